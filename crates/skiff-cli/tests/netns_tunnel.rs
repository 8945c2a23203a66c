//! Tunnels on a lossy real network: two network namespaces joined by a
//! veth pair (10.213.10+.x), a share of the packets arriving at the
//! receiver dropped by iptables. A 256 MiB `skiff cat` transfer must arrive
//! byte-exact, and a stream of small messages complete and in order.
//!
//! These tests need root and `ip netns`; they are `#[ignore]`d so a plain
//! `cargo test` reports them as ignored (skipped), and `scripts/test.sh`
//! runs them with `--ignored` where the machine allows.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::Netns;

/// A file of this test process; `name` carries the test's subnet, so tests
/// running in parallel do not share files.
fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("skiff-netns-tunnel-{}-{name}", std::process::id()))
}

/// A child process killed if the test fails before waiting for it (a
/// listener left behind would wait forever).
struct Reap(std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `skiff cat` from `a` to `b` with `input`, returns what `b` wrote
/// and how long the listener ran on after the sender exited.
fn cat(ns: &Netns, subnet: u8, input: &PathBuf, send_opts: &[&str]) -> (Vec<u8>, Duration) {
    let bin = env!("CARGO_BIN_EXE_skiff");
    let out_path = temp(&format!("out-{subnet}"));
    let out = std::fs::File::create(&out_path).unwrap();
    let listen = format!("udp://10.213.{subnet}.2:4711?idle_timeout=20s");
    let mut rx = Reap(
        ns.exec(1)
            .args([bin, "cat", "--listen", &listen, "--stats"])
            .stdout(out)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let to = format!("udp://10.213.{subnet}.2:4711?idle_timeout=20s");
    let tx = ns
        .exec(0)
        .args([bin, "cat", &to, "--stats"])
        .args(send_opts)
        .stdin(std::fs::File::open(input).unwrap())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    assert!(
        tx.status.success(),
        "sender failed: {}",
        String::from_utf8_lossy(&tx.stderr)
    );
    let st = rx.0.wait().unwrap();
    let lag = started.elapsed() - elapsed;
    let mut rx_err = String::new();
    std::io::Read::read_to_string(rx.0.stderr.as_mut().unwrap(), &mut rx_err).unwrap();
    assert!(st.success(), "listener failed: {rx_err}");
    eprintln!(
        "sender ({elapsed:?}):\n{}\nlistener:\n{rx_err}",
        String::from_utf8_lossy(&tx.stderr)
    );
    let got = std::fs::read(&out_path).unwrap();
    let _ = std::fs::remove_file(&out_path);
    (got, lag)
}

fn sha256(path: &PathBuf) -> String {
    Command::new("sha256sum")
        .arg(path)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn bulk(tag: &str, subnet: u8, drop: f64) {
    let ns = Netns::new(tag, subnet);
    ns.drop_on_receiver(drop);
    let input = temp(&format!("in-{subnet}"));
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&input).unwrap());
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ u64::from(subnet);
        let mut block = vec![0u8; 1 << 20];
        for _ in 0..256 {
            for w in block.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                w.copy_from_slice(&x.to_le_bytes());
            }
            f.write_all(&block).unwrap();
        }
    }
    let (got, _) = cat(&ns, subnet, &input, &[]);
    let want = std::fs::read(&input).unwrap();
    let out = temp(&format!("out-check-{subnet}"));
    std::fs::write(&out, &got).unwrap();
    eprintln!("sha256:\n{}{}", sha256(&input), sha256(&out));
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_file(&input);
    assert_eq!(got.len(), want.len(), "length differs");
    assert!(got == want, "256 MiB arrived with different bytes");
    let dropped = ns.dropped();
    eprintln!("iptables dropped {dropped} packets");
    assert!(
        dropped > 0,
        "the drop rule dropped nothing: the test did not run"
    );
}

fn small_messages(tag: &str, subnet: u8, drop: f64, n: u64) {
    let ns = Netns::new(tag, subnet);
    ns.drop_on_receiver(drop);
    let input = temp(&format!("lines-{subnet}"));
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&input).unwrap());
        for i in 0..n {
            writeln!(f, "m-{i}").unwrap();
        }
    }
    let (got, _) = cat(&ns, subnet, &input, &["--lines"]);
    let _ = std::fs::remove_file(&input);
    let text = String::from_utf8(got).unwrap();
    let mut count = 0u64;
    for (i, line) in text.lines().enumerate() {
        assert_eq!(
            line,
            format!("m-{i}"),
            "message {i} missing or out of order"
        );
        count += 1;
    }
    assert_eq!(count, n, "every message arrives");
    assert!(ns.dropped() > 0, "the drop rule dropped nothing");
}

#[test]
#[ignore = "needs root and ip netns; scripts/test.sh runs it"]
fn bulk_256mib_byte_exact_at_1_4_percent_drop() {
    bulk("tb14", 10, 0.014);
}

#[test]
#[ignore = "needs root and ip netns; scripts/test.sh runs it"]
fn bulk_256mib_byte_exact_at_5_percent_drop() {
    bulk("tb5", 11, 0.05);
}

#[test]
#[ignore = "needs root and ip netns; scripts/test.sh runs it"]
fn small_messages_complete_in_order_at_1_4_percent_drop() {
    small_messages("tm14", 12, 0.014, 200_000);
}

#[test]
#[ignore = "needs root and ip netns; scripts/test.sh runs it"]
fn small_messages_complete_in_order_at_5_percent_drop() {
    small_messages("tm5", 13, 0.05, 200_000);
}

/// Issue 16, item 6: the end of a lossy transfer is clean and prompt. Many
/// short `skiff cat` runs at 5 % drop: every one byte-exact, the listener
/// exiting successfully soon after the sender, never held until its idle
/// timeout (20 s here) nor failing after the sender exited 0. The bound is
/// a quarter of the idle timeout: what it catches is a hang, not a speed.
fn lossy_closes(tag: &str, subnet: u8, drop: f64, runs: usize) {
    let ns = Netns::new(tag, subnet);
    ns.drop_on_receiver(drop);
    // And on the sender's side: its last acknowledgement, or the
    // listener's sentinel, lost is the race this test is for.
    let st = ns
        .exec(0)
        .args([
            "iptables",
            "-A",
            "INPUT",
            "-m",
            "statistic",
            "--mode",
            "random",
        ])
        .args(["--probability", &drop.to_string(), "-j", "DROP"])
        .status()
        .expect("run iptables");
    assert!(st.success(), "iptables rule refused");
    let input = temp(&format!("close-{subnet}"));
    let mut want = Vec::new();
    for i in 0..40_000u32 {
        want.extend_from_slice(&i.wrapping_mul(2_654_435_761).to_le_bytes());
    }
    std::fs::write(&input, &want).unwrap();
    let mut worst = Duration::ZERO;
    for run in 0..runs {
        let (got, lag) = cat(&ns, subnet, &input, &[]);
        assert!(got == want, "run {run}: bytes differ");
        assert!(
            lag < Duration::from_secs(5),
            "run {run}: the listener ended {lag:?} after the sender (held to its idle timeout?)"
        );
        worst = worst.max(lag);
    }
    let _ = std::fs::remove_file(&input);
    eprintln!("{runs} closes at {drop}: the listener ended at most {worst:?} after the sender; iptables dropped {}", ns.dropped());
    assert!(ns.dropped() > 0, "the drop rule dropped nothing");
}

#[test]
#[ignore = "needs root and ip netns; scripts/test.sh runs it"]
fn lossy_closes_are_clean_and_prompt_at_5_percent_drop() {
    lossy_closes("tc5", 14, 0.05, 40);
}
