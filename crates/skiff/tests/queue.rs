//! The queue over real loopback sockets: delivery, order, batching, typed
//! messages, loss counting, and hostile datagrams.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use bytes::Bytes;
use skiff::{Dest, Error, Message, Queue};
use skiff_proto::wire;

fn pop_n(q: &Queue, n: usize) -> Vec<Message> {
    let mut out = Vec::new();
    while out.len() < n {
        match q.pop_blocking(Some(Duration::from_secs(5))) {
            Some(m) => out.push(m),
            None => break,
        }
    }
    out
}

fn pair(opts: &str) -> (Queue, Queue) {
    (
        Queue::bind(&format!("udp://127.0.0.1:0{opts}")).unwrap(),
        Queue::bind("udp://127.0.0.1:0?rcvbuf=4m").unwrap(),
    )
}

#[test]
fn natural_batching_delivers_in_order() {
    let (a, b) = pair("");
    for i in 0..5000u32 {
        a.push(
            b.local_addr(),
            &Message::new("x.y", Bytes::copy_from_slice(&i.to_le_bytes())),
        )
        .unwrap();
    }
    a.flush().unwrap();
    let got = pop_n(&b, 5000);
    assert_eq!(got.len(), 5000);
    for (i, m) in got.iter().enumerate() {
        assert_eq!(m.payload, Bytes::copy_from_slice(&(i as u32).to_le_bytes()));
        assert_eq!(m.meta.seq, i as u64);
        assert_eq!(&*m.subject, "x.y");
        assert_eq!(m.meta.from, Some(a.local_addr()));
    }
    // How many datagrams carried them depends on timing (that is natural
    // batching's point); `skiff bench queue` shows it, the batcher's own
    // tests pin the rule down deterministically.
    let s = a.stats();
    assert_eq!(s.sent_messages, 5000);
    assert!(s.sent_batches >= 1 && s.sent_batches <= 5000, "{s:?}");
    let r = b.stats();
    assert_eq!((r.recv_messages, r.lost, r.dropped.total()), (5000, 0, 0));
}

#[test]
fn lone_message_waits_for_timeout_not_longer() {
    let (a, b) = pair("?qthresh=512&timeout=100ms");
    let t = Instant::now();
    a.push(b.local_addr(), &Message::from_payload("one"))
        .unwrap();
    assert!(
        b.try_pop().is_none(),
        "a lone message below qthresh waits for the timeout"
    );
    let m = b
        .pop_blocking(Some(Duration::from_secs(5)))
        .expect("sent at the timeout");
    assert_eq!(&m.payload[..], b"one");
    assert!(
        t.elapsed() >= Duration::from_millis(100),
        "left before its timeout: {:?}",
        t.elapsed()
    );
}

#[test]
fn qthresh_sends_without_waiting_for_timeout() {
    let (a, b) = pair("?qthresh=512&timeout=60s");
    for _ in 0..11 {
        a.push(b.local_addr(), &Message::from_payload(vec![7u8; 100]))
            .unwrap();
    }
    // Each message is 102 bytes encoded; with the 26-byte header, five
    // reach 512, so two datagrams of five leave and the eleventh waits.
    let got = pop_n(&b, 10);
    assert_eq!(got.len(), 10);
    assert!(b.pop_blocking(Some(Duration::from_millis(200))).is_none());
    a.flush().unwrap();
    assert_eq!(pop_n(&b, 1).len(), 1);
    assert_eq!(a.stats().sent_batches, 3);
}

#[test]
fn too_large_message_names_the_limit() {
    let (a, b) = pair("");
    let e = a
        .push(b.local_addr(), &Message::from_payload(vec![0u8; 1500]))
        .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::Usage(_)), "{e:?}");
    assert!(
        text.contains("1446") && text.contains("max_datagram"),
        "{text}"
    );
    // With a larger datagram the same message goes through.
    let big = Queue::bind("udp://127.0.0.1:0?max_datagram=65507").unwrap();
    big.push(b.local_addr(), &Message::from_payload(vec![1u8; 60_000]))
        .unwrap();
    big.flush().unwrap();
    let m = b.pop_blocking(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(
        m.payload.len(),
        60_000,
        "a datagram over 512 B is not truncated (CMQ's defect)"
    );
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Event {
    id: u64,
    name: String,
    tags: Vec<String>,
}

#[test]
fn typed_round_trip_and_mismatch() {
    let (a, b) = pair("");
    let ev = Event {
        id: 7,
        name: "start".into(),
        tags: vec!["a".into(), "b".into()],
    };
    a.push_typed(b.local_addr(), &ev).unwrap();
    a.push_typed(b.local_addr(), &42u32).unwrap();
    a.flush().unwrap();
    let got = pop_n(&b, 2);
    assert_eq!(skiff::decode_typed::<Event>(&got[0]).unwrap(), ev);
    assert!(matches!(
        skiff::decode_typed::<Event>(&got[1]),
        Err(Error::TypeMismatch { .. })
    ));
    assert_eq!(skiff::decode_typed::<u32>(&got[1]).unwrap(), 42);
}

fn raw_send(to: SocketAddr, bytes: &[u8]) {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.send_to(bytes, to).unwrap();
}

#[test]
fn sequence_gaps_are_counted_lost() {
    let b = Queue::bind("udp://127.0.0.1:0").unwrap();
    let m = |i: u8| Message::from_payload(vec![i]);
    // A stream is a source id from one address: one socket sends it all.
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let raw_send = |to: SocketAddr, d: &[u8]| {
        sock.send_to(d, to).unwrap();
    };
    // Source 99 sends seqs 0..3, skips 3..10, sends 10, then 5 late, then 10 again.
    raw_send(
        b.local_addr(),
        &wire::encode_datagram(99, 0, 0, &[m(0), m(1), m(2)]).unwrap(),
    );
    raw_send(
        b.local_addr(),
        &wire::encode_datagram(99, 0, 10, &[m(10)]).unwrap(),
    );
    raw_send(
        b.local_addr(),
        &wire::encode_datagram(99, 0, 5, &[m(5)]).unwrap(),
    );
    raw_send(
        b.local_addr(),
        &wire::encode_datagram(99, 0, 10, &[m(10)]).unwrap(),
    );
    let got = pop_n(&b, 5);
    assert_eq!(
        got.iter().map(|m| m.payload[0]).collect::<Vec<_>>(),
        vec![0, 1, 2, 10, 5]
    );
    assert!(
        b.pop_blocking(Some(Duration::from_millis(200))).is_none(),
        "the duplicate is not delivered"
    );
    let s = b.stats();
    assert_eq!(s.lost, 6, "3,4,6,7,8,9 never came");
    assert_eq!(s.recovered, 1);
    assert_eq!(s.dropped.duplicate, 1);
}

#[test]
fn hostile_datagrams_are_counted_and_the_queue_keeps_working() {
    let b = Queue::bind("udp://127.0.0.1:0?endpoint=3").unwrap();
    let good = wire::encode_datagram(1, 3, 0, &[Message::from_payload("ok")]).unwrap();
    let mut wrong_version = good.clone();
    wrong_version[2] = 9;
    let mut malformed = good.clone();
    malformed[wire::HEADER_LEN] = 0xff; // reserved flag bits
    let wrong_endpoint =
        wire::encode_datagram(2, 4, 0, &[Message::from_payload("not for us")]).unwrap();
    let garbage: Vec<&[u8]> = vec![
        b"GET / HTTP/1.1\r\n\r\n",
        &good[..10],
        &wrong_version,
        &malformed,
        &wrong_endpoint,
        &good[..good.len() - 1],
        b"",
    ];
    for g in &garbage {
        raw_send(b.local_addr(), g);
    }
    raw_send(b.local_addr(), &good);
    let m = b
        .pop_blocking(Some(Duration::from_secs(5)))
        .expect("the good datagram still arrives");
    assert_eq!(&m.payload[..], b"ok");
    assert!(b.pop_blocking(Some(Duration::from_millis(100))).is_none());
    let d = b.stats().dropped;
    assert_eq!(d.foreign, 1);
    assert_eq!(d.truncated, 3, "{d:?}");
    assert_eq!(d.version, 1);
    assert_eq!(d.malformed, 1);
    assert_eq!(d.endpoint, 1);
}

#[test]
fn explicit_endpoint_reaches_matching_queue() {
    let b = Queue::bind("udp://127.0.0.1:0?endpoint=5").unwrap();
    let a = Queue::bind("udp://127.0.0.1:0").unwrap();
    a.push(
        Dest {
            addr: b.local_addr(),
            endpoint: 5,
        },
        &Message::from_payload("for 5"),
    )
    .unwrap();
    a.push(
        Dest {
            addr: b.local_addr(),
            endpoint: 6,
        },
        &Message::from_payload("for 6"),
    )
    .unwrap();
    a.flush().unwrap();
    assert_eq!(
        &b.pop_blocking(Some(Duration::from_secs(5)))
            .unwrap()
            .payload[..],
        b"for 5"
    );
    assert!(b.pop_blocking(Some(Duration::from_millis(200))).is_none());
    assert_eq!(b.stats().dropped.endpoint, 1);
}

#[test]
fn async_pop_waits_for_a_message() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (a, b) = pair("");
    let to = b.local_addr();
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        a.push(to, &Message::from_payload("later")).unwrap();
        a.flush().unwrap();
        a
    });
    let m = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(5), b.pop()).await })
        .unwrap()
        .unwrap();
    assert_eq!(&m.payload[..], b"later");
    drop(sender.join());
}

#[test]
fn ipv6_loopback() {
    let Ok(b) = Queue::bind("udp://[::1]:0") else {
        eprintln!("SKIPPED ipv6_loopback: ::1 cannot be bound here");
        return;
    };
    let a = Queue::bind("udp://[::1]:0").unwrap();
    a.push(b.local_addr(), &Message::new("v6", "hi")).unwrap();
    assert_eq!(
        &b.pop_blocking(Some(Duration::from_secs(5)))
            .unwrap()
            .payload[..],
        b"hi"
    );
}

#[test]
fn multicast_push_reaches_every_member() {
    let group = "239.255.47.47";
    let port = 47_000 + (std::process::id() % 1000) as u16;
    let loc = format!("udp://0.0.0.0:{port}?reuse=true&join={group}&interface=127.0.0.1");
    let (m1, m2) = match (Queue::bind(&loc), Queue::bind(&loc)) {
        (Ok(a), Ok(b)) => (a, b),
        (a, b) => {
            eprintln!("SKIPPED multicast: {:?} {:?}", a.err(), b.err());
            return;
        }
    };
    let tx = Queue::bind("udp://127.0.0.1:0?interface=127.0.0.1").unwrap();
    let to: SocketAddr = format!("{group}:{port}").parse().unwrap();
    tx.push(to, &Message::new("mc", "to all")).unwrap();
    tx.flush().unwrap();
    for m in [&m1, &m2] {
        let got = m
            .pop_blocking(Some(Duration::from_secs(3)))
            .expect("member got the multicast");
        assert_eq!(&got.payload[..], b"to all");
    }
    m1.leave_multicast(group.parse().unwrap()).unwrap();
}

#[test]
fn stats_and_try_pop_do_not_wait_behind_a_blocked_pop() {
    let q = std::sync::Arc::new(Queue::bind("udp://127.0.0.1:0").unwrap());
    let waiter = {
        let q = q.clone();
        std::thread::spawn(move || q.pop_blocking(None))
    };
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    assert_eq!(q.stats().recv_messages, 0);
    assert!(q.try_pop().is_none());
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "stats/try_pop waited for the blocked pop"
    );
    let a = Queue::bind("udp://127.0.0.1:0").unwrap();
    a.push(q.local_addr(), &Message::from_payload("wake"))
        .unwrap();
    a.flush().unwrap();
    let m = waiter
        .join()
        .unwrap()
        .expect("the blocked pop gets the message");
    assert_eq!(&m.payload[..], b"wake");
    assert_eq!(q.stats().recv_messages, 1);
}

/// Request/reply under natural batching: every lone message leaves at once
/// in a datagram of its own (one system call each), numbered in its
/// stream, and nothing is counted lost or dropped.
#[test]
fn request_reply_sends_each_message_alone_and_in_sequence() {
    let a = Queue::bind("udp://127.0.0.1:0").unwrap();
    let b = std::sync::Arc::new(Queue::bind("udp://127.0.0.1:0").unwrap());
    let (a_addr, b_addr) = (a.local_addr(), b.local_addr());
    const N: u64 = 200;
    let echo = {
        let b = b.clone();
        std::thread::spawn(move || {
            for i in 0..N {
                let m = b.pop_blocking(Some(Duration::from_secs(5))).expect("ping");
                assert_eq!(m.meta.seq, i);
                assert_eq!(m.meta.from, Some(a_addr));
                b.push(a_addr, &m).unwrap();
            }
        })
    };
    for i in 0..N {
        let ping = Message::from_payload(Bytes::copy_from_slice(&i.to_le_bytes()));
        a.push(b_addr, &ping).unwrap();
        let pong = a.pop_blocking(Some(Duration::from_secs(5))).expect("pong");
        assert_eq!(pong.payload, ping.payload);
        assert_eq!(pong.meta.seq, i);
    }
    echo.join().unwrap();
    for s in [a.stats(), b.stats()] {
        assert_eq!((s.sent_messages, s.sent_batches, s.send_calls), (N, N, N));
        assert_eq!((s.recv_messages, s.recv_batches), (N, N));
        assert_eq!((s.lost, s.dropped.total()), (0, 0), "{s:?}");
    }
}

/// While a pop waits in the kernel holding the receive state, `stats`
/// still reports what that pop received and refused before waiting again.
#[test]
fn stats_during_a_blocked_pop_include_its_last_receive() {
    let q = std::sync::Arc::new(Queue::bind("udp://127.0.0.1:0").unwrap());
    let waiter = {
        let q = q.clone();
        std::thread::spawn(move || q.pop_blocking(Some(Duration::from_secs(10))))
    };
    std::thread::sleep(Duration::from_millis(50));
    raw_send(q.local_addr(), b"not skiff at all");
    let t = Instant::now();
    while q.stats().dropped.foreign == 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", q.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
    let a = Queue::bind("udp://127.0.0.1:0").unwrap();
    a.push(q.local_addr(), &Message::from_payload("wake"))
        .unwrap();
    a.flush().unwrap();
    assert!(waiter.join().unwrap().is_some());
    let s = q.stats();
    assert_eq!((s.dropped.foreign, s.recv_messages), (1, 1));
}

/// A blocking pop on a quiet queue returns `None` after its timeout; one
/// whose wait is cut short by a refused datagram waits on, at most twice
/// the timeout in all.
#[test]
fn pop_blocking_times_out() {
    let q = Queue::bind("udp://127.0.0.1:0").unwrap();
    let t = Instant::now();
    assert!(q.pop_blocking(Some(Duration::from_millis(100))).is_none());
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(99) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    let addr = q.local_addr();
    let noise = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        raw_send(addr, b"noise");
    });
    let t = Instant::now();
    assert!(q.pop_blocking(Some(Duration::from_millis(200))).is_none());
    let waited = t.elapsed();
    noise.join().unwrap();
    assert!(
        waited >= Duration::from_millis(199)
            && waited < Duration::from_millis(400) + Duration::from_secs(1),
        "{waited:?}"
    );
    assert_eq!(q.stats().dropped.foreign, 1);
}

/// A lone message the kernel refuses (port 0: `EINVAL`) is counted as a
/// send error and reported by `flush`; the queue goes on sending.
#[test]
fn refused_lone_message_is_counted_and_the_queue_goes_on() {
    let (a, b) = pair("");
    let nowhere: SocketAddr = "127.0.0.1:0".parse().unwrap();
    a.push(nowhere, &Message::from_payload(Bytes::from_static(b"lost")))
        .unwrap();
    let s = a.stats();
    assert_eq!((s.dropped.send_error, s.sent_messages), (1, 0), "{s:?}");
    let e = a.flush().unwrap_err().to_string();
    assert!(e.contains("send") && e.contains("nvalid"), "{e}");
    a.push(
        b.local_addr(),
        &Message::from_payload(Bytes::from_static(b"next")),
    )
    .unwrap();
    let got = b.pop_blocking(Some(Duration::from_secs(5))).expect("next");
    assert_eq!(&got.payload[..], b"next");
    let s = a.stats();
    assert_eq!((s.dropped.send_error, s.sent_messages), (1, 1), "{s:?}");
}

/// A point-to-point queue (`peer=`) exchanges with its peer, takes nothing
/// from anyone else, and still pushes to other addresses.
#[test]
fn connected_queue_hears_only_its_peer() {
    let b = Queue::bind("udp://127.0.0.1:0").unwrap();
    let a = Queue::bind(&format!("udp://127.0.0.1:0?peer={}", b.local_addr())).unwrap();
    assert_eq!(a.as_datagram().unwrap().peer(), Some(b.local_addr()));
    let stranger = Queue::bind("udp://127.0.0.1:0").unwrap();
    stranger
        .push(
            a.local_addr(),
            &Message::from_payload(Bytes::from_static(b"from a stranger")),
        )
        .unwrap();
    b.push(
        a.local_addr(),
        &Message::from_payload(Bytes::from_static(b"from the peer")),
    )
    .unwrap();
    let got = a
        .pop_blocking(Some(Duration::from_secs(5)))
        .expect("peer's message");
    assert_eq!(&got.payload[..], b"from the peer");
    assert_eq!(got.meta.from, Some(b.local_addr()));
    assert!(
        a.pop_blocking(Some(Duration::from_millis(200))).is_none(),
        "heard a stranger"
    );
    for (to, what) in [
        (b.local_addr(), &b"to the peer"[..]),
        (stranger.local_addr(), b"to another"),
    ] {
        a.push(to, &Message::from_payload(Bytes::copy_from_slice(what)))
            .unwrap();
    }
    let q = |q: &Queue| {
        q.pop_blocking(Some(Duration::from_secs(5)))
            .expect("a's push")
            .payload
    };
    assert_eq!(&q(&b)[..], b"to the peer");
    assert_eq!(&q(&stranger)[..], b"to another");
    assert_eq!(a.stats().sent_messages, 2);
    let e = a.connect(stranger.local_addr()).unwrap_err().to_string();
    assert!(e.contains("already connected"), "{e}");
    for bad in ["peer=somewhere", "peer=127.0.0.1:1&reliable=true"] {
        let e = Queue::bind(&format!("udp://127.0.0.1:0?{bad}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("peer"), "{bad}: {e}");
    }
}

/// A GSO send of three batches, which loopback hands to a GRO socket as
/// one buffer, reaches a waiting pop whole: the waiting receive is told no
/// segment size, so the queue finds it from the batches and delivers every
/// message, none counted as malformed.
#[test]
fn waiting_pop_splits_a_coalesced_run() {
    use skiff::udp::{Outgoing, UdpConfig, UdpSocket as Udp};
    use skiff_proto::{Batcher, BatcherConfig};
    let q = Queue::bind("udp://127.0.0.1:0").unwrap();
    let tx = Udp::bind("127.0.0.1:0".parse().unwrap(), &UdpConfig::default()).unwrap();
    if tx.max_segments() == 1 {
        return println!("SKIPPED: no UDP_SEGMENT (GSO) on this kernel");
    }
    let mut b = Batcher::new(BatcherConfig {
        qthresh: 200,
        timeout: Duration::from_secs(1),
        source: 7,
        ..BatcherConfig::default()
    });
    let now = Instant::now();
    // Batches of different lengths, so that all but the last are padded.
    let sent: Vec<Message> = (0..9)
        .map(|i| Message::new("run", vec![b'a' + i as u8; 40 + 10 * i]))
        .collect();
    for m in &sent {
        b.push(now, Dest::from(q.local_addr()), m).unwrap();
    }
    b.flush();
    let mut buf = Vec::new();
    let t = b.poll_transmit(&mut buf, 64).expect("a transmit");
    assert!(t.segments >= 3 && t.segment_size.is_some(), "{t:?}");
    assert!(
        b.poll_transmit(&mut Vec::new(), 64).is_none(),
        "one transmit"
    );
    let out = Outgoing {
        dest: q.local_addr(),
        data: &buf,
        segment_size: t.segment_size,
    };
    assert_eq!(tx.send(&[out]).unwrap(), 1);
    let got = pop_n(&q, sent.len());
    let payloads: Vec<&[u8]> = got.iter().map(|m| &m.payload[..]).collect();
    let want: Vec<&[u8]> = sent.iter().map(|m| &m.payload[..]).collect();
    assert_eq!(payloads, want);
    let s = q.stats();
    assert_eq!(s.recv_batches, t.segments as u64, "{s:?}");
    assert_eq!(s.dropped.total(), 0, "{s:?}");
}

/// One forged datagram carrying a real sender's source id and a far-future
/// sequence number, sent from another port, costs at most itself: the
/// real stream's next 300 messages are all delivered.
#[test]
fn forged_datagram_from_another_port_does_not_silence_the_sender() {
    let (a, b) = pair("");
    let one = |i: u32| Message::from_payload(i.to_le_bytes().to_vec());
    a.push(b.local_addr(), &one(0)).unwrap();
    let first = pop_n(&b, 1).pop().expect("the real sender's first message");
    let forged = wire::encode_datagram(
        first.meta.source,
        0,
        first.meta.seq + (1 << 40),
        &[Message::from_payload("forged")],
    )
    .unwrap();
    raw_send(b.local_addr(), &forged);
    for i in 1..=300 {
        a.push(b.local_addr(), &one(i)).unwrap();
    }
    let (mut real, mut other) = (Vec::new(), 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while real.len() < 300 && Instant::now() < deadline {
        match b.pop_blocking(Some(Duration::from_millis(500))) {
            Some(m) if m.meta.from == Some(a.local_addr()) => {
                real.push(u32::from_le_bytes(m.payload[..4].try_into().unwrap()))
            }
            Some(_) => other += 1,
            None => {}
        }
    }
    assert_eq!(real, (1..=300).collect::<Vec<_>>(), "{:?}", b.stats());
    assert!(other <= 1, "only the forged datagram itself");
}

/// A forged datagram that even comes from the sender's own address (a
/// spoofed one) with a far-future number is refused and counted
/// (`far_ahead`), and does not move the stream.
#[test]
fn far_ahead_datagram_from_the_senders_address_is_refused_and_counted() {
    let b = Queue::bind("udp://127.0.0.1:0?rcvbuf=4m").unwrap();
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let send = |seq: u64, body: &str| {
        let d = wire::encode_datagram(7, 0, seq, &[Message::from_payload(body.to_owned())]);
        s.send_to(&d.unwrap(), b.local_addr()).unwrap();
    };
    for seq in 0..10 {
        send(seq, "real");
    }
    send(u64::MAX / 2, "forged");
    for seq in 10..310 {
        send(seq, "real");
    }
    let got = pop_n(&b, 310);
    assert_eq!(got.len(), 310, "{:?}", b.stats());
    assert!(got.iter().all(|m| &m.payload[..] == b"real"));
    let st = b.stats();
    assert_eq!(
        (st.dropped.far_ahead, st.lost, st.dropped.stale),
        (1, 0, 0),
        "{st:?}"
    );
}
