//! The buffer transports' frames on arbitrary bytes, as sent by a hostile
//! subscriber or output: reliable udp's (subscribe, credit, subscribed,
//! segment, close) and tcp's headers and close reasons. Never panics, and
//! what decodes encodes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    skiff::shm::fuzzing::assoc_frame(data);
    skiff::shm::fuzzing::tcp_header(data);
});
