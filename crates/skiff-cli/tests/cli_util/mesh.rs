//! Meshed `skiff node` processes on loopback for CLI tests (seeded, no
//! scouting, a network name of their own), and what those tests ask of
//! them: stats, interest, lines of a subscriber.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{free_port, run, skiff};

/// How long any awaited condition may take.
pub(crate) const PATIENCE: Duration = Duration::from_secs(20);

/// A child process killed (SIGKILL) and reaped on drop.
pub(crate) struct Proc(pub(crate) Child);

impl Proc {
    /// Sends `sig` to the process (SIGSTOP, SIGCONT, …).
    pub(crate) fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid, with no memory involved.
        let r = unsafe { libc::kill(self.0.id() as libc::pid_t, sig) };
        assert_eq!(r, 0, "kill {sig}");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a meshed node on free ports (seeded by `seeds`, if any); returns
/// once it listens, with its client and mesh addresses. Its failure
/// detector is quick (probes every 500 ms, 1.5 s of suspicion; the
/// defaults are patient), so a test that stops a node sees it declared
/// down soon, and one that must not be declared down holds past that.
pub(crate) fn mesh_node(net: &str, seeds: &str) -> (Proc, String, String) {
    mesh_node_with(net, seeds, &[])
}

/// [`mesh_node`] with more arguments for `skiff node` (`extra`); with
/// `--shm` among them, returns once the shared-memory listener is up too.
pub(crate) fn mesh_node_with(net: &str, seeds: &str, extra: &[&str]) -> (Proc, String, String) {
    let tcp = format!("127.0.0.1:{}", free_port());
    let mport = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mesh = format!("127.0.0.1:{mport}");
    let mut args = vec!["node", "--tcp", &tcp, "--mesh", &mesh, "--net", net];
    args.push("--no-scout");
    if !seeds.is_empty() {
        args.extend(["--seeds", seeds]);
    }
    args.extend(extra);
    let until = if extra.contains(&"--shm") {
        "listening on shm"
    } else {
        "listening on tcp"
    };
    let mut child = skiff()
        .args(&args)
        .env("SKIFF_PROBE_MS", "500")
        .env("SKIFF_SUSPECT_MS", "1500")
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn skiff node");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains(until) {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "node exited");
    }
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    (Proc(child), tcp, mesh)
}

/// `skiff stats --json` of the node at `addr`.
pub(crate) fn stats(addr: &str) -> serde_json::Value {
    let s = run(&["stats", "-n", &format!("skiff://{addr}"), "--json"]);
    serde_json::from_str(&s).unwrap()
}

/// Waits until the stats of the node at `addr` satisfy `f`.
pub(crate) fn wait_stats(addr: &str, what: &str, mut f: impl FnMut(&serde_json::Value) -> bool) {
    let t = Instant::now();
    loop {
        let v = stats(addr);
        if f(&v) {
            return;
        }
        assert!(t.elapsed() < PATIENCE, "{what} on {addr}: {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Patterns the node knows its up peers hold.
pub(crate) fn remote_patterns(v: &serde_json::Value) -> u64 {
    v["mesh"]["peers"].as_array().map_or(0, |ps| {
        ps.iter()
            .filter(|p| p["up"].as_bool() == Some(true))
            .map(|p| p["patterns"].as_u64().unwrap_or(0))
            .sum()
    })
}

/// Lines of a child's pipe, read on a thread.
pub(crate) fn lines(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
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

/// The next line of `rx`, within [`PATIENCE`].
pub(crate) fn next_line(rx: &mpsc::Receiver<String>, what: &str) -> String {
    rx.recv_timeout(PATIENCE)
        .unwrap_or_else(|_| panic!("no line: {what}"))
}

/// A `skiff sub` on the node at `addr` (with `extra` arguments): the
/// process and its standard output's lines.
pub(crate) fn subscribe(
    addr: &str,
    pattern: &str,
    extra: &[&str],
) -> (Proc, mpsc::Receiver<String>) {
    let mut child = skiff()
        .args(["sub", "-n", &format!("skiff://{addr}"), pattern])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = lines(child.stdout.take().unwrap());
    (Proc(child), out)
}
