//! `varint::get` on arbitrary bytes: never panics, never reads past its
//! input or past 10 bytes, and what it reads re-encodes (in the shortest
//! form) to a value that reads back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_proto::varint;

fuzz_target!(|data: &[u8]| {
    if let Ok((v, n)) = varint::get(data) {
        assert!(n >= 1 && n <= data.len() && n <= varint::MAX_LEN);
        // The last byte read ends the varint; the ones before continue it.
        assert!(data[n - 1] < 0x80);
        assert!(data[..n - 1].iter().all(|&b| b >= 0x80));
        let mut out = Vec::new();
        varint::put(&mut out, v);
        assert!(out.len() <= n);
        assert_eq!(out.len(), varint::len(v));
        assert_eq!(varint::get(&out), Ok((v, out.len())));
        assert_eq!(varint::unzigzag(varint::zigzag(v as i64)), v as i64);
    }
});
