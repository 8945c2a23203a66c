//! The NATS listener over raw sockets: what a node answers to each
//! operation and to bad input (nats-server's texts, closing where it
//! closes), the options of `CONNECT`, and a skiff client meeting a NATS
//! one. Real NATS clients (nats-py, nats.go, nats.js) are run against it
//! by `tests/nats/run.sh`.

use std::time::Duration;

use skiff::Message;
use skiff_node::{Config, Node};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PATIENCE: Duration = Duration::from_secs(10);

async fn node(edit: impl FnOnce(&mut Config)) -> Node {
    let mut c = Config {
        tcp: Some("127.0.0.1:0".parse().unwrap()),
        nats: Some("127.0.0.1:0".parse().unwrap()),
        ..Config::default()
    };
    edit(&mut c);
    Node::start(&c).await.unwrap()
}

/// A raw NATS connection: what was read so far.
struct Raw {
    s: TcpStream,
    seen: Vec<u8>,
}

impl Raw {
    async fn open(node: &Node) -> Raw {
        let s = TcpStream::connect(node.nats_addr().unwrap()).await.unwrap();
        let mut r = Raw {
            s,
            seen: Vec::new(),
        };
        r.expect("INFO {").await;
        r
    }

    async fn send(&mut self, b: &str) {
        self.s.write_all(b.as_bytes()).await.unwrap();
    }

    /// Reads until `what` has been seen (consuming up to its end).
    async fn expect(&mut self, what: &str) -> String {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(i) = find(&self.seen, what.as_bytes()) {
                let upto = i + what.len();
                let before = String::from_utf8_lossy(&self.seen[..upto]).into_owned();
                self.seen.drain(..upto);
                return before;
            }
            let mut buf = [0u8; 65536];
            let n = tokio::time::timeout_at(deadline, self.s.read(&mut buf))
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "waited for {what:?}; got {:?}",
                        String::from_utf8_lossy(&self.seen)
                    )
                })
                .unwrap();
            assert!(
                n > 0,
                "closed before {what:?}; got {:?}",
                String::from_utf8_lossy(&self.seen)
            );
            self.seen.extend_from_slice(&buf[..n]);
        }
    }

    /// Reads until the node closes the connection; what came before.
    async fn closed(&mut self) -> String {
        let mut rest = Vec::new();
        tokio::time::timeout(PATIENCE, self.s.read_to_end(&mut rest))
            .await
            .expect("the node closes")
            .ok();
        self.seen.extend_from_slice(&rest);
        String::from_utf8_lossy(&self.seen).into_owned()
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[tokio::test]
async fn info_then_pub_sub_ping_pong() {
    let n = node(|_| {}).await;
    let mut c = Raw::open(&n).await;
    c.send("CONNECT {\"verbose\":false,\"headers\":true,\"protocol\":1}\r\nSUB a.* 9\r\nPING\r\n")
        .await;
    c.expect("PONG\r\n").await;
    c.send("PUB a.b 5\r\nhello\r\nPUB c 1\r\nx\r\n").await;
    c.expect("MSG a.b 9 5\r\nhello\r\n").await;
    n.shutdown().await;
}

#[tokio::test]
async fn info_says_what_clients_act_on() {
    let n = node(|c| c.limits.max_payload = 4096).await;
    let s = TcpStream::connect(n.nats_addr().unwrap()).await.unwrap();
    let mut r = Raw {
        s,
        seen: Vec::new(),
    };
    let line = r.expect("\r\n").await;
    let json: serde_json::Value =
        serde_json::from_str(line.trim_start_matches("INFO ").trim()).unwrap();
    assert_eq!(json["max_payload"], 4096);
    assert_eq!(json["headers"], true);
    assert_eq!(json["proto"], 1);
    assert!(json["client_id"].as_u64().unwrap() > 0);
    assert!(json["server_id"].as_str().unwrap().starts_with("NSKIFF"));
    n.shutdown().await;
}

#[tokio::test]
async fn verbose_answers_ok_and_pedantic_checks_subjects() {
    let n = node(|_| {}).await;
    let mut c = Raw::open(&n).await;
    c.send("CONNECT {\"verbose\":true,\"pedantic\":true}\r\n")
        .await;
    c.expect("+OK\r\n").await;
    c.send("SUB x 1\r\n").await;
    c.expect("+OK\r\n").await;
    // As nats-server: the message to the client's own subscription,
    // then the +OK of its publish.
    c.send("PUB x 1\r\nz\r\n").await;
    c.expect("MSG x 1 1\r\nz\r\n").await;
    c.expect("+OK\r\n").await;
    c.send("PUB a.* 1\r\nz\r\n").await;
    c.expect("-ERR 'Invalid Publish Subject'\r\n").await;
    c.send("SUB a..b 2\r\n").await;
    c.expect("-ERR 'Invalid Subject'\r\n").await;
    // Those are not fatal.
    c.send("PING\r\n").await;
    c.expect("PONG\r\n").await;
    n.shutdown().await;
}

#[tokio::test]
async fn bad_input_is_answered_as_nats_server_answers_and_closed() {
    let n = node(|c| c.limits.max_payload = 1000).await;
    for (input, text) in [
        ("FOO\r\n", "-ERR 'Unknown Protocol Operation'"),
        ("PUB a 1001\r\n", "-ERR 'Maximum Payload Violation'"),
        ("HPUB a 10 1001\r\n", "-ERR 'Maximum Payload Violation'"),
        ("PUB a 1\r\nxyz\r\n", "-ERR 'Unknown Protocol Operation'"),
        ("CONNECT {nope\r\n", "-ERR 'processConnect Parse Error'"),
    ] {
        let mut c = Raw::open(&n).await;
        c.send(input).await;
        let all = c.closed().await;
        assert!(all.contains(text), "{input:?} gave {all:?}");
    }
    // A control line past the limit, before its end has arrived.
    let mut c = Raw::open(&n).await;
    c.send(&format!("PUB {}", "a".repeat(5000))).await;
    let all = c.closed().await;
    assert!(
        all.contains("-ERR 'Maximum Control Line Exceeded'"),
        "{all:?}"
    );
    assert!(n.broker().stats().protocol_errors >= 6);
    n.shutdown().await;
}

#[tokio::test]
async fn one_bad_client_does_not_affect_another() {
    let n = node(|_| {}).await;
    let mut good = Raw::open(&n).await;
    good.send("SUB t 1\r\nPING\r\n").await;
    good.expect("PONG\r\n").await;
    let mut bad = Raw::open(&n).await;
    bad.send("PUB t 2\r\nok\r\nGARBAGE\r\n").await;
    bad.closed().await;
    good.expect("MSG t 1 2\r\nok\r\n").await;
    good.send("PUB t 3\r\nyes\r\n").await;
    good.expect("MSG t 1 3\r\nyes\r\n").await;
    n.shutdown().await;
}

#[tokio::test]
async fn echo_off_skips_the_clients_own_messages() {
    let n = node(|_| {}).await;
    let mut c = Raw::open(&n).await;
    c.send("CONNECT {\"echo\":false}\r\nSUB e 1\r\nPUB e 4\r\nmine\r\nPING\r\n")
        .await;
    let before = c.expect("PONG\r\n").await;
    assert!(!before.contains("MSG"), "{before}");
    let mut other = Raw::open(&n).await;
    other.send("PUB e 6\r\ntheirs\r\n").await;
    c.expect("MSG e 1 6\r\ntheirs\r\n").await;
    n.shutdown().await;
}

#[tokio::test]
async fn unsub_with_a_count_and_queue_groups() {
    let n = node(|_| {}).await;
    let mut c = Raw::open(&n).await;
    c.send("SUB u 1\r\nUNSUB 1 2\r\nSUB g grp 2\r\nSUB g grp 3\r\nPING\r\n")
        .await;
    c.expect("PONG\r\n").await;
    let mut p = Raw::open(&n).await;
    for _ in 0..4 {
        p.send("PUB u 1\r\nx\r\n").await;
    }
    for _ in 0..10 {
        p.send("PUB g 1\r\ny\r\n").await;
    }
    p.send("PING\r\n").await;
    p.expect("PONG\r\n").await;
    let mut all = String::new();
    for _ in 0..50 {
        c.send("PING\r\n").await;
        all += &c.expect("PONG\r\n").await;
        if all.matches("MSG g ").count() == 10 {
            break;
        }
    }
    assert_eq!(all.matches("MSG u 1 ").count(), 2, "{all}");
    assert_eq!(
        all.matches("MSG g ").count(),
        10,
        "each once to the group: {all}"
    );
    assert!(
        all.contains("MSG g 2 ") && all.contains("MSG g 3 "),
        "both members: {all}"
    );
    n.shutdown().await;
}

#[tokio::test]
async fn requests_no_responders_and_skiff_clients() {
    let n = node(|_| {}).await;
    let mut c = Raw::open(&n).await;
    c.send("CONNECT {\"headers\":true,\"no_responders\":true,\"protocol\":1}\r\nSUB _INBOX.r.* 1\r\nPUB nobody _INBOX.r.1 0\r\n\r\n")
        .await;
    c.expect("HMSG _INBOX.r.1 1 16 16\r\nNATS/1.0 503\r\n\r\n\r\n")
        .await;

    // A skiff responder answers a NATS request; a skiff message's type
    // and fields reach the NATS client as headers.
    let loc = format!("skiff://{}", n.tcp_addr().unwrap());
    let skiff = skiff::client::Client::connect(&loc).await.unwrap();
    let mut sub = skiff.subscribe("svc", "*").await.unwrap();
    c.send("HPUB svc _INBOX.r.2 18 20\r\nNATS/1.0\r\nK: v\r\n\r\nhi\r\n")
        .await;
    let d = tokio::time::timeout(PATIENCE, sub.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&d.msg.payload[..], b"hi");
    assert_eq!(d.msg.field("K"), Some(&skiff::Value::Str("v".into())));
    skiff
        .reply(&d, Message::new("", "yo").with_kind("answer"))
        .await
        .unwrap();
    c.expect("HMSG _INBOX.r.2 1 ").await;
    c.expect("Skiff-Type: answer\r\n\r\nyo\r\n").await;

    // A NATS responder answers a skiff request.
    c.send("SUB ask 2\r\nPING\r\n").await;
    c.expect("PONG\r\n").await;
    let req = tokio::spawn(async move {
        skiff
            .request("ask", Message::new("ask", "q"), Duration::from_secs(5))
            .await
    });
    let line = c.expect("\r\nq\r\n").await;
    let reply = line
        .split_whitespace()
        .find(|w| w.starts_with("_SKIFF_REPLY."))
        .expect("a reply subject")
        .to_owned();
    c.send(&format!("PUB {reply} 3\r\nans\r\n")).await;
    let got = req.await.unwrap().unwrap();
    assert_eq!(&got.payload[..], b"ans");
    n.shutdown().await;
}

/// A node with a token user and a password user who may publish only
/// under `alice.` and subscribe to nothing under `secret.`.
async fn auth_node() -> Node {
    let toml = format!(
        r#"
[auth]
token = "tok"
timeout_ms = 2000
[[auth.users]]
name = "alice"
password_hash = "{}"
[auth.users.permissions]
publish = {{ allow = ["alice.>"] }}
subscribe = {{ allow = [">"], deny = ["secret.>"] }}
"#,
        skiff_node::auth::hash_password("alice-pw")
    );
    let mut c = Config::from_toml(&toml, std::path::Path::new("test.toml")).unwrap();
    c.tcp = Some("127.0.0.1:0".parse().unwrap());
    c.nats = Some("127.0.0.1:0".parse().unwrap());
    Node::start(&c).await.unwrap()
}

#[tokio::test]
async fn auth_token_password_and_permissions() {
    let n = auth_node().await;
    // INFO asks for authentication and carries a nonce.
    let mut c = Raw::open(&n).await;
    c.expect("\r\n").await;
    let info = {
        let s = TcpStream::connect(n.nats_addr().unwrap()).await.unwrap();
        let mut r = Raw {
            s,
            seen: Vec::new(),
        };
        r.expect("\r\n").await
    };
    assert!(
        info.contains("\"auth_required\":true") && info.contains("\"nonce\":"),
        "{info}"
    );

    // No credentials, wrong ones, or anything before CONNECT: refused.
    for first in [
        "CONNECT {}\r\n",
        "CONNECT {\"auth_token\":\"nope\"}\r\n",
        "CONNECT {\"user\":\"alice\",\"pass\":\"nope\"}\r\n",
        "SUB x 1\r\n",
        "PING\r\n",
    ] {
        let mut c = Raw::open(&n).await;
        c.send(first).await;
        let all = c.closed().await;
        assert!(
            all.contains("-ERR 'Authorization Violation'"),
            "{first:?}: {all}"
        );
    }
    // Silence past the deadline.
    let mut c = Raw::open(&n).await;
    let all = c.closed().await;
    assert!(all.contains("-ERR 'Authentication Timeout'"), "{all}");

    // The token.
    let mut c = Raw::open(&n).await;
    c.send("CONNECT {\"auth_token\":\"tok\"}\r\nSUB secret.x 1\r\nPING\r\n")
        .await;
    c.expect("PONG\r\n").await;

    // The password, with its permissions.
    let mut a = Raw::open(&n).await;
    a.send("CONNECT {\"user\":\"alice\",\"pass\":\"alice-pw\"}\r\nSUB secret.> 1\r\n")
        .await;
    a.expect("-ERR 'Permissions Violation for Subscription to \"secret.>\" (sid \"1\")'\r\n")
        .await;
    a.send("SUB alice.in 2\r\nPUB secret.x 1\r\nz\r\n").await;
    a.expect("-ERR 'Permissions Violation for Publish to \"secret.x\"'\r\n")
        .await;
    a.send("PUB alice.in 2\r\nok\r\n").await;
    a.expect("MSG alice.in 2 2\r\nok\r\n").await;
    // The token user heard nothing of alice's refused publish.
    c.send("PING\r\n").await;
    let seen = c.expect("PONG\r\n").await;
    assert!(!seen.contains("MSG"), "{seen}");
    n.shutdown().await;
}

#[tokio::test]
async fn a_slow_consumer_is_closed_and_counted_as_nats_server_does() {
    let n = node(|c| {
        c.limits.max_pending_bytes = 64 * 1024;
        c.limits.write_deadline_ms = 300;
    })
    .await;
    let mut slow = Raw::open(&n).await;
    slow.send("SUB s 1\r\nPING\r\n").await;
    slow.expect("PONG\r\n").await;
    // It reads nothing more; a fast publisher fills what the node holds
    // for it.
    let mut fast = Raw::open(&n).await;
    let msg = format!("PUB s 1000\r\n{}\r\n", "x".repeat(1000));
    // Its publisher waits while the queue is full (nats-server stalls a
    // fast producer), until the write deadline closes the consumer.
    let batch = msg.repeat(200);
    for _ in 0..200 {
        tokio::time::timeout(PATIENCE, fast.send(&batch))
            .await
            .expect("the publisher goes on once the slow consumer is closed");
        if n.broker().stats().slow_consumers > 0 {
            break;
        }
    }
    assert!(n.broker().stats().slow_consumers >= 1);
    // Closed without an -ERR (nats-server closes a slow consumer; an
    // -ERR would stop clients from reconnecting).
    let all = slow.closed().await;
    assert!(
        !all.contains("-ERR"),
        "{}",
        &all[all.len().saturating_sub(200)..]
    );
    // The publisher is unharmed.
    fast.send("PING\r\n").await;
    fast.expect("PONG\r\n").await;
    n.shutdown().await;
}

#[tokio::test]
async fn a_queue_group_is_a_skiff_cluster() {
    let n = node(|_| {}).await;
    let mut c = Raw::open(&n).await;
    c.send("SUB work.* grp 5\r\nPING\r\n").await;
    c.expect("PONG\r\n").await;
    let loc = format!("skiff://{}", n.tcp_addr().unwrap());
    let skiff = skiff::client::Client::connect(&loc).await.unwrap();
    let req = tokio::spawn(async move {
        skiff
            .request(
                skiff::client::Target::cluster("grp"),
                Message::new("work.a", "job"),
                Duration::from_secs(5),
            )
            .await
    });
    let line = c.expect("\r\njob\r\n").await;
    assert!(line.contains("MSG work.a 5 _SKIFF_REPLY."), "{line}");
    let reply = line
        .split_whitespace()
        .find(|w| w.starts_with("_SKIFF_REPLY."))
        .unwrap()
        .to_owned();
    c.send(&format!("PUB {reply} 4\r\ndone\r\n")).await;
    assert_eq!(&req.await.unwrap().unwrap().payload[..], b"done");
    n.shutdown().await;
}

#[tokio::test]
async fn a_slow_subscriber_holds_a_bounded_queue_and_loses_nothing() {
    // A NATS subscription's queue stops its publisher at 16,384 messages
    // (plus up to 8,192 being written), long before the client's
    // pending-bytes bound (16 MiB by default): a subscriber slower than
    // its publisher costs the node a few MiB, and every message arrives.
    const N: usize = 400_000;
    let n = node(|_| {}).await;
    // A small receive buffer, so the node's socket takes little of it.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let s = sock.connect(n.nats_addr().unwrap()).await.unwrap();
    let mut slow = Raw {
        s,
        seen: Vec::new(),
    };
    slow.expect("INFO {").await;
    slow.expect("\r\n").await;
    slow.send("SUB s 1\r\nPING\r\n").await;
    slow.expect("PONG\r\n").await;
    let mut fast = Raw::open(&n).await;
    let publisher = tokio::spawn(async move {
        for chunk in 0..N / 1000 {
            let mut b = String::new();
            for i in chunk * 1000..(chunk + 1) * 1000 {
                b.push_str(&format!("PUB s 8\r\n{i:08}\r\n"));
            }
            fast.send(&b).await;
        }
        fast.send("PING\r\n").await;
        fast
    });
    // (messages queued for the subscriber, its pending bytes, messages
    // the node took from the publisher)
    let queued = |n: &Node| -> (usize, usize, u64) {
        let st = n.broker().stats();
        let (q, bytes) = st
            .clients
            .iter()
            .find_map(|c| {
                let s = c.subscriptions.first()?;
                Some((s.counters.queued, c.pending_bytes))
            })
            .unwrap_or((0, 0));
        let published = st.clients.iter().map(|c| c.published).sum();
        (q, bytes, published)
    };
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while queued(&n).0 < 16 * 1024 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the queue never filled: {:?}",
            queued(&n)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Until the node stops reading the publisher: what it has not read
    // (the rest, beyond what the sockets' buffers took) waits.
    let mut last = queued(&n);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = queued(&n);
        if now.2 == last.2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the node kept reading the publisher: {now:?}"
        );
        last = now;
    }
    let (q, bytes, published) = last;
    assert!(q <= 24 * 1024, "{q} messages queued");
    assert!(bytes < 4 << 20, "{bytes} bytes pending");
    assert!(published < N as u64, "all {published} published");
    // The subscriber reads: every message, in order.
    let want: String = (0..N).map(|i| format!("MSG s 1 8\r\n{i:08}\r\n")).collect();
    let mut got = std::mem::take(&mut slow.seen);
    let mut buf = vec![0u8; 1 << 16];
    while got.len() < want.len() {
        let k = tokio::time::timeout(PATIENCE, slow.s.read(&mut buf))
            .await
            .expect("the messages keep coming")
            .unwrap();
        assert!(k > 0, "closed after {} bytes", got.len());
        got.extend_from_slice(&buf[..k]);
    }
    assert!(got == want.as_bytes(), "messages lost or out of order");
    let mut fast = tokio::time::timeout(PATIENCE, publisher)
        .await
        .expect("the publisher goes on")
        .unwrap();
    fast.expect("PONG\r\n").await;
    n.shutdown().await;
}
