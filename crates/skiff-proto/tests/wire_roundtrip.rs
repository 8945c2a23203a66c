//! Round trips of the wire format over every buffer shape: arbitrary batches
//! through `wire::encode_datagram` + `wire::decode`, slices at odd offsets,
//! copies, every strict prefix (the datagram fed one byte at a time), zero
//! padding, and datagrams built by the `Batcher` (including multi-segment
//! transmits split at `segment_size`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use bytestring::ByteString;
use proptest::prelude::*;
use skiff_proto::wire::{self, Header, Kind, HEADER_LEN, MAX_DATAGRAM};
use skiff_proto::{
    Batcher, BatcherConfig, Dest, Error, Field, Message, Meta, UsageError, Value, WireError,
};

// ---------------------------------------------------------------- strategies

/// A few subjects drawn often, so that neighbours repeat; one is long, so
/// that sending it once or spelling it out differ by hundreds of bytes.
fn pool() -> Vec<String> {
    let mut p: Vec<String> = ["daq.hallb.rate", "a", "x.y.z", "ünï.cødé"]
        .map(str::to_owned)
        .into();
    p.push(format!("long.{}", "l".repeat(600)));
    p
}

fn subject() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(pool()),
        2 => Just(String::new()),
        2 => "[a-z]{1,8}(\\.[a-z*>]{1,8}){0,3}",
        1 => "\\PC{1,24}",
        1 => "[a-z]{1000,1024}",
    ]
}

fn kind() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        3 => Just(None),
        3 => "\\PC{0,12}".prop_map(Some),
        1 => "[a-z]{255}".prop_map(Some),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<bool>().prop_map(Value::Bool),
        prop_oneof![
            any::<i64>(),
            Just(0i64),
            Just(-1),
            Just(i64::MIN),
            Just(i64::MAX)
        ]
        .prop_map(Value::Int),
        prop_oneof![
            any::<f64>(),
            Just(f64::NAN),
            Just(-0.0),
            Just(f64::INFINITY)
        ]
        .prop_map(Value::Float),
        "\\PC{0,40}".prop_map(|s| Value::Str(s.into())),
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(|b| Value::Bytes(b.into())),
    ]
}

fn field() -> impl Strategy<Value = Field> {
    ("\\PC{0,16}", value()).prop_map(|(k, value)| Field {
        key: k.into(),
        value,
    })
}

fn fields() -> impl Strategy<Value = Vec<Field>> {
    prop_oneof![
        4 => Just(Vec::new()),
        4 => proptest::collection::vec(field(), 1..6),
        1 => proptest::collection::vec(field(), wire::MAX_FIELDS..=wire::MAX_FIELDS),
    ]
}

fn payload(max: usize) -> impl Strategy<Value = Bytes> {
    prop_oneof![
        Just(Bytes::new()),
        proptest::collection::vec(any::<u8>(), 0..=max).prop_map(Bytes::from),
    ]
}

fn message_with(max_payload: usize) -> impl Strategy<Value = Message> {
    (subject(), kind(), fields(), payload(max_payload)).prop_map(|(s, k, fields, payload)| {
        Message {
            subject: s.into(),
            kind: k.map(ByteString::from),
            fields,
            payload,
            ..Default::default()
        }
    })
}

/// Messages of a few dozen bytes, for tests that decode every prefix.
fn small_message() -> impl Strategy<Value = Message> {
    let subject = prop_oneof![Just(String::new()), "[a-c]{1,3}", "\\PC{1,4}"];
    let kind = proptest::option::of("\\PC{0,3}");
    let fields = proptest::collection::vec(field(), 0..3);
    (subject, kind, fields, payload(24)).prop_map(|(s, k, fields, payload)| Message {
        subject: s.into(),
        kind: k.map(ByteString::from),
        fields,
        payload,
        ..Default::default()
    })
}

fn batch(max_payload: usize, max_len: usize) -> impl Strategy<Value = Vec<Message>> {
    proptest::collection::vec(message_with(max_payload), 1..=max_len)
}

// ---------------------------------------------------------------- helpers

/// Field values compared bit for bit, so that NaN equals itself.
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits(),
        _ => a == b,
    }
}

/// Asserts that `got` carries what `sent` did (meta aside).
fn assert_same(got: &Message, sent: &Message) -> Result<(), TestCaseError> {
    prop_assert_eq!(&got.subject, &sent.subject);
    prop_assert_eq!(&got.kind, &sent.kind);
    prop_assert_eq!(&got.payload, &sent.payload);
    prop_assert_eq!(got.fields.len(), sent.fields.len());
    for (g, s) in got.fields.iter().zip(&sent.fields) {
        prop_assert_eq!(&g.key, &s.key);
        prop_assert!(
            same_value(&g.value, &s.value),
            "{:?} != {:?}",
            g.value,
            s.value
        );
    }
    Ok(())
}

/// Decodes `buf` and checks it carries `sent` from `source` numbered from
/// `base`.
fn check_decodes(
    buf: &Bytes,
    source: u64,
    endpoint: u32,
    base: u64,
    sent: &[Message],
) -> Result<Vec<Message>, TestCaseError> {
    let (h, got) = wire::decode(buf).map_err(|e| TestCaseError::fail(format!("{e}")))?;
    prop_assert_eq!(
        h,
        Header {
            kind: Kind::Batch,
            source,
            endpoint,
            base_seq: base,
            count: sent.len() as u16,
        }
    );
    prop_assert_eq!(got.len(), sent.len());
    for (i, (g, s)) in got.iter().zip(sent).enumerate() {
        assert_same(g, s)?;
        prop_assert_eq!(g.meta.seq, base.wrapping_add(i as u64));
        prop_assert_eq!(g.meta.source, source);
        prop_assert_eq!(g.meta.from, None);
    }
    // The one-pass decoder of a lone message agrees: the same header and
    // message for one, nothing (and `out` untouched) for more.
    let mut one = None;
    let from = Some(SocketAddr::from(([127, 0, 0, 1], 9)));
    let single = wire::Batch::single_into(buf, from, &mut one);
    if let [sent] = sent {
        prop_assert_eq!(single, Some(h));
        let one = one.expect("decoded");
        assert_same(&one, sent)?;
        prop_assert_eq!(
            one.meta,
            Meta {
                seq: base,
                source,
                from
            }
        );
    } else {
        prop_assert!(single.is_none() && one.is_none());
    }
    Ok(got)
}

fn encode(source: u64, endpoint: u32, base: u64, msgs: &[Message]) -> Vec<u8> {
    wire::encode_datagram(source, endpoint, base, msgs).expect("messages within the limits")
}

// ---------------------------------------------------------------- wire::encode_datagram + decode

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Arbitrary batches round-trip: subject, type, fields, payload, and
    /// `meta.seq = base + i`, `meta.source = source`.
    #[test]
    fn encode_decode_round_trips(
        msgs in batch(3000, 12),
        source: u64,
        endpoint: u32,
        base in prop_oneof![Just(0u64), any::<u64>(), Just(u64::MAX - 3)],
    ) {
        let enc = encode(source, endpoint, base, &msgs);
        let buf = Bytes::from(enc);
        if buf.len() > MAX_DATAGRAM {
            // Too big for UDP: refused whole, never half-decoded.
            prop_assert_eq!(
                wire::decode(&buf).unwrap_err(),
                WireError::TooLong { what: "datagram", len: buf.len() as u64, max: MAX_DATAGRAM }
            );
        } else {
            check_decodes(&buf, source, endpoint, base, &msgs)?;
        }
    }

    /// Decoding from a slice at an odd offset inside a larger buffer (with
    /// garbage on both sides) gives the same messages, and their payloads
    /// are slices of that buffer, not copies.
    #[test]
    fn decodes_from_odd_offset_slice(
        msgs in batch(600, 8),
        lead in (0usize..40).prop_map(|n| 2 * n + 1),
        trail in proptest::collection::vec(any::<u8>(), 0..40),
        source: u64,
        base: u64,
    ) {
        let enc = encode(source, 7, base, &msgs);
        let mut big = vec![0xa5u8; lead];
        big.extend_from_slice(&enc);
        big.extend_from_slice(&trail);
        let big = Bytes::from(big);
        let slice = big.slice(lead..lead + enc.len());
        let got = check_decodes(&slice, source, 7, base, &msgs)?;
        let range = big.as_ptr() as usize..big.as_ptr() as usize + big.len();
        for m in got.iter().filter(|m| !m.payload.is_empty()) {
            prop_assert!(range.contains(&(m.payload.as_ptr() as usize)), "payload was copied");
        }
    }

    /// Decoding from copies (a fresh allocation, a `Vec`, a static slice)
    /// gives the same messages.
    #[test]
    fn decodes_from_copies(msgs in batch(600, 8), source: u64, base: u64) {
        let enc = encode(source, 1, base, &msgs);
        check_decodes(&Bytes::copy_from_slice(&enc), source, 1, base, &msgs)?;
        check_decodes(&Bytes::from(enc.clone()), source, 1, base, &msgs)?;
        let leaked: &'static [u8] = Box::leak(enc.into_boxed_slice());
        check_decodes(&Bytes::from_static(leaked), source, 1, base, &msgs)?;
    }

    /// The datagram fed one byte at a time: every strict prefix is rejected
    /// as truncated (never a panic, never a partial batch), and only the
    /// whole datagram decodes.
    #[test]
    fn every_strict_prefix_is_rejected(
        msgs in proptest::collection::vec(small_message(), 1..6),
        source: u64,
        base: u64,
    ) {
        let enc = Bytes::from(encode(source, 3, base, &msgs));
        for n in 0..enc.len() {
            let mut out = vec![Message::from_payload("sentinel")];
            match wire::decode_into(&enc.slice(..n), &mut out) {
                Err(WireError::Truncated { .. }) => {}
                other => prop_assert!(false, "prefix of {} of {} bytes: {:?}", n, enc.len(), other),
            }
            prop_assert_eq!(out.len(), 1, "a rejected prefix appended messages");
            let mut one = None;
            prop_assert!(wire::Batch::single_into(&enc.slice(..n), None, &mut one).is_none());
            prop_assert!(one.is_none());
        }
        check_decodes(&enc, source, 3, base, &msgs)?;
    }

    /// Trailing zero padding of any length up to the largest datagram is
    /// accepted (GSO pads every segment but the last to the same size).
    #[test]
    fn zero_padding_is_accepted(msgs in batch(200, 6), pad in 0usize..=MAX_DATAGRAM, base: u64) {
        let mut enc = encode(9, 2, base, &msgs);
        let pad = pad.min(MAX_DATAGRAM - enc.len());
        enc.resize(enc.len() + pad, 0);
        check_decodes(&Bytes::from(enc), 9, 2, base, &msgs)?;
    }

    /// Any non-zero byte after the last message is rejected, wherever it
    /// sits in the padding.
    #[test]
    fn trailing_nonzero_byte_is_rejected(
        msgs in batch(200, 6),
        pad in 1usize..3000,
        at in any::<prop::sample::Index>(),
        byte in 1u8..,
    ) {
        let mut enc = encode(9, 2, 0, &msgs);
        let len = enc.len();
        enc.resize(len + pad, 0);
        enc[len + at.index(pad)] = byte;
        let enc = Bytes::from(enc);
        let mut out = Vec::new();
        prop_assert_eq!(
            wire::decode_into(&enc, &mut out),
            Err(WireError::Malformed("trailing bytes after the last message"))
        );
        prop_assert!(out.is_empty());
        let mut one = None;
        prop_assert!(wire::Batch::single_into(&enc, None, &mut one).is_none());
    }
}

proptest! {
    /// A run of batches padded to one length, as a GSO send leaves them and
    /// GRO hands them over, yields that length from its first batch alone;
    /// one datagram, padded or not, yields none.
    #[test]
    fn run_stride_finds_the_padded_length(
        runs in prop::collection::vec(batch(40, 4), 1..5),
        extra in 0usize..64,
        last_extra in 0usize..64,
    ) {
        let encoded: Vec<Vec<u8>> = runs
            .iter()
            .enumerate()
            .map(|(i, m)| encode(9, 2, i as u64 * 100, m))
            .collect();
        let stride = encoded.iter().map(Vec::len).max().unwrap() + extra;
        let mut run = Vec::new();
        for (i, e) in encoded.iter().enumerate() {
            run.extend_from_slice(e);
            if i + 1 < encoded.len() {
                run.resize(run.len() + stride - e.len(), 0);
            } else {
                // The last of a run is at most as long as the others.
                run.resize(run.len() + last_extra.min(stride - e.len()), 0);
            }
        }
        let want = (encoded.len() > 1).then_some(stride);
        prop_assert_eq!(wire::run_stride(&Bytes::from(run.clone())), want);
        for (i, seg) in run.chunks(stride).enumerate() {
            let mut out = Vec::new();
            wire::decode_into(&Bytes::copy_from_slice(seg), &mut out).unwrap();
            prop_assert_eq!(out.len(), runs[i].len());
        }
    }

    /// Whatever the bytes, `run_stride` answers (no panic) with a stride
    /// that lies inside the buffer and is followed there by the magic.
    #[test]
    fn run_stride_is_total(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let b = Bytes::from(bytes);
        if let Some(s) = wire::run_stride(&b) {
            prop_assert!(s >= wire::HEADER_LEN && s < b.len());
            prop_assert!(b[s..].starts_with(&wire::MAGIC));
        }
    }
}

/// A first batch that is not valid gives no stride, even with a header
/// after it: the caller judges the buffer whole.
#[test]
fn run_stride_needs_a_valid_first_batch() {
    let one = wire::encode_datagram(1, 2, 3, &[Message::new("a.b", "hello")]).unwrap();
    let mut run = one.clone();
    run.extend_from_slice(&one);
    assert_eq!(wire::run_stride(&Bytes::from(run.clone())), Some(one.len()));
    run[0] = b'X';
    assert_eq!(wire::run_stride(&Bytes::from(run)), None);
    assert_eq!(wire::run_stride(&Bytes::from(one)), None);
}

/// Padding is accepted right up to the largest datagram and refused one
/// byte past it.
#[test]
fn padding_up_to_max_datagram_and_not_beyond() {
    let msgs = [Message::new("a.b", "hello")];
    let mut enc = wire::encode_datagram(1, 2, 3, &msgs).unwrap();
    enc.resize(MAX_DATAGRAM, 0);
    let (_, got) = wire::decode(&Bytes::from(enc.clone())).unwrap();
    assert_eq!(got[0].payload, "hello");
    enc.push(0);
    assert_eq!(
        wire::decode(&Bytes::from(enc)).unwrap_err(),
        WireError::TooLong {
            what: "datagram",
            len: MAX_DATAGRAM as u64 + 1,
            max: MAX_DATAGRAM
        }
    );
}

/// A subject repeated by neighbours is sent once; the empty subject never
/// counts as a previous subject.
#[test]
fn repeated_subjects_are_sent_once() {
    let one = wire::encode_datagram(0, 0, 0, &[Message::new("daq.hallb.rate", "1")]).unwrap();
    let two = wire::encode_datagram(
        0,
        0,
        0,
        &[
            Message::new("daq.hallb.rate", "1"),
            Message::new("daq.hallb.rate", "2"),
        ],
    )
    .unwrap();
    // The second message is flags, payload length and payload: 3 bytes.
    assert_eq!(two.len(), one.len() + 3);
    let msgs = [
        Message::new("s", "1"),
        Message::from_payload("2"),
        Message::new("s", "3"),
        Message::new("s", "4"),
    ];
    let enc = Bytes::from(wire::encode_datagram(0, 0, 0, &msgs).unwrap());
    let (_, got) = wire::decode(&enc).unwrap();
    let subjects: Vec<&str> = got.iter().map(|m| &*m.subject).collect();
    assert_eq!(subjects, ["s", "", "s", "s"]);
}

/// Sequence numbers wrap at `u64::MAX` instead of overflowing.
#[test]
fn sequence_numbers_wrap() {
    let msgs = [Message::from_payload("a"), Message::from_payload("b")];
    let enc = Bytes::from(wire::encode_datagram(5, 0, u64::MAX, &msgs).unwrap());
    let (h, got) = wire::decode(&enc).unwrap();
    assert_eq!(h.base_seq, u64::MAX);
    assert_eq!(got[0].meta.seq, u64::MAX);
    assert_eq!(got[1].meta.seq, 0);
}

/// `encode_datagram` refuses messages that break the wire limits instead
/// of writing bytes no receiver would accept.
#[test]
fn encode_refuses_messages_over_the_limits() {
    let long = "s".repeat(wire::MAX_SUBJECT + 1);
    assert_eq!(
        wire::encode_datagram(0, 0, 0, &[Message::new(long, "")]),
        Err(UsageError::FieldTooLong {
            what: "subject",
            len: wire::MAX_SUBJECT + 1,
            max: wire::MAX_SUBJECT
        })
    );
    let mut m = Message::from_payload("");
    for i in 0..=wire::MAX_FIELDS as i64 {
        m = m.with_field("k", i);
    }
    assert_eq!(
        wire::encode_datagram(0, 0, 0, &[m]),
        Err(UsageError::TooManyFields(wire::MAX_FIELDS + 1))
    );
}

// ---------------------------------------------------------------- the Batcher

#[derive(Debug, Clone)]
enum Op {
    Push { dest: usize, msg: Message },
    Advance(Duration),
    Flush,
    Drain { max_segments: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (prop_oneof![Just(0usize), 0usize..4], message_with(700)).prop_map(|(dest, msg)| Op::Push { dest, msg }),
        2 => (0u64..30).prop_map(|ms| Op::Advance(Duration::from_millis(ms))),
        1 => Just(Op::Flush),
        2 => (1usize..=8).prop_map(|max_segments| Op::Drain { max_segments }),
    ]
}

fn dest(i: usize) -> Dest {
    let addr: SocketAddr = format!("10.0.0.{}:4747", i % 2 + 1).parse().unwrap();
    if i == 3 {
        Dest::any(addr)
    } else {
        Dest {
            addr,
            endpoint: i as u32,
        }
    }
}

/// Splits a transmit at `segment_size` and checks the segment shapes.
fn segments(buf: &[u8], t: &skiff_proto::Transmit, max_datagram: usize) -> Vec<Bytes> {
    assert_eq!(buf.len(), t.size);
    let segs: Vec<Bytes> = match t.segment_size {
        None => vec![Bytes::copy_from_slice(buf)],
        Some(seg) => buf.chunks(seg).map(Bytes::copy_from_slice).collect(),
    };
    assert_eq!(segs.len(), t.segments, "{t:?}");
    if let Some(seg) = t.segment_size {
        assert!(segs[..segs.len() - 1].iter().all(|s| s.len() == seg));
    }
    for s in &segs {
        assert!(
            s.len() <= max_datagram,
            "a {}-byte datagram over max_datagram={max_datagram}",
            s.len()
        );
    }
    segs
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Whatever is pushed, to whichever destinations, with whatever flushes,
    /// timeouts and segment counts: every transmitted datagram decodes, and
    /// each destination receives exactly what was pushed to it, in order,
    /// numbered consecutively from zero.
    #[test]
    fn batcher_datagrams_decode_to_pushed_messages(
        ops in proptest::collection::vec(op(), 1..80),
        qthresh in prop_oneof![64usize..3000, Just(MAX_DATAGRAM)],
        max_datagram in 200usize..4000,
        timeout_ms in prop_oneof![Just(0u64), 1u64..50],
        source: u64,
    ) {
        let mut b = Batcher::new(BatcherConfig {
            qthresh,
            timeout: Duration::from_millis(timeout_ms),
            max_datagram,
            max_destinations: 16,
            source,
        });
        let max_datagram = b.config().max_datagram;
        let mut now = Instant::now();
        let mut pushed: BTreeMap<Dest, Vec<Message>> = BTreeMap::new();
        let mut received: BTreeMap<Dest, Vec<Message>> = BTreeMap::new();
        // The source id each destination's datagrams carry: one per
        // destination, stable over its whole stream.
        let mut sources: BTreeMap<Dest, u64> = BTreeMap::new();
        let mut buf = Vec::new();
        let mut drain = |b: &mut Batcher, max_segments: usize, received: &mut BTreeMap<Dest, Vec<Message>>, sources: &mut BTreeMap<Dest, u64>| -> Result<(), TestCaseError> {
            while let Some(t) = b.poll_transmit(&mut buf, max_segments) {
                let mut n = 0;
                for seg in segments(&buf, &t, max_datagram) {
                    let (h, msgs) = wire::decode(&seg).map_err(|e| TestCaseError::fail(format!("{e} in {t:?}")))?;
                    prop_assert_eq!(h.source, *sources.entry(t.dest).or_insert(h.source));
                    prop_assert_eq!(h.endpoint, t.dest.endpoint);
                    n += msgs.len();
                    received.entry(t.dest).or_default().extend(msgs);
                }
                prop_assert_eq!(n, t.messages);
            }
            Ok(())
        };
        for op in ops {
            match op {
                Op::Push { dest: d, msg } => {
                    let d = dest(d);
                    let alone = HEADER_LEN + wire::encoded_len(&msg, false);
                    match b.push(now, d, &msg) {
                        Ok(()) => pushed.entry(d).or_default().push(msg),
                        Err(Error::Usage(UsageError::TooLarge { needed, .. })) => {
                            prop_assert!(alone > max_datagram, "refused a {}-byte message", needed);
                        }
                        Err(e) => prop_assert!(false, "push failed: {}", e),
                    }
                }
                Op::Advance(d) => {
                    now += d;
                    b.handle_timeout(now);
                }
                Op::Flush => b.flush(),
                Op::Drain { max_segments } => drain(&mut b, max_segments, &mut received, &mut sources)?,
            }
        }
        b.flush();
        prop_assert_eq!(b.poll_timeout(), None);
        drain(&mut b, 3, &mut received, &mut sources)?;
        prop_assert_eq!(b.queued(), 0);
        prop_assert_eq!(pushed.len(), received.len());
        for (d, sent) in &pushed {
            let got = &received[d];
            prop_assert_eq!(got.len(), sent.len(), "to {}", d);
            for (i, (g, s)) in got.iter().zip(sent).enumerate() {
                assert_same(g, s)?;
                prop_assert_eq!(g.meta.seq, i as u64);
                prop_assert_eq!(g.meta.source, sources[d]);
            }
        }
    }
}
