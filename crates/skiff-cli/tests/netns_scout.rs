//! Two scouting nodes on a host whose only network is loopback (a fresh
//! network namespace: no route to the scouting group) find each other, and
//! each says it took 127.0.0.1 as its identity.
//!
//! Needs root and `ip netns`: `#[ignore]`d so a plain `cargo test` reports
//! it as ignored (skipped); `scripts/test.sh` runs it with `--ignored`
//! where the machine allows.

mod cli_util;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cli_util::wait_line;

/// A namespace with only loopback up, removed on drop.
struct LoopbackHost(String);

impl LoopbackHost {
    fn new() -> LoopbackHost {
        let name = format!("skiff-scout-{}", std::process::id());
        for args in [
            vec!["netns", "add", &name],
            vec!["-n", &name, "link", "set", "lo", "up"],
        ] {
            let st = Command::new("ip").args(&args).status().expect("run ip");
            assert!(st.success(), "ip {args:?}");
        }
        LoopbackHost(name)
    }

    fn skiff(&self) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0, env!("CARGO_BIN_EXE_skiff")]);
        c
    }
}

impl Drop for LoopbackHost {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
#[ignore = "needs root and ip netns; scripts/test.sh runs it"]
fn two_scouting_nodes_on_loopback_find_each_other() {
    let host = LoopbackHost::new();
    let mut nodes = Vec::new();
    for port in [4801, 4802] {
        let mut c = host
            .skiff()
            .args(["node", "--tcp", &format!("127.0.0.1:{port}"), "--mesh"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let said = wait_line(
            c.stderr.take().unwrap(),
            "127.0.0.1 as its identity",
            Duration::from_secs(60),
        );
        assert!(said.contains("in mesh"), "{said}");
        nodes.push(c);
    }
    let t = Instant::now();
    loop {
        let out = host
            .skiff()
            .args(["stats", "-n", "skiff://127.0.0.1:4801", "--json"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if v["mesh"]["stats"]["members_up"].as_u64() == Some(1) {
            assert_eq!(v["mesh"]["scout_errors"], 0, "{v}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "never met: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
    for mut n in nodes {
        let _ = n.kill();
        let _ = n.wait();
    }
}
