//! The one small codec every skiff wire format is written with: a
//! [`Reader`] cursor for decoding and the [`Writer`] helpers for encoding,
//! both on the one varint of [`crate::varint`].
//!
//! The reader is total and bounded: every read checks what is left first
//! and reports a [`WireError`] naming the field (`what`); a length read from
//! the wire is checked against its limit and against what is left before
//! anything is sliced or allocated. It never panics on any input.
//!
//! A `Reader<[u8]>` hands out borrowed slices; a `Reader<Bytes>` can also
//! hand out zero-copy [`Bytes`] slices of the buffer (reference counted),
//! which is what the message decoders use for payloads.
//!
//! Integers on skiff's wire are little-endian; lengths and counts are
//! varints (LEB128, [`crate::varint`]).

use bytes::{BufMut, Bytes};

use crate::error::WireError;
use crate::varint;

/// A cursor over an encoded buffer that refuses to read past its end.
///
/// `B` is the buffer type: `[u8]` (borrowed slices out) or [`Bytes`]
/// (zero-copy `Bytes` slices out as well).
#[derive(Debug)]
pub struct Reader<'a, B: ?Sized = [u8]> {
    buf: &'a B,
    pos: usize,
}

impl<B: ?Sized> Clone for Reader<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: ?Sized> Copy for Reader<'_, B> {}

impl<'a, B: AsRef<[u8]> + ?Sized> Reader<'a, B> {
    /// A reader at the start of `buf`.
    #[inline]
    pub fn new(buf: &'a B) -> Self {
        Reader { buf, pos: 0 }
    }

    /// A reader at offset `pos` of `buf` (clamped to its end).
    #[inline]
    pub fn at(buf: &'a B, pos: usize) -> Self {
        let pos = pos.min(buf.as_ref().len());
        Reader { buf, pos }
    }

    /// A reader at `pos`, which the caller knows is within `buf` (a
    /// position an earlier reader over the same buffer reached): no clamp
    /// on the per-message path.
    #[inline(always)]
    pub(crate) fn resume(buf: &'a B, pos: usize) -> Self {
        debug_assert!(pos <= buf.as_ref().len());
        Reader { buf, pos }
    }

    #[inline(always)]
    fn slice(&self) -> &'a [u8] {
        self.buf.as_ref()
    }

    /// The offset of the next byte to read.
    #[inline]
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// How many bytes are left.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.slice().len() - self.pos
    }

    /// Whether everything was read.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    /// The bytes left (not consumed).
    #[inline]
    pub fn rest(&self) -> &'a [u8] {
        &self.slice()[self.pos..]
    }

    /// `Ok` if everything was read, else a malformed-input error (trailing
    /// bytes after a frame are not ignored).
    pub fn finish(&self) -> Result<(), WireError> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(WireError::Malformed("trailing bytes after the frame"))
        }
    }

    /// The next `n` bytes, borrowed.
    #[inline]
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        if self.remaining() < n {
            return Err(WireError::Truncated { what });
        }
        let s = &self.slice()[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// The next `N` bytes as an array.
    #[inline]
    pub fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], WireError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    /// One byte.
    #[inline]
    pub fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        let b = *self
            .slice()
            .get(self.pos)
            .ok_or(WireError::Truncated { what })?;
        self.pos += 1;
        Ok(b)
    }

    /// A little-endian `u16`.
    #[inline]
    pub fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
        self.array(what).map(u16::from_le_bytes)
    }

    /// A little-endian `u32`.
    #[inline]
    pub fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        self.array(what).map(u32::from_le_bytes)
    }

    /// A little-endian `u64`.
    #[inline]
    pub fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A varint ([`crate::varint`]). The forms of up to three bytes (values
    /// below 2^21, the common case) are read inline; longer ones out of
    /// line, a word at a time.
    #[inline(always)]
    pub fn varint(&mut self, what: &'static str) -> Result<u64, WireError> {
        if let Some(&b) = self.slice().get(self.pos) {
            if b < 0x80 {
                self.pos += 1;
                return Ok(u64::from(b));
            }
            // Two and three bytes (below 2^21: lengths of a datagram's
            // pieces, sequence numbers, delays in microseconds).
            if let Some(&c) = self.slice().get(self.pos + 1) {
                if c < 0x80 {
                    self.pos += 2;
                    return Ok(u64::from(b & 0x7f) | u64::from(c) << 7);
                }
                if let Some(&d) = self.slice().get(self.pos + 2) {
                    if d < 0x80 {
                        self.pos += 3;
                        return Ok(u64::from(b & 0x7f)
                            | u64::from(c & 0x7f) << 7
                            | u64::from(d) << 14);
                    }
                }
            }
        }
        self.varint_long(what)
    }

    #[inline(never)]
    fn varint_long(&mut self, what: &'static str) -> Result<u64, WireError> {
        if let Some((v, n)) = self.rest().first_chunk::<8>().and_then(varint::get_word) {
            self.pos += n;
            return Ok(v);
        }
        let (v, n) = varint::get(self.rest()).map_err(|e| match e {
            WireError::Truncated { .. } => WireError::Truncated { what },
            e => e,
        })?;
        self.pos += n;
        Ok(v)
    }

    /// A varint that must fit in a `u32`.
    pub fn varint_u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        let v = self.varint(what)?;
        u32::try_from(v).map_err(|_| WireError::TooLong {
            what,
            len: v,
            max: u32::MAX as usize,
        })
    }

    /// Checks a length read from the wire: at most `max`, and no more than
    /// what is left. Nothing is read.
    #[inline]
    pub fn check_len(&self, len: u64, max: usize, what: &'static str) -> Result<usize, WireError> {
        if len > max as u64 {
            return Err(WireError::TooLong { what, len, max });
        }
        let len = len as usize;
        if self.remaining() < len {
            return Err(WireError::Truncated { what });
        }
        Ok(len)
    }

    /// `len` bytes (a length already read), checked as
    /// [`Reader::check_len`] does, borrowed.
    #[inline]
    pub fn take_len(
        &mut self,
        len: u64,
        max: usize,
        what: &'static str,
    ) -> Result<&'a [u8], WireError> {
        let n = self.check_len(len, max, what)?;
        let s = &self.slice()[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// Varint-length-prefixed bytes of at most `max`, borrowed.
    #[inline]
    pub fn bytes(&mut self, max: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        let n = self.varint(what)?;
        self.take_len(n, max, what)
    }

    /// A varint-length-prefixed UTF-8 string of at most `max` bytes,
    /// borrowed.
    pub fn str(&mut self, max: usize, what: &'static str) -> Result<&'a str, WireError> {
        let b = self.bytes(max, what)?;
        std::str::from_utf8(b).map_err(|_| WireError::Utf8(what))
    }
}

impl Reader<'_, Bytes> {
    /// `len` bytes (a length already read), checked as
    /// [`Reader::check_len`] does, as a zero-copy slice of the buffer.
    #[inline]
    pub fn shared_len(
        &mut self,
        len: u64,
        max: usize,
        what: &'static str,
    ) -> Result<Bytes, WireError> {
        let n = self.check_len(len, max, what)?;
        let b = self.buf.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(b)
    }

    /// Varint-length-prefixed bytes of at most `max`, as a zero-copy slice
    /// of the buffer.
    pub fn shared(&mut self, max: usize, what: &'static str) -> Result<Bytes, WireError> {
        let n = self.varint(what)?;
        self.shared_len(n, max, what)
    }

    /// Everything left, as a zero-copy slice of the buffer; the reader is
    /// then empty.
    pub fn shared_rest(&mut self) -> Bytes {
        let b = self.buf.slice(self.pos..);
        self.pos = self.buf.len();
        b
    }
}

/// The encoding side of the codec: varints and length-prefixed fields on
/// any [`BufMut`] (a `Vec<u8>`, a `BytesMut`, …). Fixed-width integers use
/// `BufMut`'s own little-endian `put_u32_le` and friends.
pub trait Writer: BufMut {
    /// Appends `v` as a varint ([`crate::varint`]).
    #[inline]
    fn put_varint(&mut self, v: u64) {
        varint::put_buf(self, v)
    }

    /// Appends `b` with a varint length before it.
    #[inline]
    fn put_prefixed(&mut self, b: &[u8]) {
        self.put_varint(b.len() as u64);
        self.put_slice(b);
    }
}

impl<T: BufMut + ?Sized> Writer for T {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_every_kind() {
        let mut out = Vec::new();
        out.put_u8(7);
        out.put_u16_le(0x1234);
        out.put_u32_le(0xdead_beef);
        out.put_u64_le(u64::MAX - 1);
        out.put_varint(300);
        out.put_prefixed(b"hello");
        let b = Bytes::from(out);
        let mut r = Reader::new(&b);
        assert_eq!(r.u8("a"), Ok(7));
        assert_eq!(r.u16("b"), Ok(0x1234));
        assert_eq!(r.u32("c"), Ok(0xdead_beef));
        assert_eq!(r.u64("d"), Ok(u64::MAX - 1));
        assert_eq!(r.varint("e"), Ok(300));
        assert_eq!(r.shared(16, "f"), Ok(Bytes::from_static(b"hello")));
        assert!(r.is_empty());
        assert_eq!(r.finish(), Ok(()));
        assert_eq!(r.u8("g"), Err(WireError::Truncated { what: "g" }));
    }

    proptest::proptest! {
        /// The reader's varint (inline up to three bytes, then a word at a
        /// time, then byte by byte near the end) reads what
        /// `varint::get` reads, and fails where it fails.
        #[test]
        fn varint_reads_what_get_reads(
            buf in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..14),
            v: u64,
            shift in 0u32..64,
            junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..10),
        ) {
            let mut r = Reader::new(&buf[..]);
            match varint::get(&buf) {
                Ok((want, n)) => {
                    proptest::prop_assert_eq!(r.varint("v"), Ok(want));
                    proptest::prop_assert_eq!(r.pos(), n);
                }
                Err(WireError::Truncated { .. }) => {
                    proptest::prop_assert_eq!(r.varint("v"), Err(WireError::Truncated { what: "v" }));
                }
                Err(e) => proptest::prop_assert_eq!(r.varint("v"), Err(e)),
            }
            // Every length, with and without bytes after it.
            let v = v >> shift;
            let mut out = Vec::new();
            out.put_varint(v);
            let n = out.len();
            out.extend_from_slice(&junk);
            let mut r = Reader::new(&out[..]);
            proptest::prop_assert_eq!(r.varint("v"), Ok(v));
            proptest::prop_assert_eq!(r.pos(), n);
        }
    }

    #[test]
    fn lengths_are_checked_before_reading() {
        let mut out = Vec::new();
        out.put_varint(1 << 40);
        let mut r = Reader::new(&out[..]);
        assert!(matches!(r.bytes(1024, "x"), Err(WireError::TooLong { .. })));
        let mut r = Reader::new(&[3u8, 1, 2][..]);
        assert_eq!(r.bytes(8, "x"), Err(WireError::Truncated { what: "x" }));
        let mut r = Reader::new(&[2u8, 0xff, 0xfe][..]);
        assert_eq!(r.str(8, "s"), Err(WireError::Utf8("s")));
        let mut r = Reader::new(&[0x80u8][..]);
        assert_eq!(r.varint("v"), Err(WireError::Truncated { what: "v" }));
        let r = Reader::at(&[1u8, 2][..], 9);
        assert!(r.is_empty());
    }
}
