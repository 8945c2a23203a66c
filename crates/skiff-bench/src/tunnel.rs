//! `skiff-bench tunnel`: a reliable tunnel against plain TCP on the same
//! path, in one process and one run: each row of `skiff bench tunnel`
//! followed by the same test over one TCP connection ([`crate::tcp`]):
//! `bulk` through plain `write_all`/`read`, `msgs` and `stream` with each
//! message one record written through a 64 KiB `BufWriter`, `pingpong`
//! with `TCP_NODELAY`.

use std::error::Error;

use skiff_cli::bench::report::{self, Reporter, Row};
use skiff_cli::bench::tunnel::{self, Test, TunnelParams};

use crate::{tcp, Output};

/// `skiff-bench tunnel`
#[derive(clap::Args, Debug)]
pub(crate) struct TunnelArgs {
    /// What to measure and how (as `skiff bench tunnel`).
    #[command(flatten)]
    pub(crate) params: TunnelParams,
    /// Output format.
    #[command(flatten)]
    pub(crate) output: Output,
}

/// Runs the tests asked for: each tunnel row, then TCP's row of the same
/// test.
pub(crate) fn run(args: &TunnelArgs, out: &mut Reporter) -> Result<(), Box<dyn Error>> {
    let p = &args.params;
    let rt = tunnel::runtime()?;
    let show = out.progress_enabled();
    for t in p.tests.iter().copied() {
        // With `--repeat`, the tunnel's runs and TCP's alternate, so that
        // a drift of the machine's speed meets both alike.
        let (mut tunnel_runs, mut tcp_runs) = (Vec::new(), Vec::new());
        for _ in 0..p.repeat {
            tunnel_runs.push(tunnel::run_one(&rt, p, t, show)?);
            tcp_runs.push(tcp_row(p, t, show)?);
        }
        for row in [Row::median(tunnel_runs), Row::median(tcp_runs)]
            .into_iter()
            .flatten()
        {
            out.push(row)?;
        }
    }
    Ok(())
}

/// One run of TCP's row of test `t`.
fn tcp_row(p: &TunnelParams, t: Test, show: bool) -> Result<Row, Box<dyn Error>> {
    let limits = p.limits(t);
    if t == Test::Pingpong {
        let pb = report::progress(show, limits.messages, "tcp pingpong");
        let row = tcp::pingpong(p, limits, &pb);
        pb.finish_and_clear();
        row
    } else {
        let pb = report::spinner(show, &format!("tcp {}", t.name()));
        let size = if t == Test::Bulk { p.chunk } else { p.size };
        let row = tcp::stream(p, size, limits, t.name(), t != Test::Bulk);
        pb.finish_and_clear();
        row
    }
}

/// The label of a row's mode (what `--label` added), or "".
fn label(r: &Row) -> &str {
    let skip = if r.mode.starts_with("tunnel") { 2 } else { 1 };
    r.mode.splitn(skip + 1, ' ').nth(skip).unwrap_or("")
}

/// The targets that one run can check, against TCP on the same
/// path (rows with the same label): tunnel bulk goodput at least 0.9x
/// TCP's, and small messages (`msgs`: boundaries kept; `stream`: a byte
/// stream as TCP's) at least 0.5x TCP's rate. The targets across runs
/// (goodput and p99 at 1.4 % drop against lossless) are checked by
/// `bench/tunnel.sh`.
pub(crate) fn targets(rows: &[Row]) -> Vec<String> {
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let mut out = Vec::new();
    for t in rows.iter().filter(|r| r.mode.starts_with("tunnel")) {
        let (tcp_test, min) = match t.test.as_str() {
            "bulk" => ("bulk", 0.9),
            "msgs" | "stream" => ("msgs", 0.5),
            _ => continue,
        };
        // TCP's row of the same test, else of the test it mirrors.
        let tcp_row = |test: &str| {
            rows.iter()
                .find(|r| r.test == test && r.mode.starts_with("tcp") && label(r) == label(t))
        };
        let tcp = tcp_row(&t.test).or_else(|| tcp_row(tcp_test));
        let Some(tcp) = tcp else { continue };
        let (a, b, unit) = if t.test == "bulk" {
            (t.mb_per_s, tcp.mb_per_s, "MB/s")
        } else {
            (t.msgs_per_s, tcp.msgs_per_s, "msgs/s")
        };
        if let (Some(a), Some(b)) = (a, b) {
            out.push(format!(
                "target: tunnel {} >= {min}x tcp ({}): {:.2}x ({a:.0} vs {b:.0} {unit}): {}",
                t.test,
                t.mode,
                a / b.max(1e-9),
                verdict(a >= min * b)
            ));
        }
    }
    out
}
