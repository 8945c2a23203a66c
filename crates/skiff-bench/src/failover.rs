//! `skiff-bench failover`: the trials of `skiff bench failover`, with the
//! issue's target checked against them.

use skiff_cli::bench::failover::FailoverParams;
use skiff_cli::bench::report::Row;

use crate::Output;

/// `skiff-bench failover`
#[derive(clap::Args, Debug)]
pub(crate) struct FailoverArgs {
    /// How many trials and where (as `skiff bench failover`).
    #[command(flatten)]
    pub(crate) params: FailoverParams,
    /// Output format.
    #[command(flatten)]
    pub(crate) output: Output,
}

/// The target, from the rows of this run.
pub(crate) fn targets(rows: &[Row]) -> Vec<String> {
    rows.iter()
        .filter(|r| r.test == "skiff-failover")
        .filter_map(|r| {
            let p50 = r.p50_us?;
            let max = r
                .options
                .as_deref()?
                .split_whitespace()
                .find_map(|o| o.strip_prefix("max_us="))?
                .parse::<f64>()
                .ok()?;
            let ok = max <= 1e6;
            Some(format!(
                "target: clients fail over within 1 s: p50 {:.1} ms, max {:.1} ms over {} trials: {}",
                p50 / 1e3,
                max / 1e3,
                r.messages,
                if ok { "met" } else { "NOT met" }
            ))
        })
        .collect()
}
