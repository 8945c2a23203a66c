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
//! - `tls://host:port[,host:port…]?ca=FILE[&cert=FILE&key=FILE]`: a node
//!   over TLS 1.3 (rustls), trusting the CA in `ca` (else the system's
//!   roots); `cert` and `key` (PEM) present a client certificate to a node
//!   that requires one (mutual TLS). `tls_key=` names the TLS key
//!   explicitly.
//! - Credentials, on any of these, when the node asks for them:
//!   `?token=…`, `?user=…&password=…`, or `?key=FILE` (an Ed25519 private
//!   key, `skiff keygen`; it signs the node's nonce, so no secret crosses
//!   the wire; `auth_key=` names it explicitly). `%XX` escapes are decoded
//!   in token, user and password. They never appear in errors or `Debug`.
//! - `shm://name[?dir=…&ring=4M&spin=20us]`: a node on this host over
//!   shared memory (`skiff node --shm name`; the node's socket and the
//!   rings' files are under `dir/name/`, `dir` as for [`crate::shm`]).
//!   Publishes are written once into the client's ring and reach the
//!   node's subscribers as slices of it (see `docs/shm.md`). A list
//!   (`shm://a,b?dir=…`, or shm then others: `shm://a,skiff://host:4747`)
//!   or `reconnect=true` fails over as `skiff://` does, over the rings.
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
//! 1 MiB; 0 refuses them), `connect_timeout` (per attempt, default
//! [`DEFAULT_CONNECT_TIMEOUT`], 1.5 s),
//! `spin_us` (poll the connection up to this many µs after a read before
//! the runtime sleeps, default 100, 0: off; see [`crate::spin`] and
//! `docs/node.md`).
//! Calls in flight on a lost node fail with [`Error::NodeLost`]; see the
//! [`ClientEvent`] and [`Gap`] documentation for the rest.

//! Layout (each module uses only those listed after it, and this one):
//! `failover` (the stream link's driver: reconnect, restore, events) ·
//! `link` (the transport seam: in process, stream, shared memory) ·
//! `stream`, `shm_link` (the transports) · `dispatch` (the node's frames
//! to the calls, subscriptions, members and tunnels waiting for them) ·
//! `request`, `file`, `sub`, `cluster` (the calls and handles of each
//! pattern) · `events` · `inbox` · `embed` (the in-process node's seam),
//! `status`, `target` (plain values).

mod cluster;
mod dispatch;
pub mod embed;
mod events;
mod failover;
mod file;
#[cfg(not(skiff_loom))]
mod in_place;
mod inbox;
mod link;
mod publisher;
mod request;
// Not in the loom build, which leaves out the shm transport.
#[cfg(not(skiff_loom))]
mod shm_link;
#[cfg(not(skiff_loom))]
mod shm_stream;
#[cfg(not(skiff_loom))]
mod shm_topic;
mod status;
mod stream;
mod sub;
mod target;
mod tunnel_write;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use skiff_proto::client_frame::{ClientFrame, ServerFrame};
use skiff_proto::router::Subject;
use skiff_proto::stats::StatsCursor;
use skiff_proto::Message;
use tokio::sync::{mpsc, oneshot};

pub use cluster::{Incoming, Member, Request, Target, Tunnel, TunnelSender};
pub use embed::{LocalLink, LocalNode, LocalOutbox, Refusal};
pub use events::Events;
pub use file::FileLog;
#[cfg(not(skiff_loom))]
pub use in_place::{ReplyToken, TopicMessage, TopicReader};
pub use publisher::Publisher;
pub use skiff_proto::client_frame::{Code, Policy};
pub use skiff_proto::router::Syntax;
pub use skiff_proto::stats::NodeStats;
pub use skiff_proto::wire::MessageRef;
pub use status::{ClientEvent, Gap, LinkStats, Unconfirmed};
pub use sub::{Delivery, QueueGroup, SubOptions, Subscription, SubscriptionHandle};
pub use target::DEFAULT_CONNECT_TIMEOUT;

use crate::Error;
use events::Listeners;
use inbox::Shared;
use link::Link;
use request::ReqEvent;
use stream::StreamTx;

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
    /// Held by the client-wide stop ([`Client::stop`]).
    gated: bool,
    /// A shared-buffer subscription of a client that fails over: the
    /// generation of its topic reader (bumped when the node is lost, which
    /// stops the reader of the old node's topic; see `shm_topic`).
    topic: Option<Arc<AtomicU64>>,
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
    fatal: Option<(Code, String)>,
    /// Delivery is stopped client-wide ([`Client::stop`]).
    stopped: bool,
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

/// What a client says about itself beyond its locator
/// ([`Client::connect_with`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientOptions {
    /// The name the node shows for this client (`/connz`, `skiff stats`,
    /// `skiff top`): at most 128 bytes, no control characters. Over a
    /// stream it is sent again after each failover.
    pub name: Option<String>,
}

impl ClientOptions {
    /// No options: the locator's alone.
    pub fn new() -> ClientOptions {
        ClientOptions::default()
    }

    /// Names the client.
    pub fn name(mut self, name: impl Into<String>) -> ClientOptions {
        self.name = Some(name.into());
        self
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
        Client::connect_with(locator, ClientOptions::default()).await
    }

    /// Connects as [`Client::connect`] does, with `opts` (a name the node
    /// shows in its monitoring, over the locator's `name=`).
    pub async fn connect_with(locator: &str, opts: ClientOptions) -> Result<Client, Error> {
        let name = opts.name.as_deref().map(target::check_name).transpose()?;
        let c = Client::open(locator, name.clone()).await?;
        // A stream link sends `Hello` itself, on every connection.
        if let (Some(name), Some(Link::Mem(_))) = (&name, &c.inner.link) {
            c.inner
                .send_now(ClientFrame::Hello { name: name.clone() })?;
        }
        #[cfg(not(skiff_loom))]
        if let (Some(name), Some(Link::Shm(_))) = (&name, &c.inner.link) {
            c.inner
                .send_now(ClientFrame::Hello { name: name.clone() })?;
        }
        Ok(c)
    }

    /// Opens a stream link (with failover) to the first node of the
    /// locator's list that answers.
    async fn open_stream(locator: &str, name: Option<String>) -> Result<Client, Error> {
        let mut target = target::parse_target(locator)?;
        if name.is_some() {
            target.opts.name = name;
        }
        let mut last = None;
        for (at, addr) in target.addrs.iter().enumerate() {
            match stream::open(addr, at, &target.opts).await {
                Ok(s) => return Ok(Client::over_stream(s, target)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(Error::Closed))
    }

    async fn open(locator: &str, name: Option<String>) -> Result<Client, Error> {
        let (scheme, rest) = locator
            .split_once("://")
            .ok_or_else(|| crate::LocatorError::NoNodeScheme(locator.into()))?;
        let rest = rest.split('?').next().unwrap_or("");
        match scheme {
            "mem" => Client::attach(&*embed::node(rest).ok_or(crate::LocatorError::NoLocalNode)?),
            "skiff" | "tcp" | "unix" | "tls" => Client::open_stream(locator, name).await,
            // A list, or `reconnect=true`: the stream link's failover
            // over shm halves (see `shm_stream`).
            #[cfg(not(skiff_loom))]
            "shm" if fails_over(locator)? => Client::open_stream(locator, name).await,
            #[cfg(not(skiff_loom))]
            "shm" => {
                let a = shm_link::attach(locator).await?;
                let link = Link::Shm(a.tx());
                let inner = Inner::new(
                    Some(link),
                    Backend::Node,
                    a.max_payload() as usize,
                    a.client(),
                );
                inner.connected_to(locator.to_owned());
                a.start(&inner)?;
                Ok(Client { inner })
            }
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

    fn over_stream(s: stream::Session, target: target::NodeTarget) -> Client {
        let tx = Arc::new(StreamTx::new(
            target.opts.reconnect_buffer,
            target.opts.unconfirmed_buffer,
        ));
        if tx.confirms() {
            // Before any publish: the node confirms what it takes.
            let _ = tx.send_now(&ClientFrame::Confirm);
        }
        let inner = Inner::new(
            Some(Link::Stream(tx.clone())),
            Backend::Node,
            s.max_payload as usize,
            s.client,
        );
        inner.connected_to(target.addrs[s.at].to_string());
        failover::spawn_stream(&inner, tx, target, s);
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
        // A type is checked as a subscription's is: what no one could
        // subscribe to is refused, not delivered to `*`.
        if let Some(k) = &msg.kind {
            skiff_proto::router::check_kind(k)?;
        }
        self.publish_checked(msg).await
    }

    /// [`Client::publish`] once the subject and type are known good.
    async fn publish_checked(&self, msg: Message) -> Result<(), Error> {
        if let Backend::File(f) = &self.inner.backend {
            return f.append(&msg);
        }
        self.check(&msg)?;
        // Most publishes fit in the write buffer at once: encode there by
        // reference, with no future to move the message into.
        loop {
            if let Some(r) = self.inner.try_publish(&msg) {
                return r;
            }
            // Over shm, a ring with no room now: wait for it, then write
            // into it again (not behind a queue).
            match &self.inner.link {
                Some(l) if l.wait_room().await => {}
                _ => break,
            }
        }
        self.inner.send(ClientFrame::Pub(msg)).await
    }

    /// The node's counters: per node, client and subscription.
    pub async fn stats(&self) -> Result<NodeStats, Error> {
        let json = self.stats_json().await?;
        serde_json::from_str(&json).map_err(|e| Error::Codec(format!("stats: {e}")))
    }

    /// The node's counters as JSON text. A node sends big stats in pages
    /// (each within the frame bound, one in flight at a time): this asks
    /// for each page after the last and joins them into one document, up
    /// to [`MAX_STATS_BYTES`].
    pub async fn stats_json(&self) -> Result<String, Error> {
        let first = self.stats_page(None).await?;
        let mut total = first.len();
        let mut doc: serde_json::Value = serde_json::from_str(&first).map_err(stats_err)?;
        let Some(mut next) = take_next(&mut doc)? else {
            // One page (or a node that does not page): the node's text.
            return Ok(first);
        };
        loop {
            let text = self.stats_page(Some(next)).await?;
            total += text.len();
            if total > MAX_STATS_BYTES {
                return Err(Error::Codec(format!(
                    "stats: the node's stats exceed {MAX_STATS_BYTES} bytes"
                )));
            }
            let mut page: serde_json::Value = serde_json::from_str(&text).map_err(stats_err)?;
            let after = take_next(&mut page)?;
            join_clients(&mut doc, page)?;
            match after {
                // Pages must move forward, or a node could keep us here.
                Some(a) if a > next => next = a,
                Some(_) => {
                    return Err(Error::Codec(
                        "stats: the node's pages went backwards".into(),
                    ))
                }
                None => break,
            }
        }
        serde_json::to_string(&doc).map_err(stats_err)
    }

    /// One page of stats: the first (`Stats`) or the one at `from`.
    async fn stats_page(&self, from: Option<StatsCursor>) -> Result<String, Error> {
        let corr = self.inner.next_id();
        let rx = self.inner.waiter(&mut self.inner.state.lock(), corr);
        let f = match from {
            None => ClientFrame::Stats { corr },
            Some(from) => ClientFrame::StatsFrom { corr, from },
        };
        match self.inner.call(rx, f).await? {
            Answer::Stats(s) => Ok(s),
            _ => Err(Error::Codec("unexpected answer to stats".into())),
        }
    }

    /// Asks the node to reread its configuration file and apply what can
    /// change while it runs (what `skiff reload` and SIGHUP do). The node
    /// takes it only from a client on its own host; an error says why the
    /// node refused (its log says what changed).
    pub async fn reload(&self) -> Result<(), Error> {
        let corr = self.inner.next_id();
        let rx = self.inner.waiter(&mut self.inner.state.lock(), corr);
        self.inner
            .call(rx, ClientFrame::Reload { corr })
            .await
            .map(|_| ())
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

    /// The first node this client is connected to (link session 0), as
    /// in its locator.
    fn connected_to(&self, node: String) {
        let mut st = self.state.lock();
        st.nodes.push((0, node.clone()));
        st.node = Some(node);
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
            if let Some((code, e)) = &self.state.lock().fatal {
                return Err(Error::Refused {
                    code: *code,
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
            Some((code, e)) => Error::Refused {
                code: *code,
                reason: e.clone(),
            },
            None => Error::Closed,
        }
    }

    /// The node closed this client: everything waiting learns why.
    pub(crate) fn fail(&self, why: String) {
        self.fail_with(Code::Shutdown, why);
    }

    /// The client is closed for good for `why`: everything waiting learns
    /// it, under `code` ([`Code::Protocol`] when the node sent what this
    /// client cannot read).
    pub(crate) fn fail_with(&self, code: Code, why: String) {
        {
            let mut st = self.state.lock();
            if st.fatal.is_none() {
                st.fatal = Some((code, why.clone()));
                self.failed.store(true, Ordering::Release);
            }
        }
        self.shut(Some((code, why)));
    }

    /// The client is closed for good, by the node (`why`) or the
    /// application (`None`): everything waiting ends.
    pub(crate) fn shut(&self, why: Option<(Code, String)>) {
        let mut st = self.state.lock();
        let (code, why) = match why {
            Some((code, w)) => (code, Some(w)),
            None => (Code::Shutdown, None),
        };
        let err = || match &why {
            Some(w) => Error::Refused {
                code,
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

/// The most stats JSON [`Client::stats_json`] joins from a node's pages
/// (256 MiB): the bound on what a node can make a client hold.
pub const MAX_STATS_BYTES: usize = 256 << 20;

fn stats_err(e: serde_json::Error) -> Error {
    Error::Codec(format!("stats: {e}"))
}

/// Removes a stats page's `next` and reads it.
fn take_next(page: &mut serde_json::Value) -> Result<Option<StatsCursor>, Error> {
    match page.as_object_mut().and_then(|o| o.remove("next")) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v).map(Some).map_err(stats_err),
    }
}

/// Appends a later page's clients to `doc`'s; a client cut by the end of
/// the previous page goes on with the rest of its subscriptions.
fn join_clients(doc: &mut serde_json::Value, mut page: serde_json::Value) -> Result<(), Error> {
    let bad = || Error::Codec("stats: a page without a list of clients".into());
    let more = page.get_mut("clients").map(serde_json::Value::take);
    let Some(serde_json::Value::Array(more)) = more else {
        return Err(bad());
    };
    let clients = doc
        .get_mut("clients")
        .and_then(|c| c.as_array_mut())
        .ok_or_else(bad)?;
    for mut c in more {
        if let Some(last) = clients.last_mut() {
            if last.get("id").is_some() && last.get("id") == c.get("id") {
                let rest = c
                    .get_mut("subscriptions")
                    .and_then(|s| s.as_array_mut())
                    .map(std::mem::take)
                    .unwrap_or_default();
                if let Some(subs) = last.get_mut("subscriptions").and_then(|s| s.as_array_mut()) {
                    subs.extend(rest);
                }
                continue;
            }
        }
        clients.push(c);
    }
    Ok(())
}

/// Whether an `shm://` locator takes the stream link (which fails over):
/// a list of nodes, or a link option (`reconnect=true`, `ping`, …) that
/// only the stream link has.
#[cfg(not(skiff_loom))]
fn fails_over(locator: &str) -> Result<bool, Error> {
    let l: crate::locator::Locator = locator.parse()?;
    Ok(l.address.contains(',')
        || l.options
            .iter()
            .any(|(k, _)| !matches!(k.as_str(), "dir" | "ring" | "spin")))
}
