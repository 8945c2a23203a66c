//! The topic request line a subscriber sends on the node's shm socket
//! (`skiff::shm::topic::TopicAsk`), on arbitrary text: never panics, and
//! what parses prints back as a line that parses to the same request. The
//! same for a subscriber's report line (`skiff::shm::topic::Report`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff::shm::topic::{Report, TopicAsk};

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(ask) = TopicAsk::parse(line) {
        assert_eq!(TopicAsk::parse(&ask.line()), Ok(ask));
    }
    if let Ok(r) = Report::parse(line) {
        assert_eq!(Report::parse(&r.line()), Ok(r));
    }
});
