//! The NATS client protocol parser (`skiff_proto::nats`) on arbitrary
//! bytes, read whole and in the chunk sizes the input's first byte picks:
//! it never panics, never holds more than its limits allow, gives the same
//! operations however the input is cut, and every header block and
//! `CONNECT` it hands out is parsed without a panic either. Where
//! `Parser::plain_pub` reads a publish in place, it reads what `next` does.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use skiff_proto::nats::{parse_headers, ConnectOptions, Op, Parser};

const MAX_CONTROL: usize = 256;
const MAX_PAYLOAD: usize = 4096;

fn run(data: &[u8], chunk: usize) -> (Vec<Op>, bool) {
    let mut p = Parser::new(MAX_CONTROL, MAX_PAYLOAD);
    let mut buf = BytesMut::new();
    let mut ops = Vec::new();
    for c in data.chunks(chunk.max(1)) {
        buf.extend_from_slice(c);
        loop {
            // The in-place reading of a plain publish is the operation
            // `next` returns for the same bytes, and takes as many.
            let plain = p.plain_pub(&buf).map(|pp| {
                (buf[pp.subject].to_vec(), buf[pp.payload].to_vec(), buf.len() - pp.len)
            });
            let r = p.next(&mut buf);
            if let Some((subject, payload, left)) = plain {
                match &r {
                    Ok(Some(Op::Pub { subject: s, reply: None, headers: None, payload: d })) => {
                        assert_eq!((&s[..], &d[..], buf.len()), (&subject[..], &payload[..], left));
                    }
                    other => panic!("plain_pub took what next reads as {other:?}"),
                }
            }
            match r {
                Ok(Some(op)) => {
                    match &op {
                        Op::Pub { headers: Some(h), payload, .. } => {
                            assert!(h.len() + payload.len() <= MAX_PAYLOAD);
                            let _ = parse_headers(h);
                        }
                        Op::Pub { payload, .. } => assert!(payload.len() <= MAX_PAYLOAD),
                        Op::Connect(json) => {
                            assert!(json.len() <= MAX_CONTROL);
                            let _ = ConnectOptions::parse(json);
                        }
                        _ => {}
                    }
                    ops.push(op);
                }
                Ok(None) => break,
                Err(e) => {
                    assert!(!e.text().is_empty());
                    return (ops, true);
                }
            }
            // Nothing beyond a line and a payload is held.
            assert!(buf.len() <= data.len());
        }
    }
    (ops, false)
}

fuzz_target!(|data: &[u8]| {
    let Some((&k, rest)) = data.split_first() else { return };
    let (whole, failed) = run(rest, rest.len());
    let (cut, cut_failed) = run(rest, usize::from(k % 16) + 1);
    assert_eq!(failed, cut_failed);
    assert_eq!(whole, cut);
});
