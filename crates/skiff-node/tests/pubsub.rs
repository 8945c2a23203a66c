//! Publish/subscribe end to end, on every transport: wildcards, types,
//! ordering, zero-copy fan-out, disconnect cleanup, limits.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{eventually, quiet, recv_n, Kind, H};
use skiff::Message;

on_every_transport!(
    wildcards_and_types,
    order_is_kept_per_publisher,
    subscribe_returns_after_the_node_holds_interest,
    disconnect_cleans_up_interest,
    unsubscribe_stops_delivery,
);

async fn wildcards_and_types(h: H) {
    let p = h.client().await;
    let c = h.client().await;
    let mut star = c.subscribe("a.*.c", "*").await.unwrap();
    let mut rest = c.subscribe("a.>", "*").await.unwrap();
    let mut exact = c.subscribe("a", "*").await.unwrap();
    let mut typed = c.subscribe("a.>", "alarm").await.unwrap();
    let mut untyped = c.subscribe("a.>", "").await.unwrap();
    for s in ["a", "a.b", "a.b.c", "a.x.c", "a.b.b.c", "b.b.c"] {
        p.publish(Message::new(s, Bytes::from_static(b"x")))
            .await
            .unwrap();
    }
    p.publish(Message::new("a.q", "!").with_kind("alarm"))
        .await
        .unwrap();
    p.flush().await.unwrap();
    let subj = |v: Vec<skiff::client::Delivery>| -> Vec<String> {
        v.into_iter().map(|d| d.subject.to_string()).collect()
    };
    assert_eq!(subj(recv_n(&mut star, 2).await), ["a.b.c", "a.x.c"]);
    // `a.>` does not match `a`.
    assert_eq!(
        subj(recv_n(&mut rest, 5).await),
        ["a.b", "a.b.c", "a.x.c", "a.b.b.c", "a.q"]
    );
    assert_eq!(subj(recv_n(&mut exact, 1).await), ["a"]);
    assert_eq!(subj(recv_n(&mut typed, 1).await), ["a.q"]);
    assert_eq!(subj(recv_n(&mut untyped, 4).await).len(), 4);
    for s in [&mut star, &mut rest, &mut exact, &mut typed, &mut untyped] {
        quiet(s).await;
    }
}

async fn order_is_kept_per_publisher(h: H) {
    let p = h.client().await;
    let c = h.client().await;
    let mut s = c
        .subscribe_with("seq", "*", skiff::client::SubOptions::default().window(16))
        .await
        .unwrap();
    let n = 5000u32;
    let pubr = tokio::spawn(async move {
        for i in 0..n {
            p.publish(Message::new("seq", i.to_le_bytes().to_vec()))
                .await
                .unwrap();
        }
        p
    });
    let got = recv_n(&mut s, n as usize).await;
    for (i, d) in got.iter().enumerate() {
        assert_eq!(d.payload[..], (i as u32).to_le_bytes());
    }
    assert_eq!(s.dropped(), 0);
    drop(pubr.await.unwrap());
}

async fn subscribe_returns_after_the_node_holds_interest(h: H) {
    // No slow joiner: a message published by another client right after
    // subscribe returns is delivered, every time.
    let p = h.client().await;
    for i in 0..50 {
        let c = h.client().await;
        let subject = format!("join.{i}");
        let mut s = c.subscribe(&subject, "*").await.unwrap();
        p.publish(Message::new(subject.as_str(), "hi"))
            .await
            .unwrap();
        recv_n(&mut s, 1).await;
    }
}

async fn disconnect_cleans_up_interest(h: H) {
    let c = h.client().await;
    let _s1 = c.subscribe("gone.>", "*").await.unwrap();
    let _s2 = c.subscribe("gone.*", "t").await.unwrap();
    let _m = c.join("svc", 4).await.unwrap();
    let b = h.node.broker().clone();
    assert_eq!(b.subscription_count(), 2);
    drop((_s1, _s2, _m));
    drop(c);
    eventually(|| b.subscription_count() == 0 && b.client_count() == 0).await;
    let p = h.client().await;
    let e = p
        .request(
            skiff::client::Target::cluster("svc"),
            Message::new("x", ""),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, skiff::Error::NoResponders { .. }), "{e}");
    assert_eq!(p.stats().await.unwrap().clusters, 0);
}

async fn unsubscribe_stops_delivery(h: H) {
    let c = h.client().await;
    let mut keep = c.subscribe("u", "*").await.unwrap();
    let gone = c.subscribe("u", "*").await.unwrap();
    gone.unsubscribe();
    c.flush().await.unwrap();
    assert_eq!(h.node.broker().subscription_count(), 1);
    c.publish(Message::new("u", "1")).await.unwrap();
    recv_n(&mut keep, 1).await;
}

/// RocketBufs' splice: one payload, shared by reference count with every
/// matching subscriber.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_shares_one_payload_without_copying() {
    let h = H::new(Kind::Mem).await;
    let p = h.client().await;
    let c1 = h.client().await;
    let c2 = h.client().await;
    let mut a = c1.subscribe("zc.>", "*").await.unwrap();
    let mut b = c2.subscribe("zc.*", "*").await.unwrap();
    let mut b2 = c2.subscribe("zc.x", "*").await.unwrap();
    let payload = Bytes::from(vec![7u8; 4096]);
    let ptr = payload.as_ptr();
    p.publish(Message::new("zc.x", payload)).await.unwrap();
    for s in [&mut a, &mut b, &mut b2] {
        let d = recv_n(s, 1).await;
        assert_eq!(d[0].payload.as_ptr(), ptr, "payload was copied");
    }
}

/// Over a socket the node also shares: every subscriber's copy of a
/// message is a slice of the one frame buffer it arrived in. Checked in
/// the node with a third in-process subscriber.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_over_tcp_shares_the_received_frame() {
    let h = H::new(Kind::Tcp).await;
    let local1 = skiff::Client::attach(&h.node).unwrap();
    let local2 = skiff::Client::attach(&h.node).unwrap();
    let mut a = local1.subscribe("f", "*").await.unwrap();
    let mut b = local2.subscribe("f", "*").await.unwrap();
    let p = h.client().await;
    p.publish(Message::new("f", vec![1u8; 1000])).await.unwrap();
    let x = recv_n(&mut a, 1).await;
    let y = recv_n(&mut b, 1).await;
    assert_eq!(x[0].payload.as_ptr(), y[0].payload.as_ptr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_enforced_and_reported() {
    let mut cfg = skiff_node::Config::default();
    cfg.limits.max_subscriptions = 2;
    cfg.limits.max_payload = 1000;
    cfg.limits.max_subject = 16;
    cfg.limits.max_connections = 3;
    for kind in [Kind::Mem, Kind::Tcp] {
        let h = H::with(kind, cfg.clone()).await;
        let c = h.client().await;
        let _a = c.subscribe("a", "*").await.unwrap();
        let _b = c.subscribe("b", "*").await.unwrap();
        let e = c.subscribe("c", "*").await.unwrap_err();
        assert!(e.to_string().contains("max_subscriptions"), "{e}");
        let e = c
            .publish(Message::new("a", vec![0u8; 1001]))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("max_payload"), "{e}");
        // A subject over the node's limit: reported asynchronously.
        c.publish(Message::new("a.very.long.subject.name", "x"))
            .await
            .unwrap();
        c.flush().await.unwrap();
        let (n, last) = c.async_errors();
        assert_eq!(n, 1);
        assert!(last.unwrap().contains("max_subject"));
        let e = c
            .subscribe("a.very.long.subject.name", "*")
            .await
            .unwrap_err();
        assert!(e.to_string().contains("max_subject"), "{e}");
        let _c2 = h.client().await;
        let _c3 = h.client().await;
        let e = h.try_client().await.unwrap_err();
        assert!(e.to_string().contains("max_connections"), "{e}");
        let st = c.stats().await.unwrap();
        assert!(st.limit_hits >= 4, "{st:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protocol_error_closes_that_client_not_the_node() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = H::new(Kind::Tcp).await;
    let good = h.client().await;
    let mut sub = good.subscribe("still.here", "*").await.unwrap();
    let mut raw = tokio::net::TcpStream::connect(h.node.tcp_addr().unwrap())
        .await
        .unwrap();
    // A frame claiming 2 GB, then garbage.
    raw.write_all(&[0, 0, 0, 0x80, 1, 2, 3]).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("protocol error"), "{text}");
    // An unknown op in a well-formed frame.
    let mut raw = tokio::net::TcpStream::connect(h.node.tcp_addr().unwrap())
        .await
        .unwrap();
    raw.write_all(&[1, 0, 0, 0, 200]).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&got).contains("unknown client frame op"));
    good.publish(Message::new("still.here", "yes"))
        .await
        .unwrap();
    recv_n(&mut sub, 1).await;
    assert_eq!(good.stats().await.unwrap().protocol_errors, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_drains_queued_messages() {
    let h = H::new(Kind::Tcp).await;
    let p = h.client().await;
    let c = h.client().await;
    let mut s = c.subscribe("drain", "*").await.unwrap();
    for i in 0..1000u32 {
        p.publish(Message::new("drain", i.to_le_bytes().to_vec()))
            .await
            .unwrap();
    }
    p.flush().await.unwrap();
    h.node.shutdown().await;
    let got = recv_n(&mut s, 1000).await;
    assert_eq!(got.len(), 1000);
    let end = tokio::time::timeout(Duration::from_secs(5), s.recv())
        .await
        .unwrap();
    assert!(end.is_none());
    assert!(
        s.error().unwrap().contains("shutting down"),
        "{:?}",
        s.error()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_log_appends_and_reads_back() {
    let d = common::temp_dir("log");
    let loc = format!("file://{}", d.0.join("events.log").display());
    let w = skiff::Client::connect(&loc).await.unwrap();
    w.publish(Message::new("log.a", "1").with_kind("t"))
        .await
        .unwrap();
    w.publish(Message::new("log.b", "2")).await.unwrap();
    w.publish(Message::new("other", "3")).await.unwrap();
    let r = skiff::Client::connect(&loc).await.unwrap();
    let mut s = r.subscribe("log.>", "*").await.unwrap();
    let got = recv_n(&mut s, 2).await;
    assert_eq!(&got[0].payload[..], b"1");
    assert_eq!(got[0].kind.as_deref(), Some("t"));
    assert_eq!(&got[1].payload[..], b"2");
    // It follows the log as it grows.
    w.publish(Message::new("log.c", "4")).await.unwrap();
    assert_eq!(&recv_n(&mut s, 1).await[0].payload[..], b"4");
    let e = w.join("x", 1).await.unwrap_err();
    assert!(e.to_string().contains("file://"), "{e}");
}

/// A run of publishes on one subject is checked once for its subject and
/// type, but every message for its size: after a reload lowers
/// `max_payload` (the client still sends up to the limit it was welcomed
/// with), the large messages in the middle of a run are refused and
/// counted, and the small ones around them are delivered, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_on_one_subject_checks_each_payload() {
    for kind in [Kind::Tcp, Kind::Shm] {
        let mut cfg = skiff_node::Config::default();
        cfg.limits.max_payload = 1000;
        let h = H::with(kind, cfg.clone()).await;
        let sub = h.client().await;
        let mut s = sub.subscribe("run", "*").await.unwrap();
        let c = h.client().await;
        // A round trip first: the node has read the client's welcome
        // and made its session (with the limits of then).
        let before = c.stats().await.unwrap().limit_hits;
        let mut lower = cfg.limits.clone();
        lower.max_payload = 100;
        h.node.broker().set_limits(lower);
        for i in 0u8..30 {
            let len = if i % 3 == 1 { 500 } else { 10 };
            c.publish(Message::new("run", vec![i; len])).await.unwrap();
        }
        c.flush().await.unwrap();
        let got = recv_n(&mut s, 20).await;
        let want: Vec<u8> = (0u8..30).filter(|i| i % 3 != 1).collect();
        let seen: Vec<u8> = got.iter().map(|d| d.payload[0]).collect();
        assert_eq!(seen, want, "{kind:?}");
        quiet(&mut s).await;
        eventually(|| {
            let (n, last) = c.async_errors();
            n == 10 && last.is_some_and(|t| t.contains("max_payload"))
        })
        .await;
        assert_eq!(c.stats().await.unwrap().limit_hits, before + 10, "{kind:?}");
    }
}
