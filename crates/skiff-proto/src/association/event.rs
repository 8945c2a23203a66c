//! What an association reports and refuses: its [`Event`]s, why it
//! closed or failed, why a send was refused, the datagrams it hands out
//! ([`Transmit`]), its [`State`] and its counters.

use std::net::SocketAddr;

use bytes::Bytes;

#[cfg(doc)]
use super::Association;

/// Something the application should know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The set-up completed; messages flow.
    Connected,
    /// A whole message from the peer, in order.
    Message(Bytes),
    /// A bundle of small messages from the peer, in order, each a message
    /// of its own: split it with [`bundle::split_next`](super::bundle::split_next)
    /// (the association checked it). Only once both ends offered bundles
    /// ([`AssociationConfig::bundles`](super::AssociationConfig::bundles)).
    Bundle(Bytes),
    /// A whole message from the peer, in order, in the pieces it arrived
    /// in: a message larger than one packet, delivered so only when
    /// [`AssociationConfig::deliver_pieces`](super::AssociationConfig::deliver_pieces)
    /// is set (else it comes joined, as [`Event::Message`]).
    Pieces(Pieces),
    /// [`Association::send`] refused with [`SendError::WouldBlock`] earlier
    /// and now has room.
    Writable,
    /// Both sides closed and every message was delivered. Last event.
    Closed(CloseReason),
    /// The association is gone; messages not yet acknowledged may not have
    /// arrived. Last event.
    Failed(FailReason),
}

/// A message in the pieces it arrived in: slices of the receive buffers,
/// in order, not copied. The application joins them (or copies them out
/// where it wants them) on its own thread, so the thread that receives
/// packets does not copy every byte of a large message once more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pieces {
    parts: Vec<Bytes>,
    len: usize,
}

impl Pieces {
    /// The pieces of a message of `len` bytes (their lengths add up to it).
    pub(super) fn new(parts: Vec<Bytes>, len: usize) -> Pieces {
        debug_assert_eq!(parts.iter().map(Bytes::len).sum::<usize>(), len);
        Pieces { parts, len }
    }

    /// The message's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the message is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pieces, in order.
    pub fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    /// The pieces, in order, to read without joining them.
    pub fn into_parts(self) -> Vec<Bytes> {
        self.parts
    }

    /// The message in one buffer: a copy into a new one.
    pub fn join(self) -> Bytes {
        self.join_reusing(&mut Bytes::new())
    }

    /// The message in one buffer: a copy into `spare` if the application
    /// has dropped every other handle of it and it is large enough (no
    /// allocation, no fresh pages), else into a new buffer. The result
    /// becomes the next `spare` when at most 256 KiB (a message the
    /// application keeps holds its own buffer, nothing more).
    pub fn join_reusing(mut self, spare: &mut Bytes) -> Bytes {
        super::recv::join(&mut self.parts, self.len, spare)
    }
}

/// Who started a graceful close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// This side called [`Association::close`] first.
    Local,
    /// The peer closed first.
    Peer,
}

/// Why an association failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FailReason {
    /// Nothing was heard from the peer for `idle_timeout`.
    #[error("peer silent for longer than idle_timeout; it or the path is down")]
    PeerDead,
    /// The set-up did not complete within `handshake_timeout`.
    #[error("set-up not answered within handshake_timeout; is a listener running there?")]
    HandshakeTimeout,
    /// The peer aborted the association.
    #[error("the peer reset the association")]
    Reset,
    /// The peer answers but acknowledged nothing new for `idle_timeout`
    /// while data waited (a path that drops large packets does this).
    #[error(
        "no acknowledgement progress for idle_timeout; \
         is the path's MTU smaller than the configured mtu?"
    )]
    Stalled,
    /// The peer broke the protocol.
    #[error("protocol violation by the peer: {0}")]
    Protocol(&'static str),
    /// This end aborted it ([`super::Association::abort`]).
    #[error("aborted by this end")]
    Aborted,
}

/// Why [`Association::send`] refused a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The send buffer is full; wait for [`Event::Writable`] and retry.
    #[error("send buffer full; retry after Event::Writable")]
    WouldBlock,
    /// The association is closing, closed or failed.
    #[error("association closed; no more messages can be sent")]
    Closed,
    /// The message is larger than either end accepts.
    #[error("message of {len} bytes is over the limit of {max} (max_message)")]
    TooLarge {
        /// The message's size.
        len: usize,
        /// The limit in force.
        max: u64,
    },
    /// A bundle for a peer that did not offer bundles at set-up.
    #[error("the peer does not take bundles")]
    Unsupported,
}

/// A datagram to send: its bytes are at the start of the buffer given to
/// `poll_transmit` (the last `size` bytes of the one given to
/// `poll_transmit_append`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Where to send it.
    pub destination: SocketAddr,
    /// Its length.
    pub size: usize,
    /// Send it in a datagram of its own, never packed with other frames:
    /// it is the second copy of a packet, which must not share the fate of
    /// the first.
    pub alone: bool,
}

/// Where an association stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// The initiator sent FIRST and waits for the answer.
    Connecting,
    /// The listener answered a FIRST and waits to hear the initiator again.
    HalfOpen,
    /// Set up; messages flow.
    Established,
    /// A sentinel is pending or sent; messages already accepted still flow.
    Closing,
    /// Closed; lingering to acknowledge retransmissions.
    Closed,
    /// Finished (closed or failed); nothing more will happen.
    Drained,
}

/// Counters an association keeps. Every dropped input increments one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AssociationStats {
    /// Datagrams handed out by `poll_transmit`.
    pub packets_sent: u64,
    /// Valid packets taken in.
    pub packets_received: u64,
    /// Messages accepted by `send`, and messages made of bytes gathered
    /// from `write`s.
    pub messages_sent: u64,
    /// Messages delivered as [`Event::Message`] or [`Event::Pieces`].
    pub messages_delivered: u64,
    /// Data packets sent for the first time.
    pub data_packets: u64,
    /// Data packets sent again.
    pub retransmits: u64,
    /// Packets declared lost from selective acknowledgements.
    pub fast_retransmits: u64,
    /// Retransmission timer expiries with data outstanding.
    pub rto_expired: u64,
    /// Tail-loss probes: the newest unacknowledged packet sent again
    /// because the flight was silent for about two round trips.
    pub tail_probes: u64,
    /// Second copies of lone small packets (neither new data nor
    /// retransmissions).
    pub copies: u64,
    /// Requests whose acknowledgement was held for the reply to carry
    /// (`AssociationConfig::delayed_ack`).
    pub acks_held: u64,
    /// Messages of ours the peer acknowledged (cumulatively, so delivered
    /// unless it failed before reading them).
    pub messages_acked: u64,
    /// Window probes and keepalives sent.
    pub probes: u64,
    /// Data packets received before (dropped).
    pub duplicates: u64,
    /// Data packets outside the window (dropped).
    pub out_of_window: u64,
    /// Statuses acknowledging data never sent (packet dropped).
    pub ack_of_unsent: u64,
    /// Packets that did not decode (dropped).
    pub malformed: u64,
    /// Packets with a key that is not this association's (dropped).
    pub wrong_key: u64,
    /// Packets with this association's key from another address (dropped).
    pub wrong_source: u64,
    /// Packets that make no sense in the current state (dropped).
    pub stray: u64,
    /// Protocol violations (the association failed).
    pub protocol_violations: u64,
    /// Bundles of small messages sent (each also one of `messages_sent`).
    pub bundles_sent: u64,
    /// Small messages carried in those bundles.
    pub bundled_messages_sent: u64,
    /// Bundles received (each also one of `messages_delivered`).
    pub bundles_delivered: u64,
    /// Small messages carried in those bundles.
    pub bundled_messages_delivered: u64,
    /// Times new data had to wait because the window was shut (the
    /// peer's `alloc` or `send_window` packets past the oldest
    /// unacknowledged one, which a hole being repaired holds in place).
    pub window_stalls: u64,
    /// Microseconds new data waited on a shut window, in all (the stall
    /// in progress, if any, not yet counted).
    pub window_stalled_us: u64,
    /// Times a packet arrived above a gap while none was open: delivery
    /// waited for a missing packet (lost or late).
    pub gaps: u64,
    /// Microseconds delivery waited for missing packets, in all (the gap
    /// open now, if any, not yet counted).
    pub gap_us: u64,
}
