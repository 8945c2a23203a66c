//! LEB128 variable-length unsigned integers, as used throughout the wire
//! format: 7 bits a byte, low bits first, at most 10 bytes for a `u64`.
//!
//! The decoder is total: it rejects truncated input and encodings that do not
//! fit in 64 bits, and never reads past the slice it is given. This is the
//! one varint of every skiff wire format; [`crate::codec::Reader::varint`]
//! reads it with the one-byte form inline.

use bytes::BufMut;

use crate::error::WireError;

/// The largest number of bytes a `u64` takes.
pub const MAX_LEN: usize = 10;

/// Number of bytes `v` takes when encoded.
#[inline]
pub fn len(v: u64) -> usize {
    // 1 + floor(bits / 7), with 0 taking one byte.
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Appends `v` to `out`.
#[inline]
pub fn put(out: &mut Vec<u8>, v: u64) {
    put_buf(out, v)
}

/// Appends `v` to any buffer (what [`crate::codec::Writer::put_varint`]
/// and every encoder use).
#[inline]
pub fn put_buf<B: BufMut + ?Sized>(out: &mut B, mut v: u64) {
    while v >= 0x80 {
        out.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
}

/// Reads a varint from the front of `buf`, returning the value and the number
/// of bytes it took.
#[inline]
pub fn get(buf: &[u8]) -> Result<(u64, usize), WireError> {
    let mut v: u64 = 0;
    for (i, &b) in buf.iter().enumerate().take(MAX_LEN) {
        if i == MAX_LEN - 1 && b > 1 {
            return Err(WireError::VarintOverflow);
        }
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Ok((v, i + 1));
        }
    }
    if buf.len() >= MAX_LEN {
        Err(WireError::VarintOverflow)
    } else {
        Err(WireError::Truncated { what: "varint" })
    }
}

/// Reads a varint of at most 8 bytes from the front of `word` (the next 8
/// bytes of the input) without a loop: the value and its length, or `None`
/// when no byte of `word` ends it (a longer varint, or the input's end:
/// the caller falls back to [`get`], which gives the same answer on every
/// input `get_word` decodes).
#[inline]
pub fn get_word(word: &[u8; 8]) -> Option<(u64, usize)> {
    let x = u64::from_le_bytes(*word);
    // A zero top bit ends the varint: the lowest such byte is its last.
    let stops = !x & 0x8080_8080_8080_8080;
    if stops == 0 {
        return None;
    }
    let bits = stops.trailing_zeros() + 1;
    // Keep its bytes (up to and including the stop bit) and their low 7
    // bits, then pack the 7-bit groups together pairwise.
    let x = if bits == 64 { x } else { x & ((1 << bits) - 1) };
    let x = x & 0x7f7f_7f7f_7f7f_7f7f;
    let x = ((x & 0x7f00_7f00_7f00_7f00) >> 1) | (x & 0x007f_007f_007f_007f);
    let x = ((x & 0x3fff_0000_3fff_0000) >> 2) | (x & 0x0000_3fff_0000_3fff);
    let x = ((x & 0x0fff_ffff_0000_0000) >> 4) | (x & 0x0000_0000_0fff_ffff);
    Some((x, bits as usize / 8))
}

/// Maps a signed integer to an unsigned one so that small magnitudes stay
/// small (protobuf's zigzag).
#[inline]
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// Inverse of [`zigzag`].
#[inline]
pub fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(v: u64) {
            let mut out = Vec::new();
            put(&mut out, v);
            prop_assert_eq!(out.len(), len(v));
            prop_assert_eq!(get(&out).unwrap(), (v, out.len()));
        }

        #[test]
        fn zigzag_round_trips(v: i64) {
            prop_assert_eq!(unzigzag(zigzag(v)), v);
        }

        #[test]
        fn never_panics(buf: Vec<u8>) {
            let _ = get(&buf);
        }

        /// The word-at-a-time read agrees with the byte loop on every
        /// input it decodes, and declines only varints longer than 8 bytes.
        #[test]
        fn get_word_agrees_with_get(word: [u8; 8], v: u64, junk: [u8; 8]) {
            match get_word(&word) {
                Some(got) => prop_assert_eq!(Ok(got), get(&word)),
                None => prop_assert!(word.iter().all(|&b| b >= 0x80)),
            }
            let mut out = Vec::new();
            put(&mut out, v);
            out.extend_from_slice(&junk);
            let got = get_word(out[..8].try_into().unwrap());
            if len(v) <= 8 {
                prop_assert_eq!(got, Some((v, len(v))));
            } else {
                prop_assert_eq!(got, None);
            }
        }
    }

    #[test]
    fn rejects_overflow_and_truncation() {
        assert_eq!(get(&[0x80; 10]), Err(WireError::VarintOverflow));
        assert_eq!(
            get(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02]),
            Err(WireError::VarintOverflow)
        );
        assert_eq!(
            get(&[0x80, 0x80]),
            Err(WireError::Truncated { what: "varint" })
        );
        assert_eq!(get(&[]), Err(WireError::Truncated { what: "varint" }));
        let mut out = Vec::new();
        put(&mut out, u64::MAX);
        assert_eq!(out.len(), 10);
        assert_eq!(get(&out), Ok((u64::MAX, 10)));
    }
}
