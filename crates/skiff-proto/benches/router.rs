//! Router and cluster micro-benchmarks.
//!
//! - `match/N`: route one message (`orders.eu.created`, three matching
//!   subscriptions) while N subscriptions that do not match are also held.
//!   The cost should stay flat from N = 10 to N = 100,000.
//! - `has_interest/N`: the same subject, the question a node asks before
//!   forwarding.
//! - `subject_new`: validating the subject, paid once per message.
//! - `pick/{wrr,keyed}/M`: choosing one of M cluster members.
//! - `cmsg_match/N`: as `match/N`, with N cMsg patterns of the same shapes
//!   (literal starts, `*`, `?`, `#`, ranges) that do not match and three
//!   that do; run beside `tokens_match/N` (the `match` set) for the
//!   comparison at 100,000 subscriptions.
//! - `cmsg_leading/N`: N cMsg patterns that start with a wildcard and end
//!   with a literal (`*x7`): the reverse (suffix) index skips them.
//! - `cmsg_inner/N`: N cMsg patterns with a wildcard at both ends and a
//!   literal inside (`*x7*`): the index by two bytes of a literal skips
//!   them.
//! - `cmsg_noliteral/N`: N cMsg patterns with no literal of two bytes
//!   (`*{i>7}*`, one range per pattern), against `run.42.rate` (a subject
//!   with digits): the index by shape runs `*#*` once and finds the
//!   ranges holding 2, 4 or 42 by their bounds.
//! - `cmsg_noliteral_mix/N`: N patterns of varied shapes with no literal
//!   to key by (`*{i>N}*`, `{i<N}`, `*{i=N}*`, `???`, `#`, `*.?`, `?#?`,
//!   `*{i>N & i<M}*`), the same subject; one in eight has a range bounded
//!   on both sides, found by an interval tree.
//! - `cmsg_ranges/FORM/N`: N patterns of one form with an integer range
//!   bounded on both sides, each a different range (K = 0..N), against
//!   `run.42.rate` (9 of them match): `two_sided` is `*{i>K & i<K+10}*`
//!   (no literal: the index by shape), `prefixed` is
//!   `run.{i>K & i<K+10}.rate` (behind a literal start), `disjunct` is
//!   `run.{i>K & i<K+10 | i=K+20}.rate` (the manual's example form),
//!   `suffixed` is `*{i>K & i<K+10}.rate` (before a literal end).
//!
//! Run: `cargo bench -p skiff-proto --bench router` (short measurement
//! times are set below; criterion's command-line flags override them).

// criterion's macros define public functions without doc comments.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use skiff_proto::router::{Clusters, Router, Subject, Syntax};

/// A realistic subscription that does not match `orders.eu.created`.
fn other(i: u64) -> (String, &'static str) {
    match i % 10 {
        0..=4 => (format!("svc.{}.events.{}", i / 100, i % 100), "*"),
        5 => (format!("svc.{}.*.{}", i / 100, i % 100), "ev"),
        6 => (format!("tenant.t{i}.orders.>"), "*"),
        7 => (format!("orders.r{i}.*"), "*"),
        8 => (format!("*.{i}.created"), ""),
        _ => (format!("orders.eu.created.v{i}"), "*"),
    }
}

fn router_with(n: u64) -> Router<u64> {
    let mut r = Router::new();
    for i in 0..n {
        let (p, k) = other(i);
        r.subscribe(&p, k, i % 1000).unwrap();
    }
    r.subscribe("orders.eu.created", "*", 1).unwrap();
    r.subscribe("orders.*.created", "*", 2).unwrap();
    r.subscribe("orders.>", "*", 3).unwrap();
    r
}

fn matching(c: &mut Criterion) {
    let subject = Subject::new("orders.eu.created").unwrap();
    let mut g = c.benchmark_group("match");
    for n in [10u64, 10_000, 100_000] {
        let r = router_with(n);
        let mut out = Vec::with_capacity(16);
        assert_eq!(r.matches(subject, None, &mut out), 3);
        g.bench_with_input(BenchmarkId::from_parameter(n), &r, |b, r| {
            b.iter(|| {
                out.clear();
                r.matches(black_box(subject), black_box(None), &mut out)
            })
        });
    }
    g.finish();
    let mut g = c.benchmark_group("has_interest");
    for n in [10u64, 100_000] {
        let r = router_with(n);
        g.bench_with_input(BenchmarkId::from_parameter(n), &r, |b, r| {
            b.iter(|| r.has_interest(black_box(subject)))
        });
    }
    g.finish();
    c.bench_function("subject_new", |b| {
        b.iter(|| Subject::new(black_box("orders.eu.created")).is_ok())
    });
}

/// A cMsg subscription that does not match `orders.eu.created`.
fn other_cmsg(i: u64) -> (String, &'static str) {
    match i % 10 {
        0..=3 => (format!("svc.{}.events.{}", i / 100, i % 100), "*"),
        4 => (format!("svc.{}.ev*.#", i / 100), "*"),
        5 => (format!("svc.{}.*.{}", i / 100, i % 100), "ev?"),
        6 => (format!("tenant.t{i}.orders.*"), "*"),
        7 => (format!("orders.r{i}.*"), "*"),
        8 => (format!("orders.eu.created.v{{i>{i}}}"), ""),
        _ => (format!("orders.e{i}?.created"), "*"),
    }
}

fn cmsg_router_with(n: u64) -> Router<u64> {
    let mut r = Router::new();
    for i in 0..n {
        let (p, k) = other_cmsg(i);
        r.subscribe_as(Syntax::Cmsg, &p, k, i % 1000).unwrap();
    }
    r.subscribe_as(Syntax::Cmsg, "orders.eu.created", "*", 1)
        .unwrap();
    r.subscribe_as(Syntax::Cmsg, "orders.?u.created", "*", 2)
        .unwrap();
    r.subscribe_as(Syntax::Cmsg, "orders.*", "*", 3).unwrap();
    r
}

fn cmsg_matching(c: &mut Criterion) {
    let subject = Subject::new("orders.eu.created").unwrap();
    let mut out = Vec::with_capacity(16);
    let mut g = c.benchmark_group("tokens_vs_cmsg");
    for n in [10u64, 100_000] {
        let t = router_with(n);
        assert_eq!(t.matches(subject, None, &mut out), 3);
        g.bench_with_input(BenchmarkId::new("tokens_match", n), &t, |b, r| {
            b.iter(|| {
                out.clear();
                r.matches(black_box(subject), black_box(None), &mut out)
            })
        });
        drop(t);
        let r = cmsg_router_with(n);
        out.clear();
        assert_eq!(r.matches(subject, None, &mut out), 3);
        g.bench_with_input(BenchmarkId::new("cmsg_match", n), &r, |b, r| {
            b.iter(|| {
                out.clear();
                r.matches(black_box(subject), black_box(None), &mut out)
            })
        });
    }
    g.finish();
    type Shape = fn(u64) -> String;
    let shapes: [(&str, Shape); 3] = [
        ("cmsg_leading", |i| format!("*x{i}")),
        ("cmsg_inner", |i| format!("*x{i}*")),
        ("cmsg_noliteral", |i| format!("*{{i>{i}}}*")),
    ];
    let digits = Subject::new("run.42.rate").unwrap();
    for (group, shape) in shapes {
        let subject = if group == "cmsg_noliteral" {
            digits
        } else {
            subject
        };
        let mut g = c.benchmark_group(group);
        let sizes: &[u64] = if group == "cmsg_noliteral" {
            &[100, 100_000]
        } else {
            &[100, 10_000]
        };
        for &n in sizes {
            let mut r = Router::new();
            for i in 0..n {
                let p = shape(i);
                r.subscribe_as(Syntax::Cmsg, &p, "*", i).unwrap();
            }
            g.bench_with_input(BenchmarkId::from_parameter(n), &r, |b, r| {
                b.iter(|| {
                    out.clear();
                    r.matches(black_box(subject), black_box(None), &mut out)
                })
            });
        }
        g.finish();
    }
}

/// A cMsg pattern with no literal to key by, of one of eight shapes.
fn no_literal(i: u64) -> String {
    match i % 8 {
        0 => format!("*{{i>{i}}}*"),
        1 => format!("{{i<{i}}}"),
        2 => format!("*{{i={i}}}*"),
        3 => "???".into(),
        4 => "#".into(),
        5 => "*.?".into(),
        6 => "?#?".into(),
        _ => format!("*{{i>{i} & i<{}}}*", i + 10),
    }
}

fn no_literal_matching(c: &mut Criterion) {
    let subject = Subject::new("run.42.rate").unwrap();
    let mut out = Vec::with_capacity(1024);
    let mut g = c.benchmark_group("cmsg_noliteral_mix");
    for n in [100u64, 100_000] {
        let mut r = Router::new();
        for i in 0..n {
            r.subscribe_as(Syntax::Cmsg, &no_literal(i), "*", i % 1000)
                .unwrap();
        }
        g.bench_with_input(BenchmarkId::from_parameter(n), &r, |b, r| {
            b.iter(|| {
                out.clear();
                r.matches(black_box(subject), black_box(None), &mut out)
            })
        });
    }
    g.finish();
}

fn range_matching(c: &mut Criterion) {
    let subject = Subject::new("run.42.rate").unwrap();
    let mut out = Vec::with_capacity(1024);
    type Form = fn(u64) -> String;
    let forms: [(&str, Form); 4] = [
        ("two_sided", |k| format!("*{{i>{k} & i<{}}}*", k + 10)),
        ("prefixed", |k| format!("run.{{i>{k} & i<{}}}.rate", k + 10)),
        ("disjunct", |k| {
            format!("run.{{i>{k} & i<{} | i={}}}.rate", k + 10, k + 20)
        }),
        ("suffixed", |k| format!("*{{i>{k} & i<{}}}.rate", k + 10)),
    ];
    let mut g = c.benchmark_group("cmsg_ranges");
    for (name, form) in forms {
        for n in [100u64, 100_000] {
            let mut r = Router::new();
            for k in 0..n {
                r.subscribe_as(Syntax::Cmsg, &form(k), "*", k).unwrap();
            }
            out.clear();
            let hits = r.matches(subject, None, &mut out);
            assert!((9..=13).contains(&hits), "{name}: {hits}");
            g.bench_with_input(BenchmarkId::new(name, n), &r, |b, r| {
                b.iter(|| {
                    out.clear();
                    r.matches(black_box(subject), black_box(None), &mut out)
                })
            });
        }
    }
    g.finish();
}

fn picking(c: &mut Criterion) {
    let mut g = c.benchmark_group("pick");
    for m in [5u32, 100] {
        let mut cl = Clusters::new();
        for i in 0..m {
            cl.join("db", i, 1 + i % 7);
        }
        g.bench_function(BenchmarkId::new("wrr", m), |b| {
            b.iter(|| cl.pick(black_box("db"), None))
        });
        let mut k = 0u64;
        g.bench_function(BenchmarkId::new("keyed", m), |b| {
            b.iter(|| {
                k += 1;
                cl.pick(black_box("db"), Some(&k.to_le_bytes()))
            })
        });
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = matching, cmsg_matching, no_literal_matching, range_matching, picking
}
criterion_main!(benches);
