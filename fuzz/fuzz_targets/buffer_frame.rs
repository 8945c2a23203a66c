//! The buffer transports' frames (`skiff_proto::buffer`) on arbitrary
//! bytes, as sent by a hostile subscriber or output: reliable udp's
//! (subscribe, credit, subscribed, segment, close) and tcp's headers and
//! close reasons. Never panics, and what decodes encodes back to the same
//! bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_proto::buffer::{assoc, tcp, CloseReason};

fuzz_target!(|data: &[u8]| {
    for f in [assoc::decode_up(data), assoc::decode_down(data)]
        .into_iter()
        .flatten()
    {
        assert_eq!(&assoc::encode(&f)[..], data, "{f:?}");
    }
    if let Some(h) = data.first_chunk::<8>() {
        if let Ok((id, up)) = tcp::decode_up(h) {
            let again = match up {
                tcp::Up::Subscribe(size) => tcp::subscribe(id, size),
                tcp::Up::Close => tcp::unsubscribe(id),
            };
            assert_eq!(&again, h, "{up:?}");
        }
        if let Ok((id, down)) = tcp::decode_down(h) {
            let again = match down {
                tcp::Down::Subscribed => tcp::subscribed(id),
                tcp::Down::Segment(len) => tcp::segment(id, len),
                tcp::Down::Close => {
                    let f = tcp::close_frame(id, CloseReason::Producer);
                    f[..8].try_into().unwrap()
                }
            };
            assert_eq!(&again, h, "{down:?}");
        }
    }
    if let Some(&r) = data.get(8) {
        if let Some(reason) = CloseReason::decode(r) {
            assert_eq!(reason.code(), r);
        }
    }
});
