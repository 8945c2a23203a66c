//! The broker's counters as a [`NodeStats`] snapshot.

use std::sync::atomic::Ordering::Relaxed;

use skiff_proto::stats::{ClientStats, NodeStats, SubStats};

use super::Broker;

impl Broker {
    /// Every counter: the node's, each client's and each subscription's.
    pub fn stats(&self) -> NodeStats {
        let st = self.state.lock();
        let c = &self.counters;
        let mut clients: Vec<ClientStats> = st
            .clients
            .iter()
            .map(|(&id, e)| {
                let (pending_bytes, delivered, dropped_control) = e.out.counters();
                let mut subscriptions: Vec<SubStats> = e
                    .sids
                    .iter()
                    .map(|(&sid, (_, policy, pattern, kind))| SubStats {
                        sid,
                        pattern: pattern.clone(),
                        kind: kind.clone(),
                        policy: policy.name().into(),
                        counters: e.out.sub_counters(sid).unwrap_or_default(),
                    })
                    .collect();
                subscriptions.sort_by_key(|s| s.sid);
                ClientStats {
                    id,
                    peer: e.peer.clone(),
                    published: e.published,
                    delivered,
                    pending_bytes,
                    dropped_control,
                    requests_waiting: e.requests.len(),
                    subscriptions,
                }
            })
            .collect();
        clients.sort_by_key(|c| c.id);
        NodeStats {
            uptime_s: self.started.elapsed().as_secs_f64(),
            connections: st.clients.len(),
            connections_total: c.connections_total.load(Relaxed),
            subscriptions: st.router.len(),
            clusters: st.clusters.cluster_count(),
            tunnels: st.tunnels.len(),
            published: c.published.load(Relaxed),
            requests: c.requests.load(Relaxed),
            replies: c.replies.load(Relaxed),
            no_responders: c.no_responders.load(Relaxed),
            broadcasts: c.broadcasts.load(Relaxed),
            limit_hits: c.limit_hits.load(Relaxed),
            protocol_errors: c.protocol_errors.load(Relaxed),
            slow_consumers: c.slow_consumers.load(Relaxed),
            remote_drops: self.remote_drops.load(Relaxed),
            mesh: self.mesh.get().map(|m| m.view()),
            clients,
        }
    }

    /// Counts a protocol error (the caller closes the client); for
    /// listeners outside this crate (the `shm://` one in `skiff`).
    pub fn protocol_error(&self) {
        self.counters.protocol_errors.fetch_add(1, Relaxed);
    }

    /// Counts a limit reached by a front end (the caller closes the
    /// client with an error naming it), e.g. a read deadline.
    pub fn limit_hit(&self) {
        self.counters.limit_hits.fetch_add(1, Relaxed);
    }
}
