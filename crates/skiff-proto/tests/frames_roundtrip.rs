//! Round trips of the frame codecs moved into skiff-proto (node↔node
//! frames, tunnel frames, the buffer transports' frames) over every buffer
//! shape: arbitrary frames, every strict prefix (the frame cut at each
//! byte), a byte more, slices at odd offsets of a larger buffer, and for
//! the stream formats (the tcp buffer headers, the client↔node stream) the
//! input fed one byte at a time.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use skiff_proto::buffer::{self, assoc, tcp, CloseReason};
use skiff_proto::client_frame::{ClientFrame, Decoder};
use skiff_proto::codec::{Reader, Writer};
use skiff_proto::credits::Flow;
use skiff_proto::mesh::node_frame::{self, NodeFrame};
use skiff_proto::mesh::tunnel_frame::TunnelFrame;
use skiff_proto::{Message, WireError};

const MAX_PAYLOAD: usize = 1 << 20;

// ---------------------------------------------------------------- strategies

fn message() -> impl Strategy<Value = Message> {
    (
        prop_oneof!["[a-z]{1,8}(\\.[a-z]{1,8}){0,3}", "\\PC{1,24}"],
        proptest::option::of("[a-z]{0,12}"),
        proptest::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(s, k, p)| {
            let mut m = Message::new(s.as_str(), p);
            m.kind = k.map(Into::into);
            m
        })
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof!["", "[a-z]{1,16}", "\\PC{1,40}", "[a-z]{1024}"]
}

fn key() -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from)
}

fn node_frame() -> impl Strategy<Value = NodeFrame> {
    prop_oneof![
        message().prop_map(|msg| NodeFrame::Pub { msg }),
        (
            any::<u64>(),
            any::<u8>(),
            any::<u32>(),
            name(),
            key(),
            message()
        )
            .prop_map(|(token, flags, max, target, key, msg)| NodeFrame::Req {
                token,
                flags,
                max,
                target,
                key,
                msg
            }),
        (
            any::<u64>(),
            any::<u8>(),
            any::<u32>(),
            name(),
            proptest::collection::vec(name(), 0..4),
            message()
        )
            .prop_map(
                |(token, flags, max, target, groups, msg)| NodeFrame::GroupReq {
                    token,
                    flags,
                    max,
                    target,
                    groups,
                    msg
                }
            ),
        (any::<u64>(), message()).prop_map(|(token, msg)| NodeFrame::Reply { token, msg }),
        (any::<u64>(), any::<u32>())
            .prop_map(|(token, reached)| NodeFrame::Done { token, reached }),
        (name(), message()).prop_map(|(cluster, msg)| NodeFrame::Bcast { cluster, msg }),
        (name(), message()).prop_map(|(group, msg)| NodeFrame::Group { group, msg }),
    ]
}

fn tunnel_frame() -> impl Strategy<Value = TunnelFrame> {
    prop_oneof![
        (any::<u64>(), any::<u32>(), name(), key()).prop_map(|(tunnel, window, cluster, key)| {
            TunnelFrame::Open {
                tunnel,
                window,
                cluster,
                key,
            }
        }),
        (any::<u64>(), any::<u64>()).prop_map(|(tunnel, peer_tunnel)| TunnelFrame::Opened {
            tunnel,
            peer_tunnel
        }),
        any::<u64>().prop_map(|tunnel| TunnelFrame::Refused { tunnel }),
        (any::<u64>(), message()).prop_map(|(tunnel, msg)| TunnelFrame::Data { tunnel, msg }),
        (any::<u64>(), any::<u32>()).prop_map(|(tunnel, n)| TunnelFrame::Credit { tunnel, n }),
        any::<u64>().prop_map(|tunnel| TunnelFrame::Close { tunnel }),
    ]
}

fn reason() -> impl Strategy<Value = CloseReason> {
    prop_oneof![
        Just(CloseReason::Producer),
        Just(CloseReason::Corrupt),
        Just(CloseReason::Lost)
    ]
}

/// Owned parts of an assoc buffer frame (a segment borrows its bytes).
#[derive(Debug, Clone)]
enum AssocFrame {
    Subscribe(u32, u32, u32),
    Credit(u32, u64, u64),
    Subscribed(u32, Flow),
    Segment(u32, Vec<u8>),
    Close(u32, CloseReason),
}

impl AssocFrame {
    fn frame(&self) -> assoc::Frame<'_> {
        match *self {
            AssocFrame::Subscribe(id, size, records) => {
                assoc::Frame::Subscribe { id, size, records }
            }
            AssocFrame::Credit(id, consumed, read) => assoc::Frame::Credit { id, consumed, read },
            AssocFrame::Subscribed(id, flow) => assoc::Frame::Subscribed { id, flow },
            AssocFrame::Segment(id, ref data) => assoc::Frame::Segment { id, data },
            AssocFrame::Close(id, reason) => assoc::Frame::Close { id, reason },
        }
    }

    fn up(&self) -> bool {
        matches!(self, AssocFrame::Subscribe(..) | AssocFrame::Credit(..))
    }
}

fn assoc_frame() -> impl Strategy<Value = AssocFrame> {
    prop_oneof![
        (any::<u32>(), 1..=buffer::MAX_LEN, 1..=u32::MAX)
            .prop_map(|(i, s, r)| AssocFrame::Subscribe(i, s, r)),
        (any::<u32>(), any::<u64>(), any::<u64>())
            .prop_map(|(i, c, r)| AssocFrame::Credit(i, c, r)),
        (
            any::<u32>(),
            prop_oneof![Just(Flow::Credits), Just(Flow::Overwrite)]
        )
            .prop_map(|(i, f)| AssocFrame::Subscribed(i, f)),
        (any::<u32>(), proptest::collection::vec(any::<u8>(), 0..200))
            .prop_map(|(i, d)| AssocFrame::Segment(i, d)),
        (any::<u32>(), reason()).prop_map(|(i, r)| AssocFrame::Close(i, r)),
    ]
}

// ---------------------------------------------------------------- helpers

/// `b` as a slice at an odd offset of a larger buffer (the shape a frame
/// has inside a datagram or an association message).
fn embedded(b: &[u8]) -> Bytes {
    let mut v = vec![0xa5; 3];
    v.extend_from_slice(b);
    v.extend_from_slice(&[0x5a; 5]);
    Bytes::from(v).slice(3..3 + b.len())
}

fn node_bytes(f: &NodeFrame) -> Bytes {
    let mut out = Vec::new();
    f.encode(&mut out);
    out.into()
}

/// Decodes an assoc buffer frame from the side that sends it.
fn dec(up: bool, x: &[u8]) -> Result<assoc::Frame<'_>, WireError> {
    if up {
        assoc::decode_up(x)
    } else {
        assoc::decode_down(x)
    }
}

// ---------------------------------------------------------------- properties

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn node_frames_round_trip_over_every_shape(f in node_frame()) {
        let b = node_bytes(&f);
        prop_assert_eq!(&NodeFrame::decode(&b, MAX_PAYLOAD).unwrap(), &f);
        prop_assert_eq!(&NodeFrame::decode(&embedded(&b), MAX_PAYLOAD).unwrap(), &f);
        prop_assert_eq!(&NodeFrame::decode(&Bytes::copy_from_slice(&b), MAX_PAYLOAD).unwrap(), &f);
        for n in 0..b.len() {
            prop_assert!(NodeFrame::decode(&b.slice(..n), MAX_PAYLOAD).is_err(), "prefix {}", n);
        }
        let mut longer = b.to_vec();
        longer.push(0);
        prop_assert!(NodeFrame::decode(&Bytes::from(longer), MAX_PAYLOAD).is_err());
    }

    #[test]
    fn node_frame_parts_encode_as_the_frame_does(f in node_frame()) {
        let mut parts = Vec::new();
        match &f {
            NodeFrame::Pub { msg } => node_frame::encode_publish(&mut parts, msg),
            NodeFrame::Req { token, flags, max, target, key, msg } =>
                node_frame::encode_request(&mut parts, *token, *flags, *max, target, key, msg),
            NodeFrame::GroupReq { token, flags, max, target, groups, msg } =>
                node_frame::encode_group_request(&mut parts, *token, *flags, *max, target, groups, msg),
            NodeFrame::Reply { token, msg } => node_frame::encode_reply(&mut parts, *token, msg),
            NodeFrame::Done { token, reached } => node_frame::encode_done(&mut parts, *token, *reached),
            NodeFrame::Bcast { cluster, msg } => node_frame::encode_broadcast(&mut parts, cluster, msg),
            NodeFrame::Group { group, msg } => {
                node_frame::group_head(&mut parts, group);
                skiff_proto::wire::encode_message(&mut parts, msg, false);
            }
        }
        prop_assert_eq!(&parts[..], &node_bytes(&f)[..]);
    }

    #[test]
    fn tunnel_frames_round_trip_over_every_shape(f in tunnel_frame()) {
        let b = f.encode();
        prop_assert_eq!(&TunnelFrame::decode(&b, MAX_PAYLOAD).unwrap(), &f);
        prop_assert_eq!(&TunnelFrame::decode(&embedded(&b), MAX_PAYLOAD).unwrap(), &f);
        prop_assert_eq!(f.tunnel(), TunnelFrame::decode(&b, MAX_PAYLOAD).unwrap().tunnel());
        for n in 0..b.len() {
            prop_assert!(TunnelFrame::decode(&b.slice(..n), MAX_PAYLOAD).is_err(), "prefix {}", n);
        }
        let mut longer = b.to_vec();
        longer.push(0);
        prop_assert!(TunnelFrame::decode(&Bytes::from(longer), MAX_PAYLOAD).is_err());
    }

    #[test]
    fn assoc_buffer_frames_round_trip_over_every_shape(f in assoc_frame()) {
        let b = assoc::encode(&f.frame());
        let up = f.up();
        prop_assert_eq!(dec(up, &b).unwrap(), f.frame());
        let e = embedded(&b);
        prop_assert_eq!(dec(up, &e).unwrap(), f.frame());
        for n in 0..b.len() {
            prop_assert!(dec(up, &b[..n]).is_err(), "prefix {}", n);
        }
        let mut longer = b.to_vec();
        longer.push(0);
        prop_assert!(dec(up, &longer).is_err());
        if let AssocFrame::Segment(id, data) = &f {
            let mut v = Vec::new();
            assoc::segment_header(*id, data.len() as u32, &mut v);
            v.extend_from_slice(data);
            prop_assert_eq!(&v[..], &b[..]);
        }
    }

    /// A tcp buffer stream (headers, close reasons and segment bytes) read
    /// the way the transport reads it, fed one byte at a time.
    #[test]
    fn tcp_buffer_stream_decodes_fed_one_byte_at_a_time(
        frames in proptest::collection::vec(
            (any::<u32>(), prop_oneof![
                Just(None),
                reason().prop_map(Some),
            ], proptest::collection::vec(any::<u8>(), 0..40)),
            1..8,
        )
    ) {
        let mut stream = Vec::new();
        stream.extend_from_slice(&tcp::subscribed(frames[0].0));
        for (id, reason, data) in &frames {
            match reason {
                Some(r) => stream.extend_from_slice(&tcp::close_frame(*id, *r)),
                None => {
                    stream.extend_from_slice(&tcp::segment(*id, data.len() as u32));
                    stream.extend_from_slice(data);
                }
            }
        }
        // The reader: 8 bytes of header, then what the header says.
        let mut got = Vec::new();
        let mut pending: Vec<u8> = Vec::new();
        let mut want: Option<(u32, tcp::Down)> = None;
        for &byte in &stream {
            pending.push(byte);
            match want {
                None if pending.len() == 8 => {
                    let h: [u8; 8] = pending[..].try_into().unwrap();
                    let (id, d) = tcp::decode_down(&h).unwrap();
                    pending.clear();
                    match d {
                        tcp::Down::Subscribed => got.push((id, None, Vec::new(), true)),
                        tcp::Down::Segment(0) => got.push((id, None, Vec::new(), false)),
                        d => want = Some((id, d)),
                    }
                }
                Some((id, tcp::Down::Close)) => {
                    got.push((id, CloseReason::decode(pending[0]), Vec::new(), false));
                    pending.clear();
                    want = None;
                }
                Some((id, tcp::Down::Segment(len))) if pending.len() == len as usize => {
                    got.push((id, None, std::mem::take(&mut pending), false));
                    want = None;
                }
                _ => {}
            }
        }
        prop_assert!(pending.is_empty() && want.is_none());
        let mut expect = vec![(frames[0].0, None, Vec::new(), true)];
        expect.extend(frames.iter().map(|(id, r, d)| {
            (*id, *r, if r.is_some() { Vec::new() } else { d.clone() }, false)
        }));
        prop_assert_eq!(got, expect);
    }

    #[test]
    fn tcp_headers_round_trip(id in any::<u32>(), size in 1..=buffer::MAX_LEN) {
        prop_assert_eq!(tcp::decode_up(&tcp::subscribe(id, size)), Ok((id, tcp::Up::Subscribe(size))));
        prop_assert_eq!(tcp::decode_up(&tcp::unsubscribe(id)), Ok((id, tcp::Up::Close)));
        prop_assert_eq!(tcp::decode_down(&tcp::segment(id, size)), Ok((id, tcp::Down::Segment(size))));
        prop_assert_eq!(tcp::decode_down(&tcp::subscribed(id)), Ok((id, tcp::Down::Subscribed)));
    }

    /// The client↔node stream: many frames, fed to the stream decoder one
    /// byte at a time, come out whole and in order.
    #[test]
    fn client_stream_fed_one_byte_at_a_time(
        corrs in proptest::collection::vec(any::<u64>(), 1..10),
        msg in message(),
    ) {
        let mut frames: Vec<ClientFrame> =
            corrs.iter().map(|&corr| ClientFrame::Ping { corr }).collect();
        frames.push(ClientFrame::Pub(msg));
        let mut stream = Vec::new();
        for f in &frames {
            f.encode(&mut stream);
        }
        let dec = Decoder::new(MAX_PAYLOAD + 64);
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for &b in &stream {
            buf.extend_from_slice(&[b]);
            while let Some(body) = dec.next(&mut buf).unwrap() {
                got.push(ClientFrame::decode(body, MAX_PAYLOAD).unwrap());
            }
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(got, frames);
    }

    #[test]
    fn codec_reader_is_total(data in proptest::collection::vec(any::<u8>(), 0..64), max in 0usize..80) {
        let b = Bytes::from(data);
        let mut r = Reader::new(&b);
        while !r.is_empty() {
            let before = r.pos();
            let _ = r.varint("v");
            let _ = r.shared(max, "b");
            let _ = r.str(max, "s");
            let _ = r.u32("u");
            if r.pos() == before {
                let _ = r.u8("u8");
            }
        }
        prop_assert_eq!(r.finish(), Ok(()));
    }

    #[test]
    fn codec_writer_and_reader_agree(v in any::<u64>(), b in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut out = Vec::new();
        out.put_varint(v);
        out.put_prefixed(&b);
        let mut r = Reader::new(&out[..]);
        prop_assert_eq!(r.varint("v"), Ok(v));
        prop_assert_eq!(r.bytes(300, "b"), Ok(&b[..]));
        prop_assert!(r.is_empty());
        // Every strict prefix is an error, never a panic.
        for n in 0..out.len() {
            let mut r = Reader::new(&out[..n]);
            let ok = r.varint("v").and_then(|_| r.bytes(300, "b").map(|_| ()));
            prop_assert!(ok.is_err());
        }
    }
}

#[test]
fn the_pub_frame_is_its_op_then_the_message() {
    let msg = Message::new("a.b", &b"hi"[..]);
    let b = node_bytes(&NodeFrame::Pub { msg: msg.clone() });
    assert_eq!(b[0], node_frame::op::PUB);
    assert_eq!(
        skiff_proto::wire::decode_message(&b.slice(1..), MAX_PAYLOAD),
        Ok(msg)
    );
}

#[test]
fn varint_errors_name_the_field() {
    let mut r = Reader::new(&[0x80u8, 0x80][..]);
    assert_eq!(r.varint("sid"), Err(WireError::Truncated { what: "sid" }));
}
