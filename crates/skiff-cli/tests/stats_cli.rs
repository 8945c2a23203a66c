//! `skiff stats` on big answers, against a real node process: a client
//! holding 10,000 subscriptions makes the node's stats larger than one
//! frame (1 MiB payload + overhead), which the node sends in pages; and a
//! closed standard output (`skiff stats | head -1`) ends the command
//! quietly, never with a panic.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};

use skiff::client::Subscription;

fn skiff() -> Command {
    Command::new(env!("CARGO_BIN_EXE_skiff"))
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts a node with the default limits (with a mesh of its own when
/// `mesh`); returns once it listens, with its client address.
fn start_node(mesh: bool) -> (Proc, String) {
    let port = free_port();
    let mut cmd = skiff();
    cmd.args(["node", "--tcp", &format!("127.0.0.1:{port}")]);
    if mesh {
        let mport = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        cmd.args(["--mesh", &format!("127.0.0.1:{mport}"), "--no-scout"]);
    }
    let mut child = cmd
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
    (Proc(child), format!("skiff://127.0.0.1:{port}"))
}

/// Subscriptions the big client holds: the node's per-client limit.
const SUBS: usize = 10_000;

/// A client holding [`SUBS`] subscriptions with long patterns (stats of
/// about 1.7 MB, over the 1 MiB + 64 KiB frame bound), kept until the
/// returned runtime and client are dropped (the runtime keeps a worker,
/// so the client goes on answering its node meanwhile).
fn big_client(node: &str) -> (tokio::runtime::Runtime, skiff::Client, Vec<Subscription>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (c, subs) = rt.block_on(async {
        let c = skiff::Client::connect(node).await.unwrap();
        let mut subs = Vec::with_capacity(SUBS);
        for i in 0..SUBS {
            let p = format!("stats.paging.a-rather-long-subject-to-make-big-stats.{i:05}");
            subs.push(c.subscribe(&p, "").await.unwrap());
        }
        (c, subs)
    });
    (rt, c, subs)
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

/// Runs `skiff args`, reads `lines` lines of its output (0: none) and
/// closes the pipe, as `| head -n lines` does; returns its exit code and
/// standard error.
fn run_closed(args: &[&str], lines: usize) -> (Option<i32>, String) {
    let mut child = skiff()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn skiff");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    for _ in 0..lines {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
    }
    drop(out);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (child.wait().unwrap().code(), err)
}

#[test]
fn stats_of_a_client_with_10k_subscriptions() {
    let (_node, addr) = start_node(false);
    let (_rt, _c, _subs) = big_client(&addr);

    let json = run(&["stats", "-n", &addr, "--json"]);
    assert!(
        json.len() > (1 << 20) + (64 << 10),
        "stats of {} bytes",
        json.len()
    );
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["subscriptions"].as_u64(), Some(SUBS as u64));
    assert!(
        v.get("next").is_none(),
        "a page, not the whole: {:?}",
        v["next"]
    );
    let clients = v["clients"].as_array().unwrap();
    let big = clients
        .iter()
        .find(|c| c["subscriptions"].as_array().unwrap().len() == SUBS)
        .expect("the client with every subscription, joined from the pages");
    let sids: Vec<u64> = big["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sid"].as_u64().unwrap())
        .collect();
    assert!(sids.windows(2).all(|w| w[0] < w[1]), "each once, in order");

    let table = run(&["stats", "-n", &addr]);
    let shown = table.lines().filter(|l| l.starts_with("  sub ")).count();
    assert_eq!(shown, SUBS, "every subscription shown");
    assert!(table.contains(".09999 "), "the last one shown");
}

#[test]
fn stats_into_a_closed_pipe_exits_quietly() {
    let (_node, addr) = start_node(false);
    let (_rt, _c, _subs) = big_client(&addr);
    // `skiff stats | head -1`: far more output than a pipe holds.
    let (code, err) = run_closed(&["stats", "-n", &addr], 1);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(code, Some(141), "the exit of a closed pipe: {err}");
}

#[test]
fn stats_mesh_into_a_closed_pipe_exits_quietly() {
    let (_node, addr) = start_node(true);
    // `skiff stats --mesh | head -1`, with the reader gone before the
    // first line (so every write finds the pipe closed).
    let (code, err) = run_closed(&["stats", "-n", &addr, "--mesh"], 0);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(code, Some(141), "the exit of a closed pipe: {err}");
}
