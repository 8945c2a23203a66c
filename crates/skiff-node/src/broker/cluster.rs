//! Clusters (Iris): membership with a capacity, broadcasts, the members
//! other nodes advertise, and the load that weights the choice of a
//! member.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use skiff_proto::client_frame::{Code, ServerFrame, ASYNC_ERROR};
use skiff_proto::router::{Clusters, Subject};
use skiff_proto::Message;

use super::{Broker, State, REMOTE};
use crate::outbox::{cost, ClientOut};

impl Broker {
    /// Advertises this node's membership of `cluster`: 0 for no local
    /// members, else 1 + their total capacity (so members of capacity 0,
    /// which take broadcasts but no requests, are still advertised).
    pub(super) fn advertise_cluster(&self, st: &State, cluster: &str) {
        if let Some(m) = self.mesh.get() {
            let mut any = false;
            let cap: u32 = st
                .clusters
                .members(cluster)
                .filter(|c| *c < REMOTE)
                .filter_map(|c| st.clusters.weight(cluster, c).map(|w| w.0))
                .inspect(|_| any = true)
                .fold(1u32, |a, b| a.saturating_add(b));
            m.set_cluster(cluster, if any { cap } else { 0 });
        }
    }

    /// Client `me` joins `cluster` with `capacity`.
    pub(super) fn join(&self, me: &Arc<ClientOut>, corr: u64, cluster: String, capacity: u32) {
        match Subject::new(&cluster) {
            Ok(_) => {
                let mut st = self.state.lock();
                st.clusters.join(&cluster, me.id, capacity);
                self.advertise_cluster(&st, &cluster);
                drop(st);
                me.control(ServerFrame::Ack { corr });
            }
            Err(e) => me.control(ServerFrame::Error {
                corr,
                code: Code::Invalid,
                text: format!("cluster name: {e}"),
            }),
        }
    }

    /// Client `me` subscribed in queue group `group` (a `Sub` frame): with
    /// its first subscription in the group, it becomes a member of the
    /// cluster of that name with capacity 1 (as a NATS queue subscriber
    /// does), unless it is one already (its own capacity counts then) or
    /// may not join (`may_join`: still a queue subscriber).
    pub(super) fn group_sub_added(&self, me: &Arc<ClientOut>, group: Arc<str>, may_join: bool) {
        let mut st = self.state.lock();
        let st = &mut *st;
        let member = st.clusters.weight(&group, me.id).is_some();
        let Some(c) = st.clients.get_mut(&me.id) else {
            return;
        };
        let e = c.groups.entry(group.clone()).or_insert((0, false));
        e.0 += 1;
        if e.0 == 1 && !member && may_join {
            e.1 = true;
            st.clusters.join(&group, me.id, 1);
            self.advertise_cluster(st, &group);
        }
    }

    /// Client `me` ended a subscription in queue group `group`: with its
    /// last one, it leaves the cluster if [`Broker::group_sub_added`] made
    /// it a member.
    pub(super) fn group_sub_removed(&self, st: &mut State, me: u64, group: &str) {
        let Some(c) = st.clients.get_mut(&me) else {
            return;
        };
        let Some(e) = c.groups.get_mut(group) else {
            return;
        };
        e.0 -= 1;
        if e.0 > 0 {
            return;
        }
        let joined = e.1;
        c.groups.remove(group);
        if joined {
            st.clusters.leave(group, me);
            self.advertise_cluster(st, group);
        }
    }

    /// Client `me` leaves `cluster`.
    pub(super) fn leave(&self, me: &Arc<ClientOut>, corr: u64, cluster: String) {
        let mut st = self.state.lock();
        st.clusters.leave(&cluster, me.id);
        self.advertise_cluster(&st, &cluster);
        drop(st);
        me.control(ServerFrame::Ack { corr });
    }

    /// A client's broadcast: to every member of `cluster`, here and on
    /// other nodes (at most once each).
    pub(super) fn broadcast(&self, me: &Arc<ClientOut>, cluster: String, msg: Message) {
        if let Err((code, text)) = self.check_message(&msg, false) {
            me.control(ServerFrame::Error {
                corr: ASYNC_ERROR,
                code,
                text,
            });
            return;
        }
        self.counters.broadcasts.fetch_add(1, Relaxed);
        let st = self.state.lock();
        let size = cost(&msg);
        for m in st.clusters.members(&cluster) {
            if m >= REMOTE {
                if let (Some(l), Some(a)) = (self.mesh.get(), st.remote_addrs.get(&m)) {
                    l.broadcast(*a, &cluster, &msg);
                }
                continue;
            }
            if let Some(c) = st.clients.get(&m) {
                c.out.control_bounded(
                    ServerFrame::Bcast {
                        cluster: cluster.clone(),
                        msg: msg.clone(),
                    },
                    size,
                );
            }
        }
    }

    /// A broadcast another node relayed: to local members only.
    pub(crate) fn deliver_broadcast(&self, cluster: &str, msg: Message) {
        let st = self.state.lock();
        let size = cost(&msg);
        for m in st.clusters.members(cluster).filter(|m| *m < REMOTE) {
            if let Some(c) = st.clients.get(&m) {
                c.out.control_bounded(
                    ServerFrame::Bcast {
                        cluster: cluster.into(),
                        msg: msg.clone(),
                    },
                    size,
                );
            }
        }
    }

    /// Another node's advertisement for `cluster` changed (0: it has no
    /// members; else 1 + their capacity, see `advertise_cluster`).
    pub(crate) fn remote_cluster(&self, peer: SocketAddr, cluster: &str, advertised: u32) {
        let mut st = self.state.lock();
        let next = REMOTE + st.remote_ids.len() as u64;
        let id = *st.remote_ids.entry(peer).or_insert(next);
        st.remote_addrs.insert(id, peer);
        if advertised == 0 {
            if st.clusters.leave(cluster, id) {
                forget_remote_cluster(&mut st, cluster);
            }
        } else if st.clusters.join(cluster, id, advertised - 1) {
            *st.remote_clusters.entry(cluster.to_owned()).or_default() += 1;
        }
    }

    /// Another node is down: it is no cluster member any more.
    pub(crate) fn remote_down(&self, peer: SocketAddr) {
        let mut st = self.state.lock();
        if let Some(id) = st.remote_ids.get(&peer).copied() {
            let of: Vec<String> = st.clusters.clusters_of(id).map(str::to_owned).collect();
            for c in of {
                forget_remote_cluster(&mut st, &c);
            }
            st.clusters.remove_member(id);
            st.load.remove(&id);
        }
    }

    /// Messages from the node at `peer` may be missing from `silent` ago
    /// (the last batch received from it) on: every local client holding
    /// subscriptions is told with an asynchronous error.
    pub(crate) fn remote_gap(&self, peer: SocketAddr, silent: std::time::Duration, why: &str) {
        let since = std::time::SystemTime::now()
            .checked_sub(silent)
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0.0, |d| d.as_secs_f64());
        let text = format!(
            "messages from node {peer} may be missing: {why}; the gap began with the last message received from it, {silent:?} earlier (unix time {since:.3})"
        );
        let st = self.state.lock();
        for c in st.clients.values().filter(|c| !c.sids.is_empty()) {
            c.out.control(ServerFrame::Error {
                corr: crate::ASYNC_ERROR,
                code: skiff_proto::client_frame::Code::NotFound,
                text: text.clone(),
            });
        }
    }

    /// Members of `cluster` this node routes to: its own clients and, for
    /// each other node with members, one entry. What a request or a
    /// broadcast sent now would reach (the mesh's view of a peer can be a
    /// moment ahead of this).
    pub fn cluster_members(&self, cluster: &str) -> usize {
        self.state.lock().clusters.len(cluster)
    }
}

/// One node fewer has members in `cluster`.
fn forget_remote_cluster(st: &mut State, cluster: &str) {
    if let Some(n) = st.remote_clusters.get_mut(cluster) {
        *n -= 1;
        if *n == 0 {
            st.remote_clusters.remove(cluster);
        }
    }
}

/// Picks a member of `cluster` on this node (not another node of the
/// mesh), by the same weighted round robin.
pub(super) fn pick_local(
    clusters: &mut Clusters<u64>,
    cluster: &str,
    key: Option<&[u8]>,
) -> Option<u64> {
    clusters.pick_where(cluster, key, |m| m < REMOTE)
}

/// Releases the load a request put on `members`.
pub(super) fn release_members(st: &mut State, members: &[u64]) {
    for &m in members {
        if let Some(l) = st.load.get_mut(&m) {
            *l = l.saturating_sub(1);
            let l = *l;
            st.clusters.set_load(m, l);
        }
    }
}
