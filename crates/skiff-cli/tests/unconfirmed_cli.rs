//! A publisher learns which of its publishes may not have reached its node
//! (issue 16, item 4), against real `skiff node` processes: the publisher
//! lists two nodes (`skiff://A,B`); A confirms what it takes (`Taken`
//! frames); A is stopped (SIGSTOP) with more publishes sent to it, then
//! killed (SIGKILL). The client fails over to B and reports exactly the
//! publishes A never confirmed, hands them back for republishing, and
//! `skiff pub` prints them and exits non-zero.

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use skiff::client::{Client, ClientEvent};
use skiff::Message;

mod cli_util;
use cli_util::mesh::{Proc, PATIENCE};
use cli_util::{free_port, skiff, wait_line};

/// Starts a node on a free TCP port; returns once it listens, with its
/// address.
fn start_node() -> (Proc, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = skiff()
        .args(["node", "--tcp", &addr])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn skiff node");
    wait_line(child.stderr.take().unwrap(), "listening on tcp", PATIENCE);
    (Proc(child), addr)
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < PATIENCE, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unconfirmed_publishes_of_a_killed_node_are_reported_and_handed_back() {
    let (a, aa) = start_node();
    let (_b, ba) = start_node();
    let sub = Client::connect(&format!("skiff://{ba}")).await.unwrap();
    let mut s = sub.subscribe("u.>", "*").await.unwrap();
    let p = Client::connect(&format!("skiff://{aa},{ba}"))
        .await
        .unwrap();
    let mut events = p.events();
    for i in 1..=100u64 {
        p.publish(Message::new("u.a", i.to_string())).await.unwrap();
    }
    p.flush().await.unwrap();
    until("A confirms the first 100", || {
        p.link_stats().unconfirmed == 0
    })
    .await;

    // A stops reading; 50 more go into its socket, unconfirmed.
    a.signal(libc::SIGSTOP);
    for i in 101..=150u64 {
        p.publish(Message::new("u.a", i.to_string())).await.unwrap();
    }
    assert_eq!(p.link_stats().unconfirmed, 50);
    a.signal(libc::SIGKILL);

    let t = Instant::now();
    let u = loop {
        let e = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .expect("an event")
            .expect("events go on");
        if let ClientEvent::Unconfirmed(u) = e {
            break u;
        }
        assert!(t.elapsed() < PATIENCE, "no Unconfirmed event");
    };
    assert_eq!((u.first, u.last, u.held, u.forgotten), (101, 150, 50, 0));
    assert!(u.node.ends_with(&aa), "{}", u.node);
    assert_eq!(u.subjects, vec!["u.a".to_string()]);
    assert!(u.to_string().contains("101-150"), "{u}");

    // Taken back exactly once, numbered, with their payloads.
    let back = p.unconfirmed();
    assert_eq!(back.len(), 50);
    for (k, (n, m)) in back.iter().enumerate() {
        assert_eq!(*n, 101 + k as u64);
        assert_eq!(&m.payload[..], n.to_string().as_bytes());
    }
    assert!(p.unconfirmed().is_empty(), "handed back once");
    assert_eq!(p.link_stats().maybe_lost, 50);

    // Republished through B, followed by new ones: all arrive, in order.
    until("failed over to B", || {
        p.node().is_some_and(|n| n.ends_with(&ba))
    })
    .await;
    for (_, m) in back {
        p.publish(m).await.unwrap();
    }
    for i in 151..=160u64 {
        p.publish(Message::new("u.a", i.to_string())).await.unwrap();
    }
    p.flush().await.unwrap();
    for want in 101..=160u64 {
        let d = tokio::time::timeout(PATIENCE, s.recv())
            .await
            .expect("delivery")
            .expect("subscription open");
        assert_eq!(&d.msg.payload[..], want.to_string().as_bytes());
    }
    until("B confirms everything", || p.link_stats().unconfirmed == 0).await;
}

#[test]
fn skiff_pub_names_the_messages_a_killed_node_may_have_lost() {
    let (a, aa) = start_node();
    let (_b, ba) = start_node();
    let mut child = skiff()
        .args(["pub", "-n", &format!("skiff://{aa},{ba}"), "u.c"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn skiff pub");
    let mut stdin = child.stdin.take().unwrap();
    let write = |stdin: &mut std::process::ChildStdin, r: std::ops::RangeInclusive<u32>| {
        for i in r {
            writeln!(stdin, "{i}").unwrap();
        }
        stdin.flush().unwrap();
    };
    write(&mut stdin, 1..=100);
    // Time for `skiff pub` to read and send them and for A to confirm
    // (ordering only; nothing is measured).
    std::thread::sleep(Duration::from_secs(1));
    a.signal(libc::SIGSTOP);
    write(&mut stdin, 101..=150);
    std::thread::sleep(Duration::from_secs(1));
    a.signal(libc::SIGKILL);
    write(&mut stdin, 151..=160);
    drop(stdin);
    let out = child.wait_with_output().expect("skiff pub ends");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "skiff pub exited 0: {err}");
    assert!(
        err.contains("messages 101-150 may be missing"),
        "stderr: {err}"
    );
    assert!(err.contains("50 message(s) may not have reached"), "{err}");
}
