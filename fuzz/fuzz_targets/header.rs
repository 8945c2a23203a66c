//! `Header::read` on arbitrary bytes: never panics, and a header it accepts
//! writes back to the same 26 bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_proto::wire::{Header, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Header::read(data) {
        assert!(data.len() >= HEADER_LEN);
        let mut out = [0u8; HEADER_LEN];
        h.write(&mut out);
        assert_eq!(&out[..], &data[..HEADER_LEN]);
        assert_eq!(Header::read(&out), Ok(h));
    }
});
