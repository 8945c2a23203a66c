//! `wire::decode` on arbitrary bytes: never panics; on error `decode_into`
//! leaves its output as it was; what decodes re-encodes with
//! `encode_datagram` to a datagram that decodes to the same messages.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use skiff_proto::wire::{self, MAX_DATAGRAM};
use skiff_proto::{Message, Value};

fn same(a: &Message, b: &Message) -> bool {
    a.subject == b.subject
        && a.kind == b.kind
        && a.payload == b.payload
        && a.meta == b.meta
        && a.fields.len() == b.fields.len()
        && a.fields.iter().zip(&b.fields).all(|(x, y)| {
            x.key == y.key
                && match (&x.value, &y.value) {
                    // Bit for bit, so that NaN equals itself.
                    (Value::Float(p), Value::Float(q)) => p.to_bits() == q.to_bits(),
                    (p, q) => p == q,
                }
        })
}

fuzz_target!(|data: &[u8]| {
    let buf = Bytes::copy_from_slice(data);
    let mut out = vec![Message::from_payload("sentinel")];
    let Ok(h) = wire::decode_into(&buf, &mut out) else {
        assert_eq!(out.len(), 1, "a rejected datagram appended messages");
        return;
    };
    let msgs = out.split_off(1);
    assert_eq!(msgs.len(), usize::from(h.count));
    let again = wire::encode_datagram(h.source, h.endpoint, h.base_seq, &msgs)
        .expect("decoded messages are within the limits");
    // Re-encoding is canonical (shortest varints, subjects repeated, no
    // padding), so never longer.
    assert!(again.len() <= data.len() && again.len() <= MAX_DATAGRAM);
    let (h2, msgs2) = wire::decode(&Bytes::from(again)).expect("re-encoded datagram decodes");
    assert_eq!(h2, h);
    assert_eq!(msgs2.len(), msgs.len());
    for (a, b) in msgs.iter().zip(&msgs2) {
        assert!(same(a, b), "{a:?} != {b:?}");
    }
});
