//! The `Batcher`'s flush rules (threshold, timeout, size cap, natural
//! batching, explicit flush), per-destination order, its limits, the
//! deadline index at 100,000 destinations and multi-segment transmits. Time
//! is simulated: every `Instant` is an offset from one taken at the start.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use skiff_proto::batcher::BatcherStats;
use skiff_proto::wire::{self, HEADER_LEN};
use skiff_proto::{Batcher, BatcherConfig, Dest, Error, LimitError, Message, Transmit, UsageError};

fn dest(i: u32) -> Dest {
    Dest {
        addr: SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 4747)),
        endpoint: i,
    }
}

fn config(qthresh: usize, timeout: Duration, max_datagram: usize) -> BatcherConfig {
    BatcherConfig {
        qthresh,
        timeout,
        max_datagram,
        max_destinations: 1 << 20,
        source: 0xfeed,
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Every transmit waiting now, each split into its datagrams and decoded.
fn drain(b: &mut Batcher, max_segments: usize) -> Vec<(Transmit, Vec<Vec<Message>>)> {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while let Some(t) = b.poll_transmit(&mut buf, max_segments) {
        assert_eq!(t.size, buf.len());
        let segs: Vec<&[u8]> = match t.segment_size {
            None => vec![&buf[..]],
            Some(seg) => buf.chunks(seg).collect(),
        };
        assert_eq!(segs.len(), t.segments);
        let mut decoded = Vec::new();
        for seg in segs {
            assert!(seg.len() <= b.config().max_datagram, "{} bytes", seg.len());
            let (h, msgs) = wire::decode(&Bytes::copy_from_slice(seg))
                .unwrap_or_else(|e| panic!("{e} in a transmit to {}", t.dest));
            assert_eq!(h.endpoint, t.dest.endpoint);
            assert!(msgs.iter().all(|m| m.meta.source == h.source));
            decoded.push(msgs);
        }
        assert_eq!(decoded.iter().map(Vec::len).sum::<usize>(), t.messages);
        out.push((t, decoded));
    }
    out
}

/// The payloads of every message in `transmits`, in order.
fn payloads(transmits: &[(Transmit, Vec<Vec<Message>>)]) -> Vec<Bytes> {
    transmits
        .iter()
        .flat_map(|(_, d)| d.iter().flatten().map(|m| m.payload.clone()))
        .collect()
}

fn msg(i: usize, len: usize) -> Message {
    let mut p = format!("{i:08}").into_bytes();
    p.resize(len, b'.');
    Message::new("daq.rate", p)
}

// ---------------------------------------------------------------- flush rules

#[test]
fn seals_at_qthresh() {
    let t0 = Instant::now();
    let mut b = Batcher::new(config(200, ms(1000), 1472));
    // Each message after the first is 1 (flags) + 1 (length) + 8 bytes: the
    // subject is sent once.
    let first = HEADER_LEN + wire::encoded_len(&msg(0, 8), false);
    let per = wire::encoded_len(&msg(0, 8), true);
    let n = 1 + (200 - first).div_ceil(per);
    for i in 0..n - 1 {
        b.push(t0, dest(1), &msg(i, 8)).unwrap();
        assert!(!b.has_transmit(), "sealed early at message {i}");
    }
    b.push(t0, dest(1), &msg(n - 1, 8)).unwrap();
    assert!(b.has_transmit(), "not sealed at qthresh");
    assert_eq!(b.stats().sealed_thresh, 1);
    // The sealed batch's deadline no longer counts.
    assert_eq!(b.poll_timeout(), None);
    let out = drain(&mut b, 1);
    assert_eq!(out.len(), 1);
    let (t, _) = &out[0];
    assert_eq!(t.messages, n);
    assert!(t.size >= 200 && t.size - per < 200, "{}", t.size);
    assert_eq!(b.queued(), 0);
}

#[test]
fn seals_at_timeout() {
    let t0 = Instant::now();
    let mut b = Batcher::new(config(1472, ms(10), 1472));
    assert_eq!(b.poll_timeout(), None);
    b.push(t0, dest(1), &msg(0, 8)).unwrap();
    assert_eq!(b.poll_timeout(), Some(t0 + ms(10)));
    // A later message joins the open batch; the deadline is the oldest's.
    b.push(t0 + ms(5), dest(1), &msg(1, 8)).unwrap();
    assert_eq!(b.poll_timeout(), Some(t0 + ms(10)));
    // Another destination's batch has its own, later deadline.
    b.push(t0 + ms(7), dest(2), &msg(2, 8)).unwrap();
    assert_eq!(b.poll_timeout(), Some(t0 + ms(10)));

    b.handle_timeout(t0 + ms(9));
    assert!(!b.has_transmit(), "sealed before the deadline");
    assert!(drain(&mut b, 1).is_empty());

    b.handle_timeout(t0 + ms(10));
    let out = drain(&mut b, 1);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0.dest, dest(1));
    assert_eq!(payloads(&out), [msg(0, 8).payload, msg(1, 8).payload]);
    assert_eq!(b.poll_timeout(), Some(t0 + ms(17)));
    assert_eq!(b.stats().sealed_timeout, 1);

    // A push after the seal opens a new batch with a new deadline.
    b.push(t0 + ms(12), dest(1), &msg(3, 8)).unwrap();
    assert_eq!(b.poll_timeout(), Some(t0 + ms(17)));
    b.handle_timeout(t0 + ms(20));
    let out = drain(&mut b, 1);
    assert_eq!(out.len(), 1, "only dest 2 is due at 20 ms");
    assert_eq!(out[0].0.dest, dest(2));
    assert_eq!(b.poll_timeout(), Some(t0 + ms(22)));
    b.handle_timeout(t0 + ms(60));
    assert_eq!(payloads(&drain(&mut b, 1)), [msg(3, 8).payload]);
    assert_eq!(b.poll_timeout(), None);
    assert_eq!(b.stats().sealed_timeout, 3);
}

#[test]
fn seals_when_the_next_message_would_not_fit() {
    let t0 = Instant::now();
    let max = 300;
    let mut b = Batcher::new(config(max, ms(1000), max));
    // Subject-less messages of 1 + 1 + 100 bytes: two fit (26 + 204 = 230),
    // a third would make 332.
    let m = |i| Message::from_payload(vec![i as u8; 100]);
    b.push(t0, dest(1), &m(0)).unwrap();
    b.push(t0, dest(1), &m(1)).unwrap();
    assert!(!b.has_transmit());
    b.push(t0, dest(1), &m(2)).unwrap();
    assert!(b.has_transmit());
    assert_eq!(
        b.stats(),
        BatcherStats {
            messages: 3,
            bytes: 306,
            batches: 1,
            sealed_full: 1,
            ..Default::default()
        }
    );
    let out = drain(&mut b, 1);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0.messages, 2);
    assert_eq!(out[0].0.size, 230);
    // The third message opened a new batch, numbered on.
    b.flush();
    let out = drain(&mut b, 1);
    let got = &out[0].1[0];
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, m(2).payload);
    assert_eq!(got[0].meta.seq, 2);
}

#[test]
fn a_message_of_exactly_max_datagram_fits() {
    let t0 = Instant::now();
    let mut b = Batcher::new(config(1472, ms(1000), 1472));
    // 1 (flags) + 2 (length) + payload = 1472 - 26.
    let m = Message::from_payload(vec![7; 1472 - HEADER_LEN - 3]);
    b.push(t0, dest(1), &m).unwrap();
    let out = drain(&mut b, 1);
    assert_eq!(out[0].0.size, 1472);
    assert_eq!(b.stats().sealed_thresh, 1);
}

#[test]
fn natural_batching_sends_what_queued_while_busy() {
    let t0 = Instant::now();
    let mut b = Batcher::new(config(1472, Duration::ZERO, 1472));
    // Due at once.
    b.push(t0, dest(1), &msg(0, 8)).unwrap();
    assert_eq!(b.poll_timeout(), Some(t0));
    // But the driver is busy sending; more arrive before it polls.
    for i in 1..20 {
        b.push(t0 + Duration::from_micros(i as u64), dest(1), &msg(i, 8))
            .unwrap();
    }
    assert_eq!(b.poll_timeout(), Some(t0));
    // The driver is idle again: everything leaves in one datagram.
    b.handle_timeout(t0 + Duration::from_micros(20));
    let out = drain(&mut b, 1);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0.messages, 20);
    let expect: Vec<Bytes> = (0..20).map(|i| msg(i, 8).payload).collect();
    assert_eq!(payloads(&out), expect);
    assert_eq!(b.poll_timeout(), None);
    // A push to an idle batcher is due the moment it is pushed.
    b.push(t0 + ms(5), dest(1), &msg(20, 8)).unwrap();
    assert_eq!(b.poll_timeout(), Some(t0 + ms(5)));
    b.handle_timeout(t0 + ms(5));
    assert_eq!(drain(&mut b, 1)[0].0.messages, 1);
}

#[test]
fn explicit_flush_seals_everything() {
    let t0 = Instant::now();
    let mut b = Batcher::new(config(1472, Duration::from_secs(3600), 1472));
    for d in 0..3 {
        for i in 0..=d as usize {
            b.push(t0, dest(d), &msg(i, 8)).unwrap();
        }
    }
    assert!(!b.has_transmit());
    assert_eq!(b.queued(), 6);
    b.flush();
    assert_eq!(b.poll_timeout(), None);
    assert_eq!(b.stats().sealed_flush, 3);
    let out = drain(&mut b, 1);
    let mut by_dest: Vec<(Dest, usize)> = out.iter().map(|(t, _)| (t.dest, t.messages)).collect();
    by_dest.sort();
    assert_eq!(by_dest, [(dest(0), 1), (dest(1), 2), (dest(2), 3)]);
    assert_eq!(b.queued(), 0);
    // Flushing with nothing open is a no-op.
    b.flush();
    assert!(!b.has_transmit());
    assert_eq!(b.stats().batches, 3);
}

#[test]
fn poll_transmit_with_nothing_sealed_is_none() {
    let mut b = Batcher::new(BatcherConfig::default());
    let mut buf = vec![1, 2, 3];
    assert_eq!(b.poll_transmit(&mut buf, 8), None);
    b.push(Instant::now(), dest(0), &msg(0, 8)).unwrap();
    assert_eq!(b.poll_transmit(&mut buf, 8), None, "open, not sealed");
}

// ---------------------------------------------------------------- order

#[test]
fn per_destination_order_is_push_order() {
    let t0 = Instant::now();
    let mut rng = StdRng::seed_from_u64(7);
    let mut b = Batcher::new(config(300, ms(3), 600));
    let mut pushed: BTreeMap<Dest, Vec<Bytes>> = BTreeMap::new();
    let mut got: BTreeMap<Dest, Vec<Message>> = BTreeMap::new();
    let mut now = t0;
    for i in 0..3000 {
        let d = dest(rng.random_range(0..5));
        let m = msg(i, rng.random_range(0..120));
        b.push(now, d, &m).unwrap();
        pushed.entry(d).or_default().push(m.payload);
        if rng.random_ratio(1, 10) {
            now += Duration::from_micros(rng.random_range(0..2000));
            b.handle_timeout(now);
        }
        if rng.random_ratio(1, 25) {
            for (t, d) in drain(&mut b, rng.random_range(1..5)) {
                got.entry(t.dest)
                    .or_default()
                    .extend(d.into_iter().flatten());
            }
        }
    }
    b.flush();
    for (t, d) in drain(&mut b, 3) {
        got.entry(t.dest)
            .or_default()
            .extend(d.into_iter().flatten());
    }
    assert_eq!(pushed.len(), 5);
    for (d, sent) in &pushed {
        let recv = &got[d];
        let seqs: Vec<u64> = recv.iter().map(|m| m.meta.seq).collect();
        let expect: Vec<u64> = (0..sent.len() as u64).collect();
        assert_eq!(seqs, expect, "sequence numbers to {d}");
        let p: Vec<Bytes> = recv.iter().map(|m| m.payload.clone()).collect();
        assert_eq!(&p, sent, "payloads to {d}");
        // One stream per destination: one source id on all its datagrams.
        assert!(recv.iter().all(|m| m.meta.source == recv[0].meta.source));
    }
}

// ---------------------------------------------------------------- limits

#[test]
fn too_large_message_names_the_limit() {
    let t0 = Instant::now();
    let mut b = Batcher::new(config(1472, ms(1), 1472));
    let m = Message::from_payload(vec![0; 2000]);
    let err = b.push(t0, dest(1), &m).unwrap_err();
    assert_eq!(
        err,
        Error::Usage(UsageError::TooLarge {
            needed: 1 + 2 + 2000,
            limit: 1472 - HEADER_LEN,
            max_datagram: 1472,
            header: HEADER_LEN,
        })
    );
    let s = err.to_string();
    assert!(s.contains("1446") && s.contains("max_datagram=1472"), "{s}");
    // Nothing was queued.
    assert_eq!(b.queued(), 0);
    assert_eq!(b.poll_timeout(), None);
    // One byte less fits.
    let fits = Message::from_payload(vec![0; 1472 - HEADER_LEN - 3]);
    b.push(t0, dest(1), &fits).unwrap();
}

#[test]
fn message_over_a_wire_limit_is_refused_at_push() {
    let mut b = Batcher::new(BatcherConfig::default());
    let m = Message::new("s".repeat(wire::MAX_SUBJECT + 1), "");
    assert_eq!(
        b.push(Instant::now(), dest(1), &m).unwrap_err(),
        Error::Usage(UsageError::FieldTooLong {
            what: "subject",
            len: wire::MAX_SUBJECT + 1,
            max: wire::MAX_SUBJECT,
        })
    );
}

#[test]
fn max_destinations_is_enforced() {
    let t0 = Instant::now();
    let mut b = Batcher::new(BatcherConfig {
        max_destinations: 3,
        ..BatcherConfig::default()
    });
    for d in 0..3 {
        b.push(t0, dest(d), &msg(0, 8)).unwrap();
    }
    let err = b.push(t0, dest(3), &msg(0, 8)).unwrap_err();
    assert_eq!(err, Error::Limit(LimitError::Destinations { max: 3 }));
    assert!(err.to_string().contains("max_destinations"), "{err}");
    assert_eq!(b.destinations(), 3);
    // Known destinations still take messages.
    b.push(t0, dest(0), &msg(1, 8)).unwrap();
    assert_eq!(b.queued(), 4);
}

// ---------------------------------------------------------------- the deadline index

/// One message to each of 100,000 destinations at increasing times: the
/// earliest deadline is always the one reported, and stepping time releases
/// exactly the batches that are due, in deadline order. With a heap this is
/// O(n log n); a linear scan per step would make it quadratic.
#[test]
fn deadline_index_at_100k_destinations() {
    const N: u32 = 100_000;
    let t0 = Instant::now();
    let timeout = ms(50);
    let mut b = Batcher::new(config(1472, timeout, 1472));
    let at = |i: u32| t0 + Duration::from_micros(u64::from(i) * 10);
    let dest = |i: u32| Dest {
        addr: SocketAddr::from((Ipv4Addr::from(0x0a00_0000 + i), 4747)),
        endpoint: 1,
    };
    for i in 0..N {
        b.push(
            at(i),
            dest(i),
            &Message::from_payload(i.to_le_bytes().to_vec()),
        )
        .unwrap();
    }
    assert_eq!(b.destinations(), N as usize);
    assert_eq!(b.queued(), N as usize);
    assert_eq!(b.poll_timeout(), Some(at(0) + timeout));

    // A second message to every tenth destination joins its open batch and
    // must not move its deadline.
    for i in (0..N).step_by(10) {
        b.push(
            at(N),
            dest(i),
            &Message::from_payload(i.to_le_bytes().to_vec()),
        )
        .unwrap();
    }
    assert_eq!(b.poll_timeout(), Some(at(0) + timeout));

    // Step time 7 ms at a time (700 destinations become due per step).
    let mut next = 0u32;
    let mut buf = Vec::new();
    let mut now = t0;
    while next < N {
        now += ms(7);
        b.handle_timeout(now);
        while let Some(t) = b.poll_transmit(&mut buf, 1) {
            assert!(next < N, "more transmits than destinations");
            assert_eq!(t.dest, dest(next), "out of deadline order");
            assert!(at(next) + timeout <= now, "{next} released early");
            let (_, msgs) = wire::decode(&Bytes::copy_from_slice(&buf)).unwrap();
            // (Every tenth got a second message; no is_multiple_of: MSRV 1.80.)
            assert_eq!(msgs.len(), if next / 10 * 10 == next { 2 } else { 1 });
            assert_eq!(msgs[0].payload, next.to_le_bytes()[..]);
            next += 1;
        }
        // Everything still open is not due yet, and the next deadline is
        // the earliest of them.
        if next < N {
            assert!(at(next) + timeout > now, "{next} due but not released");
            assert_eq!(b.poll_timeout(), Some(at(next) + timeout));
        }
    }
    assert_eq!(b.poll_timeout(), None);
    assert_eq!(b.queued(), 0);
    assert_eq!(b.stats().sealed_timeout, u64::from(N));
}

/// Batches sealed by threshold or flush leave stale entries in the deadline
/// index; they are skipped, never reported or fired.
#[test]
fn stale_deadlines_are_skipped() {
    let t0 = Instant::now();
    let mut b = Batcher::new(config(100, ms(10), 1472));
    b.push(t0, dest(1), &Message::from_payload(vec![0; 90]))
        .unwrap();
    assert!(b.has_transmit(), "sealed by qthresh");
    b.push(t0 + ms(3), dest(2), &msg(0, 8)).unwrap();
    assert_eq!(b.poll_timeout(), Some(t0 + ms(13)));
    b.push(t0 + ms(4), dest(1), &msg(1, 8)).unwrap();
    assert_eq!(b.poll_timeout(), Some(t0 + ms(13)));
    b.handle_timeout(t0 + ms(13));
    let out = drain(&mut b, 1);
    assert_eq!(out.len(), 2, "dest 1's first batch and dest 2's");
    assert_eq!(b.poll_timeout(), Some(t0 + ms(14)));
    b.handle_timeout(t0 + ms(14));
    assert_eq!(drain(&mut b, 1).len(), 1);
    assert_eq!(b.stats().sealed_timeout, 2);
    assert_eq!(b.stats().sealed_thresh, 1);
}

// ---------------------------------------------------------------- segments

#[test]
fn multi_segment_transmits_have_equal_segments_but_the_last() {
    let t0 = Instant::now();
    let mut b = Batcher::new(config(200, ms(1000), 1472));
    let mut rng = StdRng::seed_from_u64(11);
    let mut sent = Vec::new();
    for i in 0..500 {
        let m = msg(i, rng.random_range(8..60));
        b.push(t0, dest(1), &m).unwrap();
        b.push(t0, dest(2), &msg(i, 8)).unwrap();
        sent.push(m.payload);
    }
    b.flush();
    let batches = b.stats().batches as usize;
    let out = drain(&mut b, 8);
    let ones: Vec<_> = out.iter().filter(|(t, _)| t.dest == dest(1)).collect();
    assert!(ones.len() > 1);
    for (t, _) in &ones[..ones.len() - 1] {
        assert_eq!(t.segments, 8, "{t:?}");
    }
    for (t, decoded) in &ones {
        assert_eq!(decoded.len(), t.segments);
        if let Some(seg) = t.segment_size {
            let last = t.size - seg * (t.segments - 1);
            assert!(last >= 1 && last <= seg, "{t:?}");
        }
    }
    let got: Vec<Bytes> = ones
        .iter()
        .flat_map(|(_, d)| d.iter().flatten().map(|m| m.payload.clone()))
        .collect();
    assert_eq!(got, sent);
    // Every sealed batch left as exactly one segment.
    let segments: usize = out.iter().map(|(t, _)| t.segments).sum();
    assert_eq!(segments, batches);
}

#[test]
fn one_segment_transmits_have_no_segment_size() {
    let t0 = Instant::now();
    let mut b = Batcher::new(config(100, ms(1000), 1472));
    for i in 0..50 {
        b.push(t0, dest(1), &msg(i, 40)).unwrap();
    }
    let out = drain(&mut b, 1);
    assert!(out.len() > 1);
    assert!(out
        .iter()
        .all(|(t, _)| t.segment_size.is_none() && t.segments == 1));
}

// ---------------------------------------------------------------- regressions

/// A message with the empty subject between two with the same subject: the
/// third must spell its subject out (or the receiver, whose "previous
/// subject" is the empty one, rejects the whole datagram).
#[test]
fn regression_empty_subject_between_equal_subjects() {
    let t0 = Instant::now();
    let mut b = Batcher::new(config(1472, ms(10), 1472));
    b.push(t0, dest(1), &Message::new("a.b", "1")).unwrap();
    b.push(t0, dest(1), &Message::from_payload("2")).unwrap();
    b.push(t0, dest(1), &Message::new("a.b", "3")).unwrap();
    b.flush();
    let out = drain(&mut b, 1);
    let subjects: Vec<String> = out[0].1[0].iter().map(|m| m.subject.to_string()).collect();
    assert_eq!(subjects, ["a.b", "", "a.b"]);
}

/// The same after a seal: the new batch starts with an empty subject, and
/// the stale subject position from the previous batch must not be compared
/// against the new batch's bytes.
#[test]
fn regression_stale_subject_after_seal() {
    let t0 = Instant::now();
    let mut b = Batcher::new(config(1472, ms(10), 1472));
    // Header (26) + flags (1) + subject length (1): "abc" sits at 28..31.
    b.push(t0, dest(1), &Message::new("abc", "x")).unwrap();
    b.flush();
    // In the new batch, the payload "abc" lands at 28..31.
    b.push(t0, dest(1), &Message::from_payload("abc")).unwrap();
    b.push(t0, dest(1), &Message::new("abc", "y")).unwrap();
    b.flush();
    let out = drain(&mut b, 1);
    let second = &out[1].1[0];
    assert_eq!(&*second[1].subject, "abc");
    assert_eq!(second[1].payload, "y");
}

/// A message that fits only with its subject repeated must not produce an
/// oversize datagram when it ends up first in a new batch.
#[test]
fn regression_repeat_sized_message_never_exceeds_max_datagram() {
    let t0 = Instant::now();
    let max = 1472;
    let mut b = Batcher::new(config(max, ms(10), max));
    let subject = "s".repeat(100);
    b.push(t0, dest(1), &Message::new(subject.as_str(), "first"))
        .unwrap();
    // Repeated, this message is exactly max - header; spelled out, 101
    // bytes more.
    let big = Message::new(subject.as_str(), vec![0; max - HEADER_LEN - 3]);
    assert_eq!(HEADER_LEN + wire::encoded_len(&big, true), max);
    match b.push(t0, dest(1), &big) {
        Ok(()) => {
            b.flush();
            // drain() asserts every datagram is within max_datagram.
            assert_eq!(payloads(&drain(&mut b, 1)).len(), 2);
        }
        Err(e) => assert!(
            matches!(e, Error::Usage(UsageError::TooLarge { .. })),
            "{e}"
        ),
    }
}

/// One sender pushes to a receiver's own endpoint id and to `Dest::ANY` at
/// the same address (or to a multicast group and to the receiver's unicast
/// address). Those are two destinations, so two sequences each numbered
/// from zero; a receiver accepts both (its id or ANY, as `skiff::Queue`
/// does) and tracks loss by the header's source. The streams must be
/// distinguishable there, or the second stream's messages are dropped as
/// duplicates of the first's.
#[test]
fn regression_two_streams_into_one_receiver_are_both_delivered() {
    use skiff_proto::{LossDetector, Verdict};
    let t0 = Instant::now();
    let mut b = Batcher::new(config(1472, ms(10), 1472));
    let addr = SocketAddr::from(([10, 0, 0, 9], 4747));
    let mine = Dest { addr, endpoint: 5 };
    for i in 0..3 {
        b.push(t0, mine, &msg(i, 8)).unwrap();
        b.push(t0, Dest::any(addr), &msg(100 + i, 8)).unwrap();
    }
    b.flush();
    // The receiver with endpoint id 5 at `addr`.
    let mut loss = LossDetector::new(16);
    let mut delivered = Vec::new();
    let mut buf = Vec::new();
    while let Some(t) = b.poll_transmit(&mut buf, 1) {
        let (h, msgs) = wire::decode(&Bytes::copy_from_slice(&buf)).unwrap();
        assert!(t.dest.addr == addr && h.endpoint == t.dest.endpoint);
        for m in msgs {
            if loss.check(h.source, m.meta.seq, std::time::Instant::now) == Verdict::Deliver {
                delivered.push(m.payload);
            }
        }
    }
    delivered.sort();
    let mut expect: Vec<Bytes> = [0, 1, 2, 100, 101, 102].map(|i| msg(i, 8).payload).into();
    expect.sort();
    assert_eq!(delivered, expect, "{:?}", loss.stats());
}

/// `push_alone` makes the datagram `push` + `flush` + `poll_transmit`
/// would make, numbered in the same stream, and declines while anything
/// is queued.
#[test]
fn push_alone_equals_push_flush_poll_and_keeps_the_numbering() {
    let now = Instant::now();
    let cfg = config(1472, Duration::ZERO, 1472);
    let (mut a, mut b) = (Batcher::new(cfg.clone()), Batcher::new(cfg));
    let msg = |i: u8| Message::new("a.b", Bytes::from(vec![i; 8]));
    let (mut buf_a, mut buf_b) = (Vec::new(), Vec::new());
    for i in 0..3u8 {
        let t = a
            .push_alone(dest(1), &msg(i), &mut buf_a)
            .unwrap()
            .expect("nothing queued");
        b.push(now, dest(1), &msg(i)).unwrap();
        b.flush();
        let u = b.poll_transmit(&mut buf_b, 1).unwrap();
        assert_eq!((t, &buf_a), (u, &buf_b), "message {i}");
        assert_eq!(a.queued(), 0);
    }
    assert_eq!(a.stats(), b.stats());
    // Something queued: it must leave first.
    a.push(now, dest(2), &msg(9)).unwrap();
    assert_eq!(a.push_alone(dest(1), &msg(3), &mut buf_a).unwrap(), None);
    assert_eq!(a.queued(), 1);
    a.flush();
    let sent = drain(&mut a, 1);
    assert_eq!(sent.len(), 1);
    // The stream to dest(1) goes on at 3, through the normal path too.
    a.push(now, dest(1), &msg(3)).unwrap();
    a.flush();
    let sent = drain(&mut a, 1);
    assert_eq!(sent[0].1[0][0].meta.seq, 3);
    // Too large: the same error as push, whether the payload alone is too
    // large or only the payload with the subject, and the stream is not
    // advanced by a refused message.
    let big = Message::from_payload(vec![0u8; 2000]);
    let over = Message::new("a".repeat(100), Bytes::from(vec![0u8; 1472 - 26 - 60]));
    for m in [&big, &over] {
        let alone = a.push_alone(dest(1), m, &mut buf_a).unwrap_err();
        let pushed = b.push(now, dest(1), m).unwrap_err();
        assert!(matches!(alone, Error::Usage(UsageError::TooLarge { .. })));
        assert_eq!(alone.to_string(), pushed.to_string());
    }
    let t = a.push_alone(dest(1), &msg(4), &mut buf_a).unwrap();
    assert!(t.is_some());
    assert_eq!(wire::decode(&Bytes::from(buf_a)).unwrap().1[0].meta.seq, 4);
}
