//! Tunnels over loopback: set-up, ordered exactly-once delivery,
//! back-pressure, fragmentation, the byte-stream adapter, close, dead-peer
//! detection, path sharing with best-effort traffic, and FIRST floods.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use skiff::{Endpoint, Message, TunnelError};
use skiff_proto::association::AssociationStats;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const T: Duration = Duration::from_secs(5);

fn pair(opts: &str) -> (Endpoint, Endpoint) {
    let server = Endpoint::bind(&format!("udp://127.0.0.1:0?{opts}")).unwrap();
    server.listen();
    let client = Endpoint::bind(&format!("udp://127.0.0.1:0?{opts}")).unwrap();
    (server, client)
}

async fn connected(opts: &str) -> (Endpoint, Endpoint, skiff::Tunnel, skiff::Tunnel) {
    let (server, client) = pair(opts);
    let (c, s) = tokio::join!(client.connect(server.local_addr(), T), server.accept());
    (server, client, s.unwrap(), c.unwrap())
}

/// Messages a tunnel's `send` handed to its association: plain ones, and
/// the small ones carried in bundles.
fn sent(st: &AssociationStats) -> u64 {
    st.messages_sent - st.bundles_sent + st.bundled_messages_sent
}

/// Messages a tunnel's association delivered, bundles split.
fn delivered(st: &AssociationStats) -> u64 {
    st.messages_delivered - st.bundles_delivered + st.bundled_messages_delivered
}

#[tokio::test]
async fn connect_accept_and_exchange() {
    let (server, client, s, c) = connected("").await;
    assert_eq!(s.peer(), client.local_addr());
    assert_eq!(c.peer(), server.local_addr());
    c.send(&b"ping"[..]).await.unwrap();
    assert_eq!(
        s.recv().await.unwrap().unwrap(),
        Bytes::from_static(b"ping")
    );
    s.send(&b"pong"[..]).await.unwrap();
    assert_eq!(
        c.recv().await.unwrap().unwrap(),
        Bytes::from_static(b"pong")
    );
    assert_eq!(server.stats().listener.established, 1);
    assert_eq!(server.stats().tunnels_open, 1);
}

#[tokio::test]
async fn connect_without_listener_times_out() {
    let (server, client) = pair("");
    let quiet = Endpoint::bind("udp://127.0.0.1:0").unwrap(); // not listening
    let e = client
        .connect(quiet.local_addr(), Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(e, TunnelError::ConnectTimeout { .. }), "{e}");
    assert!(e.to_string().contains("listener"));
    assert!(quiet.stats().first_not_listening >= 1);
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_messages_arrive_once_in_order() {
    let (_server, _client, s, c) = connected("").await;
    const N: u32 = 50_000;
    let sender = tokio::spawn(async move {
        for i in 0..N {
            c.send(Bytes::copy_from_slice(&i.to_le_bytes()))
                .await
                .unwrap();
        }
        c.close().await.unwrap();
        c
    });
    for i in 0..N {
        let m = s.recv().await.unwrap().expect("message before close");
        assert_eq!(u32::from_le_bytes(m[..].try_into().unwrap()), i);
    }
    assert_eq!(
        s.recv().await.unwrap(),
        None,
        "graceful end after all messages"
    );
    let c = sender.await.unwrap();
    assert_eq!(sent(&c.stats()), u64::from(N));
    assert_eq!(delivered(&s.stats()), u64::from(N));
    // Small messages gathered behind data in flight travel in bundles: far
    // fewer association messages than sends.
    assert!(
        c.stats().messages_sent < u64::from(N) / 10,
        "{N} sends made {} association messages",
        c.stats().messages_sent
    );
    assert_eq!(c.stats().bundles_sent, s.stats().bundles_delivered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_offers_no_bundles_gets_none_and_everything_arrives() {
    // `bundles=false` makes an end offer none at set-up, as an end built
    // before bundles: the other end then stages small messages as messages
    // of their own, whichever side initiated.
    for (client_opts, server_opts) in [("", "bundles=false"), ("bundles=false", "")] {
        let server = Endpoint::bind(&format!("udp://127.0.0.1:0?{server_opts}")).unwrap();
        server.listen();
        let client = Endpoint::bind(&format!("udp://127.0.0.1:0?{client_opts}")).unwrap();
        let (c, s) = tokio::join!(client.connect(server.local_addr(), T), server.accept());
        let (c, s) = (c.unwrap(), s.unwrap());
        const N: u64 = 20_000;
        let (a, b) = (
            async {
                for i in 0..N {
                    c.send(numbered(i, 8 + (i % 50) as usize)).await.unwrap();
                    s.send(numbered(i, 8)).await.unwrap();
                }
            },
            async {
                for i in 0..N {
                    let m = s.recv().await.unwrap().unwrap();
                    assert_eq!(m, numbered(i, 8 + (i % 50) as usize));
                    assert_eq!(c.recv().await.unwrap().unwrap(), numbered(i, 8));
                }
            },
        );
        tokio::join!(a, b);
        for t in [&c, &s] {
            let st = t.stats();
            assert_eq!(st.bundles_sent, 0, "{client_opts} / {server_opts}");
            assert_eq!(st.bundles_delivered, 0, "{client_opts} / {server_opts}");
            assert_eq!(st.messages_sent, N, "{client_opts} / {server_opts}");
        }
    }
}

/// A message whose bytes say its number and length (`len` at least 8).
fn numbered(i: u64, len: usize) -> Bytes {
    let mut v = vec![(i % 251) as u8; len];
    v[..8].copy_from_slice(&i.to_le_bytes());
    Bytes::from(v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_and_large_sends_keep_order_and_boundaries() {
    // Small messages are staged and large ones go straight to the
    // association (after the stage): mixed, every message arrives once,
    // whole, in order; small ones share packets.
    for opts in ["", "mtu=65507"] {
        let (_server, _client, s, c) = connected(opts).await;
        const N: u64 = 40_000;
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let lens: Vec<usize> = (0..N)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if i % 97 == 0 {
                    8 + (x % 5_000) as usize
                } else {
                    8 + (x % 120) as usize
                }
            })
            .collect();
        let expect = lens.clone();
        let sender = tokio::spawn(async move {
            for (i, &len) in lens.iter().enumerate() {
                c.send(numbered(i as u64, len)).await.unwrap();
            }
            c.close().await.unwrap();
            c.stats()
        });
        for (i, &len) in expect.iter().enumerate() {
            let m = s.recv().await.unwrap().expect("message before close");
            assert_eq!(m, numbered(i as u64, len), "{opts}: message {i}");
        }
        assert_eq!(s.recv().await.unwrap(), None, "{opts}");
        let st = sender.await.unwrap();
        assert_eq!(sent(&st), N, "{opts}");
        assert_eq!(delivered(&s.stats()), N, "{opts}");
        assert!(st.bundles_sent > 0, "{opts}");
        assert!(
            st.data_packets < N / 4,
            "{opts}: {N} messages in {} packets",
            st.data_packets
        );
    }
}

/// The length of message `i` of a mixed series: small (bundled), and every
/// 101st larger than a packet (fragmented).
fn mixed_len(i: u64) -> usize {
    if i.is_multiple_of(101) {
        70_000
    } else {
        8 + (i % 90) as usize
    }
}

/// Sends `n` numbered messages of [`mixed_len`] on `c`, then closes it.
fn send_mixed(c: skiff::Tunnel, n: u64) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for i in 0..n {
            c.send(numbered(i, mixed_len(i))).await.unwrap();
        }
        c.close().await.unwrap();
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recv_many_takes_every_message_once_in_order_then_zero_at_the_end() {
    // Small (bundled) and large (fragmented) messages, read in batches of
    // varying size: the same messages as one recv each, a large one alone,
    // then Ok(0).
    for opts in ["", "mtu=65507"] {
        let (_server, _client, s, c) = connected(opts).await;
        const N: u64 = 30_000;
        let len = mixed_len;
        let sender = send_mixed(c, N);
        let mut out = Vec::new();
        assert_eq!(s.recv_many(&mut out, 0).await.unwrap(), 0, "max 0");
        let mut next = 0u64;
        let mut calls = 0u64;
        loop {
            let max = 1 + (calls as usize * 37) % 300;
            let before = out.len();
            let n = s.recv_many(&mut out, max).await.unwrap();
            calls += 1;
            assert_eq!(out.len(), before + n, "{opts}: appended what it said");
            if n == 0 {
                break;
            }
            assert!(n <= max, "{opts}: {n} messages for max {max}");
            // A message larger than a packet comes alone.
            assert!(
                n == 1 || out.iter().all(|m| m.len() < 70_000),
                "{opts}: a large message in a batch of {n}"
            );
            for m in out.drain(..) {
                assert_eq!(m, numbered(next, len(next)), "{opts}: message {next}");
                next += 1;
            }
        }
        assert_eq!(next, N, "{opts}: every message");
        assert_eq!(
            s.recv_many(&mut out, 10).await.unwrap(),
            0,
            "{opts}: still the end"
        );
        assert_eq!(s.recv().await.unwrap(), None, "{opts}");
        sender.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recv_each_lends_every_message_once_in_order_then_zero_at_the_end() {
    // Small (bundled) and large (fragmented) messages, lent in batches of
    // varying size: the same messages as one recv each, then Ok(0).
    for opts in ["", "mtu=65507"] {
        let (_server, _client, s, c) = connected(opts).await;
        const N: u64 = 30_000;
        let len = mixed_len;
        let sender = send_mixed(c, N);
        assert_eq!(s.recv_each(0, |_| panic!("max 0")).await.unwrap(), 0);
        let mut next = 0u64;
        let mut calls = 0u64;
        loop {
            let max = 1 + (calls as usize * 37) % 300;
            let mut lent = 0;
            let n = s
                .recv_each(max, |m| {
                    assert_eq!(m, &numbered(next, len(next))[..], "{opts}: message {next}");
                    next += 1;
                    lent += 1;
                })
                .await
                .unwrap();
            calls += 1;
            assert_eq!(n, lent, "{opts}: lent what it said");
            if n == 0 {
                break;
            }
            assert!(n <= max, "{opts}: {n} messages for max {max}");
        }
        assert_eq!(next, N, "{opts}: every message");
        assert_eq!(
            s.recv_each(10, |_| panic!("after the end")).await.unwrap(),
            0
        );
        assert_eq!(s.recv().await.unwrap(), None, "{opts}");
        sender.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recv_parts_gives_each_message_in_slices_that_join_to_it() {
    // Small, packet-sized and large messages: each comes as slices whose
    // join is the message (a large one in several), in order, then None.
    for opts in ["", "mtu=65507"] {
        let (_server, _client, s, c) = connected(opts).await;
        const N: u64 = 3_000;
        let len = |i: u64| match i % 7 {
            0 => 200_000,
            1 => 1_400,
            2 => 65_536,
            _ => 8 + (i % 90) as usize,
        };
        let sender = tokio::spawn(async move {
            for i in 0..N {
                c.send(numbered(i, len(i))).await.unwrap();
            }
            c.close().await.unwrap();
        });
        let mut parts = Vec::new();
        let mut split = 0;
        for i in 0..N {
            parts.clear();
            let n = s
                .recv_parts(&mut parts)
                .await
                .unwrap()
                .expect("before close");
            assert_eq!(n, len(i), "{opts}: message {i}");
            assert!(!parts.is_empty());
            split += usize::from(parts.len() > 1);
            assert_eq!(parts.concat(), numbered(i, len(i)), "{opts}: message {i}");
        }
        assert!(split > 0, "{opts}: large messages come in pieces");
        assert_eq!(s.recv_parts(&mut parts).await.unwrap(), None, "{opts}");
        sender.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_messages_leave_without_a_flush() {
    // Bursts of small messages, each followed by silence: the last of each
    // burst is staged behind data in flight, and must leave when that data
    // is acknowledged (nothing else will move it).
    let (_server, _client, s, c) = connected("").await;
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut n = 0u64;
    for _round in 0..300 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let burst = 1 + x % 60;
        for i in n..n + burst {
            c.send(numbered(i, 16)).await.unwrap();
        }
        for i in n..n + burst {
            let m = tokio::time::timeout(T, s.recv())
                .await
                .expect("a staged message stayed behind")
                .unwrap()
                .unwrap();
            assert_eq!(m, numbered(i, 16));
        }
        n += burst;
    }
    assert_eq!(sent(&c.stats()), n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_behind_a_lone_small_one_does_not_wait_for_its_held_acknowledgement() {
    // The receiver may hold back the acknowledgement of a lone small
    // message, hoping for a reply to carry it (with these settings until
    // the sender's retransmission timer draws it). The next small message,
    // staged behind it, must not wait for that acknowledgement (TCP's
    // Nagle and delayed-ack trap).
    let (_server, _client, s, c) = connected("min_pto=10s&ack_delay=10s").await;
    // The receiver holds back acknowledgements only once it measured a
    // round trip of its own: it sends first.
    for i in 0..3 {
        s.send(numbered(1000 + i, 16)).await.unwrap();
        let m = tokio::time::timeout(T, c.recv()).await.unwrap();
        assert_eq!(m.unwrap().unwrap(), numbered(1000 + i, 16));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for round in 0..3u64 {
        c.send(numbered(2 * round, 16)).await.unwrap();
        let first = tokio::time::timeout(T, s.recv()).await.unwrap();
        assert_eq!(first.unwrap().unwrap(), numbered(2 * round, 16));
        c.send(numbered(2 * round + 1, 16)).await.unwrap();
        let second = tokio::time::timeout(T, s.recv()).await.unwrap();
        assert_eq!(second.unwrap().unwrap(), numbered(2 * round + 1, 16));
        // Let the acknowledgement of both reach the sender: the next round
        // starts with nothing in flight.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Had the second message waited for the first one's acknowledgement,
    // only the first one's retransmission (its timer expiring, at least
    // `min_rto` later) would have drawn that acknowledgement.
    let st = c.stats();
    assert_eq!(st.rto_expired, 0, "{st:?}");
    assert_eq!(st.retransmits, 0, "{st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_tunnel_delivers_its_staged_messages() {
    let (_server, _client, s, c) = connected("").await;
    for i in 0..5_000 {
        c.send(numbered(i, 40)).await.unwrap();
    }
    drop(c);
    for i in 0..5_000 {
        let m = tokio::time::timeout(T, s.recv()).await.unwrap().unwrap();
        assert_eq!(m.expect("message before the end"), numbered(i, 40));
    }
    assert_eq!(tokio::time::timeout(T, s.recv()).await.unwrap(), Ok(None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_holds_a_sender_of_small_messages() {
    let opts = "send_buffer=64k&recv_buffer=64k&tunnel_buffer=64k&window=32";
    let (_server, client, s, c) = connected(opts).await;
    let mut accepted = 0u64;
    loop {
        let m = numbered(accepted, 64);
        match tokio::time::timeout(Duration::from_millis(300), c.send(m)).await {
            Ok(r) => {
                r.unwrap();
                accepted += 1;
            }
            Err(_) => break,
        }
        assert!(accepted < 1 << 20, "send never waited: unbounded staging");
    }
    // Sender buffer + stage (a packet) + receiver window + queues, with slack.
    let bound = ((64 + 64 + 64) * 1024 + 32 * 1500) as u64;
    assert!(accepted * 64 <= bound * 2, "{accepted} messages, no reader");
    let writer = tokio::spawn(async move {
        for i in accepted..accepted + 1000 {
            c.send(numbered(i, 64)).await.unwrap();
        }
        c.close().await.unwrap();
    });
    for i in 0..accepted + 1000 {
        assert_eq!(s.recv().await.unwrap().unwrap(), numbered(i, 64));
    }
    assert_eq!(s.recv().await.unwrap(), None);
    writer.await.unwrap();
    assert_eq!(client.stats().staged_refused, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_waits_while_the_receiver_does_not_read() {
    let opts = "send_buffer=64k&recv_buffer=64k&tunnel_buffer=64k&window=32";
    let (server, _client, s, c) = connected(opts).await;
    let chunk = Bytes::from(vec![7u8; 1000]);
    // Without a reader, sends stop being accepted after a bounded amount.
    let mut accepted = 0usize;
    loop {
        match tokio::time::timeout(Duration::from_millis(300), c.send(chunk.clone())).await {
            Ok(r) => {
                r.unwrap();
                accepted += 1;
            }
            Err(_) => break,
        }
        assert!(accepted < 10_000, "send never waited: unbounded buffering");
    }
    // Sender buffer + receiver window + receiver queues, with slack.
    let bound = (64 + 64 + 64) * 1024 + 32 * 1500;
    assert!(
        accepted * 1000 <= bound * 2,
        "{accepted} KB accepted with no reader"
    );
    // Reading lets everything through, in order and complete.
    let total = accepted + 500;
    let writer = tokio::spawn(async move {
        for _ in accepted..total {
            c.send(chunk.clone()).await.unwrap();
        }
        c
    });
    for _ in 0..total {
        assert_eq!(s.recv().await.unwrap().unwrap().len(), 1000);
    }
    let _c = writer.await.unwrap();
    assert_eq!(server.stats().associations.protocol_violations, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_are_fragmented_and_reassembled() {
    let (_server, _client, s, c) = connected("send_buffer=1m").await;
    let big: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    let big = Bytes::from(big);
    let b2 = big.clone();
    let w = tokio::spawn(async move {
        c.send(b2.clone()).await.unwrap();
        c.send(b2.slice(..12345)).await.unwrap();
        c
    });
    let got = s.recv().await.unwrap().unwrap();
    assert_eq!(got.len(), big.len());
    assert!(got == big, "8 MiB message intact");
    assert_eq!(s.recv().await.unwrap().unwrap(), big.slice(..12345));
    let c = w.await.unwrap();
    assert!(c.stats().data_packets > 5000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_adapter_copies_bytes_exactly() {
    let (_server, _client, s, c) = connected("").await;
    let data: Vec<u8> = (0..3_000_001u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let expect = data.clone();
    let mut w = c.into_stream();
    let writer = tokio::spawn(async move {
        let mut src = &data[..];
        tokio::io::copy(&mut src, &mut w).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let mut r = s.into_stream();
    let mut got = Vec::new();
    r.read_to_end(&mut got).await.unwrap();
    writer.await.unwrap();
    assert_eq!(got.len(), expect.len());
    assert!(got == expect);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_reads_large_messages_in_small_reads() {
    // Messages larger than a packet reach a stream reader in their pieces
    // (copied out as they are, never joined first): read through buffers
    // smaller and larger than a piece, the bytes come out whole and in
    // order, across message boundaries, empty messages included.
    let (_server, _client, s, c) = connected("mtu=1472").await;
    let sizes = [100_000, 0, 5, 70_000, 1_400, 4_416, 1, 65_536];
    let mut from = 0;
    let mut expect = Vec::new();
    for n in sizes {
        expect.extend(pattern(from, n));
        from += n;
    }
    let sent = expect.clone();
    let writer = tokio::spawn(async move {
        let mut at = 0;
        for n in sizes {
            c.send(Bytes::copy_from_slice(&sent[at..at + n]))
                .await
                .unwrap();
            at += n;
        }
        c.close().await.unwrap();
        c
    });
    let mut r = s.into_stream();
    let mut got = Vec::new();
    for size in [997, 7, 3_000, 65_536].into_iter().cycle() {
        let mut buf = vec![0u8; size];
        let n = r.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    let c = writer.await.unwrap();
    assert_eq!(got.len(), expect.len());
    assert!(got == expect, "the stream's bytes differ from those sent");
    assert!(
        c.stats().data_packets > 100,
        "large messages went in many packets"
    );
}

/// Stream bytes with a pattern that shows where each byte belongs.
fn pattern(from: usize, len: usize) -> Vec<u8> {
    (from..from + len)
        .map(|i| (i as u64).wrapping_mul(0x9E37_79B9) as u8 ^ (i >> 11) as u8)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_writes_are_gathered_and_arrive_as_the_same_stream() {
    for opts in ["", "mtu=65507"] {
        let (_server, _client, s, c) = connected(opts).await;
        // Tiny writes (1 to 64 bytes) interleaved with large ones (200 KB),
        // written by one task, read as bytes by another.
        let mut sizes = Vec::new();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for i in 0..60_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            sizes.push(if i % 10_000 == 5_000 {
                200_000
            } else {
                1 + (x % 64) as usize
            });
        }
        let total: usize = sizes.iter().sum();
        let writer = tokio::spawn(async move {
            let mut at = 0;
            for n in sizes {
                c.write_all(&pattern(at, n)).await.unwrap();
                at += n;
            }
            c.close().await.unwrap();
            c.stats()
        });
        let mut got = Vec::new();
        s.into_stream().read_to_end(&mut got).await.unwrap();
        let st = writer.await.unwrap();
        assert_eq!(got.len(), total, "{opts}");
        assert!(got == pattern(0, total), "{opts}: byte stream differs");
        // Gathered: far fewer messages (and packets) than writes.
        assert!(
            st.messages_sent < 60_000 / 4,
            "{opts}: 60,000 writes sent as {} messages",
            st.messages_sent
        );
        assert!(st.data_packets < 60_000 / 4, "{opts}: {st:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_holds_a_writer_of_tiny_writes() {
    let opts = "send_buffer=64k&recv_buffer=64k&tunnel_buffer=64k&window=32";
    let (_server, _client, s, c) = connected(opts).await;
    // Without a reader, tiny writes stop being taken after a bounded amount
    // (every gathered byte counts against the send buffer).
    let mut accepted = 0usize;
    loop {
        match tokio::time::timeout(Duration::from_millis(300), c.write_all(&[9u8; 40])).await {
            Ok(r) => {
                r.unwrap();
                accepted += 40;
            }
            Err(_) => break,
        }
        assert!(
            accepted < 10 << 20,
            "write never waited: unbounded buffering"
        );
    }
    // Sender buffer + receiver window + receiver queues, with slack.
    let bound = (64 + 64 + 64) * 1024 + 32 * 1500;
    assert!(
        accepted <= bound * 2,
        "{accepted} bytes taken with no reader"
    );
    assert!(accepted >= 64 * 1024, "{accepted} bytes: held too early");
    // The write that timed out may have taken part of its 40 bytes; the
    // stream holds exactly what was taken, then the rest in order.
    let writer = tokio::spawn(async move {
        c.write_all(&[7u8; 100_000]).await.unwrap();
        c.close().await.unwrap();
    });
    let mut got = Vec::new();
    s.into_stream().read_to_end(&mut got).await.unwrap();
    writer.await.unwrap();
    let nines = got.iter().take_while(|&&b| b == 9).count();
    assert!(
        (accepted..accepted + 40).contains(&nines),
        "{nines} vs {accepted}"
    );
    assert!(got[nines..].iter().all(|&b| b == 7));
    assert_eq!(got.len() - nines, 100_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_from_either_side() {
    // Client closes first.
    let (_server, _client, s, c) = connected("").await;
    c.send(&b"last"[..]).await.unwrap();
    let (r, got) = tokio::join!(c.close(), async {
        let m = s.recv().await.unwrap();
        let end = s.recv().await.unwrap();
        (m, end)
    });
    r.unwrap();
    assert_eq!(got.0.unwrap(), Bytes::from_static(b"last"));
    assert_eq!(got.1, None);
    assert_eq!(c.send(&b"more"[..]).await.unwrap_err(), TunnelError::Closed);
    assert_eq!(
        s.send(&b"more"[..]).await.unwrap_err(),
        TunnelError::PeerClosed
    );
    // Server closes first; its pending message still arrives.
    let (_server, _client, s, c) = connected("").await;
    s.send(&b"bye"[..]).await.unwrap();
    let (r, m) = tokio::join!(s.close(), c.recv());
    r.unwrap();
    assert_eq!(m.unwrap().unwrap(), Bytes::from_static(b"bye"));
    assert_eq!(c.recv().await.unwrap(), None);
    c.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_peer_is_detected_when_its_endpoint_is_dropped() {
    let (server, client, s, c) = connected("idle_timeout=1s&keepalive=200ms").await;
    c.send(&b"x"[..]).await.unwrap();
    assert_eq!(s.recv().await.unwrap().unwrap(), Bytes::from_static(b"x"));
    drop(server);
    // The server side's own handle reports the endpoint gone at once.
    assert_eq!(s.recv().await.unwrap_err(), TunnelError::EndpointGone);
    let started = std::time::Instant::now();
    let e = tokio::time::timeout(Duration::from_secs(5), c.recv())
        .await
        .expect("dead peer detected within idle_timeout plus slack")
        .unwrap_err();
    assert!(
        matches!(
            e,
            TunnelError::Failed {
                reason: skiff_proto::association::FailReason::PeerDead,
                ..
            }
        ),
        "{e}"
    );
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert!(e.to_string().contains("silent"), "{e}");
    assert!(c.send(&b"y"[..]).await.is_err());
    drop(client);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_effort_and_tunnel_share_datagrams() {
    let (server, client, s, c) = connected("").await;
    let to = server.local_addr();
    // Small tunnel messages and pushes in the same breath: the driver
    // packs what is due for one host in one wake-up into compound
    // datagrams (and the receiver's acknowledgements ride with its own
    // pushes back).
    for round in 0..200u32 {
        for i in 0..5u32 {
            client
                .push(to, &Message::from_payload(format!("be-{round}-{i}")))
                .unwrap();
        }
        c.send(Bytes::from(format!("t-{round}"))).await.unwrap();
        let m = s.recv().await.unwrap().unwrap();
        assert_eq!(m, Bytes::from(format!("t-{round}")));
    }
    let mut popped = 0;
    while let Ok(m) = tokio::time::timeout(Duration::from_millis(300), server.pop()).await {
        assert!(m.payload.starts_with(b"be-"));
        assert_eq!(m.meta.from, Some(client.local_addr()));
        popped += 1;
    }
    let cs = client.stats();
    let ss = server.stats();
    eprintln!("client {cs:?}\nserver {ss:?}");
    assert_eq!(
        popped + ss.lost,
        1000,
        "every push delivered or counted lost"
    );
    assert!(cs.compound_sent > 0, "no datagram carried both kinds");
    assert_eq!(ss.compound_received, cs.compound_sent);
    assert_eq!(ss.dropped_malformed, 0);
}

#[tokio::test]
async fn a_compound_datagram_from_outside_is_split_and_decoded() {
    let server = Endpoint::bind("udp://127.0.0.1:0").unwrap();
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let batch = skiff_proto::wire::encode_datagram(
        42,
        u32::MAX,
        0,
        &[
            Message::from_payload(&b"a"[..]),
            Message::from_payload(&b"b"[..]),
        ],
    )
    .unwrap();
    // An association packet with a key nobody has: counted, not delivered.
    let mut assoc = b"SK\x01\x02\x04".to_vec();
    assoc.extend_from_slice(&(0x1234u64 | 1 << 63).to_le_bytes());
    assoc.extend_from_slice(&[0, 0, 0, 0]);
    let mut d = Vec::new();
    let mut e = skiff_proto::compound::Encoder::new(&mut d);
    assert!(e.push(&batch, 1472));
    assert!(e.push(&assoc, 1472));
    sock.send_to(&d, server.local_addr()).unwrap();
    sock.send_to(b"SK\x01\x03\x05junk", server.local_addr())
        .unwrap();
    let a = tokio::time::timeout(T, server.pop()).await.unwrap();
    let b = tokio::time::timeout(T, server.pop()).await.unwrap();
    assert_eq!((&a.payload[..], &b.payload[..]), (&b"a"[..], &b"b"[..]));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let st = server.stats();
    assert_eq!(st.compound_received, 1);
    assert_eq!(st.dropped_malformed, 1);
    assert_eq!(
        st.listener.unknown_key + st.listener.malformed,
        1,
        "{:?}",
        st.listener
    );
}

#[tokio::test]
async fn first_flood_is_bounded_and_counted() {
    let server = Endpoint::bind("udp://127.0.0.1:0?max_half_open=16&max_associations=64").unwrap();
    server.listen();
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let to: SocketAddr = server.local_addr();
    // Forged FIRSTs: distinct keys, never confirmed.
    for k in 1..=2000u64 {
        let p = skiff_proto::association::frame::Packet {
            key: k,
            first: Some(skiff_proto::association::frame::First {
                service: 0,
                mtu: 1472,
                max_message: 1 << 20,
            }),
            ..Default::default()
        };
        let mut buf = Vec::new();
        p.encode(&mut buf);
        sock.send_to(&buf, to).unwrap();
        if k % 200 == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let st = server.stats();
    eprintln!("{:?}", st.listener);
    assert!(st.listener.first_accepted <= 16, "{:?}", st.listener);
    assert!(st.listener.first_rejected_half_open > 0);
    assert_eq!(st.tunnels_open, 0);
    // A real client still cannot get in while the half-open set is full,
    // but the flood cost bounded memory; after the handshake timeout it can.
    let client = Endpoint::bind("udp://127.0.0.1:0").unwrap();
    let r = client.connect(to, Duration::from_millis(200)).await;
    assert!(r.is_err());
}
