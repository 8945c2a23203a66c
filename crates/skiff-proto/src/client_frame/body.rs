//! A frame's body on the wire: [`Enc`] appends one, [`Reader`] reads one,
//! and [`Decoder`] cuts a byte stream into them.

use crate::codec;
use crate::varint;
use crate::wire::{self};
use crate::{Message, WireError};
use bytes::{Buf, Bytes, BytesMut};

use super::LEN_PREFIX;

/// Appends frames to a buffer.
pub(super) struct Enc<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> Enc<'a> {
    pub(super) fn new(out: &'a mut Vec<u8>, op: u8) -> Enc<'a> {
        let start = out.len();
        out.extend_from_slice(&[0; LEN_PREFIX]);
        out.push(op);
        Enc { out, start }
    }
    pub(super) fn v(self, x: u64) -> Self {
        varint::put(self.out, x);
        self
    }
    pub(super) fn u8(self, x: u8) -> Self {
        self.out.push(x);
        self
    }
    pub(super) fn s(self, b: &[u8]) -> Self {
        varint::put(self.out, b.len() as u64);
        self.out.extend_from_slice(b);
        self
    }
    pub(super) fn msg(self, m: &Message) -> Self {
        wire::encode_message(self.out, m, false);
        self
    }
    pub(super) fn end(self) {
        let len = (self.out.len() - self.start - LEN_PREFIX) as u32;
        self.out[self.start..self.start + LEN_PREFIX].copy_from_slice(&len.to_le_bytes());
    }
}

/// A cursor over one frame body: the codec's reader and the frame's op.
pub(super) struct Reader<'a> {
    r: codec::Reader<'a, Bytes>,
    pub(super) op: u8,
    max_payload: usize,
    /// A message was decoded: it ran to the end.
    done: bool,
}

impl<'a> Reader<'a> {
    pub(super) fn new(buf: &'a Bytes, max_payload: usize) -> Result<Reader<'a>, WireError> {
        let mut r = codec::Reader::new(buf);
        let op = r.u8("frame op")?;
        Ok(Reader {
            r,
            op,
            max_payload,
            done: false,
        })
    }
    pub(super) fn v(&mut self, what: &'static str) -> Result<u64, WireError> {
        self.r.varint(what)
    }
    pub(super) fn v32(&mut self, what: &'static str) -> Result<u32, WireError> {
        self.r.varint_u32(what)
    }
    pub(super) fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        self.r.u8(what)
    }
    pub(super) fn bytes(&mut self, what: &'static str, max: usize) -> Result<Bytes, WireError> {
        self.r.shared(max, what)
    }
    pub(super) fn string(&mut self, what: &'static str, max: usize) -> Result<String, WireError> {
        Ok(self.r.str(max, what)?.to_owned())
    }
    pub(super) fn msg(&mut self) -> Result<Message, WireError> {
        let rest = self.r.shared_rest();
        self.done = true;
        wire::decode_message(&rest, self.max_payload)
    }
    /// Whether the body has bytes left (an optional trailing field).
    pub(super) fn more(&self) -> bool {
        !self.done && self.r.remaining() > 0
    }
    pub(super) fn finish(&self) -> Result<(), WireError> {
        if self.done {
            return Ok(());
        }
        self.r.finish()
    }
}

/// Least room [`Decoder::next`] gives a partly read frame at a time.
const GROW_MIN: usize = 64 * 1024;

/// Splits a byte stream into frame bodies. Total and bounded: a length
/// above `max_frame` is an error before any byte of the body is reserved.
#[derive(Debug)]
pub struct Decoder {
    max_frame: usize,
}

impl Decoder {
    /// A decoder refusing bodies longer than `max_frame` bytes.
    pub fn new(max_frame: usize) -> Decoder {
        Decoder { max_frame }
    }

    /// The body length a frame's prefix announces, checked: not zero, not
    /// over the limit.
    fn body_len(&self, prefix: &[u8]) -> Result<usize, WireError> {
        let len = u32::from_le_bytes(prefix.try_into().expect("4 bytes")) as usize;
        if len == 0 {
            return Err(WireError::Malformed("empty frame"));
        }
        if len > self.max_frame {
            return Err(WireError::TooLong {
                what: "frame",
                len: len as u64,
                max: self.max_frame,
            });
        }
        Ok(len)
    }

    /// The next frame body in `buf`, removed from it; `Ok(None)` when more
    /// bytes are needed. On `Ok(None)`, `buf` has been given room for more
    /// of the frame: at most as much again as it holds (at least
    /// 64 KiB), never past the frame's end, so what a sender that
    /// stops mid-frame makes the reader hold grows with what it sent, not
    /// with the length it claimed.
    pub fn next(&self, buf: &mut BytesMut) -> Result<Option<Bytes>, WireError> {
        if buf.len() < LEN_PREFIX {
            return Ok(None);
        }
        let len = self.body_len(&buf[..LEN_PREFIX])?;
        if buf.len() < LEN_PREFIX + len {
            let rest = LEN_PREFIX + len - buf.len();
            buf.reserve(rest.min(buf.len().max(GROW_MIN)));
            return Ok(None);
        }
        buf.advance(LEN_PREFIX);
        Ok(Some(buf.split_to(len).freeze()))
    }

    /// As [`Decoder::split`], over a borrowed slice: the next frame body
    /// at the front of `buf` (advanced past it), nothing reference-counted.
    pub fn split_slice<'a>(&self, buf: &mut &'a [u8]) -> Result<Option<&'a [u8]>, WireError> {
        if buf.is_empty() {
            return Ok(None);
        }
        if buf.len() < LEN_PREFIX {
            return Err(WireError::Malformed("a frame cut short"));
        }
        let len = self.body_len(&buf[..LEN_PREFIX])?;
        if buf.len() - LEN_PREFIX < len {
            return Err(WireError::Malformed("a frame cut short"));
        }
        let (body, rest) = buf[LEN_PREFIX..].split_at(len);
        *buf = rest;
        Ok(Some(body))
    }

    /// The next frame body at the front of `buf`, split off it without a
    /// copy (a frame body is then a slice of whatever `buf` refers to,
    /// e.g. a shared-memory segment); `Ok(None)` once `buf` is empty. The
    /// same checks as [`Decoder::next`]; a frame cut short by the end of
    /// `buf` is an error (the caller hands whole frames only).
    pub fn split(&self, buf: &mut Bytes) -> Result<Option<Bytes>, WireError> {
        // The checks are `split_slice`'s; only the split differs.
        let mut view: &[u8] = buf;
        let Some(body) = self.split_slice(&mut view)? else {
            return Ok(None);
        };
        let len = body.len();
        buf.advance(LEN_PREFIX);
        Ok(Some(buf.split_to(len)))
    }
}
