//! The association packet: frame kind 2 of the skiff datagram format.
//!
//! One packet is one self-contained datagram payload. It starts with the
//! same four bytes as every skiff datagram (magic, version, kind), so a
//! receiver demultiplexes on byte 3 (see [`is_association`]); then come a
//! flags byte and the 64-bit key; then the sections whose flag is set, always
//! in the order below.
//!
//! ```text
//!  0       2     3      4       5                              13
//! +-------+-----+------+-------+-------------------------------+
//! | magic | ver | kind | flags |   key (u64 LE, bit 63 = RTN)  |
//! | "SK"  |  1  |  2   |       |                               |
//! +-------+-----+------+-------+-------------------------------+
//!
//! FIRST  (flags & 0x01)  set-up, sent by the initiator, RTN clear
//! +-------------------+------------+------------------------+
//! | service (u32 LE)  | mtu varint | max message varint     |
//! +-------------------+------------+------------------------+
//! ACCEPT (flags & 0x02)  the listener's answer, RTN set
//! +-------------------------------+------------+--------------------+
//! | listener key (u64 LE, RTN 0)  | mtu varint | max message varint |
//! +-------------------------------+------------+--------------------+
//! STATUS (flags & 0x04)  the receiver's window and selective acks
//! +-------------+--------------------+------------------+-------+---------------------------+
//! | rseq varint | alloc-rseq varint  | ack delay varint | n: u8 | n x (gap, len-1) varints  |
//! +-------------+--------------------+------------------+-------+---------------------------+
//!     range i covers [start, end): start = prev_end + 1 + gap, end = start + 1 + (len-1),
//!     prev_end starts at rseq; every end <= alloc. The ack delay is in microseconds.
//! DATA   (flags & 0x08)  one sequence number's worth of data, to the end of the packet
//! +------------+---------+---------+-----+
//! | seq varint | chunk 0 | chunk 1 | ... |
//! +------------+---------+---------+-----+
//! chunk:
//! +--------+-------------------------------+------------+-------+
//! | cflags | total varint (BEGIN, not END) | len varint | bytes |
//! +--------+-------------------------------+------------+-------+
//!     cflags: bit0 BEGIN (first piece of a message), bit1 END (last piece),
//!     bit2 BUNDLE (only with BEGIN: the message is a bundle of small messages,
//!     see `bundle`; sent only to a peer that offered bundles); others 0.
//!     A whole message is BEGIN|END; a fragment that is not the last has len >= 1.
//!
//! flags: 0x01 FIRST  0x02 ACCEPT  0x04 STATUS  0x08 DATA
//!        0x10 SREQ (please answer with a STATUS)
//!        0x20 CLOSE (the DATA's seq is the sender's sentinel: its stream ends there)
//!        0x40 RESET (the association is aborted)   0x80 reserved (0)
//! ```
//!
//! In a FIRST or an ACCEPT packet nothing has been received yet, so its
//! STATUS's ack delay measures nothing: there it carries the sender's
//! feature bits instead (`bundle::FEATURE_BUNDLES`); ends built before
//! features existed send 0 there and ignore the value, so an old peer and
//! a new one agree on no features.
//!
//! A packet without DATA has no bytes after its last section. DATA with no
//! chunks is allowed only with CLOSE. FIRST and ACCEPT exclude each other,
//! FIRST carries no DATA, FIRST has RTN clear and ACCEPT has it set.
//!
//! The decoder is total and bounded: it returns a [`Packet`] or a
//! [`WireError`], never panics, and allocates nothing; the data it hands out
//! are slices of the input [`Bytes`].

use bytes::{Buf, Bytes};

use crate::codec::Reader;
use crate::error::WireError;
use crate::varint;
use crate::wire::{MAGIC, MAX_DATAGRAM, VERSION};

mod decode;
mod encode;

use encode::put_chunk;
pub use encode::Encoder;

/// The frame kind of association packets (byte 3 of the datagram header).
pub const KIND: u8 = 2;
/// Bytes before the first section: magic, version, kind, flags, key.
pub const HEADER_LEN: usize = 13;
/// The return bit in a key: set on packets travelling back to the host that
/// chose the key.
pub const RTN: u64 = 1 << 63;
/// Most selective-ack ranges in one STATUS.
pub const MAX_SACK: usize = 16;
/// The smallest datagram an association works with.
pub const MIN_MTU: usize = 128;
/// The largest message any association accepts, whatever its configuration.
pub const MAX_MESSAGE: u64 = 1 << 30;
/// Longest STATUS section with no ranges (three 10-byte varints and the
/// range count).
pub const STATUS_MIN_LEN: usize = 31;
/// Longest DATA section header (the sequence number).
pub const DATA_HEADER_LEN: usize = varint::MAX_LEN;

const F_FIRST: u8 = 0x01;
const F_ACCEPT: u8 = 0x02;
const F_STATUS: u8 = 0x04;
const F_DATA: u8 = 0x08;
const F_SREQ: u8 = 0x10;
const F_CLOSE: u8 = 0x20;
const F_RESET: u8 = 0x40;
const F_RESERVED: u8 = 0x80;

const C_BEGIN: u8 = 0x01;
const C_END: u8 = 0x02;
const C_BUNDLE: u8 = 0x04;
const C_RESERVED: u8 = 0xf8;

/// Whether `buf` looks like an association packet: skiff's magic, this
/// version and kind [`KIND`]. A cheap test for demultiplexing; the packet
/// may still fail to decode.
pub fn is_association(buf: &[u8]) -> bool {
    buf.len() >= HEADER_LEN && buf[0..2] == MAGIC && buf[2] == VERSION && buf[3] == KIND
}

/// The key of an association packet, read without decoding the rest (for
/// drivers that route packets to associations by key).
pub fn peek_key(buf: &[u8]) -> Option<u64> {
    if !is_association(buf) {
        return None;
    }
    Some(u64::from_le_bytes(buf[5..13].try_into().ok()?))
}

/// The set-up section: explicit addressing, sent only by the initiator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct First {
    /// Which listening context the initiator wants (QMP's service
    /// information; the listener must be configured with the same value).
    pub service: u32,
    /// The largest datagram the initiator accepts.
    pub mtu: u32,
    /// The largest message the initiator accepts.
    pub max_message: u64,
}

/// The listener's answer to a FIRST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accept {
    /// The listener's own key (RTN clear); the initiator sends with it, RTN
    /// set, from now on.
    pub key: u64,
    /// The largest datagram the listener accepts.
    pub mtu: u32,
    /// The largest message the listener accepts.
    pub max_message: u64,
}

/// Selective-ack ranges: up to [`MAX_SACK`] half-open `[start, end)`
/// ranges, ascending and separated by at least one missing number.
#[derive(Clone, Copy, Default)]
pub struct Sack {
    len: u8,
    ranges: [(u64, u64); MAX_SACK],
}

/// Sacks are equal when their ranges are (what lies beyond them, left by
/// an earlier use, is no part of the value).
impl PartialEq for Sack {
    fn eq(&self, other: &Sack) -> bool {
        self.ranges() == other.ranges()
    }
}

impl Eq for Sack {}

impl std::fmt::Debug for Sack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.ranges()).finish()
    }
}

impl Sack {
    /// Appends a range; returns false (and changes nothing) when full.
    pub fn push(&mut self, start: u64, end: u64) -> bool {
        if usize::from(self.len) == MAX_SACK {
            return false;
        }
        self.ranges[usize::from(self.len)] = (start, end);
        self.len += 1;
        true
    }

    /// The ranges, lowest first.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges[..usize::from(self.len)]
    }

    /// Whether there are no ranges.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops ranges beyond the first `n`.
    pub fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n as u8);
    }
}

/// A receiver's status: QMP's `rseq` (one past the last packet received in
/// order) and `alloc` (the sequence number not to be reached), plus
/// selective acks of what arrived above `rseq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Status {
    /// Every sequence number below this has been received.
    pub rseq: u64,
    /// The sender may send sequence numbers below this.
    pub alloc: u64,
    /// Microseconds between the arrival of the highest acknowledged packet
    /// and this status, for the sender's RTT estimate.
    pub ack_delay_us: u64,
    /// Packets received above `rseq`.
    pub sack: Sack,
}

impl Status {
    /// The highest sequence number this status acknowledges, if any.
    pub fn largest(&self) -> Option<u64> {
        match self.sack.ranges().last() {
            Some(&(_, end)) => Some(end - 1),
            None => self.rseq.checked_sub(1),
        }
    }
}

/// One piece of a message in a DATA section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The first piece of its message.
    pub begin: bool,
    /// The last piece of its message.
    pub end: bool,
    /// Its message is a bundle of small messages (only on a first piece).
    pub bundle: bool,
    /// The whole message's length; only for a first piece that is not also
    /// the last (zero otherwise).
    pub total: u64,
    /// The piece's bytes.
    pub bytes: Bytes,
}

impl Chunk {
    /// Bytes this chunk takes encoded.
    pub fn encoded_len(&self) -> usize {
        chunk_overhead(self.begin, self.end, self.total, self.bytes.len()) + self.bytes.len()
    }
}

/// Bytes of framing around a chunk of `len` bytes.
pub fn chunk_overhead(begin: bool, end: bool, total: u64, len: usize) -> usize {
    let t = if begin && !end { varint::len(total) } else { 0 };
    1 + t + varint::len(len as u64)
}

/// The chunks of a DATA section, validated by the decoder; iterate with
/// [`Chunks::iter`].
#[derive(Debug, Clone, Default)]
pub struct Chunks {
    /// The datagram (or encoding) the chunks are in, from offset `start`
    /// to its end: the decoder keeps the datagram it was given, with no
    /// slice made of it.
    buf: Bytes,
    start: usize,
    /// The first chunk's header as the decoder read it, so that iterating
    /// does not read it again (most data packets carry one chunk).
    first: Option<ChunkHead>,
}

/// Chunks are equal when their encodings are (the decoder's note of the
/// first chunk is no part of the value).
impl PartialEq for Chunks {
    fn eq(&self, other: &Chunks) -> bool {
        self.raw() == other.raw()
    }
}

impl Eq for Chunks {}

impl Chunks {
    /// Encodes `chunks` (for tests and tools; the association writes chunks
    /// straight into the datagram).
    pub fn from_chunks(chunks: &[Chunk]) -> Chunks {
        let mut out = Vec::new();
        for c in chunks {
            put_chunk(&mut out, c);
        }
        Chunks {
            buf: out.into(),
            start: 0,
            first: None,
        }
    }

    /// Whether there are no chunks.
    pub fn is_empty(&self) -> bool {
        self.raw().is_empty()
    }

    /// The encoded chunks.
    pub fn raw(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// Takes the one chunk out, when the decoder noted it and there is no
    /// other (the common data packet), leaving no chunks: what
    /// [`Chunks::iter`] would yield, without the iterator, and its bytes
    /// are the datagram's own [`Bytes`] narrowed to them (no reference
    /// count changes hands). `None`, and `self` untouched, otherwise.
    #[inline(always)]
    pub fn take_single(&mut self) -> Option<Chunk> {
        let h = self.first?;
        if h.at + h.len != self.buf.len() - self.start {
            return None;
        }
        let mut bytes = std::mem::take(&mut self.buf);
        bytes.advance(self.start + h.at);
        self.start = 0;
        self.first = None;
        Some(Chunk {
            begin: h.begin,
            end: h.end,
            bundle: h.bundle,
            total: h.total,
            bytes,
        })
    }

    /// The chunks in order. The decoder has checked them, so this yields
    /// every chunk; on chunks not from the decoder it stops at the first
    /// malformed one.
    pub fn iter(&self) -> ChunkIter<'_> {
        ChunkIter {
            chunks: self,
            pos: 0,
        }
    }
}

/// Iterator over [`Chunks`].
#[derive(Debug)]
pub struct ChunkIter<'a> {
    chunks: &'a Chunks,
    pos: usize,
}

impl Iterator for ChunkIter<'_> {
    type Item = Chunk;

    #[inline]
    fn next(&mut self) -> Option<Chunk> {
        let raw = self.chunks.raw();
        if self.pos >= raw.len() {
            return None;
        }
        let h = match self.chunks.first {
            Some(h) if self.pos == 0 => h,
            _ => Reader::at(raw, self.pos).chunk_head().ok()?,
        };
        self.pos = h.at + h.len;
        let at = self.chunks.start + h.at;
        Some(Chunk {
            begin: h.begin,
            end: h.end,
            bundle: h.bundle,
            total: h.total,
            bytes: self.chunks.buf.slice(at..at + h.len),
        })
    }
}

/// A DATA section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Data {
    /// The packet's sequence number.
    pub seq: u64,
    /// Its chunks (none only on a sentinel).
    pub chunks: Chunks,
}

/// A decoded association packet.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Packet {
    /// The key, RTN bit included.
    pub key: u64,
    /// The sender asks for a STATUS in return.
    pub sreq: bool,
    /// The DATA's sequence number is the sender's closing sentinel.
    pub close: bool,
    /// The sender aborted the association.
    pub reset: bool,
    /// Set-up section.
    pub first: Option<First>,
    /// Answer to a set-up.
    pub accept: Option<Accept>,
    /// Window and acknowledgements.
    pub status: Option<Status>,
    /// Data.
    pub data: Option<Data>,
}

/// A chunk's header, read and checked: where its bytes lie in the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ChunkHead {
    begin: bool,
    end: bool,
    bundle: bool,
    total: u64,
    /// Offset of its bytes in the buffer read.
    at: usize,
    len: usize,
}
