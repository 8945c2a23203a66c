//! Clusters (Iris): membership, requests to a member, broadcasts and
//! tunnels.

use std::future::poll_fn;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use skiff_proto::client_frame::{ClientFrame, Code};
use skiff_proto::router::Subject;
use skiff_proto::Message;
use tokio::sync::Notify;

use super::inbox::{self, Shared};
use super::tunnel_write::{Gather, GatherWake};
use super::{Answer, Client, Inner, MemberEntry};
use crate::Error;

/// Messages a tunnel's sender may have in flight.
pub(crate) const TUNNEL_WINDOW: u32 = 256;

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Every subscription matching this subject.
    Subject(String),
    /// One member of this cluster.
    Cluster {
        /// The cluster.
        name: String,
        /// Affinity key: the same key goes to the same member while it
        /// lives.
        key: Option<Bytes>,
    },
}

impl Target {
    /// One member of `name`, by weighted round robin over capacity.
    pub fn cluster(name: impl Into<String>) -> Target {
        Target::Cluster {
            name: name.into(),
            key: None,
        }
    }

    /// With an affinity key (clusters only).
    #[must_use]
    pub fn with_key(self, key: impl Into<Bytes>) -> Target {
        match self {
            Target::Cluster { name, .. } => Target::Cluster {
                name,
                key: Some(key.into()),
            },
            s => s,
        }
    }
}

impl From<&str> for Target {
    fn from(s: &str) -> Target {
        Target::Subject(s.into())
    }
}

impl From<String> for Target {
    fn from(s: String) -> Target {
        Target::Subject(s)
    }
}

/// What reaches a cluster member.
#[derive(Debug)]
#[non_exhaustive]
pub enum Incoming {
    /// A request for this member alone (or for every member, in
    /// scatter-gather); answer with [`Request::reply`].
    Request(Request),
    /// A broadcast to every member.
    Broadcast(Message),
    /// A tunnel opened to this member.
    Tunnel(Tunnel),
}

/// A request to a cluster member.
#[derive(Debug)]
pub struct Request {
    inner: Arc<Inner>,
    token: u64,
    /// The link session the token belongs to.
    epoch: u32,
    /// The request.
    pub msg: Message,
}

impl Request {
    pub(crate) fn new(inner: Arc<Inner>, token: u64, epoch: u32, msg: Message) -> Request {
        Request {
            inner,
            token,
            epoch,
            msg,
        }
    }

    /// Sends the reply; [`Error::NodeLost`] if the node the request came
    /// from was lost since (its requester no longer waits there).
    pub async fn reply(self, msg: Message) -> Result<(), Error> {
        self.inner.reply(self.token, self.epoch, msg).await
    }
}

/// Membership in a cluster. Dropping it leaves the cluster.
#[derive(Debug)]
pub struct Member {
    inner: Arc<Inner>,
    cluster: String,
    inbox: Shared<Incoming>,
}

impl Member {
    pub(crate) fn new(inner: Arc<Inner>, cluster: String, inbox: Shared<Incoming>) -> Member {
        Member {
            inner,
            cluster,
            inbox,
        }
    }

    /// The next request, broadcast or tunnel; `None` once the connection
    /// ended.
    pub async fn recv(&self) -> Option<Incoming> {
        poll_fn(|cx| self.inbox.lock().poll_pop(cx)).await
    }

    /// The cluster.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// Failovers this membership lived through: each is a window in which
    /// requests and broadcasts for it may have been missed (see
    /// [`super::ClientEvent::Reconnected`]).
    pub fn gaps(&self) -> u64 {
        self.inbox.lock().gaps
    }

    /// Leaves the cluster (dropping does the same).
    pub fn leave(self) {}
}

impl Drop for Member {
    fn drop(&mut self) {
        self.inner.forget_member(&self.cluster);
        let _ = self.inner.send_now(ClientFrame::Leave {
            corr: 0,
            cluster: std::mem::take(&mut self.cluster),
        });
    }
}

#[derive(Debug)]
struct TunState {
    /// Messages this side may still send.
    credit: u32,
    closed: bool,
    /// The node lost under this tunnel, if that ended it.
    lost: Option<String>,
}

/// A tunnel's state shared with the connection's dispatcher.
#[derive(Debug)]
pub(crate) struct TunShared {
    state: Mutex<TunState>,
    credit_notify: Notify,
    inbox: Shared<Message>,
    /// Stream writes gathered into messages (`tunnel_write`).
    pub(super) gather: Mutex<Gather>,
    pub(super) wake: GatherWake,
}

impl TunShared {
    pub(crate) fn data(&self, msg: Message) {
        self.inbox.lock().push(msg);
    }

    pub(crate) fn credit(&self, n: u32) {
        let mut s = self.state.lock();
        s.credit = s.credit.saturating_add(n);
        drop(s);
        self.credit_notify.notify_waiters();
    }

    pub(crate) fn close_local(&self) {
        self.state.lock().closed = true;
        self.inbox.lock().close(None);
        self.credit_notify.notify_waiters();
        // The gathered writes' flusher ends too.
        self.wake.work.notify_one();
    }

    /// `Ok` while the tunnel may send; else why not.
    pub(super) fn check_open(&self) -> Result<(), Error> {
        let s = self.state.lock();
        if let Some(node) = &s.lost {
            return Err(Error::NodeLost { node: node.clone() });
        }
        if s.closed {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// The tunnel ended (closed on either side, or its node was lost).
    pub(super) fn is_ended(&self) -> bool {
        let s = self.state.lock();
        s.closed || s.lost.is_some()
    }

    /// The node relaying the tunnel was lost: the tunnel ends (its
    /// messages in flight are gone, so it cannot go on exactly once).
    pub(crate) fn lose(&self, node: &str) {
        self.state.lock().lost = Some(node.into());
        self.inbox.lock().close(Some(format!("lost node {node}")));
        self.close_local();
    }
}

/// An ordered, flow-controlled stream of messages between two clients,
/// relayed by the node over their connections. Exactly once and in order
/// while both ends live; `send` waits while the peer's window is full.
/// Dropping it closes it. A tunnel ends when the client fails over
/// ([`Error::NodeLost`]).
#[derive(Debug)]
pub struct Tunnel {
    pub(super) inner: Arc<Inner>,
    pub(super) id: u64,
    /// The link session the id belongs to.
    pub(super) epoch: u32,
    pub(super) shared: Arc<TunShared>,
    window: u32,
    /// Taken since credit was last granted (atomic so that `recv` takes
    /// `&self`: one thread may send while another waits in `recv`).
    taken: AtomicU32,
}

impl Tunnel {
    pub(crate) fn new(
        inner: Arc<Inner>,
        id: u64,
        epoch: u32,
        window: u32,
    ) -> (Tunnel, Arc<TunShared>) {
        let window = window.max(1);
        let shared = Arc::new(TunShared {
            state: Mutex::new(TunState {
                credit: window,
                closed: false,
                lost: None,
            }),
            credit_notify: Notify::new(),
            inbox: inbox::shared(),
            gather: Mutex::new(Gather::default()),
            wake: GatherWake::default(),
        });
        (
            Tunnel {
                inner,
                id,
                epoch,
                shared: shared.clone(),
                window,
                taken: AtomicU32::new(0),
            },
            shared,
        )
    }

    /// Sends one message, waiting for window.
    pub async fn send(&self, msg: Message) -> Result<(), Error> {
        send_on(&self.inner, self.id, &self.shared, msg).await
    }

    /// A handle that sends on this tunnel from another task while this
    /// one waits in [`Tunnel::recv`] (a sender that waits for window while
    /// its peer waits for it must keep receiving). It sends only while the
    /// tunnel lives.
    pub fn sender(&self) -> TunnelSender {
        TunnelSender {
            inner: self.inner.clone(),
            id: self.id,
            shared: self.shared.clone(),
        }
    }

    /// The next message; `None` once the tunnel closed. Takes `&self`, so
    /// that one task may send while another receives (one receiver at a
    /// time: a second one waiting at once is not woken).
    pub async fn recv(&self) -> Option<Message> {
        let m = poll_fn(|cx| self.shared.inbox.lock().poll_pop(cx)).await?;
        let taken = self.taken.fetch_add(1, Ordering::Relaxed) + 1;
        if taken >= (self.window / 2).max(1) && self.inner.epoch() == self.epoch {
            let n = self.taken.swap(0, Ordering::Relaxed);
            let _ = self
                .inner
                .send_now(ClientFrame::TunCredit { tunnel: self.id, n });
        }
        Some(m)
    }

    /// The node's id for the tunnel.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Why the tunnel ended, if the client lost its node.
    pub fn error(&self) -> Option<String> {
        self.shared.inbox.lock().error.clone()
    }

    /// Closes the tunnel (dropping does the same).
    pub fn close(self) {}
}

/// Sends on a [`Tunnel`] from another task (see [`Tunnel::sender`]).
#[derive(Debug, Clone)]
pub struct TunnelSender {
    inner: Arc<Inner>,
    id: u64,
    shared: Arc<TunShared>,
}

impl TunnelSender {
    /// Sends one message, waiting for window; [`Error::Closed`] once the
    /// tunnel closed.
    pub async fn send(&self, msg: Message) -> Result<(), Error> {
        send_on(&self.inner, self.id, &self.shared, msg).await
    }
}

/// Sends `msg` on tunnel `id`, waiting for the peer's window.
pub(super) async fn send_on(
    inner: &Inner,
    id: u64,
    shared: &TunShared,
    msg: Message,
) -> Result<(), Error> {
    skiff_proto::wire::check(&msg)?;
    loop {
        let n = shared.credit_notify.notified();
        tokio::pin!(n);
        n.as_mut().enable();
        {
            let mut s = shared.state.lock();
            if let Some(node) = &s.lost {
                return Err(Error::NodeLost { node: node.clone() });
            }
            if s.closed {
                return Err(Error::Closed);
            }
            if s.credit > 0 {
                s.credit -= 1;
                break;
            }
        }
        n.await;
    }
    inner.send(ClientFrame::TunData { tunnel: id, msg }).await
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        if self.hand_close_to_flusher() {
            // Gathered writes leave first; the flusher closes after them.
            return;
        }
        self.shared.close_local();
        // An id from a lost node could name another tunnel on this one.
        if self.inner.epoch() == self.epoch {
            self.inner.forget_tunnel(self.id);
            let _ = self
                .inner
                .send_now(ClientFrame::TunClose { tunnel: self.id });
        }
    }
}

/// Joining clusters, broadcasting to them, and opening tunnels.
impl Client {
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
            window: TUNNEL_WINDOW,
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
}
