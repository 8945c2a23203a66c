//! A `skiff node` process for CLI tests, and ways to run commands against
//! it.

#![allow(dead_code)]

pub(crate) mod mesh;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStderr, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The `skiff` binary under test.
pub(crate) fn skiff() -> Command {
    Command::new(env!("CARGO_BIN_EXE_skiff"))
}

/// A running `skiff node`, killed when dropped.
pub(crate) struct Node {
    pub(crate) child: Child,
    pub(crate) loc: String,
    pub(crate) stderr: String,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free TCP port on 127.0.0.1.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `skiff node` on a free port with `extra` flags; returns once it
/// printed `until` on standard error.
pub(crate) fn start_node(extra: &[&str], until: &str) -> Node {
    let port = free_port();
    let mut child = skiff()
        .args(["node", "--tcp", &format!("127.0.0.1:{port}")])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn skiff node");
    let err = child.stderr.take().unwrap();
    let stderr = wait_line(err, until, Duration::from_secs(20));
    Node {
        child,
        loc: format!("skiff://127.0.0.1:{port}"),
        stderr,
    }
}

/// Reads `err` until a line contains `until` (panics after `limit` or at
/// the end), then drains the rest in the background; returns what it read.
pub(crate) fn wait_line(err: ChildStderr, until: &str, limit: Duration) -> String {
    let (tx, rx) = mpsc::channel();
    let awaited = until.to_owned();
    let until = until.to_owned();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let so_far = seen.clone();
    std::thread::spawn(move || {
        let mut r = BufReader::new(err);
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                let _ = tx.send(Err(()));
                return;
            }
            seen.lock().unwrap().push_str(&line);
            if line.contains(&until) {
                let _ = tx.send(Ok(()));
                break;
            }
        }
        let _ = std::io::copy(&mut r, &mut std::io::sink());
    });
    let r = rx.recv_timeout(limit);
    let seen = so_far.lock().unwrap().clone();
    match r {
        Ok(Ok(())) => seen,
        Ok(Err(())) => panic!("ended before a line with {awaited:?}: {seen}"),
        Err(_) => panic!("no line with {awaited:?} within {limit:?}; it said: {seen}"),
    }
}

/// Runs `skiff args` and returns its output, whatever its status.
pub(crate) fn output(args: &[&str]) -> Output {
    skiff().args(args).output().expect("run skiff")
}

/// Runs `skiff args`, which must succeed; returns its standard output.
pub(crate) fn run(args: &[&str]) -> String {
    let out = output(args);
    assert!(
        out.status.success(),
        "skiff {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `skiff args`, which must fail; returns its standard error.
pub(crate) fn fails(args: &[&str]) -> String {
    let out = output(args);
    assert!(
        !out.status.success(),
        "skiff {args:?} succeeded: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Reads all of a child's standard output.
pub(crate) fn read_all(mut r: impl Read) -> String {
    let mut s = String::new();
    r.read_to_string(&mut s).unwrap();
    s
}
