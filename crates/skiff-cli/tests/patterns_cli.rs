//! Iris's cluster patterns from the shell against a real node: `skiff
//! join` (a member that prints what reaches it and answers), `skiff
//! broadcast`, `skiff tunnel` and `skiff req --cluster`.

mod cli_util;

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use cli_util::{read_all, run, skiff, start_node, wait_line};

#[test]
fn join_broadcast_tunnel_and_request_between_processes() {
    let node = start_node(&[], "listening on tcp");
    let mut member = skiff()
        .args(["join", "-n", &node.loc, "workers", "--capacity", "2"])
        .args(["--echo", "--count", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let said = wait_line(
        member.stderr.take().unwrap(),
        "member of cluster",
        Duration::from_secs(20),
    );
    assert!(
        said.contains("member of cluster workers (capacity 2)"),
        "{said}"
    );

    // The node lists the cluster and its member.
    let stats = run(&["stats", "-n", &node.loc]);
    assert!(stats.contains("1 cluster(s)"), "{stats}");
    assert!(
        stats.contains("cluster workers: client ") && stats.contains("(capacity 2)"),
        "{stats}"
    );

    let out = run(&[
        "broadcast",
        "-n",
        &node.loc,
        "workers",
        "hello",
        "--type",
        "note",
    ]);
    assert_eq!(out, "");

    // stdin through a tunnel to the member, which echoes each line back.
    let mut tun = skiff()
        .args([
            "tunnel", "-n", &node.loc, "workers", "--lines", "--linger", "300ms",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    tun.stdin
        .take()
        .unwrap()
        .write_all(b"first line\nsecond line\n")
        .unwrap();
    let back = read_all(tun.stdout.take().unwrap());
    let st = tun.wait().unwrap();
    assert!(st.success(), "{}", read_all(tun.stderr.take().unwrap()));
    assert_eq!(back, "first line\nsecond line\n");

    let r = run(&["req", "-n", &node.loc, "--cluster", "workers", "ping"]);
    assert_eq!(r, "ping\n");

    // Three events (the broadcast, the tunnel, the request): it exits.
    let printed = read_all(member.stdout.take().unwrap());
    assert!(member.wait().unwrap().success());
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines[0], "broadcast: [note] hello", "{printed}");
    let id = lines[1]
        .strip_prefix("tunnel ")
        .and_then(|l| l.strip_suffix(": open"))
        .unwrap_or_else(|| panic!("{printed}"));
    for want in [
        format!("tunnel {id}: first line"),
        format!("tunnel {id}: second line"),
        format!("tunnel {id}: closed"),
        "request: ping".to_string(),
    ] {
        assert!(lines.contains(&want.as_str()), "{want:?} in {printed}");
    }
}

#[test]
fn tunnel_carries_bytes_exactly_and_broadcast_reads_stdin() {
    let node = start_node(&[], "listening on tcp");
    let mut member = skiff()
        .args(["join", "-n", &node.loc, "sink", "--echo", "--count", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_line(
        member.stderr.take().unwrap(),
        "member of cluster",
        Duration::from_secs(20),
    );
    let mut member_out = member.stdout.take().unwrap();
    let printed = std::thread::spawn(move || read_all(&mut member_out));
    // Each line of stdin is one broadcast.
    let mut b = skiff()
        .args(["broadcast", "-n", &node.loc, "sink"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    b.stdin.take().unwrap().write_all(b"one\ntwo\n").unwrap();
    assert!(b.wait().unwrap().success());

    // A binary blob larger than the window of messages in flight, echoed
    // back byte for byte (the sender keeps receiving while it waits for
    // window).
    let blob: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut tun = skiff()
        .args(["tunnel", "-n", &node.loc, "sink", "--linger", "0.5"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = tun.stdin.take().unwrap();
    let feed = {
        let blob = blob.clone();
        std::thread::spawn(move || stdin.write_all(&blob).unwrap())
    };
    let mut back = Vec::new();
    std::io::Read::read_to_end(&mut tun.stdout.take().unwrap(), &mut back).unwrap();
    feed.join().unwrap();
    let st = tun.wait().unwrap();
    let err = read_all(tun.stderr.take().unwrap());
    assert!(st.success(), "{err}");
    assert_eq!(back.len(), blob.len(), "{err}");
    assert!(back == blob, "the echoed bytes differ");
    let _ = member.kill();
    let _ = member.wait();
    let printed = printed.join().unwrap();
    assert!(
        printed.starts_with("broadcast: one\nbroadcast: two\n"),
        "{printed}"
    );
    // Binary messages are summed up, not printed.
    assert!(printed.contains(" bytes, not text)"), "{printed}");
}

#[test]
fn tunnel_to_an_empty_cluster_says_no_responders() {
    let node = start_node(&[], "listening on tcp");
    let out = skiff()
        .args(["tunnel", "-n", &node.loc, "nobody", "--timeout", "2s"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no responders"), "{err}");
}

#[test]
fn sub_reads_the_nodes_shared_buffer_of_its_topic() {
    let dir = std::env::temp_dir().join(format!("skiff-topic-cli-{}", std::process::id()));
    let shm = format!("shm://topics?dir={}", dir.display());
    let node = start_node(&["--shm", &shm], "listening on shm");
    let mut subs = Vec::new();
    for _ in 0..2 {
        let mut s = skiff()
            .args(["sub", "-n", &shm, "tb.>", "--count", "2"])
            .args(["--shared-buffer", "credits"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_line(
            s.stderr.take().unwrap(),
            "subscribed to tb.>",
            Duration::from_secs(20),
        );
        subs.push(s);
    }
    // One topic in the node for the two: one subscription.
    let v: serde_json::Value =
        serde_json::from_str(&run(&["stats", "-n", &node.loc, "--json"])).unwrap();
    assert_eq!(v["subscriptions"], 1, "{v}");
    run(&["pub", "-n", &node.loc, "tb.a", "one"]);
    run(&["pub", "-n", &shm, "tb.b", "two"]);
    for mut s in subs {
        let out = read_all(s.stdout.take().unwrap());
        assert!(s.wait().unwrap().success());
        assert_eq!(out, "tb.a one\ntb.b two\n");
    }
    // Over TCP there is no shared buffer to read.
    let out = skiff()
        .args(["sub", "-n", &node.loc, "x", "--shared-buffer", "credits"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("shm://"));
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}
