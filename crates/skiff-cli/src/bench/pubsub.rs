//! `skiff bench pubsub`: publish/subscribe through a node, against
//! nats-server with the same load shapes, in one run.
//!
//! The node runs as a child process (`skiff node` on a free port, like
//! nats-server), so its CPU time and RSS are measured on their own; the
//! load generator (this process) holds one connection per publisher and
//! per subscriber. Each shape `PxS` has P publishers each sending as fast
//! as the node lets it for `--duration-secs` (subscriptions use the
//! `block` policy, so the rate is what the subscribers sustain, with
//! nothing lost), and S subscribers to the same subject. msgs/s counts
//! messages received by all subscribers together, over the time from the
//! first publish to the last receive.
//!
//! With `--nats`, each shape also runs against `nats-server` (Debian's
//! package) driven by `bench/nats/natsbench` (nats.go; `bench/nats/build.sh`
//! builds it), rows `nats`. `node` rows give each server's CPU and RSS,
//! idle and after the load.

use std::error::Error;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use skiff::client::{Client, Policy, SubOptions};
use skiff::Message;

use super::report::{round, Reporter, Row};
use super::{parse_secs, parse_size, OutputArgs};

/// `skiff bench pubsub`
#[derive(clap::Args, Debug)]
pub(crate) struct PubsubArgs {
    /// Load shapes, publishers x subscribers.
    #[arg(long, value_delimiter = ',', default_value = "1x1,1x4,4x4")]
    pub(crate) shapes: Vec<String>,
    /// Payload sizes (`4k` = 4096).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "8,256,4k")]
    pub(crate) sizes: Vec<usize>,
    /// How long each publisher sends, in seconds.
    #[arg(long, value_parser = parse_secs, default_value = "2")]
    pub(crate) duration_secs: Duration,
    /// Most messages per publisher.
    #[arg(long, default_value_t = 20_000_000)]
    pub(crate) messages: u64,
    /// Subscriptions' slow-consumer policy.
    #[arg(long, default_value = "block")]
    pub(crate) policy: String,
    /// Use this node instead of starting one (e.g. skiff://127.0.0.1:4747).
    #[arg(long)]
    pub(crate) node: Option<String>,
    /// Also run the shapes against nats-server.
    #[arg(long)]
    pub(crate) nats: bool,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

/// A server run as a child process, with its CPU time and RSS.
pub(crate) struct Server {
    child: Child,
    /// Its locator / URL.
    pub(crate) url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16, Box<dyn Error>> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn wait_port(port: u16) -> Result<(), Box<dyn Error>> {
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if t.elapsed() > Duration::from_secs(10) {
            return Err(format!("nothing listens on port {port} after 10 s").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

impl Server {
    /// `skiff node` on a free port.
    pub(crate) fn skiff() -> Result<Server, Box<dyn Error>> {
        let port = free_port()?;
        let child = Command::new(std::env::current_exe()?)
            .args(["node", "--tcp", &format!("127.0.0.1:{port}")])
            .stderr(Stdio::null())
            .spawn()?;
        wait_port(port)?;
        Ok(Server {
            child,
            url: format!("skiff://127.0.0.1:{port}"),
        })
    }

    /// `nats-server` on a free port.
    pub(crate) fn nats() -> Result<Server, Box<dyn Error>> {
        let port = free_port()?;
        let child = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("cannot start nats-server ({e}); install it: apt-get install nats-server")
            })?;
        wait_port(port)?;
        Ok(Server {
            child,
            url: format!("nats://127.0.0.1:{port}"),
        })
    }

    /// User + system CPU time so far.
    pub(crate) fn cpu(&self) -> Duration {
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

    /// Resident set size in KiB.
    pub(crate) fn rss_kb(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// A `node` row: CPU% over `since` and RSS now.
    pub(crate) fn row(&self, test: &str, mode: &str, cpu0: Duration, since: Instant) -> Row {
        let mut r = Row::new(test, mode, 0);
        let wall = since.elapsed().as_secs_f64().max(1e-9);
        r.cpu_pct = Some(round((self.cpu() - cpu0).as_secs_f64() / wall * 100.0, 1));
        r.options = Some(format!("rss_kb={}", self.rss_kb()));
        r.elapsed_s = Some(round(wall, 3));
        r
    }
}

/// The natsbench binary: `$SKIFF_NATSBENCH`, else `bench/nats/natsbench`.
pub(crate) fn natsbench() -> Result<PathBuf, Box<dyn Error>> {
    let p = std::env::var_os("SKIFF_NATSBENCH")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("bench/nats/natsbench"));
    if p.exists() {
        Ok(p)
    } else {
        Err(format!("{} not found: run bench/nats/build.sh first", p.display()).into())
    }
}

/// Runs natsbench with `args` and parses its row.
pub(crate) fn run_natsbench(args: &[String]) -> Result<Row, Box<dyn Error>> {
    let out = Command::new(natsbench()?).args(args).output()?;
    if !out.status.success() {
        return Err(format!("natsbench failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn parse_shape(s: &str) -> Result<(usize, usize), Box<dyn Error>> {
    let (p, q) = s
        .split_once('x')
        .ok_or_else(|| format!("shape {s:?}: expected PUBSxSUBS, e.g. 1x4"))?;
    Ok((p.trim().parse()?, q.trim().parse()?))
}

/// Runs `skiff bench pubsub`.
pub(crate) fn run(a: &PubsubArgs, rep: &mut Reporter) -> Result<(), Box<dyn Error>> {
    let policy = Policy::parse(&a.policy)
        .ok_or("--policy: drop-oldest, drop-newest, block or disconnect")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let own = match &a.node {
        Some(_) => None,
        None => Some(Server::skiff()?),
    };
    let url = a
        .node
        .clone()
        .or_else(|| own.as_ref().map(|s| s.url.clone()))
        .expect("one of them");
    let nats = if a.nats { Some(Server::nats()?) } else { None };
    let idle = Instant::now();
    let (c0, n0) = (
        own.as_ref().map(Server::cpu).unwrap_or_default(),
        nats.as_ref().map(Server::cpu).unwrap_or_default(),
    );
    std::thread::sleep(Duration::from_secs(1));
    if let Some(s) = &own {
        rep.push(s.row("node", "skiff-idle", c0, idle))?;
    }
    if let Some(s) = &nats {
        rep.push(s.row("node", "nats-idle", n0, idle))?;
    }
    let load = Instant::now();
    let c0 = own.as_ref().map(Server::cpu).unwrap_or_default();
    let n0 = nats.as_ref().map(Server::cpu).unwrap_or_default();
    let mut skiff_time = Duration::ZERO;
    let mut nats_time = Duration::ZERO;
    for &size in &a.sizes {
        for shape in &a.shapes {
            let (pubs, subs) = parse_shape(shape)?;
            let t = Instant::now();
            let mut row = rt.block_on(skiff_shape(&url, pubs, subs, size, a, policy))?;
            skiff_time += t.elapsed();
            row.mode = shape.clone();
            row.options = Some(format!("{url} policy={}", policy.name()));
            rep.push(row)?;
            if let Some(n) = &nats {
                let t = Instant::now();
                let row = run_natsbench(&[
                    "pubsub".into(),
                    "-url".into(),
                    n.url.clone(),
                    "-pubs".into(),
                    pubs.to_string(),
                    "-subs".into(),
                    subs.to_string(),
                    "-size".into(),
                    size.to_string(),
                    "-duration".into(),
                    format!("{}ms", a.duration_secs.as_millis()),
                    "-messages".into(),
                    a.messages.to_string(),
                ])?;
                nats_time += t.elapsed();
                rep.push(row)?;
            }
        }
    }
    // CPU under load: each server's CPU time over the time its own tests
    // ran (the two never run at once).
    if let Some(s) = &own {
        let mut r = s.row("node", "skiff-load", c0, load);
        let wall = skiff_time.as_secs_f64().max(1e-9);
        r.cpu_pct = Some(round((s.cpu() - c0).as_secs_f64() / wall * 100.0, 1));
        rep.push(r)?;
    }
    if let Some(s) = &nats {
        let mut r = s.row("node", "nats-load", n0, load);
        let wall = nats_time.as_secs_f64().max(1e-9);
        r.cpu_pct = Some(round((s.cpu() - n0).as_secs_f64() / wall * 100.0, 1));
        rep.push(r)?;
    }
    Ok(())
}

async fn skiff_shape(
    url: &str,
    pubs: usize,
    subs: usize,
    size: usize,
    a: &PubsubArgs,
    policy: Policy,
) -> Result<Row, Box<dyn Error>> {
    let received = Arc::new(AtomicU64::new(0));
    let last = Arc::new(parking_last::Last::default());
    let mut sub_clients = Vec::new();
    let mut readers = Vec::new();
    let opts = SubOptions::default()
        .policy(policy)
        .queue(65_536)
        .window(8192);
    for _ in 0..subs {
        let c = Client::connect(url).await?;
        let mut s = c.subscribe_with("bench.ps", "*", opts).await?;
        let (received, last) = (received.clone(), last.clone());
        readers.push(tokio::spawn(async move {
            // Count what is already queued too before reading the clock:
            // one clock read per wake-up, not per message.
            while s.recv().await.is_some() {
                let mut n = 1;
                while s.try_recv().is_some() {
                    n += 1;
                }
                received.fetch_add(n, Ordering::Relaxed);
                last.set();
            }
            s.dropped()
        }));
        sub_clients.push(c);
    }
    let payload = Bytes::from(vec![0x5a; size]);
    let start = Instant::now();
    last.start(start);
    let mut senders = Vec::new();
    for _ in 0..pubs {
        let c = Client::connect(url).await?;
        let payload = payload.clone();
        let (dur, max) = (a.duration_secs, a.messages);
        senders.push(tokio::spawn(async move {
            let mut n = 0u64;
            while n < max {
                if n & 1023 == 0 && start.elapsed() >= dur {
                    break;
                }
                c.publish(Message::new("bench.ps", payload.clone())).await?;
                n += 1;
            }
            c.flush().await?;
            Ok::<u64, skiff::Error>(n)
        }));
    }
    let mut sent = 0;
    for s in senders {
        sent += s.await??;
    }
    let want = sent * subs as u64;
    loop {
        let before = received.load(Ordering::Relaxed);
        if before >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        if received.load(Ordering::Relaxed) == before {
            break;
        }
    }
    let got = received.load(Ordering::Relaxed);
    let elapsed = last.elapsed();
    drop(sub_clients);
    let mut dropped = 0;
    for r in readers {
        r.abort();
        if let Ok(d) = r.await {
            dropped += d;
        }
    }
    let mut row = Row::new("skiff", "", size);
    row.messages = sent;
    row.set_throughput(got, elapsed);
    row.lost = Some(want.saturating_sub(got));
    row.dropped = Some(dropped);
    Ok(row)
}

/// When the last message arrived, relative to the start.
mod parking_last {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    #[derive(Debug, Default)]
    pub(super) struct Last {
        start: std::sync::OnceLock<Instant>,
        nanos: AtomicU64,
    }

    impl Last {
        pub(super) fn start(&self, t: Instant) {
            let _ = self.start.set(t);
        }
        pub(super) fn set(&self) {
            if let Some(s) = self.start.get() {
                self.nanos
                    .store(s.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
        }
        pub(super) fn elapsed(&self) -> Duration {
            Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
        }
    }
}

/// The targets, from the rows of this run.
pub(crate) fn targets(rows: &[Row]) -> Vec<String> {
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let mut out = Vec::new();
    for r in rows.iter().filter(|r| r.test == "skiff" && r.size <= 256) {
        let nats = rows
            .iter()
            .find(|n| n.test == "nats" && n.mode == r.mode && n.size == r.size)
            .and_then(|n| n.msgs_per_s);
        if let (Some(s), Some(n)) = (r.msgs_per_s, nats.filter(|n| *n > 0.0)) {
            out.push(format!(
                "target: {} at {} B >= 1.5x nats-server: {:.2}x ({} vs {} msgs/s): {}",
                r.mode,
                r.size,
                s / n,
                super::report::si(s),
                super::report::si(n),
                verdict(s >= 1.5 * n)
            ));
        }
    }
    let rss = |mode: &str| {
        rows.iter()
            .find(|r| r.test == "node" && r.mode == mode)
            .and_then(|r| {
                r.options
                    .as_deref()?
                    .strip_prefix("rss_kb=")?
                    .parse::<u64>()
                    .ok()
            })
    };
    if let (Some(s), Some(n)) = (rss("skiff-load"), rss("nats-load")) {
        out.push(format!(
            "target: node RSS under load <= nats-server's: {s} KiB vs {n} KiB: {}",
            verdict(s <= n)
        ));
    }
    out
}
