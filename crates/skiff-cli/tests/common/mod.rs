//! Test hosts for the namespace tests: two network namespaces joined by a
//! veth pair, created by the test and removed when dropped.

#![allow(dead_code)]

use std::process::Command;

/// Two namespaces `a` (10.213.N.1) and `b` (10.213.N.2) over veth.
pub(crate) struct Netns {
    names: [String; 2],
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Netns {
    /// Two namespaces `a` (10.213.N.1) and `b` (10.213.N.2) over veth.
    pub(crate) fn new(tag: &str, subnet: u8) -> Netns {
        let pid = std::process::id();
        let names = [
            format!("skiff-{tag}-{pid}-a"),
            format!("skiff-{tag}-{pid}-b"),
        ];
        let [a, b] = &names;
        let n = Netns {
            names: names.clone(),
        };
        ip(&["netns", "add", a]);
        ip(&["netns", "add", b]);
        let (va, vb) = (
            format!("sk{subnet}a{}", pid % 10000),
            format!("sk{subnet}b{}", pid % 10000),
        );
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
        ip(&["link", "set", &va, "netns", a]);
        ip(&["link", "set", &vb, "netns", b]);
        for (ns, dev, host) in [(a, &va, 1), (b, &vb, 2)] {
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("10.213.{subnet}.{host}/24"),
                "dev",
                dev,
            ]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        n
    }

    pub(crate) fn exec(&self, which: usize) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.names[which]]);
        c
    }

    /// Drops `p` of the packets arriving in namespace `b`.
    pub(crate) fn drop_on_receiver(&self, p: f64) {
        let st = self
            .exec(1)
            .args([
                "iptables",
                "-A",
                "INPUT",
                "-m",
                "statistic",
                "--mode",
                "random",
            ])
            .args(["--probability", &p.to_string(), "-j", "DROP"])
            .status()
            .expect("run iptables");
        assert!(st.success(), "iptables rule refused");
    }

    /// Packets the drop rule dropped so far.
    pub(crate) fn dropped(&self) -> u64 {
        let out = self
            .exec(1)
            .args(["iptables", "-L", "INPUT", "-v", "-n", "-x"])
            .output()
            .expect("run iptables");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("DROP"))
            .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}
