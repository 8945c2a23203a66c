//! `skiff-bench pubsub`: publish/subscribe through a skiff node against
//! nats-server with the same load shapes, in one run: the rows of `skiff
//! bench pubsub` with, beside each, a `nats` row from nats-server
//! (Debian's package) driven by `bench/nats/natsbench` (nats.go;
//! `bench/nats/build.sh` builds it). `node` rows give each server's CPU
//! and RSS, idle and after the load.
//!
//! Across a mesh, `--nats-pub-at` / `--nats-sub-at` name nats-servers
//! already running (a routed cluster), as `--pub-at` / `--sub-at` do for
//! skiff. `--wake-latency-us` holds a PM QoS wake-up latency for the whole
//! run, for both systems alike.

use std::error::Error;
use std::path::Path;
use std::time::{Duration, Instant};

use skiff_cli::bench::pubsub::{parse_shape, Places, PubsubParams, Session};
use skiff_cli::bench::report::{self, round, Reporter, Row};
use skiff_cli::bench::server::Server;

use crate::{cpu, peers, Output};

/// `skiff-bench pubsub`
#[derive(clap::Args, Debug)]
pub(crate) struct PubsubArgs {
    /// What to measure and where (as `skiff bench pubsub`).
    #[command(flatten)]
    pub(crate) params: PubsubParams,
    /// Also run the shapes against nats-server.
    #[arg(long)]
    pub(crate) nats: bool,
    /// Where the nats clients connect.
    #[command(flatten)]
    pub(crate) nats_at: NatsAt,
    /// Hold this CPU wake-up latency (Linux PM QoS, needs root) for the
    /// whole run, skiff's rows and nats' alike: 0 keeps idle CPUs polling,
    /// so a cross-CPU hop costs a few µs instead of a hypervisor wake-up.
    /// The rows' options say so.
    #[arg(long, value_name = "MICROS")]
    pub(crate) wake_latency_us: Option<u32>,
    /// Output format.
    #[command(flatten)]
    pub(crate) output: Output,
}

/// Where nats publishers (requesters) and subscribers (responders)
/// connect, for runs across several servers.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct NatsAt {
    /// nats-server the nats publishers connect to (implies --nats, with no
    /// nats-server started).
    #[arg(long, value_name = "URL")]
    pub(crate) nats_pub_at: Option<String>,
    /// nats-server a nats subscriber connects to; repeatable [default: as
    /// --nats-pub-at].
    #[arg(long, value_name = "URL")]
    pub(crate) nats_sub_at: Vec<String>,
}

impl NatsAt {
    /// The nats places, if the caller named nats servers.
    pub(crate) fn places(&self) -> Option<Places> {
        let first = self.nats_pub_at.as_ref().or(self.nats_sub_at.first())?;
        Some(Places::new(
            self.nats_pub_at.as_ref(),
            &self.nats_sub_at,
            first,
        ))
    }
}

/// The nats-server to start (when `--nats` and no nats server is named)
/// and where the nats clients connect, if nats rows run at all.
pub(crate) fn nats_side(
    nats: bool,
    at: &NatsAt,
) -> Result<(Option<Server>, Option<Places>), Box<dyn Error>> {
    let places = at.places();
    let server = if nats && places.is_none() {
        Some(peers::nats_server()?)
    } else {
        None
    };
    let places = places.or_else(|| server.as_ref().map(|n| Places::new(None, &[], &n.url)));
    Ok((server, places))
}

/// Runs `skiff-bench pubsub`, starting nodes from the binary `skiff`.
pub(crate) fn run(a: &PubsubArgs, skiff: &Path, rep: &mut Reporter) -> Result<(), Box<dyn Error>> {
    let p = &a.params;
    let mut session = Session::start(p, skiff)?;
    let (nats, nats_places) = nats_side(a.nats, &a.nats_at)?;
    let (_wake, wake_note) = cpu::hold_wake(a.wake_latency_us)?;
    let idle = Instant::now();
    let (c0, n0) = (
        session.node().map(Server::cpu).unwrap_or_default(),
        nats.as_ref().map(Server::cpu).unwrap_or_default(),
    );
    if session.node().is_some() || nats.is_some() {
        std::thread::sleep(Duration::from_secs(1));
    }
    if let Some(s) = session.node() {
        rep.push(s.row("node", "skiff-idle", c0, idle))?;
    }
    if let Some(s) = &nats {
        rep.push(s.row("node", "nats-idle", n0, idle))?;
    }
    let load = Instant::now();
    let c0 = session.node().map(Server::cpu).unwrap_or_default();
    let n0 = nats.as_ref().map(Server::cpu).unwrap_or_default();
    let mut nats_time = Duration::ZERO;
    let natsbench_common = |np: &Places, size: usize| {
        let mut v: Vec<String> = vec!["pubsub".into()];
        v.extend(peers::natsbench_places(np));
        v.extend([
            "-size".into(),
            size.to_string(),
            "-duration".into(),
            format!("{}ms", p.duration_secs.as_millis()),
        ]);
        v
    };
    for &size in &p.sizes {
        for shape in &p.shapes {
            rep.push(session.shape(shape, size, &wake_note)?)?;
            if let Some(np) = &nats_places {
                let (pubs, subs) = parse_shape(shape)?;
                let t = Instant::now();
                let mut args = natsbench_common(np, size);
                args.extend([
                    "-pubs".into(),
                    pubs.to_string(),
                    "-subs".into(),
                    subs.to_string(),
                    "-messages".into(),
                    p.messages.to_string(),
                ]);
                let mut row = peers::run_natsbench(&args)?;
                nats_time += t.elapsed();
                if let Some(o) = &mut row.options {
                    o.push_str(&wake_note);
                }
                rep.push(row)?;
            }
        }
        if p.latency {
            rep.push(session.latency(size, &wake_note)?)?;
            if let Some(np) = &nats_places {
                let mut args = natsbench_common(np, size);
                args.push("-latency".into());
                let mut row = peers::run_natsbench(&args)?;
                if let Some(o) = &mut row.options {
                    o.push_str(&wake_note);
                }
                rep.push(row)?;
            }
        }
    }
    // CPU under load: each server's CPU time over the time its own tests
    // ran (the two never run at once).
    if let Some(r) = session.load_row(c0, load) {
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
                report::si(s),
                report::si(n),
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
