use super::*;

fn all(p: &mut Parser, buf: &mut BytesMut) -> Result<Vec<Op>, NatsError> {
    let mut ops = Vec::new();
    while let Some(op) = p.next(buf)? {
        ops.push(op);
    }
    Ok(ops)
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

const STREAM: &str = "CONNECT {\"verbose\":false,\"headers\":true}\r\n\
    sub foo.* 1\r\nSUB bar q 22\r\nPUB foo.a 5\r\nhello\r\n\
    PUB foo.b _INBOX.x 0\r\n\r\n\
    HPUB h 23 28\r\nNATS/1.0\r\nA: b\r\nC:d\r\n\r\nhello\r\n\
    UNSUB 1 3\r\nUNSUB 22\r\nPING\r\npong\r\n";

fn expected() -> Vec<Op> {
    vec![
        Op::Connect(b("{\"verbose\":false,\"headers\":true}")),
        Op::Sub {
            subject: b("foo.*"),
            queue: None,
            sid: b("1"),
        },
        Op::Sub {
            subject: b("bar"),
            queue: Some(b("q")),
            sid: b("22"),
        },
        Op::Pub {
            subject: b("foo.a"),
            reply: None,
            headers: None,
            payload: b("hello"),
        },
        Op::Pub {
            subject: b("foo.b"),
            reply: Some(b("_INBOX.x")),
            headers: None,
            payload: b(""),
        },
        Op::Pub {
            subject: b("h"),
            reply: None,
            headers: Some(b("NATS/1.0\r\nA: b\r\nC:d\r\n\r\n")),
            payload: b("hello"),
        },
        Op::Unsub {
            sid: b("1"),
            max: Some(3),
        },
        Op::Unsub {
            sid: b("22"),
            max: None,
        },
        Op::Ping,
        Op::Pong,
    ]
}

#[test]
fn a_stream_parses_whole() {
    let mut p = Parser::new(MAX_CONTROL_LINE, 1 << 20);
    let mut buf = BytesMut::from(STREAM);
    assert_eq!(all(&mut p, &mut buf).unwrap(), expected());
    assert!(buf.is_empty());
}

#[test]
fn every_split_gives_the_same_ops() {
    let bytes = STREAM.as_bytes();
    for chunk in 1..=bytes.len() {
        let mut p = Parser::new(MAX_CONTROL_LINE, 1 << 20);
        let mut buf = BytesMut::new();
        let mut ops = Vec::new();
        for c in bytes.chunks(chunk) {
            buf.extend_from_slice(c);
            ops.extend(all(&mut p, &mut buf).unwrap());
        }
        assert_eq!(ops, expected(), "chunks of {chunk}");
    }
}

#[test]
fn bad_input_gets_nats_server_texts() {
    let cases: &[(&str, &str)] = &[
        ("FOO bar\r\n", "Unknown Protocol Operation"),
        ("PUB a 3\r\nabcX\r\n", "Unknown Protocol Operation"),
        ("PUB a 2000000\r\n", "Maximum Payload Violation"),
        ("HPUB a 10 2000000\r\n", "Maximum Payload Violation"),
        ("PUB a\r\n", "processPub Parse Error"),
        ("PUB a b c d\r\n", "processPub Parse Error"),
        ("PUB a x\r\n", "processPub Bad or Missing Size"),
        ("PUB a 1234567890\r\n", "processPub Bad or Missing Size"),
        (
            "HPUB a 5 3\r\n",
            "processHeaderPub Header Size larger then TotalSize",
        ),
        ("SUB a\r\n", "processSub Parse Error"),
        ("SUB a b c d\r\n", "processSub Parse Error"),
        ("UNSUB\r\n", "processUnsub Parse Error"),
        ("UNSUB 1 x\r\n", "processUnsub Parse Error"),
        ("PING x\r\n", "Unknown Protocol Operation"),
    ];
    for (input, text) in cases {
        let mut p = Parser::new(MAX_CONTROL_LINE, 1 << 20);
        let mut buf = BytesMut::from(*input);
        let e = all(&mut p, &mut buf).unwrap_err();
        assert_eq!(e.text(), *text, "{input:?}");
    }
}

#[test]
fn a_control_line_is_bounded_before_its_end_arrives() {
    let mut p = Parser::new(64, 1 << 20);
    let mut buf = BytesMut::from(&b"PUB "[..]);
    buf.extend_from_slice(&[b'a'; 61]);
    assert_eq!(p.next(&mut buf), Ok(None));
    buf.extend_from_slice(b"aa");
    assert_eq!(
        p.next(&mut buf).unwrap_err().text(),
        "Maximum Control Line Exceeded"
    );
    // A line of exactly the limit passes.
    let mut p = Parser::new(8, 1 << 20);
    let mut buf = BytesMut::from(&b"PUB ab 12\r\n"[..]);
    assert!(matches!(
        p.next(&mut buf),
        Err(NatsError::ControlLine { .. })
    ));
    let mut buf = BytesMut::from(&b"PUB a 1\r\nx\r\n"[..]);
    assert!(matches!(p.next(&mut buf), Ok(Some(Op::Pub { .. }))));
}

#[test]
fn the_payload_is_a_slice_of_the_read_buffer() {
    let mut p = Parser::new(MAX_CONTROL_LINE, 1 << 20);
    let mut buf = BytesMut::from("PUB a 3\r\nabc\r\n");
    let base = buf.as_ptr() as usize;
    let Some(Op::Pub { payload, .. }) = p.next(&mut buf).unwrap() else {
        panic!()
    };
    assert_eq!(payload.as_ptr() as usize, base + 9);
}

#[test]
fn connect_options() {
    let o = ConnectOptions::parse(
        br#"{"verbose":true,"pedantic":false,"headers":true,"no_responders":true,"protocol":1,"name":"x","lang":"go","version":"1.2","user":"u","pass":"p","unknown":[1,2]}"#,
    )
    .unwrap();
    assert!(o.verbose && o.headers && o.no_responders && o.echo);
    assert_eq!(
        (o.user.as_deref(), o.pass.as_deref()),
        (Some("u"), Some("p"))
    );
    // Protocol 0 clients get no headers.
    let o =
        ConnectOptions::parse(br#"{"headers":true,"no_responders":true,"echo":false}"#).unwrap();
    assert!(!o.headers && !o.no_responders && !o.echo);
    assert!(ConnectOptions::parse(b"{nope").is_err());
    let o = ConnectOptions::parse(br#"{"pass":"hunter2","auth_token":"t0k"}"#).unwrap();
    let shown = format!("{o:?}");
    assert!(
        !shown.contains("hunter2") && !shown.contains("t0k"),
        "{shown}"
    );
}

#[test]
fn encoders() {
    let mut out = Vec::new();
    encode_msg(&mut out, b"a.b", b"7", b"", b"hi");
    encode_msg(&mut out, b"a.b", b"7", b"r", b"");
    let mut h = Vec::new();
    write_headers(&mut h, Some((503, "")), []);
    assert_eq!(h, b"NATS/1.0 503\r\n\r\n");
    encode_hmsg(&mut out, b"i", b"1", b"", &h, b"");
    encode_err(&mut out, "Unknown Protocol Operation");
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "MSG a.b 7 2\r\nhi\r\nMSG a.b 7 r 0\r\n\r\nHMSG i 1 16 16\r\nNATS/1.0 503\r\n\r\n\r\n-ERR 'Unknown Protocol Operation'\r\n"
    );
}

#[test]
fn headers_round_trip() {
    let mut h = Vec::new();
    write_headers(
        &mut h,
        Some((408, "Request Timeout")),
        [
            (&b"Skiff-Type"[..], &b"event"[..]),
            (b"Bad\r\nName", b"v\r\nw"),
        ],
    );
    let parsed = parse_headers(&Bytes::from(h)).unwrap();
    assert_eq!(parsed.status, Some(408));
    assert_eq!(&parsed.description[..], b"Request Timeout");
    assert_eq!(
        parsed.fields,
        vec![(b("Skiff-Type"), b("event")), (b("Bad--Name"), b("v  w"))]
    );
    let p = parse_headers(&b("NATS/1.0 503\r\n\r\n")).unwrap();
    assert_eq!((p.status, p.fields.len()), (Some(503), 0));
    for bad in [
        "",
        "NATS/1.0\r\n",
        "HTTP/1.1\r\n\r\n",
        "NATS/1.0\r\nnocolon\r\n\r\n",
        "NATS/1.0\r\n: v\r\n\r\n",
    ] {
        assert!(parse_headers(&b(bad)).is_err(), "{bad:?}");
    }
    let many: String = (0..=MAX_HEADERS).map(|i| format!("K{i}: v\r\n")).collect();
    assert_eq!(
        parse_headers(&b(&format!("NATS/1.0\r\n{many}\r\n"))),
        Err(HeaderError::TooMany)
    );
}

#[test]
fn subjects() {
    assert!(valid_subject(b"a.*.>") && valid_subject(b">"));
    assert!(!valid_subject(b"a..b") && !valid_subject(b"a.>.b") && !valid_subject(b""));
    assert!(valid_literal_subject(b"a.b") && !valid_literal_subject(b"a.*"));
}

/// A whole plain `PUB` is read in place as `next` reads it; anything
/// else is left to `next`.
#[test]
fn plain_pub_reads_what_next_reads() {
    let p = Parser::new(64, 16);
    let buf = b"PUB a.b 5\r\nhello\r\nPING\r\n";
    let pp = p.plain_pub(buf).unwrap();
    assert_eq!(
        (&buf[pp.subject.clone()], &buf[pp.payload.clone()]),
        (&b"a.b"[..], &b"hello"[..])
    );
    assert_eq!(&buf[pp.len..], b"PING\r\n");
    let mut m = BytesMut::from(&buf[..]);
    let mut q = Parser::new(64, 16);
    match q.next(&mut m).unwrap() {
        Some(Op::Pub {
            subject,
            reply: None,
            headers: None,
            payload,
        }) => {
            assert_eq!((&subject[..], &payload[..]), (&b"a.b"[..], &b"hello"[..]));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(&m[..], b"PING\r\n");
    assert_eq!(p.plain_pub(b"PUB a 0\r\n\r\n").map(|x| x.len), Some(11));
    for other in [
        &b"PUB a.b 5\r\nhell"[..],   // payload not all here
        b"PUB a.b 5\r\nhelloXY",     // no CRLF after it
        b"PUB a.b r 5\r\nhello\r\n", // a reply subject
        b"PUB  a.b 5\r\nhello\r\n",  // two spaces
        b"PUB a.b\t5\r\nhello\r\n",  // a tab
        b"pub a.b 5\r\nhello\r\n",   // lower case
        b"PUB a.b 5\nhello\r\n",     // a bare LF
        b"PUB a.b 17\r\n",           // over the payload limit
        b"PUB a.b x\r\nhello\r\n",   // not a size
        b"HPUB a.b 0 5\r\nhello\r\n",
        b"SUB a 1\r\n",
    ] {
        assert_eq!(
            p.plain_pub(other),
            None,
            "{:?}",
            String::from_utf8_lossy(other)
        );
    }
    let long = format!("PUB {} 1\r\nx\r\n", "s".repeat(64));
    assert_eq!(
        p.plain_pub(long.as_bytes()),
        None,
        "over the control line limit"
    );
}
