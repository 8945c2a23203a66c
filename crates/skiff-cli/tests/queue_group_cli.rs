//! Queue groups from the shell: `skiff sub --queue-group G` and `skiff
//! reply --queue-group G` share a subject's messages and requests with
//! each other and with a NATS queue subscriber of the same group (a raw
//! NATS connection), each message to one member of the group, against a
//! real node with its NATS listener.

mod cli_util;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cli_util::mesh::{lines, Proc, PATIENCE};
use cli_util::{free_port, run, skiff, start_node, wait_line};

/// A raw NATS connection subscribed to `SUB pattern group 1`; the
/// payloads of the `MSG`s it gets, on a channel.
fn nats_member(port: u16, pattern: &str, group: &str) -> mpsc::Receiver<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(
        format!("CONNECT {{\"verbose\":false}}\r\nSUB {pattern} {group} 1\r\nPING\r\n").as_bytes(),
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "closed");
        if line.starts_with("PONG") {
            break;
        }
    }
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        if let Some(rest) = line.trim_end().strip_prefix("MSG ") {
            let len: usize = rest.rsplit(' ').next().unwrap().parse().unwrap();
            let mut p = vec![0u8; len + 2];
            if r.read_exact(&mut p).is_err() {
                return;
            }
            p.truncate(len);
            if tx.send(String::from_utf8_lossy(&p).into_owned()).is_err() {
                return;
            }
        }
    });
    rx
}

/// A `skiff sub` with `extra` arguments, once subscribed: its output lines.
fn sub(loc: &str, pattern: &str, extra: &[&str]) -> (Proc, mpsc::Receiver<String>) {
    let mut child = skiff()
        .args(["sub", "-n", loc, pattern])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_line(
        child.stderr.take().unwrap(),
        "subscribed to",
        Duration::from_secs(20),
    );
    let out = lines(child.stdout.take().unwrap());
    (Proc(child), out)
}

#[test]
fn skiff_sub_and_reply_in_a_queue_group_share_with_a_nats_queue_subscriber() {
    let nats = free_port();
    let node = start_node(
        &["--nats", &format!("127.0.0.1:{nats}")],
        "listening for NATS",
    );
    let (_m1, o1) = sub(&node.loc, "q.>", &["--queue-group", "g"]);
    let (_m2, o2) = sub(&node.loc, "q.>", &["--group", "g"]);
    let n3 = nats_member(nats, "q.>", "g");
    let (_plain, op) = sub(&node.loc, "q.>", &[]);

    const N: usize = 90;
    let mut p = skiff()
        .args(["pub", "-n", &node.loc, "q.x"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut stdin = p.stdin.take().unwrap();
        for i in 0..N {
            writeln!(stdin, "m{i}").unwrap();
        }
    }
    assert!(p.wait().unwrap().success());

    // `skiff sub` prints `subject payload`; the NATS member the payload.
    let mut each: BTreeMap<String, u32> = BTreeMap::new();
    let mut per = [0u32; 3];
    let mut plain = 0;
    let start = Instant::now();
    while per.iter().sum::<u32>() < N as u32 || plain < N {
        assert!(start.elapsed() < PATIENCE, "group {per:?}, plain {plain}");
        for (k, rx) in [&o1, &o2].into_iter().enumerate() {
            while let Ok(l) = rx.try_recv() {
                let p = l.strip_prefix("q.x ").unwrap_or(&l).to_owned();
                *each.entry(p).or_default() += 1;
                per[k] += 1;
            }
        }
        while let Ok(p) = n3.try_recv() {
            *each.entry(p).or_default() += 1;
            per[2] += 1;
        }
        while op.try_recv().is_ok() {
            plain += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    for rx in [&o1, &o2] {
        assert!(rx.try_recv().is_err(), "a message twice to the group");
    }
    assert!(n3.try_recv().is_err(), "a message twice to the group");
    assert_eq!(each.len(), N, "{each:?}");
    assert!(each.values().all(|&k| k == 1), "{each:?}");
    assert!(per.iter().all(|&k| k > 0), "every member shares: {per:?}");

    // Two `skiff reply` in one group answer a subject's requests: each
    // request reaches one (both are used).
    let mut replies = Vec::new();
    for who in ["A", "B"] {
        let mut c = skiff()
            .args(["reply", "-n", &node.loc, "svc.r", who, "--queue-group", "w"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let said = wait_line(
            c.stderr.take().unwrap(),
            "answering",
            Duration::from_secs(20),
        );
        assert!(said.contains("in queue group w"), "{said}");
        replies.push(Proc(c));
    }
    let mut got = BTreeMap::<String, u32>::new();
    for _ in 0..8 {
        let out = run(&["req", "-n", &node.loc, "svc.r", "hi"]);
        *got.entry(out.trim().to_owned()).or_default() += 1;
    }
    assert_eq!(got.len(), 2, "both members answer in turn: {got:?}");

    // A group name that is not a literal subject is refused.
    let bad = cli_util::fails(&["sub", "-n", &node.loc, "q.>", "--queue-group", "a.*"]);
    assert!(bad.contains("queue group"), "{bad}");
}
