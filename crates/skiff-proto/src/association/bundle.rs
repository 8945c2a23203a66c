//! Bundles: several small messages carried as one association message,
//! each keeping its own boundaries, so that a run of small messages costs
//! the association one queue entry, one chunk, one reassembly and one
//! event instead of one of each per message.
//!
//! A bundle travels as an ordinary association message whose first chunk
//! has the BUNDLE flag (see [`frame`](super::frame)); its bytes are
//! records, back to back, at least one:
//!
//! ```text
//! +------------+-------------+------------+-------------+-----
//! | len varint | len bytes   | len varint | len bytes   | ...
//! +------------+-------------+------------+-------------+-----
//! ```
//!
//! A record may be empty (an empty message). The receiving association
//! checks a whole bundle with [`validate`] before delivering it (a bundle
//! that does not parse is a protocol violation: the association fails), so
//! the reader splits it with [`split_next`] lazily, one message per call,
//! each a slice of the bundle's one buffer.
//!
//! Bundles are sent only to a peer that offered them at set-up
//! ([`FEATURE_BUNDLES`], see [`Association::bundles`](super::Association::bundles)),
//! so a peer built before them never gets one.

use bytes::{Buf, BufMut, Bytes};

use crate::error::WireError;
use crate::varint;

/// The feature bit an end sets at set-up to say it takes bundles.
pub const FEATURE_BUNDLES: u64 = 1;

/// Bytes of framing before a record of `len` bytes.
#[inline]
pub fn record_overhead(len: usize) -> usize {
    varint::len(len as u64)
}

/// Appends one record (`msg` with its length) to a bundle being built.
#[inline]
pub fn put<B: BufMut + ?Sized>(out: &mut B, msg: &[u8]) {
    varint::put_buf(out, msg.len() as u64);
    out.put_slice(msg);
}

/// Checks that `b` is a bundle: at least one record, every record's length
/// within what is left. Returns how many records it holds. Total and
/// bounded: reads each length once, allocates nothing.
pub fn validate(b: &[u8]) -> Result<usize, WireError> {
    if b.is_empty() {
        return Err(WireError::Malformed("empty bundle"));
    }
    let mut pos = 0;
    let mut n = 0;
    while pos < b.len() {
        let (len, used) = varint::get(&b[pos..]).map_err(|e| match e {
            WireError::Truncated { .. } => WireError::Truncated {
                what: "bundle record length",
            },
            e => e,
        })?;
        pos += used;
        let rest = (b.len() - pos) as u64;
        if len > rest {
            return Err(WireError::Truncated {
                what: "bundle record",
            });
        }
        pos += len as usize;
        n += 1;
    }
    Ok(n)
}

/// Takes the next record's message off the front of a bundle checked by
/// [`validate`] (a slice of the same buffer, no copy). `None` when the
/// bundle is used up; on bytes that are not a bundle it empties `b` and
/// returns `None` rather than panic.
#[inline]
pub fn split_next(b: &mut Bytes) -> Option<Bytes> {
    let (start, end) = next_span(b)?;
    b.advance(start);
    Some(b.split_to(end - start))
}

/// Where the next record's message lies in `b`: `start..end`, `end` being
/// where the record after it begins. `None` when `b` is used up; on bytes
/// that are not a bundle it empties `b` and returns `None` rather than
/// panic. For a reader that lends the message in place and then advances
/// `b` by `end` itself ([`split_next`] cuts it out as a `Bytes`).
#[inline]
pub fn next_span(b: &mut Bytes) -> Option<(usize, usize)> {
    if b.is_empty() {
        return None;
    }
    match varint::get(b) {
        Ok((len, used)) if len <= (b.len() - used) as u64 => Some((used, used + len as usize)),
        _ => {
            b.clear();
            None
        }
    }
}

/// The messages of a bundle checked by [`validate`], in order.
pub fn records(mut b: Bytes) -> impl Iterator<Item = Bytes> {
    std::iter::from_fn(move || split_next(&mut b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn build(msgs: &[Vec<u8>]) -> Bytes {
        let mut out = Vec::new();
        for m in msgs {
            put(&mut out, m);
        }
        out.into()
    }

    #[test]
    fn malformed_bundles_are_refused() {
        assert!(validate(&[]).is_err(), "empty");
        assert!(validate(&[5, 1, 2]).is_err(), "record past the end");
        assert!(validate(&[0x80]).is_err(), "length cut short");
        assert!(validate(&[0xff; 11]).is_err(), "length overflows");
        assert_eq!(validate(&[0]).unwrap(), 1, "one empty record");
        assert_eq!(validate(&[1, 9, 0, 2, 7, 7]).unwrap(), 3);
    }

    #[test]
    fn split_next_never_panics_on_garbage() {
        let mut b = Bytes::from_static(&[9, 1, 2]);
        assert_eq!(split_next(&mut b), None);
        assert!(b.is_empty());
    }

    proptest! {
        /// Random sequences of sizes (empty ones included) round-trip with
        /// their boundaries, split one at a time.
        #[test]
        fn records_round_trip(sizes in proptest::collection::vec(0usize..400, 1..60), seed: u8) {
            let msgs: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| vec![seed.wrapping_add(i as u8); n])
                .collect();
            let b = build(&msgs);
            let framing: usize = sizes.iter().map(|&n| record_overhead(n)).sum();
            prop_assert_eq!(b.len(), sizes.iter().sum::<usize>() + framing);
            prop_assert_eq!(validate(&b).unwrap(), msgs.len());
            let got: Vec<Vec<u8>> = records(b).map(|m| m.to_vec()).collect();
            prop_assert_eq!(got, msgs);
        }

        /// Any bytes: `validate` answers, and what it accepts splits into
        /// exactly the records it counted, covering every byte.
        #[test]
        fn validate_is_total(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(n) = validate(&bytes) {
                let got: Vec<Bytes> = records(Bytes::from(bytes.clone())).collect();
                prop_assert_eq!(got.len(), n);
                prop_assert!(got.iter().map(|m| m.len() + 1).sum::<usize>() <= bytes.len());
            }
        }
    }
}
