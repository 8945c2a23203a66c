//! The datagram queue's send path: `push` copies a message into its
//! destination's batch ([`Batcher`]); sealed batches wait in a send queue
//! (bounded by `max_backlog`, the excess dropped and counted) until one
//! thread at a time hands them to the kernel, many per system call. With
//! natural batching (`timeout=0`) a push on an idle path sends at once on
//! the caller's thread; while a send is in flight, pushes only append and
//! the flusher thread sends what accumulated.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use skiff_proto::{Batcher, Dest, Message};

use super::datagram::Inner;
use super::QueueStats;
use crate::error::Error;
use crate::udp::Outgoing;

/// Datagrams per `sendmmsg`.
const SEND_BATCH: usize = 64;

/// A datagram ready to go.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) dest: SocketAddr,
    pub(super) buf: Vec<u8>,
    pub(super) segment_size: Option<usize>,
    pub(super) segments: usize,
    pub(super) messages: usize,
}

/// The send state (`Inner::tx`): the batcher, the send queue, and what
/// natural batching needs to tell a lone push from a burst.
#[derive(Debug)]
pub(super) struct Tx {
    pub(super) batcher: Batcher,
    pub(super) out: VecDeque<Pending>,
    pub(super) out_bytes: usize,
    pub(super) pool: Vec<Vec<u8>>,
    /// One thread at a time sends, so datagrams to a destination leave in
    /// order; the others only append.
    pub(super) in_flight: bool,
    /// The datagrams of the send in progress (kept for its allocation).
    pub(super) sending: Vec<Pending>,
    /// The buffer of the lone-datagram path (see `Inner::send_alone`).
    pub(super) alone: Vec<u8>,
    pub(super) last_send_end: Option<Instant>,
    /// Smoothed duration of one send system call.
    pub(super) send_cost: Duration,
    pub(super) flusher_parked: bool,
    pub(super) flusher_until: Option<Instant>,
    pub(super) last_error: Option<String>,
    pub(super) stats: QueueStats,
}

impl Inner {
    fn natural(&self) -> bool {
        self.config.timeout.is_zero()
    }

    pub(super) fn push(&self, dest: Dest, msg: &Message) -> Result<(), Error> {
        // The clock is read only when a decision needs it: to date a new
        // batch, or to tell a lone push from a burst.
        let mut clock: Option<Instant> = None;
        let mut now = || *clock.get_or_insert_with(Instant::now);
        let mut tx = self.tx.lock();
        if self.natural() {
            // Send on this thread only if the path is idle: nothing else
            // waits, and either this push answers a message popped since
            // the last send (request/reply: latency matters, and the
            // exchange itself paces the sends), or the application is not
            // pushing faster than sends complete (the time since the last
            // send ended exceeds half a send's duration). Otherwise this is
            // a burst, and the flusher sends what accumulates: batches grow
            // exactly when sending one by one could not keep up.
            let idle = !tx.in_flight && tx.batcher.queued() == 0 && tx.out_bytes == 0;
            // A plain load first: the store (a cache-line write) only when set.
            let reply = idle && self.popped.load(Ordering::Relaxed);
            if reply {
                self.popped.store(false, Ordering::Relaxed);
            }
            let cost = tx.send_cost / 2;
            let burst = idle
                && !reply
                && tx
                    .last_send_end
                    .is_some_and(|t| now().saturating_duration_since(t) < cost);
            if idle && !burst {
                // The message becomes a datagram of its own at once; a
                // reply's send is paced by the exchange: not timed.
                return self.send_alone(tx, dest, msg, !reply);
            }
            // Natural batching never reads a batch's date (nothing waits
            // for a deadline: the flusher seals everything it finds), so a
            // fixed one saves the clock read.
            tx.batcher.push_with_clock(|| self.epoch, dest, msg)?;
            // While a send is in flight, its thread picks this up when the
            // call returns; otherwise the flusher does.
            if !tx.in_flight && tx.flusher_parked {
                tx.flusher_parked = false;
                self.wake.notify_one();
            }
            return Ok(());
        }
        let opened = tx.batcher.queued() == 0;
        tx.batcher.push_with_clock(&mut now, dest, msg)?;
        if tx.in_flight {
            // The thread sending now picks this up when its call returns.
            return Ok(());
        }
        if !tx.batcher.has_transmit() {
            // A new batch has a deadline; the flusher must know if it sleeps
            // longer than that.
            if opened
                && tx
                    .flusher_until
                    .is_none_or(|u| u > now() + self.config.timeout)
            {
                self.wake.notify_one();
            }
            return Ok(());
        }
        self.collect(&mut tx);
        self.drain(tx, false, true);
        Ok(())
    }

    /// Sends `msg` as a datagram of its own on this thread, on an idle
    /// path: no send queue, no pooled buffer, one system call between two
    /// short holds of the lock.
    fn send_alone(
        &self,
        mut tx: parking_lot::MutexGuard<'_, Tx>,
        dest: Dest,
        msg: &Message,
        timed: bool,
    ) -> Result<(), Error> {
        let mut buf = std::mem::take(&mut tx.alone);
        buf.clear();
        let t = match tx.batcher.push_alone(dest, msg, &mut buf) {
            Ok(Some(t)) => t,
            Ok(None) => {
                // Something is queued after all: it leaves first, this
                // after it, through the flusher.
                tx.alone = buf;
                tx.batcher.push_with_clock(|| self.epoch, dest, msg)?;
                if tx.flusher_parked {
                    tx.flusher_parked = false;
                    self.wake.notify_one();
                }
                return Ok(());
            }
            Err(e) => {
                tx.alone = buf;
                return Err(e.into());
            }
        };
        tx.in_flight = true;
        drop(tx);
        let started = timed.then(Instant::now);
        let out = Outgoing {
            dest: t.dest.addr,
            data: &buf,
            segment_size: None,
        };
        let r = match self.socket.send(&[out]) {
            Ok(0) => Err(io::Error::from(io::ErrorKind::WouldBlock)),
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        };
        let ended = started.map(|s| (s, Instant::now()));
        let mut tx = self.tx.lock();
        tx.in_flight = false;
        tx.stats.send_calls += 1;
        if let Some((started, ended)) = ended {
            tx.last_send_end = Some(ended);
            tx.send_cost = (tx.send_cost * 7 + (ended - started)) / 8;
        }
        match r {
            Ok(()) => {
                tx.stats.sent_messages += 1;
                tx.stats.sent_bytes += buf.len() as u64;
                tx.stats.sent_batches += 1;
                tx.alone = buf;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // The flusher retries once the socket has room, ahead of
                // anything pushed meanwhile.
                tx.out_bytes += buf.len();
                tx.out.push_front(Pending {
                    dest: t.dest.addr,
                    buf,
                    segment_size: None,
                    segments: 1,
                    messages: 1,
                });
                self.wake.notify_one();
                return Ok(());
            }
            Err(e) => {
                tx.stats.dropped.send_error += 1;
                tx.last_error = Some(e.to_string());
                tx.alone = buf;
            }
        }
        // What was pushed during the call leaves now.
        if tx.batcher.queued() > 0 || !tx.out.is_empty() {
            tx.batcher.flush();
            self.collect(&mut tx);
            self.drain(tx, false, true);
        }
        Ok(())
    }

    /// Moves sealed batches from the batcher to the send queue.
    pub(super) fn collect(&self, tx: &mut Tx) {
        let segs = self.socket.max_segments().max(1);
        loop {
            let mut buf = tx.pool.pop().unwrap_or_default();
            let Some(t) = tx.batcher.poll_transmit(&mut buf, segs) else {
                tx.pool.push(buf);
                break;
            };
            tx.out_bytes += t.size;
            tx.out.push_back(Pending {
                dest: t.dest.addr,
                buf,
                segment_size: t.segment_size,
                segments: t.segments,
                messages: t.messages,
            });
        }
        self.trim_backlog(tx);
    }

    /// Over the backlog limit, drops the oldest datagrams and counts them.
    fn trim_backlog(&self, tx: &mut Tx) {
        while tx.out_bytes > self.config.max_backlog {
            let Some(p) = tx.out.pop_front() else { break };
            tx.out_bytes -= p.buf.len();
            tx.stats.dropped.backlog += p.messages as u64;
            tx.pool.push(p.buf);
        }
    }

    /// Sends the send queue, releasing the lock during system calls. Only one
    /// thread sends at a time. With `wait`, waits for another sender to
    /// finish rather than leaving the work to it. With `timed`, the calls
    /// are timed for the burst test of natural batching (`send_cost`,
    /// `last_send_end`); a reply's send is not, and reads no clock.
    pub(super) fn drain<'a>(
        &'a self,
        mut tx: parking_lot::MutexGuard<'a, Tx>,
        wait: bool,
        timed: bool,
    ) {
        if tx.in_flight {
            if !wait {
                return;
            }
            while tx.in_flight {
                drop(tx);
                std::thread::yield_now();
                tx = self.tx.lock();
            }
        }
        // Reused between calls: sending allocates nothing.
        let mut batch = std::mem::take(&mut tx.sending);
        while !tx.out.is_empty() {
            tx.in_flight = true;
            let n = tx.out.len().min(SEND_BATCH);
            batch.extend(tx.out.drain(..n));
            drop(tx);
            let started = timed.then(Instant::now);
            let (sent, calls, result) = self.send_pending(&batch);
            let ended = started.map(|s| (s, Instant::now()));
            tx = self.tx.lock();
            tx.in_flight = false;
            tx.stats.send_calls += u64::from(calls);
            if let Some((started, ended)) = ended {
                tx.last_send_end = Some(ended);
                let cost = (ended - started) / calls.max(1);
                tx.send_cost = (tx.send_cost * 7 + cost) / 8;
            }
            let mut rest = batch.drain(..);
            for p in rest.by_ref().take(sent) {
                tx.out_bytes -= p.buf.len();
                tx.stats.sent_messages += p.messages as u64;
                tx.stats.sent_bytes += p.buf.len() as u64;
                tx.stats.sent_batches += p.segments as u64;
                tx.pool.push(p.buf);
            }
            if let Err(e) = result {
                let would_block = e.kind() == io::ErrorKind::WouldBlock;
                if !would_block {
                    // The first datagram was refused (e.g. unreachable or
                    // too big for the path): drop it, count it, go on with
                    // the rest.
                    if let Some(p) = rest.next() {
                        tx.out_bytes -= p.buf.len();
                        tx.stats.dropped.send_error += p.messages as u64;
                        tx.pool.push(p.buf);
                    }
                    tx.last_error = Some(e.to_string());
                }
                // Put the rest back in front, in order.
                for p in rest.rev() {
                    tx.out.push_front(p);
                }
                if would_block {
                    // The flusher retries once the socket has room.
                    tx.sending = batch;
                    self.wake.notify_one();
                    return;
                }
            } else {
                drop(rest);
            }
            if tx.pool.len() > 256 {
                tx.pool.truncate(256);
            }
            // In natural batching, what was pushed during the call leaves now.
            if self.natural() && tx.batcher.queued() > 0 {
                tx.batcher.flush();
                self.collect(&mut tx);
            }
        }
        tx.sending = batch;
    }

    /// Hands `batch` to the kernel without holding the lock; returns how
    /// many datagrams went, the system calls made, and the error that
    /// stopped it, if any.
    fn send_pending(&self, batch: &[Pending]) -> (usize, u32, io::Result<()>) {
        fn outgoing(p: &Pending) -> Outgoing<'_> {
            Outgoing {
                dest: p.dest,
                data: &p.buf,
                segment_size: p.segment_size,
            }
        }
        if let [p] = batch {
            // The lone datagram of a quiet path (a request, a reply).
            return match self.socket.send(&[outgoing(p)]) {
                Ok(0) => (0, 1, Err(io::ErrorKind::WouldBlock.into())),
                Ok(_) => (1, 1, Ok(())),
                Err(e) => (0, 1, Err(e)),
            };
        }
        let mut out: Vec<Outgoing<'_>> = batch.iter().map(outgoing).collect();
        let (mut sent, mut calls) = (0, 0);
        while sent < batch.len() {
            calls += 1;
            match self.socket.send(&out) {
                Ok(0) => return (sent, calls, Err(io::ErrorKind::WouldBlock.into())),
                Ok(k) => {
                    let k = k.min(out.len());
                    sent += k;
                    out.drain(..k);
                }
                Err(e) => return (sent, calls, Err(e)),
            }
        }
        (sent, calls, Ok(()))
    }

    pub(super) fn flusher(&self) {
        let mut tx = self.tx.lock();
        loop {
            let now = Instant::now();
            let stopping = self.shutdown.load(Ordering::Acquire);
            if self.natural() || stopping {
                tx.batcher.flush();
            } else {
                tx.batcher.handle_timeout(now);
            }
            self.collect(&mut tx);
            if !tx.out.is_empty() && !tx.in_flight {
                let before = tx.out.len();
                self.drain(tx, stopping, true);
                tx = self.tx.lock();
                if tx.out.len() < before || tx.out.is_empty() {
                    continue;
                }
                // The socket was full: wait a little before retrying.
                if stopping {
                    return;
                }
                tx.flusher_until = Some(now + Duration::from_micros(200));
                let _ = self.wake.wait_for(&mut tx, Duration::from_micros(200));
                continue;
            }
            if stopping {
                return;
            }
            if self.natural() {
                tx.flusher_parked = true;
                tx.flusher_until = None;
                self.wake.wait(&mut tx);
                tx.flusher_parked = false;
            } else {
                let until = tx.batcher.poll_timeout();
                tx.flusher_until = until;
                tx.flusher_parked = true;
                match until {
                    Some(t) => {
                        let _ = self.wake.wait_until(&mut tx, t);
                    }
                    None => self.wake.wait(&mut tx),
                }
                tx.flusher_parked = false;
            }
        }
    }

    /// Notes that a pop handed out a message (see `popped`).
    pub(super) fn popped(&self) {
        self.popped.store(true, Ordering::Relaxed);
    }
}
