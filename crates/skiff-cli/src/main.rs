//! The `skiff` command line: push and pop on datagram queues, benchmarks,
//! and a demo that needs nothing else installed.

use clap::{Parser, Subcommand};
use skiff_cli::bench;

mod demo;
mod node_cmd;
mod out;
mod queue_cmd;
mod tunnel_cmd;

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
    /// A pipe over a reliable tunnel: `cat --listen udp://0.0.0.0:4711 > out`
    /// on one side, `cat udp://host:4711 < in` on the other.
    Cat(tunnel_cmd::CatArgs),
    /// Run a node: clients attach over TCP and a Unix socket.
    Node(node_cmd::NodeArgs),
    /// Publish messages on a subject through a node.
    Pub(node_cmd::PubArgs),
    /// Subscribe to a subject pattern and print what arrives.
    Sub(node_cmd::SubArgs),
    /// Send a request and print the reply.
    Req(node_cmd::ReqArgs),
    /// Answer requests on a subject or as a cluster member.
    Reply(node_cmd::ReplyArgs),
    /// Print a node's counters: per node, client and subscription.
    Stats(node_cmd::StatsArgs),
    /// A complete exchange on this host, nothing else needed.
    Demo,
    /// Measure skiff's throughput and latency on this machine.
    Bench(bench::BenchArgs),
}

fn main() {
    // `mem://` (the demo, `--node mem://`) attaches to a node in this process.
    skiff_node::embed::install();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Push(a) => queue_cmd::push(a),
        Command::Pop(a) => queue_cmd::pop(a),
        Command::Cat(a) => tunnel_cmd::run(a),
        Command::Node(a) => node_cmd::node(a),
        Command::Pub(a) => node_cmd::publish(a),
        Command::Sub(a) => node_cmd::subscribe(a),
        Command::Req(a) => node_cmd::request(a),
        Command::Reply(a) => node_cmd::reply(a),
        Command::Stats(a) => node_cmd::stats(a),
        Command::Demo => demo::run(),
        Command::Bench(a) => bench::run(a),
    };
    if let Err(e) = result {
        if out::is_broken_pipe(e.as_ref()) {
            std::process::exit(out::BROKEN_PIPE_EXIT);
        }
        eprintln!("skiff: {e}");
        std::process::exit(1);
    }
}
