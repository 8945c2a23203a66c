//! Receiving: whatever is waiting in one `recvmmsg(2)` into a
//! [`RecvBatch`], whose datagrams come out as zero-copy [`Bytes`] slices
//! of one arena, with coalesced runs (`UDP_GRO`) and the kernel's drop
//! counter (`SO_RXQ_OVFL`); or, waiting, one plain `recvfrom(2)`.

use std::io;
use std::mem;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::Duration;

use std::sync::Arc;

use bytes::Bytes;
use memmap2::MmapMut;

use super::{RecvBatch, UdpSocket};
use crate::sys;

/// Earlier receive arenas kept for reuse while the application still holds
/// slices of them. An arena forgotten for lack of room here is replaced by
/// a fresh mapping, whose pages the kernel then zeroes as datagrams land
/// in them: a cost on every byte received. A tunnel's unread messages
/// (`tunnel_buffer` plus the association's receive buffer, about 3 MiB)
/// are slices of the arenas of as many receives as they arrived in, 256 KiB
/// or so each under a GRO stream; 16 keeps them all. Only touched pages
/// are resident, so the arenas kept hold about the bytes received into
/// them, not 16 times the batch's size.
const KEPT_ARENAS: usize = 16;
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
        let mut arena = batch.take_arena()?;
        let r = sys::recvmmsg(
            self.socket.as_fd(),
            &mut batch.bufs,
            Arc::get_mut(&mut arena).expect("take_arena hands out a unique arena"),
            batch.slot_size,
            &mut batch.meta,
            wait,
        );
        match r {
            Ok(n) if n > 0 => {
                let RecvBatch {
                    meta,
                    drops,
                    last_ovfl,
                    ..
                } = batch;
                for v in meta[..n].iter().filter_map(|m| m.rxq_ovfl) {
                    fold_drops(drops, last_ovfl, v);
                }
                // A waiting receive reads no GRO segment size.
                meta[0].maybe_run = wait && self.gro;
                batch.filled = Bytes::from_owner(Slices(arena.clone()));
                batch.last = Some(arena);
                batch.count = n;
                Ok(n)
            }
            other => {
                batch.arena = Some(arena);
                other
            }
        }
    }
}

/// A receive arena as the owner of the [`Bytes`] slices handed out of it:
/// while any of them lives, the arena is not reused.
struct Slices(Arc<MmapMut>);

impl AsRef<[u8]> for Slices {
    fn as_ref(&self) -> &[u8] {
        &self.0
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
            arena: None,
            last: None,
            filled: Bytes::new(),
            count: 0,
            kept: Vec::new(),
            drops: 0,
            last_ovfl: 0,
        }
    }

    /// Takes out what the last `recv` filled, in arrival order. Items not
    /// taken when the iterator is dropped are discarded.
    pub fn drain(&mut self) -> impl Iterator<Item = Received> + '_ {
        let n = mem::take(&mut self.count);
        let (filled, slot) = (&self.filled, self.slot_size);
        self.meta[..n].iter().enumerate().map(move |(i, m)| {
            let at = i * slot;
            Received {
                from: m.from,
                data: filled.slice(at..at + m.len),
                segment_size: m.gro_segment,
                maybe_run: m.maybe_run,
                truncated: m.truncated,
            }
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

    /// An arena of `slots × slot_size` bytes that nobody else holds: the
    /// spare one, an earlier one whose slices are all dropped, or a new
    /// one. A new arena is anonymous mapped memory, which the kernel hands
    /// out zeroed page by page as datagrams first land in it, so its cost
    /// follows the bytes received, not its size (64 slots of 64 KiB for
    /// 64 datagrams of 1,472 B touch 64 pages, not 4 MiB); a reused one
    /// costs nothing.
    fn take_arena(&mut self) -> io::Result<Arc<MmapMut>> {
        if let Some(a) = self.arena.take() {
            return Ok(a);
        }
        let total = self.meta.len() * self.slot_size;
        // The slices of the last receive that nobody took go now.
        drop(mem::take(&mut self.filled));
        if let Some(mut last) = self.last.take() {
            // The common case first: the application holds nothing of the
            // last arena any more.
            if Arc::get_mut(&mut last).is_some() {
                return Ok(last);
            }
            self.kept.push(last);
        }
        if let Some(p) = self.kept.iter_mut().position(|a| Arc::get_mut(a).is_some()) {
            return Ok(self.kept.swap_remove(p));
        }
        if self.kept.len() > KEPT_ARENAS {
            // Forget the oldest: its memory goes when its last slice does.
            self.kept.remove(0);
        }
        Ok(Arc::new(MmapMut::map_anon(total)?))
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
    /// The bytes, a slice of the batch's arena (no copy).
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
