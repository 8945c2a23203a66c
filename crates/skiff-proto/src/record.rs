//! The records of the `file://` log: an append-only file of published
//! messages, one record each.
//!
//! ```text
//!  0         4           8            12           16
//! +---------+-----------+------------+------------+---------------------+
//! | MAGIC   | len (u32) | body crc32 | head crc32 | message, len bytes  |
//! +---------+-----------+------------+------------+---------------------+
//! ```
//!
//! Integers are little-endian; the message is `wire::encode_message`'s.
//! The head checksum covers bytes 0..12, so a damaged length is caught
//! before it is trusted; the body checksum covers the message. [`MAGIC`]
//! marks where a record starts: after damage a reader finds the next
//! record with [`resync`] and goes on from there.
//!
//! Logs written before the checksum (version 1: a bare `len (u32)` then
//! the message) still read: a record that does not start with [`MAGIC`] is
//! read as version 1 (no check beyond decoding). [`MAGIC`] read as a
//! version-1 length is about 4 GB, more than any record can be, so the two
//! never mix up; a log may hold both, old records first.
//!
//! A reader follows a file that is still being written, so a record cut
//! short by the end of what was read is not an error but "no record yet"
//! ([`Next::Partial`]). [`next`] is total and bounded: a length over the
//! reader's limit is refused before anything is sliced.

use bytes::{BufMut, Bytes};

use crate::codec::Reader;
use crate::message::Message;
use crate::wire;

/// The first bytes of every (version 2) record: the mark a reader looks
/// for to find the next record after damage.
pub const MAGIC: [u8; 4] = [0xa5, 0x5b, 0x1f, 0xf7];

/// Bytes before a record's message.
pub const HEAD: usize = 16;

/// Bytes before a version-1 record's message: its length.
pub const LEN_PREFIX: usize = 4;

/// Appends one record holding `msg` (the caller checks it against the wire
/// limits first, e.g. with [`wire::check`]).
pub fn encode(out: &mut Vec<u8>, msg: &Message) {
    let start = out.len();
    out.extend_from_slice(&[0; HEAD]);
    wire::encode_message(out, msg, false);
    let len = (out.len() - start - HEAD) as u32;
    let body = crc32fast::hash(&out[start + HEAD..]);
    let head = &mut out[start..start + HEAD];
    head[..4].copy_from_slice(&MAGIC);
    head[4..8].copy_from_slice(&len.to_le_bytes());
    head[8..12].copy_from_slice(&body.to_le_bytes());
    let check = crc32fast::hash(&head[..12]);
    head[12..].copy_from_slice(&check.to_le_bytes());
}

/// Appends one version-1 record (no magic, no checksum): for tests of
/// reading old logs.
pub fn encode_v1(out: &mut Vec<u8>, msg: &Message) {
    let start = out.len();
    out.put_u32_le(0);
    wire::encode_message(out, msg, false);
    let len = (out.len() - start - LEN_PREFIX) as u32;
    out[start..start + LEN_PREFIX].copy_from_slice(&len.to_le_bytes());
}

/// What [`next`] found at an offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// A whole record: its message (zero-copy slices of the data) and the
    /// offset after it.
    Record(Message, usize),
    /// The data ends before the record does: a record still being written
    /// (or a torn one, if nothing follows it).
    Partial,
    /// Not a valid record: why. The reader skips it with [`resync`].
    Damaged(&'static str),
}

/// The record at offset `at` of `data`, read with records of at most `max`
/// bytes.
pub fn next(data: &Bytes, at: usize, max: usize) -> Next {
    let rest = data.get(at..).unwrap_or_default();
    if rest.len() < MAGIC.len() {
        return Next::Partial;
    }
    if rest[..4] != MAGIC {
        return next_v1(data, at, max);
    }
    if rest.len() < HEAD {
        return Next::Partial;
    }
    let word = |i: usize| u32::from_le_bytes(rest[i..i + 4].try_into().expect("4 bytes"));
    if crc32fast::hash(&rest[..12]) != word(12) {
        return Next::Damaged("record head checksum");
    }
    let len = word(4) as usize;
    if len > max {
        return Next::Damaged("record length over the limit");
    }
    if rest.len() - HEAD < len {
        return Next::Partial;
    }
    let start = at + HEAD;
    if crc32fast::hash(&data[start..start + len]) != word(8) {
        return Next::Damaged("record checksum");
    }
    match wire::decode_message(&data.slice(start..start + len), max) {
        Ok(msg) => Next::Record(msg, start + len),
        Err(_) => Next::Damaged("record message does not decode"),
    }
}

/// A version-1 record (a bare length, then the message) at `at`.
fn next_v1(data: &Bytes, at: usize, max: usize) -> Next {
    let mut r = Reader::at(data, at);
    let Ok(len) = r.u32("log record length") else {
        return Next::Partial;
    };
    let len = u64::from(len);
    if len > max as u64 {
        return Next::Damaged("record length over the limit");
    }
    if (r.remaining() as u64) < len {
        return Next::Partial;
    }
    let Ok(body) = r.shared_len(len, max, "log record") else {
        return Next::Damaged("record length over the limit");
    };
    match wire::decode_message(&body, max) {
        Ok(msg) => Next::Record(msg, r.pos()),
        Err(_) => Next::Damaged("record message does not decode"),
    }
}

/// Where the next record may start at or after `from`: `Ok(offset)` of the
/// next [`MAGIC`], or `Err(offset)` when there is none in `data` and the
/// search should go on from `offset` once more data is there (a mark cut
/// by the end of `data` starts at or after it).
pub fn resync(data: &[u8], from: usize) -> Result<usize, usize> {
    let rest = data.get(from..).unwrap_or_default();
    match rest.windows(MAGIC.len()).position(|w| w == MAGIC) {
        Some(i) => Ok(from + i),
        None => Err(from.max(data.len().saturating_sub(MAGIC.len() - 1))),
    }
}

/// A walk over the records of `data` from `at` that skips damage: the
/// next message and the offset after it, counting what it skipped in
/// `skipped`. `None` once the data ends; `at` is then where to go on
/// when more data is there.
///
/// A record cut short by the end of `data` is a record still being
/// written, unless a whole valid record starts after its start: then it
/// is a torn record (e.g. the disk filled mid-append, and the log was
/// appended to since), skipped as damage.
pub fn next_skipping(
    data: &Bytes,
    at: &mut usize,
    max: usize,
    skipped: &mut Skipped,
) -> Option<Message> {
    loop {
        let why = match next(data, *at, max) {
            Next::Record(msg, end) => {
                *at = end;
                skipped.open = false;
                return Some(msg);
            }
            Next::Partial => match resync(data, *at + 1) {
                Ok(p) if matches!(next(data, p, max), Next::Record(..)) => "torn record",
                _ => return None,
            },
            Next::Damaged(why) => why,
        };
        let from = *at;
        match resync(data, *at + 1) {
            Ok(p) => *at = p,
            // Damage up to the end: what follows may be a record still
            // being written; look again from here when there is more.
            Err(p) => {
                *at = p;
                skipped.note(from, p, why, true);
                return None;
            }
        }
        skipped.note(from, *at, why, false);
    }
}

/// Damage a reader skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Damaged stretches skipped, each counted once: a damaged record and
    /// whatever follows it up to the next valid record's mark.
    pub records: u64,
    /// Bytes skipped.
    pub bytes: u64,
    /// The last stretch: offset in the data walked, length and why.
    pub last: Option<(usize, usize, &'static str)>,
    /// The last stretch ran to the end of the data: damage at the start of
    /// the next walk is the same stretch.
    open: bool,
}

impl Skipped {
    fn note(&mut self, from: usize, to: usize, why: &'static str, open: bool) {
        if self.open {
            self.bytes += (to - from) as u64;
        } else {
            self.records += 1;
            self.bytes += (to - from) as u64;
            self.last = Some((from, to - from, why));
        }
        self.open = open;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 1 << 20;

    fn msgs(n: usize) -> Vec<Message> {
        (0..n)
            .map(|i| Message::new("log.t", format!("message {i}").into_bytes()))
            .collect()
    }

    /// The log of `msgs` and where each record starts.
    fn log(msgs: &[Message]) -> (Vec<u8>, Vec<usize>) {
        let mut out = Vec::new();
        let mut starts = Vec::new();
        for m in msgs {
            starts.push(out.len());
            encode(&mut out, m);
        }
        (out, starts)
    }

    fn read_all(data: &[u8]) -> (Vec<Message>, Skipped, usize) {
        let data = Bytes::copy_from_slice(data);
        let (mut at, mut skipped, mut out) = (0, Skipped::default(), Vec::new());
        while let Some(m) = next_skipping(&data, &mut at, MAX, &mut skipped) {
            out.push(m);
        }
        (out, skipped, at)
    }

    #[test]
    fn records_round_trip_and_a_cut_record_is_not_yet_there() {
        let msgs = [
            Message::new("a.b", &b"one"[..]),
            Message::new("c", vec![7u8; 300]),
        ];
        let (log, starts) = log(&msgs);
        let data = Bytes::from(log);
        let Next::Record(m0, at) = next(&data, 0, MAX) else {
            panic!("no first record")
        };
        let Next::Record(m1, end) = next(&data, at, MAX) else {
            panic!("no second record")
        };
        assert_eq!(
            (at, &m0, &m1, end),
            (starts[1], &msgs[0], &msgs[1], data.len())
        );
        assert_eq!(next(&data, end, MAX), Next::Partial);
        for cut in at..data.len() {
            assert_eq!(
                next(&data.slice(..cut), at, MAX),
                Next::Partial,
                "cut {cut}"
            );
        }
    }

    #[test]
    fn version_1_records_still_read_before_version_2_ones() {
        let msgs = msgs(4);
        let mut old = Vec::new();
        encode_v1(&mut old, &msgs[0]);
        encode_v1(&mut old, &msgs[1]);
        encode(&mut old, &msgs[2]);
        encode(&mut old, &msgs[3]);
        let (read, skipped, end) = read_all(&old);
        assert_eq!((read, skipped, end), (msgs, Skipped::default(), old.len()));
        // MAGIC as a version-1 length is over any limit.
        assert!(u32::from_le_bytes(MAGIC) as usize > 64 << 20);
    }

    #[test]
    fn a_damaged_record_is_skipped_and_counted_and_the_rest_read() {
        let msgs = msgs(10);
        let (clean, starts) = log(&msgs);
        // Each byte of record 4 flipped in turn: head or body, it is
        // skipped and every other record read.
        for i in starts[4]..starts[5] {
            let mut bad = clean.clone();
            bad[i] ^= 0x40;
            let (read, skipped, end) = read_all(&bad);
            let mut want = msgs.clone();
            want.remove(4);
            assert_eq!(read, want, "byte {i}");
            assert_eq!((skipped.records, end), (1, bad.len()), "byte {i}");
            assert_eq!(skipped.bytes as usize, starts[5] - starts[4], "byte {i}");
        }
    }

    #[test]
    fn a_torn_record_followed_by_more_is_skipped_and_a_torn_tail_waits() {
        let msgs = msgs(6);
        let (clean, starts) = log(&msgs);
        for cut in [
            starts[3] + 1,
            starts[3] + 5,
            starts[3] + HEAD + 3,
            starts[4] - 1,
        ] {
            // Torn at the end: the reader waits there.
            let (read, skipped, end) = read_all(&clean[..cut]);
            assert_eq!(
                (read, skipped.records, end),
                (msgs[..3].to_vec(), 0, starts[3])
            );
            // Then appended to: the torn record is skipped.
            let mut torn = clean[..cut].to_vec();
            torn.extend_from_slice(&clean[starts[4]..]);
            let (read, skipped, end) = read_all(&torn);
            let want: Vec<_> = msgs
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != 3)
                .map(|(_, m)| m.clone())
                .collect();
            assert_eq!(
                (read, skipped.records, end),
                (want, 1, torn.len()),
                "cut {cut}"
            );
        }
    }

    #[test]
    fn garbage_is_one_stretch_even_when_read_in_pieces() {
        let msgs = msgs(2);
        let (rec, _) = log(&msgs[..1]);
        let mut data = rec.clone();
        data.extend_from_slice(&[0xee; 100]);
        let (rec2, _) = log(&msgs[1..]);
        let whole = [data.clone(), rec2].concat();
        let data = Bytes::from(whole.clone());
        let (mut at, mut skipped) = (0, Skipped::default());
        let mut read = Vec::new();
        for upto in [rec.len() + 10, rec.len() + 50, whole.len()] {
            let part = data.slice(..upto);
            while let Some(m) = next_skipping(&part, &mut at, MAX, &mut skipped) {
                read.push(m);
            }
        }
        assert_eq!(
            (read, skipped.records, skipped.bytes, at),
            (msgs, 1, 100, whole.len())
        );
    }

    #[test]
    fn a_length_over_the_limit_or_a_bad_message_is_damage() {
        let mut huge = Vec::new();
        huge.put_u32_le(u32::MAX - 1);
        assert!(matches!(next(&Bytes::from(huge), 0, MAX), Next::Damaged(_)));
        let mut bad = Vec::new();
        bad.put_u32_le(2);
        bad.extend_from_slice(&[0xff, 0]);
        assert!(matches!(next(&Bytes::from(bad), 0, MAX), Next::Damaged(_)));
        assert_eq!(
            next(&Bytes::from_static(b"\x01\x02"), 0, 100),
            Next::Partial
        );
        assert_eq!(
            next(&Bytes::from_static(b"\x01\x02"), 9, 100),
            Next::Partial
        );
        assert_eq!(resync(b"ab", 5), Err(5));
        assert_eq!(resync(&[1, 2, 3, 4, 5, 6], 0), Err(3));
    }
}
