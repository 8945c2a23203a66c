//! `skiff bench pubsub`: publish/subscribe through a node.
//!
//! The node runs as a child process (`skiff node` on a free port), so its
//! CPU time and RSS are measured on their own (`node` rows, idle and under
//! the load); the load generator (this process) holds one connection per
//! publisher and per subscriber. Each shape `PxS` has P publishers each
//! sending as fast as the node lets it for `--duration-secs`
//! (subscriptions use the `block` policy by default, so the rate is what
//! the subscribers sustain, with nothing lost), and S subscribers to the
//! same subject. msgs/s counts messages received by all subscribers
//! together, over the time from the first publish to the last receive.
//!
//! Across a mesh (bench/mesh.sh): `--pub-at` names the node publishers
//! connect to and `--sub-at` (repeatable) the nodes subscribers connect to,
//! spread over them in turn. Before timing, the first publisher sends empty
//! probe messages until every subscriber has one, so interest has reached
//! the publisher's node. `--latency` adds a `1x1-latency` row per size: one
//! message at a time, timed from publish to its arrival at the subscriber
//! (both ends live in this process, so one clock times them).

use std::error::Error;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use skiff::client::{Client, Policy, SubOptions};
use skiff::Message;

use super::report::{self, round, Reporter, Row};
use super::server::Server;
use super::{parse_secs, parse_size, OutputArgs};

/// `skiff bench pubsub`
#[derive(clap::Args, Debug)]
pub struct PubsubArgs {
    /// What to measure and where.
    #[command(flatten)]
    pub params: PubsubParams,
    /// Output format.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// The publish/subscribe benchmark's settings, shared with skiff-bench.
#[derive(clap::Args, Debug, Clone)]
pub struct PubsubParams {
    /// Load shapes, publishers x subscribers.
    #[arg(long, value_delimiter = ',', default_value = "1x1,1x4,4x4")]
    pub shapes: Vec<String>,
    /// Payload sizes (`4k` = 4096).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "8,256,4k")]
    pub sizes: Vec<usize>,
    /// How long each publisher sends, in seconds.
    #[arg(long, value_parser = parse_secs, default_value = "2")]
    pub duration_secs: Duration,
    /// Most messages per publisher.
    #[arg(long, default_value_t = 20_000_000)]
    pub messages: u64,
    /// Subscriptions' slow-consumer policy.
    #[arg(long, default_value = "block")]
    pub policy: String,
    /// Use this node instead of starting one (e.g. skiff://127.0.0.1:4747).
    #[arg(long)]
    pub node: Option<String>,
    /// Where publishers and subscribers connect.
    #[command(flatten)]
    pub at: At,
    /// Also time one message at a time, publish to arrival (a
    /// `1x1-latency` row per size).
    #[arg(long)]
    pub latency: bool,
    /// Subscribers over shm:// read the node's one buffer of the topic
    /// (RBMQ's broker of buffers) with this flow: credits or overwrite.
    #[arg(long, value_name = "FLOW", value_parser = parse_flow)]
    pub shared_buffer: Option<skiff::shm::Flow>,
    /// With --shared-buffer: subscribers over shm:// read the topic's
    /// buffer in place in a thread of their own (`Client::topic_reader`,
    /// no Delivery per message), and publishers publish with a publisher
    /// bound to the subject (`Client::publisher`, no Message per publish).
    #[arg(long, requires = "shared_buffer")]
    pub in_place: bool,
}

/// Parses a buffer's flow: `credits` or `overwrite`.
pub fn parse_flow(s: &str) -> Result<skiff::shm::Flow, String> {
    match s {
        "credits" => Ok(skiff::shm::Flow::Credits),
        "overwrite" => Ok(skiff::shm::Flow::Overwrite),
        _ => Err(format!("`{s}`: expected credits or overwrite")),
    }
}

/// Where publishers (requesters) and subscribers (responders) connect,
/// for runs across several nodes.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct At {
    /// Node the publishers (or the requester) connect to, e.g.
    /// skiff://127.0.0.1:4747 [default: --node, else the node started].
    #[arg(long, value_name = "LOCATOR")]
    pub pub_at: Option<String>,
    /// Node a subscriber (or responder) connects to; repeat it to spread
    /// them over several nodes in turn [default: as --pub-at].
    #[arg(long, value_name = "LOCATOR")]
    pub sub_at: Vec<String>,
}

/// The places resolved: one publisher locator, one or more subscriber
/// locators (skiff locators, or nats URLs in skiff-bench).
#[derive(Debug, Clone)]
pub struct Places {
    /// Where the publishers (or the requester) connect.
    pub publisher: String,
    /// Where the subscribers (or responders) connect, in turn.
    pub subscribers: Vec<String>,
}

impl Places {
    /// `publisher` and `subscribers`, each defaulting to `default`.
    pub fn new(publisher: Option<&String>, subscribers: &[String], default: &str) -> Places {
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
    pub fn subscriber(&self, i: usize) -> &str {
        &self.subscribers[i % self.subscribers.len()]
    }

    /// `pub=… sub=…`, for a row's options.
    pub fn describe(&self) -> String {
        format!("pub={} sub={}", self.publisher, self.subscribers.join(","))
    }
}

impl At {
    /// Whether the caller names its own servers (no skiff node to start).
    pub fn skiff_given(&self) -> bool {
        self.pub_at.is_some() || !self.sub_at.is_empty()
    }

    /// The node to measure and where each side attaches: `node` if given,
    /// the places named by `--pub-at`/`--sub-at`, or else a node started
    /// from the `skiff` binary (returned, so it lives as long as the run).
    pub fn skiff_node(
        &self,
        node: Option<&str>,
        skiff: &Path,
    ) -> Result<(Option<Server>, Places), Box<dyn Error>> {
        let own = match node {
            None if !self.skiff_given() => Some(Server::skiff(skiff)?),
            _ => None,
        };
        let url = node
            .map(str::to_owned)
            .or_else(|| own.as_ref().map(|s| s.url.clone()))
            .unwrap_or_default();
        Ok((own, self.skiff(&url)))
    }

    /// The skiff places, given the default node.
    pub fn skiff(&self, default: &str) -> Places {
        let first = self.pub_at.as_ref().or(self.sub_at.first());
        Places::new(
            self.pub_at.as_ref(),
            &self.sub_at,
            first.map(String::as_str).unwrap_or(default),
        )
    }
}

/// A load shape `PxS`: P publishers, S subscribers.
pub fn parse_shape(s: &str) -> Result<(usize, usize), Box<dyn Error>> {
    let (p, q) = s
        .split_once('x')
        .ok_or_else(|| format!("shape {s:?}: expected PUBSxSUBS, e.g. 1x4"))?;
    Ok((p.trim().parse()?, q.trim().parse()?))
}

/// A publish/subscribe run set up: the runtimes of the publishers and of
/// the subscribers, the node started (unless one was given) and where
/// clients connect. Measures one row at a time, so that a caller can put
/// other rows beside them.
#[derive(Debug)]
pub struct Session {
    params: PubsubParams,
    policy: Policy,
    rt: tokio::runtime::Runtime,
    sub_rt: tokio::runtime::Runtime,
    own: Option<Server>,
    places: Places,
    skiff_time: Duration,
}

impl Session {
    /// Checks the settings, builds the runtimes and starts `skiff node`
    /// from the binary `skiff` unless a node is given.
    pub fn start(params: &PubsubParams, skiff: &Path) -> Result<Session, Box<dyn Error>> {
        let policy = Policy::parse(&params.policy)
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
        let (own, places) = params.at.skiff_node(params.node.as_deref(), skiff)?;
        Ok(Session {
            params: params.clone(),
            policy,
            rt,
            sub_rt,
            own,
            places,
            skiff_time: Duration::ZERO,
        })
    }

    /// The node this session started, if it started one.
    pub fn node(&self) -> Option<&Server> {
        self.own.as_ref()
    }

    /// Where skiff's clients connect.
    pub fn places(&self) -> &Places {
        &self.places
    }

    /// Measures `shape` (`PxS`) at `size` bytes: a row `skiff`, mode
    /// `shape`, whose options end with `note`.
    pub fn shape(&mut self, shape: &str, size: usize, note: &str) -> Result<Row, Box<dyn Error>> {
        let (pubs, subs) = parse_shape(shape)?;
        let t = Instant::now();
        let mut row = self.rt.block_on(skiff_shape(
            &self.places,
            self.sub_rt.handle(),
            pubs,
            subs,
            size,
            &self.params,
            self.policy,
        ))?;
        self.skiff_time += t.elapsed();
        row.mode = shape.to_owned();
        let shared = match self.params.shared_buffer {
            Some(skiff::shm::Flow::Credits) => " shared-buffer=credits",
            Some(skiff::shm::Flow::Overwrite) => " shared-buffer=overwrite",
            None => "",
        };
        row.options = Some(format!(
            "{} policy={}{shared}{}{note}",
            self.places.describe(),
            self.policy.name(),
            if self.params.in_place && self.params.shared_buffer.is_some() {
                " in-place"
            } else {
                ""
            }
        ));
        Ok(row)
    }

    /// Measures publish-to-arrival latency at `size` bytes: a row `skiff`,
    /// `1x1-latency`, whose options end with `note`.
    pub fn latency(&self, size: usize, note: &str) -> Result<Row, Box<dyn Error>> {
        let mut row =
            self.rt
                .block_on(skiff_latency(&self.places, size, self.params.duration_secs))?;
        row.options = Some(self.places.describe() + note);
        Ok(row)
    }

    /// The `node skiff-load` row: the started node's CPU over the time
    /// the rows measured so far ran, from CPU time `cpu0` (read at
    /// `since`), and its RSS.
    pub fn load_row(&self, cpu0: Duration, since: Instant) -> Option<Row> {
        let s = self.own.as_ref()?;
        let mut r = s.row("node", "skiff-load", cpu0, since);
        let wall = self.skiff_time.as_secs_f64().max(1e-9);
        r.cpu_pct = Some(round((s.cpu() - cpu0).as_secs_f64() / wall * 100.0, 1));
        Some(r)
    }
}

/// Runs `skiff bench pubsub`, starting nodes from the binary `skiff`.
pub fn run(a: &PubsubArgs, skiff: &Path, rep: &mut Reporter) -> Result<(), Box<dyn Error>> {
    let p = &a.params;
    let mut session = Session::start(p, skiff)?;
    let idle = Instant::now();
    let c0 = session.node().map(Server::cpu).unwrap_or_default();
    if let Some(s) = session.node() {
        std::thread::sleep(Duration::from_secs(1));
        rep.push(s.row("node", "skiff-idle", c0, idle))?;
    }
    let load = Instant::now();
    let c0 = session.node().map(Server::cpu).unwrap_or_default();
    for &size in &p.sizes {
        for shape in &p.shapes {
            rep.push(session.shape(shape, size, "")?)?;
        }
        if p.latency {
            rep.push(session.latency(size, "")?)?;
        }
    }
    if let Some(r) = session.load_row(c0, load) {
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

/// What one subscriber's reader adds to the shape's counts after each
/// read pass: `n` messages, and whether the pass held a probe (an empty
/// message; the first one seen is counted once in `probed`).
struct Tally {
    received: Arc<AtomicU64>,
    probed: Arc<AtomicU64>,
    last: Arc<parking_last::Last>,
    seen_probe: bool,
}

impl Tally {
    fn add(&mut self, n: u64, probe: bool) {
        if probe && !self.seen_probe {
            self.seen_probe = true;
            self.probed.fetch_add(1, Ordering::Relaxed);
        }
        if n > 0 {
            self.received.fetch_add(n, Ordering::Relaxed);
            self.last.set();
        }
    }
}

async fn skiff_shape(
    places: &Places,
    sub_rt: &tokio::runtime::Handle,
    pubs: usize,
    subs: usize,
    size: usize,
    a: &PubsubParams,
    policy: Policy,
) -> Result<Row, Box<dyn Error>> {
    let received = Arc::new(AtomicU64::new(0));
    let probed = Arc::new(AtomicU64::new(0));
    let last = Arc::new(parking_last::Last::default());
    let mut sub_clients = Vec::new();
    let mut readers = Vec::new();
    let stop_readers = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let plain = SubOptions::default()
        .policy(policy)
        .queue(65_536)
        .window(8192);
    for i in 0..subs {
        let url = places.subscriber(i).to_string();
        let opts = match a.shared_buffer {
            Some(flow) if url.starts_with("shm://") => plain.shared_buffer(flow),
            _ => plain,
        };
        let mut tally = Tally {
            received: received.clone(),
            probed: probed.clone(),
            last: last.clone(),
            seen_probe: false,
        };
        if a.in_place && opts.shared.is_some() {
            // Read in place in a thread of its own: each message's
            // payload looked at where it lies in the ring.
            let (c, mut r) = sub_rt
                .spawn(async move {
                    let c = Client::connect(&url).await?;
                    let r = c.topic_reader("bench.ps", "*", opts).await?;
                    Ok::<_, skiff::Error>((c, r))
                })
                .await??;
            let stop = stop_readers.clone();
            readers.push(sub_rt.spawn_blocking(move || {
                while !stop.load(Ordering::Relaxed) {
                    let (mut n, mut probe) = (0u64, false);
                    let got = r.read(Duration::from_millis(50), |m| {
                        n += u64::from(!m.payload.is_empty());
                        probe |= m.payload.is_empty();
                    });
                    if got.is_err() {
                        break;
                    }
                    tally.add(n, probe);
                }
                r.dropped()
            }));
            sub_clients.push(c);
            continue;
        }
        let (c, mut s) = sub_rt
            .spawn(async move {
                let c = Client::connect(&url).await?;
                let s = c.subscribe_with("bench.ps", "*", opts).await?;
                Ok::<_, skiff::Error>((c, s))
            })
            .await??;
        readers.push(sub_rt.spawn(async move {
            // Count what is already queued too before reading the clock:
            // one clock read per wake-up, not per message.
            while let Some(d) = s.recv().await {
                let mut n = u64::from(!d.payload.is_empty());
                let mut probe = d.payload.is_empty();
                while let Some(d) = s.try_recv() {
                    n += u64::from(!d.payload.is_empty());
                    probe |= d.payload.is_empty();
                }
                tally.add(n, probe);
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
    let bound = a.in_place && a.shared_buffer.is_some();
    for c in pub_clients {
        let payload = payload.clone();
        let (dur, max) = (a.duration_secs, a.messages);
        senders.push(tokio::spawn(async move {
            let mut n = 0u64;
            if bound {
                let p = c.publisher("bench.ps", None)?;
                while n < max {
                    if n & 1023 == 0 && start.elapsed() >= dur {
                        break;
                    }
                    p.publish(&payload).await?;
                    n += 1;
                }
            } else {
                while n < max {
                    if n & 1023 == 0 && start.elapsed() >= dur {
                        break;
                    }
                    c.publish(Message::new("bench.ps", payload.clone())).await?;
                    n += 1;
                }
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
    stop_readers.store(true, Ordering::Relaxed);
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

/// How long a latency probe may take before it counts as lost: over
/// best-effort links a lost datagram loses the probe, and the run goes on.
const PROBE_PATIENCE: Duration = Duration::from_millis(100);

/// How long the latency run waits, after its last probe, for probes still
/// overdue: a reliable link repairs a loss within a few retransmission
/// timeouts, which back off from 200 ms.
const LATE_GRACE: Duration = Duration::from_secs(5);

/// A probe's number, carried in the first bytes of its payload (as many
/// of the number's little-endian bytes as fit).
fn probe_number(payload: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = payload.len().min(8);
    b[..n].copy_from_slice(&payload[..n]);
    u64::from_le_bytes(b)
}

/// Probes that did not arrive within [`PROBE_PATIENCE`], by number, with
/// when they were sent: one that still comes was late, not lost, and its
/// latency is kept for the row then.
#[derive(Default)]
struct Overdue {
    sent: std::collections::HashMap<u64, Instant>,
    late: Vec<Duration>,
}

impl Overdue {
    /// Probe `got` arrived: if it was overdue, its latency is kept.
    fn arrived(&mut self, got: u64) {
        if let Some(t) = self.sent.remove(&got) {
            self.late.push(t.elapsed());
        }
    }
}

/// Publishes latency probe `seq` and waits for its arrival: its latency,
/// or `None` when it did not arrive within [`PROBE_PATIENCE`] (it is then
/// `overdue`: lost, or late, and counted as such when it comes).
async fn one(
    c: &Client,
    size: usize,
    seq: u64,
    arrived: &mut tokio::sync::mpsc::UnboundedReceiver<u64>,
    overdue: &mut Overdue,
) -> Result<Option<Duration>, Box<dyn Error>> {
    let mut payload = vec![0x5a; size];
    let n = size.min(8);
    payload[..n].copy_from_slice(&seq.to_le_bytes()[..n]);
    let want = probe_number(&payload);
    let t = Instant::now();
    c.publish(Message::new("bench.lat", payload)).await?;
    let deadline = tokio::time::Instant::now() + PROBE_PATIENCE;
    loop {
        match tokio::time::timeout_at(deadline, arrived.recv()).await {
            Err(_) => {
                overdue.sent.insert(want, t);
                return Ok(None);
            }
            Ok(None) => return Err("the subscription ended".into()),
            Ok(Some(got)) if got == want => return Ok(Some(t.elapsed())),
            Ok(Some(got)) => overdue.arrived(got),
        }
    }
}

/// One message at a time from the publisher's node to the first
/// subscriber's: publish-to-arrival latency, for `dur` after a warm-up of
/// 1000 messages (or a tenth of `dur`). A probe that does not arrive
/// within [`PROBE_PATIENCE`] is passed over; if it comes later (by the
/// end, or within [`LATE_GRACE`] after) its latency is in the row, and
/// only those that never come are the row's `lost`.
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
                } else if tx.send(probe_number(&d.payload)).is_err() {
                    break;
                }
            }
        })
    };
    let c = Client::connect(&places.publisher).await?;
    probe(&c, "bench.lat", || probed.load(Ordering::Relaxed) > 0).await?;
    let size = size.max(1);
    let mut seq = 0u64;
    let warmup = Instant::now();
    let mut overdue = Overdue::default();
    for _ in 0..1000 {
        if warmup.elapsed() >= dur / 10 {
            break;
        }
        seq += 1;
        one(&c, size, seq, &mut arrived, &mut overdue).await?;
    }
    // What the warm-up left overdue is not the run's.
    let mut overdue = Overdue::default();
    let mut hist = report::histogram();
    let start = Instant::now();
    while start.elapsed() < dur {
        seq += 1;
        if let Some(d) = one(&c, size, seq, &mut arrived, &mut overdue).await? {
            report::record(&mut hist, d);
        }
    }
    let elapsed = start.elapsed();
    let grace = tokio::time::Instant::now() + LATE_GRACE;
    while !overdue.sent.is_empty() {
        match tokio::time::timeout_at(grace, arrived.recv()).await {
            Ok(Some(got)) => overdue.arrived(got),
            _ => break,
        }
    }
    reader.abort();
    if !overdue.late.is_empty() || !overdue.sent.is_empty() {
        eprintln!(
            "skiff bench: {} B latency probes: {} late (over {PROBE_PATIENCE:?}, timed when they came), {} never came",
            size,
            overdue.late.len(),
            overdue.sent.len()
        );
    }
    for d in overdue.late.drain(..) {
        report::record(&mut hist, d);
    }
    let mut row = Row::new("skiff", "1x1-latency", size);
    row.set_latency(&hist);
    row.set_throughput(hist.len(), elapsed);
    row.lost = Some(overdue.sent.len() as u64);
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
