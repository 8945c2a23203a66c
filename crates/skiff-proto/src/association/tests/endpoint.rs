//! The association endpoint: two [`Endpoint`]s joined by the simulated
//! network of [`harness`](super::harness) (seeded loss, duplication,
//! reordering and latency; time jumps to the next deadline), each able to
//! initiate and accept. Events are read only when the endpoint reports
//! activity, so every script also checks that the reports suffice.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;

use super::harness::{msg, test_config, Net, Rng};
use crate::association::{
    AssociationConfig, CloseReason, Endpoint, EndpointConfig, EndpointEvent, Event, FailReason,
    Handle, Step,
};

const SERVICE: u32 = 7;

/// Return true to drop a datagram: (order of sending, from side, bytes).
type Filter = Box<dyn FnMut(usize, usize, &[u8]) -> bool>;

/// A datagram on the way: arrival, order of sending, to side, bytes.
type InFlight = Reverse<(Instant, u64, usize, Vec<u8>)>;

/// Two endpoints, sides 0 and 1, and a network between them.
struct Duo {
    now: Instant,
    start: Instant,
    ep: [Endpoint; 2],
    addr: [SocketAddr; 2],
    net: Net,
    rng: Rng,
    queue: BinaryHeap<InFlight>,
    order: u64,
    sent: usize,
    filter: Option<Filter>,
    /// Events per side and association, in order.
    events: [BTreeMap<Handle, Vec<Event>>; 2],
    /// Associations accepted per side, in order.
    accepted: [Vec<Handle>; 2],
    /// Datagrams due together for one side go in with one
    /// [`Endpoint::handle_datagrams`] (as a GRO run does), not one by one.
    batched: bool,
    /// Chance that a datagram is followed by a copy with one byte
    /// changed (malformed, another key, other values).
    garble: f64,
    /// The most datagrams handed over in one run.
    longest_run: usize,
}

fn endpoint(seed: u64, config: &AssociationConfig) -> Endpoint {
    Endpoint::new(EndpointConfig {
        service: SERVICE,
        seed,
        association: config.clone(),
        ..EndpointConfig::default()
    })
}

impl Duo {
    fn new(seed: u64, net: Net) -> Duo {
        Duo::with_config(seed, net, test_config())
    }

    fn with_config(seed: u64, net: Net, config: AssociationConfig) -> Duo {
        let now = Instant::now();
        let mut rng = Rng::new(seed);
        Duo {
            now,
            start: now,
            ep: [endpoint(rng.next(), &config), endpoint(rng.next(), &config)],
            addr: [
                "10.0.0.1:4000".parse().unwrap(),
                "10.0.0.2:4747".parse().unwrap(),
            ],
            net,
            rng,
            queue: BinaryHeap::new(),
            order: 0,
            sent: 0,
            filter: None,
            events: [BTreeMap::new(), BTreeMap::new()],
            accepted: [Vec::new(), Vec::new()],
            batched: false,
            garble: 0.0,
            longest_run: 0,
        }
    }

    /// Side `from` connects to the other side.
    fn connect(&mut self, from: usize) -> Handle {
        let to = self.addr[1 - from];
        self.ep[from].connect(self.now, to, SERVICE)
    }

    fn send_datagram(&mut self, from: usize, bytes: Vec<u8>) {
        let index = self.sent;
        self.sent += 1;
        if let Some(f) = &mut self.filter {
            if f(index, from, &bytes) {
                return;
            }
        }
        if bytes.len() > self.net.mtu || self.rng.chance(self.net.loss) {
            return;
        }
        let copies = if self.rng.chance(self.net.dup) { 2 } else { 1 };
        for _ in 0..copies {
            self.queue_datagram(from, bytes.clone());
        }
        if self.garble > 0.0 && self.rng.chance(self.garble) {
            let mut bad = bytes;
            let at = self.rng.below(bad.len() as u64) as usize;
            bad[at] ^= 1 << self.rng.below(8);
            self.queue_datagram(from, bad);
        }
    }

    fn queue_datagram(&mut self, from: usize, bytes: Vec<u8>) {
        let jitter = self.rng.below(self.net.jitter.as_micros() as u64 + 1);
        let at = self.now + self.net.latency + Duration::from_micros(jitter);
        self.order += 1;
        self.queue.push(Reverse((at, self.order, 1 - from, bytes)));
    }

    /// Transmits and reads events on both sides until neither has any.
    fn flush(&mut self) {
        let mut buf = Vec::new();
        loop {
            let mut any = false;
            for side in 0..2 {
                if side == 1 {
                    // Side 1 is driven as a driver's bulk path drives it:
                    // association by association, stopping after a random
                    // number of packets, each with its large payload handed
                    // out by reference (the datagram is `buf` then `tail`).
                    let budget = 1 + self.rng.below(40);
                    let (now, to) = (self.now, self.addr[0]);
                    let mut out = Vec::new();
                    self.ep[1].transmit_with(|a| {
                        if out.len() as u64 >= budget {
                            return Step::Stop;
                        }
                        let (mut buf, mut tail) = (Vec::new(), None);
                        let Some(t) = a.poll_transmit_split(now, &mut buf, &mut tail) else {
                            return Step::Idle;
                        };
                        if let Some(b) = tail.take() {
                            buf.extend_from_slice(&b);
                        }
                        assert_eq!(t.destination, to);
                        assert_eq!(t.size, buf.len());
                        out.push(buf);
                        Step::Sent
                    });
                    any |= !out.is_empty();
                    for d in out {
                        self.send_datagram(1, d);
                    }
                }
                while let Some(t) = self.ep[side].poll_transmit(self.now, &mut buf) {
                    assert_eq!(t.destination, self.addr[1 - side]);
                    assert_eq!(t.size, buf.len());
                    self.send_datagram(side, buf.clone());
                    any = true;
                }
                while let Some(ev) = self.ep[side].poll_event() {
                    any = true;
                    let h = match ev {
                        EndpointEvent::Accepted(h) => {
                            self.accepted[side].push(h);
                            h
                        }
                        EndpointEvent::Activity(h) => h,
                    };
                    let Some(a) = self.ep[side].association(h) else {
                        continue;
                    };
                    let log = self.events[side].entry(h).or_default();
                    while let Some(e) = a.poll_event() {
                        log.push(e);
                    }
                }
            }
            if !any {
                break;
            }
        }
    }

    /// Delivers what is due, or jumps to the next deadline; false when
    /// nothing at all is scheduled.
    fn step(&mut self) -> bool {
        self.flush();
        let mut delivered = false;
        // Consecutive datagrams due for one side, in order.
        let mut run: Vec<Bytes> = Vec::new();
        let mut run_to = 0;
        while let Some(Reverse((at, ..))) = self.queue.peek() {
            if *at > self.now {
                break;
            }
            let Reverse((_, _, to, bytes)) = self.queue.pop().unwrap();
            delivered = true;
            if !self.batched {
                let from = self.addr[1 - to];
                self.ep[to].handle_datagram(self.now, from, bytes.into());
                continue;
            }
            if to != run_to && !run.is_empty() {
                self.deliver_run(run_to, &mut run);
            }
            run_to = to;
            run.push(bytes.into());
        }
        self.deliver_run(run_to, &mut run);
        if delivered {
            return true;
        }
        let next = [
            self.queue.peek().map(|Reverse((t, ..))| *t),
            self.ep[0].poll_timeout(),
            self.ep[1].poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(t) = next else {
            return false;
        };
        self.now = self.now.max(t);
        for ep in &mut self.ep {
            ep.handle_timeout(self.now);
        }
        true
    }

    fn deliver_run(&mut self, to: usize, run: &mut Vec<Bytes>) {
        let from = self.addr[1 - to];
        self.longest_run = self.longest_run.max(run.len());
        self.ep[to].handle_datagrams(self.now, from, run.drain(..));
    }

    fn drive_until(&mut self, limit: Duration, mut done: impl FnMut(&mut Duo) -> bool) -> bool {
        let end = self.now + limit;
        for _ in 0..5_000_000u64 {
            self.flush();
            if done(self) {
                return true;
            }
            if self.now > end || !self.step() {
                self.flush();
                return done(self);
            }
        }
        panic!("simulation does not settle");
    }

    /// Steps until the network and both endpoints are idle for good.
    fn drive_to_end(&mut self) {
        let ok = self.drive_until(Duration::from_secs(600), |d| {
            d.queue.is_empty()
                && d.ep[0].poll_timeout().is_none()
                && d.ep[1].poll_timeout().is_none()
        });
        assert!(ok, "did not settle within 600 s of simulated time");
    }

    fn log(&self, side: usize, h: Handle) -> &[Event] {
        self.events[side].get(&h).map_or(&[], |v| v.as_slice())
    }

    fn connected(&self, side: usize, h: Handle) -> bool {
        self.log(side, h).first() == Some(&Event::Connected)
    }

    fn messages(&self, side: usize, h: Handle) -> Vec<Bytes> {
        self.log(side, h)
            .iter()
            .filter_map(|e| match e {
                Event::Message(m) => Some(m.clone()),
                _ => None,
            })
            .collect()
    }

    fn elapsed(&self) -> Duration {
        self.now - self.start
    }
}

fn lossless() -> Duo {
    Duo::new(1, Net::default())
}

#[test]
fn endpoint_handshake_completes_and_accept_is_reported() {
    let mut d = lossless();
    let h = d.connect(0);
    assert!(d.drive_until(Duration::from_secs(5), |d| d.connected(0, h)
        && d.accepted[1].len() == 1));
    let s = d.accepted[1][0];
    assert!(d.connected(1, s));
    assert_eq!(d.ep[1].get(s).unwrap().peer(), d.addr[0]);
    assert_eq!(d.ep[1].stats().established, 1);
    assert!(
        d.accepted[0].is_empty(),
        "an initiated association is not accepted"
    );
}

#[test]
fn endpoint_handshake_survives_lost_first() {
    let mut d = lossless();
    d.filter = Some(Box::new(|i, _, _| i == 0));
    let h = d.connect(0);
    assert!(d.drive_until(Duration::from_secs(10), |d| d.connected(0, h)
        && d.accepted[1].len() == 1));
    assert!(
        d.elapsed() >= test_config().initial_rto,
        "FIRST was sent again"
    );
}

#[test]
fn endpoint_handshake_survives_lost_answer() {
    let mut d = lossless();
    // The first datagram from side 1 is the ACCEPT.
    let mut dropped = false;
    d.filter = Some(Box::new(move |_, from, _| {
        let drop = from == 1 && !dropped;
        dropped |= drop;
        drop
    }));
    let h = d.connect(0);
    assert!(d.drive_until(Duration::from_secs(10), |d| d.connected(0, h)
        && d.accepted[1].len() == 1));
    assert_eq!(
        d.ep[1].stats().first_duplicate,
        1,
        "the retransmitted FIRST"
    );
    assert_eq!(d.ep[1].len(), 1, "one association for both FIRSTs");
}

#[test]
fn endpoints_connect_both_ways_and_demultiplex() {
    let mut d = Duo::new(
        3,
        Net {
            jitter: Duration::from_millis(3),
            ..Net::default()
        },
    );
    // Two associations each way between the same pair of addresses.
    let out0: Vec<Handle> = (0..2).map(|_| d.connect(0)).collect();
    let out1: Vec<Handle> = (0..2).map(|_| d.connect(1)).collect();
    assert!(
        d.drive_until(Duration::from_secs(5), |d| d.accepted[0].len() == 2
            && d.accepted[1].len() == 2)
    );
    // Each association carries its own numbered messages.
    for (i, &h) in out0.iter().enumerate() {
        for j in 0..20 {
            d.ep[0]
                .association(h)
                .unwrap()
                .send(msg(100 * i + j, 50 + j))
                .unwrap();
        }
    }
    for (i, &h) in out1.iter().enumerate() {
        for j in 0..20 {
            d.ep[1]
                .association(h)
                .unwrap()
                .send(msg(1000 + 100 * i + j, 70))
                .unwrap();
        }
    }
    d.drive_to_end_of_data();
    // The acceptor sees the initiator's streams in set-up order.
    for side in 0..2 {
        let (theirs, base) = if side == 1 { (&out0, 0) } else { (&out1, 1000) };
        let mut got: Vec<Vec<Bytes>> = d.accepted[side]
            .iter()
            .map(|&h| d.messages(side, h))
            .collect();
        got.sort_by_key(|m| u64::from_le_bytes(m[0][..8].try_into().unwrap()));
        assert_eq!(got.len(), theirs.len());
        for (i, m) in got.iter().enumerate() {
            let want: Vec<Bytes> = (0..20)
                .map(|j| {
                    let len = if side == 1 { 50 + j } else { 70 };
                    msg(base + 100 * i + j, len)
                })
                .collect();
            assert_eq!(m, &want, "side {side} association {i}");
        }
    }
    // Nothing went astray.
    for side in 0..2 {
        let s = d.ep[side].stats();
        assert_eq!(s.unknown_key + s.wrong_source + s.malformed, 0, "{s:?}");
    }
}

impl Duo {
    /// Steps until no association on either side has data outstanding.
    fn drive_to_end_of_data(&mut self) {
        let ok = self.drive_until(Duration::from_secs(120), |d| {
            d.queue.is_empty()
                && (0..2).all(|side| {
                    let keys: Vec<Handle> = d.events[side].keys().copied().collect();
                    keys.iter().all(|&h| {
                        d.ep[side]
                            .get(h)
                            .is_none_or(|a| a.in_flight() == 0 && a.buffered() == 0)
                    })
                })
        });
        assert!(ok, "data still outstanding after 120 s");
    }
}

#[test]
fn endpoint_not_listening_drops_first_and_reflects_nothing() {
    let mut d = lossless();
    d.ep[1].set_listening(false);
    let h = d.connect(0);
    d.drive_to_end();
    assert_eq!(
        d.log(0, h).last(),
        Some(&Event::Failed(FailReason::HandshakeTimeout))
    );
    let s = d.ep[1].stats();
    assert!(s.first_not_listening >= 2, "{s:?}");
    assert_eq!(s.first_accepted, 0);
    assert!(d.ep[1].is_empty());
    assert!(
        d.ep[0].is_empty(),
        "the failed set-up is forgotten once read"
    );
}

#[test]
fn endpoint_timeout_is_the_earliest_of_its_associations() {
    let mut d = lossless();
    let h0 = d.connect(0);
    d.flush();
    // A later association's first deadline is later.
    d.now += Duration::from_millis(30);
    let h1 = d.connect(0);
    d.flush();
    let a0 = d.ep[0].get(h0).unwrap().poll_timeout().unwrap();
    let a1 = d.ep[0].get(h1).unwrap().poll_timeout().unwrap();
    assert!(a0 < a1);
    assert_eq!(d.ep[0].poll_timeout(), Some(a0));
    // Once the first is gone, the other's deadline is the endpoint's.
    assert!(d.ep[0].remove(h0).is_some());
    assert_eq!(d.ep[0].poll_timeout(), Some(a1));
    // Timers fire only when due: FIRST goes out again at the deadline.
    d.ep[0].handle_timeout(a1 - Duration::from_millis(1));
    assert!(d.ep[0].poll_transmit(d.now, &mut Vec::new()).is_none());
    d.now = a1;
    d.ep[0].handle_timeout(a1);
    assert!(d.ep[0].poll_transmit(d.now, &mut Vec::new()).is_some());
}

#[test]
fn endpoint_remove_abandons_a_setup() {
    let mut d = lossless();
    let h = d.connect(0);
    assert!(d.ep[0].remove(h).is_some());
    assert!(d.ep[0].is_empty());
    assert_eq!(d.ep[0].poll_timeout(), None);
    assert!(d.ep[0].poll_transmit(d.now, &mut Vec::new()).is_none());
    assert!(d.ep[0].association(h).is_none());
    d.drive_to_end();
    assert!(d.accepted[1].is_empty());
}

#[test]
fn endpoint_drops_and_counts_what_is_not_its_own() {
    let mut d = lossless();
    let h = d.connect(0);
    assert!(d.drive_until(Duration::from_secs(5), |d| d.connected(0, h)
        && d.accepted[1].len() == 1));
    let s = d.accepted[1][0];
    // A packet for side 1's association, from a third address.
    d.ep[1].association(s).unwrap().send(msg(1, 10)).unwrap();
    let mut buf = Vec::new();
    let t = d.ep[1].poll_transmit(d.now, &mut buf).unwrap();
    assert_eq!(t.destination, d.addr[0]);
    let stranger: SocketAddr = "10.9.9.9:1".parse().unwrap();
    d.ep[0].handle_datagram(d.now, stranger, Bytes::copy_from_slice(&buf));
    // An initiated association counts its wrong sources itself.
    assert_eq!(d.ep[0].get(h).unwrap().stats().wrong_source, 1);
    // Undecodable, and a key nobody has.
    d.ep[0].handle_datagram(d.now, d.addr[1], Bytes::from_static(b"SK\x01\x02"));
    assert_eq!(d.ep[0].stats().malformed, 1);
    let mut bogus = buf.clone();
    bogus[5..13].copy_from_slice(&(0x8000_0000_0000_0001u64).to_le_bytes());
    d.ep[0].handle_datagram(d.now, d.addr[1], Bytes::from(bogus));
    let st = d.ep[0].stats();
    assert_eq!(st.unknown_key + st.malformed, 2, "{st:?}");
    // The real packet still arrives.
    d.ep[0].handle_datagram(d.now, d.addr[1], Bytes::from(buf));
    d.flush();
    assert_eq!(d.messages(0, h), vec![msg(1, 10)]);
}

#[test]
fn endpoint_forgets_associations_after_close() {
    let mut d = Duo::new(
        9,
        Net {
            loss: 0.1,
            ..Net::default()
        },
    );
    let hs: Vec<Handle> = (0..3).map(|_| d.connect(0)).collect();
    for (i, &h) in hs.iter().enumerate() {
        d.ep[0].association(h).unwrap().send(msg(i, 3000)).unwrap();
        d.ep[0].association(h).unwrap().close();
    }
    assert!(
        d.drive_until(Duration::from_secs(60), |d| d.accepted[1].len() == 3
            && d.accepted[1]
                .iter()
                .all(|&s| matches!(d.log(1, s).last(), Some(Event::Closed(_)))))
    );
    for &s in &d.accepted[1].clone() {
        d.ep[1].association(s).unwrap().close();
    }
    d.drive_to_end();
    for &h in &hs {
        assert_eq!(d.log(0, h).last(), Some(&Event::Closed(CloseReason::Local)));
    }
    for side in 0..2 {
        assert!(
            d.ep[side].is_empty(),
            "side {side} still holds associations"
        );
        assert_eq!(d.ep[side].stats().removed, 3);
    }
}

#[test]
fn endpoint_bounds_accepted_not_initiated() {
    let cfg = test_config();
    let mut d = lossless();
    d.ep[1] = Endpoint::new(EndpointConfig {
        service: SERVICE,
        max_associations: 1,
        max_half_open: 1,
        seed: 5,
        association: cfg,
        ..EndpointConfig::default()
    });
    // Side 1 initiates two of its own: they do not count against its bound.
    let mine: Vec<Handle> = (0..2).map(|_| d.connect(1)).collect();
    let theirs: Vec<Handle> = (0..2).map(|_| d.connect(0)).collect();
    d.drive_until(Duration::from_secs(30), |d| {
        mine.iter().all(|&h| d.connected(1, h)) && d.accepted[1].len() == 1
    });
    assert!(mine.iter().all(|&h| d.connected(1, h)));
    assert_eq!(d.accepted[1].len(), 1, "one accepted at most");
    assert!(d.ep[1].stats().first_rejected_full + d.ep[1].stats().first_rejected_half_open > 0);
    assert_eq!(theirs.iter().filter(|&&h| d.connected(0, h)).count(), 1);
}

/// Everything sent on every association, both ways, arrives once and in
/// order over a network that loses, duplicates and reorders.
fn check_many(seed: u64, loss: f64, dup: f64, jitter_ms: u64, per: usize) {
    let mut d = Duo::new(
        seed,
        Net {
            loss,
            dup,
            jitter: Duration::from_millis(jitter_ms),
            ..Net::default()
        },
    );
    let out: Vec<(usize, Handle)> = (0..3)
        .map(|i| {
            let side = i % 2;
            (side, d.connect(side))
        })
        .collect();
    let mut rng = Rng::new(seed);
    let mut sent: Vec<Vec<Bytes>> = vec![Vec::new(); out.len()];
    for (k, &(side, h)) in out.iter().enumerate() {
        for j in 0..per {
            let m = msg(1000 * k + j, 1 + rng.below(2500) as usize);
            d.ep[side].association(h).unwrap().send(m.clone()).unwrap();
            sent[k].push(m);
        }
        d.ep[side].association(h).unwrap().close();
    }
    let ok = d.drive_until(Duration::from_secs(300), |d| {
        (0..2).all(|side| {
            d.accepted[side].len() == out.iter().filter(|(s, _)| *s != side).count()
                && d.accepted[side]
                    .iter()
                    .all(|&s| matches!(d.log(side, s).last(), Some(Event::Closed(_))))
        })
    });
    assert!(ok, "seed {seed}: not every stream closed");
    for (side, accepted) in d.accepted.clone().iter().enumerate() {
        for &s in accepted {
            let got = d.messages(side, s);
            let k = (got[0][0..8].try_into().map(u64::from_le_bytes).unwrap() / 1000) as usize;
            assert_eq!(got, sent[k], "seed {seed}: association {k}");
            let _ = d.ep[side].association(s).map(|a| a.close());
        }
    }
    d.drive_to_end();
    for (side, h) in out {
        assert_eq!(
            d.log(side, h).last(),
            Some(&Event::Closed(CloseReason::Local)),
            "seed {seed}"
        );
    }
    assert!(d.ep[0].is_empty() && d.ep[1].is_empty(), "seed {seed}");
}

#[test]
fn endpoints_deliver_every_stream_over_a_hostile_network() {
    for seed in 0..8 {
        check_many(seed, 0.05, 0.05, 4, 30);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn endpoints_deliver_exactly_once_in_order(
        seed in any::<u64>(),
        loss in 0.0f64..0.15,
        dup in 0.0f64..0.1,
        jitter in 0u64..10,
        per in 1usize..40,
    ) {
        check_many(seed, loss, dup, jitter, per);
    }
}

/// Runs streams both ways over a lossy, duplicating, reordering network
/// that also garbles copies of datagrams, delivering what is due together
/// one datagram at a time or as runs through
/// [`Endpoint::handle_datagrams`]; returns everything the endpoints
/// reported and counted.
fn run_streams(seed: u64, batched: bool) -> String {
    let mut d = Duo::new(
        seed,
        Net {
            loss: 0.03,
            dup: 0.03,
            // Without jitter, what is sent together arrives together.
            jitter: Duration::from_millis(seed % 2 * 2),
            ..Net::default()
        },
    );
    d.batched = batched;
    d.garble = 0.02;
    let out: Vec<(usize, Handle)> = (0..4).map(|i| (i % 2, d.connect(i % 2))).collect();
    let mut rng = Rng::new(seed);
    for (k, &(side, h)) in out.iter().enumerate() {
        for j in 0..30 {
            let m = msg(1000 * k + j, 1 + rng.below(2500) as usize);
            d.ep[side].association(h).unwrap().send(m).unwrap();
        }
        d.ep[side].association(h).unwrap().close();
    }
    d.drive_until(Duration::from_secs(120), |_| false);
    // Without jitter, a window's worth arrives at once.
    assert!(
        !batched || seed % 2 == 1 || d.longest_run > 8,
        "seed {seed}: no runs"
    );
    let mut report = format!("{:?}\n{:?}\n", d.ep[0].stats(), d.ep[1].stats());
    for side in 0..2 {
        for (h, log) in &d.events[side] {
            let stats = d.ep[side].get(*h).map(|a| a.stats());
            report += &format!("{side} {h:?} {log:?} {stats:?}\n");
        }
    }
    report
}

/// Handing the endpoint the datagrams that arrive together as one run
/// changes nothing: the same events, the same counters, on either side,
/// with runs that mix associations, set-ups, duplicates and garbled
/// datagrams.
#[test]
fn endpoint_takes_a_run_of_datagrams_as_it_takes_each() {
    for seed in 0..6 {
        let one = run_streams(seed, false);
        let run = run_streams(seed, true);
        assert!(one.contains("Message"), "seed {seed}: nothing delivered");
        assert_eq!(one, run, "seed {seed}");
    }
}
