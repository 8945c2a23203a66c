//! `skiff-bench queue`: the batched datagram queue against its floors, in
//! one run: the rows of `skiff bench queue` with, at each size,
//!
//! - `udp`: one datagram per message ([`crate::udp`]);
//! - `zmq`: ZeroMQ PUSH/PULL over TCP, run as a child process
//!   (`bench/zmq/build.sh` builds it);
//! - `udp-pingpong`: the latency floors `blocking` (connected sockets, the
//!   bar the targets use), `queue-calls` and `unconnected` (see
//!   [`crate::udp`]), timed interleaved with the queue's ping-pong rows of
//!   the same size, so the rows a target compares ran on the same machine.
//!
//! Both sides of every ping-pong row run on one CPU (`--latency-cpu`,
//! shown in the row's options): a round trip then measures the software,
//! not where the scheduler happened to wake the echo thread (on a virtual
//! machine a wake-up on the other, idle CPU costs tens of microseconds,
//! and which one happens changes from run to run).

use std::error::Error;
use std::path::PathBuf;

use skiff_cli::bench::queue::{QueueParams, Setup};
use skiff_cli::bench::report::{self, Reporter, Row};

use crate::cpu::Pin;
use crate::{peers, udp, Output};

/// The tests `skiff-bench queue` can run.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Test {
    /// skiff queue throughput, in each mode.
    Queue,
    /// One UDP datagram per message.
    Udp,
    /// ZeroMQ PUSH/PULL over TCP.
    Zmq,
    /// skiff queue ping-pong latency, in each mode.
    QueuePingpong,
    /// Plain UDP ping-pong latency.
    UdpPingpong,
}

/// `skiff-bench queue`
#[derive(clap::Args, Debug)]
pub(crate) struct QueueArgs {
    /// What to measure and how (as `skiff bench queue`).
    #[command(flatten)]
    pub(crate) params: QueueParams,
    /// Tests to run.
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "queue,udp,zmq,queue-pingpong,udp-pingpong"
    )]
    pub(crate) tests: Vec<Test>,
    /// The ZeroMQ peer (bench/zmq/build.sh builds it); by default
    /// target/zmq_bench is looked for beside this binary and under the
    /// current directory, and the zmq rows are skipped with a note if it is
    /// not found.
    #[arg(long, value_name = "PATH")]
    pub(crate) zmq: Option<PathBuf>,
    /// The CPU both threads of every ping-pong row run on: a CPU number,
    /// `auto` (the one this command is running on when the rows start), or
    /// `none` (the scheduler chooses, each row may differ).
    #[arg(long, default_value = "auto")]
    pub(crate) latency_cpu: String,
    /// Output format.
    #[command(flatten)]
    pub(crate) output: Output,
}

/// Runs the tests asked for.
pub(crate) fn run(args: &QueueArgs, out: &mut Reporter) -> Result<(), Box<dyn Error>> {
    let p = &args.params;
    let setup = Setup::new(p)?;
    let wants = |t: Test| args.tests.contains(&t);
    let zmq = if wants(Test::Zmq) {
        peers::zmq_path(args.zmq.as_deref())?
    } else {
        None
    };
    let show = out.progress_enabled();
    let limits = p.throughput_limits();
    for &size in &p.sizes {
        if wants(Test::Queue) {
            setup.throughput(size, out)?;
        }
        if wants(Test::Udp) {
            let pb = report::progress(show, limits.messages, &format!("udp {size} B"));
            let row = udp::udp_throughput(size, limits, p.sockbuf, p.window, &pb);
            pb.finish_and_clear();
            out.push(row?)?;
        }
        if let Some(path) = &zmq {
            let pb = report::spinner(show, &format!("zmq {size} B"));
            let rows = peers::zmq_tcp(path, size, limits);
            pb.finish_and_clear();
            for row in rows? {
                out.push(row)?;
            }
        }
    }
    let wants_latency = wants(Test::QueuePingpong) || wants(Test::UdpPingpong);
    // Threads inherit the mask: the echo threads (and the queues' flusher
    // threads) spawned below run on the same CPU. Restored on drop.
    let pinned = match wants_latency && !p.latency_sizes.is_empty() {
        true => Pin::latency_cpu(&args.latency_cpu)?,
        false => None,
    };
    let on_cpu = |mut row: Row| {
        if let Some(p) = &pinned {
            let o = row.options.take().unwrap_or_default();
            row.options = Some(format!("{o}, both threads on cpu {}", p.cpu));
        }
        row
    };
    for &size in &p.latency_sizes {
        // Every row of this size is set up before any is timed, then all
        // are timed interleaved.
        let mut set = Vec::new();
        if wants(Test::QueuePingpong) {
            set = setup.pingpongs(size)?;
        }
        if wants(Test::UdpPingpong) {
            set.push(udp::udp_pingpong(size)?);
            set.push(udp::udp_pingpong_queue_calls(size)?);
            set.push(udp::udp_pingpong_unconnected(size)?);
        }
        setup.time(size, set, out, on_cpu)?;
    }
    drop(pinned);
    Ok(())
}

/// The targets checked against `rows`, one line each (nothing for
/// a target whose rows were not measured): at 8 B the queue moves at least
/// 10 million messages/s and at least twice ZeroMQ's rate; the
/// natural-batching ping-pong median is within 1.25x of plain UDP's.
pub(crate) fn targets(rows: &[Row]) -> Vec<String> {
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let mut out = Vec::new();
    let best = rows
        .iter()
        .filter(|r| r.test == "queue" && r.size == 8)
        .filter_map(|r| Some((r, r.msgs_per_s?)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((q, rate)) = best {
        out.push(format!(
            "target: queue at 8 B >= 10 M msgs/s: {} msgs/s ({}): {}",
            report::si(rate),
            q.mode,
            verdict(rate >= 10e6)
        ));
        let zmq = rows
            .iter()
            .find(|r| r.test == "zmq" && r.size == 8)
            .and_then(|r| r.msgs_per_s);
        if let Some(z) = zmq.filter(|z| *z > 0.0) {
            out.push(format!(
                "target: queue at 8 B >= 2x zmq: {:.2}x ({} vs {} msgs/s): {}",
                rate / z,
                report::si(rate),
                report::si(z),
                verdict(rate >= 2.0 * z)
            ));
        }
    }
    for q in rows
        .iter()
        .filter(|r| r.test == "queue-pingpong" && (r.mode == "natural" || r.mode == "natural,peer"))
    {
        let p50 = |mode: &str| {
            rows.iter()
                .find(|r| r.test == "udp-pingpong" && r.mode == mode && r.size == q.size)
                .and_then(|r| r.p50_us)
        };
        if let (Some(p), Some(f)) = (q.p50_us, p50("blocking")) {
            out.push(format!(
                "target: queue-pingpong {} p50 <= 1.25x udp-pingpong p50 at {} B: {:.2}x ({:.1} vs {:.1} µs): {}",
                q.mode,
                q.size,
                p / f,
                p,
                f,
                verdict(p <= 1.25 * f)
            ));
            if let (Some(c), "natural") = (p50("queue-calls"), q.mode.as_str()) {
                out.push(format!(
                    "floor: the queue's system calls alone (udp-pingpong queue-calls) at {} B: {:.1} µs = {:.2}x udp-pingpong; the queue's own work adds {:.1} µs",
                    q.size,
                    c,
                    c / f,
                    p - c
                ));
            }
            if let (Some(u), "natural") = (p50("unconnected"), q.mode.as_str()) {
                out.push(format!(
                    "like for like: queue-pingpong natural (many peers) against plain UDP on unconnected sockets (udp-pingpong unconnected, {:.2}x udp-pingpong) at {} B: {:.2}x ({:.1} vs {:.1} µs)",
                    u / f,
                    q.size,
                    p / u,
                    p,
                    u
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_compare_with_the_baselines_of_the_same_run() {
        let mut q = Row::new("queue", "natural", 8);
        q.msgs_per_s = Some(12e6);
        let mut p = Row::new("queue", "paper", 8);
        p.msgs_per_s = Some(3e6);
        let mut z = Row::new("zmq", "push-pull-tcp", 8);
        z.msgs_per_s = Some(8e6);
        let mut qp = Row::new("queue-pingpong", "natural", 8);
        qp.p50_us = Some(9.0);
        let mut up = Row::new("udp-pingpong", "blocking", 8);
        up.p50_us = Some(8.0);
        let mut calls = Row::new("udp-pingpong", "queue-calls", 8);
        calls.p50_us = Some(8.6);
        let mut unconnected = Row::new("udp-pingpong", "unconnected", 8);
        unconnected.p50_us = Some(8.8);
        let t = targets(&[q, p, z, qp, up, calls, unconnected]);
        assert_eq!(t.len(), 5, "{t:?}");
        assert!(
            t[4].starts_with("like for like:")
                && t[4].contains("1.10x udp")
                && t[4].contains(": 1.02x"),
            "{}",
            t[4]
        );
        assert!(
            t[3].starts_with("floor:") && t[3].contains("1.07x") && t[3].contains("adds 0.4 µs"),
            "{}",
            t[3]
        );
        assert!(
            t[0].contains("12.00 M") && t[0].contains("(natural)") && t[0].ends_with(": met"),
            "{}",
            t[0]
        );
        assert!(
            t[1].contains("1.50x") && t[1].ends_with("NOT met"),
            "{}",
            t[1]
        );
        assert!(
            t[2].contains("1.12x") && t[2].ends_with(": met"),
            "{}",
            t[2]
        );
        assert!(targets(&[]).is_empty());
    }
}
