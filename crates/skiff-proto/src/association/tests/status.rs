//! Every packet carries the status as it stands when the packet is
//! written, also when the packets of a burst copy the section encoded for
//! the first (see `Association::put_status`).

use std::time::Duration;

use bytes::Bytes;

use super::harness::{msg, test_config, Dir, Net, Pair};
use crate::association::frame::Packet;
use crate::association::AssociationConfig;

/// Sends the client's next packet at the pair's instant and checks its
/// status against a fresh build.
fn next_checked(p: &mut Pair, buf: &mut Vec<u8>) -> Option<Packet> {
    let t = p.client.poll_transmit(p.now, buf)?;
    let q = Packet::decode(&Bytes::copy_from_slice(&buf[..t.size])).unwrap();
    let st = q.status.expect("every packet carries a status");
    assert_eq!(st, p.client.recv.status(p.now), "a stale status went out");
    Some(q)
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
    let mut sent = 0;
    for round in 0..6 {
        for _ in 0..3 {
            if next_checked(&mut p, &mut buf).is_some() {
                sent += 1;
            }
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
    assert!(sent >= 15, "{sent} packets sent");
    assert_eq!(
        Pair::messages(&p.client_events),
        vec![msg(9, 900), msg(10, 900)]
    );
    p.drive();
    assert_eq!(Pair::messages(&p.server_events), vec![msg(1, 25_000)]);
}

#[test]
fn a_status_names_what_arrived_before_its_packet_went() {
    // Both ends stream at once: every packet the client sends names,
    // in its status, every packet the client had received by then.
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
    for _ in 0..100_000 {
        // Nothing arrives while the pair transmits (`step` delivers after).
        let rseq = p.client.recv_window().0;
        let from = p.log.len();
        if !p.step() {
            break;
        }
        for w in p.log[from..].iter().filter(|w| w.dir == Dir::ToServer) {
            let st = w.packet.status.expect("every packet carries a status");
            assert_eq!(st.rseq, rseq, "a status lags what arrived");
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
    next_checked(&mut p, &mut buf).expect("the client sends");
    while let Some(e) = p.client.poll_event() {
        p.client_events.push(e);
    }
    p.client_reads = true;
    let q = next_checked(&mut p, &mut buf).expect("the client sends");
    let st = q.status.unwrap();
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
    p.now += Duration::from_millis(1);
    p.client.send(msg(1, 20_000)).unwrap();
    for _ in 0..3 {
        next_checked(&mut p, &mut buf).expect("the client sends");
    }
    let above = from_server[41].clone();
    p.client.handle_datagram(p.now, p.server_addr, above.into());
    assert_eq!(p.client.held(), 20);
    for _ in 0..3 {
        next_checked(&mut p, &mut buf).expect("the client sends");
    }
}
