//! Malformed input for the frame codecs moved into skiff-proto (node↔node
//! frames, tunnel frames, the buffer transports' frames): each kind of bad
//! input is refused with an error, never a panic, and nothing is allocated
//! from a length on the wire before it is checked.

use bytes::{BufMut, Bytes};
use proptest::prelude::*;
use skiff_proto::buffer::{self, assoc, tcp, CloseReason, CLOSE, CREDIT, SUBSCRIBED};
use skiff_proto::codec::Writer;
use skiff_proto::credits::Flow;
use skiff_proto::mesh::node_frame::{self, op, NodeFrame};
use skiff_proto::mesh::tunnel_frame::{self, TunnelFrame};
use skiff_proto::{Message, WireError};

const MAX_PAYLOAD: usize = 1 << 20;

fn node(b: Vec<u8>) -> Result<NodeFrame, WireError> {
    NodeFrame::decode(&Bytes::from(b), MAX_PAYLOAD)
}

fn tun(b: Vec<u8>) -> Result<TunnelFrame, WireError> {
    TunnelFrame::decode(&Bytes::from(b), MAX_PAYLOAD)
}

fn msg_bytes(m: &Message) -> Vec<u8> {
    let mut v = Vec::new();
    skiff_proto::wire::encode_message(&mut v, m, false);
    v
}

// ---------------------------------------------------------------- node frames

#[test]
fn node_empty_and_unknown_op() {
    assert_eq!(
        node(vec![]),
        Err(WireError::Truncated {
            what: "node frame op"
        })
    );
    assert_eq!(node(vec![0]), Err(WireError::Kind(0)));
    assert_eq!(node(vec![8, 1, 2]), Err(WireError::Kind(8)));
    // A group frame whose name runs past the frame.
    assert!(node(vec![op::GROUP, 5, b'a']).is_err());
}

#[test]
fn node_request_target_over_the_limit_is_refused_before_reading_it() {
    let mut b = vec![op::REQ];
    b.put_u64_le(1);
    b.put_u8(0);
    b.put_u32_le(1);
    b.put_varint(u64::MAX >> 1);
    assert!(matches!(node(b), Err(WireError::TooLong { .. })));
    let mut b = vec![op::REQ];
    b.put_u64_le(1);
    b.put_u8(0);
    b.put_u32_le(1);
    b.put_varint(node_frame::MAX_NAME as u64);
    b.extend_from_slice(b"abc");
    assert!(matches!(node(b), Err(WireError::Truncated { .. })));
}

#[test]
fn node_group_request_count_over_the_limit_is_refused_before_reading_groups() {
    let head = || {
        let mut b = vec![op::GREQ];
        b.put_u64_le(1);
        b.put_u8(0);
        b.put_u32_le(1);
        b.put_prefixed(b"a.b");
        b
    };
    let mut b = head();
    b.put_varint(node_frame::MAX_GROUPS as u64 + 1);
    b.extend_from_slice(&[0u8; 200]);
    assert!(matches!(node(b), Err(WireError::TooLong { .. })));
    // A count the frame cannot hold.
    let mut b = head();
    b.put_varint(3);
    b.put_prefixed(b"g");
    assert!(matches!(node(b), Err(WireError::Truncated { .. })));
    // A group that is not UTF-8.
    let mut b = head();
    b.put_varint(1);
    b.put_prefixed(&[0xff]);
    b.extend_from_slice(&msg_bytes(&Message::new("a.b", &b"x"[..])));
    assert!(matches!(node(b), Err(WireError::Utf8(_))));
    // Well formed.
    let mut b = head();
    b.put_varint(2);
    b.put_prefixed(b"g1");
    b.put_prefixed(b"g2");
    b.extend_from_slice(&msg_bytes(&Message::new("a.b", &b"x"[..])));
    let NodeFrame::GroupReq { groups, .. } = node(b).unwrap() else {
        panic!("not a group request")
    };
    assert_eq!(groups, ["g1", "g2"]);
}

#[test]
fn node_bad_utf8_target_and_cluster() {
    let m = msg_bytes(&Message::new("a", &b"x"[..]));
    let mut b = vec![op::REQ];
    b.put_u64_le(1);
    b.put_u8(0);
    b.put_u32_le(1);
    b.put_prefixed(&[0xff, 0xfe]);
    b.put_prefixed(b"");
    b.extend_from_slice(&m);
    assert!(matches!(node(b), Err(WireError::Utf8(_))));
    let mut b = vec![op::BCAST];
    b.put_prefixed(&[0xc0]);
    b.extend_from_slice(&m);
    assert!(matches!(node(b), Err(WireError::Utf8(_))));
}

#[test]
fn node_frames_without_their_message_or_with_trailing_bytes() {
    let mut b = vec![op::REPLY];
    b.put_u64_le(9);
    assert!(node(b).is_err(), "reply with no message");
    let mut b = vec![op::DONE];
    b.put_u64_le(9);
    b.put_u32_le(2);
    assert!(node(b.clone()).is_ok());
    b.push(0);
    assert_eq!(
        node(b),
        Err(WireError::Malformed("trailing bytes after the frame"))
    );
}

#[test]
fn node_payload_over_max_payload() {
    let mut b = Vec::new();
    node_frame::encode_publish(&mut b, &Message::new("a", vec![0u8; 2000]));
    assert!(NodeFrame::decode(&Bytes::from(b), 1000).is_err());
}

// ---------------------------------------------------------------- tunnel frames

#[test]
fn tunnel_unknown_op_short_id_and_long_names() {
    assert!(tun(vec![]).is_err());
    assert!(tun(vec![tunnel_frame::op::CLOSE, 1, 2, 3]).is_err());
    assert_eq!(
        tun(vec![99, 0, 0, 0, 0, 0, 0, 0, 0]),
        Err(WireError::Kind(99))
    );
    let mut long = vec![tunnel_frame::op::OPEN];
    long.put_u64_le(1);
    long.put_u32_le(1);
    long.put_varint(u64::MAX >> 1);
    assert!(matches!(tun(long), Err(WireError::TooLong { .. })));
    let mut just_over = vec![tunnel_frame::op::OPEN];
    just_over.put_u64_le(1);
    just_over.put_u32_le(1);
    just_over.put_prefixed(&vec![b'a'; tunnel_frame::MAX_NAME + 1]);
    just_over.put_prefixed(b"");
    assert!(matches!(tun(just_over), Err(WireError::TooLong { .. })));
}

#[test]
fn tunnel_trailing_bytes_and_big_data() {
    let mut trailing = TunnelFrame::Close { tunnel: 1 }.encode().to_vec();
    trailing.push(0);
    assert!(tun(trailing).is_err());
    let big = TunnelFrame::Data {
        tunnel: 1,
        msg: Message::new("a", vec![0u8; 2000]),
    }
    .encode();
    assert!(TunnelFrame::decode(&big, 1000).is_err(), "over max_payload");
}

// ---------------------------------------------------------------- buffer frames

fn hdr(id: u32, size: u32) -> Vec<u8> {
    buffer::header(id, size).to_vec()
}

#[test]
fn assoc_buffer_hostile_values() {
    // Short of a header.
    assert!(assoc::decode_up(&[1, 2, 3]).is_err());
    assert!(assoc::decode_down(&[]).is_err());
    // Unknown flow code and close reason.
    let mut b = hdr(1, SUBSCRIBED);
    b.push(9);
    assert!(assoc::decode_down(&b).is_err());
    let mut b = hdr(1, CLOSE);
    b.push(3);
    assert!(assoc::decode_down(&b).is_err());
    // A segment length claiming more than the frame holds.
    let mut s = hdr(1, 1000);
    s.extend_from_slice(b"ab");
    assert!(assoc::decode_down(&s).is_err());
    // Markers from the wrong side.
    let close = assoc::encode(&assoc::Frame::Close {
        id: 1,
        reason: CloseReason::Producer,
    });
    assert!(assoc::decode_up(&close).is_err());
    let credit = assoc::encode(&assoc::Frame::Credit {
        id: 1,
        consumed: 0,
        read: 0,
    });
    assert!(assoc::decode_down(&credit).is_err());
    // Subscribe of size 0 or 0 records; a credit of the wrong length.
    let mut z = hdr(1, 0);
    z.put_u32_le(4);
    assert!(assoc::decode_up(&z).is_err());
    let mut z = hdr(1, 8);
    z.put_u32_le(0);
    assert!(assoc::decode_up(&z).is_err());
    let mut c = hdr(1, CREDIT);
    c.put_u64_le(1);
    assert!(assoc::decode_up(&c).is_err());
    // Unknown markers either way.
    for m in [buffer::MAX_LEN + 1, 0xffff_fff0] {
        let mut b = hdr(1, m);
        b.put_u32_le(1);
        assert!(assoc::decode_up(&b).is_err());
        assert!(assoc::decode_down(&hdr(1, m)).is_err());
    }
    // A valid subscribed frame still decodes (the test above is not vacuous).
    let mut ok = hdr(1, SUBSCRIBED);
    ok.push(2);
    assert_eq!(
        assoc::decode_down(&ok),
        Ok(assoc::Frame::Subscribed {
            id: 1,
            flow: Flow::Overwrite
        })
    );
}

#[test]
fn tcp_unknown_markers_and_reasons_are_refused() {
    for m in buffer::MAX_LEN + 1..=u32::MAX {
        let h = buffer::header(1, m);
        if m != CLOSE {
            assert!(tcp::decode_up(&h).is_err(), "{m:#x} from a subscriber");
        }
        if m != CLOSE && m != SUBSCRIBED {
            assert!(tcp::decode_down(&h).is_err(), "{m:#x} from an output");
        }
    }
    assert!(
        tcp::decode_up(&buffer::header(1, 0)).is_err(),
        "subscribe of size 0"
    );
    for b in 3..=u8::MAX {
        assert_eq!(CloseReason::decode(b), None);
    }
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..80)) {
        let b = Bytes::from(data.clone());
        let _ = NodeFrame::decode(&b, MAX_PAYLOAD);
        let _ = TunnelFrame::decode(&b, MAX_PAYLOAD);
        let _ = assoc::decode_up(&data);
        let _ = assoc::decode_down(&data);
        if let Some(h) = data.first_chunk::<8>() {
            let _ = tcp::decode_up(h);
            let _ = tcp::decode_down(h);
        }
    }

    /// Most inputs with a valid op byte reach past it.
    #[test]
    fn arbitrary_bodies_behind_each_op_never_panic(
        op in 0u8..8,
        data in proptest::collection::vec(any::<u8>(), 0..80),
    ) {
        let mut v = vec![op];
        v.extend_from_slice(&data);
        let b = Bytes::from(v);
        let _ = NodeFrame::decode(&b, MAX_PAYLOAD);
        let _ = TunnelFrame::decode(&b, MAX_PAYLOAD);
    }
}
