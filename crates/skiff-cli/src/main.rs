//! The `skiff` command line: push and pop on datagram queues, benchmarks,
//! and a demo that needs nothing else installed.

use clap::{Parser, Subcommand};

mod bench;
mod demo;
mod queue_cmd;

/// skiff: messaging middleware for clusters and clouds.
#[derive(Debug, Parser)]
#[command(name = "skiff", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Send messages to a queue at an address (batched UDP).
    Push(queue_cmd::PushArgs),
    /// Receive messages on a queue and print them.
    Pop(queue_cmd::PopArgs),
    /// A complete exchange on this host, nothing else needed.
    Demo,
    /// Measure throughput and latency against baselines.
    Bench(bench::BenchArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Push(a) => queue_cmd::push(a),
        Command::Pop(a) => queue_cmd::pop(a),
        Command::Demo => demo::run(),
        Command::Bench(a) => bench::run(a),
    };
    if let Err(e) = result {
        eprintln!("skiff: {e}");
        std::process::exit(1);
    }
}
