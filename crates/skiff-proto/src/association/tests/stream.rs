//! Stream writes ([`Association::write`]): many tiny writes gathered into
//! few messages arrive as the identical byte stream, interleaved with large
//! writes and whole messages, over a lossy, duplicating, reordering
//! network; a gathered message fits its packet (never reassembled); a
//! reader that stops holds the writer by the send buffer and the window.

use std::time::Duration;

use bytes::Bytes;

use super::harness::{test_config, Net, Pair};
use crate::association::{Event, SendError, State};

/// The receiver's byte stream: every message's bytes, in order.
fn stream_of(events: &[Event]) -> Vec<u8> {
    let mut v = Vec::new();
    for e in events {
        if let Event::Message(m) = e {
            v.extend_from_slice(m);
        }
    }
    v
}

/// Writes all of `data` from the client, driving the pair while the send
/// buffer is full.
fn write_all(p: &mut Pair, mut data: &[u8]) {
    while !data.is_empty() {
        match p.client.write(data) {
            Ok(n) => data = &data[n..],
            Err(SendError::WouldBlock) => {
                assert!(p.step(), "blocked writer with nothing scheduled");
            }
            Err(e) => panic!("write failed: {e:?}"),
        }
    }
}

/// Pattern bytes: position `i` of the stream holds a byte derived from it.
fn pattern(from: usize, len: usize) -> Vec<u8> {
    (from..from + len)
        .map(|i| (i as u64).wrapping_mul(0x9E37_79B9) as u8 ^ (i >> 11) as u8)
        .collect()
}

fn run(seed: u64, net: Net) -> (Vec<u8>, Vec<u8>, u64, u64) {
    let mut p = Pair::new(seed, net);
    p.connect();
    let mut expect = Vec::new();
    let mut writes = 0u64;
    for round in 0..60 {
        // A burst of tiny writes between two turns of the driver: gathered.
        let burst = 50 + (p.rng.below(200) as usize);
        for _ in 0..burst {
            let len = 1 + p.rng.below(64) as usize;
            let d = pattern(expect.len(), len);
            write_all(&mut p, &d);
            expect.extend_from_slice(&d);
            writes += 1;
        }
        match round % 3 {
            // A large write: gathered too, cut at packet boundaries.
            0 => {
                let d = pattern(expect.len(), 5_000 + p.rng.below(20_000) as usize);
                write_all(&mut p, &d);
                expect.extend_from_slice(&d);
                writes += 1;
            }
            // A whole message after the gathered bytes: order kept.
            1 => {
                let d = pattern(expect.len(), 3_000 + p.rng.below(9_000) as usize);
                loop {
                    match p.client.send(Bytes::from(d.clone())) {
                        Ok(()) => break,
                        Err(SendError::WouldBlock) => assert!(p.step()),
                        Err(e) => panic!("send failed: {e:?}"),
                    }
                }
                expect.extend_from_slice(&d);
            }
            _ => {}
        }
        for _ in 0..(p.rng.below(6)) {
            p.step();
        }
    }
    p.client.close();
    p.srv().close();
    p.drive();
    assert!(p.both_done(), "both ends closed");
    assert_eq!(p.client.state(), State::Drained);
    let delivered = p
        .server_events
        .iter()
        .filter(|e| matches!(e, Event::Message(_)))
        .count() as u64;
    let got = stream_of(&p.server_events);
    (expect, got, writes, delivered)
}

#[test]
fn tiny_writes_arrive_as_the_same_byte_stream() {
    let (expect, got, writes, delivered) = run(1, Net::default());
    assert_eq!(got.len(), expect.len());
    assert!(got == expect, "byte stream differs");
    // Gathered: far fewer messages than writes.
    assert!(
        delivered * 5 < writes,
        "{writes} writes became {delivered} messages"
    );
}

#[test]
fn tiny_writes_survive_loss_duplication_and_reordering() {
    for seed in 0..12 {
        let net = Net {
            loss: 0.05,
            dup: 0.02,
            jitter: Duration::from_millis(3),
            ..Net::default()
        };
        let (expect, got, _, _) = run(100 + seed, net);
        assert_eq!(got.len(), expect.len(), "seed {seed}");
        assert!(got == expect, "seed {seed}: byte stream differs");
    }
}

#[test]
fn a_gathered_message_fits_its_packet() {
    let mut p = Pair::new(7, Net::default());
    p.connect();
    // Many packets' worth written before the driver's next turn.
    let d = pattern(0, 40_000);
    for c in d.chunks(10) {
        assert_eq!(p.client.write(c), Ok(c.len()));
    }
    assert_eq!(p.client.unsent(), 40_000);
    p.drive();
    let payload = p.client.packet_payload();
    let msgs: Vec<usize> = p
        .server_events
        .iter()
        .filter_map(|e| match e {
            Event::Message(m) => Some(m.len()),
            _ => None,
        })
        .collect();
    assert_eq!(stream_of(&p.server_events), d);
    assert!(
        msgs.iter().all(|&n| n <= payload),
        "{msgs:?} over {payload}"
    );
    // Packets are filled: about one message per packet.
    assert!(msgs.len() <= 40_000 / (payload - 16) + 2, "{msgs:?}");
    assert_eq!(p.client.unsent(), 0);
}

#[test]
fn a_stalled_reader_holds_the_writer() {
    let config = test_config();
    let mut p = Pair::with_config(3, Net::default(), config.clone());
    p.connect();
    p.server_reads = false;
    let mut accepted = 0usize;
    let mut blocked = 0;
    // Tiny writes with the driver turning: until the writer is refused for
    // a long stretch of simulated time.
    while blocked < 200 {
        match p.client.write(&[0x5A; 40]) {
            Ok(n) => {
                accepted += n;
                blocked = 0;
            }
            Err(SendError::WouldBlock) => {
                blocked += 1;
                let t = p.now + Duration::from_millis(50);
                p.drive_until(Duration::from_millis(50), |q| q.now >= t);
            }
            Err(e) => panic!("write failed: {e:?}"),
        }
        assert!(accepted < 10 << 20, "the writer was never held");
    }
    // Held: the client's send buffer, plus what the server took into its
    // window and left unread (its receive buffer and one window of
    // packets).
    let bound = config.send_buffer + config.recv_buffer + config.recv_window as usize * config.mtu;
    assert!(
        accepted <= bound,
        "{accepted} bytes accepted, bound {bound}"
    );
    assert!(p.client.buffered() <= config.send_buffer);
    assert!(p.srv().unread() <= config.recv_buffer + config.recv_window as usize * config.mtu);
    // The reader resumes: everything arrives, in order and complete.
    p.server_reads = true;
    p.client.close();
    p.drive_until(Duration::from_secs(60), |q| {
        stream_of(&q.server_events).len() == accepted
    });
    assert_eq!(stream_of(&p.server_events), vec![0x5A; accepted]);
}

#[test]
fn write_after_close_is_refused() {
    let mut p = Pair::new(9, Net::default());
    p.connect();
    assert_eq!(p.client.write(b"abc"), Ok(3));
    p.client.close();
    assert_eq!(p.client.write(b"d"), Err(SendError::Closed));
    p.srv().close();
    p.drive();
    assert_eq!(stream_of(&p.server_events), b"abc");
}

#[test]
fn tiny_packets_carry_gathered_bytes() {
    let config = crate::association::AssociationConfig {
        mtu: crate::association::frame::MIN_MTU,
        ..test_config()
    };
    let mut p = Pair::with_config(11, Net::default(), config);
    p.connect();
    let d = pattern(0, 5_000);
    for c in d.chunks(7) {
        write_all(&mut p, c);
    }
    p.client.close();
    p.srv().close();
    p.drive();
    assert_eq!(stream_of(&p.server_events), d);
}
