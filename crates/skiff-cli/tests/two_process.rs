//! Push and pop between two `skiff` processes over loopback.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn skiff() -> Command {
    Command::new(env!("CARGO_BIN_EXE_skiff"))
}

/// Starts `skiff pop` on an OS-chosen port and returns the child and port.
fn start_pop(extra: &[&str]) -> (std::process::Child, u16) {
    let mut child = skiff()
        .args([
            "pop",
            "udp://127.0.0.1:0?rcvbuf=4m",
            "--json",
            "--idle",
            "3s",
            "--stats",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn skiff pop");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let port = line
        .trim()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("no port in {line:?}"));
    // Keep draining stderr in the background so the child never blocks on it.
    std::thread::spawn(move || {
        let mut rest = String::new();
        while err.read_line(&mut rest).map(|n| n > 0).unwrap_or(false) {}
        eprint!("pop stderr: {rest}");
    });
    (child, port)
}

fn run_exchange(from: &str, n: u64) {
    let (pop, port) = start_pop(&["--count", &n.to_string()]);
    let status = skiff()
        .args([
            "push",
            &format!("127.0.0.1:{port}"),
            "m-{i}",
            "--count",
            &n.to_string(),
            "--from",
            from,
            "--subject",
            "t.x",
        ])
        .status()
        .unwrap();
    assert!(status.success());
    let out = pop.wait_with_output().unwrap();
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len() as u64, n, "all messages arrive over loopback");
    let mut seen = HashSet::new();
    for (i, m) in lines.iter().enumerate() {
        assert_eq!(m["payload"], format!("m-{i}"), "in order");
        assert_eq!(m["seq"], i as u64);
        assert_eq!(m["subject"], "t.x");
        assert!(seen.insert(m["payload"].to_string()));
    }
}

#[test]
fn push_pop_between_processes_natural_batching() {
    run_exchange("udp://127.0.0.1:0", 2000);
}

#[test]
fn push_pop_between_processes_cmq_thresholds() {
    run_exchange("udp://127.0.0.1:0?qthresh=512&timeout=200ms", 2000);
}

#[test]
fn bad_locator_names_the_bad_part() {
    let out = skiff()
        .args(["pop", "udp://127.0.0.1:0?qthresh=lots"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("qthresh") && err.contains("lots") && err.contains("byte count"),
        "{err}"
    );
    let out = skiff()
        .args(["pop", "udp://127.0.0.1:0?colour=red"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("colour") && err.contains("accepted options"),
        "{err}"
    );
    let out = skiff()
        .args(["pop", "tcpx://127.0.0.1:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tcpx") && err.contains("accepted: udp"),
        "{err}"
    );
}

#[test]
fn demo_runs() {
    let out = skiff().arg("demo").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("demo complete"), "{text}");
}
