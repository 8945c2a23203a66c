//! The router's memory budget: 100,000 subscriptions with realistic,
//! mostly distinct subjects (wildcards and types mixed) in under 50 MB.
//!
//! A counting global allocator measures the bytes the router holds (bytes
//! requested from the allocator; the allocator's own per-block overhead is
//! not included). This file holds a single test so that nothing else
//! allocates while it measures. Run with `--nocapture` to see the figures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use skiff_proto::router::{Router, Subject};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees carry over; the counters only observe.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc`'s contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is; `ptr` came from `alloc` with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `realloc`'s contract.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            let now = LIVE.fetch_add(new_size, Ordering::Relaxed) + new_size;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const N: u64 = 100_000;
const BUDGET: usize = 50 * 1024 * 1024;

/// The i-th subscription: pattern, type pattern, subscriber (1,000 clients).
fn sub(i: u64) -> (String, &'static str, u64) {
    let (pattern, kind) = match i % 20 {
        0..=9 => (format!("svc.{}.events.{}", i / 100, i % 100), "*"),
        10..=12 => (format!("svc.{}.*.{}", i / 100, i % 100), "ev"),
        13 | 14 => (format!("tenant.t{i}.orders.>"), "*"),
        15 | 16 => (format!("host.h{i}.cpu.load"), "metric"),
        17 | 18 => (format!("region.{}.host{i}.*", i % 20), ""),
        _ => (format!("*.{i}.status"), "*"),
    };
    (pattern, kind, i % 1000)
}

fn mib(b: usize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

#[test]
fn hundred_thousand_subscriptions_fit_in_50_mb() {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let mut r: Router<u64> = Router::new();
    let mut ids = Vec::with_capacity(N as usize);
    let ids_bytes = ids.capacity() * std::mem::size_of::<skiff_proto::router::SubId>();
    for i in 0..N {
        let (p, k, s) = sub(i);
        ids.push(r.subscribe(&p, k, s).unwrap());
    }
    let held = LIVE.load(Ordering::Relaxed) - base - ids_bytes;
    let peak = PEAK.load(Ordering::Relaxed) - base - ids_bytes;
    println!(
        "router: {N} subscriptions, {} trie nodes, {} strings: {:.1} MiB held \
         ({:.0} bytes/subscription), {:.1} MiB peak while building",
        r.node_count(),
        r.string_count(),
        mib(held),
        held as f64 / N as f64,
        mib(peak)
    );
    assert_eq!(r.len(), N as usize);
    assert!(held < BUDGET, "router holds {:.1} MiB", mib(held));
    assert!(peak < BUDGET, "router peaked at {:.1} MiB", mib(peak));

    // Still routes correctly at this size.
    let mut out = Vec::new();
    // i = 1203: `svc.12.events.3`, any type.
    r.matches(Subject::new("svc.12.events.3").unwrap(), None, &mut out);
    assert_eq!(out.len(), 1);
    // i = 1210: `svc.12.*.10`, type `ev` only.
    out.clear();
    r.matches(Subject::new("svc.12.events.10").unwrap(), None, &mut out);
    assert_eq!(out.len(), 0);
    r.matches(
        Subject::new("svc.12.events.10").unwrap(),
        Some("ev"),
        &mut out,
    );
    assert_eq!(out.len(), 1);

    // And gives it back: removing everything leaves only the slot table.
    for s in 0..1000 {
        r.remove_subscriber(s);
    }
    assert_eq!(r.node_count(), 0);
    assert_eq!(r.string_count(), 0);
    let left = LIVE.load(Ordering::Relaxed) - base - ids_bytes;
    println!("router: {:.1} MiB left after removing all", mib(left));
    drop(r);
    drop(ids);
}
