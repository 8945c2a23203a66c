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
    node_with(net, seeds, MeshSettings::default()).await
}

async fn node_with(net: &str, seeds: Vec<String>, m: MeshSettings) -> Node {
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
    // A sent one copy to each of B and C over their reliable links, not
    // one per pattern.
    let v = nodes[0].broker().mesh().unwrap().view();
    let frames: u64 = v.links.iter().map(|l| l.sent_frames).sum();
    assert_eq!(frames, 200, "{v:?}");
    let lost: u64 = v.links.iter().map(|l| l.lost + l.dropped_newest).sum();
    assert_eq!(lost, 0, "{v:?}");
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
    // What A's broker routes to, not only what its mesh has heard: the
    // broker learns of remote members a moment after the mesh does.
    wait_for(|| nodes[0].broker().cluster_members("svc") == 2).await;
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
    // Capacity 0 still advertises membership for broadcasts: A's broker
    // routes to its own member and to B's and C's nodes.
    wait_for(|| nodes[0].broker().cluster_members("grp") == 3).await;
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

/// Payload of tunnel message `i`: its number, padded to 100 KB for every
/// thousandth.
fn numbered(i: u32) -> Message {
    let mut p = i.to_le_bytes().to_vec();
    if i % 1000 == 500 {
        p.resize(100_000, (i % 251) as u8);
    }
    Message::new("", p)
}

fn number(m: &Message) -> u32 {
    u32::from_le_bytes(m.payload[..4].try_into().unwrap())
}

async fn incoming_tunnel(m: &skiff::client::Member) -> skiff::client::Tunnel {
    match tokio::time::timeout(PATIENCE, m.recv()).await.unwrap() {
        Some(Incoming::Tunnel(t)) => t,
        other => panic!("expected a tunnel, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_cross_nodes_over_associations() {
    let nodes = three(&format!("t-tun-{}", std::process::id())).await;
    let (a, c) = (client(&nodes[0]).await, client(&nodes[2]).await);
    let member = c.join("tun", 1).await.unwrap();
    wait_for(|| nodes[0].broker().cluster_members("tun") == 1).await;

    // A opens, sends 10,000 numbered messages (ten of 100 KB); the member
    // on C gets them all in order and echoes every thousandth.
    const N: u32 = 10_000;
    let ta = a.tunnel(Target::cluster("tun"), PATIENCE).await.unwrap();
    let tc = incoming_tunnel(&member).await;
    let echo = tokio::spawn(async move {
        for i in 0..N {
            let m = tokio::time::timeout(PATIENCE, tc.recv())
                .await
                .expect("in time")
                .expect("open");
            assert_eq!(number(&m), i);
            let want = if i % 1000 == 500 { 100_000 } else { 4 };
            assert_eq!(m.payload.len(), want);
            if i % 1000 == 0 {
                tc.send(Message::new("", m.payload.clone())).await.unwrap();
            }
        }
        // A closes: the member's end ends.
        let end = tokio::time::timeout(PATIENCE, tc.recv()).await.unwrap();
        assert!(end.is_none(), "{end:?}");
    });
    for i in 0..N {
        ta.send(numbered(i)).await.unwrap();
    }
    for i in 0..N / 1000 {
        let m = tokio::time::timeout(PATIENCE, ta.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(number(&m), i * 1000);
    }
    drop(ta);
    tokio::time::timeout(PATIENCE, echo).await.unwrap().unwrap();

    // Closing from the member's side ends the opener's end.
    let ta = a.tunnel(Target::cluster("tun"), PATIENCE).await.unwrap();
    let tc = incoming_tunnel(&member).await;
    tc.send(Message::new("", "bye")).await.unwrap();
    drop(tc);
    let m = tokio::time::timeout(PATIENCE, ta.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&m.payload[..], b"bye");
    let end = tokio::time::timeout(PATIENCE, ta.recv()).await.unwrap();
    assert!(end.is_none(), "{end:?}");
    assert!(ta.send(Message::new("", "late")).await.is_err());

    let v = nodes[0].broker().mesh().unwrap().view();
    assert_eq!(v.tunnels.bad_frames, 0, "{:?}", v.tunnels);
    assert!(v.tunnels.frames_sent >= N as u64, "{:?}", v.tunnels);
    wait_for(|| {
        nodes.iter().all(|n| {
            let v = n.broker().mesh().unwrap().view();
            v.tunnels.open == 0 && n.broker().stats().tunnels == 0
        })
    })
    .await;

    // Nobody in the cluster any more: a clear error.
    drop(member);
    wait_for(|| nodes[0].broker().cluster_members("tun") == 0).await;
    let e = a
        .tunnel(Target::cluster("tun"), PATIENCE)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NoResponders { .. }), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_ends_when_the_other_node_goes() {
    let mut nodes = three(&format!("t-tun-down-{}", std::process::id())).await;
    let (a, c) = (client(&nodes[0]).await, client(&nodes[2]).await);
    let member = c.join("tun", 1).await.unwrap();
    wait_for(|| nodes[0].broker().cluster_members("tun") == 1).await;
    let ta = a.tunnel(Target::cluster("tun"), PATIENCE).await.unwrap();
    let tc = incoming_tunnel(&member).await;
    tc.send(Message::new("", "hi")).await.unwrap();
    let m = tokio::time::timeout(PATIENCE, ta.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&m.payload[..], b"hi");
    // Node C goes (with its member): A's end of the tunnel ends.
    let gone = nodes.pop().unwrap();
    tokio::time::timeout(PATIENCE, gone.shutdown())
        .await
        .unwrap();
    let end = tokio::time::timeout(PATIENCE, ta.recv()).await.unwrap();
    assert!(end.is_none(), "{end:?}");
    wait_for(|| nodes[0].broker().mesh().unwrap().view().tunnels.open == 0).await;
    assert!(ta.send(Message::new("", "late")).await.is_err());
    // The mesh saw C go (it left before closing its clients): A's client
    // was told why.
    let (n, why) = a.async_errors();
    assert!(
        n >= 1 && why.as_deref().is_some_and(|w| w.contains("went down")),
        "{why:?}"
    );
    drop((tc, member));
}

/// Record `i` of a stream test: 64 bytes, its number then a pattern.
fn record(i: u32) -> [u8; 64] {
    let mut r = [(i % 251) as u8; 64];
    r[..4].copy_from_slice(&i.to_le_bytes());
    r
}

/// Reads tunnel messages until `len` bytes came: the bytes and how many
/// messages carried them.
async fn read_bytes(t: &skiff::client::Tunnel, len: usize) -> (Vec<u8>, u64) {
    let (mut got, mut messages) = (Vec::with_capacity(len), 0u64);
    while got.len() < len {
        let m = tokio::time::timeout(PATIENCE, t.recv())
            .await
            .expect("in time")
            .expect("open");
        got.extend_from_slice(&m.payload);
        messages += 1;
    }
    (got, messages)
}

/// Small stream writes on a tunnel a client opens through its node are
/// gathered before they reach the node: 20,000 writes of 64 B cross two
/// nodes in far fewer tunnel messages and mesh frames than writes (one
/// `send` per record made one of each), every byte in order; and a tunnel
/// dropped with writes still gathered delivers them before it closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_tunnel_writes_through_nodes_are_gathered() {
    let nodes = three(&format!("t-tun-gather-{}", std::process::id())).await;
    let (a, c) = (client(&nodes[0]).await, client(&nodes[2]).await);
    let member = c.join("tun", 1).await.unwrap();
    wait_for(|| nodes[0].broker().cluster_members("tun") == 1).await;
    let ta = a.tunnel(Target::cluster("tun"), PATIENCE).await.unwrap();
    let tc = incoming_tunnel(&member).await;
    let frames = || nodes[0].broker().mesh().unwrap().view().tunnels.frames_sent;
    let frames_before = frames();

    const WRITES: u32 = 20_000;
    let reader = tokio::spawn(async move {
        let r = read_bytes(&tc, WRITES as usize * 64).await;
        (r, tc)
    });
    let mut want = Vec::with_capacity(WRITES as usize * 64);
    for i in 0..WRITES {
        let r = record(i);
        ta.write_all(&r).await.unwrap();
        want.extend_from_slice(&r);
    }
    ta.flush().await.unwrap();
    let ((got, messages), tc) = tokio::time::timeout(PATIENCE, reader)
        .await
        .unwrap()
        .unwrap();
    assert!(got == want, "the bytes differ from what was written");
    assert_eq!(ta.gathered_messages(), messages);
    // How many writes share a message depends on how the writer and the
    // flusher share the cores: about a thousand when the flusher waits for
    // the writer's core, ten to twenty when it runs beside it on an idle
    // 2-core machine (ten on CI's). One each is what this catches.
    assert!(
        messages * 4 <= u64::from(WRITES),
        "{messages} tunnel messages for {WRITES} writes: not gathered"
    );
    let sent = frames() - frames_before;
    assert!(
        sent * 4 <= u64::from(WRITES),
        "{sent} mesh frames for {WRITES} writes: not gathered"
    );

    // Dropped right after its last write: the gathered bytes arrive, then
    // the end.
    let tail: Vec<u8> = (0..1000).flat_map(record).collect();
    for r in tail.chunks(64) {
        ta.write_all(r).await.unwrap();
    }
    drop(ta);
    let (got, _) = read_bytes(&tc, tail.len()).await;
    assert!(got == tail, "the tail differs from what was written");
    let end = tokio::time::timeout(PATIENCE, tc.recv()).await.unwrap();
    assert!(end.is_none(), "{end:?}");
}

/// Sends one UDP datagram to `to` that claims to come from `from`: a raw
/// IPv4 socket, which needs CAP_NET_RAW (`None` without it).
fn spoof_udp(
    from: std::net::SocketAddr,
    to: std::net::SocketAddr,
    payload: &[u8],
) -> Option<std::io::Result<()>> {
    let (std::net::SocketAddr::V4(from), std::net::SocketAddr::V4(to)) = (from, to) else {
        panic!("IPv4 only");
    };
    // SAFETY: plain socket call; the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
    if fd < 0 {
        return None;
    }
    let total = 20 + 8 + payload.len();
    let mut p = Vec::with_capacity(total);
    // IPv4 header: length and checksum are filled in by the kernel.
    p.extend_from_slice(&[0x45, 0]);
    p.extend_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0x40, 0, 64, libc::IPPROTO_UDP as u8, 0, 0]);
    p.extend_from_slice(&from.ip().octets());
    p.extend_from_slice(&to.ip().octets());
    // UDP header, checksum 0 (none, valid over IPv4).
    p.extend_from_slice(&from.port().to_be_bytes());
    p.extend_from_slice(&to.port().to_be_bytes());
    p.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(payload);
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(to.ip().octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `p` and `sa` are valid for the lengths given; `fd` is open.
    let r = unsafe {
        libc::sendto(
            fd,
            p.as_ptr().cast(),
            p.len(),
            0,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    let out = if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    };
    // SAFETY: `fd` is the socket opened above, closed once.
    unsafe { libc::close(fd) };
    Some(out)
}

/// Up to `n` messages of `sub` as text, each within 5 s.
async fn recv_n(sub: &mut skiff::client::Subscription, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    while got.len() < n {
        match tokio::time::timeout(Duration::from_secs(5), sub.recv()).await {
            Ok(Some(d)) => got.push(String::from_utf8(d.msg.payload.to_vec()).unwrap()),
            _ => break,
        }
    }
    got
}

/// One spoofed data datagram in a peer's name (its address and port),
/// numbered far ahead, does not stop delivery from that peer: it is
/// refused and counted, and the peer's next 100 messages all arrive.
/// Needs CAP_NET_RAW to spoof; says so and passes without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoofed_data_datagram_does_not_stop_a_peer() {
    let net = format!("t-spoof-{}", std::process::id());
    // The datagram path: these subjects travel best effort.
    let be = || MeshSettings {
        best_effort: vec!["spoof.>".into()],
        ..MeshSettings::default()
    };
    let a = node_with(&net, vec![], be()).await;
    let b = node_with(&net, vec![a.mesh_addr().unwrap().to_string()], be()).await;
    wait_for(|| b.broker().mesh().unwrap().view().stats.members_up == 1).await;
    wait_for(|| a.broker().mesh().unwrap().view().stats.members_up == 1).await;
    let (ca, cb) = (client(&a).await, client(&b).await);
    let mut sub = cb.subscribe("spoof.x", "*").await.unwrap();
    wait_for(|| known_patterns(&a) == 1).await;
    for i in 0..10u32 {
        ca.publish(Message::new("spoof.x", i.to_string()))
            .await
            .unwrap();
    }
    assert_eq!(recv_n(&mut sub, 10).await.len(), 10);
    let mut d = Vec::new();
    skiff_proto::mesh::packet::envelope(
        &mut d,
        skiff_proto::mesh::packet::Kind::Data,
        skiff_proto::mesh::packet::net_hash(&net),
    );
    d.extend_from_slice(&(u64::MAX / 4).to_le_bytes());
    let (from, to) = (a.mesh_addr().unwrap(), b.mesh_addr().unwrap());
    let peer = |n: &Node| n.broker().mesh().unwrap().view().peers[0].clone();
    let before = peer(&b).recv_datagrams;
    match spoof_udp(from, to, &d) {
        None => {
            eprintln!("no CAP_NET_RAW: cannot spoof a datagram, skipped");
            return;
        }
        Some(r) => r.unwrap(),
    }
    // The spoofed datagram has arrived (and is judged) before A goes on.
    wait_for(|| peer(&b).recv_datagrams > before).await;
    for i in 10..110u32 {
        ca.publish(Message::new("spoof.x", i.to_string()))
            .await
            .unwrap();
    }
    let got = recv_n(&mut sub, 100).await;
    let want: Vec<String> = (10..110).map(|i| i.to_string()).collect();
    assert_eq!(got, want, "{:?}", peer(&b));
    let p = peer(&b);
    assert_eq!((p.lost, p.far_ahead), (0, 1), "{p:?}");
}

/// Messages of every size up to `max_payload` cross nodes byte-identical,
/// in order with small ones around them (the reliable link fragments
/// them over the association and reassembles them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_up_to_max_payload_cross_nodes() {
    let nodes = three(&format!("t-big-{}", std::process::id())).await;
    let (a, b) = (client(&nodes[0]).await, client(&nodes[1]).await);
    let mut sub = b.subscribe("big.>", "*").await.unwrap();
    wait_for(|| known_patterns(&nodes[0]) == 1).await;
    let max = nodes[0].broker().limits().max_payload;
    let sizes = [0, 1, 100_000, 65_536, 1 << 20, max, 7];
    let body = |i: usize, n: usize| -> Vec<u8> { (0..n).map(|k| (k * 31 + i * 7) as u8).collect() };
    for (i, n) in sizes.iter().enumerate() {
        a.publish(Message::new(format!("big.{i}"), body(i, *n)))
            .await
            .unwrap();
    }
    a.flush().await.unwrap();
    assert_eq!(a.async_errors().0, 0, "{:?}", a.async_errors());
    for (i, n) in sizes.iter().enumerate() {
        let d = tokio::time::timeout(PATIENCE, sub.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&*d.msg.subject, format!("big.{i}"));
        assert!(
            d.msg.payload == body(i, *n),
            "message {i} of {n} bytes differs"
        );
    }
    let v = nodes[0].broker().mesh().unwrap().view();
    assert_eq!(v.stats.frames_too_large, 0, "{v:?}");
}

/// A full send queue with `drop_newest` drops what does not fit, counts
/// it per peer and subject, and the publisher's flush is told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_send_queue_drops_counts_and_tells_the_publisher() {
    let net = format!("t-dropq-{}", std::process::id());
    let small = || MeshSettings {
        send_queue: 0, // raised to max_payload + 64 KiB
        send_policy: skiff_node::mesh::SendPolicy::DropNewest,
        ..MeshSettings::default()
    };
    let a = node_with(&net, vec![], small()).await;
    let b = node_with(&net, vec![a.mesh_addr().unwrap().to_string()], small()).await;
    wait_for(|| a.broker().mesh().unwrap().view().stats.members_up == 1).await;
    let (ca, cb) = (client(&a).await, client(&b).await);
    let _sub = cb.subscribe("q.>", "*").await.unwrap();
    wait_for(|| known_patterns(&a) == 1).await;
    // Much more than the queue holds, faster than the link drains it.
    let payload = vec![1u8; 200_000];
    for _ in 0..100 {
        ca.publish(Message::new("q.full", payload.clone()))
            .await
            .unwrap();
    }
    ca.flush().await.unwrap();
    let v = a.broker().mesh().unwrap().view();
    let l = &v.links[0];
    assert!(l.dropped_newest > 0, "{l:?}");
    assert_eq!(l.dropped_subjects[0], ("q.full".into(), l.dropped_newest));
    let (n, text) = ca.async_errors();
    assert!(n > 0, "the publisher was not told");
    assert!(text.unwrap().contains("send queue is full"));
}

/// A node that sent messages goes: the subscribers on the other nodes are
/// told that messages from it may be missing, from the last one received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_are_told_of_a_gap_when_a_publishing_node_goes() {
    let mut nodes = three(&format!("t-gap-{}", std::process::id())).await;
    let (b, c) = (client(&nodes[1]).await, client(&nodes[2]).await);
    let mut sb = b.subscribe("gap.>", "*").await.unwrap();
    wait_for(|| known_patterns(&nodes[2]) == 1).await;
    for i in 0..10u32 {
        c.publish(Message::new("gap.x", i.to_string()))
            .await
            .unwrap();
    }
    assert_eq!(recv_n(&mut sb, 10).await.len(), 10);
    assert_eq!(b.async_errors().0, 0);
    let gone = nodes.pop().unwrap();
    drop(c);
    tokio::time::timeout(PATIENCE, gone.shutdown())
        .await
        .unwrap();
    wait_for(|| b.async_errors().0 >= 1).await;
    let why = b.async_errors().1.unwrap();
    assert!(
        why.contains("may be missing") && why.contains("went down"),
        "{why}"
    );
    let v = nodes[1].broker().mesh().unwrap().view();
    assert_eq!(v.gaps_reported, 1, "{v:?}");
}
