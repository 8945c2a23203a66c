//! `skiff node`, `pub`, `sub`, `req`, `reply` and `stats` as separate
//! processes over TCP and a Unix socket.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn skiff() -> Command {
    Command::new(env!("CARGO_BIN_EXE_skiff"))
}

struct Node {
    child: Child,
    tcp: String,
    unix: String,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a node on a free TCP port and a fresh Unix socket; returns once
/// it listens.
fn start_node() -> Node {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let sock = std::env::temp_dir().join(format!("skiff-cli-{}-{port}.sock", std::process::id()));
    let mut child = skiff()
        .args(["node", "--tcp", &format!("127.0.0.1:{port}")])
        .args(["--unix", sock.to_str().unwrap()])
        .args(["--set", "max_payload=100000"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn skiff node");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("listening on unix") {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "node exited: {seen}");
        seen += &line;
    }
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    Node {
        child,
        tcp: format!("skiff://127.0.0.1:{port}"),
        unix: format!("unix://{}", sock.display()),
    }
}

fn run(args: &[&str]) -> String {
    let out = skiff().args(args).output().expect("run skiff");
    assert!(
        out.status.success(),
        "skiff {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Waits until the node reports `n` subscriptions (a subscriber process
/// is ready).
fn wait_subs(node: &str, n: usize) {
    let t = Instant::now();
    loop {
        let s = run(&["stats", "-n", node, "--json"]);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        if v["subscriptions"].as_u64() == Some(n as u64) {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no subscriber: {s}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn pub_sub_req_reply_stats_between_processes() {
    let node = start_node();
    // sub over the Unix socket, pub over TCP.
    let mut sub = skiff()
        .args(["sub", "-n", &node.unix, "cli.>", "--count", "2"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_subs(&node.tcp, 1);
    run(&["pub", "-n", &node.tcp, "cli.a", "hello", "--type", "greet"]);
    run(&["pub", "-n", &node.tcp, "cli.b.c", "world"]);
    let mut out = String::new();
    sub.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(sub.wait().unwrap().success());
    assert_eq!(out, "cli.a [greet] hello\ncli.b.c world\n");

    // reply as a cluster member; req to the cluster.
    let mut rep = skiff()
        .args([
            "reply",
            "-n",
            &node.tcp,
            "echo",
            "--cluster",
            "--count",
            "1",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(rep.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("member of cluster echo"), "{line}");
    let r = run(&["req", "-n", &node.unix, "echo", "ping", "--cluster"]);
    assert_eq!(r, "ping\n");
    assert!(rep.wait().unwrap().success());

    // Nobody left: no responders, at once.
    let out = skiff()
        .args([
            "req",
            "-n",
            &node.tcp,
            "echo",
            "x",
            "--cluster",
            "--timeout",
            "30",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no responders"));

    let s = run(&["stats", "-n", &node.tcp]);
    assert!(s.contains("published 2"), "{s}");
    assert!(s.contains("no responders 1"), "{s}");
}

#[test]
fn node_refuses_a_bad_config_and_stops_gracefully() {
    let out = skiff()
        .args(["node", "--set", "max_payload=lots"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("whole number"));

    let mut node = start_node();
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(node.child.id() as i32, libc::SIGTERM);
    }
    let t = Instant::now();
    loop {
        if let Some(st) = node.child.try_wait().unwrap() {
            assert!(st.success(), "{st:?}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "node did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
}
