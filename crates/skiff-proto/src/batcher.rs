//! CMQ's per-destination batching, sans I/O.
//!
//! The [`Batcher`] owns one queue per destination (address + endpoint id,
//! CMQ's key tuple). A push appends the encoded message to its destination's
//! open batch in O(1). A batch is sealed into a datagram when
//! - its size reaches `qthresh` bytes,
//! - its oldest message is `timeout` old, or
//! - the next message would overflow `max_datagram`.
//!
//! The earliest deadline over all destinations comes from a binary heap with
//! lazy deletion (CMQ's priority search queue): O(log n) per batch, O(1) to
//! read the minimum.
//!
//! **Natural batching** is `timeout = 0`: every batch is due at once, and the
//! driver asks for transmits only when its path is idle, so what queues while
//! a send is in flight leaves together in the next batch.
//!
//! Polling order, as in quinn: call [`Batcher::push`] and
//! [`Batcher::handle_timeout`] as things happen, then drain
//! [`Batcher::poll_transmit`] until `None`, then sleep until
//! [`Batcher::poll_timeout`].

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::error::{Error, LimitError, UsageError};
use crate::message::Message;
use crate::wire::{self, Header, Kind, HEADER_LEN};

/// Where a batch goes: a socket address and an endpoint id (CMQ keys its
/// queues by IP and process id; the endpoint id plays the pid's part).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dest {
    /// The receiving socket.
    pub addr: SocketAddr,
    /// The receiving queue's endpoint id; [`Dest::ANY`] is accepted by every
    /// queue (multicast uses it).
    pub endpoint: u32,
}

impl Dest {
    /// The endpoint id every receiver accepts.
    pub const ANY: u32 = u32::MAX;

    /// A destination accepted by whatever queue is bound at `addr`.
    pub fn any(addr: SocketAddr) -> Dest {
        Dest {
            addr,
            endpoint: Dest::ANY,
        }
    }
}

impl From<SocketAddr> for Dest {
    fn from(addr: SocketAddr) -> Dest {
        Dest::any(addr)
    }
}

/// How a [`Batcher`] batches.
#[derive(Debug, Clone)]
pub struct BatcherConfig {
    /// Seal a batch once it holds this many bytes (header included).
    pub qthresh: usize,
    /// Seal a batch once its oldest message is this old; zero means natural
    /// batching (due at once, sent when the path is idle).
    pub timeout: Duration,
    /// The largest datagram to build, at most [`wire::MAX_DATAGRAM`].
    pub max_datagram: usize,
    /// The most destinations with state at once.
    pub max_destinations: usize,
    /// This sender's identity (random, from the caller). Each destination's
    /// stream gets its own id derived from it, written as the header's
    /// source.
    pub source: u64,
}

impl Default for BatcherConfig {
    fn default() -> Self {
        BatcherConfig {
            qthresh: 1472,
            timeout: Duration::ZERO,
            max_datagram: 1472,
            max_destinations: 1 << 20,
            source: 0,
        }
    }
}

/// A datagram (or several of equal size, for segmentation offload) that the
/// driver should send. Its bytes are at the start of the buffer passed to
/// [`Batcher::poll_transmit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Where to send it.
    pub dest: Dest,
    /// Total bytes.
    pub size: usize,
    /// Size of each datagram when `size` holds several (every one but the
    /// last is exactly this long; padding is zeros); `None` for one.
    pub segment_size: Option<usize>,
    /// Number of datagrams in this transmit.
    pub segments: usize,
    /// Number of messages in this transmit.
    pub messages: usize,
}

/// Counters the batcher keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatcherStats {
    /// Messages accepted by `push`.
    pub messages: u64,
    /// Message bytes accepted (encoded).
    pub bytes: u64,
    /// Datagrams sealed.
    pub batches: u64,
    /// Batches sealed because they reached `qthresh`.
    pub sealed_thresh: u64,
    /// Batches sealed by the timeout.
    pub sealed_timeout: u64,
    /// Batches sealed because the next message would not fit.
    pub sealed_full: u64,
    /// Batches sealed by an explicit flush.
    pub sealed_flush: u64,
}

#[derive(Debug)]
struct Queue {
    dest: Dest,
    /// The open batch: header room, then messages. Empty when no batch is
    /// open.
    buf: Vec<u8>,
    count: u16,
    base_seq: u64,
    next_seq: u64,
    /// Where the last subject sits in `buf`, to send repeats once.
    last_subject: (usize, usize),
    /// Bumped at every seal; stale heap entries carry an older value.
    generation: u32,
    sealed: VecDeque<(Vec<u8>, u16)>,
    in_ready: bool,
    /// The stream id written as the header's source: one per sender and
    /// destination, because each destination's messages are numbered on
    /// their own and a receiver may get several of them (its own endpoint
    /// id and `Dest::ANY`, a multicast group and its unicast address).
    stream: u64,
}

/// CMQ's batcher: see the module documentation.
#[derive(Debug)]
pub struct Batcher {
    config: BatcherConfig,
    index: FxHashMap<Dest, u32>,
    queues: Vec<Queue>,
    /// (deadline, queue, generation), earliest first; stale entries are
    /// skipped when they surface.
    deadlines: BinaryHeap<Reverse<(Instant, u32, u32)>>,
    ready: VecDeque<u32>,
    pool: Vec<Vec<u8>>,
    last: Option<(Dest, u32)>,
    queued: usize,
    stats: BatcherStats,
}

/// Mixes the sender's identity with a destination's index (splitmix64), so
/// that each of a sender's streams has its own well-spread 64-bit id.
fn stream_id(source: u64, index: u32) -> u64 {
    let mut z = source.wrapping_add(
        u64::from(index)
            .wrapping_add(1)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[derive(Clone, Copy)]
enum Why {
    Thresh,
    Timeout,
    Full,
    Flush,
}

impl Batcher {
    /// A batcher with `config`; `max_datagram` is clamped to what UDP allows
    /// and to at least the header plus one small message.
    pub fn new(mut config: BatcherConfig) -> Batcher {
        config.max_datagram = config
            .max_datagram
            .clamp(HEADER_LEN + 16, wire::MAX_DATAGRAM);
        config.qthresh = config.qthresh.clamp(1, config.max_datagram);
        Batcher {
            config,
            index: FxHashMap::default(),
            queues: Vec::new(),
            deadlines: BinaryHeap::new(),
            ready: VecDeque::new(),
            pool: Vec::new(),
            last: None,
            queued: 0,
            stats: BatcherStats::default(),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &BatcherConfig {
        &self.config
    }

    /// Counters so far.
    pub fn stats(&self) -> BatcherStats {
        self.stats
    }

    /// Messages pushed but not yet handed out by `poll_transmit`.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Number of destinations with state.
    pub fn destinations(&self) -> usize {
        self.queues.len()
    }

    /// Whether some sealed batch waits for `poll_transmit`.
    pub fn has_transmit(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Appends `msg` to `dest`'s queue. Never does I/O; fails only if the
    /// message can never be sent as it is or a limit is reached.
    pub fn push(&mut self, now: Instant, dest: Dest, msg: &Message) -> Result<(), Error> {
        self.push_with_clock(|| now, dest, msg)
    }

    /// As [`Batcher::push`], but reads the time only when the push opens a
    /// batch (whose deadline it sets): a caller with a costly clock pays
    /// for it once per batch, not once per message.
    pub fn push_with_clock(
        &mut self,
        now: impl FnOnce() -> Instant,
        dest: Dest,
        msg: &Message,
    ) -> Result<(), Error> {
        wire::check(msg)?;
        let q = self.queue_for(dest)?;
        let max = self.config.max_datagram;
        let subj = msg.subject.as_bytes();
        let queue = &self.queues[q as usize];
        let repeat = queue.count > 0
            && !subj.is_empty()
            && queue.buf.get(queue.last_subject.0..queue.last_subject.1) == Some(subj);
        // A message is accepted only if it fits a datagram alone, subject
        // spelled out: it may have to open the next batch.
        let alone = wire::encoded_len(msg, false);
        if HEADER_LEN + alone > max {
            return Err(self.too_large(alone));
        }
        let mut len = if repeat {
            wire::encoded_len(msg, true)
        } else {
            alone
        };
        let mut repeat = repeat;
        if queue.count > 0
            && (queue.buf.len() + len > max || queue.count as usize == wire::MAX_COUNT)
        {
            self.seal(q, Why::Full);
            repeat = false;
            len = alone;
        }
        let timeout = self.config.timeout;
        let queue = &mut self.queues[q as usize];
        if queue.count == 0 {
            let mut buf = self.pool.pop().unwrap_or_default();
            buf.clear();
            buf.resize(HEADER_LEN, 0);
            queue.buf = buf;
            queue.base_seq = queue.next_seq;
            self.deadlines
                .push(Reverse((now() + timeout, q, queue.generation)));
        }
        let start = queue.buf.len();
        wire::encode_message(&mut queue.buf, msg, repeat);
        if subj.is_empty() {
            // A repeat refers to the previous message's subject only.
            queue.last_subject = (0, 0);
        } else if !repeat {
            // flags byte, then the subject's varint length, then the subject
            let at = queue.buf.len() - len + 1 + crate::varint::len(subj.len() as u64);
            queue.last_subject = (at, at + subj.len());
        }
        debug_assert_eq!(queue.buf.len() - start, len);
        queue.count += 1;
        queue.next_seq += 1;
        self.queued += 1;
        self.stats.messages += 1;
        self.stats.bytes += len as u64;
        if queue.buf.len() >= self.config.qthresh {
            self.seal(q, Why::Thresh);
        }
        Ok(())
    }

    /// Encodes `msg` for `dest` into `buf` (cleared first) as a datagram of
    /// its own, ready to send, if nothing at all is queued: the datagram
    /// `push`, `flush` and `poll_transmit` would make of it together,
    /// numbered the same, without passing through the destination's queue
    /// and the deadline index. The lone message of an idle path under
    /// natural batching goes this way. Returns `Ok(None)` and does nothing
    /// if some message is queued (it must leave first); fails as `push`.
    pub fn push_alone(
        &mut self,
        dest: Dest,
        msg: &Message,
        buf: &mut Vec<u8>,
    ) -> Result<Option<Transmit>, Error> {
        if self.queued > 0 {
            return Ok(None);
        }
        wire::check(msg)?;
        // Encoded first and measured after: one pass over the message. A
        // payload alone too large is refused before it is copied (`check`
        // bounds the rest of the message).
        if HEADER_LEN + msg.payload.len() > self.config.max_datagram {
            return Err(self.too_large(wire::encoded_len(msg, false)));
        }
        buf.clear();
        buf.resize(HEADER_LEN, 0);
        wire::encode_message(buf, msg, false);
        let len = buf.len() - HEADER_LEN;
        if buf.len() > self.config.max_datagram {
            buf.clear();
            return Err(self.too_large(len));
        }
        let q = self.queue_for(dest)?;
        // Nothing queued: every queue is empty, so this message opens no
        // batch and overtakes nothing.
        let queue = &mut self.queues[q as usize];
        debug_assert!(queue.count == 0 && queue.sealed.is_empty());
        Header {
            kind: Kind::Batch,
            source: queue.stream,
            endpoint: queue.dest.endpoint,
            base_seq: queue.next_seq,
            count: 1,
        }
        .write(buf);
        queue.next_seq += 1;
        self.stats.messages += 1;
        self.stats.bytes += len as u64;
        self.stats.batches += 1;
        self.stats.sealed_flush += 1;
        Ok(Some(Transmit {
            dest: queue.dest,
            size: buf.len(),
            segment_size: None,
            segments: 1,
            messages: 1,
        }))
    }

    fn too_large(&self, needed: usize) -> Error {
        let max = self.config.max_datagram;
        UsageError::TooLarge {
            needed,
            limit: max - HEADER_LEN,
            max_datagram: max,
            header: HEADER_LEN,
        }
        .into()
    }

    #[inline]
    fn queue_for(&mut self, dest: Dest) -> Result<u32, Error> {
        match self.last {
            Some((d, q)) if d == dest => Ok(q),
            _ => self.queue_lookup(dest),
        }
    }

    /// `queue_for` of a destination other than the last one: the index,
    /// or a new queue.
    #[inline(never)]
    fn queue_lookup(&mut self, dest: Dest) -> Result<u32, Error> {
        let q = match self.index.get(&dest) {
            Some(&q) => q,
            None => {
                if self.queues.len() >= self.config.max_destinations {
                    return Err(LimitError::Destinations {
                        max: self.config.max_destinations,
                    }
                    .into());
                }
                let q = self.queues.len() as u32;
                self.queues.push(Queue {
                    dest,
                    buf: Vec::new(),
                    count: 0,
                    base_seq: 0,
                    next_seq: 0,
                    last_subject: (0, 0),
                    generation: 0,
                    sealed: VecDeque::new(),
                    in_ready: false,
                    stream: stream_id(self.config.source, q),
                });
                self.index.insert(dest, q);
                q
            }
        };
        self.last = Some((dest, q));
        Ok(q)
    }

    fn seal(&mut self, q: u32, why: Why) {
        let queue = &mut self.queues[q as usize];
        if queue.count == 0 {
            return;
        }
        let mut buf = std::mem::take(&mut queue.buf);
        Header {
            kind: Kind::Batch,
            source: queue.stream,
            endpoint: queue.dest.endpoint,
            base_seq: queue.base_seq,
            count: queue.count,
        }
        .write(&mut buf);
        queue.sealed.push_back((buf, queue.count));
        queue.count = 0;
        queue.generation = queue.generation.wrapping_add(1);
        if !queue.in_ready {
            queue.in_ready = true;
            self.ready.push_back(q);
        }
        self.stats.batches += 1;
        match why {
            Why::Thresh => self.stats.sealed_thresh += 1,
            Why::Timeout => self.stats.sealed_timeout += 1,
            Why::Full => self.stats.sealed_full += 1,
            Why::Flush => self.stats.sealed_flush += 1,
        }
    }

    /// Seals every batch whose oldest message is `timeout` old at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&Reverse((at, q, generation))) = self.deadlines.peek() {
            if at > now {
                break;
            }
            self.deadlines.pop();
            if self.queues[q as usize].generation == generation {
                self.seal(q, Why::Timeout);
            }
        }
    }

    /// Seals every open batch now, whatever its age or size.
    pub fn flush(&mut self) {
        while let Some(Reverse((_, q, generation))) = self.deadlines.pop() {
            if self.queues[q as usize].generation == generation {
                self.seal(q, Why::Flush);
            }
        }
    }

    /// The earliest moment a batch becomes due, if any batch is open.
    #[must_use]
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        while let Some(&Reverse((at, q, generation))) = self.deadlines.peek() {
            if self.queues[q as usize].generation == generation {
                return Some(at);
            }
            self.deadlines.pop();
        }
        None
    }

    /// Writes the next due datagram into `buf` (cleared first). With
    /// `max_segments > 1`, up to that many sealed batches for the same
    /// destination leave together as equal-size segments (the last may be
    /// shorter), for UDP segmentation offload.
    #[must_use]
    pub fn poll_transmit(&mut self, buf: &mut Vec<u8>, max_segments: usize) -> Option<Transmit> {
        let q = self.ready.pop_front()?;
        let queue = &mut self.queues[q as usize];
        let n = queue.sealed.len().min(max_segments.max(1));
        buf.clear();
        let mut messages = 0;
        let segment_size = if n == 1 {
            let (b, count) = queue.sealed.pop_front().expect("ready queue has a batch");
            messages += count as usize;
            buf.extend_from_slice(&b);
            self.pool.push(b);
            None
        } else {
            let seg = queue
                .sealed
                .iter()
                .take(n)
                .map(|(b, _)| b.len())
                .max()
                .unwrap_or(0);
            for i in 0..n {
                let (b, count) = queue.sealed.pop_front().expect("counted above");
                messages += count as usize;
                buf.extend_from_slice(&b);
                if i + 1 < n {
                    buf.resize(buf.len() + seg - b.len(), 0);
                }
                self.pool.push(b);
            }
            Some(seg)
        };
        if queue.sealed.is_empty() {
            queue.in_ready = false;
        } else {
            self.ready.push_back(q);
        }
        self.queued -= messages;
        Some(Transmit {
            dest: queue.dest,
            size: buf.len(),
            segment_size,
            segments: n,
            messages,
        })
    }
}
