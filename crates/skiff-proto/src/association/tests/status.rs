//! Which data packets carry a status, and that a status is the status as
//! it stands when its packet is written: also when the packets of a
//! burst copy the section encoded for the first, or leave an unchanged
//! status out (see `Association::status_due` and `put_status`).

use std::time::Duration;

use bytes::Bytes;

use super::harness::{msg, test_config, Dir, Net, Pair};
use crate::association::frame::{Packet, Status};
use crate::association::AssociationConfig;

/// Whether `st` says what `fresh` says: the same numbers, and selective
/// ranges that are the first of `fresh`'s (a data packet's status may
/// leave the highest out for lack of room).
fn says(st: &Status, fresh: &Status) -> bool {
    st.rseq == fresh.rseq
        && st.alloc == fresh.alloc
        && st.ack_delay_us == fresh.ack_delay_us
        && fresh.sack.ranges().starts_with(st.sack.ranges())
}

/// The client's packets, each checked when it is sent: a status it
/// carries is the status as it stands, and one it leaves out would have
/// said nothing new.
#[derive(Default)]
struct Checked {
    last: Option<Status>,
    with: usize,
    without: usize,
    sizes: Vec<usize>,
}

impl Checked {
    fn next(&mut self, p: &mut Pair, buf: &mut Vec<u8>) -> Option<Packet> {
        let t = p.client.poll_transmit(p.now, buf)?;
        let q = Packet::decode(&Bytes::copy_from_slice(&buf[..t.size])).unwrap();
        let fresh = p.client.recv.status(p.now);
        match q.status {
            Some(st) => {
                assert!(
                    says(&st, &fresh),
                    "a stale status went out: {st:?}, not {fresh:?}"
                );
                self.last = Some(st);
                self.with += 1;
            }
            None => {
                let last = self.last.expect("the first packet carries a status");
                let same = last.rseq == fresh.rseq
                    && last.alloc == fresh.alloc
                    && fresh.sack.ranges().starts_with(last.sack.ranges());
                assert!(
                    same,
                    "a status with news was left out: {last:?}, now {fresh:?}"
                );
                self.without += 1;
            }
        }
        self.sizes.push(t.size);
        Some(q)
    }
}

#[test]
fn the_packets_of_a_burst_carry_the_status_as_it_stands() {
    let mut p = Pair::new(1, Net::default());
    p.connect();
    p.srv().send(msg(9, 900)).unwrap();
    p.srv().send(msg(10, 900)).unwrap();
    let mut buf = Vec::new();
    let mut from_server = Vec::new();
    while let Some(t) = p.server.poll_transmit(p.now, &mut buf) {
        assert_eq!(t.destination, p.client_addr);
        from_server.push(buf.clone());
    }
    assert!(from_server.len() >= 2, "the server sends each message");
    p.client.send(msg(1, 25_000)).unwrap();
    let mut c = Checked::default();
    for round in 0..6 {
        for _ in 0..3 {
            c.next(&mut p, &mut buf);
        }
        // At the same instant, between two packets of the burst: the
        // server's packets arrive (the last one before the first: a gap,
        // then its repair), and the client reads (its window moves).
        let rseq = p.client.recv_window().0;
        match round {
            1 => {
                let last = from_server.pop().unwrap();
                p.client.handle_datagram(p.now, p.server_addr, last.into());
                assert_eq!(p.client.held(), 1);
            }
            2 => {
                let first = from_server.pop().unwrap();
                p.client.handle_datagram(p.now, p.server_addr, first.into());
                assert_eq!(p.client.recv_window().0, rseq + 2);
            }
            3 => {
                while let Some(e) = p.client.poll_event() {
                    p.client_events.push(e);
                }
            }
            _ => {}
        }
    }
    assert!(c.sizes.len() >= 15, "{} packets sent", c.sizes.len());
    assert!(
        c.without > 0 && c.with > 0,
        "{} with, {} without",
        c.with,
        c.without
    );
    // Full packets are of one size with a status or without (a GSO run
    // is cut where the size changes).
    let full = &c.sizes[..c.sizes.len() - 1];
    assert!(full.iter().all(|&n| n == full[0]), "{:?}", c.sizes);
    assert_eq!(
        Pair::messages(&p.client_events),
        vec![msg(9, 900), msg(10, 900)]
    );
    p.drive();
    assert_eq!(Pair::messages(&p.server_events), vec![msg(1, 25_000)]);
}

#[test]
fn a_status_names_what_arrived_before_its_packet_went() {
    // Both ends stream at once: every status the client sends names
    // every packet the client had received by then, and a packet without
    // one goes only when the last one sent did.
    let mut p = Pair::new(2, Net::default());
    p.connect();
    // 50 packets' worth each way (more than the window of 32).
    for i in 0..12 {
        p.client.send(msg(i, 5000)).unwrap();
    }
    for i in 0..60 {
        p.srv().send(msg(i, 900)).unwrap();
    }
    let mut checked = 0;
    let mut last_rseq = None;
    for _ in 0..100_000 {
        // Nothing arrives while the pair transmits (`step` delivers after).
        let rseq = p.client.recv_window().0;
        let from = p.log.len();
        if !p.step() {
            break;
        }
        for w in p.log[from..].iter().filter(|w| w.dir == Dir::ToServer) {
            match &w.packet.status {
                Some(st) => {
                    assert_eq!(st.rseq, rseq, "a status lags what arrived");
                    last_rseq = Some(st.rseq);
                }
                None => assert_eq!(last_rseq, Some(rseq), "a status with news was left out"),
            }
            checked += 1;
        }
        if Pair::messages(&p.client_events).len() == 60
            && Pair::messages(&p.server_events).len() == 12
        {
            break;
        }
    }
    let want: Vec<_> = (0..60).map(|i| msg(i, 900)).collect();
    assert_eq!(Pair::messages(&p.client_events), want);
    let want: Vec<_> = (0..12).map(|i| msg(i, 5000)).collect();
    assert_eq!(Pair::messages(&p.server_events), want);
    assert!(checked >= 50, "{checked}");
}

#[test]
fn a_window_opened_by_reading_goes_out_with_the_next_packet() {
    // The client does not read: the server's messages fill its receive
    // buffer and its window stays where it was. Once it reads, the next
    // packet it sends (data of its own stream or a status alone) carries
    // the wider window.
    let config = AssociationConfig {
        recv_buffer: 16 << 10,
        ..test_config()
    };
    let mut p = Pair::with_config(3, Net::default(), config);
    p.connect();
    p.client_reads = false;
    for i in 0..40 {
        p.srv().send(msg(i, 1000)).unwrap();
    }
    // Until the server's window is shut and nothing moves.
    p.drive_until(Duration::from_millis(500), |_| false);
    assert!(p.client.unread() > 16 << 10);
    let (_, alloc) = p.client.recv_window();
    // A packet of the client's own stream goes first, at this instant.
    p.client.send(msg(7, 40_000)).unwrap();
    let mut buf = Vec::new();
    let mut c = Checked::default();
    c.next(&mut p, &mut buf).expect("the client sends");
    while let Some(e) = p.client.poll_event() {
        p.client_events.push(e);
    }
    p.client_reads = true;
    let q = c.next(&mut p, &mut buf).expect("the client sends");
    let st = q.status.expect("the wider window goes out");
    assert!(st.alloc > alloc, "{} not above {alloc}", st.alloc);
    p.drive();
    assert_eq!(Pair::messages(&p.server_events), vec![msg(7, 40_000)]);
    assert_eq!(Pair::messages(&p.client_events).len(), 40);
}

#[test]
fn a_burst_with_more_runs_held_than_a_status_names_carries_fresh_statuses() {
    // The client holds more runs above a gap than a status names (16);
    // one more arrives above them between two packets of its burst: the
    // next status's ack delay refers to it, so the section of the one
    // before is not copied.
    let config = AssociationConfig {
        recv_window: 64,
        send_window: 64,
        recv_buffer: 256 << 10,
        send_buffer: 256 << 10,
        ..test_config()
    };
    let mut p = Pair::with_config(5, Net::default(), config);
    p.connect();
    for i in 0..44 {
        p.srv().send(msg(i, 1100)).unwrap();
    }
    let mut buf = Vec::new();
    let mut from_server = Vec::new();
    while let Some(t) = p.server.poll_transmit(p.now, &mut buf) {
        assert_eq!(t.destination, p.client_addr);
        from_server.push(buf.clone());
    }
    assert!(from_server.len() >= 42, "{}", from_server.len());
    // Every other packet: runs of one, 19 of them, above the first gap.
    for d in from_server.iter().skip(1).step_by(2).take(19) {
        p.client
            .handle_datagram(p.now, p.server_addr, d.clone().into());
    }
    assert_eq!(p.client.held(), 19);
    // With nothing of its own to send, the client acknowledges them with a
    // status alone, which names as many ranges as a status can.
    let t = p.client.poll_transmit(p.now, &mut buf).expect("an ack");
    let ack = Packet::decode(&Bytes::copy_from_slice(&buf[..t.size])).unwrap();
    assert!(ack.data.is_none());
    assert_eq!(ack.status.expect("a status").sack.ranges().len(), 16);
    p.now += Duration::from_millis(1);
    p.client.send(msg(1, 20_000)).unwrap();
    let mut c = Checked::default();
    for _ in 0..3 {
        c.next(&mut p, &mut buf).expect("the client sends");
    }
    let above = from_server[41].clone();
    p.client.handle_datagram(p.now, p.server_addr, above.into());
    assert_eq!(p.client.held(), 20);
    let q = c.next(&mut p, &mut buf).expect("the client sends");
    assert!(q.status.is_some(), "news go with the next packet");
    for _ in 0..3 {
        c.next(&mut p, &mut buf).expect("the client sends");
    }
}
