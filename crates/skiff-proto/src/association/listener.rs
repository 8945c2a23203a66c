//! QMP's listening context: matches FIRST packets against its service,
//! creates associations within configured bounds and routes every later
//! packet to its association by key.
//!
//! Lookup is QMP's: a FIRST (RTN clear) goes through the translation map
//! keyed by (source address, initiator's key), so a retransmitted FIRST
//! finds the association it already created; every other packet carries
//! this host's own key with RTN set and is found by that key alone.
//!
//! Bounds: at most `max_associations` associations and at most
//! `max_half_open` of them waiting for the initiator's confirmation. A FIRST
//! beyond either bound is dropped and counted, and nothing is sent back, so
//! a flood of FIRSTs from forged addresses costs a bounded amount of memory
//! and reflects nothing. Half-open associations expire after the
//! handshake timeout.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;
use rustc_hash::FxHashMap;

use super::frame::{Packet, RTN};
use super::{Association, AssociationConfig, State, Transmit};

/// Names an association accepted by a [`Listener`] (its local key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Handle(pub u64);

/// How a [`Listener`] accepts.
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    /// The service id a FIRST must name (QMP's explicit addressing).
    pub service: u32,
    /// Most associations at once, half-open ones included.
    pub max_associations: usize,
    /// Most associations waiting for the initiator's confirmation.
    pub max_half_open: usize,
    /// Seed for the keys this listener hands out. Must be random (from the
    /// OS, by the caller): keys are what keeps others from injecting
    /// packets.
    pub seed: u64,
    /// The configuration of every accepted association.
    pub association: AssociationConfig,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        ListenerConfig {
            service: 0,
            max_associations: 4096,
            max_half_open: 256,
            seed: 0x5eed_5eed_5eed_5eed,
            association: AssociationConfig::default(),
        }
    }
}

/// Counters a listener keeps. Every dropped packet increments one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListenerStats {
    /// Associations created by a FIRST.
    pub first_accepted: u64,
    /// Associations that completed set-up (handed out by `accept`).
    pub established: u64,
    /// FIRSTs dropped because `max_associations` were open.
    pub first_rejected_full: u64,
    /// FIRSTs dropped because `max_half_open` set-ups were pending.
    pub first_rejected_half_open: u64,
    /// FIRSTs naming another service (dropped).
    pub first_wrong_service: u64,
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
    /// Packets with a known key from the wrong address (dropped).
    pub wrong_source: u64,
}

#[derive(Debug)]
struct Slot {
    assoc: Association,
    /// The initiator's key, for the translation map.
    first_key: u64,
    half_open: bool,
    handed_out: bool,
    in_ready: bool,
    touched: bool,
}

/// A listening context; see the module documentation.
///
/// Polling order is an association's (see [`Association`]): feed
/// [`handle_datagram`](Self::handle_datagram) and
/// [`handle_timeout`](Self::handle_timeout), drain
/// [`poll_transmit`](Self::poll_transmit), take new associations from
/// [`accept`](Self::accept) and events from each association (reached with
/// [`association`](Self::association)), transmit again, and sleep until
/// [`poll_timeout`](Self::poll_timeout).
#[derive(Debug)]
pub struct Listener {
    config: ListenerConfig,
    rng: u64,
    slots: FxHashMap<u64, Slot>,
    firsts: FxHashMap<(SocketAddr, u64), u64>,
    half_open: usize,
    accepted: VecDeque<Handle>,
    ready: VecDeque<u64>,
    touched: Vec<u64>,
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    stats: ListenerStats,
}

impl Listener {
    /// A listener with `config`.
    pub fn new(config: ListenerConfig) -> Listener {
        Listener {
            rng: config.seed | 1,
            config,
            slots: FxHashMap::default(),
            firsts: FxHashMap::default(),
            half_open: 0,
            accepted: VecDeque::new(),
            ready: VecDeque::new(),
            touched: Vec::new(),
            deadlines: BinaryHeap::new(),
            stats: ListenerStats::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> ListenerStats {
        self.stats
    }

    /// Associations held, half-open ones included.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no association is held.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Associations waiting for the initiator's confirmation.
    pub fn half_open(&self) -> usize {
        self.half_open
    }

    /// The next association that completed set-up.
    #[must_use]
    pub fn accept(&mut self) -> Option<Handle> {
        self.accepted.pop_front()
    }

    /// An association by handle, to send on, close or poll for events.
    /// Transmit afterwards.
    pub fn association(&mut self, h: Handle) -> Option<&mut Association> {
        self.touch(h.0);
        self.slots.get_mut(&h.0).map(|s| &mut s.assoc)
    }

    /// An association by handle, read-only (does not schedule it for
    /// transmission).
    pub fn get(&self, h: Handle) -> Option<&Association> {
        self.slots.get(&h.0).map(|s| &s.assoc)
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

    /// Takes one datagram from `from`.
    pub fn handle_datagram(&mut self, now: Instant, from: SocketAddr, bytes: Bytes) {
        let p = match Packet::decode(&bytes) {
            Ok(p) => p,
            Err(_) => {
                self.stats.malformed += 1;
                return;
            }
        };
        if p.first.is_some() {
            return self.handle_first(now, from, p);
        }
        if p.key & RTN == 0 {
            self.stats.unknown_key += 1;
            return;
        }
        let key = p.key & !RTN;
        let Some(slot) = self.slots.get_mut(&key) else {
            self.stats.unknown_key += 1;
            return;
        };
        if slot.assoc.peer() != from {
            self.stats.wrong_source += 1;
            return;
        }
        slot.assoc.handle_packet(now, p);
        self.after(key);
    }

    fn handle_first(&mut self, now: Instant, from: SocketAddr, p: Packet) {
        let first = p.first.expect("checked by caller");
        if first.service != self.config.service {
            self.stats.first_wrong_service += 1;
            return;
        }
        if let Some(&key) = self.firsts.get(&(from, p.key)) {
            self.stats.first_duplicate += 1;
            if let Some(s) = self.slots.get_mut(&key) {
                s.assoc.handle_packet(now, p);
            }
            self.after(key);
            return;
        }
        if self.slots.len() >= self.config.max_associations {
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
                first_key: p.key,
                half_open: true,
                handed_out: false,
                in_ready: false,
                touched: false,
            },
        );
        self.firsts.insert((from, p.key), key);
        self.half_open += 1;
        self.stats.first_accepted += 1;
        self.after(key);
    }

    /// A fresh key: nonzero, RTN clear, unused here (xorshift64*).
    fn new_key(&mut self) -> u64 {
        loop {
            self.rng ^= self.rng >> 12;
            self.rng ^= self.rng << 25;
            self.rng ^= self.rng >> 27;
            let k = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) & !RTN;
            if k != 0 && !self.slots.contains_key(&k) {
                return k;
            }
        }
    }

    /// Bookkeeping after an association was driven: half-open accounting,
    /// hand-out on set-up, removal when drained.
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
                self.accepted.push_back(Handle(key));
            }
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
        self.firsts.remove(&(s.assoc.peer(), s.first_key));
        self.stats.removed += 1;
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
            if let Some(t) = s.assoc.poll_timeout() {
                self.deadlines.push(Reverse((t, key)));
            }
        }
    }

    /// The earliest instant some association has timer work.
    #[must_use]
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        self.refresh();
        while let Some(&Reverse((t, key))) = self.deadlines.peek() {
            if self.slots.get(&key).and_then(|s| s.assoc.poll_timeout()) == Some(t) {
                return Some(t);
            }
            self.deadlines.pop();
        }
        None
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
        while let Some(key) = self.ready.pop_front() {
            let Some(s) = self.slots.get_mut(&key) else {
                continue;
            };
            if let Some(t) = s.assoc.poll_transmit_append(now, buf) {
                self.ready.push_back(key);
                if !s.touched {
                    s.touched = true;
                    self.touched.push(key);
                }
                return Some(t);
            }
            s.in_ready = false;
            self.remove_if_drained(key);
        }
        None
    }
}
