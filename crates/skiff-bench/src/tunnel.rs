//! `skiff-bench tunnel`: a reliable tunnel against plain TCP on the same
//! path, in one process and one run: each row of `skiff bench tunnel`
//! followed by the same test over one TCP connection ([`crate::tcp`]):
//! `bulk` through plain `write_all`/`read`, `msgs` with each message one
//! record written through a 64 KiB `BufWriter`, `pingpong` with
//! `TCP_NODELAY`.

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

/// Runs the tests asked for.
pub(crate) fn run(args: &TunnelArgs, out: &mut Reporter) -> Result<(), Box<dyn Error>> {
    let p = &args.params;
    let rt = tunnel::runtime()?;
    let show = out.progress_enabled();
    if p.wants(Test::Bulk) {
        let limits = p.bulk_limits();
        let pb = report::progress(show, limits.messages, "tunnel bulk");
        let row = tunnel::stream(&rt, p, p.chunk, limits, "bulk", &pb);
        pb.finish_and_clear();
        out.push(row?)?;
        let pb = report::spinner(show, "tcp bulk");
        let row = tcp::stream(p, p.chunk, limits, "bulk", false);
        pb.finish_and_clear();
        out.push(row?)?;
    }
    if p.wants(Test::Msgs) {
        let limits = p.msgs_limits();
        let pb = report::progress(show, limits.messages, "tunnel msgs");
        let row = tunnel::stream(&rt, p, p.size, limits, "msgs", &pb);
        pb.finish_and_clear();
        out.push(row?)?;
        let pb = report::spinner(show, "tcp msgs");
        let row = tcp::stream(p, p.size, limits, "msgs", true);
        pb.finish_and_clear();
        out.push(row?)?;
    }
    if p.wants(Test::Pingpong) {
        let limits = p.pingpong_limits();
        let pb = report::progress(show, limits.messages, "tunnel pingpong");
        let row = tunnel::pingpong(&rt, p, limits, &pb);
        pb.finish_and_clear();
        out.push(row?)?;
        let pb = report::progress(show, limits.messages, "tcp pingpong");
        let row = tcp::pingpong(p, limits, &pb);
        pb.finish_and_clear();
        out.push(row?)?;
    }
    Ok(())
}

/// The label of a row's mode (what `--label` added), or "".
fn label(r: &Row) -> &str {
    let skip = if r.mode.starts_with("tunnel") { 2 } else { 1 };
    r.mode.splitn(skip + 1, ' ').nth(skip).unwrap_or("")
}

/// The target that one run can check: tunnel bulk goodput at
/// least 0.8x TCP's on the same path (rows with the same label). The
/// targets across runs (goodput and p99 at 1.4 % drop against lossless)
/// are checked by `bench/tunnel.sh`.
pub(crate) fn targets(rows: &[Row]) -> Vec<String> {
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let mut out = Vec::new();
    for t in rows
        .iter()
        .filter(|r| r.test == "bulk" && r.mode.starts_with("tunnel"))
    {
        let tcp = rows
            .iter()
            .find(|r| r.test == "bulk" && r.mode.starts_with("tcp") && label(r) == label(t));
        if let (Some(a), Some(b)) = (t.mb_per_s, tcp.and_then(|r| r.mb_per_s)) {
            out.push(format!(
                "target: tunnel bulk >= 0.8x tcp ({}): {:.2}x ({a:.0} vs {b:.0} MB/s): {}",
                t.mode,
                a / b.max(1e-9),
                verdict(a >= 0.8 * b)
            ));
        }
    }
    out
}
