//! `skiff-bench`: skiff measured side by side with its baselines and with
//! other systems, in one process and one run, for bench/RESULTS.md.
//!
//! Each subcommand runs the rows of the `skiff bench` subcommand of the
//! same name (the same measuring code, `skiff_cli::bench`) and, beside
//! them, rows of plain sockets (UDP, TCP, Unix), ZeroMQ or nats-server
//! under the same load; it can pin CPUs and hold a PM QoS wake-up
//! latency, and it writes what the bench scripts keep: `--json` rows,
//! `--markdown` tables with the issues' target verdicts, `--plot` SVG.
//! Not published: this is the project's lab, not part of the product.
//!
//! The nodes it starts are `skiff node` of the skiff binary named by
//! `$SKIFF`, else the `skiff` beside this binary.

use std::error::Error;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use skiff_cli::bench::report::{Reporter, Row};

mod cpu;
mod failover;
mod local;
mod markdown;
mod peers;
mod plot;
mod pubsub;
mod queue;
mod request;
mod shm;
mod tcp;
mod tunnel;
mod udp;

/// skiff against its baselines and other systems.
#[derive(Debug, Parser)]
#[command(name = "skiff-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The batched datagram queue against plain UDP, ZeroMQ and ping-pong
    /// latency floors, at several message sizes.
    Queue(queue::QueueArgs),
    /// Publish/subscribe through a node (1→1, 1→4, 4→4) against
    /// nats-server with `--nats`.
    Pubsub(pubsub::PubsubArgs),
    /// Request/reply through a node with 1 and 16 requesters, against
    /// nats-server with `--nats` and a TCP ping-pong floor.
    Request(request::RequestArgs),
    /// A reliable tunnel against plain TCP on the same path: bulk goodput,
    /// small-message rate and ping-pong latency.
    Tunnel(tunnel::TunnelArgs),
    /// RocketBufs buffers over shared memory against a Unix socket and
    /// ZeroMQ ipc: message rate and round trip, busy-poll and futex.
    Shm(shm::ShmArgs),
    /// Failover time of a subscriber whose node is killed (kill -9), with
    /// the target checked.
    Failover(failover::FailoverArgs),
}

/// Output options every benchmark takes.
#[derive(clap::Args, Debug, Clone, Default)]
struct Output {
    /// Print one JSON object per row and line instead of a table.
    #[arg(long)]
    json: bool,
    /// Also draw msgs/s and MB/s against message size into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Also write the rows as a Markdown table into this file (for
    /// bench/RESULTS.md), the target verdicts after it.
    #[arg(long, value_name = "FILE.md")]
    markdown: Option<PathBuf>,
}

/// The skiff binary whose `skiff node` the benchmarks start: `$SKIFF`,
/// else `skiff` beside this binary (`cargo build --release -p skiff-cli`
/// puts it there); run only when a benchmark starts a node.
fn skiff_binary() -> Result<PathBuf, Box<dyn Error>> {
    match std::env::var_os("SKIFF") {
        Some(p) => Ok(PathBuf::from(p)),
        None => Ok(std::env::current_exe()?.with_file_name("skiff")),
    }
}

fn run(cli: Cli) -> Result<(), Box<dyn Error>> {
    let (output, title) = match &cli.command {
        Command::Queue(a) => (&a.output, "skiff-bench queue"),
        Command::Pubsub(a) => (&a.output, "skiff-bench pubsub"),
        Command::Request(a) => (&a.output, "skiff-bench request"),
        Command::Tunnel(a) => (&a.output, "skiff-bench tunnel"),
        Command::Shm(a) => (&a.output, "skiff-bench shm"),
        Command::Failover(a) => (&a.output, "skiff-bench failover"),
    };
    let mut reporter = Reporter::new(output.json);
    let result = match &cli.command {
        Command::Queue(a) => queue::run(a, &mut reporter),
        Command::Pubsub(a) => skiff_binary().and_then(|s| pubsub::run(a, &s, &mut reporter)),
        Command::Request(a) => skiff_binary().and_then(|s| request::run(a, &s, &mut reporter)),
        Command::Tunnel(a) => tunnel::run(a, &mut reporter),
        Command::Shm(a) => shm::run(a, &mut reporter),
        Command::Failover(a) => skiff_binary()
            .and_then(|s| skiff_cli::bench::failover::run(&a.params, &s, &mut reporter)),
    };
    let rows = reporter.rows();
    let notes = targets(&cli.command, rows);
    // Whatever was measured before a failure is still shown.
    reporter.finish(&notes)?;
    if let Some(path) = &output.plot {
        std::fs::write(path, plot::svg(rows, title)?)
            .map_err(|e| format!("cannot write the plot to {}: {e}", path.display()))?;
        eprintln!("plot written to {}", path.display());
    }
    if let Some(path) = &output.markdown {
        std::fs::write(path, markdown::markdown(rows, &notes))
            .map_err(|e| format!("cannot write the table to {}: {e}", path.display()))?;
        eprintln!("markdown table written to {}", path.display());
    }
    result
}

/// The issues' targets checked against the rows of this run, one line each.
fn targets(command: &Command, rows: &[Row]) -> Vec<String> {
    match command {
        Command::Queue(_) => queue::targets(rows),
        Command::Pubsub(_) => pubsub::targets(rows),
        Command::Request(_) => request::targets(rows),
        Command::Tunnel(_) => tunnel::targets(rows),
        Command::Shm(_) => shm::targets(rows),
        Command::Failover(_) => failover::targets(rows),
    }
}

fn main() {
    // `--node mem://` attaches to a node in this process, as in `skiff`.
    skiff_node::embed::install();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("skiff-bench: {e}");
        std::process::exit(1);
    }
}
