//! `skiff bench failover`: how long a subscriber is without messages when
//! its node is killed (kill -9) and its client fails over to the next node
//! of its locator (`skiff://A,B`).
//!
//! The benchmark starts the mesh itself, on loopback: nodes B and C for the
//! whole run, and for each trial a fresh node A seeded with them. A
//! publisher on C sends a message every millisecond carrying its sequence
//! number and the time it was sent (this process's clock, which also times
//! the receipt). A subscriber connects with `skiff://A,B` (so to A), waits
//! until messages from C reach it through A, then A is killed. The trial's
//! figure is the time from the kill to the arrival of the first message
//! *published after the kill* (messages in flight through A do not count):
//! the client noticing, reconnecting to B, re-subscribing, and B's interest
//! reaching C. Resolution is the publishing interval (1 ms).
//!
//! Each trial also counts messages missed across the gap (a jump in the
//! sequence, expected: delivery is at most once), messages delivered
//! twice and messages delivered out of order (neither expected). The `skiff-failover` row has p50 and p99 (with
//! ten trials, the largest) in µs and the largest in its options.

use std::error::Error;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use skiff::client::Client;
use skiff::Message;

use super::report::{self, Reporter, Row};
use super::server::{free_port, Server};
use super::OutputArgs;

/// `skiff bench failover`
#[derive(clap::Args, Debug)]
pub struct FailoverArgs {
    /// How many trials and where.
    #[command(flatten)]
    pub params: FailoverParams,
    /// Output format.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// The failover benchmark's settings, shared with skiff-bench.
#[derive(clap::Args, Debug, Clone)]
pub struct FailoverParams {
    /// Trials (one killed node each).
    #[arg(long, default_value_t = 10)]
    pub trials: usize,
    /// The mesh's network name [default: bench-failover-PID].
    #[arg(long)]
    pub net: Option<String>,
    /// Longest wait for messages to flow, or to flow again after the kill,
    /// in seconds.
    #[arg(long, value_parser = super::parse_secs, default_value = "10")]
    pub patience: Duration,
}

/// How often the publisher sends.
const INTERVAL: Duration = Duration::from_millis(1);

/// A free UDP port on loopback.
fn free_udp_port() -> Result<u16, Box<dyn Error>> {
    Ok(std::net::UdpSocket::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A mesh node on loopback, seeded with `seeds` (mesh addresses).
fn mesh_node(
    skiff: &Path,
    net: &str,
    seeds: &[String],
) -> Result<(Server, String), Box<dyn Error>> {
    let mesh = format!("127.0.0.1:{}", free_udp_port()?);
    let mut args = vec![
        "--mesh".to_owned(),
        mesh.clone(),
        "--net".into(),
        net.into(),
        "--no-scout".into(),
    ];
    if !seeds.is_empty() {
        args.extend(["--seeds".into(), seeds.join(",")]);
    }
    Ok((Server::skiff_with(skiff, free_port()?, &args)?, mesh))
}

/// What one trial saw.
#[derive(Debug, Default)]
struct Trial {
    /// Kill to first message published after it.
    recovery: Duration,
    /// Sequence numbers skipped across the gap.
    missed: u64,
    /// Messages seen twice.
    duplicates: u64,
    /// Messages seen once but after a later one (out of order).
    late: u64,
}

/// Runs `skiff bench failover`, starting nodes from the binary `skiff`.
pub fn run(a: &FailoverParams, skiff: &Path, rep: &mut Reporter) -> Result<(), Box<dyn Error>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let net = a
        .net
        .clone()
        .unwrap_or_else(|| format!("bench-failover-{}", std::process::id()));
    let (b, b_mesh) = mesh_node(skiff, &net, &[])?;
    let (c, c_mesh) = mesh_node(skiff, &net, std::slice::from_ref(&b_mesh))?;
    let epoch = Instant::now();
    let publisher = rt.block_on(Client::connect(&c.url))?;
    let pub_task = rt.spawn(async move {
        let mut tick = tokio::time::interval(INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut seq = 0u64;
        loop {
            tick.tick().await;
            seq += 1;
            let mut p = BytesMut::with_capacity(16);
            p.put_u64(seq);
            p.put_u64(epoch.elapsed().as_nanos() as u64);
            if publisher
                .publish(Message::new("bench.failover", p.freeze()))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let mut hist = report::histogram();
    let mut worst = Duration::ZERO;
    let (mut missed, mut duplicates, mut late) = (0, 0, 0);
    let mut outcome = Ok(());
    for i in 0..a.trials {
        let t = rt.block_on(trial(
            skiff,
            &net,
            &[b_mesh.clone(), c_mesh.clone()],
            &b,
            epoch,
            a.patience,
        ));
        match t {
            Ok(t) => {
                eprintln!(
                    "failover trial {}: {:.1} ms, {} missed, {} twice, {} late",
                    i + 1,
                    t.recovery.as_secs_f64() * 1e3,
                    t.missed,
                    t.duplicates,
                    t.late
                );
                report::record(&mut hist, t.recovery);
                worst = worst.max(t.recovery);
                missed += t.missed;
                duplicates += t.duplicates;
                late += t.late;
            }
            Err(e) => {
                outcome = Err(format!("failover trial {}: {e}", i + 1).into());
                break;
            }
        }
    }
    pub_task.abort();
    drop((b, c));
    if !hist.is_empty() {
        let mut row = Row::new("skiff-failover", "kill-9", 16);
        row.set_latency(&hist);
        row.lost = Some(missed);
        row.options = Some(format!(
            "trials={} max_us={:.0} twice={duplicates} late={late} net={net}",
            hist.len(),
            worst.as_secs_f64() * 1e6
        ));
        rep.push(row)?;
    }
    outcome
}

/// One trial: a fresh node A, a subscriber on `skiff://A,B`, kill A.
async fn trial(
    skiff: &Path,
    net: &str,
    seeds: &[String],
    b: &Server,
    epoch: Instant,
    patience: Duration,
) -> Result<Trial, Box<dyn Error>> {
    let (mut a, _) = mesh_node(skiff, net, seeds)?;
    let locator = format!("{},{}", a.url, b.url.trim_start_matches("skiff://"));
    let client = Client::connect(&locator).await?;
    let mut sub = client.subscribe("bench.failover", "*").await?;
    let decode = |p: &Bytes| {
        let mut p = p.clone();
        (p.remaining() >= 16).then(|| (p.get_u64(), p.get_u64()))
    };
    // Messages flow from C through A for a moment first.
    let flowing = Instant::now();
    let mut last_seq = 0;
    let mut seen = 0;
    // Every sequence number delivered in this trial: a number seen again
    // is a duplicate, one below the highest but new arrived out of order.
    let mut got = std::collections::HashSet::new();
    let mut check = |seq: u64, last: u64, t: &mut Trial| {
        if !got.insert(seq) {
            t.duplicates += 1;
        } else if seq <= last {
            t.late += 1;
        }
    };
    let mut t = Trial::default();
    while seen < 200 {
        let d = tokio::time::timeout(patience, sub.recv())
            .await
            .map_err(|_| {
                format!("no message from C reached A within {patience:?}: is the mesh up?")
            })?
            .ok_or("the subscription ended before the kill")?;
        if let Some((seq, _)) = decode(&d.payload) {
            check(seq, last_seq, &mut t);
            last_seq = last_seq.max(seq);
            seen += 1;
        }
        if flowing.elapsed() > patience {
            return Err("messages did not flow steadily through A".into());
        }
    }
    let killed_ns = epoch.elapsed().as_nanos() as u64;
    let killed = Instant::now();
    a.kill()?;
    loop {
        let left = patience.saturating_sub(killed.elapsed());
        let d = tokio::time::timeout(left, sub.recv())
            .await
            .map_err(|_| format!("no message arrived within {patience:?} of killing A"))?
            .ok_or(
                "the subscription ended when its node died: the client did not fail over to B",
            )?;
        let Some((seq, sent_ns)) = decode(&d.payload) else {
            continue;
        };
        check(seq, last_seq, &mut t);
        if seq <= last_seq {
            continue;
        }
        if sent_ns > killed_ns {
            t.recovery = killed.elapsed();
            t.missed = seq - last_seq - 1;
            last_seq = seq;
            break;
        }
        last_seq = seq;
    }
    // A few more, to catch anything delivered twice after the switch.
    let mut last = last_seq;
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_millis(100) {
        match tokio::time::timeout(Duration::from_millis(100), sub.recv()).await {
            Ok(Some(d)) => {
                if let Some((seq, _)) = decode(&d.payload) {
                    check(seq, last, &mut t);
                    last = last.max(seq);
                }
            }
            _ => break,
        }
    }
    client.close();
    Ok(t)
}
