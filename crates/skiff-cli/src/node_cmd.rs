//! `skiff node`, `pub`, `sub`, `req`, `reply` and `stats`: run a node and
//! talk to one from the shell.

use std::error::Error;
use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use crate::out::outln;

use bytes::Bytes;
use skiff::client::{Client, ClientEvent, Incoming, Policy, SubOptions, Target};
use skiff::Message;
use skiff_node::Config;

pub(crate) type Result<T> = std::result::Result<T, Box<dyn Error>>;

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    runtime_with(2)
}

fn runtime_with(workers: usize) -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()?)
}

/// Where the node is: `skiff://host:port`, `unix:///path`,
/// `shm://name[?dir=…]`, `mem://`, `file:///path`; `skiff://a:4747,b:4747`
/// fails over between nodes.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct NodeLoc {
    /// The node's locator [default: $SKIFF_NODE, else
    /// skiff://127.0.0.1:4747].
    #[arg(short = 'n', long = "node")]
    node: Option<String>,
    /// The name the node shows for this client (`/connz`, `skiff stats`,
    /// `skiff top`) [default: skiff-COMMAND, e.g. skiff-sub].
    #[arg(long = "name", value_name = "NAME")]
    name: Option<String>,
}

impl NodeLoc {
    /// The locator given, else `$SKIFF_NODE`, else the local node.
    pub(crate) fn locator(&self) -> String {
        self.node
            .clone()
            .or_else(|| std::env::var("SKIFF_NODE").ok())
            .unwrap_or_else(|| "skiff://127.0.0.1:4747".into())
    }

    /// Connects to a node (or opens a `file://` log, if `file_ok`).
    /// `mem://` is refused: it names a node inside this process, which a
    /// lone command would be alone with.
    pub(crate) async fn connect_for(&self, command: &str, file_ok: bool) -> Result<Client> {
        let loc = self.locator();
        let scheme = loc.split_once("://").map(|(s, _)| s);
        match scheme {
            Some("mem") => {
                return Err(format!(
                    "skiff {command}: {loc} is a node inside this one process, so nothing else could reach it; \
                     start `skiff node` and use skiff://host:port, unix:///path or shm://name"
                )
                .into())
            }
            Some("file") if !file_ok => {
                return Err(format!(
                    "skiff {command}: {loc} is a log file, not a node; this command needs a node (skiff://, unix://, shm://)"
                )
                .into())
            }
            _ => {}
        }
        if scheme == Some("file") {
            return Client::connect(&loc)
                .await
                .map_err(|e| format!("cannot open the log {loc}: {e}").into());
        }
        let name = self
            .name
            .clone()
            .unwrap_or_else(|| format!("skiff-{command}"));
        Client::connect_with(&loc, skiff::ClientOptions::new().name(name))
            .await
            .map_err(|e| format!("cannot reach the node at {loc}: {e}").into())
    }
}

/// `skiff node`
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct NodeArgs {
    /// TOML configuration file (see docs/node.md); `SKIFF_*` variables
    /// and flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// TCP address to listen on (`none` for no TCP).
    #[arg(long)]
    tcp: Option<String>,
    /// Unix socket path to listen on.
    #[arg(long)]
    unix: Option<String>,
    /// Accept clients of this host over shared memory: a name (`skiff`)
    /// or a locator (`shm://skiff?dir=/dev/shm/skiff&ring=4M`); clients
    /// then use `--node shm://skiff` (with the same `dir=`).
    #[arg(long, value_name = "NAME|LOCATOR")]
    shm: Option<String>,
    /// Also accept NATS clients (the NATS core client protocol) on this
    /// address: host:port, or a host alone for port 4222.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:4222")]
    nats: Option<String>,
    /// TLS on the NATS port, with --tls-cert and --tls-key: `required`
    /// (INFO in plaintext, then TLS, as nats-server), `optional`
    /// (clients choose), `handshake_first` (TLS before INFO), or `off`.
    #[arg(long, value_name = "MODE")]
    nats_tls: Option<String>,
    /// Join a mesh of nodes on this UDP address (alone: 0.0.0.0:0, found
    /// by multicast scouting); `off` for a standalone node.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "0.0.0.0:0")]
    mesh: Option<String>,
    /// Mesh network name: nodes of another name are ignored (implies --mesh).
    #[arg(long)]
    net: Option<String>,
    /// Seed nodes' mesh addresses, host:port[,host:port…] (implies --mesh).
    #[arg(long)]
    seeds: Option<String>,
    /// A DNS name whose addresses are seeds, name:port, re-resolved every
    /// 5 s, e.g. a Kubernetes headless service (implies --mesh).
    #[arg(long, value_name = "NAME:PORT")]
    seeds_dns: Option<String>,
    /// No multicast scouting (seeds only).
    #[arg(long)]
    no_scout: bool,
    /// A standalone node even if the configuration names a mesh.
    #[arg(long, conflicts_with_all = ["mesh", "net", "seeds", "seeds_dns"])]
    no_mesh: bool,
    /// While the node runs, keep idle CPUs able to wake within this many
    /// µs (Linux PM QoS, needs root; 0: idle CPUs poll, which shortens each
    /// hop between CPUs, most on a virtual machine, at the price of idle
    /// CPU time). Off by default.
    #[arg(long, value_name = "MICROS")]
    wake_latency_us: Option<String>,
    /// Threads serving clients (`auto`: one fewer than the CPUs, at least
    /// one, leaving a CPU to the applications on this host).
    #[arg(long, value_name = "N|auto")]
    workers: Option<String>,
    /// Poll the sockets up to this many µs after traffic before sleeping,
    /// so a quick answer does not have to wake the node (0: off; the
    /// default is skiff::spin::DEFAULT_SPIN_US; it adapts to the traffic).
    #[arg(long, value_name = "MICROS", help = spin_help())]
    spin_us: Option<String>,
    /// Clients must give this token (`?token=`); also `SKIFF_TOKEN`,
    /// which, unlike a flag, other users of the host cannot read in the
    /// process list. Users and permissions: `[auth]` in the config.
    #[arg(long, value_name = "TOKEN")]
    auth_token: Option<String>,
    /// The node's TLS certificate chain (PEM): the TCP listener then
    /// speaks TLS 1.3 only (clients use `tls://host:port?ca=FILE`).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<String>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<String>,
    /// Require client certificates that chain to this CA (mutual TLS).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_ca: Option<String>,
    /// Log filter: a level (error, warn, info, debug, trace) or
    /// directives such as `skiff_node=debug,info` [default: $RUST_LOG,
    /// else info].
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,
    /// Log lines as text or as one JSON object per line.
    #[arg(long, value_name = "text|json")]
    log_format: Option<String>,
    /// Serve the HTTP monitoring endpoints (/healthz, /varz, /connz,
    /// /subsz, /meshz, /metrics) on this address, e.g. 127.0.0.1:8222
    /// (keep it on loopback or a private network: it is not
    /// authenticated). Off by default.
    #[arg(long, value_name = "ADDR")]
    monitor: Option<String>,
    /// Any setting as name=value, e.g. `--set max_payload=65536`.
    #[arg(long = "set", value_name = "NAME=VALUE")]
    set: Vec<String>,
    /// Append every message published on subjects matching PATTERN to the
    /// log file PATH, which many clients thus write through the node
    /// (cMsg's LogFile); read it with `skiff sub -n file://PATH`.
    /// Repeatable.
    #[arg(long = "log", value_name = "PATTERN=PATH")]
    log: Vec<String>,
}

/// `--spin-us`'s help, with the default the node really uses.
fn spin_help() -> String {
    format!(
        "Poll the sockets up to this many µs after traffic before sleeping, so a quick \
         answer does not have to wake the node (0: off; default {}; it adapts to the traffic)",
        skiff::spin::DEFAULT_SPIN_US
    )
}

/// The node's configuration from its file, `SKIFF_*` variables, `RUST_LOG`
/// and flags (each over the one before); run again on reload.
fn node_config(a: &NodeArgs) -> std::result::Result<Config, skiff_node::ConfigError> {
    let mut cfg = match &a.config {
        Some(p) => Config::from_file(p)?,
        None => Config::default(),
    };
    cfg.apply_env(std::env::vars())?;
    if let Some(t) = &a.tcp {
        cfg.set("tcp", t)?;
    }
    if let Some(u) = &a.unix {
        cfg.set("unix", u)?;
    }
    if let Some(n) = &a.nats {
        cfg.set("nats", n)?;
    }
    if let Some(n) = &a.nats_tls {
        cfg.set("nats_tls", n)?;
    }
    if let Some(m) = &a.mesh {
        cfg.set("mesh", m)?;
    }
    for (name, v) in [
        ("net", &a.net),
        ("seeds", &a.seeds),
        ("seeds_dns", &a.seeds_dns),
    ] {
        if let Some(v) = v {
            cfg.set(name, v)?;
        }
    }
    if a.no_scout && cfg.mesh.is_some() {
        cfg.set("scout", "false")?;
    }
    if a.no_mesh {
        cfg.set("mesh", "off")?;
    }
    if let Some(w) = &a.wake_latency_us {
        cfg.set("wake_latency_us", w)?;
    }
    if let Some(w) = &a.workers {
        cfg.set("workers", w)?;
    }
    if let Some(v) = &a.spin_us {
        cfg.set("spin_us", v)?;
    }
    if let Some(t) = &a.auth_token {
        cfg.set("token", t)?;
    }
    for (name, v) in [
        ("tls_cert", &a.tls_cert),
        ("tls_key", &a.tls_key),
        ("tls_ca", &a.tls_ca),
    ] {
        if let Some(v) = v {
            cfg.set(name, v)?;
        }
    }
    for kv in &a.set {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| skiff_node::ConfigError::Value {
                name: "--set".into(),
                value: kv.clone(),
                expected: "NAME=VALUE",
            })?;
        cfg.set(k.trim(), v.trim())?;
    }
    if let Some(s) = &a.shm {
        cfg.set("shm", s)?;
    }
    for l in &a.log {
        cfg.set("log", l)?;
    }
    for (name, v) in [
        ("log_level", &a.log_level),
        ("log_format", &a.log_format),
        ("monitor", &a.monitor),
    ] {
        if let Some(v) = v {
            cfg.set(name, v)?;
        }
    }
    // RUST_LOG when nothing else names a filter.
    if let (None, Ok(v)) = (&cfg.log_level, std::env::var("RUST_LOG")) {
        if !v.trim().is_empty() {
            cfg.set("log_level", &v)?;
        }
    }
    Ok(cfg)
}

/// Runs a node until SIGINT or SIGTERM, then shuts down gracefully;
/// SIGHUP (or `skiff reload`) rereads the configuration.
pub(crate) fn node(a: NodeArgs) -> Result<()> {
    let cfg = node_config(&a)?;
    skiff_node::logging::init(
        cfg.log_level
            .as_deref()
            .unwrap_or(skiff_node::logging::DEFAULT_FILTER),
        cfg.log_format,
    )?;
    let again = a.clone();
    let source: skiff_node::node::ConfigSource = Box::new(move || node_config(&again));
    skiff_node::node::run_with_reload(
        &cfg,
        a.config.is_some().then_some(source),
        |node| {
            if let Some(a) = node.tcp_addr() {
                let scheme = if node.tls() { "tls" } else { "tcp" };
                tracing::info!("skiff node listening on {scheme} {a}");
            }
            if let Some(a) = node.nats_addr() {
                tracing::info!("skiff node listening for NATS clients on {a}");
            }
            if let Some(m) = node.monitor_addr() {
                tracing::info!("skiff node monitoring on http://{m}");
            }
            tracing::info!("skiff node serving with {} worker thread(s)", cfg.workers());
            let max = node.broker().limits().max_connections;
            if max < cfg.limits.max_connections {
                tracing::warn!(
                    "skiff node: max_connections lowered to {max}, below the open-file limit"
                );
            }
            if let Some(us) = node.wake_latency_us() {
                tracing::info!(
                    "skiff node holds a CPU wake-up latency of {us} µs (PM QoS, while it runs)"
                );
            }
            if let Some(p) = node.unix_path() {
                tracing::info!("skiff node listening on unix {}", p.display());
            }
            if let (Some(loc), Some(l)) = (&cfg.shm, node.shm()) {
                tracing::info!("skiff node listening on {loc} ({})", l.dir().display());
            }
            if let Some(m) = node.broker().mesh() {
                let v = m.view();
                tracing::info!("skiff node in mesh {:?} as {}", v.net, v.me);
                if let Some(s) = &v.seal {
                    tracing::info!(
                        "skiff node: mesh sealed (Noise, ChaCha20-Poly1305); this node's identity key: {}",
                        s.identity
                    );
                }
                if m.loopback_fallback() {
                    tracing::warn!(
                        "skiff node: no route to the first seed or the scouting group, so this node took 127.0.0.1 as its identity: only nodes on this host can reach it (give --mesh ADDR:PORT to choose the address)"
                    );
                }
            }
            if node.broker().auth().enabled() {
                tracing::info!("skiff node: clients must authenticate");
            }
            for w in node.broker().warnings() {
                skiff_node::logging::counted();
                tracing::warn!("skiff node: WARNING: {w}");
            }
        },
        || {},
    )?;
    Ok(())
}

/// `skiff pub`
#[derive(clap::Args, Debug)]
pub(crate) struct PubArgs {
    #[command(flatten)]
    loc: NodeLoc,
    /// Subject, e.g. `daq.hallb.rate`.
    subject: String,
    /// Payload; without it, each line of standard input is one message.
    payload: Option<String>,
    /// Message type.
    #[arg(long = "type")]
    kind: Option<String>,
    /// Send the payload this many times.
    #[arg(long, default_value_t = 1)]
    count: u64,
    /// Best effort between nodes (`reliable=false`): the messages may
    /// cross to other nodes as datagrams, their loss counted in the
    /// peers' `lost` (`skiff stats --mesh`), never repaired.
    #[arg(long)]
    best_effort: bool,
}

pub(crate) fn publish(a: PubArgs) -> Result<()> {
    runtime()?.block_on(async move {
        let c = a.loc.connect_for("pub", true).await?;
        // Failovers, and which publishes a lost node may not have taken.
        let mut events = c.events();
        let make = |p: Bytes| {
            let m = Message::new(a.subject.as_str(), p).with_best_effort(a.best_effort);
            match &a.kind {
                Some(k) => m.with_kind(k.as_str()),
                None => m,
            }
        };
        match &a.payload {
            Some(p) => {
                for _ in 0..a.count {
                    c.publish(make(Bytes::from(p.clone()))).await?;
                }
            }
            None => {
                for line in std::io::stdin().lock().lines() {
                    c.publish(make(Bytes::from(line?))).await?;
                }
            }
        }
        c.flush().await?;
        let mut missing = 0u64;
        while let Some(e) = events.try_recv() {
            match e {
                ClientEvent::Disconnected { node, reason, .. } => {
                    eprintln!("skiff pub: lost node {node} ({reason}); failing over")
                }
                ClientEvent::Unconfirmed(u) => {
                    missing += u.last + 1 - u.first;
                    eprintln!(
                        "skiff pub: messages {}-{} may be missing: {u}",
                        u.first, u.last
                    );
                }
                _ => {}
            }
        }
        if let (n @ 1.., Some(e)) = c.async_errors() {
            return Err(format!("the node refused {n} message(s): {e}").into());
        }
        if missing > 0 {
            return Err(format!(
                "{missing} message(s) may not have reached the node that was lost (numbered from 1 in the order published; see above); publish them again if they must arrive"
            )
            .into());
        }
        Ok(())
    })
}

/// `skiff sub`
#[derive(clap::Args, Debug)]
pub(crate) struct SubArgs {
    #[command(flatten)]
    loc: NodeLoc,
    /// Subject pattern (`*` one token, `>` the rest; with `--cmsg`, a cMsg
    /// pattern).
    pattern: String,
    /// Type pattern (`*` any; with `--cmsg`, a cMsg pattern).
    #[arg(long = "type", default_value = "*")]
    kind: String,
    /// Match the subject and the type as cMsg patterns over whole strings:
    /// `*` any run of characters, `?` one character, `#` a non-negative
    /// integer, `{i>5 & i<10 | i=20}` an integer in a range (e.g.
    /// `--cmsg 'daq.h*b.rate' --type 'count?'`).
    #[arg(long)]
    cmsg: bool,
    /// Stop after this many messages.
    #[arg(long)]
    count: Option<u64>,
    /// Slow-consumer policy: drop-oldest, drop-newest, block, disconnect.
    #[arg(long, default_value = "drop-oldest", value_parser = parse_policy)]
    policy: Policy,
    /// Queue bound in the node, in messages.
    #[arg(long, default_value_t = 65_536)]
    queue: u32,
    /// With `-n shm://…`: read the node's one buffer of this topic, shared
    /// with the host's other subscribers, in place (RBMQ's broker of
    /// buffers): `credits` (the buffer waits for its slowest reader) or
    /// `overwrite` (a reader a buffer behind loses what was overwritten).
    #[arg(long, value_name = "FLOW", value_parser = crate::bench::pubsub::parse_flow, conflicts_with = "cmsg")]
    shared_buffer: Option<skiff::shm::Flow>,
    /// Best effort between nodes (`reliable=false`): messages from other
    /// nodes that only best-effort subscriptions want may cross as
    /// datagrams, their loss counted in `lost` (`skiff stats --mesh`),
    /// never repaired.
    #[arg(long)]
    best_effort: bool,
    /// Join queue group G (NATS `nats sub --queue G`; `--queue` here is
    /// the queue bound): of the subscriptions in the group that match a
    /// message, skiff's and NATS clients' alike, one in the whole mesh gets
    /// each message and each request.
    #[arg(long, visible_alias = "group", value_name = "G", conflicts_with_all = ["cmsg", "shared_buffer"])]
    queue_group: Option<String>,
}

fn parse_policy(s: &str) -> std::result::Result<Policy, String> {
    Policy::parse(s).ok_or_else(|| {
        format!("`{s}` is not a policy: use drop-oldest, drop-newest, block or disconnect")
    })
}

pub(crate) fn show(m: &Message) -> String {
    let kind = m
        .kind
        .as_deref()
        .map(|k| format!(" [{k}]"))
        .unwrap_or_default();
    format!(
        "{}{kind} {}",
        m.subject,
        String::from_utf8_lossy(&m.payload)
    )
}

pub(crate) fn subscribe(a: SubArgs) -> Result<()> {
    let loc = a.loc.locator();
    if let Some(path) = loc.strip_prefix("file://") {
        let path = path.split('?').next().unwrap_or_default();
        if !std::path::Path::new(path).is_file() {
            return Err(format!(
                "no log at {path}: `skiff sub -n file://PATH` reads an existing log (`skiff pub -n file://PATH` writes one)"
            )
            .into());
        }
    }
    runtime()?.block_on(async move {
        let c = a.loc.connect_for("sub", true).await?;
        let mut opts = SubOptions::default()
            .policy(a.policy)
            .queue(a.queue)
            .best_effort(a.best_effort);
        if a.cmsg {
            opts = opts.cmsg();
        }
        if let Some(g) = &a.queue_group {
            opts = opts.queue_group(g.as_str());
        }
        if let Some(flow) = a.shared_buffer {
            if !a.loc.locator().starts_with("shm://") {
                return Err("--shared-buffer needs a node over shared memory (-n shm://NAME)".into());
            }
            opts = opts.shared_buffer(flow);
        }
        let mut s = c.subscribe_with(&a.pattern, &a.kind, opts).await?;
        // Scripts wait for this line rather than sleep.
        eprintln!(
            "skiff sub: subscribed to {} [{}] at {}",
            a.pattern,
            a.kind,
            a.loc.locator()
        );
        let mut events = c.events();
        let mut unanswered = 0u64;
        let mut n = 0u64;
        let mut dropped = 0;
        let mut skipped = 0;
        // What the node reports on its own (a gap when a node that sent
        // messages went down), checked each second.
        let mut notices = 0;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            let d = tokio::select! {
                d = s.recv() => d,
                Some(e) = events.recv() => {
                    report_event(&e);
                    continue;
                }
                _ = tick.tick() => {
                    if let (k, Some(text)) = c.async_errors() {
                        if k != notices {
                            notices = k;
                            eprintln!("skiff sub: the node says: {text}");
                        }
                    }
                    continue;
                }
            };
            let Some(d) = d else {
                break;
            };
            // A `file://` log's damage, reported before what follows it.
            let (k, note) = s.skipped();
            if k != skipped {
                skipped = k;
                eprintln!(
                    "skiff sub: {k} damaged log record(s) skipped so far (last: {})",
                    note.unwrap_or_default()
                );
            }
            outln!("{}", show(&d));
            if d.is_request() {
                unanswered += 1;
                eprintln!(
                    "skiff sub: a request on {} is not answered ({unanswered} so far): `skiff sub` only prints; answer with `skiff reply`",
                    d.subject
                );
            }
            if s.dropped() != dropped {
                dropped = s.dropped();
                eprintln!(
                    "skiff sub: {dropped} message(s) dropped so far (policy {})",
                    a.policy.name()
                );
            }
            n += 1;
            if a.count.is_some_and(|c| n >= c) {
                return Ok(());
            }
        }
        match s.error() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    })
}

/// Tells the user of a failover (`-n skiff://a,b`) on standard error.
fn report_event(e: &ClientEvent) {
    match e {
        ClientEvent::Disconnected { node, reason, .. } => {
            eprintln!("skiff sub: lost node {node} ({reason}); failing over")
        }
        ClientEvent::Reconnected(g) => eprintln!(
            "skiff sub: failed over from {} to {}; messages published during the {:?} without a node may be missing",
            g.from, g.to, g.down_for
        ),
        _ => {}
    }
}

/// `skiff req`
#[derive(clap::Args, Debug)]
pub(crate) struct ReqArgs {
    #[command(flatten)]
    loc: NodeLoc,
    /// Subject, or cluster name with `--cluster`.
    target: String,
    /// Request payload.
    #[arg(default_value = "")]
    payload: String,
    /// The target is a cluster: one member answers.
    #[arg(long)]
    cluster: bool,
    /// Affinity key (clusters).
    #[arg(long)]
    key: Option<String>,
    /// How long to wait: seconds (`0.5`) or with a unit (`200ms`, `1s`).
    #[arg(long, default_value = "5", value_parser = crate::bench::parse_secs)]
    timeout: Duration,
    /// Scatter-gather: collect up to this many replies.
    #[arg(long)]
    many: Option<usize>,
}

pub(crate) fn request(a: ReqArgs) -> Result<()> {
    runtime()?.block_on(async move {
        let c = a.loc.connect_for("req", false).await?;
        let target = if a.cluster {
            let t = Target::cluster(a.target.clone());
            match &a.key {
                Some(k) => t.with_key(Bytes::from(k.clone())),
                None => t,
            }
        } else {
            Target::from(a.target.as_str())
        };
        let msg = Message::new("", a.payload.clone());
        match a.many {
            Some(max) => {
                let replies = c
                    .request_many(target, msg, a.timeout, max)
                    .await
                    .map_err(|e| no_reply(e, a.timeout))?;
                if replies.is_empty() {
                    return Err(
                        format!("no replies within {:?}: {}", a.timeout, UNANSWERED_HINT).into(),
                    );
                }
                for r in replies {
                    outln!("{}", String::from_utf8_lossy(&r.payload));
                }
            }
            None => {
                let r = c
                    .request(target, msg, a.timeout)
                    .await
                    .map_err(|e| no_reply(e, a.timeout))?;
                outln!("{}", String::from_utf8_lossy(&r.payload));
            }
        }
        Ok(())
    })
}

/// What a request that nobody answered may have met.
const UNANSWERED_HINT: &str = "a subscriber may have got the request without answering \
    (`skiff sub` only prints requests; `skiff reply` answers them)";

/// A request's timeout, said with what may have happened to it.
fn no_reply(e: skiff::Error, timeout: Duration) -> Box<dyn Error> {
    match e {
        skiff::Error::Timeout => format!("no reply within {timeout:?}: {UNANSWERED_HINT}").into(),
        e => e.into(),
    }
}

/// `skiff reply`
#[derive(clap::Args, Debug)]
pub(crate) struct ReplyArgs {
    #[command(flatten)]
    loc: NodeLoc,
    /// Subject pattern to answer, or cluster name with `--cluster`.
    target: String,
    /// The reply payload; without it, each request is echoed back.
    payload: Option<String>,
    /// Join the cluster `target` with this capacity instead of subscribing.
    #[arg(long)]
    cluster: bool,
    /// Capacity advertised with `--cluster`.
    #[arg(long, default_value_t = 1)]
    capacity: u32,
    /// Stop after this many requests.
    #[arg(long)]
    count: Option<u64>,
    /// Answer as a member of queue group G (NATS `nats reply --queue G`):
    /// each request to the subject reaches one member of the group in the
    /// whole mesh, skiff's or NATS clients'.
    #[arg(
        long,
        visible_alias = "group",
        value_name = "G",
        conflicts_with = "cluster"
    )]
    queue_group: Option<String>,
}

pub(crate) fn reply(a: ReplyArgs) -> Result<()> {
    runtime()?.block_on(async move {
        let c = a.loc.connect_for("reply", false).await?;
        let answer = |req: &Message| match &a.payload {
            Some(p) => Message::new("", p.clone()),
            None => Message::new("", req.payload.clone()),
        };
        let mut n = 0u64;
        let done = |n: u64| a.count.is_some_and(|c| n >= c);
        if a.cluster {
            let m = c.join(&a.target, a.capacity).await?;
            eprintln!(
                "skiff reply: member of cluster {} (capacity {})",
                a.target, a.capacity
            );
            while let Some(i) = m.recv().await {
                match i {
                    Incoming::Request(r) => {
                        let out = answer(&r.msg);
                        r.reply(out).await?;
                        n += 1;
                    }
                    Incoming::Broadcast(b) => outln!("broadcast: {}", show(&b)),
                    _ => {}
                }
                if done(n) {
                    break;
                }
            }
        } else {
            let mut opts = SubOptions::default();
            if let Some(g) = &a.queue_group {
                opts = opts.queue_group(g.as_str());
            }
            let mut s = c.subscribe_with(&a.target, "*", opts).await?;
            match &a.queue_group {
                Some(g) => eprintln!(
                    "skiff reply: answering requests on {} in queue group {g}",
                    a.target
                ),
                None => eprintln!("skiff reply: answering requests on {}", a.target),
            }
            while let Some(d) = s.recv().await {
                if d.is_request() {
                    c.reply(&d, answer(&d)).await?;
                    n += 1;
                    if done(n) {
                        break;
                    }
                }
            }
        }
        c.flush().await?;
        Ok(())
    })
}

/// `skiff reload`
#[derive(clap::Args, Debug)]
pub(crate) struct ReloadArgs {
    #[command(flatten)]
    loc: NodeLoc,
}

/// Asks a node on this host to reread its configuration file (as SIGHUP
/// does); the node's log says what changed and what needs a restart.
pub(crate) fn reload(a: ReloadArgs) -> Result<()> {
    runtime()?.block_on(async move {
        let c = a.loc.connect_for("reload", false).await?;
        c.reload()
            .await
            .map_err(|e| format!("the node did not reload: {e}"))?;
        outln!("reloaded (the node's log says what changed)");
        Ok(())
    })
}

/// `skiff stats`
#[derive(clap::Args, Debug)]
pub(crate) struct StatsArgs {
    #[command(flatten)]
    loc: NodeLoc,
    /// Print the raw JSON.
    #[arg(long)]
    json: bool,
    /// The mesh: members, their state, interest, per-peer traffic and loss.
    #[arg(long)]
    mesh: bool,
}

pub(crate) fn stats(a: StatsArgs) -> Result<()> {
    runtime()?.block_on(async move {
        let c = a.loc.connect_for("stats", false).await?;
        if a.json {
            outln!("{}", c.stats_json().await?);
            return Ok(());
        }
        let s = c.stats().await?;
        if a.mesh {
            let Some(m) = &s.mesh else {
                return Err("this node is not part of a mesh (start it with --mesh)".into());
            };
            let t = &m.stats;
            outln!("mesh {:?}: this node {}, {} member(s) up", m.net, m.me, t.members_up);
            outln!(
                "      dropped: wrong net {}, malformed {}, unknown sender {}, member limit {}, bad membership {}, rate limited {}, interest limit {}, stale interest {}, bad frames {}, frames too large {}, send errors {}",
                t.wrong_net, t.malformed, t.unknown_sender, t.member_limit, t.bad_membership, t.rate_limited, t.interest_limit, t.stale_interest, m.bad_frames, t.frames_too_large, m.send_errors
            );
            outln!(
                "      syncs asked {}, sent {}; scout errors {}, dns errors {}; remote deliveries dropped {}",
                t.syncs_requested, t.syncs_sent, m.scout_errors, m.dns_errors, s.remote_drops
            );
            match &m.seal {
                Some(k) => outln!(
                    "      sealed (identity {}): handshakes {}; dropped: replayed {}, forged {}, plain {}, untrusted {}, bad handshakes {}, unknown session {}, queue {}, busy {}",
                    k.identity, k.handshakes, k.replayed, k.forged, k.plain, k.untrusted, k.bad_handshakes, k.unknown_session, k.queue_drops, k.refused_busy
                ),
                None => outln!("      NOT sealed: datagrams between nodes are neither authenticated nor encrypted"),
            }
            outln!(
                "{:<22} {:>4} {:>5} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>6} {:>5} {:>9}",
                "peer", "gen", "state", "patterns", "clusters", "sent", "sent dgram", "recv", "recv dgram", "lost", "dup", "far ahead"
            );
            for p in &m.peers {
                outln!(
                    "{:<22} {:>4} {:>5} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>6} {:>5} {:>9}",
                    p.addr.to_string(),
                    p.gen % 10_000,
                    if p.up { "up" } else { "down" },
                    p.patterns,
                    p.clusters,
                    p.sent_frames,
                    p.sent_datagrams,
                    p.recv_frames,
                    p.recv_datagrams,
                    p.lost,
                    p.duplicates,
                    p.far_ahead
                );
            }
            outln!(
                "      links: frames lost {}, gaps reported {}, best-effort frames dropped while delivery was behind {}; associations: packets dropped (duplicates such as a lone small packet's second copy, replays, forged, malformed, out of window) {}, retransmitted {} (found lost from acknowledgements {}, tail probes {}, timer expiries {}), received twice {}; new data waited for a shut window {} times, {} ms in all; delivery waited for a missing packet {} times, {} ms in all",
                m.link_lost,
                m.gaps_reported,
                m.delivery_dropped,
                m.tunnels.packets_dropped,
                m.tunnels.retransmits,
                m.tunnels.fast_retransmits,
                m.tunnels.tail_probes,
                m.tunnels.rto_expired,
                m.tunnels.duplicates,
                m.tunnels.window_stalls,
                m.tunnels.window_stalled_us / 1000,
                m.tunnels.gaps,
                m.tunnels.gap_us / 1000
            );
            if !m.links.is_empty() {
                outln!(
                    "{:<22} {:>11} {:>8} {:>10} {:>10} {:>10} {:>9} {:>9} {:>7} {:>6}",
                    "link", "policy", "queued", "queued B", "sent", "recv", "drop new", "drop old", "lost", "waits"
                );
            }
            for l in &m.links {
                outln!(
                    "{:<22} {:>11} {:>8} {:>10} {:>10} {:>10} {:>9} {:>9} {:>7} {:>6}",
                    l.peer,
                    l.policy,
                    l.queued_frames,
                    l.queued_bytes,
                    l.sent_frames,
                    l.recv_frames,
                    l.dropped_newest,
                    l.dropped_oldest,
                    l.lost,
                    l.waits
                );
                if l.spliced > 0 {
                    outln!("      spliced (sent from the shm ring, not copied): {}", l.spliced);
                }
                if !l.dropped_subjects.is_empty() {
                    let top: Vec<String> = l
                        .dropped_subjects
                        .iter()
                        .take(5)
                        .map(|(s, n)| format!("{s} {n}"))
                        .collect();
                    outln!("      dropped by subject: {}", top.join(", "));
                }
            }
            return Ok(());
        }
        outln!(
            "node: up {:.0}s, {} client(s) ({} since start), {} subscription(s), {} cluster(s), {} tunnel(s)",
            s.uptime_s, s.connections, s.connections_total, s.subscriptions, s.clusters, s.tunnels
        );
        outln!(
            "      published {}, requests {}, replies {}, no responders {}, broadcasts {}, limit hits {}, protocol errors {}, slow consumers {}",
            s.published, s.requests, s.replies, s.no_responders, s.broadcasts, s.limit_hits, s.protocol_errors, s.slow_consumers
        );
        for cl in &s.cluster_members {
            let members: Vec<String> = cl
                .members
                .iter()
                .map(|m| format!("{} (capacity {})", m.member, m.capacity))
                .collect();
            outln!("cluster {}: {}", cl.name, members.join(", "));
        }
        for w in &s.warnings {
            outln!("WARNING: {w}");
        }
        if s.auth || s.auth_failures > 0 || s.denied > 0 {
            outln!(
                "      auth {}, failed authentications {}, operations denied {}",
                if s.auth { "on" } else { "off" },
                s.auth_failures,
                s.denied
            );
        }
        for u in &s.users {
            if u.denied_publish + u.denied_subscribe + u.denied_reply + u.denied_join > 0 {
                outln!(
                    "user {}: denied publish {}, subscribe {}, reply {}, join {}",
                    u.name, u.denied_publish, u.denied_subscribe, u.denied_reply, u.denied_join
                );
            }
        }
        for cl in &s.clients {
            if cl.id == c.id() {
                continue; // this command's own connection
            }
            outln!(
                "client {} {}{} ({}): published {}, delivered {}, pending {} B, dropped broadcasts {}, requests waiting {}",
                cl.id,
                cl.name.as_deref().map(|n| format!("{n} ")).unwrap_or_default(),
                cl.peer, cl.user, cl.published, cl.delivered, cl.pending_bytes, cl.dropped_control, cl.requests_waiting
            );
            for sub in &cl.subscriptions {
                outln!(
                    "  sub {} {} [{}] {}: queued {}, delivered {}, dropped {}",
                    sub.sid, sub.pattern, sub.kind, sub.policy, sub.counters.queued, sub.counters.delivered, sub.counters.dropped
                );
            }
            for r in &cl.shared_readers {
                outln!("  shared-buffer reader {}: read {}, dropped {}", r.peer, r.read, r.dropped);
            }
        }
        Ok(())
    })
}
