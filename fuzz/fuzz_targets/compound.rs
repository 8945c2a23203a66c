//! `compound::decode` on arbitrary bytes: never panics; on error appends
//! nothing; what it accepts is 1 to 64 frames, each a skiff batch or
//! association frame of at least `MIN_FRAME` bytes, that `compound::Encoder`
//! packs back into a datagram decoding to the same frames. Each frame is
//! then fed to its own decoder, which must not panic either.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use skiff_proto::association::frame::Packet;
use skiff_proto::wire::{self, MAGIC, MAX_DATAGRAM, VERSION};
use skiff_proto::{compound, Message};

fuzz_target!(|data: &[u8]| {
    let buf = Bytes::copy_from_slice(data);
    let mut frames = vec![Bytes::from_static(b"sentinel")];
    if compound::decode(&buf, &mut frames).is_err() {
        assert_eq!(frames.len(), 1, "a rejected datagram appended frames");
        return;
    }
    let frames = frames.split_off(1);
    assert!((1..=compound::MAX_FRAMES).contains(&frames.len()));
    let mut out = Vec::new();
    let mut enc = compound::Encoder::new(&mut out);
    for f in &frames {
        assert!(f.len() >= compound::MIN_FRAME);
        assert_eq!(f[0..2], MAGIC);
        assert_eq!(f[2], VERSION);
        assert!(f[3] == 1 || f[3] == 2, "frame of kind {}", f[3]);
        assert!(enc.push(f, MAX_DATAGRAM), "a decoded frame fits again");
    }
    assert_eq!(
        out.len(),
        compound::encoded_len(frames.iter().map(|f| f.len()))
    );
    assert!(out.len() <= data.len());
    let mut again = Vec::new();
    compound::decode(&Bytes::from(out), &mut again).expect("re-encoded compound decodes");
    assert_eq!(again, frames);
    let mut msgs: Vec<Message> = Vec::new();
    for f in &frames {
        match f[3] {
            1 => {
                let _ = wire::decode_into(f, &mut msgs);
            }
            _ => {
                let _ = Packet::decode(f);
            }
        }
    }
});
