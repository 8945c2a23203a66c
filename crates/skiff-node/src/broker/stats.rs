//! The broker's counters as a [`NodeStats`] snapshot, whole or one page at
//! a time.

use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use skiff_proto::client_frame::{ServerFrame, FRAME_OVERHEAD, STATS_PAGE};
use skiff_proto::stats::{
    ClientStats, ClusterMember, ClusterStats, NodeStats, StatsCursor, SubStats,
};

use super::Broker;
use crate::outbox::ClientOut;

impl Broker {
    /// Answers `Stats` (`from` `None`) or `StatsFrom` with one page, well
    /// inside the frame bound of the client, which takes frames up to
    /// `max_payload + FRAME_OVERHEAD`.
    pub(super) fn stats_reply(&self, me: &Arc<ClientOut>, corr: u64, from: Option<StatsCursor>) {
        let cap = STATS_PAGE.min(self.limits.load().max_payload + FRAME_OVERHEAD / 2);
        let page = self.stats_page(from, cap);
        let json = serde_json::to_string(&page).unwrap_or_default();
        me.control(ServerFrame::Stats { corr, json });
    }

    /// Every counter: the node's, each client's and each subscription's.
    pub fn stats(&self) -> NodeStats {
        self.stats_page(None, usize::MAX)
    }

    /// The page of [`Broker::stats`] that starts at `from` (`None`: the
    /// first page, the only one with the mesh), holding clients and
    /// subscriptions in order of id until their JSON would pass `cap`
    /// bytes (at least one), and `next` when more remain. Built from the
    /// live state: counters may move between pages.
    pub fn stats_page(&self, from: Option<StatsCursor>, cap: usize) -> NodeStats {
        let auth = self.auth.load_full();
        let st = self.state.lock();
        let c = &self.counters;
        let start = from.map_or(0, |f| f.client);
        let mut ids: Vec<u64> = st
            .clients
            .keys()
            .copied()
            .filter(|&id| id >= start)
            .collect();
        ids.sort_unstable();
        let mut clients: Vec<ClientStats> = Vec::new();
        let mut cluster_members = if from.is_none() {
            cluster_members(&st)
        } else {
            Vec::new()
        };
        // At most half the page, so that clients still fit beside it.
        while json_len(&cluster_members) > cap / 2 {
            cluster_members.pop();
        }
        let mut size = json_len(&cluster_members);
        let mut next = None;
        'clients: for id in ids {
            let e = &st.clients[&id];
            // Inside the cursor's client: only the subscriptions after it.
            let after = from.filter(|f| f.client == id).and_then(|f| f.sid);
            let mut sids: Vec<_> = e
                .sids
                .iter()
                .filter(|(&sid, _)| after.is_none_or(|a| sid > a))
                .collect();
            if after.is_some() && sids.is_empty() {
                continue;
            }
            sids.sort_unstable_by_key(|(&sid, _)| sid);
            let (pending_bytes, delivered, dropped_control) = e.out.counters();
            let (bytes_in, bytes_out) = e.out.bytes();
            let mut cl = ClientStats {
                id,
                peer: e.peer.clone(),
                user: e.user.name.clone(),
                name: e.name.clone(),
                since_unix_ms: e
                    .since
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
                bytes_in,
                bytes_out,
                published: e.published,
                delivered,
                pending_bytes,
                dropped_control,
                requests_waiting: e.requests.len(),
                subscriptions: Vec::new(),
                shared_readers: e.out.shared_readers(),
            };
            // Whole stats (no page bound) need no sizes.
            let whole = cap == usize::MAX;
            let head = if whole { 0 } else { json_len(&cl) + 1 };
            let mut first = true;
            for (&sid, (_, policy, pattern, kind, (syntax, _))) in sids {
                let sub = SubStats {
                    sid,
                    pattern: pattern.clone(),
                    kind: kind.clone(),
                    cmsg: *syntax == skiff_proto::router::Syntax::Cmsg,
                    policy: policy.name().into(),
                    counters: e.out.sub_counters(sid).unwrap_or_default(),
                };
                let n = if whole { 0 } else { json_len(&sub) + 1 } + if first { head } else { 0 };
                let empty = clients.is_empty() && cl.subscriptions.is_empty();
                if size.saturating_add(n) > cap && !empty {
                    next = Some(StatsCursor {
                        client: id,
                        sid: cl.subscriptions.last().map(|s| s.sid).or(after),
                    });
                    if !cl.subscriptions.is_empty() {
                        clients.push(cl);
                    }
                    break 'clients;
                }
                size += n;
                first = false;
                cl.subscriptions.push(sub);
            }
            if first {
                // No subscriptions: the client entry alone.
                if size.saturating_add(head) > cap && !clients.is_empty() {
                    next = Some(StatsCursor {
                        client: id,
                        sid: None,
                    });
                    break;
                }
                size += head;
            }
            clients.push(cl);
        }
        let (mut delivered, mut dropped, mut dropped_control) = (
            c.departed_delivered.load(Relaxed),
            c.departed_dropped.load(Relaxed),
            c.departed_dropped_control.load(Relaxed),
        );
        for e in st.clients.values() {
            let (_, d, dc) = e.out.counters();
            delivered += d;
            dropped_control += dc;
            dropped += e
                .sids
                .keys()
                .filter_map(|sid| e.out.sub_counters(*sid))
                .map(|k| k.dropped)
                .sum::<u64>();
        }
        NodeStats {
            delivered,
            dropped,
            dropped_control,
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
            pending_budget_used: self.budget.as_ref().map_or(0, |b| b.used()),
            cluster_members,
            mesh: if from.is_none() {
                self.mesh.get().map(|m| m.view())
            } else {
                None
            },
            tls_failures: c.tls_failures.load(Relaxed),
            auth: auth.enabled(),
            auth_failures: auth.failures(),
            denied: c.denied.load(Relaxed),
            users: if from.is_none() {
                auth.users()
                    .map(|u| {
                        let [p, s, r, j] = u.denied.snapshot();
                        skiff_proto::stats::UserStats {
                            name: u.name.clone(),
                            denied_publish: p,
                            denied_subscribe: s,
                            denied_reply: r,
                            denied_join: j,
                        }
                    })
                    .collect()
            } else {
                Vec::new()
            },
            warnings: if from.is_none() {
                self.warnings.lock().clone()
            } else {
                Vec::new()
            },
            clients,
            next,
        }
    }

    /// Counts a TLS handshake that failed or ran out of time.
    pub fn tls_failure(&self) {
        self.counters.tls_failures.fetch_add(1, Relaxed);
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

/// The length of `v`'s JSON, without building it.
fn json_len<T: serde::Serialize>(v: &T) -> usize {
    struct Count(usize);
    impl io::Write for Count {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// Clusters listed in a stats reply, and members listed per cluster (the
/// counts in [`NodeStats`] cover all of them; the reply stays bounded).
const LISTED: usize = 64;

/// The first [`LISTED`] clusters, by name, with up to [`LISTED`] of their
/// members each and their capacities.
fn cluster_members(st: &super::State) -> Vec<ClusterStats> {
    let mut names: Vec<&str> = st.clusters.clusters().collect();
    names.sort_unstable();
    names.truncate(LISTED);
    names
        .into_iter()
        .map(|name| ClusterStats {
            name: name.to_owned(),
            members: st
                .clusters
                .members(name)
                .map(|m| ClusterMember {
                    member: match st.remote_addrs.get(&m) {
                        Some(a) if m >= super::REMOTE => format!("node {a}"),
                        _ => format!("client {m}"),
                    },
                    capacity: st.clusters.weight(name, m).map_or(0, |(c, _)| c),
                })
                .take(LISTED)
                .collect(),
        })
        .collect()
}

/// One cluster as the monitor's `/subsz` lists it: its members on this
/// node (clients) and on other nodes (their advertised capacity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// Its name.
    pub name: String,
    /// Members in all (local and remote), listed or not.
    pub members: usize,
    /// Local members listed: (client id, the client's name, capacity).
    pub local: Vec<(u64, Option<String>, u32)>,
    /// Other nodes listed: (node address, capacity).
    pub remote: Vec<(std::net::SocketAddr, u32)>,
}

impl Broker {
    /// The clusters by name, `offset` skipped and at most `limit` listed,
    /// each with at most `max_members` members listed (local ones first,
    /// by id); and how many clusters there are.
    pub fn clusters_page(
        &self,
        offset: usize,
        limit: usize,
        max_members: usize,
    ) -> (usize, Vec<ClusterView>) {
        let st = self.state.lock();
        let mut names: Vec<&str> = st.clusters.clusters().collect();
        names.sort_unstable();
        let total = names.len();
        let page = names
            .into_iter()
            .skip(offset)
            .take(limit)
            .map(|name| {
                let mut ids: Vec<u64> = st.clusters.members(name).collect();
                ids.sort_unstable();
                let members = ids.len();
                let (mut local, mut remote) = (Vec::new(), Vec::new());
                for m in ids.into_iter().take(max_members) {
                    let cap = st.clusters.weight(name, m).map_or(0, |(c, _)| c);
                    match st.remote_addrs.get(&m) {
                        Some(a) if m >= super::REMOTE => remote.push((*a, cap)),
                        _ => local.push((m, st.clients.get(&m).and_then(|c| c.name.clone()), cap)),
                    }
                }
                ClusterView {
                    name: name.to_owned(),
                    members,
                    local,
                    remote,
                }
            })
            .collect();
        (total, page)
    }
}
