//! The reliable queue (`udp://…?reliable=true`): the queue's calls over
//! QMP associations, one per destination, driven by an [`Endpoint`].
//!
//! What it promises: every message pushed to a destination is delivered
//! there exactly once and in order, or its association fails and the
//! message is counted in [`Drops::unconfirmed`](super::Drops::unconfirmed)
//! (and reported by the next `flush`). Flow control is the association's:
//! a receiver that does not pop closes its window.
//!
//! `push` never waits on the network. It hands the message to the
//! destination's association; when the association's send buffer is full,
//! the message waits in a per-destination backlog of at most `max_backlog`
//! bytes, which the endpoint's driver feeds to the association as the
//! receiver acknowledges. A push that would pass `max_backlog` is refused
//! with [`LimitError::Backlog`](skiff_proto::error::LimitError::Backlog)
//! (inside [`Error::Limit`]) and nothing is queued: a reliable queue
//! neither drops nor grows without bound, so the caller decides (retry
//! later, pop on its side, give up). Pops return the messages of every
//! association in the order they arrived.
//!
//! Dropping the queue stops its endpoint at once, like dropping an
//! [`Endpoint`]: call `flush` first. Peers then see its associations go
//! silent and end them after their `idle_timeout`, counting what they had
//! pushed and not had acknowledged as unconfirmed.

use std::net::SocketAddr;
use std::time::Duration;

use skiff_proto::{Dest, Message};

use super::{Drops, QueueConfig, QueueStats};
use crate::endpoint::{DriverMode, Endpoint, EndpointConfig, EndpointStats};
use crate::error::Error;

/// A queue whose pushes travel over associations; see the module
/// documentation. Normally used through [`Queue`](super::Queue).
#[derive(Debug)]
pub struct ReliableQueue {
    endpoint: Endpoint,
    config: QueueConfig,
}

impl ReliableQueue {
    /// Binds the endpoint and starts accepting associations.
    pub fn with_config(config: QueueConfig) -> Result<ReliableQueue, Error> {
        let mut e = EndpointConfig::new(config.bind);
        e.service = config.endpoint;
        e.association = config.association.clone();
        e.association.mtu = config.max_datagram;
        e.max_datagram = config.max_datagram;
        let u = &config.udp;
        e.udp.send_buffer = u.send_buffer.or(e.udp.send_buffer);
        e.udp.recv_buffer = u.recv_buffer.or(e.udp.recv_buffer);
        e.udp.gso = u.gso;
        e.udp.gro = u.gro;
        e.udp.reuse_addr = u.reuse_addr;
        // Pushes and pops are blocking calls: the driver needs a thread
        // that a caller blocked on a runtime's worker cannot hold up.
        e.driver = DriverMode::Thread;
        let endpoint = Endpoint::with_config(e)?;
        endpoint.serve_queue(config.max_backlog);
        Ok(ReliableQueue { endpoint, config })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.endpoint.local_addr()
    }

    /// The configuration in force.
    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// Pushes `msg` to the reliable queue at `dest`; see the module
    /// documentation for the backlog and its limit. The endpoint id of
    /// `dest` is the association's service id (this queue's own `endpoint`
    /// when `dest` names none).
    pub fn push(&self, dest: impl Into<Dest>, msg: &Message) -> Result<(), Error> {
        let dest = dest.into();
        let service = if dest.endpoint == Dest::ANY {
            self.config.endpoint
        } else {
            dest.endpoint
        };
        self.endpoint.queue_push(dest.addr, service, msg)
    }

    /// Waits until every message pushed so far is acknowledged by its
    /// receiver (or its association failed); reports a failure since the
    /// previous flush, with how many messages are unconfirmed.
    pub fn flush(&self) -> Result<(), Error> {
        self.endpoint.queue_flush()
    }

    /// The next message that arrived, or `None` at once.
    pub fn try_pop(&self) -> Option<Message> {
        self.endpoint.queue_try_pop()
    }

    /// Moves up to `max` messages into `out`; returns how many.
    pub fn try_pop_many(&self, out: &mut Vec<Message>, max: usize) -> usize {
        self.endpoint.queue_pop_many(out, max)
    }

    /// Waits up to `timeout` (forever with `None`) for a message.
    pub fn pop_blocking(&self, timeout: Option<Duration>) -> Option<Message> {
        self.endpoint.queue_pop_blocking(timeout)
    }

    /// Waits for the next message (any tokio runtime, or none).
    pub async fn pop(&self) -> Result<Message, Error> {
        std::future::poll_fn(|cx| self.endpoint.queue_poll_pop(cx)).await
    }

    /// The queue's counters. `sent_*` count messages handed to
    /// associations, `recv_*` messages delivered; `sent_batches` and
    /// `recv_batches` count datagrams; `lost` stays 0 (a receiver cannot
    /// miss a message without its association failing, which the sender
    /// counts in `dropped.unconfirmed`); `dropped` holds datagrams refused
    /// and messages unconfirmed. Packets received twice (a retransmission
    /// or probe that crossed its acknowledgement) are not drops of messages
    /// and appear only in [`endpoint_stats`](Self::endpoint_stats).
    pub fn stats(&self) -> QueueStats {
        let c = self.endpoint.queue_counters();
        let e = self.endpoint.stats();
        QueueStats {
            sent_messages: c.sent,
            sent_bytes: c.sent_bytes,
            sent_batches: e.datagrams_sent,
            send_calls: e.send_calls,
            recv_messages: c.received,
            recv_bytes: c.received_bytes,
            recv_batches: e.datagrams_received,
            lost: 0,
            recovered: 0,
            dropped: Drops {
                foreign: e.dropped_foreign,
                version: e.dropped_version,
                kind: e.dropped_kind,
                truncated: e.dropped_truncated,
                malformed: e.dropped_malformed
                    + e.listener.malformed
                    + e.associations.malformed
                    + c.undecodable,
                send_error: e.send_errors,
                unconfirmed: c.unconfirmed,
                ..Drops::default()
            },
        }
    }

    /// The endpoint's counters: associations, retransmissions, tail-loss
    /// probes, rejected packets.
    pub fn endpoint_stats(&self) -> EndpointStats {
        self.endpoint.stats()
    }
}
