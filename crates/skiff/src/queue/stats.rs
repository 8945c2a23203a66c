//! A queue's counters, the same for both kinds: what was sent and
//! received, what was lost, and every drop by its reason.

/// Counters of one queue. Everything dropped on purpose is in `dropped`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueStats {
    /// Messages handed to the kernel.
    pub sent_messages: u64,
    /// Bytes handed to the kernel (datagram bytes, headers included).
    pub sent_bytes: u64,
    /// Datagrams handed to the kernel.
    pub sent_batches: u64,
    /// System calls that sent (one may carry many datagrams).
    pub send_calls: u64,
    /// Messages delivered to `pop`.
    pub recv_messages: u64,
    /// Bytes of accepted datagrams.
    pub recv_bytes: u64,
    /// Datagrams accepted.
    pub recv_batches: u64,
    /// Messages numbered by a source for this queue that never arrived.
    pub lost: u64,
    /// Gaps later filled by a late (reordered) message.
    pub recovered: u64,
    /// Drops by reason.
    pub dropped: Drops,
}

/// Drop counters by reason. Datagram-level reasons count datagrams;
/// message-level ones count messages.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Drops {
    /// Datagrams not starting with skiff's magic.
    pub foreign: u64,
    /// Datagrams of another wire version.
    pub version: u64,
    /// Datagrams of a frame kind this queue does not handle.
    pub kind: u64,
    /// Datagrams cut short.
    pub truncated: u64,
    /// Datagrams that do not decode.
    pub malformed: u64,
    /// Datagrams with a length over a limit.
    pub oversized: u64,
    /// Datagrams for another endpoint id.
    pub endpoint: u64,
    /// Messages received twice.
    pub duplicate: u64,
    /// Messages older than the reorder window (already counted lost).
    pub stale: u64,
    /// Datagrams the kernel dropped because the receive buffer was full.
    pub kernel: u64,
    /// Outgoing messages dropped because the send backlog was full.
    pub backlog: u64,
    /// Outgoing messages dropped because the kernel refused the send.
    pub send_error: u64,
    /// Sources forgotten because `max_sources` was reached.
    pub sources_evicted: u64,
    /// Messages numbered too far ahead of their stream (over 65,536 above
    /// its highest), refused while the stream is alive: a forgery, or a
    /// new epoch of the source not yet confirmed by its old stream's
    /// silence.
    pub far_ahead: u64,
    /// Reliable queues: messages pushed that may not have arrived, because
    /// their association failed before acknowledging them (or the peer's
    /// `max_message` refused them). Always 0 on a datagram queue.
    pub unconfirmed: u64,
}

impl Drops {
    pub(super) fn count_wire(&mut self, reason: &str) {
        match reason {
            "foreign" => self.foreign += 1,
            "version" => self.version += 1,
            "kind" => self.kind += 1,
            "truncated" => self.truncated += 1,
            "oversized" => self.oversized += 1,
            _ => self.malformed += 1,
        }
    }

    /// Sum over all reasons.
    pub fn total(&self) -> u64 {
        self.foreign
            + self.version
            + self.kind
            + self.truncated
            + self.malformed
            + self.oversized
            + self.endpoint
            + self.duplicate
            + self.stale
            + self.far_ahead
            + self.kernel
            + self.backlog
            + self.send_error
            + self.unconfirmed
    }
}
