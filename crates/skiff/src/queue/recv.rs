//! The datagram queue's receive path and its accounting: what the socket
//! holds is read in one `recvmmsg` (or one waiting `recvfrom`), each
//! datagram validated and its messages judged by the loss detector
//! ([`LossDetector`]: lost, recovered, duplicate, stale); everything
//! refused is counted under its reason. Messages are decoded only when
//! popped, straight out of the receive buffer.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use skiff_proto::error::Reason;
use skiff_proto::loss::LossDetector;
use skiff_proto::{wire, Dest, Message, Verdict};

use super::datagram::Inner;
use super::{Drops, QueueConfig, QueueStats};
use crate::udp::{Received, RecvBatch};

/// A received, validated datagram whose messages are handed out one by one,
/// each decoded straight into the caller's hands.
#[derive(Debug)]
pub(super) struct Arrived {
    pub(super) batch: wire::Batch,
    pub(super) from: SocketAddr,
    /// Verdicts per message when the loss detector refused some; empty when
    /// all are delivered (the common case).
    pub(super) verdicts: Vec<Verdict>,
}

/// A stream's key: the address it comes from and the `source` id in its
/// header. With the address in the key, a forger who copies a sender's id
/// from another port starts a stream of its own, never moving the real one.
pub(super) type StreamKey = (SocketAddr, u64);

/// The receive state (`Inner::rx`): the socket's receive buffers, what
/// arrived and is not yet popped, the loss detector and the counters.
#[derive(Debug)]
pub(super) struct Rx {
    pub(super) batch: RecvBatch,
    pub(super) arrived: VecDeque<Arrived>,
    pub(super) loss: LossDetector<StreamKey>,
    pub(super) verdicts: Vec<Verdict>,
    pub(super) stats: QueueStats,
}

impl Rx {
    /// The next received message, if any.
    #[inline]
    pub(super) fn take(&mut self) -> Option<Message> {
        if self.arrived.is_empty() {
            return None;
        }
        self.take_arrived()
    }

    /// `take` when something arrived: out of line, so that the common
    /// check for nothing stays small where it is inlined.
    #[inline(never)]
    fn take_arrived(&mut self) -> Option<Message> {
        loop {
            let a = self.arrived.front_mut()?;
            let index = a.batch.header().count as usize - a.batch.remaining();
            match a.batch.next_from(Some(a.from)) {
                Some(m) => {
                    if a.verdicts
                        .get(index)
                        .is_some_and(|v| *v != Verdict::Deliver)
                    {
                        continue;
                    }
                    return Some(m);
                }
                None => {
                    self.arrived.pop_front();
                }
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.arrived.is_empty()
    }

    /// The receive-side counters, loss included.
    pub(super) fn counters(&self) -> QueueStats {
        let mut s = self.stats.clone();
        let l = self.loss.stats();
        s.lost = l.lost;
        s.recovered = l.recovered;
        s.dropped.duplicate = l.duplicates;
        s.dropped.stale = l.stale;
        s.dropped.far_ahead = l.far_ahead;
        s.dropped.sources_evicted = l.evicted;
        s.dropped.kernel = self.batch.kernel_drops();
        s
    }
}

/// The receive-side counters of [`QueueStats`] as of the last receive,
/// readable without the receive lock: one relaxed store per counter per
/// receive, no lock and no copy on the receive path. Each counter is exact;
/// a reading taken during a store may mix two receives' values.
#[derive(Debug, Default)]
pub(super) struct RxCounters([AtomicU64; RX_COUNTERS]);

const RX_COUNTERS: usize = 17;

impl RxCounters {
    /// The counters of `rx`, in the order `load` reads them; what
    /// [`Rx::counters`] gives, without copying the whole [`QueueStats`].
    fn fields(rx: &Rx) -> [u64; RX_COUNTERS] {
        let (s, l) = (&rx.stats, rx.loss.stats());
        let d = &s.dropped;
        [
            s.recv_messages,
            s.recv_bytes,
            s.recv_batches,
            l.lost,
            l.recovered,
            d.foreign,
            d.version,
            d.kind,
            d.truncated,
            d.malformed,
            d.oversized,
            d.endpoint,
            l.duplicates,
            l.stale,
            rx.batch.kernel_drops(),
            l.evicted,
            l.far_ahead,
        ]
    }

    pub(super) fn store(&self, rx: &Rx) {
        for (a, v) in self.0.iter().zip(RxCounters::fields(rx)) {
            a.store(v, Ordering::Relaxed);
        }
    }

    pub(super) fn load(&self) -> QueueStats {
        // In the order of `fields`.
        let v = self.0.each_ref().map(|a| a.load(Ordering::Relaxed));
        QueueStats {
            recv_messages: v[0],
            recv_bytes: v[1],
            recv_batches: v[2],
            lost: v[3],
            recovered: v[4],
            dropped: Drops {
                foreign: v[5],
                version: v[6],
                kind: v[7],
                truncated: v[8],
                malformed: v[9],
                oversized: v[10],
                endpoint: v[11],
                duplicate: v[12],
                stale: v[13],
                kernel: v[14],
                sources_evicted: v[15],
                far_ahead: v[16],
                ..Drops::default()
            },
            ..QueueStats::default()
        }
    }
}

impl Inner {
    pub(super) fn try_pop(&self) -> Option<Message> {
        let mut rx = self.lock_rx()?;
        if let Some(m) = rx.take() {
            return Some(m);
        }
        let mut m = None;
        let _ = self.fill(&mut rx, None, &mut m);
        m
    }

    /// The receive state, or `None` if another thread is waiting inside the
    /// kernel with it (the non-blocking calls must not wait behind it).
    fn lock_rx(&self) -> Option<parking_lot::MutexGuard<'_, Rx>> {
        if self.waiting.load(Ordering::Relaxed) {
            self.rx.try_lock()
        } else {
            Some(self.rx.lock())
        }
    }

    pub(super) fn pop_many(&self, out: &mut Vec<Message>, max: usize) -> usize {
        if max == 0 {
            return 0;
        }
        let Some(mut rx) = self.lock_rx() else {
            return 0;
        };
        let mut n = 0;
        if rx.is_empty() {
            let mut m = None;
            let _ = self.fill(&mut rx, None, &mut m);
            if let Some(m) = m {
                out.push(m);
                n = 1;
            }
        }
        while n < max {
            let Some(a) = rx.arrived.front_mut() else {
                break;
            };
            if a.verdicts.is_empty() {
                // All delivered: decode straight into `out`.
                n += a.batch.next_into(out, max - n, Some(a.from));
                if a.batch.remaining() == 0 {
                    rx.arrived.pop_front();
                }
            } else {
                let Some(m) = rx.take() else { break };
                out.push(m);
                n += 1;
            }
        }
        n
    }

    /// Reads what the socket holds in one `recvmmsg` and validates it;
    /// with `wait`, first waits up to that long (forever with `Some(None)`)
    /// for one datagram. Call only with nothing left in `rx.arrived`, and
    /// `first` empty: the first message received is put there, for the
    /// caller to hand out (built in place: a message is large); the rest
    /// wait in `rx.arrived`. Returns what the receive call returned.
    pub(super) fn fill(
        &self,
        rx: &mut Rx,
        wait: Option<Option<Duration>>,
        first: &mut Option<Message>,
    ) -> io::Result<usize> {
        debug_assert!(rx.arrived.is_empty() && first.is_none());
        let Rx {
            batch,
            arrived,
            loss,
            verdicts,
            stats,
            ..
        } = rx;
        let got = match wait {
            None => self.socket.recv(batch),
            Some(t) => self.socket.recv_wait(batch, t),
        };
        let received = got?;
        for d in batch.drain() {
            // The first datagram, when it carries one message (a request
            // or a reply): decoded in one pass and handed out directly.
            if first.is_none() && arrived.is_empty() && !d.truncated {
                if let Some(h) = wire::Batch::single_into(&d.data, Some(d.from), first) {
                    let len = d.data.len() as u64;
                    if judge(&self.config, d.from, &h, len, loss, verdicts, stats) == 0 {
                        *first = None;
                    }
                    continue;
                }
            }
            self.admit_received(d, loss, verdicts, stats, arrived);
        }
        self.rx_counters.store(rx);
        if first.is_none() {
            *first = rx.take();
        }
        Ok(received)
    }
}

impl Inner {
    /// Validates what one receive slot holds (a datagram, a GRO run, or a
    /// buffer that may be a run) and queues its messages in `arrived`;
    /// counts what is refused. Kept out of line: the request/reply path
    /// (`fill`'s lone message) stays short, in instructions and in code
    /// the CPU must fetch after each wake-up.
    #[inline(never)]
    fn admit_received(
        &self,
        d: Received,
        loss: &mut LossDetector<StreamKey>,
        verdicts: &mut Vec<Verdict>,
        stats: &mut QueueStats,
        arrived: &mut VecDeque<Arrived>,
    ) {
        if d.truncated {
            stats.dropped.truncated += 1;
            return;
        }
        let from = d.from;
        if d.maybe_run {
            self.accept_maybe_run(from, d.data, loss, verdicts, stats, arrived);
            return;
        }
        for data in d.into_datagrams() {
            if let Some(a) = accept(&self.config, from, data, loss, verdicts, stats) {
                arrived.push_back(a);
            }
        }
    }

    /// A buffer that a waiting receive on a GRO socket took: the kernel
    /// does not say whether it coalesced a run. Most often it did not, and
    /// the buffer is one valid datagram. If it is refused as one, the
    /// batches say where they end (`wire::run_stride`); if not even that,
    /// it is refused whole.
    fn accept_maybe_run(
        &self,
        from: SocketAddr,
        data: Bytes,
        loss: &mut LossDetector<StreamKey>,
        verdicts: &mut Vec<Verdict>,
        stats: &mut QueueStats,
        arrived: &mut VecDeque<Arrived>,
    ) {
        let len = data.len() as u64;
        let (e, data) = match wire::Batch::try_new(data) {
            Ok(b) => {
                arrived.extend(admit(&self.config, from, b, len, loss, verdicts, stats));
                return;
            }
            Err(refused) => refused,
        };
        let Some(stride) = wire::run_stride(&data) else {
            stats.dropped.count_wire(e.reason());
            return;
        };
        let run = Received {
            from,
            data,
            segment_size: Some(stride),
            maybe_run: false,
            truncated: false,
        };
        for data in run.into_datagrams() {
            arrived.extend(accept(&self.config, from, data, loss, verdicts, stats));
        }
    }
}

/// Validates one datagram and judges its messages with the loss detector;
/// counts everything refused.
fn accept(
    config: &QueueConfig,
    from: SocketAddr,
    data: Bytes,
    loss: &mut LossDetector<StreamKey>,
    verdicts: &mut Vec<Verdict>,
    stats: &mut QueueStats,
) -> Option<Arrived> {
    let len = data.len() as u64;
    match wire::Batch::new(data) {
        Ok(b) => admit(config, from, b, len, loss, verdicts, stats),
        Err(e) => {
            stats.dropped.count_wire(e.reason());
            None
        }
    }
}

/// Judges the messages of a valid datagram of `len` bytes with the loss
/// detector; counts what is refused.
fn admit(
    config: &QueueConfig,
    from: SocketAddr,
    batch: wire::Batch,
    len: u64,
    loss: &mut LossDetector<StreamKey>,
    verdicts: &mut Vec<Verdict>,
    stats: &mut QueueStats,
) -> Option<Arrived> {
    if judge(config, from, batch.header(), len, loss, verdicts, stats) == 0 {
        return None;
    }
    Some(Arrived {
        batch,
        from,
        verdicts: std::mem::take(verdicts),
    })
}

/// Judges the messages of a valid datagram of `len` bytes with header `h`
/// from `from`: its endpoint, then each message with the loss detector
/// (the stream keyed by `from` and the header's source id), leaving the
/// verdicts in `verdicts` (empty when all are delivered). Counts what is
/// refused; returns how many messages are delivered.
#[inline]
fn judge(
    config: &QueueConfig,
    from: SocketAddr,
    h: &wire::Header,
    len: u64,
    loss: &mut LossDetector<StreamKey>,
    verdicts: &mut Vec<Verdict>,
    stats: &mut QueueStats,
) -> u64 {
    if h.endpoint != config.endpoint && h.endpoint != Dest::ANY {
        stats.dropped.endpoint += 1;
        return 0;
    }
    let count = u64::from(h.count);
    // The clock is read only for a number too far from its stream's window.
    let delivered = if loss.check_run((from, h.source), h.base_seq, count, verdicts, Instant::now) {
        verdicts.clear();
        count
    } else {
        verdicts.iter().filter(|v| **v == Verdict::Deliver).count() as u64
    };
    stats.recv_messages += delivered;
    stats.recv_batches += 1;
    stats.recv_bytes += len;
    delivered
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `stats` reads while a pop holds the receive state is what
    /// `Rx::counters` gives, field for field.
    #[test]
    fn published_counters_are_the_receive_counters() {
        let mut rx = Rx {
            batch: RecvBatch::new(1, 64),
            arrived: VecDeque::new(),
            loss: LossDetector::new(8),
            verdicts: Vec::new(),
            stats: QueueStats::default(),
        };
        let s = &mut rx.stats;
        (s.recv_messages, s.recv_bytes, s.recv_batches) = (11, 12, 13);
        let d = &mut s.dropped;
        (d.foreign, d.version, d.kind, d.truncated) = (21, 22, 23, 24);
        (d.malformed, d.oversized, d.endpoint) = (25, 26, 27);
        // A gap of 5 (lost), then a duplicate.
        let mut v = Vec::new();
        let key = ("127.0.0.1:9".parse().unwrap(), 7);
        assert!(rx.loss.check_run(key, 5, 1, &mut v, Instant::now));
        assert!(!rx.loss.check_run(key, 5, 1, &mut v, Instant::now));
        assert!(!rx.loss.check_run(key, 1 << 40, 1, &mut v, Instant::now));
        let published = RxCounters::default();
        published.store(&rx);
        let want = rx.counters();
        assert_eq!(
            (want.lost, want.dropped.duplicate, want.dropped.far_ahead),
            (5, 1, 1)
        );
        assert_eq!(published.load(), want);
    }
}
