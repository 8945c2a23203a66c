//! QMP's association, sans I/O: a reliable, ordered, flow-controlled
//! message channel between two hosts over datagrams.
//!
//! What it owns and promises:
//! - **Set-up** by a FIRST packet with explicit addressing (a service id)
//!   and a key unique on the initiating host. The listening [`Endpoint`] answers with
//!   the key's return form (RTN bit set) and a key of its own; from then on
//!   every packet carries only a key, which each side looks up directly
//!   (QMP's abbreviated lookup). FIRST is retransmitted until answered; the
//!   answer goes out once per FIRST received and is about its size, so a
//!   forged FIRST reflects one small packet and no more. The listener's side
//!   is half-open until the initiator's next packet (a confirmation, data or
//!   a keepalive) arrives.
//! - **Flow control** on packet sequence numbers: the receiver advertises
//!   `rseq` (next expected) and `alloc` (not to be reached); the sender
//!   never sends at or above `alloc`. The receiver stops raising `alloc`
//!   while the application leaves more than `recv_buffer` bytes unread, so a
//!   slow reader slows the writer instead of growing memory.
//! - **Error control**: status requests (SREQ) every `sreq_every` packets
//!   and on the last packet of a burst, selective acknowledgements, fast
//!   retransmission when a packet three transmissions younger is acked, a
//!   tail-loss probe after RFC 8985 (the newest unacknowledged packet sent
//!   again once when the flight is silent for 2 x SRTT, at least
//!   `min_pto`, so a lost last packet costs about three round trips
//!   instead of an RTO), two copies of a lone small packet (so that a
//!   request survives the loss of one), and
//!   a retransmission timer after RFC 6298 (SRTT, RTTVAR, Karn's rule,
//!   exponential backoff).
//! - **Delayed acknowledgement of requests**: the acknowledgement of a
//!   lone small packet that asks for one is held so that the reply carries
//!   it (one packet each way per request/reply instead of two): at most
//!   `ack_delay`, and at most `max(SRTT, min_pto) / 2` so that it still
//!   reaches the sender before its probe timer; a packet queued meanwhile,
//!   or a second request, sends it at once (`delayed_ack`, on by default).
//! - **Messages** of up to `max_message` bytes (64 MiB by default),
//!   fragmented over packets and reassembled; small messages queued together
//!   share a packet. Every message is delivered once and in order, or the
//!   association fails and says so ([`Event::Failed`]) on both sides (the
//!   side that fails sends a RESET; if that is lost the peer's dead-peer
//!   timer fires).
//! - **Liveness**: keepalives when nothing was sent for `keepalive`; the
//!   association fails when nothing valid was heard for `idle_timeout`, or
//!   when data in flight saw no acknowledgement for that long.
//! - **Close** by sentinels in both directions: each side's sentinel follows
//!   all its data and is acknowledged like data. A side reports `Closed`
//!   once the peer's stream is complete (its sentinel reached in order) and
//!   every message of its own was acknowledged; it does not wait for the
//!   acknowledgement of its own bare sentinel (TCP's LAST_ACK: the
//!   application has its end of file while the FIN is retransmitted). It
//!   then lingers for `idle_timeout`, acknowledging a retransmitted
//!   sentinel (TCP's TIME_WAIT) and sending its own until acknowledged:
//!   again on every status from the peer that lacks it, not only at a
//!   retransmission timer that may have backed off. A side whose sentinel
//!   was acknowledged and that lacks the peer's asks for it with status
//!   requests from two round trips on ([`Association::is_closing`] says
//!   whether a close has still to reach the peer, so that a driver about
//!   to stop can run a little longer).
//! - **Bad input** (undecodable packets, unknown or forged keys, packets
//!   from the wrong address, sequence numbers outside the window,
//!   duplicates, acknowledgements of data never sent) is dropped and counted
//!   in [`AssociationStats`] or [`ListenerStats`], never delivered.
//!
//! One [`Endpoint`] holds every association of a local address, initiated
//! and accepted: it routes datagrams to them, accepts set-ups and keeps
//! their timers; a driver runs it (see [`endpoint`]).
//!
//! What it does not do: congestion control (QMP's flow control is
//! optimistic and the window is the only brake), encryption or
//! authentication beyond unguessable keys (a key is 63 random bits from the
//! caller and packets must come from the peer's address), path migration.
//!
//! The wire format is in [`frame`]: frame kind [`KIND`] of the skiff
//! datagram, one self-contained packet per datagram.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;

pub mod bundle;
mod config;
pub mod endpoint;
mod event;
pub mod frame;
mod recv;
mod send;
#[cfg(test)]
mod tests;

pub use config::AssociationConfig;
pub use endpoint::{Endpoint, EndpointConfig, EndpointEvent, Handle, ListenerStats, Step};
pub use event::{
    AssociationStats, CloseReason, Event, FailReason, Pieces, SendError, State, Transmit,
};
pub use frame::{is_association, peek_key, KIND};

use frame::{
    Accept, Encoder, First, Packet, Status, DATA_HEADER_LEN, HEADER_LEN, RTN, STATUS_MIN_LEN,
};
use recv::{DataOutcome, RecvState};
use send::{Rtt, SendState, Tx};

/// The longest a closed end waits, after sending its sentinel, before a
/// status from the peer that lacks it sends it again (see
/// `Association::handle_packet`).
const SENTINEL_RESEND_AGE: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Initiator,
    Acceptor,
}

/// One end of a QMP association.
///
/// Polling order, as in quinn: feed [`handle_datagram`](Self::handle_datagram)
/// with every packet for this association and call
/// [`handle_timeout`](Self::handle_timeout) when the instant from
/// [`poll_timeout`](Self::poll_timeout) passes; after either, and after
/// [`send`](Self::send), [`close`](Self::close) or
/// [`poll_event`](Self::poll_event), drain
/// [`poll_transmit`](Self::poll_transmit) until `None`, drain
/// [`poll_event`](Self::poll_event) until `None` (and transmit again if it
/// returned anything), then sleep until [`poll_timeout`](Self::poll_timeout).
#[derive(Debug)]
pub struct Association {
    config: AssociationConfig,
    side: Side,
    state: State,
    peer: SocketAddr,
    local_key: u64,
    peer_key: Option<u64>,
    service: u32,
    mtu: usize,
    peer_max_message: u64,
    /// Both ends offered bundles at set-up (see [`bundle`]).
    bundles: bool,
    send: SendState,
    recv: RecvState,
    events: VecDeque<Event>,
    stats: AssociationStats,
    created: Instant,
    last_recv: Instant,
    last_sent: Instant,
    /// Last time data in flight was acknowledged (or first went out).
    last_progress: Instant,
    hs_due: bool,
    hs_deadline: Option<Instant>,
    hs_sends: u32,
    hs_sent_at: Instant,
    ack_now: bool,
    ack_at: Option<Instant>,
    /// The acknowledgement of a lone small request waits (until `ack_at`)
    /// for the reply to carry it.
    ack_held: bool,
    ping_due: bool,
    reset_due: bool,
    close_reason: Option<CloseReason>,
    linger_until: Option<Instant>,
    /// Status requests sent for the peer's sentinel (see `fin_wait`).
    fin_probes: u32,
    /// The last status written into a packet, if it went whole (every
    /// selective range in it), its encoded section, and when: see
    /// `put_status`.
    status_sent: Option<Status>,
    status_section: Vec<u8>,
    status_sent_at: Instant,
}

impl Association {
    /// Starts an association to the listener at `peer` serving `service`.
    /// `key` must be unique among this host's associations and should be
    /// random (it is what keeps others from injecting packets); its top bit
    /// is ignored.
    pub fn connect(
        now: Instant,
        config: AssociationConfig,
        peer: SocketAddr,
        service: u32,
        key: u64,
    ) -> Association {
        let mut a = Association::new(now, config, Side::Initiator, peer, key & !RTN, service);
        a.state = State::Connecting;
        a.hs_due = true;
        a
    }

    /// The listener's side, created by a FIRST.
    pub(crate) fn accept(
        now: Instant,
        config: AssociationConfig,
        peer: SocketAddr,
        local_key: u64,
        p: &Packet,
    ) -> Association {
        let first = p.first.expect("listener checked FIRST");
        let mut a = Association::new(
            now,
            config,
            Side::Acceptor,
            peer,
            local_key & !RTN,
            first.service,
        );
        a.state = State::HalfOpen;
        a.peer_key = Some(p.key);
        a.learn_peer(first.mtu, first.max_message);
        a.learn_features(p.status.map_or(0, |s| s.ack_delay_us));
        if let Some(st) = &p.status {
            if a.send.valid(st) {
                a.send.peer_alloc = st.alloc;
            }
        }
        a.hs_due = true;
        a
    }

    fn new(
        now: Instant,
        mut config: AssociationConfig,
        side: Side,
        peer: SocketAddr,
        local_key: u64,
        service: u32,
    ) -> Association {
        config.mtu = config.mtu.clamp(frame::MIN_MTU, crate::wire::MAX_DATAGRAM);
        config.max_message = config.max_message.min(frame::MAX_MESSAGE);
        let span = (config.window_bytes / config.mtu).max(16) as u64;
        config.recv_window = config.recv_window.min(span).max(1);
        config.send_window = config.send_window.min(span).max(1);
        config.sreq_every = config.sreq_every.max(1);
        // Long enough to mean "never", short enough that `now + d` cannot
        // overflow an `Instant`.
        const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
        for d in [
            &mut config.ack_delay,
            &mut config.initial_rto,
            &mut config.min_rto,
            &mut config.max_rto,
            &mut config.min_pto,
            &mut config.keepalive,
            &mut config.idle_timeout,
            &mut config.handshake_timeout,
        ] {
            *d = (*d).min(FOREVER);
        }
        config.max_rto = config.max_rto.max(config.min_rto);
        config.keepalive = config.keepalive.min(config.idle_timeout / 3);
        let rtt = Rtt::new(config.initial_rto, config.min_rto, config.max_rto);
        Association {
            send: SendState::new(
                config.send_window,
                config.send_buffer,
                config.ack_delay,
                config.min_pto,
                config.copy_max,
                rtt,
            ),
            recv: RecvState::new(
                config.recv_window,
                config.recv_buffer,
                config.max_message,
                config.deliver_pieces,
            ),
            mtu: config.mtu,
            peer_max_message: config.max_message,
            bundles: false,
            config,
            side,
            state: State::Connecting,
            peer,
            local_key,
            peer_key: None,
            service,
            events: VecDeque::new(),
            stats: AssociationStats::default(),
            created: now,
            last_recv: now,
            last_sent: now,
            last_progress: now,
            hs_due: false,
            hs_deadline: None,
            hs_sends: 0,
            hs_sent_at: now,
            ack_now: false,
            ack_at: None,
            ack_held: false,
            ping_due: false,
            reset_due: false,
            close_reason: None,
            linger_until: None,
            fin_probes: 0,
            status_sent: None,
            status_section: Vec::new(),
            status_sent_at: now,
        }
    }

    fn learn_peer(&mut self, mtu: u32, max_message: u64) {
        self.mtu = self.config.mtu.min(mtu as usize);
        self.peer_max_message = max_message;
    }

    /// The feature bits this end offers at set-up.
    fn features(&self) -> u64 {
        if self.config.bundles {
            bundle::FEATURE_BUNDLES
        } else {
            0
        }
    }

    /// Takes the peer's feature bits from its set-up packet (carried in
    /// its STATUS's ack delay, see [`frame`]; 0 from an end that has none).
    fn learn_features(&mut self, peer: u64) {
        self.bundles = self.features() & peer & bundle::FEATURE_BUNDLES != 0;
        self.recv.bundles = self.bundles;
    }

    /// Whether both ends offered bundles at set-up, so that
    /// [`send_bundle`](Self::send_bundle) may be used (false until the
    /// set-up completes on the initiator's side).
    pub fn bundles(&self) -> bool {
        self.bundles
    }

    /// Where the association stands.
    pub fn state(&self) -> State {
        if self.state == State::Established && self.send.close_requested {
            State::Closing
        } else {
            self.state
        }
    }

    /// Whether nothing more will happen: finished and nothing left to send.
    pub fn is_drained(&self) -> bool {
        self.state == State::Drained && !self.reset_due
    }

    /// Whether a close is under way that has still to reach the peer:
    /// closing with messages or the sentinel unacknowledged, or closed with
    /// our bare sentinel not yet acknowledged. A driver that is about to
    /// stop (its process exiting) keeps running while any association says
    /// so, for a bounded time, so that the peer's close completes (TCP
    /// leaves this to the kernel).
    pub fn is_closing(&self) -> bool {
        (self.state == State::Established && self.send.close_requested) || self.sentinel_pending()
    }

    /// Whether events wait for [`poll_event`](Self::poll_event).
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// This end's key (RTN clear).
    pub fn local_key(&self) -> u64 {
        self.local_key
    }

    /// The service id from the set-up.
    pub fn service(&self) -> u32 {
        self.service
    }

    /// Counters so far.
    pub fn stats(&self) -> AssociationStats {
        let mut s = self.stats;
        s.messages_sent += self.send.sealed;
        s.bundles_delivered = self.recv.bundles_delivered;
        s.bundled_messages_delivered = self.recv.bundled_delivered;
        s.window_stalls = self.send.window_stalls;
        s.window_stalled_us =
            u64::try_from(self.send.window_stalled.as_micros()).unwrap_or(u64::MAX);
        s.gaps = self.recv.gaps;
        s.gap_us = u64::try_from(self.recv.gap_time.as_micros()).unwrap_or(u64::MAX);
        s
    }

    /// The smoothed round-trip time, once measured.
    pub fn rtt(&self) -> Option<Duration> {
        self.send.rtt.srtt()
    }

    /// The retransmission timeout in force.
    pub fn rto(&self) -> Duration {
        self.send.rtt.rto()
    }

    /// The receiving window as last advertised: (`rseq`, `alloc`).
    pub fn recv_window(&self) -> (u64, u64) {
        (self.recv.rseq, self.recv.alloc)
    }

    /// Packets received above a gap and held.
    pub fn held(&self) -> usize {
        self.recv.held()
    }

    /// Bytes of delivered messages waiting in [`poll_event`](Self::poll_event).
    pub fn unread(&self) -> usize {
        self.recv.unread
    }

    /// Data packets sent and not yet acknowledged.
    pub fn in_flight(&self) -> usize {
        self.send.unacked()
    }

    /// Bytes accepted by `send` and not yet acknowledged.
    pub fn buffered(&self) -> usize {
        self.send.buffered
    }

    /// Offers `msg` for sending. Refuses, without queueing anything, when
    /// the send buffer is full ([`SendError::WouldBlock`]; an
    /// [`Event::Writable`] follows when there is room), when the message is
    /// over either end's `max_message`, or once the association is closing.
    pub fn send(&mut self, msg: Bytes) -> Result<(), SendError> {
        self.admit(msg.len())?;
        self.send.push(msg);
        self.stats.messages_sent += 1;
        Ok(())
    }

    /// Offers a bundle of small messages (see [`bundle`]; `records` is how
    /// many it holds, for the counters) as one message, as
    /// [`send`](Self::send) does one; the peer receives it as
    /// [`Event::Bundle`]. Refused with [`SendError::Unsupported`] unless
    /// both ends offered bundles ([`bundles`](Self::bundles)).
    pub fn send_bundle(&mut self, bundle: Bytes, records: usize) -> Result<(), SendError> {
        if !self.bundles {
            return Err(SendError::Unsupported);
        }
        debug_assert_eq!(bundle::validate(&bundle).ok(), Some(records));
        self.admit(bundle.len())?;
        self.send.push_as(bundle, true);
        self.stats.messages_sent += 1;
        self.stats.bundles_sent += 1;
        self.stats.bundled_messages_sent += records as u64;
        Ok(())
    }

    /// Whether a message of `len` bytes may be queued now: refused once
    /// the association is closing, over either end's `max_message`, or
    /// while the send buffer has no room (which marks the sender blocked,
    /// so an [`Event::Writable`] follows).
    fn admit(&mut self, len: usize) -> Result<(), SendError> {
        if matches!(self.state, State::Closed | State::Drained) || self.send.close_requested {
            return Err(SendError::Closed);
        }
        let max = self.config.max_message.min(self.peer_max_message);
        if len as u64 > max {
            return Err(SendError::TooLarge { len, max });
        }
        if !self.send.has_room(len) {
            self.send.blocked = true;
            return Err(SendError::WouldBlock);
        }
        Ok(())
    }

    /// Offers the messages at the front of `msgs` in order, each as
    /// [`send`](Self::send) does, taking them out of `msgs` while they are
    /// accepted; stops at the first refusal, which is returned with the
    /// refused message left in front. Returns how many were taken. For a
    /// caller that gathers small messages and hands them over together
    /// (a tunnel's send stage).
    pub fn send_from(
        &mut self,
        msgs: &mut std::collections::VecDeque<Bytes>,
    ) -> (usize, Option<SendError>) {
        if matches!(self.state, State::Closed | State::Drained) || self.send.close_requested {
            return (0, msgs.front().map(|_| SendError::Closed));
        }
        let max = self.config.max_message.min(self.peer_max_message);
        let mut n = 0;
        while let Some(m) = msgs.front() {
            if m.len() as u64 > max {
                return (n, Some(SendError::TooLarge { len: m.len(), max }));
            }
            if !self.send.has_room(m.len()) {
                self.send.blocked = true;
                return (n, Some(SendError::WouldBlock));
            }
            let m = msgs.pop_front().expect("front checked");
            self.send.push(m);
            self.stats.messages_sent += 1;
            n += 1;
        }
        (n, None)
    }

    /// Offers one message made of `parts`, as [`send`](Self::send) does a
    /// message in one piece (same refusals, for the whole length); the
    /// parts are never joined here: each packet copies its pieces straight
    /// from them, and they are held (by reference) until acknowledged. The
    /// peer gets one message. For a sender whose message is a header of
    /// its own and bytes it holds elsewhere (the node's splice of a
    /// shared-memory publish into the mesh).
    pub fn send_parts(&mut self, parts: Vec<Bytes>) -> Result<(), SendError> {
        if matches!(self.state, State::Closed | State::Drained) || self.send.close_requested {
            return Err(SendError::Closed);
        }
        let len: usize = parts.iter().map(Bytes::len).sum();
        let max = self.config.max_message.min(self.peer_max_message);
        if len as u64 > max {
            return Err(SendError::TooLarge { len, max });
        }
        if !self.send.has_room(len) {
            self.send.blocked = true;
            return Err(SendError::WouldBlock);
        }
        self.send.push_parts(parts);
        self.stats.messages_sent += 1;
        Ok(())
    }

    /// Writes stream bytes: gathered with the bytes written before into
    /// one message, as a TCP send buffer gathers small writes (see
    /// [`send`](self::send)'s module documentation); the receiver gets them
    /// as messages whose boundaries mean nothing, to be read as one byte
    /// stream. Returns how many bytes were taken: all, or as many as the
    /// send buffer has room for; none is [`SendError::WouldBlock`] (an
    /// [`Event::Writable`] follows). Order with [`send`](Self::send) is
    /// kept.
    pub fn write(&mut self, data: &[u8]) -> Result<usize, SendError> {
        if matches!(self.state, State::Closed | State::Drained) || self.send.close_requested {
            return Err(SendError::Closed);
        }
        if data.is_empty() {
            return Ok(0);
        }
        let max = self.config.max_message.min(self.peer_max_message);
        let n = self
            .send
            .write(data, usize::try_from(max).unwrap_or(usize::MAX));
        if n == 0 {
            self.send.blocked = true;
            return Err(SendError::WouldBlock);
        }
        Ok(n)
    }

    /// Bytes accepted by [`send`](Self::send) or [`write`](Self::write)
    /// and not yet put in packets: a driver sends at once when a packet's
    /// worth waits, and otherwise may let small writes gather.
    pub fn unsent(&self) -> usize {
        self.send.unsent()
    }

    /// The largest message [`send`](Self::send) takes: the smaller of
    /// both ends' `max_message` (this end's until the peer's is known).
    pub fn max_message(&self) -> u64 {
        self.config.max_message.min(self.peer_max_message)
    }

    /// The most message bytes one data packet carries.
    pub fn packet_payload(&self) -> usize {
        self.mtu - HEADER_LEN - STATUS_MIN_LEN - DATA_HEADER_LEN
    }

    /// Closes gracefully: messages already accepted are delivered, then the
    /// sentinel. [`Event::Closed`] follows once the peer has closed too (it
    /// does so on receiving the sentinel, after its own queued messages).
    pub fn close(&mut self) {
        if matches!(self.state, State::Closed | State::Drained) || self.send.close_requested {
            return;
        }
        self.send.close_requested = true;
        self.close_reason.get_or_insert(CloseReason::Local);
    }

    /// Aborts at once: what was not acknowledged is abandoned, the peer is
    /// sent a reset (so its end fails too, instead of waiting for the idle
    /// timeout), and [`Event::Failed`] with [`FailReason::Aborted`] follows.
    pub fn abort(&mut self) {
        self.fail(FailReason::Aborted);
    }

    /// Takes a datagram addressed to this association (from a driver that
    /// owns it alone; an [`Endpoint`] routes its own).
    pub fn handle_datagram(&mut self, now: Instant, from: SocketAddr, bytes: Bytes) {
        let mut p = Packet::default();
        if p.decode_into(bytes).is_err() {
            self.stats.malformed += 1;
            return;
        }
        let first_dup = p.first.is_some() && Some(p.key) == self.peer_key;
        if p.key != self.local_key | RTN && !first_dup {
            self.stats.wrong_key += 1;
            return;
        }
        if from != self.peer {
            self.stats.wrong_source += 1;
            return;
        }
        self.handle_packet(now, &mut p);
    }

    /// Counts a packet with this association's key from another address
    /// (the endpoint routed it by key and checked the source).
    pub(crate) fn count_wrong_source(&mut self) {
        self.stats.wrong_source += 1;
    }

    /// Takes a decoded packet whose key and source were checked.
    pub(crate) fn handle_packet(&mut self, now: Instant, p: &mut Packet) {
        if matches!(self.state, State::Drained) {
            self.stats.stray += 1;
            return;
        }
        if p.first.is_some() {
            if self.side == Side::Acceptor && self.state == State::HalfOpen {
                self.hs_due = true;
            } else {
                self.stats.stray += 1;
            }
            return;
        }
        if let Some(st) = &p.status {
            if !self.send.valid(st) {
                self.stats.ack_of_unsent += 1;
                return;
            }
        }
        match (self.side, self.state, &p.accept) {
            (Side::Initiator, State::Connecting, Some(a)) => {
                self.on_accept(now, a, p.status.as_ref().map_or(0, |s| s.ack_delay_us));
            }
            (Side::Initiator, _, Some(a)) if Some(a.key) == self.peer_key => {
                // Our confirmation was lost and the listener answers again.
                self.ack_now = true;
            }
            (_, _, Some(_)) | (_, State::Connecting, None) => {
                self.stats.stray += 1;
                return;
            }
            (Side::Acceptor, State::HalfOpen, None) => {
                self.state = State::Established;
                self.hs_deadline = None;
                self.hs_due = false;
                if self.hs_sends == 1 {
                    self.send
                        .rtt
                        .sample(now.saturating_duration_since(self.hs_sent_at));
                }
                self.events.push_back(Event::Connected);
            }
            _ => {}
        }
        self.last_recv = now;
        self.stats.packets_received += 1;
        if p.reset {
            self.state = State::Drained;
            self.events.push_back(Event::Failed(FailReason::Reset));
            return;
        }
        if let Some(st) = &p.status {
            let out = self.send.on_status(now, st);
            self.stats.fast_retransmits += out.fast_lost;
            self.stats.messages_acked += out.messages_acked;
            if out.progress {
                self.last_progress = now;
            }
            if self.send.blocked && self.send.writable_again() {
                self.send.blocked = false;
                self.events.push_back(Event::Writable);
            }
        }
        // Closed with our sentinel unacknowledged: the peer is still there
        // and has not got it (its status says so), so it goes again now
        // rather than at a retransmission timer that may have backed off
        // far (an acceptor whose set-up was retransmitted has no RTT).
        if self.sentinel_pending() && p.status.is_some() {
            // Not again for the statuses of one burst: at least `min_pto`
            // since it last went, and a round trip when that is short (an
            // RTT inflated by a retransmitted set-up must not hold it).
            let age = self
                .send
                .rtt
                .srtt()
                .unwrap_or(self.config.min_pto)
                .min(SENTINEL_RESEND_AGE)
                .max(self.config.min_pto);
            if self.send.resend_sentinel(now, age) {
                self.stats.retransmits += 1;
            }
        }
        // The packet's acknowledgement waits for the reply (`hold`), or it
        // is a copy that needs none of its own (`copy`).
        let (mut hold, mut copy) = (false, false);
        if let Some(d) = &mut p.data {
            let had_gap = self.recv.held() > 0;
            // A lone small request: it asks for a status while no
            // acknowledgement is pending. Its acknowledgement may wait for
            // the reply to carry it (`AssociationConfig::delayed_ack`).
            let small = p.sreq
                && !p.close
                && !self.ack_now
                && self.ack_at.is_none()
                && d.chunks.raw().len() <= send::COPY_MAX + 16
                && d.chunks.iter().map(|c| c.bytes.len()).sum::<usize>() <= send::COPY_MAX;
            let delivered_before = self.stats.messages_delivered;
            let seq = d.seq;
            let res = self.recv.on_data(
                now,
                d.seq,
                p.close,
                &mut d.chunks,
                &mut self.events,
                &mut self.stats.messages_delivered,
            );
            match res {
                Err(why) => {
                    self.stats.protocol_violations += 1;
                    self.fail(FailReason::Protocol(why));
                    return;
                }
                Ok(DataOutcome::Duplicate) => {
                    self.stats.duplicates += 1;
                    // The second copy of a lone packet (the newest, seen
                    // less than a round trip ago: no probe or
                    // retransmission comes that soon), or of the request
                    // whose acknowledgement is held: the first arrived and
                    // was (or will be) acknowledged; nothing to repair.
                    let newest = seq + 1 == self.recv.rseq;
                    let recent = self
                        .recv
                        .arrival_of(seq)
                        .zip(self.send.rtt.srtt())
                        .is_some_and(|(at, srtt)| now.saturating_duration_since(at) < srtt);
                    if newest && (self.ack_held || recent) {
                        copy = true;
                    } else {
                        self.ack_now = true;
                    }
                }
                Ok(DataOutcome::OutOfWindow) => self.stats.out_of_window += 1,
                Ok(DataOutcome::Held) => self.ack_now = true,
                Ok(DataOutcome::InOrder) => {
                    if had_gap || self.recv.fin_done {
                        self.ack_now = true;
                    } else {
                        if self.ack_at.is_none() {
                            self.ack_at = Some(now + self.config.ack_delay);
                        }
                        hold = small
                            && self.config.delayed_ack
                            && self.stats.messages_delivered > delivered_before;
                        if let (true, Some(bound)) = (hold, self.hold_bound()) {
                            self.ack_at = Some(now + bound);
                        } else {
                            hold = false;
                        }
                    }
                }
            }
        }
        if hold {
            self.stats.acks_held += 1;
            self.ack_held = true;
        } else if p.sreq && !copy {
            self.ack_now = true;
        }
        self.check_close(now);
    }

    /// How long the acknowledgement of a request may wait for the reply:
    /// `ack_delay` at most, and short enough to reach the peer well before
    /// its probe timer (`max(2 x SRTT, min_pto)`) fires: `max(SRTT,
    /// min_pto) / 2`. `None` before an RTT is measured.
    fn hold_bound(&self) -> Option<Duration> {
        let srtt = self.send.rtt.srtt()?;
        Some(self.config.ack_delay.min(srtt.max(self.config.min_pto) / 2))
    }

    fn on_accept(&mut self, now: Instant, a: &Accept, features: u64) {
        self.peer_key = Some(a.key);
        self.learn_peer(a.mtu, a.max_message);
        self.learn_features(features);
        if self.hs_sends == 1 {
            self.send
                .rtt
                .sample(now.saturating_duration_since(self.hs_sent_at));
        }
        self.state = State::Established;
        self.hs_deadline = None;
        self.hs_due = false;
        self.ack_now = true;
        self.events.push_back(Event::Connected);
    }

    fn check_close(&mut self, now: Instant) {
        if self.state != State::Established {
            return;
        }
        if self.recv.fin_done && !self.send.close_requested {
            self.send.close_requested = true;
            self.close_reason.get_or_insert(CloseReason::Peer);
        }
        // Closed once the peer's stream is complete and it has every
        // message of ours: the acknowledgement of our bare sentinel is not
        // waited for (TCP's LAST_ACK: the application has its end of file
        // while the kernel retransmits the FIN). The peer may exit at its
        // own close, and the acknowledgement of our sentinel with it.
        if self.recv.fin_done && (self.send.sentinel_acked() || self.send.messages_acked()) {
            let reason = self.close_reason.unwrap_or(CloseReason::Peer);
            self.events.push_back(Event::Closed(reason));
            self.state = State::Closed;
            // Linger as long as the peer may retransmit its sentinel before
            // it gives up on us (TCP's TIME_WAIT plays this part), and
            // send our own sentinel until it is acknowledged.
            self.linger_until = Some(now + self.config.idle_timeout);
            if self.send.sentinel_acked() {
                self.send.rto_deadline = None;
                self.send.tlp_deadline = None;
            }
        }
    }

    /// Closed, and our (bare) sentinel not yet sent or acknowledged.
    fn sentinel_pending(&self) -> bool {
        self.state == State::Closed && !self.send.sentinel_acked()
    }

    fn fail(&mut self, reason: FailReason) {
        if matches!(self.state, State::Drained) {
            return;
        }
        self.events.push_back(Event::Failed(reason));
        // No RESET for a set-up that never completed: its FIRST may have
        // come from a forged address.
        self.reset_due =
            self.peer_key.is_some() && !matches!(self.state, State::Closed | State::HalfOpen);
        self.state = State::Drained;
    }

    /// Acts on the timers that expired by `now`: retransmission, set-up
    /// retries, keepalive, dead-peer detection, the end of the linger.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.state {
            State::Drained => {}
            State::Closed => {
                if self.linger_until.is_some_and(|t| now >= t) {
                    self.state = State::Drained;
                } else if self.sentinel_pending() {
                    // Our sentinel, until the peer acknowledges it.
                    if self.send.rto_deadline.is_some_and(|t| now >= t) {
                        if self.send.on_rto(now) > 0 {
                            self.stats.rto_expired += 1;
                        }
                    } else if self.send.tlp_deadline.is_some_and(|t| now >= t) && self.send.on_tlp()
                    {
                        self.stats.tail_probes += 1;
                    }
                }
            }
            State::Connecting | State::HalfOpen => {
                if now >= self.created + self.config.handshake_timeout {
                    self.fail(FailReason::HandshakeTimeout);
                } else if self.hs_deadline.is_some_and(|t| now >= t) {
                    self.hs_due = true;
                    self.send.rtt.back_off();
                    self.hs_deadline = Some(now + self.send.rtt.rto());
                }
            }
            State::Established | State::Closing => {
                if now >= self.last_recv + self.config.idle_timeout {
                    if self.recv.fin_done && self.send.only_bare_sentinel_unacked() {
                        // The peer's stream is complete and it acknowledged
                        // every message of ours; only the acknowledgement of
                        // our sentinel was lost (the peer stopped
                        // lingering). Nothing was lost: this is a close.
                        let reason = self.close_reason.unwrap_or(CloseReason::Peer);
                        self.events.push_back(Event::Closed(reason));
                        self.state = State::Drained;
                    } else {
                        self.fail(FailReason::PeerDead);
                    }
                    return;
                }
                if self.send.unacked() > 0 && now >= self.last_progress + self.config.idle_timeout {
                    self.fail(FailReason::Stalled);
                    return;
                }
                if self.send.rto_deadline.is_some_and(|t| now >= t) {
                    if self.send.on_rto(now) > 0 {
                        self.stats.rto_expired += 1;
                    } else {
                        self.ping_due = true;
                    }
                } else if self.send.tlp_deadline.is_some_and(|t| now >= t) && self.send.on_tlp() {
                    self.stats.tail_probes += 1;
                }
                if now >= self.last_sent + self.config.keepalive {
                    self.ping_due = true;
                }
                if self.fin_wait().is_some_and(|t| now >= t) {
                    self.ping_due = true;
                    self.fin_probes = self.fin_probes.saturating_add(1);
                }
            }
        }
    }

    /// The next instant [`handle_timeout`](Self::handle_timeout) has work,
    /// if any.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut at = |x: Option<Instant>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |t| t.min(x)));
            }
        };
        match self.state {
            State::Drained => {}
            State::Closed => {
                at(self.linger_until);
                at(self.ack_at);
                if self.sentinel_pending() {
                    at(self.send.rto_deadline);
                    at(self.send.tlp_deadline);
                }
            }
            State::Connecting | State::HalfOpen => {
                at(Some(self.created + self.config.handshake_timeout));
                at(self.hs_deadline);
            }
            State::Established | State::Closing => {
                at(Some(self.last_recv + self.config.idle_timeout));
                at(Some(self.last_sent + self.config.keepalive));
                if self.send.unacked() > 0 {
                    at(Some(self.last_progress + self.config.idle_timeout));
                }
                at(self.send.rto_deadline);
                at(self.send.tlp_deadline);
                at(self.ack_at);
                at(self.fin_wait());
            }
        }
        t
    }

    /// Our sentinel is acknowledged and the peer's, which it sends as soon
    /// as it has ours, has not come: ask for it (a status request, which a
    /// closed peer answers by sending its sentinel again) one
    /// retransmission timeout after the last packet, not at the keepalive.
    fn fin_wait(&self) -> Option<Instant> {
        if !self.send.sentinel_acked() || self.recv.fin_done {
            return None;
        }
        // Two round trips, doubling per probe up to 64 times that, never
        // beyond the RTO (which
        // earlier losses may have backed off far).
        let rto = self.send.rtt.rto();
        let base = self
            .send
            .rtt
            .srtt()
            .map_or(rto, |s| (2 * s).max(self.config.min_pto));
        let wait = base
            .saturating_mul(1 << self.fin_probes.min(6))
            .min(rto.max(base));
        Some(self.last_sent + wait)
    }

    /// The next event, if any. Taking a message frees its bytes from the
    /// receive buffer (and may open the window: transmit afterwards).
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        let e = self.events.pop_front()?;
        let taken = match &e {
            Event::Message(m) | Event::Bundle(m) => Some(m.len()),
            Event::Pieces(p) => Some(p.len()),
            _ => None,
        };
        if let Some(len) = taken {
            self.recv.consumed(len);
            if self.recv.window_update_due() && self.state == State::Established {
                self.ack_now = true;
            }
        }
        Some(e)
    }

    fn out_key(&self) -> Option<u64> {
        self.peer_key.map(|k| k | RTN)
    }

    /// Writes the next datagram to send into `buf` (cleared first).
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
        buf.clear();
        self.poll_transmit_append(now, buf)
    }

    /// Like [`poll_transmit`](Self::poll_transmit), but appends the datagram
    /// to `buf` instead of clearing it first: its bytes are the last
    /// [`Transmit::size`] bytes of `buf`, and `buf` is left as it was when
    /// `None` is returned. A driver that collects many datagrams into one
    /// send buffer encodes each straight into place, with no copy.
    #[must_use]
    pub fn poll_transmit_append(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
        let start = buf.len();
        let t = self.transmit_into(now, buf, None);
        if t.is_none() {
            buf.truncate(start);
        }
        t.map(|mut t| {
            t.size = buf.len() - start;
            t
        })
    }

    /// Like [`poll_transmit_append`](Self::poll_transmit_append), but a
    /// data packet's last chunk, when it carries at least 512 bytes, is not
    /// copied into `buf`: its bytes are set in `tail` (a reference to the
    /// message they come from), and the datagram is what was appended to
    /// `buf` followed by `tail`'s bytes ([`Transmit::size`] counts both).
    /// A driver that sends scatter-gather (`sendmsg` with two iovecs) then
    /// leaves the one copy of the payload to the kernel, as TCP's `write`
    /// does. `tail` is `None` for a datagram that is all in `buf` (it is
    /// set to `None` first); the bytes are the same as the appending form's.
    #[must_use]
    pub fn poll_transmit_split(
        &mut self,
        now: Instant,
        buf: &mut Vec<u8>,
        tail: &mut Option<Bytes>,
    ) -> Option<Transmit> {
        *tail = None;
        let start = buf.len();
        let t = self.transmit_into(now, buf, Some(&mut *tail));
        if t.is_none() {
            buf.truncate(start);
        }
        let more = tail.as_ref().map_or(0, Bytes::len);
        t.map(|mut t| {
            t.size = buf.len() - start + more;
            t
        })
    }

    fn transmit_into(
        &mut self,
        now: Instant,
        buf: &mut Vec<u8>,
        tail: Option<&mut Option<Bytes>>,
    ) -> Option<Transmit> {
        if self.reset_due {
            self.reset_due = false;
            let key = self.out_key()?;
            Encoder::new(buf, key).reset(true);
            return Some(self.sent(now, buf));
        }
        match self.state {
            State::Drained => None,
            State::Connecting | State::HalfOpen => {
                if !self.hs_due {
                    return None;
                }
                self.hs_due = false;
                self.hs_sends += 1;
                self.hs_sent_at = now;
                if self.hs_deadline.is_none() && self.side == Side::Initiator {
                    self.hs_deadline = Some(now + self.send.rtt.rto());
                }
                let mtu = self.config.mtu as u32;
                let max_message = self.config.max_message;
                let mut status = self.recv.status(now);
                // Nothing is acknowledged at set-up: the ack delay carries
                // this end's feature bits (see `frame`).
                status.ack_delay_us = self.features();
                let mut e;
                if self.side == Side::Initiator {
                    e = Encoder::new(buf, self.local_key);
                    e.first(&First {
                        service: self.service,
                        mtu,
                        max_message,
                    });
                } else {
                    e = Encoder::new(buf, self.out_key().expect("acceptor knows"));
                    e.accept(&Accept {
                        key: self.local_key,
                        mtu,
                        max_message,
                    });
                }
                e.status(&status, STATUS_MIN_LEN);
                Some(self.sent(now, buf))
            }
            State::Established | State::Closing | State::Closed => {
                let key = self.out_key().expect("set up");
                if self.send.unacked() == 0 {
                    self.last_progress = now;
                }
                let data = if self.state == State::Closed && !self.sentinel_pending() {
                    None
                } else {
                    let budget = self.mtu - HEADER_LEN - STATUS_MIN_LEN - DATA_HEADER_LEN;
                    self.send.next_packet(now, budget, self.config.sreq_every)
                };
                // A packet sent or sent again arms the timers itself.
                if !matches!(data, Some((_, _, Tx::New | Tx::Again))) {
                    self.send.arm(now);
                }
                let control =
                    self.ack_now || self.ping_due || self.ack_at.is_some_and(|t| now >= t);
                if data.is_none() && !control {
                    return None;
                }
                let mut e = Encoder::new(buf, key);
                match data {
                    Some((seq, sreq, tx)) => {
                        let room = self.mtu - HEADER_LEN - self.send.data_len(seq);
                        self.put_status(now, &mut e, room);
                        self.send.encode(seq, &mut e, tail);
                        e.sreq(sreq || self.ping_due);
                        match tx {
                            Tx::New => self.stats.data_packets += 1,
                            Tx::Again => self.stats.retransmits += 1,
                            Tx::Copy => {
                                self.stats.copies += 1;
                                self.ack_now = false;
                                self.ack_at = None;
                                self.ack_held = false;
                                self.ping_due = false;
                                let mut t = self.sent(now, buf);
                                t.alone = true;
                                return Some(t);
                            }
                        }
                    }
                    None => {
                        self.put_status(now, &mut e, self.mtu - HEADER_LEN);
                        if self.ping_due {
                            e.sreq(true);
                            self.stats.probes += 1;
                        }
                    }
                }
                self.ack_now = false;
                self.ack_at = None;
                self.ack_held = false;
                self.ping_due = false;
                Some(self.sent(now, buf))
            }
        }
    }

    /// Writes the status into `e`, in at most `room` bytes. Every packet
    /// carries one, and the packets of a burst (one `now`) mostly carry
    /// the same: when the status says what the last one written said, at
    /// the same instant (so the same ack delay) and whole, its encoded
    /// section is copied instead of built and encoded again. The bytes are
    /// those a fresh encoding gives.
    #[inline(always)]
    fn put_status(&mut self, now: Instant, e: &mut Encoder<'_>, room: usize) {
        if now == self.status_sent_at
            && !self.status_section.is_empty()
            && self.status_section.len() <= room
            && self.status_sent.as_ref().is_some_and(|s| self.recv.says(s))
        {
            e.status_encoded(&self.status_section);
            return;
        }
        self.put_fresh_status(now, e, room);
    }

    /// [`Association::put_status`] when the status is built and encoded
    /// afresh (out of line: the copy is the path of most packets).
    #[inline(never)]
    fn put_fresh_status(&mut self, now: Instant, e: &mut Encoder<'_>, room: usize) {
        let status = self.recv.status(now);
        let at = e.written();
        let whole = e.status(&status, room);
        self.status_section.clear();
        if whole {
            self.status_section.extend_from_slice(e.since(at));
            self.status_sent = Some(status);
        } else {
            self.status_sent = None;
        }
        self.status_sent_at = now;
    }

    fn sent(&mut self, now: Instant, buf: &[u8]) -> Transmit {
        self.last_sent = now;
        self.stats.packets_sent += 1;
        Transmit {
            destination: self.peer,
            size: buf.len(),
            alone: false,
        }
    }
}
