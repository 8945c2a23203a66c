//! The node's side of the mesh (Iris): a UDP socket (skiff's batched
//! driver), the sans-I/O [`skiff_proto::mesh::Mesh`] behind a lock, and
//! one task that drives it.
//!
//! - **Discovery**: multicast scouting (a hello on [`SCOUT_GROUP`] each
//!   second for ten seconds, then every five), a seed list, and a DNS name
//!   resolved every five seconds (a Kubernetes headless service).
//! - **Frames between nodes** ride the mesh's batched datagrams, one
//!   datagram per destination node carrying many frames. The first byte
//!   says what a frame is:
//!
//! | byte | frame | body |
//! |------|-------|------|
//! | 1 | publish | message (wire encoding) |
//! | 2 | request | origin token u64, flags u8, max u32, target, key, message |
//! | 3 | reply | origin token u64, message |
//! | 4 | done | origin token u64, responders reached u32 |
//! | 5 | broadcast | cluster, message |
//! | 6 | queue group | group, message (for one member of the group here) |
//!
//! Names and keys are varint-length-prefixed; integers little-endian. The
//! codec and its byte diagrams are [`skiff_proto::mesh::node_frame`].
//! Frames that do not decode are dropped and counted (`bad_frames`).
//!
//! Tunnels to members on other nodes travel over associations between the
//! nodes instead (reliable and ordered): see [`crate::mesh_tunnel`].
//!
//! Calls go one way: the broker commands the mesh through [`MeshLink`]
//! (interest, publishes, requests, replies, broadcasts), and the mesh
//! hands what other nodes send back through the trait `Inbound`
//! (`mesh/inbound.rs`), which the broker implements; this module names no
//! broker type. The driver task is in `mesh/driver.rs`.
//!
//! The broker calls in with its routing lock held (routing lock, then the
//! mesh lock: never the other way round); the task takes the mesh lock
//! alone, drains what arrived, and calls `Inbound` with no lock held.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use serde::Deserialize;
use skiff_proto::mesh::node_frame::{self, op, NodeFrame};
use skiff_proto::mesh::{Mesh, MeshConfig, NodeId};
use skiff_proto::router::Syntax;
use skiff_proto::stats::MeshView;
use skiff_proto::Message;
use tokio::sync::Notify;

mod driver;
mod inbound;
pub(crate) mod seal;
pub(crate) mod sendq;

pub use sendq::SendPolicy;

pub(crate) use driver::start;
pub(crate) use inbound::Inbound;

/// The identity (X25519 public key, base64) kept in the key file `path`,
/// making the file if there is none (as a node with `identity = path`
/// does): what the other nodes list in their `trusted_keys`.
pub fn identity_public_key(path: &std::path::Path) -> std::io::Result<String> {
    use base64::Engine;
    let private = seal::load_identity(path)?;
    Ok(base64::engine::general_purpose::STANDARD.encode(seal::public_of(&private)))
}

/// Feeds arbitrary datagrams to a sealing layer (as from one peer and
/// another), for the fuzz target `mesh_seal`: it must never panic, and
/// nothing but a datagram sealed with its session's keys may open.
#[doc(hidden)]
pub fn fuzz_seal_open(datagrams: &[&[u8]]) -> usize {
    let mut s = seal::Seal::new(seal::SealConfig::new(
        Some("fuzz"),
        Vec::new(),
        [7; 32],
        "fuzz",
    ));
    let now = Instant::now();
    let (a, b) = (
        SocketAddr::from(([127, 0, 0, 1], 1)),
        SocketAddr::from(([127, 0, 0, 1], 2)),
    );
    let mut opened = 0;
    for (i, d) in datagrams.iter().enumerate() {
        let from = if i % 2 == 0 { a } else { b };
        if s.open(now, from, d).is_some() {
            opened += 1;
        }
        while s.poll_transmit().is_some() {}
        s.handle_timeout(now);
    }
    opened
}

/// The scouting multicast group and port.
pub const SCOUT_GROUP: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(239, 255, 47, 47)), 4749);

/// How a node joins the mesh (`[mesh]` in the TOML file, `SKIFF_MESH`, …,
/// `--mesh`, `--net`, `--seeds`, …).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshSettings {
    /// UDP address of the mesh socket (port 0: any free port).
    pub bind: SocketAddr,
    /// Network name: nodes of another name are ignored.
    pub net: String,
    /// Seed nodes' mesh addresses (`host:port`).
    pub seeds: Vec<String>,
    /// A DNS name (`name:port`) whose addresses are seeds, re-resolved
    /// every five seconds.
    pub seeds_dns: Option<String>,
    /// Multicast scouting on [`SCOUT_GROUP`].
    pub scout: bool,
    /// Most members tracked.
    pub max_members: usize,
    /// Most patterns and clusters accepted from one peer.
    pub max_interest: usize,
    /// Interest updates accepted per second from one peer.
    pub interest_rate: u32,
    /// Largest datagram sent to a peer.
    pub max_datagram: usize,
    /// Bytes of node frames that may wait for one peer's association
    /// (at least `max_payload` plus 64 KiB; under `block` publishers wait
    /// at this bound and what they already handed over may double it).
    pub send_queue: usize,
    /// What a full send queue does: `block` (publishers wait up to
    /// `send_deadline_ms`), `drop_oldest` or `drop_newest`.
    pub send_policy: SendPolicy,
    /// How long a publisher waits for room under `block`; after it the
    /// queue drops arriving frames (counted) until it drains to half.
    pub send_deadline_ms: u64,
    /// SWIM's probe period: each member probes one other this often.
    pub probe_ms: u64,
    /// How long a suspected member has to refute before it is declared
    /// down. With `probe_ms`, the failure detector's patience: long
    /// enough that a lossy path (5 % drop) or a node starved of CPU for a
    /// moment is not declared down (memberlist's LAN defaults are of this
    /// order), short enough that a dead node is noticed in seconds.
    pub suspect_ms: u64,
    /// Subject patterns whose publishes travel best effort (datagrams,
    /// loss counted, never repaired) instead of over the reliable link.
    pub best_effort: Vec<String>,
    /// Whether an shm client's large publishes (>= 1 KiB) go on a reliable
    /// link by reference into the client's ring (spliced: no copy into the
    /// send batch; `spliced` in link stats) instead of being copied. On by
    /// default; off to compare (`bench/splice.sh`) or to release the
    /// client's ring space as soon as the node has routed a message.
    pub splice: bool,
    /// The mesh secret: with it (or `trusted_keys`) every datagram between
    /// nodes is authenticated and encrypted (`mesh/seal.rs`), and only
    /// nodes that know it join.
    pub secret: Option<crate::auth::Secret>,
    /// Identity keys (X25519, base64) of the nodes this one accepts; empty:
    /// any node that knows the secret.
    pub trusted_keys: Vec<String>,
    /// This node's identity key file: read if it exists, else generated
    /// and written there (mode 0600). `None`: a new key each start.
    pub identity: Option<std::path::PathBuf>,
}

impl Default for MeshSettings {
    fn default() -> Self {
        let c = MeshConfig::default();
        MeshSettings {
            bind: SocketAddr::from(([0, 0, 0, 0], 0)),
            net: c.net,
            seeds: Vec::new(),
            seeds_dns: None,
            scout: true,
            max_members: c.max_members,
            max_interest: c.max_interest,
            interest_rate: c.interest_rate,
            max_datagram: c.max_datagram,
            send_queue: 16 << 20,
            send_policy: SendPolicy::Block,
            send_deadline_ms: 2000,
            probe_ms: 1000,
            suspect_ms: 4000,
            best_effort: Vec::new(),
            splice: true,
            secret: None,
            trusted_keys: Vec::new(),
            identity: None,
        }
    }
}

/// Frame kinds between nodes.
/// Counters of the node's mesh driver.
#[derive(Debug, Default)]
struct Counters {
    bad_frames: AtomicU64,
    send_errors: AtomicU64,
    scout_errors: AtomicU64,
    dns_errors: AtomicU64,
    /// Frames to peers that may not have arrived (lost with the peer or
    /// its association; per peer in the links' `lost`).
    link_lost: AtomicU64,
    /// Gaps told to local subscribers.
    gaps: AtomicU64,
    /// Best-effort frames from peers dropped while local delivery was
    /// behind.
    delivery_dropped: AtomicU64,
    /// The second of the last log line (`note`).
    noted: AtomicU64,
}

/// What [`MeshLink::publish_many`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sent {
    /// Copies queued for other nodes.
    pub(crate) sent: usize,
    /// Copies dropped at a full send queue (counted there).
    pub(crate) dropped: usize,
}

/// The mesh as the broker sees it: route, send, advertise.
#[derive(Debug)]
pub struct MeshLink {
    pub(crate) core: Mutex<Mesh>,
    pub(crate) wake: Notify,
    /// Tunnels between nodes (lock order: before `core`).
    pub(crate) tunnels: Mutex<crate::mesh_tunnel::Tunnels>,
    /// Notified when acks (or their timeout) may have opened a window.
    room: Notify,
    counters: Counters,
    max_payload: usize,
    /// Subject patterns published best effort (`best_effort`).
    best_effort: Vec<String>,
    /// How long a publisher waits for a full `block` link.
    send_deadline: Duration,
    /// Whether an shm client's large publishes are spliced (`splice`).
    splice: bool,
    /// No route led to the first seed or the scouting group, so the node
    /// took loopback as its identity (only nodes of this host reach it).
    loopback_fallback: bool,
    /// With a sealed mesh: this node's identity and the layer's counters.
    seal: Option<([u8; 32], std::sync::Arc<seal::SealCounters>)>,
}

impl MeshLink {
    /// Whether the node found no route to its first seed or the scouting
    /// group and took 127.0.0.1 as its identity: then only nodes on this
    /// host can reach it (they find each other by scouting on loopback).
    pub fn loopback_fallback(&self) -> bool {
        self.loopback_fallback
    }

    /// Whether the node splices an shm client's large publishes on
    /// reliable links (the `splice` setting).
    pub(crate) fn splices(&self) -> bool {
        self.splice
    }

    /// This node's identity key (X25519 public key) when the mesh is
    /// sealed.
    pub fn identity(&self) -> Option<[u8; 32]> {
        self.seal.as_ref().map(|(k, _)| *k)
    }

    /// This node's identity in the mesh.
    pub fn id(&self) -> NodeId {
        self.core.lock().id()
    }

    /// What `skiff stats --mesh` shows.
    pub fn view(&self) -> MeshView {
        // Lock order: `tunnels` before `core`, never the other way (the
        // mesh task holds `tunnels` while it hands packets to `core`).
        let (tunnels, links) = {
            let t = self.tunnels.lock();
            (t.stats(), t.link_stats())
        };
        let m = self.core.lock();
        let c = &self.counters;
        MeshView {
            tunnels,
            me: format!("{}#{}", m.id().addr, m.id().gen),
            net: m.config().net.clone(),
            stats: m.stats(),
            bad_frames: c.bad_frames.load(Relaxed),
            send_errors: c.send_errors.load(Relaxed),
            scout_errors: c.scout_errors.load(Relaxed),
            dns_errors: c.dns_errors.load(Relaxed),
            peers: m.peer_stats(),
            links,
            link_lost: c.link_lost.load(Relaxed),
            gaps_reported: c.gaps.load(Relaxed),
            delivery_dropped: c.delivery_dropped.load(Relaxed),
            seal: self.seal.as_ref().map(|(id, c)| c.stats(id)),
        }
    }

    /// A warning in the log, at most one a second (drops and losses are
    /// counted in full in `skiff stats --mesh`).
    pub(crate) fn note(&self, what: std::fmt::Arguments<'_>) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if self.counters.noted.swap(now, Relaxed) != now {
            crate::logging::counted();
            tracing::warn!("mesh: {what}");
        }
    }

    /// Whether publishes on `subject` travel best effort.
    fn is_best_effort(&self, subject: &str) -> bool {
        if self.best_effort.is_empty() {
            return false;
        }
        let Ok(s) = skiff_proto::router::Subject::new(subject) else {
            return false;
        };
        self.best_effort
            .iter()
            .any(|p| skiff_proto::router::Pattern::new(p).is_ok_and(|p| p.matches(&s)))
    }

    /// Waits while a peer's best-effort window is full, or a `block`
    /// link's send queue is (flow control: the publisher slows to what the
    /// slowest interested node takes, for at most the send deadline, after
    /// which that link drops instead). Returns at once when there is room.
    pub(crate) async fn wait_room(&self) {
        let mut since: Option<Instant> = None;
        loop {
            let n = self.room.notified();
            if self.tunnels.lock().should_wait() {
                let now = Instant::now();
                match since {
                    None => {
                        since = Some(now);
                        self.tunnels.lock().waited(false);
                    }
                    Some(t0) if now.duration_since(t0) >= self.send_deadline => {
                        // The full links stall: they drop new frames
                        // (counted) until they drain to half.
                        self.tunnels.lock().waited(true);
                        self.note(format_args!(
                            "a peer's send queue stayed full for {:?}; its link drops new frames (counted in `skiff stats --mesh`) until it drains",
                            self.send_deadline
                        ));
                        continue;
                    }
                    Some(_) => {}
                }
            } else if self.core.lock().room() {
                return;
            }
            // The task also wakes on the ack timeout; the bound here only
            // guards against a notification that raced this check.
            let _ = tokio::time::timeout(Duration::from_millis(5), n).await;
        }
    }

    /// Advertises a local subscription; `lossy`: a best-effort one
    /// (`reliable=false`), whose copies peers may send as datagrams.
    pub(crate) fn add_interest(&self, syntax: Syntax, pattern: &str, kind: &str, lossy: bool) {
        self.core
            .lock()
            .add_interest_with(syntax, pattern, kind, lossy);
        self.wake.notify_one();
    }

    /// Withdraws what [`MeshLink::add_interest`] advertised.
    pub(crate) fn remove_interest(&self, syntax: Syntax, pattern: &str, kind: &str, lossy: bool) {
        self.core
            .lock()
            .remove_interest_with(syntax, pattern, kind, lossy);
        self.wake.notify_one();
    }

    pub(crate) fn set_cluster(&self, cluster: &str, capacity: u32) {
        self.core.lock().set_cluster(cluster, capacity);
        self.wake.notify_one();
    }

    /// Sends a published message (its wire encoding) once to each node
    /// with matching interest.
    pub(crate) fn publish(&self, subject: &str, kind: Option<&str>, raw: &[u8]) -> Sent {
        self.publish_many(std::iter::once((subject, kind, raw, None)))
    }

    /// [`MeshLink::publish`] for a run of messages `(subject, type,
    /// encoding)`: one lock, one clock read and one wake-up for the run,
    /// and one routing lookup per change of subject or type. Each copy
    /// goes on the reliable link to its node, or in a datagram (best
    /// effort, loss counted) unless it is too large for one, when the
    /// subject is in `best_effort`, the message itself is marked best
    /// effort (`reliable=false` on the publish: wire flag
    /// [`skiff_proto::wire::F_BEST_EFFORT`]), or every subscription of
    /// that node matching it is best effort (`reliable=false` on the
    /// subscription).
    ///
    /// An item's fourth part, when given, is the encoding as `Bytes` that
    /// may be held by reference: on a reliable link a large one is spliced
    /// (not copied into the link's batch; see `mesh::sendq`), holding its
    /// memory until the peer acknowledged it or is lost.
    pub(crate) fn publish_many<'a>(
        &self,
        msgs: impl IntoIterator<Item = (&'a str, Option<&'a str>, &'a [u8], Option<&'a Bytes>)>,
    ) -> Sent {
        let mut to: Vec<(SocketAddr, bool)> = Vec::new();
        let mut prev = None;
        let mut best_effort = false;
        let now = Instant::now();
        let mut r = Sent::default();
        let mut t = self.tunnels.lock();
        let mut m = self.core.lock();
        for (subject, kind, raw, spliced) in msgs {
            if prev != Some((subject, kind)) {
                to.clear();
                m.route_reliable(subject, kind, &mut to);
                prev = Some((subject, kind));
                best_effort = self.is_best_effort(subject);
            }
            // The encoding's first byte is the message's flags.
            let lossy = best_effort
                || raw
                    .first()
                    .is_some_and(|f| f & skiff_proto::wire::F_BEST_EFFORT != 0);
            let frame: [&[u8]; 2] = [&[op::PUB], raw];
            for &(p, reliable) in &to {
                let p = &p;
                if (lossy || !reliable) && m.send_frame_parts(now, *p, &frame).is_ok() {
                    r.sent += 1;
                    continue;
                }
                let pushed = match spliced {
                    Some(b) => t.push_node_spliced(*p, &[op::PUB], b, Some(subject)),
                    None => t.push_node(now, *p, &frame, Some(subject)),
                };
                match pushed {
                    sendq::Pushed::Queued => r.sent += 1,
                    sendq::Pushed::Dropped => r.dropped += 1,
                }
            }
        }
        drop(m);
        drop(t);
        if r.sent > 0 {
            self.wake.notify_one();
        }
        r
    }

    /// The nodes a request to subject `subject` goes to.
    pub(crate) fn route(&self, subject: &str, kind: Option<&str>) -> Vec<SocketAddr> {
        let mut to = Vec::new();
        self.core.lock().route(subject, kind, &mut to);
        to
    }

    /// Forwards a request to `peer`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn request(
        &self,
        peer: SocketAddr,
        token: u64,
        flags: u8,
        max: u32,
        target: &str,
        key: &[u8],
        msg: &Message,
    ) -> bool {
        let mut f = Vec::new();
        node_frame::encode_request(&mut f, token, flags, max, target, key, msg);
        self.send(peer, &f)
    }

    pub(crate) fn reply(&self, peer: SocketAddr, token: u64, msg: &Message) -> bool {
        let mut f = Vec::new();
        node_frame::encode_reply(&mut f, token, msg);
        self.send(peer, &f)
    }

    pub(crate) fn done(&self, peer: SocketAddr, token: u64, reached: u32) -> bool {
        let mut f = Vec::new();
        node_frame::encode_done(&mut f, token, reached);
        self.send(peer, &f)
    }

    /// Forwards a request to a subject to `peer`, for its plain
    /// subscriptions and one member of each of `groups` there (this node
    /// chose `peer` for them).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn group_request(
        &self,
        peer: SocketAddr,
        token: u64,
        flags: u8,
        max: u32,
        target: &str,
        groups: &[&str],
        msg: &Message,
    ) -> bool {
        let mut f = Vec::new();
        node_frame::encode_group_request(&mut f, token, flags, max, target, groups, msg);
        self.send(peer, &f)
    }

    /// Sends a published message (its wire encoding `raw`) to `peer` for
    /// one member of queue group `group` there (this node chose `peer` for
    /// the group); `false` when the send queue dropped it (counted there).
    pub(crate) fn publish_group(
        &self,
        peer: SocketAddr,
        group: &str,
        subject: &str,
        raw: &[u8],
    ) -> bool {
        let mut head = Vec::with_capacity(group.len() + 4);
        node_frame::group_head(&mut head, group);
        let ok = self
            .tunnels
            .lock()
            .push_node(Instant::now(), peer, &[&head, raw], Some(subject))
            == sendq::Pushed::Queued;
        self.wake.notify_one();
        ok
    }

    pub(crate) fn broadcast(&self, peer: SocketAddr, cluster: &str, msg: &Message) -> bool {
        let mut f = Vec::new();
        node_frame::encode_broadcast(&mut f, cluster, msg);
        self.send(peer, &f)
    }

    /// Queues a node frame on the reliable link to `peer`; `false` when
    /// its send queue is full (counted there).
    fn send(&self, peer: SocketAddr, frame: &[u8]) -> bool {
        let ok = self
            .tunnels
            .lock()
            .push_node(Instant::now(), peer, &[frame], None)
            == sendq::Pushed::Queued;
        self.wake.notify_one();
        ok
    }

    /// Decodes a frame from `from` and hands it to the broker.
    fn handle_frame(&self, broker: &impl Inbound, from: SocketAddr, frame: Bytes) {
        if self.try_frame(broker, from, &frame).is_err() {
            self.counters.bad_frames.fetch_add(1, Relaxed);
        }
    }

    fn try_frame(&self, broker: &impl Inbound, from: SocketAddr, frame: &Bytes) -> Result<(), ()> {
        match NodeFrame::decode(frame, self.max_payload).map_err(drop)? {
            NodeFrame::Pub { msg } => {
                // Normally batched by the task (runs go to
                // `Inbound::publish_remote`); a lone one here. Its
                // encoding follows the op byte.
                broker.deliver_remote(&msg, &frame.slice(1..));
            }
            NodeFrame::Req {
                token,
                flags,
                max,
                target,
                key,
                msg,
            } => broker.remote_request(from, token, flags, max, target, key, None, msg),
            NodeFrame::GroupReq {
                token,
                flags,
                max,
                target,
                groups,
                msg,
            } => {
                let key = Bytes::new();
                broker.remote_request(from, token, flags, max, target, key, Some(groups), msg)
            }
            NodeFrame::Reply { token, msg } => broker.remote_reply(token, msg),
            NodeFrame::Done { token, reached } => broker.remote_done(token, reached),
            NodeFrame::Bcast { cluster, msg } => broker.deliver_broadcast(&cluster, msg),
            NodeFrame::Group { group, msg } => broker.deliver_group(&group, msg),
        }
        Ok(())
    }
}
