//! Where everything lives in a ring's memory, and the check of a header
//! written by another process.
//!
//! ```text
//! offset            size          contents
//! 0                 64            header, written once by the creator before the
//!                                 file is linked into place, then read-only:
//!                                   0 magic "SKFBUF01"   8 version u32  12 flow u32
//!                                  16 capacity u64      24 records u32 28 consumers u32
//!                                  32 buffer id u32     36 producer pid u32
//!                                  40 producer start time u64 (ticks since boot)
//!                                  48 total length u64
//! 64                64            producer line (atomics):
//!                                  64 head u64 (position after the last published byte)
//!                                  72 segments u64 (segments published)
//!                                  80 state u32 (0 open, 1 closed cleanly, 2 corrupt)
//!                                  84 data futex u32    88 data waiters u32
//!                                  92 space futex u32   96 space waiters u32
//! 128               64 × C        consumer slots, one cache line each:
//!                                  +0 state u32 (0 free, 1 joining, 2 attached)
//!                                  +4 pid u32   +8 consumed u64   +16 records read u64
//!                                 +24 start time u64   +32.. reserved
//! 128 + 64C         32 × R        segment records: seq u64 (sequence lock:
//!                                 2k+2 stable, 2k+1 being written/overwritten),
//!                                 start u64, len u64, pad
//! align64(…)        capacity      data, circular
//! ```
//!
//! Sizes and offsets are computed here from the header's numbers, checked
//! against the file's length, and from then on taken from this process's
//! copy, never re-read from the mapping.

use std::ops::Range;

use skiff_proto::credits::{Flow, Geometry, MAX_CAPACITY, MAX_RECORDS};

/// "SKFBUF01", little-endian.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"SKFBUF01");
/// Layout version.
pub(crate) const VERSION: u32 = 1;
/// Most consumer slots per buffer.
pub(crate) const MAX_CONSUMERS: u32 = 1024;

pub(crate) const H_MAGIC: usize = 0;
pub(crate) const H_VERSION: usize = 8;
pub(crate) const H_FLOW: usize = 12;
pub(crate) const H_CAPACITY: usize = 16;
pub(crate) const H_RECORDS: usize = 24;
pub(crate) const H_CONSUMERS: usize = 28;
pub(crate) const H_ID: usize = 32;
pub(crate) const H_PID: usize = 36;
pub(crate) const H_START: usize = 40;
pub(crate) const H_TOTAL: usize = 48;

pub(crate) const P_HEAD: usize = 64;
pub(crate) const P_SEGMENTS: usize = 72;
pub(crate) const P_STATE: usize = 80;
pub(crate) const P_DATA_FUTEX: usize = 84;
pub(crate) const P_DATA_WAITERS: usize = 88;
pub(crate) const P_SPACE_FUTEX: usize = 92;
pub(crate) const P_SPACE_WAITERS: usize = 96;

pub(crate) const C_STATE: usize = 0;
pub(crate) const C_PID: usize = 4;
pub(crate) const C_CONSUMED: usize = 8;
pub(crate) const C_READ: usize = 16;
pub(crate) const C_START: usize = 24;

/// Ring state values.
pub(crate) const OPEN: u32 = 0;
pub(crate) const CLOSED: u32 = 1;
pub(crate) const CORRUPT: u32 = 2;
/// A network transport lost its peer (tunnel or connection failed); set on
/// process-private rings only.
pub(crate) const LOST: u32 = 3;
/// Consumer slot states.
pub(crate) const SLOT_FREE: u32 = 0;
pub(crate) const SLOT_JOINING: u32 = 1;
pub(crate) const SLOT_ATTACHED: u32 = 2;

const SLOTS: usize = 128;
const SLOT_LEN: usize = 64;
const RECORD_LEN: usize = 32;

/// The numbers of a ring, validated, with its offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) geom: Geometry,
    pub(crate) flow: Flow,
    pub(crate) consumers: u32,
    records_off: usize,
    pub(crate) data_off: usize,
    pub(crate) total: usize,
    /// `capacity - 1` and `records - 1` when they are powers of two (the
    /// default geometry): positions and slots by mask instead of division
    /// on the per-segment path. `None` otherwise.
    cap_mask: Option<u64>,
    rec_mask: Option<u64>,
}

/// Why a header is refused (the file is not a ring of this build, or it was
/// corrupted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadHeader(pub(crate) String);

impl Layout {
    /// The layout of a new ring. Errors name the bad number.
    pub(crate) fn new(
        capacity: u64,
        records: u64,
        consumers: u32,
        flow: Flow,
    ) -> Result<Layout, BadHeader> {
        let geom = Geometry::new(capacity, records).map_err(|e| BadHeader(e.to_string()))?;
        if consumers == 0 || consumers > MAX_CONSUMERS {
            return Err(BadHeader(format!(
                "consumer slots must be 1..={MAX_CONSUMERS}, not {consumers}"
            )));
        }
        let records_off = SLOTS + SLOT_LEN * consumers as usize;
        let data_off = (records_off + RECORD_LEN * records as usize).next_multiple_of(64);
        let total = data_off + capacity as usize;
        let mask = |n: u64| n.is_power_of_two().then(|| n - 1);
        Ok(Layout {
            geom,
            flow,
            consumers,
            records_off,
            data_off,
            total,
            cap_mask: mask(capacity),
            rec_mask: mask(records),
        })
    }

    /// Validates the header words of a mapping of `file_len` bytes (read by
    /// the caller from the first 64 bytes) and returns its layout.
    pub(crate) fn check(h: &HeaderWords, file_len: u64) -> Result<Layout, BadHeader> {
        if h.magic != MAGIC {
            return Err(BadHeader(format!("bad magic {:#018x}", h.magic)));
        }
        if h.version != VERSION {
            return Err(BadHeader(format!(
                "layout version {} (this build reads {VERSION})",
                h.version
            )));
        }
        let flow = Flow::from_code(h.flow)
            .ok_or_else(|| BadHeader(format!("unknown flow code {}", h.flow)))?;
        if h.capacity > MAX_CAPACITY || u64::from(h.records) > MAX_RECORDS {
            return Err(BadHeader(format!(
                "capacity {} or records {} over the limit",
                h.capacity, h.records
            )));
        }
        let l = Layout::new(h.capacity, u64::from(h.records), h.consumers, flow)?;
        if h.total != l.total as u64 || file_len < l.total as u64 {
            return Err(BadHeader(format!(
                "header says {} bytes, layout needs {}, file has {file_len}",
                h.total, l.total
            )));
        }
        Ok(l)
    }

    /// Offset of consumer slot `i`'s field `field`.
    pub(crate) fn slot(&self, i: u32, field: usize) -> usize {
        debug_assert!(i < self.consumers);
        SLOTS + SLOT_LEN * i as usize + field
    }

    /// The record slot of segment `seg` (`seg % records`, by mask when it
    /// can).
    #[inline]
    pub(crate) fn slot_of(&self, seg: u64) -> usize {
        match self.rec_mask {
            Some(m) => (seg & m) as usize,
            None => self.geom.slot(seg),
        }
    }

    /// Offset of segment `seg`'s record.
    #[inline]
    pub(crate) fn record_of(&self, seg: u64) -> usize {
        self.record(self.slot_of(seg))
    }

    /// The data ranges of `len` bytes from position `pos` (as
    /// [`Geometry::split`], by mask when the capacity is a power of two):
    /// the second is empty unless the segment wraps.
    #[inline]
    pub(crate) fn split(&self, pos: u64, len: u64) -> (Range<usize>, Range<usize>) {
        match self.cap_mask {
            Some(m) => {
                let cap = m + 1;
                let len = len.min(cap);
                let off = pos & m;
                let first = len.min(cap - off);
                (
                    off as usize..(off + first) as usize,
                    0..(len - first) as usize,
                )
            }
            None => self.geom.split(pos, len),
        }
    }

    /// Offset of record slot `i` (seq; start at +8, len at +16).
    pub(crate) fn record(&self, i: usize) -> usize {
        debug_assert!((i as u64) < self.geom.records());
        self.records_off + RECORD_LEN * i
    }
}

/// The header's numbers as read from memory (before validation).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct HeaderWords {
    pub(crate) magic: u64,
    pub(crate) version: u32,
    pub(crate) flow: u32,
    pub(crate) capacity: u64,
    pub(crate) records: u32,
    pub(crate) consumers: u32,
    pub(crate) id: u32,
    pub(crate) pid: u32,
    pub(crate) start: u64,
    pub(crate) total: u64,
}

impl HeaderWords {
    /// Decodes the first 64 bytes of a ring file.
    pub(crate) fn decode(b: &[u8; 64]) -> HeaderWords {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or_default());
        HeaderWords {
            magic: u64_at(H_MAGIC),
            version: u32_at(H_VERSION),
            flow: u32_at(H_FLOW),
            capacity: u64_at(H_CAPACITY),
            records: u32_at(H_RECORDS),
            consumers: u32_at(H_CONSUMERS),
            id: u32_at(H_ID),
            pid: u32_at(H_PID),
            start: u64_at(H_START),
            total: u64_at(H_TOTAL),
        }
    }

    /// Encodes the header of a new ring.
    pub(crate) fn encode(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[H_MAGIC..H_MAGIC + 8].copy_from_slice(&self.magic.to_le_bytes());
        b[H_VERSION..H_VERSION + 4].copy_from_slice(&self.version.to_le_bytes());
        b[H_FLOW..H_FLOW + 4].copy_from_slice(&self.flow.to_le_bytes());
        b[H_CAPACITY..H_CAPACITY + 8].copy_from_slice(&self.capacity.to_le_bytes());
        b[H_RECORDS..H_RECORDS + 4].copy_from_slice(&self.records.to_le_bytes());
        b[H_CONSUMERS..H_CONSUMERS + 4].copy_from_slice(&self.consumers.to_le_bytes());
        b[H_ID..H_ID + 4].copy_from_slice(&self.id.to_le_bytes());
        b[H_PID..H_PID + 4].copy_from_slice(&self.pid.to_le_bytes());
        b[H_START..H_START + 8].copy_from_slice(&self.start.to_le_bytes());
        b[H_TOTAL..H_TOTAL + 8].copy_from_slice(&self.total.to_le_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(l: &Layout) -> HeaderWords {
        HeaderWords {
            magic: MAGIC,
            version: VERSION,
            flow: l.flow.code(),
            capacity: l.geom.capacity(),
            records: l.geom.records() as u32,
            consumers: l.consumers,
            id: 7,
            pid: 1,
            start: 2,
            total: l.total as u64,
        }
    }

    #[test]
    fn header_round_trips_and_checks() {
        let l = Layout::new(4096, 64, 4, Flow::Credits).unwrap();
        assert_eq!(l.data_off % 64, 0);
        let h = HeaderWords::decode(&words(&l).encode());
        assert_eq!(Layout::check(&h, l.total as u64), Ok(l));
        assert!(Layout::check(&h, l.total as u64 - 1).is_err(), "short file");
    }

    #[test]
    fn masks_agree_with_the_geometry() {
        for (cap, records) in [(4096, 64), (10, 4), (1, 1), (4096, 3), (6, 8)] {
            let l = Layout::new(cap, records, 1, Flow::Credits).unwrap();
            for pos in [0, 1, 5, 9, 4095, 4096, 4097, 1 << 40, u64::MAX - 3] {
                for len in [0, 1, 3, 4, 10, cap, cap + 1] {
                    assert_eq!(
                        l.split(pos, len),
                        l.geom.split(pos, len),
                        "{cap} {pos} {len}"
                    );
                }
                assert_eq!(l.slot_of(pos), l.geom.slot(pos));
            }
        }
    }

    #[test]
    fn every_corrupt_field_is_refused() {
        let l = Layout::new(4096, 64, 4, Flow::Overwrite).unwrap();
        let good = words(&l);
        let bad: Vec<fn(&mut HeaderWords)> = vec![
            |h| h.magic ^= 1,
            |h| h.version = 9,
            |h| h.flow = 0,
            |h| h.capacity = u64::MAX,
            |h| h.capacity = 0,
            |h| h.records = 0,
            |h| h.records = u32::MAX,
            |h| h.consumers = 0,
            |h| h.consumers = u32::MAX,
            |h| h.total += 1,
            |h| h.capacity += 64,
        ];
        for (i, f) in bad.into_iter().enumerate() {
            let mut h = good;
            f(&mut h);
            let h = HeaderWords::decode(&h.encode());
            assert!(Layout::check(&h, 1 << 40).is_err(), "case {i} accepted");
        }
    }
}
