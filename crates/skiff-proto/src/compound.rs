//! Compound datagrams: frame kind 3, several skiff frames sharing one
//! datagram, so that association packets (kind 2) and best-effort batches
//! (kind 1) to the same host share the path (and its per-datagram cost).
//!
//! ```text
//!  0       2     3      4       5
//! +-------+-----+------+-------+---------------------------+---------------------------+-----+
//! | magic | ver | kind | count | len 0 varint | frame 0    | len 1 varint | frame 1    | ... |
//! | "SK"  |  1  |  3   | (u8)  |              |            |              |            |     |
//! +-------+-----+------+-------+---------------------------+---------------------------+-----+
//! ```
//!
//! Each frame is a complete skiff datagram of kind 1 (batch) or kind 2
//! (association packet), header included, exactly as it would travel
//! alone; the receiver hands each to its own decoder. `count` is 1 to
//! [`MAX_FRAMES`]; a frame is at least [`MIN_FRAME`] bytes, starts with
//! skiff's magic and version, and is never itself compound. Nothing may
//! follow the last frame.
//!
//! The decoder is total and bounded: [`decode`] returns the frames as
//! zero-copy slices of the input or a [`WireError`], never panics, and
//! allocates at most `count` slices, after checking that `count` frames can
//! fit in what remains.

use bytes::Bytes;

use crate::codec::Reader;
use crate::error::WireError;
use crate::varint;
use crate::wire::{MAGIC, MAX_DATAGRAM, VERSION};

/// The frame kind of compound datagrams (byte 3 of the header).
pub const KIND: u8 = 3;
/// Bytes before the first frame: magic, version, kind, count.
pub const HEADER_LEN: usize = 5;
/// Most frames in one compound datagram.
pub const MAX_FRAMES: usize = 64;
/// The shortest frame: a skiff datagram's magic, version and kind.
pub const MIN_FRAME: usize = 4;
/// The kinds a frame may have: batch and association.
const FRAME_KINDS: [u8; 2] = [1, 2];

/// Whether `buf` starts like a compound datagram (it may still fail to
/// decode).
pub fn is_compound(buf: &[u8]) -> bool {
    buf.len() >= HEADER_LEN && buf[0..2] == MAGIC && buf[2] == VERSION && buf[3] == KIND
}

/// Bytes a compound datagram of frames of these lengths takes.
pub fn encoded_len(frame_lens: impl IntoIterator<Item = usize>) -> usize {
    HEADER_LEN
        + frame_lens
            .into_iter()
            .map(|n| varint::len(n as u64) + n)
            .sum::<usize>()
}

/// Builds compound datagrams frame by frame.
#[derive(Debug)]
pub struct Encoder<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> Encoder<'a> {
    /// Starts a compound datagram at the end of `out`.
    pub fn new(out: &'a mut Vec<u8>) -> Encoder<'a> {
        let start = out.len();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&[VERSION, KIND, 0]);
        Encoder { out, start }
    }

    /// Frames written so far.
    pub fn count(&self) -> usize {
        usize::from(self.out[self.start + 4])
    }

    /// Bytes written so far, header included.
    pub fn len(&self) -> usize {
        self.out.len() - self.start
    }

    /// Whether no frame was written yet.
    pub fn is_empty(&self) -> bool {
        self.count() == 0
    }

    /// Appends one frame (a whole kind 1 or 2 datagram). Returns `false`,
    /// writing nothing, when the datagram already holds [`MAX_FRAMES`] or
    /// the frame would take it over `max_datagram` bytes.
    pub fn push(&mut self, frame: &[u8], max_datagram: usize) -> bool {
        let need = varint::len(frame.len() as u64) + frame.len();
        if self.count() >= MAX_FRAMES || self.len() + need > max_datagram.min(MAX_DATAGRAM) {
            return false;
        }
        varint::put(self.out, frame.len() as u64);
        self.out.extend_from_slice(frame);
        self.out[self.start + 4] += 1;
        true
    }
}

/// Decodes a compound datagram into its frames, appended to `out` as
/// slices of `buf`. On error nothing is appended.
pub fn decode(buf: &Bytes, out: &mut Vec<Bytes>) -> Result<(), WireError> {
    if buf.len() < 2 || buf[0..2] != MAGIC {
        return Err(WireError::Foreign);
    }
    if buf.len() < 3 {
        return Err(WireError::Truncated { what: "header" });
    }
    if buf[2] != VERSION {
        return Err(WireError::Version(buf[2]));
    }
    if buf.len() < HEADER_LEN {
        return Err(WireError::Truncated {
            what: "compound header",
        });
    }
    if buf[3] != KIND {
        return Err(WireError::Kind(buf[3]));
    }
    if buf.len() > MAX_DATAGRAM {
        return Err(WireError::TooLong {
            what: "datagram",
            len: buf.len() as u64,
            max: MAX_DATAGRAM,
        });
    }
    let count = usize::from(buf[4]);
    if count == 0 || count > MAX_FRAMES {
        return Err(WireError::Malformed("compound frame count not in 1..=64"));
    }
    // Each frame takes at least a length byte and MIN_FRAME bytes.
    if count * (1 + MIN_FRAME) > buf.len() - HEADER_LEN {
        return Err(WireError::Truncated {
            what: "compound frames",
        });
    }
    let start = out.len();
    let res = frames(buf, count, out);
    if res.is_err() {
        out.truncate(start);
    }
    res
}

fn frames(buf: &Bytes, count: usize, out: &mut Vec<Bytes>) -> Result<(), WireError> {
    out.reserve(count);
    let mut r = Reader::at(buf, HEADER_LEN);
    for _ in 0..count {
        let len = r.varint("frame length")?;
        let f = r.shared_len(len, usize::MAX, "frame")?;
        if f.len() < MIN_FRAME {
            return Err(WireError::Malformed("compound frame shorter than 4 bytes"));
        }
        if f[0..2] != MAGIC || f[2] != VERSION {
            return Err(WireError::Malformed("compound frame is not a skiff frame"));
        }
        if !FRAME_KINDS.contains(&f[3]) {
            return Err(WireError::Malformed(
                "compound frame of a kind other than batch or association",
            ));
        }
        out.push(f);
    }
    if !r.is_empty() {
        return Err(WireError::Malformed("trailing bytes after the last frame"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire;
    use crate::Message;

    fn batch() -> Vec<u8> {
        wire::encode_datagram(7, 0, 0, &[Message::from_payload(&b"hi"[..])]).unwrap()
    }

    fn assoc() -> Vec<u8> {
        let mut v = b"SK\x01\x02\x04".to_vec();
        v.extend_from_slice(&[9; 8]);
        v
    }

    fn build(frames: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut e = Encoder::new(&mut out);
        for f in frames {
            assert!(e.push(f, MAX_DATAGRAM));
        }
        out
    }

    #[test]
    fn round_trips_both_kinds() {
        let (b, a) = (batch(), assoc());
        let buf = build(&[&a, &b, &a]);
        assert!(is_compound(&buf));
        assert_eq!(buf.len(), encoded_len([a.len(), b.len(), a.len()]));
        let mut out = Vec::new();
        decode(&Bytes::from(buf), &mut out).unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(&out[0][..], &a[..]);
        assert_eq!(&out[1][..], &b[..]);
        let (_, msgs) = wire::decode(&out[1]).unwrap();
        assert_eq!(&msgs[0].payload[..], b"hi");
    }

    #[test]
    fn encoder_respects_limits() {
        let a = assoc();
        let mut out = Vec::new();
        let mut e = Encoder::new(&mut out);
        assert!(!e.push(&a, HEADER_LEN + a.len()), "no room for the length");
        assert!(e.push(&a, HEADER_LEN + 1 + a.len()));
        assert!(e.is_empty() || e.count() == 1);
        let mut out = Vec::new();
        let mut e = Encoder::new(&mut out);
        for _ in 0..MAX_FRAMES {
            assert!(e.push(&a, MAX_DATAGRAM));
        }
        assert!(!e.push(&a, MAX_DATAGRAM));
        let mut frames = Vec::new();
        decode(&Bytes::from(out), &mut frames).unwrap();
        assert_eq!(frames.len(), MAX_FRAMES);
    }

    #[test]
    fn malformed_inputs_are_rejected_whole() {
        let (b, a) = (batch(), assoc());
        let good = build(&[&a, &b]);
        let mut out = vec![Bytes::new()];
        let reject = |buf: Vec<u8>, out: &mut Vec<Bytes>| decode(&Bytes::from(buf), out);
        // Every truncation fails and appends nothing.
        for n in 0..good.len() {
            assert!(reject(good[..n].to_vec(), &mut out).is_err(), "prefix {n}");
            assert_eq!(out.len(), 1);
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(reject(trailing, &mut out).is_err());
        let mut zero = good.clone();
        zero[4] = 0;
        assert!(reject(zero, &mut out).is_err());
        let mut many = good.clone();
        many[4] = 200;
        assert!(reject(many, &mut out).is_err());
        // A nested compound, a foreign frame, a short frame.
        let nested = build(&[&a]);
        let mut bad = Vec::new();
        Encoder::new(&mut bad).push(&nested, MAX_DATAGRAM);
        assert!(reject(bad, &mut out).is_err());
        assert!(reject(build(&[b"XXXXXXXX"]), &mut out).is_err());
        assert!(reject(build(&[b"SK\x01"]), &mut out).is_err());
        assert_eq!(
            reject(b"SK\x02\x03\x01".to_vec(), &mut out),
            Err(WireError::Version(2))
        );
        assert_eq!(reject(b"QQ".to_vec(), &mut out), Err(WireError::Foreign));
        let mut kind = good.clone();
        kind[3] = 1;
        assert_eq!(reject(kind, &mut out), Err(WireError::Kind(1)));
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut x: u64 = 0x1234_5678_9abc_def1;
        let mut out = Vec::new();
        for i in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 64) as usize;
            let mut buf = b"SK\x01\x03".to_vec();
            buf.push((x >> 8) as u8 % 4);
            for j in 0..len {
                buf.push((x >> (j % 56)) as u8 ^ i as u8);
            }
            out.clear();
            let _ = decode(&Bytes::from(buf), &mut out);
            assert!(out.len() <= MAX_FRAMES);
        }
    }
}
