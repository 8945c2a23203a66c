//! The sealed mesh with real nodes and sockets in this process: nodes that
//! share the mesh secret (or trust each other's identity keys) form a mesh
//! and carry publishes; a node with another secret, without one, or with
//! an untrusted key never becomes a member, receives nothing and injects
//! nothing; plain and forged datagrams sent to a node's socket are dropped
//! and counted. (Replayed and bit-flipped datagrams are shown on the
//! sealing layer's own bytes in `mesh/seal/tests.rs`.)

mod common;

use std::time::{Duration, Instant};

use skiff::client::Client;
use skiff::Message;
use skiff_node::auth::Secret;
use skiff_node::{Config, MeshSettings, Node};

const PATIENCE: Duration = Duration::from_secs(20);

async fn node(net: &str, seeds: Vec<String>, m: MeshSettings) -> Node {
    let config = Config {
        tcp: Some("127.0.0.1:0".parse().unwrap()),
        mesh: Some(MeshSettings {
            bind: "127.0.0.1:0".parse().unwrap(),
            net: net.into(),
            seeds,
            scout: false,
            ..m
        }),
        ..Config::default()
    };
    Node::start(&config).await.unwrap()
}

fn secret(s: &str) -> MeshSettings {
    MeshSettings {
        secret: Some(Secret::new(s)),
        ..MeshSettings::default()
    }
}

async fn wait_for(mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < PATIENCE, "condition not reached in time");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn up(n: &Node) -> usize {
    n.broker().mesh().unwrap().view().stats.members_up
}

async fn client(n: &Node) -> Client {
    Client::connect(&format!("skiff://{}", n.tcp_addr().unwrap()))
        .await
        .unwrap()
}

/// `a` publishes on `t.x`; whether `sub` (a subscription elsewhere) gets
/// it within a second.
async fn reaches(a: &Client, sub: &mut skiff::client::Subscription, text: &str) -> bool {
    a.publish(Message::new("t.x", text.to_string()))
        .await
        .unwrap();
    matches!(
        tokio::time::timeout(Duration::from_secs(1), sub.recv()).await,
        Ok(Some(d)) if d.payload[..] == *text.as_bytes()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_nodes_with_the_secret_join_and_exchange() {
    let net = format!("seal-{}", std::process::id());
    let a = node(&net, vec![], secret("s3cret")).await;
    let seed = a.mesh_addr().unwrap().to_string();
    let b = node(&net, vec![seed.clone()], secret("s3cret")).await;
    let wrong = node(&net, vec![seed.clone()], secret("guess")).await;
    let plain = node(&net, vec![seed], MeshSettings::default()).await;
    wait_for(|| up(&a) == 1 && up(&b) == 1).await;
    let (ca, cb, cw, cp) = (
        client(&a).await,
        client(&b).await,
        client(&wrong).await,
        client(&plain).await,
    );
    let mut sb = cb.subscribe("t.x", "*").await.unwrap();
    let mut sw = cw.subscribe("t.x", "*").await.unwrap();
    let mut sp = cp.subscribe("t.x", "*").await.unwrap();
    // Interest travels (sealed) before publishes reach the other node.
    let mut got = false;
    for i in 0..100 {
        if reaches(&ca, &mut sb, &format!("m{i}")).await {
            got = true;
            break;
        }
    }
    assert!(got, "a sealed mesh carried nothing");
    // The outsiders are no members and receive nothing published on a.
    assert!(!reaches(&ca, &mut sw, "to wrong").await);
    assert!(!reaches(&ca, &mut sp, "to plain").await);
    // And what they publish reaches no one inside.
    let mut sa = ca.subscribe("t.x", "*").await.unwrap();
    while tokio::time::timeout(Duration::from_millis(200), sa.recv())
        .await
        .is_ok()
    {}
    assert!(!reaches(&cw, &mut sa, "from wrong").await);
    assert!(!reaches(&cp, &mut sa, "from plain").await);
    assert_eq!((up(&a), up(&b), up(&wrong), up(&plain)), (1, 1, 0, 0));
    let s = a.broker().mesh().unwrap().view().seal.unwrap();
    assert!(s.handshakes >= 1, "{s:?}");
    assert!(
        s.bad_handshakes >= 1,
        "the wrong secret's handshakes: {s:?}"
    );
    assert!(s.plain >= 1, "the plain node's datagrams: {s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_keys_admit_only_the_listed_nodes() {
    let dir = common::temp_dir("seal-keys");
    let key = |n: &str| dir.0.join(format!("{n}.key"));
    let pub_a = skiff_node::mesh::identity_public_key(&key("a")).unwrap();
    let pub_b = skiff_node::mesh::identity_public_key(&key("b")).unwrap();
    let pub_m = skiff_node::mesh::identity_public_key(&key("m")).unwrap();
    let trust = |me: &str| MeshSettings {
        identity: Some(key(me)),
        trusted_keys: vec![pub_a.clone(), pub_b.clone()],
        ..MeshSettings::default()
    };
    let net = format!("seal-keys-{}", std::process::id());
    let a = node(&net, vec![], trust("a")).await;
    let seed = a.mesh_addr().unwrap().to_string();
    let b = node(&net, vec![seed.clone()], trust("b")).await;
    // `m` trusts everyone listed and itself, but is not on the list of a or b.
    let m = node(
        &net,
        vec![seed],
        MeshSettings {
            identity: Some(key("m")),
            trusted_keys: vec![pub_a.clone(), pub_b.clone(), pub_m.clone()],
            ..MeshSettings::default()
        },
    )
    .await;
    wait_for(|| up(&a) == 1 && up(&b) == 1).await;
    assert_eq!(
        a.broker().mesh().unwrap().identity().map(|k| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(k)
        }),
        Some(pub_a.clone()),
        "the kept key file is the node's identity"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(up(&m), 0);
    assert_eq!(up(&a), 1);
    let s = a.broker().mesh().unwrap().view().seal.unwrap();
    assert!(s.untrusted >= 1, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_forged_datagrams_on_the_socket_are_dropped_and_counted() {
    let net = format!("seal-raw-{}", std::process::id());
    let a = node(&net, vec![], secret("k")).await;
    let to = a.mesh_addr().unwrap();
    let s = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    // A plain mesh datagram (swim kind), and sealed-looking data for a
    // session that does not exist, and a short one.
    let mut plain = b"SM\x01\x01".to_vec();
    plain.extend_from_slice(&[0; 40]);
    let mut forged = b"SX\x01\x04".to_vec();
    forged.extend_from_slice(&[7; 60]);
    for d in [&plain[..], &forged[..], b"SX"] {
        s.send_to(d, to).await.unwrap();
    }
    wait_for(|| {
        let v = a.broker().mesh().unwrap().view().seal.unwrap();
        v.plain >= 2 && v.unknown_session >= 1
    })
    .await;
    assert_eq!(up(&a), 0);
}
