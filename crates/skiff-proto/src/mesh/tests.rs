//! A seeded, deterministic simulation of many [`Mesh`]es on a simulated
//! network (latency, jitter, loss, cut links, dead nodes), and the mesh's
//! behaviour checked on it: convergence at 3, 20 and 100 nodes, partition
//! and heal, a bounced node, exactly-once publish, requests spread by
//! capacity, and the bounds on hostile input.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rustc_hash::{FxHashMap, FxHashSet};

use super::packet::{Kind, Op};
use super::*;
use crate::router::{Clusters, Router, Subject};

const MS: Duration = Duration::from_millis(1);

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, (i / 250) as u8, (i % 250) as u8 + 1], 4748))
}

struct Sim {
    now: Instant,
    nodes: Vec<Option<Mesh>>,
    gens: Vec<u64>,
    wire: BinaryHeap<Reverse<(Instant, u64)>>,
    flying: FxHashMap<u64, (usize, SocketAddr, Vec<u8>)>,
    next: u64,
    rng: StdRng,
    loss: f64,
    cut: FxHashSet<(usize, usize)>,
    /// Stalled nodes (as by SIGSTOP): they run no timers and send nothing,
    /// and what reaches them waits, in order, until they resume.
    paused: FxHashMap<usize, Vec<(usize, Vec<u8>)>>,
    /// Frames delivered: (receiver, frame).
    frames: Vec<(usize, Bytes)>,
    /// Every other event, per node.
    events: Vec<Vec<MeshEvent>>,
    trace: std::collections::hash_map::DefaultHasher,
    config: MeshConfig,
}

impl Sim {
    fn new(n: usize, seed: u64) -> Sim {
        Sim::with(n, seed, MeshConfig::default())
    }

    fn with(n: usize, seed: u64, config: MeshConfig) -> Sim {
        let now = Instant::now();
        let mut s = Sim {
            now,
            nodes: Vec::new(),
            gens: vec![1; n],
            wire: BinaryHeap::new(),
            flying: FxHashMap::default(),
            next: 0,
            rng: StdRng::seed_from_u64(seed),
            loss: 0.0,
            cut: FxHashSet::default(),
            paused: FxHashMap::default(),
            frames: Vec::new(),
            events: vec![Vec::new(); n],
            trace: Default::default(),
            config,
        };
        for i in 0..n {
            let m = s.make(i);
            s.nodes.push(Some(m));
        }
        s
    }

    fn make(&mut self, i: usize) -> Mesh {
        let id = NodeId {
            addr: addr(i),
            gen: self.gens[i],
        };
        let seed = self.rng.random();
        Mesh::new(id, self.config.clone(), self.now, seed)
    }

    fn index(a: SocketAddr) -> usize {
        let SocketAddr::V4(v4) = a else {
            unreachable!()
        };
        let o = v4.ip().octets();
        o[2] as usize * 250 + o[3] as usize - 1
    }

    fn node(&mut self, i: usize) -> &mut Mesh {
        self.nodes[i].as_mut().expect("alive")
    }

    /// Every node has node 0 as its seed.
    fn join_all(&mut self) {
        let now = self.now;
        for i in 1..self.nodes.len() {
            self.node(i).set_seeds(now, &[addr(0)]);
        }
        self.pump();
    }

    fn pump(&mut self) {
        for i in 0..self.nodes.len() {
            if self.paused.contains_key(&i) {
                continue;
            }
            let Some(m) = self.nodes[i].as_mut() else {
                continue;
            };
            let mut out = Vec::new();
            let mut buf = Vec::new();
            while let Some(t) = m.poll_transmit(self.now, &mut buf) {
                assert_eq!(t.size, buf.len());
                out.push((t.destination, std::mem::take(&mut buf)));
            }
            let mut frames = Vec::new();
            while let Some(e) = m.poll_event() {
                match e {
                    MeshEvent::Frames { frames: f, .. } => frames.extend(f),
                    e => self.events[i].push(e),
                }
            }
            for f in frames {
                self.frames.push((i, f));
            }
            for (to, d) in out {
                d.hash(&mut self.trace);
                let j = Sim::index(to);
                if self.rng.random_bool(self.loss) || self.cut.contains(&(i, j)) {
                    continue;
                }
                let at = self.now + MS / 2 + MS * self.rng.random_range(0..2);
                self.wire.push(Reverse((at, self.next)));
                self.flying.insert(self.next, (i, to, d));
                self.next += 1;
            }
        }
    }

    /// Runs the simulation for `d`.
    fn run(&mut self, d: Duration) {
        let end = self.now + d;
        self.pump();
        loop {
            let timer = self
                .nodes
                .iter()
                .enumerate()
                .filter(|(i, _)| !self.paused.contains_key(i))
                .filter_map(|(_, m)| m.as_ref()?.poll_timeout())
                .min();
            let wire = self.wire.peek().map(|Reverse((t, _))| *t);
            let Some(t) = timer.into_iter().chain(wire).min() else {
                self.now = end;
                return;
            };
            if t > end {
                self.now = end;
                return;
            }
            self.now = self.now.max(t);
            let now = self.now;
            while let Some(Reverse((at, n))) = self.wire.peek().copied() {
                if at > now {
                    break;
                }
                self.wire.pop();
                let (from, to, d) = self.flying.remove(&n).expect("in flight");
                if let Some(held) = self.paused.get_mut(&Sim::index(to)) {
                    held.push((from, d));
                } else if let Some(m) = self.nodes[Sim::index(to)].as_mut() {
                    m.handle_datagram(now, addr(from), Bytes::from(d));
                }
            }
            for (i, m) in self.nodes.iter_mut().enumerate() {
                let Some(m) = m.as_mut().filter(|_| !self.paused.contains_key(&i)) else {
                    continue;
                };
                if m.poll_timeout().is_some_and(|t| t <= now) {
                    m.handle_timeout(now);
                }
            }
            self.pump();
        }
    }

    fn up_counts(&self) -> Vec<usize> {
        self.nodes
            .iter()
            .map(|m| m.as_ref().map_or(0, |m| m.members().count()))
            .collect()
    }

    fn converged(&self, alive: usize) -> bool {
        self.nodes
            .iter()
            .flatten()
            .all(|m| m.members().count() == alive - 1)
    }

    /// Runs until every live node sees every other live node, or `limit`.
    fn run_until_converged(&mut self, limit: Duration) -> Duration {
        let alive = self.nodes.iter().flatten().count();
        let start = self.now;
        while !self.converged(alive) && self.now - start < limit {
            self.run(100 * MS);
            eprintln!(
                "t={:?} {:?} flying {}",
                self.now - start,
                self.up_counts(),
                self.wire.len()
            );
        }
        self.now - start
    }

    /// Node `i` publishes `body` on `subject`: one frame to each interested
    /// peer.
    fn publish(&mut self, i: usize, subject: &str, body: &[u8]) -> usize {
        let mut to = Vec::new();
        self.node(i).route(subject, None, &mut to);
        for &p in &to {
            let now = self.now;
            self.node(i).send_frame(now, p, body).unwrap();
        }
        self.pump();
        to.len()
    }

    fn kill(&mut self, i: usize) {
        self.nodes[i] = None;
    }

    fn restart(&mut self, i: usize) {
        self.gens[i] += 1;
        let m = self.make(i);
        self.nodes[i] = Some(m);
        let now = self.now;
        self.node(i)
            .set_seeds(now, &[addr(if i == 0 { 1 } else { 0 })]);
        self.pump();
    }

    /// Stalls node `i` (see `paused`).
    fn pause(&mut self, i: usize) {
        self.paused.insert(i, Vec::new());
    }

    /// Node `i` goes on: it reads what waited for it, then runs its late
    /// timers (as the node's driver does after a stall).
    fn resume(&mut self, i: usize) {
        let held = self.paused.remove(&i).unwrap_or_default();
        let now = self.now;
        for (from, d) in held {
            self.node(i)
                .handle_datagram(now, addr(from), Bytes::from(d));
        }
        self.node(i).handle_timeout(now);
        self.pump();
    }

    fn partition(&mut self, a: &[usize], b: &[usize]) {
        for &x in a {
            for &y in b {
                self.cut.insert((x, y));
                self.cut.insert((y, x));
            }
        }
    }

    fn routes(&self, i: usize, subject: &str) -> Vec<usize> {
        let mut to = Vec::new();
        self.nodes[i]
            .as_ref()
            .unwrap()
            .route(subject, None, &mut to);
        let mut v: Vec<usize> = to.into_iter().map(Sim::index).collect();
        v.sort();
        v
    }
}

#[test]
fn three_nodes_converge() {
    let mut s = Sim::new(3, 1);
    s.join_all();
    let t = s.run_until_converged(Duration::from_secs(10));
    assert!(s.converged(3), "after {t:?}: {:?}", s.up_counts());
}

#[test]
fn twenty_nodes_converge() {
    let mut s = Sim::new(20, 2);
    s.join_all();
    let t = s.run_until_converged(Duration::from_secs(30));
    assert!(s.converged(20), "after {t:?}: {:?}", s.up_counts());
}

#[test]
fn a_hundred_nodes_converge_with_loss() {
    let mut s = Sim::new(100, 3);
    s.loss = 0.014;
    s.join_all();
    let t = s.run_until_converged(Duration::from_secs(60));
    assert!(s.converged(100), "after {t:?}: {:?}", s.up_counts());
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let trace = |seed| {
        let mut s = Sim::new(10, seed);
        s.loss = 0.05;
        s.join_all();
        s.run(Duration::from_secs(5));
        (s.trace.finish(), s.up_counts())
    };
    assert_eq!(trace(7), trace(7));
    assert_ne!(trace(7).0, trace(8).0);
}

#[test]
fn interest_spreads_and_withdraws() {
    let mut s = Sim::new(3, 4);
    s.join_all();
    s.run_until_converged(Duration::from_secs(10));
    s.node(1).add_interest("orders.*", "");
    s.node(1).add_interest("orders.*", "");
    s.node(2).add_interest("orders.>", "");
    s.run(Duration::from_millis(50));
    assert_eq!(s.routes(0, "orders.new"), vec![1, 2]);
    assert_eq!(s.routes(0, "orders.new.eu"), vec![2]);
    assert_eq!(s.routes(0, "other"), Vec::<usize>::new());
    // Two local subscriptions hold the pattern; removing one keeps it.
    s.node(1).remove_interest("orders.*", "");
    s.run(Duration::from_millis(50));
    assert_eq!(s.routes(0, "orders.new"), vec![1, 2]);
    s.node(1).remove_interest("orders.*", "");
    s.run(Duration::from_millis(50));
    assert_eq!(s.routes(0, "orders.new"), vec![2]);
}

/// cMsg interest travels with its kind: a peer routes by cMsg matching,
/// a snapshot carries it (a node that joins later), and withdrawing it
/// leaves the token interest of the same text alone.
#[test]
fn cmsg_interest_travels_with_its_kind() {
    use crate::router::Syntax;
    let mut s = Sim::new(3, 4);
    s.join_all();
    s.run_until_converged(Duration::from_secs(10));
    s.node(1)
        .add_interest_as(Syntax::Cmsg, "daq.h*b.{i>5 & i<10}", "*");
    s.node(2).add_interest("daq.h*b.{i>5 & i<10}", "*");
    s.run(Duration::from_millis(50));
    assert_eq!(s.routes(0, "daq.hallb.7"), vec![1]);
    assert_eq!(s.routes(0, "daq.hallb.10"), Vec::<usize>::new());
    // A full snapshot (asked for after a lost epoch) keeps the kind.
    s.node(0).forget_interest(addr(1));
    assert_eq!(s.routes(0, "daq.hb.9"), Vec::<usize>::new());
    s.node(0).ask_sync(addr(1));
    s.run(Duration::from_secs(2));
    assert_eq!(s.routes(0, "daq.hb.9"), vec![1]);
    s.node(1)
        .remove_interest_as(Syntax::Cmsg, "daq.h*b.{i>5 & i<10}", "*");
    s.run(Duration::from_millis(50));
    assert_eq!(s.routes(0, "daq.hb.9"), Vec::<usize>::new());
}

/// Every message published anywhere reaches every node with a matching
/// subscription exactly once (overlapping patterns on one node included)
/// and no other node.
#[test]
fn a_publish_reaches_every_interested_node_once() {
    let mut s = Sim::new(20, 5);
    s.join_all();
    s.run_until_converged(Duration::from_secs(30));
    let mut rng = StdRng::seed_from_u64(55);
    let mut interested: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    for i in 0..20 {
        let pats: Vec<&str> = ["t.*", "t.>", "t.a", "u.*"]
            .into_iter()
            .filter(|_| rng.random_bool(0.4))
            .collect();
        for p in &pats {
            s.node(i).add_interest(p, "");
        }
        interested.insert(i, pats);
    }
    s.run(Duration::from_millis(100));
    let subjects = ["t.a", "t.b", "t.a.b", "u.x", "v"];
    let mut want: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    for k in 0..200usize {
        let from = rng.random_range(0..20);
        let subject = subjects[k % subjects.len()];
        s.publish(from, subject, &k.to_le_bytes());
        for (&node, pats) in &interested {
            let hit = pats.iter().any(|p| {
                let mut r: Router<u8> = Router::new();
                r.subscribe(p, "", 0).unwrap();
                r.has_interest(Subject::new(subject).unwrap())
            });
            if hit && node != from {
                want.insert((node, k), 1);
            }
        }
    }
    s.run(Duration::from_millis(100));
    let mut got: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    for (node, f) in &s.frames {
        let k = usize::from_le_bytes(f[..8].try_into().unwrap());
        *got.entry((*node, k)).or_default() += 1;
    }
    assert_eq!(got, want);
}

#[test]
fn frames_to_one_peer_share_datagrams() {
    let mut s = Sim::new(2, 6);
    s.join_all();
    s.run_until_converged(Duration::from_secs(10));
    s.node(1).add_interest("x", "");
    s.run(Duration::from_millis(50));
    for k in 0..1000u32 {
        let now = s.now;
        s.node(0)
            .send_frame(now, addr(1), &k.to_le_bytes())
            .unwrap();
    }
    s.pump();
    s.run(Duration::from_millis(10));
    let p = &s.node(0).peer_stats()[0];
    assert_eq!(p.sent_frames, 1000);
    // 1400-byte datagrams of 5-byte frames: a few datagrams, not 1000.
    assert!(p.sent_datagrams <= 5, "{p:?}");
    assert_eq!(s.frames.len(), 1000);
    let q = &s.node(1).peer_stats()[0];
    assert_eq!((q.recv_frames, q.lost), (1000, 0));
}

/// A peer's data datagrams leave back to back even when frames to two
/// peers were queued interleaved, so a driver can send each run as one
/// segmented send.
#[test]
fn datagrams_to_one_peer_leave_back_to_back() {
    let mut s = Sim::new(3, 16);
    s.join_all();
    s.run_until_converged(Duration::from_secs(10));
    s.run(Duration::from_secs(1));
    let now = s.now;
    let mut buf = Vec::new();
    while s.node(0).poll_transmit(now, &mut buf).is_some() {}
    let frame = [1u8; 600];
    for _ in 0..10 {
        for to in [1, 2] {
            s.node(0).send_frame(now, addr(to), &frame).unwrap();
        }
    }
    let mut dests = Vec::new();
    while let Some(t) = s.node(0).poll_transmit(now, &mut buf) {
        assert_eq!((t.size, t.alone), (buf.len(), false));
        assert_eq!(buf[3], Kind::Data as u8);
        dests.push(Sim::index(t.destination));
    }
    // Two 600-byte frames per 1400-byte datagram: five datagrams each.
    assert_eq!(dests.len(), 10, "{dests:?}");
    let changes = dests.windows(2).filter(|w| w[0] != w[1]).count();
    assert_eq!(changes, 1, "{dests:?}");
}

#[test]
fn requests_spread_by_advertised_capacity() {
    let mut s = Sim::new(4, 7);
    s.join_all();
    s.run_until_converged(Duration::from_secs(10));
    for (i, cap) in [(1, 1), (2, 2), (3, 3)] {
        s.node(i).set_cluster("svc", cap);
    }
    s.run(Duration::from_millis(100));
    // Node 0 builds its view from the events, as the node does.
    let mut clusters: Clusters<usize> = Clusters::new();
    for e in std::mem::take(&mut s.events[0]) {
        if let MeshEvent::Cluster {
            peer,
            cluster,
            capacity,
        } = e
        {
            clusters.join(&cluster, Sim::index(peer), capacity);
        }
    }
    let mut n = [0usize; 4];
    for _ in 0..600 {
        n[clusters.pick("svc", None).unwrap()] += 1;
    }
    assert_eq!(n, [0, 100, 200, 300]);
    let caps: BTreeMap<usize, u32> = s
        .node(0)
        .cluster_peers("svc")
        .map(|(a, c)| (Sim::index(a), c))
        .collect();
    assert_eq!(caps, BTreeMap::from([(1, 1), (2, 2), (3, 3)]));
}

#[test]
fn partition_then_heal_reconverges() {
    let mut s = Sim::new(6, 8);
    s.join_all();
    s.run_until_converged(Duration::from_secs(20));
    s.partition(&[0, 1, 2], &[3, 4, 5]);
    s.run(Duration::from_secs(15));
    assert_eq!(s.up_counts(), vec![2; 6], "each side sees only its own");
    // Each side keeps serving its own members.
    s.node(4).add_interest("side.b", "");
    s.node(1).add_interest("side.a", "");
    s.run(Duration::from_millis(100));
    assert_eq!(s.routes(3, "side.b"), vec![4]);
    assert_eq!(s.routes(0, "side.a"), vec![1]);
    assert_eq!(s.routes(0, "side.b"), Vec::<usize>::new());
    s.cut.clear();
    let t = s.run_until_converged(Duration::from_secs(60));
    assert!(s.converged(6), "after {t:?}: {:?}", s.up_counts());
    s.run(Duration::from_secs(3));
    assert_eq!(s.routes(0, "side.b"), vec![4]);
    assert_eq!(s.routes(5, "side.a"), vec![1]);
}

#[test]
fn a_bounced_node_rejoins_with_new_interest() {
    let mut s = Sim::new(5, 9);
    s.join_all();
    s.run_until_converged(Duration::from_secs(20));
    s.node(2).add_interest("old", "");
    s.run(Duration::from_millis(100));
    assert_eq!(s.routes(0, "old"), vec![2]);
    s.kill(2);
    s.run(Duration::from_secs(10));
    assert_eq!(s.up_counts(), vec![3, 3, 0, 3, 3]);
    assert_eq!(s.routes(0, "old"), Vec::<usize>::new());
    s.restart(2);
    s.node(2).add_interest("new", "");
    let t = s.run_until_converged(Duration::from_secs(30));
    assert!(s.converged(5), "after {t:?}: {:?}", s.up_counts());
    s.run(Duration::from_secs(2));
    assert_eq!(s.routes(0, "new"), vec![2]);
    assert_eq!(s.routes(0, "old"), Vec::<usize>::new());
    let p2 = s
        .node(0)
        .peer_stats()
        .into_iter()
        .find(|p| p.addr == addr(2));
    assert_eq!(p2.map(|p| (p.gen, p.up)), Some((2, true)));
    assert!(s.events[0].contains(&MeshEvent::Down(NodeId {
        addr: addr(2),
        gen: 1
    })));
}

#[test]
fn lost_deltas_converge_through_digests() {
    let mut s = Sim::new(4, 10);
    s.join_all();
    s.run_until_converged(Duration::from_secs(10));
    s.loss = 0.3;
    for k in 0..40 {
        s.node(3).add_interest(&format!("p.{k}"), "");
        s.run(Duration::from_millis(20));
    }
    s.loss = 0.0;
    s.run(Duration::from_secs(5));
    for i in 0..3 {
        for k in 0..40 {
            assert_eq!(s.routes(i, &format!("p.{k}")), vec![3], "node {i} p.{k}");
        }
    }
}

#[test]
fn a_big_snapshot_travels_in_parts() {
    let mut s = Sim::new(2, 11);
    for k in 0..2000 {
        s.node(1)
            .add_interest(&format!("big.subject.number.{k}"), "");
    }
    s.join_all();
    s.run_until_converged(Duration::from_secs(10));
    s.run(Duration::from_secs(2));
    assert_eq!(s.node(0).peer_stats()[0].patterns, 2000);
    assert!(s.node(1).stats().syncs_sent >= 1);
}

#[test]
fn another_network_is_ignored_and_counted() {
    let mut s = Sim::new(2, 12);
    let other = Mesh::new(
        NodeId {
            addr: addr(5),
            gen: 1,
        },
        MeshConfig {
            net: "other".into(),
            ..MeshConfig::default()
        },
        s.now,
        1,
    );
    let mut hello = Vec::new();
    other.hello(&mut hello);
    let now = s.now;
    s.node(0).handle_datagram(now, addr(5), hello.into());
    let mut d = Vec::new();
    packet::envelope(&mut d, Kind::Data, packet::net_hash("other"));
    s.node(0).handle_datagram(now, addr(5), d.into());
    assert_eq!(s.node(0).stats().wrong_net, 2);
    assert_eq!(s.node(0).members().count(), 0);
    let mut buf = Vec::new();
    assert_eq!(
        s.node(0).poll_transmit(now, &mut buf),
        None,
        "no answer to a stranger"
    );
}

/// One spoofed data datagram in a member's name, numbered far ahead, is
/// refused and counted: the real peer's data goes on being delivered.
#[test]
fn a_spoofed_data_datagram_does_not_stop_a_peer() {
    let mut s = Sim::new(2, 21);
    s.join_all();
    s.run_until_converged(Duration::from_secs(10));
    s.node(1).add_interest("x", "");
    s.run(Duration::from_millis(50));
    let send = |s: &mut Sim, from: u32, to: u32| {
        for k in from..to {
            let now = s.now;
            s.node(0)
                .send_frame(now, addr(1), &k.to_le_bytes())
                .unwrap();
            s.pump();
            s.run(Duration::from_millis(2));
        }
    };
    send(&mut s, 0, 10);
    let mut d = Vec::new();
    packet::envelope(&mut d, Kind::Data, packet::net_hash("skiff"));
    d.extend_from_slice(&(u64::MAX / 4).to_le_bytes());
    let now = s.now;
    s.node(1).handle_datagram(now, addr(0), d.into());
    send(&mut s, 10, 110);
    s.run(Duration::from_millis(50));
    let got: Vec<u32> = s
        .frames
        .iter()
        .filter(|(n, _)| *n == 1)
        .map(|(_, f)| u32::from_le_bytes(f[..4].try_into().unwrap()))
        .collect();
    assert_eq!(got, (0..110).collect::<Vec<_>>());
    let p = &s.node(1).peer_stats()[0];
    assert_eq!((p.lost, p.far_ahead), (0, 1), "{p:?}");
}

#[test]
fn hostile_peers_are_bounded_and_counted() {
    let config = MeshConfig {
        max_interest: 10,
        interest_rate: 5,
        ..MeshConfig::default()
    };
    let mut s = Sim::with(2, 13, config);
    s.join_all();
    s.run_until_converged(Duration::from_secs(10));
    let now = s.now;
    let net = packet::net_hash("skiff");
    // Data from a node that never joined.
    let mut d = Vec::new();
    packet::envelope(&mut d, Kind::Data, net);
    d.extend_from_slice(&0u64.to_le_bytes());
    s.node(0).handle_datagram(now, addr(9), d.into());
    assert_eq!(s.node(0).stats().unknown_sender, 1);
    // A member floods interest: 20 deltas of 2 patterns, at one instant.
    let epoch = s.node(1).local.epoch;
    let version = s.node(1).local.version;
    for k in 0..20u64 {
        let mut d = Vec::new();
        packet::envelope(&mut d, Kind::Delta, net);
        d.extend_from_slice(&epoch.to_le_bytes());
        d.extend_from_slice(&(version + k).to_le_bytes());
        let ops = [
            Op::Sub(format!("f.{k}.a"), String::new()),
            Op::Sub(format!("f.{k}.b"), String::new()),
        ];
        packet::put_ops(&mut d, ops.iter());
        s.node(0).handle_datagram(now, addr(1), d.into());
    }
    let st = s.node(0).stats();
    assert!(st.rate_limited >= 14, "{st:?}");
    let held = s.node(0).peer_stats()[0].patterns;
    assert!(held <= 10, "held {held}");
    // Garbage from a member: counted, nothing else.
    s.node(0)
        .handle_datagram(now, addr(1), Bytes::from_static(b"SM\x01\x02\0\0"));
    assert!(s.node(0).stats().malformed >= 1);
}

#[test]
fn the_member_table_is_bounded() {
    let config = MeshConfig {
        max_members: 3,
        ..MeshConfig::default()
    };
    let mut s = Sim::with(6, 14, config);
    s.join_all();
    s.run(Duration::from_secs(10));
    assert!(s.node(0).peers.len() <= 3, "{}", s.node(0).peers.len());
    assert!(s.node(0).stats().member_limit > 0);
}

#[test]
fn a_full_window_holds_the_sender_until_acks_or_the_timeout() {
    let config = MeshConfig {
        window: 4 * 1400,
        max_datagram: 1400,
        ..MeshConfig::default()
    };
    let mut s = Sim::with(2, 15, config);
    s.join_all();
    s.run_until_converged(Duration::from_secs(10));
    let big = [7u8; 1000];
    // Each frame fills a datagram: four of them fill the window.
    for _ in 0..4 {
        let now = s.now;
        s.node(0).send_frame(now, addr(1), &big).unwrap();
        s.node(0).flush();
    }
    assert!(!s.node(0).room(), "four datagrams in flight");
    // The receiver takes them and acknowledges: room again.
    s.run(Duration::from_millis(10));
    assert!(s.node(0).room());
    assert_eq!(s.node(0).stats().ack_timeouts, 0);
    // With the link cut no ack comes; the window opens after the timeout,
    // counted.
    s.partition(&[0], &[1]);
    for _ in 0..4 {
        let now = s.now;
        s.node(0).send_frame(now, addr(1), &big).unwrap();
        s.node(0).flush();
    }
    assert!(!s.node(0).room());
    s.run(Duration::from_millis(100));
    assert!(s.node(0).room());
    assert_eq!(s.node(0).stats().ack_timeouts, 1);
}

#[test]
fn association_packets_travel_only_between_up_members() {
    let config = MeshConfig {
        interest_rate: 5,
        ..MeshConfig::default()
    };
    let mut s = Sim::with(2, 21, config);
    let now = s.now;
    let net = packet::net_hash("skiff");
    // Before joining: nothing goes out, nothing comes in.
    assert_eq!(
        s.node(0).send_assoc(now, addr(1), b"x", false),
        Err(FrameError::NotUp(addr(1)))
    );
    let mut d = Vec::new();
    packet::envelope(&mut d, Kind::Assoc, net);
    d.extend_from_slice(b"forged");
    s.node(1).handle_datagram(now, addr(0), d.into());
    assert_eq!(s.node(1).stats().unknown_sender, 1);
    assert!(s.node(1).poll_event().is_none());

    s.join_all();
    s.run_until_converged(Duration::from_secs(10));
    s.events[1].clear();
    let now = s.now;
    // Many at one instant: packets are not rate-limited like interest.
    for k in 0..50u8 {
        s.node(0)
            .send_assoc(now, addr(1), &[k; 100], k % 2 == 0)
            .unwrap();
    }
    s.run(10 * MS);
    let got: Vec<Bytes> = s.events[1]
        .iter()
        .filter_map(|e| match e {
            MeshEvent::Assoc { from, packet } if *from == addr(0) => Some(packet.clone()),
            _ => None,
        })
        .collect();
    // Each once (the simulated wire may reorder them).
    let mut firsts: Vec<u8> = got.iter().map(|p| p[0]).collect();
    firsts.sort();
    assert_eq!(firsts, (0..50).collect::<Vec<u8>>());
    assert!(got
        .iter()
        .all(|p| p.len() == 100 && p.iter().all(|b| *b == p[0])));
    assert_eq!(s.node(1).stats().rate_limited, 0);

    // An empty one from a member is malformed; an oversized one is refused.
    let before = s.node(1).stats().malformed;
    let mut d = Vec::new();
    packet::envelope(&mut d, Kind::Assoc, net);
    s.node(1).handle_datagram(now, addr(0), d.into());
    assert_eq!(s.node(1).stats().malformed, before + 1);
    let big = vec![0u8; 65_000];
    assert!(matches!(
        s.node(0).send_assoc(now, addr(1), &big, false),
        Err(FrameError::TooLarge { .. })
    ));
    assert_eq!(s.node(0).stats().frames_too_large, 1);
}

/// An association packet the association marked `alone` (a repeat) comes
/// out marked so, and the others not, so a driver keeps only those out
/// of segmented runs.
#[test]
fn association_packets_keep_their_alone_mark() {
    let mut s = Sim::new(2, 22);
    s.join_all();
    s.run_until_converged(Duration::from_secs(10));
    s.run(Duration::from_secs(1));
    let now = s.now;
    let mut buf = Vec::new();
    while s.node(0).poll_transmit(now, &mut buf).is_some() {}
    for k in 0..6u8 {
        s.node(0)
            .send_assoc(now, addr(1), &[k; 10], k >= 4)
            .unwrap();
    }
    let mut marks = Vec::new();
    while let Some(t) = s.node(0).poll_transmit(now, &mut buf) {
        if buf[3] == Kind::Assoc as u8 {
            marks.push((buf[packet::ENVELOPE], t.alone));
        }
    }
    let want: Vec<(u8, bool)> = (0..6).map(|k| (k, k >= 4)).collect();
    assert_eq!(marks, want);
}

/// A member suspected for a moment (stalled, as by SIGSTOP, for longer
/// than a probe) refutes the suspicion once it runs again, and stays in
/// the mesh as it was: not declared down, not made to rejoin under a new
/// generation (which restarts its links and can lose what was in flight
/// on them). foca 2.0.0 sends its "you were declared down" message when
/// the suspicion's timer fires even if the member refuted meanwhile; the
/// mesh must not let that through.
#[test]
fn a_refuted_suspicion_does_not_make_a_member_rejoin() {
    let mut s = Sim::new(3, 12);
    s.join_all();
    s.run_until_converged(Duration::from_secs(20));
    s.run(Duration::from_secs(2));
    s.pause(2);
    let suspected = |s: &Sim| {
        s.events[..2]
            .iter()
            .flatten()
            .any(|e| matches!(e, MeshEvent::Suspect(id) if id.addr == addr(2)))
    };
    let start = s.now;
    while !suspected(&s) && s.now - start < Duration::from_secs(10) {
        s.run(10 * MS);
    }
    assert!(suspected(&s), "node 2 was never suspected");
    s.resume(2);
    s.run(Duration::from_secs(5));
    assert!(
        !s.events[2]
            .iter()
            .any(|e| matches!(e, MeshEvent::Rejoined(_))),
        "node 2 rejoined: {:?}",
        s.events[2]
    );
    for i in 0..2 {
        assert!(
            !s.events[i]
                .iter()
                .any(|e| matches!(e, MeshEvent::Down(id) if id.addr == addr(2))),
            "node {i} declared node 2 down: {:?}",
            s.events[i]
        );
    }
    assert_eq!(s.up_counts(), vec![2, 2, 2]);
    assert_eq!(s.node(2).id().gen, 1, "node 2 kept its generation");
}
