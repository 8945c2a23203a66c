//! cMsg patterns (`skiff_proto::router::cmsg`) from arbitrary text: the
//! parser never panics and keeps the text; matching never panics, on any
//! text; `*p` matches whatever `p` matches and `*p*` whatever holds a match
//! of `p`; the router (its prefix index) agrees with the pattern alone.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_proto::router::{CmsgPattern, Router, Subject, Syntax};

fuzz_target!(|input: (&str, &str, &str)| {
    let (pattern, kind, text) = input;
    let _ = CmsgPattern::kind(kind);
    let Ok(p) = CmsgPattern::subject(pattern) else {
        return;
    };
    assert_eq!(p.as_str(), pattern);
    let m = p.matches(text);
    if p.is_literal() {
        assert_eq!(m, text == pattern);
    }
    if m {
        assert!(text.starts_with(p.literal_prefix()));
        if let Ok(star) = CmsgPattern::subject(&format!("*{pattern}")) {
            assert!(star.matches(text));
        }
        if let Ok(both) = CmsgPattern::subject(&format!("*{pattern}*")) {
            assert!(both.matches(&format!("x{text}y")));
        }
    }
    if let Ok(subject) = Subject::new(text) {
        let mut r = Router::new();
        let id = r.subscribe_as(Syntax::Cmsg, pattern, "*", 1u8).unwrap();
        let mut out = Vec::new();
        r.matches(subject, None, &mut out);
        assert_eq!(out.len(), usize::from(m));
        assert_eq!(r.has_interest(subject), m);
        r.unsubscribe(id);
        assert_eq!(r.node_count(), 0);
    }
});
