//! Frame codec tests: round trips (whole and byte by byte) and bad input.

use super::*;
use bytes::BytesMut;

fn msg() -> Message {
    Message::new("a.b", Bytes::from_static(b"hello"))
        .with_kind("t")
        .with_field("n", 3i64)
}

fn client_frames() -> Vec<ClientFrame> {
    use ClientFrame as F;
    vec![
        F::Pub(msg()),
        F::Sub {
            sid: 7,
            pattern: "a.>".into(),
            kind: "*".into(),
            policy: Policy::Block,
            queue: 100,
            credit: 50,
            syntax: Syntax::Tokens,
            best_effort: false,
            group: None,
        },
        F::Sub {
            sid: 8,
            pattern: "daq.h*b.{i<5}".into(),
            kind: "count?".into(),
            policy: Policy::DropOldest,
            queue: 1,
            credit: 1,
            syntax: Syntax::Cmsg,
            best_effort: false,
            group: None,
        },
        F::Sub {
            sid: 9,
            pattern: "lossy.>".into(),
            kind: "".into(),
            policy: Policy::DropOldest,
            queue: 1,
            credit: 1,
            syntax: Syntax::Tokens,
            best_effort: true,
            group: None,
        },
        F::Sub {
            sid: 10,
            pattern: "work.*".into(),
            kind: "*".into(),
            policy: Policy::Block,
            queue: 5,
            credit: 5,
            syntax: Syntax::Tokens,
            best_effort: false,
            group: Some("workers".into()),
        },
        F::Sub {
            sid: 11,
            pattern: "work.>".into(),
            kind: "".into(),
            policy: Policy::DropOldest,
            queue: 1,
            credit: 1,
            syntax: Syntax::Tokens,
            best_effort: true,
            group: Some("a.b".into()),
        },
        F::Unsub { sid: 7 },
        F::Credit { sid: 7, n: 9 },
        F::Req {
            rid: 1,
            flags: req_flags::CLUSTER,
            max: 1,
            target: "c".into(),
            key: Bytes::from_static(b"k"),
            msg: msg(),
        },
        F::Reply {
            token: 3,
            msg: msg(),
        },
        F::Cancel { rid: 1 },
        F::Join {
            corr: 1,
            cluster: "c".into(),
            capacity: 4,
        },
        F::Leave {
            corr: 2,
            cluster: "c".into(),
        },
        F::Bcast {
            cluster: "c".into(),
            msg: msg(),
        },
        F::TunOpen {
            corr: 3,
            cluster: "c".into(),
            key: Bytes::new(),
            window: 64,
        },
        F::TunData {
            tunnel: 1,
            msg: msg(),
        },
        F::TunCredit { tunnel: 1, n: 2 },
        F::TunClose { tunnel: 1 },
        F::Stats { corr: 5 },
        F::Ping { corr: 6 },
        F::Reload { corr: 9 },
        F::Hello {
            name: "skiff-sub".into(),
        },
        F::Hello {
            name: String::new(),
        },
        F::Hello {
            name: "é".repeat(MAX_CLIENT_NAME / 2),
        },
        F::Confirm,
        F::StatsFrom {
            corr: 7,
            from: crate::stats::StatsCursor {
                client: 3,
                sid: None,
            },
        },
        F::StatsFrom {
            corr: 8,
            from: crate::stats::StatsCursor {
                client: 3,
                sid: Some(0),
            },
        },
        F::Auth(Proof::None),
        F::Auth(Proof::Token("t".into())),
        F::Auth(Proof::Password {
            user: "alice".into(),
            password: "pw".into(),
        }),
        F::Auth(Proof::Signature {
            public_key: [7; 32],
            signature: [9; 64],
        }),
    ]
}

fn server_frames() -> Vec<ServerFrame> {
    use ServerFrame as F;
    vec![
        F::Welcome {
            client: 1,
            max_payload: 1 << 20,
        },
        F::Ack { corr: 2 },
        F::Error {
            corr: 0,
            code: Code::SlowConsumer,
            text: "slow".into(),
        },
        F::Msg {
            sid: 1,
            token: 0,
            msg: msg(),
        },
        F::Dropped { sid: 1, total: 5 },
        F::Request {
            token: 9,
            cluster: "c".into(),
            msg: msg(),
        },
        F::Bcast {
            cluster: "c".into(),
            msg: msg(),
        },
        F::Reply { rid: 1, msg: msg() },
        F::ReqDone {
            rid: 1,
            code: Code::NoResponders,
        },
        F::TunIncoming {
            tunnel: 1,
            cluster: "c".into(),
            window: 8,
        },
        F::TunOpened {
            corr: 1,
            tunnel: 1,
            window: 8,
        },
        F::TunData {
            tunnel: 1,
            msg: msg(),
        },
        F::TunCredit { tunnel: 1, n: 1 },
        F::TunClose { tunnel: 1 },
        F::Stats {
            corr: 1,
            json: "{}".into(),
        },
        F::Pong { corr: 1 },
        F::Ping,
        F::Taken { n: 1234 },
        F::Challenge {
            nonce: Bytes::from_static(&[5; 32]),
        },
    ]
}

#[test]
fn frames_round_trip_whole_and_byte_by_byte() {
    let mut out = Vec::new();
    for f in client_frames() {
        f.encode(&mut out);
    }
    let dec = Decoder::new(1 << 20);
    // Fed one byte at a time.
    let mut buf = BytesMut::new();
    let mut got = Vec::new();
    for b in &out {
        buf.extend_from_slice(&[*b]);
        while let Some(body) = dec.next(&mut buf).unwrap() {
            got.push(ClientFrame::decode(body, 1 << 20).unwrap());
        }
    }
    assert_eq!(got, client_frames());

    let mut out = Vec::new();
    for f in server_frames() {
        f.encode(&mut out);
    }
    let mut buf = BytesMut::from(&out[..]);
    let mut got = Vec::new();
    while let Some(body) = dec.next(&mut buf).unwrap() {
        got.push(ServerFrame::decode(body, 1 << 20).unwrap());
    }
    assert_eq!(got, server_frames());
}

#[test]
fn a_partial_frame_gets_room_for_what_was_read_not_what_it_claims() {
    let dec = Decoder::new(8 << 20);
    let mut buf = BytesMut::from(&(8u32 << 20).to_le_bytes()[..]);
    buf.extend_from_slice(&[1; 100]);
    assert!(dec.next(&mut buf).unwrap().is_none());
    assert!(buf.capacity() <= 256 << 10, "{}", buf.capacity());
    // Past 64 KiB, at most as much again as it holds.
    buf.extend_from_slice(&vec![1; 1 << 20]);
    assert!(dec.next(&mut buf).unwrap().is_none());
    assert!(buf.capacity() <= 4 << 20, "{}", buf.capacity());
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let dec = Decoder::new(1000);
    let mut buf = BytesMut::from(&[0xff, 0xff, 0xff, 0x7f, 1][..]);
    assert!(dec.next(&mut buf).is_err(), "oversized length refused");
    assert!(buf.capacity() < 1 << 20);
    let mut buf = BytesMut::from(&[0, 0, 0, 0][..]);
    assert!(dec.next(&mut buf).is_err(), "empty frame refused");
    assert!(ClientFrame::decode(Bytes::from_static(&[200]), 100).is_err());
    assert!(ClientFrame::decode(Bytes::from_static(&[op::SUB, 1]), 100).is_err());
    assert!(ClientFrame::decode(Bytes::from_static(&[op::UNSUB, 1, 0]), 100).is_err());
    // Every prefix of every valid frame is refused, never a panic.
    for f in client_frames() {
        let mut out = Vec::new();
        f.encode(&mut out);
        for cut in 1..out.len() - LEN_PREFIX {
            let body = Bytes::copy_from_slice(&out[LEN_PREFIX..LEN_PREFIX + cut]);
            let _ = ClientFrame::decode(body, 100);
        }
    }
    // A payload over the limit is refused.
    let mut out = Vec::new();
    ClientFrame::Pub(Message::new("a", vec![0u8; 200])).encode(&mut out);
    let body = Bytes::copy_from_slice(&out[LEN_PREFIX..]);
    assert!(ClientFrame::decode(body, 100).is_err());
}

#[test]
fn codes_and_policies_round_trip() {
    for n in 0..12 {
        assert_eq!(Code::from_u16(n).to_u16(), n);
    }
    for p in [
        Policy::DropOldest,
        Policy::DropNewest,
        Policy::Block,
        Policy::Disconnect,
    ] {
        assert_eq!(Policy::parse(p.name()), Some(p));
        assert_eq!(Policy::from_u8(p as u8), Some(p));
    }
}

/// `simple_message` accepts only what `decode_message` accepts, and reads
/// the same subject and payload length; `simple_span` reads what it reads
/// without the UTF-8 check; neither panics.
#[test]
fn simple_message_agrees_with_decode_message() {
    let mut inputs: Vec<Vec<u8>> = Vec::new();
    for m in [
        Message::new("bench.ps", Bytes::from_static(b"12345678")),
        Message::new("a", Bytes::new()),
        msg(),
    ] {
        let mut out = Vec::new();
        crate::wire::encode_message(&mut out, &m, false);
        inputs.push(out);
    }
    // Every prefix and one-byte corruption of each.
    let base = inputs.clone();
    for b in &base {
        for n in 0..b.len() {
            inputs.push(b[..n].to_vec());
            for x in [0u8, 1, 0x7f, 0x80, 0xff] {
                let mut c = b.clone();
                c[n] = x;
                inputs.push(c);
            }
        }
        let mut longer = b.clone();
        longer.push(0);
        inputs.push(longer);
    }
    // A subject that is not UTF-8: the simple form without its check.
    inputs.push(vec![1, 2, 0xff, 0xfe, 1, 7]);
    let mut simple = 0;
    for raw in inputs {
        for max in [0, 4, 8, 1 << 20] {
            // The span is what `simple_message` reads, UTF-8 or not.
            let span = simple_span(&raw, max);
            let checked = span
                .clone()
                .filter(|(s, _)| std::str::from_utf8(&raw[s.clone()]).is_ok());
            assert_eq!(
                checked.map(|(s, n)| (&raw[s], n)),
                simple_message(&raw, max).map(|(s, n)| (s.as_bytes(), n))
            );
            if let Some((subject, len)) = simple_message(&raw, max) {
                simple += 1;
                let m = crate::wire::decode_message(&Bytes::from(raw.clone()), max)
                    .expect("a simple message decodes");
                assert_eq!(&*m.subject, subject);
                assert_eq!(m.payload.len(), len);
                assert!(m.kind.is_none() && m.fields.is_empty());
            }
        }
    }
    assert!(simple > 0);
}

/// A message frame written in place is what `encode_msg_raw` appends.
#[test]
fn msg_raw_in_place() {
    let mut raw = Vec::new();
    crate::wire::encode_message(&mut raw, &msg(), false);
    for (sid, token) in [(0, 0), (1, 2), (300, u64::MAX)] {
        let mut v = Vec::new();
        encode_msg_raw(&mut v, sid, token, &raw);
        let n = msg_raw_frame_len(sid, token, raw.len());
        assert_eq!(n, v.len());
        let mut s = vec![0u8; n];
        assert!(encode_msg_raw_into(&mut s, sid, token, &raw));
        assert_eq!(s, v);
        let mut short = vec![0u8; n - 1];
        assert!(!encode_msg_raw_into(&mut short, sid, token, &raw));
        assert!(short.iter().all(|&b| b == 0));
    }
}

/// A publish written in place is what `encode_pub` appends, and
/// `Decoder::split` takes frames off a `Bytes` without a copy, refusing
/// what `Decoder::next` refuses.
#[test]
fn pub_in_place_and_split() {
    let m = msg();
    let mut v = Vec::new();
    encode_pub(&mut v, &m);
    let mut s = vec![0u8; pub_frame_len(&m)];
    assert!(encode_pub_into(&mut s, &m));
    assert_eq!(s, v);
    assert!(!encode_pub_into(&mut s[1..], &m));
    v.extend_from_slice(&s);
    let all = Bytes::from(v);
    let mut rest = all.clone();
    let dec = Decoder::new(1 << 20);
    for _ in 0..2 {
        let body = dec.split(&mut rest).unwrap().unwrap();
        assert!(is_pub(&body));
        let base = all.as_ptr() as usize;
        let p = body.as_ptr() as usize;
        assert!(p >= base && p < base + all.len(), "a slice, not a copy");
    }
    assert!(dec.split(&mut rest).unwrap().is_none());
    for bad in [&[1u8, 0][..], &[0, 0, 0, 0], &[9, 0, 0, 0, 1]] {
        assert!(dec.split(&mut Bytes::copy_from_slice(bad)).is_err());
    }
    let mut big = Bytes::copy_from_slice(&[0, 0, 0, 1, 0]);
    assert!(Decoder::new(8).split(&mut big).is_err());
}

#[test]
fn handshake_frames_are_bounded_and_hide_secrets() {
    let enc = |f: ClientFrame| {
        let mut out = Vec::new();
        f.encode(&mut out);
        Bytes::copy_from_slice(&out[LEN_PREFIX..])
    };
    // A key or signature of the wrong length, an unknown kind, a token
    // over the bound: errors.
    let mut body = vec![op::AUTH, 3, 31];
    body.extend_from_slice(&[0; 31]);
    body.push(64);
    body.extend_from_slice(&[0; 64]);
    assert!(ClientFrame::decode(Bytes::from(body), 100).is_err());
    assert!(ClientFrame::decode(Bytes::from_static(&[op::AUTH, 9]), 100).is_err());
    let long = enc(ClientFrame::Auth(Proof::Token(
        "x".repeat(MAX_PROOF_FIELD + 1),
    )));
    assert!(ClientFrame::decode(long, 1 << 20).is_err());
    let mut out = Vec::new();
    ServerFrame::Challenge {
        nonce: Bytes::from(vec![0; MAX_NONCE + 1]),
    }
    .encode(&mut out);
    assert!(ServerFrame::decode(Bytes::copy_from_slice(&out[LEN_PREFIX..]), 100).is_err());
    let p = Proof::Password {
        user: "alice".into(),
        password: "hunter2".into(),
    };
    assert!(!format!("{:?}", ClientFrame::Auth(p)).contains("hunter2"));
    assert!(!format!("{:?}", Proof::Token("tok".into())).contains("tok"));
}

#[test]
fn sub_syntax_is_a_trailing_byte_only_for_cmsg() {
    let sub = |syntax| ClientFrame::Sub {
        sid: 1,
        pattern: "a".into(),
        kind: "*".into(),
        policy: Policy::DropOldest,
        queue: 1,
        credit: 1,
        syntax,
        best_effort: false,
        group: None,
    };
    let (mut tokens, mut cmsg) = (Vec::new(), Vec::new());
    sub(Syntax::Tokens).encode(&mut tokens);
    sub(Syntax::Cmsg).encode(&mut cmsg);
    assert_eq!(cmsg.len(), tokens.len() + 1);
    assert_eq!(*cmsg.last().unwrap(), 1);
    // An unknown kind, or more after it, is refused.
    let mut bad = cmsg.clone();
    *bad.last_mut().unwrap() = 9;
    let body = Bytes::copy_from_slice(&bad[LEN_PREFIX..]);
    assert!(ClientFrame::decode(body, 1 << 20).is_err());
    let mut flags = cmsg.clone();
    flags.push(7);
    let n = (flags.len() - LEN_PREFIX) as u32;
    flags[..LEN_PREFIX].copy_from_slice(&n.to_le_bytes());
    let body = Bytes::copy_from_slice(&flags[LEN_PREFIX..]);
    assert!(ClientFrame::decode(body, 1 << 20).is_err());
    let mut long = cmsg.clone();
    long.extend_from_slice(&[0, 0]);
    let n = (long.len() - LEN_PREFIX) as u32;
    long[..LEN_PREFIX].copy_from_slice(&n.to_le_bytes());
    let body = Bytes::copy_from_slice(&long[LEN_PREFIX..]);
    assert!(ClientFrame::decode(body, 1 << 20).is_err());
}

#[test]
fn hello_names_are_bounded_and_printable() {
    let enc = |name: &str| {
        let mut out = Vec::new();
        ClientFrame::Hello { name: name.into() }.encode(&mut out);
        Bytes::from(out).slice(LEN_PREFIX..)
    };
    assert!(ClientFrame::decode(enc("ok name"), 0).is_ok());
    for bad in [
        "a\nb".to_owned(),
        "\u{7f}".to_owned(),
        "x".repeat(MAX_CLIENT_NAME + 1),
    ] {
        assert!(ClientFrame::decode(enc(&bad), 0).is_err(), "{bad:?}");
    }
    // Not UTF-8.
    let mut raw = vec![19u8, 2, 0xff, 0xfe];
    assert!(ClientFrame::decode(Bytes::from(std::mem::take(&mut raw)), 0).is_err());
    assert!(valid_client_name("skiff-sub"));
    assert!(!valid_client_name("tab\there"));
}

#[test]
fn sub_queue_group_is_flags_bit_1_then_its_name_bounded() {
    let sub = |group: Option<&str>| ClientFrame::Sub {
        sid: 1,
        pattern: "a".into(),
        kind: "*".into(),
        policy: Policy::DropOldest,
        queue: 1,
        credit: 1,
        syntax: Syntax::Tokens,
        best_effort: false,
        group: group.map(Into::into),
    };
    let (mut plain, mut grouped) = (Vec::new(), Vec::new());
    sub(None).encode(&mut plain);
    sub(Some("g")).encode(&mut grouped);
    // Syntax byte, flags byte 2, then the name with its length.
    assert_eq!(&grouped[grouped.len() - 4..], &[0, 2, 1, b'g']);
    let body = |b: &[u8]| Bytes::copy_from_slice(&b[LEN_PREFIX..]);
    assert_eq!(
        ClientFrame::decode(body(&grouped), 1024).unwrap(),
        sub(Some("g"))
    );
    // The frame's body with its trailing group part replaced by `tail`.
    let with = |tail: &[u8]| {
        let mut b = plain[LEN_PREFIX..].to_vec();
        b.extend_from_slice(tail);
        Bytes::from(b)
    };
    assert_eq!(
        ClientFrame::decode(with(&[0, 2, 0]), 1024),
        Err(crate::WireError::Malformed("empty queue group"))
    );
    assert_eq!(
        ClientFrame::decode(with(&[0, 4]), 1024),
        Err(crate::WireError::Malformed("unknown subscription flags"))
    );
    // A name over MAX_GROUP is refused before it is read.
    let mut long = vec![0, 2];
    crate::varint::put(&mut long, MAX_GROUP as u64 + 1);
    assert!(matches!(
        ClientFrame::decode(with(&long), 1024),
        Err(crate::WireError::TooLong { .. })
    ));
    // Cut short, or with more after the name.
    assert!(ClientFrame::decode(with(&[0, 2, 3, b'a']), 1024).is_err());
    assert!(ClientFrame::decode(with(&[0, 2, 1, b'a', 0]), 1024).is_err());
}

#[test]
fn a_pub_head_encodes_what_encode_pub_does() {
    for (subject, kind) in [("a.b", None), ("x.y.z", Some("t")), ("s", Some(""))] {
        let head = PubHead::new(subject, kind);
        for len in [0usize, 1, 127, 128, 300, 70_000] {
            let payload = vec![7u8; len];
            let mut m = Message::new(subject, payload.clone());
            if let Some(k) = kind {
                m = m.with_kind(k);
            }
            let mut want = Vec::new();
            encode_pub(&mut want, &m);
            assert_eq!(head.frame_len(len), pub_frame_len(&m));
            let mut got = vec![1u8];
            head.encode(&mut got, &payload);
            assert_eq!(&got[1..], &want[..]);
            let mut short = vec![0u8; want.len() - 1];
            assert!(!head.encode_into(&mut short, &payload));
        }
    }
}

#[test]
fn split_slice_agrees_with_split() {
    let mut v = Vec::new();
    encode_pub(&mut v, &Message::new("a", "b"));
    encode_pub(&mut v, &Message::new("c", "dd"));
    let d = Decoder::new(1 << 16);
    let mut b = Bytes::from(v.clone());
    let mut s = &v[..];
    loop {
        let x = d.split(&mut b).unwrap();
        let y = d.split_slice(&mut s).unwrap();
        assert_eq!(x.as_deref(), y);
        if x.is_none() {
            break;
        }
    }
    for cut in 1..v.len() {
        let mut b = Bytes::copy_from_slice(&v[..cut]);
        let mut s = &v[..cut];
        loop {
            let x = d.split(&mut b);
            let y = d.split_slice(&mut s);
            assert_eq!(x.is_err(), y.is_err());
            match (x, y) {
                (Ok(Some(x)), Ok(Some(y))) => assert_eq!(&x[..], y),
                _ => break,
            }
        }
    }
}
