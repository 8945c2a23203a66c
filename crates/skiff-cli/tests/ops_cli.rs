//! Operating a node, against real `skiff node` processes: JSON log lines
//! for each event, the HTTP monitoring listener (`/metrics` read by the
//! Python `prometheus-client` package's OpenMetrics parser, counters
//! moving by exactly the traffic sent; `/connz` naming a paused
//! subscriber as the slow one; `/healthz` going 503 → 200 as a mesh
//! forms; hostile requests), reload on SIGHUP and `skiff reload` without
//! dropping a client, and SIGTERM draining a subscriber's pending
//! messages (a second signal exiting at once).
//!
//! The parser comes from `SKIFF_TEST_PYTHON` (a Python with
//! `prometheus_client`), else `target/py-prom` (which `scripts/test.sh`
//! makes); without either the metrics test says SKIPPED, and fails under
//! CI.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

fn skiff() -> Command {
    Command::new(env!("CARGO_BIN_EXE_skiff"))
}

/// A child process, killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid, with no memory involved.
        let r = unsafe { libc::kill(self.0.id() as libc::pid_t, sig) };
        assert_eq!(r, 0, "kill {sig}");
    }

    /// Waits up to `t` for the process to exit; its exit code.
    fn exit_within(&mut self, t: Duration) -> Option<i32> {
        let start = Instant::now();
        while start.elapsed() < t {
            if let Some(s) = self.0.try_wait().unwrap() {
                return Some(s.code().unwrap_or(-1));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

const PATIENCE: Duration = Duration::from_secs(20);

/// A node started with `--log-format json`; its log lines parsed as they
/// come (every line must be JSON).
struct Node {
    proc: Proc,
    log: Arc<Mutex<Vec<Value>>>,
    tcp: String,
    monitor: Option<String>,
}

fn start_node(args: &[&str]) -> Node {
    let mut child = skiff()
        .args(["node", "--tcp", "127.0.0.1:0", "--log-format", "json"])
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn skiff node");
    let err = BufReader::new(child.stderr.take().unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    let l2 = log.clone();
    std::thread::spawn(move || {
        for line in err.lines() {
            let Ok(line) = line else { break };
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {line}"));
            l2.lock().unwrap().push(v);
        }
    });
    let mut node = Node {
        proc: Proc(child),
        log,
        tcp: String::new(),
        monitor: None,
    };
    let l = node.wait_log(|m, _| m.starts_with("skiff node listening on tcp "));
    node.tcp = l.rsplit(' ').next().unwrap().to_owned();
    if args.contains(&"--monitor") {
        let l = node.wait_log(|m, _| m.starts_with("skiff node monitoring on http://"));
        node.monitor = Some(l.rsplit("http://").next().unwrap().to_owned());
    }
    node
}

fn message(v: &Value) -> &str {
    v["fields"]["message"].as_str().unwrap_or("")
}

impl Node {
    fn url(&self) -> String {
        format!("skiff://{}", self.tcp)
    }

    /// The first log line whose message and fields satisfy `pred`
    /// (waiting for it); its message.
    fn wait_log(&self, pred: impl Fn(&str, &Value) -> bool) -> String {
        let start = Instant::now();
        loop {
            if let Some(v) = self
                .log
                .lock()
                .unwrap()
                .iter()
                .find(|v| pred(message(v), &v["fields"]))
            {
                return message(v).to_owned();
            }
            if start.elapsed() > PATIENCE {
                let all: Vec<String> = self
                    .log
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_string())
                    .collect();
                panic!("no such log line; the log:\n{}", all.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Log lines with this message.
    fn count_log(&self, msg: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|v| message(v) == msg)
            .count()
    }

    fn get(&self, path: &str) -> (u16, String) {
        http(
            self.monitor.as_deref().expect("started with --monitor"),
            &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        )
    }

    fn json(&self, path: &str) -> Value {
        let (status, body) = self.get(path);
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap()
    }
}

/// Sends `request` as is; the status and body of the answer.
fn http(addr: &str, request: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A Python that has `prometheus_client`, or `None` (said as SKIPPED;
/// a failure under CI, where `scripts/test.sh` installs it).
fn python() -> Option<PathBuf> {
    let p = std::env::var_os("SKIFF_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/py-prom/bin/python")
        });
    let ok = Command::new(&p)
        .args(["-c", "import prometheus_client"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return Some(p);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "no Python with prometheus_client at {} (scripts/test.sh makes it)",
        p.display()
    );
    println!("SKIPPED: no Python with prometheus_client at {} (run scripts/test.sh, or set SKIFF_TEST_PYTHON)", p.display());
    None
}

/// `/metrics` parsed by prometheus_client's OpenMetrics parser: every
/// sample as `name{labels}` → value.
fn scrape(py: &PathBuf, node: &Node) -> std::collections::HashMap<String, f64> {
    let (status, text) = node.get("/metrics");
    assert_eq!(status, 200);
    let script = r#"
import sys, json
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = {}
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        out[f"{s.name}{{{labels}}}"] = s.value
print(json.dumps(out))
"#;
    let mut child = Command::new(py)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the parser refused /metrics:\n{text}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn metrics_move_by_exactly_the_traffic_sent() {
    let Some(py) = python() else { return };
    let node = start_node(&["--monitor", "127.0.0.1:0"]);
    let before = scrape(&py, &node);
    let mut sub = Proc(
        skiff()
            .args(["sub", "-n", &node.url(), "ops.>", "--count", "250"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    until("the subscription", || {
        node.json("/varz")["subscriptions"] == 1
    });
    let st = skiff()
        .args(["pub", "-n", &node.url(), "ops.m", "x{i}", "--count", "250"])
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(
        sub.exit_within(PATIENCE),
        Some(0),
        "the subscriber got all 250"
    );
    until("both clients gone", || {
        node.json("/varz")["connections"] == 0
    });
    let after = scrape(&py, &node);
    let d = |k: &str| after[k] - before.get(k).copied().unwrap_or(0.0);
    assert_eq!(d("skiff_messages_received_total{}"), 250.0);
    assert_eq!(d("skiff_messages_delivered_total{}"), 250.0);
    assert_eq!(d("skiff_client_connections_total{}"), 2.0);
    assert_eq!(d("skiff_messages_dropped_total{reason=subscription}"), 0.0);
    assert_eq!(after["skiff_clients{}"], 0.0);
    assert_eq!(after["skiff_subscriptions{}"], 0.0);
    // The same counters in /varz, from the same snapshot kind.
    let v = node.json("/varz");
    assert_eq!(
        v["messages_received"],
        after["skiff_messages_received_total{}"] as u64
    );
    // JSON log lines for the start, listeners and both clients.
    node.wait_log(|m, f| m == "node starting" && f["monitor"].as_str().is_some());
    node.wait_log(|m, _| m == "listening: clients over tcp");
    node.wait_log(|m, _| m == "listening: monitor (http)");
    assert_eq!(node.count_log("client connected"), 2);
    node.wait_log(|m, f| m == "client left" && f["reason"] == "closed by the client");
}

#[test]
fn monitor_refuses_hostile_requests() {
    let node = start_node(&["--monitor", "127.0.0.1:0"]);
    let addr = node.monitor.clone().unwrap();
    assert_eq!(node.get("/nope").0, 404);
    assert_eq!(node.get("/connz?sort=name").0, 400);
    assert_eq!(node.get("/connz?limit=100000").0, 400);
    assert_eq!(node.get("/varz?x=1").0, 400);
    assert_eq!(node.get("/meshz").0, 404, "not in a mesh");
    let (s, body) = node.get("/connz?sort=pending&limit=5&offset=0&subs=1");
    assert_eq!(s, 200, "{body}");
    let post = http(
        &addr,
        "POST /varz HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
    );
    assert_eq!(post.0, 405);
    // A request head over the bound is refused, not buffered.
    let big = format!(
        "GET /varz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let mut c = TcpStream::connect(&addr).unwrap();
    c.set_read_timeout(Some(PATIENCE)).unwrap();
    let _ = c.write_all(big.as_bytes());
    let mut text = String::new();
    let _ = c.read_to_string(&mut text);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 431"),
        "{text}"
    );
    // The node still answers.
    assert_eq!(node.get("/healthz").0, 200);
}

#[test]
fn connz_names_the_paused_subscriber_as_slow() {
    let node = start_node(&["--monitor", "127.0.0.1:0"]);
    let paused = Proc(
        skiff()
            .args(["sub", "-n", &node.url(), "slow.>", "--queue", "1000"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // A subscriber that keeps up with what it is sent.
    let _healthy = Proc(
        skiff()
            .args(["sub", "-n", &node.url(), "slow.y"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    until("two subscriptions", || {
        node.json("/varz")["subscriptions"] == 2
    });
    paused.signal(libc::SIGSTOP);
    // Far more than the socket buffers and a 1000-message queue hold.
    let payload = "p".repeat(1000);
    let mut publisher = Proc(
        skiff()
            .args([
                "pub",
                "-n",
                &node.url(),
                "slow.x",
                &payload,
                "--count",
                "1000000",
            ])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    until("drops", || {
        node.json("/varz")["messages_dropped"].as_u64() > Some(0)
    });
    let st = skiff()
        .args(["pub", "-n", &node.url(), "slow.y", "y{i}", "--count", "100"])
        .status()
        .unwrap();
    assert!(st.success());
    let healthy_got_all =
        || {
            let c = node.json("/connz?subs=1");
            c["clients"].as_array().unwrap().iter().any(|c| {
                c["subscription_list"][0]["pattern"] == "slow.y" && c["messages_out"] == 100
            })
        };
    until("the healthy subscriber to get all 100", healthy_got_all);
    // `skiff top` names it while it drops.
    let top = skiff()
        .args(["top", "-n", &node.url(), "--once", "--interval", "0.5"])
        .output()
        .unwrap();
    let screen = String::from_utf8_lossy(&top.stdout);
    assert!(top.status.success(), "{screen}");
    assert!(
        screen.contains("'slow.>' (drop-oldest)") && screen.contains("SLOW"),
        "{screen}"
    );
    assert!(!screen.contains("'slow.y'"), "{screen}");
    let c = node.json("/connz?sort=dropped&subs=1");
    let clients = c["clients"].as_array().unwrap();
    let by_pattern = |p: &str| {
        clients
            .iter()
            .find(|c| c["subscription_list"][0]["pattern"] == p)
            .unwrap_or_else(|| panic!("no client subscribed to {p}: {c}"))
    };
    let slow = by_pattern("slow.>");
    let fine = by_pattern("slow.y");
    assert_eq!(fine["slow_consumer"], false, "{c}");
    assert_eq!(fine["dropped"], 0, "{c}");
    assert_eq!(slow["slow_consumer"], true, "{c}");
    for other in clients.iter().filter(|c| c["id"] != slow["id"]) {
        assert_eq!(other["slow_consumer"], false, "{c}");
    }
    assert_eq!(
        clients[0]["id"], slow["id"],
        "sorted by drops, the slow one first"
    );
    assert!(slow["dropped"].as_u64() > Some(0));
    let sid = slow["subscription_list"][0]["sid"].clone();
    assert_eq!(slow["slow_subscriptions"][0], sid);
    // The warning names the client and the subscription.
    node.wait_log(|m, f| {
        m == "slow consumer: subscription dropping messages"
            && f["client"] == slow["id"]
            && f["sid"] == sid
            && f["pattern"] == "slow.>"
    });
    publisher.signal(libc::SIGKILL);
    let _ = publisher.exit_within(PATIENCE);
    paused.signal(libc::SIGCONT);
}

#[test]
fn healthz_goes_from_503_to_200_as_the_mesh_forms() {
    let port = |_| {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (pa, pb) = (port(0), port(1));
    let b = start_node(&[
        "--monitor",
        "127.0.0.1:0",
        "--mesh",
        &format!("127.0.0.1:{pb}"),
        "--seeds",
        &format!("127.0.0.1:{pa}"),
        "--no-scout",
    ]);
    let (s, body) = b.get("/healthz");
    assert_eq!(s, 503, "{body}");
    assert!(body.contains("mesh not converged"), "{body}");
    let mut a = start_node(&[
        "--mesh",
        &format!("127.0.0.1:{pa}"),
        "--seeds",
        &format!("127.0.0.1:{pb}"),
        "--no-scout",
    ]);
    until("healthz 200", || b.get("/healthz").0 == 200);
    b.wait_log(|m, f| m == "mesh member up" && f["peer"] == format!("127.0.0.1:{pa}"));
    let mz = b.json("/meshz");
    assert_eq!(mz["members_up"], 1, "{mz}");
    assert_eq!(mz["peers"][0]["state"], "up", "{mz}");
    // A leaves gracefully on SIGTERM: B hears it go without suspecting
    // it first.
    let a_addr = format!("127.0.0.1:{pa}");
    a.proc.signal(libc::SIGTERM);
    assert_eq!(a.proc.exit_within(PATIENCE), Some(0));
    a.wait_log(|m, _| m == "leaving the mesh");
    b.wait_log(|m, f| m == "mesh member down" && f["peer"] == a_addr);
    assert_eq!(
        b.count_log("mesh member suspected down (not answering probes)"),
        0
    );
    // A comes back, then freezes: B suspects it, then declares it down.
    let a = start_node(&[
        "--mesh",
        &a_addr,
        "--seeds",
        &format!("127.0.0.1:{pb}"),
        "--no-scout",
    ]);
    until("A up again", || b.count_log("mesh member up") == 2);
    a.proc.signal(libc::SIGSTOP);
    b.wait_log(|m, f| {
        m == "mesh member suspected down (not answering probes)" && f["peer"] == a_addr
    });
    until("A down again", || b.count_log("mesh member down") == 2);
    a.proc.signal(libc::SIGKILL);
}

#[test]
fn reload_changes_a_limit_without_dropping_a_client() {
    let dir = std::env::temp_dir().join(format!("skiff-ops-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("node.toml");
    std::fs::write(&file, "[limits]\nmax_subscriptions = 100\n").unwrap();
    let node = start_node(&[
        "--monitor",
        "127.0.0.1:0",
        "--config",
        file.to_str().unwrap(),
    ]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let c = rt.block_on(skiff::Client::connect(&node.url())).unwrap();
    let mut keep = Vec::new();
    for i in 0..3 {
        keep.push(rt.block_on(c.subscribe(&format!("r.{i}"), "")).unwrap());
    }
    // SIGHUP with a lower limit (and a listener change, which needs a
    // restart and is only named).
    std::fs::write(&file, "spin_us = 7\n[limits]\nmax_subscriptions = 3\n").unwrap();
    node.proc.signal(libc::SIGHUP);
    node.wait_log(|m, f| {
        m == "configuration reloaded" && f["changed"] == "max_subscriptions: 100 -> 3"
    });
    node.wait_log(|m, f| m.contains("needs a restart") && f["setting"] == "spin_us");
    let Err(e) = rt.block_on(c.subscribe("r.3", "")) else {
        panic!("a subscription over the new limit was taken")
    };
    assert!(e.to_string().contains("max_subscriptions"), "{e}");
    assert_eq!(node.json("/varz")["limits"]["max_subscriptions"], 3);
    // A bad file is refused whole; the limit stays.
    std::fs::write(&file, "[limits]\nmax_subscriptions = 50\nbogus = 1\n").unwrap();
    node.proc.signal(libc::SIGHUP);
    node.wait_log(|m, f| {
        m.starts_with("reload refused") && f["reason"].as_str().unwrap_or("").contains("node.toml")
    });
    assert_eq!(node.json("/varz")["limits"]["max_subscriptions"], 3);
    let out = skiff()
        .args(["reload", "-n", &node.url()])
        .output()
        .unwrap();
    assert!(!out.status.success(), "a bad file fails `skiff reload` too");
    assert!(String::from_utf8_lossy(&out.stderr).contains("node.toml"));
    // `skiff reload` with a good file.
    std::fs::write(&file, "[limits]\nmax_subscriptions = 10\n").unwrap();
    let out = skiff()
        .args(["reload", "-n", &node.url()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    node.wait_log(|m, f| {
        m == "configuration reloaded" && f["changed"] == "max_subscriptions: 3 -> 10"
    });
    keep.push(rt.block_on(c.subscribe("r.3", "")).unwrap());
    // The client never left: it still gets what is published to it.
    rt.block_on(c.publish(skiff::Message::new("r.0", "still here")))
        .unwrap();
    let got = rt
        .block_on(async { tokio::time::timeout(PATIENCE, keep[0].recv()).await })
        .unwrap()
        .unwrap();
    assert_eq!(&got.msg.payload[..], b"still here");
    assert_eq!(
        node.count_log("client left"),
        2,
        "only the two `skiff reload` clients left"
    );
    node.wait_log(|m, f| m == "limit reached" && f["cause"] == "max_subscriptions");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_drains_a_subscribers_pending_messages() {
    let mut node = start_node(&[
        "--monitor",
        "127.0.0.1:0",
        "--set",
        "drain_timeout_ms=20000",
    ]);
    let mut sub = Proc(
        skiff()
            .args(["sub", "-n", &node.url(), "d.>", "--count", "6000"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    node.wait_log(|m, _| m == "client connected");
    std::thread::sleep(Duration::from_millis(300));
    sub.signal(libc::SIGSTOP);
    // More than the subscriber's credit: most wait in the node for it
    // (6 MB, within the 16 MiB pending bound and the queue: none dropped).
    let payload = "q".repeat(1000);
    let st = skiff()
        .args(["pub", "-n", &node.url(), "d.x", &payload, "--count", "6000"])
        .status()
        .unwrap();
    assert!(st.success());
    node.proc.signal(libc::SIGTERM);
    node.wait_log(|m, _| m.starts_with("shutting down"));
    // Draining: unhealthy, and new clients are refused.
    let (status, body) = node.get("/healthz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("shutting down"), "{body}");
    let late = skiff()
        .args(["pub", "-n", &node.url(), "d.x", "late"])
        .output()
        .unwrap();
    assert!(!late.status.success(), "a client during the drain");
    // The node waits for the paused subscriber; it wakes and takes all.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        node.proc.exit_within(Duration::ZERO),
        None,
        "still draining"
    );
    sub.signal(libc::SIGCONT);
    assert_eq!(
        sub.exit_within(PATIENCE),
        Some(0),
        "the subscriber got all 6000"
    );
    assert_eq!(node.proc.exit_within(PATIENCE), Some(0));
    node.wait_log(|m, _| m == "queues drained");
    node.wait_log(|m, _| m == "stopped");
}

#[test]
fn a_second_signal_exits_at_once() {
    let mut node = start_node(&["--set", "drain_timeout_ms=60000"]);
    let sub = Proc(
        skiff()
            .args(["sub", "-n", &node.url(), "e.>"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    node.wait_log(|m, _| m == "client connected");
    std::thread::sleep(Duration::from_millis(300));
    sub.signal(libc::SIGSTOP);
    let payload = "q".repeat(1000);
    let st = skiff()
        .args([
            "pub",
            "-n",
            &node.url(),
            "e.x",
            &payload,
            "--count",
            "20000",
        ])
        .status()
        .unwrap();
    assert!(st.success());
    node.proc.signal(libc::SIGTERM);
    node.wait_log(|m, _| m.starts_with("shutting down"));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        node.proc.exit_within(Duration::ZERO),
        None,
        "draining a paused subscriber"
    );
    node.proc.signal(libc::SIGTERM);
    assert_eq!(node.proc.exit_within(Duration::from_secs(5)), Some(1));
    node.wait_log(|m, _| m.starts_with("second signal"));
    sub.signal(libc::SIGCONT);
}

/// A NATS client over a plain socket: `CONNECT` as `user` with `pass`
/// and `name`, answered (`PING` → `PONG`).
struct NatsConn {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl NatsConn {
    fn connect(addr: &str, user: &str, pass: &str, name: &str) -> NatsConn {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut c = NatsConn {
            w: s.try_clone().unwrap(),
            r: BufReader::new(s),
        };
        assert!(c.line().starts_with("INFO "));
        c.send(&format!(
            "CONNECT {{\"verbose\":false,\"pedantic\":false,\"user\":\"{user}\",\"pass\":\"{pass}\",\"name\":\"{name}\"}}\r\nPING\r\n"
        ));
        assert_eq!(c.line(), "PONG");
        c
    }

    fn send(&mut self, s: &str) {
        self.w.write_all(s.as_bytes()).unwrap();
    }

    /// The next line, without its CRLF; empty at the end of the stream.
    fn line(&mut self) -> String {
        let mut l = String::new();
        let _ = self.r.read_line(&mut l);
        l.trim_end().to_owned()
    }
}

/// A free TCP port on loopback (for a listener given by number).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn reload_swaps_users_and_permissions() {
    let dir = std::env::temp_dir().join(format!("skiff-ops-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("node.toml");
    let hash = skiff_node::auth::hash_password;
    let (ha, hb, hc) = (hash("alice-pw"), hash("bob-pw"), hash("carol-pw"));
    let user = |name: &str, hash: &str, perms: &str| {
        format!("[[auth.users]]\nname = \"{name}\"\npassword_hash = \"{hash}\"\n{perms}")
    };
    let bob_wide = "[auth.users.permissions]\npublish = { allow = [\"a.>\", \"b.>\"] }\nsubscribe = { allow = [\"a.>\", \"b.>\"] }\n";
    let bob_narrow = "[auth.users.permissions]\npublish = { allow = [\"b.>\"] }\nsubscribe = { allow = [\"b.>\"] }\n";
    std::fs::write(
        &file,
        format!(
            "[auth]\n{}{}",
            user("alice", &ha, ""),
            user("bob", &hb, bob_wide)
        ),
    )
    .unwrap();
    let nats = format!("127.0.0.1:{}", free_port());
    let node = start_node(&[
        "--monitor",
        "127.0.0.1:0",
        "--config",
        file.to_str().unwrap(),
        "--nats",
        &nats,
    ]);
    node.wait_log(|m, _| m.starts_with("skiff node listening for NATS clients"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // An argon2 check in a debug node on a loaded 2-core machine can overrun
    // the default 1.5 s connect timeout.
    let url =
        |u: &str, p: &str| format!("{}?user={u}&password={p}&connect_timeout=20s", node.url());
    assert!(
        rt.block_on(skiff::Client::connect(&url("carol", "carol-pw")))
            .is_err(),
        "carol is not a user yet"
    );
    let alice = rt
        .block_on(skiff::Client::connect_with(
            &url("alice", "alice-pw"),
            skiff::ClientOptions::new().name("alice-app"),
        ))
        .unwrap();
    let mut alice_sub = rt.block_on(alice.subscribe("a.>", "")).unwrap();
    let bob = rt
        .block_on(skiff::Client::connect(&format!(
            "{}&name=bob-app",
            url("bob", "bob-pw")
        )))
        .unwrap();
    let mut bob_a = rt.block_on(bob.subscribe("a.x", "")).unwrap();
    let mut bob_b = rt.block_on(bob.subscribe("b.x", "")).unwrap();
    let mut nats_alice = NatsConn::connect(&nats, "alice", "alice-pw", "nats-alice");
    nats_alice.send("SUB a.> 1\r\nPING\r\n");
    assert_eq!(nats_alice.line(), "PONG");
    // `/connz` names each client and its user.
    let c = node.json("/connz");
    let named: Vec<(String, String)> = c["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or("").to_owned(),
                c["user"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for want in [
        ("alice-app", "alice"),
        ("bob-app", "bob"),
        ("nats-alice", "alice"),
    ] {
        assert!(
            named.iter().any(|(n, u)| (n.as_str(), u.as_str()) == want),
            "{want:?} not in {c}"
        );
    }

    // Carol added, alice removed, bob narrowed to b.>.
    std::fs::write(
        &file,
        format!(
            "[auth]\n{}{}",
            user("carol", &hc, ""),
            user("bob", &hb, bob_narrow)
        ),
    )
    .unwrap();
    node.proc.signal(libc::SIGHUP);
    let reloaded = node.wait_log(|m, f| {
        m == "configuration reloaded" && f["changed"].as_str().unwrap_or("").contains("auth")
    });
    assert!(!reloaded.is_empty());
    node.wait_log(|m, f| {
        m == "configuration reloaded"
            && f["changed"]
                .as_str()
                .unwrap_or("")
                .contains("2 clients disconnected, 1 given new permissions, 1 subscriptions ended")
    });
    // A user added by the reload connects, and bob (still connected) gets
    // what it publishes.
    let carol = rt
        .block_on(skiff::Client::connect(&url("carol", "carol-pw")))
        .unwrap();
    rt.block_on(carol.publish(skiff::Message::new("b.x", "from carol")))
        .unwrap();
    let got = rt
        .block_on(async { tokio::time::timeout(PATIENCE, bob_b.recv()).await })
        .unwrap()
        .unwrap();
    assert_eq!(&got.msg.payload[..], b"from carol");
    // Alice's clients are cut, told why.
    let end = rt
        .block_on(async { tokio::time::timeout(PATIENCE, alice_sub.recv()).await })
        .unwrap();
    assert!(end.is_none(), "alice's subscription still delivers");
    let e = rt
        .block_on(alice.publish(skiff::Message::new("a.y", "x")))
        .unwrap_err()
        .to_string();
    assert!(e.contains("user `alice` was removed"), "{e}");
    assert_eq!(nats_alice.line(), "-ERR 'Authorization Violation'");
    assert_eq!(nats_alice.line(), "", "the NATS client is closed");
    assert!(rt
        .block_on(skiff::Client::connect(&url("alice", "alice-pw")))
        .is_err());
    until("two clients cut in the log", || {
        node.count_log("client disconnected by a reload of the users") == 2
    });
    // Bob's narrowed permissions: its a.x subscription ended, told why;
    // a publish to a.x refused; b.x still works.
    let end = rt
        .block_on(async { tokio::time::timeout(PATIENCE, bob_a.recv()).await })
        .unwrap();
    assert!(end.is_none());
    let why = bob_a.error().unwrap_or_default();
    assert!(why.contains("may no longer subscribe to `a.x`"), "{why}");
    rt.block_on(bob.publish(skiff::Message::new("a.x", "refused")))
        .unwrap();
    rt.block_on(bob.flush()).unwrap();
    let (n, last) = bob.async_errors();
    assert_eq!(n, 1);
    let last = last.unwrap_or_default();
    assert!(last.contains("may not publish to `a.x`"), "{last}");
    rt.block_on(bob.publish(skiff::Message::new("b.x", "bob still here")))
        .unwrap();
    let got = rt
        .block_on(async { tokio::time::timeout(PATIENCE, bob_b.recv()).await })
        .unwrap()
        .unwrap();
    assert_eq!(&got.msg.payload[..], b"bob still here");

    // A bad [auth] (carol twice) refuses the whole reload, limits too.
    std::fs::write(
        &file,
        format!(
            "[limits]\nmax_subscriptions = 5\n[auth]\n{}{}",
            user("carol", &hc, ""),
            user("carol", &ha, "")
        ),
    )
    .unwrap();
    node.proc.signal(libc::SIGHUP);
    node.wait_log(|m, f| {
        m.starts_with("reload refused") && f["reason"].as_str().unwrap_or("").contains("two users")
    });
    assert_ne!(node.json("/varz")["limits"]["max_subscriptions"], 5);
    let bob_again = rt
        .block_on(skiff::Client::connect(&url("bob", "bob-pw")))
        .unwrap();
    rt.block_on(bob_again.flush()).unwrap();
    rt.block_on(carol.flush()).unwrap();

    // No secret in the log: no password, no hash.
    let log: String = node
        .log
        .lock()
        .unwrap()
        .iter()
        .map(|v| v.to_string())
        .collect();
    for secret in [
        "alice-pw",
        "bob-pw",
        "carol-pw",
        "$argon2",
        &ha[30..],
        &hc[30..],
    ] {
        assert!(!log.contains(secret), "{secret:?} in the log");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn subsz_lists_patterns_and_clusters_with_their_members() {
    let port = || {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (pa, pb) = (port(), port());
    let a = start_node(&[
        "--monitor",
        "127.0.0.1:0",
        "--mesh",
        &format!("127.0.0.1:{pa}"),
        "--seeds",
        &format!("127.0.0.1:{pb}"),
        "--no-scout",
    ]);
    let b = start_node(&[
        "--mesh",
        &format!("127.0.0.1:{pb}"),
        "--seeds",
        &format!("127.0.0.1:{pa}"),
        "--no-scout",
    ]);
    until("the mesh", || a.get("/healthz").0 == 200);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let named = |n: &str| skiff::ClientOptions::new().name(n);
    let c1 = rt
        .block_on(skiff::Client::connect_with(&a.url(), named("one")))
        .unwrap();
    let c2 = rt
        .block_on(skiff::Client::connect_with(&a.url(), named("two")))
        .unwrap();
    let remote = rt.block_on(skiff::Client::connect(&b.url())).unwrap();
    let _s = [
        rt.block_on(c1.subscribe("x.*", "t")).unwrap(),
        rt.block_on(c1.subscribe("x.*", "t")).unwrap(),
        rt.block_on(c2.subscribe("x.*", "t")).unwrap(),
        rt.block_on(c2.subscribe_with("x.a*", "*", skiff::client::SubOptions::default().cmsg()))
            .unwrap(),
        rt.block_on(c2.subscribe("y.>", "*")).unwrap(),
    ];
    let _m = [
        rt.block_on(c1.join("svc", 3)).unwrap(),
        rt.block_on(c2.join("svc", 5)).unwrap(),
        rt.block_on(c2.join("aux", 1)).unwrap(),
        rt.block_on(remote.join("svc", 7)).unwrap(),
    ];
    let b_mesh = format!("127.0.0.1:{pb}");
    until("the remote member", || {
        a.json("/subsz")["clusters"][1]["remote"][0]["node"] == b_mesh.as_str()
    });
    let s = a.json("/subsz");
    assert_eq!(s["subscriptions"], 5, "{s}");
    assert_eq!(s["patterns_distinct"], 3, "{s}");
    let p = &s["patterns"];
    assert_eq!(
        p[0],
        serde_json::json!({"pattern": "x.*", "type": "t", "kind": "token",
            "subscriptions": 3, "clients": 2, "queued": 0, "delivered": 0, "dropped": 0}),
        "{s}"
    );
    assert_eq!(
        (&p[1]["pattern"], &p[1]["kind"]),
        (&"x.a*".into(), &"cmsg".into()),
        "{s}"
    );
    assert_eq!(
        (&p[2]["pattern"], &p[2]["subscriptions"]),
        (&"y.>".into(), &1.into()),
        "{s}"
    );
    assert_eq!(s["clusters_total"], 2, "{s}");
    let aux = &s["clusters"][0];
    assert_eq!(aux["name"], "aux");
    assert_eq!(
        aux["local"],
        serde_json::json!([{"client": c2.id(), "name": "two", "capacity": 1}])
    );
    let svc = &s["clusters"][1];
    assert_eq!(svc["name"], "svc");
    assert_eq!(svc["members"], 3, "{s}");
    assert_eq!(
        svc["local"],
        serde_json::json!([
            {"client": c1.id(), "name": "one", "capacity": 3},
            {"client": c2.id(), "name": "two", "capacity": 5},
        ]),
        "{s}"
    );
    assert_eq!(
        svc["remote"],
        serde_json::json!([{"node": b_mesh, "capacity": 7}]),
        "{s}"
    );
    // Paging, and a bad parameter named.
    let page = a.json("/subsz?offset=1&limit=1&cluster_offset=1&cluster_limit=1&members=1");
    assert_eq!(page["patterns"].as_array().unwrap().len(), 1, "{page}");
    assert_eq!(page["patterns"][0]["pattern"], "x.a*", "{page}");
    assert_eq!(page["clusters"][0]["name"], "svc", "{page}");
    assert_eq!(
        page["clusters"][0]["local"].as_array().unwrap().len(),
        1,
        "{page}"
    );
    assert_eq!(page["clusters"][0]["members"], 3, "{page}");
    let (status, body) = a.get("/subsz?limit=0");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("limit=0"), "{body}");
    let (status, body) = a.get("/subsz?bogus=1");
    assert_eq!(status, 400, "{body}");
    // `skiff stats` and `skiff top` show the names too.
    let out = skiff().args(["stats", "-n", &a.url()]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("client {} one ", c1.id())), "{text}");
    let top = skiff()
        .args(["top", "-n", &a.url(), "--once", "--interval", "0.2"])
        .output()
        .unwrap();
    let screen = String::from_utf8_lossy(&top.stdout);
    assert!(screen.contains("two"), "{screen}");
    drop(b);
}
