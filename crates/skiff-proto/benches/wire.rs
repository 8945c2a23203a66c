//! Inner-loop costs of the wire format and the batcher, per message:
//!
//! - `push/{8,64,512}B`: `Batcher::push` of one message into an open batch
//!   (encoding included; sealing happens inside, draining is not timed).
//! - `decode/1472B_of_8B`: `wire::decode_into` of a full 1472-byte datagram
//!   of 8-byte messages with one shared subject, reported per message.
//! - `push_poll/{1,64}_dests`: push then `poll_transmit` until empty, as a
//!   driver does, over one or 64 destinations.
//!
//! Run: `cargo bench -p skiff-proto --bench wire` (add `-- --quick` for a
//! short run). Criterion reports time per element; every group's element is
//! one message.
#![allow(missing_docs)]

use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use skiff_proto::wire::{self, HEADER_LEN};
use skiff_proto::{Batcher, BatcherConfig, Dest, Message};

const MTU_DATAGRAM: usize = 1472;

fn batcher(timeout: Duration) -> Batcher {
    Batcher::new(BatcherConfig {
        qthresh: MTU_DATAGRAM,
        timeout,
        max_datagram: MTU_DATAGRAM,
        max_destinations: 1 << 16,
        source: 0x5eed,
    })
}

fn dest(i: u32) -> Dest {
    Dest {
        addr: SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 4747)),
        endpoint: i,
    }
}

fn push(c: &mut Criterion) {
    let mut g = c.benchmark_group("push");
    g.throughput(Throughput::Elements(1));
    for size in [8usize, 64, 512] {
        let msg = Message::new("daq.hallb.rate", vec![0xa5u8; size]);
        g.bench_function(format!("{size}B"), |b| {
            // Only the pushes are timed; sealed batches are drained every
            // 1024 pushes outside the timer so memory stays flat.
            b.iter_custom(|iters| {
                let mut bt = batcher(Duration::from_secs(1));
                let now = Instant::now();
                let d = dest(1);
                let mut buf = Vec::with_capacity(MTU_DATAGRAM);
                let mut total = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(1024);
                    let start = Instant::now();
                    for _ in 0..n {
                        bt.push(now, d, black_box(&msg)).unwrap();
                    }
                    total += start.elapsed();
                    while let Some(t) = bt.poll_transmit(&mut buf, 1) {
                        black_box(t);
                    }
                    left -= n;
                }
                total
            });
        });
    }
    g.finish();
}

/// A full datagram of 8-byte messages sharing one subject.
fn full_datagram() -> (Bytes, usize) {
    let first = Message::new("daq.hallb.rate", [1u8; 8].to_vec());
    let rest = Message::new("daq.hallb.rate", [2u8; 8].to_vec());
    let mut msgs = vec![first];
    let mut len = HEADER_LEN + wire::encoded_len(&msgs[0], false);
    while len + wire::encoded_len(&rest, true) <= MTU_DATAGRAM {
        len += wire::encoded_len(&rest, true);
        msgs.push(rest.clone());
    }
    let enc = wire::encode_datagram(1, 2, 0, &msgs).unwrap();
    assert_eq!(enc.len(), len);
    (Bytes::from(enc), msgs.len())
}

fn decode(c: &mut Criterion) {
    let (buf, n) = full_datagram();
    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Elements(n as u64));
    let mut out = Vec::with_capacity(n);
    g.bench_function(format!("{}B_of_8B", buf.len()), |b| {
        b.iter(|| {
            out.clear();
            let h = wire::decode_into(black_box(&buf), &mut out).unwrap();
            black_box(h);
        });
    });
    g.finish();
}

fn push_poll(c: &mut Criterion) {
    const BATCH: usize = 4096;
    let mut g = c.benchmark_group("push_poll");
    g.throughput(Throughput::Elements(BATCH as u64));
    let msg = Message::from_payload(vec![0x5au8; 8]);
    for dests in [1u32, 64] {
        g.bench_function(format!("{dests}_dests"), |b| {
            // One batcher kept across iterations (its pools warm, as in a
            // running driver); each iteration pushes BATCH messages, natural
            // batching (timeout 0), the driver polling every 64 pushes.
            let mut bt = batcher(Duration::ZERO);
            let mut buf = Vec::with_capacity(MTU_DATAGRAM * 8);
            let t0 = Instant::now();
            let mut tick = 0u64;
            b.iter(|| {
                for i in 0..BATCH {
                    let now = t0 + Duration::from_micros(tick);
                    bt.push(now, dest(i as u32 % dests), &msg).unwrap();
                    if i % 64 == 63 {
                        tick += 1;
                        bt.handle_timeout(now);
                        while let Some(t) = bt.poll_transmit(&mut buf, 8) {
                            black_box((t, &buf));
                        }
                    }
                }
                bt.flush();
                while let Some(t) = bt.poll_transmit(&mut buf, 8) {
                    black_box((t, &buf));
                }
            });
        });
    }
    g.finish();
}

criterion_group!(benches, push, decode, push_poll);
criterion_main!(benches);
