//! The datagrams waiting for [`Mesh::poll_transmit`](super::Mesh::poll_transmit):
//! control datagrams (membership, interest, acks, association packets) in
//! the order they were made, then each peer's sealed data datagrams back
//! to back, so that a driver can send a peer's run as one segmented send.
//! Buffers go round: a datagram's buffer is handed to the caller whole
//! and the caller's old one comes back to a small pool that new datagrams
//! are built in, so a steady flow allocates nothing.

use std::collections::VecDeque;
use std::net::SocketAddr;

use rustc_hash::FxHashMap;

use super::Peer;

/// Buffers kept for reuse; beyond it they are freed.
const POOL: usize = 32;

/// A datagram that [`Mesh::poll_transmit`](super::Mesh::poll_transmit)
/// wrote into the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Where to send it.
    pub destination: SocketAddr,
    /// Its length (the buffer's whole length).
    pub size: usize,
    /// Send it in a packet of its own, never in a segmented run with its
    /// neighbours (an association packet that is the repeat of one just
    /// before it and must not share its fate).
    pub alone: bool,
}

#[derive(Debug)]
struct Queued {
    to: SocketAddr,
    datagram: Vec<u8>,
    alone: bool,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    control: VecDeque<Queued>,
    /// Peers with sealed data datagrams (each once, in the order its
    /// first one was sealed); the datagrams wait in the peer's own queue.
    ready: VecDeque<SocketAddr>,
    pool: Vec<Vec<u8>>,
}

impl Outbox {
    /// An empty buffer to build a datagram in.
    pub(super) fn buffer(&mut self) -> Vec<u8> {
        self.pool.pop().unwrap_or_default()
    }

    /// Takes back a buffer no longer needed.
    pub(super) fn recycle(&mut self, mut buf: Vec<u8>) {
        if buf.capacity() > 0 && self.pool.len() < POOL {
            buf.clear();
            self.pool.push(buf);
        }
    }

    /// Queues a control datagram for `to`.
    pub(super) fn push(&mut self, to: SocketAddr, datagram: Vec<u8>) {
        self.control.push_back(Queued {
            to,
            datagram,
            alone: false,
        });
    }

    /// Queues a control datagram for `to` that must travel alone.
    pub(super) fn push_alone(&mut self, to: SocketAddr, datagram: Vec<u8>) {
        self.control.push_back(Queued {
            to,
            datagram,
            alone: true,
        });
    }

    /// Queues a sealed data datagram in `to`'s own `queue`.
    pub(super) fn sealed(&mut self, to: SocketAddr, queue: &mut VecDeque<Vec<u8>>, d: Vec<u8>) {
        if queue.is_empty() {
            self.ready.push_back(to);
        }
        queue.push_back(d);
    }

    /// Hands the next datagram over in `buf` (whose old buffer is kept for
    /// reuse).
    pub(super) fn pop(
        &mut self,
        peers: &mut FxHashMap<SocketAddr, Peer>,
        buf: &mut Vec<u8>,
    ) -> Option<super::Transmit> {
        let (to, d, alone) = match self.control.pop_front() {
            Some(q) => (q.to, q.datagram, q.alone),
            None => loop {
                let to = *self.ready.front()?;
                let Some(queue) = peers.get_mut(&to).map(|p| &mut p.flow.sealed) else {
                    self.ready.pop_front();
                    continue;
                };
                let Some(d) = queue.pop_front() else {
                    self.ready.pop_front();
                    continue;
                };
                if queue.is_empty() {
                    self.ready.pop_front();
                }
                break (to, d, false);
            },
        };
        let size = d.len();
        let old = std::mem::replace(buf, d);
        self.recycle(old);
        Some(Transmit {
            destination: to,
            size,
            alone,
        })
    }
}
