//! The sending half of an association: the queue of accepted messages, the
//! packets in flight, selective-ack processing, loss detection, the
//! retransmission timer (RFC 6298) and the tail-loss probe (RFC 8985).
//!
//! **Tail-loss probe**: a loss among the last packets of a burst draws no
//! later acknowledgement to reveal it, so without help only the RTO (at
//! least `min_rto`) recovers it. Once an RTT is measured, whenever data is
//! in flight the probe timer runs for the probe timeout (PTO) from the
//! last data sent or the last acknowledgement that made progress. The
//! newest packet of a burst always asks for a status (SREQ), which the
//! receiver answers at once, so `PTO = max(2 x SRTT, min_pto)`; only when
//! the newest packet sent did not ask (more was queued behind it) may the
//! receiver hold its acknowledgement, and `ack_delay` is added (RFC 8985
//! 7.2 adds the delayed-ack allowance the same way). When it
//! fires first, the newest packet not yet acknowledged is sent again once,
//! asking for a status. Its acknowledgement either shows that nothing was
//! lost, or (through the SACK rule) which earlier packets were. One probe
//! per episode: another only after new progress; the RTO stays armed
//! behind it.
//!
//! **Copies of a lone small packet**: a request that fits one small packet
//! (at most `AssociationConfig::copy_max` payload bytes), sent while at
//! most one other packet is in flight (`COPY_FLIGHT`: the previous
//! request, when its acknowledgement races the reply home), goes out twice
//! back to back. Losing one copy then costs nothing,
//! where it would otherwise cost a probe timeout: at a loss rate `p` only
//! `p^2` of such requests wait for the probe. The copy is the same packet
//! (same sequence number and transmission), so it gives no RTT sample of
//! its own and is not a retransmission; the receiver drops whichever
//! arrives second as a duplicate. Bulk transfers never qualify (their
//! packets are large or not alone).
//!
//! **Stream writes** ([`SendState::write`]) are gathered the way a TCP send
//! buffer gathers small `write`s: bytes append to one open buffer, and
//! what a packet has room for becomes one message when the packet is
//! filled (the writer went idle and the driver collected, or a packet's
//! worth was written); the buffer becomes a message as well when it
//! reaches `COALESCE_MAX` bytes, or when a whole message is sent after it
//! (order is kept). Many tiny writes then travel as one chunk instead of
//! one chunk (and one queue entry) each, and a gathered message fits its
//! packet, so the receiver delivers it without reassembly; it reads the
//! messages as one byte stream. Less than a packet of gathered bytes waits
//! while data is in flight (Nagle's rule: the last packet sent asks for a
//! status, and its acknowledgement lets them go), so a steady stream of
//! small writes travels in full packets.
//!
//! Memory is bounded twice: `send` and `write` refuse once `send_buffer`
//! bytes are accepted and not yet acknowledged (gathered bytes included; one
//! message larger than that is let in alone), and at most `send_window`
//! packets are in flight.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::frame::{chunk_overhead, Chunk, Encoder, Sack, Status};
use crate::varint;

/// A packet counts as lost once a packet transmitted this many
/// transmissions after it has been acknowledged (RFC 6675's DupThresh,
/// counted as QUIC counts packet numbers).
const DUPTHRESH: u64 = 3;
/// Clock granularity in the RTO formula.
const GRANULARITY: Duration = Duration::from_millis(1);
/// Most doublings of the RTO.
const MAX_BACKOFF: u32 = 16;
/// The payload bytes of a small request, at most: the default of
/// `AssociationConfig::copy_max`, and the receiver's test for a lone
/// request whose acknowledgement may wait for the reply
/// (`AssociationConfig::delayed_ack`).
pub(super) const COPY_MAX: usize = 512;
/// A small packet is sent twice when at most this many packets, itself
/// included, are unacknowledged: besides the lone request, the next one
/// of a request/reply exchange whose replies come back another way (the
/// mesh's two associations per pair of nodes), sent when the previous
/// request's acknowledgement is still on its way.
const COPY_FLIGHT: usize = 2;
/// The most bytes stream writes gather into one message before a packet
/// takes them (see the module documentation).
pub(super) const COALESCE_MAX: usize = 1 << 20;
/// Gathered stream bytes start a packet's last piece only if at least this
/// many fit (or all of them do); otherwise they start the next packet.
const MIN_PIECE: usize = 256;
/// Bytes allocated at a time for gathering stream writes.
const GATHER_ALLOC: usize = 256 << 10;
/// A packet's last chunk of at least this many bytes is handed to a
/// driver that asks for it by reference rather than copied into the
/// datagram (see `Association::poll_transmit_split`): below it the copy
/// costs less than the reference.
pub(super) const SPLIT_MIN: usize = 512;

/// RFC 6298's round-trip estimator: SRTT, RTTVAR, RTO with exponential
/// backoff. Samples come only from packets sent once (Karn's rule); the
/// caller enforces that.
#[derive(Debug, Clone)]
pub(super) struct Rtt {
    srtt: Option<Duration>,
    rttvar: Duration,
    base: Duration,
    backoff: u32,
    min: Duration,
    max: Duration,
}

impl Rtt {
    pub(super) fn new(initial: Duration, min: Duration, max: Duration) -> Rtt {
        Rtt {
            srtt: None,
            rttvar: Duration::ZERO,
            base: initial.clamp(min, max),
            backoff: 0,
            min,
            max,
        }
    }

    /// Takes one measurement and resets the backoff (RFC 6298 2.2, 2.3).
    pub(super) fn sample(&mut self, r: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                let diff = s.abs_diff(r);
                self.rttvar = self.rttvar * 3 / 4 + diff / 4;
                self.srtt = Some(s * 7 / 8 + r / 8);
            }
        }
        let s = self.srtt.expect("set above");
        self.base = (s + (4 * self.rttvar).max(GRANULARITY)).clamp(self.min, self.max);
        self.backoff = 0;
    }

    /// The retransmission timeout in force, backoff included.
    pub(super) fn rto(&self) -> Duration {
        self.base
            .saturating_mul(1 << self.backoff.min(MAX_BACKOFF))
            .min(self.max)
    }

    /// Doubles the timeout after an expiry (RFC 6298 5.5).
    pub(super) fn back_off(&mut self) {
        self.backoff = (self.backoff + 1).min(MAX_BACKOFF);
    }

    /// The smoothed RTT, once measured.
    pub(super) fn srtt(&self) -> Option<Duration> {
        self.srtt
    }
}

/// One packet sent and not yet acknowledged cumulatively.
#[derive(Debug)]
struct Sent {
    chunks: PacketChunks,
    close: bool,
    /// Payload bytes, released from the send buffer when acknowledged.
    bytes: usize,
    /// Time of the last transmission.
    sent: Instant,
    /// Transmission number of the last transmission.
    tx: u64,
    sends: u32,
    /// Acknowledged, cumulatively or selectively.
    acked: bool,
    /// Waiting in the retransmission queue.
    lost: bool,
    /// Messages whose last byte is in this packet.
    ends: u32,
}

impl Sent {
    fn data_len(&self, seq: u64) -> usize {
        let mut len = varint::len(seq);
        self.chunks.for_each(|c| len += c.encoded_len());
        len
    }
}

/// The chunks of one packet: the first inline, the others in a list
/// taken (from the spare lists) only for a packet of two or more. A bulk
/// transfer's packets carry one chunk each, so recording one in flight
/// allocates nothing.
#[derive(Debug, Default)]
struct PacketChunks {
    first: Option<Chunk>,
    rest: Vec<Chunk>,
}

impl PacketChunks {
    /// Appends `c`; a list for the chunks after the first comes from
    /// `spare` when one is kept.
    fn push(&mut self, c: Chunk, spare: &mut Vec<Vec<Chunk>>) {
        if self.first.is_none() {
            self.first = Some(c);
            return;
        }
        if self.rest.capacity() == 0 {
            if let Some(list) = spare.pop() {
                self.rest = list;
            }
        }
        self.rest.push(c);
    }

    fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// Calls `f` on each chunk in order (plainer than a chained iterator
    /// on the path of every packet).
    fn for_each(&self, mut f: impl FnMut(&Chunk)) {
        if let Some(c) = &self.first {
            f(c);
            for c in &self.rest {
                f(c);
            }
        }
    }

    /// Calls `f` on each chunk but the last, in order, and returns the
    /// last.
    fn for_each_but_last(&self, mut f: impl FnMut(&Chunk)) -> Option<&Chunk> {
        let first = self.first.as_ref()?;
        let Some((last, mid)) = self.rest.split_last() else {
            return Some(first);
        };
        f(first);
        for c in mid {
            f(c);
        }
        Some(last)
    }

    /// The last chunk, if any.
    fn last(&self) -> Option<&Chunk> {
        self.rest.last().or(self.first.as_ref())
    }

    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = &Chunk> {
        self.first.iter().chain(&self.rest)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    #[cfg(test)]
    fn get(&self, i: usize) -> Option<&Chunk> {
        self.iter().nth(i)
    }
}

#[cfg(test)]
impl std::ops::Index<usize> for PacketChunks {
    type Output = Chunk;

    fn index(&self, i: usize) -> &Chunk {
        self.get(i).expect("chunk index in range")
    }
}

/// Drops the chunks of an acknowledged packet (its payload references)
/// and keeps their list, if one was taken, emptied for a later packet,
/// unless enough are kept or it grew large.
#[inline]
fn recycle(spare: &mut Vec<Vec<Chunk>>, chunks: PacketChunks) {
    let PacketChunks { first, rest } = chunks;
    drop(first);
    // A packet of one chunk (a bulk transfer's) took no list.
    if rest.capacity() > 0 {
        keep_list(spare, rest);
    }
}

/// Keeps `list` (emptied) for a later packet, unless enough are kept or
/// it grew large.
#[inline(never)]
fn keep_list(spare: &mut Vec<Vec<Chunk>>, mut list: Vec<Chunk>) {
    if spare.len() < SPARE_CHUNK_LISTS && list.capacity() <= SPARE_CHUNK_CAPACITY {
        list.clear();
        spare.push(list);
    }
}

/// Everything the probe timer of a packet just sent depends on (with
/// `min_pto` and `ack_delay`, which do not change).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TlpInputs {
    now: Instant,
    asked: bool,
    rto: Option<Instant>,
    srtt: Option<Duration>,
}

/// What kind of transmission [`SendState::next_packet`] chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tx {
    /// A packet sent for the first time.
    New,
    /// A packet declared lost (or probed), sent again.
    Again,
    /// The second copy of a lone small packet.
    Copy,
}

/// What an acknowledgement changed.
#[derive(Debug, Default)]
pub(super) struct AckOutcome {
    /// Packets newly marked lost by the SACK rule.
    pub(super) fast_lost: u64,
    /// Whether any packet was newly acknowledged.
    pub(super) progress: bool,
    /// Messages whose every packet is now acknowledged cumulatively.
    pub(super) messages_acked: u64,
}

/// A queued message, or one part of a message sent in parts
/// ([`SendState::push_parts`]): its pieces go into packets in order, the
/// first with BEGIN (and the whole message's length), the last with END,
/// so the peer gets one message without the parts ever being joined here.
#[derive(Debug)]
struct Part {
    bytes: Bytes,
    /// The message's first part.
    first: bool,
    /// The message's last part.
    last: bool,
    /// The message is a bundle of small messages (its first chunk says so).
    bundle: bool,
    /// The whole message's length.
    total: u64,
}

/// The sending half; see the module documentation.
#[derive(Debug)]
pub(super) struct SendState {
    queue: VecDeque<Part>,
    /// Bytes of the front message already in packets.
    front_off: usize,
    /// Stream writes gathered after `queue`, not yet a message.
    open: BytesMut,
    /// Bytes accepted and not yet in packets (queue and `open`).
    unsent: usize,
    /// Messages made of gathered stream bytes so far.
    pub(super) sealed: u64,
    /// Bytes accepted by `send` and not yet acknowledged.
    pub(super) buffered: usize,
    send_buffer: usize,
    /// Lowest sequence number not acknowledged cumulatively.
    pub(super) una: u64,
    /// Next new sequence number.
    pub(super) next: u64,
    inflight: VecDeque<Sent>,
    unacked: usize,
    rtx: VecDeque<u64>,
    /// `(tx, seq)` of every transmission not yet judged by the SACK rule,
    /// oldest first (`tx` ascends). A status looks only at those that
    /// `DUPTHRESH` younger acknowledged transmissions have overtaken, each
    /// once, instead of the whole flight on every status (with a hole at
    /// `una`, thousands of packets at the default window).
    unjudged: VecDeque<(u64, u64)>,
    /// The selective ranges of the last status applied: every packet in
    /// them is acknowledged already, so a status walks only what its
    /// ranges add (they repeat from status to status until a hole fills).
    last_sack: Sack,
    /// The peer's `alloc`: never send this sequence number or above.
    pub(super) peer_alloc: u64,
    window: u64,
    /// `close` was called (or the peer closed): send the sentinel after the
    /// queue.
    pub(super) close_requested: bool,
    /// Sequence number of the packet that carries the sentinel.
    pub(super) sentinel: Option<u64>,
    tx: u64,
    largest_acked_tx: u64,
    since_sreq: u32,
    /// `send` refused for lack of room; report `Writable` later.
    pub(super) blocked: bool,
    pub(super) rto_deadline: Option<Instant>,
    /// When to send a tail-loss probe, if one is due.
    pub(super) tlp_deadline: Option<Instant>,
    /// A probe was sent and nothing was acknowledged since.
    tlp_spent: bool,
    /// What `arm_tlp_after_send` last computed the probe timer from, and
    /// the deadline it set (see there).
    tlp_memo: Option<(TlpInputs, Option<Instant>)>,
    /// The newest data packet sent asked for a status (the receiver
    /// answers it without delay).
    newest_asked: bool,
    /// A lone small packet to send a second copy of.
    copy_due: Option<u64>,
    /// `AssociationConfig::copy_max`.
    copy_max: usize,
    /// The payload budget of the last packet filled (what a full packet
    /// carries), for Nagle's rule on gathered bytes.
    budget: usize,
    min_pto: Duration,
    /// The receiver's longest deliberate acknowledgement delay.
    ack_delay: Duration,
    pub(super) rtt: Rtt,
    /// Chunk lists of acknowledged packets, emptied, for the next packets
    /// (no allocation per packet; see `recycle`).
    spare_chunks: Vec<Vec<Chunk>>,
    /// Since when new data has waited on a shut window, if it does.
    stalled_since: Option<Instant>,
    /// Times new data waited on a shut window, and for how long in all.
    pub(super) window_stalls: u64,
    pub(super) window_stalled: Duration,
    /// `rto_deadline` is the window probe's (see `window_probe_timeout`).
    window_probing: bool,
}

/// The parts of `[a, b)` outside `done` (ascending, disjoint ranges): what a
/// selective range adds to those already applied.
fn news(a: u64, b: u64, done: &[(u64, u64)]) -> impl Iterator<Item = (u64, u64)> + '_ {
    let mut from = a;
    let mut rest = done.iter();
    std::iter::from_fn(move || loop {
        if from >= b {
            return None;
        }
        match rest.next() {
            Some(&(_, y)) if y <= from => {}
            Some(&(x, y)) if x < b => {
                let gap = (from < x).then_some((from, x));
                from = from.max(y);
                if gap.is_some() {
                    return gap;
                }
            }
            _ => {
                let r = (from, b);
                from = b;
                return Some(r);
            }
        }
    })
}

/// Chunk lists kept for reuse, at most.
const SPARE_CHUNK_LISTS: usize = 256;
/// Largest capacity of a chunk list kept for reuse (a packet of many tiny
/// messages may have needed thousands; such a list is freed).
const SPARE_CHUNK_CAPACITY: usize = 64;

impl SendState {
    pub(super) fn new(
        window: u64,
        send_buffer: usize,
        ack_delay: Duration,
        min_pto: Duration,
        copy_max: usize,
        rtt: Rtt,
    ) -> SendState {
        SendState {
            queue: VecDeque::new(),
            front_off: 0,
            open: BytesMut::new(),
            unsent: 0,
            sealed: 0,
            buffered: 0,
            send_buffer,
            una: 0,
            next: 0,
            inflight: VecDeque::new(),
            unacked: 0,
            rtx: VecDeque::new(),
            unjudged: VecDeque::new(),
            last_sack: Sack::default(),
            peer_alloc: 0,
            window,
            close_requested: false,
            sentinel: None,
            tx: 0,
            largest_acked_tx: 0,
            since_sreq: 0,
            blocked: false,
            rto_deadline: None,
            tlp_deadline: None,
            tlp_spent: false,
            tlp_memo: None,
            newest_asked: true,
            copy_due: None,
            copy_max,
            budget: 0,
            min_pto,
            ack_delay,
            rtt,
            spare_chunks: Vec::new(),
            stalled_since: None,
            window_stalls: 0,
            window_stalled: Duration::ZERO,
            window_probing: false,
        }
    }

    /// Whether a message of `len` bytes fits in the send buffer now.
    pub(super) fn has_room(&self, len: usize) -> bool {
        self.buffered == 0 || self.buffered.saturating_add(len) <= self.send_buffer
    }

    /// Queues a message; the caller has checked room and limits.
    pub(super) fn push(&mut self, msg: Bytes) {
        self.push_as(msg, false);
    }

    /// Queues a message, a bundle of small messages if `bundle` (see
    /// `bundle.rs`); the caller has checked room, limits and that the peer
    /// takes bundles.
    pub(super) fn push_as(&mut self, msg: Bytes, bundle: bool) {
        self.seal(usize::MAX);
        self.buffered += msg.len();
        self.unsent += msg.len();
        let total = msg.len() as u64;
        self.queue.push_back(Part {
            bytes: msg,
            first: true,
            last: true,
            bundle,
            total,
        });
    }

    /// Queues one message made of `parts` (empty parts are skipped), each
    /// referenced, never copied into one buffer: the packets take their
    /// pieces from the parts themselves.
    pub(super) fn push_parts(&mut self, parts: Vec<Bytes>) {
        self.seal(usize::MAX);
        let parts: Vec<Bytes> = parts.into_iter().filter(|p| !p.is_empty()).collect();
        let total: usize = parts.iter().map(Bytes::len).sum();
        if parts.is_empty() {
            self.push(Bytes::new());
            return;
        }
        self.buffered += total;
        self.unsent += total;
        let n = parts.len();
        for (i, bytes) in parts.into_iter().enumerate() {
            self.queue.push_back(Part {
                bytes,
                first: i == 0,
                last: i + 1 == n,
                bundle: false,
                total: total as u64,
            });
        }
    }

    /// Gathers stream bytes (see the module documentation): takes as many
    /// of `data` as the send buffer has room for and returns how many (0:
    /// full). `max_message` bounds a gathered message.
    pub(super) fn write(&mut self, data: &[u8], max_message: usize) -> usize {
        let limit = COALESCE_MAX.min(max_message).max(1);
        let mut room = self.send_buffer.saturating_sub(self.buffered);
        if self.buffered == 0 {
            // As for `send`: an empty buffer lets some bytes in whatever
            // its size.
            room = room.max(limit);
        }
        let mut data = &data[..data.len().min(room)];
        let taken = data.len();
        while !data.is_empty() {
            if self.open.len() >= limit {
                self.seal(limit);
            }
            let n = data.len().min(limit - self.open.len());
            if self.open.capacity() - self.open.len() < n {
                self.open.reserve(n.max(GATHER_ALLOC).min(limit));
            }
            self.open.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        self.buffered += taken;
        self.unsent += taken;
        taken
    }

    /// Turns up to `n` of the gathered stream bytes, if any, into a queued
    /// message.
    fn seal(&mut self, n: usize) {
        let n = n.min(self.open.len());
        if n > 0 {
            let msg = self.open.split_to(n).freeze();
            let total = msg.len() as u64;
            self.queue.push_back(Part {
                bytes: msg,
                first: true,
                last: true,
                bundle: false,
                total,
            });
            self.sealed += 1;
        }
    }

    /// Bytes accepted and not yet put in packets.
    pub(super) fn unsent(&self) -> usize {
        self.unsent
    }

    /// Whether the send buffer has drained far enough to report `Writable`.
    pub(super) fn writable_again(&self) -> bool {
        self.buffered <= self.send_buffer / 2
    }

    /// Packets sent and not acknowledged.
    pub(super) fn unacked(&self) -> usize {
        self.unacked
    }

    /// Messages (or parts) queued and not yet in packets, or a sentinel.
    pub(super) fn has_new(&self) -> bool {
        !self.queue.is_empty()
            || !self.open.is_empty()
            || (self.close_requested && self.sentinel.is_none())
    }

    /// The highest sequence number allowed, exclusive: the peer's window and
    /// our own bound on packets in flight.
    fn limit(&self) -> u64 {
        self.peer_alloc.min(self.una.saturating_add(self.window))
    }

    /// New data waits but the window is shut.
    pub(super) fn window_blocked(&self) -> bool {
        self.has_new() && self.next >= self.limit()
    }

    /// Whether the sentinel is sent and everything up to it acknowledged.
    pub(super) fn sentinel_acked(&self) -> bool {
        self.sentinel.is_some_and(|s| self.una > s)
    }

    /// Whether the only packet not acknowledged is a sentinel without data:
    /// every message was acknowledged.
    pub(super) fn only_bare_sentinel_unacked(&self) -> bool {
        self.sentinel == Some(self.una)
            && self.unacked == 1
            && self.inflight.front().is_some_and(|p| p.chunks.is_empty())
    }

    /// Whether every message was sent and acknowledged: nothing is queued
    /// and nothing in flight but, perhaps, a bare sentinel (sent or not).
    pub(super) fn messages_acked(&self) -> bool {
        self.queue.is_empty()
            && self.open.is_empty()
            && (self.unacked == 0 || self.only_bare_sentinel_unacked())
    }

    /// Whether a packet (retransmission or new) could be sent now.
    pub(super) fn has_data(&self) -> bool {
        !self.rtx.is_empty() || (self.has_new() && self.next < self.limit() && !self.holds_tail())
    }

    /// Nagle's rule for gathered stream bytes: when they are all that is
    /// new, fill less than a packet and data is in flight, they wait for
    /// an acknowledgement (the packet before them asked for one) instead
    /// of leaving as a small packet; more writes fill them meanwhile.
    fn holds_tail(&self) -> bool {
        self.queue.is_empty()
            && !self.close_requested
            && self.unacked > 0
            && !self.open.is_empty()
            && self.open.len() + MIN_PIECE / 8 < self.budget
    }

    /// Arms the retransmission timer if it should run and does not: the
    /// RTO while data is in flight, the window probe's timeout while the
    /// peer's window is shut and nothing is in flight.
    pub(super) fn arm(&mut self, now: Instant) {
        if self.unarmed() {
            return;
        }
        self.end_window_probe();
        if self.rto_deadline.is_none() && (self.unacked > 0 || self.window_blocked()) {
            let wait = if self.unacked == 0 {
                self.window_probing = true;
                self.window_probe_timeout()
            } else {
                self.rtt.rto()
            };
            self.rto_deadline = Some(now + wait);
        }
        if self.unacked == 0 && !self.window_blocked() {
            self.rto_deadline = None;
        }
        if self.unacked == 0 {
            self.tlp_deadline = None;
        }
    }

    /// Whether [`SendState::arm`] has nothing to do: no timer runs and
    /// none should (nothing in flight, no new data waiting, no probe),
    /// which is the state of an end that only receives, on every packet.
    #[inline]
    fn unarmed(&self) -> bool {
        self.unacked == 0
            && self.rto_deadline.is_none()
            && self.tlp_deadline.is_none()
            && !self.window_probing
            && !self.has_new()
    }

    /// Drops the window probe's deadline once the window is open or data
    /// is in flight: it is no retransmission timer.
    fn end_window_probe(&mut self) {
        if self.window_probing && (self.unacked > 0 || !self.window_blocked()) {
            self.window_probing = false;
            self.rto_deadline = None;
        }
    }

    /// How long a sender whose window the peer shut, with nothing in
    /// flight, waits before asking for the window again (a status request,
    /// which the peer answers at once): a probe timeout, `max(2 x SRTT,
    /// min_pto)`, doubling with each ask left unanswered by a wider window,
    /// never beyond the RTO without backoff. The peer opens the window with
    /// one status of its own, and a lost one would otherwise cost a whole
    /// RTO, backoff included (200 ms at least), with the link idle.
    fn window_probe_timeout(&self) -> Duration {
        let rto = self.rtt.base;
        let Some(srtt) = self.rtt.srtt() else {
            return self.rtt.rto();
        };
        (2 * srtt)
            .max(self.min_pto)
            .saturating_mul(1 << self.rtt.backoff.min(MAX_BACKOFF))
            .min(rto)
    }

    /// (Re)starts the probe timer from `now`, unless a probe is spent, no
    /// RTT is known yet, nothing is in flight, or the RTO would fire first
    /// anyway.
    fn arm_tlp(&mut self, now: Instant) {
        self.tlp_deadline = None;
        if self.tlp_spent || self.unacked == 0 {
            return;
        }
        let Some(srtt) = self.rtt.srtt() else {
            return;
        };
        let delay = if self.newest_asked {
            Duration::ZERO
        } else {
            self.ack_delay
        };
        let at = now + (2 * srtt + delay).max(self.min_pto);
        if self.rto_deadline.is_none_or(|rto| at < rto) {
            self.tlp_deadline = Some(at);
        }
    }

    /// The probe timer fired: queues the newest packet not acknowledged for
    /// retransmission (once per episode). Returns whether a probe was
    /// queued.
    pub(super) fn on_tlp(&mut self) -> bool {
        self.tlp_deadline = None;
        if self.tlp_spent || !self.rtx.is_empty() {
            return false;
        }
        let Some(i) = self.inflight.iter().rposition(|p| !p.acked && !p.lost) else {
            return false;
        };
        self.inflight[i].lost = true;
        self.rtx.push_back(self.una + i as u64);
        self.tlp_spent = true;
        true
    }

    /// Queues the sentinel for retransmission when it is sent, not
    /// acknowledged, not already queued, and last went out at least
    /// `min_age` ago. Returns whether it was queued.
    pub(super) fn resend_sentinel(&mut self, now: Instant, min_age: Duration) -> bool {
        let Some(i) = self.sentinel.and_then(|s| s.checked_sub(self.una)) else {
            return false;
        };
        let Some(p) = self.inflight.get_mut(i as usize) else {
            return false;
        };
        if p.acked || p.lost || now.saturating_duration_since(p.sent) < min_age {
            return false;
        }
        p.lost = true;
        self.rtx.push_back(self.una + i);
        true
    }

    /// Chooses the next data packet: the copy of a lone small packet, the
    /// oldest loss, else a new packet filled from the queue with at most
    /// `budget` bytes of chunks. Returns its sequence number, whether it
    /// should carry SREQ, and what kind of transmission it is.
    pub(super) fn next_packet(
        &mut self,
        now: Instant,
        budget: usize,
        sreq_every: u32,
    ) -> Option<(u64, bool, Tx)> {
        if let Some(seq) = self.copy_due.take() {
            let i = seq.checked_sub(self.una).map(|i| i as usize);
            if i.and_then(|i| self.inflight.get(i))
                .is_some_and(|p| !p.acked && !p.lost)
            {
                return Some((seq, true, Tx::Copy));
            }
        }
        while let Some(seq) = self.rtx.pop_front() {
            let Some(i) = seq.checked_sub(self.una) else {
                continue;
            };
            let Some(p) = self.inflight.get_mut(i as usize) else {
                continue;
            };
            if p.acked || !p.lost {
                continue;
            }
            p.lost = false;
            p.sent = now;
            self.tx += 1;
            p.tx = self.tx;
            self.unjudged.push_back((self.tx, seq));
            p.sends += 1;
            self.newest_asked = true;
            self.arm(now);
            return Some((seq, true, Tx::Again));
        }
        self.budget = budget;
        if self.window_blocked() {
            if self.stalled_since.is_none() {
                self.stalled_since = Some(now);
                self.window_stalls += 1;
            }
            return None;
        }
        if let Some(since) = self.stalled_since.take() {
            self.window_stalled += now.saturating_duration_since(since);
        }
        if !self.has_new() || self.holds_tail() {
            return None;
        }
        let (chunks, bytes) = self.fill(budget);
        let mut ends = 0;
        chunks.for_each(|c| ends += u32::from(c.end));
        let close = self.close_requested && self.queue.is_empty() && self.open.is_empty();
        let seq = self.next;
        if close {
            self.sentinel = Some(seq);
        }
        self.next += 1;
        self.tx += 1;
        self.unjudged.push_back((self.tx, seq));
        self.inflight.push_back(Sent {
            chunks,
            close,
            bytes,
            sent: now,
            tx: self.tx,
            sends: 1,
            acked: false,
            lost: false,
            ends,
        });
        self.unacked += 1;
        self.since_sreq += 1;
        let sreq = self.since_sreq >= sreq_every || close || !self.has_data();
        if sreq {
            self.since_sreq = 0;
        }
        self.newest_asked = sreq;
        if sreq && self.unacked <= COPY_FLIGHT && bytes <= self.copy_max {
            self.copy_due = Some(seq);
        }
        // With a packet in flight and the RTO armed, `arm` has nothing
        // left to do.
        self.arm_tlp_after_send(now);
        Some((seq, sreq, Tx::New))
    }

    /// Arms the RTO if it is not, ends a window probe, and (re)starts the
    /// probe timer for a packet just sent, unless the packet before it,
    /// sent at the same instant with the same timers, already left the
    /// timer where this one would (the packets of a burst share `now`).
    fn arm_tlp_after_send(&mut self, now: Instant) {
        self.end_window_probe();
        if self.rto_deadline.is_none() {
            self.rto_deadline = Some(now + self.rtt.rto());
        }
        let inputs = TlpInputs {
            now,
            asked: self.newest_asked,
            rto: self.rto_deadline,
            srtt: self.rtt.srtt(),
        };
        if self.tlp_deadline.is_some()
            && !self.tlp_spent
            && self.tlp_memo == Some((inputs, self.tlp_deadline))
        {
            return;
        }
        self.arm_tlp(now);
        self.tlp_memo = Some((inputs, self.tlp_deadline));
    }

    /// Takes chunks from the queue for one packet.
    fn fill(&mut self, mut budget: usize) -> (PacketChunks, usize) {
        let mut chunks = PacketChunks::default();
        let mut bytes = 0;
        loop {
            if self.queue.is_empty() && !self.open.is_empty() {
                // The writer has gone idle or a packet's worth waits: what
                // was gathered travels now, as a message that fits this
                // packet (so the receiver never reassembles stream bytes),
                // unless only a sliver of a packet already holding others
                // is left.
                let over = chunk_overhead(true, false, COALESCE_MAX as u64, budget);
                let room = budget.saturating_sub(over);
                if room == 0 || (!chunks.is_empty() && room < self.open.len().min(MIN_PIECE)) {
                    break;
                }
                self.seal(room);
            }
            let Some(part) = self.queue.front() else {
                break;
            };
            let begin = part.first && self.front_off == 0;
            let bundle = begin && part.bundle;
            let rest = part.bytes.len() - self.front_off;
            let total = part.total;
            // Overhead with the largest length that could fit, so the chunk
            // never overshoots the budget.
            let over = chunk_overhead(begin, false, total, budget);
            if budget <= over {
                break;
            }
            let n = rest.min(budget - over);
            let whole_part = n == rest;
            if bundle && !whole_part && !chunks.is_empty() {
                // A bundle that does not fit what is left of a packet
                // holding others starts the next packet, where it fits
                // whole (bundles are at most a packet's payload): the
                // receiver then splits it where it landed, never joining
                // its fragments first.
                break;
            }
            let end = whole_part && part.last;
            // A part that fits whole moves into its chunk (no reference
            // taken and dropped per small message).
            let moved = whole_part && self.front_off == 0;
            let piece = if moved {
                self.queue.pop_front().expect("front checked").bytes
            } else {
                part.bytes.slice(self.front_off..self.front_off + n)
            };
            let c = Chunk {
                begin,
                end,
                bundle,
                total: if begin && !end { total } else { 0 },
                bytes: piece,
            };
            budget -= c.encoded_len();
            bytes += n;
            self.unsent -= n;
            chunks.push(c, &mut self.spare_chunks);
            if whole_part {
                if !moved {
                    self.queue.pop_front();
                }
                self.front_off = 0;
            } else {
                self.front_off += n;
                break;
            }
        }
        (chunks, bytes)
    }

    /// Encoded length of `seq`'s DATA section.
    pub(super) fn data_len(&self, seq: u64) -> usize {
        self.inflight[(seq - self.una) as usize].data_len(seq)
    }

    /// Writes `seq`'s DATA section (and CLOSE flag). With `tail`, a last
    /// chunk of at least `SPLIT_MIN` bytes is written without its bytes,
    /// which are set in `tail` (a reference, no copy) to follow what was
    /// written; `tail` is left as it was otherwise.
    pub(super) fn encode(&self, seq: u64, e: &mut Encoder<'_>, tail: Option<&mut Option<Bytes>>) {
        let p = &self.inflight[(seq - self.una) as usize];
        e.data(seq);
        match tail {
            Some(t) if p.chunks.last().is_some_and(|c| c.bytes.len() >= SPLIT_MIN) => {
                if let Some(last) = p.chunks.for_each_but_last(|c| e.chunk(c)) {
                    e.chunk_head(last);
                    *t = Some(last.bytes.clone());
                }
            }
            _ => p.chunks.for_each(|c| e.chunk(c)),
        }
        e.close(p.close);
    }

    /// Whether `st` acknowledges only what was sent.
    pub(super) fn valid(&self, st: &Status) -> bool {
        st.rseq <= self.next && st.sack.ranges().iter().all(|&(_, end)| end <= self.next)
    }

    /// Whether applying `st` would change nothing but the timers: it
    /// acknowledges nothing new (its `rseq` is `una` and its ranges are the
    /// ones applied last), opens no window, and no packet waits to be
    /// judged by the SACK rule against the acknowledgements already seen.
    /// A sender whose peer sends nothing back gets the same status on
    /// every data packet.
    #[inline]
    fn changes_nothing(&self, st: &Status) -> bool {
        st.rseq == self.una
            && st.alloc <= self.peer_alloc
            && st.sack.ranges() == self.last_sack.ranges()
            && self
                .unjudged
                .front()
                .is_none_or(|&(tx, _)| tx + DUPTHRESH > self.largest_acked_tx)
    }

    /// Applies a status the caller has checked with [`SendState::valid`].
    #[inline]
    pub(super) fn on_status(&mut self, now: Instant, st: &Status) -> AckOutcome {
        if self.changes_nothing(st) {
            // What `apply_status` would do with it: no packet acknowledged,
            // so no RTT sample, no progress and no loss; only the timers
            // are armed (checked here first: an end that only receives has
            // none to arm, on every packet).
            if !self.unarmed() {
                self.arm(now);
            }
            return AckOutcome::default();
        }
        self.apply_status(now, st)
    }

    /// [`SendState::on_status`] in full.
    #[inline(never)]
    fn apply_status(&mut self, now: Instant, st: &Status) -> AckOutcome {
        let mut out = AckOutcome::default();
        self.peer_alloc = self.peer_alloc.max(st.alloc);
        let mut newest: Option<(u64, Instant, u32)> = None;
        let mut note = |seq: u64, p: &Sent| match newest {
            Some((s, _, _)) if s >= seq => {}
            _ => newest = Some((seq, p.sent, p.sends)),
        };
        let mut max_tx = self.largest_acked_tx;
        let advanced = st.rseq > self.una;
        while self.una < st.rseq {
            let mut p = self.inflight.pop_front().expect("una < rseq <= next");
            recycle(&mut self.spare_chunks, std::mem::take(&mut p.chunks));
            out.messages_acked += u64::from(p.ends);
            if !p.acked {
                self.buffered -= p.bytes;
                self.unacked -= 1;
                max_tx = max_tx.max(p.tx);
                out.progress = true;
                note(self.una, &p);
            }
            self.una += 1;
        }
        for &(a, b) in st.sack.ranges() {
            for (a, b) in news(a.max(self.una), b, self.last_sack.ranges()) {
                for seq in a..b {
                    let p = &mut self.inflight[(seq - self.una) as usize];
                    if !p.acked {
                        p.acked = true;
                        recycle(&mut self.spare_chunks, std::mem::take(&mut p.chunks));
                        self.buffered -= p.bytes;
                        self.unacked -= 1;
                        max_tx = max_tx.max(p.tx);
                        out.progress = true;
                        note(seq, p);
                    }
                }
            }
        }
        self.last_sack = st.sack;
        // Karn: only a packet sent once gives a sample, and only the packet
        // the ack delay refers to.
        if let (Some((seq, sent, 1)), Some(largest)) = (newest, st.largest()) {
            if seq == largest {
                let raw = now.saturating_duration_since(sent);
                let delay = Duration::from_micros(st.ack_delay_us);
                let r = if raw > delay { raw - delay } else { raw };
                self.rtt.sample(r);
            }
        }
        self.largest_acked_tx = max_tx;
        while let Some(&(tx, seq)) = self.unjudged.front() {
            if tx + DUPTHRESH > max_tx {
                break;
            }
            self.unjudged.pop_front();
            // Judged once: a packet acknowledged, already lost, or sent
            // again since (a younger `tx`, judged on its own) is passed.
            let i = seq.checked_sub(self.una).map(|i| i as usize);
            if let Some(p) = i.and_then(|i| self.inflight.get_mut(i)) {
                if !p.acked && !p.lost && p.tx == tx {
                    p.lost = true;
                    self.rtx.push_back(seq);
                    out.fast_lost += 1;
                }
            }
        }
        if advanced || out.progress {
            self.rto_deadline = None;
            self.tlp_spent = false;
        }
        self.arm(now);
        if out.progress {
            self.arm_tlp(now);
        }
        out
    }

    /// The retransmission timer expired: every packet not acknowledged is
    /// queued again and the timer backs off. Returns how many were queued
    /// (zero means the timer was a window probe).
    pub(super) fn on_rto(&mut self, now: Instant) -> u64 {
        self.rtt.back_off();
        let mut n = 0;
        for (i, p) in self.inflight.iter_mut().enumerate() {
            if !p.acked && !p.lost {
                p.lost = true;
                self.rtx.push_back(self.una + i as u64);
                n += 1;
            }
        }
        // Every packet not acknowledged is lost now; nothing is left for
        // the SACK rule to judge until they are sent again.
        self.unjudged.clear();
        self.rto_deadline = None;
        // The timeout recovers the whole tail; no probe until progress.
        self.tlp_spent = true;
        self.tlp_deadline = None;
        self.arm(now);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// `news` yields exactly the numbers of `[a, b)` outside `done`,
        /// ascending and each once.
        #[test]
        fn news_is_the_range_minus_what_was_done(
            a in 0u64..200,
            len in 0u64..200,
            cuts in proptest::collection::vec(0u64..400, 0..32),
        ) {
            let b = a + len;
            let mut cuts = cuts;
            cuts.sort_unstable();
            cuts.dedup();
            // Disjoint, ascending, separated ranges, as a SACK holds them.
            let done: Vec<(u64, u64)> = cuts
                .chunks_exact(2)
                .map(|c| (c[0], c[1]))
                .collect();
            let got: Vec<u64> = news(a, b, &done).flat_map(|(x, y)| x..y).collect();
            let want: Vec<u64> = (a..b)
                .filter(|n| !done.iter().any(|&(x, y)| (x..y).contains(n)))
                .collect();
            proptest::prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn rtt_follows_rfc6298() {
        let ms = Duration::from_millis;
        let mut r = Rtt::new(ms(1000), ms(200), ms(60_000));
        assert_eq!(r.rto(), ms(1000));
        r.sample(ms(100));
        // SRTT = 100, RTTVAR = 50, RTO = 100 + 200 = 300
        assert_eq!(r.srtt(), Some(ms(100)));
        assert_eq!(r.rto(), ms(300));
        r.back_off();
        assert_eq!(r.rto(), ms(600));
        r.sample(ms(100));
        // RTTVAR = 37.5, SRTT = 100, RTO = 250 and the backoff is gone
        assert_eq!(r.rto(), ms(250));
        for _ in 0..40 {
            r.back_off();
        }
        assert_eq!(r.rto(), ms(60_000));
    }

    /// A sender with a 64-packet window the peer has opened, 1 MiB of
    /// buffer and no delays.
    fn sender() -> SendState {
        let rtt = Rtt::new(
            Duration::from_secs(1),
            Duration::ZERO,
            Duration::from_secs(60),
        );
        let mut s = SendState::new(64, 1 << 20, Duration::ZERO, Duration::ZERO, COPY_MAX, rtt);
        s.peer_alloc = 64;
        s
    }

    proptest::proptest! {
        /// `on_status`, which only arms the timers for a status that
        /// changes nothing, leaves the sender exactly as applying the
        /// status in full does, whatever was sent, lost, retransmitted and
        /// acknowledged before; repeated statuses (the case it is for) come
        /// often.
        #[test]
        fn a_status_that_changes_nothing_is_applied_as_in_full(
            steps in proptest::collection::vec(
                (0u8..4, proptest::prelude::any::<u64>(), proptest::prelude::any::<u64>()),
                1..120,
            ),
        ) {
            let start = Instant::now();
            let (mut fast, mut full) = (sender(), sender());
            let mut last: Option<Status> = None;
            for (i, (op, x, y)) in steps.into_iter().enumerate() {
                let now = start + Duration::from_millis(i as u64);
                let st = match op {
                    0 => {
                        for s in [&mut fast, &mut full] {
                            s.push(Bytes::from(vec![1u8; 1 + (x % 300) as usize]));
                            while s.next_packet(now, 200, 4).is_some() {}
                        }
                        continue;
                    }
                    1 => {
                        for s in [&mut fast, &mut full] {
                            s.on_rto(now);
                            while s.next_packet(now, 200, 4).is_some() {}
                        }
                        continue;
                    }
                    2 if last.is_some() => last.unwrap(),
                    _ => {
                        // A status the receiver could send: everything
                        // below `rseq`, some ranges above it.
                        let (una, next) = (full.una, full.next);
                        let rseq = una + x % (next - una + 1);
                        let mut st = Status {
                            rseq,
                            alloc: full.peer_alloc + y % 3,
                            ack_delay_us: y % 500,
                            sack: Sack::default(),
                        };
                        let mut at = rseq + 1 + (y >> 8) % 3;
                        for k in 0..(x >> 8) % 4 {
                            let end = at + 1 + ((y >> (16 + k)) % 3);
                            if end > next {
                                break;
                            }
                            st.sack.push(at, end);
                            at = end + 1 + ((x >> (24 + k)) % 2);
                        }
                        st
                    }
                };
                last = Some(st);
                if !full.valid(&st) {
                    continue;
                }
                let a = fast.on_status(now, &st);
                let b = full.apply_status(now, &st);
                proptest::prop_assert_eq!(format!("{a:?}"), format!("{b:?}"));
                proptest::prop_assert_eq!(format!("{fast:?}"), format!("{full:?}"));
            }
        }
    }

    /// The status a bulk sender's peer repeats on every packet (nothing
    /// new acknowledged) is the one taken without applying it; a status
    /// acknowledging more, or a new range, or a wider window, is not.
    #[test]
    fn a_repeated_status_changes_nothing() {
        let now = Instant::now();
        let mut s = sender();
        for _ in 0..4 {
            s.push(Bytes::from(vec![1u8; 50]));
        }
        while s.next_packet(now, 100, 8).is_some() {}
        let mut st = Status {
            rseq: 1,
            alloc: 64,
            ack_delay_us: 7,
            sack: Sack::default(),
        };
        st.sack.push(2, 3);
        assert!(!s.changes_nothing(&st));
        s.on_status(now, &st);
        assert!(s.changes_nothing(&st));
        assert!(!s.changes_nothing(&Status { alloc: 65, ..st }));
        assert!(!s.changes_nothing(&Status { rseq: 2, ..st }));
        let mut more = st;
        more.sack.push(4, 5);
        assert!(!s.changes_nothing(&more));
    }

    #[test]
    fn the_probe_timer_of_a_burst_is_what_arming_afresh_gives() {
        // The packets of a burst, sent at one instant, skip recomputing the
        // probe timer when nothing it depends on changed: after every
        // packet it must be where a fresh computation puts it, also when
        // an acknowledgement (a new RTT sample) or an asking packet
        // (no ack delay) comes between.
        let t0 = Instant::now();
        let mut s = sender();
        s.ack_delay = Duration::from_millis(3);
        s.rtt.sample(Duration::from_millis(4));
        for i in 0..40 {
            s.push(Bytes::from(vec![i as u8; 300]));
        }
        let (mut sent, mut armed) = (0, 0);
        for round in 0..4u64 {
            let now = t0 + Duration::from_millis(10 * round);
            if round == 2 {
                // An acknowledgement of the first packets at this instant.
                let st = Status {
                    rseq: 3,
                    alloc: 64,
                    ..Status::default()
                };
                s.on_status(now, &st);
            }
            for _ in 0..8 {
                let Some(_) = s.next_packet(now, 400, 3) else {
                    break;
                };
                sent += 1;
                // Afresh, leaving the memo as the burst left it.
                let got = s.tlp_deadline;
                s.arm_tlp(now);
                assert_eq!(got, s.tlp_deadline, "round {round}, packet {sent}");
                armed += usize::from(got.is_some());
            }
        }
        assert!(sent >= 30 && armed >= 8, "{sent} sent, {armed} armed");
    }

    proptest::proptest! {
        /// A packet encoded with its large last chunk handed out by
        /// reference is, followed by that chunk's bytes, the packet encoded
        /// whole; only a last chunk of at least `SPLIT_MIN` bytes is handed
        /// out, and always.
        #[test]
        fn a_split_packet_is_the_whole_packet(
            sizes in proptest::collection::vec(0usize..3000, 1..24),
            budget in 100usize..1500,
        ) {
            let now = Instant::now();
            let mut s = sender();
            s.peer_alloc = 1 << 20;
            s.window = 1 << 20;
            for (i, &n) in sizes.iter().enumerate() {
                s.push(Bytes::from(vec![i as u8; n]));
            }
            s.close_requested = true;
            while let Some((seq, _, _)) = s.next_packet(now, budget, 4) {
                let mut whole = Vec::new();
                s.encode(seq, &mut Encoder::new(&mut whole, 7), None);
                let mut split = b"before".to_vec();
                let mut tail = None;
                s.encode(seq, &mut Encoder::new(&mut split, 7), Some(&mut tail));
                let p = &s.inflight[(seq - s.una) as usize];
                let big = p.chunks.last().is_some_and(|c| c.bytes.len() >= SPLIT_MIN);
                proptest::prop_assert_eq!(tail.is_some(), big);
                if let Some(t) = tail {
                    split.extend_from_slice(&t);
                }
                proptest::prop_assert_eq!(&split[6..], &whole[..]);
            }
        }
    }

    #[test]
    fn fill_fragments_and_coalesces() {
        let now = Instant::now();
        let mut s = sender();
        s.push(Bytes::from_static(b"a"));
        s.push(Bytes::from_static(b"bb"));
        s.push(Bytes::from(vec![7u8; 250]));
        let (seq, _, _) = s.next_packet(now, 100, 8).unwrap();
        let p = &s.inflight[seq as usize];
        assert_eq!(p.chunks.len(), 3);
        assert!(p.chunks[0].begin && p.chunks[0].end);
        assert!(p.chunks[2].begin && !p.chunks[2].end && p.chunks[2].total == 250);
        let used: usize = p.chunks.iter().map(Chunk::encoded_len).sum();
        assert!(used <= 100, "{used}");
        let mut got = p.chunks[2].bytes.len();
        while let Some((seq, _, _)) = s.next_packet(now, 100, 8) {
            let p = &s.inflight[seq as usize];
            assert!(p.chunks.iter().map(Chunk::encoded_len).sum::<usize>() <= 100);
            got += p.chunks.iter().map(|c| c.bytes.len()).sum::<usize>();
        }
        assert_eq!(got, 250);
        assert!(s.inflight.back().unwrap().chunks.last().unwrap().end);
    }

    #[test]
    fn a_bundle_that_does_not_fit_a_packets_rest_starts_the_next_packet() {
        let now = Instant::now();
        let mut s = sender();
        s.push(Bytes::from(vec![1u8; 40]));
        s.push_as(Bytes::from(vec![2u8; 80]), true);
        s.push_as(Bytes::from(vec![3u8; 10]), true);
        s.push(Bytes::from(vec![4u8; 150]));
        // The first packet has room for the plain message and a piece of
        // the bundle: the bundle waits for the next packet instead.
        let (seq, _, _) = s.next_packet(now, 100, 8).unwrap();
        let p = &s.inflight[seq as usize];
        assert_eq!(p.chunks.len(), 1);
        assert!(p.chunks[0].begin && p.chunks[0].end && !p.chunks[0].bundle);
        // The next packet carries it whole, and the small bundle after it
        // (which fits) beside it; a plain message is still fragmented.
        let (seq, _, _) = s.next_packet(now, 100, 8).unwrap();
        let p = &s.inflight[seq as usize];
        assert!(p.chunks.len() >= 2, "{:?}", p.chunks);
        assert!(p.chunks[0].bundle && p.chunks[0].begin && p.chunks[0].end);
        assert_eq!(p.chunks[0].bytes.len(), 80);
        assert!(p.chunks[1].bundle && p.chunks[1].begin && p.chunks[1].end);
        if let Some(c) = p.chunks.get(2) {
            assert!(c.begin && !c.end && !c.bundle);
        }
    }
}
