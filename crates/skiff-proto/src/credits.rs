//! Credits and ring bookkeeping for RocketBufs buffers, without I/O.
//!
//! A RocketBufs buffer is a circular byte region with one producer and one
//! or more consumers. Positions are byte counts since the buffer was
//! created (`u64`, never wrapping in practice); the byte at position `p`
//! lives at offset `p % capacity`. Each delivered *segment* also gets a
//! segment number `k` (0, 1, 2, …) and a record slot `k % records`.
//!
//! This module owns the arithmetic every transport shares and that must be
//! right before any memory is touched:
//!
//! - [`Geometry`]: capacity and record count, validated once; splitting a
//!   segment that wraps around into two ranges.
//! - [`Producer`]: the producer's side: reserving a segment against the
//!   consumers' credits ([`Flow::Credits`]) or over the oldest data
//!   ([`Flow::Overwrite`], which names the segments it destroys so their
//!   sequence locks can be broken first), committing it, and reporting
//!   which segments reached every consumer.
//! - [`Consumer`]: the consumer's side: checking a segment record read from
//!   (possibly hostile) shared memory before it is used, and byte-granular
//!   `consumed` accounting.
//!
//! Sequence-lock values: a record of segment `k` holds `2k + 2` once the
//! segment is complete ([`stable_seq`]) and `2k + 1` while it is being
//! written or after it was overwritten ([`broken_seq`]); any other value
//! means the slot belongs to another segment. A reader accepts a segment
//! only if it sees the stable value before *and* after reading the bytes.
//!
//! Nothing here knows about memory maps, sockets or threads.

use std::collections::VecDeque;
use std::ops::Range;

/// How a buffer treats a producer that is faster than its consumers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flow {
    /// Credit flow control: space is reused only after every consumer has
    /// consumed it; a producer without space gets "would block" or waits.
    Credits,
    /// No flow control: the producer never waits and overwrites the oldest
    /// segments; readers detect overwritten (torn) data by sequence lock.
    Overwrite,
}

impl Flow {
    /// The code stored in a shared header.
    pub fn code(self) -> u32 {
        match self {
            Flow::Credits => 1,
            Flow::Overwrite => 2,
        }
    }

    /// The flow of a header code; `None` for an unknown one.
    pub fn from_code(code: u32) -> Option<Flow> {
        match code {
            1 => Some(Flow::Credits),
            2 => Some(Flow::Overwrite),
            _ => None,
        }
    }
}

/// The sequence-lock value of a complete segment `seg`.
pub fn stable_seq(seg: u64) -> u64 {
    seg.wrapping_mul(2).wrapping_add(2)
}

/// The sequence-lock value of segment `seg` while written or once
/// overwritten.
pub fn broken_seq(seg: u64) -> u64 {
    seg.wrapping_mul(2).wrapping_add(1)
}

/// Why a geometry or a request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CreditError {
    /// The capacity or record count is zero or too large.
    #[error("buffer geometry is invalid: {0}")]
    Geometry(&'static str),
    /// A segment can never fit.
    #[error("a segment of {len} bytes is larger than the buffer ({capacity} bytes); request at most {capacity} bytes or create a larger buffer")]
    TooLarge {
        /// Bytes requested.
        len: u64,
        /// The buffer's capacity, the limit.
        capacity: u64,
    },
    /// Not enough credit now; retry after consumers consume.
    #[error("buffer full: {len} bytes requested, {free} free until subscribers consume")]
    WouldBlock {
        /// Bytes requested.
        len: u64,
        /// Bytes free now.
        free: u64,
    },
    /// Every record slot holds a segment not yet read by some consumer.
    #[error("all {records} segment records are in use until subscribers read them")]
    NoRecord {
        /// Record slots of the buffer.
        records: u64,
    },
    /// A segment is already reserved and not yet delivered.
    #[error("a segment of this buffer is already outstanding; deliver it first")]
    Outstanding,
    /// `deliver` with more bytes than reserved.
    #[error("delivered {used} bytes of a {len}-byte segment")]
    Overused {
        /// Bytes claimed.
        used: u64,
        /// Bytes reserved.
        len: u64,
    },
    /// `consumed` with more bytes than received.
    #[error("consumed {len} bytes but only {unconsumed} are received and not yet consumed")]
    OverConsumed {
        /// Bytes claimed.
        len: u64,
        /// Bytes available to consume.
        unconsumed: u64,
    },
}

/// Why a value read from shared memory is refused: the peer (or whoever
/// wrote the memory) is at fault, and the buffer should be closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Corrupt {
    /// A position moved backwards or ahead of what was published.
    #[error("{what} is {value}, outside the valid range {min}..={max}")]
    OutOfRange {
        /// Which value.
        what: &'static str,
        /// The value read.
        value: u64,
        /// Smallest valid value.
        min: u64,
        /// Largest valid value.
        max: u64,
    },
}

/// Capacity and record count of a buffer, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    capacity: u64,
    records: u64,
}

/// Largest data capacity accepted: RocketBufs' 32-bit size field, less
/// one value (`u32::MAX`) that transports may reserve for control frames.
pub const MAX_CAPACITY: u64 = u32::MAX as u64 - 1;
/// Largest record count accepted.
pub const MAX_RECORDS: u64 = 1 << 24;

impl Geometry {
    /// A geometry of `capacity` data bytes and `records` segment records.
    pub fn new(capacity: u64, records: u64) -> Result<Geometry, CreditError> {
        if capacity == 0 || capacity > MAX_CAPACITY {
            return Err(CreditError::Geometry(
                "capacity must be 1..=4294967294 bytes",
            ));
        }
        if records == 0 || records > MAX_RECORDS {
            return Err(CreditError::Geometry("records must be 1..=16777216"));
        }
        Ok(Geometry { capacity, records })
    }

    /// Data bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Record slots.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// The record slot of segment `seg`.
    pub fn slot(&self, seg: u64) -> usize {
        (seg % self.records) as usize
    }

    /// The data ranges of `len` bytes from position `pos`: the second is
    /// empty unless the segment wraps around. `len` must be at most the
    /// capacity (checked: longer is clamped so ranges stay in bounds).
    pub fn split(&self, pos: u64, len: u64) -> (Range<usize>, Range<usize>) {
        let len = len.min(self.capacity);
        let off = pos % self.capacity;
        let first = len.min(self.capacity - off);
        let a = off as usize..(off + first) as usize;
        let b = 0..(len - first) as usize;
        (a, b)
    }
}

/// A reserved, not yet delivered segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// Its segment number.
    pub seg: u64,
    /// Its first byte's position.
    pub start: u64,
    /// Bytes reserved.
    pub len: u64,
}

/// A segment that reached every consumer (all consumed it), or in
/// overwrite mode was published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    /// Segment number.
    pub seg: u64,
    /// First byte's position.
    pub start: u64,
    /// Length.
    pub len: u64,
}

/// The producer's bookkeeping for one buffer.
///
/// Order of use: [`Producer::reserve`] (with the slowest consumer's
/// positions), then [`Producer::overwritten`] in overwrite mode (break those
/// records' sequence locks before touching the bytes), then the bytes are
/// written, then [`Producer::commit`]. [`Producer::poll_delivered`] reports
/// segments every consumer has consumed.
#[derive(Debug, Clone)]
pub struct Producer {
    geom: Geometry,
    flow: Flow,
    head: u64,
    next_seg: u64,
    reserved: Option<Reservation>,
    /// Published segments not yet reported delivered (credits) or not yet
    /// overwritten (overwrite), oldest first.
    live: VecDeque<Delivered>,
    /// Published, not yet reported delivered (overwrite mode reports at
    /// commit).
    pending: VecDeque<Delivered>,
    doomed: Vec<u64>,
}

/// The slowest consumer's progress, as the producer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slowest {
    /// Smallest consumed byte position.
    pub consumed: u64,
    /// Smallest count of segment records read.
    pub records_read: u64,
}

impl Producer {
    /// A producer at position 0.
    pub fn new(geom: Geometry, flow: Flow) -> Producer {
        Producer {
            geom,
            flow,
            head: 0,
            next_seg: 0,
            reserved: None,
            live: VecDeque::new(),
            pending: VecDeque::new(),
            doomed: Vec::new(),
        }
    }

    /// The geometry.
    pub fn geometry(&self) -> Geometry {
        self.geom
    }

    /// The flow mode.
    pub fn flow(&self) -> Flow {
        self.flow
    }

    /// Position after the last published byte.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// Segments published.
    pub fn segments(&self) -> u64 {
        self.next_seg
    }

    /// Bytes free for a new segment given the slowest consumer (`None`: no
    /// consumers, everything is free).
    pub fn free(&self, slowest: Option<Slowest>) -> u64 {
        match (self.flow, slowest) {
            (Flow::Overwrite, _) | (_, None) => self.geom.capacity,
            (Flow::Credits, Some(s)) => {
                let used = self.head.saturating_sub(s.consumed);
                self.geom.capacity.saturating_sub(used)
            }
        }
    }

    /// Checks a consumer's published progress against what was published:
    /// a position beyond the head or behind the oldest kept data is
    /// corrupt.
    pub fn check_consumer(&self, consumed: u64, records_read: u64) -> Result<Slowest, Corrupt> {
        let min = self.head.saturating_sub(self.geom.capacity);
        if consumed < min || consumed > self.head {
            return Err(Corrupt::OutOfRange {
                what: "consumer position",
                value: consumed,
                min,
                max: self.head,
            });
        }
        let rmin = self.next_seg.saturating_sub(self.geom.records);
        if records_read < rmin || records_read > self.next_seg {
            return Err(Corrupt::OutOfRange {
                what: "consumer record count",
                value: records_read,
                min: rmin,
                max: self.next_seg,
            });
        }
        Ok(Slowest {
            consumed,
            records_read,
        })
    }

    /// Reserves `len` bytes. In credit mode fails with
    /// [`CreditError::WouldBlock`] or [`CreditError::NoRecord`] until the
    /// slowest consumer makes room.
    pub fn reserve(
        &mut self,
        len: u64,
        slowest: Option<Slowest>,
    ) -> Result<Reservation, CreditError> {
        if self.reserved.is_some() {
            return Err(CreditError::Outstanding);
        }
        if len > self.geom.capacity {
            return Err(CreditError::TooLarge {
                len,
                capacity: self.geom.capacity,
            });
        }
        self.doomed.clear();
        match self.flow {
            Flow::Credits => {
                let free = self.free(slowest);
                if len > free {
                    return Err(CreditError::WouldBlock { len, free });
                }
                if let Some(s) = slowest {
                    if self.next_seg - s.records_read.min(self.next_seg) >= self.geom.records {
                        return Err(CreditError::NoRecord {
                            records: self.geom.records,
                        });
                    }
                }
            }
            Flow::Overwrite => {
                // Segments whose bytes overlap the new range die, and so
                // does the one whose record slot is reused.
                let end = self.head + len;
                let reused = self.next_seg.checked_sub(self.geom.records);
                while let Some(s) = self.live.front() {
                    let overlapped = s.start + s.len + self.geom.capacity > self.head
                        && s.start + self.geom.capacity < end;
                    let recycled = reused.is_some_and(|r| s.seg <= r);
                    if overlapped || recycled {
                        self.doomed.push(s.seg);
                        self.live.pop_front();
                    } else {
                        break;
                    }
                }
            }
        }
        let r = Reservation {
            seg: self.next_seg,
            start: self.head,
            len,
        };
        self.reserved = Some(r);
        Ok(r)
    }

    /// Overwrite mode: the segments the current reservation destroys; their
    /// records must read [`broken_seq`] before the bytes are written.
    pub fn overwritten(&self) -> &[u64] {
        &self.doomed
    }

    /// Publishes the reservation with `used` of its bytes; returns the
    /// segment as published.
    pub fn commit(&mut self, used: u64) -> Result<Delivered, CreditError> {
        let r = self.reserved.ok_or(CreditError::Outstanding)?;
        if used > r.len {
            return Err(CreditError::Overused { used, len: r.len });
        }
        self.reserved = None;
        let d = Delivered {
            seg: r.seg,
            start: r.start,
            len: used,
        };
        self.head += used;
        self.next_seg += 1;
        match self.flow {
            Flow::Credits => self.live.push_back(d),
            Flow::Overwrite => {
                self.live.push_back(d);
                self.pending.push_back(d);
            }
        }
        Ok(d)
    }

    /// Drops the reservation without publishing.
    pub fn abandon(&mut self) {
        self.reserved = None;
    }

    /// The oldest segment that reached every consumer (credit mode: all
    /// consumed its last byte; no consumers counts as reached), or in
    /// overwrite mode that was published.
    #[must_use]
    pub fn poll_delivered(&mut self, slowest: Option<Slowest>) -> Option<Delivered> {
        match self.flow {
            Flow::Overwrite => self.pending.pop_front(),
            Flow::Credits => {
                let front = *self.live.front()?;
                let reached = slowest.is_none_or(|s| s.consumed >= front.start + front.len);
                if reached {
                    self.live.pop_front();
                    Some(front)
                } else {
                    None
                }
            }
        }
    }
}

/// What a consumer makes of a record it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// Segment `seg` is whole: `start`, `len`.
    Ready(Delivered),
    /// Overwrite mode: this segment is gone (overwritten before it was
    /// read); skip it.
    Lost,
}

/// A consumer's bookkeeping for one buffer.
///
/// Order of use: [`Consumer::check`] a record read from memory (after
/// seeing the segment count), [`Consumer::accept`] it, read the bytes,
/// then [`Consumer::consume`] what was processed.
#[derive(Debug, Clone)]
pub struct Consumer {
    geom: Geometry,
    flow: Flow,
    next_seg: u64,
    /// End of the last accepted segment.
    received: u64,
    consumed: u64,
}

impl Consumer {
    /// A consumer that starts with segment `next_seg` at position `pos`.
    pub fn new(geom: Geometry, flow: Flow, next_seg: u64, pos: u64) -> Consumer {
        Consumer {
            geom,
            flow,
            next_seg,
            received: pos,
            consumed: pos,
        }
    }

    /// The next segment number to read.
    pub fn next_seg(&self) -> u64 {
        self.next_seg
    }

    /// Position consumed up to.
    pub fn consumed_pos(&self) -> u64 {
        self.consumed
    }

    /// Position received up to (end of the last accepted segment).
    pub fn received_pos(&self) -> u64 {
        self.received
    }

    /// Bytes received and not yet consumed.
    pub fn unconsumed(&self) -> u64 {
        self.received - self.consumed
    }

    /// Overwrite mode, when the producer is more than a ring of records
    /// ahead: jumps to the oldest record that can still exist; returns the
    /// segments skipped (lost).
    pub fn catch_up(&mut self, published: u64) -> u64 {
        let oldest = published.saturating_sub(self.geom.records);
        if self.flow == Flow::Overwrite && self.next_seg < oldest {
            let lost = oldest - self.next_seg;
            self.next_seg = oldest;
            lost
        } else {
            0
        }
    }

    /// Checks the record of segment [`Consumer::next_seg`] as read from
    /// memory: `seq` (the sequence lock), `start`, `len`, with `head` the
    /// producer's published position. Every value is validated before the
    /// caller may use it to address memory.
    pub fn check(&self, seq: u64, start: u64, len: u64, head: u64) -> Result<Record, Corrupt> {
        let seg = self.next_seg;
        if seq != stable_seq(seg) {
            return match self.flow {
                // Overwritten (broken lock or a newer segment in the slot).
                Flow::Overwrite => Ok(Record::Lost),
                Flow::Credits => Err(Corrupt::OutOfRange {
                    what: "segment sequence",
                    value: seq,
                    min: stable_seq(seg),
                    max: stable_seq(seg),
                }),
            };
        }
        if len > self.geom.capacity {
            return Err(Corrupt::OutOfRange {
                what: "segment length",
                value: len,
                min: 0,
                max: self.geom.capacity,
            });
        }
        let (min, max) = match self.flow {
            Flow::Credits => (self.received, self.received),
            Flow::Overwrite => (self.received, head.saturating_sub(len)),
        };
        if start < min || start > max || start.checked_add(len).is_none_or(|e| e > head) {
            return Err(Corrupt::OutOfRange {
                what: "segment start",
                value: start,
                min,
                max,
            });
        }
        Ok(Record::Ready(Delivered { seg, start, len }))
    }

    /// Accepts a checked segment: the next one is expected after it.
    pub fn accept(&mut self, rec: Record) {
        if let Record::Ready(d) = rec {
            if self.flow == Flow::Overwrite && d.start > self.received {
                // Skipped bytes of lost segments count as consumed.
                self.consumed = self.consumed.max(d.start);
            }
            self.received = d.start + d.len;
        }
        self.next_seg += 1;
    }

    /// Marks `len` more bytes consumed; returns the new consumed position.
    pub fn consume(&mut self, len: u64) -> Result<u64, CreditError> {
        if len > self.unconsumed() {
            return Err(CreditError::OverConsumed {
                len,
                unconsumed: self.unconsumed(),
            });
        }
        self.consumed += len;
        Ok(self.consumed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geom(c: u64, r: u64) -> Geometry {
        Geometry::new(c, r).unwrap()
    }

    #[test]
    fn split_wraps_into_two_ranges() {
        let g = geom(10, 4);
        assert_eq!(g.split(3, 4), (3..7, 0..0));
        assert_eq!(g.split(8, 4), (8..10, 0..2));
        assert_eq!(g.split(20, 10), (0..10, 0..0));
        assert_eq!(g.split(25, 99), (5..10, 0..5), "clamped to capacity");
        assert!(Geometry::new(0, 1).is_err());
        assert!(Geometry::new(1, 0).is_err());
    }

    #[test]
    fn credits_block_until_consumed_and_report_delivery() {
        let g = geom(16, 8);
        let mut p = Producer::new(g, Flow::Credits);
        let s = |consumed, records_read| {
            Some(Slowest {
                consumed,
                records_read,
            })
        };
        let r = p.reserve(10, s(0, 0)).unwrap();
        assert_eq!(p.reserve(1, s(0, 0)), Err(CreditError::Outstanding));
        p.commit(10).unwrap();
        assert_eq!(r.start, 0);
        assert_eq!(
            p.reserve(7, s(0, 1)),
            Err(CreditError::WouldBlock { len: 7, free: 6 })
        );
        assert!(p.poll_delivered(s(5, 1)).is_none());
        let d = p.poll_delivered(s(10, 1)).unwrap();
        assert_eq!((d.seg, d.len), (0, 10));
        let r = p.reserve(7, s(10, 1)).unwrap();
        assert_eq!(r.start, 10);
        assert!(matches!(
            p.commit(8),
            Err(CreditError::Overused { used: 8, len: 7 })
        ));
        p.commit(3).unwrap();
        assert_eq!(p.head(), 13);
        assert!(matches!(
            p.reserve(17, None),
            Err(CreditError::TooLarge {
                len: 17,
                capacity: 16
            })
        ));
    }

    #[test]
    fn records_are_credits_too() {
        let mut p = Producer::new(geom(100, 2), Flow::Credits);
        let s = Some(Slowest {
            consumed: 0,
            records_read: 0,
        });
        for _ in 0..2 {
            p.reserve(1, s).unwrap();
            p.commit(1).unwrap();
        }
        assert_eq!(p.reserve(1, s), Err(CreditError::NoRecord { records: 2 }));
    }

    #[test]
    fn overwrite_names_the_segments_it_destroys() {
        let mut p = Producer::new(geom(10, 4), Flow::Overwrite);
        let mut doomed = Vec::new();
        for _ in 0..5 {
            p.reserve(4, None).unwrap();
            doomed.push(p.overwritten().to_vec());
            p.commit(4).unwrap();
        }
        // Segment k covers [4k, 4k+4). Reserving segment k overwrites
        // positions [4k-10, 4k-6): segment 2 kills 0, 3 kills 1, 4 kills 2;
        // segment 4 also reuses segment 0's record slot (already dead).
        assert_eq!(doomed, vec![vec![], vec![], vec![0], vec![1], vec![2]]);
        let mut p = Producer::new(geom(100, 2), Flow::Overwrite);
        for k in 0..3 {
            p.reserve(1, None).unwrap();
            assert_eq!(p.overwritten(), if k == 2 { &[0u64][..] } else { &[] });
            p.commit(1).unwrap();
        }
        // Delivered in overwrite mode = published.
        assert_eq!(p.poll_delivered(None).unwrap().seg, 0);
    }

    #[test]
    fn consumer_validates_records() {
        let g = geom(16, 4);
        let mut c = Consumer::new(g, Flow::Credits, 0, 0);
        assert!(c.check(stable_seq(0), 0, 17, 17).is_err(), "too long");
        assert!(c.check(stable_seq(0), 1, 4, 5).is_err(), "gap");
        assert!(c.check(stable_seq(0), 0, 4, 3).is_err(), "past head");
        assert!(c.check(broken_seq(0), 0, 4, 4).is_err(), "credits: torn");
        assert!(c.check(stable_seq(0), u64::MAX, 4, 4).is_err(), "overflow");
        let r = c.check(stable_seq(0), 0, 4, 4).unwrap();
        c.accept(r);
        assert_eq!(c.unconsumed(), 4);
        assert!(c.consume(5).is_err());
        assert_eq!(c.consume(3), Ok(3));
        let mut o = Consumer::new(g, Flow::Overwrite, 0, 0);
        assert_eq!(o.check(broken_seq(0), 0, 4, 4), Ok(Record::Lost));
        o.accept(Record::Lost);
        assert_eq!(o.catch_up(10), 5);
        let r = o.check(stable_seq(6), 20, 4, 40).unwrap();
        assert!(matches!(r, Record::Ready(_)));
        o.accept(r);
        assert_eq!(o.consumed_pos(), 20);
        assert_eq!(o.received_pos(), 24);
    }

    #[test]
    fn producer_rejects_corrupt_consumer_positions() {
        let mut p = Producer::new(geom(16, 4), Flow::Credits);
        p.reserve(8, None).unwrap();
        p.commit(8).unwrap();
        assert!(p.check_consumer(9, 0).is_err());
        assert!(p.check_consumer(4, 2).is_err());
        assert!(p.check_consumer(4, 1).is_ok());
    }

    #[test]
    fn flow_codes_round_trip() {
        for f in [Flow::Credits, Flow::Overwrite] {
            assert_eq!(Flow::from_code(f.code()), Some(f));
        }
        assert_eq!(Flow::from_code(0), None);
    }
}
