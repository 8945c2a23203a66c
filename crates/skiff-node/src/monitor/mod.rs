//! The HTTP monitoring listener (`monitor = "127.0.0.1:8222"`,
//! `--monitor`), read-only, in the manner of nats-server's port 8222:
//! `/healthz`, `/varz`, `/connz`, `/subsz`, `/meshz` (JSON, fields in
//! `docs/monitoring.md`) and `/metrics` (OpenMetrics text, [`metrics`]).
//! Every answer is built from one [`skiff_proto::stats::NodeStats`]
//! snapshot, the same counters `skiff stats` reads.
//!
//! Hostile input is bounded: at most [`MAX_CONNS`] connections, request
//! heads of at most [`MAX_HEAD`] bytes that must arrive within
//! [`HEAD_TIMEOUT`], a connection lives at most [`CONN_TIMEOUT`], only
//! `GET` and `HEAD` without a body, query parameters checked
//! ([`query`]), unknown paths 404.
//!
//! Also here: the start-up log line ([`log_start`]) and the watchdog that
//! warns, once a second at most per cause, about subscriptions dropping
//! messages (naming the client and the subscription) and other drops
//! ([`watchdog`]).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustc_hash::FxHashMap;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::broker::Broker;
use crate::config::Config;
use crate::mesh::MeshSettings;
use skiff_proto::stats::{ClientStats, NodeStats};

pub mod metrics;
pub mod query;

/// Connections served at once; more wait in the kernel's backlog.
pub const MAX_CONNS: usize = 64;
/// Largest request head (request line and headers), bytes.
pub const MAX_HEAD: usize = 16 * 1024;
/// Time a request head has to arrive.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a monitoring connection is kept.
pub const CONN_TIMEOUT: Duration = Duration::from_secs(60);
/// A node with a mesh and no seeds (scouting only) may be alone: it counts
/// as converged after scouting this long without finding anyone.
pub const SCOUT_GRACE: Duration = Duration::from_secs(3);

/// What `/healthz` answers from.
#[derive(Debug)]
pub struct Health {
    /// 0: starting, 1: listening, 2: stopping.
    phase: AtomicU8,
    /// Whether the mesh has seeds (it waits for a member) or only scouts.
    seeded: AtomicBool,
    since: parking_lot::Mutex<Instant>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            phase: AtomicU8::new(0),
            seeded: AtomicBool::new(false),
            since: parking_lot::Mutex::new(Instant::now()),
        }
    }
}

impl Health {
    /// Every listener is up.
    pub(crate) fn set_listening(&self, mesh: Option<&MeshSettings>) {
        self.seeded.store(
            mesh.is_some_and(|m| !m.seeds.is_empty() || m.seeds_dns.is_some()),
            Relaxed,
        );
        *self.since.lock() = Instant::now();
        self.phase.store(1, Relaxed);
    }

    /// The node is shutting down.
    pub(crate) fn set_stopping(&self) {
        self.phase.store(2, Relaxed);
    }

    /// `Ok` when the node serves (listeners up and, with a mesh, the mesh
    /// converged: a member is up, or a scouting-only node has looked for
    /// [`SCOUT_GRACE`]); else why not.
    pub fn check(&self, broker: &Broker) -> Result<(), String> {
        match self.phase.load(Relaxed) {
            0 => return Err("starting: listeners not up yet".into()),
            2 => return Err("shutting down".into()),
            _ => {}
        }
        let Some(m) = broker.mesh() else {
            return Ok(());
        };
        let up = m.view().stats.members_up;
        if up > 0 {
            return Ok(());
        }
        if self.seeded.load(Relaxed) {
            return Err("mesh not converged: no member up yet (waiting for the seeds)".into());
        }
        if self.since.lock().elapsed() < SCOUT_GRACE {
            return Err("mesh not converged: scouting for members".into());
        }
        Ok(())
    }
}

/// Logs the effective configuration at start (nothing secret is in it;
/// settings that carry secrets are left out by name).
pub(crate) fn log_start(c: &Config) {
    let mesh = c.mesh.as_ref().map(|m| {
        format!(
            "bind={} net={} seeds={:?} seeds_dns={:?} scout={} max_members={}",
            m.bind, m.net, m.seeds, m.seeds_dns, m.scout, m.max_members
        )
    });
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        tcp = ?c.tcp,
        unix = ?c.unix,
        shm = ?c.shm,
        monitor = ?c.monitor,
        mesh = ?mesh,
        workers = c.workers(),
        spin_us = c.spin_us,
        wake_latency_us = ?c.wake_latency_us,
        log_level = c.log_level.as_deref().unwrap_or("default"),
        log_format = c.log_format.name(),
        limits = ?c.limits,
        "node starting"
    );
}

/// Warns about drops once a second at most per cause: a subscription
/// that dropped messages in the last second (naming the client, its
/// address and the subscription), clients dropping broadcasts, remote
/// deliveries dropped. Ends when `stop` turns true.
pub(crate) async fn watchdog(broker: Arc<Broker>, mut stop: watch::Receiver<bool>) {
    let mut last: FxHashMap<(u64, u64), u64> = FxHashMap::default();
    let mut last_control: FxHashMap<u64, u64> = FxHashMap::default();
    let mut last_remote = 0u64;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let s = broker.stats();
        let mut seen = FxHashMap::default();
        let mut seen_control = FxHashMap::default();
        for c in &s.clients {
            for sub in &c.subscriptions {
                let d = sub.counters.dropped;
                let before = last.get(&(c.id, sub.sid)).copied().unwrap_or(0);
                if d > before {
                    crate::warn_every!(
                        &format!("slow consumer {} {}", c.id, sub.sid),
                        client = c.id,
                        peer = %c.peer,
                        sid = sub.sid,
                        pattern = %sub.pattern,
                        policy = %sub.policy,
                        dropped = d - before,
                        dropped_total = d,
                        queued = sub.counters.queued,
                        pending_bytes = c.pending_bytes,
                        "slow consumer: subscription dropping messages"
                    );
                }
                seen.insert((c.id, sub.sid), d);
            }
            let before = last_control.get(&c.id).copied().unwrap_or(0);
            if c.dropped_control > before {
                crate::warn_every!(
                    &format!("control drops {}", c.id),
                    client = c.id,
                    peer = %c.peer,
                    dropped = c.dropped_control - before,
                    pending_bytes = c.pending_bytes,
                    "slow consumer: broadcasts or tunnel frames not queued over max_pending_bytes"
                );
            }
            seen_control.insert(c.id, c.dropped_control);
        }
        if s.remote_drops > last_remote {
            crate::warn_every!(
                "remote drops",
                dropped = s.remote_drops - last_remote,
                "messages from other nodes dropped: a subscription was full"
            );
        }
        last_remote = s.remote_drops;
        last = seen;
        last_control = seen_control;
    }
}

/// The monitoring listener's state.
#[derive(Debug)]
pub struct Monitor {
    broker: Arc<Broker>,
    health: Arc<Health>,
    config: Value,
}

impl Monitor {
    /// A monitor of `broker`.
    pub(crate) fn new(broker: Arc<Broker>, health: Arc<Health>, c: &Config) -> Arc<Monitor> {
        let config = json!({
            "tcp": c.tcp.map(|a| a.to_string()),
            "unix": c.unix.as_ref().map(|p| p.display().to_string()),
            "shm": c.shm,
            "monitor": c.monitor.map(|a| a.to_string()),
            "mesh": c.mesh.as_ref().map(|m| m.bind.to_string()),
            "workers": c.workers(),
        });
        Arc::new(Monitor {
            broker,
            health,
            config,
        })
    }
}

/// Serves the monitoring listener until `stop` turns true.
pub(crate) async fn serve(l: TcpListener, m: Arc<Monitor>, mut stop: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNS));
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = stop.changed() => return,
        };
        let (s, _) = tokio::select! {
            r = l.accept() => match r {
                Ok(x) => x,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let m = m.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let svc = hyper::service::service_fn(move |req| {
                let m = m.clone();
                async move { Ok::<_, Infallible>(answer(&m, &req)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(MAX_HEAD)
                .serve_connection(TokioIo::new(s), svc);
            let _ = tokio::time::timeout(CONN_TIMEOUT, conn).await;
        });
    }
}

type Answer = Response<Full<Bytes>>;

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Answer {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    if let Ok(v) = "no-store".parse() {
        r.headers_mut().insert(hyper::header::CACHE_CONTROL, v);
    }
    r
}

fn json_reply(status: StatusCode, v: &Value) -> Answer {
    let mut body = serde_json::to_vec_pretty(v).unwrap_or_default();
    body.push(b'\n');
    reply(status, "application/json", body)
}

fn error(status: StatusCode, text: String) -> Answer {
    json_reply(status, &json!({ "error": text }))
}

/// Answers one request (see the module documentation).
fn answer(m: &Monitor, req: &Request<Incoming>) -> Answer {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "read-only: GET and HEAD only".into(),
        );
    }
    let has_body = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .is_some_and(|v| v.as_bytes() != b"0")
        || req.headers().contains_key(hyper::header::TRANSFER_ENCODING);
    if has_body {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "requests take no body".into(),
        );
    }
    let path = req.uri().path();
    let q = req.uri().query().unwrap_or("");
    let bad = |e: String| error(StatusCode::BAD_REQUEST, e);
    match path {
        "/healthz" => {
            if let Err(e) = query::parse_none(path, q) {
                return bad(e);
            }
            match m.health.check(&m.broker) {
                Ok(()) => json_reply(StatusCode::OK, &json!({ "status": "ok" })),
                Err(reason) => json_reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &json!({ "status": "unavailable", "reason": reason }),
                ),
            }
        }
        "/subsz" => match query::parse_subsz(q) {
            Ok(p) => json_reply(StatusCode::OK, &subsz(&m.broker, &m.broker.stats(), p)),
            Err(e) => bad(e),
        },
        "/varz" | "/meshz" | "/metrics" | "/" => {
            if let Err(e) = query::parse_none(path, q) {
                return bad(e);
            }
            match path {
                "/varz" => json_reply(StatusCode::OK, &varz(m, &m.broker.stats())),
                "/meshz" => match m.broker.mesh() {
                    Some(l) => json_reply(StatusCode::OK, &meshz(&l.view())),
                    None => error(
                        StatusCode::NOT_FOUND,
                        "this node is not part of a mesh".into(),
                    ),
                },
                "/metrics" => reply(
                    StatusCode::OK,
                    metrics::CONTENT_TYPE,
                    metrics::encode(m.broker.stats(), crate::logging::WARNINGS.load(Relaxed)),
                ),
                _ => json_reply(
                    StatusCode::OK,
                    &json!({ "endpoints": ["/healthz", "/varz", "/connz", "/subsz", "/meshz", "/metrics"] }),
                ),
            }
        }
        "/connz" => match query::parse_connz(q) {
            Ok(c) => json_reply(StatusCode::OK, &connz(&m.broker, &m.broker.stats(), c)),
            Err(e) => bad(e),
        },
        _ => error(
            StatusCode::NOT_FOUND,
            "unknown path: try /healthz, /varz, /connz, /subsz, /meshz or /metrics".into(),
        ),
    }
}

fn varz(m: &Monitor, s: &NodeStats) -> Value {
    let l = m.broker.limits();
    let pending: usize = s.clients.iter().map(|c| c.pending_bytes).sum();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": s.uptime_s,
        "config": m.config,
        "limits": {
            "max_subject": l.max_subject,
            "max_payload": l.max_payload,
            "max_subscriptions": l.max_subscriptions,
            "max_pending_bytes": l.max_pending_bytes,
            "max_total_pending_bytes": l.max_total_pending_bytes,
            "max_connections": l.max_connections,
            "max_requests": l.max_requests,
            "drain_timeout_ms": l.drain_timeout_ms,
            "read_timeout_ms": l.read_timeout_ms,
            "ping_interval_ms": l.ping_interval_ms,
            "max_pings_out": l.max_pings_out,
        },
        "connections": s.connections,
        "connections_total": s.connections_total,
        "subscriptions": s.subscriptions,
        "clusters": s.clusters,
        "tunnels": s.tunnels,
        "messages_received": s.published,
        "messages_delivered": s.delivered,
        "messages_dropped": s.dropped,
        "control_dropped": s.dropped_control,
        "remote_drops": s.remote_drops,
        "requests": s.requests,
        "replies": s.replies,
        "no_responders": s.no_responders,
        "broadcasts": s.broadcasts,
        "limit_hits": s.limit_hits,
        "protocol_errors": s.protocol_errors,
        "slow_consumers": s.slow_consumers,
        "pending_bytes": pending,
        "pending_budget_used": s.pending_budget_used,
        "warnings_logged": crate::logging::WARNINGS.load(Relaxed),
        "mesh_members_up": s.mesh.as_ref().map(|v| v.stats.members_up),
    })
}

/// Messages a client's subscriptions dropped, and control frames.
fn dropped(c: &ClientStats) -> u64 {
    c.subscriptions
        .iter()
        .map(|s| s.counters.dropped)
        .sum::<u64>()
        + c.dropped_control
}

/// Whether a client is a slow consumer now: it dropped messages, or its
/// queue holds at least half of its `max_pending_bytes`.
fn is_slow(c: &ClientStats, max_pending: usize) -> bool {
    dropped(c) > 0 || c.pending_bytes.saturating_mul(2) >= max_pending.max(1)
}

fn connz(broker: &Broker, s: &NodeStats, q: query::Connz) -> Value {
    use query::SortBy as S;
    let max_pending = broker.limits().max_pending_bytes;
    let mut cs: Vec<&ClientStats> = s.clients.iter().collect();
    let key = |c: &ClientStats| -> u64 {
        match q.sort {
            S::Id => c.id,
            S::Pending => c.pending_bytes as u64,
            S::Delivered => c.delivered,
            S::Published => c.published,
            S::Dropped => dropped(c),
            S::BytesIn => c.bytes_in,
            S::BytesOut => c.bytes_out,
            S::Subs => c.subscriptions.len() as u64,
            S::Since => c.since_unix_ms,
        }
    };
    match q.sort {
        S::Id | S::Since => cs.sort_by_key(|c| (key(c), c.id)),
        _ => cs.sort_by_key(|c| (std::cmp::Reverse(key(c)), c.id)),
    }
    let total = cs.len();
    let page: Vec<Value> = cs
        .into_iter()
        .skip(q.offset)
        .take(q.limit)
        .map(|c| {
            let slow_subs: Vec<u64> = c
                .subscriptions
                .iter()
                .filter(|s| s.counters.dropped > 0)
                .map(|s| s.sid)
                .collect();
            let mut v = json!({
                "id": c.id,
                "address": c.peer,
                "name": c.name,
                "user": c.user,
                "since_unix_ms": c.since_unix_ms,
                "subscriptions": c.subscriptions.len(),
                "messages_in": c.published,
                "messages_out": c.delivered,
                "bytes_in": c.bytes_in,
                "bytes_out": c.bytes_out,
                "pending_bytes": c.pending_bytes,
                "dropped": dropped(c),
                "control_dropped": c.dropped_control,
                "requests_waiting": c.requests_waiting,
                "slow_consumer": is_slow(c, max_pending),
                "slow_subscriptions": slow_subs,
            });
            if !c.shared_readers.is_empty() {
                v["shared_readers"] = json!(c
                    .shared_readers
                    .iter()
                    .map(|r| json!({ "peer": r.peer, "read": r.read, "dropped": r.dropped }))
                    .collect::<Vec<_>>());
            }
            if q.subs {
                v["subscription_list"] = json!(c
                    .subscriptions
                    .iter()
                    .map(|s| json!({
                        "sid": s.sid,
                        "pattern": s.pattern,
                        "type": s.kind,
                        "policy": s.policy,
                        "queued": s.counters.queued,
                        "delivered": s.counters.delivered,
                        "dropped": s.counters.dropped,
                        "credit": s.counters.credit,
                    }))
                    .collect::<Vec<_>>());
            }
            v
        })
        .collect();
    json!({
        "total": total,
        "offset": q.offset,
        "limit": q.limit,
        "sort": q.sort.name(),
        "clients": page,
    })
}

fn subsz(broker: &Broker, s: &NodeStats, q: query::Subsz) -> Value {
    // Per (pattern, type, kind): subscriptions, the clients holding them,
    // and their counters summed.
    #[derive(Default)]
    struct Sum {
        subs: u64,
        clients: Vec<u64>,
        queued: u64,
        delivered: u64,
        dropped: u64,
    }
    let mut by: std::collections::BTreeMap<(&str, &str, bool), Sum> = Default::default();
    for c in &s.clients {
        for sub in &c.subscriptions {
            let e = by.entry((&sub.pattern, &sub.kind, sub.cmsg)).or_default();
            e.subs += 1;
            if e.clients.last() != Some(&c.id) {
                e.clients.push(c.id);
            }
            e.queued += sub.counters.queued as u64;
            e.delivered += sub.counters.delivered;
            e.dropped += sub.counters.dropped;
        }
    }
    let distinct = by.len();
    let patterns: Vec<Value> = by
        .into_iter()
        .skip(q.offset)
        .take(q.limit)
        .map(|((p, k, cmsg), e)| {
            json!({
                "pattern": p,
                "type": k,
                "kind": if cmsg { "cmsg" } else { "token" },
                "subscriptions": e.subs,
                "clients": e.clients.len(),
                "queued": e.queued,
                "delivered": e.delivered,
                "dropped": e.dropped,
            })
        })
        .collect();
    let (clusters_total, page) = broker.clusters_page(q.cluster_offset, q.cluster_limit, q.members);
    let clusters: Vec<Value> = page
        .into_iter()
        .map(|c| {
            json!({
                "name": c.name,
                "members": c.members,
                "local": c.local.iter().map(|(id, name, cap)| json!({
                    "client": id,
                    "name": name,
                    "capacity": cap,
                })).collect::<Vec<_>>(),
                "remote": c.remote.iter().map(|(addr, cap)| json!({
                    "node": addr.to_string(),
                    "capacity": cap,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "subscriptions": s.subscriptions,
        "patterns_distinct": distinct,
        "offset": q.offset,
        "limit": q.limit,
        "patterns": patterns,
        "clusters_total": clusters_total,
        "cluster_offset": q.cluster_offset,
        "cluster_limit": q.cluster_limit,
        "clusters": clusters,
    })
}

fn meshz(v: &skiff_proto::stats::MeshView) -> Value {
    let peers: Vec<Value> = v
        .peers
        .iter()
        .map(|p| {
            json!({
                "address": p.addr.to_string(),
                "generation": p.gen,
                "state": match (p.up, p.suspect) {
                    (true, false) => "up",
                    (true, true) => "suspect",
                    _ => "down",
                },
                "patterns": p.patterns,
                "clusters": p.clusters,
                "interest_version": p.version,
                "sent_frames": p.sent_frames,
                "sent_datagrams": p.sent_datagrams,
                "sent_bytes": p.sent_bytes,
                "received_frames": p.recv_frames,
                "received_datagrams": p.recv_datagrams,
                "received_bytes": p.recv_bytes,
                "lost": p.lost,
                "duplicates": p.duplicates,
                "far_ahead": p.far_ahead,
            })
        })
        .collect();
    json!({
        "me": v.me,
        "net": v.net,
        "members_up": v.stats.members_up,
        "counters": v.stats,
        "bad_frames": v.bad_frames,
        "send_errors": v.send_errors,
        "scout_errors": v.scout_errors,
        "dns_errors": v.dns_errors,
        "tunnels": v.tunnels,
        "peers": peers,
    })
}
