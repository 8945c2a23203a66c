//! The node's buffers of topics for its shared-memory subscribers (RBMQ's
//! broker of buffers): each message written once, read by every local
//! subscriber of the topic; credits or overwrite; the topic removed with
//! its last subscriber.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{eventually, recv_n, Kind, H};
use skiff::client::SubOptions;
use skiff::shm::Flow;
use skiff::Message;

fn ring_files(h: &H) -> usize {
    let dir = h.shm.as_ref().unwrap().dir().to_owned();
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".topic"))
            })
            .count()
        })
        .unwrap_or(0)
}

/// Receives `n` messages of `sub`, each checked to carry its number in
/// its first 8 bytes and then dropped: a message of a shared buffer is a
/// slice of the topic's ring, and holds its segment until dropped.
async fn recv_numbered(sub: &mut skiff::client::Subscription, n: u64) {
    for i in 0..n {
        let d = tokio::time::timeout(std::time::Duration::from_secs(10), sub.recv())
            .await
            .unwrap_or_else(|_| panic!("timed out after {i} of {n}"))
            .expect("the subscription is open");
        assert_eq!(d.payload[..8], i.to_le_bytes(), "message {i}");
    }
}

/// Two subscribers of one topic with credits, read at once, over three
/// rings' worth: the ring waits for the slower, and both get everything
/// in order. (A subscriber that keeps its messages keeps their segments:
/// with credits it then holds the topic, as one that stops reading does.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_subscribers_read_at_once_get_three_rings_worth() {
    let h = H::new(Kind::Shm).await;
    let opts = SubOptions::default().shared_buffer(Flow::Credits);
    let (c1, c2) = (h.client().await, h.client().await);
    let mut s1 = c1.subscribe_with("three.>", "*", opts).await.unwrap();
    let mut s2 = c2.subscribe_with("three.>", "*", opts).await.unwrap();
    let publisher = h.client().await;
    let n = 6000u64;
    let p = common::publish_numbered(publisher, "three.x", n);
    tokio::join!(recv_numbered(&mut s1, n), recv_numbered(&mut s2, n));
    p.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subscriber_reads_each_message_written_once() {
    let h = H::new(Kind::Shm).await;
    let shm = h.shm.as_ref().unwrap();
    let opts = SubOptions::default().shared_buffer(Flow::Credits);
    let mut clients = Vec::new();
    let mut subs = Vec::new();
    for _ in 0..4 {
        let c = h.client().await;
        subs.push(c.subscribe_with("tp.>", "*", opts).await.unwrap());
        clients.push(c);
    }
    let st = shm.topic_stats();
    assert_eq!((st.topics, st.readers), (1, 4), "{st:?}");
    assert_eq!(ring_files(&h), 1);
    // An ordinary subscriber of the same subjects beside them.
    let plain_client = h.client().await;
    let mut plain = plain_client.subscribe("tp.>", "*").await.unwrap();
    // Only the topic's one subscription and the plain one in the broker.
    assert_eq!(h.node.broker().subscription_count(), 2);

    let publisher = h.client().await;
    let n = 3000;
    for i in 0..n {
        publisher
            .publish(
                Message::new(format!("tp.{}", i % 7), Bytes::from(format!("m{i}"))).with_kind("k"),
            )
            .await
            .unwrap();
    }
    publisher.flush().await.unwrap();
    for s in subs.iter_mut().chain(std::iter::once(&mut plain)) {
        let got = recv_n(s, n).await;
        for (i, d) in got.iter().enumerate() {
            assert_eq!(d.payload, Bytes::from(format!("m{i}")));
            assert_eq!(&*d.subject, format!("tp.{}", i % 7));
            assert_eq!(d.kind.as_deref(), Some("k"));
            assert!(!d.is_request());
        }
    }
    // The publisher's thread wrote (some of) them into the ring itself
    // (the direct path: nothing was queued for the topic).
    assert!(shm.topic_stats().direct > 0, "{:?}", shm.topic_stats());
    // Written once for the four: about one frame per message.
    let written = shm.topic_stats().bytes_written;
    assert!(
        written > 0 && written < n as u64 * 40,
        "{written} bytes for {n} messages"
    );

    // A subscription of another type is another topic.
    let other = clients[0]
        .subscribe_with("tp.>", "other", opts)
        .await
        .unwrap();
    assert_eq!(shm.topic_stats().topics, 2);
    drop(other);
    // The last subscriber of a topic removes it (its ring file too).
    drop(subs);
    eventually(|| shm.topic_stats().topics == 0).await;
    eventually(|| ring_files(&h) == 0).await;
    eventually(|| h.node.broker().subscription_count() == 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credits_hold_the_topic_for_a_slow_reader_and_lose_nothing() {
    let h = H::new(Kind::Shm).await;
    let c = h.client().await;
    // A small window: the reader stops taking from the ring early.
    let opts = SubOptions::default()
        .shared_buffer(Flow::Credits)
        .window(64);
    let mut slow = c.subscribe_with("slow", "*", opts).await.unwrap();
    let publisher = h.client().await;
    let n = 6000u64; // 12 MB: three times the default 4 MiB ring
    let p = tokio::spawn(async move {
        for i in 0..n {
            let mut payload = vec![3u8; 2000];
            payload[..8].copy_from_slice(&i.to_le_bytes());
            publisher
                .publish(Message::new("slow", payload))
                .await
                .unwrap();
        }
        publisher.flush().await.unwrap();
        publisher
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Messages are read in place: each is dropped once looked at (a
    // reader that kept them all would hold the ring, for every reader).
    // In order, though some went into the ring from the publisher's
    // thread (the direct path) and the rest, while the ring was full,
    // through the topic's queue and writer thread.
    for i in 0..n {
        let d = tokio::time::timeout(Duration::from_secs(10), slow.recv())
            .await
            .expect("in time")
            .expect("open");
        assert_eq!(d.payload.len(), 2000);
        assert_eq!(d.payload[..8], i.to_le_bytes(), "message {i}");
    }
    assert_eq!(slow.dropped(), 0);
    p.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overwrite_never_waits_and_counts_what_a_slow_reader_lost() {
    let h = H::new(Kind::Shm).await;
    let c = h.client().await;
    let opts = SubOptions::default()
        .shared_buffer(Flow::Overwrite)
        .window(16);
    let mut lagging = c.subscribe_with("ow", "*", opts).await.unwrap();
    let publisher = h.client().await;
    let payload = Bytes::from(vec![5u8; 4000]);
    let n = 5000u32; // 20 MB through a 4 MiB ring
    for i in 0..n {
        let mut p = payload.to_vec();
        p[..4].copy_from_slice(&i.to_le_bytes());
        publisher.publish(Message::new("ow", p)).await.unwrap();
    }
    publisher.flush().await.unwrap();
    // It read at most its window, then fell behind: it still gets a
    // later part, in order, and the loss is counted.
    let mut last = None;
    let mut seen = 0;
    while let Ok(Some(d)) = tokio::time::timeout(Duration::from_secs(2), lagging.recv()).await {
        let i = u32::from_le_bytes(d.payload[..4].try_into().unwrap());
        assert!(last.is_none_or(|l| i > l), "{i} after {last:?}");
        last = Some(i);
        seen += 1;
    }
    assert!(seen < n as usize, "a reader a ring behind lost nothing?");
    assert!(lagging.dropped() > 0, "the loss is not counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_topic_requests_are_refused() {
    let h = H::new(Kind::Shm).await;
    let c = h.client().await;
    let opts = SubOptions::default().shared_buffer(Flow::Credits);
    assert!(c.subscribe_with("a..b", "*", opts).await.is_err());
    // A raw bad line on the socket: refused, the node goes on.
    let sock = h.shm.as_ref().unwrap().dir().join("node.sock");
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    use std::io::{BufRead, Write};
    s.write_all(b"SKIFF-TOPIC 1 sometimes a.b *\n").unwrap();
    let mut line = String::new();
    std::io::BufReader::new(&s).read_line(&mut line).unwrap();
    assert!(line.starts_with("ERR "), "{line}");
    let mut ok = c.subscribe_with("a.b", "*", opts).await.unwrap();
    let publisher = h.client().await;
    publisher.publish(Message::new("a.b", "x")).await.unwrap();
    publisher.flush().await.unwrap();
    assert_eq!(recv_n(&mut ok, 1).await[0].payload, "x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_requests_are_checked_as_shm_clients_are() {
    // SAFETY: getuid cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    let config = skiff_node::Config::from_toml(
        &format!(
            "[auth]\ntoken = \"t\"\n[[auth.users]]\nname = \"local\"\nuid = {uid}\n[auth.users.permissions]\nsubscribe = {{ allow = [\"ok.>\"] }}\n"
        ),
        std::path::Path::new("topic-auth.toml"),
    )
    .unwrap();
    let h = H::with(Kind::Shm, config).await;
    let c = h.client().await;
    let opts = SubOptions::default().shared_buffer(Flow::Credits);
    let mut ok = c.subscribe_with("ok.>", "*", opts).await.unwrap();
    let e = c.subscribe_with("other.>", "*", opts).await.unwrap_err();
    assert!(e.to_string().contains("not permitted"), "{e}");
    assert_eq!(h.shm.as_ref().unwrap().topic_stats().refused, 1);
    c.publish(Message::new("ok.x", "y")).await.unwrap();
    c.flush().await.unwrap();
    assert_eq!(recv_n(&mut ok, 1).await[0].payload, "y");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_to_a_shared_buffer_subscriber_gets_its_reply() {
    let h = H::new(Kind::Shm).await;
    let responder = h.client().await;
    let opts = SubOptions::default().shared_buffer(Flow::Credits);
    let mut s = responder.subscribe_with("svc.>", "*", opts).await.unwrap();
    let r2 = responder.clone();
    let answer = tokio::spawn(async move {
        for _ in 0..3 {
            let d = s.recv().await.expect("open");
            assert!(d.is_request(), "a request arrives as one");
            let reply = Message::new(
                "ignored",
                format!("re:{}", String::from_utf8_lossy(&d.payload)),
            );
            r2.reply(&d, reply).await.unwrap();
        }
    });
    common::ask_echo_three(&h.client().await).await;
    answer.await.unwrap();
}

/// The topic's client in the node's stats, with its readers.
fn shared_readers(h: &H) -> Vec<skiff_proto::stats::SharedReaderStats> {
    let st = h.node.broker().stats();
    st.clients
        .iter()
        .flat_map(|c| c.shared_readers.iter().cloned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_counts_what_each_shared_buffer_reader_read_and_lost() {
    let h = H::new(Kind::Shm).await;
    let c = h.client().await;
    let opts = SubOptions::default().shared_buffer(Flow::Credits);
    let mut a = c.subscribe_with("cnt", "*", opts).await.unwrap();
    let mut b = c.subscribe_with("cnt", "*", opts).await.unwrap();
    eventually(|| shared_readers(&h).len() == 2).await;
    let publisher = h.client().await;
    for i in 0..500 {
        publisher
            .publish(Message::new("cnt", format!("m{i}")))
            .await
            .unwrap();
    }
    publisher.flush().await.unwrap();
    recv_n(&mut a, 500).await;
    recv_n(&mut b, 500).await;
    eventually(|| {
        let mut r: Vec<u64> = shared_readers(&h).iter().map(|r| r.read).collect();
        r.sort();
        r == [500, 500]
    })
    .await;
    let me = format!("pid {}", std::process::id());
    assert!(shared_readers(&h)
        .iter()
        .all(|r| r.peer == me && r.dropped == 0));
    // A reader that leaves is no longer listed.
    drop(b);
    eventually(|| shared_readers(&h).len() == 1).await;

    // Overwrite: what a reader a ring behind lost is counted by the node.
    let opts = SubOptions::default()
        .shared_buffer(Flow::Overwrite)
        .window(16);
    let mut lagging = c.subscribe_with("ow", "*", opts).await.unwrap();
    eventually(|| shared_readers(&h).len() == 2).await;
    let payload = Bytes::from(vec![5u8; 4000]);
    for _ in 0..5000 {
        publisher
            .publish(Message::new("ow", payload.clone()))
            .await
            .unwrap();
    }
    publisher.flush().await.unwrap();
    let mut seen = 0u64;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(2), lagging.recv()).await {
        seen += 1;
    }
    let lost = lagging.dropped();
    assert!(lost > 0);
    eventually(|| {
        shared_readers(&h)
            .iter()
            .any(|r| r.read == seen && r.dropped == lost)
    })
    .await;
    let bad = h.shm.as_ref().unwrap().topic_stats().bad_reports;
    assert_eq!(bad, 0);
}
