//! `skiff bench request`: request/reply round trips through a node, with
//! 1 and 16 concurrent requesters on one connection.
//!
//! One responder client subscribes to `bench.req` and echoes each request;
//! a second client runs C requester tasks, each sending the next request as
//! soon as its reply arrives, for `--duration-secs`. msgs/s is round trips
//! per second; p50/p99 the round-trip latency.
//!
//! Across a mesh (bench/mesh.sh): the requester connects to `--pub-at` and
//! one responder to each `--sub-at`; with `--cluster NAME` the responders
//! join cluster NAME and each request goes to one of them, so three
//! responders on three nodes answer a third each. The first requests are
//! retried while the mesh answers "no responders" (interest still on its
//! way), for up to 10 s.

use std::error::Error;
use std::path::Path;
use std::time::{Duration, Instant};

use skiff::client::{Client, Incoming, Target};
use skiff::Message;

use super::pubsub::{At, Places};
use super::report::{self, record, Histogram, Reporter, Row};
use super::server::Server;
use super::{parse_secs, parse_size, OutputArgs};

/// `skiff bench request`
#[derive(clap::Args, Debug)]
pub struct RequestArgs {
    /// What to measure and where.
    #[command(flatten)]
    pub params: RequestParams,
    /// Accepted and ignored: the TCP ping-pong floor this used to skip is
    /// skiff-bench's now.
    #[arg(long, hide = true)]
    pub no_floor: bool,
    /// Output format.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// The request/reply benchmark's settings, shared with skiff-bench.
#[derive(clap::Args, Debug, Clone)]
pub struct RequestParams {
    /// Concurrent requesters.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub concurrency: Vec<usize>,
    /// Payload sizes.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "8")]
    pub sizes: Vec<usize>,
    /// How long each test runs, in seconds.
    #[arg(long, value_parser = parse_secs, default_value = "2")]
    pub duration_secs: Duration,
    /// Use this node instead of starting one.
    #[arg(long)]
    pub node: Option<String>,
    /// Where the requester and the responders connect.
    #[command(flatten)]
    pub at: At,
    /// Responders join this cluster and each request goes to one member
    /// instead of to every subscriber of a subject.
    #[arg(long, value_name = "NAME")]
    pub cluster: Option<String>,
}

/// A request/reply run set up: the runtimes of the requesters and of the
/// responders, the node started (unless one was given) and where clients
/// connect. Measures one row at a time, so that a caller can put other
/// rows beside them.
#[derive(Debug)]
pub struct Session {
    params: RequestParams,
    rt: tokio::runtime::Runtime,
    resp_rt: tokio::runtime::Runtime,
    own: Option<Server>,
    places: Places,
}

impl Session {
    /// Builds the runtimes and starts `skiff node` from the binary `skiff`
    /// unless a node is given.
    pub fn start(params: &RequestParams, skiff: &Path) -> Result<Session, Box<dyn Error>> {
        // The requesters and the responder get one-worker runtimes of their
        // own, as two single-threaded programs would have: sharing one
        // two-worker runtime, requests and replies hopped between the
        // workers, each hop a cross-CPU wake-up. The 16-requester rate
        // still varies from run to run with whether the responder lands on
        // the node's CPU: bench/request_placement.sh.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let resp_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("bench-responder")
            .enable_all()
            .build()?;
        let (own, places) = params.at.skiff_node(params.node.as_deref(), skiff)?;
        Ok(Session {
            params: params.clone(),
            rt,
            resp_rt,
            own,
            places,
        })
    }

    /// The node this session started, if it started one.
    pub fn node(&self) -> Option<&Server> {
        self.own.as_ref()
    }

    /// Measures `conc` requesters at `size` bytes: a row `skiff-request`,
    /// `conc=N`, whose options end with `note`.
    pub fn requests(&self, conc: usize, size: usize, note: &str) -> Result<Row, Box<dyn Error>> {
        let p = &self.params;
        let mut row = self.rt.block_on(skiff_requests(
            self.resp_rt.handle(),
            &self.places,
            p.cluster.as_deref(),
            conc,
            size,
            p.duration_secs,
        ))?;
        let mut options = self.places.describe();
        if let Some(c) = &p.cluster {
            options += &format!(" cluster={c}");
        }
        row.options = Some(options + note);
        Ok(row)
    }
}

/// Runs `skiff bench request`, starting nodes from the binary `skiff`.
pub fn run(a: &RequestArgs, skiff: &Path, rep: &mut Reporter) -> Result<(), Box<dyn Error>> {
    let session = Session::start(&a.params, skiff)?;
    for &size in &a.params.sizes {
        for &conc in &a.params.concurrency {
            rep.push(session.requests(conc, size, "")?)?;
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

/// Round trips of `conc` requesters on one connection, as the module
/// documentation says: a row `skiff-request`, `conc=N`.
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
