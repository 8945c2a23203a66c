//! Loom models of the ring protocol over a heap region (`loom_region.rs`):
//! the same `ring.rs` code as the mapping runs, with loom's atomics.
//!
//! ```text
//! RUSTFLAGS="--cfg skiff_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p skiff --lib shm::loom --release
//! ```
//!
//! The cfg is `skiff_loom`, not the customary `loom`: under `--cfg loom`
//! tokio compiles without `tokio::net`, which the rest of the workspace
//! needs. A separate target directory keeps the loom build from evicting
//! the normal one.
//!
//! Data bytes are relaxed atomics in the model, so a missing
//! acquire/release pair shows up as a stale byte and a failed assertion.

use std::sync::Arc;

use skiff_proto::credits::Flow;

use super::layout::Layout;
use super::ring::{Ring, RingConsumer, RingProducer};
use super::Region;

fn ring(cap: u64, records: u64, flow: Flow) -> Arc<Ring> {
    let layout = Layout::new(cap, records, 2, flow).unwrap();
    let region = Region::anonymous(layout.total).unwrap();
    Arc::new(Ring::init(region, layout, 1))
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.max_branches = 100_000;
    b.check(f);
}

/// Writes `len` bytes of `val` at the reservation.
fn produce(p: &mut RingProducer, len: u64, val: u8) {
    let r = loop {
        match p.try_reserve(len) {
            Ok(r) => break r,
            Err(_) => loom::thread::yield_now(),
        }
    };
    for (off, n) in p.ring.ranges(r.start, r.len) {
        p.ring.region.write(off, &vec![val; n]);
    }
    p.commit(len).unwrap();
}

/// Credits: every segment arrives whole, in order, and the producer never
/// overwrites unconsumed bytes (the 8-byte ring holds two 4-byte
/// segments; the third must wait for the first to be consumed).
#[test]
fn credits_deliver_whole_segments_in_order() {
    model(|| {
        let r = ring(8, 4, Flow::Credits);
        let mut c = RingConsumer::attach(Arc::clone(&r)).unwrap();
        let mut p = RingProducer::new(Arc::clone(&r));
        let t = loom::thread::spawn(move || {
            for k in 1..=3u8 {
                produce(&mut p, 4, k);
            }
        });
        let mut want = 1u8;
        while want <= 3 {
            match c.try_next().unwrap() {
                Some(d) => {
                    let mut buf = Vec::new();
                    for (off, n) in c.ring.ranges(d.start, d.len) {
                        let mut part = vec![0; n];
                        c.ring.region.copy_out(off, &mut part);
                        buf.extend(part);
                    }
                    assert_eq!(buf, vec![want; 4], "segment {want}");
                    c.consume(d.len).unwrap();
                    want += 1;
                }
                None => loom::thread::yield_now(),
            }
        }
        t.join().unwrap();
    });
}

/// Credits with two consumers: a reservation over a segment succeeds only
/// once *both* consumers consumed it, so neither ever reads the next
/// segment's bytes in its place (a 2-byte ring; no spinning, so loom
/// explores every interleaving).
#[test]
fn credits_wait_for_the_slowest_consumer() {
    model(|| {
        let r = ring(2, 4, Flow::Credits);
        let mut a = RingConsumer::attach(Arc::clone(&r)).unwrap();
        let mut b = RingConsumer::attach(Arc::clone(&r)).unwrap();
        let mut p = RingProducer::new(Arc::clone(&r));
        produce(&mut p, 2, 1);
        let read = |c: &mut RingConsumer| {
            let d = c.try_next().unwrap().expect("published before spawn");
            let mut v = [0u8; 2];
            c.ring
                .region
                .copy_out(c.ring.ranges(d.start, d.len)[0].0, &mut v);
            c.consume(2).unwrap();
            v
        };
        let ta = loom::thread::spawn(move || read(&mut a));
        let tb = loom::thread::spawn(move || read(&mut b));
        if let Ok(res) = p.try_reserve(2) {
            for (off, n) in p.ring.ranges(res.start, res.len) {
                p.ring.region.write(off, &vec![2; n]);
            }
            p.commit(2).unwrap();
        }
        assert_eq!(ta.join().unwrap(), [1, 1]);
        assert_eq!(tb.join().unwrap(), [1, 1]);
    });
}

/// Overwrite: the producer never waits; whatever the reader accepts as
/// intact (sequence lock unbroken after the read) is exactly what was
/// written for that segment (a 2-byte ring lapped by 2-byte segments).
#[test]
fn overwrite_seqlock_never_accepts_torn_data() {
    model(|| {
        let r = ring(2, 2, Flow::Overwrite);
        let mut c = RingConsumer::attach(Arc::clone(&r)).unwrap();
        let mut p = RingProducer::new(Arc::clone(&r));
        let t = loom::thread::spawn(move || {
            for k in 1..=3u8 {
                produce(&mut p, 2, k);
            }
        });
        for _ in 0..3 {
            if let Some(d) = c.try_next().unwrap() {
                let mut v = [0u8; 2];
                c.ring
                    .region
                    .copy_out(c.ring.ranges(d.start, d.len)[0].0, &mut v);
                if c.intact(d.seg) {
                    assert_eq!(v, [d.seg as u8 + 1; 2], "segment {}", d.seg);
                }
            } else {
                loom::thread::yield_now();
            }
        }
        t.join().unwrap();
    });
}
