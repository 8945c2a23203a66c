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

use bytes::{Buf, Bytes, BytesMut};

use crate::codec::Reader;
use crate::error::WireError;
use crate::varint;
use crate::wire::{MAGIC, MAX_DATAGRAM, VERSION};

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

impl Packet {
    /// Appends the encoded packet to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut e = Encoder::new(out, self.key);
        if let Some(f) = &self.first {
            e.first(f);
        }
        if let Some(a) = &self.accept {
            e.accept(a);
        }
        if let Some(s) = &self.status {
            e.status(s, usize::MAX);
        }
        if let Some(d) = &self.data {
            e.data(d.seq);
            e.out.extend_from_slice(d.chunks.raw());
        }
        e.sreq(self.sreq);
        e.close(self.close);
        e.reset(self.reset);
    }

    /// Decodes one packet. Total and bounded: any input gives a packet or an
    /// error, nothing is allocated, data are slices of `buf`.
    pub fn decode(buf: &Bytes) -> Result<Packet, WireError> {
        let mut p = Packet::default();
        p.decode_into(buf.clone())?;
        Ok(p)
    }

    /// Decodes one packet into `self`, as [`Packet::decode`] does, reusing
    /// its status in place (a packet is a few hundred bytes: a driver
    /// decodes every packet into the same one instead of moving a fresh
    /// one around), and keeping `buf` for its data (no slice of it is
    /// made). On an error `self` holds no meaning (and no data).
    #[inline(always)]
    pub fn decode_into(&mut self, buf: Bytes) -> Result<(), WireError> {
        if let Some(p) = Plain::read(&buf) {
            self.set_plain(&p, buf);
            return Ok(());
        }
        self.decode_general(buf)
    }

    /// Fills `self` with the plain data packet `p` read from `buf`: what
    /// [`Packet::decode_general`] would leave.
    #[inline(always)]
    fn set_plain(&mut self, p: &Plain, buf: Bytes) {
        self.key = p.key;
        self.sreq = p.sreq;
        self.close = false;
        self.reset = false;
        self.first = None;
        self.accept = None;
        let st = self.status.get_or_insert_with(Status::default);
        st.rseq = p.rseq;
        st.alloc = p.alloc;
        st.ack_delay_us = p.ack_delay_us;
        st.sack.truncate(0);
        let chunks = Chunks {
            buf,
            start: p.start,
            first: Some(p.chunk),
        };
        self.data = Some(Data { seq: p.seq, chunks });
    }

    /// [`Packet::decode_into`] for any packet: every section, every check.
    #[inline(never)]
    pub(crate) fn decode_general(&mut self, buf: Bytes) -> Result<(), WireError> {
        self.data = None;
        let Some(head) = buf.first_chunk::<HEADER_LEN>() else {
            return Err(header_error(&buf));
        };
        if head[0..4] != [MAGIC[0], MAGIC[1], VERSION, KIND] || buf.len() > MAX_DATAGRAM {
            return Err(header_error(&buf));
        }
        let flags = head[4];
        let key = u64::from_le_bytes(head[5..13].try_into().expect("8 bytes"));
        // Every rule between flags involves one of these (a data packet
        // has none of them).
        if flags & (F_RESERVED | F_FIRST | F_ACCEPT | F_CLOSE) != 0 {
            check_flags(flags, key)?;
        }
        let has = |f: u8| flags & f != 0;
        let mut r = Reader::at(&buf[..], HEADER_LEN);
        self.key = key;
        self.sreq = has(F_SREQ);
        self.close = has(F_CLOSE);
        self.reset = has(F_RESET);
        self.first = None;
        self.accept = None;
        if has(F_FIRST) {
            self.first = Some(First {
                service: r.u32("service")?,
                mtu: r.mtu()?,
                max_message: r.max_message()?,
            });
        }
        if has(F_ACCEPT) {
            let k = r.u64("listener key")?;
            if k & RTN != 0 {
                return Err(WireError::Malformed("listener key with RTN set"));
            }
            self.accept = Some(Accept {
                key: k,
                mtu: r.mtu()?,
                max_message: r.max_message()?,
            });
        }
        if has(F_STATUS) {
            // Decoded in place: a status is a few hundred bytes, and this
            // runs for every packet.
            r.status_into(self.status.get_or_insert_with(Status::default))?;
        } else {
            self.status = None;
        }
        if has(F_DATA) {
            let seq = r.varint("sequence number")?;
            let start = r.pos();
            // Checked here, sliced only where kept (`Chunks::iter`). The
            // offsets noted are relative to the DATA's chunks.
            let mut c = Reader::new(&buf[start..]);
            let first = if c.is_empty() {
                None
            } else {
                Some(c.chunk_head()?)
            };
            while !c.is_empty() {
                c.chunk_head()?;
            }
            if first.is_none() && !self.close {
                return Err(WireError::Malformed("DATA with no chunks and no CLOSE"));
            }
            let chunks = Chunks { buf, start, first };
            self.data = Some(Data { seq, chunks });
        } else if !r.is_empty() {
            return Err(WireError::Malformed(
                "trailing bytes after the last section",
            ));
        }
        Ok(())
    }
}

/// The common data packet, read by [`Plain::read`]: flags STATUS and
/// DATA (and perhaps SREQ), a status without selective ranges, and one
/// chunk to the end of the datagram, every number in at most three bytes.
#[derive(Debug, Clone, Copy)]
struct Plain {
    key: u64,
    sreq: bool,
    rseq: u64,
    alloc: u64,
    ack_delay_us: u64,
    seq: u64,
    /// Offset of the DATA's chunks in the datagram.
    start: usize,
    /// The chunk, its offset relative to `start`.
    chunk: ChunkHead,
}

// `Plain::read` takes a message length of three varint bytes as within
// bounds.
const _: () = assert!(MAX_MESSAGE >= 1 << 21);

/// A varint of one to three bytes at `*pos` of `b` (what
/// [`Reader::varint`] reads inline); `None` for a longer one or the end.
#[inline(always)]
fn short_varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    let x = *b.get(*pos)?;
    if x < 0x80 {
        *pos += 1;
        return Some(u64::from(x));
    }
    let y = *b.get(*pos + 1)?;
    if y < 0x80 {
        *pos += 2;
        return Some(u64::from(x & 0x7f) | u64::from(y) << 7);
    }
    let z = *b.get(*pos + 2)?;
    if z < 0x80 {
        *pos += 3;
        return Some(u64::from(x & 0x7f) | u64::from(y & 0x7f) << 7 | u64::from(z) << 14);
    }
    None
}

impl Plain {
    /// Reads `buf` if it is a plain data packet that
    /// [`Packet::decode_general`] accepts, with every check it makes;
    /// `None` for anything else, valid or not (the general path decides).
    #[inline(always)]
    fn read(buf: &[u8]) -> Option<Plain> {
        let head = buf.first_chunk::<HEADER_LEN>()?;
        if head[0..4] != [MAGIC[0], MAGIC[1], VERSION, KIND] || buf.len() > MAX_DATAGRAM {
            return None;
        }
        let flags = head[4];
        if flags & !F_SREQ != F_STATUS | F_DATA {
            return None;
        }
        let key = u64::from_le_bytes(head[5..13].try_into().ok()?);
        let mut pos = HEADER_LEN;
        let rseq = short_varint(buf, &mut pos)?;
        // Both below 2^21: the sum cannot overflow.
        let alloc = rseq + short_varint(buf, &mut pos)?;
        let ack_delay_us = short_varint(buf, &mut pos)?;
        if *buf.get(pos)? != 0 {
            return None;
        }
        pos += 1;
        let seq = short_varint(buf, &mut pos)?;
        let start = pos;
        let f = *buf.get(pos)?;
        pos += 1;
        let (begin, end, bundle) = (f & C_BEGIN != 0, f & C_END != 0, f & C_BUNDLE != 0);
        if f & C_RESERVED != 0 || (bundle && !begin) {
            return None;
        }
        let total = if begin && !end {
            // Below 2^21, so within MAX_MESSAGE.
            short_varint(buf, &mut pos)?
        } else {
            0
        };
        let len = short_varint(buf, &mut pos)? as usize;
        let whole = begin && end;
        if (!whole && len == 0) || (begin && !end && len as u64 >= total) {
            return None;
        }
        // One chunk, to the end.
        if buf.len() - pos != len {
            return None;
        }
        let chunk = ChunkHead {
            begin,
            end,
            bundle,
            total,
            at: pos - start,
            len,
        };
        Some(Plain {
            key,
            sreq: flags & F_SREQ != 0,
            rseq,
            alloc,
            ack_delay_us,
            seq,
            start,
            chunk,
        })
    }
}

/// Why a datagram's header is not an association packet's (the checks in
/// the order the header is read: the first that fails names the error).
#[cold]
fn header_error(buf: &[u8]) -> WireError {
    if buf.len() < 2 || buf[0..2] != MAGIC {
        return WireError::Foreign;
    }
    if buf.len() < 3 {
        return WireError::Truncated { what: "header" };
    }
    if buf[2] != VERSION {
        return WireError::Version(buf[2]);
    }
    if buf.len() < 4 {
        return WireError::Truncated { what: "header" };
    }
    if buf[3] != KIND {
        return WireError::Kind(buf[3]);
    }
    if buf.len() < HEADER_LEN {
        return WireError::Truncated { what: "header" };
    }
    WireError::TooLong {
        what: "datagram",
        len: buf.len() as u64,
        max: MAX_DATAGRAM,
    }
}

/// The rules between a packet's flags (and its key's RTN bit).
fn check_flags(flags: u8, key: u64) -> Result<(), WireError> {
    let has = |f: u8| flags & f != 0;
    if has(F_RESERVED) {
        return Err(WireError::Malformed("reserved packet flag set"));
    }
    if has(F_FIRST) && has(F_ACCEPT) {
        return Err(WireError::Malformed("FIRST and ACCEPT together"));
    }
    if has(F_FIRST) && (key & RTN != 0) {
        return Err(WireError::Malformed("FIRST with a return key"));
    }
    if has(F_ACCEPT) && (key & RTN == 0) {
        return Err(WireError::Malformed("ACCEPT without a return key"));
    }
    if has(F_FIRST) && has(F_DATA) {
        return Err(WireError::Malformed("FIRST with DATA"));
    }
    if has(F_CLOSE) && !has(F_DATA) {
        return Err(WireError::Malformed("CLOSE without DATA"));
    }
    Ok(())
}

/// Writes a packet section by section, in the fixed order, straight into the
/// output buffer. Flags are patched into the header as sections are added.
#[derive(Debug)]
pub struct Encoder<'a> {
    out: &'a mut Vec<u8>,
    at: usize,
}

impl<'a> Encoder<'a> {
    /// Starts a packet with `key` at the end of `out`.
    pub fn new(out: &'a mut Vec<u8>, key: u64) -> Encoder<'a> {
        let at = out.len();
        // One copy of the whole header (and one capacity check).
        let mut h = [0u8; HEADER_LEN];
        h[0..2].copy_from_slice(&MAGIC);
        h[2] = VERSION;
        h[3] = KIND;
        h[5..13].copy_from_slice(&key.to_le_bytes());
        out.extend_from_slice(&h);
        Encoder { out, at }
    }

    fn flag(&mut self, f: u8, on: bool) {
        if on {
            self.out[self.at + 4] |= f;
        }
    }

    fn flags(&self) -> u8 {
        self.out[self.at + 4]
    }

    /// Bytes written so far for this packet, header included.
    pub fn written(&self) -> usize {
        self.out.len() - self.at
    }

    /// Adds the FIRST section.
    pub fn first(&mut self, f: &First) {
        debug_assert!(self.flags() & !F_FIRST & 0x0f == 0, "section order");
        self.flag(F_FIRST, true);
        self.out.extend_from_slice(&f.service.to_le_bytes());
        varint::put(self.out, u64::from(f.mtu));
        varint::put(self.out, f.max_message);
    }

    /// Adds the ACCEPT section.
    pub fn accept(&mut self, a: &Accept) {
        debug_assert!(self.flags() & 0x0c == 0, "section order");
        self.flag(F_ACCEPT, true);
        self.out.extend_from_slice(&a.key.to_le_bytes());
        varint::put(self.out, u64::from(a.mtu));
        varint::put(self.out, a.max_message);
    }

    /// Adds a STATUS section of at most `room` bytes (at least
    /// [`STATUS_MIN_LEN`]), dropping the highest ranges that do not fit.
    /// Returns whether every range fit.
    pub fn status(&mut self, s: &Status, room: usize) -> bool {
        debug_assert!(self.flags() & 0x08 == 0, "section order");
        debug_assert!(s.alloc >= s.rseq);
        self.flag(F_STATUS, true);
        let start = self.out.len();
        varint::put(self.out, s.rseq);
        varint::put(self.out, s.alloc - s.rseq);
        varint::put(self.out, s.ack_delay_us);
        let count_at = self.out.len();
        self.out.push(0);
        let mut prev = s.rseq;
        let mut n = 0u8;
        for &(a, b) in s.sack.ranges() {
            let gap = a - prev - 1;
            let len = b - a - 1;
            if self.out.len() - start + varint::len(gap) + varint::len(len) > room {
                break;
            }
            varint::put(self.out, gap);
            varint::put(self.out, len);
            prev = b;
            n += 1;
        }
        self.out[count_at] = n;
        usize::from(n) == s.sack.ranges().len()
    }

    /// Adds a STATUS section encoded before by [`Encoder::status`] (its
    /// bytes as [`Encoder::since`] gave them): the same status again
    /// without encoding it again.
    pub fn status_encoded(&mut self, section: &[u8]) {
        debug_assert!(self.flags() & 0x08 == 0, "section order");
        self.flag(F_STATUS, true);
        self.out.extend_from_slice(section);
    }

    /// The bytes written for this packet from `at` (a [`written`](Self::written)
    /// count) on.
    pub fn since(&self, at: usize) -> &[u8] {
        &self.out[self.at + at..]
    }

    /// Starts the DATA section with sequence number `seq`; add chunks next.
    pub fn data(&mut self, seq: u64) {
        self.flag(F_DATA, true);
        varint::put(self.out, seq);
    }

    /// Adds a chunk to the DATA section.
    pub fn chunk(&mut self, c: &Chunk) {
        debug_assert!(self.flags() & F_DATA != 0, "chunk outside DATA");
        put_chunk(self.out, c);
    }

    /// Adds the header of a chunk to the DATA section, not its bytes: the
    /// caller sends them right after what was written, as the packet's
    /// last bytes (so only the packet's last chunk may be added this way).
    pub fn chunk_head(&mut self, c: &Chunk) {
        debug_assert!(self.flags() & F_DATA != 0, "chunk outside DATA");
        put_chunk_head(self.out, c);
    }

    /// Sets SREQ.
    pub fn sreq(&mut self, on: bool) {
        self.flag(F_SREQ, on);
    }

    /// Sets CLOSE (with a DATA section).
    pub fn close(&mut self, on: bool) {
        self.flag(F_CLOSE, on);
    }

    /// Sets RESET.
    pub fn reset(&mut self, on: bool) {
        self.flag(F_RESET, on);
    }
}

fn put_chunk(out: &mut Vec<u8>, c: &Chunk) {
    put_chunk_head(out, c);
    out.extend_from_slice(&c.bytes);
}

/// A chunk's flags and lengths: its encoding without its bytes.
fn put_chunk_head(out: &mut Vec<u8>, c: &Chunk) {
    let mut f = 0;
    if c.begin {
        f |= C_BEGIN;
    }
    if c.end {
        f |= C_END;
    }
    if c.bundle {
        f |= C_BUNDLE;
    }
    out.push(f);
    if c.begin && !c.end {
        varint::put(out, c.total);
    }
    varint::put(out, c.bytes.len() as u64);
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

/// The association sections, on the codec's cursor.
impl<B: AsRef<[u8]> + ?Sized> Reader<'_, B> {
    fn mtu(&mut self) -> Result<u32, WireError> {
        let m = self.varint("mtu")?;
        if m < MIN_MTU as u64 || m > MAX_DATAGRAM as u64 {
            return Err(WireError::Malformed("mtu out of range"));
        }
        Ok(m as u32)
    }

    fn max_message(&mut self) -> Result<u64, WireError> {
        let m = self.varint("max message")?;
        if m > MAX_MESSAGE {
            return Err(WireError::TooLong {
                what: "max message",
                len: m,
                max: MAX_MESSAGE as usize,
            });
        }
        Ok(m)
    }

    #[inline]
    fn status_into(&mut self, st: &mut Status) -> Result<(), WireError> {
        let rseq = self.varint("rseq")?;
        let alloc = rseq
            .checked_add(self.varint("alloc")?)
            .ok_or(WireError::Malformed("alloc overflows"))?;
        let ack_delay_us = self.varint("ack delay")?;
        let n = self.u8("range count")?;
        st.rseq = rseq;
        st.alloc = alloc;
        st.ack_delay_us = ack_delay_us;
        // `st` may be a status decoded before (see `Packet::decode_into`).
        st.sack.truncate(0);
        if usize::from(n) > MAX_SACK {
            return Err(WireError::TooLong {
                what: "sack ranges",
                len: u64::from(n),
                max: MAX_SACK,
            });
        }
        let mut prev = rseq;
        let overflow = WireError::Malformed("sack range overflows");
        for _ in 0..n {
            let gap = self.varint("sack gap")?;
            let len = self.varint("sack length")?;
            let start = prev
                .checked_add(gap)
                .and_then(|v| v.checked_add(1))
                .ok_or(overflow)?;
            let end = start
                .checked_add(len)
                .and_then(|v| v.checked_add(1))
                .ok_or(overflow)?;
            if end > alloc {
                return Err(WireError::Malformed("sack range beyond alloc"));
            }
            st.sack.push(start, end);
            prev = end;
        }
        Ok(())
    }

    /// Reads and checks a chunk, stepping over its bytes.
    #[inline(always)]
    fn chunk_head(&mut self) -> Result<ChunkHead, WireError> {
        let f = self.u8("chunk flags")?;
        if f & C_RESERVED != 0 {
            return Err(WireError::Malformed("reserved chunk flag set"));
        }
        let begin = f & C_BEGIN != 0;
        let end = f & C_END != 0;
        let bundle = f & C_BUNDLE != 0;
        if bundle && !begin {
            return Err(WireError::Malformed(
                "BUNDLE on a piece that is not the first",
            ));
        }
        let total = if begin && !end {
            let t = self.varint("message length")?;
            if t > MAX_MESSAGE {
                return Err(WireError::TooLong {
                    what: "message",
                    len: t,
                    max: MAX_MESSAGE as usize,
                });
            }
            t
        } else {
            0
        };
        let wire_len = self.varint("chunk length")?;
        let len = self.check_len(wire_len, usize::MAX, "chunk")?;
        if !(begin && end) && len == 0 {
            return Err(WireError::Malformed("empty fragment"));
        }
        if begin && !end && len as u64 >= total {
            return Err(WireError::Malformed(
                "first fragment not shorter than its message",
            ));
        }
        let at = self.pos();
        self.take_len(wire_len, usize::MAX, "chunk")?;
        Ok(ChunkHead {
            begin,
            end,
            bundle,
            total,
            at,
            len,
        })
    }
}

/// Most bytes of a joined message whose buffer is kept for reuse.
const SPARE_MAX: usize = 256 << 10;

/// Joins a message's pieces, copying only when there is more than one.
/// The copy goes into `spare`, the buffer of the message joined before,
/// when the application has dropped that message (no allocation, no fresh
/// pages), else into a new buffer; the result becomes the next `spare`
/// (when at most 256 KiB: a reassembled message held by the application
/// keeps its own buffer, nothing more).
pub(crate) fn join(parts: &mut Vec<Bytes>, total: usize, spare: &mut Bytes) -> Bytes {
    if parts.len() == 1 {
        return parts.pop().expect("one part");
    }
    let mut b = match std::mem::take(spare).try_into_mut() {
        Ok(mut b) if b.capacity() >= total => {
            b.clear();
            b
        }
        _ => BytesMut::with_capacity(total),
    };
    for p in parts.drain(..) {
        b.extend_from_slice(&p);
    }
    let msg = b.freeze();
    if total <= SPARE_MAX {
        *spare = msg.clone();
    }
    msg
}

#[cfg(test)]
mod join_tests {
    use super::*;

    fn parts(n: u8) -> Vec<Bytes> {
        vec![Bytes::from(vec![n; 1000]), Bytes::from(vec![n; 500])]
    }

    #[test]
    fn join_reuses_the_buffer_of_a_dropped_message() {
        let mut spare = Bytes::new();
        let a = join(&mut parts(1), 1500, &mut spare);
        assert_eq!(&a[..], &[1u8; 1500][..]);
        let at = a.as_ptr();
        drop(a);
        let b = join(&mut parts(2), 1500, &mut spare);
        assert_eq!(&b[..], &[2u8; 1500][..]);
        assert_eq!(
            b.as_ptr(),
            at,
            "the dropped message's buffer was not reused"
        );
    }

    #[test]
    fn join_leaves_a_held_message_alone() {
        let mut spare = Bytes::new();
        let a = join(&mut parts(1), 1500, &mut spare);
        let b = join(&mut parts(2), 1500, &mut spare);
        assert_ne!(a.as_ptr(), b.as_ptr());
        assert_eq!(&a[..], &[1u8; 1500][..]);
        assert_eq!(&b[..], &[2u8; 1500][..]);
        // A single part is handed over as it is, without a copy.
        let one = Bytes::from(vec![3u8; 10]);
        let at = one.as_ptr();
        assert_eq!(join(&mut vec![one], 10, &mut spare).as_ptr(), at);
    }
}

#[cfg(test)]
mod plain_tests {
    use proptest::prelude::*;

    use super::*;

    fn general(buf: &Bytes) -> Result<Packet, WireError> {
        let mut p = Packet::default();
        p.decode_general(buf.clone()).map(|()| p)
    }

    /// The fast path takes only what the general path accepts, and leaves
    /// the same packet (the noted first chunk included), in a packet that
    /// held another before; `decode_into` answers as the general path does
    /// on every input. Returns whether the fast path took it.
    fn agree(buf: &Bytes) -> bool {
        let slow = general(buf);
        let mut p = Packet::default();
        // A packet with every section and ranges, decoded into first.
        let mut other = Vec::new();
        let mut sack = Sack::default();
        sack.push(5, 7);
        Packet {
            key: RTN | 9,
            sreq: true,
            status: Some(Status {
                rseq: 1,
                alloc: 90,
                ack_delay_us: 3,
                sack,
            }),
            accept: Some(Accept {
                key: 4,
                mtu: 1400,
                max_message: 77,
            }),
            ..Packet::default()
        }
        .encode(&mut other);
        p.decode_into(other.into()).unwrap();
        let fast = Plain::read(buf).is_some();
        let got = p.decode_into(buf.clone());
        match (&slow, got) {
            (Ok(want), Ok(())) => {
                assert_eq!(&p, want);
                let firsts = |q: &Packet| q.data.as_ref().map(|d| d.chunks.first);
                assert_eq!(firsts(&p), firsts(want));
            }
            (Err(want), Err(e)) => assert_eq!(&e, want),
            (want, got) => panic!("general {want:?}, decode_into {got:?}"),
        }
        assert!(
            !fast || slow.is_ok(),
            "fast path took a packet the general one refuses"
        );
        fast
    }

    /// A plain data packet, encoded.
    fn plain(
        key: u64,
        sreq: bool,
        rseq: u64,
        window: u64,
        delay: u64,
        seq: u64,
        c: Chunk,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        let mut e = Encoder::new(&mut out, key);
        e.status(
            &Status {
                rseq,
                alloc: rseq + window,
                ack_delay_us: delay,
                sack: Sack::default(),
            },
            usize::MAX,
        );
        e.data(seq);
        e.chunk(&c);
        e.sreq(sreq);
        out
    }

    #[test]
    fn a_bulk_packet_takes_the_fast_path() {
        let c = Chunk {
            begin: false,
            end: false,
            bundle: false,
            total: 0,
            bytes: Bytes::from(vec![7u8; 1400]),
        };
        let buf = Bytes::from(plain(RTN | 77, false, 0, 1024, 0, 12_345, c));
        assert!(agree(&buf));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

        /// Plain data packets of every shape (numbers of one to four varint
        /// bytes), then changed in up to three bytes, cut or extended.
        #[test]
        fn fast_and_general_decoders_agree(
            key in any::<u64>(),
            sreq in any::<bool>(),
            nums in proptest::collection::vec(0u64..(1 << 23), 4),
            cflags in 0u8..8,
            total in 0u64..(1 << 22),
            len in 0usize..300,
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
            cut in 0usize..4,
            grow in 0usize..3,
        ) {
            let c = Chunk {
                begin: cflags & 1 != 0,
                end: cflags & 2 != 0,
                bundle: cflags & 4 != 0,
                total,
                bytes: Bytes::from(vec![1u8; len]),
            };
            let mut buf = plain(key, sreq, nums[0], nums[1], nums[2], nums[3], c);
            agree(&Bytes::from(buf.clone()));
            for (at, x) in edits {
                let at = at % buf.len();
                buf[at] ^= x;
            }
            buf.truncate(buf.len().saturating_sub(cut));
            buf.extend(std::iter::repeat_n(0x42, grow));
            agree(&Bytes::from(buf));
        }

        /// Any bytes at all behind a valid header.
        #[test]
        fn fast_and_general_decoders_agree_on_any_bytes(
            flags in any::<u8>(),
            key in any::<u64>(),
            rest in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut buf = vec![MAGIC[0], MAGIC[1], VERSION, KIND, flags];
            buf.extend_from_slice(&key.to_le_bytes());
            buf.extend_from_slice(&rest);
            agree(&Bytes::from(buf));
        }
    }
}
