//! `msgframe::Messages` (the buffer API's message layer) on arbitrary
//! bytes split anywhere into a segment's two slices: never panics, ends at
//! the first error, and the messages it returns, re-framed, are a prefix
//! of the segment's bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_proto::msgframe::Messages;

fuzz_target!(|input: (u16, &[u8])| {
    let (cut, data) = input;
    let at = cut as usize % (data.len() + 1);
    let (a, b) = data.split_at(at);
    let mut reframed = Vec::new();
    let mut errors = 0;
    for m in Messages::new(a, b) {
        match m {
            Ok(m) => {
                reframed.extend_from_slice(&(m.len() as u32).to_le_bytes());
                reframed.extend_from_slice(&m);
            }
            Err(_) => errors += 1,
        }
    }
    assert!(errors <= 1, "the iteration ends at the first error");
    assert!(reframed.len() <= data.len());
    assert_eq!(&data[..reframed.len()], &reframed[..]);
    if errors == 0 {
        assert_eq!(reframed.len(), data.len(), "no error: every byte is a message");
    }
});
