//! The mesh with real nodes and sockets in this process: three nodes on
//! loopback find each other through a seed, and publish/subscribe,
//! requests to subjects and clusters, scatter-gather and broadcast work
//! across them, each client talking only to its own node.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use skiff::client::{Client, Incoming, Target};
use skiff::{Error, Message};
use skiff_node::{Config, MeshSettings, Node};

/// Long enough for anything that should happen; tests never assert timing.
const PATIENCE: Duration = Duration::from_secs(20);

async fn node(net: &str, seeds: Vec<String>) -> Node {
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

async fn three(net: &str) -> Vec<Node> {
    let a = node(net, vec![]).await;
    let seed = a.mesh_addr().unwrap().to_string();
    let b = node(net, vec![seed.clone()]).await;
    let c = node(net, vec![seed]).await;
    let nodes = vec![a, b, c];
    wait_for(|| {
        nodes
            .iter()
            .all(|n| n.broker().mesh().unwrap().view().stats.members_up == 2)
    })
    .await;
    nodes
}

async fn wait_for(mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < PATIENCE, "condition not reached in time");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn client(n: &Node) -> Client {
    Client::connect(&format!("skiff://{}", n.tcp_addr().unwrap()))
        .await
        .unwrap()
}

/// Patterns node `at` knows of, summed over its peers.
fn known_patterns(n: &Node) -> usize {
    let v = n.broker().mesh().unwrap().view();
    v.peers.iter().map(|p| p.patterns).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_reaches_subscribers_on_every_node_once() {
    let nodes = three(&format!("t-pub-{}", std::process::id())).await;
    let (a, b, c) = (
        client(&nodes[0]).await,
        client(&nodes[1]).await,
        client(&nodes[2]).await,
    );
    let mut sb = b.subscribe("m.x", "*").await.unwrap();
    // Two overlapping patterns on one node: it still gets each message once
    // from the mesh (and each subscription its own copy locally).
    let mut sc = c.subscribe("m.>", "*").await.unwrap();
    let mut sc2 = c.subscribe("m.*", "*").await.unwrap();
    wait_for(|| known_patterns(&nodes[0]) == 3).await;
    for i in 0..100u32 {
        a.publish(Message::new("m.x", i.to_string())).await.unwrap();
    }
    for s in [&mut sb, &mut sc, &mut sc2] {
        for i in 0..100u32 {
            let d = tokio::time::timeout(PATIENCE, s.recv())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(d.msg.payload, i.to_string().into_bytes());
        }
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(sb.try_recv().is_none() && sc.try_recv().is_none() && sc2.try_recv().is_none());
    // A sent one datagram stream to each of B and C, not one per pattern.
    let v = nodes[0].broker().mesh().unwrap().view();
    let frames: u64 = v.peers.iter().map(|p| p.sent_frames).sum();
    assert_eq!(frames, 200, "{v:?}");
    // Once C unsubscribes both, A stops sending there.
    drop(sc);
    drop(sc2);
    wait_for(|| known_patterns(&nodes[0]) == 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_cross_nodes_and_spread_by_capacity() {
    let nodes = three(&format!("t-req-{}", std::process::id())).await;
    let (a, b, c) = (
        client(&nodes[0]).await,
        client(&nodes[1]).await,
        client(&nodes[2]).await,
    );
    let mb = b.join("svc", 1).await.unwrap();
    let mc = c.join("svc", 3).await.unwrap();
    wait_for(|| {
        let v = nodes[0].broker().mesh().unwrap().view();
        v.peers.iter().filter(|p| p.clusters == 1).count() == 2
    })
    .await;
    let serve = |m: skiff::client::Member, who: &'static str| {
        tokio::spawn(async move {
            while let Some(i) = m.recv().await {
                match i {
                    Incoming::Request(r) => {
                        r.reply(Message::new("", who)).await.unwrap();
                    }
                    Incoming::Broadcast(msg) => {
                        assert_eq!(&msg.payload[..], b"all");
                    }
                    _ => {}
                }
            }
        })
    };
    let _tb = serve(mb, "b");
    let _tc = serve(mc, "c");
    let mut n: BTreeMap<Vec<u8>, usize> = BTreeMap::new();
    for _ in 0..40 {
        let r = a
            .request(Target::cluster("svc"), Message::new("", "q"), PATIENCE)
            .await
            .unwrap();
        *n.entry(r.payload.to_vec()).or_default() += 1;
    }
    // Weighted round robin over advertised capacity 1 : 3.
    assert_eq!(n.get(&b"b"[..]), Some(&10), "{n:?}");
    assert_eq!(n.get(&b"c"[..]), Some(&30), "{n:?}");

    // Scatter-gather reaches every member on every node.
    let all = a
        .request_many(Target::cluster("svc"), Message::new("", "q"), PATIENCE, 10)
        .await
        .unwrap();
    let mut who: Vec<Vec<u8>> = all.into_iter().map(|m| m.payload.to_vec()).collect();
    who.sort();
    assert_eq!(who, vec![b"b".to_vec(), b"c".to_vec()]);

    // A subject request answered on another node.
    let mut echo = c.subscribe("svc.echo", "*").await.unwrap();
    wait_for(|| known_patterns(&nodes[0]) == 1).await;
    let responder = tokio::spawn({
        let c = c.clone();
        async move {
            let d = echo.recv().await.unwrap();
            c.reply(&d, Message::new("", "echoed")).await.unwrap();
        }
    });
    let r = a
        .request("svc.echo", Message::new("svc.echo", "hi"), PATIENCE)
        .await
        .unwrap();
    assert_eq!(&r.payload[..], b"echoed");
    responder.await.unwrap();

    // Nobody anywhere: a clear error, not a timeout.
    let e = a
        .request("nobody.here", Message::new("", ""), PATIENCE)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NoResponders { .. }), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcast_reaches_members_on_every_node() {
    let nodes = three(&format!("t-bc-{}", std::process::id())).await;
    let (a, b, c) = (
        client(&nodes[0]).await,
        client(&nodes[1]).await,
        client(&nodes[2]).await,
    );
    let ma = a.join("grp", 0).await.unwrap();
    let mb = b.join("grp", 0).await.unwrap();
    let mc = c.join("grp", 0).await.unwrap();
    // Capacity 0 still advertises membership for broadcasts.
    wait_for(|| {
        let v = nodes[0].broker().mesh().unwrap().view();
        v.peers.iter().filter(|p| p.clusters == 1).count() == 2
    })
    .await;
    a.broadcast("grp", Message::new("", "all")).await.unwrap();
    for m in [&ma, &mb, &mc] {
        let Some(Incoming::Broadcast(msg)) =
            tokio::time::timeout(PATIENCE, m.recv()).await.unwrap()
        else {
            panic!("expected a broadcast")
        };
        assert_eq!(&msg.payload[..], b"all");
    }
}
