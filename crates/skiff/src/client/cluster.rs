//! Clusters (Iris): membership, requests to a member, broadcasts and
//! tunnels.

use std::future::poll_fn;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use skiff_node::ClientFrame;
use skiff_proto::Message;
use tokio::sync::Notify;

use super::inbox::{self, Shared};
use super::Inner;
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
    /// The request.
    pub msg: Message,
}

impl Request {
    pub(crate) fn new(inner: Arc<Inner>, token: u64, msg: Message) -> Request {
        Request { inner, token, msg }
    }

    /// Sends the reply.
    pub async fn reply(self, msg: Message) -> Result<(), Error> {
        self.inner.reply(self.token, msg).await
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
}

/// A tunnel's state shared with the connection's dispatcher.
#[derive(Debug)]
pub(crate) struct TunShared {
    state: Mutex<TunState>,
    credit_notify: Notify,
    inbox: Shared<Message>,
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
    }
}

/// An ordered, flow-controlled stream of messages between two clients,
/// relayed by the node over their connections. Exactly once and in order
/// while both ends live; `send` waits while the peer's window is full.
/// Dropping it closes it.
#[derive(Debug)]
pub struct Tunnel {
    inner: Arc<Inner>,
    id: u64,
    shared: Arc<TunShared>,
    window: u32,
    taken: u32,
}

impl Tunnel {
    pub(crate) fn new(inner: Arc<Inner>, id: u64, window: u32) -> (Tunnel, Arc<TunShared>) {
        let window = window.max(1);
        let shared = Arc::new(TunShared {
            state: Mutex::new(TunState {
                credit: window,
                closed: false,
            }),
            credit_notify: Notify::new(),
            inbox: inbox::shared(),
        });
        (
            Tunnel {
                inner,
                id,
                shared: shared.clone(),
                window,
                taken: 0,
            },
            shared,
        )
    }

    /// Sends one message, waiting for window.
    pub async fn send(&self, msg: Message) -> Result<(), Error> {
        skiff_proto::wire::check(&msg)?;
        loop {
            let n = self.shared.credit_notify.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            {
                let mut s = self.shared.state.lock();
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
        self.inner
            .send(ClientFrame::TunData {
                tunnel: self.id,
                msg,
            })
            .await
    }

    /// The next message; `None` once the tunnel closed.
    pub async fn recv(&mut self) -> Option<Message> {
        let m = poll_fn(|cx| self.shared.inbox.lock().poll_pop(cx)).await?;
        self.taken += 1;
        if self.taken >= (self.window / 2).max(1) {
            let n = std::mem::take(&mut self.taken);
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

    /// Closes the tunnel (dropping does the same).
    pub fn close(self) {}
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        self.shared.close_local();
        self.inner.forget_tunnel(self.id);
        let _ = self
            .inner
            .send_now(ClientFrame::TunClose { tunnel: self.id });
    }
}
