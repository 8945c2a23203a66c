//! The mesh between real processes: three `skiff node --mesh` on loopback
//! (seeded, no scouting, a network name of their own). A subscriber on C
//! gets what is published on A; when C is killed with SIGKILL the
//! subscriber fails over to B, and A's publishes reach it through B, none
//! twice. `skiff stats --mesh` shows the members and their traffic.

use std::process::Stdio;
use std::time::Duration;

mod cli_util;
use cli_util::mesh::{
    lines, mesh_node as start_node, next_line, remote_patterns, subscribe, wait_stats, Proc,
};
use cli_util::{run, skiff};

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

/// The generation B knows A by (0 when A is not up there).
fn generation_of(v: &serde_json::Value, mesh: &str) -> u64 {
    v["mesh"]["peers"].as_array().map_or(0, |ps| {
        ps.iter()
            .filter(|p| p["up"].as_bool() == Some(true) && p["addr"].as_str() == Some(mesh))
            .map(|p| p["gen"].as_u64().unwrap_or(0))
            .sum()
    })
}

/// Two meshed nodes, each seeing the other up: the processes and each
/// one's [client address, mesh address].
fn two_nodes(net: &str) -> (Proc, Proc, [String; 2], [String; 2]) {
    let net = format!("{net}-{}", std::process::id());
    let (a, aa, am) = start_node(&net, "");
    let (b, ba, bm) = start_node(&net, &am);
    for n in [&aa, &ba] {
        wait_stats(n, "one member up", |v| {
            v["mesh"]["stats"]["members_up"].as_u64() == Some(1)
        });
    }
    (a, b, [aa, am], [ba, bm])
}

/// A node that was declared down while it was alive (stopped past the
/// failure detector's patience, then resumed) rejoins with a new
/// generation, and its reliable link to the others restarts: what it
/// publishes afterwards arrives. (Before, the peer kept acknowledging the
/// old association's frames and dropped them as stray: nothing more
/// arrived from that node, ever.)
#[test]
fn a_node_declared_down_while_alive_rejoins_and_its_messages_flow_again() {
    let (a, _b, [aa, am], [ba, _]) = two_nodes("cli-rejoin");
    let (_sub, out) = subscribe(&ba, "rj.>", &[]);
    wait_stats(&aa, "interest from B", |v| remote_patterns(v) == 1);
    run(&["pub", "-n", &format!("skiff://{aa}"), "rj.before", "x"]);
    assert_eq!(next_line(&out, "before the stop"), "rj.before x");
    let mut gen = 0;
    wait_stats(&ba, "A's generation", |v| {
        gen = generation_of(v, &am);
        gen != 0
    });

    // Stopped well past probe_period + suspect_to_down: B declares A down.
    a.signal(libc::SIGSTOP);
    wait_stats(&ba, "A declared down", |v| generation_of(v, &am) == 0);
    a.signal(libc::SIGCONT);
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
    let (_a, _b, [aa, am], [ba, bm]) = two_nodes("cli-stall");
    let (sub, out) = subscribe(&ba, "stall.>", &["--policy", "block", "--queue", "100"]);
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
    sub.signal(libc::SIGSTOP);
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
    sub.signal(libc::SIGCONT);
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
