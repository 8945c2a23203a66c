//! The UDP driver: a non-blocking socket that moves many datagrams per
//! system call.
//!
//! [`UdpSocket::send`] hands up to 64 datagrams at a time to `sendmmsg(2)`,
//! each with **its own destination** (a lone datagram goes with plain
//! `sendto(2)`, which costs less), and cuts large batches into segments
//! in the kernel (`UDP_SEGMENT`, GSO) where it can; [`UdpSocket::recv`]
//! takes whatever is waiting with one `recvmmsg(2)` into a [`RecvBatch`],
//! whose datagrams come out as zero-copy [`Bytes`](bytes::Bytes) slices of
//! one arena, with
//! coalesced runs (`UDP_GRO`) and the kernel's receive-drop counter
//! (`SO_RXQ_OVFL`). [`UdpSocket::recv_wait`], the blocking receive of a
//! request/reply exchange, is instead one plain `recvfrom(2)`, the cheapest
//! receive the kernel has, which reports neither (see there). It promises
//! nothing about delivery; it does promise that the kernel's drops are
//! visible ([`RecvBatch::kernel_drops`], [`UdpSocket::kernel_drops`]) and
//! that a datagram larger than a slot is flagged, never silently cut.
//!
//! For many datagrams to many peers, collect them in a [`SendBatch`]:
//! [`UdpSocket::try_send_batch`] sends it in as few system calls as the
//! kernel allows (64 datagrams or GSO runs per `sendmmsg`), and
//! [`AsyncUdpSocket`] does that from a tokio task, waiting for room when
//! the send buffer is full, and receives into a [`RecvBatch`] when
//! datagrams arrive.
//!
//! Why not `quinn-udp`: it sends one destination per call (QUIC talks to
//! one peer per connection), while the queue (CMQ) batches per destination
//! and flushes many destinations at once, which needs `sendmmsg` across
//! destinations; and it does not read `SO_RXQ_OVFL`, without which receive
//! buffer overflows would be silent loss.
//!
//! Linux only. All system calls live in the crate's `sys` module. The
//! code: `socket` binds and sets options (and multicast), `send` is the
//! batched send (`sendmmsg`, GSO), `recv` the batched receive (`recvmmsg`,
//! GRO, the drop counter), `batch` the [`SendBatch`] and tokio API on top.

mod batch;
mod recv;
mod send;
mod socket;
#[cfg(test)]
mod tests;

pub use batch::{AsyncUdpSocket, SendBatch, Sent};
pub use recv::{Datagrams, Received, RecvBatch};
pub use send::Outgoing;
pub use socket::{MulticastInterface, UdpConfig, UdpSocket};
