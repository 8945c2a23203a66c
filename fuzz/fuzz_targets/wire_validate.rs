//! `wire::validate` and `wire::Batch` against `wire::decode` on arbitrary
//! bytes: the same verdict (the same header, or the same error), and the
//! same messages, whether taken one by one (`Iterator`) or in bulk in two
//! uneven steps (`next_into`, as the receive path does). And
//! `wire::run_stride` on the same bytes: no panic, and a stride only where
//! a valid batch and its zero padding end and a header begins. And
//! `wire::Batch::single_into`: a message exactly when `decode` gives one
//! message, and that message.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use skiff_proto::wire;
use skiff_proto::{Message, Value};

/// Equality with floats compared bit for bit, so that NaN equals itself.
fn same(a: &Message, b: &Message) -> bool {
    a.subject == b.subject
        && a.kind == b.kind
        && a.payload == b.payload
        && a.meta == b.meta
        && a.fields.len() == b.fields.len()
        && a.fields.iter().zip(&b.fields).all(|(x, y)| {
            x.key == y.key
                && match (&x.value, &y.value) {
                    (Value::Float(p), Value::Float(q)) => p.to_bits() == q.to_bits(),
                    (p, q) => p == q,
                }
        })
}

fn all_same(a: &[Message], b: &[Message]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!(same(x, y), "{x:?} != {y:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let buf = Bytes::copy_from_slice(data);
    if let Some(s) = wire::run_stride(&buf) {
        assert!(s >= wire::HEADER_LEN && s < buf.len());
        assert!(buf[s..].starts_with(&wire::MAGIC));
        wire::validate(&buf.slice(..s)).expect("the first datagram of a run is valid");
    }
    let mut single = None;
    let single_header = wire::Batch::single_into(&buf, None, &mut single);
    assert_eq!(single_header.is_some(), single.is_some());
    let decoded = wire::decode(&buf);
    match (&decoded, &single_header, &single) {
        (Ok((h, msgs)), Some(hs), Some(m)) if msgs.len() == 1 => {
            assert_eq!(h, hs);
            assert!(same(&msgs[0], m), "{:?} != {m:?}", msgs[0]);
        }
        (Ok((_, msgs)), None, None) if msgs.len() != 1 => {}
        (Err(_), None, None) => {}
        (d, s, _) => panic!("single_into {s:?} disagrees with decode {d:?}"),
    }
    let validated = wire::validate(&buf);
    let batch = wire::Batch::new(buf.clone());
    match (decoded, validated, batch) {
        (Ok((h, msgs)), Ok(hv), Ok(batch)) => {
            assert_eq!(h, hv);
            assert_eq!(&h, batch.header());
            assert_eq!(batch.remaining(), msgs.len());
            let split = usize::from(data.first().copied().unwrap_or(0)) % (msgs.len() + 1);
            let mut bulk = Vec::new();
            let mut b2 = batch.clone();
            let first = b2.next_into(&mut bulk, split, None);
            let rest = b2.next_into(&mut bulk, usize::MAX, None);
            assert_eq!((first, rest), (split, msgs.len() - split));
            assert_eq!(b2.remaining(), 0);
            all_same(&msgs, &bulk);
            let lazy: Vec<Message> = batch.collect();
            all_same(&msgs, &lazy);
        }
        (Err(d), Err(v), Err(b)) => {
            assert_eq!(d, v, "decode and validate refuse differently");
            assert_eq!(d, b, "decode and Batch::new refuse differently");
        }
        (d, v, b) => panic!(
            "verdicts differ: decode {:?}, validate {:?}, Batch::new {:?}",
            d.err(),
            v.err(),
            b.err()
        ),
    }
});
