//! The `skiff` command line: a node and every pattern against it (pub/sub,
//! request/reply, clusters, broadcasts, tunnels), queues at an address, a
//! tunnel pipe, benchmarks, a demo that needs nothing else installed, and
//! its own shell completions and man page.

use clap::{CommandFactory, Parser, Subcommand};
use skiff_cli::bench;

mod auth_cmd;
mod cluster_cmd;
mod demo;
mod docs_cmd;
mod node_cmd;
mod out;
mod queue_cmd;
mod top;
mod tunnel_cmd;

/// skiff: messaging middleware for clusters and clouds.
#[derive(Debug, Parser)]
#[command(name = "skiff", version)]
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
    Node(Box<node_cmd::NodeArgs>),
    /// Publish messages on a subject through a node.
    Pub(node_cmd::PubArgs),
    /// Subscribe to a subject pattern and print what arrives.
    Sub(node_cmd::SubArgs),
    /// Send a request and print the reply.
    Req(node_cmd::ReqArgs),
    /// Answer requests on a subject or as a cluster member.
    Reply(node_cmd::ReplyArgs),
    /// Join a cluster: print the requests, broadcasts and tunnels that
    /// reach this member, and answer them.
    Join(cluster_cmd::JoinArgs),
    /// Send a message to every member of a cluster.
    Broadcast(cluster_cmd::BroadcastArgs),
    /// A pipe through a tunnel to one member of a cluster: standard input
    /// to it, what it sends back to standard output.
    Tunnel(cluster_cmd::TunnelArgs),
    /// Print a node's counters: per node, client and subscription.
    Stats(node_cmd::StatsArgs),
    /// A live view of a node: clients, rates, pending, drops, slow
    /// consumers, mesh peers.
    Top(top::TopArgs),
    /// Ask a node on this host to reread its configuration file.
    Reload(node_cmd::ReloadArgs),
    /// A complete exchange on this host, nothing else needed.
    Demo,
    /// Measure skiff's throughput and latency on this machine.
    Bench(bench::BenchArgs),
    /// Print a shell completion script: `skiff completions bash >
    /// /etc/bash_completion.d/skiff`.
    Completions(docs_cmd::CompletionsArgs),
    /// Print the man page (roff): `skiff man | man -l -`; `--dir DIR`
    /// writes one page per command.
    Man(docs_cmd::ManArgs),
    /// Make an Ed25519 key for a client (`?key=FILE`); prints the public
    /// key for the node's `[auth]`.
    Keygen(auth_cmd::KeygenArgs),
    /// Hash a password read from standard input for the node's `[auth]`.
    Passwd,
}

fn main() {
    // `mem://` (the demo, `--node mem://`) attaches to a node in this process.
    skiff_node::embed::install();
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Node(_)) {
        // What the libraries log (warnings: a torn log cut, a driver
        // stopped), on standard error; `skiff node` sets up its own.
        let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into());
        let _ = skiff_node::logging::init(&filter, skiff_node::logging::Format::Text)
            .or_else(|_| skiff_node::logging::init("warn", skiff_node::logging::Format::Text));
    }
    let result = match cli.command {
        Command::Push(a) => queue_cmd::push(a),
        Command::Pop(a) => queue_cmd::pop(a),
        Command::Cat(a) => tunnel_cmd::run(a),
        Command::Node(a) => node_cmd::node(*a),
        Command::Pub(a) => node_cmd::publish(a),
        Command::Sub(a) => node_cmd::subscribe(a),
        Command::Req(a) => node_cmd::request(a),
        Command::Reply(a) => node_cmd::reply(a),
        Command::Join(a) => cluster_cmd::join(a),
        Command::Broadcast(a) => cluster_cmd::broadcast(a),
        Command::Tunnel(a) => cluster_cmd::tunnel(a),
        Command::Stats(a) => node_cmd::stats(a),
        Command::Top(a) => top::run(a),
        Command::Reload(a) => node_cmd::reload(a),
        Command::Demo => demo::run(),
        Command::Bench(a) => bench::run(a),
        Command::Completions(a) => docs_cmd::completions(a, Cli::command()),
        Command::Man(a) => docs_cmd::man(a, Cli::command()),
        Command::Keygen(a) => auth_cmd::keygen(a),
        Command::Passwd => auth_cmd::passwd(),
    };
    if let Err(e) = result {
        if out::is_broken_pipe(e.as_ref()) {
            std::process::exit(out::BROKEN_PIPE_EXIT);
        }
        eprintln!("skiff: {e}");
        std::process::exit(1);
    }
}
