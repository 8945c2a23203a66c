//! The endpoint's state under its lock: the sans-I/O association endpoint
//! ([`association::Endpoint`]: every association, initiated or accepted,
//! its demultiplexing and timers), each tunnel's receive queue and wakers,
//! the best-effort batcher and inbox, and the routing of datagrams between
//! them. No I/O here: the driver (`driver.rs`) moves the bytes.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Waker;
use std::time::Instant;

use bytes::Bytes;
use rustc_hash::FxHashMap;
use skiff_proto::association::{
    self, Association, AssociationStats, CloseReason, EndpointEvent, Event, FailReason, Handle,
    SendError, State,
};
use skiff_proto::error::Reason;
use skiff_proto::{compound, wire, Batcher, LossDetector, Message, Verdict, WireError};

use super::pump::{Outlet, Pump};
use super::stage::{Inbound, SendStage, Stage};
use super::{add_stats, wake_all, EndpointStats};
use crate::tunnel::TunnelError;
use crate::udp::SendBatch;

/// How a tunnel ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// Closed gracefully; who started it.
    Closed(CloseReason),
    /// The association failed.
    Failed(FailReason),
    /// The endpoint stopped.
    Gone,
}

impl End {
    /// The error a tunnel call reports once the tunnel ended this way.
    pub(crate) fn error(&self, peer: SocketAddr, local_closed: bool) -> TunnelError {
        match self {
            End::Closed(_) if local_closed => TunnelError::Closed,
            End::Closed(CloseReason::Local) => TunnelError::Closed,
            End::Closed(CloseReason::Peer) => TunnelError::PeerClosed,
            End::Failed(reason) => TunnelError::Failed {
                peer,
                reason: *reason,
            },
            End::Gone => TunnelError::EndpointGone,
        }
    }
}

/// A tunnel's state beside its association.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) peer: SocketAddr,
    /// Carries a reliable queue's messages (see `reliable.rs`) rather than
    /// a `Tunnel`'s.
    pub(super) queue: bool,
    /// Messages delivered so far (a reliable queue numbers them).
    pub(super) delivered: u64,
    inbox: VecDeque<Inbound>,
    inbox_bytes: usize,
    pub(crate) end: Option<End>,
    pub(crate) connected: bool,
    local_closed: bool,
    pub(super) dropped: bool,
    pub(crate) readers: Vec<Waker>,
    pub(crate) writers: Vec<Waker>,
    pub(crate) final_stats: AssociationStats,
    /// `final_stats` were added to the endpoint's finished total.
    pub(super) folded: bool,
    /// The tunnel's staging areas (see `stage.rs`).
    pub(crate) stage: Arc<Stage>,
    /// Bytes of `inbox_bytes` moved to the receive stage by the last
    /// [`Core::take_inbox`], still counted against `tunnel_buffer` until
    /// the next one (the stage is read empty by then).
    lent: usize,
    /// Closed (or dropped) while staged messages waited for room: the
    /// association closes once the stage is empty.
    close_pending: bool,
}

impl Conn {
    pub(super) fn new(peer: SocketAddr) -> Conn {
        Conn {
            peer,
            queue: false,
            delivered: 0,
            inbox: VecDeque::new(),
            inbox_bytes: 0,
            end: None,
            connected: false,
            local_closed: false,
            dropped: false,
            readers: Vec::new(),
            writers: Vec::new(),
            final_stats: AssociationStats::default(),
            folded: false,
            stage: Arc::default(),
            lent: 0,
            close_pending: false,
        }
    }
}

/// Bytes a tunnel's send stage gathers before its sender moves them into
/// the association itself (at least a packet's worth): with small packets,
/// the run of packets they fill leaves in one send (GSO) instead of one
/// system call per packet.
const STAGE_BYTES: usize = 64 << 10;

/// Unacknowledged bytes above which the acknowledgement comes without
/// delay: the receiver holds back only that of a lone packet of at most
/// 512 payload bytes (the association's delayed acknowledgement).
const PROMPT_ACK: usize = 512;

/// Moves tunnel `c`'s staged messages into its association while it takes
/// them (and refreshes the stage's limits from it); closes the association
/// once the stage is empty if a close waits. Returns whether any moved.
fn flush_stage(c: &mut Conn, a: &mut Association, stats: &mut EndpointStats) -> bool {
    let mut s = c.stage.tx.lock();
    let payload = a.packet_payload();
    let max_message = usize::try_from(a.max_message()).unwrap_or(usize::MAX);
    s.flush_at = payload.max(STAGE_BYTES);
    s.small = (payload / 4).min(max_message);
    s.bundling = a.bundles();
    // A bundle fills a packet as one whole message (one chunk, never
    // reassembled) when it starts one.
    s.bundle_max = payload
        .saturating_sub(association::frame::chunk_overhead(true, true, 0, payload))
        .min(max_message);
    let mut moved = 0;
    while !s.msgs.is_empty() {
        let (n, refused) = a.send_from(&mut s.msgs);
        moved += n;
        match refused {
            Some(SendError::TooLarge { .. }) => {
                // Staged under a `small` that the peer's limit no longer
                // allows (its limit is known before any message is staged,
                // so this should not happen): dropped and counted.
                if let Some(m) = s.msgs.pop_front() {
                    s.bytes -= m.len();
                }
                stats.staged_refused += 1;
            }
            Some(SendError::WouldBlock) | None => break,
            Some(_) => {
                // Closing: the peer closed (or the association ended)
                // before the stage moved. These were accepted by `send`
                // and will not be delivered: counted.
                stats.staged_refused += s.clear() as u64;
                s.shut = true;
                break;
            }
        }
    }
    if s.msgs.is_empty() && s.bundling {
        moved += move_bundles(&mut s, a, stats);
    }
    if moved > 0 {
        s.bytes = s.msgs.iter().map(Bytes::len).sum::<usize>() + s.bundled_bytes();
    }
    s.busy = a.buffered() > 0;
    s.prompt = a.buffered() > PROMPT_ACK;
    s.asked = false;
    let empty = s.is_empty();
    if c.end.is_some() || c.local_closed || c.dropped {
        s.shut = true;
    }
    drop(s);
    if empty && c.close_pending {
        c.close_pending = false;
        a.close();
    }
    moved > 0
}

/// Seals the stage's open bundle and moves its bundles into the
/// association while it takes them; how many messages they held.
fn move_bundles(s: &mut SendStage, a: &mut Association, stats: &mut EndpointStats) -> usize {
    s.seal();
    let mut moved = 0;
    while let Some((b, n)) = s.bundles.front() {
        let n = *n;
        match a.send_bundle(b.clone(), n) {
            Ok(()) => {
                s.bundles.pop_front();
                moved += n;
            }
            Err(SendError::WouldBlock) => break,
            Err(SendError::TooLarge { .. }) => {
                // Built under a `bundle_max` that the peer's limit no
                // longer allows (it is known before anything is staged, so
                // this should not happen): dropped and counted.
                s.bundles.pop_front();
                stats.staged_refused += n as u64;
            }
            Err(_) => {
                // Closing, or the peer does not take bundles (`bundling`
                // follows the association, so this should not happen):
                // accepted by `send` and not delivered, counted.
                stats.staged_refused += s.clear() as u64;
                s.shut = true;
                break;
            }
        }
    }
    moved
}

/// Whether datagram `d` is an association packet by its first four bytes
/// (what [`Core::handle_datagram`] checks before it hands one to the
/// association endpoint).
#[inline]
fn is_association(d: &Bytes) -> bool {
    d.first_chunk::<4>()
        == Some(&[
            wire::MAGIC[0],
            wire::MAGIC[1],
            wire::VERSION,
            association::KIND,
        ])
}

/// A frame to send: destination and its bytes in `Core::fbuf`.
type Frame = (SocketAddr, usize, usize);

/// Everything the driver and the handles share, under one lock.
#[derive(Debug)]
pub(crate) struct Core {
    /// Every association, initiated or accepted; a tunnel's key is its
    /// handle.
    pub(crate) assocs: association::Endpoint,
    /// Drives `assocs`: its input, timers, events and packets.
    assoc_io: Pump,
    pub(crate) stopped: bool,
    pub(crate) conns: FxHashMap<u64, Conn>,
    /// The reliable queue this endpoint serves, if it is one's.
    pub(crate) queue: Option<super::reliable::QueueState>,
    pub(crate) accepted: VecDeque<(u64, SocketAddr)>,
    pub(crate) accept_wakers: Vec<Waker>,
    pub(crate) batcher: Batcher,
    loss: LossDetector,
    pub(crate) inbox: VecDeque<Message>,
    max_inbox: usize,
    pub(crate) pop_wakers: Vec<Waker>,
    pub(crate) stats: EndpointStats,
    pub(super) finished: AssociationStats,
    touched: Vec<u64>,
    next_deadline: Option<Instant>,
    /// When the driver's timer is armed to fire (`None`: disarmed).
    pub(crate) timer_armed: Option<Instant>,
    /// A tunnel left gathered bytes for the driver and nudged it; cleared
    /// when they are collected (one nudge per collection, not per write).
    pub(crate) flush_wanted: bool,
    // Scratch space reused across calls.
    frames_in: Vec<Bytes>,
    msgs: Vec<Message>,
    verdicts: Vec<Verdict>,
    fbuf: Vec<u8>,
    frames: Vec<Frame>,
    tmp: Vec<u8>,
}

fn add_frame(fbuf: &mut Vec<u8>, frames: &mut Vec<Frame>, dest: SocketAddr, bytes: &[u8]) {
    let start = fbuf.len();
    fbuf.extend_from_slice(bytes);
    frames.push((dest, start, fbuf.len()));
}

/// The endpoint thread's [`Outlet`]: each packet is written straight into
/// the send batch and stays there as a datagram of its own when it must
/// travel alone or is too large to share a compound datagram with another
/// frame of its size; otherwise it moves to the frames packed after
/// collection.
struct BatchOutlet<'a> {
    out: &'a mut SendBatch,
    fbuf: &'a mut Vec<u8>,
    frames: &'a mut Vec<Frame>,
    max_datagram: usize,
}

impl Outlet for BatchOutlet<'_> {
    #[inline]
    fn take(
        &mut self,
        _now: Instant,
        poll: impl FnOnce(&mut Vec<u8>) -> Option<association::Transmit>,
    ) -> Option<usize> {
        let mut size = None;
        let (fbuf, frames, max_datagram) = (&mut *self.fbuf, &mut *self.frames, self.max_datagram);
        self.out.push_with_alone(|buf| {
            let start = buf.len();
            let t = poll(buf)?;
            size = Some(t.size);
            if t.alone || 2 * (t.size + 4) + compound::HEADER_LEN > max_datagram {
                Some((t.destination, t.alone))
            } else {
                // Removed from the batch when this returns `None`.
                add_frame(fbuf, frames, t.destination, &buf[start..]);
                None
            }
        });
        size
    }

    const SPLIT: bool = true;

    /// As [`Outlet::take`], with a packet's large payload left where it
    /// lies: the batch keeps a reference and the kernel copies it from
    /// there (one copy of every byte, as TCP's `write`). A packet that
    /// moves to a compound datagram is joined whole.
    #[inline]
    fn take_split(
        &mut self,
        _now: Instant,
        poll: impl FnOnce(&mut Vec<u8>, &mut Option<Bytes>) -> Option<association::Transmit>,
    ) -> Option<usize> {
        let mut size = None;
        let (fbuf, frames, max_datagram) = (&mut *self.fbuf, &mut *self.frames, self.max_datagram);
        self.out.push_with_tail(|buf, tail| {
            let start = buf.len();
            let t = poll(buf, tail)?;
            size = Some(t.size);
            if t.alone || 2 * (t.size + 4) + compound::HEADER_LEN > max_datagram {
                Some((t.destination, t.alone))
            } else {
                // Removed from the batch when this returns `None`.
                let at = fbuf.len();
                fbuf.extend_from_slice(&buf[start..]);
                if let Some(b) = tail.take() {
                    fbuf.extend_from_slice(&b);
                }
                frames.push((t.destination, at, fbuf.len()));
                None
            }
        });
        size
    }
}

impl Core {
    pub(crate) fn new(
        assocs: association::Endpoint,
        batcher: Batcher,
        loss: LossDetector,
        max_inbox: usize,
    ) -> Core {
        Core {
            assocs,
            assoc_io: Pump::new(super::driver::SEND_BYTES),
            stopped: false,
            conns: FxHashMap::default(),
            queue: None,
            accepted: VecDeque::new(),
            accept_wakers: Vec::new(),
            batcher,
            loss,
            inbox: VecDeque::new(),
            max_inbox,
            pop_wakers: Vec::new(),
            stats: EndpointStats::default(),
            finished: AssociationStats::default(),
            touched: Vec::new(),
            next_deadline: None,
            timer_armed: None,
            flush_wanted: false,
            frames_in: Vec::new(),
            msgs: Vec::new(),
            verdicts: Vec::new(),
            fbuf: Vec::new(),
            frames: Vec::new(),
            tmp: Vec::new(),
        }
    }

    /// The association behind tunnel `key`.
    pub(crate) fn assoc(&mut self, key: u64) -> Option<&mut Association> {
        self.assocs.association(Handle(key))
    }

    /// Creates an outgoing association; returns its key.
    pub(crate) fn connect(&mut self, now: Instant, peer: SocketAddr, service: u32) -> u64 {
        let key = self.assocs.connect(now, peer, service).0;
        self.conns.insert(key, Conn::new(peer));
        key
    }

    /// Offers `msg` to tunnel `key`: `Ok(true)` accepted, `Ok(false)` no
    /// room yet.
    pub(crate) fn try_send(&mut self, key: u64, msg: &Bytes) -> Result<bool, TunnelError> {
        self.offer(key, |a| a.send(msg.clone()).map(|()| 1))
            .map(|n| n > 0)
    }

    /// Offers stream bytes to tunnel `key` (gathered with the bytes
    /// written before, see [`Association::write`]): how many were taken,
    /// 0 when there is no room yet.
    pub(crate) fn try_write(&mut self, key: u64, data: &[u8]) -> Result<usize, TunnelError> {
        self.offer(key, |a| a.write(data))
    }

    /// Whether what tunnel `key` has just accepted should be sent at once:
    /// a packet's worth waits, or nothing is in flight (a lone message,
    /// whose latency counts). Otherwise small writes gather until the
    /// driver, nudged once, collects them (TCP's send buffer, without a
    /// timer).
    pub(crate) fn send_now(&mut self, key: u64) -> bool {
        self.assoc(key)
            .is_none_or(|a| a.in_flight() == 0 || a.unsent() >= a.packet_payload())
    }

    /// Runs `f` on tunnel `key`'s association and maps its refusal to the
    /// tunnel's error; `Ok(0)` is no room yet.
    fn offer(
        &mut self,
        key: u64,
        f: impl FnOnce(&mut Association) -> Result<usize, SendError>,
    ) -> Result<usize, TunnelError> {
        let Core {
            assocs,
            conns,
            stats,
            ..
        } = self;
        let Some(c) = conns.get_mut(&key) else {
            return Err(TunnelError::EndpointGone);
        };
        if let Some(e) = &c.end {
            return Err(e.error(c.peer, c.local_closed));
        }
        if c.local_closed {
            return Err(TunnelError::Closed);
        }
        let Some(a) = assocs.association(Handle(key)) else {
            return Err(TunnelError::EndpointGone);
        };
        // What was staged goes first (order); while it waits for room,
        // so does this.
        flush_stage(c, a, stats);
        if !c.stage.tx.lock().is_empty() {
            return Ok(0);
        }
        match f(a) {
            Ok(n) => Ok(n),
            Err(SendError::WouldBlock) => Ok(0),
            Err(SendError::TooLarge { len, max }) => Err(TunnelError::TooLarge { len, max }),
            Err(_) => {
                // Closing or finished: a failure waiting in the events says
                // more than "closed".
                self.pump(key, usize::MAX);
                let c = &self.conns[&key];
                Err(match (&c.end, c.local_closed) {
                    (Some(e), l) => e.error(c.peer, l),
                    (None, true) => TunnelError::Closed,
                    (None, false) => TunnelError::PeerClosed,
                })
            }
        }
    }

    /// Moves every message tunnel `key` holds into `out` (its receive
    /// stage, read empty), if any is ready: `Some(Ok(()))`; else whether
    /// the tunnel ended (`Some(Ok(()))` with nothing moved after a graceful
    /// end, an error after a failure) or not (`None`). Also returns whether
    /// events were taken from the association (the driver should transmit:
    /// the window may have opened).
    #[allow(clippy::type_complexity)]
    pub(crate) fn take_inbox(
        &mut self,
        key: u64,
        limit: usize,
        out: &mut VecDeque<Inbound>,
    ) -> (Option<Result<(), TunnelError>>, bool) {
        let mut pumped = false;
        for attempt in 0..2 {
            let Some(c) = self.conns.get_mut(&key) else {
                return (Some(Err(TunnelError::EndpointGone)), pumped);
            };
            // The messages lent last time were all read.
            c.inbox_bytes -= c.lent;
            c.lent = 0;
            if !c.inbox.is_empty() {
                std::mem::swap(out, &mut c.inbox);
                c.lent = c.inbox_bytes;
                if c.inbox_bytes < limit / 2 {
                    pumped |= self.pump(key, limit);
                }
                return (Some(Ok(())), pumped);
            }
            if attempt == 0 {
                pumped |= self.pump(key, limit);
            }
        }
        let c = &self.conns[&key];
        let r = match &c.end {
            Some(End::Closed(_)) => Some(Ok(())),
            Some(e) => Some(Err(e.error(c.peer, c.local_closed))),
            None => None,
        };
        (r, pumped)
    }

    /// Moves events from tunnel `key`'s association into its queue while
    /// the queue holds under `limit` bytes (all of them once the
    /// association is finished, or the tunnel dropped). Wakes its tasks if
    /// anything moved; returns whether anything did.
    pub(crate) fn pump(&mut self, key: u64, limit: usize) -> bool {
        if self.conns.get(&key).is_some_and(|c| c.queue) {
            return self.pump_queue(key);
        }
        let Core {
            assocs,
            conns,
            stats,
            finished,
            ..
        } = self;
        let Some(c) = conns.get_mut(&key) else {
            return false;
        };
        let Some(a) = assocs.association(Handle(key)) else {
            if c.end.is_none() {
                c.end = Some(End::Gone);
                wake_all(&mut c.readers);
                wake_all(&mut c.writers);
            }
            return false;
        };
        let mut any = false;
        loop {
            let done = matches!(a.state(), State::Closed | State::Drained);
            if c.inbox_bytes >= limit && !done && !c.dropped {
                break;
            }
            let Some(ev) = a.poll_event() else { break };
            any = true;
            match ev {
                Event::Connected => c.connected = true,
                Event::Message(_) | Event::Pieces(_) if c.dropped => {
                    stats.discarded_after_drop += 1;
                }
                Event::Bundle(b) if c.dropped => {
                    stats.discarded_after_drop += Inbound::Bundle(b).messages() as u64;
                }
                Event::Message(b) => {
                    c.inbox_bytes += b.len();
                    c.inbox.push_back(Inbound::Whole(b));
                }
                Event::Bundle(b) => {
                    c.inbox_bytes += b.len();
                    c.inbox.push_back(Inbound::Bundle(b));
                }
                Event::Pieces(p) => {
                    c.inbox_bytes += p.len();
                    c.inbox.push_back(Inbound::Pieces(p));
                }
                Event::Writable => {}
                Event::Closed(r) => c.end = Some(End::Closed(r)),
                Event::Failed(r) => c.end = Some(End::Failed(r)),
            }
            if c.end.is_some() && !c.folded {
                c.folded = true;
                c.final_stats = a.stats();
                add_stats(finished, &c.final_stats);
            }
        }
        if c.end.is_some() {
            let mut s = c.stage.tx.lock();
            s.shut = true;
            // Accepted by `send` and never in the association: the tunnel
            // failed (a graceful end empties the stage first).
            stats.staged_refused += s.clear() as u64;
        } else if !c.dropped || c.close_pending {
            any |= flush_stage(c, a, stats);
        }
        if any {
            wake_all(&mut c.readers);
            wake_all(&mut c.writers);
        } else if !c.writers.is_empty() && (a.has_events() || a.buffered() == 0) {
            // Events held back by a full queue may include `Writable`.
            wake_all(&mut c.writers);
        }
        any
    }

    pub(crate) fn close(&mut self, key: u64) {
        self.close_after_stage(key);
        if let Some(c) = self.conns.get_mut(&key) {
            c.local_closed = true;
            c.stage.tx.lock().shut = true;
        }
    }

    /// Closes tunnel `key`'s association once its staged messages are in
    /// it: now, or when acknowledgements make room for the last of them
    /// (`pump`).
    fn close_after_stage(&mut self, key: u64) {
        let Core {
            assocs,
            conns,
            stats,
            ..
        } = self;
        let Some(a) = assocs.association(Handle(key)) else {
            return;
        };
        match conns.get_mut(&key) {
            Some(c) if c.end.is_none() => {
                c.close_pending = true;
                flush_stage(c, a, stats);
            }
            _ => a.close(),
        }
    }

    /// Moves tunnel `key`'s staged messages into its association (the
    /// caller flushes, or is about to wait); whether any moved.
    pub(crate) fn flush(&mut self, key: u64) -> bool {
        let Core {
            assocs,
            conns,
            stats,
            ..
        } = self;
        match (conns.get_mut(&key), assocs.association(Handle(key))) {
            (Some(c), Some(a)) => flush_stage(c, a, stats),
            _ => false,
        }
    }

    /// The tunnel handle is gone: close in the background, discard what
    /// arrives, forget the tunnel once it ended.
    pub(crate) fn drop_tunnel(&mut self, key: u64) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        c.dropped = true;
        self.stats.discarded_after_drop +=
            c.inbox.iter().map(Inbound::messages).sum::<usize>() as u64;
        c.inbox.clear();
        c.inbox_bytes = 0;
        c.lent = 0;
        if c.end.is_none() {
            self.close_after_stage(key);
        }
        self.touched.push(key);
    }

    /// Forgets a set-up that timed out.
    pub(crate) fn abort(&mut self, key: u64) {
        let a = self.assocs.remove(Handle(key));
        if let Some(c) = self.conns.get_mut(&key) {
            c.end
                .get_or_insert(End::Failed(FailReason::HandshakeTimeout));
            if let Some(a) = a.filter(|_| !c.folded) {
                c.folded = true;
                c.final_stats = a.stats();
                add_stats(&mut self.finished, &c.final_stats);
            }
        }
    }

    /// The driver stopped: every tunnel and waiter learns it.
    pub(crate) fn stop(&mut self) {
        self.stopped = true;
        for c in self.conns.values_mut() {
            c.end.get_or_insert(End::Gone);
            wake_all(&mut c.readers);
            wake_all(&mut c.writers);
        }
        wake_all(&mut self.accept_wakers);
        wake_all(&mut self.pop_wakers);
        if let Some(q) = &mut self.queue {
            wake_all(&mut q.waiters);
        }
    }

    /// Counters, live associations included.
    pub(crate) fn stats(&self) -> EndpointStats {
        let mut s = self.stats.clone();
        s.listener = self.assocs.stats();
        s.first_not_listening = s.listener.first_not_listening;
        s.associations = self.finished;
        let mut open = 0;
        for (k, c) in &self.conns {
            if c.end.is_some() {
                continue;
            }
            open += 1;
            if let Some(a) = self.assocs.get(Handle(*k)) {
                add_stats(&mut s.associations, &a.stats());
            }
        }
        s.tunnels_open = open;
        let l = self.loss.stats();
        s.lost = l.lost;
        s.duplicate = l.duplicates;
        // Numbers refused as too far ahead are dropped like stale ones.
        s.stale = l.stale + l.far_ahead;
        s
    }

    /// Takes one received datagram.
    pub(crate) fn handle_datagram(&mut self, now: Instant, from: SocketAddr, data: Bytes) {
        self.stats.datagrams_received += 1;
        if data.len() < 2 || data[0..2] != wire::MAGIC {
            self.stats.dropped_foreign += 1;
            return;
        }
        if data.len() < 4 {
            self.stats.dropped_malformed += 1;
            return;
        }
        if data[2] != wire::VERSION {
            self.stats.dropped_version += 1;
            return;
        }
        if data[3] != compound::KIND {
            return self.handle_frame(now, from, data);
        }
        let mut frames = std::mem::take(&mut self.frames_in);
        match compound::decode(&data, &mut frames) {
            Ok(()) => {
                self.stats.compound_received += 1;
                for f in frames.drain(..) {
                    self.handle_frame(now, from, f);
                }
            }
            Err(_) => self.stats.dropped_malformed += 1,
        }
        self.frames_in = frames;
    }

    /// Takes the datagrams of one receive from `from` (one, or the
    /// segments of a GRO run), as [`Core::handle_datagram`] takes each:
    /// association packets in a row go to the endpoint together (see
    /// [`association::Endpoint::handle_datagrams`]).
    pub(crate) fn handle_run(
        &mut self,
        now: Instant,
        from: SocketAddr,
        mut datagrams: impl Iterator<Item = Bytes>,
    ) {
        loop {
            // The first datagram that is not an association packet stops
            // the run; it goes the way of every other.
            let mut other = None;
            let Core {
                assocs,
                assoc_io,
                stats,
                ..
            } = self;
            let run = std::iter::from_fn(|| {
                let d = datagrams.next()?;
                if !is_association(&d) {
                    other = Some(d);
                    return None;
                }
                stats.datagrams_received += 1;
                Some(d)
            });
            assoc_io.input_run(assocs, now, from, run);
            match other {
                Some(d) => self.handle_datagram(now, from, d),
                None => return,
            }
        }
    }

    #[inline(always)]
    fn handle_frame(&mut self, now: Instant, from: SocketAddr, f: Bytes) {
        match f[3] {
            association::KIND => self.assoc_io.input(&mut self.assocs, now, from, f),
            1 => self.handle_batch(now, from, f),
            _ => self.stats.dropped_kind += 1,
        }
    }

    fn handle_batch(&mut self, now: Instant, from: SocketAddr, f: Bytes) {
        let Core {
            msgs,
            loss,
            verdicts,
            inbox,
            stats,
            max_inbox,
            ..
        } = self;
        let max = *max_inbox;
        msgs.clear();
        let header = match wire::decode_into(&f, msgs) {
            Ok(h) => h,
            Err(e) => {
                match WireError::reason(&e) {
                    "kind" => stats.dropped_kind += 1,
                    "truncated" => stats.dropped_truncated += 1,
                    _ => stats.dropped_malformed += 1,
                }
                return;
            }
        };
        let all = loss.check_run(
            header.source,
            header.base_seq,
            msgs.len() as u64,
            verdicts,
            || now,
        );
        for (i, mut m) in msgs.drain(..).enumerate() {
            if !all && verdicts[i] != Verdict::Deliver {
                continue;
            }
            if inbox.len() >= max {
                stats.inbox_full += 1;
                continue;
            }
            m.meta.from = Some(from);
            inbox.push_back(m);
            stats.popped_ready += 1;
        }
        wake_all(&mut self.pop_wakers);
    }

    /// After a batch of input: timers, new tunnels, events into tunnels.
    pub(crate) fn after_input(&mut self, now: Instant, limit: usize) {
        let fired = self.next_deadline.is_some_and(|t| now >= t);
        if fired {
            self.assoc_io.timers(&mut self.assocs, now);
            self.batcher.handle_timeout(now);
        }
        let Core {
            assoc_io,
            assocs,
            touched,
            queue,
            conns,
            accepted,
            accept_wakers,
            ..
        } = self;
        assoc_io.events(assocs, |assocs, ev| {
            let h = match ev {
                EndpointEvent::Activity(h) => {
                    touched.push(h.0);
                    return;
                }
                EndpointEvent::Accepted(h) => h,
            };
            let Some(peer) = assocs.get(h).map(|a| a.peer()) else {
                return;
            };
            let mut c = Conn::new(peer);
            if let Some(q) = queue {
                // A reliable queue accepts every association itself.
                c.queue = true;
                q.adopt(peer, h.0);
                touched.push(h.0);
                conns.insert(h.0, c);
                return;
            }
            conns.insert(h.0, c);
            accepted.push_back((h.0, peer));
            wake_all(accept_wakers);
        });
        let mut keys = std::mem::take(&mut self.touched);
        keys.sort_unstable();
        keys.dedup();
        for &k in &keys {
            self.pump(k, limit);
        }
        for k in keys.drain(..) {
            if self
                .conns
                .get(&k)
                .is_some_and(|c| (c.dropped || c.queue) && c.end.is_some())
            {
                // Its stats were folded into `finished` when it ended.
                self.conns.remove(&k);
            }
        }
        self.touched = keys;
    }

    /// Collects what every state machine has to send, at most about
    /// [`SEND_BYTES`](super::driver::SEND_BYTES), into `out` (datagrams,
    /// small frames to one host packed into compound datagrams of at most
    /// `max_datagram` bytes). Returns whether more may be waiting.
    pub(crate) fn collect(
        &mut self,
        now: Instant,
        out: &mut SendBatch,
        max_datagram: usize,
    ) -> bool {
        self.fbuf.clear();
        self.frames.clear();
        self.flush_wanted = false;
        let mut tmp = std::mem::take(&mut self.tmp);
        self.batcher.flush();
        while let Some(t) = self.batcher.poll_transmit(&mut tmp, 1) {
            self.add_frame(t.dest.addr, &tmp);
        }
        self.tmp = tmp;
        // Association packets are encoded straight into the send batch
        // (one copy of the payload in user space, where the kernel's send
        // takes it from); only frames small enough to share a compound
        // datagram move to `fbuf` for packing.
        let more = self.assoc_io.transmit(
            &mut self.assocs,
            now,
            &mut BatchOutlet {
                out,
                fbuf: &mut self.fbuf,
                frames: &mut self.frames,
                max_datagram,
            },
        );
        self.pack(out, max_datagram);
        self.next_deadline = self.poll_timeout();
        more
    }

    fn add_frame(&mut self, dest: SocketAddr, bytes: &[u8]) {
        add_frame(&mut self.fbuf, &mut self.frames, dest, bytes);
    }

    /// Writes the frames into `out`: small ones to the same host share
    /// compound datagrams, the others go alone.
    fn pack(&mut self, out: &mut SendBatch, max_datagram: usize) {
        // Groups of frame indices (first member, in sending order); a group
        // of one travels as it is.
        let mut groups: Vec<(usize, usize)> = Vec::with_capacity(self.frames.len());
        let mut members: Vec<Vec<usize>> = Vec::new();
        // Open compound per destination: (members index, bytes so far).
        let mut open: FxHashMap<SocketAddr, (usize, usize)> = FxHashMap::default();
        for (i, &(dest, s, e)) in self.frames.iter().enumerate() {
            let len = e - s;
            let need = skiff_proto::varint::len(len as u64) + len;
            match open.get_mut(&dest) {
                Some((m, bytes))
                    if *bytes + need <= max_datagram
                        && members[*m].len() < compound::MAX_FRAMES =>
                {
                    members[*m].push(i);
                    *bytes += need;
                }
                _ => {
                    members.push(vec![i]);
                    open.insert(dest, (members.len() - 1, compound::HEADER_LEN + need));
                    groups.push((members.len() - 1, i));
                }
            }
        }
        for (m, i) in groups {
            let (dest, s, e) = self.frames[i];
            if members[m].len() == 1 {
                out.push(dest, &self.fbuf[s..e]);
                continue;
            }
            let (fbuf, frames) = (&self.fbuf, &self.frames);
            out.push_with(|buf| {
                let mut enc = compound::Encoder::new(buf);
                for &j in &members[m] {
                    let (_, s, e) = frames[j];
                    let ok = enc.push(&fbuf[s..e], max_datagram);
                    debug_assert!(ok, "sized above");
                }
                Some(dest)
            });
            self.stats.compound_sent += 1;
            self.stats.frames_shared += members[m].len() as u64;
        }
    }

    /// The earliest timer of any state machine.
    pub(crate) fn poll_timeout(&mut self) -> Option<Instant> {
        let mut t = self.assocs.poll_timeout();
        if let Some(x) = self.batcher.poll_timeout() {
            t = Some(t.map_or(x, |t| t.min(x)));
        }
        self.next_deadline = t;
        t
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use skiff_proto::association::{Endpoint, EndpointConfig};
    use skiff_proto::BatcherConfig;

    use super::*;

    fn core() -> Core {
        let batcher = Batcher::new(BatcherConfig {
            qthresh: 1472,
            timeout: Duration::ZERO,
            max_datagram: 1472,
            max_destinations: 16,
            source: 1,
        });
        let assocs = Endpoint::new(EndpointConfig::default());
        Core::new(assocs, batcher, LossDetector::new(16), 64)
    }

    /// A run of datagrams of every kind the endpoint takes (set-ups of
    /// associations, best-effort batches, foreign and malformed bytes),
    /// the association packets in runs and alone.
    fn mixed_run(now: Instant, me: SocketAddr) -> Vec<Bytes> {
        let mut peer = Endpoint::new(EndpointConfig {
            seed: 7,
            ..EndpointConfig::default()
        });
        let mut firsts = Vec::new();
        let mut buf = Vec::new();
        for _ in 0..3 {
            peer.connect(now, me, 0);
            while let Some(t) = peer.poll_transmit(now, &mut buf) {
                assert_eq!(t.destination, me);
                firsts.push(Bytes::from(buf.clone()));
            }
        }
        assert_eq!(firsts.len(), 3);
        let batch = |seq: u64| {
            let msgs = [Message::new("a.b", Bytes::from_static(b"hello"))];
            Bytes::from(wire::encode_datagram(9, 0, seq, &msgs).unwrap())
        };
        let mut garbled = firsts[1].to_vec();
        garbled[4] = 0xff;
        vec![
            firsts[0].clone(),
            firsts[0].clone(),
            batch(0),
            firsts[1].clone(),
            Bytes::from(garbled),
            Bytes::from_static(b"not skiff"),
            firsts[2].clone(),
            batch(1),
            Bytes::from_static(b"SK"),
            firsts[1].clone(),
        ]
    }

    /// A receive handed over whole goes where each of its datagrams goes
    /// one by one: the same counters, the same associations, the same
    /// messages.
    #[test]
    fn a_run_is_taken_as_its_datagrams_one_by_one() {
        let now = Instant::now();
        let me: SocketAddr = "10.0.0.1:4000".parse().unwrap();
        let from: SocketAddr = "10.0.0.2:4000".parse().unwrap();
        let run = mixed_run(now, me);
        let (mut one, mut all) = (core(), core());
        for d in run.iter().cloned() {
            one.handle_datagram(now, from, d);
        }
        all.handle_run(now, from, run.into_iter());
        assert_eq!(one.stats, all.stats);
        assert_eq!(one.stats.datagrams_received, 10);
        assert!(one.stats.dropped_foreign > 0 && one.stats.dropped_malformed > 0);
        assert_eq!(one.assocs.stats(), all.assocs.stats());
        assert_eq!(one.assocs.stats().first_accepted, 3);
        assert_eq!(one.assocs.stats().first_duplicate, 2);
        assert_eq!(one.assocs.stats().malformed, 1);
        assert_eq!(one.inbox.len(), 2);
        assert_eq!(one.inbox, all.inbox);
    }
}
