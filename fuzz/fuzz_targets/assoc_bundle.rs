//! `association::bundle::validate` on arbitrary bytes: never panics; a
//! bundle it accepts splits (`split_next`) into exactly the records it
//! counted, each within the input, and the records put back together
//! (`bundle::put`) validate to the same count and split to the same
//! messages.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use skiff_proto::association::bundle;

fuzz_target!(|data: &[u8]| {
    let Ok(n) = bundle::validate(data) else {
        return;
    };
    let msgs: Vec<Bytes> = bundle::records(Bytes::copy_from_slice(data)).collect();
    assert_eq!(msgs.len(), n);
    assert!(msgs.iter().map(Bytes::len).sum::<usize>() + n <= data.len());
    let mut again = Vec::new();
    for m in &msgs {
        bundle::put(&mut again, m);
    }
    assert_eq!(bundle::validate(&again).ok(), Some(n));
    let back: Vec<Bytes> = bundle::records(Bytes::from(again)).collect();
    assert_eq!(back, msgs);
});
