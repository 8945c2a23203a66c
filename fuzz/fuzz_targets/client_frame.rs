//! The client↔node protocol (`skiff_proto::client_frame`) on arbitrary
//! bytes: the stream `Decoder`
//! (`next` over a read buffer, `split` over a shared-memory segment),
//! both frame decoders and the publish reader never panic, a decoded
//! publish's encoding lies within what was read, and the client's in-place
//! decoding of a message frame (header, then the message into a slot)
//! agrees with decoding the whole frame (and so does decoding it by
//! reference, `decode_message_ref`, a topic reader's, with `split_slice`
//! splitting as `split` does), and a decoded `Hello` carries a
//! valid name that survives encoding and decoding again.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use skiff_node::broker::Published;
use skiff_proto::client_frame::{
    simple_message, simple_span, valid_client_name, ClientFrame, Decoder, ServerFrame, LEN_PREFIX,
};
use skiff_proto::wire::{decode_message_into, decode_message_ref};
use skiff_proto::Message;

const MAX_PAYLOAD: usize = 60_000;

fn bodies(body: Bytes) {
    if let Ok(f @ ClientFrame::Hello { .. }) = ClientFrame::decode(body.clone(), MAX_PAYLOAD) {
        if let ClientFrame::Hello { name } = &f {
            assert!(valid_client_name(name));
        }
        let mut out = Vec::new();
        f.encode(&mut out);
        let again = ClientFrame::decode(Bytes::from(out).slice(LEN_PREFIX..), MAX_PAYLOAD);
        assert_eq!(again.ok(), Some(f));
    }
    let whole = ServerFrame::decode(body.clone(), MAX_PAYLOAD);
    if let Ok(Some((sid, token, at))) = ServerFrame::msg_header(&body) {
        let mut slot = Message::default();
        let r = decode_message_into(&body, at, MAX_PAYLOAD, &mut slot);
        // Read in place (a topic reader's way): the same verdict and parts.
        match decode_message_ref(&body, at, MAX_PAYLOAD) {
            Ok(m) => {
                assert!(r.is_ok(), "in place by reference accepted what the slot refused");
                assert_eq!(m.subject, &*slot.subject);
                assert_eq!(m.kind, slot.kind.as_deref());
                assert_eq!(m.payload, &slot.payload[..]);
                assert_eq!(m.best_effort, slot.best_effort);
                assert_eq!(m.has_fields, !slot.fields.is_empty());
            }
            Err(_) => assert!(r.is_err(), "by reference refused what the slot accepted"),
        }
        match whole {
            Ok(ServerFrame::Msg {
                sid: s,
                token: t,
                msg,
            }) => {
                assert_eq!((r, s, t), (Ok(()), sid, token));
                assert_eq!(slot, msg);
            }
            _ => assert!(
                r.is_err(),
                "in place accepted what the frame decoder refused"
            ),
        }
    }
    if let Some((subject, len)) = simple_message(&body, MAX_PAYLOAD) {
        let (span, n) = simple_span(&body, MAX_PAYLOAD).expect("a simple message has a span");
        assert_eq!((&body[span], n), (subject.as_bytes(), len));
    }
    let len = body.len();
    if let Ok(p) = Published::from_frame(body, MAX_PAYLOAD) {
        assert!(p.raw.len() < len.max(1));
    }
}

fuzz_target!(|data: &[u8]| {
    let dec = Decoder::new(MAX_PAYLOAD + 64);
    let mut buf = BytesMut::from(data);
    while let Ok(Some(body)) = dec.next(&mut buf) {
        bodies(body);
    }
    let mut seg = Bytes::copy_from_slice(data);
    let mut slice = data;
    loop {
        // The borrowed split (a topic reader's) agrees with the shared one.
        let (a, b) = (dec.split(&mut seg), dec.split_slice(&mut slice));
        match (a, b) {
            (Ok(Some(body)), Ok(Some(s))) => {
                assert_eq!(&body[..], s);
                bodies(body);
            }
            (Ok(None), Ok(None)) | (Err(_), Err(_)) => break,
            _ => panic!("split and split_slice disagree"),
        }
    }
    // A body on its own, as an in-process frame or a mesh frame is.
    bodies(Bytes::copy_from_slice(data));
});
