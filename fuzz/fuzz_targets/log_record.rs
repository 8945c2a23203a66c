//! The `file://` log's records (`skiff_proto::record`) on arbitrary bytes,
//! read from any offset as a follower of a growing log reads them: never
//! panics, offsets only move forward within the data, and each record read
//! encodes to a record that reads back as the same message. And damage: a
//! valid log with one byte changed or cut short still reads every record
//! the damage did not touch, with at most one damaged stretch counted.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use skiff_proto::record::{self, Next, Skipped};
use skiff_proto::Message;

const MAX: usize = 1 << 16;

fuzz_target!(|input: (u8, u16, u8, u16, &[u8])| {
    let (start, flip_at, flip, cut, data) = input;
    let data = Bytes::copy_from_slice(data);
    let mut at = usize::from(start).min(data.len());
    while let Next::Record(msg, next) = record::next(&data, at, MAX) {
        assert!(next > at && next <= data.len());
        let mut again = Vec::new();
        record::encode(&mut again, &msg);
        let again = Bytes::from(again);
        match record::next(&again, 0, MAX) {
            Next::Record(back, end) => assert_eq!((back, end), (msg, again.len())),
            other => panic!("re-encoded {msg:?} reads as {other:?}"),
        }
        at = next;
    }

    // The skipping walk on arbitrary bytes ends, moving forward.
    let (mut at, mut skipped) = (usize::from(start).min(data.len()), Skipped::default());
    loop {
        let before = at;
        let more = record::next_skipping(&data, &mut at, MAX, &mut skipped).is_some();
        assert!(at >= before && at <= data.len().max(before));
        if !more {
            break;
        }
        assert!(at > before);
    }

    // A valid log of fixed records, one byte changed and maybe cut short.
    let msgs: Vec<Message> = (0..8)
        .map(|i| Message::new("log.t", vec![b'a' + i; 10 + 7 * usize::from(i)]))
        .collect();
    let (mut log, mut starts) = (Vec::new(), Vec::new());
    for m in &msgs {
        starts.push(log.len());
        record::encode(&mut log, m);
    }
    starts.push(log.len());
    let flip_at = usize::from(flip_at) % log.len();
    log[flip_at] ^= flip;
    let len = log.len() - usize::from(cut) % 64;
    let log = Bytes::from(log).slice(..len);
    let (mut at, mut skipped, mut read) = (0, Skipped::default(), Vec::new());
    while let Some(m) = record::next_skipping(&log, &mut at, MAX, &mut skipped) {
        read.push(m);
    }
    let whole: Vec<Message> = (0..8)
        .filter(|&i| starts[i + 1] <= len && (flip == 0 || !(starts[i]..starts[i + 1]).contains(&flip_at)))
        .map(|i| msgs[i].clone())
        .collect();
    assert_eq!(read, whole, "flip {flip:#x} at {flip_at}, cut to {len}");
    assert!(skipped.records <= 1);
});
