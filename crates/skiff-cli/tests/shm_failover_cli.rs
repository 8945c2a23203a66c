//! Failover of `shm://` clients between real `skiff node` processes
//! (issue 21, item 3): a client given two nodes (`shm://a,b?dir=…`, or shm
//! then TCP: `shm://a,skiff://host:port?dir=…`) keeps its plain and
//! shared-buffer subscriptions when the first node is killed with SIGKILL,
//! reports the gap, and reports the publishes the dead node never
//! confirmed, as a TCP client does.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use skiff::client::{Client, ClientEvent, SubOptions, Subscription};
use skiff::shm::Flow;
use skiff::Message;

mod cli_util;
use cli_util::mesh::{Proc, PATIENCE};
use cli_util::{free_port, run, skiff, wait_line};

/// A directory of its own for a test's shm attachments, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("skiff-shmfo-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        Dir(d)
    }

    fn shm(&self, name: &str) -> String {
        format!("shm://{name}?dir={}", self.0.display())
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts a node on a free TCP port and, with `shm`, on that shm
/// locator; returns once it listens, with its TCP address.
fn start_node(shm: Option<&str>) -> (Proc, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut args = vec!["node", "--tcp", &addr];
    if let Some(s) = shm {
        args.extend(["--shm", s]);
    }
    let until = if shm.is_some() {
        "listening on shm"
    } else {
        "listening on tcp"
    };
    let mut child = skiff()
        .args(&args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn skiff node");
    wait_line(child.stderr.take().unwrap(), until, PATIENCE);
    (Proc(child), addr)
}

/// Waits until the node at `addr` reports `n` subscriptions.
fn wait_subs(addr: &str, n: u64) {
    let t = Instant::now();
    loop {
        let s = run(&["stats", "-n", &format!("skiff://{addr}"), "--json"]);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        if v["subscriptions"].as_u64() == Some(n) {
            return;
        }
        assert!(
            t.elapsed() < PATIENCE,
            "not {n} subscriptions on {addr}: {s}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn next(s: &mut Subscription, what: &str) -> skiff::client::Delivery {
    tokio::time::timeout(PATIENCE, s.recv())
        .await
        .unwrap_or_else(|_| panic!("no delivery: {what}"))
        .unwrap_or_else(|| panic!("subscription ended: {what}: {:?}", s.error()))
}

/// Waits for the `Reconnected` event and returns its gap.
async fn reconnected(events: &mut skiff::client::Events) -> skiff::client::Gap {
    loop {
        let e = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .expect("an event")
            .expect("events go on");
        if let ClientEvent::Reconnected(g) = e {
            return g;
        }
    }
}

/// Publishes `subject` through a fresh client of the node at `addr`.
async fn publish(addr: &str, subject: &str, payload: &str) {
    let p = Client::connect(&format!("skiff://{addr}")).await.unwrap();
    p.publish(Message::new(subject, payload.to_owned()))
        .await
        .unwrap();
    p.flush().await.unwrap();
}

/// Kills node A under a client attached to it over shm (with a plain and
/// a shared-buffer subscription) and checks that both go on through B.
async fn fails_over(list: &str, a: Proc, aa: &str, ba: &str, b_is_shm: bool) {
    let c = Client::connect(list).await.unwrap();
    assert!(c.node().unwrap().starts_with("shm://fa"), "{:?}", c.node());
    let mut events = c.events();
    let mut plain = c.subscribe("fo.>", "*").await.unwrap();
    let mut shared = c
        .subscribe_with(
            "fo.>",
            "*",
            SubOptions::default().shared_buffer(Flow::Credits),
        )
        .await
        .unwrap();
    // Two subscriptions on A: the plain one, and the topic's own.
    wait_subs(aa, 2);
    publish(aa, "fo.a", "one").await;
    for s in [&mut plain, &mut shared] {
        let d = next(s, "via A").await;
        assert_eq!(&d.msg.payload[..], b"one");
        assert!(d.gap().is_none());
    }

    // kill -9: no goodbye from the node.
    let mut a = a;
    a.0.kill().unwrap();
    a.0.wait().unwrap();
    let gap = reconnected(&mut events).await;
    assert!(gap.from.starts_with("shm://fa"), "{gap:?}");
    let to_b = if b_is_shm {
        gap.to.starts_with("shm://fb")
    } else {
        gap.to.ends_with(ba)
    };
    assert!(to_b, "{gap:?}");
    assert_eq!(c.link_stats().failovers, 1);
    // Both restored on B (over shm, the shared one as the topic's own
    // subscription; over TCP as a plain one).
    wait_subs(ba, 2);
    for i in 0..3 {
        publish(ba, &format!("fo.b.{i}"), "x").await;
    }
    for s in [&mut plain, &mut shared] {
        for i in 0..3 {
            let d = next(s, "via B").await;
            assert_eq!(&d.msg.subject[..], format!("fo.b.{i}"));
            // The first message after the failover carries the gap.
            assert_eq!(d.gap().is_some(), i == 0, "message {i}");
        }
        assert_eq!(s.gaps(), 1);
        assert!(
            tokio::time::timeout(Duration::from_millis(200), s.recv())
                .await
                .is_err(),
            "nothing delivered twice"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_client_fails_over_to_a_second_shm_node() {
    let dir = Dir::new("ss");
    let (a, aa) = start_node(Some(&dir.shm("fa")));
    let (_b, ba) = start_node(Some(&dir.shm("fb")));
    let list = format!("shm://fa,fb?dir={}", dir.0.display());
    fails_over(&list, a, &aa, &ba, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_client_fails_over_to_a_node_over_tcp() {
    let dir = Dir::new("st");
    let (a, aa) = start_node(Some(&dir.shm("fa")));
    let (_b, ba) = start_node(None);
    let list = format!("shm://fa,skiff://{ba}?dir={}", dir.0.display());
    fails_over(&list, a, &aa, &ba, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unconfirmed_publishes_of_a_killed_shm_node_are_reported() {
    let dir = Dir::new("un");
    let (a, _aa) = start_node(Some(&dir.shm("fa")));
    let (_b, ba) = start_node(Some(&dir.shm("fb")));
    let sub = Client::connect(&format!("skiff://{ba}")).await.unwrap();
    let mut s = sub.subscribe("u.>", "*").await.unwrap();
    let p = Client::connect(&format!("shm://fa,fb?dir={}", dir.0.display()))
        .await
        .unwrap();
    let mut events = p.events();
    for i in 1..=100u64 {
        p.publish(Message::new("u.a", i.to_string())).await.unwrap();
    }
    p.flush().await.unwrap();
    let t = Instant::now();
    while p.link_stats().unconfirmed != 0 {
        assert!(t.elapsed() < PATIENCE, "A confirms the first 100");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A stops reading its ring; 50 more go into it, unconfirmed. (kill
    // returns before the process has stopped: wait until it has, or A may
    // still take one of the 50.)
    a.signal(libc::SIGSTOP);
    let stat = format!("/proc/{}/stat", a.0.id());
    let t = Instant::now();
    while !std::fs::read_to_string(&stat)
        .map(|st| {
            st.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('T')
        })
        .unwrap_or(false)
    {
        assert!(t.elapsed() < PATIENCE, "A stopped");
        std::thread::sleep(Duration::from_millis(1));
    }
    for i in 101..=150u64 {
        p.publish(Message::new("u.a", i.to_string())).await.unwrap();
    }
    assert_eq!(p.link_stats().unconfirmed, 50);
    a.signal(libc::SIGKILL);
    let u = loop {
        let e = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .expect("an event")
            .expect("events go on");
        if let ClientEvent::Unconfirmed(u) = e {
            break u;
        }
    };
    assert_eq!((u.first, u.last, u.held, u.forgotten), (101, 150, 50, 0));
    assert!(u.node.starts_with("shm://fa"), "{}", u.node);
    let back = p.unconfirmed();
    assert_eq!(back.len(), 50);
    let t = Instant::now();
    while !p.node().is_some_and(|n| n.starts_with("shm://fb")) {
        assert!(t.elapsed() < PATIENCE, "failed over to B");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for (_, m) in back {
        p.publish(m).await.unwrap();
    }
    p.flush().await.unwrap();
    for want in 101..=150u64 {
        let d = next(&mut s, "republished via B").await;
        assert_eq!(&d.msg.payload[..], want.to_string().as_bytes());
    }
}
