//! The association codec: round trips, and malformed input of every kind
//! rejected without a panic.

use bytes::Bytes;
use proptest::prelude::*;

use crate::association::frame::{
    is_association, peek_key, Accept, Chunk, Chunks, Data, First, Packet, Sack, Status, KIND,
    MAX_SACK, RTN,
};
use crate::error::WireError;

fn chunk(begin: bool, end: bool, total: u64, b: &'static [u8]) -> Chunk {
    Chunk {
        begin,
        end,
        bundle: false,
        total,
        bytes: Bytes::from_static(b),
    }
}

fn samples() -> Vec<Packet> {
    let mut sack = Sack::default();
    sack.push(5, 7);
    sack.push(9, 10);
    vec![
        Packet {
            key: 42,
            sreq: true,
            first: Some(First {
                service: 7,
                mtu: 1472,
                max_message: 64 << 20,
            }),
            status: Some(Status {
                rseq: 0,
                alloc: 32,
                ..Status::default()
            }),
            ..Packet::default()
        },
        Packet {
            key: 42 | RTN,
            accept: Some(Accept {
                key: 99,
                mtu: 1200,
                max_message: 1000,
            }),
            status: Some(Status {
                rseq: 0,
                alloc: 32,
                ..Status::default()
            }),
            ..Packet::default()
        },
        Packet {
            key: 99 | RTN,
            status: Some(Status {
                rseq: 3,
                alloc: 40,
                ack_delay_us: 1234,
                sack,
            }),
            data: Some(Data {
                seq: 11,
                chunks: Chunks::from_chunks(&[
                    chunk(true, true, 0, b"hello"),
                    chunk(true, true, 0, b""),
                    chunk(true, false, 100, b"frag"),
                ]),
            }),
            ..Packet::default()
        },
        Packet {
            key: 99 | RTN,
            close: true,
            data: Some(Data {
                seq: 12,
                chunks: Chunks::default(),
            }),
            ..Packet::default()
        },
        Packet {
            key: 99 | RTN,
            reset: true,
            ..Packet::default()
        },
    ]
}

fn enc(p: &Packet) -> Vec<u8> {
    let mut v = Vec::new();
    p.encode(&mut v);
    v
}

fn dec(v: &[u8]) -> Result<Packet, WireError> {
    Packet::decode(&Bytes::copy_from_slice(v))
}

#[test]
fn samples_round_trip() {
    for p in samples() {
        let b = enc(&p);
        assert!(is_association(&b));
        assert_eq!(b[3], KIND);
        assert_eq!(peek_key(&b), Some(p.key));
        assert_eq!(dec(&b).unwrap(), p);
    }
}

#[test]
fn every_truncation_is_an_error() {
    for p in samples() {
        let b = enc(&p);
        for n in 0..b.len() {
            // A DATA packet cut at a chunk boundary is a valid shorter
            // packet; anything else must fail.
            if let Ok(q) = dec(&b[..n]) {
                assert!(q.data.is_some() && n > 13, "prefix {n} of {p:?} decoded");
            }
        }
    }
}

#[test]
fn not_ours() {
    assert_eq!(dec(b""), Err(WireError::Foreign));
    assert_eq!(dec(b"XY\x01\x02"), Err(WireError::Foreign));
    assert_eq!(dec(b"SK\x09\x02"), Err(WireError::Version(9)));
    assert_eq!(dec(b"SK\x01\x01rest-of-a-batch"), Err(WireError::Kind(1)));
    assert!(!is_association(b"SK\x01\x01aaaaaaaaaaaaa"));
    assert!(!is_association(b"SK\x01\x02"));
    assert_eq!(peek_key(b"SK\x01\x02"), None);
}

fn header(flags: u8, key: u64) -> Vec<u8> {
    let mut v = b"SK\x01\x02".to_vec();
    v.push(flags);
    v.extend_from_slice(&key.to_le_bytes());
    v
}

#[test]
fn flag_rules() {
    let m = |f: u8, key: u64| dec(&header(f, key));
    assert!(
        matches!(m(0x80, 1), Err(WireError::Malformed(_))),
        "reserved"
    );
    assert!(
        matches!(m(0x03, 1), Err(WireError::Malformed(_))),
        "FIRST+ACCEPT"
    );
    assert!(
        matches!(m(0x01, RTN), Err(WireError::Malformed(_))),
        "FIRST with RTN"
    );
    assert!(
        matches!(m(0x02, 1), Err(WireError::Malformed(_))),
        "ACCEPT w/o RTN"
    );
    assert!(
        matches!(m(0x09, 1), Err(WireError::Malformed(_))),
        "FIRST+DATA"
    );
    assert!(
        matches!(m(0x20, RTN), Err(WireError::Malformed(_))),
        "CLOSE w/o DATA"
    );
    // DATA with no chunks and no CLOSE.
    let mut v = header(0x08, RTN);
    v.push(0);
    assert!(matches!(dec(&v), Err(WireError::Malformed(_))));
    // A bare header is a valid (empty) packet; trailing bytes are not.
    assert!(m(0, RTN).is_ok());
    let mut v = header(0, RTN);
    v.push(0);
    assert!(matches!(dec(&v), Err(WireError::Malformed(_))));
}

#[test]
fn bad_sections() {
    // mtu below the minimum
    let mut v = header(0x01, 1);
    v.extend_from_slice(&7u32.to_le_bytes());
    v.push(10);
    v.push(0);
    assert!(matches!(dec(&v), Err(WireError::Malformed(_))));
    // max message over the hard limit
    let mut v = header(0x01, 1);
    v.extend_from_slice(&7u32.to_le_bytes());
    v.extend_from_slice(&[0x80, 0x04]); // 512
    v.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
    assert!(matches!(dec(&v), Err(WireError::TooLong { .. })));
    // ACCEPT whose listener key has RTN
    let mut v = header(0x02, RTN);
    v.extend_from_slice(&RTN.to_le_bytes());
    v.extend_from_slice(&[0x80, 0x04, 0]);
    assert!(matches!(dec(&v), Err(WireError::Malformed(_))));
    // too many sack ranges
    let mut v = header(0x04, RTN);
    v.extend_from_slice(&[0, 100, 0, (MAX_SACK + 1) as u8]);
    assert!(matches!(dec(&v), Err(WireError::TooLong { .. })));
    // sack beyond alloc
    let mut v = header(0x04, RTN);
    v.extend_from_slice(&[0, 4, 0, 1, 3, 0]);
    assert!(matches!(dec(&v), Err(WireError::Malformed(_))));
    // alloc overflow
    let mut v = header(0x04, RTN);
    v.extend_from_slice(&[0xff; 9]);
    v.push(0x01);
    v.extend_from_slice(&[0xff; 9]);
    v.push(0x01);
    v.extend_from_slice(&[0, 0]);
    assert!(matches!(dec(&v), Err(WireError::Malformed(_))));
    // varint overflow
    let mut v = header(0x04, RTN);
    v.extend_from_slice(&[0xff; 11]);
    assert!(matches!(dec(&v), Err(WireError::VarintOverflow)));
}

#[test]
fn bad_chunks() {
    let data = |chunk: &[u8]| {
        let mut v = header(0x08, RTN);
        v.push(1); // seq
        v.extend_from_slice(chunk);
        dec(&v)
    };
    assert!(
        matches!(data(&[0x04, 1, b'a']), Err(WireError::Malformed(_))),
        "reserved"
    );
    assert!(
        matches!(data(&[0x03, 5, b'a']), Err(WireError::Truncated { .. })),
        "len"
    );
    assert!(
        matches!(data(&[0x00, 0]), Err(WireError::Malformed(_))),
        "empty middle"
    );
    assert!(
        matches!(data(&[0x02, 0]), Err(WireError::Malformed(_))),
        "empty end"
    );
    assert!(
        matches!(data(&[0x01, 1, 1, b'a']), Err(WireError::Malformed(_))),
        "first = total"
    );
    assert!(
        matches!(
            data(&[0x01, 0xff, 0xff, 0xff, 0xff, 0x0f, 1, b'a']),
            Err(WireError::TooLong { .. })
        ),
        "total over the hard limit"
    );
    assert!(data(&[0x03, 1, b'a', 0x00, 1, b'b']).is_ok());
    // A claimed length far beyond the packet allocates nothing and fails.
    assert!(matches!(
        data(&[0x03, 0xff, 0xff, 0xff, 0xff, 0x0f]),
        Err(WireError::Truncated { .. })
    ));
}

#[test]
fn oversized_datagram() {
    let mut v = header(0x08, RTN);
    v.push(0);
    v.push(0x03);
    crate::varint::put(&mut v, 70_000);
    v.resize(v.len() + 70_000, 0);
    assert!(matches!(dec(&v), Err(WireError::TooLong { .. })));
}

fn arb_status() -> impl Strategy<Value = Status> {
    (
        0u64..1 << 40,
        proptest::collection::vec((0u64..5, 0u64..5), 0..=MAX_SACK),
        0u64..1 << 20,
    )
        .prop_map(|(rseq, gaps, delay)| {
            let mut sack = Sack::default();
            let mut prev = rseq;
            for (g, l) in gaps {
                let a = prev + 1 + g;
                let b = a + 1 + l;
                sack.push(a, b);
                prev = b;
            }
            Status {
                rseq,
                alloc: prev + 3,
                ack_delay_us: delay,
                sack,
            }
        })
}

fn arb_chunks() -> impl Strategy<Value = Vec<Chunk>> {
    proptest::collection::vec(
        (
            any::<bool>(),
            any::<bool>(),
            proptest::collection::vec(any::<u8>(), 1..40),
        ),
        0..5,
    )
    .prop_map(|v| {
        v.into_iter()
            .map(|(begin, end, b)| Chunk {
                begin,
                end,
                bundle: false,
                total: if begin && !end {
                    b.len() as u64 + 10
                } else {
                    0
                },
                bytes: b.into(),
            })
            .collect()
    })
}

fn arb_packet() -> impl Strategy<Value = Packet> {
    (
        any::<u64>(),
        0u8..3,
        any::<bool>(),
        proptest::option::of(arb_status()),
        proptest::option::of((0u64..1 << 50, arb_chunks(), any::<bool>())),
        any::<bool>(),
    )
        .prop_map(|(key, hs, sreq, status, data, reset)| {
            let mut p = Packet {
                key: key & !RTN,
                sreq,
                reset,
                status,
                ..Packet::default()
            };
            match hs {
                1 if data.is_none() => {
                    p.first = Some(First {
                        service: key as u32,
                        mtu: 1472,
                        max_message: 1 << 20,
                    })
                }
                2 => {
                    p.key |= RTN;
                    p.accept = Some(Accept {
                        key: key >> 1,
                        mtu: 9000,
                        max_message: 5,
                    });
                }
                _ => p.key |= key & RTN,
            }
            if let Some((seq, chunks, close)) = data {
                if p.first.is_none() {
                    p.close = close || chunks.is_empty();
                    p.data = Some(Data {
                        seq,
                        chunks: Chunks::from_chunks(&chunks),
                    });
                }
            }
            p
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn packets_round_trip(p in arb_packet()) {
        let b = enc(&p);
        let q = dec(&b).unwrap();
        prop_assert_eq!(&q, &p);
        if let Some(d) = &q.data {
            let n = d.chunks.iter().count();
            prop_assert_eq!(n, p.data.as_ref().unwrap().chunks.iter().count());
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(mut v in proptest::collection::vec(any::<u8>(), 0..200), hdr in any::<bool>()) {
        if hdr && v.len() >= 4 {
            v[..4].copy_from_slice(b"SK\x01\x02");
        }
        let _ = dec(&v);
    }

    /// Decoding into one reused packet, as the endpoint does, gives what a
    /// fresh decode gives, packet after packet (a status with ranges after
    /// one without, data after none), on valid and mutated input alike;
    /// and the chunks of a decoded packet, taken through the decoder's note
    /// of the first one (`iter`, `take_single`), are the chunks of its encoding
    /// as read without the note.
    #[test]
    fn decoding_in_place_is_decoding(
        ps in proptest::collection::vec(
            (arb_packet(), any::<usize>(), any::<u8>(), any::<bool>()),
            1..8,
        ),
    ) {
        let mut reused = Packet::default();
        for (p, at, byte, mutate) in ps {
            let mut b = enc(&p);
            if mutate {
                let i = at % b.len();
                b[i] = byte;
            }
            let b = Bytes::from(b);
            let fresh = Packet::decode(&b);
            let got = reused.decode_into(b.clone());
            let q = match fresh {
                Ok(q) => q,
                Err(e) => {
                    prop_assert_eq!(got, Err(e));
                    prop_assert!(reused.data.is_none());
                    continue;
                }
            };
            prop_assert_eq!(got, Ok(()));
            prop_assert_eq!(&reused, &q);
            if !mutate {
                prop_assert_eq!(&reused, &p);
            }
            let Some(d) = &reused.data else { continue };
            let chunks: Vec<Chunk> = d.chunks.iter().collect();
            let plain = Chunks::from_chunks(&chunks);
            prop_assert_eq!(plain.raw(), d.chunks.raw());
            prop_assert_eq!(&plain.iter().collect::<Vec<_>>(), &chunks);
            if !mutate {
                let sent: Vec<Chunk> = p.data.as_ref().unwrap().chunks.iter().collect();
                prop_assert_eq!(&sent, &chunks);
            }
            let mut taken = d.chunks.clone();
            let single = taken.take_single();
            match &chunks[..] {
                [one] => {
                    prop_assert_eq!(single.as_ref(), Some(one));
                    prop_assert!(taken.is_empty());
                }
                _ => {
                    prop_assert_eq!(single, None);
                    prop_assert_eq!(&taken, &d.chunks);
                }
            }
        }
    }

    #[test]
    fn mutated_packets_never_panic(p in arb_packet(), at in any::<usize>(), byte in any::<u8>(), cut in any::<usize>()) {
        let mut b = enc(&p);
        let i = at % b.len();
        b[i] = byte;
        let _ = dec(&b);
        b.truncate(cut % (b.len() + 1));
        let _ = dec(&b);
    }
}

/// A bad header is named by the first check that fails, in the order the
/// header is read (the decoder checks a good header in one go).
#[test]
fn header_errors_in_reading_order() {
    let mut long = vec![0u8; crate::wire::MAX_DATAGRAM + 1];
    long[..4].copy_from_slice(b"SK\x01\x02");
    let cases: [(&[u8], WireError); 9] = [
        (b"", WireError::Foreign),
        (b"S", WireError::Foreign),
        (b"SX\x01\x02", WireError::Foreign),
        (b"SK", WireError::Truncated { what: "header" }),
        (b"SK\x09\x02", WireError::Version(9)),
        (b"SK\x01", WireError::Truncated { what: "header" }),
        (b"SK\x01\x05\x00", WireError::Kind(5)),
        (
            b"SK\x01\x02\x00\x00",
            WireError::Truncated { what: "header" },
        ),
        (
            &long,
            WireError::TooLong {
                what: "datagram",
                len: long.len() as u64,
                max: crate::wire::MAX_DATAGRAM,
            },
        ),
    ];
    for (b, want) in cases {
        assert_eq!(dec(b), Err(want), "{b:?}");
    }
}
