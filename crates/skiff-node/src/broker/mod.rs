//! The node's state and what it does with each client frame: the router
//! (subject trie), clusters, requests in flight and tunnels. It owns no
//! sockets: the front ends ([`crate::listen`], through each client's
//! [`crate::session::Session`]) hand it decoded [`ClientFrame`]s and runs
//! of publishes, and it answers by queueing [`ServerFrame`]s in the
//! clients' [`ClientOut`]s.
//!
//! One lock guards the routing state; each client's outbox has its own, and
//! is only ever taken after the routing lock or alone, never before it. A
//! publish matches under the routing lock and queues the same
//! [`Message`] (payload shared by reference count) to every matching
//! subscription. Only a `block` subscription that is full makes the
//! publisher wait, and it waits with no lock held.
//!
//! Layout: this file holds the state, attachment and the dispatch of a
//! client's frames; `pubsub` subscriptions and publishes, `request`
//! requests and replies (from clients and from other nodes, one path),
//! `tunnel` tunnels, `cluster` cluster membership and broadcasts, `stats`
//! the counters.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use rustc_hash::{FxHashMap, FxHashSet};
use skiff_proto::client_frame::{ClientFrame, Code, Policy, ServerFrame, ASYNC_ERROR};
use skiff_proto::router::{Clusters, Router, SubId, Subject, Syntax};
use skiff_proto::Message;

use crate::auth::{Auth, User};
use crate::config::Limits;
use crate::mesh::MeshLink;
use crate::outbox::{cost, Budget, ClientOut};

mod cluster;
mod inbound;
mod pubsub;
mod request;
mod stats;
mod tunnel;
mod users;

use cluster::release_members;
pub use pubsub::{LastSubject, Published};
use request::Request;
pub use stats::ClusterView;
pub use users::{AuthSwap, MAX_CLIENT_NAME};

/// Cluster members at or above this id are other nodes of the mesh (their
/// capacity is what they advertise), not clients.
const REMOTE: u64 = 1 << 62;

#[derive(Debug)]
struct SubEntry {
    out: Arc<ClientOut>,
    sid: u64,
    /// A queue group (NATS `SUB subject group sid`): of the matching
    /// subscriptions in one group, one gets each message.
    group: Option<Arc<str>>,
}

/// A client's subscription: router id, policy, pattern, type pattern,
/// (pattern kind, best effort between nodes).
type SidEntry = (SubId, Policy, String, String, (Syntax, bool));

#[derive(Debug)]
struct ClientEntry {
    out: Arc<ClientOut>,
    peer: String,
    /// Queue groups of the client's `Sub` frames → (its subscriptions in
    /// each, whether the node made it a member of the cluster of that
    /// name, to be undone with its last subscription in the group).
    groups: FxHashMap<Arc<str>, (u32, bool)>,
    /// The client's sid → router id, policy and patterns (with their kind
    /// and whether the subscription is best effort between nodes).
    sids: FxHashMap<u64, SidEntry>,
    /// The client's request id → node token.
    requests: FxHashMap<u64, u64>,
    /// Cluster requests this client was chosen to answer.
    serving: FxHashSet<u64>,
    tunnels: FxHashSet<u64>,
    published: u64,
    /// Who the client authenticated as.
    user: Arc<User>,
    /// Attached in process by the node itself ([`Broker::attach`]): a
    /// reload of the users leaves it alone.
    trusted: bool,
    /// The name the client gave itself (`Hello`, NATS `CONNECT`), for
    /// `/connz` and stats.
    name: Option<String>,
    /// When it attached (for `/connz`).
    since: std::time::SystemTime,
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
    /// Draws request tokens: random, so that a client cannot guess the
    /// token of a request it was not given and answer it (a forged reply);
    /// made on the first request.
    tokens: Option<rand::rngs::StdRng>,
    tunnels: FxHashMap<u64, (u64, u64)>,
    next_tunnel: u64,
    /// Mesh peers as cluster members: address ↔ member id (≥ [`REMOTE`]).
    remote_ids: FxHashMap<SocketAddr, u64>,
    remote_addrs: FxHashMap<u64, SocketAddr>,
    /// Clusters other nodes have members in → how many such nodes: the
    /// queue groups a publish may have members of elsewhere.
    remote_clusters: FxHashMap<String, u32>,
    /// A client with several subscriptions in one queue group: the turn of
    /// its round robin among them.
    sub_turns: FxHashMap<u64, u32>,
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
    /// Operations refused by a user's permissions.
    denied: AtomicU64,
    /// TLS handshakes that failed or ran out of time.
    tls_failures: AtomicU64,
    /// What clients gone had delivered and dropped (node totals are
    /// these plus the clients attached).
    departed_delivered: AtomicU64,
    departed_dropped: AtomicU64,
    departed_dropped_control: AtomicU64,
}

/// The node's state, shared by every connection. See the module
/// documentation.
#[derive(Debug)]
pub struct Broker {
    state: Mutex<State>,
    /// Swapped whole by a reload ([`Broker::set_limits`]).
    limits: arc_swap::ArcSwap<Limits>,
    next_client: AtomicU64,
    counters: Counters,
    shutting_down: AtomicBool,
    started: std::time::Instant,
    mesh: OnceLock<Arc<MeshLink>>,
    /// Remote deliveries dropped because a subscription was full.
    remote_drops: AtomicU64,
    /// Pending bytes across all clients (`max_total_pending_bytes`).
    budget: Option<Arc<Budget>>,
    /// The users and how to check them, swapped whole by a reload
    /// ([`Broker::set_auth`]).
    auth: arc_swap::ArcSwap<Auth>,
    /// Warnings for the operator, shown at start and in stats (e.g. a
    /// listener beyond loopback without authentication).
    warnings: Mutex<Vec<String>>,
    /// Turns of the queue groups' round robin.
    group_turn: AtomicU64,
    /// Rereads the configuration and applies it (`Reload`); set by the
    /// node that owns the configuration file.
    reloader: OnceLock<ReloadHook>,
}

/// An operation a user's permissions may refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Publish,
    /// With the patterns' kind: a cMsg pattern is checked as one.
    Subscribe(Syntax),
    Reply,
    Join,
}

/// The installed [`Reloader`] (opaque to `Debug`).
struct ReloadHook(Reloader);

impl std::fmt::Debug for ReloadHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReloadHook")
    }
}

/// What a `Reload` frame runs: `Ok` with a summary of what changed, or
/// the reason the configuration was refused.
pub type Reloader = Box<dyn Fn() -> Result<String, String> + Send + Sync>;

/// Why a frame could not be handled: the client is closed with this error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fatal {
    /// Why.
    pub code: Code,
    /// A sentence for the client.
    pub text: String,
}

impl Broker {
    /// A node with no clients and no authentication.
    pub fn new(limits: Limits) -> Broker {
        Broker::with_auth(limits, Arc::new(Auth::default()))
    }

    /// A node with no clients whose front ends authenticate with `auth`.
    pub fn with_auth(limits: Limits, auth: Arc<Auth>) -> Broker {
        Broker {
            auth: arc_swap::ArcSwap::new(auth),
            warnings: Mutex::new(Vec::new()),
            state: Mutex::new(State {
                next_tunnel: 1,
                ..State::default()
            }),
            budget: (limits.max_total_pending_bytes > 0)
                .then(|| Arc::new(Budget::new(limits.max_total_pending_bytes))),
            limits: arc_swap::ArcSwap::from_pointee(limits),
            next_client: AtomicU64::new(1),
            counters: Counters::default(),
            shutting_down: AtomicBool::new(false),
            started: std::time::Instant::now(),
            mesh: OnceLock::new(),
            remote_drops: AtomicU64::new(0),
            group_turn: AtomicU64::new(0),
            reloader: OnceLock::new(),
        }
    }

    /// Installs what a `Reload` frame runs (once).
    pub fn set_reloader(&self, f: Reloader) {
        let _ = self.reloader.set(ReloadHook(f));
    }

    /// Replaces the limits in force (a reload). Checks made from now on
    /// use the new ones; a client's pending-bytes bound and frame size
    /// bound are set when it attaches, so those apply to clients attaching
    /// after, and `max_total_pending_bytes` needs a restart.
    pub fn set_limits(&self, limits: Limits) {
        self.limits.store(Arc::new(limits));
    }

    /// Connects the broker to the mesh (once): local interest is
    /// advertised from then on, and publishes, requests and broadcasts go
    /// to other nodes too.
    pub fn set_mesh(&self, link: Arc<MeshLink>) {
        let st = self.state.lock();
        for c in st.clients.values() {
            for (id, _, p, k, (syntax, lossy)) in c.sids.values() {
                link.add_interest(*syntax, p, k, *lossy);
                if let Some(g) = st.subs.get(id).and_then(|e| e.group.as_deref()) {
                    link.add_interest(Syntax::Tokens, &pubsub::queue_interest(g, p), "*", false);
                }
            }
        }
        let _ = self.mesh.set(link);
    }

    /// The mesh link, when the node is part of a mesh.
    pub fn mesh(&self) -> Option<&Arc<MeshLink>> {
        self.mesh.get()
    }

    /// How many clients have left since the node started.
    pub fn clients_left(&self) -> u64 {
        let now = self.state.lock().clients.len() as u64;
        self.counters
            .connections_total
            .load(Relaxed)
            .saturating_sub(now)
    }

    /// The limits in force.
    pub fn limits(&self) -> Arc<Limits> {
        self.limits.load_full()
    }

    /// The users, for front ends to authenticate clients with: the ones
    /// in force now (a reload may replace them; each authentication reads
    /// them once).
    pub fn auth(&self) -> Arc<Auth> {
        self.auth.load_full()
    }

    /// Adds a warning for the operator (shown in stats).
    pub fn warn(&self, text: String) {
        self.warnings.lock().push(text);
    }

    /// The warnings for the operator.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.lock().clone()
    }

    /// Operations refused by users' permissions so far.
    pub fn denied(&self) -> u64 {
        self.counters.denied.load(Relaxed)
    }

    /// Adds a trusted client (in process, or the node's own), with every
    /// permission: see [`Broker::attach_as`].
    pub fn attach(&self, peer: String) -> Result<Arc<ClientOut>, Fatal> {
        self.attach_with(peer, User::anonymous(), true)
    }

    /// Adds a client that authenticated as `user` (`peer` says where from,
    /// for stats), whose operations are then checked against the user's
    /// permissions, and queues its `Welcome`; refuses when the connection
    /// limit is reached or the node is shutting down.
    pub fn attach_as(&self, peer: String, user: Arc<User>) -> Result<Arc<ClientOut>, Fatal> {
        self.attach_with(peer, user, false)
    }

    fn attach_with(
        &self,
        peer: String,
        user: Arc<User>,
        trusted: bool,
    ) -> Result<Arc<ClientOut>, Fatal> {
        let name = user.name.clone();
        let r = self.attach_inner(peer.clone(), user, trusted);
        match &r {
            Ok(out) => {
                tracing::info!(client = out.id, peer = %peer, user = %name, "client connected")
            }
            Err(f) => crate::warn_every!(
                "refused client",
                peer = %peer,
                user = %name,
                reason = %f.text,
                "client refused"
            ),
        }
        r
    }

    fn attach_inner(
        &self,
        peer: String,
        user: Arc<User>,
        trusted: bool,
    ) -> Result<Arc<ClientOut>, Fatal> {
        let limits = self.limits.load();
        if self.shutting_down.load(Relaxed) {
            return Err(Fatal {
                code: Code::Shutdown,
                text: "the node is shutting down".into(),
            });
        }
        let mut st = self.state.lock();
        if st.clients.len() >= limits.max_connections {
            self.counters.limit_hits.fetch_add(1, Relaxed);
            return Err(Fatal {
                code: Code::Limit,
                text: format!(
                    "the node already has {} clients (max_connections)",
                    limits.max_connections
                ),
            });
        }
        if self.budget.as_ref().is_some_and(|b| b.exhausted()) {
            self.counters.limit_hits.fetch_add(1, Relaxed);
            return Err(Fatal {
                code: Code::Limit,
                text: format!(
                    "the node holds {} bytes for its clients (max_total_pending_bytes)",
                    limits.max_total_pending_bytes
                ),
            });
        }
        let id = self.next_client.fetch_add(1, Relaxed);
        let out = Arc::new(
            ClientOut::new(id, limits.max_pending_bytes, self.budget.clone()).with_user(&user),
        );
        out.control(ServerFrame::Welcome {
            client: id,
            max_payload: limits.max_payload as u64,
        });
        st.clients.insert(
            id,
            ClientEntry {
                out: out.clone(),
                peer,
                groups: FxHashMap::default(),
                sids: FxHashMap::default(),
                requests: FxHashMap::default(),
                serving: FxHashSet::default(),
                tunnels: FxHashSet::default(),
                published: 0,
                user,
                trusted,
                name: None,
                since: std::time::SystemTime::now(),
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
        match &error {
            Some((code, text)) => {
                tracing::info!(client, peer = %c.peer, code = ?code, reason = %text, "client left")
            }
            None => {
                tracing::info!(client, peer = %c.peer, reason = "closed by the client", "client left")
            }
        }
        let (_, delivered, dropped_control) = c.out.counters();
        let dropped: u64 = c
            .sids
            .keys()
            .filter_map(|sid| c.out.sub_counters(*sid))
            .map(|k| k.dropped)
            .sum();
        let k = &self.counters;
        k.departed_delivered.fetch_add(delivered, Relaxed);
        k.departed_dropped.fetch_add(dropped, Relaxed);
        k.departed_dropped_control
            .fetch_add(dropped_control, Relaxed);
        c.out.close(error);
        st.router.remove_subscriber(client);
        st.sub_turns.remove(&client);
        for (_, (id, _, pattern, kind, (syntax, lossy))) in c.sids {
            let e = st.subs.remove(&id);
            if let Some(m) = self.mesh.get() {
                m.remove_interest(syntax, &pattern, &kind, lossy);
                if let Some(g) = e.and_then(|e| e.group) {
                    m.remove_interest(
                        Syntax::Tokens,
                        &pubsub::queue_interest(&g, &pattern),
                        "*",
                        false,
                    );
                }
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
                request::forget_queued(&st, token, &p.members);
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

    /// Whether client `me` may do `op` on `target` (a subject, pattern or
    /// cluster); `Err` is the error for that operation, counted for the
    /// user and the node.
    pub(crate) fn permit(
        &self,
        me: &ClientOut,
        op: Op,
        target: &str,
    ) -> Result<(), (Code, String)> {
        let Some(u) = me.restricted() else {
            return Ok(());
        };
        let p = &u.permissions;
        let (ok, counter, what) = match op {
            Op::Publish => (p.may_publish(target), &u.denied.publish, "publish to"),
            Op::Subscribe(syntax) => (
                p.may_subscribe_as(syntax, target),
                &u.denied.subscribe,
                "subscribe to",
            ),
            Op::Reply => (p.allow_responses, &u.denied.reply, "reply to requests"),
            Op::Join => (p.may_join(target), &u.denied.join, "join cluster"),
        };
        if ok {
            return Ok(());
        }
        counter.fetch_add(1, Relaxed);
        self.counters.denied.fetch_add(1, Relaxed);
        let text = if op == Op::Reply {
            format!("permission denied: user `{}` may not {what}", u.name)
        } else {
            format!(
                "permission denied: user `{}` may not {what} `{target}`",
                u.name
            )
        };
        Err((Code::Denied, text))
    }

    fn limit(&self, text: String) -> (Code, String) {
        self.counters.limit_hits.fetch_add(1, Relaxed);
        warn_limit(&text);
        (Code::Limit, text)
    }

    /// Checks a message from a client against the limits.
    fn check_message(&self, msg: &Message, subject_needed: bool) -> Result<(), (Code, String)> {
        self.check_parts(
            &self.limits.load(),
            &msg.subject,
            msg.kind.as_deref(),
            msg.payload.len(),
            subject_needed,
            false,
        )
    }

    /// Checks a message's size, and its subject (when `subject_needed`)
    /// and type the way a subscription's are checked, so that nothing is
    /// delivered that no one could have subscribed to.
    ///
    /// `same`: the subject and type are those of a message checked just
    /// before against the same `limits` (a publish run's): only the
    /// payload's size is checked.
    fn check_parts(
        &self,
        limits: &Limits,
        subject: &str,
        kind: Option<&str>,
        payload: usize,
        subject_needed: bool,
        same: bool,
    ) -> Result<(), (Code, String)> {
        if payload > limits.max_payload {
            return Err(self.limit(format!(
                "payload of {} bytes is over the node's limit of {} (max_payload)",
                payload, limits.max_payload
            )));
        }
        if same {
            return Ok(());
        }
        if subject.len() > limits.max_subject {
            return Err(self.limit(format!(
                "subject of {} bytes is over the node's limit of {} (max_subject)",
                subject.len(),
                limits.max_subject
            )));
        }
        if subject_needed {
            Subject::new(subject).map_err(|e| (Code::Invalid, e.to_string()))?;
        }
        if let Some(k) = kind {
            skiff_proto::router::check_kind(k).map_err(|e| (Code::Invalid, e.to_string()))?;
        }
        Ok(())
    }

    /// Handles one frame from client `me`. An `Err` means the client must
    /// be closed with that error (the caller calls [`Broker::detach`]).
    pub async fn handle(&self, me: &Arc<ClientOut>, frame: ClientFrame) -> Result<(), Fatal> {
        match frame {
            ClientFrame::Pub(msg) => self.publish(me, msg).await,
            ClientFrame::Req {
                rid,
                flags,
                max,
                target,
                key,
                msg,
            } => {
                let req = Request {
                    flags,
                    max: max.max(1),
                    target,
                    key,
                    msg,
                };
                self.request(me, rid, req).await
            }
            other => self.handle_control(me, other)?,
        }
        Ok(())
    }

    /// Subscribes client `me` as a `Sub` frame would (any type), in queue
    /// group `group` if given: of a group's subscriptions that match a
    /// message, one gets it (the NATS front end's `SUB subject group sid`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn subscribe_in_group(
        &self,
        me: &Arc<ClientOut>,
        sid: u64,
        pattern: String,
        group: Option<Arc<str>>,
        policy: Policy,
        queue: u32,
        credit: u32,
    ) -> Result<(), (Code, String)> {
        self.subscribe(
            me,
            sid,
            (Syntax::Tokens, pattern, "*".into(), false),
            policy,
            queue,
            credit,
            group,
        )
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
                syntax,
                best_effort,
                group,
            } => {
                let group: Option<Arc<str>> = group.map(Into::into);
                let r = self
                    .permit(me, Op::Subscribe(syntax), &pattern)
                    .and_then(|()| match &group {
                        Some(g) if syntax != Syntax::Tokens || Subject::new(g).is_err() => Err((
                            Code::Invalid,
                            format!(
                                "queue group {g:?}: a group is a literal subject, and its pattern a token pattern"
                            ),
                        )),
                        _ => Ok(()),
                    })
                    .and_then(|()| {
                        self.subscribe(
                            me,
                            sid,
                            (syntax, pattern, kind, best_effort),
                            policy,
                            queue,
                            credit,
                            group.clone(),
                        )
                    });
                if let (Ok(()), Some(g)) = (&r, group) {
                    let may_join = self.permit(me, Op::Join, &g).is_ok();
                    self.group_sub_added(me, g, may_join);
                }
                me.control(match r {
                    Ok(()) => ServerFrame::Ack { corr: sid },
                    Err((code, text)) => ServerFrame::Error {
                        corr: sid,
                        code,
                        text,
                    },
                });
            }
            F::Unsub { sid } => self.unsubscribe(me, sid),
            F::Credit { sid, n } => me.credit(sid, n),
            F::Reply { token, msg } => match self.permit(me, Op::Reply, "") {
                Ok(()) => self.reply(token, msg),
                Err((code, text)) => me.control(ServerFrame::Error {
                    corr: ASYNC_ERROR,
                    code,
                    text,
                }),
            },
            F::Cancel { rid } => self.cancel(me, rid),
            F::Join {
                corr,
                cluster,
                capacity,
            } => match self.permit(me, Op::Join, &cluster) {
                Ok(()) => self.join(me, corr, cluster, capacity),
                Err((code, text)) => me.control(ServerFrame::Error { corr, code, text }),
            },
            F::Leave { corr, cluster } => self.leave(me, corr, cluster),
            F::Bcast { cluster, msg } => match self.permit(me, Op::Publish, &cluster) {
                Ok(()) => self.broadcast(me, cluster, msg),
                Err((code, text)) => me.control(ServerFrame::Error {
                    corr: ASYNC_ERROR,
                    code,
                    text,
                }),
            },
            F::TunOpen {
                corr,
                cluster,
                key,
                window,
            } => match self.permit(me, Op::Publish, &cluster) {
                Ok(()) => self.tunnel_open(me, corr, cluster, key, window),
                Err((code, text)) => me.control(ServerFrame::Error { corr, code, text }),
            },
            F::TunData { tunnel, msg } => {
                let size = cost(&msg);
                let f = ServerFrame::TunData { tunnel, msg };
                self.tunnel_relay(me, tunnel, f, Some(size))?
            }
            F::TunCredit { tunnel, n } => {
                self.tunnel_relay(me, tunnel, ServerFrame::TunCredit { tunnel, n }, None)?
            }
            F::TunClose { tunnel } => self.tunnel_close(me, tunnel),
            F::Stats { corr } => self.stats_reply(me, corr, None),
            F::StatsFrom { corr, from } => self.stats_reply(me, corr, Some(from)),
            F::Ping { corr } => me.control(ServerFrame::Pong { corr }),
            F::Auth(_) => {
                return Err(Fatal {
                    code: Code::Protocol,
                    text: "an Auth frame after the handshake".into(),
                })
            }
            F::Reload { corr } => me.control(self.reload(me.id, corr)),
            F::Hello { name } => self.set_name(me.id, &name),
            F::Confirm => me.set_confirm(),
        }
        Ok(())
    }

    /// Runs the node's reloader for client `id` (`Reload`), if the
    /// client is on this host.
    fn reload(&self, id: u64, corr: u64) -> ServerFrame {
        let peer = self
            .state
            .lock()
            .clients
            .get(&id)
            .map(|c| c.peer.clone())
            .unwrap_or_default();
        let refuse = |code, text: String| ServerFrame::Error { corr, code, text };
        if !is_local(&peer) {
            crate::warn_every!("reload refused", client = id, peer = %peer, "reload refused: not a client on this host");
            return refuse(
                Code::Invalid,
                format!("reload is taken only from clients on the node's host, not {peer}"),
            );
        }
        let Some(f) = self.reloader.get() else {
            return refuse(
                Code::Invalid,
                "this node has no configuration file to reload".into(),
            );
        };
        tracing::info!(client = id, peer = %peer, "reload asked by a client");
        match (f.0)() {
            Ok(_) => ServerFrame::Ack { corr },
            Err(e) => refuse(Code::Invalid, e),
        }
    }
}

/// Whether a client's `peer` (as the listeners name it) is on this host:
/// a Unix socket, shared memory, in process, or TCP from a loopback
/// address.
fn is_local(peer: &str) -> bool {
    if let Some(a) = peer.strip_prefix("tcp:") {
        return a
            .parse::<SocketAddr>()
            .is_ok_and(|a| a.ip().is_loopback() || a.ip().to_canonical().is_loopback());
    }
    peer.starts_with("unix:") || peer.starts_with("shm") || peer.starts_with("mem")
}

/// Logs a limit reached (at most once a second per limit): the limit is
/// the name in the text's last parentheses.
fn warn_limit(text: &str) {
    let cause = text
        .rsplit_once('(')
        .and_then(|(_, r)| r.split_once(')'))
        .map_or("limit", |(name, _)| name);
    crate::warn_every!(cause, reason = %text, "limit reached");
}
