//! The UDP driver: a non-blocking socket that moves many datagrams per
//! system call.
//!
//! [`UdpSocket::send`] hands up to 64 datagrams at a time to `sendmmsg(2)`,
//! each with **its own destination** (a lone datagram goes with plain
//! `sendto(2)`, which costs less), and cuts large batches into segments
//! in the kernel (`UDP_SEGMENT`, GSO) where it can; [`UdpSocket::recv`]
//! takes whatever is waiting with one `recvmmsg(2)` into a [`RecvBatch`],
//! whose datagrams come out as zero-copy [`Bytes`] slices of reused slots,
//! with coalesced runs (`UDP_GRO`) and the kernel's receive-drop counter
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

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64};

use bytes::Bytes;
use socket2::Socket;

use crate::sys;

mod batch;
mod recv;
mod send;
mod socket;
#[cfg(test)]
mod tests;

pub use batch::{AsyncUdpSocket, SendBatch, Sent};
pub use recv::{Datagrams, Received};
pub use send::Outgoing;
pub use socket::{MulticastInterface, UdpConfig};

// The two types below are declared here, their methods in the files above:
// rustc puts a method in the codegen unit of its type's module, so the
// receive path (`recv_inner` and the `RecvBatch` methods it calls) stays in
// one unit, where its small helpers inline, as when this was one file.

/// A non-blocking UDP socket that sends and receives in batches.
///
/// All methods take `&self`; one thread may send while another receives.
#[derive(Debug)]
pub struct UdpSocket {
    socket: Socket,
    v6: bool,
    /// Whether segmented sends go to the kernel whole; cleared when the
    /// kernel refuses one that it then takes segment by segment.
    gso: AtomicBool,
    /// The `SO_RCVTIMEO` last set, in µs (`u64::MAX`: none), so that
    /// `recv_wait` sets it only when it changes.
    recv_timeout: AtomicU64,
    /// The peer of a connected socket (see [`UdpSocket::connect`]).
    peer: std::sync::OnceLock<SocketAddr>,
    /// `UDP_GRO` is on: a buffer may be a coalesced run.
    gro: bool,
}

/// Reusable receive buffers for [`UdpSocket::recv`]; received datagrams
/// come out as zero-copy [`Bytes`] slices of their slots.
///
/// Each `recv` fills up to `slots` slots of `slot_size` bytes, one per
/// datagram (or GRO run). A slot is reused once every slice handed out
/// from it is dropped (the batch keeps a few free slots per slot for
/// that); otherwise a new one is mapped, so holding on to a payload is
/// safe, only costlier: a slice keeps its whole slot alive, so copy what
/// must live long (`Bytes::copy_from_slice`). New slots are anonymous
/// mappings, whose pages cost something only where datagrams land (see
/// `refill`). Use one batch per socket: the drop counter follows one
/// socket's count.
#[derive(Debug)]
pub struct RecvBatch {
    slot_size: usize,
    bufs: sys::RecvBufs,
    meta: Vec<sys::RecvMeta>,
    /// A buffer per slot for the next `recv`, nobody else holding them.
    ready: Vec<memmap2::MmapMut>,
    /// What the last `recv` filled, a [`Bytes`] per slot (each the owner
    /// of its slot), not yet drained.
    filled: Vec<Bytes>,
    /// Free slots, which slots come back to when their slices are dropped.
    pool: std::sync::Arc<recv::SlotPool>,
    /// Datagrams in `filled` not yet drained.
    count: usize,
    drops: u64,
    last_ovfl: u32,
}
