//! The datagram queue (CMQ): `push` to an address, `pop` what arrived.
//!
//! A [`Queue`] owns one UDP socket. `push` copies the message into its
//! destination's batch (a [`Batcher`](skiff_proto::Batcher)) and never
//! waits on the network; a batch leaves as one datagram when it reaches
//! `qthresh` bytes, when its oldest message is `timeout` old, when the next
//! message would not fit, or on [`Queue::flush`]. `try_pop` never blocks either (CMQ's `cwPop`): it
//! hands out what was already received, else reads whatever the socket holds
//! in one `recvmmsg`, else returns `None`.
//!
//! **Natural batching** (`timeout=0`, the default): a push that finds the
//! path idle sends at once on the caller's thread, so a lone message costs
//! one system call and no hand-off; while a send is in flight (or one has
//! just finished), pushes only append, and a flusher thread sends whatever
//! accumulated as one batch. Low latency at low load, full datagrams at high
//! load, nothing to tune.
//!
//! Delivery is best effort. What is guaranteed: a message is delivered at
//! most once; each message a source numbered for this queue is either
//! delivered or counted in [`QueueStats::lost`]; every datagram or message
//! dropped on purpose is counted in [`QueueStats::dropped`] under its
//! reason, including the kernel's own receive-buffer drops.
//!
//! **Reliable queues** (`udp://…?reliable=true`): the same calls over QMP
//! associations, one per destination: exactly once, in order, flow
//! controlled; see [`reliable`]. [`Queue`] is either kind, chosen by the
//! locator; [`DatagramQueue`] and [`ReliableQueue`] are the two kinds.
//!
//! The code, by concern: `config` parses the locator's options; the
//! datagram queue is `datagram` (binding and the calls), `send` (pushing,
//! natural batching, the flusher), `recv` (receiving, validation, loss
//! and drop accounting) and `multicast`; `stats` holds the counters both
//! kinds report, `typed` CMQ's typed messages, and [`reliable`] the queue
//! over associations.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde::{de::DeserializeOwned, Serialize};
use skiff_proto::{Dest, Message};

use crate::error::Error;

mod config;
mod datagram;
mod multicast;
mod recv;
pub mod reliable;
mod send;
mod stats;
mod typed;

pub use config::QueueConfig;
pub use datagram::DatagramQueue;
pub use reliable::ReliableQueue;
pub use stats::{Drops, QueueStats};
pub use typed::{decode_typed, typed_message};

/// A queue: [`push`](Queue::push) to an address, [`try_pop`](Queue::try_pop)
/// or [`pop`](Queue::pop) what arrived. The locator chooses the kind:
/// best-effort datagrams ([`DatagramQueue`], the default; see the module
/// documentation) or, with `reliable=true`, associations ([`ReliableQueue`]:
/// exactly once, in order, flow controlled).
///
/// `Queue` is `Send + Sync`: share it with `Arc` to push and pop from
/// several threads.
#[derive(Debug)]
pub struct Queue(Kind);

#[derive(Debug)]
enum Kind {
    Datagram(DatagramQueue),
    Reliable(Box<ReliableQueue>),
}

impl Queue {
    /// Binds a queue: `udp://0.0.0.0:4711?qthresh=512&timeout=200ms`, or
    /// `udp://0.0.0.0:4711?reliable=true`. Options are listed on
    /// [`QueueConfig`].
    pub fn bind(locator: &str) -> Result<Queue, Error> {
        Queue::with_config(QueueConfig::from_locator(locator)?)
    }

    /// Binds a queue with an explicit configuration.
    pub fn with_config(config: QueueConfig) -> Result<Queue, Error> {
        Ok(Queue(if config.reliable {
            Kind::Reliable(Box::new(ReliableQueue::with_config(config)?))
        } else {
            Kind::Datagram(DatagramQueue::with_config(config)?)
        }))
    }

    /// The datagram queue, if this is one.
    pub fn as_datagram(&self) -> Option<&DatagramQueue> {
        match &self.0 {
            Kind::Datagram(q) => Some(q),
            Kind::Reliable(_) => None,
        }
    }

    /// The reliable queue, if this is one.
    pub fn as_reliable(&self) -> Option<&ReliableQueue> {
        match &self.0 {
            Kind::Reliable(q) => Some(q),
            Kind::Datagram(_) => None,
        }
    }

    /// The bound address (with the port the OS chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        match &self.0 {
            Kind::Datagram(q) => q.local_addr(),
            Kind::Reliable(q) => q.local_addr(),
        }
    }

    /// Makes a datagram queue point-to-point (see
    /// [`DatagramQueue::connect`]); a reliable queue refuses, since its
    /// associations have their own peers.
    pub fn connect(&self, peer: SocketAddr) -> Result<(), Error> {
        match &self.0 {
            Kind::Datagram(q) => q.connect(peer),
            Kind::Reliable(_) => Err(Error::Io {
                what: "connect to peer",
                source: io::Error::new(
                    io::ErrorKind::Unsupported,
                    "a reliable queue's associations have their own peers; \
                     use a queue without reliable=true",
                ),
            }),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &QueueConfig {
        match &self.0 {
            Kind::Datagram(q) => q.config(),
            Kind::Reliable(q) => q.config(),
        }
    }

    /// Queues `msg` for `dest` (a `SocketAddr` works: any endpoint there);
    /// never waits on the network. Fails if the message can never be sent
    /// as it is (too large: the error names the limit) or a limit is
    /// reached (on a reliable queue, the destination's backlog:
    /// [`ReliableQueue`] explains).
    pub fn push(&self, dest: impl Into<Dest>, msg: &Message) -> Result<(), Error> {
        match &self.0 {
            Kind::Datagram(q) => q.push(dest, msg),
            Kind::Reliable(q) => q.push(dest, msg),
        }
    }

    /// Serializes `value` (postcard) and pushes it with its Rust type name as
    /// the message type, for [`Queue::try_pop_typed`] (CMQ's polymorphic
    /// queue).
    pub fn push_typed<T: Serialize>(&self, dest: impl Into<Dest>, value: &T) -> Result<(), Error> {
        self.push(dest, &typed_message(value)?)
    }

    /// Datagram queue: hands everything queued to the kernel now, waiting
    /// while the socket's send buffer is full. Reliable queue: waits until
    /// every message pushed is acknowledged by its receiver. Either reports
    /// what failed since the previous flush.
    pub fn flush(&self) -> Result<(), Error> {
        match &self.0 {
            Kind::Datagram(q) => q.flush(),
            Kind::Reliable(q) => q.flush(),
        }
    }

    /// The next received message, or `None` at once if there is none
    /// (CMQ's `cwPop`).
    pub fn try_pop(&self) -> Option<Message> {
        match &self.0 {
            Kind::Datagram(q) => q.try_pop(),
            Kind::Reliable(q) => q.try_pop(),
        }
    }

    /// Moves up to `max` received messages into `out` without blocking;
    /// returns how many. Cheaper per message than `try_pop` in a loop.
    pub fn try_pop_many(&self, out: &mut Vec<Message>, max: usize) -> usize {
        match &self.0 {
            Kind::Datagram(q) => q.try_pop_many(out, max),
            Kind::Reliable(q) => q.try_pop_many(out, max),
        }
    }

    /// Waits up to `timeout` (forever with `None`) for a message.
    pub fn pop_blocking(&self, timeout: Option<Duration>) -> Option<Message> {
        match &self.0 {
            Kind::Datagram(q) => q.pop_blocking(timeout),
            Kind::Reliable(q) => q.pop_blocking(timeout),
        }
    }

    /// Waits for the next message (tokio). A datagram queue must be polled
    /// inside a tokio runtime with I/O enabled.
    pub async fn pop(&self) -> Result<Message, Error> {
        match &self.0 {
            Kind::Datagram(q) => q.pop().await,
            Kind::Reliable(q) => q.pop().await,
        }
    }

    /// Pops the next message and deserializes it as `T`; `None` if nothing
    /// is waiting. A message of another type is consumed and reported as
    /// [`Error::TypeMismatch`].
    pub fn try_pop_typed<T: DeserializeOwned>(&self) -> Option<Result<T, Error>> {
        self.try_pop().map(|m| decode_typed(&m))
    }

    /// Joins a multicast group (datagram queues only).
    pub fn join_multicast(&self, group: IpAddr) -> Result<(), Error> {
        match &self.0 {
            Kind::Datagram(q) => q.join_multicast(group),
            Kind::Reliable(_) => Err(no_multicast()),
        }
    }

    /// Leaves a multicast group (datagram queues only).
    pub fn leave_multicast(&self, group: IpAddr) -> Result<(), Error> {
        match &self.0 {
            Kind::Datagram(q) => q.leave_multicast(group),
            Kind::Reliable(_) => Err(no_multicast()),
        }
    }

    /// Counters: sent, received, lost, dropped by reason.
    pub fn stats(&self) -> QueueStats {
        match &self.0 {
            Kind::Datagram(q) => q.stats(),
            Kind::Reliable(q) => q.stats(),
        }
    }
}

fn no_multicast() -> Error {
    Error::Io {
        what: "multicast",
        source: io::Error::new(
            io::ErrorKind::Unsupported,
            "a reliable queue has no multicast: each association has one peer; \
             use a queue without reliable=true",
        ),
    }
}
