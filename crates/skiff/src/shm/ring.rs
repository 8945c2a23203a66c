//! The ring protocol over a [`Region`]: one producer publishes segments,
//! consumers read them in place and return credits. The arithmetic is
//! `skiff_proto::credits`; this module moves it in and out of memory with
//! the right atomic orderings, and is the code loom checks.
//!
//! Publication (producer): reserve against the slowest consumer's
//! positions (credits) or break the sequence locks of the segments about
//! to be overwritten (overwrite: `seq = 2k+1`, then a release fence), let
//! the bytes be written, then store the record (`start`, `len`, then
//! `seq = 2k+2` with release), `head`, and `segments` (release). Reading
//! (consumer): load `segments` (acquire), then the record; every value is
//! checked by `credits::Consumer::check` before it addresses memory; an
//! overwrite-mode reader re-checks `seq` after reading the bytes (acquire
//! fence, then the load) and counts a torn read when it moved.
//!
//! Wake-ups: a side that must wait registers in a waiter count, re-checks,
//! then sleeps on a futex word; the other side, after publishing, issues a
//! `SeqCst` fence and bumps the word and wakes only when the count is
//! non-zero (Dekker's pattern: one of the two sees the other).

use std::sync::Arc;
use std::time::{Duration, Instant};

use skiff_proto::credits::{
    self, broken_seq, stable_seq, CreditError, Delivered, Flow, Record, Reservation, Slowest,
};

use super::layout::*;
use super::sync::{fence, spin_hint, AtomicU64, Ordering};
use super::{sys, BufferError, BufferId, Region};

/// A ring's memory and its validated layout, shared by its producer and
/// this process's consumers.
#[derive(Debug)]
pub(crate) struct Ring {
    pub(crate) region: Region,
    pub(crate) layout: Layout,
    pub(crate) id: BufferId,
    /// The producing process (from the header, read once).
    pub(crate) producer: (u32, u64),
    /// Whether this process may use the asymmetric fence pair
    /// (`sys::membarrier_ready`): publishers then pay a compiler fence
    /// instead of a `SeqCst` fence per segment and per `consume`.
    asym: bool,
    /// Process-local: set while a `Writable` of this ring lives.
    #[cfg_attr(skiff_loom, allow(dead_code))]
    live: std::sync::atomic::AtomicBool,
}

/// How often a waiting side checks that its peer still lives.
const LIVENESS: Duration = Duration::from_millis(10);

impl Ring {
    /// Writes a new ring's header into zeroed `region` (the creator's
    /// side, before anyone else can see the memory).
    pub(crate) fn init(region: Region, layout: Layout, id: BufferId) -> Ring {
        let pid = sys::pid();
        let start = sys::process_start(pid).unwrap_or(0);
        let h = HeaderWords {
            magic: MAGIC,
            version: VERSION,
            flow: layout.flow.code(),
            capacity: layout.geom.capacity(),
            records: layout.geom.records() as u32,
            consumers: layout.consumers,
            id,
            pid,
            start,
            total: layout.total as u64,
        };
        let b = h.encode();
        for o in (0..64).step_by(8) {
            let w = u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default());
            region.u64_at(o).store(w, Ordering::Relaxed);
        }
        fence(Ordering::Release);
        Ring {
            region,
            layout,
            id,
            producer: (pid, start),
            asym: sys::membarrier_ready(),
            live: Default::default(),
        }
    }

    /// A ring whose header was validated into `layout` (an attaching
    /// consumer's side).
    pub(crate) fn attached(region: Region, layout: Layout, h: &HeaderWords) -> Ring {
        Ring {
            region,
            layout,
            id: h.id,
            producer: (h.pid, h.start),
            asym: sys::membarrier_ready(),
            live: Default::default(),
        }
    }

    fn w64(&self, off: usize) -> &AtomicU64 {
        self.region.u64_at(off)
    }

    /// The ring's state word (open, closed, corrupt).
    pub(crate) fn state(&self) -> u32 {
        self.region.u32_at(P_STATE).load(Ordering::Acquire)
    }

    /// Marks the ring closed (`CLOSED`, `CORRUPT` or `LOST`) and wakes
    /// everyone.
    pub(crate) fn close(&self, state: u32) {
        self.region.u32_at(P_STATE).store(state, Ordering::Release);
        for futex in [P_DATA_FUTEX, P_SPACE_FUTEX] {
            self.region.u32_at(futex).fetch_add(1, Ordering::SeqCst);
            sys::futex_wake(self.region.u32_at(futex));
        }
    }

    /// Wakes a consumer sleeping in [`RingConsumer::next_or`] so that it
    /// re-checks its extra condition (a system call only if one sleeps).
    pub(crate) fn poke_data(&self) {
        self.wake(P_DATA_FUTEX, P_DATA_WAITERS);
    }

    /// The data offset of position `pos` split for `len` bytes.
    pub(crate) fn ranges(&self, pos: u64, len: u64) -> [(usize, usize); 2] {
        let (a, b) = self.layout.split(pos, len);
        let d = self.layout.data_off;
        [(d + a.start, a.len()), (d + b.start, b.len())]
    }

    /// Whether the producing process is alive.
    pub(crate) fn producer_alive(&self) -> bool {
        let (pid, start) = self.producer;
        sys::process_start(pid) == Some(start)
    }

    /// Wakes the waiters on `futex` if `waiters` says there are any; after
    /// the caller published. The fence between the publication and the
    /// load of `waiters` is the light half of the asymmetric pair (a
    /// compiler fence when membarrier is available, paired with the
    /// waiter's heavy fence; else `SeqCst`): no store-buffer drain, no
    /// system call while the peer is busy (not registered as a waiter).
    #[inline]
    fn wake(&self, futex: usize, waiters: usize) {
        sys::light_fence(self.asym);
        if self.region.u32_at(waiters).load(Ordering::Relaxed) > 0 {
            self.region.u32_at(futex).fetch_add(1, Ordering::SeqCst);
            sys::futex_wake(self.region.u32_at(futex));
        }
    }

    /// Waits on `futex` (registered in `waiters`) until `ready` holds or
    /// `deadline`; spins first for `spin`. `alive` is checked every
    /// `every` ([`LIVENESS`] but where another signal covers a dead peer).
    /// Returns whether `ready` held.
    #[allow(clippy::too_many_arguments)]
    fn wait(
        &self,
        futex: usize,
        waiters: usize,
        deadline: Option<Instant>,
        spin: Duration,
        every: Duration,
        mut ready: impl FnMut() -> Result<bool, BufferError>,
        mut alive: impl FnMut() -> Result<(), BufferError>,
    ) -> Result<bool, BufferError> {
        if ready()? {
            return Ok(true);
        }
        if !spin.is_zero() {
            // Re-check often (a pause is tens of cycles to ~140 on recent
            // cores), read the clock rarely.
            let until = Instant::now() + spin;
            loop {
                for _ in 0..16 {
                    for _ in 0..4 {
                        spin_hint();
                    }
                    if ready()? {
                        return Ok(true);
                    }
                }
                if Instant::now() >= until {
                    break;
                }
            }
        }
        let word = self.region.u32_at(futex);
        let count = self.region.u32_at(waiters);
        loop {
            count.fetch_add(1, Ordering::SeqCst);
            // The heavy half of the pair: after it, either the publisher
            // sees this waiter or this re-check sees its publication.
            sys::heavy_fence(self.asym);
            let v = word.load(Ordering::SeqCst);
            let r = ready();
            if !matches!(r, Ok(false)) {
                count.fetch_sub(1, Ordering::SeqCst);
                return r;
            }
            let now = Instant::now();
            let slice = match deadline {
                Some(d) if d <= now => {
                    count.fetch_sub(1, Ordering::SeqCst);
                    return Ok(false);
                }
                Some(d) => (d - now).min(every),
                None => every,
            };
            let w = sys::futex_wait(word, v, slice);
            count.fetch_sub(1, Ordering::SeqCst);
            w.map_err(BufferError::io("futex wait"))?;
            alive()?;
        }
    }
}

/// The producer's end of a ring.
#[derive(Debug)]
pub(crate) struct RingProducer {
    pub(crate) ring: Arc<Ring>,
    state: credits::Producer,
    /// Consumers detached because they died or published nonsense.
    pub(crate) consumers_lost: u64,
    /// The slowest consumer at the last scan: consumers only move forward,
    /// so it stays a safe (conservative) bound until rescanned.
    cached: Option<Slowest>,
    /// A second reference to the ring, lent to each `Writable` and given
    /// back at commit, so handing out a segment costs no reference-count
    /// update.
    #[cfg_attr(skiff_loom, allow(dead_code))]
    spare: Option<Arc<Ring>>,
}

impl RingProducer {
    /// The producer of a freshly initialized ring.
    pub(crate) fn new(ring: Arc<Ring>) -> RingProducer {
        let state = credits::Producer::new(ring.layout.geom, ring.layout.flow);
        RingProducer {
            spare: Some(Arc::clone(&ring)),
            ring,
            state,
            consumers_lost: 0,
            cached: None,
        }
    }

    /// Segments published.
    pub(crate) fn segments(&self) -> u64 {
        self.state.segments()
    }

    /// Bytes published.
    pub(crate) fn head(&self) -> u64 {
        self.state.head()
    }

    /// The slowest attached consumer; detaches one whose positions are
    /// impossible.
    pub(crate) fn slowest(&mut self) -> Option<Slowest> {
        let l = self.ring.layout;
        let mut min: Option<Slowest> = None;
        for i in 0..l.consumers {
            let r = &self.ring.region;
            if r.u32_at(l.slot(i, C_STATE)).load(Ordering::Acquire) != SLOT_ATTACHED {
                continue;
            }
            let consumed = r.u64_at(l.slot(i, C_CONSUMED)).load(Ordering::Acquire);
            let read = r.u64_at(l.slot(i, C_READ)).load(Ordering::Acquire);
            match self.state.check_consumer(consumed, read) {
                Ok(s) => {
                    min = Some(match min {
                        None => s,
                        Some(m) => Slowest {
                            consumed: m.consumed.min(s.consumed),
                            records_read: m.records_read.min(s.records_read),
                        },
                    })
                }
                Err(_) => self.detach(i),
            }
        }
        min
    }

    fn detach(&mut self, i: u32) {
        let l = self.ring.layout;
        self.ring
            .region
            .u32_at(l.slot(i, C_STATE))
            .store(SLOT_FREE, Ordering::Release);
        self.consumers_lost += 1;
    }

    /// Detaches consumers whose process is gone; returns how many.
    pub(crate) fn reap_dead(&mut self) -> u32 {
        let l = self.ring.layout;
        let mut n = 0;
        for i in 0..l.consumers {
            let r = &self.ring.region;
            if r.u32_at(l.slot(i, C_STATE)).load(Ordering::Acquire) == SLOT_FREE {
                continue;
            }
            let pid = r.u32_at(l.slot(i, C_PID)).load(Ordering::Acquire);
            let start = r.u64_at(l.slot(i, C_START)).load(Ordering::Acquire);
            if sys::process_start(pid) != Some(start) {
                self.detach(i);
                n += 1;
            }
        }
        n
    }

    /// Reserves `len` bytes now, or says why not.
    pub(crate) fn try_reserve(&mut self, len: u64) -> Result<Reservation, CreditError> {
        let r = match self.ring.layout.flow {
            Flow::Overwrite => self.state.reserve(len, None)?,
            // The cached bound first (no scan of the consumer slots per
            // segment); rescan when it does not suffice. No consumers is
            // never cached: one may attach at any time.
            Flow::Credits => match self.cached.map(|c| self.state.reserve(len, Some(c))) {
                Some(Ok(r)) => r,
                _ => {
                    self.cached = self.slowest();
                    self.state.reserve(len, self.cached)?
                }
            },
        };
        if self.ring.layout.flow == Flow::Overwrite {
            let region = &self.ring.region;
            for &seg in self.state.overwritten() {
                let off = self.ring.layout.record_of(seg);
                region.u64_at(off).store(broken_seq(seg), Ordering::Relaxed);
            }
            let off = self.ring.layout.record_of(r.seg);
            region
                .u64_at(off)
                .store(broken_seq(r.seg), Ordering::Relaxed);
            // Seqlock writer: the broken marks are visible to anyone who
            // sees a byte written after this fence.
            fence(Ordering::Release);
        }
        Ok(r)
    }

    /// Reserves `len` bytes, waiting for credits up to `deadline` (`None`:
    /// forever); dead consumers are reaped while waiting.
    pub(crate) fn reserve(
        &mut self,
        len: u64,
        deadline: Option<Instant>,
        spin: Duration,
    ) -> Result<Reservation, BufferError> {
        let id = self.ring.id;
        match self.try_reserve(len) {
            Err(CreditError::WouldBlock { .. } | CreditError::NoRecord { .. }) => {}
            other => return other.map_err(|e| BufferError::credit(id, e)),
        }
        let ring = Arc::clone(&self.ring);
        let mut got = None;
        let mut last_reap = Instant::now();
        let ok = ring.wait(
            P_SPACE_FUTEX,
            P_SPACE_WAITERS,
            deadline,
            spin,
            LIVENESS,
            || match self.try_reserve(len) {
                Ok(r) => {
                    got = Some(r);
                    Ok(true)
                }
                Err(CreditError::WouldBlock { .. } | CreditError::NoRecord { .. }) => {
                    if last_reap.elapsed() >= LIVENESS {
                        last_reap = Instant::now();
                        self.reap_dead();
                    }
                    Ok(false)
                }
                Err(e) => Err(BufferError::credit(id, e)),
            },
            || Ok(()),
        )?;
        match got {
            Some(r) if ok => Ok(r),
            _ => Err(BufferError::Timeout),
        }
    }

    /// Drops the outstanding reservation.
    pub(crate) fn abandon(&mut self) {
        self.state.abandon();
    }

    /// Publishes the reservation with `used` bytes and wakes readers (a
    /// system call only if one sleeps). Per segment: plain and release
    /// stores (plain `mov`s on x86) and the light fence, no read-modify-write.
    pub(crate) fn commit(&mut self, used: u64) -> Result<Delivered, CreditError> {
        let d = self.state.commit(used)?;
        let l = self.ring.layout;
        let r = &self.ring.region;
        let rec = l.record_of(d.seg);
        r.u64_at(rec + 8).store(d.start, Ordering::Relaxed);
        r.u64_at(rec + 16).store(d.len, Ordering::Relaxed);
        r.u64_at(rec).store(stable_seq(d.seg), Ordering::Release);
        self.ring
            .w64(P_HEAD)
            .store(d.start + d.len, Ordering::Release);
        self.ring
            .w64(P_SEGMENTS)
            .store(d.seg + 1, Ordering::Release);
        self.ring.wake(P_DATA_FUTEX, P_DATA_WAITERS);
        Ok(d)
    }

    /// The oldest segment that reached every consumer, if any.
    pub(crate) fn poll_delivered(&mut self) -> Option<Delivered> {
        let slowest = match self.ring.layout.flow {
            Flow::Credits => self.slowest(),
            Flow::Overwrite => None,
        };
        self.state.poll_delivered(slowest)
    }
}

/// A consumer's end of a ring (one slot).
#[derive(Debug)]
pub(crate) struct RingConsumer {
    pub(crate) ring: Arc<Ring>,
    slot: u32,
    state: credits::Consumer,
    /// Reads the sequence lock found torn.
    pub(crate) torn: std::cell::Cell<u64>,
    /// Segments overwritten before they were read.
    pub(crate) lost: u64,
    closed: bool,
    /// The producer's segment count and head as last loaded (acquire):
    /// segments below `seen_segs` are read without touching the
    /// producer's line again; each record is still checked against
    /// `seen_head`, which was published after them.
    seen_segs: u64,
    seen_head: u64,
}

impl RingConsumer {
    /// Takes a free consumer slot and starts at the next segment to be
    /// published.
    pub(crate) fn attach(ring: Arc<Ring>) -> Result<RingConsumer, BufferError> {
        let l = ring.layout;
        let r = &ring.region;
        let slot = (0..l.consumers)
            .find(|&i| {
                r.u32_at(l.slot(i, C_STATE))
                    .compare_exchange(SLOT_FREE, SLOT_JOINING, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            })
            .ok_or(BufferError::NoSlot {
                id: ring.id,
                slots: l.consumers,
            })?;
        let pid = sys::pid();
        r.u32_at(l.slot(slot, C_PID)).store(pid, Ordering::Relaxed);
        let start = sys::process_start(pid).unwrap_or(0);
        r.u64_at(l.slot(slot, C_START))
            .store(start, Ordering::Relaxed);
        // Two rounds: the first position protects nothing until the slot is
        // attached; the second, read after attaching (SeqCst), is one the
        // producer cannot have overwritten (see the module doc).
        let mut at = (0, 0);
        for round in 0..2 {
            at = Self::position(&ring)?;
            r.u64_at(l.slot(slot, C_CONSUMED))
                .store(at.1, Ordering::SeqCst);
            r.u64_at(l.slot(slot, C_READ)).store(at.0, Ordering::SeqCst);
            if round == 0 {
                r.u32_at(l.slot(slot, C_STATE))
                    .store(SLOT_ATTACHED, Ordering::SeqCst);
            }
        }
        let state = credits::Consumer::new(l.geom, l.flow, at.0, at.1);
        Ok(RingConsumer {
            ring,
            slot,
            state,
            torn: Default::default(),
            lost: 0,
            closed: false,
            seen_segs: 0,
            seen_head: 0,
        })
    }

    /// The next segment number and its start position, consistently.
    fn position(ring: &Ring) -> Result<(u64, u64), BufferError> {
        let l = ring.layout;
        let r = &ring.region;
        for _ in 0..1000 {
            let head = ring.w64(P_HEAD).load(Ordering::SeqCst);
            let segs = ring.w64(P_SEGMENTS).load(Ordering::SeqCst);
            if segs == 0 {
                return Ok((0, 0));
            }
            if l.flow == Flow::Overwrite {
                // Any position up to the next segment's start will do.
                return Ok((segs, head));
            }
            let rec = l.record_of(segs - 1);
            let seq = r.u64_at(rec).load(Ordering::Acquire);
            let start = r.u64_at(rec + 8).load(Ordering::Relaxed);
            let len = r.u64_at(rec + 16).load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if seq == stable_seq(segs - 1)
                && r.u64_at(rec).load(Ordering::Relaxed) == seq
                && ring.w64(P_SEGMENTS).load(Ordering::SeqCst) == segs
            {
                let end = start
                    .checked_add(len)
                    .filter(|&e| e <= head + l.geom.capacity());
                return end.map(|e| (segs, e)).ok_or_else(|| BufferError::Corrupt {
                    id: ring.id,
                    why: format!("last segment ends past the ring ({start}+{len})"),
                });
            }
            spin_hint();
        }
        Err(BufferError::Corrupt {
            id: ring.id,
            why: "segment records never settle".into(),
        })
    }

    fn fail(&mut self, why: String) -> BufferError {
        self.detach();
        BufferError::Corrupt {
            id: self.ring.id,
            why,
        }
    }

    /// The next published segment, if any. `Closed` once the producer closed
    /// and everything was read.
    pub(crate) fn try_next(&mut self) -> Result<Option<Delivered>, BufferError> {
        if self.closed {
            return Err(BufferError::Closed { id: self.ring.id });
        }
        loop {
            let next = self.state.next_seg();
            if next >= self.seen_segs {
                let segs = self.ring.w64(P_SEGMENTS).load(Ordering::Acquire);
                // Published before `segments`: at least the end of every
                // segment below `segs`.
                let head = self.ring.w64(P_HEAD).load(Ordering::Acquire);
                self.seen_segs = segs;
                self.seen_head = head;
            }
            let segs = self.seen_segs;
            if next >= segs {
                if next > segs {
                    return Err(self.fail(format!("segment count went back to {segs}")));
                }
                return match self.ring.state() {
                    OPEN => Ok(None),
                    CLOSED if self.ring.w64(P_SEGMENTS).load(Ordering::Acquire) == segs => {
                        self.detach();
                        Err(BufferError::Closed { id: self.ring.id })
                    }
                    CLOSED => continue,
                    LOST if self.ring.w64(P_SEGMENTS).load(Ordering::Acquire) == segs => {
                        self.detach();
                        Err(BufferError::PeerLost { id: self.ring.id })
                    }
                    LOST => continue,
                    CORRUPT => Err(self.fail(
                        "closed as corrupt (a peer broke the protocol or the header)".into(),
                    )),
                    s => Err(self.fail(format!("ring state {s}"))),
                };
            }
            self.lost += self.state.catch_up(segs);
            let l = self.ring.layout;
            let rec = l.record_of(self.state.next_seg());
            let r = &self.ring.region;
            let seq = r.u64_at(rec).load(Ordering::Acquire);
            let start = r.u64_at(rec + 8).load(Ordering::Relaxed);
            let len = r.u64_at(rec + 16).load(Ordering::Relaxed);
            let head = self.seen_head;
            // Overwrite: the record must not have changed while read.
            fence(Ordering::Acquire);
            let seq = if r.u64_at(rec).load(Ordering::Relaxed) == seq {
                seq
            } else {
                0
            };
            let checked = match self.state.check(seq, start, len, head) {
                Ok(c) => c,
                Err(e) => return Err(self.fail(e.to_string())),
            };
            self.state.accept(checked);
            r.u64_at(l.slot(self.slot, C_READ))
                .store(self.state.next_seg(), Ordering::Release);
            match checked {
                Record::Ready(d) => return Ok(Some(d)),
                Record::Lost => self.lost += 1,
            }
        }
    }

    /// Overwrite mode: whether segment `seg` is still whole, after its
    /// bytes were read (the sequence lock's second check). Counts a torn
    /// read.
    pub(crate) fn intact(&self, seg: u64) -> bool {
        let l = self.ring.layout;
        fence(Ordering::Acquire);
        let seq = self
            .ring
            .region
            .u64_at(l.record_of(seg))
            .load(Ordering::Relaxed);
        let ok = seq == stable_seq(seg);
        if !ok {
            self.torn.set(self.torn.get() + 1);
        }
        ok
    }

    /// Returns `len` bytes of credit to the producer.
    pub(crate) fn consume(&mut self, len: u64) -> Result<(), BufferError> {
        let pos = self
            .state
            .consume(len)
            .map_err(|e| BufferError::credit(self.ring.id, e))?;
        let l = self.ring.layout;
        self.ring
            .region
            .u64_at(l.slot(self.slot, C_CONSUMED))
            .store(pos, Ordering::Release);
        self.ring.wake(P_SPACE_FUTEX, P_SPACE_WAITERS);
        Ok(())
    }

    /// Position received up to and consumed up to.
    pub(crate) fn positions(&self) -> (u64, u64) {
        (self.state.consumed_pos(), self.state.received_pos())
    }

    /// Waits for a segment up to `deadline`; checks the producer's
    /// liveness while waiting.
    pub(crate) fn next(
        &mut self,
        deadline: Option<Instant>,
        spin: Duration,
    ) -> Result<Option<Delivered>, BufferError> {
        self.next_or(deadline, spin, LIVENESS, || false)
    }

    /// As [`RingConsumer::next`], but also returns `Ok(None)` as soon as
    /// `also` holds (checked with the ring's own condition; another thread
    /// that makes it true calls [`Ring::poke_data`]), and checks the
    /// producer's liveness only every `every` (where another signal, such
    /// as a socket's end closing the ring, covers a dead peer sooner: an
    /// idle waiter then wakes rarely).
    pub(crate) fn next_or(
        &mut self,
        deadline: Option<Instant>,
        spin: Duration,
        every: Duration,
        mut also: impl FnMut() -> bool,
    ) -> Result<Option<Delivered>, BufferError> {
        let ring = Arc::clone(&self.ring);
        let mut got = None;
        ring.wait(
            P_DATA_FUTEX,
            P_DATA_WAITERS,
            deadline,
            spin,
            every,
            || {
                got = self.try_next()?;
                Ok(got.is_some() || also())
            },
            || {
                if ring.state() == OPEN && !ring.producer_alive() {
                    let (pid, _) = ring.producer;
                    Err(BufferError::PeerDead { id: ring.id, pid })
                } else {
                    Ok(())
                }
            },
        )?;
        Ok(got)
    }

    /// Gives the slot back (idempotent).
    pub(crate) fn detach(&mut self) {
        if !self.closed {
            self.closed = true;
            let l = self.ring.layout;
            self.ring
                .region
                .u32_at(l.slot(self.slot, C_STATE))
                .store(SLOT_FREE, Ordering::Release);
            self.ring.wake(P_SPACE_FUTEX, P_SPACE_WAITERS);
        }
    }
}

impl Drop for RingConsumer {
    fn drop(&mut self) {
        self.detach();
    }
}

/// The producer's one outstanding reservation, writable in place. At most
/// one exists per ring: [`RingProducer::writable`] refuses while one lives.
#[cfg(not(skiff_loom))]
#[derive(Debug)]
pub(crate) struct Writable {
    /// The producer's spare reference (`None` only once given back).
    ring: Option<Arc<Ring>>,
    pub(crate) res: Reservation,
}

#[cfg(not(skiff_loom))]
impl RingProducer {
    /// Whether a [`Writable`] of this ring is alive.
    pub(crate) fn outstanding(&self) -> bool {
        self.ring.live.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Wraps the reservation just made in a [`Writable`] (lends it the
    /// spare reference; a new one only if the last was dropped).
    pub(crate) fn writable(&mut self, res: Reservation) -> Writable {
        debug_assert!(!self.outstanding());
        let ring = self.spare.take().unwrap_or_else(|| Arc::clone(&self.ring));
        ring.live.store(true, std::sync::atomic::Ordering::Release);
        Writable {
            ring: Some(ring),
            res,
        }
    }

    /// Ends `w` and takes its reference back (dropping it works too, at
    /// the cost of a reference-count update or two).
    pub(crate) fn finish(&mut self, mut w: Writable) {
        if let Some(r) = w.ring.take() {
            r.live.store(false, std::sync::atomic::Ordering::Release);
            if Arc::ptr_eq(&r, &self.ring) {
                self.spare = Some(r);
            }
        }
    }
}

#[cfg(not(skiff_loom))]
impl Writable {
    /// The reserved bytes: one slice, or two when the segment wraps.
    pub(crate) fn slices_mut(&mut self) -> (&mut [u8], &mut [u8]) {
        let Some(ring) = &self.ring else {
            return (&mut [], &mut []);
        };
        let [(a, al), (b, bl)] = ring.ranges(self.res.start, self.res.len);
        // SAFETY: this Writable is the only one of its ring (the `live`
        // flag), the producer reserved the range against every consumer's
        // credits (or, in overwrite mode, readers only copy it out under the
        // sequence lock), the two ranges are disjoint (one ring lap at most)
        // and both borrows end with `&mut self`.
        unsafe { (ring.region.bytes_mut(a, al), ring.region.bytes_mut(b, bl)) }
    }

    /// Whether `other` is this writable's ring.
    pub(crate) fn is_of(&self, ring: &Arc<Ring>) -> bool {
        self.ring.as_ref().is_some_and(|r| Arc::ptr_eq(r, ring))
    }
}

#[cfg(not(skiff_loom))]
impl Drop for Writable {
    fn drop(&mut self) {
        if let Some(r) = &self.ring {
            r.live.store(false, std::sync::atomic::Ordering::Release);
        }
    }
}

#[cfg(not(skiff_loom))]
impl RingConsumer {
    /// The bytes of `[start, start+len)` in place (credit flow only).
    ///
    /// Borrowing `self` keeps [`RingConsumer::consume`] (which takes
    /// `&mut self`) from returning the space while the slices live.
    pub(crate) fn slices(&self, start: u64, len: u64) -> Option<(&[u8], &[u8])> {
        let (consumed, received) = self.positions();
        if self.ring.layout.flow != Flow::Credits
            || start < consumed
            || start.checked_add(len).is_none_or(|e| e > received)
        {
            return None;
        }
        let [(a, al), (b, bl)] = self.ring.ranges(start, len);
        // SAFETY: the range is received and not consumed by this slot, so a
        // credit-flow producer does not write it until `consume`, which the
        // shared borrow of `self` rules out while the slices live; the
        // ranges are in bounds (split by the validated geometry).
        unsafe { Some((self.ring.region.bytes(a, al), self.ring.region.bytes(b, bl))) }
    }

    /// The bytes of `[start, start+len)` in place, as a value that keeps
    /// the mapping alive (for `bytes::Bytes::from_owner`): `None` unless
    /// the range is received, not consumed, credit flow and in one piece
    /// (not wrapped).
    ///
    /// # Safety
    /// The caller must not [`RingConsumer::consume`] past `start` while
    /// the returned value (or anything made from it) lives: the node's
    /// `shm://` listener returns the space only when every `Bytes` of the
    /// segment, and of the segments before it, was dropped (its in-order
    /// release queue).
    pub(crate) unsafe fn pin(&self, start: u64, len: u64) -> Option<Pinned> {
        let (consumed, received) = self.positions();
        if self.ring.layout.flow != Flow::Credits
            || start < consumed
            || start.checked_add(len).is_none_or(|e| e > received)
        {
            return None;
        }
        let [(a, al), (_, bl)] = self.ring.ranges(start, len);
        if bl != 0 {
            return None;
        }
        Some(Pinned {
            ring: Arc::clone(&self.ring),
            off: a,
            len: al,
        })
    }

    /// Copies `[start, start+len)` out (any flow); `false` if an overwrite
    /// producer broke the segment's sequence lock meanwhile (counted).
    pub(crate) fn copy(&self, seg: u64, start: u64, len: u64, out: &mut Vec<u8>) -> bool {
        let [(a, al), (b, bl)] = self.ring.ranges(start, len);
        let base = out.len();
        out.resize(base + al + bl, 0);
        self.ring.region.copy_out(a, &mut out[base..base + al]);
        self.ring.region.copy_out(b, &mut out[base + al..]);
        self.ring.layout.flow == Flow::Credits || self.intact(seg)
    }
}

/// A received segment's bytes in a ring's mapping, readable in place for
/// as long as this value lives (it holds the mapping); made by
/// [`RingConsumer::pin`], whose caller promised not to consume them
/// meanwhile.
#[cfg(not(skiff_loom))]
#[derive(Debug)]
pub(crate) struct Pinned {
    ring: Arc<Ring>,
    off: usize,
    len: usize,
}

#[cfg(not(skiff_loom))]
impl AsRef<[u8]> for Pinned {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `RingConsumer::pin` checked the range was received and
        // unconsumed (so a credit-flow producer does not write it) and in
        // bounds of the mapping, which `self.ring` keeps alive; its caller
        // promised not to consume it while this value lives, so no writer
        // can touch the bytes while the slice borrows `self`.
        unsafe { self.ring.region.bytes(self.off, self.len) }
    }
}

/// Single-threaded tests of the ring over an anonymous mapping; they run
/// under miri (`MIRIFLAGS=-Zmiri-disable-isolation cargo +nightly miri
/// test -p skiff --lib shm::ring`), which checks the unsafe accessors.
#[cfg(all(test, not(skiff_loom)))]
mod tests {
    use super::*;

    fn ring(cap: u64, records: u64, flow: Flow) -> Arc<Ring> {
        let layout = Layout::new(cap, records, 2, flow).unwrap();
        Arc::new(Ring::init(
            Region::anonymous(layout.total).unwrap(),
            layout,
            1,
        ))
    }

    #[test]
    fn wrapped_segments_round_trip_in_place() {
        let r = ring(10, 4, Flow::Credits);
        let mut c = RingConsumer::attach(Arc::clone(&r)).unwrap();
        let mut p = RingProducer::new(Arc::clone(&r));
        let mut wrapped = 0;
        for k in 0..8u8 {
            let res = p.try_reserve(4).unwrap();
            let mut w = p.writable(res);
            assert!(p.try_reserve(1).is_err() || p.outstanding());
            let (a, b) = w.slices_mut();
            wrapped += usize::from(!b.is_empty());
            a.fill(k);
            b.fill(k);
            drop(w);
            p.commit(4).unwrap();
            let d = c.try_next().unwrap().unwrap();
            let (a, b) = c.slices(d.start, d.len).unwrap();
            assert_eq!([a, b].concat(), vec![k; 4]);
            assert!(
                c.slices(d.start, d.len + 1).is_none(),
                "past what was received"
            );
            c.consume(4).unwrap();
            assert_eq!(p.poll_delivered().map(|d| d.seg), Some(u64::from(k)));
        }
        assert!(wrapped > 0);
        assert!(c.try_next().unwrap().is_none());
    }

    #[test]
    fn full_ring_refuses_then_recovers() {
        let r = ring(8, 4, Flow::Credits);
        let mut c = RingConsumer::attach(Arc::clone(&r)).unwrap();
        let mut p = RingProducer::new(Arc::clone(&r));
        for _ in 0..2 {
            p.try_reserve(4).unwrap();
            p.commit(4).unwrap();
        }
        assert!(matches!(
            p.try_reserve(1),
            Err(CreditError::WouldBlock { .. })
        ));
        let d = c.try_next().unwrap().unwrap();
        c.consume(d.len).unwrap();
        assert!(p.try_reserve(4).is_ok());
    }

    #[test]
    fn overwrite_copy_detects_torn_reads() {
        let r = ring(8, 4, Flow::Overwrite);
        let mut c = RingConsumer::attach(Arc::clone(&r)).unwrap();
        let mut p = RingProducer::new(Arc::clone(&r));
        let res = p.try_reserve(8).unwrap();
        p.writable(res).slices_mut().0.fill(1);
        p.commit(8).unwrap();
        let d = c.try_next().unwrap().unwrap();
        assert!(c.slices(d.start, d.len).is_none(), "no in-place reads");
        let mut v = Vec::new();
        assert!(c.copy(d.seg, d.start, d.len, &mut v));
        p.try_reserve(8).unwrap();
        v.clear();
        assert!(!c.copy(d.seg, d.start, d.len, &mut v), "lock broken");
        assert_eq!(c.torn.get(), 1);
    }
}
