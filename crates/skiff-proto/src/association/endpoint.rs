//! QMP's endpoint: every association of one local address, the ones it
//! initiated and the ones it accepted, in one table, in the style of
//! quinn-proto's `Endpoint`. It owns demultiplexing (which association a
//! datagram belongs to), accepting (QMP's listening context), the
//! association table and the timers (the earliest deadline across all
//! associations). No I/O: a driver moves the datagrams and the time in.
//!
//! Lookup is QMP's: a FIRST (RTN clear) goes through the translation map
//! keyed by (source address, initiator's key), so a retransmitted FIRST
//! finds the association it already created; every other packet carries
//! this host's own key with RTN set and is found by that key alone,
//! whichever side started the association.
//!
//! Bounds: at most `max_associations` accepted associations and at most
//! `max_half_open` of them waiting for the initiator's confirmation. A
//! FIRST beyond either bound, or while the endpoint is not listening, is
//! dropped and counted, and nothing is sent back, so a flood of FIRSTs
//! from forged addresses costs a bounded amount of memory and reflects
//! nothing. Half-open associations expire after the handshake timeout.
//!
//! Keys (this host's half of every association) come from a
//! cryptographically strong generator (ChaCha, `rand`'s `StdRng`) seeded
//! by the caller ([`EndpointConfig::seed`]), unique within the endpoint:
//! a peer that sees the key of its own association learns nothing of the
//! others'.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rustc_hash::FxHashMap;

use super::frame::{Packet, RTN};
use super::{Association, AssociationConfig, State, Transmit};

/// Names an association of an [`Endpoint`] (its local key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Handle(pub u64);

/// How an [`Endpoint`] accepts and connects.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// The service id a FIRST must name (QMP's explicit addressing).
    pub service: u32,
    /// Whether FIRSTs are accepted from the start (see
    /// [`Endpoint::set_listening`]).
    pub listen: bool,
    /// Most accepted associations at once, half-open ones included.
    pub max_associations: usize,
    /// Most associations waiting for the initiator's confirmation.
    pub max_half_open: usize,
    /// Seed for the keys this endpoint hands out. Must be random (from the
    /// OS, by the caller): keys are what keeps others from injecting
    /// packets.
    pub seed: u64,
    /// The configuration of every association, accepted or initiated.
    pub association: AssociationConfig,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            service: 0,
            listen: true,
            max_associations: 4096,
            max_half_open: 256,
            seed: 0x5eed_5eed_5eed_5eed,
            association: AssociationConfig::default(),
        }
    }
}

/// Counters of an endpoint's listening side and demultiplexing. Every
/// dropped packet increments one (or one of its association's counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListenerStats {
    /// Associations created by a FIRST.
    pub first_accepted: u64,
    /// Associations that completed set-up (reported as
    /// [`EndpointEvent::Accepted`]).
    pub established: u64,
    /// FIRSTs dropped because `max_associations` were open.
    pub first_rejected_full: u64,
    /// FIRSTs dropped because `max_half_open` set-ups were pending.
    pub first_rejected_half_open: u64,
    /// FIRSTs naming another service (dropped).
    pub first_wrong_service: u64,
    /// FIRSTs dropped because the endpoint was not listening.
    pub first_not_listening: u64,
    /// Retransmitted FIRSTs for an existing association.
    pub first_duplicate: u64,
    /// Half-open associations that expired.
    pub half_open_expired: u64,
    /// Associations removed after closing or failing.
    pub removed: u64,
    /// Packets that did not decode (dropped).
    pub malformed: u64,
    /// Packets with a key no association has (dropped).
    pub unknown_key: u64,
    /// Packets with a known key from the wrong address, for an accepted
    /// association (dropped; an initiated one counts its own).
    pub wrong_source: u64,
}

/// What an [`Endpoint`] tells its driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointEvent {
    /// A peer set up an association; it is now the application's.
    Accepted(Handle),
    /// A datagram or a timer was handled for this association (accepted
    /// and handed out, or initiated here): it may have events, or room to
    /// send. Reported once until polled.
    Activity(Handle),
}

#[derive(Debug)]
struct Slot {
    assoc: Association,
    /// The initiator's key, for the translation map (accepted only).
    first_key: Option<u64>,
    half_open: bool,
    /// The application knows it (initiated here, or accepted and
    /// reported).
    handed_out: bool,
    in_ready: bool,
    touched: bool,
    /// An [`EndpointEvent::Activity`] for it is queued.
    active: bool,
    /// The deadline last pushed on the heap for it, while that entry is
    /// there (so an unchanged deadline is not pushed again).
    queued: Option<Instant>,
}

impl Slot {
    /// Whether [`Endpoint::after`] has nothing to do for it: not half-open,
    /// already queued for transmission and for a deadline refresh, and
    /// its activity reported (or not to be).
    fn noted(&self) -> bool {
        !self.half_open && self.in_ready && self.touched && (self.active || !self.handed_out)
    }
}

/// What [`Endpoint::feed`] stopped at.
enum Fed {
    /// The datagrams ran out.
    End,
    /// `Endpoint::packet` holds a packet decoded for another association
    /// (or a FIRST), to dispatch.
    Other,
    /// The association handled a packet and needs [`Endpoint::after`].
    After(u64),
    /// The association is no longer held (nothing was taken).
    Gone,
}

/// What the caller of [`Endpoint::transmit_with`] did with an association.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Took a packet from it: ask again.
    Sent,
    /// It had none: go on with the next.
    Idle,
    /// Took nothing and wants no more now: stop.
    Stop,
}

/// Data packets one association may emit before the next gets a turn.
const PER_TURN: u32 = 16;

/// The association endpoint; see the module documentation.
///
/// Polling order, on every wake-up of the driver:
/// 1. feed every datagram received to
///    [`handle_datagram`](Self::handle_datagram), and call
///    [`handle_timeout`](Self::handle_timeout) if the deadline passed;
/// 2. drain [`poll_event`](Self::poll_event): take
///    [`Accepted`](EndpointEvent::Accepted) associations, and drain the
///    events of each [`Activity`](EndpointEvent::Activity) one (reached with
///    [`association`](Self::association)), sending on them as the
///    application asks;
/// 3. drain [`poll_transmit`](Self::poll_transmit) until `None` (it also
///    forgets associations that finished and whose events were read);
/// 4. sleep until [`poll_timeout`](Self::poll_timeout), a datagram or the
///    application's next call.
#[derive(Debug)]
pub struct Endpoint {
    config: EndpointConfig,
    listening: bool,
    rng: StdRng,
    slots: FxHashMap<u64, Slot>,
    firsts: FxHashMap<(SocketAddr, u64), u64>,
    /// Accepted associations held, half-open included.
    accepted: usize,
    half_open: usize,
    events: VecDeque<EndpointEvent>,
    ready: VecDeque<u64>,
    /// Packets the association at the front of `ready` sent this turn.
    turn: u32,
    touched: Vec<u64>,
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    stats: ListenerStats,
    /// Every datagram is decoded into this one packet, in place (see
    /// [`Packet::decode_into`]).
    packet: Packet,
}

impl Endpoint {
    /// An endpoint with `config`.
    pub fn new(config: EndpointConfig) -> Endpoint {
        Endpoint {
            rng: StdRng::seed_from_u64(config.seed),
            listening: config.listen,
            config,
            slots: FxHashMap::default(),
            firsts: FxHashMap::default(),
            accepted: 0,
            half_open: 0,
            events: VecDeque::new(),
            ready: VecDeque::new(),
            turn: 0,
            touched: Vec::new(),
            deadlines: BinaryHeap::new(),
            stats: ListenerStats::default(),
            packet: Packet::default(),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &EndpointConfig {
        &self.config
    }

    /// Counters so far.
    pub fn stats(&self) -> ListenerStats {
        self.stats
    }

    /// Starts or stops accepting set-ups (QMP's listening context).
    /// Associations already set up are not affected.
    pub fn set_listening(&mut self, listen: bool) {
        self.listening = listen;
    }

    /// Whether set-ups are accepted.
    pub fn is_listening(&self) -> bool {
        self.listening
    }

    /// Associations held, initiated and accepted, half-open ones included.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no association is held.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Associations whose close has still to reach their peer
    /// ([`Association::is_closing`](super::Association::is_closing)).
    pub fn closing(&self) -> usize {
        self.slots.values().filter(|s| s.assoc.is_closing()).count()
    }

    /// Accepted associations waiting for the initiator's confirmation.
    pub fn half_open(&self) -> usize {
        self.half_open
    }

    /// Starts an association to the endpoint listening at `peer` for
    /// `service`, with this endpoint's association configuration. Its FIRST
    /// goes out with the next [`poll_transmit`](Self::poll_transmit); it
    /// reports [`Event::Connected`](super::Event::Connected) (or fails) like
    /// any association.
    pub fn connect(&mut self, now: Instant, peer: SocketAddr, service: u32) -> Handle {
        self.connect_mtu(now, peer, service, None)
    }

    /// [`Endpoint::connect`] with the datagram size of this path, when the
    /// caller knows it (the smaller of it and the listener's is used), in
    /// place of the configured `mtu`.
    pub fn connect_mtu(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        service: u32,
        mtu: Option<usize>,
    ) -> Handle {
        let key = self.new_key();
        let mut config = self.config.association.clone();
        if let Some(m) = mtu {
            config.mtu = m;
        }
        let assoc = Association::connect(now, config, peer, service, key);
        self.slots.insert(
            key,
            Slot {
                assoc,
                first_key: None,
                half_open: false,
                handed_out: true,
                in_ready: false,
                touched: false,
                active: false,
                queued: None,
            },
        );
        self.touch(key);
        Handle(key)
    }

    /// An association by handle, to send on, close or poll for events.
    /// Transmit afterwards.
    pub fn association(&mut self, h: Handle) -> Option<&mut Association> {
        let s = self.slots.get_mut(&h.0)?;
        if !s.in_ready {
            s.in_ready = true;
            self.ready.push_back(h.0);
        }
        if !s.touched {
            s.touched = true;
            self.touched.push(h.0);
        }
        Some(&mut s.assoc)
    }

    /// An association by handle, read-only (does not schedule it for
    /// transmission).
    pub fn get(&self, h: Handle) -> Option<&Association> {
        self.slots.get(&h.0).map(|s| &s.assoc)
    }

    /// Forgets an association at once, whatever its state (an abandoned
    /// set-up): nothing more is sent for it, and its packets are dropped
    /// as unknown. Returns it, for its counters.
    pub fn remove(&mut self, h: Handle) -> Option<Association> {
        let s = self.slots.remove(&h.0)?;
        self.forget(&s);
        Some(s.assoc)
    }

    fn forget(&mut self, s: &Slot) {
        if let Some(k) = s.first_key {
            self.firsts.remove(&(s.assoc.peer(), k));
            self.accepted -= 1;
        }
        if s.half_open {
            self.half_open -= 1;
        }
        self.stats.removed += 1;
    }

    fn touch(&mut self, key: u64) {
        let Some(s) = self.slots.get_mut(&key) else {
            return;
        };
        if !s.in_ready {
            s.in_ready = true;
            self.ready.push_back(key);
        }
        if !s.touched {
            s.touched = true;
            self.touched.push(key);
        }
    }

    /// Takes one datagram from `from` (an association packet: frame kind
    /// [`KIND`](super::KIND)) and hands it to its association, accepting
    /// a new one for a FIRST.
    pub fn handle_datagram(&mut self, now: Instant, from: SocketAddr, bytes: Bytes) {
        if self.packet.decode_into(bytes).is_err() {
            self.stats.malformed += 1;
            return;
        }
        self.dispatch(now, from);
    }

    /// Takes datagrams that arrived together from `from` (the segments of
    /// one GRO run), in order, as [`handle_datagram`](Self::handle_datagram)
    /// would one by one, with the same outcome: a packet for the
    /// association that took the one before it is handed to it without
    /// looking it up again (its key is compared, its source is the same).
    /// Takes datagrams until `datagrams` first yields `None`.
    pub fn handle_datagrams(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagrams: impl IntoIterator<Item = Bytes>,
    ) {
        let mut rest = datagrams.into_iter();
        // The association that took the last packet, if any.
        let mut last = None;
        loop {
            let fed = match last {
                Some(key) => self.feed(now, key, &mut rest),
                None => match rest.next() {
                    Some(bytes) => {
                        if self.packet.decode_into(bytes).is_err() {
                            self.stats.malformed += 1;
                            continue;
                        }
                        Fed::Other
                    }
                    None => Fed::End,
                },
            };
            last = match fed {
                Fed::End => return,
                Fed::Gone => None,
                Fed::Other => self.dispatch(now, from),
                Fed::After(key) => {
                    self.after(key);
                    Some(key)
                }
            };
        }
    }

    /// Hands association `key` (which took the packet before, from the
    /// same source) the packets of `rest` that carry its key, each decoded
    /// and handled as [`dispatch`](Self::dispatch) would, until one is
    /// another's (left decoded in `self.packet`), one needs
    /// [`after`](Self::after), or `rest` ends.
    fn feed(&mut self, now: Instant, key: u64, rest: &mut impl Iterator<Item = Bytes>) -> Fed {
        let Endpoint {
            slots,
            packet: p,
            stats,
            ..
        } = self;
        let Some(slot) = slots.get_mut(&key) else {
            return Fed::Gone;
        };
        for bytes in rest {
            if p.decode_into(bytes).is_err() {
                stats.malformed += 1;
                continue;
            }
            if p.first.is_some() || p.key != key | RTN {
                return Fed::Other;
            }
            slot.assoc.handle_packet(now, p);
            p.data = None;
            if !slot.noted() {
                return Fed::After(key);
            }
        }
        Fed::End
    }

    /// Hands the packet decoded in `self.packet` from `from` to its
    /// association, accepting a new one for a FIRST. Returns the key of
    /// the association that took it, when it was not a FIRST.
    fn dispatch(&mut self, now: Instant, from: SocketAddr) -> Option<u64> {
        let p = &mut self.packet;
        if p.first.is_some() {
            let p = std::mem::take(p);
            self.handle_first(now, from, p);
            return None;
        }
        if p.key & RTN == 0 {
            self.stats.unknown_key += 1;
            return None;
        }
        let key = p.key & !RTN;
        let Some(slot) = self.slots.get_mut(&key) else {
            self.stats.unknown_key += 1;
            return None;
        };
        if slot.assoc.peer() != from {
            if slot.first_key.is_some() {
                self.stats.wrong_source += 1;
            } else {
                slot.assoc.count_wrong_source();
            }
            return None;
        }
        // By reference: a packet is a few hundred bytes, moved for nothing.
        slot.assoc.handle_packet(now, p);
        // What the association left (data it did not take) is not kept
        // until the next datagram.
        p.data = None;
        if !slot.noted() {
            // `noted`: the common case within one wake-up, where `after`
            // would change nothing (and look the slot up twice to find
            // that out).
            self.after(key);
        }
        Some(key)
    }

    fn handle_first(&mut self, now: Instant, from: SocketAddr, mut p: Packet) {
        let first = p.first.expect("checked by caller");
        if !self.listening {
            self.stats.first_not_listening += 1;
            return;
        }
        if first.service != self.config.service {
            self.stats.first_wrong_service += 1;
            return;
        }
        if let Some(&key) = self.firsts.get(&(from, p.key)) {
            self.stats.first_duplicate += 1;
            if let Some(s) = self.slots.get_mut(&key) {
                s.assoc.handle_packet(now, &mut p);
            }
            self.after(key);
            return;
        }
        if self.accepted >= self.config.max_associations {
            self.stats.first_rejected_full += 1;
            return;
        }
        if self.half_open >= self.config.max_half_open {
            self.stats.first_rejected_half_open += 1;
            return;
        }
        let key = self.new_key();
        let assoc = Association::accept(now, self.config.association.clone(), from, key, &p);
        self.slots.insert(
            key,
            Slot {
                assoc,
                first_key: Some(p.key),
                half_open: true,
                handed_out: false,
                in_ready: false,
                touched: false,
                active: false,
                queued: None,
            },
        );
        self.firsts.insert((from, p.key), key);
        self.accepted += 1;
        self.half_open += 1;
        self.stats.first_accepted += 1;
        self.after(key);
    }

    /// A fresh key: nonzero, RTN clear, unused here.
    fn new_key(&mut self) -> u64 {
        loop {
            let k = self.rng.next_u64() & !RTN;
            if k != 0 && !self.slots.contains_key(&k) {
                return k;
            }
        }
    }

    /// Bookkeeping after an association was driven: half-open accounting,
    /// hand-out on set-up, activity for the driver.
    fn after(&mut self, key: u64) {
        let Some(s) = self.slots.get_mut(&key) else {
            return;
        };
        let state = s.assoc.state();
        if s.half_open && state != State::HalfOpen {
            s.half_open = false;
            self.half_open -= 1;
            if state == State::Drained {
                self.stats.half_open_expired += 1;
            } else {
                self.stats.established += 1;
                s.handed_out = true;
                self.events.push_back(EndpointEvent::Accepted(Handle(key)));
            }
        }
        if s.handed_out && !s.active {
            s.active = true;
            self.events.push_back(EndpointEvent::Activity(Handle(key)));
        }
        self.touch(key);
    }

    fn remove_if_drained(&mut self, key: u64) {
        let Some(s) = self.slots.get(&key) else {
            return;
        };
        // Keep a drained association while the application may still read
        // its last events (it was handed out unless it never set up).
        if !s.assoc.is_drained() || (s.handed_out && s.assoc.has_events()) {
            return;
        }
        let s = self.slots.remove(&key).expect("present");
        self.forget(&s);
    }

    /// Acts on every association's expired timers.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.refresh();
        while let Some(&Reverse((t, key))) = self.deadlines.peek() {
            if t > now {
                break;
            }
            self.deadlines.pop();
            let Some(s) = self.slots.get_mut(&key) else {
                continue;
            };
            if s.queued == Some(t) {
                s.queued = None;
            }
            if s.assoc.poll_timeout() != Some(t) {
                continue;
            }
            s.assoc.handle_timeout(now);
            self.after(key);
        }
    }

    /// Pushes fresh deadlines for associations touched since the last call.
    fn refresh(&mut self) {
        for key in std::mem::take(&mut self.touched) {
            let Some(s) = self.slots.get_mut(&key) else {
                continue;
            };
            s.touched = false;
            let t = s.assoc.poll_timeout();
            if let Some(t) = t.filter(|&t| s.queued != Some(t)) {
                self.deadlines.push(Reverse((t, key)));
                s.queued = Some(t);
            }
        }
    }

    /// The earliest instant some association has timer work.
    #[must_use]
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        self.refresh();
        while let Some(&Reverse((t, key))) = self.deadlines.peek() {
            let Some(s) = self.slots.get_mut(&key) else {
                self.deadlines.pop();
                continue;
            };
            if s.assoc.poll_timeout() == Some(t) {
                return Some(t);
            }
            // Stale: the association's deadline moved (its current one,
            // if any, has an entry of its own since `refresh`).
            if s.queued == Some(t) {
                s.queued = None;
            }
            self.deadlines.pop();
        }
        None
    }

    /// The next thing the driver should act on: an association accepted,
    /// or one with new input.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<EndpointEvent> {
        let e = self.events.pop_front()?;
        if let EndpointEvent::Activity(h) = e {
            if let Some(s) = self.slots.get_mut(&h.0) {
                s.active = false;
            }
        }
        Some(e)
    }

    /// Writes the next datagram any association has to send into `buf`
    /// (cleared first), taking associations in turn.
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
        buf.clear();
        self.poll_transmit_append(now, buf)
    }

    /// Like [`poll_transmit`](Self::poll_transmit), but appends the datagram
    /// to `buf` (see [`Association::poll_transmit_append`]); `buf` is left
    /// as it was when `None` is returned.
    #[must_use]
    pub fn poll_transmit_append(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
        self.poll_with(|a| a.poll_transmit_append(now, buf))
    }

    /// Like [`poll_transmit_append`](Self::poll_transmit_append), but a
    /// data packet's large last chunk is handed out in `tail` rather than
    /// copied (see [`Association::poll_transmit_split`]).
    #[must_use]
    pub fn poll_transmit_split(
        &mut self,
        now: Instant,
        buf: &mut Vec<u8>,
        tail: &mut Option<Bytes>,
    ) -> Option<Transmit> {
        self.poll_with(|a| a.poll_transmit_split(now, buf, tail))
    }

    /// Hands the associations with packets to send to `take`, in the turns
    /// [`poll_transmit`](Self::poll_transmit) gives them, until `take`
    /// says [`Step::Stop`] or none has more: `take` polls the association
    /// for one packet (with [`Association::poll_transmit_append`] or
    /// [`Association::poll_transmit_split`]) and says [`Step::Sent`] if it
    /// got one, [`Step::Idle`] if not. The same packets in the same order
    /// as a loop of `poll_transmit`, with one table lookup per turn of an
    /// association instead of one per packet (a driver's bulk path).
    pub fn transmit_with(&mut self, mut take: impl FnMut(&mut Association) -> Step) {
        while let Some(&key) = self.ready.front() {
            let Some(s) = self.slots.get_mut(&key) else {
                self.ready.pop_front();
                self.turn = 0;
                continue;
            };
            loop {
                match take(&mut s.assoc) {
                    Step::Stop => return,
                    Step::Sent => {
                        if !s.touched {
                            s.touched = true;
                            self.touched.push(key);
                        }
                        self.turn += 1;
                        if self.turn >= PER_TURN {
                            // Its turn is over: to the back of the line.
                            self.turn = 0;
                            self.ready.pop_front();
                            self.ready.push_back(key);
                            break;
                        }
                    }
                    Step::Idle => {
                        s.in_ready = false;
                        self.ready.pop_front();
                        self.turn = 0;
                        self.remove_if_drained(key);
                        break;
                    }
                }
            }
        }
    }

    /// The next datagram any association has, as `poll` takes it from one,
    /// taking associations in turn ([`Endpoint::transmit_with`] stopped
    /// after one packet).
    #[inline]
    fn poll_with(
        &mut self,
        mut poll: impl FnMut(&mut Association) -> Option<Transmit>,
    ) -> Option<Transmit> {
        let mut got = None;
        self.transmit_with(|a| {
            if got.is_some() {
                return Step::Stop;
            }
            match poll(a) {
                Some(t) => {
                    got = Some(t);
                    Step::Sent
                }
                None => Step::Idle,
            }
        });
        got
    }
}
