//! How an association behaves: [`AssociationConfig`], its sizes and
//! timers, with the defaults a skiff endpoint starts from.

use std::time::Duration;

#[cfg(doc)]
use super::Association;

/// How an association behaves. Both ends should agree on the timers; the
/// sizes are per end.
#[derive(Debug, Clone)]
pub struct AssociationConfig {
    /// The largest datagram to send or accept; the smaller of the two ends'
    /// values is used. At least [`MIN_MTU`](super::frame::MIN_MTU).
    pub mtu: usize,
    /// Packets the receiver admits beyond `rseq` (QMP's window), at most;
    /// `window_bytes` may allow fewer.
    pub recv_window: u64,
    /// Unread message bytes above which the receiver stops opening its
    /// window.
    pub recv_buffer: usize,
    /// Packets in flight at most, whatever the peer allows; `window_bytes`
    /// may allow fewer.
    pub send_window: u64,
    /// Bytes a window may span: both windows are at most `window_bytes /
    /// mtu` packets (never fewer than 16), so the memory a window pins (the
    /// receiver holds what arrives out of order within it) does not grow
    /// with the datagram size. The default, 3 MiB, is about 2,100 packets
    /// at the default mtu and 48 at loopback's 65,507 bytes: under loss a
    /// hole at `rseq` stays open for a round trip or two while the sender
    /// goes on within the window, and a window of 256 packets stalled the
    /// sender on it (`bench/RESULTS.md` has the runs).
    pub window_bytes: usize,
    /// Bytes accepted by [`Association::send`] and not yet acknowledged, at
    /// most (one larger message is accepted when nothing is buffered).
    pub send_buffer: usize,
    /// The largest message, sent or received.
    pub max_message: u64,
    /// Ask for a status every this many data packets (QMP's SREQ
    /// frequency; 1 asks on every packet). The last packet of a burst always
    /// asks.
    pub sreq_every: u32,
    /// How long a receiver may hold an acknowledgement that nobody asked
    /// for (and, with `delayed_ack`, that of a lone small request).
    pub ack_delay: Duration,
    /// Hold the acknowledgement of a lone small request (a packet of at
    /// most 512 payload bytes that asks for a status while no
    /// acknowledgement is pending and delivers a message) so that the
    /// reply carries it instead of a packet of its own (TCP's delayed
    /// acknowledgement). It waits at most `ack_delay`, and never long
    /// enough to set off the sender's probe timer: `max(SRTT, min_pto) /
    /// 2`.
    pub delayed_ack: bool,
    /// The retransmission timeout before any RTT is measured.
    pub initial_rto: Duration,
    /// The smallest retransmission timeout.
    pub min_rto: Duration,
    /// The largest retransmission timeout, backoff included.
    pub max_rto: Duration,
    /// The shortest tail-loss probe timeout (the probe waits about two
    /// round trips, never less than this). A host timer this close costs
    /// something on every send, so the default stays above a 4 ms kernel
    /// tick.
    pub min_pto: Duration,
    /// A new packet of at most this many payload bytes that asks for an
    /// acknowledgement while at most one other packet is unacknowledged
    /// goes out twice, back to back, so that losing one copy costs nothing
    /// instead of a probe timeout (see `send`'s module documentation).
    /// 512 by default: a lone request. A link that carries batches of
    /// requests raises it (the mesh's, to its packet size): the copies
    /// happen only while the link is nearly idle, so they cost at most a
    /// packet or two per round trip.
    pub copy_max: usize,
    /// Send a keepalive after this long without sending (capped at a third
    /// of `idle_timeout`).
    pub keepalive: Duration,
    /// Declare the peer dead after this long without a valid packet from it.
    pub idle_timeout: Duration,
    /// Give up a set-up that has not completed after this long.
    pub handshake_timeout: Duration,
    /// Offer bundles at set-up: the peer may then send several small
    /// messages as one association message ([`Event::Bundle`](super::Event::Bundle),
    /// see [`bundle`](super::bundle)), and so may this end
    /// ([`Association::send_bundle`]). Off by default: an application that
    /// takes events must split them; tunnels turn it on.
    pub bundles: bool,
    /// Deliver a message larger than one packet as [`Event::Pieces`] (its
    /// fragments as they arrived, for the application to join on its own
    /// thread) instead of joined into one buffer as [`Event::Message`].
    ///
    /// [`Event::Pieces`]: super::Event::Pieces
    /// [`Event::Message`]: super::Event::Message
    pub deliver_pieces: bool,
}

impl Default for AssociationConfig {
    fn default() -> Self {
        AssociationConfig {
            mtu: 1472,
            recv_window: 4096,
            recv_buffer: 2 << 20,
            send_window: 4096,
            send_buffer: 2 << 20,
            window_bytes: 3 << 20,
            max_message: 64 << 20,
            sreq_every: 8,
            ack_delay: Duration::from_millis(5),
            delayed_ack: true,
            initial_rto: Duration::from_secs(1),
            min_rto: Duration::from_millis(200),
            max_rto: Duration::from_secs(60),
            min_pto: Duration::from_millis(5),
            copy_max: super::send::COPY_MAX,
            keepalive: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(10),
            bundles: false,
            deliver_pieces: false,
        }
    }
}
