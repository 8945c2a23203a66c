//! Bundles of small messages (see `bundle.rs`): offered at set-up, sent
//! only when both ends offered them, delivered as one event whose records
//! keep their boundaries, and checked as hostile input.

use std::time::Duration;

use bytes::Bytes;

use super::harness::{msg, test_config, Net, Pair};
use crate::association::bundle::{self, records};
use crate::association::frame::{Chunk, Encoder, RTN};
use crate::association::{Association, AssociationConfig, Event, FailReason, SendError};

fn offering() -> AssociationConfig {
    AssociationConfig {
        bundles: true,
        ..test_config()
    }
}

/// A pair whose client offers bundles if `client` and whose listener does
/// if `server`.
fn pair(seed: u64, net: Net, client: bool, server: bool) -> Pair {
    let mut p = Pair::with_config(
        seed,
        net,
        AssociationConfig {
            bundles: server,
            ..test_config()
        },
    );
    let key = p.rng.next();
    p.client = Association::connect(
        p.now,
        AssociationConfig {
            bundles: client,
            ..test_config()
        },
        p.server_addr,
        7,
        key,
    );
    p
}

fn build(msgs: &[Bytes]) -> Bytes {
    let mut out = Vec::new();
    for m in msgs {
        bundle::put(&mut out, m);
    }
    out.into()
}

/// Every message one side received, bundles split, in order.
fn received(events: &[Event]) -> Vec<Bytes> {
    let mut out = Vec::new();
    for e in events {
        match e {
            Event::Message(m) => out.push(m.clone()),
            Event::Bundle(b) => out.extend(records(b.clone())),
            _ => {}
        }
    }
    out
}

#[test]
fn bundles_keep_order_and_boundaries_among_plain_and_large_messages() {
    let mut p = pair(1, Net::default(), true, true);
    p.connect();
    assert!(p.client.bundles() && p.srv().bundles());
    let mut want = Vec::new();
    let mut i = 0;
    for round in 0..6 {
        // A bundle of small messages (an empty one among them), a plain
        // message, and every other round a bundle larger than a packet
        // (fragmented and reassembled like any message).
        let n = if round % 2 == 0 { 5 } else { 120 };
        let small: Vec<Bytes> = (0..n)
            .map(|k| {
                i += 1;
                if k == 2 {
                    Bytes::new()
                } else {
                    msg(i, 8 + k % 40)
                }
            })
            .collect();
        p.client.send_bundle(build(&small), small.len()).unwrap();
        want.extend(small);
        i += 1;
        let plain = msg(i, 3000);
        p.client.send(plain.clone()).unwrap();
        want.push(plain);
        p.drive();
    }
    assert_eq!(received(&p.server_events), want);
    let c = p.client.stats();
    let s = p.srv().stats();
    assert_eq!(c.bundles_sent, 6);
    assert_eq!(c.bundled_messages_sent, 3 * 5 + 3 * 120);
    assert_eq!(c.messages_sent, 12, "a bundle is one association message");
    assert_eq!(s.bundles_delivered, 6);
    assert_eq!(s.bundled_messages_delivered, 3 * 5 + 3 * 120);
    assert_eq!(s.messages_delivered, 12);
    // The bundles' bytes were freed from the receive buffer when taken.
    assert_eq!(p.srv().unread(), 0);
}

#[test]
fn bundles_survive_loss_duplication_and_reordering() {
    let net = Net {
        loss: 0.1,
        dup: 0.05,
        jitter: Duration::from_millis(3),
        ..Net::default()
    };
    for seed in 1..6 {
        let mut p = pair(seed, net.clone(), true, true);
        p.connect();
        let mut want = Vec::new();
        for b in 0..40usize {
            let small: Vec<Bytes> = (0..(1 + b % 30)).map(|k| msg(b * 100 + k, 8 + k)).collect();
            p.client.send_bundle(build(&small), small.len()).unwrap();
            want.extend(small);
        }
        p.drive();
        assert_eq!(received(&p.server_events), want, "seed {seed}");
    }
}

#[test]
fn an_end_that_did_not_offer_is_never_sent_a_bundle() {
    for (client, server) in [(true, false), (false, true), (false, false)] {
        let mut p = pair(3, Net::default(), client, server);
        p.connect();
        assert!(!p.client.bundles() && !p.srv().bundles());
        let b = build(&[msg(1, 10), msg(2, 10)]);
        assert_eq!(
            p.client.send_bundle(b.clone(), 2),
            Err(SendError::Unsupported)
        );
        assert_eq!(p.srv().send_bundle(b, 2), Err(SendError::Unsupported));
        // Plain messages flow as before, both ways.
        p.client.send(msg(3, 10)).unwrap();
        p.srv().send(msg(4, 10)).unwrap();
        p.drive();
        assert_eq!(Pair::messages(&p.server_events), vec![msg(3, 10)]);
        assert_eq!(Pair::messages(&p.client_events), vec![msg(4, 10)]);
    }
}

#[test]
fn set_up_packets_carry_the_offer_in_the_ack_delay() {
    // What an end built before bundles sees: 0 (no features) from an end
    // that does not offer, the feature bit from one that does; nothing else
    // in the set-up changes.
    for offer in [false, true] {
        let mut p = pair(4, Net::default(), offer, offer);
        p.connect();
        let first = p
            .log
            .iter()
            .find(|w| w.packet.first.is_some())
            .expect("a FIRST");
        let accept = p
            .log
            .iter()
            .find(|w| w.packet.accept.is_some())
            .expect("an ACCEPT");
        let want = if offer { bundle::FEATURE_BUNDLES } else { 0 };
        assert_eq!(first.packet.status.unwrap().ack_delay_us, want);
        assert_eq!(accept.packet.status.unwrap().ack_delay_us, want);
    }
}

/// Sends the server one packet with a chunk flagged BUNDLE, at the next
/// sequence number, from the right address with the right key.
fn inject_bundle(p: &mut Pair, bytes: &'static [u8]) {
    let key = p.srv().local_key() | RTN;
    let mut out = Vec::new();
    let mut e = Encoder::new(&mut out, key);
    e.data(0);
    e.chunk(&Chunk {
        begin: true,
        end: true,
        bundle: true,
        total: 0,
        bytes: Bytes::from_static(bytes),
    });
    let client = p.client_addr;
    p.inject_to_server(client, out);
    assert!(p.drive_until(Duration::from_secs(5), |p| p.both_done()));
}

#[test]
fn a_bundle_to_an_end_that_did_not_offer_is_a_protocol_violation() {
    let mut p = pair(5, Net::default(), true, false);
    p.connect();
    inject_bundle(&mut p, &[1, b'x']);
    assert_eq!(
        p.server_events.last(),
        Some(&Event::Failed(FailReason::Protocol(
            "a bundle, which this end did not offer"
        )))
    );
    assert!(received(&p.server_events).is_empty());
}

#[test]
fn a_bundle_that_does_not_parse_is_a_protocol_violation() {
    for bad in [&[5u8, 1, 2][..], &[][..], &[0x80][..]] {
        let mut p = Pair::with_config(6, Net::default(), offering());
        p.connect();
        let bad: &'static [u8] = Box::leak(bad.to_vec().into_boxed_slice());
        inject_bundle(&mut p, bad);
        assert_eq!(
            p.server_events.last(),
            Some(&Event::Failed(FailReason::Protocol(
                "a bundle whose records do not parse"
            ))),
            "{bad:?}"
        );
        assert!(received(&p.server_events).is_empty());
    }
}
