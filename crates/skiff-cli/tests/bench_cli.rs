//! `skiff bench` as a user runs it: short runs of the skiff-only
//! workloads, their `--json` contract, and the comparison features that
//! live in skiff-bench now refused with clap's usual error.

use std::process::{Command, Output};

fn skiff(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_skiff"))
        .args(args)
        .output()
        .expect("run skiff")
}

/// The rows of a `--json` run, each checked to carry the keys scripts read.
fn rows(out: &Output) -> Vec<serde_json::Value> {
    assert!(
        out.status.success(),
        "skiff bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON row per line");
            for key in [
                "test",
                "mode",
                "size",
                "messages",
                "msgs_per_s",
                "mb_per_s",
                "p50_us",
                "p99_us",
            ] {
                assert!(v.get(key).is_some(), "{key} missing from {l}");
            }
            v
        })
        .collect()
}

#[test]
fn queue_json_has_the_queue_rows_and_no_baselines() {
    let out = skiff(&[
        "bench",
        "queue",
        "--json",
        "--sizes",
        "64",
        "--messages",
        "2000",
        "--round-trips",
        "50",
        "--rounds",
        "2",
        "--duration-secs",
        "2",
    ]);
    let rows = rows(&out);
    let names: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["test"].as_str().unwrap().into(),
                r["mode"].as_str().unwrap().into(),
            )
        })
        .collect();
    let want = [
        ("queue", "natural"),
        ("queue", "qthresh=512,timeout=200ms"),
        ("queue-pingpong", "natural"),
        ("queue-pingpong", "qthresh=512,timeout=200ms"),
        ("queue-pingpong", "natural,peer"),
    ];
    assert_eq!(names, want.map(|(t, m)| (t.to_string(), m.to_string())));
    assert_eq!(rows[0]["messages"], 2000);
}

#[test]
fn tunnel_table_has_a_row_per_test() {
    let out = skiff(&[
        "bench",
        "tunnel",
        "--bytes",
        "1m",
        "--messages",
        "1000",
        "--round-trips",
        "50",
        "--duration-secs",
        "5",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("test") && lines[0].contains("msgs/s"),
        "{table}"
    );
    for test in ["bulk", "msgs", "pingpong"] {
        assert!(
            lines[2..]
                .iter()
                .any(|l| l.starts_with(test) && l.contains("tunnel mtu=1472")),
            "no {test} row in\n{table}"
        );
    }
    assert!(
        !table.contains("tcp"),
        "no TCP rows in skiff bench: {table}"
    );
}

#[test]
fn comparison_flags_are_skiff_bench_ones() {
    for args in [
        &["bench", "queue", "--tests", "udp"][..],
        &["bench", "queue", "--zmq", "x"],
        &["bench", "queue", "--plot", "x.svg"],
        &["bench", "queue", "--latency-cpu", "0"],
        &["bench", "pubsub", "--nats"],
        &["bench", "request", "--cpu", "0"],
        &["bench", "shm", "--markdown", "x.md"],
    ] {
        let out = skiff(args);
        assert_eq!(out.status.code(), Some(2), "{args:?} accepted");
    }
    // Kept, and ignored, for scripts written when skiff bench had a floor.
    let help = skiff(&["bench", "request", "--help"]);
    assert!(!String::from_utf8_lossy(&help.stdout).contains("--no-floor"));
}

#[test]
fn request_still_accepts_no_floor_and_starts_its_node() {
    let out = skiff(&[
        "bench",
        "request",
        "--json",
        "--no-floor",
        "--concurrency",
        "1",
        "--duration-secs",
        "0.2",
    ]);
    let rows = rows(&out);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["test"], "skiff-request");
    assert_eq!(rows[0]["mode"], "conc=1");
}

#[test]
fn pubsub_latency_row_times_every_probe_on_a_healthy_node() {
    // One message at a time through the node it starts: every probe
    // arrives (a late one is timed when it comes, not called lost).
    let out = skiff(&[
        "bench",
        "pubsub",
        "--json",
        "--shapes",
        "1x1",
        "--sizes",
        "8",
        "--duration-secs",
        "1",
        "--latency",
    ]);
    let rows = rows(&out);
    let lat = rows
        .iter()
        .find(|r| r["mode"] == "1x1-latency")
        .expect("a 1x1-latency row");
    assert_eq!(lat["lost"], 0, "{lat}");
    assert!(lat["messages"].as_u64().unwrap() > 0, "{lat}");
    assert!(lat["p50_us"].as_f64().unwrap() > 0.0, "{lat}");
}
