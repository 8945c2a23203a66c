//! The mesh between nodes (Iris): membership, interest exchange and the
//! routing decisions of one node, sans-I/O. The node's driver feeds it the
//! datagrams of its mesh socket and the time; it hands back datagrams to
//! send, events and its next deadline, like [`crate::association`].
//!
//! - **Membership** is SWIM, by the `foca` crate: join (announce to a seed
//!   or a node found by scouting), leave, suspicion, failure, and rejoin
//!   with a new identity generation ([`NodeId::gen`]).
//! - **Interest**: each node advertises the subject patterns its clients
//!   subscribe to and its capacity in each cluster. Changes travel as
//!   versioned deltas to every member; a receiver applies a delta only on
//!   top of the version it holds (so duplicates are idempotent) and asks
//!   for a full snapshot on a gap, an unknown epoch or a digest mismatch.
//!   Every member sends a digest (epoch, version) each
//!   [`MeshConfig::digest_every`]: anti-entropy, so a lost delta or a
//!   healed partition converges without restarts.
//! - **Routing**: [`Mesh::route`] names each node with matching interest
//!   once, whatever number of its subscriptions match, so a message is sent
//!   once per interested node, which fans out locally. Frames to one node
//!   share datagrams ([`Mesh::send_frame`] and [`Mesh::flush`]: CMQ's
//!   per-destination batching; the driver flushes when it goes idle, which
//!   is natural batching).
//! - **Flow control**: a receiver acknowledges the data datagrams it took
//!   (one ack per burst, at flush); a sender with [`MeshConfig::window`]
//!   datagrams unacknowledged to a peer has no [`Mesh::room`], and the node
//!   makes its publishers wait, so a fast publisher slows to what the
//!   slowest interested node takes instead of overflowing its socket. An
//!   ack that does not come within [`MeshConfig::ack_timeout`] opens the
//!   window again (counted), so a lost ack stalls nobody for long.
//! - **Associations** between nodes (tunnels) ride the mesh's datagrams
//!   unread: [`Mesh::send_assoc`] queues one packet per datagram to an up
//!   member and [`MeshEvent::Assoc`] hands one back, only from an up
//!   member (others are counted in `unknown_sender`); the node drives the
//!   associations themselves.
//! - **Hostile input**: datagrams of another network name, from unknown
//!   senders, malformed, over the membership or interest bounds, or beyond
//!   a peer's interest rate are dropped and counted in [`MeshStats`].
//!
//! Datagram layouts are in [`packet`].

pub mod node_frame;
pub mod packet;
#[cfg(test)]
mod tests;
pub mod tunnel_frame;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::SocketAddr;
use std::num::{NonZeroU8, NonZeroUsize};
use std::time::{Duration, Instant};

use bytes::Bytes;
use foca::{
    AccumulatingRuntime, Foca, Identity, NoCustomBroadcast, OwnedNotification, PostcardCodec,
};
use rand010::rngs::SmallRng;
use rand010::SeedableRng;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::loss::{LossDetector, Verdict};
use crate::router::{Router, SubId, Subject};
use crate::varint;
use packet::{Kind, Op, Reader};

/// A node's identity in the mesh: its mesh address and a generation that
/// grows when it rejoins after being declared down (SWIM forbids reusing
/// a dead identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeId {
    /// The node's mesh (UDP) address.
    pub addr: SocketAddr,
    /// Generation; the higher wins for the same address.
    pub gen: u64,
}

impl Identity for NodeId {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        Some(NodeId {
            addr: self.addr,
            gen: self.gen.checked_add(1)?,
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.gen > adversary.gen
    }
}

/// How a node takes part in the mesh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshConfig {
    /// Network name: nodes of another name are ignored (Iris's `-net`).
    pub net: String,
    /// Most members tracked; SWIM packets from new senders beyond it are
    /// dropped and counted.
    pub max_members: usize,
    /// Most patterns (plus clusters) accepted from one peer; the rest are
    /// dropped and counted.
    pub max_interest: usize,
    /// Interest packets (deltas, snapshot parts, sync requests) accepted
    /// per second from one peer; the rest are dropped and counted.
    pub interest_rate: u32,
    /// Largest datagram this node sends.
    pub max_datagram: usize,
    /// SWIM probe period.
    pub probe_period: Duration,
    /// How long a suspect member has to refute before it is declared down.
    pub suspect_to_down: Duration,
    /// Interval of the anti-entropy digests.
    pub digest_every: Duration,
    /// Bytes of data datagrams that may be unacknowledged to one peer
    /// (counted as whole datagrams of that peer's size, at least 4).
    pub window: u64,
    /// How long a full window waits for an ack before it opens anyway.
    pub ack_timeout: Duration,
}

impl Default for MeshConfig {
    fn default() -> Self {
        MeshConfig {
            net: "skiff".into(),
            max_members: 1024,
            max_interest: 100_000,
            interest_rate: 200,
            max_datagram: 1400,
            probe_period: Duration::from_millis(500),
            suspect_to_down: Duration::from_millis(1500),
            digest_every: Duration::from_millis(500),
            window: 512 << 10,
            ack_timeout: Duration::from_millis(50),
        }
    }
}

/// What happened in the mesh, for the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MeshEvent {
    /// A member came up (or rejoined with a new generation).
    Up(NodeId),
    /// A member was declared down; its interest is gone.
    Down(NodeId),
    /// A peer's capacity in a cluster changed (0: it has no members).
    Cluster {
        /// The peer's mesh address.
        peer: SocketAddr,
        /// The cluster.
        cluster: String,
        /// Its advertised total capacity there.
        capacity: u32,
    },
    /// An application frame from a peer.
    /// The application frames of one datagram from a peer, in order.
    Frames {
        /// The peer's mesh address.
        from: SocketAddr,
        /// The frames, as the peer's node gave them to [`Mesh::send_frame`].
        frames: Frames,
    },
    /// An association packet from an up member.
    Assoc {
        /// The peer's mesh address.
        from: SocketAddr,
        /// The packet, as the peer gave it to [`Mesh::send_assoc`].
        packet: Bytes,
    },
}

/// Node-wide mesh counters; every dropped datagram is in one of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeshStats {
    /// Members up now (not counting this node).
    pub members_up: usize,
    /// Datagrams of another network name.
    pub wrong_net: u64,
    /// Datagrams that did not decode.
    pub malformed: u64,
    /// Interest or data datagrams from a node that is not an up member.
    pub unknown_sender: u64,
    /// SWIM datagrams from new senders while at `max_members`.
    pub member_limit: u64,
    /// SWIM datagrams foca refused (bad membership data).
    pub bad_membership: u64,
    /// Interest datagrams over a peer's rate.
    pub rate_limited: u64,
    /// Patterns or clusters dropped over `max_interest`.
    pub interest_limit: u64,
    /// Deltas already applied (duplicates, replays).
    pub stale_interest: u64,
    /// Full snapshots asked for.
    pub syncs_requested: u64,
    /// Full snapshots sent.
    pub syncs_sent: u64,
    /// Frames too large for one datagram, refused by `send_frame`.
    pub frames_too_large: u64,
    /// Windows opened by the ack timeout rather than an ack.
    pub ack_timeouts: u64,
}

/// One peer, for `skiff stats --mesh`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStats {
    /// Mesh address.
    pub addr: SocketAddr,
    /// Identity generation.
    pub gen: u64,
    /// Up (true) or down.
    pub up: bool,
    /// Patterns it advertises.
    pub patterns: usize,
    /// Clusters it has members in.
    pub clusters: usize,
    /// Interest version held.
    pub version: u64,
    /// Frames sent to it.
    pub sent_frames: u64,
    /// Datagrams sent to it.
    pub sent_datagrams: u64,
    /// Bytes sent to it.
    pub sent_bytes: u64,
    /// Frames received from it.
    pub recv_frames: u64,
    /// Datagrams received from it.
    pub recv_datagrams: u64,
    /// Bytes received from it.
    pub recv_bytes: u64,
    /// Data datagrams from it known lost (sequence gaps).
    pub lost: u64,
    /// Data datagrams from it received twice (dropped).
    pub duplicates: u64,
}

#[derive(Debug)]
struct Staging {
    epoch: u64,
    version: u64,
    parts: u16,
    got: Vec<bool>,
    ops: Vec<Op>,
}

#[derive(Debug)]
struct Peer {
    id: NodeId,
    up: bool,
    /// Interest epoch and version held (epoch 0: none yet).
    epoch: u64,
    version: u64,
    subs: FxHashMap<(String, String), SubId>,
    clusters: FxHashMap<String, u32>,
    staging: Option<Staging>,
    sync_asked: Option<Instant>,
    tokens: f64,
    refilled: Instant,
    tx_seq: u64,
    tx: Vec<u8>,
    tx_frames: u64,
    /// Largest data datagram to this peer: its path MTU when known.
    max_data: usize,
    /// Data datagrams the peer acknowledged (next it expects).
    acked: u64,
    /// When the window last moved (or first filled).
    acked_at: Instant,
    /// Next data sequence number expected from the peer.
    rx_next: u64,
    ack_due: bool,
    rx: LossDetector,
    stats: PeerStats,
}

impl Peer {
    fn new(id: NodeId, now: Instant, rate: u32) -> Peer {
        Peer {
            id,
            up: false,
            epoch: 0,
            version: 0,
            subs: FxHashMap::default(),
            clusters: FxHashMap::default(),
            staging: None,
            sync_asked: None,
            tokens: rate as f64,
            refilled: now,
            tx_seq: 0,
            tx: Vec::new(),
            tx_frames: 0,
            max_data: 0,
            acked: 0,
            acked_at: now,
            rx_next: 0,
            ack_due: false,
            rx: LossDetector::new(1),
            stats: PeerStats {
                addr: id.addr,
                gen: id.gen,
                up: false,
                patterns: 0,
                clusters: 0,
                version: 0,
                sent_frames: 0,
                sent_datagrams: 0,
                sent_bytes: 0,
                recv_frames: 0,
                recv_datagrams: 0,
                recv_bytes: 0,
                lost: 0,
                duplicates: 0,
            },
        }
    }
}

/// This node's own advertised interest.
#[derive(Debug, Default)]
struct Local {
    epoch: u64,
    version: u64,
    subs: FxHashMap<(String, String), u32>,
    clusters: FxHashMap<String, u32>,
    pending: Vec<Op>,
}

type Membership = Foca<NodeId, PostcardCodec, SmallRng, NoCustomBroadcast>;

/// One node's view of the mesh. See the module documentation.
pub struct Mesh {
    config: MeshConfig,
    net: u32,
    foca: Membership,
    rt: AccumulatingRuntime<NodeId>,
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    timer_events: FxHashMap<u64, foca::Timer<NodeId>>,
    next_timer: u64,
    now: Instant,
    peers: FxHashMap<SocketAddr, Peer>,
    interest: Router<SocketAddr>,
    local: Local,
    out: VecDeque<(SocketAddr, Vec<u8>)>,
    events: VecDeque<MeshEvent>,
    stats: MeshStats,
    next_digest: Instant,
    seeds: Vec<SocketAddr>,
}

impl std::fmt::Debug for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh")
            .field("me", self.foca.identity())
            .field("peers", &self.peers.len())
            .finish()
    }
}

impl Mesh {
    /// A node `me` alone in its mesh. `seed` seeds the random choices
    /// (probe targets, the interest epoch): the same seed and inputs give
    /// the same outputs.
    pub fn new(me: NodeId, config: MeshConfig, now: Instant, seed: u64) -> Mesh {
        let fc = foca::Config {
            probe_period: config.probe_period,
            probe_rtt: config.probe_period * 2 / 5,
            num_indirect_probes: NonZeroUsize::new(3).expect("3"),
            max_transmissions: NonZeroU8::new(8).expect("8"),
            suspect_to_down_after: config.suspect_to_down,
            remove_down_after: Some(Duration::from_secs(60)),
            max_packet_size: NonZeroUsize::new(
                config.max_datagram.clamp(512, 65_000) - packet::ENVELOPE,
            )
            .expect("non-zero"),
            notify_down_members: true,
            periodic_announce: Some(foca::PeriodicParams {
                frequency: Duration::from_secs(10),
                num_members: NonZeroUsize::new(1).expect("1"),
            }),
            periodic_announce_to_down_members: Some(foca::PeriodicParams {
                frequency: Duration::from_secs(2),
                num_members: NonZeroUsize::new(2).expect("2"),
            }),
            periodic_gossip: Some(foca::PeriodicParams {
                frequency: Duration::from_millis(200),
                num_members: NonZeroUsize::new(3).expect("3"),
            }),
        };
        let mut rng = SmallRng::seed_from_u64(seed);
        let epoch = rand010::RngExt::random::<u64>(&mut rng) | 1;
        let mut m = Mesh {
            net: packet::net_hash(&config.net),
            foca: Foca::new(me, fc, rng, PostcardCodec),
            rt: AccumulatingRuntime::new(),
            timers: BinaryHeap::new(),
            timer_events: FxHashMap::default(),
            next_timer: 0,
            now,
            peers: FxHashMap::default(),
            interest: Router::new(),
            local: Local {
                epoch,
                ..Local::default()
            },
            out: VecDeque::new(),
            events: VecDeque::new(),
            stats: MeshStats::default(),
            next_digest: now + config.digest_every,
            seeds: Vec::new(),
            config,
        };
        m.drain_runtime();
        m
    }

    /// This node's identity (its generation grows if it had to rejoin).
    pub fn id(&self) -> NodeId {
        *self.foca.identity()
    }

    /// The configuration.
    pub fn config(&self) -> &MeshConfig {
        &self.config
    }

    /// Asks the node at `addr` (a seed, or one found by scouting) to let
    /// this node in.
    pub fn announce(&mut self, now: Instant, addr: SocketAddr) {
        self.now = now;
        if addr == self.id().addr || self.peers.get(&addr).is_some_and(|p| p.up) {
            return;
        }
        let _ = self.foca.announce(NodeId { addr, gen: 0 }, &mut self.rt);
        self.drain_runtime();
    }

    /// Sets the seed addresses (from configuration or DNS): each is
    /// announced to now, and again at every digest while it is not an up
    /// member, so a lost announce, a seed that starts later or a healed
    /// partition still joins. At most `max_members` are kept.
    pub fn set_seeds(&mut self, now: Instant, seeds: &[SocketAddr]) {
        self.seeds = seeds
            .iter()
            .copied()
            .take(self.config.max_members)
            .collect();
        for a in self.seeds.clone() {
            self.announce(now, a);
        }
    }

    /// A scouting hello for the multicast group: network name and identity.
    pub fn hello(&self) -> Vec<u8> {
        let mut out = Vec::new();
        packet::envelope(&mut out, Kind::Hello, self.net);
        let name = &self.config.net.as_bytes()[..self.config.net.len().min(255)];
        out.push(name.len() as u8);
        out.extend_from_slice(name);
        out.extend_from_slice(&self.id().gen.to_le_bytes());
        out
    }

    /// Leaves the mesh gracefully: members learn it at once instead of
    /// suspecting this node.
    pub fn leave(&mut self, now: Instant) {
        self.now = now;
        let _ = self.foca.leave_cluster(&mut self.rt);
        self.drain_runtime();
    }

    /// Members up now.
    pub fn members(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.peers.values().filter(|p| p.up).map(|p| p.id)
    }

    /// Whether the peer at `addr` is an up member.
    pub fn is_up(&self, addr: SocketAddr) -> bool {
        self.peers.get(&addr).is_some_and(|p| p.up)
    }

    /// Counters.
    pub fn stats(&self) -> MeshStats {
        let mut s = self.stats.clone();
        s.members_up = self.peers.values().filter(|p| p.up).count();
        s
    }

    /// Every peer known, up or down, sorted by address.
    pub fn peer_stats(&self) -> Vec<PeerStats> {
        let mut v: Vec<PeerStats> = self
            .peers
            .values()
            .map(|p| {
                let l = p.rx.stats();
                PeerStats {
                    addr: p.id.addr,
                    gen: p.id.gen,
                    up: p.up,
                    patterns: p.subs.len(),
                    clusters: p.clusters.len(),
                    version: p.version,
                    lost: l.lost,
                    duplicates: l.duplicates + l.stale,
                    ..p.stats.clone()
                }
            })
            .collect();
        v.sort_by_key(|p| p.addr);
        v
    }

    // ---- local interest ----

    /// A local subscription to `pattern` and type `kind` was added. Peers
    /// learn of the first one per (pattern, type) at the next flush.
    pub fn add_interest(&mut self, pattern: &str, kind: &str) {
        let n = self
            .local
            .subs
            .entry((pattern.to_owned(), kind.to_owned()))
            .or_default();
        *n += 1;
        if *n == 1 {
            self.local
                .pending
                .push(Op::Sub(pattern.to_owned(), kind.to_owned()));
        }
    }

    /// A local subscription was removed; the last one per (pattern, type)
    /// is withdrawn from peers at the next flush.
    pub fn remove_interest(&mut self, pattern: &str, kind: &str) {
        let key = (pattern.to_owned(), kind.to_owned());
        if let Some(n) = self.local.subs.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.local.subs.remove(&key);
                self.local.pending.push(Op::Unsub(key.0, key.1));
            }
        }
    }

    /// This node's total capacity in `cluster` (0: no local members).
    pub fn set_cluster(&mut self, cluster: &str, capacity: u32) {
        let old = if capacity == 0 {
            self.local.clusters.remove(cluster).unwrap_or(0)
        } else {
            self.local
                .clusters
                .insert(cluster.to_owned(), capacity)
                .unwrap_or(0)
        };
        if old != capacity {
            self.local
                .pending
                .push(Op::Cluster(cluster.to_owned(), capacity));
        }
    }

    // ---- routing ----

    /// Appends to `out` each up peer (once) with interest in a message on
    /// `subject` of type `kind`.
    pub fn route(&self, subject: &str, kind: Option<&str>, out: &mut Vec<SocketAddr>) {
        let Ok(s) = Subject::new(subject) else { return };
        let start = out.len();
        self.interest.for_each_match(s, kind, |_, peer| {
            if !out[start..].contains(&peer) {
                out.push(peer);
            }
        });
    }

    /// Each up peer with members in `cluster`, with its capacity there.
    pub fn cluster_peers<'a>(
        &'a self,
        cluster: &'a str,
    ) -> impl Iterator<Item = (SocketAddr, u32)> + 'a {
        self.peers
            .values()
            .filter(|p| p.up)
            .filter_map(move |p| p.clusters.get(cluster).map(|c| (p.id.addr, *c)))
    }

    /// Queues `frame` for the peer at `to`, sharing a datagram with the
    /// frames queued before it; a datagram leaves when the next frame would
    /// not fit or at [`Mesh::flush`]. Refuses (and counts) a frame larger
    /// than one datagram, or a peer that is not up.
    pub fn send_frame(
        &mut self,
        now: Instant,
        to: SocketAddr,
        frame: &[u8],
    ) -> Result<(), FrameError> {
        self.send_frame_parts(now, to, &[frame])
    }

    /// [`Mesh::send_frame`] of the frame made of `parts` in order (a tag
    /// and a body, say), so the caller need not join them first.
    pub fn send_frame_parts(
        &mut self,
        now: Instant,
        to: SocketAddr,
        parts: &[&[u8]],
    ) -> Result<(), FrameError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        self.now = self.now.max(now);
        let max = match self.peers.get(&to) {
            Some(p) if p.max_data > 0 => p.max_data,
            _ => self.config.max_datagram.max(512),
        };
        let need = varint::len(len as u64) + len;
        if packet::ENVELOPE + 8 + need > 65_000.max(max) {
            self.stats.frames_too_large += 1;
            return Err(FrameError::TooLarge {
                len,
                max: 65_000 - packet::ENVELOPE - 8 - 4,
            });
        }
        let (net, now) = (self.net, self.now);
        let Some(p) = self.peers.get_mut(&to).filter(|p| p.up) else {
            return Err(FrameError::NotUp(to));
        };
        if !p.tx.is_empty() && p.tx.len() + need > max {
            Self::seal(p, &mut self.out);
        }
        if p.tx.is_empty() {
            if p.tx_seq == p.acked {
                // Nothing in flight: the ack clock starts now.
                p.acked_at = now;
            }
            packet::envelope(&mut p.tx, Kind::Data, net);
            p.tx.extend_from_slice(&p.tx_seq.to_le_bytes());
            p.tx_seq += 1;
        }
        varint::put(&mut p.tx, len as u64);
        for part in parts {
            p.tx.extend_from_slice(part);
        }
        p.tx_frames += 1;
        Ok(())
    }

    /// Queues one association packet for the up member at `to`, in a
    /// datagram of its own. Refuses (and counts) a packet too large for a
    /// datagram, or a peer that is not up.
    pub fn send_assoc(
        &mut self,
        now: Instant,
        to: SocketAddr,
        packet: &[u8],
    ) -> Result<(), FrameError> {
        self.now = self.now.max(now);
        let max = 65_000 - packet::ENVELOPE;
        if packet.len() > max {
            self.stats.frames_too_large += 1;
            return Err(FrameError::TooLarge {
                len: packet.len(),
                max,
            });
        }
        let Some(p) = self.peers.get_mut(&to).filter(|p| p.up) else {
            return Err(FrameError::NotUp(to));
        };
        let mut d = Vec::with_capacity(packet::ENVELOPE + packet.len());
        packet::envelope(&mut d, Kind::Assoc, self.net);
        d.extend_from_slice(packet);
        p.stats.sent_datagrams += 1;
        p.stats.sent_bytes += d.len() as u64;
        self.out.push_back((to, d));
        Ok(())
    }

    fn seal(p: &mut Peer, out: &mut VecDeque<(SocketAddr, Vec<u8>)>) {
        if p.tx.is_empty() {
            return;
        }
        let d = std::mem::take(&mut p.tx);
        p.stats.sent_datagrams += 1;
        p.stats.sent_bytes += d.len() as u64;
        p.stats.sent_frames += std::mem::take(&mut p.tx_frames);
        out.push_back((p.id.addr, d));
    }

    /// Whether every up peer's window has room for more data datagrams:
    /// the node holds publishers back while it has none.
    pub fn room(&self) -> bool {
        self.peers
            .values()
            .all(|p| !p.up || p.tx_seq.saturating_sub(p.acked) < self.window_of(p))
    }

    /// A peer's window in datagrams.
    fn window_of(&self, p: &Peer) -> u64 {
        let size = if p.max_data > 0 {
            p.max_data
        } else {
            self.config.max_datagram.max(512)
        };
        (self.config.window / size as u64).max(4)
    }

    /// Sizes data datagrams to `addr` by its path MTU (the driver asks the
    /// kernel, `IP_MTU`): a whole datagram per IP packet, never fragmented,
    /// and as few datagrams as the path allows (a loopback peer takes 64 KB
    /// ones, an Ethernet peer 1,472-byte ones).
    pub fn set_path_mtu(&mut self, addr: SocketAddr, mtu: usize) {
        let ip_udp = if addr.is_ipv4() { 28 } else { 48 };
        if let Some(p) = self.peers.get_mut(&addr) {
            p.max_data = mtu.saturating_sub(ip_udp).clamp(512, 65_000);
        }
    }

    /// Seals every peer's pending frames into datagrams and sends pending
    /// interest changes as deltas. The driver calls it when it has nothing
    /// else to do (natural batching).
    pub fn flush(&mut self) {
        let net = self.net;
        for p in self.peers.values_mut() {
            Self::seal(p, &mut self.out);
            if p.ack_due {
                p.ack_due = false;
                let mut d = Vec::with_capacity(packet::ENVELOPE + 8);
                packet::envelope(&mut d, Kind::Ack, net);
                d.extend_from_slice(&p.rx_next.to_le_bytes());
                self.out.push_back((p.id.addr, d));
            }
        }
        if !self.local.pending.is_empty() {
            self.send_deltas();
        }
    }

    fn send_deltas(&mut self) {
        let ops = std::mem::take(&mut self.local.pending);
        let room = self.config.max_datagram.max(512) - packet::ENVELOPE - 16 - 5;
        let mut start = 0;
        while start < ops.len() {
            let mut end = start;
            let mut size = 0;
            while end < ops.len() && (end == start || size + packet::op_len(&ops[end]) <= room) {
                size += packet::op_len(&ops[end]);
                end += 1;
            }
            let mut d = Vec::with_capacity(packet::ENVELOPE + 16 + size + 5);
            packet::envelope(&mut d, Kind::Delta, self.net);
            d.extend_from_slice(&self.local.epoch.to_le_bytes());
            d.extend_from_slice(&self.local.version.to_le_bytes());
            packet::put_ops(&mut d, ops[start..end].iter());
            self.local.version += 1;
            for p in self.peers.values().filter(|p| p.up) {
                self.out.push_back((p.id.addr, d.clone()));
            }
            start = end;
        }
    }

    fn send_full(&mut self, to: SocketAddr) {
        self.stats.syncs_sent += 1;
        let ops: Vec<Op> = self
            .local
            .subs
            .keys()
            .map(|(p, k)| Op::Sub(p.clone(), k.clone()))
            .chain(
                self.local
                    .clusters
                    .iter()
                    .map(|(c, n)| Op::Cluster(c.clone(), *n)),
            )
            .collect();
        let room = self.config.max_datagram.max(512) - packet::ENVELOPE - 20 - 5;
        let mut chunks: Vec<&[Op]> = Vec::new();
        let mut start = 0;
        while start < ops.len() || chunks.is_empty() {
            let mut end = start;
            let mut size = 0;
            while end < ops.len() && (end == start || size + packet::op_len(&ops[end]) <= room) {
                size += packet::op_len(&ops[end]);
                end += 1;
            }
            chunks.push(&ops[start..end]);
            start = end;
            if chunks.len() == u16::MAX as usize {
                break;
            }
        }
        let parts = chunks.len() as u16;
        for (i, c) in chunks.iter().enumerate() {
            let mut d = Vec::new();
            packet::envelope(&mut d, Kind::Full, self.net);
            d.extend_from_slice(&self.local.epoch.to_le_bytes());
            d.extend_from_slice(&self.local.version.to_le_bytes());
            d.extend_from_slice(&(i as u16).to_le_bytes());
            d.extend_from_slice(&parts.to_le_bytes());
            packet::put_ops(&mut d, c.iter());
            self.out.push_back((to, d));
        }
    }

    fn ask_sync(&mut self, addr: SocketAddr) {
        let now = self.now;
        let Some(p) = self.peers.get_mut(&addr) else {
            return;
        };
        if p.sync_asked
            .is_some_and(|t| now < t + Duration::from_millis(300))
        {
            return;
        }
        p.sync_asked = Some(now);
        self.stats.syncs_requested += 1;
        let mut d = Vec::new();
        packet::envelope(&mut d, Kind::Sync, self.net);
        self.out.push_back((addr, d));
    }

    // ---- input ----

    /// Handles one datagram received on the mesh socket from `from`.
    pub fn handle_datagram(&mut self, now: Instant, from: SocketAddr, data: &[u8]) {
        self.handle_datagram_bytes(now, from, Bytes::copy_from_slice(data))
    }

    /// [`Mesh::handle_datagram`] without a copy: frames are handed on as
    /// slices of `data`.
    pub fn handle_datagram_bytes(&mut self, now: Instant, from: SocketAddr, datagram: Bytes) {
        let data = &datagram[..];
        self.now = now;
        let (kind, net, body) = match packet::open(data) {
            Ok(x) => x,
            Err(_) => {
                self.stats.malformed += 1;
                return;
            }
        };
        if net != self.net {
            self.stats.wrong_net += 1;
            return;
        }
        match kind {
            Kind::Swim => self.handle_swim(from, body),
            Kind::Hello => self.handle_hello(from, body),
            _ => {
                let up = self.peers.get(&from).is_some_and(|p| p.up);
                if !up {
                    self.stats.unknown_sender += 1;
                    return;
                }
                if !matches!(kind, Kind::Data | Kind::Digest | Kind::Ack | Kind::Assoc)
                    && !self.take_token(from)
                {
                    self.stats.rate_limited += 1;
                    return;
                }
                if self.handle_peer(kind, from, body, &datagram).is_err() {
                    self.stats.malformed += 1;
                }
            }
        }
        self.drain_runtime();
    }

    fn take_token(&mut self, from: SocketAddr) -> bool {
        let rate = self.config.interest_rate as f64;
        let now = self.now;
        let Some(p) = self.peers.get_mut(&from) else {
            return false;
        };
        let dt = now.saturating_duration_since(p.refilled).as_secs_f64();
        p.refilled = now;
        p.tokens = (p.tokens + dt * rate).min(rate.max(1.0));
        if p.tokens >= 1.0 {
            p.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn handle_swim(&mut self, from: SocketAddr, body: &[u8]) {
        if !self.peers.contains_key(&from) && self.peers.len() >= self.config.max_members {
            self.stats.member_limit += 1;
            return;
        }
        if self.foca.handle_data(body, &mut self.rt).is_err() {
            self.stats.bad_membership += 1;
        }
    }

    fn handle_hello(&mut self, from: SocketAddr, body: &[u8]) {
        let mut r = Reader::new(body);
        let ok = (|| {
            let n = r.u8("hello")? as usize;
            let name = r
                .rest()
                .get(..n)
                .ok_or(crate::WireError::Truncated { what: "hello" })?;
            Ok::<bool, crate::WireError>(name == self.config.net.as_bytes())
        })();
        match ok {
            Ok(true) => {
                let now = self.now;
                self.announce(now, from);
            }
            Ok(false) => self.stats.wrong_net += 1,
            Err(_) => self.stats.malformed += 1,
        }
    }

    fn handle_peer(
        &mut self,
        kind: Kind,
        from: SocketAddr,
        body: &[u8],
        datagram: &Bytes,
    ) -> Result<(), crate::WireError> {
        let mut r = Reader::new(body);
        match kind {
            Kind::Delta => {
                let (epoch, base) = (r.u64("mesh packet")?, r.u64("mesh packet")?);
                let ops = packet::get_ops(&mut r)?;
                let p = self.peers.get(&from).expect("up");
                if epoch != p.epoch || base > p.version {
                    self.ask_sync(from);
                } else if base < p.version {
                    self.stats.stale_interest += 1;
                } else {
                    self.apply(from, ops, false);
                    if let Some(p) = self.peers.get_mut(&from) {
                        p.version += 1;
                    }
                }
            }
            Kind::Digest => {
                let (epoch, version) = (r.u64("mesh packet")?, r.u64("mesh packet")?);
                let p = self.peers.get(&from).expect("up");
                if epoch != p.epoch || version != p.version {
                    self.ask_sync(from);
                }
            }
            Kind::Sync => self.send_full(from),
            Kind::Full => {
                let (epoch, version, part, parts) = (
                    r.u64("mesh packet")?,
                    r.u64("mesh packet")?,
                    r.u16("mesh packet")?,
                    r.u16("mesh packet")?,
                );
                if part >= parts {
                    return Err(crate::WireError::Malformed("part index past its count"));
                }
                let ops = packet::get_ops(&mut r)?;
                if ops.iter().any(|o| matches!(o, Op::Unsub(..))) {
                    return Err(crate::WireError::Malformed("unsubscribe in a snapshot"));
                }
                let limit = self.config.max_interest;
                let p = self.peers.get_mut(&from).expect("up");
                let fresh = p
                    .staging
                    .as_ref()
                    .is_none_or(|s| s.epoch != epoch || s.version != version || s.parts != parts);
                if fresh {
                    p.staging = Some(Staging {
                        epoch,
                        version,
                        parts,
                        got: vec![false; parts as usize],
                        ops: Vec::new(),
                    });
                }
                let s = p.staging.as_mut().expect("set");
                if !s.got[part as usize] {
                    s.got[part as usize] = true;
                    let room = limit.saturating_sub(s.ops.len());
                    if ops.len() > room {
                        self.stats.interest_limit += (ops.len() - room) as u64;
                    }
                    s.ops.extend(ops.into_iter().take(room));
                }
                if s.got.iter().all(|g| *g) {
                    let s = p.staging.take().expect("set");
                    self.replace(from, s.epoch, s.version, s.ops);
                }
            }
            Kind::Ack => {
                let next = r.u64("mesh packet")?;
                let now = self.now;
                let p = self.peers.get_mut(&from).expect("up");
                let next = next.min(p.tx_seq);
                if next > p.acked {
                    p.acked = next;
                    p.acked_at = now;
                }
            }
            Kind::Data => {
                let seq = r.u64("mesh packet")?;
                let p = self.peers.get_mut(&from).expect("up");
                p.rx_next = p.rx_next.max(seq.saturating_add(1));
                p.ack_due = true;
                p.stats.recv_datagrams += 1;
                p.stats.recv_bytes += body.len() as u64 + packet::ENVELOPE as u64;
                if p.rx.check(0, seq) != Verdict::Deliver {
                    return Ok(());
                }
                // Checked whole before any frame is handed on.
                let mut check = Reader::new(r.rest());
                let mut n = 0;
                while !check.is_empty() {
                    check.bytes(packet::MAX_FRAME, "mesh frame")?;
                    n += 1;
                }
                p.stats.recv_frames += n;
                let at = datagram.len() - r.rest().len();
                self.events.push_back(MeshEvent::Frames {
                    from,
                    frames: Frames {
                        buf: datagram.slice(at..),
                    },
                });
            }
            Kind::Assoc => {
                if body.is_empty() {
                    return Err(crate::WireError::Truncated {
                        what: "association packet",
                    });
                }
                let p = self.peers.get_mut(&from).expect("up");
                p.stats.recv_datagrams += 1;
                p.stats.recv_bytes += body.len() as u64 + packet::ENVELOPE as u64;
                self.events.push_back(MeshEvent::Assoc {
                    from,
                    packet: Bytes::copy_from_slice(body),
                });
            }
            Kind::Swim | Kind::Hello => {}
        }
        Ok(())
    }

    /// Applies a peer's ops (`snapshot`: they rebuild from nothing).
    fn apply(&mut self, from: SocketAddr, ops: Vec<Op>, snapshot: bool) {
        let limit = self.config.max_interest;
        let p = self.peers.get_mut(&from).expect("known");
        for op in ops {
            match op {
                Op::Sub(pat, kind) => {
                    let key = (pat, kind);
                    if p.subs.contains_key(&key) {
                        continue;
                    }
                    if p.subs.len() + p.clusters.len() >= limit {
                        self.stats.interest_limit += 1;
                        continue;
                    }
                    // A pattern that does not parse is the peer's bug:
                    // counted, not routed.
                    match self.interest.subscribe(&key.0, &key.1, from) {
                        Ok(id) => {
                            p.subs.insert(key, id);
                        }
                        Err(_) => self.stats.malformed += 1,
                    }
                }
                Op::Unsub(pat, kind) => {
                    if let Some(id) = p.subs.remove(&(pat, kind)) {
                        self.interest.unsubscribe(id);
                    }
                }
                Op::Cluster(c, cap) => {
                    let changed = if cap == 0 {
                        p.clusters.remove(&c).is_some()
                    } else if p.clusters.len() + p.subs.len() >= limit
                        && !p.clusters.contains_key(&c)
                    {
                        self.stats.interest_limit += 1;
                        false
                    } else {
                        p.clusters.insert(c.clone(), cap) != Some(cap)
                    };
                    if changed {
                        self.events.push_back(MeshEvent::Cluster {
                            peer: from,
                            cluster: c,
                            capacity: cap,
                        });
                    }
                }
            }
        }
        let _ = snapshot;
    }

    /// Replaces a peer's interest by a complete snapshot.
    fn replace(&mut self, from: SocketAddr, epoch: u64, version: u64, ops: Vec<Op>) {
        let p = self.peers.get_mut(&from).expect("known");
        let new_clusters: FxHashMap<&str, u32> = ops
            .iter()
            .filter_map(|o| match o {
                Op::Cluster(c, n) => Some((c.as_str(), *n)),
                _ => None,
            })
            .collect();
        let mut ops2 = Vec::new();
        // Withdraw what the snapshot no longer holds.
        let new_subs: rustc_hash::FxHashSet<(&str, &str)> = ops
            .iter()
            .filter_map(|o| match o {
                Op::Sub(a, b) => Some((a.as_str(), b.as_str())),
                _ => None,
            })
            .collect();
        for (a, b) in p.subs.keys() {
            if !new_subs.contains(&(a.as_str(), b.as_str())) {
                ops2.push(Op::Unsub(a.clone(), b.clone()));
            }
        }
        for c in p.clusters.keys() {
            if !new_clusters.contains_key(c.as_str()) {
                ops2.push(Op::Cluster(c.clone(), 0));
            }
        }
        p.epoch = epoch;
        p.version = version;
        p.sync_asked = None;
        ops2.extend(ops);
        self.apply(from, ops2, true);
    }

    fn forget_interest(&mut self, addr: SocketAddr) {
        let Some(p) = self.peers.get_mut(&addr) else {
            return;
        };
        for (_, id) in p.subs.drain() {
            self.interest.unsubscribe(id);
        }
        for (c, _) in p.clusters.drain() {
            self.events.push_back(MeshEvent::Cluster {
                peer: addr,
                cluster: c,
                capacity: 0,
            });
        }
        p.epoch = 0;
        p.version = 0;
        p.staging = None;
        p.tx.clear();
        p.tx_frames = 0;
    }

    // ---- time ----

    /// Runs what is due at `now`: SWIM timers and the anti-entropy digest.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        while let Some(Reverse((at, n))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            if let Some(t) = self.timer_events.remove(&n) {
                let _ = self.foca.handle_timer(t, &mut self.rt);
                self.drain_runtime();
            }
        }
        let t = self.config.ack_timeout;
        let full: Vec<SocketAddr> = self
            .peers
            .values()
            .filter(|p| p.up && p.tx_seq.saturating_sub(p.acked) >= self.window_of(p))
            .map(|p| p.id.addr)
            .collect();
        for a in full {
            let p = self.peers.get_mut(&a).expect("listed");
            if now >= p.acked_at + t {
                p.acked = p.tx_seq;
                p.acked_at = now;
                self.stats.ack_timeouts += 1;
            }
        }
        if now >= self.next_digest {
            self.next_digest = now + self.config.digest_every;
            self.flush();
            let mut d = Vec::new();
            packet::envelope(&mut d, Kind::Digest, self.net);
            d.extend_from_slice(&self.local.epoch.to_le_bytes());
            d.extend_from_slice(&self.local.version.to_le_bytes());
            for p in self.peers.values().filter(|p| p.up) {
                self.out.push_back((p.id.addr, d.clone()));
            }
            for a in self.seeds.clone() {
                self.announce(now, a);
            }
        }
    }

    /// When [`Mesh::handle_timeout`] next has something to do.
    pub fn poll_timeout(&self) -> Instant {
        let full = self
            .peers
            .values()
            .filter(|p| p.up && p.tx_seq.saturating_sub(p.acked) >= self.window_of(p))
            .map(|p| p.acked_at + self.config.ack_timeout)
            .min();
        let t = match self.timers.peek() {
            Some(Reverse((at, _))) => (*at).min(self.next_digest),
            None => self.next_digest,
        };
        full.map_or(t, |f| f.min(t))
    }

    /// The next datagram to send: (destination, bytes).
    pub fn poll_transmit(&mut self) -> Option<(SocketAddr, Vec<u8>)> {
        self.out.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<MeshEvent> {
        self.events.pop_front()
    }

    fn drain_runtime(&mut self) {
        while let Some((to, data)) = self.rt.to_send() {
            let mut d = Vec::with_capacity(packet::ENVELOPE + data.len());
            packet::envelope(&mut d, Kind::Swim, self.net);
            d.extend_from_slice(&data);
            self.out.push_back((to.addr, d));
        }
        while let Some((after, t)) = self.rt.to_schedule() {
            let n = self.next_timer;
            self.next_timer += 1;
            self.timers.push(Reverse((self.now + after, n)));
            self.timer_events.insert(n, t);
        }
        while let Some(n) = self.rt.to_notify() {
            match n {
                OwnedNotification::MemberUp(id) => self.member_up(id),
                OwnedNotification::MemberDown(id) => self.member_down(id),
                OwnedNotification::Rename(old, new) => {
                    if let Some(p) = self.peers.get_mut(&old.addr) {
                        p.id = new;
                        p.stats.gen = new.gen;
                    }
                }
                _ => {}
            }
        }
    }

    fn member_up(&mut self, id: NodeId) {
        let (now, rate) = (self.now, self.config.interest_rate);
        let p = self
            .peers
            .entry(id.addr)
            .or_insert_with(|| Peer::new(id, now, rate));
        p.id = id;
        p.stats.gen = id.gen;
        if p.up {
            return;
        }
        p.up = true;
        p.stats.up = true;
        // A fresh stream of data sequence numbers each way.
        p.rx = LossDetector::new(1);
        p.tx_seq = 0;
        p.acked = 0;
        p.rx_next = 0;
        p.acked_at = self.now;
        self.events.push_back(MeshEvent::Up(id));
        // Both ways: it may have refused ours while it did not know us yet.
        self.send_full(id.addr);
        self.ask_sync(id.addr);
    }

    fn member_down(&mut self, id: NodeId) {
        let Some(p) = self.peers.get_mut(&id.addr) else {
            return;
        };
        if !p.up {
            return;
        }
        p.up = false;
        p.stats.up = false;
        self.forget_interest(id.addr);
        self.events.push_back(MeshEvent::Down(id));
    }
}

/// The frames of one data datagram (validated): each is a slice of the
/// received datagram, no copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frames {
    buf: Bytes,
}

impl Iterator for Frames {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        let (n, used) = varint::get(&self.buf).ok()?;
        let end = used.checked_add(usize::try_from(n).ok()?)?;
        if end > self.buf.len() {
            return None;
        }
        // One reference-count increment per frame (`split_to`), none to
        // move past it: the count is shared by every frame of the datagram.
        let mut f = self.buf.split_to(end);
        bytes::Buf::advance(&mut f, used);
        Some(f)
    }
}

/// Why [`Mesh::send_frame`] refused a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Larger than one datagram.
    #[error("a frame of {len} bytes is over the mesh's datagram limit of {max} bytes")]
    TooLarge {
        /// The frame's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The peer is not an up member.
    #[error("mesh peer {0} is not up")]
    NotUp(SocketAddr),
}
