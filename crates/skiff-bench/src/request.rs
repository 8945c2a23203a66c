//! `skiff-bench request`: request/reply round trips through a skiff node
//! against nats-server (`--nats`) and a raw TCP ping-pong floor, in one
//! run: the rows of `skiff bench request` with, beside each, a
//! `nats-request` row from natsbench (with `--cluster NAME`, a nats queue
//! group of that name), and a `tcp-pingpong` floor per size
//! ([`crate::tcp::request_floor`]).
//!
//! `--cpu N` runs every row with this process, the servers it starts and
//! the nats load generator on CPU N; `--wake-latency-us` holds a PM QoS
//! wake-up latency for the whole run.

use std::error::Error;
use std::path::Path;

use skiff_cli::bench::report::{self, Reporter, Row};
use skiff_cli::bench::request::{RequestParams, Session};
use skiff_cli::bench::server::Server;

use crate::cpu::{self, PinAll};
use crate::pubsub::{nats_side, NatsAt};
use crate::{peers, tcp, Output};

/// `skiff-bench request`
#[derive(clap::Args, Debug)]
pub(crate) struct RequestArgs {
    /// What to measure and where (as `skiff bench request`).
    #[command(flatten)]
    pub(crate) params: RequestParams,
    /// Also run against nats-server.
    #[arg(long)]
    pub(crate) nats: bool,
    /// Where the nats clients connect.
    #[command(flatten)]
    pub(crate) nats_at: NatsAt,
    /// Skip the TCP ping-pong floor.
    #[arg(long)]
    pub(crate) no_floor: bool,
    /// Run every row with this process, the servers it starts and the
    /// nats load generator on this one CPU: no cross-CPU wake-ups (on a VM
    /// each costs tens of microseconds), so the rows compare software.
    #[arg(long, value_name = "N")]
    pub(crate) cpu: Option<usize>,
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

/// Runs `skiff-bench request`, starting nodes from the binary `skiff`.
pub(crate) fn run(a: &RequestArgs, skiff: &Path, rep: &mut Reporter) -> Result<(), Box<dyn Error>> {
    let p = &a.params;
    let session = Session::start(p, skiff)?;
    let (nats, nats_places) = nats_side(a.nats, &a.nats_at)?;
    let servers: Vec<u32> = session
        .node()
        .into_iter()
        .chain(nats.iter())
        .map(Server::pid)
        .collect();
    let _pin = match a.cpu {
        Some(cpu) => {
            Some(PinAll::to(cpu, &servers).map_err(|e| format!("--cpu {cpu}: cannot pin: {e}"))?)
        }
        None => None,
    };
    let (_wake, wake_note) = cpu::hold_wake(a.wake_latency_us)?;
    let pinned = a
        .cpu
        .map(|c| format!(" all on cpu {c}"))
        .unwrap_or_default()
        + &wake_note;
    for &size in &p.sizes {
        if !a.no_floor {
            let mut row = tcp::request_floor(size, p.duration_secs)?;
            if !pinned.is_empty() {
                row.options = Some(pinned.trim().to_string());
            }
            rep.push(row)?;
        }
        for &conc in &p.concurrency {
            rep.push(session.requests(conc, size, &pinned)?)?;
            if let Some(np) = &nats_places {
                let mut args: Vec<String> = vec!["request".into()];
                args.extend(peers::natsbench_places(np));
                args.extend([
                    "-conc".into(),
                    conc.to_string(),
                    "-size".into(),
                    size.to_string(),
                    "-duration".into(),
                    format!("{}ms", p.duration_secs.as_millis()),
                ]);
                if let Some(c) = &p.cluster {
                    args.extend(["-queue".into(), c.clone()]);
                }
                let mut row = peers::run_natsbench(&args)?;
                if let Some(o) = &mut row.options {
                    o.push_str(&pinned);
                }
                rep.push(row)?;
            }
        }
    }
    Ok(())
}

/// The targets, from the rows of this run.
pub(crate) fn targets(rows: &[Row]) -> Vec<String> {
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let find = |test: &str, mode: &str| rows.iter().find(|r| r.test == test && r.mode == mode);
    let mut out = Vec::new();
    let on = rows
        .iter()
        .filter_map(|r| r.options.as_deref())
        .find_map(|o| o.find("all on cpu").map(|i| format!(" [{}]", &o[i..])))
        .unwrap_or_default();
    if let (Some(s), Some(n)) = (
        find("skiff-request", "conc=16"),
        find("nats-request", "conc=16"),
    ) {
        if let (Some(a), Some(b)) = (s.msgs_per_s, n.msgs_per_s) {
            out.push(format!(
                "target: request rate with 16 requesters >= 2x nats-server{on}: {:.2}x ({} vs {}/s): {}",
                a / b,
                report::si(a),
                report::si(b),
                verdict(a >= 2.0 * b)
            ));
        }
    }
    if let (Some(s), Some(n)) = (
        find("skiff-request", "conc=1"),
        find("nats-request", "conc=1"),
    ) {
        if let (Some(a), Some(b)) = (s.p50_us, n.p50_us) {
            let floor = find("tcp-pingpong", "floor")
                .and_then(|f| f.p50_us)
                .map(|f| format!(" (tcp ping-pong floor {f:.1} us)"))
                .unwrap_or_default();
            out.push(format!(
                "target: one requester p50 <= nats-server's{on}: {a:.1} us vs {b:.1} us{floor}: {}",
                verdict(a <= b)
            ));
        }
    }
    out
}
