//! The client API of a skiff node: publish/subscribe, request/reply,
//! clusters, broadcast and tunnels (cMsg, Iris, RBMQ).
//!
//! ```no_run
//! # async fn f() -> Result<(), skiff::Error> {
//! use std::time::Duration;
//! use skiff::client::Client;
//! use skiff::Message;
//! let c = Client::connect("skiff://127.0.0.1:4747").await?; // or "mem://"
//! let mut sub = c.subscribe("daq.*.rate", "*").await?;      // node holds it now
//! c.publish(Message::new("daq.hallb.rate", "42")).await?;
//! let m = sub.recv().await.unwrap();
//! # Ok(()) }
//! ```
//!
//! # Locators
//! - `mem://` (or `mem://name`): a node inside this process, started on
//!   first use and shared by every client of the process that names it (the
//!   embedded default; no socket, no copy).
//! - `skiff://host:port[,host:port…]` or `tcp://…`: a node over TCP. The
//!   addresses are tried in order; with two or more the client **fails
//!   over** when its node dies (see [`failover`](self#failover)).
//! - `unix:///path[,/path…]`: a node over a Unix socket (a list fails over
//!   the same way).
//! - `shm://name[?dir=…&ring=4M&spin=20us]`: a node on this host over
//!   shared memory (`skiff node --shm name`; the node's socket and the
//!   rings' files are under `dir/name/`, `dir` as for [`crate::shm`]).
//!   Publishes are written once into the client's ring and reach the
//!   node's subscribers as slices of it (see `docs/shm.md`); no failover.
//! - `file:///path`: cMsg's file domain: [`Client::publish`] appends to the
//!   log, [`Client::subscribe`] reads it back; nothing else is supported.
//!
//! # What is promised
//! - Publish: at most once, in order per publisher and subscription. A
//!   subscription's queue is bounded in the node and its [`Policy`] says
//!   what happens when it is full; every drop is counted and reported
//!   ([`Subscription::dropped`]).
//! - [`Client::subscribe`] returns once the node holds the interest: a
//!   message published after it returns is delivered (no slow joiner).
//! - [`Client::request`]: the first reply, [`Error::Timeout`], or at once
//!   [`Error::NoResponders`] when nobody subscribes or the cluster is empty.
//! - Tunnels are relayed over the client's node connection (TCP, Unix or in
//!   process), not yet over UDP associations: ordered and exactly once while
//!   both ends live, flow controlled by a window of messages.
//!
//! # Failover
//! `skiff://a:4747,b:4747` (cMsg): when the node dies (end of stream, an
//! error, or no answer to a keepalive ping within `ping_timeout`) the client
//! moves round robin to the next address, retrying with a short bounded
//! backoff until it gets one or is closed, re-registers its subscriptions
//! and cluster memberships there, and reports the gap:
//!
//! ```no_run
//! # async fn f() -> Result<(), skiff::Error> {
//! use skiff::client::{Client, ClientEvent};
//! let c = Client::connect("skiff://10.0.0.1:4747,10.0.0.2:4747?ping=100ms").await?;
//! let mut events = c.events();
//! let mut sub = c.subscribe("daq.>", "*").await?;
//! tokio::spawn(async move {
//!     while let Some(e) = events.recv().await {
//!         if let ClientEvent::Reconnected(gap) = e {
//!             eprintln!("{} -> {}: {:?} without a node", gap.from, gap.to, gap.down_for);
//!         }
//!     }
//! });
//! while let Some(d) = sub.recv().await {
//!     if let Some(gap) = d.gap() { /* messages before this one may be missing */ }
//! }
//! # Ok(()) }
//! ```
//!
//! Options (query parameters): `ping` (silence before a keepalive ping,
//! default 150 ms with failover, off otherwise), `ping_timeout` (silence
//! after which the node is dead, default 600 ms), `reconnect` (default on
//! with two or more addresses; `reconnect=true` retries a single node),
//! `reconnect_buffer` (publishes held while no node is reachable, default
//! 1 MiB; 0 refuses them), `connect_timeout` (per attempt, default 1 s),
//! `spin_us` (poll the connection up to this many µs after a read before
//! the runtime sleeps, default 100, 0: off; see [`crate::spin`] and
//! `docs/node.md`).
//! Calls in flight on a lost node fail with [`Error::NodeLost`]; see the
//! [`ClientEvent`] and [`Gap`] documentation for the rest.

mod cluster;
pub mod embed;
mod failover;
mod file;
mod inbox;
mod link;
// Not in the loom build, which leaves out the shm transport.
#[cfg(not(skiff_loom))]
mod shm_link;
mod sub;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use skiff_proto::client_frame::{req_flags, ClientFrame, ServerFrame, ASYNC_ERROR};
use skiff_proto::router::{KindPattern, Pattern, Subject};
use skiff_proto::{Message, WireError};
use tokio::sync::{mpsc, oneshot};

pub use cluster::{Incoming, Member, Request, Target, Tunnel};
pub use embed::{LocalLink, LocalNode, LocalOutbox, Refusal};
pub use failover::{ClientEvent, Events, Gap, LinkStats};
pub use file::FileLog;
pub use skiff_proto::client_frame::{Code, Policy};
pub use skiff_proto::stats::NodeStats;
pub use sub::{Delivery, SubOptions, Subscription, SubscriptionHandle};

use crate::Error;
use failover::Listeners;
use inbox::Shared;
use link::{Link, StreamTx};

/// Node names kept per link session, to name the node in errors about
/// stale replies.
const NODES_KEPT: usize = 16;

/// What the dispatcher hands a waiting call.
#[derive(Debug)]
enum Answer {
    Ack,
    Tunnel(Tunnel),
    Stats(String),
}

/// What a request hears.
#[derive(Debug)]
enum ReqEvent {
    Reply(Message),
    Done(Code),
    /// The node it was sent to was lost.
    Lost(String),
}

/// A subscription as the client registered it (to restore it elsewhere).
#[derive(Debug)]
struct SubEntry {
    inbox: Shared<Delivery>,
    pattern: String,
    kind: String,
    opts: SubOptions,
    /// The node acknowledged it (one still in flight is not restored: its
    /// call fails instead).
    live: bool,
}

/// A cluster membership as the client registered it.
#[derive(Debug)]
struct MemberEntry {
    inbox: Shared<Incoming>,
    /// Set once a node acknowledged the join.
    capacity: Option<u32>,
}

#[derive(Debug, Default)]
struct State {
    subs: FxHashMap<u64, SubEntry>,
    waiters: FxHashMap<u64, oneshot::Sender<Result<Answer, Error>>>,
    requests: FxHashMap<u64, mpsc::UnboundedSender<ReqEvent>>,
    members: FxHashMap<String, MemberEntry>,
    /// Joins sent and not yet answered: corr → (cluster, capacity).
    joins: FxHashMap<u64, (String, u32)>,
    tunnels: FxHashMap<u64, Arc<cluster::TunShared>>,
    /// The node connected to (`None` while failing over or in process).
    node: Option<String>,
    /// The node of each recent link session (epoch, node).
    nodes: Vec<(u32, String)>,
    /// A restore sent to a new node: the `corr` of the ping that ends it
    /// and the gap to report once it is answered.
    restoring: Option<(u64, Gap)>,
    failovers: u64,
    listeners: Listeners,
    /// Why the node closed this client.
    fatal: Option<String>,
    /// Errors about publishes, which have no call to return them to.
    async_errors: u64,
    last_async_error: Option<String>,
}

#[derive(Debug)]
enum Backend {
    Node,
    File(FileLog),
}

/// Shared by a [`Client`] and every handle made from it.
#[derive(Debug)]
pub(crate) struct Inner {
    link: Option<Link>,
    backend: Backend,
    state: Mutex<State>,
    /// Set once `state.fatal` is (so a publish need not take the lock).
    failed: AtomicBool,
    next: AtomicU64,
    max_payload: AtomicUsize,
    id: AtomicU64,
    /// The link session: bumped each time the node is lost, so that
    /// node-scoped ids (reply tokens, tunnels) from a lost node are never
    /// sent to the next one.
    epoch: AtomicU32,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(l) = &self.link {
            l.close();
        }
        self.state.get_mut().listeners.emit(ClientEvent::Closed {
            reason: "the client was dropped".into(),
        });
    }
}

/// A connection to a skiff node; cheap to clone (clones share it). See
/// the module documentation.
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl Client {
    /// Connects to a node named by a locator (see the module
    /// documentation). Needs a tokio runtime.
    pub async fn connect(locator: &str) -> Result<Client, Error> {
        let (scheme, rest) = locator
            .split_once("://")
            .ok_or_else(|| crate::LocatorError::NoScheme(locator.into()))?;
        let rest = rest.split('?').next().unwrap_or("");
        match scheme {
            "mem" => Client::attach(&*embed::node(rest).ok_or(crate::LocatorError::NoLocalNode)?),
            "skiff" | "tcp" | "unix" => {
                let target = failover::parse_target(locator)?;
                let mut last = None;
                for (at, addr) in target.addrs.iter().enumerate() {
                    match link::open(addr, at, target.opts.connect_timeout).await {
                        Ok(s) => return Ok(Client::over_stream(s, target)),
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.unwrap_or(Error::Closed))
            }
            #[cfg(not(skiff_loom))]
            "shm" => shm_link::connect(locator).await,
            "file" => Ok(Client {
                inner: Inner::new(None, Backend::File(FileLog::open(rest)?), usize::MAX, 0),
            }),
            other => Err(crate::LocatorError::Scheme {
                scheme: other.into(),
                accepted: "mem, skiff, tcp, unix, shm, file",
            }
            .into()),
        }
    }

    /// Attaches to a node running in this process (what `mem://` does with
    /// the process's embedded node).
    pub fn attach(node: &dyn LocalNode) -> Result<Client, Error> {
        let link = node.attach().map_err(|f| Error::Refused {
            code: f.code,
            reason: f.text,
        })?;
        // The Welcome is the first frame in the outbox.
        let mut first = Vec::new();
        let out = link.outbox();
        out.take(&mut first);
        let (id, max_payload) = match first.first() {
            Some(ServerFrame::Welcome {
                client,
                max_payload,
            }) => (*client, *max_payload),
            _ => (link.id(), link.max_payload() as u64),
        };
        let inner = Inner::new(
            Some(Link::Mem(link)),
            Backend::Node,
            max_payload as usize,
            id,
        );
        link::spawn_mem(&inner);
        Ok(Client { inner })
    }

    fn over_stream(s: link::Session, target: failover::NodeTarget) -> Client {
        let tx = Arc::new(StreamTx::new(target.opts.reconnect_buffer));
        let inner = Inner::new(
            Some(Link::Stream(tx.clone())),
            Backend::Node,
            s.max_payload as usize,
            s.client,
        );
        {
            let node = target.addrs[s.at].to_string();
            let mut st = inner.state.lock();
            st.nodes.push((0, node.clone()));
            st.node = Some(node);
        }
        link::spawn_stream(&inner, tx, target, s);
        Client { inner }
    }

    /// The node's id for this client (a new one after each failover).
    pub fn id(&self) -> u64 {
        self.inner.id.load(Ordering::Relaxed)
    }

    /// Largest payload the node accepts.
    pub fn max_payload(&self) -> usize {
        self.inner.max_payload.load(Ordering::Relaxed)
    }

    /// Errors the node reported about publishes (which return before the
    /// node sees them): how many, and the last one.
    pub fn async_errors(&self) -> (u64, Option<String>) {
        let st = self.inner.state.lock();
        (st.async_errors, st.last_async_error.clone())
    }

    fn check(&self, msg: &Message) -> Result<(), Error> {
        skiff_proto::wire::check(msg)?;
        let max = self.inner.max_payload.load(Ordering::Relaxed);
        if msg.payload.len() > max {
            return Err(Error::Refused {
                code: Code::Limit,
                reason: format!(
                    "payload of {} bytes is over the node's limit of {max} (max_payload)",
                    msg.payload.len(),
                ),
            });
        }
        Ok(())
    }

    /// Publishes `msg` on its subject. Returns once the message is handed
    /// to the node (in process: routed); waits while a `block` subscriber
    /// or the connection pushes back. While a failover list has no node
    /// the message is held (see the module documentation) or, when the
    /// buffer is full, refused with [`Error::NodeLost`].
    pub async fn publish(&self, msg: Message) -> Result<(), Error> {
        Subject::new(&msg.subject)?;
        if let Backend::File(f) = &self.inner.backend {
            return f.append(&msg);
        }
        self.check(&msg)?;
        // Most publishes fit in the write buffer at once: encode there by
        // reference, with no future to move the message into.
        if let Some(r) = self.inner.try_publish(&msg) {
            return r;
        }
        self.inner.send(ClientFrame::Pub(msg)).await
    }

    /// Subscribes to subjects matching `pattern` with types matching
    /// `kind` (`*` for any), with the default [`SubOptions`].
    pub async fn subscribe(&self, pattern: &str, kind: &str) -> Result<Subscription, Error> {
        self.subscribe_with(pattern, kind, SubOptions::default())
            .await
    }

    /// Subscribes with options (queue bound, policy, window). Returns once
    /// the node holds the interest.
    pub async fn subscribe_with(
        &self,
        pattern: &str,
        kind: &str,
        opts: SubOptions,
    ) -> Result<Subscription, Error> {
        Pattern::new(pattern)?;
        KindPattern::new(kind)?;
        if let Backend::File(f) = &self.inner.backend {
            return f.subscribe(self.inner.clone(), pattern, kind);
        }
        let sid = self.inner.next_id();
        let inbox = inbox::shared();
        let rx = {
            let mut st = self.inner.state.lock();
            if let Some(e) = &st.fatal {
                return Err(Error::Refused {
                    code: Code::Shutdown,
                    reason: e.clone(),
                });
            }
            st.subs.insert(
                sid,
                SubEntry {
                    inbox: inbox.clone(),
                    pattern: pattern.into(),
                    kind: kind.into(),
                    opts,
                    live: false,
                },
            );
            self.inner.waiter(&mut st, sid)
        };
        let window = opts.window.max(1);
        let r = self
            .inner
            .call(
                rx,
                ClientFrame::Sub {
                    sid,
                    pattern: pattern.into(),
                    kind: kind.into(),
                    policy: opts.policy,
                    queue: opts.queue.max(1),
                    credit: window,
                },
            )
            .await;
        if let Err(e) = r {
            self.inner.state.lock().subs.remove(&sid);
            return Err(e);
        }
        Ok(Subscription::new(self.inner.clone(), sid, inbox, window))
    }

    /// Subscribes and calls `f` for each message on a task of its own (the
    /// callback form); the handle pauses, resumes and ends it.
    pub async fn subscribe_fn<F>(
        &self,
        pattern: &str,
        kind: &str,
        opts: SubOptions,
        f: F,
    ) -> Result<SubscriptionHandle, Error>
    where
        F: FnMut(Delivery) + Send + 'static,
    {
        let sub = self.subscribe_with(pattern, kind, opts).await?;
        Ok(SubscriptionHandle::spawn(sub, f))
    }

    /// Answers a request received on a subscription (a [`Delivery`] with
    /// [`Delivery::is_request`]). A reply to a request that is no longer
    /// waited for is dropped by the node.
    pub async fn reply(&self, to: &Delivery, msg: Message) -> Result<(), Error> {
        let token = to.token.ok_or(Error::Refused {
            code: Code::Invalid,
            reason: "this message is not a request; there is nobody to reply to".into(),
        })?;
        self.inner.reply(token, to.epoch, msg).await
    }

    /// Sends a request and waits for the first reply: to every subscription
    /// matching a subject (`"svc.echo"`), or to one member of a cluster
    /// ([`Target::cluster`]). [`Error::NoResponders`] comes at once when
    /// nobody could answer; [`Error::Timeout`] after `timeout`;
    /// [`Error::NodeLost`] at once if the node is lost meanwhile (the
    /// request may or may not have been handled).
    pub async fn request(
        &self,
        target: impl Into<Target>,
        msg: Message,
        timeout: Duration,
    ) -> Result<Message, Error> {
        let mut v = self.request_inner(target.into(), msg, timeout, 1).await?;
        v.pop().ok_or(Error::Timeout)
    }

    /// Scatter-gather: sends to every matching subscription (or every
    /// member of a cluster) and collects replies until `max` arrived, every
    /// responder answered, or `timeout` passed. An empty result means
    /// nobody answered in time; [`Error::NoResponders`] means nobody could.
    pub async fn request_many(
        &self,
        target: impl Into<Target>,
        msg: Message,
        timeout: Duration,
        max: usize,
    ) -> Result<Vec<Message>, Error> {
        let max = max.clamp(1, u32::MAX as usize) as u32;
        self.request_inner(target.into(), msg, timeout, max).await
    }

    async fn request_inner(
        &self,
        target: Target,
        msg: Message,
        timeout: Duration,
        max: u32,
    ) -> Result<Vec<Message>, Error> {
        self.check(&msg)?;
        let (name, key, mut flags) = match &target {
            Target::Subject(s) => {
                Subject::new(s)?;
                (s.clone(), Bytes::new(), 0)
            }
            Target::Cluster { name, key } => (
                name.clone(),
                key.clone().unwrap_or_default(),
                req_flags::CLUSTER,
            ),
        };
        if max > 1 {
            flags |= req_flags::MANY;
        }
        let rid = self.inner.next_id();
        let (tx, mut rx) = mpsc::unbounded_channel();
        self.inner.state.lock().requests.insert(rid, tx);
        let sent = self
            .inner
            .send(ClientFrame::Req {
                rid,
                flags,
                max,
                target: name.clone(),
                key,
                msg,
            })
            .await;
        if let Err(e) = sent {
            self.inner.state.lock().requests.remove(&rid);
            return Err(e);
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut replies = Vec::new();
        let mut finished = false;
        let outcome = loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(ReqEvent::Reply(m))) => {
                    replies.push(m);
                    if replies.len() >= max as usize {
                        finished = true;
                        break Ok(());
                    }
                }
                Ok(Some(ReqEvent::Done(Code::NoResponders))) if replies.is_empty() => {
                    finished = true;
                    break Err(Error::NoResponders { target: name });
                }
                Ok(Some(ReqEvent::Done(_))) => {
                    finished = true;
                    break Ok(());
                }
                Ok(Some(ReqEvent::Lost(node))) => {
                    finished = true;
                    break Err(Error::NodeLost { node });
                }
                Ok(None) => {
                    finished = true;
                    break Err(self.inner.closed_error());
                }
                Err(_) => break Ok(()),
            }
        };
        self.inner.state.lock().requests.remove(&rid);
        if !finished {
            let _ = self.inner.send_now(ClientFrame::Cancel { rid });
        }
        outcome?;
        if replies.is_empty() && max == 1 {
            return Err(Error::Timeout);
        }
        Ok(replies)
    }

    /// Joins `cluster` with `capacity` (its share of requests; 0: only
    /// broadcasts). Requests, broadcasts and tunnels for this member arrive
    /// on the returned [`Member`].
    pub async fn join(&self, cluster: &str, capacity: u32) -> Result<Member, Error> {
        Subject::new(cluster)?;
        let corr = self.inner.next_id();
        let (inbox, rx) = {
            let mut st = self.inner.state.lock();
            let inbox = st
                .members
                .entry(cluster.to_owned())
                .or_insert_with(|| MemberEntry {
                    inbox: inbox::shared(),
                    capacity: None,
                })
                .inbox
                .clone();
            st.joins.insert(corr, (cluster.to_owned(), capacity));
            (inbox, self.inner.waiter(&mut st, corr))
        };
        let r = self
            .inner
            .call(
                rx,
                ClientFrame::Join {
                    corr,
                    cluster: cluster.into(),
                    capacity,
                },
            )
            .await;
        if let Err(e) = r {
            let mut st = self.inner.state.lock();
            st.joins.remove(&corr);
            if st
                .members
                .get(cluster)
                .is_some_and(|m| m.capacity.is_none())
            {
                st.members.remove(cluster);
            }
            return Err(e);
        }
        Ok(Member::new(self.inner.clone(), cluster.into(), inbox))
    }

    /// Sends `msg` to every member of `cluster`, at most once each.
    pub async fn broadcast(&self, cluster: &str, msg: Message) -> Result<(), Error> {
        self.check(&msg)?;
        self.inner
            .send(ClientFrame::Bcast {
                cluster: cluster.into(),
                msg,
            })
            .await
    }

    /// Opens a tunnel to one member of `cluster` (chosen like a request's;
    /// `key` for affinity), waiting at most `timeout`.
    pub async fn tunnel(
        &self,
        cluster: impl Into<Target>,
        timeout: Duration,
    ) -> Result<Tunnel, Error> {
        let (name, key) = match cluster.into() {
            Target::Subject(s) => (s, Bytes::new()),
            Target::Cluster { name, key } => (name, key.unwrap_or_default()),
        };
        let corr = self.inner.next_id();
        let rx = self.inner.waiter(&mut self.inner.state.lock(), corr);
        let frame = ClientFrame::TunOpen {
            corr,
            cluster: name.clone(),
            key,
            window: cluster::TUNNEL_WINDOW,
        };
        match tokio::time::timeout(timeout, self.inner.call(rx, frame)).await {
            Ok(Ok(Answer::Tunnel(t))) => Ok(t),
            Ok(Ok(_)) => Err(Error::Codec("unexpected answer to a tunnel".into())),
            Ok(Err(Error::Refused {
                code: Code::NoResponders,
                ..
            })) => Err(Error::NoResponders { target: name }),
            Ok(Err(e)) => Err(e),
            Err(_) => {
                self.inner.state.lock().waiters.remove(&corr);
                Err(Error::Timeout)
            }
        }
    }

    /// The node's counters: per node, client and subscription.
    pub async fn stats(&self) -> Result<NodeStats, Error> {
        let json = self.stats_json().await?;
        serde_json::from_str(&json).map_err(|e| Error::Codec(format!("stats: {e}")))
    }

    /// The node's counters as JSON text.
    pub async fn stats_json(&self) -> Result<String, Error> {
        let corr = self.inner.next_id();
        let rx = self.inner.waiter(&mut self.inner.state.lock(), corr);
        match self.inner.call(rx, ClientFrame::Stats { corr }).await? {
            Answer::Stats(s) => Ok(s),
            _ => Err(Error::Codec("unexpected answer to stats".into())),
        }
    }

    /// Waits until the node has handled everything this client sent before.
    pub async fn flush(&self) -> Result<(), Error> {
        if self.inner.link.is_none() {
            return Ok(());
        }
        let corr = self.inner.next_id();
        let rx = self.inner.waiter(&mut self.inner.state.lock(), corr);
        self.inner
            .call(rx, ClientFrame::Ping { corr })
            .await
            .map(|_| ())
    }

    /// Closes the connection now (dropping every clone does the same).
    pub fn close(&self) {
        if let Some(l) = &self.inner.link {
            l.close();
        }
    }
}

impl Inner {
    fn new(link: Option<Link>, backend: Backend, max_payload: usize, id: u64) -> Arc<Inner> {
        Arc::new(Inner {
            link,
            backend,
            state: Mutex::new(State::default()),
            failed: AtomicBool::new(false),
            next: AtomicU64::new(1),
            max_payload: AtomicUsize::new(max_payload),
            id: AtomicU64::new(id),
            epoch: AtomicU32::new(0),
        })
    }

    fn next_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// The current link session (see [`Inner::epoch`]'s field).
    pub(crate) fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The node of link session `epoch`, for errors.
    fn node_of(&self, epoch: u32) -> String {
        let st = self.state.lock();
        st.nodes
            .iter()
            .find(|(e, _)| *e == epoch)
            .map(|(_, n)| n.clone())
            .unwrap_or_else(|| "(an earlier node)".into())
    }

    fn link(&self) -> Result<&Link, Error> {
        self.link.as_ref().ok_or(Error::Refused {
            code: Code::Invalid,
            reason: "a file:// log supports publish and subscribe only".into(),
        })
    }

    pub(crate) async fn send(&self, f: ClientFrame) -> Result<(), Error> {
        if self.failed.load(Ordering::Acquire) {
            if let Some(e) = &self.state.lock().fatal {
                return Err(Error::Refused {
                    code: Code::Shutdown,
                    reason: e.clone(),
                });
            }
        }
        self.link()?.send(f).await
    }

    /// Publishes at once if that needs no wait; `None` otherwise (send
    /// the frame).
    fn try_publish(&self, msg: &Message) -> Option<Result<(), Error>> {
        if self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.link.as_ref()?.try_publish(msg)
    }

    pub(crate) fn send_now(&self, f: ClientFrame) -> Result<(), Error> {
        self.link()?.send_now(f)
    }

    /// Replies to a request that came in link session `epoch`; a token of
    /// a lost node is never sent (it could name another request on the
    /// next node).
    pub(crate) async fn reply(&self, token: u64, epoch: u32, msg: Message) -> Result<(), Error> {
        skiff_proto::wire::check(&msg)?;
        if epoch != self.epoch() {
            return Err(Error::NodeLost {
                node: self.node_of(epoch),
            });
        }
        self.send(ClientFrame::Reply { token, msg }).await
    }

    fn waiter(&self, st: &mut State, corr: u64) -> oneshot::Receiver<Result<Answer, Error>> {
        let (tx, rx) = oneshot::channel();
        st.waiters.insert(corr, tx);
        rx
    }

    async fn call(
        &self,
        rx: oneshot::Receiver<Result<Answer, Error>>,
        f: ClientFrame,
    ) -> Result<Answer, Error> {
        self.send(f).await?;
        match rx.await {
            Ok(r) => r,
            Err(_) => Err(self.closed_error()),
        }
    }

    fn closed_error(&self) -> Error {
        match &self.state.lock().fatal {
            Some(e) => Error::Refused {
                code: Code::Shutdown,
                reason: e.clone(),
            },
            None => Error::Closed,
        }
    }

    /// The node closed this client: everything waiting learns why.
    pub(crate) fn fail(&self, why: String) {
        {
            let mut st = self.state.lock();
            if st.fatal.is_none() {
                st.fatal = Some(why.clone());
                self.failed.store(true, Ordering::Release);
            }
        }
        self.shut(Some(why));
    }

    /// The client is closed for good, by the node (`why`) or the
    /// application (`None`): everything waiting ends.
    pub(crate) fn shut(&self, why: Option<String>) {
        let mut st = self.state.lock();
        let err = || match &why {
            Some(w) => Error::Refused {
                code: Code::Shutdown,
                reason: w.clone(),
            },
            None => Error::Closed,
        };
        for (_, s) in st.subs.drain() {
            s.inbox.lock().close(why.clone());
        }
        for (_, m) in st.members.drain() {
            m.inbox.lock().close(why.clone());
        }
        for (_, t) in st.tunnels.drain() {
            t.close_local();
        }
        for (_, w) in st.waiters.drain() {
            let _ = w.send(Err(err()));
        }
        st.requests.clear();
        st.joins.clear();
        st.node = None;
        st.restoring = None;
        st.listeners.emit(ClientEvent::Closed {
            reason: why.unwrap_or_else(|| "closed by the application".into()),
        });
    }

    /// Routes frames from the node to the calls and handles waiting for
    /// them. Returns the node's error if it closed this client (the caller
    /// fails the client or, for a shutdown, fails over).
    ///
    /// (Batched: see `flush_run`.)
    #[must_use]
    pub(crate) fn dispatch(
        self: &Arc<Self>,
        frames: impl IntoIterator<Item = ServerFrame>,
    ) -> Option<(Code, String)> {
        let mut bad = None;
        let fatal = self.dispatch_inbound(frames, &mut bad);
        debug_assert!(bad.is_none(), "decoded frames cannot be malformed");
        fatal
    }

    /// [`Inner::dispatch`] for frames still to be decoded (see
    /// [`Inbound`]): a message is decoded straight into its
    /// subscription's queue. Stops at the first frame that does not
    /// decode and leaves its error in `bad`; nothing after it is
    /// delivered.
    #[must_use]
    pub(crate) fn dispatch_inbound<I: Inbound>(
        self: &Arc<Self>,
        frames: impl IntoIterator<Item = I>,
        bad: &mut Option<WireError>,
    ) -> Option<(Code, String)> {
        let mut fatal = None;
        let epoch = self.epoch();
        {
            let mut st = self.state.lock();
            let st = &mut *st;
            // Consecutive messages for one subscription go straight into
            // its inbox under one lock, with one wake-up.
            let mut run: Option<Run> = None;
            for item in frames {
                if let Some((sid, token)) = item.msg() {
                    if run.as_ref().map(|r| r.sid) != Some(sid) {
                        end_run(run.take());
                        run = Some(Run {
                            sid,
                            inbox: st.subs.get(&sid).map(|s| s.inbox.lock_arc()),
                            pushed: false,
                        });
                    }
                    let r = run.as_mut().expect("set");
                    let token = (token != 0).then_some(token);
                    let filled = match &mut r.inbox {
                        Some(i) => {
                            // Decoded in place: the 200-byte delivery is
                            // not moved from frame to queue.
                            i.q.push_back(Delivery::new(Message::default(), token, epoch));
                            let i = &mut **i;
                            let d = i.q.back_mut().expect("just pushed");
                            match item.fill(&mut d.msg) {
                                Ok(()) => {
                                    d.gap = i.pending_gap.take();
                                    r.pushed = true;
                                    Ok(())
                                }
                                Err(e) => {
                                    i.q.pop_back();
                                    Err(e)
                                }
                            }
                        }
                        // Checked all the same: a bad frame is bad for
                        // a subscription that has ended too.
                        None => item.fill(&mut Message::default()),
                    };
                    if let Err(e) = filled {
                        *bad = Some(e);
                        break;
                    }
                    continue;
                }
                end_run(run.take());
                let f = match item.frame() {
                    Ok(f) => f,
                    Err(e) => {
                        *bad = Some(e);
                        break;
                    }
                };
                match f {
                    // Taken above (`item.msg()`): a frame that decodes to a
                    // message here cannot occur, and is ignored, not a panic.
                    ServerFrame::Msg { .. } => {}
                    ServerFrame::Dropped { sid, total } => {
                        if let Some(s) = st.subs.get(&sid) {
                            let mut i = s.inbox.lock();
                            i.dropped = i.dropped_base + total;
                        }
                    }
                    ServerFrame::Ack { corr } => {
                        if let Some(s) = st.subs.get_mut(&corr) {
                            s.live = true;
                        }
                        if let Some((cluster, capacity)) = st.joins.remove(&corr) {
                            if let Some(m) = st.members.get_mut(&cluster) {
                                m.capacity = Some(capacity);
                            }
                        }
                        if let Some(w) = st.waiters.remove(&corr) {
                            let _ = w.send(Ok(Answer::Ack));
                        }
                    }
                    ServerFrame::Pong { corr } => {
                        if let Some(w) = st.waiters.remove(&corr) {
                            let _ = w.send(Ok(Answer::Ack));
                        } else if st.restoring.as_ref().is_some_and(|(c, _)| *c == corr) {
                            // The new node holds everything restored.
                            let (_, gap) = st.restoring.take().expect("checked");
                            st.failovers += 1;
                            st.listeners.emit(ClientEvent::Reconnected(gap));
                        }
                    }
                    ServerFrame::Error {
                        corr: 0,
                        code,
                        text,
                    } => fatal = Some((code, text)),
                    ServerFrame::Error {
                        corr: ASYNC_ERROR,
                        text,
                        ..
                    } => {
                        st.async_errors += 1;
                        st.last_async_error = Some(text);
                    }
                    ServerFrame::Error { corr, code, text } => {
                        let join = st.joins.remove(&corr);
                        if let Some(w) = st.waiters.remove(&corr) {
                            let _ = w.send(Err(Error::Refused { code, reason: text }));
                        } else if let Some(s) = st.subs.remove(&corr) {
                            // A subscription restored after a failover.
                            s.inbox.lock().close(Some(format!(
                                "the node refused to restore this subscription after a failover: {text}"
                            )));
                        } else if let Some(m) = join.and_then(|(c, _)| st.members.remove(&c)) {
                            m.inbox.lock().close(Some(format!(
                                "the node refused to restore this membership after a failover: {text}"
                            )));
                        }
                    }
                    ServerFrame::Reply { rid, msg } => {
                        if let Some(r) = st.requests.get(&rid) {
                            let _ = r.send(ReqEvent::Reply(msg));
                        }
                    }
                    ServerFrame::ReqDone { rid, code } => {
                        if let Some(r) = st.requests.get(&rid) {
                            let _ = r.send(ReqEvent::Done(code));
                        }
                    }
                    ServerFrame::Request {
                        token,
                        cluster,
                        msg,
                    } => {
                        if let Some(m) = st.members.get(&cluster) {
                            m.inbox.lock().push(Incoming::Request(Request::new(
                                self.clone(),
                                token,
                                epoch,
                                msg,
                            )));
                        }
                    }
                    ServerFrame::Bcast { cluster, msg } => {
                        if let Some(m) = st.members.get(&cluster) {
                            m.inbox.lock().push(Incoming::Broadcast(msg));
                        }
                    }
                    ServerFrame::TunIncoming {
                        tunnel,
                        cluster,
                        window,
                    } => {
                        let (t, shared) = Tunnel::new(self.clone(), tunnel, epoch, window);
                        st.tunnels.insert(tunnel, shared);
                        match st.members.get(&cluster) {
                            Some(m) => m.inbox.lock().push(Incoming::Tunnel(t)),
                            None => drop(t),
                        }
                    }
                    ServerFrame::TunOpened {
                        corr,
                        tunnel,
                        window,
                    } => {
                        let (t, shared) = Tunnel::new(self.clone(), tunnel, epoch, window);
                        st.tunnels.insert(tunnel, shared);
                        match st.waiters.remove(&corr) {
                            Some(w) => {
                                let _ = w.send(Ok(Answer::Tunnel(t)));
                            }
                            None => drop(t),
                        }
                    }
                    ServerFrame::TunData { tunnel, msg } => {
                        if let Some(t) = st.tunnels.get(&tunnel) {
                            t.data(msg);
                        }
                    }
                    ServerFrame::TunCredit { tunnel, n } => {
                        if let Some(t) = st.tunnels.get(&tunnel) {
                            t.credit(n);
                        }
                    }
                    ServerFrame::TunClose { tunnel } => {
                        if let Some(t) = st.tunnels.remove(&tunnel) {
                            t.close_local();
                        }
                    }
                    ServerFrame::Stats { corr, json } => {
                        if let Some(w) = st.waiters.remove(&corr) {
                            let _ = w.send(Ok(Answer::Stats(json)));
                        }
                    }
                    ServerFrame::Welcome { .. } => {}
                }
            }
            end_run(run);
        }
        fatal
    }

    pub(crate) fn forget_sub(&self, sid: u64) {
        self.state.lock().subs.remove(&sid);
    }

    pub(crate) fn forget_tunnel(&self, tunnel: u64) {
        self.state.lock().tunnels.remove(&tunnel);
    }

    pub(crate) fn forget_member(&self, cluster: &str) {
        self.state.lock().members.remove(cluster);
    }
}

/// A frame from the node as the client receives it: decoded already (an
/// in-process or shared-memory node hands over [`ServerFrame`]s), or still
/// bytes ([`RawFrame`], from a socket), whose message is then decoded
/// straight into the subscription's queue.
pub(crate) trait Inbound {
    /// A message frame's subscription and reply token (0: none).
    fn msg(&self) -> Option<(u64, u64)>;
    /// Puts a message frame's message into `out`.
    fn fill(self, out: &mut Message) -> Result<(), WireError>;
    /// Any other frame, decoded.
    fn frame(self) -> Result<ServerFrame, WireError>;
}

impl Inbound for ServerFrame {
    fn msg(&self) -> Option<(u64, u64)> {
        match self {
            ServerFrame::Msg { sid, token, .. } => Some((*sid, *token)),
            _ => None,
        }
    }
    fn fill(self, out: &mut Message) -> Result<(), WireError> {
        if let ServerFrame::Msg { msg, .. } = self {
            *out = msg;
        }
        Ok(())
    }
    fn frame(self) -> Result<ServerFrame, WireError> {
        Ok(self)
    }
}

/// A frame body read from a socket, not decoded yet.
pub(crate) struct RawFrame {
    body: Bytes,
    max_payload: usize,
    /// A message frame's subscription, token and where its message starts.
    msg: Option<(u64, u64, usize)>,
}

impl RawFrame {
    /// Reads what kind of frame `body` is (for a message frame, its
    /// subscription and token; the message itself waits for `fill`).
    pub(crate) fn new(body: Bytes, max_payload: usize) -> Result<RawFrame, WireError> {
        Ok(RawFrame {
            msg: ServerFrame::msg_header(&body)?,
            body,
            max_payload,
        })
    }
}

impl Inbound for RawFrame {
    fn msg(&self) -> Option<(u64, u64)> {
        self.msg.map(|(sid, token, _)| (sid, token))
    }
    fn fill(self, out: &mut Message) -> Result<(), WireError> {
        let at = self.msg.map_or(0, |(_, _, at)| at);
        skiff_proto::wire::decode_message_into(&self.body, at, self.max_payload, out)
    }
    fn frame(self) -> Result<ServerFrame, WireError> {
        ServerFrame::decode(self.body, self.max_payload)
    }
}

/// Messages for one subscription being put into its inbox: its lock is
/// held for the run.
struct Run {
    sid: u64,
    inbox: Option<parking_lot::ArcMutexGuard<parking_lot::RawMutex, inbox::Inbox<Delivery>>>,
    pushed: bool,
}

/// Ends a run: wakes the subscription once, and releases its inbox.
fn end_run(run: Option<Run>) {
    if let Some(Run {
        inbox: Some(mut i),
        pushed: true,
        ..
    }) = run
    {
        i.wake();
    }
}
