//! Gathered stream writes on a node-relayed [`Tunnel`]: many small
//! [`Tunnel::write_all`] calls leave as few `TunData` frames (one tunnel
//! message each), as a TCP send buffer gathers small writes into segments.
//!
//! Writes append to the tunnel's gather buffer (at most [`GATHER_MAX`]
//! bytes; a writer waits while it is full). One flusher task per tunnel
//! takes everything gathered as one message and sends it, waiting for the
//! peer's window like any `send`; while it sends or waits, further writes
//! gather behind it. So a lone write leaves at once (nothing in flight: the
//! flusher is idle), and a burst leaves in messages of up to `GATHER_MAX`
//! bytes, fewer the faster it comes; no timer holds bytes back.
//!
//! Dropping the tunnel with bytes still gathered hands the close to the
//! flusher, which sends them first and then closes (as dropping a
//! [`crate::Tunnel`] closes it gracefully in the background).
//!
//! Lock order: the gather lock is never held while taking the tunnel's
//! state lock or calling into the link.

use std::sync::Arc;

use bytes::BytesMut;
use skiff_proto::client_frame::ClientFrame;
use skiff_proto::Message;
use tokio::sync::Notify;

use super::cluster::{send_on, TunShared, Tunnel};
use super::Inner;
use crate::Error;

/// Most bytes gathered into one tunnel message.
pub(crate) const GATHER_MAX: usize = 64 << 10;

/// A tunnel's gathered writes, shared by its writers and its flusher.
#[derive(Debug, Default)]
pub(crate) struct Gather {
    buf: BytesMut,
    /// A flusher task runs for this tunnel.
    running: bool,
    /// The flusher holds bytes taken from `buf` and not yet handed to the
    /// link.
    busy: bool,
    /// The tunnel was dropped: the flusher closes it once `buf` is sent.
    close_after: bool,
    /// The flusher failed to send (the tunnel ended); writes fail.
    failed: bool,
    /// Messages the flusher sent (tests and stats read it).
    messages: u64,
}

/// The gather buffer's wake-ups: the flusher waits on `work`, writers and
/// `flush` on `room`.
#[derive(Debug, Default)]
pub(crate) struct GatherWake {
    pub(super) work: Notify,
    room: Notify,
}

impl Tunnel {
    /// Writes `data` as stream bytes, gathered with the writes before and
    /// after it into messages of up to 64 KiB (see the module
    /// documentation of `tunnel_write`): what a TCP connection carrying
    /// small records does, in far fewer frames than one [`Tunnel::send`]
    /// per record. Returns once the bytes are gathered (they then leave
    /// without a flush); waits while 64 KiB wait already. The peer receives
    /// messages of any length: read them as one byte stream, and do not mix
    /// `write_all` with `send` on a tunnel whose reader expects message
    /// boundaries.
    pub async fn write_all(&self, mut data: &[u8]) -> Result<(), Error> {
        let sh = &self.shared;
        while !data.is_empty() {
            let room = sh.wake.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            sh.check_open()?;
            {
                let mut g = sh.gather.lock();
                if g.failed {
                    return Err(Error::Closed);
                }
                let space = GATHER_MAX.saturating_sub(g.buf.len());
                if space > 0 {
                    let n = space.min(data.len());
                    g.buf.extend_from_slice(&data[..n]);
                    data = &data[n..];
                    if !g.running {
                        g.running = true;
                        drop(g);
                        let (inner, id, epoch) = (self.inner.clone(), self.id, self.epoch);
                        tokio::spawn(flusher(inner, id, epoch, sh.clone()));
                    } else {
                        drop(g);
                        sh.wake.work.notify_one();
                    }
                    continue;
                }
            }
            room.await;
        }
        Ok(())
    }

    /// Waits until every byte written with [`Tunnel::write_all`] is handed
    /// to the connection (not until the peer has it: that is `recv`'s
    /// business on the other side).
    pub async fn flush(&self) -> Result<(), Error> {
        let sh = &self.shared;
        loop {
            let room = sh.wake.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let g = sh.gather.lock();
                if g.failed {
                    drop(g);
                    sh.check_open()?;
                    return Err(Error::Closed);
                }
                if g.buf.is_empty() && !g.busy {
                    return Ok(());
                }
            }
            room.await;
        }
    }

    /// Tunnel messages that gathered writes went out as so far.
    pub fn gathered_messages(&self) -> u64 {
        self.shared.gather.lock().messages
    }

    /// At drop: whether the flusher takes over the close (bytes are still
    /// gathered or being sent); it then sends them and closes.
    pub(crate) fn hand_close_to_flusher(&self) -> bool {
        let mut g = self.shared.gather.lock();
        if !g.running || (g.buf.is_empty() && !g.busy) || g.failed {
            return false;
        }
        g.close_after = true;
        drop(g);
        self.shared.wake.work.notify_one();
        true
    }
}

/// Sends what gathers on tunnel `id` until the tunnel ends; see the module
/// documentation.
async fn flusher(inner: Arc<Inner>, id: u64, epoch: u32, sh: Arc<TunShared>) {
    loop {
        let work = sh.wake.work.notified();
        tokio::pin!(work);
        work.as_mut().enable();
        let (chunk, close) = {
            let mut g = sh.gather.lock();
            let chunk = (!g.buf.is_empty()).then(|| g.buf.split().freeze());
            g.busy = chunk.is_some();
            (chunk, g.close_after)
        };
        match chunk {
            Some(bytes) => {
                sh.wake.room.notify_waiters();
                let r = send_on(&inner, id, &sh, Message::new("", bytes)).await;
                let mut g = sh.gather.lock();
                g.busy = false;
                if r.is_err() {
                    g.failed = true;
                    g.buf.clear();
                    drop(g);
                    sh.wake.room.notify_waiters();
                    if close {
                        close_tunnel(&inner, id, epoch, &sh);
                    }
                    return;
                }
                g.messages += 1;
                drop(g);
                sh.wake.room.notify_waiters();
            }
            None if close => {
                close_tunnel(&inner, id, epoch, &sh);
                return;
            }
            None => {
                if sh.is_ended() {
                    let mut g = sh.gather.lock();
                    g.failed = true;
                    g.running = false;
                    drop(g);
                    sh.wake.room.notify_waiters();
                    return;
                }
                work.await;
            }
        }
    }
}

/// Closes tunnel `id` as dropping it does (the flusher's part of a drop
/// handed over to it).
fn close_tunnel(inner: &Inner, id: u64, epoch: u32, sh: &TunShared) {
    sh.close_local();
    if inner.epoch() == epoch {
        inner.forget_tunnel(id);
        let _ = inner.send_now(ClientFrame::TunClose { tunnel: id });
    }
}
