//! Tunnels: ordered, credit flow-controlled streams between a client and
//! a cluster member, relayed by the node (over the mesh when the member is
//! on another node, see [`crate::mesh_tunnel`]).

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use skiff_proto::client_frame::{Code, ServerFrame};

use super::cluster::pick_local;
use super::{Broker, Fatal, REMOTE};
use crate::outbox::{cost, ClientOut};

impl Broker {
    /// A client opens a tunnel to a member of `cluster` (here or on
    /// another node), picked by weighted round robin or key affinity.
    pub(super) fn tunnel_open(
        &self,
        me: &Arc<ClientOut>,
        corr: u64,
        cluster: String,
        key: Bytes,
        window: u32,
    ) {
        let mut st = self.state.lock();
        let st = &mut *st;
        let raw_key = key.clone();
        let key = (!key.is_empty()).then_some(&key[..]);
        // Members on other nodes too (their tunnels go over associations).
        let Some(member) = st.clusters.pick(&cluster, key) else {
            self.counters.no_responders.fetch_add(1, Relaxed);
            me.control(ServerFrame::Error {
                corr,
                code: Code::NoResponders,
                text: format!("cluster {cluster:?} has no members with capacity"),
            });
            return;
        };
        let t = st.next_tunnel;
        st.next_tunnel += 1;
        if member >= REMOTE {
            let (Some(l), Some(&peer)) = (self.mesh.get(), st.remote_addrs.get(&member)) else {
                return;
            };
            if !l.tunnel_open(peer, t, me.id, corr, &cluster, &raw_key, window) {
                let e = self.limit("too many tunnels to other nodes".into());
                me.control(ServerFrame::Error {
                    corr,
                    code: e.0,
                    text: e.1,
                });
                return;
            }
            if let Some(c) = st.clients.get_mut(&me.id) {
                c.tunnels.insert(t);
            }
            return;
        }
        st.tunnels.insert(t, (me.id, member));
        for end in [me.id, member] {
            if let Some(c) = st.clients.get_mut(&end) {
                c.tunnels.insert(t);
            }
        }
        if let Some(c) = st.clients.get(&member) {
            c.out.control(ServerFrame::TunIncoming {
                tunnel: t,
                cluster,
                window,
            });
        }
        me.control(ServerFrame::TunOpened {
            corr,
            tunnel: t,
            window,
        });
    }

    /// Relays `frame` (`TunData` of `size` bytes, bounded, or
    /// `TunCredit`) to the other end of `tunnel`, on this node or another.
    pub(super) fn tunnel_relay(
        &self,
        me: &Arc<ClientOut>,
        tunnel: u64,
        frame: ServerFrame,
        size: Option<usize>,
    ) -> Result<(), Fatal> {
        let st = self.state.lock();
        match st.tunnels.get(&tunnel) {
            Some(&(a, b)) if a == me.id || b == me.id => {
                let other = if a == me.id { b } else { a };
                if let Some(c) = st.clients.get(&other) {
                    match (size, frame) {
                        (_, ServerFrame::TunCredit { tunnel, n }) => c.out.tun_credit(tunnel, n),
                        (Some(size), frame) => {
                            c.out.control_bounded(frame, size);
                        }
                        (None, frame) => c.out.control(frame),
                    }
                }
                Ok(())
            }
            None if st
                .clients
                .get(&me.id)
                .is_some_and(|c| c.tunnels.contains(&tunnel)) =>
            {
                drop(st);
                if let Some(l) = self.mesh.get() {
                    l.tunnel_relay(tunnel, frame);
                }
                Ok(())
            }
            Some(_) => Err(Fatal {
                code: Code::Protocol,
                text: format!("tunnel {tunnel} is not yours"),
            }),
            // Closed by the other side while this frame was on its way.
            None => Ok(()),
        }
    }

    /// Frames for the local end of a tunnel whose other end is on another
    /// node (from [`crate::mesh_tunnel`]); `ended`: the tunnel is gone.
    pub(crate) fn tunnel_deliver(
        &self,
        client: u64,
        tunnel: u64,
        frames: Vec<ServerFrame>,
        ended: bool,
    ) {
        let mut st = self.state.lock();
        let Some(c) = st.clients.get_mut(&client) else {
            return;
        };
        if ended {
            c.tunnels.remove(&tunnel);
        }
        for f in frames {
            match f {
                ServerFrame::TunData { ref msg, .. } => {
                    let size = cost(msg);
                    c.out.control_bounded(f, size);
                }
                ServerFrame::TunCredit { tunnel, n } => c.out.tun_credit(tunnel, n),
                f => c.out.control(f),
            }
        }
    }

    /// Another node opens a tunnel (its id `theirs`) to a member of
    /// `cluster` here: one local member is picked and told, or the node
    /// is refused.
    pub(crate) fn tunnel_incoming(
        &self,
        from: SocketAddr,
        theirs: u64,
        cluster: String,
        key: Bytes,
        window: u32,
    ) {
        let Some(l) = self.mesh.get() else { return };
        let mut st = self.state.lock();
        let st = &mut *st;
        let key = (!key.is_empty()).then_some(&key[..]);
        let member = pick_local(&mut st.clusters, &cluster, key);
        let t = st.next_tunnel;
        st.next_tunnel += 1;
        // The answer is queued before the member can send on the tunnel.
        if !l.tunnel_accept(from, theirs, t, member) {
            self.counters.no_responders.fetch_add(1, Relaxed);
            return;
        }
        if let Some(c) = member.and_then(|m| st.clients.get_mut(&m)) {
            c.tunnels.insert(t);
            c.out.control(ServerFrame::TunIncoming {
                tunnel: t,
                cluster,
                window,
            });
        }
    }

    /// A client closes `tunnel`: the other end is told (here or over the
    /// mesh).
    pub(super) fn tunnel_close(&self, me: &Arc<ClientOut>, tunnel: u64) {
        let mut st = self.state.lock();
        if let Some((a, b)) = st.tunnels.remove(&tunnel) {
            for end in [a, b] {
                if let Some(c) = st.clients.get_mut(&end) {
                    c.tunnels.remove(&tunnel);
                    if end != me.id {
                        c.out.control(ServerFrame::TunClose { tunnel });
                    }
                }
            }
        } else if let Some(c) = st.clients.get_mut(&me.id) {
            // The other end is on another node.
            if c.tunnels.remove(&tunnel) {
                if let Some(l) = self.mesh.get() {
                    l.tunnel_close(tunnel);
                }
            }
        }
    }
}
