//! Tunnels between nodes (Iris: "tunnels travel over associations"): a
//! client's tunnel to a cluster member on another node is relayed over a
//! QMP association between the two nodes, carried in the mesh's datagrams
//! (kind 9, [`skiff_proto::mesh::MeshEvent::Assoc`]).
//!
//! - **Associations**: each node has one association [`Endpoint`] for its
//!   peers (it accepts theirs, routes packets and keeps the timers) and
//!   opens one association to a peer on first use. A node sends its frames
//!   only on the association it opened and reads frames from both, so each
//!   direction is one reliable, ordered stream and no set-up races. Timers
//!   and packets are driven by the mesh task (`drive`); the broker only
//!   queues frames (and wakes the task). What arrives for local tunnel
//!   ends goes to the broker through the mesh's `Inbound`, as the rest of
//!   the mesh's traffic does.
//! - **Frames** are association messages, one frame each; tunnel ids are
//!   the receiving node's unless said otherwise:
//!
//! | byte | frame | body |
//! |------|-------|------|
//! | 1 | open | sender's tunnel u64, window u32, cluster, key |
//! | 2 | opened | opener's tunnel u64, sender's tunnel u64 |
//! | 3 | refused | opener's tunnel u64 (no member with capacity) |
//! | 4 | data | tunnel u64, message (wire encoding) |
//! | 5 | credit | tunnel u64, n u32 |
//! | 6 | close | tunnel u64 |
//!
//!   Cluster and key are varint-length-prefixed (at most 1,024 bytes);
//!   integers little-endian. The codec and its byte diagrams are
//!   [`skiff_proto::mesh::tunnel_frame`].
//! - **Failure**: a peer going down, or an association to or from it
//!   failing, ends every tunnel with that peer: the local end gets an error
//!   and `TunClose` (a pending open gets `NoResponders`), and on a failed
//!   association the peer is told with `close` frames on a fresh one.
//! - **Hostile input**: frames that do not decode, name a tunnel the peer
//!   does not hold, or arrive on a superseded association are dropped and
//!   counted; tunnels with remote ends are bounded (`MAX_TUNNELS`) and
//!   data waiting for an association's send buffer is bounded per peer
//!   (`max_pending_bytes`, beyond which data is dropped and counted, as for
//!   a local tunnel end).
//!
//! Lock order: the broker's routing lock, then the tunnel lock, then the
//! mesh core's lock; the task takes the tunnel lock with no other held and
//! calls the broker with none held.

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rustc_hash::FxHashMap;
use skiff::endpoint::{Outlet, Pump};
use skiff_proto::association::{
    bundle, frame::MIN_MTU, AssociationConfig, Endpoint, EndpointConfig, EndpointEvent, Event,
    Handle, SendError, Transmit,
};
use skiff_proto::mesh::packet::ENVELOPE;
use skiff_proto::mesh::tunnel_frame::TunnelFrame as TunFrame;
use skiff_proto::mesh::Mesh;
use skiff_proto::stats::TunnelStats;

use crate::mesh::sendq::{Pushed, SendPolicy, SendQueue};
use crate::mesh::{Inbound, MeshLink};
use crate::ASYNC_ERROR;
use skiff_proto::client_frame::{Code, ServerFrame};
use skiff_proto::mesh::Frames;
use skiff_proto::stats::LinkStats;

/// The association service id of tunnels between nodes ("TUN1").
const SERVICE: u32 = 0x5455_4e31;
/// The largest association packet between nodes, whatever the path allows
/// (loopback allows 64 KiB): a window then holds enough packets for loss to
/// be repaired by acknowledgements rather than timers, and a burst fits a
/// receive buffer of the kernel's default size (208 KiB) several packets
/// at a time. (With 64 KiB packets, 1.4 % loss in a namespace whose buffers
/// are the default stalled a link for seconds.)
const MAX_ASSOC_MTU: usize = 8192;
/// Bytes a link's window spans (the association's `window_bytes`): 1,024
/// packets of `MAX_ASSOC_MTU`, about four times the send buffer. A lost
/// packet is repaired about a round trip after the packets behind it are
/// acknowledged, and on a busy link the round trip is mostly the send
/// buffer's worth of packets queued ahead of the retransmission; the
/// sender goes on past the hole only as far as the window spans from it.
/// At the default span (1.5 times the send buffer) a lossy link waited on
/// a shut window for much of its time (`window_stalled_us` in `skiff
/// stats --mesh`; `bench/RESULTS.md` has the runs). The receiver holds
/// what arrives above a hole, so this is also the most a link from one
/// peer pins there; what is in flight stays bounded by the send buffer.
const LINK_WINDOW_BYTES: usize = 8 << 20;
/// Send queues of peers that are gone, kept for their counters, at most.
const MAX_GONE_LINKS: usize = 1024;
/// Most tunnels with a remote end on one node.
pub(crate) const MAX_TUNNELS: usize = 65_536;
/// This node's end of a tunnel whose other end is on `peer`.
#[derive(Debug)]
struct End {
    client: u64,
    peer: SocketAddr,
    /// The peer's id for the tunnel; `None` while the open is pending.
    theirs: Option<u64>,
    /// The client's `TunOpen` correlation id (opener's side).
    corr: u64,
    window: u32,
}

/// The association this node opened to one peer, and what waits for it.
#[derive(Debug)]
struct Out {
    assoc: Handle,
    backlog: VecDeque<Bytes>,
    backlog_bytes: usize,
}

/// A tunnel end lost with its peer: tell the client.
#[derive(Debug)]
pub(crate) struct Lost {
    client: u64,
    tunnel: u64,
    /// The open was still pending (its correlation id).
    pending: Option<u64>,
}

/// The tunnels' side of the mesh: associations and remote tunnel ends.
/// No I/O: the mesh task feeds it packets and time and sends what it
/// transmits through the mesh core.
#[derive(Debug)]
pub(crate) struct Tunnels {
    assocs: Endpoint,
    /// Drives `assocs` (skiff's one association driver): packets in,
    /// timers, events, packets out into the mesh's envelope.
    io: Pump,
    out: FxHashMap<SocketAddr, Out>,
    /// Accepted associations: peer, and whether still the current one.
    accepted: FxHashMap<Handle, (SocketAddr, bool)>,
    ends: FxHashMap<u64, End>,
    /// The reliable link to each peer: node frames waiting for its
    /// association (kept after the association fails, so they go on a
    /// fresh one; forgotten, counted, when the peer goes down).
    links: FxHashMap<SocketAddr, SendQueue>,
    link_bytes: usize,
    link_policy: SendPolicy,
    /// Association packet size per peer (its path), and when unknown.
    mtus: FxHashMap<SocketAddr, usize>,
    default_mtu: usize,
    max_backlog: usize,
    max_payload: usize,
    stats: TunnelStats,
    /// Links whose association failed since the last round, with the
    /// frames that may not have arrived.
    link_lost: Vec<(SocketAddr, u64)>,
    /// Associations with input not read while delivery was paused.
    unread: Vec<Handle>,
}

/// What one step of the associations produced, to act on with no lock
/// held.
#[derive(Debug, Default)]
struct Step {
    frames: Vec<(SocketAddr, Bytes)>,
    failed: Vec<SocketAddr>,
}

/// What the reliable links produced in one round of the mesh task.
#[derive(Debug, Default)]
pub(crate) struct Delivered {
    /// Batches of node frames from peers, in order per peer.
    pub(crate) nodes: Vec<(SocketAddr, Frames)>,
    /// Peers whose association failed or who went down, with how many
    /// frames to them may not have arrived.
    pub(crate) lost: Vec<(SocketAddr, u64)>,
    /// Peers whose association (either way) failed.
    pub(crate) failed: Vec<SocketAddr>,
}

/// How the reliable links to peers queue (from the mesh settings).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LinkConfig {
    pub(crate) max_datagram: usize,
    pub(crate) max_payload: usize,
    pub(crate) max_backlog: usize,
    pub(crate) link_bytes: usize,
    pub(crate) link_policy: SendPolicy,
    /// Seeds the association keys (0: from the process and the clock; a
    /// simulation passes its own, so that its run is reproducible).
    pub(crate) seed: u64,
}

impl Tunnels {
    pub(crate) fn new(c: LinkConfig) -> Tunnels {
        let LinkConfig {
            max_datagram,
            max_payload,
            max_backlog,
            ..
        } = c;
        let seed = if c.seed != 0 {
            c.seed
        } else {
            std::collections::hash_map::RandomState::new()
                .hash_one((std::process::id(), std::time::SystemTime::now()))
        };
        let config = AssociationConfig {
            // As large as a mesh datagram may be: what a set-up proposes is
            // the initiator's path (`set_path_mtu`), and the smaller side
            // wins.
            mtu: MAX_ASSOC_MTU,
            max_message: (max_payload as u64) + (64 << 10),
            idle_timeout: Duration::from_secs(15),
            window_bytes: LINK_WINDOW_BYTES,
            // Each node sends on its own association to a peer and
            // receives on the peer's, so a reply never travels on the
            // association its request came by: an acknowledgement held
            // for a reply would wait out its whole hold, and meanwhile the
            // sender's next request, with one still unacknowledged, would
            // go without its second copy (a single loss then waits for the
            // probe timer).
            delayed_ack: false,
            // A batch of requests (16 clients' at once) is one packet of a
            // kilobyte or more, alone in flight: copied like a lone
            // request, so that losing it costs nothing either.
            copy_max: MAX_ASSOC_MTU,
            ..AssociationConfig::default()
        };
        Tunnels {
            assocs: Endpoint::new(EndpointConfig {
                service: SERVICE,
                listen: true,
                max_associations: 4096,
                max_half_open: 256,
                seed: seed.rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15,
                association: config,
            }),
            io: Pump::new(usize::MAX),
            out: FxHashMap::default(),
            accepted: FxHashMap::default(),
            ends: FxHashMap::default(),
            links: FxHashMap::default(),
            // A frame as large as a message always fits an empty queue.
            link_bytes: c.link_bytes.max(max_payload + (64 << 10)),
            link_policy: c.link_policy,
            mtus: FxHashMap::default(),
            default_mtu: max_datagram.saturating_sub(ENVELOPE).max(MIN_MTU),
            max_backlog,
            max_payload,
            stats: TunnelStats::default(),
            link_lost: Vec::new(),
            unread: Vec::new(),
        }
    }

    pub(crate) fn stats(&self) -> TunnelStats {
        let e = self.assocs.stats();
        let mut dropped = e.malformed
            + e.unknown_key
            + e.wrong_source
            + e.first_rejected_full
            + e.first_rejected_half_open
            + e.first_wrong_service
            + e.first_not_listening;
        let (mut retransmits, mut fast_retransmits, mut tail_probes) = (0, 0, 0);
        let (mut rto_expired, mut duplicates) = (0, 0);
        let (mut window_stalls, mut window_stalled_us) = (0, 0);
        let (mut gaps, mut gap_us) = (0, 0);
        let live = self
            .out
            .values()
            .map(|o| o.assoc)
            .chain(self.accepted.keys().copied());
        for h in live {
            if let Some(a) = self.assocs.get(h) {
                let s = a.stats();
                dropped += s.duplicates
                    + s.out_of_window
                    + s.ack_of_unsent
                    + s.malformed
                    + s.wrong_key
                    + s.wrong_source
                    + s.stray
                    + s.protocol_violations;
                retransmits += s.retransmits;
                fast_retransmits += s.fast_retransmits;
                tail_probes += s.tail_probes;
                rto_expired += s.rto_expired;
                duplicates += s.duplicates;
                window_stalls += s.window_stalls;
                window_stalled_us += s.window_stalled_us;
                gaps += s.gaps;
                gap_us += s.gap_us;
            }
        }
        TunnelStats {
            open: self.ends.len(),
            associations: self.out.len(),
            packets_dropped: dropped,
            retransmits,
            fast_retransmits,
            tail_probes,
            rto_expired,
            duplicates,
            window_stalls,
            window_stalled_us,
            gaps,
            gap_us,
            ..self.stats.clone()
        }
    }

    /// The datagram size of the path to `peer` (its MTU, as the mesh
    /// measured it when the peer came up), for associations opened to it.
    pub(crate) fn set_path_mtu(&mut self, peer: SocketAddr, mtu: usize) {
        let ip_udp = if peer.is_ipv4() { 28 } else { 48 };
        let m = mtu
            .saturating_sub(ip_udp + ENVELOPE)
            .clamp(MIN_MTU, MAX_ASSOC_MTU);
        self.mtus.insert(peer, m);
    }

    /// This node's association to `peer`, opened now if there is none.
    fn out(&mut self, now: Instant, peer: SocketAddr) -> &mut Out {
        let mtu = Some(self.mtus.get(&peer).copied().unwrap_or(self.default_mtu));
        self.out.entry(peer).or_insert_with(|| Out {
            assoc: self.assocs.connect_mtu(now, peer, SERVICE, mtu),
            backlog: VecDeque::new(),
            backlog_bytes: 0,
        })
    }

    /// Queues the node frame `head` then `body`, `body` spliced (kept by
    /// reference, see [`SendQueue::push_spliced`]), on the reliable link
    /// to `peer`.
    pub(crate) fn push_node_spliced(
        &mut self,
        peer: SocketAddr,
        head: &[u8],
        body: &bytes::Bytes,
        subject: Option<&str>,
    ) -> Pushed {
        let (bytes, policy) = (self.link_bytes, self.link_policy);
        self.links
            .entry(peer)
            .or_insert_with(|| SendQueue::new(bytes, policy))
            .push_spliced(head, body, subject)
    }

    /// Queues the node frame made of `parts` (a publish's `subject`, for
    /// the drop counters) on the reliable link to `peer`.
    pub(crate) fn push_node(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        parts: &[&[u8]],
        subject: Option<&str>,
    ) -> Pushed {
        // The association is opened (if need be) when the queue drains.
        let _ = now;
        let (bytes, policy) = (self.link_bytes, self.link_policy);
        self.links
            .entry(peer)
            .or_insert_with(|| SendQueue::new(bytes, policy))
            .push(parts, subject)
    }

    /// Whether a publisher should wait for room on some link (`block`).
    pub(crate) fn should_wait(&self) -> bool {
        self.links.values().any(|q| q.should_wait())
    }

    /// A publisher waited: counted on every full link; with `expired`,
    /// its deadline passed and those links stall (drop newest until they
    /// drain to half).
    pub(crate) fn waited(&mut self, expired: bool) {
        for q in self.links.values_mut().filter(|q| q.should_wait()) {
            if expired {
                q.stall();
            } else {
                q.waited();
            }
        }
    }

    /// Counters of every link.
    pub(crate) fn link_stats(&self) -> Vec<LinkStats> {
        let mut v: Vec<LinkStats> = self
            .links
            .iter()
            .map(|(p, q)| q.stats(p.to_string()))
            .collect();
        v.sort_by(|a, b| a.peer.cmp(&b.peer));
        v
    }

    /// Queues `frame` for `peer` on this node's association to it (opened
    /// now if there is none). Data beyond the backlog bound is dropped.
    fn send(&mut self, now: Instant, peer: SocketAddr, frame: &TunFrame) {
        let bytes = frame.encode();
        self.out(now, peer);
        let o = self.out.get_mut(&peer).expect("inserted");
        let data = matches!(frame, TunFrame::Data { .. });
        if o.backlog.is_empty() {
            let sent = match self.assocs.association(o.assoc) {
                Some(a) => a.send(bytes.clone()),
                None => Err(SendError::Closed),
            };
            match sent {
                Ok(()) => {
                    self.stats.frames_sent += 1;
                    return;
                }
                Err(SendError::WouldBlock) => {}
                Err(_) => {
                    // Closed or too large: the association's failure (or
                    // the frame's size) ends the tunnel elsewhere.
                    self.stats.backlog_drops += 1;
                    return;
                }
            }
        }
        // Data past the bound is dropped (counted); control frames (open,
        // credit, close) get twice the room, so they pass data that waits,
        // but a client that floods credit still cannot grow the backlog
        // without bound (an honest one sends credit only for data it took).
        let room = if data {
            self.max_backlog
        } else {
            self.max_backlog.saturating_mul(2)
        };
        if o.backlog_bytes + bytes.len() > room {
            self.stats.backlog_drops += 1;
            return;
        }
        o.backlog_bytes += bytes.len();
        o.backlog.push_back(bytes);
    }

    /// Records a tunnel this node's `client` opens to a member on `peer`
    /// and sends the open; `false` over [`MAX_TUNNELS`].
    #[allow(clippy::too_many_arguments)]
    fn open(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        tunnel: u64,
        client: u64,
        corr: u64,
        cluster: &str,
        key: &[u8],
        window: u32,
    ) -> bool {
        if self.ends.len() >= MAX_TUNNELS {
            self.stats.limit_refused += 1;
            return false;
        }
        self.ends.insert(
            tunnel,
            End {
                client,
                peer,
                theirs: None,
                corr,
                window,
            },
        );
        let f = TunFrame::Open {
            tunnel,
            window,
            cluster: cluster.into(),
            key: Bytes::copy_from_slice(key),
        };
        self.send(now, peer, &f);
        true
    }

    /// The end of a tunnel `peer` opened to local `client`; `false` over
    /// [`MAX_TUNNELS`].
    fn accept(&mut self, now: Instant, peer: SocketAddr, theirs: u64, t: u64, client: u64) -> bool {
        if self.ends.len() >= MAX_TUNNELS {
            self.stats.limit_refused += 1;
            return false;
        }
        self.ends.insert(
            t,
            End {
                client,
                peer,
                theirs: Some(theirs),
                corr: 0,
                window: 0,
            },
        );
        let f = TunFrame::Opened {
            tunnel: theirs,
            peer_tunnel: t,
        };
        self.send(now, peer, &f);
        true
    }

    /// Ends every tunnel with `peer`; with `notify`, tells the peer on a
    /// fresh association.
    fn fail_peer(&mut self, now: Instant, peer: SocketAddr, notify: bool) -> Vec<Lost> {
        let gone: Vec<u64> = self
            .ends
            .iter()
            .filter(|(_, e)| e.peer == peer)
            .map(|(t, _)| *t)
            .collect();
        let mut lost = Vec::with_capacity(gone.len());
        for t in gone {
            let e = self.ends.remove(&t).expect("listed");
            self.stats.tunnels_lost += 1;
            if let (true, Some(theirs)) = (notify, e.theirs) {
                self.send(now, peer, &TunFrame::Close { tunnel: theirs });
            }
            lost.push(Lost {
                client: e.client,
                tunnel: t,
                pending: e.theirs.is_none().then_some(e.corr),
            });
        }
        lost
    }

    /// The mesh says `peer` is down: its associations and tunnels go, and
    /// its link's frames are counted lost (returned: how many).
    fn peer_down(&mut self, now: Instant, peer: SocketAddr) -> (Vec<Lost>, u64) {
        if let Some(o) = self.out.remove(&peer) {
            if let Some(q) = self.links.get_mut(&peer) {
                if let Some(a) = self.assocs.get(o.assoc) {
                    q.acked(a.buffered());
                }
            }
            self.assocs.remove(o.assoc);
        }
        let lost = self.links.get_mut(&peer).map_or(0, |q| q.lose_all());
        if self.links.len() > MAX_GONE_LINKS {
            let out = &self.out;
            self.links.retain(|p, _| out.contains_key(p));
        }
        for (p, live) in self.accepted.values_mut() {
            if *p == peer {
                *live = false;
            }
        }
        (self.fail_peer(now, peer, false), lost)
    }

    /// This node was declared down and rejoined with a new generation:
    /// its peers gave up their associations with it, and drop what arrives
    /// on the old ones. So every association this node opened is aborted
    /// (the peer is sent a reset), its tunnels end, and each link goes on
    /// with its queued frames over a fresh association; the frames in
    /// flight on the old one may be lost (counted in `link_lost`).
    fn restart_links(&mut self, now: Instant) -> Vec<Lost> {
        let peers: Vec<SocketAddr> = self.out.keys().copied().collect();
        let mut lost = Vec::new();
        for peer in peers {
            let o = self.out.remove(&peer).expect("listed");
            if let Some(a) = self.assocs.association(o.assoc) {
                if let Some(q) = self.links.get_mut(&peer) {
                    q.acked(a.buffered());
                }
                a.abort();
                // Its events are read now, so that the endpoint forgets it
                // once the reset is out.
                while a.poll_event().is_some() {}
            }
            if let Some(q) = self.links.get_mut(&peer) {
                let n = q.lose_in_flight();
                if n > 0 {
                    self.link_lost.push((peer, n));
                }
            }
            self.stats.backlog_drops += o.backlog.len() as u64;
            lost.extend(self.fail_peer(now, peer, false));
        }
        for (_, live) in self.accepted.values_mut() {
            *live = false;
        }
        lost
    }

    /// An association packet from an up member.
    pub(crate) fn handle_packet(&mut self, now: Instant, from: SocketAddr, packet: Bytes) {
        // The endpoint routes it (set-ups, either side's associations) and
        // drops and counts what is not its own.
        self.io.input(&mut self.assocs, now, from, packet);
    }

    fn poll_timeout(&mut self) -> Option<Instant> {
        self.assocs.poll_timeout()
    }

    /// Timers, new associations, events and backlogs. With `paused` (the
    /// node's delivery queue is full) no association's messages are read:
    /// the ones with input are remembered and read on the first step
    /// without it, and meanwhile their receive windows close, so their
    /// senders are held by flow control.
    fn step(&mut self, now: Instant, paused: bool) -> Step {
        let mut s = Step::default();
        self.io.timers(&mut self.assocs, now);
        let mut dead = Vec::new();
        let Tunnels {
            assocs,
            io,
            accepted,
            ..
        } = self;
        // Only associations the endpoint reports active have new events.
        let mut active: Vec<Handle> = Vec::new();
        io.events(assocs, |assocs, ev| {
            let h = match ev {
                EndpointEvent::Activity(h) => h,
                EndpointEvent::Accepted(h) => {
                    let Some(peer) = assocs.get(h).map(|a| a.peer()) else {
                        return;
                    };
                    // The peer replaced its association (it failed there,
                    // and the peer said so with close frames on the new
                    // one).
                    for (p, live) in accepted.values_mut() {
                        if *p == peer {
                            *live = false;
                        }
                    }
                    accepted.insert(h, (peer, true));
                    h
                }
            };
            active.push(h);
        });
        if paused {
            for h in active {
                if !self.unread.contains(&h) {
                    self.unread.push(h);
                }
            }
        } else {
            let mut hs = std::mem::take(&mut self.unread);
            hs.extend(active);
            for h in hs {
                self.read(h, &mut s, &mut dead);
            }
        }
        self.drain_backlogs(now);
        for peer in dead {
            // The endpoint forgets the association once it drained. The
            // link's queued frames go on the next association; those handed
            // to this one and not acknowledged may be lost.
            if let (Some(o), Some(q)) = (self.out.remove(&peer), self.links.get_mut(&peer)) {
                if let Some(a) = self.assocs.get(o.assoc) {
                    q.acked(a.buffered());
                }
                let n = q.lose_in_flight();
                if n > 0 {
                    self.link_lost.push((peer, n));
                }
            }
            s.failed.push(peer);
        }
        self.stats.assoc_failures += s.failed.len() as u64;
        self.stats.frames_received += s.frames.len() as u64;
        s
    }

    /// Reads the events of association `h`: messages into `s`, the end of
    /// a live one into `s.failed` (accepted) or `dead` (this node's).
    fn read(&mut self, h: Handle, s: &mut Step, dead: &mut Vec<SocketAddr>) {
        let Tunnels {
            assocs,
            out,
            accepted,
            stats,
            ..
        } = self;
        let Some(a) = assocs.association(h) else {
            accepted.remove(&h);
            return;
        };
        let peer = a.peer();
        if let Some(&(_, live)) = accepted.get(&h) {
            let (mut gone, mut stray) = (false, false);
            while let Some(e) = a.poll_event() {
                match e {
                    Event::Message(m) if live => s.frames.push((peer, m)),
                    // Mesh links do not offer bundles (the association
                    // fails on one); split all the same.
                    Event::Bundle(b) if live => {
                        s.frames.extend(bundle::records(b).map(|m| (peer, m)));
                    }
                    // The mesh's associations deliver whole messages
                    // (`deliver_pieces` off); pieces are joined all the same.
                    Event::Pieces(p) if live => s.frames.push((peer, p.join())),
                    Event::Message(_) | Event::Bundle(_) | Event::Pieces(_) => {
                        stats.stray_frames += 1;
                        stray = true;
                    }
                    Event::Closed(_) | Event::Failed(_) => {
                        gone = true;
                        if live {
                            if let Event::Failed(why) = e {
                                crate::logging::counted();
                                tracing::warn!(peer = %peer, reason = %why, "the association from this peer failed");
                            }
                            s.failed.push(peer);
                        }
                    }
                    Event::Connected | Event::Writable => {}
                }
            }
            if stray && !gone {
                // The peer still sends on an association this node gave up
                // (it declared the peer down meanwhile): a reset tells it
                // to go on over a fresh one, instead of its frames being
                // acknowledged here and dropped forever.
                a.abort();
                while a.poll_event().is_some() {}
                gone = true;
            }
            if gone {
                accepted.remove(&h);
            }
        } else if out.get(&peer).is_some_and(|o| o.assoc == h) {
            while let Some(e) = a.poll_event() {
                match e {
                    Event::Message(m) => s.frames.push((peer, m)),
                    Event::Bundle(b) => s.frames.extend(bundle::records(b).map(|m| (peer, m))),
                    Event::Pieces(p) => s.frames.push((peer, p.join())),
                    Event::Closed(_) => dead.push(peer),
                    Event::Failed(why) => {
                        crate::logging::counted();
                        tracing::warn!(peer = %peer, reason = %why, "this node's association to the peer failed; its link goes on over a fresh one");
                        dead.push(peer);
                    }
                    Event::Connected | Event::Writable => {}
                }
            }
        } else {
            // An association this node gave up (its peer went down): its
            // events are read so that the endpoint forgets it.
            while a.poll_event().is_some() {}
        }
    }

    /// Moves waiting frames into associations with room (opening one to a
    /// peer whose link has frames and no association).
    fn drain_backlogs(&mut self, now: Instant) {
        let orphans: Vec<SocketAddr> = self
            .links
            .iter()
            .filter(|(p, q)| q.has_frames() && !self.out.contains_key(*p))
            .map(|(p, _)| *p)
            .collect();
        for p in orphans {
            self.out(now, p);
        }
        for (peer, o) in self.out.iter_mut() {
            let Some(a) = self.assocs.association(o.assoc) else {
                continue;
            };
            if let Some(q) = self.links.get_mut(peer) {
                while let Some(p) = q.pop() {
                    let (len, n) = (p.len, p.frames);
                    // A spliced batch goes in parts: packets copy its
                    // bodies from where they were read.
                    let r = if p.parts.len() == 1 {
                        a.send(p.parts[0].clone())
                    } else {
                        a.send_parts(p.parts.clone())
                    };
                    match r {
                        Ok(()) => q.sent(len, n),
                        Err(SendError::TooLarge { .. }) => q.refused(n),
                        Err(_) => {
                            q.unpop(p);
                            break;
                        }
                    }
                }
                q.acked(a.buffered());
            }
            while let Some(b) = o.backlog.front() {
                match a.send(b.clone()) {
                    Ok(()) => {
                        o.backlog_bytes -= b.len();
                        o.backlog.pop_front();
                        self.stats.frames_sent += 1;
                    }
                    Err(_) => break,
                }
            }
        }
    }

    /// Hands every packet the associations have to the mesh core.
    fn transmit(&mut self, now: Instant, core: &mut Mesh) {
        let mut out = Envelope {
            core,
            refused: &mut self.stats.send_refused,
        };
        self.io.transmit(&mut self.assocs, now, &mut out);
    }
}

/// The mesh's [`Outlet`]: each association packet goes into a mesh
/// datagram (kind 9) to an up member, keeping its `alone` mark. The
/// association writes the packet straight after the datagram's envelope:
/// no copy. (This is the seam where packets between nodes would be
/// sealed, were the mesh encrypted.)
struct Envelope<'a> {
    core: &'a mut Mesh,
    /// Packets the mesh refused (no such member).
    refused: &'a mut u64,
}

impl Outlet for Envelope<'_> {
    fn take(
        &mut self,
        now: Instant,
        poll: impl FnOnce(&mut Vec<u8>) -> Option<Transmit>,
    ) -> Option<usize> {
        let mut d = self.core.assoc_buffer();
        let Some(t) = poll(&mut d) else {
            self.core.recycle_assoc_buffer(d);
            return None;
        };
        if self
            .core
            .send_assoc_datagram(now, t.destination, d, t.alone)
            .is_err()
        {
            *self.refused += 1;
        }
        Some(t.size)
    }
}

mod callers;
pub(crate) use callers::{deadline, drive, peer_down, restart_links};

#[cfg(test)]
#[path = "mesh_sim.rs"]
mod sim;

#[cfg(test)]
mod tests {
    use super::*;

    fn test_config() -> LinkConfig {
        LinkConfig {
            max_datagram: 1400,
            max_payload: 1 << 20,
            max_backlog: 1 << 20,
            link_bytes: 8 << 20,
            link_policy: SendPolicy::Block,
            seed: 0,
        }
    }

    #[test]
    fn packets_for_unknown_associations_are_dropped_and_counted() {
        let mut t = Tunnels::new(test_config());
        let now = Instant::now();
        let from: SocketAddr = "127.0.0.1:9".parse().unwrap();
        t.handle_packet(now, from, Bytes::from_static(b"garbage"));
        let mut forged = vec![b'S', b'K', 1, 2, 0];
        forged.extend_from_slice(&(5u64 | 1 << 63).to_le_bytes());
        t.handle_packet(now, from, Bytes::from(forged));
        let s = t.assocs.stats();
        assert_eq!((s.malformed, s.unknown_key), (1, 1), "{s:?}");
        assert!(t.assocs.is_empty());
    }

    #[test]
    fn a_pending_open_is_lost_with_its_peer() {
        let mut t = Tunnels::new(test_config());
        let now = Instant::now();
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert!(t.open(now, peer, 1, 10, 77, "c", b"", 8));
        assert!(t.accept(now, peer, 5, 2, 11));
        let (mut lost, _) = t.peer_down(now, peer);
        lost.sort_by_key(|l| l.tunnel);
        assert_eq!(lost.len(), 2);
        assert_eq!((lost[0].client, lost[0].pending), (10, Some(77)));
        assert_eq!((lost[1].client, lost[1].pending), (11, None));
        assert_eq!(t.stats().open, 0);
        assert_eq!(t.stats().associations, 0);
    }
}
