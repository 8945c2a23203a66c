//! The monitoring listener's query parameters
//! (`skiff_node::monitor::query`) on arbitrary text: never a panic, and
//! what is accepted lies within the bounds (a page of 1 to `MAX_LIMIT`
//! clients, no query over `MAX_QUERY` bytes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_node::monitor::query::{parse_connz, parse_none, parse_subsz, MAX_LIMIT, MAX_QUERY};

fuzz_target!(|data: &[u8]| {
    let q = String::from_utf8_lossy(data);
    if let Ok(c) = parse_connz(&q) {
        assert!((1..=MAX_LIMIT).contains(&c.limit));
        assert!(q.len() <= MAX_QUERY);
    }
    if let Ok(s) = parse_subsz(&q) {
        assert!((1..=MAX_LIMIT).contains(&s.limit));
        assert!((1..=MAX_LIMIT).contains(&s.cluster_limit));
        assert!(s.members <= MAX_LIMIT);
        assert!(q.len() <= MAX_QUERY);
    }
    if parse_none("/varz", &q).is_ok() {
        assert!(q.split('&').all(|p| p.is_empty()));
    }
});
