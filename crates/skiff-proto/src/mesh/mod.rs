//! The mesh between nodes (Iris): membership, interest exchange and the
//! routing decisions of one node, sans-I/O. The node's driver feeds it the
//! datagrams of its mesh socket and the time; it hands back datagrams to
//! send, events and its next deadline, like [`crate::association`].
//!
//! - **Membership** is SWIM, by the `foca` crate: join (announce to a
//!   seed or a node found by scouting), leave, suspicion, failure, and
//!   rejoin with a new identity generation ([`NodeId::gen`]).
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
//!   share datagrams ([`Mesh::send_frame`]: CMQ's per-destination
//!   batching); a datagram leaves when it is full or when the driver polls
//!   for datagrams to send, which it does when it has handled what arrived
//!   (natural batching).
//! - **Flow control**: a receiver acknowledges the data datagrams it took
//!   (one ack per burst); a sender with [`MeshConfig::window`] bytes of
//!   data datagrams unacknowledged to a peer has no [`Mesh::room`], and the
//!   node makes its publishers wait, so a fast publisher slows to what the
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
//! The code is split along those seams: `membership.rs` (foca, its timers,
//! members coming and going, scouting hellos), `interest.rs` (this node's
//! advertised interest, peers' interest, routing), `flow.rs` (data
//! datagrams, acks, windows, association packets) and `outbox.rs` (the
//! datagrams waiting for [`Mesh::poll_transmit`]). Datagram layouts are in
//! [`packet`].

mod flow;
mod interest;
mod membership;
pub mod node_frame;
mod outbox;
pub mod packet;
mod stats;
#[cfg(test)]
mod tests;
pub mod tunnel_frame;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use rustc_hash::FxHashMap;

use crate::router::Router;
use flow::PeerFlow;
use interest::{Local, PeerInterest};
use membership::Membership;
use outbox::Outbox;
use packet::Kind;

pub use flow::{FrameError, Frames};
pub use membership::NodeId;
pub use outbox::Transmit;
pub use stats::{MeshStats, PeerStats};

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
    /// This node was declared down by the mesh and rejoined with a new
    /// generation (the one given): its peers forgot what they had from
    /// the old one.
    Rejoined(NodeId),
    /// A member did not answer probes and is suspected down (SWIM): it is
    /// declared down unless it refutes the suspicion in time.
    Suspect(NodeId),
    /// A peer's capacity in a cluster changed (0: it has no members).
    Cluster {
        /// The peer's mesh address.
        peer: SocketAddr,
        /// The cluster.
        cluster: String,
        /// Its advertised total capacity there.
        capacity: u32,
    },
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

/// One peer known to this node: up or down, its interest, the flow of
/// data each way, and its counters.
#[derive(Debug)]
struct Peer {
    id: NodeId,
    up: bool,
    interest: PeerInterest,
    flow: PeerFlow,
    stats: PeerStats,
}

impl Peer {
    fn new(id: NodeId, now: Instant, rate: u32) -> Peer {
        Peer {
            id,
            up: false,
            interest: PeerInterest::new(now, rate),
            flow: PeerFlow::new(now),
            stats: PeerStats::new(id),
        }
    }
}

/// One node's view of the mesh. See the module documentation.
///
/// Driving it, as the quinn-proto connection is driven:
/// - **inputs**: every datagram of the mesh socket to
///   [`handle_datagram`](Self::handle_datagram); the time to
///   [`handle_timeout`](Self::handle_timeout) once the instant of
///   [`poll_timeout`](Self::poll_timeout) has passed; and the node's own
///   commands: [`add_interest`](Self::add_interest),
///   [`remove_interest`](Self::remove_interest),
///   [`set_cluster`](Self::set_cluster), [`send_frame`](Self::send_frame),
///   [`send_assoc`](Self::send_assoc), [`set_seeds`](Self::set_seeds),
///   [`announce`](Self::announce), [`leave`](Self::leave).
/// - **outputs**, after any input, in this order:
///   1. [`poll_event`](Self::poll_event) until `None` (handling an event
///      may call the inputs again: a path MTU, association packets);
///   2. [`poll_transmit`](Self::poll_transmit) until `None`: it seals the
///      frames queued so far into datagrams and sends pending interest
///      changes, so polling when the input is drained is what batches;
///   3. [`poll_timeout`](Self::poll_timeout) for the next deadline (sending
///      may move it).
pub struct Mesh {
    config: MeshConfig,
    net: u32,
    membership: Membership,
    now: Instant,
    peers: FxHashMap<SocketAddr, Peer>,
    /// Peers' interest: (peer, best effort) per subscription.
    interest: Router<(SocketAddr, bool)>,
    local: Local,
    out: Outbox,
    events: VecDeque<MeshEvent>,
    stats: MeshStats,
    next_digest: Instant,
    /// Within a round of [`Mesh::poll_transmit`] calls (it ends at `None`).
    polling: bool,
}

impl std::fmt::Debug for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh")
            .field("me", &self.id())
            .field("peers", &self.peers.len())
            .finish()
    }
}

impl Mesh {
    /// A node `me` alone in its mesh. `seed` seeds the random choices
    /// (probe targets, the interest epoch): the same seed and inputs give
    /// the same outputs.
    pub fn new(me: NodeId, config: MeshConfig, now: Instant, seed: u64) -> Mesh {
        let mut rng = SmallRng::seed_from_u64(seed);
        let epoch = rand::RngExt::random::<u64>(&mut rng) | 1;
        let mut m = Mesh {
            net: packet::net_hash(&config.net),
            membership: Membership::new(me, &config, rng),
            now,
            peers: FxHashMap::default(),
            interest: Router::new(),
            local: Local::new(epoch),
            out: Outbox::default(),
            events: VecDeque::new(),
            stats: MeshStats::default(),
            next_digest: now + config.digest_every,
            polling: false,
            config,
        };
        m.drain_membership();
        m
    }

    /// This node's identity (its generation grows if it had to rejoin).
    pub fn id(&self) -> NodeId {
        self.membership.id()
    }

    /// The configuration.
    pub fn config(&self) -> &MeshConfig {
        &self.config
    }

    /// Counters.
    pub fn stats(&self) -> MeshStats {
        let mut s = self.stats.clone();
        s.members_up = self.peers.values().filter(|p| p.up).count();
        s
    }

    /// Every peer known, up or down, sorted by address.
    pub fn peer_stats(&self) -> Vec<PeerStats> {
        let suspects = self.suspects();
        let mut v: Vec<PeerStats> = self
            .peers
            .values()
            .map(|p| {
                let l = p.flow.rx.stats();
                PeerStats {
                    addr: p.id.addr,
                    gen: p.id.gen,
                    up: p.up,
                    patterns: p.interest.subs.len(),
                    clusters: p.interest.clusters.len(),
                    version: p.interest.version,
                    lost: l.lost,
                    duplicates: l.duplicates + l.stale,
                    far_ahead: l.far_ahead,
                    suspect: p.up && suspects.contains(&p.id.addr),
                    ..p.stats.clone()
                }
            })
            .collect();
        v.sort_by_key(|p| p.addr);
        v
    }

    // ---- input ----

    /// Handles one datagram received on the mesh socket from `from`.
    /// Frames of a data datagram are handed on as slices of `datagram`, no
    /// copy.
    pub fn handle_datagram(&mut self, now: Instant, from: SocketAddr, datagram: Bytes) {
        self.now = now;
        let (kind, net, body) = match packet::open(&datagram) {
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
                if !self.is_up(from) {
                    self.stats.unknown_sender += 1;
                    return;
                }
                let r = match kind {
                    Kind::Data => self.handle_data(from, body, &datagram),
                    Kind::Ack => self.handle_ack(from, body),
                    Kind::Assoc => self.handle_assoc(from, body),
                    Kind::Digest => self.handle_interest(kind, from, body),
                    _ if !self.take_token(from) => {
                        self.stats.rate_limited += 1;
                        return;
                    }
                    _ => self.handle_interest(kind, from, body),
                };
                if r.is_err() {
                    self.stats.malformed += 1;
                }
            }
        }
        self.drain_membership();
    }

    /// Runs what is due at `now`: SWIM timers, windows whose ack is late,
    /// and the anti-entropy digest.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        self.membership_timeout(now);
        self.flow_timeout(now);
        if now >= self.next_digest {
            self.next_digest = now + self.config.digest_every;
            // Pending deltas first, so that the digest names the version
            // they make.
            self.flush();
            self.send_digest();
            self.announce_seeds(now);
        }
    }

    // ---- output ----

    /// When [`Mesh::handle_timeout`] next has something to do (always
    /// some instant: the digest is periodic).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = self.next_digest;
        if let Some(m) = self.membership.next_timer() {
            t = t.min(m);
        }
        if let Some(f) = self.flow_deadline() {
            t = t.min(f);
        }
        Some(t)
    }

    /// Writes the next datagram to send into `buf` (replacing what it
    /// held: the buffer itself is swapped, no copy) and says where it
    /// goes. A round of calls (from the first one after a `None` to the
    /// next `None`) first seals the frames queued for each peer into
    /// datagrams, acknowledges what arrived and turns pending interest
    /// changes into deltas: call it until `None` once the input at hand is
    /// handled. Datagrams to one peer come out back to back, so a driver
    /// can send them as one segmented run (GSO).
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
        self.now = self.now.max(now);
        if !self.polling {
            // A round of polls starts: seal everything first, so that each
            // peer's datagrams are queued whole, back to back.
            self.polling = true;
            self.flush();
        }
        if let Some(t) = self.out.pop(&mut self.peers, buf) {
            return Some(t);
        }
        // What came in during the round goes too before it ends.
        self.flush();
        let t = self.out.pop(&mut self.peers, buf);
        self.polling = t.is_some();
        t
    }

    /// The next event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<MeshEvent> {
        self.events.pop_front()
    }
}
