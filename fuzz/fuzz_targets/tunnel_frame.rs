//! Tunnel frames between nodes (`skiff_proto::mesh::tunnel_frame`: open,
//! opened, refused, data, credit, close) on arbitrary bytes:
//! `TunnelFrame::decode` never panics, and a frame it accepts encodes to
//! bytes that decode to the same frame, canonically after one round.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use skiff_proto::mesh::tunnel_frame::TunnelFrame;

const MAX_PAYLOAD: usize = 60_000;

fuzz_target!(|data: &[u8]| {
    let b = Bytes::copy_from_slice(data);
    let Ok(f) = TunnelFrame::decode(&b, MAX_PAYLOAD) else {
        return;
    };
    let again = f.encode();
    let g = TunnelFrame::decode(&again, MAX_PAYLOAD)
        .unwrap_or_else(|e| panic!("re-encoded {f:?} does not decode: {e}"));
    assert_eq!(f, g);
    assert_eq!(again, g.encode(), "encoding is canonical after one round");
});
