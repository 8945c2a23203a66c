//! Frames between nodes (`skiff_proto::mesh::node_frame`: publish,
//! request, group request, reply, done, broadcast, queue group) on arbitrary bytes: `NodeFrame::decode`
//! never panics, and a frame it accepts encodes back to the same bytes
//! (the decoder accepts one encoding of each frame, the encoder writes it).
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use skiff_proto::mesh::node_frame::NodeFrame;

const MAX_PAYLOAD: usize = 60_000;

fuzz_target!(|data: &[u8]| {
    let b = Bytes::copy_from_slice(data);
    let Ok(f) = NodeFrame::decode(&b, MAX_PAYLOAD) else {
        return;
    };
    let mut again = Vec::new();
    f.encode(&mut again);
    let g = NodeFrame::decode(&Bytes::from(again.clone()), MAX_PAYLOAD)
        .unwrap_or_else(|e| panic!("re-encoded {f:?} does not decode: {e}"));
    assert_eq!(f, g);
    let mut third = Vec::new();
    g.encode(&mut third);
    assert_eq!(again, third, "encoding is canonical after one round");
});
