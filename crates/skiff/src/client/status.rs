//! What a client reports about its link to the node: the [`Gap`] of a
//! failover, the [`ClientEvent`]s, and the [`LinkStats`] counters. Plain
//! values, with no behaviour.

use std::time::{Duration, SystemTime};

/// A window during which the client had no node: messages published then
/// (and requests, broadcasts for its clusters) may have been missed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// The node that was lost, as in the locator (`skiff://host:port` or
    /// `unix:///path`).
    pub from: String,
    /// The node reached.
    pub to: String,
    /// When the lost node was last heard from (wall clock): the gap begins
    /// with the last bytes read from it, not when its loss was noticed.
    pub down_at: SystemTime,
    /// When the new node welcomed the client (wall clock).
    pub up_at: SystemTime,
    /// How long the client heard from no node (monotonic clock): from the
    /// last bytes read from the lost node to the new node's welcome.
    pub down_for: Duration,
    /// Connection attempts it took.
    pub attempts: u32,
}

/// What happened to a client's link to its node (see
/// [`super::Client::events`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientEvent {
    /// The link to `node` was lost; the client is failing over. Calls in
    /// flight failed with [`crate::Error::NodeLost`].
    Disconnected {
        /// The node lost.
        node: String,
        /// When (wall clock).
        at: SystemTime,
        /// Why: end of stream, an error, or no answer to pings.
        reason: String,
    },
    /// The client reached another node (or the same one again) and that
    /// node now holds every restored subscription and membership.
    Reconnected(Gap),
    /// The client is closed for good (by the application, or the node
    /// closed it with an error); no more events follow.
    Closed {
        /// Why.
        reason: String,
    },
    /// Publishes the lost node may not have taken: written (or queued) to
    /// it and not confirmed before it was lost. Sent right after
    /// [`ClientEvent::Disconnected`]; take them back with
    /// [`super::Client::unconfirmed`] to publish them again.
    Unconfirmed(Unconfirmed),
}

/// Which publishes may not have reached a lost node. Publishes are
/// numbered 1, 2, 3, … in the order the client made them, over its whole
/// life (across failovers).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unconfirmed {
    /// The node lost.
    pub node: String,
    /// The first publish not confirmed (every one before it was).
    pub first: u64,
    /// The last publish made before the loss was noticed.
    pub last: u64,
    /// Of `first..=last`, how many the client still holds (the newest),
    /// for [`super::Client::unconfirmed`].
    pub held: u64,
    /// Of `first..=last`, how many were forgotten to keep the buffer of
    /// unconfirmed publishes within `unconfirmed_buffer` (the oldest).
    pub forgotten: u64,
    /// The distinct subjects of the publishes held (at most 16).
    pub subjects: Vec<String>,
}

impl std::fmt::Display for Unconfirmed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "publishes {}-{} ({} message(s)) may not have reached node {}",
            self.first,
            self.last,
            self.last + 1 - self.first,
            self.node
        )?;
        if !self.subjects.is_empty() {
            write!(f, " (subjects: {})", self.subjects.join(", "))?;
        }
        if self.forgotten > 0 {
            write!(
                f,
                "; the first {} of them were forgotten (unconfirmed_buffer full)",
                self.forgotten
            )?;
        }
        Ok(())
    }
}

/// Counters of a client's link: failovers and what happened to publishes
/// made while it had no node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LinkStats {
    /// The node connected to now (`None` while failing over, in process or
    /// closed).
    pub node: Option<String>,
    /// Failovers completed.
    pub failovers: u64,
    /// Publishes and broadcasts held while no node was reachable (sent
    /// after the restore).
    pub held: u64,
    /// Publishes and broadcasts refused with [`crate::Error::NodeLost`] while no
    /// node was reachable (buffer full or `reconnect_buffer=0`).
    pub refused: u64,
    /// Publishes sent and not yet confirmed by the node (held to be
    /// reported, and taken back, should the node be lost).
    pub unconfirmed: u64,
    /// Unconfirmed publishes forgotten because `unconfirmed_buffer` was
    /// full (the oldest first), or never taken back after a loss.
    pub forgotten: u64,
    /// Publishes a lost node may not have taken, over every failover
    /// ([`ClientEvent::Unconfirmed`]).
    pub maybe_lost: u64,
}
