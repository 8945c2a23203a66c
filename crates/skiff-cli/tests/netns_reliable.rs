//! Nothing lost between nodes (issue 16, Evidence): three network
//! namespaces on one bridge, iptables dropping 1.4 % and then 5 % of the
//! packets arriving on every host's link, a meshed `skiff node` in each.
//! Two publishers on host 1 each send a numbered stream; subscribers on
//! hosts 2 and 3 must receive every number of each publisher exactly once
//! and in order. Then messages of 1 MiB and of `max_payload` must arrive
//! byte-identical.
//!
//! ```text
//!   ns1: node 1 + 2 pubs       ns2: node 2 + sub     ns3: node 3 + sub
//!   eth0 10.215.S.1            eth0 10.215.S.2       eth0 10.215.S.3
//!     |                          |                     |
//!     p1 ------------------ br0 (hub ns) ------------- p3
//!                                |
//!                                p2
//! ```
//!
//! [`MESSAGES`] per publisher in CI; set `SKIFF_RELIABLE_MESSAGES=1000000`
//! for the issue's hand run. These tests need root and `ip netns`; they
//! are `#[ignore]`d so a plain `cargo test` reports them as ignored
//! (skipped), and `scripts/test.sh` runs them with `--ignored` where the
//! machine allows.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long anything that should happen may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(60);
/// Numbered messages per publisher in CI (the issue's hand run: one
/// million, through `SKIFF_RELIABLE_MESSAGES`).
const MESSAGES: u64 = 50_000;

fn messages() -> u64 {
    std::env::var("SKIFF_RELIABLE_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(MESSAGES)
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Three namespaces (10.215.S.1–3 on `eth0`) on a bridge in a fourth.
/// Removed on drop.
struct Lan {
    hosts: [String; 3],
    hub: String,
    subnet: u8,
}

impl Lan {
    fn new(tag: &str, subnet: u8) -> Lan {
        let pid = std::process::id();
        let name = |n: &str| format!("skiff-{tag}-{pid}-{n}");
        let lan = Lan {
            hosts: [name("1"), name("2"), name("3")],
            hub: name("hub"),
            subnet,
        };
        ip(&["netns", "add", &lan.hub]);
        ip(&["-n", &lan.hub, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &lan.hub, "link", "set", "br0", "up"]);
        for (i, ns) in lan.hosts.iter().enumerate() {
            let port = format!("p{}", i + 1);
            ip(&["netns", "add", ns]);
            ip(&[
                "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", &port, "netns",
                &lan.hub,
            ]);
            ip(&["-n", &lan.hub, "link", "set", &port, "master", "br0"]);
            ip(&["-n", &lan.hub, "link", "set", &port, "up"]);
            let addr = format!("{}/24", lan.ip(i));
            ip(&["-n", ns, "addr", "add", &addr, "dev", "eth0"]);
            ip(&["-n", ns, "link", "set", "eth0", "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        lan
    }

    fn ip(&self, i: usize) -> String {
        format!("10.215.{}.{}", self.subnet, i + 1)
    }

    fn exec(&self, i: usize) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.hosts[i]]);
        c
    }

    /// Drops `p` of the packets arriving on every host's link (replacing
    /// the rule before): every `1/p`-th, each host at its own offset. Not
    /// at random: the nodes send a link's packets in GSO runs, which the
    /// rule sees as one: at a random 1.4 % a run of this test saw 5 to 7
    /// drops, and once none, which proves nothing and failed the test.
    fn drop_ingress(&self, p: f64) {
        let every = (1.0 / p).round().max(2.0) as usize;
        for i in 0..3 {
            let _ = self.exec(i).args(["iptables", "-F", "INPUT"]).status();
            let st = self
                .exec(i)
                .args(["iptables", "-A", "INPUT", "-i", "eth0", "-m", "statistic"])
                .args(["--mode", "nth", "--every", &every.to_string()])
                .args(["--packet", &(i * 7 % every).to_string()])
                .args(["-j", "DROP"])
                .status()
                .expect("run iptables");
            assert!(st.success(), "iptables rule refused");
        }
    }

    /// Packets the drop rules dropped so far, over every host.
    fn dropped(&self) -> u64 {
        (0..3)
            .map(|i| {
                let out = self
                    .exec(i)
                    .args(["iptables", "-L", "INPUT", "-v", "-n", "-x"])
                    .output()
                    .expect("run iptables");
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter(|l| l.contains("DROP"))
                    .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
                    .sum::<u64>()
            })
            .sum()
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for n in self.hosts.iter().chain([&self.hub]) {
            let _ = Command::new("ip")
                .args(["netns", "del", n])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A child process killed and reaped on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn lines(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines() {
            let Ok(l) = l else { return };
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    rx
}

fn start_node(lan: &Lan, i: usize, net: &str) -> Proc {
    let bin = env!("CARGO_BIN_EXE_skiff");
    let seeds = (0..3)
        .filter(|&j| j != i)
        .map(|j| format!("{}:4748", lan.ip(j)))
        .collect::<Vec<_>>()
        .join(",");
    let mut child = lan
        .exec(i)
        .args([bin, "node", "--tcp", "0.0.0.0:4747"])
        .args(["--mesh", &format!("{}:4748", lan.ip(i))])
        .args(["--net", net, "--seeds", &seeds, "--no-scout"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn skiff node");
    let err = lines(child.stderr.take().unwrap());
    let proc = Proc(child);
    loop {
        let l = err
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("node {} did not start", i + 1));
        if l.contains("listening on tcp") {
            break;
        }
    }
    std::thread::spawn(move || {
        for l in err {
            eprintln!("node {}: {l}", i + 1);
        }
    });
    proc
}

fn stats(lan: &Lan, i: usize) -> serde_json::Value {
    let out = lan
        .exec(i)
        .args([env!("CARGO_BIN_EXE_skiff"), "stats", "--json"])
        .args(["-n", "skiff://127.0.0.1:4747"])
        .output()
        .expect("run skiff stats");
    assert!(out.status.success(), "skiff stats on node {}", i + 1);
    serde_json::from_slice(&out.stdout).expect("stats are JSON")
}

fn wait_stats(lan: &Lan, i: usize, what: &str, f: impl Fn(&serde_json::Value) -> bool) {
    let t = Instant::now();
    loop {
        let v = stats(lan, i);
        if f(&v) {
            return;
        }
        assert!(t.elapsed() < PATIENCE, "{what} on node {}: {v}", i + 1);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Patterns node `i` knows its up peers hold.
fn remote_patterns(v: &serde_json::Value) -> u64 {
    v["mesh"]["peers"].as_array().map_or(0, |ps| {
        ps.iter()
            .filter(|p| p["up"].as_bool() == Some(true))
            .map(|p| p["patterns"].as_u64().unwrap_or(0))
            .sum()
    })
}

/// A subscriber (`skiff sub --policy block`) in host `i`: its lines.
fn subscribe(lan: &Lan, i: usize, pattern: &str) -> (Proc, mpsc::Receiver<String>) {
    subscribe_with(lan, i, pattern, &[])
}

/// A best-effort subscriber (`skiff sub --best-effort`) in host `i`.
fn subscribe_best_effort(lan: &Lan, i: usize, pattern: &str) -> (Proc, mpsc::Receiver<String>) {
    subscribe_with(lan, i, pattern, &["--best-effort"])
}

/// [`subscribe`] with `extra` arguments.
fn subscribe_with(
    lan: &Lan,
    i: usize,
    pattern: &str,
    extra: &[&str],
) -> (Proc, mpsc::Receiver<String>) {
    let mut child = lan
        .exec(i)
        .args([env!("CARGO_BIN_EXE_skiff"), "sub", pattern])
        .args(extra)
        .args(["-n", "skiff://127.0.0.1:4747", "--policy", "block"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn skiff sub");
    let out = lines(child.stdout.take().unwrap());
    (Proc(child), out)
}

/// Publishes the lines `lines` on `subject` from host `i` (`skiff pub`,
/// one message per line); returns once it exited, with its status.
fn publish(lan: &Lan, i: usize, subject: &str, lines: impl Iterator<Item = String>) -> Proc {
    let mut child = lan
        .exec(i)
        .args([env!("CARGO_BIN_EXE_skiff"), "pub", subject])
        .args(["-n", "skiff://127.0.0.1:4747"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn skiff pub");
    let mut stdin = std::io::BufWriter::new(child.stdin.take().unwrap());
    for l in lines {
        writeln!(stdin, "{l}").expect("write to skiff pub");
    }
    drop(stdin);
    Proc(child)
}

fn wait_exit(p: &mut Proc, what: &str) {
    let t = Instant::now();
    loop {
        if let Some(st) = p.0.try_wait().unwrap() {
            assert!(st.success(), "{what} exited with {st}");
            return;
        }
        assert!(t.elapsed() < PATIENCE * 5, "{what} did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads `want` lines of two numbered streams (`rel.a N`, `rel.b N`) and
/// checks each arrives 0, 1, 2, … exactly once, in order.
fn check_streams(rx: &mpsc::Receiver<String>, want: u64, host: usize) {
    let mut next = [0u64; 2];
    while next[0] < want || next[1] < want {
        let l = rx.recv_timeout(PATIENCE).unwrap_or_else(|_| {
            panic!(
                "host {host}: stalled at a={} b={} of {want}",
                next[0], next[1]
            )
        });
        let (subject, n) = l.split_once(' ').expect("subject and payload");
        let k = match subject {
            "rel.a" => 0,
            "rel.b" => 1,
            s => panic!("host {host}: unexpected subject {s}"),
        };
        let n: u64 = n.parse().expect("a number");
        assert_eq!(n, next[k], "host {host}: {subject} out of order or lost");
        next[k] += 1;
    }
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "host {host}: more than was published"
    );
}

/// Whether the test may build namespaces (root), else says it skips.
fn may_run() -> bool {
    let ok = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0"));
    if !ok {
        eprintln!("SKIPPED: needs root and ip netns");
    }
    ok
}

/// Three hosts (`tag`, `subnet`), a node in each on mesh `net`, every
/// node seeing the other two up.
fn three_nodes(tag: &str, subnet: u8, net: &str) -> (Lan, Vec<Proc>) {
    let lan = Lan::new(tag, subnet);
    let nodes: Vec<Proc> = (0..3).map(|i| start_node(&lan, i, net)).collect();
    for i in 0..3 {
        wait_stats(&lan, i, "members up", |v| {
            v["mesh"]["stats"]["members_up"].as_u64() == Some(2)
        });
    }
    (lan, nodes)
}

/// No node's link to a peer dropped or lost anything.
fn assert_links_lost_nothing(lan: &Lan) {
    for i in 0..3 {
        for l in stats(lan, i)["mesh"]["links"].as_array().unwrap() {
            for c in ["dropped_newest", "dropped_oldest", "lost"] {
                assert_eq!(l[c].as_u64(), Some(0), "node {}: {l}", i + 1);
            }
        }
    }
}

/// Best effort beside reliable at `drop` (issue 16, item 5): host 2
/// subscribes best effort to `be.*`, host 3 reliably to `rel.*`; host 1
/// publishes numbered streams on both. The reliable streams arrive whole;
/// the best-effort one crosses as datagrams (counted in node 1's
/// `sent_frames` to its peers) and what it loses is counted in node 2's
/// `lost`, never silently.
fn run_best_effort(drop: f64, subnet: u8, tag: &str) {
    if !may_run() {
        return;
    }
    let (lan, _nodes) = three_nodes(tag, subnet, &format!("be-{}", std::process::id()));
    let (_s2, be) = subscribe_best_effort(&lan, 1, "be.*");
    let (_s3, rel) = subscribe(&lan, 2, "rel.*");
    wait_stats(&lan, 0, "interest", |v| remote_patterns(v) == 2);
    lan.drop_ingress(drop);
    let n = messages() / 2;
    let datagram_frames = |v: &serde_json::Value| -> u64 {
        v["mesh"]["peers"].as_array().map_or(0, |ps| {
            ps.iter()
                .map(|p| p["sent_frames"].as_u64().unwrap_or(0))
                .sum()
        })
    };
    let before = datagram_frames(&stats(&lan, 0));
    // Padded, so that the stream takes thousands of datagrams and some
    // are surely dropped.
    let pad = "x".repeat(200);
    let mut pe = publish(&lan, 0, "be.a", (0..n).map(|i| format!("{i} {pad}")));
    let mut pa = publish(&lan, 0, "rel.a", (0..n).map(|i| i.to_string()));
    let mut pb = publish(&lan, 0, "rel.b", (0..n).map(|i| i.to_string()));
    let h3 = std::thread::spawn(move || check_streams(&rel, n, 3));
    wait_exit(&mut pe, "best-effort publisher");
    wait_exit(&mut pa, "publisher a");
    wait_exit(&mut pb, "publisher b");
    h3.join().unwrap();
    // Every best-effort copy went out as a datagram, none on the link.
    wait_stats(&lan, 0, "be.a sent as datagrams", |v| {
        datagram_frames(v) == before + n
    });
    // Datagrams after the stream, one publish each: a loss at its tail
    // shows as a gap before the first of these that arrives.
    for _ in 0..20 {
        let mut p = publish(&lan, 0, "be.z", std::iter::once("end".to_string()));
        wait_exit(&mut p, "tail publisher");
    }
    // What arrives, arrives once and in order; the rest is counted lost.
    let mut got = 0u64;
    let mut last: Option<u64> = None;
    while let Ok(l) = be.recv_timeout(Duration::from_secs(3)) {
        if l.starts_with("be.z ") {
            continue;
        }
        let k: u64 = l
            .strip_prefix("be.a ")
            .and_then(|r| r.split(' ').next())
            .expect("be.a N")
            .parse()
            .unwrap();
        assert!(last.is_none_or(|p| k > p), "be.a {k} after {last:?}");
        last = Some(k);
        got += 1;
    }
    let lost: u64 = stats(&lan, 1)["mesh"]["peers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["lost"].as_u64().unwrap_or(0))
        .sum();
    eprintln!(
        "{drop}: best effort {got} of {n} arrived, {lost} datagram(s) counted lost; {} packets dropped by iptables",
        lan.dropped()
    );
    assert!(got <= n);
    assert!(
        got == n || lost > 0,
        "{} missing, none counted lost",
        n - got
    );
    assert!(lost > 0, "at {drop} drop some best-effort datagram is lost");
    assert_links_lost_nothing(&lan);
}

/// Two numbered publishers on host 1 at `drop`, reliable subscribers on
/// hosts 2 and 3: every number once and in order; then 1 MiB and
/// `max_payload` messages byte-identical.
fn run(drop: f64, subnet: u8, tag: &str) {
    if !may_run() {
        return;
    }
    let (lan, _nodes) = three_nodes(tag, subnet, &format!("rel-{}", std::process::id()));
    let (_s2, rx2) = subscribe(&lan, 1, "rel.*");
    let (_s3, rx3) = subscribe(&lan, 2, "rel.*");
    wait_stats(&lan, 0, "interest", |v| remote_patterns(v) == 2);
    lan.drop_ingress(drop);
    let n = messages();
    let t = Instant::now();
    let mut pa = publish(&lan, 0, "rel.a", (0..n).map(|i| i.to_string()));
    let mut pb = publish(&lan, 0, "rel.b", (0..n).map(|i| i.to_string()));
    let (h2, h3) = (
        std::thread::spawn(move || check_streams(&rx2, n, 2)),
        std::thread::spawn(move || check_streams(&rx3, n, 3)),
    );
    wait_exit(&mut pa, "publisher a");
    wait_exit(&mut pb, "publisher b");
    h2.join().unwrap();
    h3.join().unwrap();
    eprintln!(
        "{drop}: 2 x {n} messages to 2 nodes in {:?}, {} packets dropped by iptables",
        t.elapsed(),
        lan.dropped()
    );
    assert!(lan.dropped() > 0, "the drop rule dropped nothing");
    // Large messages: 1 MiB and the node's max_payload, byte-identical.
    let max = stats(&lan, 0)["max_payload"].as_u64().unwrap_or(1 << 20) as usize;
    let (_s, rx) = subscribe(&lan, 1, "big.*");
    wait_stats(&lan, 0, "interest", |v| remote_patterns(v) == 3);
    for (k, size) in [(1usize << 20) - 1, max].into_iter().enumerate() {
        // One line of `size` bytes (a line is one message).
        let body: String = (0..size)
            .map(|j| char::from(b'a' + ((j * 7 + k) % 26) as u8))
            .collect();
        let mut p = publish(&lan, 0, &format!("big.{k}"), std::iter::once(body.clone()));
        wait_exit(&mut p, "big publisher");
        let l = rx.recv_timeout(PATIENCE).expect("the large message");
        assert_eq!(l.len(), 6 + size, "size {size}");
        assert!(
            l == format!("big.{k} {body}"),
            "message of {size} bytes differs"
        );
    }
    assert_links_lost_nothing(&lan);
}

#[test]
#[ignore = "needs root and ip netns; scripts/test.sh runs it"]
fn nothing_lost_between_three_hosts_at_1_4_percent_drop() {
    run(0.014, 1, "rel14");
}

#[test]
#[ignore = "needs root and ip netns; scripts/test.sh runs it"]
fn nothing_lost_between_three_hosts_at_5_percent_drop() {
    run(0.05, 2, "rel5");
}

#[test]
#[ignore = "needs root and ip netns; scripts/test.sh runs it"]
fn best_effort_beside_reliable_at_5_percent_drop() {
    run_best_effort(0.05, 3, "be5");
}
