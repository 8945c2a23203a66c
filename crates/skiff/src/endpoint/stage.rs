//! A tunnel's staging areas, outside the endpoint's core lock: small
//! messages given to [`Tunnel::send`](crate::Tunnel::send) wait in the send
//! stage and move into the association together, under one acquisition of
//! the core lock: at once when nothing is in flight (the sender moves
//! them), when 64 KiB (or a packet's worth, if more) is staged (the sender
//! moves them), when the data in flight is acknowledged (TCP's Nagle rule),
//! on `Tunnel::flush`, a `recv` about to wait, or close. Only while more
//! than a small packet is in flight do they wait for its acknowledgement,
//! which then comes within a round trip; behind a lone small packet (whose
//! acknowledgement the peer may hold back for milliseconds, hoping for a
//! reply to carry it) they leave at the endpoint driver's next wake-up
//! instead (the first one staged asks for it). On
//! the receiving side, `recv` takes every message the core holds for the
//! tunnel at once into the receive stage and serves the following `recv`s
//! from there. A small message then costs its sender and its reader a
//! short lock of their own instead of the core lock (which the driver and
//! the other direction contend for) and the association's work per call.
//!
//! When both ends offered bundles at set-up (every skiff tunnel does; see
//! [`skiff_proto::association::bundle`]), the stage copies each small
//! message, with its length, into a bundle being built, at most one
//! packet's payload long, and a move hands the association one message per
//! bundle instead of one per small message; the receiving association
//! delivers each bundle as one event, and `recv` splits it one message at a
//! time (slices of the bundle's buffer). With a peer that did not offer
//! them, each staged message is one association message as before.
//!
//! What stays as it was: order (staged messages enter the association in
//! the order they were staged, and anything sent another way first moves
//! the stage into the association), boundaries (each staged message is one
//! message for the peer's `recv`, bundled or not), flow control (the stage holds at most about one
//! packet's worth; beyond that `send` waits for the association to take
//! it), and close (the stage moves into the association before its close;
//! while the association has no room the close waits for it).
//!
//! Lock order: a tunnel's `rx`, then the endpoint's core, then the
//! tunnel's `tx`. Whoever holds `tx` takes no other lock.

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use skiff_proto::association::{bundle, Pieces};

/// The send stage; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct SendStage {
    /// Messages staged, oldest first.
    pub(crate) msgs: VecDeque<Bytes>,
    /// Their bytes.
    pub(crate) bytes: usize,
    /// Staged bytes that make the sender move the stage itself (at least a
    /// packet's worth; 0 until the core set it: stage nothing).
    pub(crate) flush_at: usize,
    /// The largest message staged; larger ones go to the association at
    /// once (after the stage).
    pub(crate) small: usize,
    /// The association holds unacknowledged data. Otherwise the sender
    /// moves the stage itself, at once.
    pub(crate) busy: bool,
    /// More than one small packet's worth is unacknowledged: its
    /// acknowledgement comes within a round trip (the receiver holds back
    /// only that of a lone small packet, hoping for a reply to carry it),
    /// and the core moves the stage then. Otherwise the driver is asked to.
    pub(crate) prompt: bool,
    /// The tunnel is closing or ended: nothing more is staged (the sender
    /// goes to the core, which says why).
    pub(crate) shut: bool,
    /// The endpoint's driver was asked to move this stage at its next
    /// wake-up (cleared when the stage moves).
    pub(crate) asked: bool,
    /// Both ends take bundles: small messages are copied into `open`
    /// instead of queued in `msgs` (which then holds only messages staged
    /// before the set-up said so, and goes first).
    pub(crate) bundling: bool,
    /// Longest bundle: what one packet carries as one whole message (and
    /// at most the peer's `max_message`).
    pub(crate) bundle_max: usize,
    /// The bundle being built and how many records it holds. It is the
    /// front of a slab: sealing splits it off (sharing the slab's
    /// allocation), and the next bundle is built in the rest, so a slab's
    /// worth of bundles costs one allocation and one free instead of one
    /// each (which the driver thread, dropping acknowledged bundles, paid
    /// per packet).
    open: BytesMut,
    open_records: usize,
    /// Slabs used up lately, oldest first (each the empty tail left of
    /// one): a slab whose bundles the association has all let go of
    /// (acknowledged) is reclaimed whole for the next, instead of fresh
    /// pages for every slab.
    kept: VecDeque<BytesMut>,
    /// Bundles built, oldest first, with their record counts.
    pub(crate) bundles: VecDeque<(Bytes, usize)>,
}

impl SendStage {
    /// Stages `msg` if it is small and there is room: what the sender does
    /// next, or `None` if it was not staged.
    #[inline]
    pub(crate) fn offer(&mut self, msg: &Bytes) -> Option<Move> {
        if !self.takes(msg.len()) {
            return None;
        }
        if self.bundling {
            self.put(msg);
        } else {
            self.msgs.push_back(msg.clone());
        }
        self.bytes += msg.len();
        Some(self.next_move())
    }

    /// Whether a message of `len` bytes may be staged now.
    #[inline]
    fn takes(&self, len: usize) -> bool {
        !(self.shut
            || len > self.small
            || self.bytes >= self.flush_at
            || (self.bundling && len + bundle::record_overhead(len) > self.bundle_max))
    }

    /// Copies `msg` into the open bundle (sealing it first if it would grow
    /// past `bundle_max`).
    #[inline]
    fn put(&mut self, msg: &[u8]) {
        let need = msg.len() + bundle::record_overhead(msg.len());
        if self.open.len() + need > self.bundle_max {
            self.seal();
        }
        if self.open.capacity() < self.bundle_max {
            self.fresh();
        }
        bundle::put(&mut self.open, msg);
        self.open_records += 1;
    }

    /// Makes `open` (empty) the front of a slab with room for a whole
    /// bundle: the oldest kept slab, if nothing else holds it any more,
    /// else a new one; the used-up slab is kept.
    fn fresh(&mut self) {
        debug_assert!(self.open.is_empty());
        let slab = SLAB_BYTES.max(self.bundle_max);
        let used = std::mem::take(&mut self.open);
        if used.capacity() > 0 || !self.kept.is_empty() {
            // Only a slab's tail is ever here: reclaiming it takes back the
            // slab from its start once every bundle cut from it is gone.
            if self.kept.len() >= (KEPT_BYTES / slab).clamp(4, 64) {
                self.kept.pop_front();
            }
            self.kept.push_back(used);
            if let Some(mut old) = self.kept.pop_front() {
                if old.try_reclaim(slab) {
                    self.open = old;
                    return;
                }
                self.kept.push_front(old);
            }
        }
        self.open = BytesMut::with_capacity(slab);
    }

    /// Closes the open bundle, if any, into `bundles`.
    pub(crate) fn seal(&mut self) {
        if self.open_records > 0 {
            let b = self.open.split().freeze();
            self.bundles.push_back((b, self.open_records));
            self.open_records = 0;
        }
    }

    /// Bytes in bundles, sealed or open (lengths included).
    pub(crate) fn bundled_bytes(&self) -> usize {
        self.open.len() + self.bundles.iter().map(|(b, _)| b.len()).sum::<usize>()
    }

    /// Whether nothing is staged.
    pub(crate) fn is_empty(&self) -> bool {
        self.msgs.is_empty() && self.bundles.is_empty() && self.open_records == 0
    }

    /// What the sender of the message just staged does.
    #[inline]
    fn next_move(&mut self) -> Move {
        if !self.busy || self.bytes >= self.flush_at {
            Move::Now
        } else if self.prompt || self.asked {
            Move::Wait
        } else {
            self.asked = true;
            Move::Ask
        }
    }

    /// [`SendStage::offer`] for a message the caller gives away: what to do
    /// if staged, else the message back.
    #[inline]
    pub(crate) fn offer_owned(&mut self, msg: Bytes) -> Result<Move, Bytes> {
        let len = msg.len();
        if !self.takes(len) {
            return Err(msg);
        }
        if self.bundling {
            self.put(&msg);
        } else {
            self.msgs.push_back(msg);
        }
        self.bytes += len;
        Ok(self.next_move())
    }

    /// Takes every staged message out (on shutdown); how many there were.
    pub(crate) fn clear(&mut self) -> usize {
        let n = self.msgs.len()
            + self.open_records
            + self.bundles.iter().map(|(_, n)| n).sum::<usize>();
        self.msgs.clear();
        self.bundles.clear();
        self.open.clear();
        self.open_records = 0;
        self.bytes = 0;
        n
    }
}

/// Bytes of bundle slabs kept for reuse (see `SendStage::kept`; 4 to 64
/// slabs): about what the association holds unacknowledged.
const KEPT_BYTES: usize = 2 << 20;
/// Bytes of one slab bundles are cut from (at least one whole bundle).
const SLAB_BYTES: usize = 64 << 10;

/// What a sender does after staging a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Move {
    /// Move the stage into the association and send now, on this thread:
    /// nothing is in flight (a lone message, whose latency counts), or a
    /// stage's worth waits.
    Now,
    /// Ask the endpoint's driver to move the stage at its next wake-up
    /// (a lone small packet is in flight, whose acknowledgement the peer
    /// may hold back; what is staged until then leaves together).
    Ask,
    /// Nothing: the acknowledgement of the data in flight is near, or the
    /// driver was asked already.
    Wait,
}

/// What the association delivered to a tunnel: one message, or a bundle
/// of small ones (checked by the association) that `recv` splits.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// One message.
    Whole(Bytes),
    /// A bundle (see [`bundle`]): its messages not yet read.
    Bundle(Bytes),
    /// A message larger than a packet in the pieces it arrived in, joined
    /// by the reader when it takes it (a byte stream copies them out as
    /// they are).
    Pieces(Pieces),
}

impl Inbound {
    /// How many messages it holds.
    pub(crate) fn messages(&self) -> usize {
        match self {
            Inbound::Whole(_) | Inbound::Pieces(_) => 1,
            Inbound::Bundle(b) => bundle::validate(b).unwrap_or(0),
        }
    }
}

/// The receive stage: what `recv` serves without the core lock, and the
/// buffer of the last message in pieces joined there, reused for the next
/// when the application has dropped it (the join is the reader's copy, on
/// its thread; with the buffer reused it costs no allocation and no fresh
/// pages).
#[derive(Debug, Default)]
pub(crate) struct RecvStage {
    /// Taken from the core, oldest first.
    pub(crate) msgs: VecDeque<Inbound>,
    spare: Bytes,
}

impl RecvStage {
    /// The next message: the front one, or the next of the front bundle
    /// (a slice of its buffer).
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<Bytes> {
        loop {
            if let Inbound::Bundle(b) = self.msgs.front_mut()? {
                let m = bundle::split_next(b);
                if b.is_empty() {
                    self.msgs.pop_front();
                }
                if m.is_some() {
                    return m;
                }
            } else {
                match self.msgs.pop_front()? {
                    Inbound::Whole(b) => return Some(b),
                    Inbound::Pieces(p) => return Some(p.join_reusing(&mut self.spare)),
                    Inbound::Bundle(_) => unreachable!("a bundle is split at the front"),
                }
            }
        }
    }

    /// Up to `max` next messages appended to `out`, in order (as many
    /// [`RecvStage::pop`]s under the one lock the caller holds); how many.
    /// A message that came in pieces comes alone (it ends a batch, or is
    /// one): its join reuses the buffer of the last one only once the
    /// caller has dropped that, which a batch of them would prevent.
    pub(crate) fn pop_many(&mut self, out: &mut Vec<Bytes>, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            let pieces = matches!(self.msgs.front(), Some(Inbound::Pieces(_)));
            if pieces && n > 0 {
                break;
            }
            match self.pop() {
                Some(m) => out.push(m),
                None => break,
            }
            n += 1;
            if pieces {
                break;
            }
        }
        n
    }

    /// Up to `max` next messages, in order, each lent to `f` (as many
    /// [`RecvStage::pop`]s, without a `Bytes` each: a message of a bundle
    /// is lent in place, so reading it takes no reference to its buffer,
    /// whose count the receiving driver shares); how many.
    pub(crate) fn pop_each(&mut self, max: usize, f: &mut impl FnMut(&[u8])) -> usize {
        let mut n = 0;
        while n < max {
            match self.msgs.front_mut() {
                None => break,
                Some(Inbound::Bundle(b)) => {
                    while n < max && lend_next(b, f) {
                        n += 1;
                    }
                    if b.is_empty() {
                        self.msgs.pop_front();
                    }
                }
                Some(_) => {
                    let Some(m) = self.pop() else { break };
                    f(&m);
                    n += 1;
                }
            }
        }
        n
    }

    /// The next message as slices appended to `out`: one, or the pieces
    /// it arrived in (not joined); its length.
    pub(crate) fn pop_parts(&mut self, out: &mut Vec<Bytes>) -> Option<usize> {
        if let Some(Inbound::Pieces(_)) = self.msgs.front() {
            let Some(Inbound::Pieces(p)) = self.msgs.pop_front() else {
                unreachable!("the front is pieces")
            };
            let len = p.len();
            out.extend(p.into_parts());
            return Some(len);
        }
        let m = self.pop()?;
        let len = m.len();
        out.push(m);
        Some(len)
    }

    /// The oldest message as it came: a bundle whole, pieces as pieces (a
    /// byte stream copies them out as they are).
    pub(crate) fn pop_inbound(&mut self) -> Option<Inbound> {
        self.msgs.pop_front()
    }

    /// Messages left to read.
    pub(crate) fn messages(&self) -> usize {
        self.msgs.iter().map(Inbound::messages).sum()
    }
}

/// Lends the next record of bundle `b` to `f` and advances past it
/// (moving a pointer: no reference taken); whether there was one.
#[inline]
fn lend_next(b: &mut Bytes, f: &mut impl FnMut(&[u8])) -> bool {
    use bytes::Buf;
    let Some((start, end)) = bundle::next_span(b) else {
        return false;
    };
    f(&b[start..end]);
    b.advance(end);
    true
}

/// Both stages of one tunnel, shared by its handle and the core.
#[derive(Debug, Default)]
pub(crate) struct Stage {
    /// Small messages on their way into the association.
    pub(crate) tx: StageLock<SendStage>,
    /// Messages taken from the core for `recv`, oldest first.
    pub(crate) rx: Mutex<RecvStage>,
}

/// The send stage's lock, taken by the sender once per small message and
/// by the core when it moves the stage. It is released with a plain store
/// where a `Mutex` releases with a second atomic read-modify-write (on x86
/// a locked instruction: with the one that takes the lock, the largest item
/// of a small message's staging), and a waiter does not sleep in the
/// kernel: it spins a little, then yields its CPU to the holder. Every holder
/// keeps it for a short, bounded time (one message's copy, or one move of
/// the stage into the association) and takes no other lock meanwhile.
pub(crate) struct StageLock<T> {
    held: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a `StageGuard`, and `held`
// lets one guard exist at a time (taken with `Acquire`, released with
// `Release`, so each holder sees the writes of the one before): threads
// share `T` one at a time, as through a `Mutex`, for which `T: Send`
// suffices.
unsafe impl<T: Send> Sync for StageLock<T> {}

/// Turns a waiter spins before it yields.
const STAGE_SPINS: u32 = 100;

impl<T> StageLock<T> {
    /// Takes the lock, waiting for the holder.
    #[inline]
    pub(crate) fn lock(&self) -> StageGuard<'_, T> {
        if self
            .held
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        StageGuard {
            lock: self,
            _not_send: PhantomData,
        }
    }

    #[cold]
    fn lock_contended(&self) {
        let mut spins = 0;
        loop {
            while self.held.load(Ordering::Relaxed) {
                if spins < STAGE_SPINS {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if self
                .held
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }
}

impl<T: Default> Default for StageLock<T> {
    fn default() -> Self {
        StageLock {
            held: AtomicBool::new(false),
            value: UnsafeCell::new(T::default()),
        }
    }
}

impl<T> std::fmt::Debug for StageLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StageLock")
            .field("held", &self.held.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Access to a [`StageLock`]'s value; dropping it releases the lock. It is
/// not `Send`, as a `parking_lot` guard is not: a guard held across an
/// `.await` in a spawned task would not compile, where it could otherwise
/// leave another task on the same thread yielding for ever.
pub(crate) struct StageGuard<'a, T> {
    lock: &'a StageLock<T>,
    _not_send: PhantomData<*const ()>,
}

impl<T> Deref for StageGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock (see `StageLock`'s `Sync`), so
        // nothing else reaches the value while the reference lives (it
        // borrows the guard).
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for StageGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; the guard is borrowed mutably, so this is
        // the only reference.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for StageGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.held.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundling() -> SendStage {
        SendStage {
            flush_at: 1 << 20,
            small: 256,
            bundling: true,
            bundle_max: 1000,
            ..SendStage::default()
        }
    }

    #[test]
    fn bundles_are_at_most_bundle_max_and_split_back_in_order() {
        let mut s = bundling();
        let msgs: Vec<Bytes> = (0..300u32)
            .map(|i| Bytes::from(vec![i as u8; (i % 90) as usize]))
            .collect();
        for m in &msgs {
            assert!(s.offer(m).is_some());
        }
        s.seal();
        assert!(s.bundles.len() > 1);
        let mut rx = RecvStage::default();
        for (b, n) in s.bundles.drain(..) {
            assert!(b.len() <= 1000);
            assert_eq!(bundle::validate(&b).unwrap(), n);
            rx.msgs.push_back(Inbound::Bundle(b));
        }
        assert_eq!(rx.messages(), msgs.len());
        let got: Vec<Bytes> = std::iter::from_fn(|| rx.pop()).collect();
        assert_eq!(got, msgs);
    }

    #[test]
    fn the_stage_lock_lets_one_holder_in_at_a_time() {
        // Four threads add to a plain counter under the lock, each also
        // checking that nobody else holds it: every addition lands.
        let lock = std::sync::Arc::new(StageLock::<(u64, bool)>::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut g = lock.lock();
                        assert!(!g.1, "two holders at once");
                        g.1 = true;
                        g.0 += 1;
                        std::hint::spin_loop();
                        g.1 = false;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(lock.lock().0, 80_000);
    }

    /// Seals one bundle of one 246-byte message (248 bytes with its
    /// length); its buffer.
    fn one_bundle(s: &mut SendStage, byte: u8) -> Bytes {
        s.offer(&Bytes::from(vec![byte; 246])).unwrap();
        s.seal();
        s.bundles.pop_front().unwrap().0
    }

    #[test]
    fn bundles_are_cut_from_slabs_and_a_slab_let_go_of_comes_back() {
        let mut s = bundling();
        let first = one_bundle(&mut s, 0);
        let at = first.as_ptr() as usize;
        let in_first = |b: &Bytes| (at..at + SLAB_BYTES).contains(&(b.as_ptr() as usize));
        // Bundles follow each other in one slab until it is used up.
        let mut held = vec![first];
        loop {
            let b = one_bundle(&mut s, held.len() as u8);
            if !in_first(&b) {
                // Every bundle of the first slab still held: a new slab.
                held.push(b);
                break;
            }
            held.push(b);
        }
        // Back to back, until less than a whole bundle (1000) is left.
        assert_eq!(held.len(), (SLAB_BYTES - 1000) / 248 + 2);
        // The first slab's bundles are let go of (acknowledged); the
        // second slab is used up: the first comes back for the third.
        let second = held.pop().unwrap();
        for (i, b) in held.drain(..).enumerate() {
            assert_eq!(bundle::records(b).next().unwrap()[0], i as u8);
        }
        let mut third = None;
        for k in 0..2 * SLAB_BYTES / 248 {
            let b = one_bundle(&mut s, k as u8);
            if in_first(&b) {
                third = Some(b);
                break;
            }
        }
        let third = third.expect("the first slab was not reclaimed");
        assert_eq!(third.as_ptr() as usize, at, "reclaimed from its start");
        assert_eq!(bundle::records(third).count(), 1);
        drop(second);
    }
}
