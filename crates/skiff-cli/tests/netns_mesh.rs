//! The mesh on a real, lossy network (issue 6, Evidence): three network
//! namespaces on one bridge, 1.4 % of the packets arriving on each
//! namespace's link dropped by iptables, a meshed `skiff node` in each. A
//! subscriber in namespace 1 (`skiff://n1,n2,n3`) receives a numbered
//! stream published every 2 ms on node 3. Node 1 is killed with SIGKILL,
//! then node 2's link is cut: each time the subscriber must report the
//! failover, move on (to node 2, then node 3), keep its subscription and
//! receive again within 1 s, and no number may arrive twice. Numbers may be
//! missing (best effort at 1.4 % drop, and whatever was published while
//! the subscriber had no node): they are counted and printed.
//!
//! ```text
//!   ns1: node 1 + sub          ns2: node 2           ns3: node 3 + pub
//!   eth0 10.214.S.1            eth0 10.214.S.2       eth0 10.214.S.3
//!     |                          |                     |
//!     p1 ------------------ br0 (hub ns) ------------- p3
//!                                |
//!                                p2   <- cut in phase 2
//! ```
//!
//! The drop rule matches `-i eth0` only: traffic over a namespace's
//! loopback (the subscriber to node 1, the publisher to node 3) is local,
//! not network. Namespaces are removed when the test ends, even on panic.
//!
//! These tests need root and `ip netns`; they are `#[ignore]`d so a plain
//! `cargo test` reports them as ignored (skipped), and `scripts/test.sh`
//! runs them with `--ignored` where the machine allows.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// How long anything that should happen may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(20);
/// The issue's bound on a failover (from the kill or cut to the first
/// message through the next node) and on each step of one. It is a speed
/// target, measured by `skiff bench failover` (bench/RESULTS.md): a step
/// over it is reported here, not failed, since a loaded CI machine can
/// hold the processes off the CPU for longer.
const BOUND: Duration = Duration::from_secs(1);
/// What fails the test: the keepalive's detection (`ping_timeout` 600 ms)
/// and the move, many times over, but far below what a failover that did
/// not come from the keepalive would take (the kernel's TCP timeouts, or
/// `PATIENCE`).
const LIMIT: Duration = Duration::from_secs(6);
/// One publish every `TICK`.
const TICK: Duration = Duration::from_millis(2);
const PROBABILITY: f64 = 0.014;

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Three namespaces `0..3` (10.214.S.1–3 on `eth0`) whose links meet on a
/// bridge in a fourth, the hub. Removed on drop.
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
        // From here on `lan` removes whatever was made if a step fails.
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
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/24", lan.ip(i)),
                "dev",
                "eth0",
            ]);
            ip(&["-n", ns, "link", "set", "eth0", "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        lan
    }

    /// Host `i`'s address.
    fn ip(&self, i: usize) -> String {
        format!("10.214.{}.{}", self.subnet, i + 1)
    }

    /// A command run in host `i`'s namespace.
    fn exec(&self, i: usize) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.hosts[i]]);
        c
    }

    /// Drops `p` of the packets arriving on every host's link.
    fn drop_ingress(&self, p: f64) {
        for i in 0..3 {
            let st = self
                .exec(i)
                .args(["iptables", "-A", "INPUT", "-i", "eth0", "-m", "statistic"])
                .args(["--mode", "random", "--probability", &p.to_string()])
                .args(["-j", "DROP"])
                .status()
                .expect("run iptables");
            assert!(st.success(), "iptables rule refused");
        }
    }

    /// Packets the drop rules dropped so far, per host.
    fn dropped(&self) -> [u64; 3] {
        [0, 1, 2].map(|i| {
            let out = self
                .exec(i)
                .args(["iptables", "-L", "INPUT", "-v", "-n", "-x"])
                .output()
                .expect("run iptables");
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.contains("DROP"))
                .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
                .sum()
        })
    }

    /// Cuts host `i` off the bridge, as a cable pulled at the switch: its
    /// own interface stays up and nothing tells its processes.
    fn cut(&self, i: usize) {
        ip(&[
            "-n",
            &self.hub,
            "link",
            "set",
            &format!("p{}", i + 1),
            "down",
        ]);
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

/// A child process killed (SIGKILL) and reaped on drop. `ip netns exec`
/// execs its command, so the child is the skiff process itself.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Lines of a child's pipe with the time each was read, on a thread.
fn lines(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<(Instant, String)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines() {
            let Ok(l) = l else { return };
            if tx.send((Instant::now(), l)).is_err() {
                return;
            }
        }
    });
    rx
}

/// Starts a meshed node in host `i`, seeded with the others; returns once
/// it listens. Its standard error goes to `log`, prefixed.
fn start_node(lan: &Lan, i: usize, net: &str, log: &Arc<Mutex<Vec<String>>>) -> Proc {
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
        let (_, l) = err
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("node {} did not start", i + 1));
        let listening = l.contains("listening on tcp");
        log.lock().unwrap().push(format!("node {}: {l}", i + 1));
        if listening {
            break;
        }
    }
    let log = log.clone();
    std::thread::spawn(move || {
        for (_, l) in err {
            log.lock().unwrap().push(format!("node {}: {l}", i + 1));
        }
    });
    proc
}

/// `skiff stats --json` of the node in host `i`, asked over its loopback.
fn stats(lan: &Lan, i: usize) -> serde_json::Value {
    let out = lan
        .exec(i)
        .args([env!("CARGO_BIN_EXE_skiff"), "stats", "--json"])
        .args(["-n", "skiff://127.0.0.1:4747"])
        .output()
        .expect("run skiff stats");
    assert!(
        out.status.success(),
        "skiff stats on node {}: {}",
        i + 1,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stats are JSON")
}

/// Waits until the stats of the node in host `i` satisfy `f`.
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

/// Patterns the node knows its up peers hold.
fn remote_patterns(v: &serde_json::Value) -> u64 {
    v["mesh"]["peers"].as_array().map_or(0, |ps| {
        ps.iter()
            .filter(|p| p["up"].as_bool() == Some(true))
            .map(|p| p["patterns"].as_u64().unwrap_or(0))
            .sum()
    })
}

/// Publishes `0, 1, 2, …` on `subject` through `skiff pub` (one message
/// per line of its standard input), one every [`TICK`], until stopped;
/// remembers when each number was handed over.
struct Publisher {
    stop: Arc<AtomicBool>,
    sent: Arc<Mutex<Vec<Instant>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _proc: Proc,
}

impl Publisher {
    fn start(mut cmd: Command, subject: &str) -> Publisher {
        let mut child = cmd
            .args([env!("CARGO_BIN_EXE_skiff"), "pub", subject])
            .stdin(Stdio::piped())
            .spawn()
            .expect("spawn skiff pub");
        let mut stdin = child.stdin.take().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, sent) = (stop.clone(), sent.clone());
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Paced from the start, so a late wake-up does not
                    // slow the stream down.
                    let due = start + TICK * n as u32;
                    if let Some(d) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(d);
                    }
                    sent.lock().unwrap().push(Instant::now());
                    if writeln!(stdin, "{n}").is_err() {
                        return;
                    }
                    n += 1;
                }
            })
        };
        Publisher {
            stop,
            sent,
            thread: Some(thread),
            _proc: Proc(child),
        }
    }

    /// The first number handed over at or after `t`.
    fn first_at(&self, t: Instant) -> u64 {
        self.sent.lock().unwrap().partition_point(|&s| s < t) as u64
    }

    /// Stops; returns how many numbers were handed over.
    fn stop(&mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.sent.lock().unwrap().len() as u64
    }
}

/// What the subscriber printed: every number with the time it was read,
/// and its notices on standard error.
struct Received {
    out: mpsc::Receiver<(Instant, String)>,
    err: mpsc::Receiver<(Instant, String)>,
    msgs: Vec<(Instant, u64)>,
    notices: Vec<(Instant, String)>,
}

impl Received {
    fn drain(&mut self) {
        while let Ok((t, l)) = self.out.try_recv() {
            self.push(t, &l);
        }
        while let Ok(n) = self.err.try_recv() {
            self.notices.push(n);
        }
    }

    fn push(&mut self, t: Instant, line: &str) {
        let n = line
            .strip_prefix("nm.seq ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected line from skiff sub: {line:?}"));
        self.msgs.push((t, n));
    }

    /// Waits until a message numbered `n` or above arrives; returns when,
    /// and its number.
    fn wait_number(&mut self, n: u64, what: &str) -> (Instant, u64) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(&found) = self.msgs.iter().find(|&&(_, m)| m >= n) {
                return found;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.out.recv_timeout(left) {
                Ok((t, l)) => self.push(t, &l),
                Err(_) => {
                    self.drain();
                    panic!(
                        "{what}: nothing numbered {n} or above; notices {:?}",
                        self.notices
                    )
                }
            }
        }
    }

    /// Waits for a notice on standard error containing every one of
    /// `words`; returns when it was read and the line.
    fn wait_notice(&mut self, words: &[&str], after: Instant) -> (Instant, String) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let found = self
                .notices
                .iter()
                .find(|(t, l)| *t >= after && words.iter().all(|w| l.contains(w)));
            if let Some(n) = found {
                return n.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.err.recv_timeout(left) {
                Ok(n) => self.notices.push(n),
                Err(_) => panic!("no notice with {words:?}; notices {:?}", self.notices),
            }
        }
    }

    /// Reads on for `d`.
    fn keep_reading(&mut self, d: Duration) {
        std::thread::sleep(d);
        self.drain();
    }
}

/// One failover as the subscriber saw it.
struct Failover {
    what: &'static str,
    /// From the kill or the cut to the "lost node" notice.
    detected: Duration,
    /// From the kill or the cut to the "failed over" notice.
    moved: Duration,
    /// From the kill or the cut to the first message published after it.
    delivered: Duration,
    /// The node the subscriber moved to.
    to: String,
    /// The number of that first message.
    resumed: u64,
    /// What the network lost that costs time to recover, and how much
    /// time that allows beyond the bound.
    lost: Lost,
}

impl Failover {
    /// Waits for the notices and for the first message published at or
    /// after `at` (it can only come through the next node).
    fn observe(
        what: &'static str,
        rx: &mut Received,
        publisher: &Publisher,
        at: Instant,
        lost: &str,
    ) -> Failover {
        let (t_lost, _) = rx.wait_notice(&["lost node", lost], at);
        let (t_over, over) = rx.wait_notice(&["failed over from", lost], at);
        assert!(
            over.contains("may be missing"),
            "the gap is reported: {over}"
        );
        let to = over
            .split(" to ")
            .nth(1)
            .and_then(|s| s.split(';').next())
            .unwrap_or_default();
        let to = to.strip_prefix("skiff://").unwrap_or(to).to_string();
        // Numbers are handed over every TICK: wait until one after `at`
        // exists, then for it (or a later one) to arrive.
        std::thread::sleep(TICK * 2);
        let first = publisher.first_at(at);
        let (t_first, resumed) = rx.wait_number(first, what);
        Failover {
            what,
            detected: t_lost - at,
            moved: t_over - at,
            delivered: t_first - at,
            to,
            resumed,
            lost: Lost::default(),
        }
    }

    /// From the loss being detected to the first new message.
    fn after_detection(&self) -> Duration {
        self.delivered.saturating_sub(self.detected)
    }

    fn report(&self) {
        eprintln!(
            "{}: loss detected after {:?}, failed over to {} after {:?}, first new message after {:?} ({:?} after detection){}",
            self.what,
            self.detected,
            self.to,
            self.moved,
            self.delivered,
            self.after_detection(),
            if self.lost.what.is_empty() {
                String::new()
            } else {
                format!("; the network lost {}", self.lost.what.join(", "))
            }
        );
    }

    /// Asserts `took < LIMIT`, plus the time the network's losses allow;
    /// reports a step over `bound`.
    fn check(&self, what: &str, took: Duration, bound: Duration) {
        let allowed = LIMIT + self.lost.allows;
        assert!(
            took < allowed,
            "{}: {what} took {took:?}, over {allowed:?}; the network lost {:?}",
            self.what,
            self.lost.what
        );
        if took >= bound {
            eprintln!(
                "{}: {what} took {took:?}, over the {bound:?} target (the network lost: {})",
                self.what,
                self.lost.what.join(", ")
            );
        }
    }
}

/// Losses that make one failover slower than the bound however quick
/// skiff is, and the time each allows.
#[derive(Default)]
struct Lost {
    what: Vec<String>,
    allows: Duration,
}

/// Counters of what the network lost that costs a failover time: a TCP
/// connect (the subscriber's, to the next node) whose SYN or SYN-ACK was
/// dropped starts another attempt after 200 ms, but if that is lost too
/// the kernel's own retransmission comes after its initial 1 s; an
/// interest delta (the next node's to node 3) that was dropped is
/// repaired after the next digest, within 1 s.
struct Network {
    /// `TcpExt: TCPSynRetrans` summed over the hosts: the subscriber's
    /// SYNs and the nodes' SYN-ACKs sent again.
    syn_retrans: u64,
    /// Interest syncs node 3 asked for: a lost interest delta is repaired
    /// by the next digest (`digest_every`, 1 s).
    syncs_requested: u64,
}

impl Network {
    fn now(lan: &Lan) -> Network {
        let syn_retrans = (0..3).map(|i| syn_retrans(lan, i)).sum();
        let syncs_requested = stats(lan, 2)["mesh"]["stats"]["syncs_requested"]
            .as_u64()
            .unwrap_or(0);
        Network {
            syn_retrans,
            syncs_requested,
        }
    }

    /// What was lost since `before`.
    fn lost_since(&self, before: &Network) -> Lost {
        let mut lost = Lost::default();
        let syns = self.syn_retrans - before.syn_retrans;
        if syns > 0 {
            lost.what.push(format!(
                "{syns} TCP SYN(s) (retransmitted after TCP's 1 s initial timeout)"
            ));
        }
        let syncs = self.syncs_requested - before.syncs_requested;
        if syncs > 0 {
            lost.what.push(format!(
                "{syncs} interest delta(s) (repaired by an anti-entropy sync, digest every 1 s)"
            ));
        }
        lost.allows = Duration::from_secs(syns + syncs);
        lost
    }
}

/// `TcpExt: TCPSynRetrans` (SYNs and SYN-ACKs sent again) in host `i`.
fn syn_retrans(lan: &Lan, i: usize) -> u64 {
    let out = lan
        .exec(i)
        .args(["cat", "/proc/net/netstat"])
        .output()
        .expect("read /proc/net/netstat");
    let text = String::from_utf8_lossy(&out.stdout);
    let tcp_ext: Vec<&str> = text.lines().filter(|l| l.starts_with("TcpExt:")).collect();
    match tcp_ext[..] {
        [names, values] => names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(n, _)| *n == "TCPSynRetrans")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

/// Numbers received more than once.
fn duplicates(msgs: &[(Instant, u64)]) -> Vec<u64> {
    let mut count = HashMap::new();
    for &(_, n) in msgs {
        *count.entry(n).or_insert(0u32) += 1;
    }
    let mut d: Vec<u64> = count
        .into_iter()
        .filter(|&(_, c)| c > 1)
        .map(|(n, _)| n)
        .collect();
    d.sort_unstable();
    d
}

/// How many numbers in `from..to` never arrived.
fn missing(got: &BTreeSet<u64>, from: u64, to: u64) -> u64 {
    (from..to).filter(|n| !got.contains(n)).count() as u64
}

#[test]
#[ignore = "needs root and ip netns; scripts/test.sh runs it"]
fn mesh_fails_over_on_kill_and_cut_link_at_1_4_percent_drop() {
    let lan = Lan::new("mesh", 1);
    lan.drop_ingress(PROBABILITY);
    let net = format!("netns-mesh-{}", std::process::id());
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut node1 = start_node(&lan, 0, &net, &log);
    let _node2 = start_node(&lan, 1, &net, &log);
    let _node3 = start_node(&lan, 2, &net, &log);
    let addr = |i: usize| format!("{}:4747", lan.ip(i));
    for i in 0..3 {
        wait_stats(&lan, i, "two members up", |v| {
            v["mesh"]["stats"]["members_up"].as_u64() == Some(2)
        });
    }

    // The subscriber, in host 1: its own node first, then 2, then 3, with
    // the default keepalive (ping 150 ms, ping_timeout 600 ms). A connect
    // whose SYN is dropped is raced by a fresh one after 200 ms, and
    // the kernel's own retransmission comes after 1 s: `connect_timeout`
    // 2 s keeps an unlucky connect from timing out, so the subscriber
    // always moves to the next node in the list.
    let locator = format!(
        "skiff://{},{},{}?connect_timeout=2s",
        addr(0),
        addr(1),
        addr(2)
    );
    let mut sub = Proc(
        lan.exec(0)
            .args([env!("CARGO_BIN_EXE_skiff"), "sub", "-n", &locator, "nm.>"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn skiff sub"),
    );
    let mut rx = Received {
        out: lines(sub.0.stdout.take().unwrap()),
        err: lines(sub.0.stderr.take().unwrap()),
        msgs: Vec::new(),
        notices: Vec::new(),
    };
    wait_stats(&lan, 2, "interest from node 1", |v| remote_patterns(v) == 1);

    // The stream, published on node 3 from host 3.
    let mut publisher = {
        let mut c = lan.exec(2);
        c.env("SKIFF_NODE", "skiff://127.0.0.1:4747");
        Publisher::start(c, "nm.seq")
    };
    rx.wait_number(250, "the stream through node 1");

    // Phase 1: kill -9 node 1, the subscriber's own. Its connection ends
    // at once; node 2 must tell node 3 of the restored interest.
    let before = Network::now(&lan);
    let t_kill = Instant::now();
    node1.0.kill().unwrap();
    node1.0.wait().unwrap();
    let mut kill = Failover::observe("kill -9 node 1", &mut rx, &publisher, t_kill, &addr(0));
    kill.lost = Network::now(&lan).lost_since(&before);
    kill.report();
    assert_eq!(kill.to, addr(1), "after node 1 comes node 2");
    rx.keep_reading(Duration::from_secs(1));
    let node2 = stats(&lan, 1);
    assert_eq!(node2["subscriptions"], 1, "restored on node 2: {node2}");

    // Phase 2: cut node 2's link. The subscriber hears nothing more from
    // it, gives it up after `ping_timeout` and moves to node 3, the
    // publisher's own.
    let before = Network::now(&lan);
    lan.cut(1);
    let t_cut = Instant::now();
    let mut cut = Failover::observe("cut node 2's link", &mut rx, &publisher, t_cut, &addr(1));
    cut.lost = Network::now(&lan).lost_since(&before);
    cut.report();
    assert_eq!(
        cut.to,
        addr(2),
        "after node 2 comes node 3 (node 1 is dead)"
    );
    rx.keep_reading(Duration::from_secs(1));

    // Stop, and let the last messages arrive.
    let sent = publisher.stop();
    rx.keep_reading(Duration::from_millis(500));
    let node3 = stats(&lan, 2);
    drop(sub);
    rx.drain();

    let dropped = lan.dropped();
    let got: BTreeSet<u64> = rx.msgs.iter().map(|&(_, n)| n).collect();
    // The stream in five spans: steady through node 1, the first
    // failover, steady through node 2, the second, steady through node 3.
    let spans = [
        ("through node 1", 0, publisher.first_at(t_kill)),
        (
            "kill to resumption",
            publisher.first_at(t_kill),
            kill.resumed,
        ),
        ("through node 2", kill.resumed, publisher.first_at(t_cut)),
        ("cut to resumption", publisher.first_at(t_cut), cut.resumed),
        ("through node 3", cut.resumed, sent),
    ];
    eprintln!(
        "sent {sent}, received {} ({} distinct); iptables dropped {dropped:?} packets arriving in hosts 1, 2, 3",
        rx.msgs.len(),
        got.len(),
    );
    for (what, from, to) in spans {
        eprintln!(
            "  {what}: {} of {} missing",
            missing(&got, from, to),
            to.saturating_sub(from)
        );
    }
    eprintln!(
        "subscriber: {:#?}",
        rx.notices.iter().map(|(_, l)| l).collect::<Vec<_>>()
    );
    eprintln!("node 3 at the end: {node3}");
    for l in log.lock().unwrap().iter() {
        eprintln!("{l}");
    }

    let twice = duplicates(&rx.msgs);
    assert!(twice.is_empty(), "delivered twice: {twice:?}");
    // A killed node's connection ends at once; a cut link is noticed
    // `ping_timeout` (600 ms) after the last byte heard. Either way the
    // whole failover, to the first message through the next node, is
    // within the bound, and so is each step of it.
    for f in [&kill, &cut] {
        f.check(
            "the move to the next node",
            f.moved.saturating_sub(f.detected),
            BOUND,
        );
        f.check(
            "detection to the first new message",
            f.after_detection(),
            BOUND,
        );
        f.check("the whole failover", f.delivered, BOUND);
    }
    // The subscription held on node 3, and between failovers the stream
    // arrived but for what the network lost (best effort: a datagram
    // between nodes carries many messages).
    assert_eq!(node3["subscriptions"], 1, "{node3}");
    for (what, from, to) in [spans[0], spans[2], spans[4]] {
        assert!(to > from + 100, "{what}: only {from}..{to}");
        let m = missing(&got, from, to);
        assert!(m * 10 < to - from, "{what}: {m} of {} missing", to - from);
    }
    assert!(
        dropped.iter().sum::<u64>() > 0,
        "the iptables rules dropped nothing: the experiment did not run"
    );
}

#[test]
#[ignore = "needs root and ip netns; scripts/test.sh runs it"]
fn client_connect_gets_past_a_lost_syn_without_the_kernels_retransmission() {
    let lan = Lan::new("syn", 2);
    let log = Arc::new(Mutex::new(Vec::new()));
    let net = format!("netns-syn-{}", std::process::id());
    let _node = start_node(&lan, 1, &net, &log);
    // Host 2 drops the first SYN to the node's port (every second one,
    // starting with the first), so a client's first attempt is lost.
    let st = lan
        .exec(1)
        .args(["iptables", "-A", "INPUT", "-i", "eth0", "-p", "tcp"])
        .args(["--dport", "4747", "--syn", "-m", "statistic"])
        .args([
            "--mode", "nth", "--every", "2", "--packet", "0", "-j", "DROP",
        ])
        .status()
        .expect("run iptables");
    assert!(st.success(), "iptables rule refused");
    let before = syn_retrans(&lan, 0);
    let out = lan
        .exec(0)
        .args([env!("CARGO_BIN_EXE_skiff"), "stats", "--json"])
        .args(["-n", &format!("skiff://{}:4747", lan.ip(1))])
        .output()
        .expect("run skiff stats");
    assert!(
        out.status.success(),
        "the client connects: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lan.dropped()[1], 1, "the first SYN was dropped");
    assert_eq!(
        syn_retrans(&lan, 0) - before,
        0,
        "a second connect attempt got through before the kernel sent the lost SYN again"
    );
}
