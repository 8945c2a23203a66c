//! Authentication and permissions against a real node over TCP and a Unix
//! socket: every kind of credential, every wrong one, a stalled handshake,
//! refused operations with their errors and counters, and SO_PEERCRED.

mod common;

use std::time::Duration;

use bytes::BytesMut;
use common::temp_dir;
use skiff::client::{Client, Code};
use skiff::{Error, Message};
use skiff_node::frame::{ClientFrame, Decoder, Proof, ServerFrame};
use skiff_node::{Config, Node};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Fixture {
    node: Node,
    dir: common::TempDir,
    key_file: String,
    other_key_file: String,
}

fn uid_gid() -> (u32, u32) {
    // SAFETY: getuid and getgid cannot fail and touch no memory.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// The node's time limit for a handshake. Short enough that the stalled
/// handshake test is quick, long enough that a client in this busy test
/// process (CI's machine is 2 slow cores) always sends its credentials in time.
const AUTH_TIMEOUT_MS: u64 = 2000;

/// Every client here may take this long to connect and authenticate: an
/// argon2 check on a loaded 2-core machine overran the default 1.5 s once.
const CONNECT_TIMEOUT: &str = "connect_timeout=20s";

/// A node on TCP and a Unix socket with a token, two users with
/// passwords (one restricted), one with a key.
async fn node(extra: &str) -> Fixture {
    let dir = temp_dir("auth");
    let seed = [11u8; 32];
    let key_file = dir.0.join("svc.key");
    std::fs::write(&key_file, skiff::keys::seed_text(&seed)).unwrap();
    let other_key_file = dir.0.join("other.key");
    std::fs::write(&other_key_file, skiff::keys::seed_text(&[12u8; 32])).unwrap();
    let public = skiff::keys::public_text(&skiff::keys::public_of(&seed));
    let text = format!(
        r#"
tcp = "127.0.0.1:0"
unix = "{sock}"
[auth]
token = "tok-123"
timeout_ms = {timeout_ms}
{extra}
[[auth.users]]
name = "alice"
password_hash = "{alice}"
[[auth.users]]
name = "bob"
password_hash = "{bob}"
[auth.users.permissions]
publish = {{ allow = ["orders.>"], deny = ["orders.secret"] }}
subscribe = {{ allow = ["orders.>"], deny = ["orders.secret.>"] }}
allow_responses = false
join = {{ allow = ["workers"] }}
[[auth.users]]
name = "svc"
public_key = "{public}"
"#,
        sock = dir.0.join("node.sock").display(),
        timeout_ms = AUTH_TIMEOUT_MS,
        alice = skiff_node::auth::hash_password("pw-alice"),
        bob = skiff_node::auth::hash_password("pw-bob"),
    );
    let config = Config::from_toml(&text, std::path::Path::new("auth.toml")).unwrap();
    let node = Node::start(&config).await.unwrap();
    Fixture {
        node,
        key_file: key_file.display().to_string(),
        other_key_file: other_key_file.display().to_string(),
        dir,
    }
}

impl Fixture {
    fn tcp(&self, query: &str) -> String {
        format!(
            "skiff://{}?{}",
            self.node.tcp_addr().unwrap(),
            with_connect_timeout(query)
        )
    }

    fn unix(&self, query: &str) -> String {
        format!(
            "unix://{}?{}",
            self.dir.0.join("node.sock").display(),
            with_connect_timeout(query)
        )
    }
}

fn with_connect_timeout(query: &str) -> String {
    if query.is_empty() {
        CONNECT_TIMEOUT.to_string()
    } else {
        format!("{query}&{CONNECT_TIMEOUT}")
    }
}

fn refused_auth(r: Result<Client, Error>) -> String {
    match r {
        Err(Error::Refused { code, reason }) => {
            assert_eq!(code, Code::Auth, "{reason}");
            reason
        }
        Err(e) => panic!("not an auth refusal: {e}"),
        Ok(_) => panic!("connected without the right credentials"),
    }
}

#[tokio::test]
async fn wrong_or_missing_credentials_are_refused_with_one_answer() {
    let f = node("").await;
    let wrong = [
        f.tcp(""),
        f.tcp("token=tok-124"),
        f.tcp("user=alice&password=nope"),
        f.tcp("user=mallory&password=pw-alice"),
        f.tcp(&format!("key={}", f.other_key_file)),
        f.unix(""),
    ];
    let mut texts = Vec::new();
    for l in &wrong {
        texts.push(refused_auth(Client::connect(l).await));
    }
    // The wrong part is never named; the missing-credentials case says so.
    for t in &texts {
        assert!(t.starts_with("authentication"), "{t}");
        assert!(!t.contains("tok-124") && !t.contains("nope"), "{t}");
    }
    let wrong_creds: Vec<_> = texts
        .iter()
        .filter(|t| t.contains("did not accept"))
        .collect();
    assert_eq!(wrong_creds.len(), wrong.len(), "{texts:?}");
    let c = Client::connect(&f.tcp("token=tok-123")).await.unwrap();
    let s = c.stats().await.unwrap();
    assert!(s.auth);
    assert_eq!(s.auth_failures, wrong.len() as u64);
    assert_eq!(s.clients.len(), 1, "refused clients never attached");
    assert_eq!(s.clients[0].user, "token");
}

#[tokio::test]
async fn each_credential_lets_its_user_publish_and_subscribe() {
    let f = node("").await;
    let locators = [
        f.tcp("token=tok-123"),
        f.tcp("user=alice&password=pw-alice"),
        f.tcp(&format!("key={}", f.key_file)),
        f.unix("token=tok-123"),
    ];
    let mut kept = Vec::new();
    for l in &locators {
        let c = Client::connect(l).await.unwrap();
        kept.push(c.clone());
        let mut sub = c.subscribe("a.b", "*").await.unwrap();
        c.publish(Message::new("a.b", "hi")).await.unwrap();
        let d = tokio::time::timeout(Duration::from_secs(5), sub.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&d.payload[..], b"hi", "{l}");
    }
    let c = Client::connect(&f.tcp("token=tok-123")).await.unwrap();
    let users: Vec<String> = c
        .stats()
        .await
        .unwrap()
        .clients
        .into_iter()
        .map(|c| c.user)
        .collect();
    for u in ["token", "alice", "svc"] {
        assert!(users.contains(&u.to_string()), "{users:?}");
    }
}

#[tokio::test]
async fn a_client_that_stalls_in_the_handshake_is_closed_by_the_time_limit() {
    let f = node("").await;
    let mut s = tokio::net::TcpStream::connect(f.node.tcp_addr().unwrap())
        .await
        .unwrap();
    let mut buf = BytesMut::new();
    let dec = Decoder::new(1 << 16);
    let mut frames = Vec::new();
    let t0 = std::time::Instant::now();
    // Say nothing: the node challenges, then closes with the reason.
    let end = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            while let Some(b) = dec.next(&mut buf).unwrap() {
                frames.push(ServerFrame::decode(b, 0).unwrap());
            }
            if s.read_buf(&mut buf).await.unwrap() == 0 {
                return;
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the node did not close a stalled handshake");
    assert!(t0.elapsed() >= Duration::from_millis(AUTH_TIMEOUT_MS - 50));
    assert!(matches!(frames[0], ServerFrame::Challenge { ref nonce } if nonce.len() == 32));
    match &frames[1] {
        ServerFrame::Error {
            corr: 0,
            code,
            text,
        } => {
            assert_eq!(*code, Code::Auth);
            assert!(
                text.contains("timed out") && text.contains("timeout_ms"),
                "{text}"
            );
        }
        f => panic!("{f:?}"),
    }
    // Anything but Auth first is refused at once.
    let mut s = tokio::net::TcpStream::connect(f.node.tcp_addr().unwrap())
        .await
        .unwrap();
    let mut out = Vec::new();
    ClientFrame::Ping { corr: 1 }.encode(&mut out);
    s.write_all(&out).await.unwrap();
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut all))
        .await
        .unwrap()
        .unwrap();
    let mut buf = BytesMut::from(&all[..]);
    let _challenge = dec.next(&mut buf).unwrap().unwrap();
    let e = ServerFrame::decode(dec.next(&mut buf).unwrap().unwrap(), 0).unwrap();
    assert!(
        matches!(
            e,
            ServerFrame::Error {
                code: Code::Auth,
                ..
            }
        ),
        "{e:?}"
    );
    // A proof over the wrong nonce (a replayed signature) is refused.
    let mut s = tokio::net::TcpStream::connect(f.node.tcp_addr().unwrap())
        .await
        .unwrap();
    let seed = skiff::keys::parse_seed(&std::fs::read_to_string(&f.key_file).unwrap()).unwrap();
    let mut out = Vec::new();
    ClientFrame::Auth(Proof::Signature {
        public_key: skiff::keys::public_of(&seed),
        signature: skiff::keys::sign(&seed, &[0u8; 32]),
    })
    .encode(&mut out);
    s.write_all(&out).await.unwrap();
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut all))
        .await
        .unwrap()
        .unwrap();
    let mut buf = BytesMut::from(&all[..]);
    let _challenge = dec.next(&mut buf).unwrap().unwrap();
    let e = ServerFrame::decode(dec.next(&mut buf).unwrap().unwrap(), 0).unwrap();
    assert!(
        matches!(
            e,
            ServerFrame::Error {
                code: Code::Auth,
                ..
            }
        ),
        "{e:?}"
    );
}

#[tokio::test]
async fn forbidden_operations_fail_alone_with_the_error_and_are_counted() {
    let f = node("").await;
    let admin = Client::connect(&f.tcp("user=alice&password=pw-alice"))
        .await
        .unwrap();
    let bob = Client::connect(&f.tcp("user=bob&password=pw-bob"))
        .await
        .unwrap();
    let denied = |r: Result<_, Error>| match r {
        Err(Error::Refused {
            code: Code::Denied,
            reason,
        }) => reason,
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("allowed"),
    };
    // Subscribe: outside the allow list, or overlapping the deny list.
    let t = denied(bob.subscribe("payroll.>", "*").await.map(|_| ()));
    assert!(
        t.contains("bob") && t.contains("subscribe") && t.contains("payroll.>"),
        "{t}"
    );
    denied(bob.subscribe(">", "*").await.map(|_| ()));
    denied(bob.subscribe("orders.>", "*").await.map(|_| ()));
    let mut orders = bob.subscribe("orders.new", "*").await.unwrap();
    // Join: only `workers`.
    denied(bob.join("payroll", 1).await.map(|_| ()));
    let _w = bob.join("workers", 1).await.unwrap();
    // Publish: refused ones are reported and dropped, others go through.
    let mut all = admin.subscribe(">", "*").await.unwrap();
    bob.publish(Message::new("payroll.salary.alice", "250000"))
        .await
        .unwrap();
    bob.publish(Message::new("orders.secret", "x"))
        .await
        .unwrap();
    bob.publish(Message::new("orders.new", "ok")).await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(5), all.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&*d.subject, "orders.new", "a refused publish got through");
    let d = tokio::time::timeout(Duration::from_secs(5), orders.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&d.payload[..], b"ok");
    bob.flush().await.unwrap();
    let (n, last) = bob.async_errors();
    assert_eq!(n, 2, "{last:?}");
    assert!(last.unwrap().contains("permission denied"));
    // Request to a subject it may not publish to.
    let t = denied(
        bob.request(
            "payroll.query",
            Message::new("", "?"),
            Duration::from_secs(2),
        )
        .await
        .map(|_| ()),
    );
    assert!(t.contains("permission denied"), "{t}");
    // Reply: bob may not answer requests (allow_responses = false).
    let mut reqs = bob.subscribe("orders.query", "*").await.unwrap();
    let asker = admin.clone();
    let ask = tokio::spawn(async move {
        asker
            .request(
                "orders.query",
                Message::new("", "?"),
                Duration::from_millis(500),
            )
            .await
    });
    let d = tokio::time::timeout(Duration::from_secs(5), reqs.recv())
        .await
        .unwrap()
        .unwrap();
    bob.reply(&d, Message::new("", "forged")).await.unwrap();
    assert!(
        matches!(ask.await.unwrap(), Err(Error::Timeout)),
        "a refused reply arrived"
    );
    bob.flush().await.unwrap();
    // Counted per user and for the node; the connection stayed open.
    let s = admin.stats().await.unwrap();
    let u = s.users.iter().find(|u| u.name == "bob").unwrap();
    assert_eq!(
        (
            u.denied_publish,
            u.denied_subscribe,
            u.denied_reply,
            u.denied_join
        ),
        (3, 3, 1, 1),
        "{u:?}"
    );
    assert_eq!(s.denied, 8);
    let a = s.users.iter().find(|u| u.name == "alice").unwrap();
    assert_eq!(a.denied_publish + a.denied_subscribe, 0);
    bob.publish(Message::new("orders.new", "still here"))
        .await
        .unwrap();
    let d = tokio::time::timeout(Duration::from_secs(5), orders.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&d.payload[..], b"still here");
}

#[tokio::test]
async fn unix_socket_peers_are_mapped_by_their_uid() {
    let (uid, _) = uid_gid();
    let f = node(&format!(
        "[[auth.users]]\nname = \"local\"\nuid = {uid}\n[auth.users.permissions]\npublish = {{ allow = [\"local.>\"] }}\n"
    ))
    .await;
    // No credentials over the Unix socket: the kernel says who it is.
    let c = Client::connect(&f.unix("")).await.unwrap();
    c.publish(Message::new("elsewhere", "x")).await.unwrap();
    c.flush().await.unwrap();
    let (n, _) = c.async_errors();
    assert_eq!(n, 1, "local's permissions apply");
    let s = c.stats().await.unwrap();
    let me = s.clients.iter().find(|cl| cl.id == c.id()).unwrap();
    assert_eq!(me.user, "local");
    // Over TCP the same process must authenticate.
    refused_auth(Client::connect(&f.tcp("")).await);
}

#[tokio::test]
async fn a_configuration_error_names_the_file_and_line() {
    let e = Config::from_toml(
        "[auth]\ntoken = \"t\"\n[[auth.users]]\nname = \"x\"\nuid = 5\n[auth.users.permissions]\nsubscribe = { allow = [\"a.>.b\"] }\n",
        std::path::Path::new("bad.toml"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("bad.toml") && e.contains("line 7") && e.contains("a.>.b"),
        "{e}"
    );
}

#[tokio::test]
async fn connections_per_address_and_per_second_are_bounded() {
    let mut c = Config {
        tcp: Some("127.0.0.1:0".parse().unwrap()),
        ..Config::default()
    };
    c.set("max_connections_per_ip", "2").unwrap();
    let node = Node::start(&c).await.unwrap();
    let l = format!("skiff://{}", node.tcp_addr().unwrap());
    let a = Client::connect(&l).await.unwrap();
    let _b = Client::connect(&l).await.unwrap();
    match Client::connect(&l).await {
        Err(Error::Refused { code, reason }) => {
            assert_eq!(code, Code::Limit);
            assert!(reason.contains("max_connections_per_ip"), "{reason}");
        }
        r => panic!("a third connection from one address: {:?}", r.map(|_| ())),
    }
    assert_eq!(a.stats().await.unwrap().limit_hits, 1);
    a.close();
    drop(a);
    // Its place comes back once it is gone.
    let mut again = None;
    for _ in 0..500 {
        if let Ok(c) = Client::connect(&l).await {
            again = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        again.is_some(),
        "the closed client's place did not come back"
    );

    let mut c = Config {
        tcp: Some("127.0.0.1:0".parse().unwrap()),
        ..Config::default()
    };
    c.set("max_connection_rate", "2").unwrap();
    let node = Node::start(&c).await.unwrap();
    let l = format!("skiff://{}", node.tcp_addr().unwrap());
    let mut refused = 0;
    let mut kept = Vec::new();
    for _ in 0..8 {
        match Client::connect(&l).await {
            Ok(c) => kept.push(c),
            Err(Error::Refused {
                code: Code::Limit,
                reason,
            }) => {
                assert!(reason.contains("max_connection_rate"), "{reason}");
                refused += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    // A bucket of 2 refilled at 2 per second: 8 attempts refuse at least 2
    // unless they take longer than 2.5 s.
    assert!(refused >= 2, "{refused} of 8 refused at 2 per second");
}

/// A cMsg pattern is checked as one: `orders.*` in cMsg also matches
/// `orders.secret.x`, so a user whose token rules allow `orders.*` may not
/// subscribe to it as a cMsg pattern; a literal cMsg pattern is checked as
/// its subject; an unrestricted user may subscribe to any.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cmsg_subscriptions_cannot_escape_token_permissions() {
    use skiff::client::SubOptions;
    let f = node("").await;
    let admin = Client::connect(&f.tcp("user=alice&password=pw-alice"))
        .await
        .unwrap();
    let bob = Client::connect(&f.tcp("user=bob&password=pw-bob"))
        .await
        .unwrap();
    let cm = SubOptions::default().cmsg();
    let _tokens = bob.subscribe("orders.*", "*").await.unwrap();
    match bob.subscribe_with("orders.*", "*", cm).await {
        Err(Error::Refused {
            code: Code::Denied,
            reason,
        }) => assert!(reason.contains("orders.*"), "{reason}"),
        other => panic!("allowed: {:?}", other.map(|_| ())),
    }
    let _literal = bob.subscribe_with("orders.new", "*", cm).await.unwrap();
    assert!(bob.subscribe_with("payroll.x", "*", cm).await.is_err());
    let _any = admin.subscribe_with("*", "*", cm).await.unwrap();
}

#[tokio::test]
async fn shared_memory_clients_are_their_uid_or_refused() {
    let (uid, _) = uid_gid();
    for mapped in [true, false] {
        let dir = temp_dir("auth-shm");
        let users = if mapped {
            format!("[[auth.users]]\nname = \"local\"\nuid = {uid}\n")
        } else {
            format!(
                "[[auth.users]]\nname = \"other\"\nuid = {}\n",
                uid.wrapping_add(1)
            )
        };
        let text = format!(
            "tcp = \"none\"\nshm = \"shm://n?dir={}\"\n[auth]\ntoken = \"t\"\n{users}",
            dir.0.display()
        );
        let config = Config::from_toml(&text, std::path::Path::new("shm.toml")).unwrap();
        let node = Node::start(&config).await.unwrap();
        let r = Client::connect(&format!("shm://n?dir={}", dir.0.display())).await;
        if mapped {
            let c = r.unwrap();
            let s = c.stats().await.unwrap();
            let me = s.clients.iter().find(|cl| cl.id == c.id()).unwrap();
            assert_eq!(me.user, "local");
        } else {
            let e = match r {
                Err(e) => e.to_string(),
                Ok(_) => panic!("an unmapped shm client was attached"),
            };
            assert!(e.contains("authentication failed"), "{e}");
            assert_eq!(node.broker().auth().failures(), 1);
        }
        drop(node);
    }
}
