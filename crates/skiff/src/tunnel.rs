//! Tunnels (Iris): a reliable, ordered, flow-controlled message channel
//! between two endpoints, carried by a QMP association
//! ([`skiff_proto::association`]) that an [`Endpoint`](crate::Endpoint)
//! drives.
//!
//! What a [`Tunnel`] promises while it lives: every message sent is
//! delivered once and in order, or the tunnel fails on both sides and says
//! why ([`TunnelError`]). [`Tunnel::send`] waits while the send buffer is
//! full, so a slow reader slows the writer instead of growing memory (the
//! sending side holds at most `send_buffer` bytes plus a 64 KiB stage of
//! small messages gathered for the next packets); the receiving side holds
//! at most its association's window plus `tunnel_buffer` bytes of unread
//! messages.
//!
//! [`Tunnel::close`] closes both directions gracefully: the messages
//! already accepted by `send` are delivered, the peer's own queued messages
//! still arrive on `recv`, and `close` returns once both ends have seen
//! each other's last message. A `Tunnel` dropped without `close` closes
//! the same way in the background (messages arriving afterwards are
//! discarded and counted). [`TunnelStream`] adapts a tunnel to tokio's
//! [`AsyncRead`]/[`AsyncWrite`] for byte streams.

use std::fmt;
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use std::collections::VecDeque;

use bytes::{Buf, Bytes};
use skiff_proto::association::{bundle, AssociationStats, FailReason};
use skiff_proto::Message;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::endpoint::stage::{Inbound, Stage};
use crate::endpoint::Shared;

/// Why a tunnel operation failed, grouped by who is at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TunnelError {
    /// The peer or the path failed: nothing was heard from the peer for
    /// `idle_timeout`, it reset the tunnel, it broke the protocol, or it
    /// acknowledged nothing for `idle_timeout` while data waited.
    #[error("tunnel to {peer} failed: {reason}")]
    Failed {
        /// The peer.
        peer: SocketAddr,
        /// What the association saw.
        reason: FailReason,
    },
    /// No listener answered the set-up in time.
    #[error(
        "no answer from {peer} within the timeout; is `skiff cat --listen` (or another \
         listener for service {service}) running there, and is the port open?"
    )]
    ConnectTimeout {
        /// Where the set-up went.
        peer: SocketAddr,
        /// The service asked for.
        service: u32,
    },
    /// This side closed the tunnel (or dropped its endpoint); nothing more
    /// can be sent.
    #[error("the tunnel was closed on this side")]
    Closed,
    /// The peer closed the tunnel; nothing more can be sent, and `recv`
    /// returns what it sent before closing, then `None`.
    #[error("the peer closed the tunnel")]
    PeerClosed,
    /// The endpoint that drove this tunnel is gone (dropped, or its driver
    /// stopped on a system error).
    #[error("the endpoint driving this tunnel was dropped or stopped")]
    EndpointGone,
    /// The endpoint does not accept tunnels: call
    /// [`Endpoint::listen`](crate::Endpoint::listen) first.
    #[error("this endpoint is not listening; call Endpoint::listen before accept")]
    NotListening,
    /// The message is larger than either end accepts (`max_message`).
    #[error("message of {len} bytes is over the limit of {max} bytes (max_message)")]
    TooLarge {
        /// The message's size.
        len: usize,
        /// The limit in force.
        max: u64,
    },
}

impl From<TunnelError> for io::Error {
    fn from(e: TunnelError) -> io::Error {
        let kind = match &e {
            TunnelError::Failed {
                reason: FailReason::Reset,
                ..
            } => io::ErrorKind::ConnectionReset,
            TunnelError::Failed { .. } | TunnelError::EndpointGone => {
                io::ErrorKind::ConnectionAborted
            }
            TunnelError::ConnectTimeout { .. } => io::ErrorKind::TimedOut,
            TunnelError::Closed | TunnelError::PeerClosed => io::ErrorKind::BrokenPipe,
            TunnelError::NotListening => io::ErrorKind::NotConnected,
            TunnelError::TooLarge { .. } => io::ErrorKind::InvalidInput,
        };
        io::Error::new(kind, e)
    }
}

/// One end of a tunnel; see the module documentation.
///
/// Methods take `&self`, so one task may send while another receives
/// (share it with `Arc`). Dropping it closes the tunnel gracefully in the
/// background.
pub struct Tunnel {
    pub(crate) shared: Arc<Shared>,
    pub(crate) key: u64,
    pub(crate) peer: SocketAddr,
    /// Its send and receive stages (shared with the endpoint's core).
    pub(crate) stage: Arc<Stage>,
}

impl fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tunnel")
            .field("peer", &self.peer)
            .field("key", &format_args!("{:#x}", self.key))
            .finish()
    }
}

impl Tunnel {
    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Sends one message, waiting while the send buffer is full. Returns
    /// once the message is accepted (it is then delivered unless the tunnel
    /// fails, which `recv` and later `send`s report).
    ///
    /// Small messages are gathered while data is in flight: they leave at
    /// once when nothing is; else when the data in flight is acknowledged
    /// (within a round trip) or, behind a lone small packet, at the
    /// endpoint driver's next wake-up; and when 64 KiB waits, on
    /// [`Tunnel::flush`], when this tunnel's `recv` is about to wait, on
    /// close. Each stays one message for the peer.
    pub async fn send(&self, msg: impl Into<Bytes>) -> Result<(), TunnelError> {
        let msg = msg.into();
        // A small message is staged without waiting (and without a second
        // reference to it); another, or one that finds the stage full,
        // waits its turn.
        let msg = match self.shared.stage_send(self.key, &self.stage, msg) {
            Ok(()) => return Ok(()),
            Err(msg) => msg,
        };
        poll_fn(|cx| self.poll_send(cx, &msg)).await
    }

    /// Sends a [`Message`]'s payload (subject, type and fields are not
    /// carried: a tunnel moves bytes between two ends that know each
    /// other).
    pub async fn send_message(&self, msg: &Message) -> Result<(), TunnelError> {
        self.send(msg.payload.clone()).await
    }

    /// Offers `msg` without waiting: `Pending` (with the waker registered)
    /// while the send buffer is full.
    pub fn poll_send(&self, cx: &mut Context<'_>, msg: &Bytes) -> Poll<Result<(), TunnelError>> {
        self.shared.poll_send(self.key, &self.stage, cx, msg)
    }

    /// Sends the small messages `send` gathered now, without waiting for
    /// the endpoint's driver (see [`Tunnel::send`]).
    pub fn flush(&self) {
        self.shared.flush(self.key);
    }

    /// Writes stream bytes without waiting: `Pending` (with the waker
    /// registered) while the send buffer is full, else how many bytes were
    /// taken. Consecutive writes are gathered into one message, as a TCP
    /// send buffer gathers small writes: they leave at once when a packet's
    /// worth waits or nothing is in flight, else when the data in flight is
    /// acknowledged (Nagle's rule, with no timer of its own; a lone small
    /// packet's acknowledgement may be delayed by up to half the probe
    /// timeout, so a write that must not wait behind an earlier one goes
    /// with [`Tunnel::send`]). The peer receives them as messages of
    /// any length: read them as one byte stream ([`TunnelStream`]), and do
    /// not mix `write` with [`Tunnel::send`] on a tunnel whose reader
    /// expects the message boundaries.
    pub fn poll_write(
        &self,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<Result<usize, TunnelError>> {
        self.shared.poll_write(self.key, cx, data)
    }

    /// Writes all of `data` as stream bytes, waiting for room; see
    /// [`Tunnel::poll_write`].
    pub async fn write_all(&self, mut data: &[u8]) -> Result<(), TunnelError> {
        while !data.is_empty() {
            let n = poll_fn(|cx| self.poll_write(cx, data)).await?;
            data = &data[n..];
        }
        Ok(())
    }

    /// The next message, in order; `Ok(None)` once the tunnel closed
    /// gracefully and every message was read; an error if it failed.
    pub async fn recv(&self) -> Result<Option<Bytes>, TunnelError> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// The next message without waiting; see [`Tunnel::recv`].
    pub fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, TunnelError>> {
        self.shared.poll_recv(self.key, &self.stage, cx)
    }

    /// Waits for the next messages and appends up to `max` of them to
    /// `out`, in order; returns how many (at least one), or `Ok(0)` once
    /// the tunnel closed gracefully and every message was read (and at
    /// once if `max` is 0); an error if it failed. The same messages as
    /// that many [`Tunnel::recv`]s, taken under one lock: for a reader of
    /// a stream of small messages, which then pays the tunnel's per-call
    /// work once per batch instead of once per message. A message larger
    /// than a packet (it arrived in pieces, joined here) is returned alone,
    /// so its buffer can be reused for the next once dropped.
    pub async fn recv_many(&self, out: &mut Vec<Bytes>, max: usize) -> Result<usize, TunnelError> {
        poll_fn(|cx| self.poll_recv_many(cx, out, max)).await
    }

    /// [`Tunnel::recv_many`] without waiting: `Pending` (the task woken
    /// when messages arrive) if none is ready.
    pub fn poll_recv_many(
        &self,
        cx: &mut Context<'_>,
        out: &mut Vec<Bytes>,
        max: usize,
    ) -> Poll<Result<usize, TunnelError>> {
        if max == 0 {
            return Poll::Ready(Ok(0));
        }
        self.shared
            .poll_recv_many(self.key, &self.stage, cx, out, max)
    }

    /// Waits for the next messages and lends up to `max` of them to `f`,
    /// in order, one call each; returns how many (at least one), or
    /// `Ok(0)` once the tunnel closed gracefully and every message was
    /// read (and at once if `max` is 0); an error if it failed. The same
    /// messages as [`Tunnel::recv_many`], for a reader that is done with
    /// each message when `f` returns (one that parses, counts or copies
    /// it): a small message is lent where it lies in the received packet,
    /// with no [`Bytes`] made and dropped for it (each is a reference
    /// count taken and given back, shared with the endpoint's driver).
    pub async fn recv_each(
        &self,
        max: usize,
        mut f: impl FnMut(&[u8]),
    ) -> Result<usize, TunnelError> {
        poll_fn(|cx| self.poll_recv_each(cx, max, &mut f)).await
    }

    /// [`Tunnel::recv_each`] without waiting: `Pending` (the task woken
    /// when messages arrive) if none is ready.
    pub fn poll_recv_each(
        &self,
        cx: &mut Context<'_>,
        max: usize,
        mut f: impl FnMut(&[u8]),
    ) -> Poll<Result<usize, TunnelError>> {
        if max == 0 {
            return Poll::Ready(Ok(0));
        }
        self.shared
            .poll_recv_each(self.key, &self.stage, cx, max, &mut f)
    }

    /// The next message, in order, as slices appended to `out` (they
    /// joined are the message): one, or for a message larger than a
    /// packet the pieces it arrived in, which [`Tunnel::recv`] copies into
    /// one buffer and this does not. Returns the message's length, or
    /// `Ok(None)` once the tunnel closed gracefully and every message was
    /// read; an error if it failed. For a reader that can take a message
    /// in pieces (one that writes it out, hashes it or parses a stream).
    pub async fn recv_parts(&self, out: &mut Vec<Bytes>) -> Result<Option<usize>, TunnelError> {
        poll_fn(|cx| self.poll_recv_parts(cx, out)).await
    }

    /// [`Tunnel::recv_parts`] without waiting: `Pending` (the task woken
    /// when a message arrives) if none is ready.
    pub fn poll_recv_parts(
        &self,
        cx: &mut Context<'_>,
        out: &mut Vec<Bytes>,
    ) -> Poll<Result<Option<usize>, TunnelError>> {
        self.shared.poll_recv_parts(self.key, &self.stage, cx, out)
    }

    /// Closes both directions gracefully and waits until both ends have
    /// delivered everything (see the module documentation). Messages the
    /// peer sent before closing stay readable with `recv`.
    pub async fn close(&self) -> Result<(), TunnelError> {
        self.shared.start_close(self.key);
        poll_fn(|cx| self.shared.poll_closed(self.key, cx)).await
    }

    /// The association's counters (retransmissions, duplicates, window
    /// probes, everything dropped).
    pub fn stats(&self) -> AssociationStats {
        self.shared.tunnel_stats(self.key)
    }

    /// The smoothed round-trip time, once measured.
    pub fn rtt(&self) -> Option<std::time::Duration> {
        self.shared.tunnel_rtt(self.key)
    }

    /// A byte-stream view of this tunnel (tokio `AsyncRead`/`AsyncWrite`).
    pub fn into_stream(self) -> TunnelStream {
        TunnelStream {
            tunnel: self,
            read: VecDeque::new(),
            eof: false,
            chunk: 64 << 10,
        }
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        let unread = self.stage.rx.lock().messages();
        self.shared.drop_tunnel(self.key, unread);
    }
}

/// A tunnel as a byte stream: writes are gathered into messages of at most
/// 64 KiB ([`Tunnel::poll_write`]), reads return the bytes of the messages
/// in order; `shutdown`
/// closes the tunnel gracefully (both directions) and read returns 0 once
/// the peer closed and everything was read.
#[derive(Debug)]
pub struct TunnelStream {
    tunnel: Tunnel,
    /// Bytes received and not yet read: one message, or the pieces of a
    /// large one, copied out as they are (never joined first).
    read: VecDeque<Bytes>,
    eof: bool,
    chunk: usize,
}

impl TunnelStream {
    /// The tunnel underneath.
    pub fn tunnel(&self) -> &Tunnel {
        &self.tunnel
    }

    /// Sets the most bytes one `poll_write` takes (default 64 KiB).
    pub fn set_chunk(&mut self, bytes: usize) {
        self.chunk = bytes.max(1);
    }
}

impl AsyncRead for TunnelStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while this.read.is_empty() && !this.eof {
            let t = &this.tunnel;
            match t.shared.poll_recv_inbound(t.key, &t.stage, cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(Some(Inbound::Whole(b)))) => this.read.push_back(b),
                Poll::Ready(Ok(Some(Inbound::Pieces(p)))) => this.read.extend(p.into_parts()),
                Poll::Ready(Ok(Some(Inbound::Bundle(b)))) => this.read.extend(bundle::records(b)),
                Poll::Ready(Ok(None)) => this.eof = true,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
            }
            // Empty messages and pieces carry nothing to read.
            this.read.retain(|b| !b.is_empty());
        }
        while buf.remaining() > 0 {
            let Some(b) = this.read.front_mut() else {
                break;
            };
            let n = b.len().min(buf.remaining());
            buf.put_slice(&b[..n]);
            b.advance(n);
            if b.is_empty() {
                this.read.pop_front();
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for TunnelStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = buf.len().min(this.chunk);
        this.tunnel
            .poll_write(cx, &buf[..n])
            .map_err(io::Error::from)
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Written bytes are in the tunnel's reliable send buffer already,
        // and leave without a flush (as a TCP socket's); messages `send`
        // gathered leave now.
        self.tunnel.flush();
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let t = &self.get_mut().tunnel;
        t.shared.start_close(t.key);
        t.shared.poll_closed(t.key, cx).map_err(io::Error::from)
    }
}
