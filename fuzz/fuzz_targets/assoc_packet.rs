//! `association::frame::Packet::decode` on arbitrary bytes: never panics,
//! and a packet it accepts encodes (`Packet::encode`) to bytes that decode
//! to the same packet, no longer than the input.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use skiff_proto::association::frame::Packet;

fuzz_target!(|data: &[u8]| {
    let buf = Bytes::copy_from_slice(data);
    let Ok(p) = Packet::decode(&buf) else {
        return;
    };
    let mut again = Vec::new();
    p.encode(&mut again);
    let q = Packet::decode(&Bytes::from(again.clone()))
        .unwrap_or_else(|e| panic!("re-encoded {p:?} does not decode: {e}"));
    assert_eq!(p, q);
    // Decoding is canonical after one round: encoding again is identical.
    let mut third = Vec::new();
    q.encode(&mut third);
    assert_eq!(again, third);
});
