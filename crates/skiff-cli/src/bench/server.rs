//! A server the benchmarks start as a child process (`skiff node`, or in
//! skiff-bench another system's server): killed on drop, its CPU time and
//! memory read from /proc.

use std::error::Error;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::report::{round, Row};

/// A server run as a child process, with its CPU time and RSS.
#[derive(Debug)]
pub struct Server {
    child: Child,
    /// Its locator / URL.
    pub url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free TCP port on loopback.
pub fn free_port() -> Result<u16, Box<dyn Error>> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Server {
    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A server already started as `child`, reached at `url`; killed when
    /// dropped.
    pub fn new(child: Child, url: String) -> Server {
        Server { child, url }
    }

    /// `skiff node` of the binary `skiff` on a free port.
    pub fn skiff(skiff: &Path) -> Result<Server, Box<dyn Error>> {
        Server::skiff_with(skiff, free_port()?, &[])
    }

    /// `skiff node --tcp 127.0.0.1:PORT ARGS…` of the binary `skiff`, once
    /// it listens.
    pub fn skiff_with(skiff: &Path, port: u16, args: &[String]) -> Result<Server, Box<dyn Error>> {
        let child = Command::new(skiff)
            .args(["node", "--tcp", &format!("127.0.0.1:{port}")])
            .args(args)
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run {} node: {e}", skiff.display()))?;
        let mut s = Server {
            child,
            url: format!("skiff://127.0.0.1:{port}"),
        };
        let t = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = s.child.try_wait()? {
                return Err(format!("skiff node {} exited ({status})", args.join(" ")).into());
            }
            if t.elapsed() > Duration::from_secs(10) {
                return Err(format!("skiff node does not listen on port {port} after 10 s").into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // A node that starts listening and then rejects its mesh settings
        // exits at once.
        std::thread::sleep(Duration::from_millis(20));
        if let Ok(Some(status)) = s.child.try_wait() {
            return Err(format!("skiff node {} exited ({status})", args.join(" ")).into());
        }
        Ok(s)
    }

    /// Kills the server at once (SIGKILL: no goodbye to anyone).
    pub fn kill(&mut self) -> std::io::Result<()> {
        self.child.kill()?;
        self.child.wait().map(|_| ())
    }

    /// User + system CPU time so far.
    pub fn cpu(&self) -> Duration {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the command name (which ends with ')').
        let rest = stat.rsplit(')').next().unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        // utime and stime are fields 14 and 15; index 11 and 12 here.
        let hz = 100; // USER_HZ on Linux
        Duration::from_millis((ticks(11) + ticks(12)) * 1000 / hz)
    }

    /// A `/proc/PID/status` size in KiB (`VmRSS`, `VmHWM`).
    fn status_kb(&self, field: &str) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// Resident set size now, in KiB.
    pub fn rss_kb(&self) -> u64 {
        self.status_kb("VmRSS")
    }

    /// The largest resident set size so far (`VmHWM`), in KiB: what the
    /// server needed at its busiest, whenever that was (the RSS after a
    /// run depends on how much the allocator has given back by then).
    pub fn peak_rss_kb(&self) -> u64 {
        self.status_kb("VmHWM")
    }

    /// A `node` row: CPU% over `since`, RSS now and at its peak.
    pub fn row(&self, test: &str, mode: &str, cpu0: Duration, since: Instant) -> Row {
        let mut r = Row::new(test, mode, 0);
        let wall = since.elapsed().as_secs_f64().max(1e-9);
        r.cpu_pct = Some(round((self.cpu() - cpu0).as_secs_f64() / wall * 100.0, 1));
        r.options = Some(format!(
            "rss_kb={} peak_rss_kb={}",
            self.rss_kb(),
            self.peak_rss_kb()
        ));
        r.elapsed_s = Some(round(wall, 3));
        r
    }
}
