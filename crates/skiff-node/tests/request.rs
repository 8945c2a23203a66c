//! Request/reply, clusters, broadcast and tunnels, on every transport.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::H;
use skiff::client::{Client, Incoming, Member, Target};
use skiff::Message;

on_every_transport!(
    request_gets_the_first_reply,
    request_times_out,
    no_responders_is_immediate,
    scatter_gather_collects_every_reply,
    cluster_round_robin_follows_capacity,
    key_affinity_sticks_while_the_member_lives,
    broadcast_reaches_every_member,
    tunnel_is_ordered_both_ways,
    member_leaving_mid_request_ends_it,
);

/// Answers every request on `m` with `name`.
fn serve(m: Member, name: &'static str) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(i) = m.recv().await {
            if let Incoming::Request(r) = i {
                r.reply(Message::new("", name)).await.unwrap();
            }
        }
    })
}

async fn request_gets_the_first_reply(h: H) {
    let server = h.client().await;
    let mut sub = server.subscribe("svc.echo", "*").await.unwrap();
    let s2 = server.clone();
    tokio::spawn(async move {
        while let Some(d) = sub.recv().await {
            assert!(d.is_request());
            let payload = d.payload.clone();
            s2.reply(&d, Message::new("", payload)).await.unwrap();
        }
    });
    let c = h.client().await;
    for i in 0..100u32 {
        let r = c
            .request(
                "svc.echo",
                Message::new("", i.to_le_bytes().to_vec()),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert_eq!(r.payload[..], i.to_le_bytes());
    }
    // Concurrent requesters.
    let mut tasks = Vec::new();
    for i in 0..16u32 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            for j in 0..50u32 {
                let v = i * 1000 + j;
                let r = c
                    .request(
                        "svc.echo",
                        Message::new("", v.to_le_bytes().to_vec()),
                        Duration::from_secs(5),
                    )
                    .await
                    .unwrap();
                assert_eq!(r.payload[..], v.to_le_bytes());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let st = c.stats().await.unwrap();
    assert_eq!(
        st.clients.iter().map(|c| c.requests_waiting).sum::<usize>(),
        0
    );
}

async fn request_times_out(h: H) {
    let silent = h.client().await;
    let _sub = silent.subscribe("svc.silent", "*").await.unwrap();
    let c = h.client().await;
    let t = Instant::now();
    let e = c
        .request(
            "svc.silent",
            Message::new("", "?"),
            Duration::from_millis(200),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, skiff::Error::Timeout), "{e}");
    assert!(t.elapsed() >= Duration::from_millis(200));
    // The node forgot the request.
    c.flush().await.unwrap();
    let st = c.stats().await.unwrap();
    assert_eq!(
        st.clients.iter().map(|c| c.requests_waiting).sum::<usize>(),
        0
    );
}

async fn no_responders_is_immediate(h: H) {
    let c = h.client().await;
    let t = Instant::now();
    for target in [Target::from("nobody.home"), Target::cluster("empty")] {
        let e = c
            .request(target, Message::new("", "?"), Duration::from_secs(30))
            .await
            .unwrap_err();
        assert!(matches!(e, skiff::Error::NoResponders { .. }), "{e}");
    }
    let e = c
        .tunnel(Target::cluster("empty"), Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(matches!(e, skiff::Error::NoResponders { .. }), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5));
}

async fn scatter_gather_collects_every_reply(h: H) {
    let mut servers = Vec::new();
    for i in 0..3u8 {
        let s = h.client().await;
        let mut sub = s.subscribe("sg.*", "*").await.unwrap();
        let s2 = s.clone();
        tokio::spawn(async move {
            while let Some(d) = sub.recv().await {
                s2.reply(&d, Message::new("", vec![i])).await.unwrap();
            }
        });
        servers.push(s);
    }
    let c = h.client().await;
    let t = Instant::now();
    let mut r = c
        .request_many("sg.q", Message::new("", "?"), Duration::from_secs(20), 10)
        .await
        .unwrap();
    // Every responder answered: no need to wait for the deadline.
    assert!(t.elapsed() < Duration::from_secs(10));
    r.sort_by_key(|m| m.payload[0]);
    assert_eq!(
        r.iter().map(|m| m.payload[0]).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    // `max` caps the replies.
    let r = c
        .request_many("sg.q", Message::new("", "?"), Duration::from_secs(20), 2)
        .await
        .unwrap();
    assert_eq!(r.len(), 2);
    // Scatter-gather over a cluster: every member.
    let mut members = Vec::new();
    for (i, name) in ["m0", "m1", "m2"].into_iter().enumerate() {
        let m = servers[i].join("sgc", 1).await.unwrap();
        members.push(serve(m, name));
    }
    let r = c
        .request_many(
            Target::cluster("sgc"),
            Message::new("", "?"),
            Duration::from_secs(20),
            10,
        )
        .await
        .unwrap();
    assert_eq!(r.len(), 3);
}

async fn cluster_round_robin_follows_capacity(h: H) {
    let names = ["a", "b", "c"];
    let mut clients = Vec::new();
    for (i, name) in names.into_iter().enumerate() {
        let c = h.client().await;
        let m = c.join("work", i as u32 + 1).await.unwrap();
        serve(m, name);
        clients.push(c);
    }
    let c = h.client().await;
    let mut counts: HashMap<String, usize> = HashMap::new();
    for _ in 0..600 {
        let r = c
            .request(
                Target::cluster("work"),
                Message::new("", ""),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        *counts
            .entry(String::from_utf8_lossy(&r.payload).into_owned())
            .or_default() += 1;
    }
    // Exactly one member per request, in proportion to capacity 1:2:3.
    assert_eq!(counts["a"], 100, "{counts:?}");
    assert_eq!(counts["b"], 200, "{counts:?}");
    assert_eq!(counts["c"], 300, "{counts:?}");
}

async fn key_affinity_sticks_while_the_member_lives(h: H) {
    let names = ["a", "b", "c", "d"];
    let mut members: Vec<(Client, tokio::task::JoinHandle<()>)> = Vec::new();
    for name in names {
        let c = h.client().await;
        let m = c.join("kv", 1).await.unwrap();
        members.push((c, serve(m, name)));
    }
    let c = h.client().await;
    let ask = |key: String| {
        let c = c.clone();
        async move {
            let r = c
                .request(
                    Target::cluster("kv").with_key(key),
                    Message::new("", ""),
                    Duration::from_secs(5),
                )
                .await
                .unwrap();
            String::from_utf8_lossy(&r.payload).into_owned()
        }
    };
    let mut owner = HashMap::new();
    for k in 0..100 {
        owner.insert(k, ask(format!("key-{k}")).await);
    }
    let distinct: std::collections::HashSet<_> = owner.values().collect();
    assert!(
        distinct.len() >= 3,
        "keys spread over members: {distinct:?}"
    );
    for k in 0..100 {
        assert_eq!(ask(format!("key-{k}")).await, owner[&k], "key-{k} moved");
    }
    // When member "a" leaves, only its keys move.
    let (ca, ta) = members.remove(0);
    ta.abort();
    drop(ca);
    tokio::time::sleep(Duration::from_millis(50)).await;
    for k in 0..100 {
        let now = ask(format!("key-{k}")).await;
        if owner[&k] != "a" {
            assert_eq!(now, owner[&k], "key-{k} moved though its member stayed");
        } else {
            assert_ne!(now, "a");
        }
    }
}

async fn broadcast_reaches_every_member(h: H) {
    let mut members = Vec::new();
    for cap in [0, 1, 5] {
        let c = h.client().await;
        let m = c.join("all", cap).await.unwrap();
        members.push((c, m));
    }
    let p = h.client().await;
    p.broadcast("all", Message::new("news", "hello"))
        .await
        .unwrap();
    for (_, m) in &members {
        match tokio::time::timeout(Duration::from_secs(5), m.recv())
            .await
            .unwrap()
        {
            Some(Incoming::Broadcast(msg)) => assert_eq!(&msg.payload[..], b"hello"),
            other => panic!("{other:?}"),
        }
    }
}

async fn tunnel_is_ordered_both_ways(h: H) {
    let server = h.client().await;
    let m = server.join("tun", 1).await.unwrap();
    let srv = tokio::spawn(async move {
        let Some(Incoming::Tunnel(t)) = m.recv().await else {
            panic!("no tunnel");
        };
        // Echo each message back, in order.
        while let Some(msg) = t.recv().await {
            t.send(msg).await.unwrap();
        }
    });
    let c = h.client().await;
    let t = c
        .tunnel(Target::cluster("tun"), Duration::from_secs(5))
        .await
        .unwrap();
    let n = 3000u32; // many times the window: flow control must work
                     // Send and receive on one task, at most 100 ahead: the window (256)
                     // is many times smaller than `n`, so credit must flow back.
    let mut next = 0u32;
    let mut sent = 0u32;
    while next < n {
        while sent < n && sent - next < 100 {
            t.send(Message::new("", sent.to_le_bytes().to_vec()))
                .await
                .unwrap();
            sent += 1;
        }
        let m = tokio::time::timeout(Duration::from_secs(5), t.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(m.payload[..], next.to_le_bytes());
        next += 1;
    }
    t.close();
    // The server sees the close and ends.
    tokio::time::timeout(Duration::from_secs(5), srv)
        .await
        .unwrap()
        .unwrap();
}

async fn member_leaving_mid_request_ends_it(h: H) {
    let member = h.client().await;
    let m = member.join("flaky", 1).await.unwrap();
    let c = h.client().await;
    let req = tokio::spawn({
        let c = c.clone();
        async move {
            c.request(
                Target::cluster("flaky"),
                Message::new("", "?"),
                Duration::from_secs(30),
            )
            .await
        }
    });
    // The member receives the request and disconnects without replying.
    let Some(Incoming::Request(_r)) = m.recv().await else {
        panic!()
    };
    drop(m);
    member.close();
    let t = Instant::now();
    let e = req.await.unwrap().unwrap_err();
    assert!(matches!(e, skiff::Error::NoResponders { .. }), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10));
}
