//! Subscriptions: what [`super::Client::subscribe`] returns.
//!
//! Messages wait in two bounded places: the subscription's queue in the
//! node (bound [`SubOptions::queue`], where the [`Policy`] applies), and a
//! window of at most [`SubOptions::window`] messages in this process. The
//! client grants the node credit as the application takes messages, so a
//! subscriber that stops reading (or is paused) fills its node queue, and
//! only its own.

use std::future::poll_fn;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use skiff_proto::client_frame::{ClientFrame, Policy, MAX_GROUP};
use skiff_proto::router::{CmsgPattern, KindPattern, Pattern, Syntax};
use skiff_proto::Message;

use super::inbox::{self, Shared};
use super::status::Gap;
use super::{Backend, Client, Inner, SubEntry};
use crate::Error;

/// A queue group's name ([`SubOptions::queue_group`]), held inline so
/// that [`SubOptions`] stays `Copy`. A name over
/// [`skiff_proto::client_frame::MAX_GROUP`] bytes is kept as too long and
/// refused when subscribing.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct QueueGroup {
    len: usize,
    name: [u8; MAX_GROUP],
}

impl QueueGroup {
    /// The group `name` (too long if over `MAX_GROUP` bytes).
    pub fn new(name: &str) -> QueueGroup {
        let mut g = QueueGroup {
            len: name.len(),
            name: [0; MAX_GROUP],
        };
        if name.len() <= MAX_GROUP {
            g.name[..name.len()].copy_from_slice(name.as_bytes());
        }
        g
    }

    /// The name, or an error if it is too long.
    pub fn name(&self) -> Result<&str, Error> {
        if self.len > MAX_GROUP {
            return Err(Error::Refused {
                code: skiff_proto::client_frame::Code::Invalid,
                reason: format!(
                    "queue group name of {} bytes is over the limit of {MAX_GROUP}",
                    self.len
                ),
            });
        }
        // Whole UTF-8: copied from a `&str` in full.
        Ok(std::str::from_utf8(&self.name[..self.len]).unwrap_or_default())
    }
}

impl std::fmt::Debug for QueueGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Ok(n) => write!(f, "QueueGroup({n:?})"),
            Err(_) => write!(f, "QueueGroup(<{} bytes, too long>)", self.len),
        }
    }
}

/// Options of one subscription.
#[derive(Debug, Clone, Copy)]
pub struct SubOptions {
    /// What the node does when the queue is full.
    pub policy: Policy,
    /// Most messages queued in the node for this subscription.
    pub queue: u32,
    /// Most messages held in this process before the application takes
    /// them (the credit window).
    pub window: u32,
    /// The kind of the subject and type patterns: tokens (the default) or
    /// cMsg's matching over whole strings ([`SubOptions::cmsg`]).
    pub syntax: Syntax,
    /// Over `shm://`: read the topic from the node's one buffer of it,
    /// shared with the host's other subscribers (see
    /// [`SubOptions::shared_buffer`]).
    pub shared: Option<skiff_proto::credits::Flow>,
    /// Best effort (`reliable=false`, CMQ's loss-tolerant traffic): what
    /// reaches this subscription from other nodes may travel as datagrams,
    /// their loss counted in the peers' `lost`, never repaired (unless
    /// another subscription on this node wants the same messages
    /// reliably). Within one node nothing changes.
    pub best_effort: bool,
    /// A queue group ([`SubOptions::queue_group`]): of the subscriptions
    /// in the group that match a message, skiff's and NATS clients' alike,
    /// one in the whole mesh gets it.
    pub queue_group: Option<QueueGroup>,
}

impl Default for SubOptions {
    fn default() -> Self {
        SubOptions {
            policy: Policy::DropOldest,
            queue: 65_536,
            window: 4_096,
            syntax: Syntax::Tokens,
            shared: None,
            best_effort: false,
            queue_group: None,
        }
    }
}

impl SubOptions {
    /// Joins queue group `group` (NATS `SUB subject group`): of the
    /// subscriptions in the group that match a message, skiff clients' and
    /// NATS clients' alike, one in the whole mesh gets each message and
    /// each request, chosen by the capacity-weighted choice of the skiff
    /// cluster of the same name (the client becomes a member with capacity
    /// 1 unless it joined the cluster itself). The name is a literal
    /// subject. A node that predates queue groups refuses the
    /// subscription.
    #[must_use]
    pub fn queue_group(mut self, group: &str) -> Self {
        self.queue_group = Some(QueueGroup::new(group));
        self
    }

    /// Asks for best effort between nodes (see [`SubOptions::best_effort`]).
    #[must_use]
    pub fn best_effort(mut self, on: bool) -> Self {
        self.best_effort = on;
        self
    }

    /// Sets the policy.
    #[must_use]
    pub fn policy(mut self, p: Policy) -> Self {
        self.policy = p;
        self
    }

    /// Sets the node-side queue bound, in messages.
    #[must_use]
    pub fn queue(mut self, n: u32) -> Self {
        self.queue = n;
        self
    }

    /// Sets the in-process window, in messages.
    #[must_use]
    pub fn window(mut self, n: u32) -> Self {
        self.window = n;
        self
    }

    /// Sets the pattern kind.
    #[must_use]
    pub fn syntax(mut self, s: Syntax) -> Self {
        self.syntax = s;
        self
    }

    /// Makes the subject and type patterns cMsg patterns: `*` any run of
    /// characters, `?` one character, `#` a non-negative integer,
    /// `{i>5 & i<10 | i=20}` an integer in a range
    /// (see [`skiff_proto::router::cmsg`]).
    #[must_use]
    pub fn cmsg(self) -> Self {
        self.syntax(Syntax::Cmsg)
    }

    /// Over `shm://` (RBMQ's broker of buffers): the node keeps one buffer
    /// per topic (this pattern and type) for the subscribers of its host,
    /// writes each message into it once, and every such subscriber reads
    /// it there in place. `Flow::Credits`: the buffer waits for its slowest
    /// reader (the node's queue for the topic and its `policy` take the
    /// rest); `Flow::Overwrite`: a reader that falls a buffer behind loses
    /// what was overwritten (counted in `dropped`). Such a subscription
    /// gets published messages only (a request on the topic is not
    /// delivered to it), has no node-side counters of its own and is not
    /// held by [`Client::stop`]. Ignored over other transports and with
    /// cMsg patterns.
    #[must_use]
    pub fn shared_buffer(mut self, flow: skiff_proto::credits::Flow) -> Self {
        self.shared = Some(flow);
        self
    }
}

/// A received message; dereferences to the [`Message`]. When
/// [`Delivery::is_request`], answer it with [`super::Client::reply`].
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The message.
    pub msg: Message,
    pub(crate) token: Option<u64>,
    /// The link session the token belongs to.
    pub(crate) epoch: u32,
    pub(crate) gap: Option<Arc<Gap>>,
}

impl Delivery {
    pub(crate) fn new(msg: Message, token: Option<u64>, epoch: u32) -> Delivery {
        Delivery {
            msg,
            token,
            epoch,
            gap: None,
        }
    }

    /// Set on the first message after a failover: the client had no node
    /// during [`Gap`], so messages published then may be missing before
    /// this one. Nothing before this message is repeated.
    pub fn gap(&self) -> Option<&Gap> {
        self.gap.as_deref()
    }

    /// Whether the sender waits for a reply.
    pub fn is_request(&self) -> bool {
        self.token.is_some()
    }

    /// The message, without the reply token.
    pub fn into_message(self) -> Message {
        self.msg
    }
}

impl Deref for Delivery {
    type Target = Message;
    fn deref(&self) -> &Message {
        &self.msg
    }
}

/// A subscription: an async stream of [`Delivery`]s. Dropping it
/// unsubscribes.
#[derive(Debug)]
pub struct Subscription {
    inner: Arc<Inner>,
    sid: u64,
    inbox: Shared<Delivery>,
    window: u32,
    /// Taken since credit was last granted.
    taken: u32,
    /// The inbox's epoch `taken` counts for.
    epoch: u32,
}

impl Subscription {
    pub(crate) fn new(inner: Arc<Inner>, sid: u64, inbox: Shared<Delivery>, window: u32) -> Self {
        Subscription {
            inner,
            sid,
            inbox,
            window,
            taken: 0,
            epoch: 0,
        }
    }

    /// The next message; `None` once the subscription or the connection
    /// ended (see [`Subscription::error`]).
    pub async fn recv(&mut self) -> Option<Delivery> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// The next message if one is here now.
    pub fn try_recv(&mut self) -> Option<Delivery> {
        let (d, credit) = {
            let mut i = self.inbox.lock();
            if i.held() {
                return None;
            }
            let d = i.q.pop_front();
            let credit = d.is_some() && i.earns_credit(&mut self.epoch, &mut self.taken);
            (d, credit)
        };
        if credit {
            self.took();
        }
        d
    }

    /// Polls for the next message.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Delivery>> {
        let (r, credit) = {
            let mut i = self.inbox.lock();
            let r = i.poll_pop(cx);
            let credit = matches!(r, Poll::Ready(Some(_)))
                && i.earns_credit(&mut self.epoch, &mut self.taken);
            (r, credit)
        };
        if credit {
            self.took();
        }
        r
    }

    fn took(&mut self) {
        self.taken += 1;
        if self.taken >= (self.window / 2).max(1) {
            let n = std::mem::take(&mut self.taken);
            let _ = self
                .inner
                .send_now(ClientFrame::Credit { sid: self.sid, n });
        }
    }

    /// Stops handing out messages (cMsg's pause); they wait, and once the
    /// window and the node's queue are full the policy applies.
    pub fn pause(&self) {
        self.inbox.lock().paused = true;
    }

    /// Hands out messages again.
    pub fn resume(&self) {
        let mut i = self.inbox.lock();
        i.paused = false;
        i.wake();
    }

    /// Whether paused.
    pub fn is_paused(&self) -> bool {
        self.inbox.lock().paused
    }

    /// Messages waiting in this process (at most the window; the node's
    /// queue is in [`super::Client::stats`]).
    pub fn queue_len(&self) -> usize {
        self.inbox.lock().q.len()
    }

    /// Messages the node dropped for this subscription so far, as last
    /// reported by the node (summed over the nodes of a failover list).
    pub fn dropped(&self) -> u64 {
        self.inbox.lock().dropped
    }

    /// Failovers this subscription lived through: each is a window in
    /// which messages may have been missed (the first message after it
    /// carries the [`Gap`], see [`Delivery::gap`]).
    pub fn gaps(&self) -> u64 {
        self.inbox.lock().gaps
    }

    /// Damaged records of a `file://` log skipped so far (each a damaged
    /// or torn record, up to the next valid one), and the last of them:
    /// where it was and why. Always 0 for other transports.
    pub fn skipped(&self) -> (u64, Option<String>) {
        let i = self.inbox.lock();
        (i.skipped, i.last_skip.clone())
    }

    /// Why the subscription ended, if the node ended it (e.g. slow
    /// consumer).
    pub fn error(&self) -> Option<String> {
        self.inbox.lock().error.clone()
    }

    /// The client's id for this subscription (as in the node's stats).
    pub fn id(&self) -> u64 {
        self.sid
    }

    /// Ends the subscription.
    pub fn unsubscribe(self) {}
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.inner.forget_sub(self.sid);
        let _ = self.inner.send_now(ClientFrame::Unsub { sid: self.sid });
    }
}

impl futures_core::Stream for Subscription {
    type Item = Delivery;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Delivery>> {
        self.get_mut().poll_recv(cx)
    }
}

/// The callback form of a subscription: a task calls the function for each
/// message. Dropping the handle ends the subscription.
#[derive(Debug)]
pub struct SubscriptionHandle {
    inbox: Shared<Delivery>,
    sid: u64,
    task: tokio::task::JoinHandle<()>,
}

impl SubscriptionHandle {
    pub(crate) fn spawn<F: FnMut(Delivery) + Send + 'static>(
        mut sub: Subscription,
        mut f: F,
    ) -> Self {
        let inbox = sub.inbox.clone();
        let sid = sub.sid;
        let task = tokio::spawn(async move {
            while let Some(d) = sub.recv().await {
                f(d);
            }
        });
        SubscriptionHandle { inbox, sid, task }
    }

    /// Stops calling the function; messages wait (cMsg's pause).
    pub fn pause(&self) {
        self.inbox.lock().paused = true;
    }

    /// Calls the function again.
    pub fn resume(&self) {
        let mut i = self.inbox.lock();
        i.paused = false;
        i.wake();
    }

    /// Messages waiting in this process.
    pub fn queue_len(&self) -> usize {
        self.inbox.lock().q.len()
    }

    /// Messages the node dropped for this subscription so far.
    pub fn dropped(&self) -> u64 {
        self.inbox.lock().dropped
    }

    /// Failovers the subscription lived through (see
    /// [`Subscription::gaps`]).
    pub fn gaps(&self) -> u64 {
        self.inbox.lock().gaps
    }

    /// The subscription's id.
    pub fn id(&self) -> u64 {
        self.sid
    }
}

impl Drop for SubscriptionHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Subscribing.
impl Client {
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
        self.subscribe_inner(pattern, kind, opts, true).await
    }

    /// cMsg's `subscribeAndGet`: waits up to `timeout` for the next message
    /// matching `pattern` and `kind` (of the kind in `opts`), with no
    /// lasting subscription: the one made for the call ends when it
    /// returns, whatever the outcome. Only messages published after the
    /// node holds the interest can match (as for
    /// [`Client::subscribe_with`]); the client-wide [`Client::stop`] does
    /// not hold this one back. [`Error::Timeout`] when none came in time.
    pub async fn subscribe_and_get(
        &self,
        pattern: &str,
        kind: &str,
        opts: SubOptions,
        timeout: std::time::Duration,
    ) -> Result<Delivery, Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        let sub = self.subscribe_inner(pattern, kind, opts.window(1), false);
        let mut sub = tokio::time::timeout_at(deadline, sub)
            .await
            .map_err(|_| Error::Timeout)??;
        match tokio::time::timeout_at(deadline, sub.recv()).await {
            Ok(Some(d)) => Ok(d),
            Ok(None) => Err(match sub.error() {
                Some(reason) => Error::Refused {
                    code: super::Code::Shutdown,
                    reason,
                },
                None => Error::Closed,
            }),
            Err(_) => Err(Error::Timeout),
        }
    }

    /// Stops delivery for the whole client (cMsg's `stop`): every
    /// subscription, callbacks included, and every one made while stopped,
    /// holds its messages as [`Subscription::pause`] does (its own pause
    /// and resume still apply on top) until [`Client::start`]. A `file://`
    /// log's subscriptions are not held.
    pub fn stop(&self) {
        self.set_started(false);
    }

    /// Starts delivery again after [`Client::stop`] (cMsg's `start`); a
    /// client starts started.
    pub fn start(&self) {
        self.set_started(true);
    }

    /// Whether delivery is on (see [`Client::stop`]).
    pub fn is_started(&self) -> bool {
        !self.inner.state.lock().stopped
    }

    fn set_started(&self, on: bool) {
        let mut st = self.inner.state.lock();
        st.stopped = !on;
        for s in st.subs.values().filter(|s| s.gated) {
            let mut i = s.inbox.lock();
            i.stopped = !on;
            if on {
                i.wake();
            }
        }
    }

    async fn subscribe_inner(
        &self,
        pattern: &str,
        kind: &str,
        opts: SubOptions,
        gated: bool,
    ) -> Result<Subscription, Error> {
        check_patterns(opts.syntax, pattern, kind)?;
        let group = opts
            .queue_group
            .as_ref()
            .map(|g| g.name().map(str::to_owned))
            .transpose()?;
        if let Backend::File(f) = &self.inner.backend {
            return f.subscribe(self.inner.clone(), opts.syntax, pattern, kind);
        }
        // A client that fails over keeps its shared-buffer subscriptions
        // across nodes: from the topic's ring on an shm node, as a plain
        // subscription on any other.
        let fails_over = matches!(self.inner.link, Some(super::link::Link::Stream(_)));
        let topic = (fails_over && opts.shared.is_some() && opts.syntax == Syntax::Tokens)
            .then(|| Arc::new(std::sync::atomic::AtomicU64::new(0)));
        #[cfg(not(skiff_loom))]
        if let (Some(gen), Some(loc)) = (&topic, self.node()) {
            if loc.starts_with("shm://") {
                return super::shm_topic::subscribe_kept(
                    self.inner.clone(),
                    &loc,
                    pattern,
                    kind,
                    opts,
                    gated,
                    gen.clone(),
                )
                .await;
            }
        }
        #[cfg(not(skiff_loom))]
        if let (Some(flow), Some(loc), Syntax::Tokens, false) =
            (opts.shared, self.node(), opts.syntax, fails_over)
        {
            if loc.starts_with("shm://") {
                return super::shm_topic::subscribe(
                    self.inner.clone(),
                    &loc,
                    pattern,
                    kind,
                    flow,
                    opts.window,
                    self.max_payload(),
                )
                .await;
            }
        }
        let sid = self.inner.next_id();
        let inbox = inbox::shared();
        let rx = {
            let mut st = self.inner.state.lock();
            if let Some((code, e)) = &st.fatal {
                return Err(Error::Refused {
                    code: *code,
                    reason: e.clone(),
                });
            }
            inbox.lock().stopped = gated && st.stopped;
            st.subs.insert(
                sid,
                SubEntry {
                    gated,
                    inbox: inbox.clone(),
                    pattern: pattern.into(),
                    kind: kind.into(),
                    opts,
                    live: false,
                    topic,
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
                    syntax: opts.syntax,
                    best_effort: opts.best_effort,
                    group,
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
}

/// Checks a subscription's subject and type patterns, of kind `syntax`.
pub(crate) fn check_patterns(syntax: Syntax, pattern: &str, kind: &str) -> Result<(), Error> {
    Pattern::with_syntax(pattern, syntax)?;
    match syntax {
        Syntax::Tokens => {
            KindPattern::new(kind)?;
        }
        Syntax::Cmsg => {
            CmsgPattern::kind(kind)?;
        }
    }
    Ok(())
}
