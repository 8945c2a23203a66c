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
}
