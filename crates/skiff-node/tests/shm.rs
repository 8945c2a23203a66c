//! The node's `shm://` listener: publishes reach the broker without a
//! copy, and a client killed with SIGKILL is detached and leaves nothing.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use common::{eventually, recv_n, Kind, H};
use skiff::client::Client;
use skiff::Message;

/// An in-process subscriber's frames are values: the payload it receives
/// from an shm publisher is the very bytes the publisher wrote into its
/// ring (the address lies in the node's mapping of that ring).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_reaches_the_broker_in_place() {
    let h = H::new(Kind::Shm).await;
    let local = Client::attach(&h.node).unwrap();
    let mut sub = local.subscribe("zc.>", "*").await.unwrap();
    let publisher = h.client().await;
    let payload = Bytes::from(vec![7u8; 4000]);
    for i in 0..50 {
        publisher
            .publish(Message::new(format!("zc.{i}"), payload.clone()))
            .await
            .unwrap();
    }
    let got = recv_n(&mut sub, 50).await;
    let shm = h.shm.as_ref().unwrap();
    for d in &got {
        assert_eq!(d.payload, payload);
        assert!(
            shm.in_client_ring(d.payload.as_ptr() as usize),
            "the payload was copied out of the publisher's ring"
        );
    }
    let st = shm.stats();
    assert_eq!(st.copied, 0, "{st:?}");
    assert_eq!(st.in_place, st.segments, "{st:?}");
    assert_eq!(st.frames, 50, "{st:?}");
}

/// Many more bytes than the ring holds go through while an in-process
/// subscriber drops what it received: space goes back in order as the
/// last reference to each segment is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_space_comes_back_as_payloads_are_dropped() {
    let h = H::new(Kind::Shm).await;
    let local = Client::attach(&h.node).unwrap();
    let mut sub = local.subscribe("big", "*").await.unwrap();
    let publisher = h.client().await;
    let payload = Bytes::from(vec![1u8; 256 * 1024]);
    let n = 200; // 50 MiB through 4 MiB rings
    let p = tokio::spawn(async move {
        for _ in 0..n {
            publisher
                .publish(Message::new("big", payload.clone()))
                .await
                .unwrap();
        }
        publisher
    });
    for _ in 0..n {
        let d = recv_n(&mut sub, 1).await;
        assert_eq!(d[0].payload.len(), 256 * 1024);
    }
    let _publisher = p.await.unwrap();
    assert_eq!(h.shm.as_ref().unwrap().stats().copied, 0);
}

/// A hostile rendezvous (a ring file name outside the directory) is
/// refused with an error line, leaves nothing behind, and the node goes on
/// serving others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_rendezvous_is_refused_and_the_node_goes_on() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let h = H::new(Kind::Shm).await;
    let shm = h.shm.as_ref().unwrap();
    let sock = shm.dir().join("node.sock");
    // A ring file name that escapes the directory.
    let s = tokio::net::UnixStream::connect(&sock).await.unwrap();
    let mut s = tokio::io::BufReader::new(s);
    s.get_mut().write_all(b"SKIFF-SHM 1\n").await.unwrap();
    let mut line = String::new();
    s.read_line(&mut line).await.unwrap();
    assert!(line.starts_with("RING "), "{line}");
    s.get_mut().write_all(b"RING ../../etc.up\n").await.unwrap();
    line.clear();
    s.read_line(&mut line).await.unwrap();
    assert!(line.starts_with("ERR "), "{line}");
    // Counted just after the error line is written.
    for _ in 0..200 {
        if shm.stats().refused > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(shm.stats().refused, 1);
    // Nothing left behind but the socket.
    let left: Vec<_> = std::fs::read_dir(shm.dir()).unwrap().collect();
    assert_eq!(left.len(), 1, "{left:?}");
    // Others still attach.
    let c = h.client().await;
    let mut sub = c.subscribe("ok", "*").await.unwrap();
    c.publish(Message::new("ok", "x")).await.unwrap();
    recv_n(&mut sub, 1).await;
}

/// The child half of `a_killed_client_is_detached`: attaches, subscribes,
/// says so, and waits to be killed. Does nothing unless started by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_child() {
    let Ok(locator) = std::env::var("SKIFF_SHM_CHILD") else {
        return;
    };
    let c = Client::connect(&locator).await.unwrap();
    let _sub = c.subscribe("crash.>", "*").await.unwrap();
    c.publish(Message::new("crash.hello", "from the child"))
        .await
        .unwrap();
    println!("CHILD-READY");
    tokio::time::sleep(Duration::from_secs(600)).await;
}

/// A client process killed with SIGKILL: the node detaches it, frees its
/// interest, and no ring file is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_client_is_detached() {
    let h = H::new(Kind::Shm).await;
    let local = Client::attach(&h.node).unwrap();
    let mut hello = local.subscribe("crash.hello", "*").await.unwrap();
    let b = h.node.broker().clone();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env("SKIFF_SHM_CHILD", h.locator())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let ready = tokio::task::spawn_blocking(move || {
        BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("CHILD-READY"))
    })
    .await
    .unwrap();
    assert!(ready, "the child never attached");
    recv_n(&mut hello, 1).await;
    assert_eq!(b.client_count(), 2);
    assert_eq!(b.subscription_count(), 2);
    // SAFETY: kill(2) on the child's pid; no memory is involved.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGKILL) }, 0);
    let _ = child.wait();
    eventually(|| b.client_count() == 1 && b.subscription_count() == 1).await;
    let shm = h.shm.as_ref().unwrap();
    eventually(|| shm.stats().detached == 1).await;
    let left: Vec<_> = std::fs::read_dir(shm.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("node.sock")]);
    // The node goes on.
    let c = h.client().await;
    let mut sub = c.subscribe("after", "*").await.unwrap();
    c.publish(Message::new("after", "x")).await.unwrap();
    recv_n(&mut sub, 1).await;
    // A clean shutdown leaves nothing: not the socket, not the directory.
    // (The harness's temporary directory, the parent, is still there;
    // clients still attached keep no file in it.)
    drop((sub, c));
    let mut h = h;
    let listener = h.shm.take().unwrap();
    let dir = listener.dir().to_path_buf();
    drop(listener);
    assert!(!dir.exists(), "{} left behind", dir.display());
}

/// Small publishes (encoded into runs in the client, copied from those
/// runs into the ring) and large ones (queued as frames, encoded in the
/// ring) interleaved, many more bytes than the ring holds: every message
/// arrives once, in the order published, whatever batches the client's
/// writer thread took them in and however it reused its runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_publishes_arrive_once_and_in_order() {
    let h = H::new(Kind::Shm).await;
    let local = Client::attach(&h.node).unwrap();
    let mut sub = local
        .subscribe_with(
            "mix",
            "*",
            skiff::client::SubOptions::default().queue(1 << 20),
        )
        .await
        .unwrap();
    let publisher = h.client().await;
    let n = 60_000u32;
    let p = tokio::spawn(async move {
        for i in 0..n {
            // Every 7th is over the client's run limit for small
            // publishes; the rest are a few bytes.
            let len = if i % 7 == 3 {
                600 + (i % 5) as usize * 1000
            } else {
                4 + (i % 9) as usize
            };
            let mut v = vec![(i % 251) as u8; len];
            v[..4].copy_from_slice(&i.to_le_bytes());
            publisher.publish(Message::new("mix", v)).await.unwrap();
        }
        publisher.flush().await.unwrap();
        publisher
    });
    for i in 0..n {
        let d = recv_n(&mut sub, 1).await;
        let p = &d[0].payload;
        let got = u32::from_le_bytes(p[..4].try_into().unwrap());
        assert_eq!(got, i, "message {i} out of order (got {got})");
        assert!(
            p[4..].iter().all(|&b| b == (i % 251) as u8),
            "message {i} torn"
        );
    }
    let _publisher = p.await.unwrap();
    assert!(sub.try_recv().is_none(), "a message arrived twice");
}

/// Small publishes are written by the publishing task straight into a
/// segment of the ring that it keeps open: a lone publish, a burst's last
/// one and one after a quiet spell all arrive without a flush (the
/// client's writer thread publishes the open segment), in order with the
/// frames queued around them (a subscription, a large publish).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_segments_are_published_without_a_flush() {
    let h = H::new(Kind::Shm).await;
    let local = Client::attach(&h.node).unwrap();
    let mut sub = local.subscribe("open.>", "*").await.unwrap();
    let c = h.client().await;
    let p = c.publisher("open.a", None).unwrap();
    let mut next = 0u32;
    for burst in [1usize, 1, 5, 300, 1, 4000, 2] {
        for k in 0..burst {
            // Now and then one over the small-publish limit (the frame
            // path, queued behind the open segment).
            let len = if k == 7 { 3000 } else { 8 };
            let mut v = vec![0u8; len];
            v[..4].copy_from_slice(&next.to_le_bytes());
            p.publish(&v).await.unwrap();
            next += 1;
        }
        // No flush: everything of the burst still arrives.
        let got = recv_n(&mut sub, burst).await;
        for (k, d) in got.iter().enumerate() {
            let i = next - burst as u32 + k as u32;
            assert_eq!(d.payload[..4], i.to_le_bytes(), "burst of {burst}, {k}");
        }
        // A frame that is not a publish (a subscription) between bursts,
        // and a quiet spell.
        let _s = c.subscribe(&format!("other.{next}"), "*").await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(sub.try_recv().is_none(), "a message arrived twice");
}
