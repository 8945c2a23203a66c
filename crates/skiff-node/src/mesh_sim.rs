//! A seeded, deterministic simulation of the reliable links between
//! nodes (issue 16, Evidence): each simulated node is the sans-I/O mesh
//! ([`Mesh`]) and this module's [`Tunnels`] (associations, send queues),
//! driven the way the node's mesh task drives them, on a simulated network
//! with latency, jitter, loss and cut links. Publishers on several nodes
//! send numbered messages to every node; the checks: each message arrives
//! at each subscribing node exactly once and in its publisher's order,
//! and, across a partition long enough for members to be declared down,
//! none twice and every one missing counted lost on its publisher's link.
//! The same seed gives the same run (a trace hash says so).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rustc_hash::FxHashSet;
use skiff_proto::mesh::node_frame::op;
use skiff_proto::mesh::tunnel_frame::TunnelFrame;
use skiff_proto::mesh::{Mesh, MeshConfig, MeshEvent, NodeId};

use super::{LinkConfig, Tunnels};
use crate::mesh::sendq::SendPolicy;

const MS: Duration = Duration::from_millis(1);

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 1, 0, i as u8 + 1], 4748))
}

fn index(a: SocketAddr) -> usize {
    let SocketAddr::V4(v4) = a else {
        unreachable!()
    };
    v4.ip().octets()[3] as usize - 1
}

struct Node {
    core: Mesh,
    links: Tunnels,
}

struct Sim {
    now: Instant,
    nodes: Vec<Node>,
    wire: BinaryHeap<Reverse<(Instant, u64, usize, usize)>>,
    flying: rustc_hash::FxHashMap<u64, Vec<u8>>,
    next: u64,
    rng: StdRng,
    loss: f64,
    /// The chance that a node's round leaves its associations unread (its
    /// local delivery is behind: `Tunnels::step`'s `paused`).
    pause: f64,
    cut: FxHashSet<(usize, usize)>,
    /// (receiver, publisher) → numbers received, in order of arrival.
    got: BTreeMap<(usize, usize), Vec<u64>>,
    /// (publisher, receiver) → messages routed there (its node was up
    /// with interest when published).
    routed: BTreeMap<(usize, usize), u64>,
    trace: std::collections::hash_map::DefaultHasher,
}

impl Sim {
    fn new(n: usize, seed: u64, loss: f64) -> Sim {
        let now = Instant::now();
        let mut rng = StdRng::seed_from_u64(seed);
        let config = MeshConfig::default();
        let nodes = (0..n)
            .map(|i| Node {
                core: Mesh::new(
                    NodeId {
                        addr: addr(i),
                        gen: 1,
                    },
                    config.clone(),
                    now,
                    rng.random(),
                ),
                links: Tunnels::new(LinkConfig {
                    max_datagram: 1400,
                    max_payload: 1 << 20,
                    max_backlog: 16 << 20,
                    link_bytes: 64 << 20,
                    link_policy: SendPolicy::Block,
                    seed: rng.random::<u64>() | 1,
                }),
            })
            .collect();
        let mut s = Sim {
            now,
            nodes,
            wire: BinaryHeap::new(),
            flying: Default::default(),
            next: 0,
            rng,
            loss,
            pause: 0.0,
            cut: FxHashSet::default(),
            got: BTreeMap::new(),
            routed: BTreeMap::new(),
            trace: Default::default(),
        };
        for i in 1..n {
            s.nodes[i].core.set_seeds(now, &[addr(0)]);
        }
        s.pump();
        s
    }

    /// Events, association work and datagrams of every node, until quiet.
    fn pump(&mut self) {
        let now = self.now;
        for i in 0..self.nodes.len() {
            let n = &mut self.nodes[i];
            let mut pubs = Vec::new();
            while let Some(e) = n.core.poll_event() {
                match e {
                    MeshEvent::Assoc { from, packet } => n.links.handle_packet(now, from, packet),
                    MeshEvent::Down(id) => {
                        let _ = n.links.peer_down(now, id.addr);
                    }
                    // Best effort is not used here.
                    MeshEvent::Frames { .. } => panic!("a datagram frame in a reliable run"),
                    _ => {}
                }
            }
            let paused = self.pause > 0.0 && self.rng.random_bool(self.pause);
            let step = n.links.step(now, paused);
            for (from, raw) in step.frames {
                if let Ok(TunnelFrame::Nodes { frames, .. }) = TunnelFrame::decode(&raw, 1 << 20) {
                    for f in frames {
                        assert_eq!(f.first(), Some(&op::PUB));
                        pubs.push((index(from), f.slice(1..)));
                    }
                }
            }
            n.links.drain_backlogs(now);
            n.links.transmit(now, &mut n.core);
            let mut buf = Vec::new();
            let mut out = Vec::new();
            while let Some(t) = n.core.poll_transmit(now, &mut buf) {
                out.push((t.destination, std::mem::take(&mut buf)));
            }
            for (from, body) in pubs {
                let m = skiff_proto::wire::decode_message(&body, 1 << 20).unwrap();
                let k: u64 = std::str::from_utf8(&m.payload).unwrap().parse().unwrap();
                assert_eq!(index(addr(from)), from);
                self.got.entry((i, from)).or_default().push(k);
            }
            for (to, d) in out {
                d.hash(&mut self.trace);
                let j = index(to);
                if self.rng.random_bool(self.loss) || self.cut.contains(&(i, j)) {
                    continue;
                }
                let at = now + MS / 2 + MS * self.rng.random_range(0..2);
                self.wire.push(Reverse((at, self.next, i, j)));
                self.flying.insert(self.next, d);
                self.next += 1;
            }
        }
    }

    fn run(&mut self, d: Duration) {
        let end = self.now + d;
        self.pump();
        loop {
            let timer = self
                .nodes
                .iter_mut()
                .filter_map(|n| {
                    let a = n.core.poll_timeout();
                    let b = n.links.poll_timeout();
                    a.into_iter().chain(b).min()
                })
                .min();
            let wire = self.wire.peek().map(|Reverse((t, ..))| *t);
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
            while let Some(Reverse((at, k, from, to))) = self.wire.peek().copied() {
                if at > now {
                    break;
                }
                self.wire.pop();
                let d = self.flying.remove(&k).expect("in flight");
                self.nodes[to]
                    .core
                    .handle_datagram(now, addr(from), Bytes::from(d));
            }
            for n in &mut self.nodes {
                if n.core.poll_timeout().is_some_and(|t| t <= now) {
                    n.core.handle_timeout(now);
                }
            }
            self.pump();
        }
    }

    fn converged(&self) -> bool {
        let n = self.nodes.len();
        self.nodes
            .iter()
            .all(|x| x.core.stats().members_up == n - 1)
    }

    fn run_until_converged(&mut self, limit: Duration) {
        let start = self.now;
        while !self.converged() && self.now - start < limit {
            self.run(100 * MS);
        }
        assert!(self.converged(), "no convergence in {limit:?}");
    }

    /// Node `i` publishes number `k` to every node with interest.
    fn publish(&mut self, i: usize, k: u64) {
        let mut raw = Vec::new();
        skiff_proto::wire::encode_message(
            &mut raw,
            &skiff_proto::Message::new(format!("sim.{i}"), k.to_string()),
            false,
        );
        let mut to = Vec::new();
        let now = self.now;
        let n = &mut self.nodes[i];
        n.core.route(&format!("sim.{i}"), None, &mut to);
        for p in to {
            let _ = n.links.push_node(now, p, &[&[op::PUB], &raw], Some("sim"));
            *self.routed.entry((i, index(p))).or_default() += 1;
        }
    }

    fn lost(&self, from: usize, to: usize) -> u64 {
        self.nodes[from]
            .links
            .link_stats()
            .iter()
            .find(|l| l.peer == addr(to).to_string())
            .map_or(0, |l| l.lost)
    }
}

/// Twenty nodes, publishers on five, 5 % loss, a partition (shorter than
/// the failure detector's suspicion) and its heal: every message reaches
/// every other node exactly once, in order.
fn exactly_once(seed: u64, pause: f64) -> u64 {
    const N: usize = 20;
    const PUBLISHERS: usize = 5;
    const EACH: u64 = 400;
    let mut s = Sim::new(N, seed, 0.05);
    s.pause = pause;
    s.run_until_converged(Duration::from_secs(30));
    for i in 0..N {
        s.nodes[i].core.add_interest("sim.>", "");
    }
    s.run(Duration::from_secs(3));
    let mut k = 0;
    // Numbered messages at 1 per ms from each publisher, for 400 ms; the
    // network is cut in two from 100 ms to 600 ms.
    while k < EACH {
        if k == 100 {
            for a in 0..N / 2 {
                for b in N / 2..N {
                    s.cut.insert((a, b));
                    s.cut.insert((b, a));
                }
            }
        }
        for p in 0..PUBLISHERS {
            s.publish(p * 4, k);
        }
        k += 1;
        s.run(MS);
    }
    s.run(Duration::from_millis(200));
    s.cut.clear();
    s.run(Duration::from_secs(10));
    for r in 0..N {
        for p in (0..PUBLISHERS).map(|p| p * 4).filter(|&p| p != r) {
            let got = s.got.get(&(r, p)).cloned().unwrap_or_default();
            let want: Vec<u64> = (0..EACH).collect();
            assert!(
                got == want,
                "seed {seed}: node {r} from {p}: {} of {EACH}, first wrong at {:?}; lost counted {}",
                got.len(),
                got.iter().zip(&want).position(|(a, b)| a != b),
                s.lost(p, r)
            );
        }
    }
    for n in &s.nodes {
        for l in n.links.link_stats() {
            assert_eq!(
                (l.lost, l.dropped_newest, l.dropped_oldest),
                (0, 0, 0),
                "{l:?}"
            );
        }
    }
    s.trace.finish()
}

#[test]
fn exactly_once_over_twenty_nodes_at_5_percent_loss_through_a_partition() {
    let t = exactly_once(16, 0.0);
    assert_eq!(t, exactly_once(16, 0.0), "the same seed gives the same run");
}

/// The same while every node leaves its associations unread in half of its
/// rounds (as when a slow local subscriber holds its delivery): what was
/// left is read later, and still arrives exactly once, in order.
#[test]
fn exactly_once_while_nodes_pause_reading_their_links() {
    exactly_once(23, 0.5);
}

/// A partition long enough for each side to declare the other down: no
/// message arrives twice or out of order; what is missing is counted lost
/// on its publisher's link; after the heal, new messages arrive everywhere.
#[test]
fn a_long_partition_loses_only_what_it_counts_and_heals() {
    const N: usize = 8;
    let mut s = Sim::new(N, 17, 0.05);
    s.run_until_converged(Duration::from_secs(30));
    for i in 0..N {
        s.nodes[i].core.add_interest("sim.>", "");
    }
    s.run(Duration::from_secs(3));
    for a in 0..N / 2 {
        for b in N / 2..N {
            s.cut.insert((a, b));
            s.cut.insert((b, a));
        }
    }
    for k in 0..200 {
        s.publish(0, k);
        s.publish(5, k);
        s.run(MS * 20);
    }
    s.cut.clear();
    s.run_until_converged(Duration::from_secs(60));
    s.run(Duration::from_secs(3));
    for k in 200..300 {
        s.publish(0, k);
        s.publish(5, k);
        s.run(MS);
    }
    s.run(Duration::from_secs(5));
    for r in 0..N {
        for p in [0, 5].into_iter().filter(|&p| p != r) {
            let got = s.got.get(&(r, p)).cloned().unwrap_or_default();
            assert!(
                got.windows(2).all(|w| w[0] < w[1]),
                "node {r} from {p}: duplicated or out of order"
            );
            for k in 200..300 {
                assert!(
                    got.contains(&k),
                    "node {r} from {p}: {k} after the heal missing"
                );
            }
            // What was routed to a node (it was up, as its publisher's
            // node saw it) and did not arrive is counted lost on the link;
            // the rest was published while the node was down there.
            let routed = s.routed.get(&(p, r)).copied().unwrap_or(0);
            let missing = routed - got.len() as u64;
            assert!(
                missing <= s.lost(p, r),
                "node {r} from {p}: {missing} of {routed} routed missing, {} counted lost",
                s.lost(p, r)
            );
        }
    }
}

/// Request and reply between two nodes at 1.4 % loss: the request travels
/// on node 0's association to node 1 and the reply on node 1's to node 0,
/// so neither association ever has a reply to carry its acknowledgement.
/// `batch` requests go at once (as from that many clients in lockstep) and
/// come back at once. Returns each round's time, after a few lossless
/// rounds that set the associations up.
fn request_rounds(loss: f64, rounds: u64, batch: u64) -> Vec<Duration> {
    let mut s = Sim::new(2, 31, 0.0);
    s.run_until_converged(Duration::from_secs(30));
    s.nodes[0].core.add_interest("sim.1", "");
    s.nodes[1].core.add_interest("sim.0", "");
    s.run(Duration::from_secs(3));
    // Runs until `at` (receiver, sender) has received number `k` last.
    let wait = |s: &mut Sim, at: (usize, usize), k: u64, t0: Instant| {
        while s.got.get(&at).is_none_or(|v| v.last() != Some(&k)) {
            assert!(s.now - t0 < Duration::from_secs(5), "{at:?}: {k} lost");
            s.run(MS / 10);
        }
    };
    let mut times = Vec::new();
    for round in 0..rounds + 5 {
        if round == 5 {
            s.loss = loss;
        }
        let t0 = s.now;
        let last = (round + 1) * batch - 1;
        // The requests from node 0, then the replies from node 1.
        for (from, to) in [(0, 1), (1, 0)] {
            for k in round * batch..=last {
                s.publish(from, k);
            }
            wait(&mut s, (to, from), last, t0);
        }
        if round >= 5 {
            times.push(s.now - t0);
        }
    }
    times
}

/// A lost packet must cost a round no more than a lost copy: the 99th
/// percentile of the rounds at 1.4 % loss stays within the slowest
/// lossless one, 1 ms over. A lone small packet goes twice, and only while
/// at most one other is unacknowledged, so an acknowledgement held back
/// for a reply that never comes would leave the next request with one
/// copy, and a batch of requests too large to copy would be one packet
/// whose loss waits for the probe timer.
fn p99_within_lossless(rounds: u64, batch: u64) {
    let slowest = request_rounds(0.0, 300, batch).into_iter().max().unwrap();
    let mut times = request_rounds(0.014, rounds, batch);
    times.sort_unstable();
    let p99 = times[times.len() * 99 / 100];
    assert!(
        p99 <= slowest + MS,
        "batches of {batch}: p99 {p99:?}, slowest lossless {slowest:?}; worst {:?}",
        times.last()
    );
}

#[test]
fn request_reply_across_two_associations_shrugs_off_single_losses() {
    p99_within_lossless(3000, 1);
}

/// The same with 40 requests at a time (one packet of about a kilobyte
/// each way, as 16 or more requesters in lockstep make).
#[test]
fn batches_of_requests_shrug_off_single_losses() {
    p99_within_lossless(1500, 40);
}
