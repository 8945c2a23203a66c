//! Hostile peers of the `udp://…?reliable=true` buffer transport, played
//! with raw tunnels: malformed frames, frames for unknown buffers, credits
//! beyond what was sent, segments beyond the credits. Each is dropped or
//! closes only what it concerns, is counted, and never panics.

use std::time::Duration;

use bytes::Bytes;
use skiff::shm::{BufferError, Flow, Input, Output};
use skiff::Endpoint;

const T: Duration = Duration::from_secs(5);
const UDP: &str = "reliable=true&keepalive=100ms&idle_timeout=2s";

fn frame(id: u32, size: u32, rest: &[u8]) -> Bytes {
    let mut v = id.to_le_bytes().to_vec();
    v.extend_from_slice(&size.to_le_bytes());
    v.extend_from_slice(rest);
    Bytes::from(v)
}

fn subscribe(id: u32, size: u32, records: u32) -> Bytes {
    frame(id, size, &records.to_le_bytes())
}

fn credit(id: u32, consumed: u64, read: u64) -> Bytes {
    let mut rest = consumed.to_le_bytes().to_vec();
    rest.extend_from_slice(&read.to_le_bytes());
    frame(id, 0xffff_fffe, &rest)
}

async fn eventually(mut ok: impl FnMut() -> bool) {
    for _ in 0..500 {
        if ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not reached within 5 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_subscriber_is_counted_and_detached() {
    let mut out = Output::open(&format!("udp://127.0.0.1:0?{UDP}")).unwrap();
    out.create_buffer(1, 1024, Flow::Credits).unwrap();
    let addr = out.local_addr().unwrap();
    let ep = Endpoint::bind("udp://127.0.0.1:0?keepalive=100ms&idle_timeout=2s").unwrap();
    let t = ep.connect(addr, T).await.unwrap();
    // Garbage of every shape.
    for bad in [
        Bytes::from_static(b"xx"),
        subscribe(1, 1024, 0),
        frame(1, 0, &[]),
        frame(1, 0xffff_ffff, &[1]),
        Bytes::from(vec![0u8; 100]),
    ] {
        t.send(bad).await.unwrap();
    }
    t.send(credit(77, 1, 1)).await.unwrap();
    // A real subscription, acknowledged.
    t.send(subscribe(1, 1024, 64)).await.unwrap();
    let ack = tokio::time::timeout(T, t.recv())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(&ack[..], &frame(1, 0xffff_ffff, &[1])[..]);
    out.send(1, b"data", true).unwrap();
    let seg = tokio::time::timeout(T, t.recv())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(&seg[..], &frame(1, 4, b"data")[..]);
    // Credit for more than was sent: the subscriber is detached.
    t.send(credit(1, 999, 1)).await.unwrap();
    eventually(|| out.link_stats().unwrap().protocol_errors == 1).await;
    let s = out.link_stats().unwrap();
    assert!(s.frames_malformed >= 4, "{s:?}");
    assert!(s.frames_unknown >= 1, "{s:?}");
    // Detached: its unconsumed segment no longer holds the buffer.
    for _ in 0..300 {
        out.send(1, &[0; 64], true).unwrap();
    }
    // A well-behaved input still works.
    let loc = format!("udp://{addr}?{UDP}");
    let got = tokio::task::spawn_blocking(move || {
        let mut input = Input::open(&loc).unwrap();
        input.subscribe(1, 1024).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        out.send(1, b"fine", true).unwrap();
        let seg = input.recv(Some(T)).unwrap().unwrap();
        seg.to_vec()
    })
    .await
    .unwrap();
    assert_eq!(got, b"fine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_output_closes_only_what_it_breaks() {
    let ep = Endpoint::bind("udp://127.0.0.1:0?keepalive=100ms&idle_timeout=2s").unwrap();
    ep.listen();
    let loc = format!("udp://{}?{UDP}", ep.local_addr());
    let input = tokio::task::spawn_blocking(move || {
        let mut input = Input::open(&loc).unwrap();
        input.subscribe(1, 1024).unwrap();
        input.subscribe(2, 64).unwrap();
        input
    });
    let t = ep.accept().await.unwrap();
    for _ in 0..2 {
        let sub = tokio::time::timeout(T, t.recv())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(sub.len(), 12, "subscribe frame: id, size, records");
        let id = u32::from_le_bytes(sub[..4].try_into().unwrap());
        t.send(frame(id, 0xffff_ffff, &[1])).await.unwrap();
    }
    let mut input = input.await.unwrap();
    for bad in [
        Bytes::from_static(b"abc"),
        frame(1, 10, b"short"),      // length differs from the frame
        frame(1, 0xffff_fff0, &[]),  // unknown marker
        frame(1, 0xffff_fffd, &[7]), // unknown close reason
        frame(9, 3, b"who"),         // unknown buffer
        frame(9, 0xffff_ffff, &[1]), // unsolicited ack
    ] {
        t.send(bad).await.unwrap();
    }
    t.send(frame(1, 2, b"ok")).await.unwrap();
    // Beyond buffer 2's 64 bytes of credit: buffer 2 is closed as corrupt.
    t.send(frame(2, 100, &[0; 100])).await.unwrap();
    t.send(frame(1, 4, b"more")).await.unwrap();
    let (stats, one, two) = tokio::task::spawn_blocking(move || {
        let mut one = Vec::new();
        let mut two = None;
        // Buffer 2's error may come before, between or after buffer 1's
        // segments, and more than once: read until both are seen.
        let start = std::time::Instant::now();
        while (one.len() < 2 || two.is_none()) && start.elapsed() < T {
            match input.recv(Some(T)) {
                Ok(Some(seg)) => {
                    let (id, v) = (seg.id(), seg.to_vec());
                    input.consumed(id, v.len()).unwrap();
                    one.push(v);
                }
                Ok(None) => break,
                Err(e) => two = Some(e),
            }
        }
        (input.link_stats().unwrap(), one, two)
    })
    .await
    .unwrap();
    assert_eq!(one, vec![b"ok".to_vec(), b"more".to_vec()]);
    assert!(
        matches!(two, Some(BufferError::Corrupt { id: 2, .. })),
        "{two:?}"
    );
    assert!(stats.frames_malformed >= 4, "{stats:?}");
    assert!(stats.frames_unknown >= 2, "{stats:?}");
    assert_eq!(stats.protocol_errors, 1, "{stats:?}");
}
