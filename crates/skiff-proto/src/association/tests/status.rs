//! When a data packet carries a STATUS: in the middle of a burst only when
//! it says something new; the first and the last packet of a burst, and
//! every packet after the status changed, always.

use std::time::Duration;

use bytes::Bytes;

use super::harness::{msg, test_config, Dir, Net, Pair};
use crate::association::frame::Packet;
use crate::association::AssociationConfig;

/// Data packets the client sent from `log[from..]`: (has a status, SREQ,
/// time sent).
fn client_data(p: &Pair, from: usize) -> Vec<(bool, bool, std::time::Instant)> {
    p.log[from..]
        .iter()
        .filter(|w| w.dir == Dir::ToServer && w.packet.data.is_some())
        .map(|w| (w.packet.status.is_some(), w.packet.sreq, w.at))
        .collect()
}

#[test]
fn a_burst_carries_the_status_first_and_last_and_not_in_every_packet() {
    let mut p = Pair::new(1, Net::default());
    p.connect();
    let from = p.log.len();
    // 30 packets' worth, within the window of 32: one burst.
    p.client.send(msg(1, 30_000)).unwrap();
    p.drive();
    assert_eq!(Pair::messages(&p.server_events), vec![msg(1, 30_000)]);
    let sent = client_data(&p, from);
    let burst: Vec<_> = sent.iter().filter(|d| d.2 == sent[0].2).collect();
    assert!(burst.len() >= 20, "{sent:?}");
    assert!(burst[0].0, "the first packet of a burst carries the status");
    let last = burst.last().unwrap();
    assert!(
        last.0 && last.1,
        "the last asks for a status and carries one"
    );
    // Every packet that asks for a status carries one of its own.
    assert!(burst.iter().all(|d| !d.1 || d.0), "{burst:?}");
    let with = burst.iter().filter(|d| d.0).count();
    assert!(
        with < burst.len() / 2,
        "{with} of {} carry a status",
        burst.len()
    );
}

#[test]
fn a_data_packet_sent_after_data_arrived_says_so() {
    // Both ends stream at once: every packet the client sends without a
    // status must come when the last status it sent named every packet
    // received so far (its `rseq` then is the client's now).
    let mut p = Pair::new(2, Net::default());
    p.connect();
    // 50 packets' worth each way (more than the window of 32).
    for i in 0..12 {
        p.client.send(msg(i, 5000)).unwrap();
    }
    for i in 0..60 {
        p.srv().send(msg(i, 900)).unwrap();
    }
    let mut last_rseq = None;
    let (mut omitted, mut news) = (0, 0);
    for _ in 0..100_000 {
        let rseq = p.client.recv_window().0;
        let from = p.log.len();
        if !p.step() {
            break;
        }
        let mut first = true;
        for w in p.log[from..].iter().filter(|w| w.dir == Dir::ToServer) {
            match &w.packet.status {
                Some(st) => {
                    if first && last_rseq != Some(rseq) {
                        news += 1;
                        assert_eq!(st.rseq, rseq, "the first status after news names them");
                    }
                    last_rseq = Some(st.rseq);
                }
                None => {
                    omitted += 1;
                    assert_eq!(last_rseq, Some(rseq), "a status with news was left out");
                }
            }
            first = false;
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
    assert!(
        omitted > 0,
        "no status was left out: the rule is not exercised"
    );
    assert!(news > 0, "no data arrived between the client's sends");
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
    while let Some(e) = p.client.poll_event() {
        p.client_events.push(e);
    }
    p.client_reads = true;
    p.client.send(msg(7, 40_000)).unwrap();
    let from = p.log.len();
    p.flush();
    let first = p.log[from..]
        .iter()
        .find(|w| w.dir == Dir::ToServer)
        .expect("the client sent something");
    let st = first
        .packet
        .status
        .expect("the first packet carries a status");
    assert!(st.alloc > alloc, "{} not above {alloc}", st.alloc);
    p.drive();
    assert_eq!(Pair::messages(&p.server_events), vec![msg(7, 40_000)]);
}

#[test]
fn data_arriving_between_two_packets_of_one_instant_goes_out_with_the_second() {
    // The client sends part of a burst, then (at the same instant) a
    // packet of the server's arrives: the client's next packet carries
    // the status that acknowledges it, though the one before went an
    // instant ago.
    let mut p = Pair::new(4, Net::default());
    p.connect();
    let now = p.now;
    p.srv().send(msg(9, 300)).unwrap();
    let mut buf = Vec::new();
    let t = p
        .server
        .poll_transmit(now, &mut buf)
        .expect("the server sends");
    assert_eq!(t.destination, p.client_addr);
    let from_server = buf.clone();
    p.client.send(msg(1, 20_000)).unwrap();
    let mut sent = Vec::new();
    for _ in 0..4 {
        let t = p.client.poll_transmit(now, &mut buf).expect("more to send");
        sent.push(Packet::decode(&Bytes::copy_from_slice(&buf[..t.size])).unwrap());
    }
    assert!(sent[0].status.is_some());
    assert!(sent[1..].iter().any(|q| q.status.is_none()), "{sent:?}");
    let rseq = p.client.recv_window().0;
    p.client
        .handle_datagram(now, p.server_addr, from_server.into());
    assert_eq!(
        p.client.recv_window().0,
        rseq + 1,
        "the server's packet arrived"
    );
    let t = p.client.poll_transmit(now, &mut buf).expect("more to send");
    let next = Packet::decode(&Bytes::copy_from_slice(&buf[..t.size])).unwrap();
    assert!(next.data.is_some());
    let st = next.status.expect("the packet after news carries a status");
    assert_eq!(st.rseq, rseq + 1);
}
