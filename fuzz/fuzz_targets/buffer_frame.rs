//! The reliable-udp buffer transport's frames (subscribe, credit,
//! subscribed, segment, close) on arbitrary bytes, as sent by a hostile
//! subscriber or output: never panics, and a frame that decodes encodes
//! back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    skiff::shm::fuzzing::assoc_frame(data);
});
