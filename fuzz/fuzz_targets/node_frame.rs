//! The client↔node protocol on arbitrary bytes: the stream `Decoder`
//! (`next` over a read buffer, `split` over a shared-memory segment),
//! both frame decoders and the publish reader never panic, and a decoded
//! publish's encoding lies within what was read.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use skiff_node::broker::Published;
use skiff_node::frame::{simple_message, Decoder};
use skiff_node::{ClientFrame, ServerFrame};

const MAX_PAYLOAD: usize = 60_000;

fn bodies(body: Bytes) {
    let _ = ClientFrame::decode(body.clone(), MAX_PAYLOAD);
    let _ = ServerFrame::decode(body.clone(), MAX_PAYLOAD);
    let _ = simple_message(&body, MAX_PAYLOAD);
    let len = body.len();
    if let Ok(p) = Published::from_frame(body, MAX_PAYLOAD) {
        assert!(p.raw.len() < len.max(1));
    }
}

fuzz_target!(|data: &[u8]| {
    let dec = Decoder::new(MAX_PAYLOAD + 64);
    let mut buf = BytesMut::from(data);
    while let Ok(Some(body)) = dec.next(&mut buf) {
        bodies(body);
    }
    let mut seg = Bytes::copy_from_slice(data);
    while let Ok(Some(body)) = dec.split(&mut seg) {
        bodies(body);
    }
    // A body on its own, as an in-process frame or a mesh frame is.
    bodies(Bytes::copy_from_slice(data));
});
