//! Client failover (`skiff://A,B`): real nodes in this process, each on a
//! runtime of its own so that a test can kill one abruptly (its runtime is
//! shut down: every socket closes with no goodbye, as with kill -9) or
//! freeze it (its only worker thread blocks: the sockets stay open and the
//! node goes silent).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use skiff::client::{Client, ClientEvent, Events, Gap, Incoming, SubOptions, Target};
use skiff::{Error, Message};
use skiff_node::{Config, Node};

/// Long enough for anything that should happen; tests never assert timing.
const PATIENCE: Duration = Duration::from_secs(20);

/// A node on a runtime of its own.
struct Remote {
    rt: Option<tokio::runtime::Runtime>,
    node: Option<Node>,
    thaw: Option<std::sync::mpsc::Sender<()>>,
}

impl Remote {
    fn start(tcp: Option<SocketAddr>, unix: Option<PathBuf>) -> Remote {
        // Started from a plain thread: a runtime cannot be entered from
        // inside the test's.
        let (rt, node) = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let config = Config {
                tcp,
                unix,
                ..Config::default()
            };
            let node = rt.block_on(Node::start(&config)).unwrap();
            (rt, node)
        })
        .join()
        .unwrap();
        Remote {
            rt: Some(rt),
            node: Some(node),
            thaw: None,
        }
    }

    fn tcp() -> Remote {
        Remote::start(Some("127.0.0.1:0".parse().unwrap()), None)
    }

    fn locator(&self) -> String {
        let n = self.node.as_ref().unwrap();
        match n.tcp_addr() {
            Some(a) => format!("skiff://{a}"),
            None => format!("unix://{}", n.unix_path().unwrap().display()),
        }
    }

    /// Kills the node: its tasks are dropped, its sockets close.
    fn kill(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
        // Its Drop would close clients politely; the process is "dead".
        std::mem::forget(self.node.take());
    }

    /// Blocks the node's only worker thread: it stops answering.
    fn freeze(&mut self) {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        self.rt.as_ref().unwrap().spawn(async move {
            let _ = rx.recv();
        });
        self.thaw = Some(tx);
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        self.thaw.take();
        self.kill();
    }
}

async fn next_event(ev: &mut Events) -> ClientEvent {
    tokio::time::timeout(PATIENCE, ev.recv())
        .await
        .expect("an event in time")
        .expect("events go on")
}

/// Waits for the failover from `from` to `to`: a `Disconnected` then a
/// `Reconnected`.
async fn failover(ev: &mut Events, from: &str, to: &str) -> (String, Gap) {
    let reason = match next_event(ev).await {
        ClientEvent::Disconnected { node, reason, .. } => {
            assert_eq!(node, from);
            reason
        }
        other => panic!("expected Disconnected, got {other:?}"),
    };
    (reason, reconnected(ev, from, to).await)
}

/// Waits for a `Reconnected` from `from` to `to`.
async fn reconnected(ev: &mut Events, from: &str, to: &str) -> Gap {
    match next_event(ev).await {
        ClientEvent::Reconnected(gap) => {
            assert_eq!(gap.from, from);
            assert_eq!(gap.to, to);
            assert!(gap.up_at >= gap.down_at, "{gap:?}");
            assert!(gap.attempts >= 1);
            gap
        }
        other => panic!("expected Reconnected, got {other:?}"),
    }
}

async fn recv(sub: &mut skiff::client::Subscription) -> skiff::client::Delivery {
    tokio::time::timeout(PATIENCE, sub.recv())
        .await
        .expect("a message in time")
        .expect("the subscription lives")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_node_fails_over_and_everything_is_restored() {
    let mut a = Remote::tcp();
    let b = Remote::tcp();
    let (la, lb) = (a.locator(), b.locator());
    let list = format!("{la},{}", lb.trim_start_matches("skiff://"));
    let c = Client::connect(&list).await.unwrap();
    let mut events = c.events();
    assert_eq!(c.node().as_deref(), Some(la.as_str()));

    let mut sub = c.subscribe("fo.>", "*").await.unwrap();
    // A small window, with messages left unread across the failover: the
    // credit given to B must neither stall nor double.
    let mut small = c
        .subscribe_with("win.>", "*", SubOptions::default().window(4))
        .await
        .unwrap();
    let member = c.join("svc", 1).await.unwrap();

    // Messages flow through A.
    let pa = Client::connect(&la).await.unwrap();
    pa.publish(Message::new("fo.a", "1")).await.unwrap();
    for i in 0..3 {
        pa.publish(Message::new(format!("win.a.{i}"), ""))
            .await
            .unwrap();
    }
    let d = recv(&mut sub).await;
    assert_eq!(d.subject, "fo.a");
    assert!(d.gap().is_none());
    tokio::time::timeout(PATIENCE, async {
        while small.queue_len() < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();

    // A request in flight on A: its only responder, on A, never answers.
    let silent = Client::connect(&la).await.unwrap();
    let mut asked = silent.subscribe("slow.q", "*").await.unwrap();
    let req = tokio::spawn({
        let c = c.clone();
        async move {
            c.request(
                "slow.q",
                Message::new("slow.q", "?"),
                Duration::from_secs(600),
            )
            .await
        }
    });
    recv(&mut asked).await;
    // A request from A reaches the member; it will answer too late.
    let _old_req = tokio::spawn({
        let pa = pa.clone();
        async move {
            pa.request(Target::cluster("svc"), Message::new("", "old"), PATIENCE)
                .await
        }
    });
    let Some(Incoming::Request(old)) = tokio::time::timeout(PATIENCE, member.recv()).await.unwrap()
    else {
        panic!("expected a request")
    };

    // A publisher on B numbers its messages the whole time.
    let pb = Client::connect(&lb).await.unwrap();
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let publisher = tokio::spawn({
        let pb = pb.clone();
        async move {
            let mut n = 0u64;
            loop {
                pb.publish(Message::new("fo.seq", n.to_string()))
                    .await
                    .unwrap();
                n += 1;
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(1)) => {}
                    _ = &mut stop_rx => return n,
                }
            }
        }
    });

    let killed = Instant::now();
    a.kill();

    // The request fails at once with the clear error, naming A.
    let e = tokio::time::timeout(PATIENCE, req)
        .await
        .expect("the request does not hang")
        .unwrap()
        .unwrap_err();
    match &e {
        Error::NodeLost { node } => assert_eq!(node, &la),
        other => panic!("expected NodeLost, got {other}"),
    }
    assert!(e.to_string().contains(&la), "{e}");

    let (reason, gap) = failover(&mut events, &la, &lb).await;
    eprintln!(
        "failover in {:?} ({reason}); gap {:?} over {} attempt(s)",
        killed.elapsed(),
        gap.down_for,
        gap.attempts
    );
    assert_eq!(c.node().as_deref(), Some(lb.as_str()));
    assert_eq!(c.link_stats().failovers, 1);
    // Its token meant something on A only: the reply is refused, not sent.
    match old.reply(Message::new("", "late")).await {
        Err(Error::NodeLost { node }) => assert_eq!(node, la),
        other => panic!("expected NodeLost, got {other:?}"),
    }

    // Reconnected means B holds the interest: a message published at B
    // from now on is delivered.
    pb.publish(Message::new("fo.b", "after")).await.unwrap();
    let _ = stop_tx.send(());
    let sent = publisher.await.unwrap();
    pb.publish(Message::new("fo.end", "")).await.unwrap();

    // The first message after the failover carries the gap; the sequence
    // from B only goes up (nothing twice); nothing from A is repeated.
    let mut first = true;
    let mut last_seq: Option<u64> = None;
    let mut saw_after = false;
    loop {
        let d = recv(&mut sub).await;
        if first {
            assert_eq!(d.gap(), Some(&gap), "the first message after the failover");
            first = false;
        } else {
            assert!(d.gap().is_none(), "{:?}", d.subject);
        }
        match &d.subject[..] {
            "fo.seq" => {
                let n: u64 = std::str::from_utf8(&d.payload).unwrap().parse().unwrap();
                assert!(last_seq.is_none_or(|l| n > l), "{n} after {last_seq:?}");
                assert!(n < sent);
                last_seq = Some(n);
            }
            "fo.b" => saw_after = true,
            "fo.end" => break,
            other => panic!("unexpected {other} (delivered twice?)"),
        }
    }
    assert!(saw_after);
    assert_eq!(sub.gaps(), 1);
    assert_eq!(member.gaps(), 1);

    // The small window: the three from A, then many from B.
    for i in 0..50 {
        pb.publish(Message::new(format!("win.b.{i}"), ""))
            .await
            .unwrap();
    }
    for i in 0..53 {
        let d = recv(&mut small).await;
        if i < 3 {
            assert_eq!(d.subject, format!("win.a.{i}"));
            assert!(d.gap().is_none());
        } else {
            assert_eq!(d.subject, format!("win.b.{}", i - 3));
            assert_eq!(d.gap().is_some(), i == 3);
        }
    }
    assert_eq!(small.gaps(), 1);

    // A cluster request made at B reaches the member, and its reply goes
    // back.
    let q = tokio::spawn({
        let pb = pb.clone();
        async move {
            pb.request(Target::cluster("svc"), Message::new("", "ping"), PATIENCE)
                .await
        }
    });
    let Some(Incoming::Request(r)) = tokio::time::timeout(PATIENCE, member.recv()).await.unwrap()
    else {
        panic!("expected a request")
    };
    assert_eq!(&r.msg.payload[..], b"ping");
    r.reply(Message::new("", "pong")).await.unwrap();
    let reply = q.await.unwrap().unwrap();
    assert_eq!(&reply.payload[..], b"pong");

    // B sees one client with two subscriptions and the membership.
    let stats = c.stats().await.unwrap();
    assert_eq!(stats.subscriptions, 2, "{stats:?}");
    assert_eq!(stats.clusters, 1, "{stats:?}");
    assert!(sub.try_recv().is_none(), "nothing delivered twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_without_a_node_are_held_then_sent() {
    let dir = std::env::temp_dir().join(format!("skiff-failover-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (pa, pb) = (dir.join("a.sock"), dir.join("b.sock"));
    let _ = std::fs::remove_file(&pb);
    let mut a = Remote::start(None, Some(pa.clone()));
    let list = format!("unix://{},{}", pa.display(), pb.display());
    let c = Client::connect(&format!("{list}?reconnect_buffer=64k"))
        .await
        .unwrap();
    let strict = Client::connect(&format!("{list}?reconnect_buffer=0"))
        .await
        .unwrap();
    let mut ev = c.events();
    let mut strict_ev = strict.events();
    let mut sub = c.subscribe("held.>", "*").await.unwrap();
    let mut strict_sub = strict.subscribe("held.>", "*").await.unwrap();

    a.kill();
    for e in [&mut ev, &mut strict_ev] {
        assert!(matches!(
            next_event(e).await,
            ClientEvent::Disconnected { .. }
        ));
    }
    assert_eq!(c.node(), None);
    // No node anywhere: publishes wait in the buffer, calls fail at once.
    for i in 0..3 {
        c.publish(Message::new(format!("held.{i}"), "x"))
            .await
            .unwrap();
    }
    assert_eq!(c.link_stats().held, 3);
    let e = c
        .request("held.q", Message::new("held.q", ""), PATIENCE)
        .await
        .unwrap_err();
    assert!(e.is_node_lost(), "{e}");
    assert!(c.subscribe("other", "*").await.unwrap_err().is_node_lost());
    let e = strict
        .publish(Message::new("held.x", "x"))
        .await
        .unwrap_err();
    assert!(e.is_node_lost(), "{e}");
    assert_eq!(strict.link_stats().refused, 1);

    // Closing a client that has no node ends its subscriptions and events.
    strict.close();
    assert!(matches!(
        next_event(&mut strict_ev).await,
        ClientEvent::Closed { .. }
    ));
    let ended = tokio::time::timeout(PATIENCE, strict_sub.recv()).await;
    assert!(ended.expect("ends, does not hang").is_none());

    // A node comes up at the second address: the subscription is restored
    // first, then the held publishes go out (and come back to it).
    let b = Remote::start(None, Some(pb.clone()));
    let gap = reconnected(&mut ev, &a_loc(&pa), &b.locator()).await;
    assert!(gap.attempts >= 2, "A and B were both tried: {gap:?}");
    for i in 0..3 {
        let d = recv(&mut sub).await;
        assert_eq!(d.subject, format!("held.{i}"));
        assert_eq!(d.gap(), (i == 0).then_some(&gap));
    }
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

fn a_loc(p: &std::path::Path) -> String {
    format!("unix://{}", p.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_node_is_given_up_after_ping_timeout() {
    let mut a = Remote::tcp();
    let b = Remote::tcp();
    let (la, lb) = (a.locator(), b.locator());
    let c = Client::connect(&format!(
        "{la},{}?ping=100ms&ping_timeout=800ms",
        lb.trim_start_matches("skiff://")
    ))
    .await
    .unwrap();
    let mut ev = c.events();
    let mut sub = c.subscribe("quiet.>", "*").await.unwrap();
    // An idle link answers its pings: no failover.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(ev.try_recv().is_none());

    a.freeze();
    let (reason, _) = failover(&mut ev, &la, &lb).await;
    assert!(reason.contains("did not answer"), "{reason}");
    let pb = Client::connect(&lb).await.unwrap();
    pb.publish(Message::new("quiet.b", "")).await.unwrap();
    let d = recv(&mut sub).await;
    assert_eq!(d.subject, "quiet.b");
    assert!(d.gap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_shutdown_is_a_failover_and_close_ends_events() {
    let config = |_| Config {
        tcp: Some("127.0.0.1:0".parse().unwrap()),
        ..Config::default()
    };
    let a = Node::start(&config(())).await.unwrap();
    let b = Node::start(&config(())).await.unwrap();
    let (la, lb) = (
        format!("skiff://{}", a.tcp_addr().unwrap()),
        format!("skiff://{}", b.tcp_addr().unwrap()),
    );
    let c = Client::connect(&format!("{la},{}", b.tcp_addr().unwrap()))
        .await
        .unwrap();
    let mut ev = c.events();
    let mut sub = c.subscribe("bye.>", "*").await.unwrap();
    a.shutdown().await;
    let (reason, _) = failover(&mut ev, &la, &lb).await;
    assert!(reason.contains("shutting down"), "{reason}");
    assert!(sub.error().is_none());
    Client::connect(&lb)
        .await
        .unwrap()
        .publish(Message::new("bye.b", ""))
        .await
        .unwrap();
    assert_eq!(recv(&mut sub).await.subject, "bye.b");

    c.close();
    assert!(matches!(
        next_event(&mut ev).await,
        ClientEvent::Closed { .. }
    ));
    assert!(ev.recv().await.is_none());
    assert!(tokio::time::timeout(PATIENCE, sub.recv())
        .await
        .unwrap()
        .is_none());
}
