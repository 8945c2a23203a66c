//! The receiving half of an association: QMP's window (`rseq`, `alloc`),
//! the packets held above a gap, reassembly of fragmented messages and the
//! closing sentinel.
//!
//! Memory is bounded by the window: packets are accepted only below the
//! `alloc` last advertised, which is never more than `recv_window` above
//! `rseq`; `alloc` stops growing while the application leaves more than
//! `recv_buffer` bytes unread; one message at a time is reassembled, of at
//! most `max_message` bytes.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::frame::{Chunk, Chunks, Sack, Status, MAX_SACK};
use super::{Event, Pieces};

/// Most pieces a kept reassembly list has room for (a list grown further,
/// by a message in many small pieces, is freed).
const SPARE_PARTS_MAX: usize = 1024;

/// What became of one DATA section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DataOutcome {
    /// Next in order: processed, maybe with held packets after it.
    InOrder,
    /// Above a gap: held.
    Held,
    /// Seen before: dropped.
    Duplicate,
    /// Outside the window (or after the sentinel): dropped.
    OutOfWindow,
}

#[derive(Debug)]
struct Partial {
    bundle: bool,
    total: u64,
    got: u64,
    parts: Vec<Bytes>,
}

/// The receiving half; see the module documentation.
#[derive(Debug)]
pub(super) struct RecvState {
    /// Every sequence number below this has arrived and been processed.
    pub(super) rseq: u64,
    /// The window's upper edge as last advertised (exclusive).
    pub(super) alloc: u64,
    window: u64,
    held: BTreeMap<u64, (bool, Chunks)>,
    /// The runs of consecutive numbers in `held`, `start -> end`
    /// (exclusive), kept as packets arrive: a status names the first
    /// `MAX_SACK` of them without walking every held packet.
    runs: BTreeMap<u64, u64>,
    partial: Option<Partial>,
    /// Bytes of delivered messages the application has not taken.
    pub(super) unread: usize,
    recv_buffer: usize,
    pub(super) max_message: u64,
    /// The peer's sentinel, once seen.
    pub(super) fin: Option<u64>,
    /// The sentinel was reached in order: the peer's stream is complete.
    pub(super) fin_done: bool,
    largest: Option<(u64, Instant)>,
    /// The buffer of the last reassembled message, reused once the
    /// application drops it (see `join`).
    spare: Bytes,
    /// The (empty) list of the last reassembled message's pieces, kept for
    /// the next one so that reassembly allocates nothing per message.
    spare_parts: Vec<Bytes>,
    /// Both ends offered bundles: a message flagged as one is checked and
    /// delivered as [`Event::Bundle`]; otherwise a bundle is a protocol
    /// violation.
    pub(super) bundles: bool,
    /// Bundles delivered, and the messages they held.
    pub(super) bundles_delivered: u64,
    pub(super) bundled_delivered: u64,
    /// Deliver fragmented messages as [`Event::Pieces`], unjoined.
    pieces: bool,
    /// Since when a packet has been held above a gap, if one is.
    gap_since: Option<Instant>,
    /// Gaps opened, and how long they stayed open in all.
    pub(super) gaps: u64,
    pub(super) gap_time: Duration,
}

impl RecvState {
    pub(super) fn new(
        window: u64,
        recv_buffer: usize,
        max_message: u64,
        pieces: bool,
    ) -> RecvState {
        RecvState {
            rseq: 0,
            alloc: window,
            window,
            held: BTreeMap::new(),
            runs: BTreeMap::new(),
            partial: None,
            unread: 0,
            recv_buffer,
            max_message,
            fin: None,
            fin_done: false,
            largest: None,
            spare: Bytes::new(),
            spare_parts: Vec::new(),
            bundles: false,
            bundles_delivered: 0,
            bundled_delivered: 0,
            pieces,
            gap_since: None,
            gaps: 0,
            gap_time: Duration::ZERO,
        }
    }

    /// The `alloc` this receiver would grant now.
    fn want_alloc(&self) -> u64 {
        if self.fin.is_some() || self.unread > self.recv_buffer {
            self.alloc
        } else {
            self.alloc.max(self.rseq + self.window)
        }
    }

    /// Whether the window would open far enough to be worth a status of its
    /// own: by half a window, or from shut.
    pub(super) fn window_update_due(&self) -> bool {
        let want = self.want_alloc();
        want > self.alloc && (want - self.alloc >= self.window / 2 || self.alloc == self.rseq)
    }

    /// The status to send now; advances `alloc` as far as the window and
    /// the unread bytes allow.
    pub(super) fn status(&mut self, now: Instant) -> Status {
        self.alloc = self.want_alloc();
        let mut sack = Sack::default();
        for (&a, &b) in self.runs.iter().take(MAX_SACK) {
            sack.push(a, b);
        }
        let ack_delay_us = self.largest.map_or(0, |(_, at)| {
            let d = now.saturating_duration_since(at);
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
        });
        Status {
            rseq: self.rseq,
            alloc: self.alloc,
            ack_delay_us,
            sack,
        }
    }

    /// Whether a status now would say what `last` says, its ack delay
    /// aside: the same `rseq`, `alloc` and selective ranges. Never while
    /// more runs are held than a status names (a packet may then have
    /// arrived above those it names, and moved the ack delay's reference).
    pub(super) fn says(&self, last: &Status) -> bool {
        self.rseq == last.rseq
            && self.want_alloc() == last.alloc
            && self.runs.len() == last.sack.ranges().len()
            && (self.runs.is_empty()
                || self
                    .runs
                    .iter()
                    .zip(last.sack.ranges())
                    .all(|((&a, &b), &(x, y))| a == x && b == y))
    }

    /// Takes one DATA section. In-order data are processed at once (with
    /// whatever they release from the held set), delivering whole messages
    /// to `events`. An error is a protocol violation by the peer.
    #[inline(always)]
    pub(super) fn on_data(
        &mut self,
        now: Instant,
        seq: u64,
        close: bool,
        chunks: &mut Chunks,
        events: &mut VecDeque<Event>,
        delivered: &mut u64,
    ) -> Result<DataOutcome, &'static str> {
        if seq < self.rseq || (!self.held.is_empty() && self.held.contains_key(&seq)) {
            return Ok(DataOutcome::Duplicate);
        }
        if seq >= self.alloc || self.fin.is_some_and(|f| seq > f) {
            return Ok(DataOutcome::OutOfWindow);
        }
        if close {
            if self.fin.is_some_and(|f| f != seq) {
                return Err("two different sentinels");
            }
            if self.held.range(seq + 1..).next().is_some() {
                return Err("data after the sentinel");
            }
            self.fin = Some(seq);
        }
        if !matches!(self.largest, Some((s, _)) if s >= seq) {
            self.largest = Some((seq, now));
        }
        if seq > self.rseq {
            if self.gap_since.is_none() {
                self.gap_since = Some(now);
                self.gaps += 1;
            }
            self.held.insert(seq, (close, std::mem::take(chunks)));
            self.add_run(seq);
            return Ok(DataOutcome::Held);
        }
        self.process(close, chunks, events, delivered)?;
        self.rseq += 1;
        // Nothing held (the common case): no run to close, no gap open.
        if !self.held.is_empty() {
            self.release_held(now, events, delivered)?;
        }
        Ok(DataOutcome::InOrder)
    }

    /// After an in-order packet: processes the held packets that now
    /// follow in order, and closes the gap if none is left.
    #[inline(never)]
    fn release_held(
        &mut self,
        now: Instant,
        events: &mut VecDeque<Event>,
        delivered: &mut u64,
    ) -> Result<(), &'static str> {
        while let Some(e) = self.held.first_entry() {
            if *e.key() != self.rseq {
                break;
            }
            let (close, mut chunks) = e.remove();
            self.process(close, &mut chunks, events, delivered)?;
            self.rseq += 1;
        }
        // What was released was the first run, whole.
        if let Some(e) = self.runs.first_entry() {
            if *e.key() < self.rseq {
                debug_assert_eq!(*e.get(), self.rseq);
                e.remove();
            }
        }
        if self.held.is_empty() {
            if let Some(since) = self.gap_since.take() {
                self.gap_time += now.saturating_duration_since(since);
            }
        }
        Ok(())
    }

    /// Adds `seq`, just held, to the runs: it extends the run ending at
    /// it, joins the one starting after it, or starts its own.
    fn add_run(&mut self, seq: u64) {
        let end = match self.runs.remove(&(seq + 1)) {
            Some(end) => end,
            None => seq + 1,
        };
        match self.runs.range_mut(..seq).next_back() {
            Some((_, e)) if *e == seq => *e = end,
            _ => {
                self.runs.insert(seq, end);
            }
        }
    }

    /// Takes one piece of a message, in order.
    #[inline(always)]
    fn piece(
        &mut self,
        c: Chunk,
        events: &mut VecDeque<Event>,
        delivered: &mut u64,
    ) -> Result<(), &'static str> {
        let len = c.bytes.len() as u64;
        if c.bundle && !self.bundles {
            return Err("a bundle, which this end did not offer");
        }
        match (c.begin, c.end, self.partial.as_mut()) {
            (true, true, None) => {
                if len > self.max_message {
                    return Err("message over max_message");
                }
                self.unread += c.bytes.len();
                *delivered += 1;
                let e = self.message(c.bundle, c.bytes)?;
                events.push_back(e);
            }
            (true, false, None) => {
                if c.total > self.max_message {
                    return Err("message over max_message");
                }
                let mut parts = std::mem::take(&mut self.spare_parts);
                if parts.capacity() == 0 {
                    // Room for the pieces the message will take if the
                    // rest are the size of the first (one allocation
                    // instead of one per doubling).
                    let n = c.total.div_ceil(len.max(1)) as usize;
                    parts.reserve(n.min(SPARE_PARTS_MAX));
                }
                parts.push(c.bytes);
                self.partial = Some(Partial {
                    bundle: c.bundle,
                    total: c.total,
                    got: len,
                    parts,
                });
            }
            (false, end, Some(p)) => {
                p.got += len;
                if p.got > p.total || (end && p.got != p.total) {
                    return Err("fragments do not add up to the message length");
                }
                p.parts.push(c.bytes);
                if end {
                    let mut p = self.partial.take().expect("matched Some");
                    let total = p.total as usize;
                    self.unread += total;
                    *delivered += 1;
                    if self.pieces && !p.bundle && p.parts.len() > 1 {
                        events.push_back(Event::Pieces(Pieces::new(p.parts, total)));
                    } else {
                        let msg = join(&mut p.parts, total, &mut self.spare);
                        if p.parts.capacity() <= SPARE_PARTS_MAX {
                            self.spare_parts = p.parts;
                        }
                        let e = self.message(p.bundle, msg)?;
                        events.push_back(e);
                    }
                }
            }
            _ => return Err("message piece out of place"),
        }
        Ok(())
    }

    #[inline(always)]
    fn process(
        &mut self,
        close: bool,
        chunks: &mut Chunks,
        events: &mut VecDeque<Event>,
        delivered: &mut u64,
    ) -> Result<(), &'static str> {
        // Most data packets carry one piece: taken without the iterator.
        if let Some(c) = chunks.take_single() {
            self.piece(c, events, delivered)?;
        } else {
            for c in chunks.iter() {
                self.piece(c, events, delivered)?;
            }
        }
        if close {
            if self.partial.is_some() {
                return Err("sentinel inside a message");
            }
            self.fin_done = true;
        }
        Ok(())
    }

    /// The event for a whole message; a bundle is checked first (one that
    /// does not parse is a protocol violation).
    #[inline]
    fn message(&mut self, bundle: bool, msg: Bytes) -> Result<Event, &'static str> {
        if !bundle {
            return Ok(Event::Message(msg));
        }
        let Ok(n) = super::bundle::validate(&msg) else {
            return Err("a bundle whose records do not parse");
        };
        self.bundles_delivered += 1;
        self.bundled_delivered += n as u64;
        Ok(Event::Bundle(msg))
    }

    /// The application took a message of `len` bytes.
    pub(super) fn consumed(&mut self, len: usize) {
        self.unread -= len;
    }

    /// When `seq` arrived, if it is the highest sequence number received.
    pub(super) fn arrival_of(&self, seq: u64) -> Option<Instant> {
        self.largest.filter(|&(s, _)| s == seq).map(|(_, at)| at)
    }

    /// Packets held above a gap (for tests of the memory bound).
    pub(super) fn held(&self) -> usize {
        self.held.len()
    }
}

/// Most bytes of a joined message whose buffer is kept for reuse.
const SPARE_MAX: usize = 256 << 10;

/// Joins a message's pieces, copying only when there is more than one.
/// The copy goes into `spare`, the buffer of the message joined before,
/// when the application has dropped that message (no allocation, no fresh
/// pages), else into a new buffer; the result becomes the next `spare`
/// (when at most 256 KiB: a reassembled message held by the application
/// keeps its own buffer, nothing more).
pub(crate) fn join(parts: &mut Vec<Bytes>, total: usize, spare: &mut Bytes) -> Bytes {
    if parts.len() == 1 {
        return parts.pop().expect("one part");
    }
    let mut b = match std::mem::take(spare).try_into_mut() {
        Ok(mut b) if b.capacity() >= total => {
            b.clear();
            b
        }
        _ => BytesMut::with_capacity(total),
    };
    for p in parts.drain(..) {
        b.extend_from_slice(&p);
    }
    let msg = b.freeze();
    if total <= SPARE_MAX {
        *spare = msg.clone();
    }
    msg
}

#[cfg(test)]
mod join_tests {
    use super::*;

    fn parts(n: u8) -> Vec<Bytes> {
        vec![Bytes::from(vec![n; 1000]), Bytes::from(vec![n; 500])]
    }

    #[test]
    fn join_reuses_the_buffer_of_a_dropped_message() {
        let mut spare = Bytes::new();
        let a = join(&mut parts(1), 1500, &mut spare);
        assert_eq!(&a[..], &[1u8; 1500][..]);
        let at = a.as_ptr();
        drop(a);
        let b = join(&mut parts(2), 1500, &mut spare);
        assert_eq!(&b[..], &[2u8; 1500][..]);
        assert_eq!(
            b.as_ptr(),
            at,
            "the dropped message's buffer was not reused"
        );
    }

    #[test]
    fn join_leaves_a_held_message_alone() {
        let mut spare = Bytes::new();
        let a = join(&mut parts(1), 1500, &mut spare);
        let b = join(&mut parts(2), 1500, &mut spare);
        assert_ne!(a.as_ptr(), b.as_ptr());
        assert_eq!(&a[..], &[1u8; 1500][..]);
        assert_eq!(&b[..], &[2u8; 1500][..]);
        // A single part is handed over as it is, without a copy.
        let one = Bytes::from(vec![3u8; 10]);
        let at = one.as_ptr();
        assert_eq!(join(&mut vec![one], 10, &mut spare).as_ptr(), at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The runs kept as packets arrive name what walking the held
        /// packets would: the first `MAX_SACK` runs, after every packet,
        /// whatever the order and duplicates.
        #[test]
        fn sack_ranges_are_the_runs_of_held_packets(
            arrivals in proptest::collection::vec(0u64..300, 0..600),
        ) {
            let mut r = RecvState::new(4096, 1 << 20, 1 << 20, false);
            let now = Instant::now();
            let mut events = VecDeque::new();
            let mut delivered = 0;
            for seq in arrivals {
                r.on_data(now, seq, false, &mut Chunks::default(), &mut events, &mut delivered)
                    .unwrap();
                let mut want = Vec::new();
                for &k in r.held.keys() {
                    match want.last_mut() {
                        Some((_, b)) if *b == k => *b = k + 1,
                        _ => want.push((k, k + 1)),
                    }
                }
                want.truncate(MAX_SACK);
                let st = r.status(now);
                proptest::prop_assert_eq!(st.sack.ranges(), &want[..]);
                proptest::prop_assert!(r.held.keys().all(|&k| k > r.rseq));
            }
        }
    }
}
