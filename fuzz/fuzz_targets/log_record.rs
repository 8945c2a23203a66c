//! The `file://` log's records (`skiff_proto::record`) on arbitrary bytes,
//! read from any offset as a follower of a growing log reads them: never
//! panics, offsets only move forward within the data, and each record read
//! encodes to a record that reads back as the same message.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use skiff_proto::record;

const MAX: usize = 1 << 16;

fuzz_target!(|input: (u8, &[u8])| {
    let (start, data) = input;
    let data = Bytes::copy_from_slice(data);
    let mut at = usize::from(start).min(data.len());
    while let Ok(Some((msg, next))) = record::next(&data, at, MAX) {
        assert!(next > at && next <= data.len());
        let mut again = Vec::new();
        record::encode(&mut again, &msg);
        let again = Bytes::from(again);
        let (back, end) = record::next(&again, 0, MAX)
            .unwrap_or_else(|e| panic!("re-encoded {msg:?} does not read: {e}"))
            .expect("a whole record");
        assert_eq!((back, end), (msg, again.len()));
        at = next;
    }
});
