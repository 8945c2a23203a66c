//! A tunnel's staging areas, outside the endpoint's core lock: small
//! messages given to [`Tunnel::send`](crate::Tunnel::send) wait in the send
//! stage until 64 KiB (or a packet's worth, if more) is staged or a moment comes when TCP's
//! Nagle rule would send (nothing in flight, an acknowledgement arrives,
//! the caller flushes, `recv` is about to wait, close); then they move into
//! the association together, under one acquisition of the core lock. On
//! the receiving side, `recv` takes every message the core holds for the
//! tunnel at once into the receive stage and serves the following `recv`s
//! from there. A small message then costs its sender and its reader a
//! short lock of their own instead of the core lock (which the driver and
//! the other direction contend for) and the association's work per call.
//!
//! What stays as it was: order (staged messages enter the association in
//! the order they were staged, and anything sent another way first moves
//! the stage into the association), boundaries (each staged message is one
//! association message), flow control (the stage holds at most about one
//! packet's worth; beyond that `send` waits for the association to take
//! it), and close (the stage moves into the association before its close;
//! while the association has no room the close waits for it).
//!
//! Lock order: a tunnel's `rx`, then the endpoint's core, then the
//! tunnel's `tx`. Whoever holds `tx` takes no other lock.

use std::collections::VecDeque;

use bytes::Bytes;
use parking_lot::Mutex;

/// The send stage; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct SendStage {
    /// Messages staged, oldest first.
    pub(crate) msgs: VecDeque<Bytes>,
    /// Their bytes.
    pub(crate) bytes: usize,
    /// Staged bytes that make the sender move the stage itself (at least a
    /// packet's worth; 0 until the core set it: stage nothing).
    pub(crate) flush_at: usize,
    /// The largest message staged; larger ones go to the association at
    /// once (after the stage).
    pub(crate) small: usize,
    /// The association holds unacknowledged data: its acknowledgement
    /// will come, and the core moves the stage then. Otherwise the sender
    /// moves the stage itself.
    pub(crate) busy: bool,
    /// The tunnel is closing or ended: nothing more is staged (the sender
    /// goes to the core, which says why).
    pub(crate) shut: bool,
}

impl SendStage {
    /// Stages `msg` if it is small and there is room: `Some(flush)` (the
    /// sender should move the stage into the association now), `None` if
    /// it was not staged.
    #[inline]
    pub(crate) fn offer(&mut self, msg: &Bytes) -> Option<bool> {
        let len = msg.len();
        if self.shut || len > self.small || self.bytes >= self.flush_at {
            return None;
        }
        self.msgs.push_back(msg.clone());
        self.bytes += len;
        Some(!self.busy || self.bytes >= self.flush_at)
    }

    /// [`SendStage::offer`] for a message the caller gives away: `Ok(flush)`
    /// if staged, else the message back.
    #[inline]
    pub(crate) fn offer_owned(&mut self, msg: Bytes) -> Result<bool, Bytes> {
        let len = msg.len();
        if self.shut || len > self.small || self.bytes >= self.flush_at {
            return Err(msg);
        }
        self.msgs.push_back(msg);
        self.bytes += len;
        Ok(!self.busy || self.bytes >= self.flush_at)
    }

    /// Takes every staged message out (on shutdown).
    pub(crate) fn clear(&mut self) -> usize {
        let n = self.msgs.len();
        self.msgs.clear();
        self.bytes = 0;
        n
    }
}

/// Both stages of one tunnel, shared by its handle and the core.
#[derive(Debug, Default)]
pub(crate) struct Stage {
    /// Small messages on their way into the association.
    pub(crate) tx: Mutex<SendStage>,
    /// Messages taken from the core for `recv`, oldest first.
    pub(crate) rx: Mutex<VecDeque<Bytes>>,
}
