//! Malformed datagrams, one named test per case, each asserting the exact
//! `WireError` and the stats label a receiver counts it under; then random
//! bytes and random mutations of valid datagrams, which must never panic and
//! must leave the output untouched when they fail.

use bytes::Bytes;
use proptest::prelude::*;
use skiff_proto::error::Reason;
use skiff_proto::wire::{self, Header, Kind, HEADER_LEN, MAX_DATAGRAM, MAX_FIELDS, MAX_SUBJECT};
use skiff_proto::{varint, LossDetector, Message, Value, WireError};

/// Message flag bits (see `docs/wire.md`).
const S: u8 = 1;
const R: u8 = 2;
const T: u8 = 4;
const F: u8 = 8;

/// A datagram with a valid header claiming `count` messages, then `body`.
fn dgram(count: u16, body: &[u8]) -> Vec<u8> {
    let mut out = vec![0; HEADER_LEN];
    Header {
        kind: Kind::Batch,
        source: 0x5eed,
        endpoint: 2,
        base_seq: 100,
        count,
    }
    .write(&mut out);
    out.extend_from_slice(body);
    out
}

/// Decodes `buf`, which must fail, into a vector that already holds a
/// message; checks that the vector is left as it was and returns the error.
fn reject(buf: Vec<u8>) -> WireError {
    let sentinel = Message::new("already.here", "x");
    let mut out = vec![sentinel.clone()];
    let res = wire::decode_into(&Bytes::from(buf), &mut out);
    assert_eq!(out, [sentinel], "a rejected datagram changed the output");
    res.expect_err("malformed datagram was accepted")
}

/// A one-message body: `flags`, then `rest`.
fn one(flags: u8, rest: &[u8]) -> Vec<u8> {
    dgram(1, &[&[flags][..], rest].concat())
}

/// A one-message body with one field `k` whose tag and value bytes follow.
fn field(tag_and_value: &[u8]) -> Vec<u8> {
    one(F, &[&[1, 1, b'k'][..], tag_and_value, &[0]].concat())
}

fn varint(v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    varint::put(&mut out, v);
    out
}

#[test]
fn valid_baseline_decodes() {
    // The bodies below are built from these pieces; check the pieces work.
    let buf = dgram(
        2,
        &[
            &[S | T | F, 3, b'a', b'.', b'b', 2, b'e', b'v', 2][..],
            &[1, b'k', 0, 1], // k = true
            &[1, b'n', 1, 3], // n = -2 (zigzag 3)
            &[2, b'h', b'i'], // payload "hi"
            &[R, 0],          // same subject, empty payload
        ]
        .concat(),
    );
    let (h, msgs) = wire::decode(&Bytes::from(buf)).unwrap();
    assert_eq!(h.count, 2);
    assert_eq!(&*msgs[0].subject, "a.b");
    assert_eq!(msgs[0].kind.as_deref(), Some("ev"));
    assert_eq!(msgs[0].field("k"), Some(&Value::Bool(true)));
    assert_eq!(msgs[0].field("n"), Some(&Value::Int(-2)));
    assert_eq!(msgs[0].payload, "hi");
    assert_eq!(&*msgs[1].subject, "a.b");
    assert_eq!((msgs[0].meta.seq, msgs[1].meta.seq), (100, 101));
    assert_eq!(msgs[1].meta.source, 0x5eed);
}

// ---------------------------------------------------------------- header

#[test]
fn foreign_magic() {
    let mut buf = dgram(1, &[0, 0]);
    buf[0..2].copy_from_slice(b"GE");
    assert_eq!(reject(buf), WireError::Foreign);
    assert_eq!(reject(b"SX".to_vec()), WireError::Foreign);
    assert_eq!(reject(b"x".to_vec()), WireError::Foreign);
    assert_eq!(WireError::Foreign.reason(), "foreign");
}

#[test]
fn wrong_version() {
    for v in [0, 2, 0xff] {
        let mut buf = dgram(1, &[0, 0]);
        buf[2] = v;
        assert_eq!(reject(buf), WireError::Version(v));
    }
    // The version is judged before the length: a peer speaking another
    // version is told so even from three bytes.
    assert_eq!(reject(b"SK\x09".to_vec()), WireError::Version(9));
    assert_eq!(WireError::Version(2).reason(), "version");
}

#[test]
fn unknown_kind() {
    for k in [0, 2, 0xff] {
        let mut buf = dgram(1, &[0, 0]);
        buf[3] = k;
        assert_eq!(reject(buf), WireError::Kind(k));
    }
    assert_eq!(WireError::Kind(0).reason(), "kind");
}

#[test]
fn truncated_header() {
    let header = dgram(1, &[]);
    for n in [0, 1, 2, 3, 4, 12, HEADER_LEN - 1] {
        assert_eq!(
            reject(header[..n].to_vec()),
            WireError::Truncated { what: "header" },
            "{n} bytes"
        );
    }
    assert_eq!(
        WireError::Truncated { what: "header" }.reason(),
        "truncated"
    );
}

#[test]
fn header_only_is_truncated_batch() {
    assert_eq!(
        reject(dgram(1, &[])),
        WireError::Truncated { what: "batch" }
    );
}

#[test]
fn count_larger_than_body() {
    // Claims more messages than the body could hold at 2 bytes each: refused
    // before anything is reserved.
    assert_eq!(
        reject(dgram(u16::MAX, &[0, 0, 0, 0])),
        WireError::Truncated { what: "batch" }
    );
    assert_eq!(
        reject(dgram(3, &[0, 0, 0, 0])),
        WireError::Truncated { what: "batch" }
    );
    // Plausible by size, but the body holds one 4-byte message, not two.
    assert_eq!(
        reject(dgram(2, &[0, 2, b'h', b'i'])),
        WireError::Truncated {
            what: "message flags"
        }
    );
}

#[test]
fn datagram_over_max_is_too_long() {
    let mut buf = dgram(1, &[0, 0]);
    buf.resize(MAX_DATAGRAM + 1, 0);
    assert_eq!(
        reject(buf),
        WireError::TooLong {
            what: "datagram",
            len: MAX_DATAGRAM as u64 + 1,
            max: MAX_DATAGRAM
        }
    );
    assert_eq!(
        WireError::TooLong {
            what: "datagram",
            len: 0,
            max: 0
        }
        .reason(),
        "oversized"
    );
}

#[test]
fn empty_batch() {
    assert_eq!(reject(dgram(0, &[])), WireError::Malformed("empty batch"));
    assert_eq!(
        reject(dgram(0, &[0, 0])),
        WireError::Malformed("empty batch")
    );
    assert_eq!(WireError::Malformed("empty batch").reason(), "malformed");
}

// ---------------------------------------------------------------- message flags and subject

#[test]
fn reserved_flag_bits() {
    // Bit 4 is the best-effort flag; 5..7 stay reserved.
    for bit in 5..8 {
        assert_eq!(
            reject(one(1 << bit, &[0])),
            WireError::Malformed("reserved message flag bits set"),
            "bit {bit}"
        );
    }
}

#[test]
fn subject_both_sent_and_repeated() {
    assert_eq!(
        reject(dgram(2, &[S, 1, b'a', 0, S | R, 1, b'a', 0])),
        WireError::Malformed("subject both sent and repeated")
    );
}

#[test]
fn repeat_with_no_previous() {
    let no_previous = WireError::Malformed("repeated subject with no previous subject");
    // First message of the batch.
    assert_eq!(reject(one(R, &[0])), no_previous);
    // After a message with the empty subject: "previous" means the message
    // just before, not the last non-empty subject.
    assert_eq!(reject(dgram(3, &[S, 1, b'a', 0, 0, 0, R, 0])), no_previous);
}

#[test]
fn empty_subject_sent_explicitly() {
    assert_eq!(
        reject(one(S, &[0, 0])),
        WireError::Malformed("empty subject sent explicitly")
    );
}

#[test]
fn subject_too_long() {
    let mut rest = varint(MAX_SUBJECT as u64 + 1);
    rest.extend(vec![b'a'; MAX_SUBJECT + 1]);
    rest.push(0);
    assert_eq!(
        reject(one(S, &rest)),
        WireError::TooLong {
            what: "subject",
            len: MAX_SUBJECT as u64 + 1,
            max: MAX_SUBJECT
        }
    );
    // A huge claimed length is refused by its limit, without allocating.
    assert_eq!(
        reject(one(S, &varint(u64::MAX))),
        WireError::TooLong {
            what: "subject",
            len: u64::MAX,
            max: MAX_SUBJECT
        }
    );
}

#[test]
fn subject_past_the_end() {
    assert_eq!(
        reject(one(S, &[10, b'a', b'b'])),
        WireError::Truncated { what: "subject" }
    );
}

#[test]
fn bad_utf8_in_subject() {
    assert_eq!(
        reject(one(S, &[2, 0xc3, 0x28, 0])),
        WireError::Utf8("subject")
    );
    assert_eq!(WireError::Utf8("subject").reason(), "malformed");
}

#[test]
fn bad_utf8_in_type() {
    assert_eq!(reject(one(T, &[1, 0xff, 0])), WireError::Utf8("type"));
}

#[test]
fn type_past_the_end() {
    assert_eq!(
        reject(one(T, &[200, b'e', b'v'])),
        WireError::Truncated { what: "type" }
    );
}

// ---------------------------------------------------------------- fields

#[test]
fn bad_utf8_in_key() {
    assert_eq!(
        reject(one(F, &[1, 2, 0xe2, 0x82, 0, 1, 0])),
        WireError::Utf8("field key")
    );
}

#[test]
fn bad_utf8_in_string_field() {
    assert_eq!(
        reject(field(&[3, 3, b'o', 0x80, b'k'])),
        WireError::Utf8("string field")
    );
}

#[test]
fn bad_bool() {
    for b in [2, 0x80, 0xff] {
        assert_eq!(
            reject(field(&[0, b])),
            WireError::Malformed("bool is neither 0 nor 1")
        );
    }
}

#[test]
fn unknown_field_tag() {
    for tag in [5, 6, 0x7f, 0xff] {
        assert_eq!(
            reject(field(&[tag, 0])),
            WireError::Malformed("unknown field tag")
        );
    }
}

#[test]
fn field_count_zero() {
    assert_eq!(
        reject(one(F, &[0, 0])),
        WireError::TooLong {
            what: "field count",
            len: 0,
            max: MAX_FIELDS
        }
    );
}

#[test]
fn field_count_over_max() {
    assert_eq!(
        reject(one(F, &[MAX_FIELDS as u8 + 1, 0])),
        WireError::TooLong {
            what: "field count",
            len: MAX_FIELDS as u64 + 1,
            max: MAX_FIELDS
        }
    );
    assert_eq!(
        reject(one(F, &varint(u64::MAX))),
        WireError::TooLong {
            what: "field count",
            len: u64::MAX,
            max: MAX_FIELDS
        }
    );
}

#[test]
fn field_count_past_the_end() {
    // 64 fields claimed, one present: the reservation is bounded by the
    // bytes left and the missing fields are reported as truncation.
    assert_eq!(
        reject(one(F, &[64, 1, b'k', 0, 1])),
        WireError::Truncated {
            what: "field key length"
        }
    );
}

#[test]
fn field_values_past_the_end() {
    assert_eq!(
        reject(one(F, &[1, 1, b'k', 2, 1, 2, 3])),
        WireError::Truncated { what: "float" }
    );
    assert_eq!(
        reject(one(F, &[1, 1, b'k', 4, 9, 1, 2])),
        WireError::Truncated {
            what: "bytes field"
        }
    );
    assert_eq!(
        reject(one(F, &[1, 1, b'k', 3, 9, b'a'])),
        WireError::Truncated {
            what: "string field"
        }
    );
    assert_eq!(
        reject(one(F, &[1, 1, b'k', 0])),
        WireError::Truncated { what: "bool" }
    );
    assert_eq!(
        reject(one(F, &[1, 1, b'k', 1, 0x80])),
        WireError::Truncated { what: "int" }
    );
    assert_eq!(
        reject(one(F, &[1, 5, b'k'])),
        WireError::Truncated { what: "field key" }
    );
    assert_eq!(
        reject(one(F, &[1, 1, b'k'])),
        WireError::Truncated { what: "field tag" }
    );
}

#[test]
fn field_lengths_over_max() {
    let mut rest = vec![1, 1, b'k', 3];
    rest.extend(varint(MAX_DATAGRAM as u64 + 1));
    assert_eq!(
        reject(one(F, &rest)),
        WireError::TooLong {
            what: "string field",
            len: MAX_DATAGRAM as u64 + 1,
            max: MAX_DATAGRAM
        }
    );
    let mut rest = vec![1, 1, b'k', 4];
    rest.extend(varint(u64::MAX));
    assert_eq!(
        reject(one(F, &rest)),
        WireError::TooLong {
            what: "bytes field",
            len: u64::MAX,
            max: MAX_DATAGRAM
        }
    );
}

// ---------------------------------------------------------------- varints, payload, trailer

#[test]
fn varint_overflow() {
    // Eleven bytes with the continuation bit: longer than any u64.
    assert_eq!(reject(one(0, &[0x80; 11])), WireError::VarintOverflow);
    // Ten bytes whose last carries more than bit 63.
    let mut v = vec![0xff; 9];
    v.push(0x02);
    assert_eq!(reject(one(0, &v)), WireError::VarintOverflow);
    // In a field count, and in an int field.
    assert_eq!(reject(one(F, &[0x80; 10])), WireError::VarintOverflow);
    assert_eq!(
        reject(field(&[&[1][..], &[0xff; 10]].concat())),
        WireError::VarintOverflow
    );
    assert_eq!(WireError::VarintOverflow.reason(), "malformed");
}

#[test]
fn varint_truncated() {
    assert_eq!(
        reject(one(0, &[0x80, 0x80])),
        WireError::Truncated {
            what: "payload length"
        }
    );
    assert_eq!(
        reject(one(S, &[0x80])),
        WireError::Truncated {
            what: "subject length"
        }
    );
}

#[test]
fn payload_length_past_the_end() {
    assert_eq!(
        reject(one(0, &[100, 1, 2, 3])),
        WireError::Truncated { what: "payload" }
    );
    let mut rest = varint(MAX_DATAGRAM as u64 + 1);
    rest.extend([0; 8]);
    assert_eq!(
        reject(one(0, &rest)),
        WireError::TooLong {
            what: "payload",
            len: MAX_DATAGRAM as u64 + 1,
            max: MAX_DATAGRAM
        }
    );
}

#[test]
fn trailing_garbage() {
    let trailing = WireError::Malformed("trailing bytes after the last message");
    assert_eq!(reject(one(0, &[1, b'x', 7])), trailing);
    assert_eq!(reject(one(0, &[1, b'x', 0, 0, 0, 1])), trailing);
    // Zeros alone are padding, and accepted.
    let (_, msgs) = wire::decode(&Bytes::from(one(0, &[1, b'x', 0, 0, 0]))).unwrap();
    assert_eq!(msgs.len(), 1);
}

#[test]
fn error_in_a_later_message_drops_the_whole_datagram() {
    // Two good messages, then one with a bad bool: nothing is delivered.
    let buf = dgram(
        3,
        &[&[0, 1, b'a', 0, 1, b'b'][..], &[F, 1, 1, b'k', 0, 9, 0]].concat(),
    );
    assert_eq!(reject(buf), WireError::Malformed("bool is neither 0 nor 1"));
}

/// Sequence numbers come from the peer. Hostile ones (near `u64::MAX`, from
/// several sources) must not overflow the receiver's loss counters, which
/// would panic in a debug build and wrap to nonsense in a release build.
#[test]
fn hostile_sequence_numbers_do_not_overflow_loss_counters() {
    let mut d = LossDetector::new(8);
    for source in 0..4 {
        let buf = Bytes::from(
            wire::encode_datagram(source, 0, u64::MAX - 1, &[Message::from_payload("x")]).unwrap(),
        );
        let (_, msgs) = wire::decode(&buf).unwrap();
        for m in msgs {
            d.check(m.meta.source, m.meta.seq, std::time::Instant::now);
        }
    }
    assert!(d.stats().lost >= u64::MAX - 1);
}

// ---------------------------------------------------------------- random input

fn valid_datagram() -> impl Strategy<Value = Vec<u8>> {
    let msg = (
        prop_oneof![Just(""), Just("a.b"), Just("daq.hallb.rate")],
        proptest::option::of("[a-z]{0,6}"),
        proptest::collection::vec(
            (
                "[a-z]{0,4}",
                prop_oneof![
                    any::<bool>().prop_map(Value::Bool),
                    any::<i64>().prop_map(Value::Int),
                    any::<f64>().prop_map(Value::Float),
                    "\\PC{0,8}".prop_map(|s| Value::Str(s.into())),
                    proptest::collection::vec(any::<u8>(), 0..8)
                        .prop_map(|b| Value::Bytes(b.into())),
                ],
            ),
            0..4,
        ),
        proptest::collection::vec(any::<u8>(), 0..40),
    )
        .prop_map(|(s, k, fields, p)| {
            let mut m = Message::new(s, p);
            if let Some(k) = k {
                m = m.with_kind(k);
            }
            for (key, v) in fields {
                m = m.with_field(key, v);
            }
            m
        });
    (
        proptest::collection::vec(msg, 1..6),
        any::<u64>(),
        any::<u32>(),
        any::<u64>(),
        0usize..8,
    )
        .prop_map(|(msgs, src, ep, base, pad)| {
            let mut b = wire::encode_datagram(src, ep, base, &msgs).unwrap();
            b.resize(b.len() + pad, 0);
            b
        })
}

/// Decodes `buf` into a vector holding a sentinel; on error the vector must
/// be unchanged, on success it must hold the sentinel then `count` messages.
fn decode_checked(buf: Vec<u8>) -> Result<(), TestCaseError> {
    let sentinel = Message::new("sentinel", "s");
    let mut out = vec![sentinel.clone()];
    match wire::decode_into(&Bytes::from(buf), &mut out) {
        Ok(h) => {
            prop_assert_eq!(out.len(), 1 + usize::from(h.count));
            prop_assert_eq!(&out[0], &sentinel);
            for (i, m) in out[1..].iter().enumerate() {
                prop_assert_eq!(m.meta.seq, h.base_seq.wrapping_add(i as u64));
                prop_assert_eq!(m.meta.source, h.source);
            }
        }
        Err(e) => {
            prop_assert_eq!(&out, &[sentinel]);
            prop_assert!(!e.to_string().is_empty());
            prop_assert!(!e.reason().is_empty());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..200)) {
        decode_checked(buf)?;
    }

    /// Random bodies behind a valid header reach far past the header checks.
    #[test]
    fn random_bodies_never_panic(
        count in 0u16..12,
        body in proptest::collection::vec(prop_oneof![Just(0u8), Just(1), Just(2), Just(0x80), any::<u8>()], 0..200),
    ) {
        decode_checked(dgram(count, &body))?;
    }

    #[test]
    fn mutated_datagrams_never_panic(
        buf in valid_datagram(),
        at in any::<prop::sample::Index>(),
        byte: u8,
    ) {
        let mut buf = buf;
        let i = at.index(buf.len());
        buf[i] = byte;
        decode_checked(buf)?;
    }

    #[test]
    fn xor_mutations_never_panic(
        buf in valid_datagram(),
        at in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let mut buf = buf;
        let i = at.index(buf.len());
        buf[i] ^= 1 << bit;
        decode_checked(buf)?;
    }
}
