//! The two callers of the node's tunnels between nodes: the broker, which
//! opens tunnels and queues frames with its routing lock held (`impl
//! MeshLink`), and the mesh task, which drives the associations with no
//! lock held on entry (`drive`, `deadline`, `peer_down`,
//! `restart_links`). The state they share, [`Tunnels`], is the parent
//! module's; the lock order is written there.

use super::*;

// ---- the broker's side (called with the routing lock held) ----

impl MeshLink {
    /// Opens a tunnel from local `client` to a member on `peer`; `false`
    /// when too many tunnels are open.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn tunnel_open(
        &self,
        peer: SocketAddr,
        tunnel: u64,
        client: u64,
        corr: u64,
        cluster: &str,
        key: &[u8],
        window: u32,
    ) -> bool {
        let now = Instant::now();
        let ok = self
            .tunnels
            .lock()
            .open(now, peer, tunnel, client, corr, cluster, key, window);
        self.wake.notify_one();
        ok
    }

    /// Accepts a tunnel `peer` opened (its id `theirs`) to local `client`
    /// as `tunnel`, or refuses it (`client` `None`, or over the limit).
    /// `false` when refused.
    pub(crate) fn tunnel_accept(
        &self,
        peer: SocketAddr,
        theirs: u64,
        tunnel: u64,
        client: Option<u64>,
    ) -> bool {
        let now = Instant::now();
        let mut t = self.tunnels.lock();
        let ok = client.is_some_and(|c| t.accept(now, peer, theirs, tunnel, c));
        if !ok {
            t.send(now, peer, &TunFrame::Refused { tunnel: theirs });
        }
        drop(t);
        self.wake.notify_one();
        ok
    }

    /// Relays a client's `TunData` or `TunCredit` on a remote tunnel
    /// (dropped while the open is pending or after the tunnel ended).
    pub(crate) fn tunnel_relay(&self, tunnel: u64, frame: ServerFrame) {
        let now = Instant::now();
        let mut t = self.tunnels.lock();
        let Some((peer, Some(theirs))) = t.ends.get(&tunnel).map(|e| (e.peer, e.theirs)) else {
            return;
        };
        let f = match frame {
            ServerFrame::TunData { msg, .. } => TunFrame::Data {
                tunnel: theirs,
                msg,
            },
            ServerFrame::TunCredit { n, .. } => TunFrame::Credit { tunnel: theirs, n },
            _ => return,
        };
        t.send(now, peer, &f);
        drop(t);
        self.wake.notify_one();
    }

    /// The local end closed a remote tunnel (or its client went away).
    pub(crate) fn tunnel_close(&self, tunnel: u64) {
        let now = Instant::now();
        let mut t = self.tunnels.lock();
        let Some(e) = t.ends.remove(&tunnel) else {
            return;
        };
        if let Some(theirs) = e.theirs {
            t.send(now, e.peer, &TunFrame::Close { tunnel: theirs });
        }
        // A pending open: the `opened` that comes is answered with a close.
        drop(t);
        self.wake.notify_one();
    }
}

// ---- the mesh task's side (no lock held on entry) ----

/// The earliest association timer, or `d`.
pub(crate) fn deadline(l: &MeshLink, d: Instant) -> Instant {
    l.tunnels.lock().poll_timeout().map_or(d, |t| t.min(d))
}

/// The mesh declared `peer` down: its tunnels end with an error; returns
/// how many frames on the link to it may not have arrived.
pub(crate) fn peer_down(l: &MeshLink, broker: &impl Inbound, peer: SocketAddr) -> u64 {
    let (lost, frames) = l.tunnels.lock().peer_down(Instant::now(), peer);
    tell_lost(broker, lost, &format!("node {peer} went down"));
    frames
}

/// This node rejoined the mesh with a new generation: every reliable link
/// restarts on a fresh association (see [`Tunnels::restart_links`]).
pub(crate) fn restart_links(l: &MeshLink, broker: &impl Inbound) {
    let lost = l.tunnels.lock().restart_links(Instant::now());
    tell_lost(
        broker,
        lost,
        "this node was declared down by the mesh and rejoined",
    );
}

/// Drives the associations: timers, events, tunnel frames to the broker,
/// and packets to the mesh core (sent at the task's flush). Returns the
/// batches of node frames that arrived, for the task to deliver in order,
/// and the links that lost frames.
/// With `paused`, no association's messages are read this round (see
/// [`Tunnels::step`]).
pub(crate) fn drive(l: &MeshLink, broker: &impl Inbound, paused: bool) -> Delivered {
    let now = Instant::now();
    let mut d = Delivered::default();
    let step = l.tunnels.lock().step(now, paused);
    for (from, frame) in step.frames {
        if let Some(frames) = act(l, broker, from, frame) {
            d.nodes.push((from, frames));
        }
    }
    for peer in step.failed {
        d.failed.push(peer);
        let lost = l.tunnels.lock().fail_peer(now, peer, true);
        tell_lost(
            broker,
            lost,
            &format!("the association with node {peer} failed"),
        );
    }
    let mut t = l.tunnels.lock();
    // Frames queued just now (answers, backlogs) go out in this round.
    t.drain_backlogs(now);
    t.transmit(now, &mut l.core.lock());
    d.lost = std::mem::take(&mut t.link_lost);
    d
}

fn tell_lost(broker: &impl Inbound, lost: Vec<Lost>, why: &str) {
    for e in lost {
        let frames = match e.pending {
            Some(corr) => vec![ServerFrame::Error {
                corr,
                code: Code::NoResponders,
                text: format!("tunnel not opened: {why}"),
            }],
            None => vec![
                ServerFrame::Error {
                    corr: ASYNC_ERROR,
                    code: Code::NotFound,
                    text: format!("tunnel {} closed: {why}", e.tunnel),
                },
                ServerFrame::TunClose { tunnel: e.tunnel },
            ],
        };
        broker.tunnel_deliver(e.client, e.tunnel, frames, true);
    }
}

/// Acts on one frame from `from`; a batch of node frames is handed back.
fn act(l: &MeshLink, broker: &impl Inbound, from: SocketAddr, raw: Bytes) -> Option<Frames> {
    let now = Instant::now();
    let max_payload = l.tunnels.lock().max_payload;
    let Ok(f) = TunFrame::decode(&raw, max_payload) else {
        l.tunnels.lock().stats.bad_frames += 1;
        return None;
    };
    if let TunFrame::Nodes { frames, count } = f {
        let mut t = l.tunnels.lock();
        let (bytes, policy) = (t.link_bytes, t.link_policy);
        t.links
            .entry(from)
            .or_insert_with(|| SendQueue::new(bytes, policy))
            .received(count);
        return Some(frames);
    }
    if let TunFrame::Open {
        tunnel,
        window,
        cluster,
        key,
    } = f
    {
        broker.tunnel_incoming(from, tunnel, cluster, key, window);
        return None;
    }
    let mut t = l.tunnels.lock();
    let tunnel = match &f {
        TunFrame::Opened { tunnel, .. }
        | TunFrame::Refused { tunnel }
        | TunFrame::Data { tunnel, .. }
        | TunFrame::Credit { tunnel, .. }
        | TunFrame::Close { tunnel } => *tunnel,
        TunFrame::Open { .. } | TunFrame::Nodes { .. } => unreachable!("handled above"),
    };
    let pending_ok = matches!(f, TunFrame::Opened { .. } | TunFrame::Refused { .. });
    let end = t
        .ends
        .get_mut(&tunnel)
        .filter(|e| e.peer == from && e.theirs.is_none() == pending_ok);
    let Some(end) = end else {
        t.stats.stray_frames += 1;
        if let TunFrame::Opened { peer_tunnel, .. } = f {
            // Our client closed it while the open was on its way.
            t.send(
                now,
                from,
                &TunFrame::Close {
                    tunnel: peer_tunnel,
                },
            );
        }
        return None;
    };
    let client = end.client;
    let (frames, ended) = match f {
        TunFrame::Opened { peer_tunnel, .. } => {
            end.theirs = Some(peer_tunnel);
            let opened = ServerFrame::TunOpened {
                corr: end.corr,
                tunnel,
                window: end.window,
            };
            (vec![opened], false)
        }
        TunFrame::Refused { .. } => {
            let corr = end.corr;
            t.ends.remove(&tunnel);
            let e = ServerFrame::Error {
                corr,
                code: Code::NoResponders,
                text: format!("the member's node {from} has no member with capacity any more"),
            };
            (vec![e], true)
        }
        TunFrame::Data { msg, .. } => (vec![ServerFrame::TunData { tunnel, msg }], false),
        TunFrame::Credit { n, .. } => (vec![ServerFrame::TunCredit { tunnel, n }], false),
        TunFrame::Close { .. } => {
            t.ends.remove(&tunnel);
            (vec![ServerFrame::TunClose { tunnel }], true)
        }
        TunFrame::Open { .. } | TunFrame::Nodes { .. } => unreachable!("handled above"),
    };
    drop(t);
    broker.tunnel_deliver(client, tunnel, frames, ended);
    None
}
