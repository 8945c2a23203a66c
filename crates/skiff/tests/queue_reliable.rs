//! Reliable queues (`reliable=true`) over real loopback sockets: exactly
//! once and in order over associations, both directions over one
//! association, typed messages, the bounded backlog, unreachable peers
//! counted, stats.

use std::time::Duration;

use bytes::Bytes;
use skiff::{Error, Message, Queue, Value};
use skiff_proto::error::LimitError;

fn reliable(opts: &str) -> Queue {
    Queue::bind(&format!("udp://127.0.0.1:0?reliable=true{opts}")).unwrap()
}

fn pop_n(q: &Queue, n: usize) -> Vec<Message> {
    let mut out = Vec::new();
    while out.len() < n {
        match q.pop_blocking(Some(Duration::from_secs(10))) {
            Some(m) => out.push(m),
            None => break,
        }
    }
    out
}

fn index(m: &Message) -> u32 {
    u32::from_le_bytes(m.payload[..4].try_into().unwrap())
}

fn numbered(i: u32) -> Message {
    // Sizes from 4 bytes to about 3 KiB: some messages span packets.
    let mut p = i.to_le_bytes().to_vec();
    p.resize(4 + (i as usize * 37) % 3000, (i % 251) as u8);
    Message::new("rel.test", p)
}

#[test]
fn many_messages_arrive_exactly_once_in_order() {
    let (a, b) = (reliable(""), std::sync::Arc::new(reliable("")));
    assert!(a.as_reliable().is_some());
    let n = 20_000u32;
    // About 30 MB: more than the windows, buffers and backlog hold, so the
    // receiver pops while the sender pushes, and the sender retries when
    // the backlog is full (the documented answer to `Limit`).
    let b2 = b.clone();
    let reader = std::thread::spawn(move || pop_n(&b2, n as usize));
    let mut refused = 0u64;
    for i in 0..n {
        loop {
            match a.push(b.local_addr(), &numbered(i)) {
                Ok(()) => break,
                Err(Error::Limit(LimitError::Backlog { .. })) => {
                    refused += 1;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    let got = reader.join().unwrap();
    eprintln!("pushes refused for a full backlog (and retried): {refused}");
    assert_eq!(got.len(), n as usize, "every message arrives");
    for (i, m) in got.iter().enumerate() {
        assert_eq!(index(m), i as u32, "in order, none twice");
        assert_eq!(m, &numbered(i as u32).with_meta_of(m));
        assert_eq!(m.meta.seq, i as u64);
        assert_eq!(m.meta.from, Some(a.local_addr()));
    }
    a.flush().unwrap();
    assert!(b.pop_blocking(Some(Duration::from_millis(100))).is_none());
    let sa = a.stats();
    let sb = b.stats();
    assert_eq!(sa.sent_messages, u64::from(n));
    assert_eq!(sb.recv_messages, u64::from(n));
    assert_eq!(sb.recv_bytes, sa.sent_bytes);
    assert_eq!(sb.lost, 0);
    assert_eq!(sa.dropped.total(), 0, "{sa:?}");
    assert_eq!(sb.dropped.total(), 0, "{sb:?}");
    assert!(sa.sent_batches > 0 && sb.recv_batches > 0);
    let e = a.as_reliable().unwrap().endpoint_stats();
    assert_eq!(e.associations.messages_acked, u64::from(n));
}

/// Copies the receive-side metadata so messages compare on content.
trait WithMeta {
    fn with_meta_of(self, other: &Message) -> Message;
}

impl WithMeta for Message {
    fn with_meta_of(mut self, other: &Message) -> Message {
        self.meta = other.meta;
        self
    }
}

#[test]
fn both_directions_share_one_association() {
    let (a, b) = (reliable(""), reliable(""));
    for i in 0..500u32 {
        a.push(b.local_addr(), &numbered(i)).unwrap();
    }
    let got = pop_n(&b, 500);
    assert_eq!(got.len(), 500);
    // Answer each message to where it came from.
    for m in &got {
        let reply = Message::new("rel.reply", Bytes::copy_from_slice(&m.payload[..4]));
        b.push(m.meta.from.unwrap(), &reply).unwrap();
    }
    let back = pop_n(&a, 500);
    assert_eq!(back.len(), 500);
    for (i, m) in back.iter().enumerate() {
        assert_eq!(index(m), i as u32);
        assert_eq!(m.subject, "rel.reply");
    }
    // The replies rode the association `a` set up: `a` accepted none.
    let ea = a.as_reliable().unwrap().endpoint_stats();
    let eb = b.as_reliable().unwrap().endpoint_stats();
    assert_eq!(ea.listener.first_accepted, 0, "{ea:?}");
    assert_eq!(eb.listener.first_accepted, 1, "{eb:?}");
    a.flush().unwrap();
    b.flush().unwrap();
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Reading {
    sensor: String,
    value: f64,
}

#[test]
fn typed_messages_and_fields_round_trip() {
    let (a, b) = (reliable(""), reliable(""));
    let r = Reading {
        sensor: "hallb".into(),
        value: 4.5,
    };
    a.push_typed(b.local_addr(), &r).unwrap();
    a.push_typed(b.local_addr(), &7u32).unwrap();
    let m = Message::new("daq.rate", "x")
        .with_kind("rate")
        .with_field("n", 3i64)
        .with_field("ok", true);
    a.push(b.local_addr(), &m).unwrap();
    let got = pop_n(&b, 3);
    assert_eq!(got.len(), 3);
    assert_eq!(skiff::decode_typed::<Reading>(&got[0]).unwrap(), r);
    assert!(matches!(
        skiff::decode_typed::<Reading>(&got[1]),
        Err(Error::TypeMismatch { .. })
    ));
    assert_eq!(skiff::decode_typed::<u32>(&got[1]).unwrap(), 7);
    assert_eq!(got[2].kind.as_deref(), Some("rate"));
    assert_eq!(got[2].field("n"), Some(&Value::Int(3)));
    // And with try_pop_typed.
    a.push_typed(b.local_addr(), &r).unwrap();
    let t = loop {
        if let Some(t) = b.try_pop_typed::<Reading>() {
            break t;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(t.unwrap(), r);
}

#[test]
fn full_backlog_refuses_push_and_loses_nothing() {
    // The receiver does not pop: its inbox, its window, the sender's
    // association buffer and then the backlog fill up.
    let (a, b) = (reliable("&max_backlog=64k&window=8"), reliable("&window=8"));
    let mut accepted = 0u32;
    let mut refused = None;
    for i in 0..1_000_000u32 {
        let mut p = i.to_le_bytes().to_vec();
        p.resize(1000, 1);
        match a.push(b.local_addr(), &Message::from_payload(p)) {
            Ok(()) => accepted += 1,
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
        if i % 256 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let e = refused.expect("the backlog is bounded");
    assert!(matches!(e, Error::Limit(LimitError::Backlog { .. })), "{e}");
    assert!(e.to_string().contains("max_backlog"), "{e}");
    // Everything accepted arrives once the receiver reads, in order.
    let got = pop_n(&b, accepted as usize);
    assert_eq!(got.len(), accepted as usize);
    for (i, m) in got.iter().enumerate() {
        assert_eq!(index(m), i as u32);
    }
    // And the queue takes pushes again.
    a.push(
        b.local_addr(),
        &Message::from_payload(u32::MAX.to_le_bytes().to_vec()),
    )
    .unwrap();
    assert_eq!(index(&pop_n(&b, 1)[0]), u32::MAX);
    a.flush().unwrap();
    assert_eq!(a.stats().dropped.total(), 0);
}

#[test]
fn unreachable_destination_is_counted_not_silent() {
    let a = reliable("&handshake_timeout=300ms");
    // A bound socket that never answers.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 0..10u32 {
        a.push(silent.local_addr().unwrap(), &numbered(i)).unwrap();
    }
    let e = a.flush().expect_err("nobody acknowledged");
    assert!(e.to_string().contains("unconfirmed"), "{e}");
    assert_eq!(a.stats().dropped.unconfirmed, 10);
    assert_eq!(a.stats().sent_messages, 10);
}

#[tokio::test]
async fn async_pop_waits_for_messages() {
    let (a, b) = (reliable(""), reliable(""));
    let to = b.local_addr();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        for i in 0..100u32 {
            a.push(to, &numbered(i)).unwrap();
        }
        a.flush().unwrap();
    });
    for i in 0..100u32 {
        let m = tokio::time::timeout(Duration::from_secs(10), b.pop())
            .await
            .expect("arrives")
            .unwrap();
        assert_eq!(index(&m), i);
    }
    t.join().unwrap();
}

#[test]
fn reliable_option_parses() {
    let c = skiff::QueueConfig::from_locator(
        "udp://127.0.0.1:0?reliable=true&window=64&idle_timeout=5s&max_message=1m",
    )
    .unwrap();
    assert!(c.reliable);
    assert_eq!(c.association.recv_window, 64);
    assert_eq!(c.association.idle_timeout, Duration::from_secs(5));
    assert_eq!(c.association.max_message, 1 << 20);
    assert!(
        !skiff::QueueConfig::from_locator("udp://127.0.0.1:0")
            .unwrap()
            .reliable
    );
    assert!(skiff::QueueConfig::from_locator("udp://127.0.0.1:0?reliable=maybe").is_err());
}
