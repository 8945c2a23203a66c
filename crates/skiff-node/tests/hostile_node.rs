//! A node that breaks the protocol: the client delivers what arrived
//! whole before the bad frame, then gives the node up with an error that
//! says why (a decoder never panics on a node's bytes, and nothing after
//! the bad frame is taken).

use std::time::Duration;

use bytes::BytesMut;
use skiff::client::{Client, ClientEvent};
use skiff::Message;
use skiff_node::frame::{Decoder, ServerFrame};
use skiff_node::ClientFrame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const PATIENCE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_frame_from_the_node_loses_it_after_what_came_before() {
    // A whole frame whose body is not a frame.
    bad_frame_after_one_message(|_| vec![0xff; 4]).await;
}

#[tokio::test]
async fn a_message_frame_with_a_bad_message_loses_the_node() {
    // A message frame for the live subscription whose message has reserved
    // flag bits set (the client decodes it in place, into the queue).
    bad_frame_after_one_message(|sid| msg_body(sid, &[0x80, 0])).await;
    // The same message cut short: the subject claims more than is there.
    bad_frame_after_one_message(|sid| msg_body(sid, &[0x01, 9, b'a'])).await;
    // For a subscription the client does not have: still checked.
    bad_frame_after_one_message(|sid| msg_body(sid + 1000, &[0x80, 0])).await;
}

/// A message frame's body for `sid` (no reply token) around `message`.
fn msg_body(sid: u64, message: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    ServerFrame::Msg {
        sid,
        token: 0,
        msg: Message::new("t.a", "x"),
    }
    .encode(&mut out);
    // After the 4-byte length: the op, the sid and the token (0, one
    // byte); then the given message bytes instead of the real ones.
    let mut body = out[4..4 + 1 + varint_len(sid) + 1].to_vec();
    body.extend_from_slice(message);
    body
}

fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// A fake node sends one good message, then the frame body `bad(sid)`,
/// then another good message: the client delivers the first, nothing
/// after, and closes with "bad frame from the node".
async fn bad_frame_after_one_message(bad: impl FnOnce(u64) -> Vec<u8> + Send + 'static) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let fake = tokio::spawn(async move {
        // One connection only: a reconnect finds nobody.
        let (mut s, _) = l.accept().await.unwrap();
        drop(l);
        let mut out = Vec::new();
        ServerFrame::Welcome {
            client: 7,
            max_payload: 1 << 20,
        }
        .encode(&mut out);
        s.write_all(&out).await.unwrap();
        // Wait for the subscription and acknowledge it.
        let dec = Decoder::new(1 << 21);
        let mut buf = BytesMut::new();
        let sid = loop {
            if let Some(body) = dec.next(&mut buf).unwrap() {
                if let ClientFrame::Sub { sid, .. } = ClientFrame::decode(body, 1 << 20).unwrap() {
                    break sid;
                }
                continue;
            }
            assert!(s.read_buf(&mut buf).await.unwrap() > 0, "client left");
        };
        out.clear();
        ServerFrame::Ack { corr: sid }.encode(&mut out);
        ServerFrame::Msg {
            sid,
            token: 0,
            msg: Message::new("t.a", "before"),
        }
        .encode(&mut out);
        // The bad frame, then a good one.
        let body = bad(sid);
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
        ServerFrame::Msg {
            sid,
            token: 0,
            msg: Message::new("t.a", "after"),
        }
        .encode(&mut out);
        s.write_all(&out).await.unwrap();
        // Keep the connection open: the client must leave on its own.
        tokio::time::sleep(PATIENCE).await;
    });

    let c = Client::connect(&format!("skiff://{addr}?connect_timeout=200ms"))
        .await
        .unwrap();
    let mut events = c.events();
    let mut sub = c.subscribe("t.>", "*").await.unwrap();
    let d = tokio::time::timeout(PATIENCE, sub.recv())
        .await
        .expect("the message before the bad frame arrives")
        .expect("a message");
    assert_eq!(&d.payload[..], b"before");
    // One node and no reconnect: the client is closed, and says why.
    let end = tokio::time::timeout(PATIENCE, sub.recv())
        .await
        .expect("the subscription ends");
    assert!(end.is_none(), "nothing after the bad frame is delivered");
    let reason = sub.error().expect("a reason");
    assert!(reason.contains("bad frame from the node"), "{reason}");
    match tokio::time::timeout(PATIENCE, events.recv()).await {
        Ok(Some(ClientEvent::Closed { reason })) => {
            assert!(reason.contains("bad frame from the node"), "{reason}")
        }
        other => panic!("no close event: {other:?}"),
    }
    fake.abort();
}

/// A node from before stats came in pages answers `Stats` with one frame
/// over the client's bound: the call fails with a protocol error that
/// says so (the frame's size and the bound), not as a node shutting down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_in_one_frame_over_the_bound_fail_as_what_they_are() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let fake = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        drop(l);
        let mut out = Vec::new();
        ServerFrame::Welcome {
            client: 7,
            max_payload: 1 << 20,
        }
        .encode(&mut out);
        s.write_all(&out).await.unwrap();
        let dec = Decoder::new(1 << 21);
        let mut buf = BytesMut::new();
        let corr = loop {
            if let Some(body) = dec.next(&mut buf).unwrap() {
                if let ClientFrame::Stats { corr } = ClientFrame::decode(body, 1 << 20).unwrap() {
                    break corr;
                }
                continue;
            }
            assert!(s.read_buf(&mut buf).await.unwrap() > 0, "client left");
        };
        out.clear();
        let json = format!("{{\"pad\":\"{}\"}}", "x".repeat(1_200_000));
        ServerFrame::Stats { corr, json }.encode(&mut out);
        s.write_all(&out).await.unwrap();
        tokio::time::sleep(PATIENCE).await;
    });

    let c = Client::connect(&format!("skiff://{addr}?connect_timeout=200ms"))
        .await
        .unwrap();
    let e = tokio::time::timeout(PATIENCE, c.stats_json())
        .await
        .expect("the call ends")
        .expect_err("a frame over the bound");
    match &e {
        skiff::Error::Refused { code, reason } => {
            assert_eq!(*code, skiff::client::Code::Protocol, "{e}");
            assert!(reason.contains("bad frame from the node"), "{e}");
            assert!(reason.contains("over the limit"), "{e}");
        }
        other => panic!("not a refusal: {other}"),
    }
    assert!(!e.to_string().contains("Shutdown"), "{e}");
    fake.abort();
}
