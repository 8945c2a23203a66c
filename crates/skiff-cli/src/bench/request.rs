//! `skiff bench request`: request/reply round trips through a node, with
//! 1 and 16 concurrent requesters on one connection, against nats-server
//! (`--nats`) and a raw TCP ping-pong floor, in one run.
//!
//! One responder client subscribes to `bench.req` and echoes each request;
//! a second client runs C requester tasks, each sending the next request as
//! soon as its reply arrives, for `--duration-secs`. msgs/s is round trips
//! per second; p50/p99 the round-trip latency. A request crosses the node
//! twice, so the `tcp-pingpong` floor (one TCP round trip between two
//! threads over loopback, no server) is about half of the best possible.
//!
//! Across a mesh (bench/mesh.sh): the requester connects to `--pub-at` and
//! one responder to each `--sub-at`; with `--cluster NAME` the responders
//! join cluster NAME and each request goes to one of them (nats: a queue
//! group), so three responders on three nodes answer a third each. The
//! first requests are retried while the mesh answers "no responders"
//! (interest still on its way), for up to 10 s.

use std::error::Error;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use skiff::client::{Client, Incoming, Target};
use skiff::Message;

use super::pin::PinAll;
use super::pubsub::{run_natsbench, At, Places, Server};
use super::report::{self, record, Histogram, Reporter, Row};
use super::{parse_secs, parse_size, OutputArgs};

/// `skiff bench request`
#[derive(clap::Args, Debug)]
pub(crate) struct RequestArgs {
    /// Concurrent requesters.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub(crate) concurrency: Vec<usize>,
    /// Payload sizes.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "8")]
    pub(crate) sizes: Vec<usize>,
    /// How long each test runs, in seconds.
    #[arg(long, value_parser = parse_secs, default_value = "2")]
    pub(crate) duration_secs: Duration,
    /// Use this node instead of starting one.
    #[arg(long)]
    pub(crate) node: Option<String>,
    /// Also run against nats-server.
    #[arg(long)]
    pub(crate) nats: bool,
    #[command(flatten)]
    pub(crate) at: At,
    /// Responders join this cluster and each request goes to one member
    /// (nats: this queue group) instead of to every subscriber of a
    /// subject.
    #[arg(long, value_name = "NAME")]
    pub(crate) cluster: Option<String>,
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
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

/// Runs `skiff bench request`.
pub(crate) fn run(a: &RequestArgs, rep: &mut Reporter) -> Result<(), Box<dyn Error>> {
    // The requesters and the responder get one-worker runtimes of their
    // own, as two single-threaded programs would have: sharing one
    // two-worker runtime, requests and replies hopped between the workers,
    // each hop a cross-CPU wake-up (one requester's p50 was 177 µs that
    // way, 67–125 µs apart). The 16-requester rate still varies from run
    // to run (85–235 k/s) with whether the responder lands on the node's
    // CPU: bench/request_placement.sh.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let resp_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("bench-responder")
        .enable_all()
        .build()?;
    let own = match &a.node {
        Some(_) => None,
        None if a.at.skiff_given() => None,
        None => Some(Server::skiff()?),
    };
    let url = a
        .node
        .clone()
        .or_else(|| own.as_ref().map(|s| s.url.clone()))
        .unwrap_or_default();
    let places = a.at.skiff(&url);
    let nats_places = a.at.nats();
    let nats = if a.nats && nats_places.is_none() {
        Some(Server::nats()?)
    } else {
        None
    };
    let nats_places = nats_places.or_else(|| nats.as_ref().map(|n| Places::new(None, &[], &n.url)));
    let servers: Vec<u32> = own.iter().chain(nats.iter()).map(Server::pid).collect();
    let _pin = match a.cpu {
        Some(cpu) => {
            Some(PinAll::to(cpu, &servers).map_err(|e| format!("--cpu {cpu}: cannot pin: {e}"))?)
        }
        None => None,
    };
    let (_wake, wake_note) = super::pin::hold_wake(a.wake_latency_us)?;
    let pinned = a
        .cpu
        .map(|c| format!(" all on cpu {c}"))
        .unwrap_or_default()
        + &wake_note;
    for &size in &a.sizes {
        if !a.no_floor {
            let mut row = tcp_pingpong(size, a.duration_secs)?;
            if !pinned.is_empty() {
                row.options = Some(pinned.trim().to_string());
            }
            rep.push(row)?;
        }
        for &conc in &a.concurrency {
            let mut row = rt.block_on(skiff_requests(
                resp_rt.handle(),
                &places,
                a.cluster.as_deref(),
                conc,
                size,
                a.duration_secs,
            ))?;
            let mut options = places.describe();
            if let Some(c) = &a.cluster {
                options += &format!(" cluster={c}");
            }
            row.options = Some(options + &pinned);
            rep.push(row)?;
            if let Some(np) = &nats_places {
                let mut args: Vec<String> = vec!["request".into()];
                args.extend(np.natsbench_args());
                args.extend([
                    "-conc".into(),
                    conc.to_string(),
                    "-size".into(),
                    size.to_string(),
                    "-duration".into(),
                    format!("{}ms", a.duration_secs.as_millis()),
                ]);
                if let Some(c) = &a.cluster {
                    args.extend(["-queue".into(), c.clone()]);
                }
                let mut row = run_natsbench(&args)?;
                if let Some(o) = &mut row.options {
                    o.push_str(&pinned);
                }
                rep.push(row)?;
            }
        }
    }
    Ok(())
}

/// A responder: echoes every request it gets, as a subscriber of
/// `bench.req` or as a member of `cluster`.
async fn responder(
    at: &str,
    cluster: Option<&str>,
) -> Result<(Client, tokio::task::JoinHandle<()>), Box<dyn Error>> {
    let server = Client::connect(at).await?;
    let s2 = server.clone();
    let task = match cluster {
        None => {
            let mut sub = server.subscribe("bench.req", "*").await?;
            tokio::spawn(async move {
                while let Some(d) = sub.recv().await {
                    let payload = d.payload.clone();
                    if s2.reply(&d, Message::new("", payload)).await.is_err() {
                        break;
                    }
                }
            })
        }
        Some(name) => {
            let member = server.join(name, 100).await?;
            tokio::spawn(async move {
                let _keep = s2;
                while let Some(i) = member.recv().await {
                    if let Incoming::Request(r) = i {
                        let payload = r.msg.payload.clone();
                        if r.reply(Message::new("", payload)).await.is_err() {
                            break;
                        }
                    }
                }
            })
        }
    };
    Ok((server, task))
}

async fn skiff_requests(
    resp_rt: &tokio::runtime::Handle,
    places: &Places,
    cluster: Option<&str>,
    conc: usize,
    size: usize,
    dur: Duration,
) -> Result<Row, Box<dyn Error>> {
    let mut responders = Vec::new();
    for at in &places.subscribers {
        let (at, cluster) = (at.clone(), cluster.map(str::to_owned));
        responders.push(
            resp_rt
                .spawn(async move {
                    responder(&at, cluster.as_deref())
                        .await
                        .map_err(|e| e.to_string())
                })
                .await??,
        );
    }
    let target = match cluster {
        Some(name) => Target::cluster(name),
        None => Target::from("bench.req"),
    };
    let c = Client::connect(&places.publisher).await?;
    let payload = bytes::Bytes::from(vec![0x5a; size]);
    let timeout = Duration::from_secs(5);
    // Warm up; while interest crosses the mesh the first requests may find
    // no responder yet.
    let patience = Instant::now();
    let mut warm = 0;
    while warm < 1000 {
        match c
            .request(target.clone(), Message::new("", payload.clone()), timeout)
            .await
        {
            Ok(_) => warm += 1,
            Err(skiff::Error::NoResponders { .. }) if patience.elapsed() < PATIENCE => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conc {
        let c = c.clone();
        let payload = payload.clone();
        let target = target.clone();
        tasks.push(tokio::spawn(async move {
            let mut h: Histogram = report::histogram();
            while start.elapsed() < dur {
                let t = Instant::now();
                c.request(target.clone(), Message::new("", payload.clone()), timeout)
                    .await?;
                record(&mut h, t.elapsed());
            }
            Ok::<Histogram, skiff::Error>(h)
        }));
    }
    let mut hist = report::histogram();
    for t in tasks {
        hist.add(t.await??).map_err(|e| format!("{e:?}"))?;
    }
    let elapsed = start.elapsed();
    for (_, task) in responders {
        task.abort();
    }
    let mut row = Row::new("skiff-request", &format!("conc={conc}"), size);
    row.set_latency(&hist);
    row.set_throughput(hist.len(), elapsed);
    Ok(row)
}

/// How long the warm-up retries requests that find no responder.
const PATIENCE: Duration = Duration::from_secs(10);

/// One TCP round trip between two threads over loopback: the floor.
fn tcp_pingpong(size: usize, dur: Duration) -> Result<Row, Box<dyn Error>> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = l.accept()?;
        s.set_nodelay(true)?;
        let mut buf = vec![0u8; size];
        loop {
            if s.read_exact(&mut buf).is_err() {
                return Ok(());
            }
            s.write_all(&buf)?;
        }
    });
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut buf = vec![0x5au8; size];
    let mut hist = report::histogram();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < dur {
        let t = Instant::now();
        s.write_all(&buf)?;
        s.read_exact(&mut buf)?;
        if n >= 1000 {
            record(&mut hist, t.elapsed());
        }
        n += 1;
    }
    drop(s);
    let _ = echo.join();
    let mut row = Row::new("tcp-pingpong", "floor", size);
    row.set_latency(&hist);
    row.set_throughput(hist.len(), start.elapsed());
    Ok(row)
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
