//! Receiving: whatever is waiting in one `recvmmsg(2)` into a
//! [`RecvBatch`], whose datagrams come out as zero-copy [`Bytes`] slices
//! of reused slots, with coalesced runs (`UDP_GRO`) and the kernel's drop
//! counter (`SO_RXQ_OVFL`); or, waiting, one plain `recvfrom(2)`.

use std::io;
use std::mem;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use memmap2::MmapMut;
use parking_lot::Mutex;

use super::{RecvBatch, UdpSocket};
use crate::sys;

/// Free slots a [`RecvBatch`] keeps, per slot it receives into, for reuse:
/// a slot whose last slice is dropped comes back to its batch's pool (up
/// to this many per slot; beyond, it is unmapped), so that datagrams land
/// in pages already written, where a fresh mapping's pages are each
/// faulted in and zeroed by the kernel as datagrams land in them: a cost
/// on every byte received. A slot is reused as soon as its own slices are
/// gone, whatever the other slots of its receive hold: a reader lagging
/// behind pins only the slots its unread data lie in.
const KEPT_PER_SLOT: usize = 4;
/// Most slots of a [`RecvBatch`] (`UIO_MAXIOV`).
const MAX_SLOTS: usize = 1024;
/// Largest useful slot: no UDP datagram or GRO run is longer.
const MAX_SLOT: usize = 65_536;

impl UdpSocket {
    /// Receives what is ready now, in one system call, into `batch` (what it
    /// held before is gone); returns how many buffers arrived (a GRO buffer
    /// counts once). `WouldBlock` if nothing was waiting.
    pub fn recv(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        self.recv_inner(batch, false)
    }

    /// Waits up to `timeout` (forever with `None`) for a datagram inside
    /// the receive system call itself (one `recvfrom` taking one datagram;
    /// what else arrived is left for the next `recv`): one system call
    /// where `wait_readable` + `recv` take two, which is what a
    /// request/reply exchange pays per message. `WouldBlock` on timeout,
    /// `Interrupted` if a signal cut the wait short.
    ///
    /// `recvfrom` carries no control messages, which is why it is cheaper
    /// than `recvmsg`, so this receive reports no drop counter (read
    /// [`UdpSocket::kernel_drops`]) and no GRO segment size: with GRO on,
    /// its buffer may be a run of datagrams the kernel coalesced, marked
    /// [`Received::maybe_run`], which only a caller that can tell where its
    /// own datagrams end can split.
    pub fn recv_wait(&self, batch: &mut RecvBatch, timeout: Option<Duration>) -> io::Result<usize> {
        let micros = timeout.map_or(u64::MAX, |d| d.as_micros().min(u64::MAX as u128 - 1) as u64);
        // A plain load first: the common wait repeats the last timeout.
        if self.recv_timeout.load(Ordering::Relaxed) != micros {
            self.recv_timeout.store(micros, Ordering::Relaxed);
            sys::set_recv_timeout(self.socket.as_fd(), timeout)?;
        }
        self.recv_inner(batch, true)
    }

    fn recv_inner(&self, batch: &mut RecvBatch, wait: bool) -> io::Result<usize> {
        batch.count = 0;
        // The slices of the last receive that nobody took go now (and
        // their slots back to the pool).
        batch.filled.clear();
        batch.refill()?;
        let r = sys::recvmmsg(
            self.socket.as_fd(),
            &mut batch.bufs,
            &mut batch.ready,
            &mut batch.meta,
            wait,
        );
        match r {
            Ok(n) if n > 0 => {
                let RecvBatch {
                    meta,
                    drops,
                    last_ovfl,
                    ready,
                    filled,
                    pool,
                    ..
                } = batch;
                for v in meta[..n].iter().filter_map(|m| m.rxq_ovfl) {
                    fold_drops(drops, last_ovfl, v);
                }
                // A waiting receive reads no GRO segment size.
                meta[0].maybe_run = wait && self.gro;
                // Each filled slot becomes the owner of its bytes; the
                // slots after them wait for the next receive.
                for (slot, m) in ready.drain(..n).zip(&meta[..n]) {
                    filled.push(Bytes::from_owner(Filled {
                        slot: Some(slot),
                        len: m.len,
                        pool: pool.clone(),
                    }));
                }
                batch.count = n;
                Ok(n)
            }
            other => other,
        }
    }
}

/// The free slots of one [`RecvBatch`], shared with the owners of the
/// slices handed out of it: a slot whose slices are all dropped comes back
/// here, up to `cap` of them.
#[derive(Debug)]
pub(super) struct SlotPool {
    free: Mutex<Vec<MmapMut>>,
    cap: usize,
}

/// A received slot as the owner of the [`Bytes`] handed out of it: its
/// first `len` bytes; the slot goes back to its pool when the last slice
/// of it is dropped.
struct Filled {
    /// `Some` until dropped.
    slot: Option<MmapMut>,
    len: usize,
    pool: Arc<SlotPool>,
}

impl AsRef<[u8]> for Filled {
    fn as_ref(&self) -> &[u8] {
        match &self.slot {
            Some(s) => &s[..self.len],
            None => &[],
        }
    }
}

impl Drop for Filled {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            let mut free = self.pool.free.lock();
            if free.len() < self.pool.cap {
                free.push(slot);
            }
        }
    }
}

impl RecvBatch {
    /// Buffers for up to `slots` datagrams per `recv` (1 to 1024; 32 is a
    /// good start) of up to `slot_size` bytes each (1 to 65,536). Use 65,536
    /// so nothing is ever truncated, and with GRO, whose runs are up to
    /// 64 KiB.
    pub fn new(slots: usize, slot_size: usize) -> Self {
        let slots = slots.clamp(1, MAX_SLOTS);
        RecvBatch {
            slot_size: slot_size.clamp(1, MAX_SLOT),
            bufs: sys::RecvBufs::new(slots),
            meta: vec![sys::RecvMeta::default(); slots],
            ready: Vec::with_capacity(slots),
            filled: Vec::with_capacity(slots),
            pool: Arc::new(SlotPool {
                free: Mutex::new(Vec::new()),
                cap: slots * KEPT_PER_SLOT,
            }),
            count: 0,
            drops: 0,
            last_ovfl: 0,
        }
    }

    /// Takes out what the last `recv` filled, in arrival order. Items not
    /// taken when the iterator is dropped are discarded.
    pub fn drain(&mut self) -> impl Iterator<Item = Received> + '_ {
        let n = mem::take(&mut self.count);
        self.meta[..n]
            .iter()
            .zip(self.filled.drain(..))
            .map(move |(m, data)| Received {
                from: m.from,
                data,
                segment_size: m.gro_segment,
                maybe_run: m.maybe_run,
                truncated: m.truncated,
            })
    }

    /// Cumulative kernel drops on the socket, as reported by `SO_RXQ_OVFL`
    /// (0 where unsupported). The kernel reports them on the next datagram
    /// it queues, and only to [`UdpSocket::recv`] (a waiting receive reads
    /// no control messages), so drops show up late here; they show up at
    /// once through [`UdpSocket::kernel_drops`].
    ///
    /// The kernel counts dropped *buffers*: with GRO on, one dropped buffer
    /// may have held a run of up to 64 datagrams. So this is exact without
    /// GRO and a lower bound with it; it says that loss happened, and a
    /// sequence-number loss count says how much.
    pub fn kernel_drops(&self) -> u64 {
        self.drops
    }

    /// Gives every slot a buffer of `slot_size` bytes that nobody else
    /// holds: a free one from the pool (the most recently freed first,
    /// whose pages are warm), else a new one. A new slot is anonymous
    /// mapped memory, which the kernel hands out zeroed page by page as
    /// datagrams first land in it, so its cost follows the bytes received,
    /// not its size; a reused one costs nothing.
    fn refill(&mut self) -> io::Result<()> {
        let want = self.meta.len();
        if self.ready.len() >= want {
            return Ok(());
        }
        {
            // The most recently freed go first, where the next datagrams
            // land: their pages are the warmest.
            let mut free = self.pool.free.lock();
            let k = (want - self.ready.len()).min(free.len());
            let from = free.len() - k;
            self.ready.splice(0..0, free.drain(from..).rev());
        }
        while self.ready.len() < want {
            self.ready.push(MmapMut::map_anon(self.slot_size)?);
        }
        Ok(())
    }

    /// Free slots in the pool now (for tests).
    #[cfg(test)]
    pub(super) fn free_slots(&self) -> usize {
        self.pool.free.lock().len()
    }
}

/// Folds a reading `v` of the kernel's 32-bit drop counter into the 64-bit
/// total `drops`, whose last reading was `last`.
pub(super) fn fold_drops(drops: &mut u64, last: &mut u32, v: u32) {
    let d = v.wrapping_sub(*last);
    // Readings only grow; a "decrease" is an older reading, not a wrap.
    if d < 1 << 31 {
        *drops += u64::from(d);
        *last = v;
    }
}

/// One received buffer: a datagram, or with `segment_size` a run of
/// datagrams the kernel coalesced (GRO).
#[derive(Debug, Clone)]
pub struct Received {
    /// The sender.
    pub from: SocketAddr,
    /// The bytes, a slice of the batch's slot (no copy).
    pub data: Bytes,
    /// GRO: `data` holds datagrams of this many bytes each, the last
    /// possibly shorter; see [`Received::datagrams`].
    pub segment_size: Option<usize>,
    /// Received by [`UdpSocket::recv_wait`] on a socket with GRO on, which
    /// reports no segment size: `data` may be a run of datagrams all of one
    /// length but the last, which [`Received::datagrams`] yields as one.
    /// A caller whose datagrams say where they end finds the length and
    /// sets `segment_size`.
    pub maybe_run: bool,
    /// The datagram was longer than the slot and was cut (`MSG_TRUNC`):
    /// `data` is only its beginning.
    pub truncated: bool,
}

impl Received {
    /// The datagrams in `data`: one, or each of a GRO run (zero-copy).
    pub fn datagrams(&self) -> Datagrams {
        self.clone().into_datagrams()
    }

    /// As [`Received::datagrams`], consuming the buffer (one reference
    /// count change fewer per datagram).
    pub fn into_datagrams(self) -> Datagrams {
        Datagrams {
            rest: self.data,
            stride: self.segment_size.unwrap_or(0),
            done: false,
        }
    }
}

/// Iterator over the datagrams of a [`Received`]; see
/// [`Received::datagrams`].
#[derive(Debug, Clone)]
pub struct Datagrams {
    rest: Bytes,
    /// 0: `rest` is one datagram.
    stride: usize,
    done: bool,
}

impl Iterator for Datagrams {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        if self.stride == 0 || self.rest.len() <= self.stride {
            self.done = true;
            return Some(mem::take(&mut self.rest));
        }
        Some(self.rest.split_to(self.stride))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match (self.done, self.stride) {
            (true, _) => 0,
            (false, 0) => 1,
            (false, s) => self.rest.len().div_ceil(s).max(1),
        };
        (n, Some(n))
    }
}

impl ExactSizeIterator for Datagrams {}
