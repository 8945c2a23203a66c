//! The mesh between real processes: three `skiff node --mesh` on loopback
//! (seeded, no scouting, a network name of their own). A subscriber on C
//! gets what is published on A; when C is killed with SIGKILL the
//! subscriber fails over to B, and A's publishes reach it through B, none
//! twice. `skiff stats --mesh` shows the members and their traffic.

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

/// Starts a meshed node on free ports; returns once it listens, with its
/// client and mesh addresses.
fn start_node(net: &str, seeds: &str) -> (Proc, String, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mport = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mesh = format!("127.0.0.1:{mport}");
    let mut args = vec![
        "node".to_string(),
        "--tcp".into(),
        format!("127.0.0.1:{port}"),
        "--mesh".into(),
        mesh.clone(),
        "--net".into(),
        net.into(),
        "--no-scout".into(),
    ];
    if !seeds.is_empty() {
        args.extend(["--seeds".into(), seeds.into()]);
    }
    // A quick failure detector (the defaults are patient: 1 s probes, 4 s
    // suspicion), so the tests that stop a process see it declared down
    // soon, and the one that must not be declared down is held past it.
    let mut child = skiff()
        .args(&args)
        .env("SKIFF_PROBE_MS", "500")
        .env("SKIFF_SUSPECT_MS", "1500")
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
    (Proc(child), format!("127.0.0.1:{port}"), mesh)
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

/// Waits until the stats of the node at `addr` satisfy `f`.
fn wait_stats(addr: &str, what: &str, mut f: impl FnMut(&serde_json::Value) -> bool) {
    let t = Instant::now();
    loop {
        let s = run(&["stats", "-n", &format!("skiff://{addr}"), "--json"]);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        if f(&v) {
            return;
        }
        assert!(t.elapsed() < PATIENCE, "{what} on {addr}: {s}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Patterns the node at `addr` knows its up peers hold.
fn remote_patterns(v: &serde_json::Value) -> u64 {
    v["mesh"]["peers"].as_array().map_or(0, |ps| {
        ps.iter()
            .filter(|p| p["up"].as_bool() == Some(true))
            .map(|p| p["patterns"].as_u64().unwrap_or(0))
            .sum()
    })
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
fn three_nodes_route_and_a_client_fails_over_across_the_mesh() {
    let net = format!("cli-{}", std::process::id());
    let (_a, aa, am) = start_node(&net, "");
    let (_b, ba, _) = start_node(&net, &am);
    let (mut c, ca, _) = start_node(&net, &am);
    for n in [&aa, &ba, &ca] {
        wait_stats(n, "two members up", |v| {
            v["mesh"]["stats"]["members_up"].as_u64() == Some(2)
        });
    }
    let mut sub = Proc(
        skiff()
            .args(["sub", "-n", &format!("skiff://{ca},{ba}"), "mx.>"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let out = lines(sub.0.stdout.take().unwrap());
    let err = lines(sub.0.stderr.take().unwrap());
    wait_stats(&aa, "interest from C", |v| remote_patterns(v) == 1);
    run(&["pub", "-n", &format!("skiff://{aa}"), "mx.a", "one"]);
    assert_eq!(next_line(&out, "A to C"), "mx.a one");

    let table = run(&["stats", "-n", &format!("skiff://{aa}"), "--mesh"]);
    assert!(table.contains("2 member(s) up"), "{table}");
    assert!(table.matches(" up ").count() >= 2, "{table}");

    // kill -9 C: the subscriber moves to B and restores its subscription
    // there; B advertises it; A routes to B.
    c.0.kill().unwrap();
    c.0.wait().unwrap();
    // "subscribed", then "lost node", then "failed over".
    let over = (0..3)
        .map(|_| next_line(&err, "failover notice"))
        .collect::<Vec<_>>();
    assert!(
        over.iter()
            .any(|l| l.contains("failed over") && l.contains(&ba)),
        "{over:?}"
    );
    wait_stats(&aa, "interest from B", |v| {
        v["mesh"]["peers"].as_array().is_some_and(|ps| {
            ps.iter()
                .any(|p| p["up"].as_bool() == Some(true) && p["patterns"].as_u64() == Some(1))
        })
    });
    for i in 0..3 {
        run(&[
            "pub",
            "-n",
            &format!("skiff://{aa}"),
            &format!("mx.b.{i}"),
            "x",
        ]);
    }
    for i in 0..3 {
        assert_eq!(next_line(&out, "A to B"), format!("mx.b.{i} x"));
    }
    assert!(
        out.recv_timeout(Duration::from_millis(300)).is_err(),
        "nothing delivered twice"
    );
    // A and B see C go down.
    wait_stats(&aa, "C down", |v| {
        v["mesh"]["stats"]["members_up"].as_u64() == Some(1)
    });
}

fn signal(p: &Proc, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid, with no memory involved.
    let r = unsafe { libc::kill(p.0.id() as libc::pid_t, sig) };
    assert_eq!(r, 0, "kill {sig}");
}

/// The generation B knows A by (0 when A is not up there).
fn generation_of(v: &serde_json::Value, mesh: &str) -> u64 {
    v["mesh"]["peers"].as_array().map_or(0, |ps| {
        ps.iter()
            .filter(|p| p["up"].as_bool() == Some(true) && p["addr"].as_str() == Some(mesh))
            .map(|p| p["gen"].as_u64().unwrap_or(0))
            .sum()
    })
}

/// A node that was declared down while it was alive (stopped past the
/// failure detector's patience, then resumed) rejoins with a new
/// generation, and its reliable link to the others restarts: what it
/// publishes afterwards arrives. (Before, the peer kept acknowledging the
/// old association's frames and dropped them as stray: nothing more
/// arrived from that node, ever.)
#[test]
fn a_node_declared_down_while_alive_rejoins_and_its_messages_flow_again() {
    let net = format!("cli-rejoin-{}", std::process::id());
    let (a, aa, am) = start_node(&net, "");
    let (_b, ba, _) = start_node(&net, &am);
    for n in [&aa, &ba] {
        wait_stats(n, "one member up", |v| {
            v["mesh"]["stats"]["members_up"].as_u64() == Some(1)
        });
    }
    let mut sub = Proc(
        skiff()
            .args(["sub", "-n", &format!("skiff://{ba}"), "rj.>"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let out = lines(sub.0.stdout.take().unwrap());
    wait_stats(&aa, "interest from B", |v| remote_patterns(v) == 1);
    run(&["pub", "-n", &format!("skiff://{aa}"), "rj.before", "x"]);
    assert_eq!(next_line(&out, "before the stop"), "rj.before x");
    let mut gen = 0;
    wait_stats(&ba, "A's generation", |v| {
        gen = generation_of(v, &am);
        gen != 0
    });

    // Stopped well past probe_period + suspect_to_down: B declares A down.
    signal(&a, libc::SIGSTOP);
    wait_stats(&ba, "A declared down", |v| generation_of(v, &am) == 0);
    signal(&a, libc::SIGCONT);
    wait_stats(&ba, "A up again, with a new generation", |v| {
        let g = generation_of(v, &am);
        g != 0 && g != gen
    });
    wait_stats(&aa, "interest from B again", |v| remote_patterns(v) == 1);
    for i in 0..20 {
        run(&[
            "pub",
            "-n",
            &format!("skiff://{aa}"),
            &format!("rj.after.{i}"),
            "y",
        ]);
    }
    for i in 0..20 {
        assert_eq!(
            next_line(&out, "after the rejoin"),
            format!("rj.after.{i} y")
        );
    }
}

/// A local subscriber that stops reading (policy `block`) holds only its
/// own deliveries: its node goes on answering the mesh's probes (nobody is
/// declared down, no generation changes), the link from the publishing
/// node is held by flow control, and once the subscriber reads again
/// every message arrives, in order. (Before, the mesh task itself waited
/// for the subscriber: its node stopped answering probes, was declared
/// down, and what was in flight was lost.)
#[test]
fn a_stalled_local_subscriber_does_not_stall_its_node_in_the_mesh() {
    let net = format!("cli-stall-{}", std::process::id());
    let (_a, aa, am) = start_node(&net, "");
    let (_b, ba, bm) = start_node(&net, &am);
    for n in [&aa, &ba] {
        wait_stats(n, "one member up", |v| {
            v["mesh"]["stats"]["members_up"].as_u64() == Some(1)
        });
    }
    let mut sub = Proc(
        skiff()
            .args(["sub", "-n", &format!("skiff://{ba}"), "stall.>"])
            .args(["--policy", "block", "--queue", "100"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let out = lines(sub.0.stdout.take().unwrap());
    wait_stats(&aa, "interest from B", |v| remote_patterns(v) == 1);
    let (mut gen_a, mut gen_b) = (0, 0);
    wait_stats(&ba, "A's generation", |v| {
        gen_a = generation_of(v, &am);
        gen_a != 0
    });
    wait_stats(&aa, "B's generation", |v| {
        gen_b = generation_of(v, &bm);
        gen_b != 0
    });
    signal(&sub, libc::SIGSTOP);
    // Far more than the socket buffers and a 100-message queue hold.
    const N: usize = 14_000;
    let mut publisher = Proc(
        skiff()
            .args(["pub", "-n", &format!("skiff://{aa}"), "stall.x"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stdin = publisher.0.stdin.take().unwrap();
    let pad = "p".repeat(1000);
    std::thread::spawn(move || {
        use std::io::Write;
        for i in 0..N {
            writeln!(stdin, "{i} {pad}").unwrap();
        }
    });
    // Past the failure detector's probe and suspicion times.
    std::thread::sleep(Duration::from_secs(4));
    wait_stats(&ba, "A still up, same generation", |v| {
        generation_of(v, &am) == gen_a
    });
    wait_stats(&aa, "B still up, same generation", |v| {
        generation_of(v, &bm) == gen_b
    });
    signal(&sub, libc::SIGCONT);
    for i in 0..N {
        let l = next_line(&out, "a held message");
        let want = format!("stall.x {i} ");
        assert!(
            l.starts_with(&want),
            "message {i}: {}",
            &l[..l.len().min(40)]
        );
    }
    let st = publisher.0.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut publisher.0.stderr.take().unwrap(), &mut err).unwrap();
    assert!(st.success(), "{err}");
}
