//! What a new user met on the command line (issue 21), one test each:
//! help that lists every command and the defaults the code uses, one
//! duration syntax, `push` without a port or with `--interval`, `sub` that
//! says it subscribed and that it does not answer requests, `req` that
//! says what a silence may mean, errors that name the real cause, and
//! `stats` that names clusters and every mesh counter.

mod cli_util;

use std::process::Stdio;
use std::time::{Duration, Instant};

use cli_util::{fails, free_port, output, read_all, run, skiff, start_node, wait_line};

/// The commands under `Commands:` in `skiff --help`.
fn listed_commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn help_lists_every_command_and_its_summary_names_no_subset() {
    let help = run(&["--help"]);
    let listed = listed_commands(&help);
    for c in [
        "node",
        "pub",
        "sub",
        "req",
        "reply",
        "join",
        "broadcast",
        "tunnel",
        "push",
        "pop",
        "cat",
        "stats",
        "demo",
        "bench",
        "completions",
        "man",
    ] {
        assert!(listed.iter().any(|l| l == c), "{c} missing from: {help}");
        // Each listed command has its own help.
        run(&[c, "--help"]);
    }
    // The summary above `Usage:` either names no command or all of them
    // (it once named 5 of 11).
    let summary = help.split("Usage:").next().unwrap();
    let named = listed
        .iter()
        .filter(|c| {
            summary
                .split(|ch: char| !ch.is_ascii_alphanumeric())
                .any(|w| w == c.as_str())
        })
        .count();
    assert!(named == 0 || named == listed.len(), "{summary}");
}

#[test]
fn node_help_gives_the_spin_default_the_node_uses() {
    let help = run(&["node", "--help"]);
    let want = format!("default {}", skiff::spin::DEFAULT_SPIN_US);
    assert!(help.contains(&want), "{help}");
}

#[test]
fn one_duration_syntax_for_flags_and_locator_options() {
    let node = start_node(&[], "listening on tcp");
    let mut rep = skiff()
        .args(["reply", "-n", &node.loc, "svc", "--count", "3"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_line(
        rep.stderr.take().unwrap(),
        "answering",
        Duration::from_secs(20),
    );
    // Seconds, a unit, a fraction: every flag takes all three.
    for t in ["1s", "1500ms", "0.75"] {
        assert_eq!(
            run(&["req", "-n", &node.loc, "svc", "x", "--timeout", t]),
            "x\n"
        );
    }
    assert!(rep.wait().unwrap().success());
    // `pop --idle` and a locator option without a unit (seconds).
    let port = free_port();
    let t = Instant::now();
    let out = output(&["pop", &format!("udp://127.0.0.1:{port}"), "--idle", "0.3"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(t.elapsed() < Duration::from_secs(20));
    let out = output(&[
        "push",
        &format!("127.0.0.1:{port}"),
        "m",
        "--from",
        "udp://0.0.0.0:0?timeout=0.2&qthresh=512",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = fails(&["req", "-n", &node.loc, "svc", "--timeout", "soon"]);
    assert!(err.contains("200ms") && err.contains("0.5"), "{err}");
}

#[test]
fn push_needs_a_port_and_says_interval_overrides_batching() {
    let err = fails(&["push", "127.0.0.1", "x"]);
    assert!(err.contains("no port"), "{err}");
    let err = fails(&["push", "::1", "x"]);
    assert!(err.contains("no port"), "{err}");
    let port = free_port();
    let out = output(&[
        "push",
        &format!("127.0.0.1:{port}"),
        "a",
        "b",
        "--interval",
        "1ms",
        "--from",
        "udp://0.0.0.0:0?qthresh=4096&timeout=50ms",
    ]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--interval") && err.contains("qthresh and timeout"),
        "{err}"
    );
    // Help says so too.
    assert!(run(&["push", "--help"]).contains("no longer apply"));
}

#[test]
fn sub_says_it_subscribed_and_that_it_does_not_answer_requests() {
    let node = start_node(&[], "listening on tcp");
    let mut sub = skiff()
        .args(["sub", "-n", &node.loc, "asks.>", "--count", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // No sleep, no polling: the line says the subscription is in place.
    let mut err = sub.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut buf = [0u8; 4096];
        let mut seen = String::new();
        while let Ok(n @ 1..) = err.read(&mut buf) {
            seen += &String::from_utf8_lossy(&buf[..n]);
            let _ = tx.send(seen.clone());
        }
    });
    let mut seen = String::new();
    while !seen.contains("subscribed to asks.>") {
        seen = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("a subscribed line");
    }
    // A request only the plain subscriber gets: it times out, and says
    // what may have happened.
    let err = fails(&[
        "req",
        "-n",
        &node.loc,
        "asks.one",
        "q",
        "--timeout",
        "300ms",
    ]);
    assert!(
        err.contains("no reply within") && err.contains("skiff reply"),
        "{err}"
    );
    // Scatter-gather with nobody answering fails too (it printed nothing
    // and exited 0).
    let out = output(&[
        "req",
        "-n",
        &node.loc,
        "asks.two",
        "q",
        "--many",
        "3",
        "--timeout",
        "300ms",
    ]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no replies within"));
    assert!(sub.wait().unwrap().success());
    let printed = read_all(sub.stdout.take().unwrap());
    assert_eq!(printed, "asks.one q\nasks.two q\n");
    while !seen.contains("(2 so far)") {
        seen = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the warnings");
    }
    assert!(seen.contains("is not answered"), "{seen}");
}

#[test]
fn errors_name_the_real_cause() {
    // A node locator without a scheme suggests a node's scheme.
    let err = fails(&["pub", "-n", "127.0.0.1:4747", "a", "b"]);
    assert!(err.contains("skiff://") && !err.contains("udp://"), "{err}");
    // No node serves this shared memory: not "the node refused".
    let dir = std::env::temp_dir().join(format!("skiff-noshm-{}", std::process::id()));
    let loc = format!("shm://nobody?dir={}", dir.display());
    let err = fails(&["pub", "-n", &loc, "a", "b"]);
    assert!(err.contains("no node serves shared memory"), "{err}");
    assert!(!err.contains("refused"), "{err}");
    // A log that cannot be opened is not a node out of reach.
    let err = fails(&["pub", "-n", "file:///nonexistent-dir-skiff/x.log", "a", "b"]);
    assert!(err.contains("cannot open the log"), "{err}");
    assert!(!err.contains("reach the node"), "{err}");
    let err = fails(&["req", "-n", "file:///tmp/x.log", "a"]);
    assert!(err.contains("not a node"), "{err}");
    // A bad shm name is refused before the node listens on anything.
    let out = output(&["node", "--tcp", "127.0.0.1:0", "--shm", "bad/name"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("listening"), "{err}");
    assert!(err.contains("shm") && !err.contains("host:port"), "{err}");
    // An address in use is named.
    let node = start_node(&[], "listening on tcp");
    let addr = node.loc.trim_start_matches("skiff://");
    let err = fails(&["node", "--tcp", addr]);
    assert!(err.contains(addr) && err.contains("in use"), "{err}");
}

#[test]
fn sub_refuses_a_missing_log_and_commands_refuse_mem() {
    let path = std::env::temp_dir().join(format!("skiff-missing-{}.log", std::process::id()));
    let loc = format!("file://{}", path.display());
    let t = Instant::now();
    let err = fails(&["sub", "-n", &loc, ">"]);
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(err.contains("no log at"), "{err}");
    assert!(!path.exists(), "sub created {}", path.display());
    for args in [
        &["pub", "-n", "mem://", "a", "b"][..],
        &["sub", "-n", "mem://", "a", "--count", "1"],
        &["req", "-n", "mem://", "a"],
        &["stats", "-n", "mem://"],
        &["join", "-n", "mem://", "c"],
    ] {
        let err = fails(args);
        assert!(err.contains("inside this one process"), "{args:?}: {err}");
    }
}

#[test]
fn stats_names_clusters_and_every_mesh_counter() {
    let net = format!("stats-{}", std::process::id());
    let node = start_node(
        &["--mesh", "127.0.0.1:0", "--net", &net, "--no-scout"],
        "in mesh",
    );
    let mut m = skiff()
        .args(["join", "-n", &node.loc, "pool", "--capacity", "5"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_line(
        m.stderr.take().unwrap(),
        "member of cluster",
        Duration::from_secs(20),
    );
    let s = run(&["stats", "-n", &node.loc]);
    assert!(
        s.contains("cluster pool: client ") && s.contains("(capacity 5)"),
        "{s}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&run(&["stats", "-n", &node.loc, "--json"])).unwrap();
    assert_eq!(v["cluster_members"][0]["name"], "pool", "{v}");
    let mesh = run(&["stats", "-n", &node.loc, "--mesh"]);
    assert!(mesh.contains("frames too large 0"), "{mesh}");
    let _ = m.kill();
    let _ = m.wait();
}
