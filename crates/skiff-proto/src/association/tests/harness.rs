//! A client association and a listener joined by a simulated network, after
//! quinn's `Pair`: time is simulated and jumps to the next deadline, the
//! network delays, loses, duplicates and reorders packets from a seeded
//! generator, and every run is reproducible from its seed.
//!
//! Invariants are checked on every packet: a data packet's sequence number
//! is below the receiver's advertised `alloc`, and neither end holds more
//! than its window.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::association::frame::Packet;
use crate::association::{
    Association, AssociationConfig, Endpoint, EndpointConfig, EndpointEvent, Event, Handle, State,
};

/// xorshift64*: small, seeded, good enough for fault injection.
#[derive(Debug, Clone)]
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15 | 1)
    }

    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// True with probability `p`.
    pub(super) fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// Which way a packet travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Dir {
    ToServer,
    ToClient,
}

/// A packet as the network saw it, for drop filters and the log.
#[derive(Debug, Clone)]
pub(super) struct Wire {
    /// Order of sending, from 0.
    pub(super) index: usize,
    pub(super) dir: Dir,
    pub(super) at: Instant,
    pub(super) bytes: Bytes,
    pub(super) packet: Packet,
}

/// The simulated network.
#[derive(Debug, Clone)]
pub(super) struct Net {
    pub(super) latency: Duration,
    /// Extra random delay in [0, jitter]: reorders packets.
    pub(super) jitter: Duration,
    pub(super) mtu: usize,
    pub(super) loss: f64,
    pub(super) dup: f64,
}

impl Default for Net {
    fn default() -> Self {
        Net {
            latency: Duration::from_millis(5),
            jitter: Duration::ZERO,
            mtu: 1200,
            loss: 0.0,
            dup: 0.0,
        }
    }
}

pub(super) type Filter = Box<dyn FnMut(&Wire) -> bool>;

/// A packet on the way: arrival time, order of sending, direction, bytes.
type InFlight = Reverse<(Instant, u64, Dir, Vec<u8>)>;

/// Two endpoints and a network.
pub(super) struct Pair {
    pub(super) now: Instant,
    pub(super) start: Instant,
    pub(super) client: Association,
    pub(super) server: Endpoint,
    pub(super) server_h: Option<Handle>,
    pub(super) client_addr: SocketAddr,
    pub(super) server_addr: SocketAddr,
    pub(super) net: Net,
    pub(super) rng: Rng,
    queue: BinaryHeap<InFlight>,
    order: u64,
    /// Return true to drop a packet.
    pub(super) filter: Option<Filter>,
    pub(super) log: Vec<Wire>,
    pub(super) client_events: Vec<Event>,
    pub(super) server_events: Vec<Event>,
    /// Whether the harness reads events (and so frees receive buffers).
    pub(super) client_reads: bool,
    pub(super) server_reads: bool,
    pub(super) dropped: usize,
    pub(super) too_big: usize,
    /// Probability that a delivered packet has a byte changed or is cut.
    pub(super) mutate: f64,
}

pub(super) fn test_config() -> AssociationConfig {
    AssociationConfig {
        mtu: 1200,
        recv_window: 32,
        send_window: 32,
        recv_buffer: 64 << 10,
        send_buffer: 64 << 10,
        initial_rto: Duration::from_millis(200),
        min_rto: Duration::from_millis(50),
        max_rto: Duration::from_secs(5),
        ack_delay: Duration::from_millis(2),
        keepalive: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(10),
        handshake_timeout: Duration::from_secs(8),
        ..AssociationConfig::default()
    }
}

impl Pair {
    pub(super) fn new(seed: u64, net: Net) -> Pair {
        Pair::with_config(seed, net, test_config())
    }

    pub(super) fn with_config(seed: u64, net: Net, config: AssociationConfig) -> Pair {
        let now = Instant::now();
        let client_addr: SocketAddr = "10.0.0.1:4000".parse().unwrap();
        let server_addr: SocketAddr = "10.0.0.2:4747".parse().unwrap();
        let mut rng = Rng::new(seed);
        let key = rng.next();
        let client = Association::connect(now, config.clone(), server_addr, 7, key);
        let server = Endpoint::new(EndpointConfig {
            service: 7,
            seed: rng.next(),
            association: config,
            ..EndpointConfig::default()
        });
        Pair {
            now,
            start: now,
            client,
            server,
            server_h: None,
            client_addr,
            server_addr,
            net,
            rng,
            queue: BinaryHeap::new(),
            order: 0,
            filter: None,
            log: Vec::new(),
            client_events: Vec::new(),
            server_events: Vec::new(),
            client_reads: true,
            server_reads: true,
            dropped: 0,
            too_big: 0,
            mutate: 0.0,
        }
    }

    /// The server's association, once set up.
    pub(super) fn srv(&mut self) -> &mut Association {
        let h = self.server_h.expect("server association accepted");
        self.server
            .association(h)
            .expect("server association exists")
    }

    /// Simulated time since the start.
    pub(super) fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    fn send_packet(&mut self, dir: Dir, bytes: Vec<u8>) {
        let index = self.log.len();
        let b = Bytes::from(bytes.clone());
        let packet = Packet::decode(&b).expect("endpoints send valid packets");
        self.check_window(dir, &packet);
        let w = Wire {
            index,
            dir,
            at: self.now,
            bytes: b,
            packet,
        };
        let drop = match &mut self.filter {
            Some(f) => f(&w),
            None => false,
        };
        self.log.push(w);
        if drop || self.rng.chance(self.net.loss) {
            self.dropped += 1;
            return;
        }
        if bytes.len() > self.net.mtu {
            self.too_big += 1;
            return;
        }
        let mut bytes = bytes;
        if self.rng.chance(self.mutate) {
            let i = self.rng.below(bytes.len() as u64) as usize;
            if self.rng.chance(0.5) {
                bytes[i] = self.rng.next() as u8;
            } else {
                bytes.truncate(i);
            }
        }
        let copies = if self.rng.chance(self.net.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let jitter = self.rng.below(self.net.jitter.as_micros() as u64 + 1);
            let at = self.now + self.net.latency + Duration::from_micros(jitter);
            self.order += 1;
            self.queue
                .push(Reverse((at, self.order, dir, bytes.clone())));
        }
    }

    fn check_window(&self, dir: Dir, p: &Packet) {
        let Some(d) = &p.data else {
            return;
        };
        let receiver = match dir {
            Dir::ToServer => self.server_h.and_then(|h| self.server.get(h)),
            Dir::ToClient => Some(&self.client),
        };
        if let Some(r) = receiver {
            let (_, alloc) = r.recv_window();
            assert!(
                d.seq < alloc,
                "{dir:?}: seq {} sent at or above alloc {alloc}",
                d.seq
            );
        }
    }

    fn check_bounds(&self) {
        for a in [
            Some(&self.client),
            self.server_h.and_then(|h| self.server.get(h)),
        ]
        .into_iter()
        .flatten()
        {
            let (rseq, alloc) = a.recv_window();
            assert!(alloc >= rseq);
            assert!(a.held() as u64 <= alloc - rseq, "held beyond the window");
        }
    }

    /// Lets both ends transmit and reads their events.
    pub(super) fn flush(&mut self) {
        let mut buf = Vec::new();
        loop {
            let mut any = false;
            // The client hands large payloads out by reference (the
            // scatter-gather form): the datagram is `buf` then `tail`.
            buf.clear();
            let mut tail = None;
            while let Some(t) = self
                .client
                .poll_transmit_split(self.now, &mut buf, &mut tail)
            {
                assert_eq!(t.destination, self.server_addr);
                if let Some(b) = tail.take() {
                    assert!(b.len() >= 512, "a small tail is copied");
                    buf.extend_from_slice(&b);
                }
                assert_eq!(t.size, buf.len());
                self.send_packet(Dir::ToServer, std::mem::take(&mut buf));
                any = true;
            }
            assert!(buf.is_empty(), "nothing appended without a transmit");
            // The server uses the appending form, behind bytes that must
            // stay as they are (a driver's other datagrams).
            const BEHIND: &[u8] = b"other datagrams";
            buf.clear();
            buf.extend_from_slice(BEHIND);
            while let Some(t) = self.server.poll_transmit_append(self.now, &mut buf) {
                assert_eq!(t.destination, self.client_addr);
                assert_eq!(&buf[..BEHIND.len()], BEHIND);
                assert_eq!(buf.len(), BEHIND.len() + t.size);
                self.send_packet(Dir::ToClient, buf[BEHIND.len()..].to_vec());
                buf.truncate(BEHIND.len());
                any = true;
            }
            assert_eq!(buf, BEHIND, "nothing appended without a transmit");
            if let Some(h) = accept(&mut self.server) {
                assert!(self.server_h.is_none(), "one client, one association");
                self.server_h = Some(h);
                any = true;
            }
            if self.client_reads {
                while let Some(e) = self.client.poll_event() {
                    self.client_events.push(e);
                    any = true;
                }
            }
            if self.server_reads {
                if let Some(h) = self.server_h {
                    if let Some(a) = self.server.association(h) {
                        while let Some(e) = a.poll_event() {
                            self.server_events.push(e);
                            any = true;
                        }
                    }
                }
            }
            if !any {
                break;
            }
        }
        self.check_bounds();
    }

    /// One step: transmit, deliver what is due, or jump to the next deadline.
    /// False when nothing at all is scheduled.
    pub(super) fn step(&mut self) -> bool {
        self.flush();
        let mut delivered = false;
        while let Some(Reverse((at, _, _, _))) = self.queue.peek() {
            if *at > self.now {
                break;
            }
            let Reverse((_, _, dir, bytes)) = self.queue.pop().unwrap();
            match dir {
                Dir::ToServer => {
                    self.server
                        .handle_datagram(self.now, self.client_addr, bytes.into())
                }
                Dir::ToClient => {
                    self.client
                        .handle_datagram(self.now, self.server_addr, bytes.into())
                }
            }
            delivered = true;
        }
        if delivered {
            return true;
        }
        let next = [
            self.queue.peek().map(|Reverse((t, ..))| *t),
            self.client.poll_timeout(),
            self.server.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(t) = next else {
            return false;
        };
        self.now = self.now.max(t);
        self.client.handle_timeout(self.now);
        self.server.handle_timeout(self.now);
        true
    }

    /// Steps until `done` holds or `limit` of simulated time passes; returns
    /// whether `done` held.
    pub(super) fn drive_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&mut Pair) -> bool,
    ) -> bool {
        let end = self.now + limit;
        let mut steps = 0u64;
        loop {
            self.flush();
            if done(self) {
                return true;
            }
            if self.now > end || !self.step() {
                self.flush();
                return done(self);
            }
            steps += 1;
            assert!(steps < 5_000_000, "simulation does not settle");
        }
    }

    /// Steps until nothing is in the network and neither end has data
    /// outstanding or a set-up or close in progress (keepalives aside).
    pub(super) fn drive(&mut self) {
        let quiet = |p: &mut Pair| {
            let busy = |a: &Association| {
                a.in_flight() > 0
                    || a.buffered() > 0
                    || matches!(
                        a.state(),
                        State::Connecting | State::HalfOpen | State::Closing | State::Closed
                    )
            };
            let server_busy = match p.server_h {
                Some(h) => p.server.get(h).is_some_and(busy),
                None => p.server.half_open() > 0,
            };
            p.queue.is_empty() && !busy(&p.client) && !server_busy
        };
        assert!(
            self.drive_until(Duration::from_secs(600), quiet),
            "did not settle within 600 s of simulated time"
        );
    }

    /// Sets up the association over the configured network.
    pub(super) fn connect(&mut self) {
        let ok = self.drive_until(Duration::from_secs(30), |p| {
            p.server_h.is_some() && p.client.state() == State::Established
        });
        assert!(ok, "set-up did not complete");
        assert_eq!(self.client_events.first(), Some(&Event::Connected));
    }

    /// Messages delivered to one side, in order.
    pub(super) fn messages(events: &[Event]) -> Vec<Bytes> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Message(m) => Some(m.clone()),
                Event::Pieces(p) => Some(p.clone().join()),
                _ => None,
            })
            .collect()
    }

    /// Injects raw bytes as if they came from `from` to the server.
    pub(super) fn inject_to_server(&mut self, from: SocketAddr, bytes: Vec<u8>) {
        self.server.handle_datagram(self.now, from, bytes.into());
    }

    /// Injects raw bytes as if they came from `from` to the client.
    pub(super) fn inject_to_client(&mut self, from: SocketAddr, bytes: Vec<u8>) {
        self.client.handle_datagram(self.now, from, bytes.into());
    }

    /// Whether both ends have finished and each reported a last event.
    pub(super) fn both_done(&mut self) -> bool {
        let last = |ev: &[Event]| matches!(ev.last(), Some(Event::Closed(_) | Event::Failed(_)));
        last(&self.client_events) && last(&self.server_events)
    }
}

/// A message that says which it is: its index, then a pattern.
pub(super) fn msg(i: usize, len: usize) -> Bytes {
    let mut v = vec![0u8; len.max(8)];
    v[..8].copy_from_slice(&(i as u64).to_le_bytes());
    for (j, b) in v.iter_mut().enumerate().skip(8) {
        *b = (i * 31 + j * 7) as u8;
    }
    v.truncate(len.max(8));
    v.into()
}

/// The next association `e` accepted, skipping activity reports.
pub(super) fn accept(e: &mut Endpoint) -> Option<Handle> {
    while let Some(ev) = e.poll_event() {
        if let EndpointEvent::Accepted(h) = ev {
            return Some(h);
        }
    }
    None
}
