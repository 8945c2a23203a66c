//! `/metrics`: the node's counters ([`NodeStats`], the same snapshot as
//! `skiff stats` and the JSON endpoints) in the OpenMetrics text format,
//! encoded by the `prometheus-client` crate.
//!
//! Names follow Prometheus conventions (`skiff_` prefix, base units,
//! `_total` on counters). Labels stay bounded: `client` (one series per
//! client attached, so at most `max_connections`), `peer` (one per mesh
//! member, at most `max_members`) and `reason` (a fixed set); no subject
//! or pattern is ever a label.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use skiff_proto::stats::NodeStats;

/// One scrape's snapshot.
#[derive(Debug)]
struct Snapshot {
    stats: NodeStats,
    warnings: u64,
}

/// The OpenMetrics text of `stats`.
pub fn encode(stats: NodeStats, warnings: u64) -> String {
    let mut r = Registry::default();
    r.register_collector(Box::new(Snapshot { stats, warnings }));
    let mut out = String::with_capacity(4096);
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &r);
    out
}

/// The content type of [`encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

fn gauge_f(e: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

/// A family of counters (or gauges) with one label.
fn family(
    e: &mut DescriptorEncoder,
    kind: MetricType,
    name: &str,
    help: &str,
    label: &'static str,
    series: impl IntoIterator<Item = (String, u64)>,
) -> std::fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, kind)?;
    for (value, v) in series {
        let labels = [(label, value)];
        let f = m.encode_family(&labels)?;
        if matches!(kind, MetricType::Counter) {
            ConstCounter::new(v).encode(f)?;
        } else {
            ConstGauge::new(v as i64).encode(f)?;
        }
    }
    Ok(())
}

fn sat(v: usize) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Collector for Snapshot {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.stats;
        let e = &mut e;
        gauge_f(
            e,
            "skiff_uptime_seconds",
            "Seconds since the node started.",
            s.uptime_s,
        )?;
        gauge(
            e,
            "skiff_clients",
            "Clients attached now.",
            sat(s.connections),
        )?;
        counter(
            e,
            "skiff_client_connections",
            "Clients attached since the start.",
            s.connections_total,
        )?;
        gauge(
            e,
            "skiff_subscriptions",
            "Subscriptions held.",
            sat(s.subscriptions),
        )?;
        gauge(
            e,
            "skiff_clusters",
            "Clusters with members.",
            sat(s.clusters),
        )?;
        gauge(e, "skiff_tunnels", "Tunnels open.", sat(s.tunnels))?;
        counter(
            e,
            "skiff_messages_received",
            "Messages published to this node (by its clients and by other nodes).",
            s.published,
        )?;
        counter(
            e,
            "skiff_messages_delivered",
            "Messages handed to clients' connections, clients gone included.",
            s.delivered,
        )?;
        family(
            e,
            MetricType::Counter,
            "skiff_messages_dropped",
            "Messages dropped, by reason: a subscription's policy (subscription), a full subscription for a message from another node (remote), a broadcast or tunnel frame over a client's pending bytes (control).",
            "reason",
            [
                ("subscription".to_owned(), s.dropped),
                ("remote".to_owned(), s.remote_drops),
                ("control".to_owned(), s.dropped_control),
            ],
        )?;
        counter(e, "skiff_requests", "Requests received.", s.requests)?;
        counter(e, "skiff_replies", "Replies relayed.", s.replies)?;
        counter(
            e,
            "skiff_no_responders",
            "Requests and tunnels refused for want of a responder.",
            s.no_responders,
        )?;
        counter(e, "skiff_broadcasts", "Broadcasts received.", s.broadcasts)?;
        counter(
            e,
            "skiff_limit_hits",
            "Times a limit was reached.",
            s.limit_hits,
        )?;
        counter(
            e,
            "skiff_protocol_errors",
            "Clients closed for protocol errors.",
            s.protocol_errors,
        )?;
        counter(
            e,
            "skiff_slow_consumers",
            "Clients closed as slow consumers.",
            s.slow_consumers,
        )?;
        counter(e, "skiff_log_warnings", "Warnings logged.", self.warnings)?;
        let pending: usize = s.clients.iter().map(|c| c.pending_bytes).sum();
        gauge(
            e,
            "skiff_pending_bytes",
            "Bytes queued in the node for all clients.",
            sat(pending),
        )?;
        gauge(
            e,
            "skiff_pending_budget_used_bytes",
            "Bytes clients hold reserved from max_total_pending_bytes.",
            sat(s.pending_budget_used),
        )?;
        let per = |f: &dyn Fn(&skiff_proto::stats::ClientStats) -> u64| {
            s.clients
                .iter()
                .map(|c| (c.id.to_string(), f(c)))
                .collect::<Vec<_>>()
        };
        family(
            e,
            MetricType::Gauge,
            "skiff_client_pending_bytes",
            "Bytes queued for the client.",
            "client",
            per(&|c| c.pending_bytes as u64),
        )?;
        family(
            e,
            MetricType::Counter,
            "skiff_client_messages_received",
            "Messages the client published.",
            "client",
            per(&|c| c.published),
        )?;
        family(
            e,
            MetricType::Counter,
            "skiff_client_messages_delivered",
            "Messages handed to the client's connection.",
            "client",
            per(&|c| c.delivered),
        )?;
        family(
            e,
            MetricType::Counter,
            "skiff_client_messages_dropped",
            "Messages the client's subscriptions dropped, and broadcasts and tunnel frames not queued for it.",
            "client",
            per(&|c| c.subscriptions.iter().map(|s| s.counters.dropped).sum::<u64>() + c.dropped_control),
        )?;
        family(
            e,
            MetricType::Counter,
            "skiff_client_received_bytes",
            "Bytes read from the client's connection (TCP and Unix sockets).",
            "client",
            per(&|c| c.bytes_in),
        )?;
        family(
            e,
            MetricType::Counter,
            "skiff_client_sent_bytes",
            "Bytes written to the client's connection (TCP and Unix sockets).",
            "client",
            per(&|c| c.bytes_out),
        )?;
        if let Some(m) = &s.mesh {
            let t = &m.stats;
            gauge(
                e,
                "skiff_mesh_members_up",
                "Other nodes of the mesh up now.",
                sat(t.members_up),
            )?;
            family(
                e,
                MetricType::Counter,
                "skiff_mesh_dropped_datagrams",
                "Datagrams from other nodes dropped, by reason.",
                "reason",
                [
                    ("wrong_net", t.wrong_net),
                    ("malformed", t.malformed),
                    ("unknown_sender", t.unknown_sender),
                    ("member_limit", t.member_limit),
                    ("bad_membership", t.bad_membership),
                    ("rate_limited", t.rate_limited),
                ]
                .map(|(r, v)| (r.to_owned(), v)),
            )?;
            counter(
                e,
                "skiff_mesh_bad_frames",
                "Frames between nodes that did not decode.",
                m.bad_frames,
            )?;
            counter(
                e,
                "skiff_mesh_send_errors",
                "Datagrams the socket refused to send.",
                m.send_errors,
            )?;
            let peer = |f: &dyn Fn(&skiff_proto::mesh::PeerStats) -> u64| {
                m.peers
                    .iter()
                    .map(|p| (p.addr.to_string(), f(p)))
                    .collect::<Vec<_>>()
            };
            family(
                e,
                MetricType::Gauge,
                "skiff_mesh_peer_up",
                "1 while the peer is up.",
                "peer",
                peer(&|p| p.up as u64),
            )?;
            family(
                e,
                MetricType::Counter,
                "skiff_mesh_peer_sent_bytes",
                "Bytes sent to the peer.",
                "peer",
                peer(&|p| p.sent_bytes),
            )?;
            family(
                e,
                MetricType::Counter,
                "skiff_mesh_peer_received_bytes",
                "Bytes received from the peer.",
                "peer",
                peer(&|p| p.recv_bytes),
            )?;
            family(
                e,
                MetricType::Counter,
                "skiff_mesh_peer_sent_frames",
                "Frames sent to the peer.",
                "peer",
                peer(&|p| p.sent_frames),
            )?;
            family(
                e,
                MetricType::Counter,
                "skiff_mesh_peer_received_frames",
                "Frames received from the peer.",
                "peer",
                peer(&|p| p.recv_frames),
            )?;
            family(
                e,
                MetricType::Counter,
                "skiff_mesh_peer_lost_datagrams",
                "Data datagrams from the peer known lost.",
                "peer",
                peer(&|p| p.lost),
            )?;
            family(
                e,
                MetricType::Counter,
                "skiff_mesh_peer_duplicate_datagrams",
                "Data datagrams from the peer received twice.",
                "peer",
                peer(&|p| p.duplicates),
            )?;
        }
        Ok(())
    }
}
