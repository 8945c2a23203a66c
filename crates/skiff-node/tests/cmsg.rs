//! cMsg patterns end to end, on every transport and across two meshed
//! nodes: each wildcard and range form, types as patterns, the kind chosen
//! per subscription, and a message type checked on publish as on
//! subscribe.

mod common;

use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::{quiet, recv_n, H};
use skiff::client::{Client, Delivery, SubOptions};
use skiff::{Error, Message};
use skiff_node::{Config, MeshSettings, Node};
use skiff_proto::client_frame::{ClientFrame, Code, Decoder, ServerFrame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

on_every_transport!(
    each_wildcard_and_range,
    types_are_patterns,
    kind_is_per_subscription
);

fn subjects(v: Vec<Delivery>) -> Vec<String> {
    v.into_iter().map(|d| d.subject.to_string()).collect()
}

async fn publish_all(c: &Client, subjects: &[&str]) {
    for s in subjects {
        c.publish(Message::new(*s, "x")).await.unwrap();
    }
    c.flush().await.unwrap();
}

async fn each_wildcard_and_range(h: H) {
    let p = h.client().await;
    let c = h.client().await;
    let cm = SubOptions::default().cmsg();
    let mut star = c.subscribe_with("daq.h*b.rate", "*", cm).await.unwrap();
    let mut one = c.subscribe_with("a.b?c", "*", cm).await.unwrap();
    let mut pound = c.subscribe_with("run.#", "*", cm).await.unwrap();
    let mut range = c
        .subscribe_with("ch.{i>5 & i<10 | i=20}", "*", cm)
        .await
        .unwrap();
    let mut lead = c.subscribe_with("*.rate", "*", cm).await.unwrap();
    publish_all(
        &p,
        &[
            "daq.hallb.rate",
            "daq.hb.rate",
            "daq.hallb.rates",
            "a.bxc",
            "a.bc",
            "a.bxxc",
            "run.42",
            "run.x",
            "run.007",
            "ch.5",
            "ch.6",
            "ch.9",
            "ch.10",
            "ch.20",
            "ch.0020",
            "x.rate",
        ],
    )
    .await;
    assert_eq!(
        subjects(recv_n(&mut star, 2).await),
        ["daq.hallb.rate", "daq.hb.rate"]
    );
    assert_eq!(subjects(recv_n(&mut one, 1).await), ["a.bxc"]);
    assert_eq!(subjects(recv_n(&mut pound, 2).await), ["run.42", "run.007"]);
    assert_eq!(
        subjects(recv_n(&mut range, 4).await),
        ["ch.6", "ch.9", "ch.20", "ch.0020"]
    );
    assert_eq!(
        subjects(recv_n(&mut lead, 3).await),
        ["daq.hallb.rate", "daq.hb.rate", "x.rate"]
    );
    for s in [&mut star, &mut one, &mut pound, &mut range, &mut lead] {
        quiet(s).await;
    }
    // A bad cMsg pattern is refused, saying why.
    let e = c.subscribe_with("a{i<", "*", cm).await.unwrap_err();
    assert!(e.to_string().contains("without its `}`"), "{e}");
}

async fn types_are_patterns(h: H) {
    let p = h.client().await;
    let c = h.client().await;
    let cm = SubOptions::default().cmsg();
    let mut count = c.subscribe_with("t", "count?", cm).await.unwrap();
    let mut untyped = c.subscribe_with("t", "", cm).await.unwrap();
    let mut run = c.subscribe_with("t", "v{i<3}", cm).await.unwrap();
    for k in [
        None,
        Some("count1"),
        Some("count"),
        Some("count12"),
        Some("v2"),
        Some("v3"),
    ] {
        let m = Message::new("t", "x");
        p.publish(match k {
            Some(k) => m.with_kind(k),
            None => m,
        })
        .await
        .unwrap();
    }
    p.flush().await.unwrap();
    let kind = |v: Vec<Delivery>| -> Vec<Option<String>> {
        v.into_iter()
            .map(|d| d.kind.as_deref().map(str::to_owned))
            .collect()
    };
    assert_eq!(kind(recv_n(&mut count, 1).await), [Some("count1".into())]);
    assert_eq!(kind(recv_n(&mut untyped, 1).await), [None]);
    assert_eq!(kind(recv_n(&mut run, 1).await), [Some("v2".into())]);
    for s in [&mut count, &mut untyped, &mut run] {
        quiet(s).await;
    }
}

async fn kind_is_per_subscription(h: H) {
    let p = h.client().await;
    let c = h.client().await;
    // The same text: a literal token pattern, or a cMsg pattern.
    let mut tokens = c.subscribe("run.#", "*").await.unwrap();
    let mut cmsg = c
        .subscribe_with("run.#", "*", SubOptions::default().cmsg())
        .await
        .unwrap();
    publish_all(&p, &["run.1", "run.#"]).await;
    assert_eq!(subjects(recv_n(&mut tokens, 1).await), ["run.#"]);
    assert_eq!(subjects(recv_n(&mut cmsg, 1).await), ["run.1"]);
    quiet(&mut tokens).await;
    quiet(&mut cmsg).await;
    // Stats say which kind each subscription is.
    let st = c.stats().await.unwrap();
    let me = st.clients.iter().find(|x| x.id == c.id()).unwrap();
    let mut kinds: Vec<(u64, bool)> = me.subscriptions.iter().map(|s| (s.sid, s.cmsg)).collect();
    kinds.sort();
    assert_eq!(kinds, [(tokens.id(), false), (cmsg.id(), true)]);
    // A type no subscription could name is refused on publish, as on
    // subscribe.
    for bad in ["*", "a b", "t\u{7}"] {
        let e = p
            .publish(Message::new("run.1", "x").with_kind(bad))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Subject(_)), "{bad:?}: {e}");
        assert!(c.subscribe("run.1", bad).await.is_err() || bad == "*");
    }
}

/// The node checks a published type itself, whatever the client did: a
/// raw `Pub` of type `*` or `a b` is refused with an error and reaches no
/// one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_refuses_bad_types_from_raw_clients() {
    let h = H::new(common::Kind::Tcp).await;
    let c = h.client().await;
    let mut all = c.subscribe(">", "*").await.unwrap();
    let mut s = tokio::net::TcpStream::connect(h.node.tcp_addr().unwrap())
        .await
        .unwrap();
    let mut out = Vec::new();
    for k in ["*", "a b", "ok"] {
        ClientFrame::Pub(Message::new("raw", k).with_kind(k)).encode(&mut out);
    }
    s.write_all(&out).await.unwrap();
    let dec = Decoder::new(1 << 21);
    let mut buf = BytesMut::new();
    let mut errors = Vec::new();
    while errors.len() < 2 {
        if let Some(body) = dec.next(&mut buf).unwrap() {
            if let ServerFrame::Error { code, text, .. } =
                ServerFrame::decode(body, 1 << 20).unwrap()
            {
                assert_eq!(code, Code::Invalid);
                errors.push(text);
            }
            continue;
        }
        let n = tokio::time::timeout(Duration::from_secs(10), s.read_buf(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "the node closed the connection");
    }
    assert!(errors[0].contains("type `*`"), "{errors:?}");
    assert!(errors[1].contains("type `a b`"), "{errors:?}");
    let got = recv_n(&mut all, 1).await;
    assert_eq!(got[0].kind.as_deref(), Some("ok"));
    quiet(&mut all).await;
}

async fn mesh_node(net: &str, seeds: Vec<String>) -> Node {
    let config = Config {
        tcp: Some("127.0.0.1:0".parse().unwrap()),
        mesh: Some(MeshSettings {
            bind: "127.0.0.1:0".parse().unwrap(),
            net: net.into(),
            seeds,
            scout: false,
            ..MeshSettings::default()
        }),
        ..Config::default()
    };
    Node::start(&config).await.unwrap()
}

async fn wait_for(mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "condition not reached in time"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Two meshed nodes: a cMsg subscription on B gets what a client of A
/// publishes by cMsg matching (subject and type), and nothing else; the
/// interest A holds for B is the cMsg one, not a token pattern of the same
/// text, and it goes when the subscription does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_two_meshed_nodes() {
    let net = format!("t-cmsg-{}", std::process::id());
    let a = mesh_node(&net, vec![]).await;
    let b = mesh_node(&net, vec![a.mesh_addr().unwrap().to_string()]).await;
    wait_for(|| {
        [&a, &b]
            .iter()
            .all(|n| n.broker().mesh().unwrap().view().stats.members_up == 1)
    })
    .await;
    let ca = Client::connect(&format!("skiff://{}", a.tcp_addr().unwrap()))
        .await
        .unwrap();
    let cb = Client::connect(&format!("skiff://{}", b.tcp_addr().unwrap()))
        .await
        .unwrap();
    let mut s = cb
        .subscribe_with(
            "daq.h*b.{i>5 & i<10 | i=20}",
            "count?",
            SubOptions::default().cmsg(),
        )
        .await
        .unwrap();
    let patterns = |n: &Node| -> usize {
        let v = n.broker().mesh().unwrap().view();
        v.peers.iter().map(|p| p.patterns).sum()
    };
    wait_for(|| patterns(&a) == 1).await;
    let sends = [
        ("daq.hallb.7", Some("count1")),
        ("daq.hallb.7", Some("count")),
        ("daq.hallb.10", Some("count1")),
        ("daq.hb.20", Some("countx")),
        ("daq.h*b.{i>5 & i<10 | i=20}", None),
        ("daq.hallc.7", Some("count1")),
    ];
    for (subject, kind) in sends {
        let m = Message::new(subject, "x");
        let m = match kind {
            Some(k) => m.with_kind(k),
            None => m,
        };
        // The pattern's own text is not a subject: refused here.
        let _ = ca.publish(m).await;
    }
    ca.flush().await.unwrap();
    let got: Vec<(String, Option<String>)> = recv_n(&mut s, 2)
        .await
        .into_iter()
        .map(|d| (d.subject.to_string(), d.kind.as_deref().map(str::to_owned)))
        .collect();
    assert_eq!(
        got,
        [
            ("daq.hallb.7".to_string(), Some("count1".to_string())),
            ("daq.hb.20".to_string(), Some("countx".to_string())),
        ]
    );
    quiet(&mut s).await;
    drop(s);
    wait_for(|| patterns(&a) == 0).await;
}
