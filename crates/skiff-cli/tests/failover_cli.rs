//! Client failover between real processes: two `skiff node`s, a
//! `skiff sub -n skiff://A,B`; the first node is killed with SIGKILL and the
//! subscriber keeps receiving what is published through the second.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PATIENCE: Duration = Duration::from_secs(20);

fn skiff() -> Command {
    Command::new(env!("CARGO_BIN_EXE_skiff"))
}

/// A child process killed (SIGKILL) and reaped on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a node on a free TCP port; returns once it listens.
fn start_node() -> (Proc, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = skiff()
        .args(["node", "--tcp", &format!("127.0.0.1:{port}")])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn skiff node");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("listening on tcp") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "node exited");
    }
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    (Proc(child), format!("127.0.0.1:{port}"))
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

/// Waits until the node at `addr` reports `n` subscriptions.
fn wait_subs(addr: &str, n: u64) {
    let t = Instant::now();
    loop {
        let s = run(&["stats", "-n", &format!("skiff://{addr}"), "--json"]);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        if v["subscriptions"].as_u64() == Some(n) {
            return;
        }
        assert!(t.elapsed() < PATIENCE, "no subscriber on {addr}: {s}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Lines of a child's pipe, read on a thread.
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

fn next_line(rx: &mpsc::Receiver<String>, what: &str) -> String {
    rx.recv_timeout(PATIENCE)
        .unwrap_or_else(|_| panic!("no line: {what}"))
}

#[test]
fn sub_fails_over_when_its_node_is_killed() {
    let (mut a, aa) = start_node();
    let (_b, ba) = start_node();
    let mut sub = Proc(
        skiff()
            .args(["sub", "-n", &format!("skiff://{aa},{ba}"), "fo.>"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let out = lines(sub.0.stdout.take().unwrap());
    let err = lines(sub.0.stderr.take().unwrap());
    wait_subs(&aa, 1);
    run(&["pub", "-n", &format!("skiff://{aa}"), "fo.a", "one"]);
    assert_eq!(next_line(&out, "via A"), "fo.a one");

    // kill -9: no goodbye from the node.
    a.0.kill().unwrap();
    a.0.wait().unwrap();
    // The subscriber restores its subscription on B by itself.
    wait_subs(&ba, 1);
    let said = next_line(&err, "subscribed notice");
    assert!(said.contains("subscribed to fo.>"), "{said}");
    let lost = next_line(&err, "lost notice");
    assert!(lost.contains("lost node") && lost.contains(&aa), "{lost}");
    let over = next_line(&err, "failover notice");
    assert!(
        over.contains("failed over") && over.contains(&ba) && over.contains("may be missing"),
        "{over}"
    );
    for i in 0..3 {
        run(&[
            "pub",
            "-n",
            &format!("skiff://{ba}"),
            &format!("fo.b.{i}"),
            "x",
        ]);
    }
    for i in 0..3 {
        assert_eq!(next_line(&out, "via B"), format!("fo.b.{i} x"));
    }
    assert!(
        out.recv_timeout(Duration::from_millis(200)).is_err(),
        "nothing delivered twice"
    );
}
