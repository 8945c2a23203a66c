//! The in-place API of shm clients (issue 21 item 3): a topic's buffer
//! read in the application's thread (`Client::topic_reader`) and a
//! publisher bound to a subject (`Client::publisher`), against a node's
//! real shm listener and rings.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{eventually, recv_n, Kind, H};
use skiff::client::{SubOptions, TopicReader};
use skiff::shm::Flow;
use skiff::Message;

/// Reads until `n` messages came (or 10 s passed), on a blocking thread:
/// each message's `(subject, kind, payload)` copied out.
async fn read_n(
    mut r: TopicReader,
    n: usize,
) -> (TopicReader, Vec<(String, Option<String>, Vec<u8>)>) {
    tokio::task::spawn_blocking(move || {
        let mut got = Vec::new();
        let t = std::time::Instant::now();
        while got.len() < n && t.elapsed() < Duration::from_secs(10) {
            r.read(Duration::from_millis(100), |m| {
                got.push((
                    m.subject.to_owned(),
                    m.kind.map(str::to_owned),
                    m.payload.to_vec(),
                ))
            })
            .expect("the topic is open");
        }
        (r, got)
    })
    .await
    .unwrap()
}

/// What the node says the topic's readers read and lost.
fn shared_readers(h: &H) -> Vec<(u64, u64)> {
    let st = h.node.broker().stats();
    st.clients
        .iter()
        .flat_map(|c| c.shared_readers.iter().map(|r| (r.read, r.dropped)))
        .collect()
}

/// Two readers of one topic with credits, read at once: the ring is held
/// to the slower of them, and both get every message in order, however
/// many rings' worth go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_in_place_readers_of_one_topic_each_get_every_message() {
    let h = H::new(Kind::Shm).await;
    let c = h.client().await;
    let opts = SubOptions::default().shared_buffer(Flow::Credits);
    let a = c.topic_reader("two.>", "*", opts).await.unwrap();
    let b = c.topic_reader("two.>", "*", opts).await.unwrap();
    let publisher = h.client().await;
    let n = 6000u64; // three rings' worth of 2 KB messages
    let p = common::publish_numbered(publisher, "two.x", n);
    let ((_a, got_a), (_b, got_b)) = tokio::join!(read_n(a, n as usize), read_n(b, n as usize));
    for got in [&got_a, &got_b] {
        assert_eq!(got.len(), n as usize);
        for (i, (_, _, payload)) in got.iter().enumerate() {
            assert_eq!(payload[..8], (i as u64).to_le_bytes(), "message {i}");
        }
    }
    p.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_place_reader_gets_every_message_in_order_with_credits() {
    let h = H::new(Kind::Shm).await;
    let c = h.client().await;
    let opts = SubOptions::default().shared_buffer(Flow::Credits);
    let r = c.topic_reader("ip.>", "*", opts).await.unwrap();
    // Alone on the topic (two readers at once: the test below).
    let publisher = h.client().await;
    let n = 6000u64; // 12 MB: three times the 4 MiB ring, so credits hold the node
    let p = tokio::spawn(async move {
        for i in 0..n {
            let mut payload = vec![3u8; 2000];
            payload[..8].copy_from_slice(&i.to_le_bytes());
            let m = Message::new(format!("ip.{}", i % 5), payload).with_kind("k");
            let m = if i == 7 { m.with_field("f", 42i64) } else { m };
            publisher.publish(m).await.unwrap();
        }
        publisher.flush().await.unwrap();
        publisher
    });
    let (r, got) = read_n(r, n as usize).await;
    assert_eq!(
        got.len(),
        n as usize,
        "in place got {}, dropped {}",
        got.len(),
        r.dropped()
    );
    for (i, (subject, kind, payload)) in got.iter().enumerate() {
        assert_eq!(subject, &format!("ip.{}", i % 5));
        assert_eq!(kind.as_deref(), Some("k"));
        assert_eq!(payload.len(), 2000);
        assert_eq!(payload[..8], (i as u64).to_le_bytes(), "message {i}");
    }
    assert_eq!((r.read_count(), r.dropped()), (n, 0));
    p.await.unwrap();
    // The reader's reports reach the node (sent from its calls: one more
    // call after the throttle's interval sends the last).
    // (The reader is kept: dropping it would take it off the node's list.)
    let mut r = r;
    let _r = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(150));
        r.try_read(|_| ()).unwrap();
        r
    })
    .await
    .unwrap();
    eventually(|| shared_readers(&h).contains(&(n, 0))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_and_best_effort_are_read_in_place_too() {
    let h = H::new(Kind::Shm).await;
    let c = h.client().await;
    let mut r = c
        .topic_reader(
            "fx",
            "*",
            SubOptions::default().shared_buffer(Flow::Credits),
        )
        .await
        .unwrap();
    c.publish(
        Message::new("fx", "p")
            .with_field("a", 7i64)
            .with_field("s", "v"),
    )
    .await
    .unwrap();
    c.flush().await.unwrap();
    let got = tokio::task::spawn_blocking(move || {
        let mut got = Vec::new();
        for _ in 0..50 {
            r.read(Duration::from_millis(100), |m| {
                assert!(m.has_fields);
                got.push(m.to_message().unwrap());
            })
            .unwrap();
            if !got.is_empty() {
                break;
            }
        }
        got
    })
    .await
    .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, "p");
    assert_eq!(got[0].fields.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overwrite_counts_what_a_slow_in_place_reader_lost() {
    let h = H::new(Kind::Shm).await;
    let c = h.client().await;
    let mut r = c
        .topic_reader(
            "ow",
            "*",
            SubOptions::default().shared_buffer(Flow::Overwrite),
        )
        .await
        .unwrap();
    let publisher = h.client().await;
    let n = 5000u32; // 20 MB through a 4 MiB ring, nothing read meanwhile
    for i in 0..n {
        let mut p = vec![5u8; 4000];
        p[..4].copy_from_slice(&i.to_le_bytes());
        publisher.publish(Message::new("ow", p)).await.unwrap();
    }
    publisher.flush().await.unwrap();
    let r = tokio::task::spawn_blocking(move || {
        let mut last: Option<u32> = None;
        loop {
            let got = r
                .read(Duration::from_millis(500), |m| {
                    let i = u32::from_le_bytes(m.payload[..4].try_into().unwrap());
                    assert!(last.is_none_or(|l| i > l), "{i} after {last:?}");
                    last = Some(i);
                })
                .unwrap();
            if got == 0 {
                break;
            }
        }
        // Past the throttle: the next call reports the last counts.
        std::thread::sleep(Duration::from_millis(150));
        r.try_read(|_| ()).unwrap();
        r
    })
    .await
    .unwrap();
    assert!(
        r.read_count() < u64::from(n),
        "a reader a ring behind lost nothing?"
    );
    assert!(r.dropped() > 0, "the loss is not counted");
    let want = (r.read_count(), r.dropped());
    eventually(|| shared_readers(&h).contains(&want)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_ends_with_an_error_when_the_node_ends_the_topic() {
    let h = H::new(Kind::Shm).await;
    let c = h.client().await;
    let mut r = c
        .topic_reader(
            "end",
            "*",
            SubOptions::default().shared_buffer(Flow::Credits),
        )
        .await
        .unwrap();
    c.publish(Message::new("end", "last")).await.unwrap();
    c.flush().await.unwrap();
    let H { node, shm, .. } = h;
    node.shutdown().await;
    drop(shm);
    let (r, seen, e) = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        let t = std::time::Instant::now();
        loop {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the reader never ended"
            );
            match r.read(Duration::from_millis(100), |m| {
                seen.push(m.payload.to_vec())
            }) {
                Ok(_) => continue,
                Err(e) => break (r, seen, e),
            }
        }
    })
    .await
    .unwrap();
    // What was written before the end is still read.
    assert_eq!(seen, vec![b"last".to_vec()]);
    assert!(r.error().is_some(), "{e}");
    // Over: the same error again.
    let mut r = r;
    assert!(r.try_read(|_| ()).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_read_in_place_is_answered_with_its_token() {
    let h = H::new(Kind::Shm).await;
    let responder = h.client().await;
    let mut r = responder
        .topic_reader(
            "svc.>",
            "*",
            SubOptions::default().shared_buffer(Flow::Credits),
        )
        .await
        .unwrap();
    let r2 = responder.clone();
    let rt = tokio::runtime::Handle::current();
    let answer = tokio::task::spawn_blocking(move || {
        let mut answered = 0;
        while answered < 3 {
            let mut asks = Vec::new();
            r.read(Duration::from_millis(100), |m| {
                assert!(m.is_request(), "a request arrives as one");
                asks.push((m.reply_token().unwrap(), m.payload.to_vec()));
            })
            .unwrap();
            for (token, q) in asks {
                let reply = Message::new("ignored", format!("re:{}", String::from_utf8_lossy(&q)));
                rt.block_on(r2.reply_to(token, reply)).unwrap();
                answered += 1;
            }
        }
    });
    common::ask_echo_three(&h.client().await).await;
    answer.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_reader_needs_shm_and_token_patterns() {
    let tcp = H::new(Kind::Tcp).await;
    let c = tcp.client().await;
    let opts = SubOptions::default().shared_buffer(Flow::Credits);
    let e = c.topic_reader("a.b", "*", opts).await.unwrap_err();
    assert!(e.to_string().contains("shm://"), "{e}");
    let h = H::new(Kind::Shm).await;
    let c = h.client().await;
    assert!(c.topic_reader("a..b", "*", opts).await.is_err());
    let e = c.topic_reader("a*", "*", opts.cmsg()).await.unwrap_err();
    assert!(e.to_string().contains("token patterns"), "{e}");
    // Dropping a reader closes its socket: the node removes the topic.
    let r = c.topic_reader("a.b", "*", opts).await.unwrap();
    let shm = h.shm.as_ref().unwrap();
    assert_eq!(shm.topic_stats().readers, 1);
    drop(r);
    eventually(|| shm.topic_stats().topics == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_checks_its_subject_once_and_publishes_in_order() {
    for kind in [Kind::Tcp, Kind::Shm] {
        let mut config = skiff_node::Config::default();
        config.limits.max_payload = 4096;
        let h = H::with(kind, config).await;
        let c = h.client().await;
        // Refused at creation, with publish's rules.
        assert!(c.publisher("a..b", None).is_err());
        assert!(c.publisher("a.*", None).is_err());
        assert!(c.publisher("a.>", None).is_err());
        assert!(c.publisher("a.b", Some("bad type")).is_err());
        assert!(c.publisher(&"x".repeat(100_000), None).is_err());
        let sub_client = h.client().await;
        let mut plain = sub_client.subscribe("pb.x", "*").await.unwrap();
        let mut shared = match kind {
            Kind::Shm => Some(
                sub_client
                    .subscribe_with(
                        "pb.x",
                        "t",
                        SubOptions::default().shared_buffer(Flow::Credits),
                    )
                    .await
                    .unwrap(),
            ),
            _ => None,
        };
        let p = c.publisher("pb.x", Some("t")).unwrap();
        assert_eq!(p.subject(), "pb.x");
        // Over the node's limit: refused, nothing sent.
        let e = p.publish(&[0u8; 4097]).await.unwrap_err();
        assert!(e.to_string().contains("max_payload"), "{e}");
        let e = p
            .publish_bytes(Bytes::from(vec![0u8; 5000]))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("max_payload"), "{e}");
        // Small ones (written from the head), large ones (the frame path),
        // and Bytes, in one order.
        let n = 3000usize;
        for i in 0..n {
            let mut payload = vec![1u8; if i % 10 == 0 { 3000 } else { 16 }];
            payload[..4].copy_from_slice(&(i as u32).to_le_bytes());
            if i % 3 == 0 {
                p.publish_bytes(Bytes::from(payload)).await.unwrap();
            } else {
                p.publish(&payload).await.unwrap();
            }
        }
        c.flush().await.unwrap();
        let mut subs = vec![&mut plain];
        if let Some(s) = shared.as_mut() {
            subs.push(s);
        }
        for s in subs {
            let got = recv_n(s, n).await;
            for (i, d) in got.iter().enumerate() {
                assert_eq!(&*d.subject, "pb.x");
                assert_eq!(d.kind.as_deref(), Some("t"));
                assert_eq!(d.payload.len(), if i % 10 == 0 { 3000 } else { 16 });
                assert_eq!(
                    d.payload[..4],
                    (i as u32).to_le_bytes(),
                    "{kind:?} message {i}"
                );
            }
        }
    }
}
