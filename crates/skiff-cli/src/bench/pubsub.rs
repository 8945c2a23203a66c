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
//!
//! Across a mesh (bench/mesh.sh): `--pub-at` names the node publishers
//! connect to and `--sub-at` (repeatable) the nodes subscribers connect to,
//! spread over them in turn; `--nats-pub-at` / `--nats-sub-at` do the same
//! for the nats rows against servers already running (a routed cluster).
//! Before timing, the first publisher sends empty probe messages until
//! every subscriber has one, so interest has reached the publisher's node.
//! `--latency` adds a `1x1-latency` row per size: one message at a time,
//! timed from publish to its arrival at the subscriber (both ends live in
//! this process, so one clock times them).

use std::error::Error;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use skiff::client::{Client, Policy, SubOptions};
use skiff::Message;

use super::report::{self, round, Reporter, Row};
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
    /// Hold this CPU wake-up latency (Linux PM QoS, needs root) for the
    /// whole run, skiff's rows and nats' alike: 0 keeps idle CPUs polling,
    /// so a cross-CPU hop costs a few µs instead of a hypervisor wake-up.
    /// The rows' options say so.
    #[arg(long, value_name = "MICROS")]
    pub(crate) wake_latency_us: Option<u32>,
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
    pub(crate) at: At,
    /// Also time one message at a time, publish to arrival (a
    /// `1x1-latency` row per size).
    #[arg(long)]
    pub(crate) latency: bool,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

/// Where publishers (requesters) and subscribers (responders) connect,
/// for runs across several nodes or servers.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct At {
    /// Node the publishers (or the requester) connect to, e.g.
    /// skiff://127.0.0.1:4747 [default: --node, else the node started].
    #[arg(long, value_name = "LOCATOR")]
    pub(crate) pub_at: Option<String>,
    /// Node a subscriber (or responder) connects to; repeat it to spread
    /// them over several nodes in turn [default: as --pub-at].
    #[arg(long, value_name = "LOCATOR")]
    pub(crate) sub_at: Vec<String>,
    /// nats-server the nats publishers connect to (implies --nats, with no
    /// nats-server started).
    #[arg(long, value_name = "URL")]
    pub(crate) nats_pub_at: Option<String>,
    /// nats-server a nats subscriber connects to; repeatable [default: as
    /// --nats-pub-at].
    #[arg(long, value_name = "URL")]
    pub(crate) nats_sub_at: Vec<String>,
}

/// The places resolved: one publisher locator, one or more subscriber
/// locators.
#[derive(Debug, Clone)]
pub(crate) struct Places {
    pub(crate) publisher: String,
    pub(crate) subscribers: Vec<String>,
}

impl Places {
    /// `publisher` and `subscribers`, each defaulting to `default`.
    pub(crate) fn new(publisher: Option<&String>, subscribers: &[String], default: &str) -> Places {
        let publisher = publisher.cloned().unwrap_or_else(|| default.to_owned());
        let subscribers = if subscribers.is_empty() {
            vec![publisher.clone()]
        } else {
            subscribers.to_vec()
        };
        Places {
            publisher,
            subscribers,
        }
    }

    /// Where subscriber number `i` connects.
    pub(crate) fn subscriber(&self, i: usize) -> &str {
        &self.subscribers[i % self.subscribers.len()]
    }

    /// `pub=… sub=…`, for a row's options.
    pub(crate) fn describe(&self) -> String {
        format!("pub={} sub={}", self.publisher, self.subscribers.join(","))
    }

    /// natsbench's flags for these places.
    pub(crate) fn natsbench_args(&self) -> Vec<String> {
        let mut v = vec!["-pub-url".to_owned(), self.publisher.clone()];
        for s in &self.subscribers {
            v.push("-sub-url".into());
            v.push(s.clone());
        }
        v
    }
}

impl At {
    /// Whether the caller names its own servers (no skiff node to start).
    pub(crate) fn skiff_given(&self) -> bool {
        self.pub_at.is_some() || !self.sub_at.is_empty()
    }

    /// The skiff places, given the default node.
    pub(crate) fn skiff(&self, default: &str) -> Places {
        let first = self.pub_at.as_ref().or(self.sub_at.first());
        Places::new(
            self.pub_at.as_ref(),
            &self.sub_at,
            first.map(String::as_str).unwrap_or(default),
        )
    }

    /// The nats places, if the caller named nats servers.
    pub(crate) fn nats(&self) -> Option<Places> {
        let first = self.nats_pub_at.as_ref().or(self.nats_sub_at.first())?;
        Some(Places::new(
            self.nats_pub_at.as_ref(),
            &self.nats_sub_at,
            first,
        ))
    }
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

pub(crate) fn free_port() -> Result<u16, Box<dyn Error>> {
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
    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `skiff node` on a free port.
    pub(crate) fn skiff() -> Result<Server, Box<dyn Error>> {
        Server::skiff_with(free_port()?, &[])
    }

    /// `skiff node --tcp 127.0.0.1:PORT ARGS…`, once it listens.
    pub(crate) fn skiff_with(port: u16, args: &[String]) -> Result<Server, Box<dyn Error>> {
        let child = Command::new(std::env::current_exe()?)
            .args(["node", "--tcp", &format!("127.0.0.1:{port}")])
            .args(args)
            .stderr(Stdio::null())
            .spawn()?;
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
    pub(crate) fn kill(&mut self) -> std::io::Result<()> {
        self.child.kill()?;
        self.child.wait().map(|_| ())
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
    pub(crate) fn rss_kb(&self) -> u64 {
        self.status_kb("VmRSS")
    }

    /// The largest resident set size so far (`VmHWM`), in KiB: what the
    /// server needed at its busiest, whenever that was (the RSS after a
    /// run depends on how much the allocator has given back by then).
    pub(crate) fn peak_rss_kb(&self) -> u64 {
        self.status_kb("VmHWM")
    }

    /// A `node` row: CPU% over `since`, RSS now and at its peak.
    pub(crate) fn row(&self, test: &str, mode: &str, cpu0: Duration, since: Instant) -> Row {
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
    // Publishers and subscribers get runtimes of their own, as separate
    // programs would have: in one shared two-worker runtime, tokio left
    // every client task of a 1x1 run on one worker (perf: 97 % of a CPU)
    // while the other idled, and the row measured that worker.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let sub_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench-sub")
        .enable_all()
        .build()?;
    let own = match &a.node {
        Some(_) => None,
        None if a.at.skiff_given() => None,
        None => Some(Server::skiff()?),
    };
    let url = a
        .node
        .clone()
        .or_else(|| own.as_ref().map(|s| s.url.clone()))
        .unwrap_or_default();
    let places = a.at.skiff(&url);
    let nats_places = a.at.nats();
    let nats = if a.nats && nats_places.is_none() {
        Some(Server::nats()?)
    } else {
        None
    };
    let nats_places = nats_places.or_else(|| nats.as_ref().map(|n| Places::new(None, &[], &n.url)));
    let (_wake, wake_note) = super::pin::hold_wake(a.wake_latency_us)?;
    let idle = Instant::now();
    let (c0, n0) = (
        own.as_ref().map(Server::cpu).unwrap_or_default(),
        nats.as_ref().map(Server::cpu).unwrap_or_default(),
    );
    if own.is_some() || nats.is_some() {
        std::thread::sleep(Duration::from_secs(1));
    }
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
    let natsbench_common = |np: &Places, size: usize| {
        let mut v: Vec<String> = vec!["pubsub".into()];
        v.extend(np.natsbench_args());
        v.extend([
            "-size".into(),
            size.to_string(),
            "-duration".into(),
            format!("{}ms", a.duration_secs.as_millis()),
        ]);
        v
    };
    for &size in &a.sizes {
        for shape in &a.shapes {
            let (pubs, subs) = parse_shape(shape)?;
            let t = Instant::now();
            let mut row = rt.block_on(skiff_shape(
                &places,
                sub_rt.handle(),
                pubs,
                subs,
                size,
                a,
                policy,
            ))?;
            skiff_time += t.elapsed();
            row.mode = shape.clone();
            row.options = Some(format!(
                "{} policy={}{wake_note}",
                places.describe(),
                policy.name()
            ));
            rep.push(row)?;
            if let Some(np) = &nats_places {
                let t = Instant::now();
                let mut args = natsbench_common(np, size);
                args.extend([
                    "-pubs".into(),
                    pubs.to_string(),
                    "-subs".into(),
                    subs.to_string(),
                    "-messages".into(),
                    a.messages.to_string(),
                ]);
                let mut row = run_natsbench(&args)?;
                nats_time += t.elapsed();
                if let Some(o) = &mut row.options {
                    o.push_str(&wake_note);
                }
                rep.push(row)?;
            }
        }
        if a.latency {
            let mut row = rt.block_on(skiff_latency(&places, size, a.duration_secs))?;
            row.options = Some(places.describe() + &wake_note);
            rep.push(row)?;
            if let Some(np) = &nats_places {
                let mut args = natsbench_common(np, size);
                args.push("-latency".into());
                let mut row = run_natsbench(&args)?;
                if let Some(o) = &mut row.options {
                    o.push_str(&wake_note);
                }
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

/// How long the probe waits for interest to reach the publisher's node.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Publishes empty messages on `subject` from `c` until `ready` says every
/// subscriber has seen one: interest has reached the publisher's node.
async fn probe(c: &Client, subject: &str, ready: impl Fn() -> bool) -> Result<(), Box<dyn Error>> {
    let t = Instant::now();
    while !ready() {
        if t.elapsed() > PROBE_TIMEOUT {
            return Err(format!(
                "subscribers got no probe on {subject} within {PROBE_TIMEOUT:?}: is the mesh up (skiff stats --mesh)?"
            )
            .into());
        }
        c.publish(Message::new(subject, Bytes::new())).await?;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

async fn skiff_shape(
    places: &Places,
    sub_rt: &tokio::runtime::Handle,
    pubs: usize,
    subs: usize,
    size: usize,
    a: &PubsubArgs,
    policy: Policy,
) -> Result<Row, Box<dyn Error>> {
    let received = Arc::new(AtomicU64::new(0));
    let probed = Arc::new(AtomicU64::new(0));
    let last = Arc::new(parking_last::Last::default());
    let mut sub_clients = Vec::new();
    let mut readers = Vec::new();
    let opts = SubOptions::default()
        .policy(policy)
        .queue(65_536)
        .window(8192);
    for i in 0..subs {
        let url = places.subscriber(i).to_string();
        let (c, mut s) = sub_rt
            .spawn(async move {
                let c = Client::connect(&url).await?;
                let s = c.subscribe_with("bench.ps", "*", opts).await?;
                Ok::<_, skiff::Error>((c, s))
            })
            .await??;
        let (received, probed, last) = (received.clone(), probed.clone(), last.clone());
        readers.push(sub_rt.spawn(async move {
            let mut seen_probe = false;
            // Count what is already queued too before reading the clock:
            // one clock read per wake-up, not per message. Empty messages
            // are probes.
            while let Some(d) = s.recv().await {
                let mut n = u64::from(!d.payload.is_empty());
                let mut probe = d.payload.is_empty();
                while let Some(d) = s.try_recv() {
                    n += u64::from(!d.payload.is_empty());
                    probe |= d.payload.is_empty();
                }
                if probe && !seen_probe {
                    seen_probe = true;
                    probed.fetch_add(1, Ordering::Relaxed);
                }
                if n > 0 {
                    received.fetch_add(n, Ordering::Relaxed);
                    last.set();
                }
            }
            s.dropped()
        }));
        sub_clients.push(c);
    }
    let mut pub_clients = Vec::new();
    for _ in 0..pubs {
        pub_clients.push(Client::connect(&places.publisher).await?);
    }
    probe(&pub_clients[0], "bench.ps", || {
        probed.load(Ordering::Relaxed) == subs as u64
    })
    .await?;
    let payload = Bytes::from(vec![0x5a; size]);
    let start = Instant::now();
    last.start(start);
    let mut senders = Vec::new();
    for c in pub_clients {
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

/// Publishes one latency message and waits for its arrival.
async fn one(
    c: &Client,
    payload: &Bytes,
    arrived: &mut tokio::sync::mpsc::UnboundedReceiver<()>,
) -> Result<Duration, Box<dyn Error>> {
    let timeout = Duration::from_secs(5);
    let t = Instant::now();
    c.publish(Message::new("bench.lat", payload.clone()))
        .await?;
    tokio::time::timeout(timeout, arrived.recv())
        .await
        .map_err(|_| format!("a message did not arrive within {timeout:?}"))?
        .ok_or("the subscription ended")?;
    Ok(t.elapsed())
}

/// One message at a time from the publisher's node to the first
/// subscriber's: publish-to-arrival latency, for `dur` after a warm-up of
/// 1000 messages (or a tenth of `dur`).
async fn skiff_latency(places: &Places, size: usize, dur: Duration) -> Result<Row, Box<dyn Error>> {
    let sub_client = Client::connect(places.subscriber(0)).await?;
    let mut s = sub_client.subscribe("bench.lat", "*").await?;
    let probed = Arc::new(AtomicU64::new(0));
    let (tx, mut arrived) = tokio::sync::mpsc::unbounded_channel();
    let reader = {
        let probed = probed.clone();
        tokio::spawn(async move {
            while let Some(d) = s.recv().await {
                if d.payload.is_empty() {
                    probed.store(1, Ordering::Relaxed);
                } else if tx.send(()).is_err() {
                    break;
                }
            }
        })
    };
    let c = Client::connect(&places.publisher).await?;
    probe(&c, "bench.lat", || probed.load(Ordering::Relaxed) > 0).await?;
    let payload = Bytes::from(vec![0x5a; size]);
    let warmup = Instant::now();
    for _ in 0..1000 {
        if warmup.elapsed() >= dur / 10 {
            break;
        }
        one(&c, &payload, &mut arrived).await?;
    }
    let mut hist = report::histogram();
    let start = Instant::now();
    while start.elapsed() < dur {
        let d = one(&c, &payload, &mut arrived).await?;
        report::record(&mut hist, d);
    }
    let elapsed = start.elapsed();
    reader.abort();
    let mut row = Row::new("skiff", "1x1-latency", size);
    row.set_latency(&hist);
    row.set_throughput(hist.len(), elapsed);
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
    let nats_row = |r: &Row| {
        rows.iter()
            .find(|n| n.test == "nats" && n.mode == r.mode && n.size == r.size)
    };
    for r in rows
        .iter()
        .filter(|r| r.test == "skiff" && r.mode.ends_with("-latency"))
    {
        if let (Some(s), Some(n)) = (r.p50_us, nats_row(r).and_then(|n| n.p50_us)) {
            out.push(format!(
                "{} at {} B: p50 {s:.1} us vs nats-server {n:.1} us ({:.2}x)",
                r.mode,
                r.size,
                s / n
            ));
        }
    }
    for r in rows
        .iter()
        .filter(|r| r.test == "skiff" && r.size <= 256 && !r.mode.ends_with("-latency"))
    {
        let nats = nats_row(r).and_then(|n| n.msgs_per_s);
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
    let rss = |mode: &str, key: &str| {
        rows.iter()
            .find(|r| r.test == "node" && r.mode == mode)
            .and_then(|r| {
                r.options
                    .as_deref()?
                    .split_whitespace()
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?
                    .parse::<u64>()
                    .ok()
            })
    };
    if let (Some(s), Some(n)) = (
        rss("skiff-load", "peak_rss_kb"),
        rss("nats-load", "peak_rss_kb"),
    ) {
        out.push(format!(
            "target: node peak RSS under load <= nats-server's: {s} KiB vs {n} KiB: {}",
            verdict(s <= n)
        ));
    }
    if let (Some(s), Some(n)) = (rss("skiff-load", "rss_kb"), rss("nats-load", "rss_kb")) {
        out.push(format!(
            "node RSS after the load (what the allocator kept): {s} KiB vs {n} KiB"
        ));
    }
    out
}
