//! An association after a valid handshake, fed arbitrary datagrams:
//! `Endpoint::handle_datagram` and `Association::handle_datagram` never
//! panic, never hold more than the window, and the session goes on (real
//! packets between the two ends are exchanged after every input, timers
//! run as simulated time advances).
//!
//! Input: a list of operations, each `op: u8, len: u8, bytes[len]`. `op`
//! bit 0 picks the receiver (client association or the listening
//! endpoint), bit 1 sends
//! from a stranger's address instead of the peer's, bit 2 patches the
//! skiff header and the receiver's current key into the bytes (so the
//! fuzzer reaches past the key check), bits 3-5 advance time by that many
//! times 7 ms first, bit 6 makes the client send a small message and bit 7
//! a bundle of two (both ends offer bundles), and with a `len` above 127
//! also a message of several packets. Both ends deliver messages larger
//! than a packet in pieces (`deliver_pieces`), whose lengths must add up.
#![no_main]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use skiff_proto::association::bundle;
use skiff_proto::association::frame::{KIND, RTN};
use skiff_proto::association::{
    Association, AssociationConfig, Endpoint, EndpointConfig, EndpointEvent, Event, Handle,
};
use skiff_proto::wire::{MAGIC, VERSION};

struct Session {
    now: Instant,
    client: Association,
    listener: Endpoint,
    server: Option<Handle>,
    client_addr: SocketAddr,
    server_addr: SocketAddr,
    window: u64,
    buf: Vec<u8>,
}

impl Session {
    fn new() -> Session {
        let now = Instant::now();
        let config = AssociationConfig {
            mtu: 600,
            recv_window: 8,
            send_window: 8,
            recv_buffer: 8 << 10,
            send_buffer: 8 << 10,
            max_message: 64 << 10,
            ack_delay: Duration::from_millis(2),
            initial_rto: Duration::from_millis(50),
            min_rto: Duration::from_millis(20),
            keepalive: Duration::from_millis(500),
            idle_timeout: Duration::from_secs(2),
            handshake_timeout: Duration::from_secs(1),
            // Both ends offer bundles, so forged chunks flagged BUNDLE reach
            // the bundle check instead of failing as not offered.
            bundles: true,
            deliver_pieces: true,
            ..AssociationConfig::default()
        };
        let server_addr: SocketAddr = "10.0.0.2:4747".parse().unwrap();
        let client = Association::connect(now, config.clone(), server_addr, 7, 0x1234_5678_9abc);
        let listener = Endpoint::new(EndpointConfig {
            service: 7,
            max_associations: 4,
            max_half_open: 2,
            seed: 0x5eed,
            association: config,
            ..EndpointConfig::default()
        });
        let mut s = Session {
            now,
            client,
            listener,
            server: None,
            client_addr: "10.0.0.1:4000".parse().unwrap(),
            server_addr,
            window: 8,
            buf: Vec::new(),
        };
        for _ in 0..4 {
            s.exchange();
        }
        assert!(s.server.is_some(), "the handshake completes");
        s
    }

    /// Lets both ends transmit to each other until quiet, reading events.
    fn exchange(&mut self) {
        for _ in 0..64 {
            let mut any = false;
            while let Some(t) = self.client.poll_transmit(self.now, &mut self.buf) {
                assert_eq!(t.size, self.buf.len());
                let b = Bytes::copy_from_slice(&self.buf);
                self.listener.handle_datagram(self.now, self.client_addr, b);
                any = true;
            }
            while let Some(t) = self.listener.poll_transmit(self.now, &mut self.buf) {
                let b = Bytes::copy_from_slice(&self.buf);
                if t.destination == self.client_addr {
                    self.client.handle_datagram(self.now, self.server_addr, b);
                }
                any = true;
            }
            while let Some(ev) = self.listener.poll_event() {
                if let EndpointEvent::Accepted(h) = ev {
                    self.server.get_or_insert(h);
                    any = true;
                }
            }
            while let Some(e) = self.client.poll_event() {
                check_pieces(&e);
                any |= !matches!(e, Event::Closed(_) | Event::Failed(_));
            }
            if let Some(a) = self.server.and_then(|h| self.listener.association(h)) {
                while let Some(e) = a.poll_event() {
                    check_pieces(&e);
                    any = true;
                }
            }
            if !any {
                break;
            }
        }
        self.check();
    }

    fn check(&self) {
        let server = self.server.and_then(|h| self.listener.get(h));
        for a in [Some(&self.client), server].into_iter().flatten() {
            let (rseq, alloc) = a.recv_window();
            assert!(alloc >= rseq);
            assert!(alloc - rseq <= self.window, "window grew");
            assert!(a.held() as u64 <= alloc - rseq, "held beyond the window");
            assert!(a.in_flight() as u64 <= self.window);
        }
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        self.client.handle_timeout(self.now);
        self.listener.handle_timeout(self.now);
    }
}

/// A message in pieces is at most `max_message` and its pieces add up.
fn check_pieces(e: &Event) {
    if let Event::Pieces(p) = e {
        assert!(p.len() <= 64 << 10);
        assert_eq!(p.parts().iter().map(|b| b.len()).sum::<usize>(), p.len());
    }
}

fuzz_target!(|data: &[u8]| {
    let mut s = Session::new();
    let stranger: SocketAddr = "10.9.9.9:4000".parse().unwrap();
    let mut rest = data;
    let mut sent = 0u64;
    while rest.len() >= 2 {
        let (op, len) = (rest[0], usize::from(rest[1]));
        rest = &rest[2..];
        let mut bytes = rest[..len.min(rest.len())].to_vec();
        rest = &rest[bytes.len()..];
        s.advance(Duration::from_millis(7 * u64::from((op >> 3) & 7)));
        if op & 0x40 != 0 {
            let _ = s.client.send(Bytes::from(sent.to_le_bytes().to_vec()));
            sent += 1;
        }
        if op & 0x80 != 0 {
            // A bundle of two small messages (refused before set-up).
            let mut b = Vec::new();
            bundle::put(&mut b, &sent.to_le_bytes());
            bundle::put(&mut b, &[]);
            let _ = s.client.send_bundle(Bytes::from(b), 2);
            if len > 127 {
                let _ = s
                    .client
                    .send(Bytes::from(vec![sent as u8; 2_000 + len * 7]));
            }
            sent += 1;
        }
        let to_client = op & 1 == 0;
        if op & 4 != 0 && bytes.len() >= 13 {
            let key = if to_client {
                s.client.local_key()
            } else {
                s.server
                    .and_then(|h| s.listener.get(h))
                    .map_or(0, |a| a.local_key())
            };
            bytes[0..2].copy_from_slice(&MAGIC);
            bytes[2] = VERSION;
            bytes[3] = KIND;
            bytes[5..13].copy_from_slice(&(key | RTN).to_le_bytes());
        }
        let b = Bytes::from(bytes);
        match (to_client, op & 2 != 0) {
            (true, false) => s.client.handle_datagram(s.now, s.server_addr, b),
            (true, true) => s.client.handle_datagram(s.now, stranger, b),
            (false, false) => s.listener.handle_datagram(s.now, s.client_addr, b),
            (false, true) => s.listener.handle_datagram(s.now, stranger, b),
        }
        s.check();
        s.exchange();
    }
    // Time runs on: every timer fires, and the session ends one way or
    // another without a panic.
    for _ in 0..40 {
        s.advance(Duration::from_millis(100));
        s.exchange();
    }
});
