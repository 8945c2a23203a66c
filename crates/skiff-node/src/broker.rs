//! The node's state and what it does with each client frame: the router
//! (subject trie), clusters, requests in flight and tunnels. It owns no
//! sockets: connection tasks ([`crate::server`]) and in-process clients
//! ([`crate::MemLink`]) hand it decoded [`ClientFrame`]s, and it answers by
//! queueing [`ServerFrame`]s in the clients' [`ClientOut`]s.
//!
//! One lock guards the routing state; each client's outbox has its own, and
//! is only ever taken after the routing lock or alone, never before it. A
//! publish matches under the routing lock and queues the same
//! [`Message`] (payload shared by reference count) to every matching
//! subscription. Only a `block` subscription that is full makes the
//! publisher wait, and it waits with no lock held.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use parking_lot::Mutex;
use rustc_hash::{FxHashMap, FxHashSet};
use skiff_proto::router::{Clusters, Router, SubId, Subject};
use skiff_proto::{Message, WireError};

use crate::config::Limits;
use crate::mesh::MeshLink;
use crate::outbox::{cost, Body, ClientOut, Push};
use skiff_proto::client_frame::{req_flags, ClientFrame, Code, Policy, ServerFrame, ASYNC_ERROR};
use skiff_proto::stats::{ClientStats, NodeStats, SubStats};

/// Cluster members at or above this id are other nodes of the mesh (their
/// capacity is what they advertise), not clients.
const REMOTE: u64 = 1 << 62;

/// A message from a client's `Pub` frame, for [`Broker::publish_batch`]:
/// its encoding, and the decoded message unless the encoding is the simple
/// kind [`skiff_proto::client_frame::simple_message`] reads in place.
#[derive(Debug)]
pub struct Published {
    /// The message's encoding (checked).
    pub raw: Bytes,
    /// The message, decoded, when it is not simple.
    pub msg: Option<Box<Message>>,
}

impl Published {
    /// A publish frame's body (its op byte first), checked: the encoding
    /// is kept as a slice of `body` (no copy), and decoded only when it is
    /// not the simple kind.
    pub fn from_frame(mut body: Bytes, max_payload: usize) -> Result<Published, WireError> {
        // Past the op byte in place: no reference-count traffic.
        let op = 1.min(body.len());
        bytes::Buf::advance(&mut body, op);
        let msg = if skiff_proto::client_frame::simple_message(&body, max_payload).is_some() {
            None
        } else {
            Some(Box::new(skiff_proto::wire::decode_message(
                &body,
                max_payload,
            )?))
        };
        Ok(Published { raw: body, msg })
    }

    /// (subject, type, payload length).
    fn parts(&self, max_payload: usize) -> (&str, Option<&str>, usize) {
        match &self.msg {
            Some(m) => (&m.subject, m.kind.as_deref(), m.payload.len()),
            None => skiff_proto::client_frame::simple_message(&self.raw, max_payload)
                .map_or(("", None, 0), |(s, n)| (s, None, n)),
        }
    }
}

#[derive(Debug)]
struct SubEntry {
    out: Arc<ClientOut>,
    sid: u64,
}

#[derive(Debug)]
struct ClientEntry {
    out: Arc<ClientOut>,
    peer: String,
    /// The client's sid → router id, policy and patterns.
    sids: FxHashMap<u64, (SubId, Policy, String, String)>,
    /// The client's request id → node token.
    requests: FxHashMap<u64, u64>,
    /// Cluster requests this client was chosen to answer.
    serving: FxHashSet<u64>,
    tunnels: FxHashSet<u64>,
    published: u64,
}

#[derive(Debug)]
struct Pending {
    requester: u64,
    rid: u64,
    /// Replies still wanted.
    left: u32,
    /// Responders reached that have not answered.
    expect: u32,
    /// Cluster members reached, for their load.
    members: Vec<u64>,
    /// For a request forwarded by another node: that node and its token;
    /// replies go back there.
    origin: Option<(SocketAddr, u64)>,
    /// Replies relayed so far.
    replied: u32,
}

#[derive(Debug, Default)]
struct State {
    router: Router<u64>,
    subs: FxHashMap<SubId, SubEntry>,
    clients: FxHashMap<u64, ClientEntry>,
    clusters: Clusters<u64>,
    load: FxHashMap<u64, u32>,
    pending: FxHashMap<u64, Pending>,
    next_token: u64,
    tunnels: FxHashMap<u64, (u64, u64)>,
    next_tunnel: u64,
    /// Mesh peers as cluster members: address ↔ member id (≥ [`REMOTE`]).
    remote_ids: FxHashMap<SocketAddr, u64>,
    remote_addrs: FxHashMap<u64, SocketAddr>,
}

/// Node-wide counters.
#[derive(Debug, Default)]
struct Counters {
    connections_total: AtomicU64,
    published: AtomicU64,
    requests: AtomicU64,
    replies: AtomicU64,
    no_responders: AtomicU64,
    broadcasts: AtomicU64,
    limit_hits: AtomicU64,
    protocol_errors: AtomicU64,
    slow_consumers: AtomicU64,
}

/// The node's state, shared by every connection. See the module
/// documentation.
#[derive(Debug)]
pub struct Broker {
    state: Mutex<State>,
    limits: Limits,
    next_client: AtomicU64,
    counters: Counters,
    shutting_down: AtomicBool,
    started: std::time::Instant,
    mesh: OnceLock<Arc<MeshLink>>,
    /// Remote deliveries dropped because a subscription was full.
    remote_drops: AtomicU64,
}

/// Why a frame could not be handled: the client is closed with this error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fatal {
    /// Why.
    pub code: Code,
    /// A sentence for the client.
    pub text: String,
}

impl Broker {
    /// A node with no clients.
    pub fn new(limits: Limits) -> Broker {
        Broker {
            state: Mutex::new(State {
                next_token: 1,
                next_tunnel: 1,
                ..State::default()
            }),
            limits,
            next_client: AtomicU64::new(1),
            counters: Counters::default(),
            shutting_down: AtomicBool::new(false),
            started: std::time::Instant::now(),
            mesh: OnceLock::new(),
            remote_drops: AtomicU64::new(0),
        }
    }

    /// Connects the broker to the mesh (once): local interest is
    /// advertised from then on, and publishes, requests and broadcasts go
    /// to other nodes too.
    pub fn set_mesh(&self, link: Arc<MeshLink>) {
        let st = self.state.lock();
        for c in st.clients.values() {
            for (_, _, p, k) in c.sids.values() {
                link.add_interest(p, k);
            }
        }
        let _ = self.mesh.set(link);
    }

    /// The mesh link, when the node is part of a mesh.
    pub fn mesh(&self) -> Option<&Arc<MeshLink>> {
        self.mesh.get()
    }

    /// Advertises this node's membership of `cluster`: 0 for no local
    /// members, else 1 + their total capacity (so members of capacity 0,
    /// which take broadcasts but no requests, are still advertised).
    fn advertise_cluster(&self, st: &State, cluster: &str) {
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

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Adds a client (`peer` says where from, for stats) and queues its
    /// `Welcome`; refuses when the connection limit is reached or the node
    /// is shutting down.
    pub fn attach(&self, peer: String) -> Result<Arc<ClientOut>, Fatal> {
        if self.shutting_down.load(Relaxed) {
            return Err(Fatal {
                code: Code::Shutdown,
                text: "the node is shutting down".into(),
            });
        }
        let mut st = self.state.lock();
        if st.clients.len() >= self.limits.max_connections {
            self.counters.limit_hits.fetch_add(1, Relaxed);
            return Err(Fatal {
                code: Code::Limit,
                text: format!(
                    "the node already has {} clients (max_connections)",
                    self.limits.max_connections
                ),
            });
        }
        let id = self.next_client.fetch_add(1, Relaxed);
        let out = Arc::new(ClientOut::new(id, self.limits.max_pending_bytes));
        out.control(ServerFrame::Welcome {
            client: id,
            max_payload: self.limits.max_payload as u64,
        });
        st.clients.insert(
            id,
            ClientEntry {
                out: out.clone(),
                peer,
                sids: FxHashMap::default(),
                requests: FxHashMap::default(),
                serving: FxHashSet::default(),
                tunnels: FxHashSet::default(),
                published: 0,
            },
        );
        self.counters.connections_total.fetch_add(1, Relaxed);
        Ok(out)
    }

    /// Number of clients attached.
    pub fn client_count(&self) -> usize {
        self.state.lock().clients.len()
    }

    /// Number of subscriptions held.
    pub fn subscription_count(&self) -> usize {
        self.state.lock().router.len()
    }

    /// Removes a client and everything it held (subscriptions, cluster
    /// memberships, requests, tunnels), closing it with `error` if given.
    pub fn detach(&self, client: u64, error: Option<(Code, String)>) {
        let mut st = self.state.lock();
        let Some(c) = st.clients.remove(&client) else {
            return;
        };
        c.out.close(error);
        st.router.remove_subscriber(client);
        for (_, (id, _, pattern, kind)) in c.sids {
            st.subs.remove(&id);
            if let Some(m) = self.mesh.get() {
                m.remove_interest(&pattern, &kind);
            }
        }
        let joined: Vec<String> = if self.mesh.get().is_some() {
            st.clusters.clusters_of(client).map(str::to_owned).collect()
        } else {
            Vec::new()
        };
        st.clusters.remove_member(client);
        for c in &joined {
            self.advertise_cluster(&st, c);
        }
        st.load.remove(&client);
        for (_, token) in c.requests {
            if let Some(p) = st.pending.remove(&token) {
                release_members(&mut st, &p.members);
            }
        }
        for token in c.serving {
            let Some(p) = st.pending.get_mut(&token) else {
                continue;
            };
            p.expect = p.expect.saturating_sub(1);
            p.members.retain(|m| *m != client);
            if p.expect == 0 {
                let p = st.pending.remove(&token).expect("present");
                release_members(&mut st, &p.members);
                if let Some(r) = st.clients.get_mut(&p.requester) {
                    r.requests.remove(&p.rid);
                    r.out.control(ServerFrame::ReqDone {
                        rid: p.rid,
                        code: Code::NoResponders,
                    });
                }
            }
        }
        for t in c.tunnels {
            if let Some((a, b)) = st.tunnels.remove(&t) {
                let other = if a == client { b } else { a };
                if let Some(o) = st.clients.get_mut(&other) {
                    o.tunnels.remove(&t);
                    o.out.control(ServerFrame::TunClose { tunnel: t });
                }
            } else if let Some(l) = self.mesh.get() {
                l.tunnel_close(t);
            }
        }
    }

    /// Stops accepting clients (see [`crate::Node::shutdown`]).
    pub(crate) fn begin_shutdown(&self) {
        self.shutting_down.store(true, Relaxed);
    }

    /// Whether every client's queue is empty.
    pub(crate) fn drained(&self) -> bool {
        self.state
            .lock()
            .clients
            .values()
            .all(|c| c.out.is_drained())
    }

    /// Closes every client with `code`.
    pub(crate) fn close_all(&self, code: Code, text: &str) {
        let ids: Vec<u64> = self.state.lock().clients.keys().copied().collect();
        for id in ids {
            self.detach(id, Some((code, text.to_owned())));
        }
    }

    fn limit(&self, text: String) -> (Code, String) {
        self.counters.limit_hits.fetch_add(1, Relaxed);
        (Code::Limit, text)
    }

    /// Checks a message from a client against the limits.
    fn check_message(&self, msg: &Message, subject_needed: bool) -> Result<(), (Code, String)> {
        self.check_parts(&msg.subject, msg.payload.len(), subject_needed)
    }

    fn check_parts(
        &self,
        subject: &str,
        payload: usize,
        subject_needed: bool,
    ) -> Result<(), (Code, String)> {
        if payload > self.limits.max_payload {
            return Err(self.limit(format!(
                "payload of {} bytes is over the node's limit of {} (max_payload)",
                payload, self.limits.max_payload
            )));
        }
        if subject.len() > self.limits.max_subject {
            return Err(self.limit(format!(
                "subject of {} bytes is over the node's limit of {} (max_subject)",
                subject.len(),
                self.limits.max_subject
            )));
        }
        if subject_needed {
            Subject::new(subject).map_err(|e| (Code::Invalid, e.to_string()))?;
        }
        Ok(())
    }

    /// Handles one frame from client `me`. An `Err` means the client must
    /// be closed with that error (the caller calls [`Broker::detach`]).
    pub async fn handle(&self, me: &Arc<ClientOut>, frame: ClientFrame) -> Result<(), Fatal> {
        use ClientFrame as F;
        match frame {
            F::Pub(msg) => {
                if let Err((code, text)) = self.check_message(&msg, true) {
                    me.control(ServerFrame::Error {
                        corr: ASYNC_ERROR,
                        code,
                        text,
                    });
                    return Ok(());
                }
                self.counters.published.fetch_add(1, Relaxed);
                if let Some(m) = self.mesh.get() {
                    m.wait_room().await;
                }
                let msg = Arc::new(msg);
                self.fan_out(me, &msg, &Body::Val(msg.clone()), 0, None)
                    .await;
            }
            F::Req {
                rid,
                flags,
                max,
                target,
                key,
                msg,
            } => {
                self.request(me, rid, flags, max.max(1), target, key, msg)
                    .await
            }
            other => self.handle_control(me, other)?,
        }
        Ok(())
    }

    /// Handles a frame that never waits: anything but `Pub` and `Req`,
    /// which this refuses as a protocol error (use [`Broker::handle`]).
    pub fn handle_control(&self, me: &Arc<ClientOut>, frame: ClientFrame) -> Result<(), Fatal> {
        use ClientFrame as F;
        match frame {
            F::Pub(_) | F::Req { .. } => {
                return Err(Fatal {
                    code: Code::Protocol,
                    text: "publish and request frames go through Broker::handle".into(),
                })
            }
            F::Sub {
                sid,
                pattern,
                kind,
                policy,
                queue,
                credit,
            } => {
                let r = self.subscribe(me, sid, pattern, kind, policy, queue, credit);
                me.control(match r {
                    Ok(()) => ServerFrame::Ack { corr: sid },
                    Err((code, text)) => ServerFrame::Error {
                        corr: sid,
                        code,
                        text,
                    },
                });
            }
            F::Unsub { sid } => {
                let mut st = self.state.lock();
                let removed = st.clients.get_mut(&me.id).and_then(|c| c.sids.remove(&sid));
                if let Some((id, _, pattern, kind)) = removed {
                    st.router.unsubscribe(id);
                    st.subs.remove(&id);
                    if let Some(m) = self.mesh.get() {
                        m.remove_interest(&pattern, &kind);
                    }
                }
                drop(st);
                me.remove_sub(sid);
            }
            F::Credit { sid, n } => me.credit(sid, n),
            F::Reply { token, msg } => self.reply(token, msg),
            F::Cancel { rid } => {
                let mut st = self.state.lock();
                let token = st
                    .clients
                    .get_mut(&me.id)
                    .and_then(|c| c.requests.remove(&rid));
                if let Some(p) = token.and_then(|t| st.pending.remove(&t)) {
                    release_members(&mut st, &p.members);
                }
            }
            F::Join {
                corr,
                cluster,
                capacity,
            } => {
                let r = Subject::new(&cluster).map(|_| ());
                match r {
                    Ok(()) => {
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
            F::Leave { corr, cluster } => {
                let mut st = self.state.lock();
                st.clusters.leave(&cluster, me.id);
                self.advertise_cluster(&st, &cluster);
                drop(st);
                me.control(ServerFrame::Ack { corr });
            }
            F::Bcast { cluster, msg } => {
                if let Err((code, text)) = self.check_message(&msg, false) {
                    me.control(ServerFrame::Error {
                        corr: ASYNC_ERROR,
                        code,
                        text,
                    });
                    return Ok(());
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
            F::TunOpen {
                corr,
                cluster,
                key,
                window,
            } => self.tunnel_open(me, corr, cluster, key, window),
            F::TunData { tunnel, msg } => {
                let size = cost(&msg);
                let f = ServerFrame::TunData { tunnel, msg };
                self.tunnel_relay(me, tunnel, f, Some(size))?
            }
            F::TunCredit { tunnel, n } => {
                self.tunnel_relay(me, tunnel, ServerFrame::TunCredit { tunnel, n }, None)?
            }
            F::TunClose { tunnel } => {
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
            F::Stats { corr } => {
                let json = serde_json::to_string(&self.stats()).unwrap_or_default();
                me.control(ServerFrame::Stats { corr, json });
            }
            F::Ping { corr } => me.control(ServerFrame::Pong { corr }),
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn subscribe(
        &self,
        me: &Arc<ClientOut>,
        sid: u64,
        pattern: String,
        kind: String,
        policy: Policy,
        queue: u32,
        credit: u32,
    ) -> Result<(), (Code, String)> {
        if pattern.len() > self.limits.max_subject {
            return Err(self.limit(format!(
                "pattern of {} bytes is over the node's limit of {} (max_subject)",
                pattern.len(),
                self.limits.max_subject
            )));
        }
        let mut st = self.state.lock();
        let st = &mut *st;
        let Some(c) = st.clients.get_mut(&me.id) else {
            return Err((Code::NotFound, "client is closing".into()));
        };
        if c.sids.len() >= self.limits.max_subscriptions {
            return Err(self.limit(format!(
                "the client already holds {} subscriptions (max_subscriptions)",
                self.limits.max_subscriptions
            )));
        }
        if c.sids.contains_key(&sid) {
            return Err((Code::Invalid, format!("subscription id {sid} is in use")));
        }
        // The queue exists before the interest, so nothing matched is lost.
        me.add_sub(sid, queue as usize, policy, credit);
        match st.router.subscribe(&pattern, &kind, me.id) {
            Ok(id) => {
                st.subs.insert(
                    id,
                    SubEntry {
                        out: me.clone(),
                        sid,
                    },
                );
                if let Some(m) = self.mesh.get() {
                    m.add_interest(&pattern, &kind);
                }
                c.sids.insert(sid, (id, policy, pattern, kind));
                Ok(())
            }
            Err(e) => {
                me.remove_sub(sid);
                Err((Code::Invalid, e.to_string()))
            }
        }
    }

    /// Queues `msg` to every subscription matching its subject and type;
    /// returns how many matched. Waits (with no lock held) for full `block`
    /// subscriptions.
    async fn fan_out(
        &self,
        me: &Arc<ClientOut>,
        msg: &Message,
        body: &Body,
        token: u64,
        pending: Option<u64>,
    ) -> usize {
        let Ok(subject) = Subject::new(&msg.subject) else {
            return 0;
        };
        let mut blocked: Vec<(Arc<ClientOut>, u64)> = Vec::new();
        let mut kill: Vec<u64> = Vec::new();
        let mut matched = 0usize;
        {
            let mut st = self.state.lock();
            let st = &mut *st;
            if let Some(c) = st.clients.get_mut(&me.id) {
                c.published += 1;
            }
            let subs = &st.subs;
            st.router
                .for_each_match(subject, msg.kind.as_deref(), |id, client| {
                    let Some(e) = subs.get(&id) else { return };
                    matched += 1;
                    match e.out.push(e.sid, token, body) {
                        Push::Queued | Push::Dropped => e.out.wake(),
                        Push::Full => blocked.push((e.out.clone(), e.sid)),
                        Push::Kill => kill.push(client),
                        Push::Gone => matched -= 1,
                    }
                });
            if let Some(p) = pending.and_then(|t| st.pending.get_mut(&t)) {
                p.expect += matched as u32;
            }
            if pending.is_none() {
                if let Some(m) = self.mesh.get() {
                    let mut raw = Vec::new();
                    skiff_proto::wire::encode_message(&mut raw, msg, false);
                    m.publish(&msg.subject, msg.kind.as_deref(), &raw);
                }
            }
        }
        for k in kill {
            self.counters.slow_consumers.fetch_add(1, Relaxed);
            self.detach(
                k,
                Some((
                    Code::SlowConsumer,
                    "a subscription with policy `disconnect` was full: slow consumer".into(),
                )),
            );
        }
        for (out, sid) in blocked {
            // Stop waiting if the publisher itself is closed.
            tokio::select! {
                _ = out.wait_space(sid, token, body) => {}
                _ = me.closed() => break,
            }
        }
        matched
    }

    /// Publishes a batch of messages from one client (as read from `Pub`
    /// frames), in order: what [`Broker::handle`] does for each `Pub`, with one routing
    /// lock per run of messages (until one waits for a full `block`
    /// subscription) and one match per run of messages with the same
    /// subject and type. Wakes each subscriber once per run. Empties
    /// `batch`.
    pub async fn publish_batch(&self, me: &Arc<ClientOut>, batch: &mut Vec<Published>) {
        let mesh = self.mesh.get();
        if let Some(m) = mesh {
            if !batch.is_empty() {
                m.wait_room().await;
            }
        }
        self.publish_run(me, batch, mesh.map(|m| &**m)).await
    }

    /// Messages other nodes published, as [`Broker::publish_batch`] does
    /// for a client's, to local subscriptions only (`me` is the node's
    /// mesh client, whose counters they go to). A full `block`
    /// subscription makes the mesh wait, which holds the publishing nodes
    /// back through their flow-control windows.
    pub(crate) async fn publish_remote(&self, me: &Arc<ClientOut>, batch: &mut Vec<Published>) {
        self.publish_run(me, batch, None).await
    }

    async fn publish_run(
        &self,
        me: &Arc<ClientOut>,
        batch: &mut Vec<Published>,
        forward: Option<&MeshLink>,
    ) {
        // A subscription that was full, with what it has still to get.
        let mut blocked: Vec<Blocked> = Vec::new();
        let mut kill: Vec<u64> = Vec::new();
        // Subscriptions matching the previous message: (router id, client).
        let mut targets: Vec<(SubId, u64)> = Vec::new();
        // Messages for `targets` not yet queued to them.
        let mut run: Vec<Body> = Vec::new();
        let mut woken: Vec<u64> = Vec::new();
        // Messages of this round for other nodes (indices into `batch`),
        // handed to the mesh together once the routing lock is released.
        let mut fwd: Vec<usize> = Vec::new();
        let mut i = 0;
        while i < batch.len() {
            {
                let mut st = self.state.lock();
                let st = &mut *st;
                let mut prev: Option<usize> = None;
                let mut published = 0u64;
                fwd.clear();
                while i < batch.len() && blocked.is_empty() && kill.is_empty() {
                    let p = &batch[i];
                    i += 1;
                    let (subject, kind, payload) = p.parts(self.limits.max_payload);
                    let same = prev.is_some_and(|q| {
                        let (s, k, _) = batch[q].parts(self.limits.max_payload);
                        s == subject && k == kind
                    });
                    // A subject seen just before was checked and matched.
                    if let Err((code, text)) = self.check_parts(subject, payload, !same) {
                        me.control(ServerFrame::Error {
                            corr: ASYNC_ERROR,
                            code,
                            text,
                        });
                        continue;
                    }
                    if !same {
                        flush_run(st, &mut run, &targets, &mut woken, &mut blocked, &mut kill);
                        if !blocked.is_empty() || !kill.is_empty() {
                            i -= 1;
                            break;
                        }
                        let Ok(subject) = Subject::new(subject) else {
                            continue;
                        };
                        targets.clear();
                        st.router
                            .for_each_match(subject, kind, |id, client| targets.push((id, client)));
                        prev = Some(i - 1);
                    }
                    published += 1;
                    if forward.is_some() {
                        fwd.push(i - 1);
                    }
                    run.push(Body::encoded(&p.raw));
                }
                flush_run(st, &mut run, &targets, &mut woken, &mut blocked, &mut kill);
                if let Some(c) = st.clients.get_mut(&me.id) {
                    c.published += published;
                }
                self.counters.published.fetch_add(published, Relaxed);
                for c in woken.drain(..) {
                    if let Some(c) = st.clients.get(&c) {
                        c.out.wake();
                    }
                }
            }
            if let (Some(m), false) = (forward, fwd.is_empty()) {
                let max = self.limits.max_payload;
                m.publish_many(fwd.iter().map(|&k| {
                    let p = &batch[k];
                    let (subject, kind, _) = p.parts(max);
                    (subject, kind, &p.raw[..])
                }));
            }
            for k in kill.drain(..) {
                self.counters.slow_consumers.fetch_add(1, Relaxed);
                self.detach(
                    k,
                    Some((
                        Code::SlowConsumer,
                        "a subscription with policy `disconnect` was full: slow consumer".into(),
                    )),
                );
            }
            for (out, sid, rest) in blocked.drain(..) {
                for body in &rest {
                    tokio::select! {
                        r = out.wait_space(sid, 0, body) => if r != Push::Queued && r != Push::Dropped {
                            break;
                        },
                        _ = me.closed() => {
                            batch.clear();
                            return;
                        }
                    }
                }
            }
        }
        batch.clear();
    }

    #[allow(clippy::too_many_arguments)]
    async fn request(
        &self,
        me: &Arc<ClientOut>,
        rid: u64,
        flags: u8,
        max: u32,
        target: String,
        key: Bytes,
        msg: Message,
    ) {
        let cluster = flags & req_flags::CLUSTER != 0;
        let many = flags & req_flags::MANY != 0;
        self.counters.requests.fetch_add(1, Relaxed);
        let refuse = |code, text: String| {
            me.control(ServerFrame::Error {
                corr: ASYNC_ERROR,
                code,
                text,
            });
            me.control(ServerFrame::ReqDone { rid, code });
        };
        if let Err((code, text)) = self.check_message(&msg, false) {
            return refuse(code, text);
        }
        let token;
        {
            let mut st = self.state.lock();
            let st = &mut *st;
            let Some(c) = st.clients.get_mut(&me.id) else {
                return;
            };
            if c.requests.len() >= self.limits.max_requests {
                let e = self.limit(format!(
                    "the client already has {} requests awaiting replies (max_requests)",
                    self.limits.max_requests
                ));
                return refuse(e.0, e.1);
            }
            token = st.next_token;
            st.next_token += 1;
            c.requests.insert(rid, token);
            let mut p = Pending {
                requester: me.id,
                rid,
                left: if many { max } else { 1 },
                expect: 0,
                members: Vec::new(),
                origin: None,
                replied: 0,
            };
            if !cluster {
                // Other nodes with matching interest: each answers with how
                // many it reached (a `done` frame), then their replies.
                if let Some(l) = self.mesh.get() {
                    for a in l.route(&target, msg.kind.as_deref()) {
                        if l.request(a, token, flags, max, &target, &[], &msg) {
                            p.expect += 1;
                        }
                    }
                }
            }
            if cluster {
                let raw_key = key.clone();
                let key = (!key.is_empty()).then_some(&key[..]);
                if many {
                    p.members = st
                        .clusters
                        .members(&target)
                        .filter(|m| {
                            st.clusters
                                .weight(&target, *m)
                                .is_some_and(|(cap, _)| cap > 0)
                        })
                        .collect();
                } else if let Some(m) = st.clusters.pick(&target, key) {
                    p.members.push(m);
                }
                for &m in &p.members {
                    if m >= REMOTE {
                        if let (Some(l), Some(a)) = (self.mesh.get(), st.remote_addrs.get(&m)) {
                            l.request(*a, token, flags, max, &target, &raw_key, &msg);
                        }
                    } else if let Some(c) = st.clients.get_mut(&m) {
                        c.serving.insert(token);
                        c.out.control(ServerFrame::Request {
                            token,
                            cluster: target.clone(),
                            msg: msg.clone(),
                        });
                    }
                    let load = st.load.entry(m).or_default();
                    *load += 1;
                    let load = *load;
                    st.clusters.set_load(m, load);
                }
                p.expect = p.members.len() as u32;
            }
            st.pending.insert(token, p);
        }
        if !cluster {
            let msg = Message {
                subject: target.as_str().into(),
                ..msg
            };
            if let Err((code, text)) = self.check_message(&msg, true) {
                self.finish(token, None);
                return refuse(code, text);
            }
            let msg = Arc::new(msg);
            self.fan_out(me, &msg, &Body::Val(msg.clone()), token, Some(token))
                .await;
        }
        let none = self
            .state
            .lock()
            .pending
            .get(&token)
            .is_some_and(|p| p.expect == 0);
        if none {
            self.counters.no_responders.fetch_add(1, Relaxed);
            self.finish(token, Some(Code::NoResponders));
        }
    }

    /// Forgets request `token`, telling the requester `done` if given.
    fn finish(&self, token: u64, done: Option<Code>) {
        let mut st = self.state.lock();
        let Some(p) = st.pending.remove(&token) else {
            return;
        };
        release_members(&mut st, &p.members);
        if let Some(c) = st.clients.get_mut(&p.requester) {
            c.requests.remove(&p.rid);
            if let Some(code) = done {
                c.out.control(ServerFrame::ReqDone { rid: p.rid, code });
            }
        }
        for m in p.members {
            if let Some(c) = st.clients.get_mut(&m) {
                c.serving.remove(&token);
            }
        }
    }

    fn reply(&self, token: u64, msg: Message) {
        let mut st = self.state.lock();
        let st = &mut *st;
        let Some(p) = st.pending.get_mut(&token) else {
            return; // late or duplicate: the requester stopped waiting
        };
        self.counters.replies.fetch_add(1, Relaxed);
        p.left -= 1;
        p.replied += 1;
        p.expect = p.expect.saturating_sub(1);
        if let (Some((a, t)), Some(l)) = (p.origin, self.mesh.get()) {
            l.reply(a, t, &msg);
        }
        let done = if p.left == 0 {
            Some(None)
        } else if p.expect == 0 {
            Some(Some(Code::Complete))
        } else {
            None
        };
        let (requester, rid) = (p.requester, p.rid);
        // Forget the request (and release the members' load) before the
        // reply can reach the requester, so its next request sees the load
        // as it is.
        if done.is_some() {
            let p = st.pending.remove(&token).expect("present");
            release_members(st, &p.members);
            for m in p.members {
                if let Some(c) = st.clients.get_mut(&m) {
                    c.serving.remove(&token);
                }
            }
        }
        if let Some(c) = st.clients.get_mut(&requester) {
            c.out.control(ServerFrame::Reply { rid, msg });
            if let Some(code) = done {
                c.requests.remove(&rid);
                if let Some(code) = code {
                    c.out.control(ServerFrame::ReqDone { rid, code });
                }
            }
        }
    }

    fn tunnel_open(
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
    fn tunnel_relay(
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
                    match size {
                        Some(size) => {
                            c.out.control_bounded(frame, size);
                        }
                        None => c.out.control(frame),
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
            match &f {
                ServerFrame::TunData { msg, .. } => {
                    let size = cost(msg);
                    c.out.control_bounded(f, size);
                }
                _ => c.out.control(f),
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

    /// Queues `body` to every local subscription matching `msg` (with
    /// request `token`, 0 for a publish); a full subscription drops it and
    /// counts it (the mesh task never waits). Returns how many it reached.
    fn local_deliver(
        &self,
        st: &State,
        msg: &Message,
        body: &Body,
        token: u64,
    ) -> (usize, Vec<u64>) {
        let Ok(subject) = Subject::new(&msg.subject) else {
            return (0, Vec::new());
        };
        let (mut n, mut kill) = (0, Vec::new());
        st.router
            .for_each_match(subject, msg.kind.as_deref(), |id, client| {
                let Some(e) = st.subs.get(&id) else { return };
                match e.out.push(e.sid, token, body) {
                    Push::Queued => {
                        n += 1;
                        e.out.wake()
                    }
                    Push::Dropped => e.out.wake(),
                    Push::Full => {
                        self.remote_drops.fetch_add(1, Relaxed);
                    }
                    Push::Kill => kill.push(client),
                    Push::Gone => {}
                }
            });
        (n, kill)
    }

    fn kill_slow(&self, kill: Vec<u64>) {
        for k in kill {
            self.counters.slow_consumers.fetch_add(1, Relaxed);
            self.detach(
                k,
                Some((
                    Code::SlowConsumer,
                    "a subscription with policy `disconnect` was full: slow consumer".into(),
                )),
            );
        }
    }

    /// A message another node published: to local subscriptions only.
    pub(crate) fn deliver_remote(&self, msg: &Message, raw: &Bytes) {
        let kill = {
            let st = self.state.lock();
            self.local_deliver(&st, msg, &Body::encoded(raw), 0).1
        };
        self.kill_slow(kill);
    }

    /// A request another node forwarded: to local responders only; tells
    /// that node how many were reached, and relays their replies.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn remote_request(
        &self,
        from: SocketAddr,
        origin: u64,
        flags: u8,
        max: u32,
        target: String,
        key: Bytes,
        msg: Message,
    ) {
        let Some(l) = self.mesh.get() else { return };
        let cluster = flags & req_flags::CLUSTER != 0;
        let many = flags & req_flags::MANY != 0;
        self.counters.requests.fetch_add(1, Relaxed);
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if st.pending.len() >= self.limits.max_requests {
            self.counters.limit_hits.fetch_add(1, Relaxed);
            drop(guard);
            l.done(from, origin, 0);
            return;
        }
        let token = st.next_token;
        st.next_token += 1;
        let mut p = Pending {
            requester: 0,
            rid: 0,
            left: if many { max.max(1) } else { 1 },
            expect: 0,
            members: Vec::new(),
            origin: Some((from, origin)),
            replied: 0,
        };
        let mut kill = Vec::new();
        if cluster {
            if many {
                p.members = st
                    .clusters
                    .members(&target)
                    .filter(|m| *m < REMOTE)
                    .filter(|m| st.clusters.weight(&target, *m).is_some_and(|w| w.0 > 0))
                    .collect();
            } else {
                let key = (!key.is_empty()).then_some(&key[..]);
                p.members.extend(pick_local(&mut st.clusters, &target, key));
            }
            for &m in &p.members {
                if let Some(c) = st.clients.get_mut(&m) {
                    c.serving.insert(token);
                    c.out.control(ServerFrame::Request {
                        token,
                        cluster: target.clone(),
                        msg: msg.clone(),
                    });
                }
                let load = st.load.entry(m).or_default();
                *load += 1;
                let load = *load;
                st.clusters.set_load(m, load);
            }
            p.expect = p.members.len() as u32;
        } else {
            let msg = Message {
                subject: target.as_str().into(),
                ..msg
            };
            let msg = Arc::new(msg);
            let (n, k) = self.local_deliver(st, &msg, &Body::Val(msg.clone()), token);
            p.expect = n as u32;
            kill = k;
        }
        let reached = p.expect;
        if reached > 0 {
            st.pending.insert(token, p);
        }
        l.done(from, origin, reached);
        drop(guard);
        self.kill_slow(kill);
    }

    /// A reply another node relayed for request `token`.
    pub(crate) fn remote_reply(&self, token: u64, msg: Message) {
        self.reply(token, msg);
    }

    /// Another node reached `reached` responders for request `token`.
    pub(crate) fn remote_done(&self, token: u64, reached: u32) {
        let code = {
            let mut st = self.state.lock();
            let Some(p) = st.pending.get_mut(&token) else {
                return;
            };
            p.expect = p.expect.saturating_sub(1).saturating_add(reached);
            if p.expect > 0 {
                return;
            }
            if p.replied == 0 {
                Code::NoResponders
            } else {
                Code::Complete
            }
        };
        if code == Code::NoResponders {
            self.counters.no_responders.fetch_add(1, Relaxed);
        }
        self.finish(token, Some(code));
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
            st.clusters.leave(cluster, id);
        } else {
            st.clusters.join(cluster, id, advertised - 1);
        }
    }

    /// Another node is down: it is no cluster member any more.
    pub(crate) fn remote_down(&self, peer: SocketAddr) {
        let mut st = self.state.lock();
        if let Some(id) = st.remote_ids.get(&peer).copied() {
            st.clusters.remove_member(id);
            st.load.remove(&id);
        }
    }

    /// Members of `cluster` this node routes to: its own clients and, for
    /// each other node with members, one entry. What a request or a
    /// broadcast sent now would reach (the mesh's view of a peer can be a
    /// moment ahead of this).
    pub fn cluster_members(&self, cluster: &str) -> usize {
        self.state.lock().clusters.len(cluster)
    }

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
}

/// A subscription that was full, with the messages it has still to get.
type Blocked = (Arc<ClientOut>, u64, Vec<Body>);

/// Queues `run` to every subscription in `targets`, one outbox lock per
/// target, and empties it; notes whom to wake, who is blocked and whom to
/// close.
fn flush_run(
    st: &State,
    run: &mut Vec<Body>,
    targets: &[(SubId, u64)],
    woken: &mut Vec<u64>,
    blocked: &mut Vec<Blocked>,
    kill: &mut Vec<u64>,
) {
    if run.is_empty() {
        return;
    }
    for &(id, client) in targets {
        let Some(e) = st.subs.get(&id) else { continue };
        let (k, r) = e.out.push_run(e.sid, run);
        if k > 0 && !woken.contains(&client) {
            woken.push(client);
        }
        match r {
            Push::Full => blocked.push((e.out.clone(), e.sid, run[k..].to_vec())),
            Push::Kill => kill.push(client),
            _ => {}
        }
    }
    run.clear();
}

/// Picks a member of `cluster` on this node (not another node of the
/// mesh), by the same weighted round robin.
fn pick_local(clusters: &mut Clusters<u64>, cluster: &str, key: Option<&[u8]>) -> Option<u64> {
    clusters.pick_where(cluster, key, |m| m < REMOTE)
}

fn release_members(st: &mut State, members: &[u64]) {
    for &m in members {
        if let Some(l) = st.load.get_mut(&m) {
            *l = l.saturating_sub(1);
            let l = *l;
            st.clusters.set_load(m, l);
        }
    }
}
