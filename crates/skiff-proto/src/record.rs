//! The records of the `file://` log: an append-only file of published
//! messages, one record each.
//!
//! ```text
//!  0           4
//! +-----------+----------------------------------------+
//! | len (u32) | message (wire::encode_message), len B  |
//! +-----------+----------------------------------------+
//! ```
//!
//! The length is little-endian. A reader follows a file that is still being
//! written, so a record cut short by the end of what was read is not an
//! error but "no record yet". [`next`] is total and bounded: a length over
//! the reader's limit is refused before anything is sliced.

use bytes::{BufMut, Bytes};

use crate::codec::Reader;
use crate::error::WireError;
use crate::message::Message;
use crate::wire;

/// Bytes before a record's message: its length.
pub const LEN_PREFIX: usize = 4;

/// Appends one record holding `msg` (the caller checks it against the wire
/// limits first, e.g. with [`wire::check`]).
pub fn encode(out: &mut Vec<u8>, msg: &Message) {
    let start = out.len();
    out.put_u32_le(0);
    wire::encode_message(out, msg, false);
    let len = (out.len() - start - LEN_PREFIX) as u32;
    out[start..start + LEN_PREFIX].copy_from_slice(&len.to_le_bytes());
}

/// The record at offset `at` of `data`: its message (zero-copy slices of
/// `data`) and the offset after it; `Ok(None)` when `data` ends before the
/// record does (a record still being written). A length above `max` is
/// [`WireError::TooLong`] (the log is corrupt), as is a message that does
/// not decode or whose payload is over `max`.
pub fn next(data: &Bytes, at: usize, max: usize) -> Result<Option<(Message, usize)>, WireError> {
    let mut r = Reader::at(data, at);
    let Ok(len) = r.u32("log record length") else {
        return Ok(None);
    };
    let len = u64::from(len);
    if len > max as u64 {
        return Err(WireError::TooLong {
            what: "log record",
            len,
            max,
        });
    }
    if (r.remaining() as u64) < len {
        return Ok(None);
    }
    let body = r.shared_len(len, max, "log record")?;
    let msg = wire::decode_message(&body, max)?;
    Ok(Some((msg, r.pos())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_a_cut_record_is_not_yet_there() {
        let msgs = [
            Message::new("a.b", &b"one"[..]),
            Message::new("c", vec![7u8; 300]),
        ];
        let mut log = Vec::new();
        for m in &msgs {
            encode(&mut log, m);
        }
        let data = Bytes::from(log);
        let (m0, at) = next(&data, 0, 1 << 20).unwrap().unwrap();
        let (m1, end) = next(&data, at, 1 << 20).unwrap().unwrap();
        assert_eq!(
            (m0, m1, end),
            (msgs[0].clone(), msgs[1].clone(), data.len())
        );
        assert_eq!(next(&data, end, 1 << 20), Ok(None));
        for cut in at..data.len() {
            assert_eq!(next(&data.slice(..cut), at, 1 << 20), Ok(None), "cut {cut}");
        }
    }

    #[test]
    fn a_corrupt_length_or_message_is_an_error() {
        let mut huge = Vec::new();
        huge.put_u32_le(u32::MAX);
        assert!(matches!(
            next(&Bytes::from(huge), 0, 1 << 20),
            Err(WireError::TooLong { .. })
        ));
        let mut bad = Vec::new();
        bad.put_u32_le(2);
        bad.extend_from_slice(&[0xff, 0]);
        assert!(next(&Bytes::from(bad), 0, 1 << 20).is_err());
        assert_eq!(next(&Bytes::from_static(b"\x01\x02"), 0, 100), Ok(None));
        assert_eq!(next(&Bytes::from_static(b"\x01\x02"), 9, 100), Ok(None));
    }
}
