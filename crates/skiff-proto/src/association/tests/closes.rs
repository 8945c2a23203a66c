//! Hundreds of lossy closes (issue 16, item 6), seeded: one end sends a
//! stream of messages and closes, and "exits" once it reports `Closed`:
//! its driver goes on only while its association
//! [`is_closing`](crate::association::Association::is_closing), for at
//! most [`LINGER`] (as skiff's endpoint does when dropped), and from then
//! on nothing it sends and nothing sent to it gets through (as when
//! `skiff cat` ends its process). The other end must have every message,
//! report `Closed` (never `Failed`), and do so promptly: well before its
//! idle timeout, the only other way out.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use super::harness::{msg, Dir, Net, Pair};
use crate::association::{Event, State};

/// Seeds per loss rate (`SKIFF_CLOSE_RUNS` for a longer hand run).
fn runs() -> u64 {
    std::env::var("SKIFF_CLOSE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150)
}

/// How long an exiting end's driver runs on while its close is under way.
const LINGER: Duration = Duration::from_secs(3);

/// The bound on the staying end's close, after the exiting end closed: a
/// few retransmission timeouts (the test config's idle timeout is 10 s).
const PROMPT: Duration = Duration::from_secs(4);

/// One run: the client sends (`client_sends`) or the server does; the
/// sender closes after its last message, the receiver closes on the
/// peer's sentinel (automatically). The end named `exits` vanishes at its
/// `Closed`.
fn run(seed: u64, loss: f64, client_sends: bool, client_exits: bool) {
    let mut p = Pair::new(
        seed,
        Net {
            loss,
            dup: 0.01,
            jitter: Duration::from_micros(300),
            ..Net::default()
        },
    );
    let gone = Rc::new(Cell::new(false));
    {
        let gone = gone.clone();
        // Once the exiting end is gone, nothing it sends goes out and
        // nothing reaches it.
        p.filter = Some(Box::new(move |_w| gone.get()));
    }
    p.connect();
    let n = 20 + (seed % 40) as usize;
    let sizes: Vec<usize> = (0..n)
        .map(|i| 8 + (seed as usize * 131 + i * 977) % 1000)
        .collect();
    for (i, &len) in sizes.iter().enumerate() {
        let m = msg(i, len);
        let r = if client_sends {
            p.client.send(m)
        } else {
            p.srv().send(m)
        };
        // The send buffer (64 KiB) holds the whole stream.
        r.expect("fits the send buffer");
    }
    if client_sends {
        p.client.close();
    } else {
        p.srv().close();
    }
    let closed = |ev: &[Event]| ev.iter().any(|e| matches!(e, Event::Closed(_)));
    let failed = |ev: &[Event]| ev.iter().any(|e| matches!(e, Event::Failed(_)));
    // Until the exiting end reports `Closed`.
    let ok = p.drive_until(Duration::from_secs(60), |p| {
        if client_exits {
            closed(&p.client_events)
        } else {
            closed(&p.server_events)
        }
    });
    let tag =
        format!("seed {seed} loss {loss} client_sends {client_sends} client_exits {client_exits}");
    assert!(
        ok,
        "{tag}: the exiting end did not close: {} / {}",
        last(&p.client_events),
        last(&p.server_events)
    );
    let at = p.elapsed();
    // The exiting end's driver runs on while its close is under way.
    let settled = p.drive_until(LINGER, |p| {
        if client_exits {
            !p.client.is_closing()
        } else {
            p.server.closing() == 0
        }
    });
    if !settled && std::env::var("CLOSE_DEBUG").is_ok() {
        let srv = p.server_h.and_then(|h| p.server.get(h));
        eprintln!(
            "server {:?} {:?}",
            srv.map(|a| a.state()),
            srv.map(|a| a.stats())
        );
        eprintln!("client {:?} {:?}", p.client.state(), p.client.stats());
        for w in p
            .log
            .iter()
            .filter(|w| w.at - p.start > at - Duration::from_millis(20))
        {
            let q = &w.packet;
            eprintln!(
                "{:?} {:?} sreq {} close {} status {:?} data {:?}",
                w.at - p.start,
                w.dir,
                q.sreq,
                q.close,
                q.status.as_ref().map(|s| (s.rseq, s.sack)),
                q.data.as_ref().map(|d| (d.seq, d.chunks.raw().len()))
            );
        }
    }
    gone.set(true);
    // The staying end closes promptly, having every message.
    let ok = p.drive_until(PROMPT, |p| {
        let ev = if client_exits {
            &p.server_events
        } else {
            &p.client_events
        };
        closed(ev) || failed(ev)
    });
    let (stay, leave) = if client_exits {
        (&p.server_events, &p.client_events)
    } else {
        (&p.client_events, &p.server_events)
    };
    assert!(
        ok,
        "{tag}: the staying end did not close within {PROMPT:?} of the other's close at {at:?} (its close settled: {settled}): last event {}; client {:?} {:?}",
        last(stay),
        p.client.state(),
        p.client.stats(),
    );
    assert!(
        !failed(stay),
        "{tag}: the staying end failed: {}",
        last(stay)
    );
    assert!(!failed(leave), "{tag}: the exiting end failed");
    let receiver = if client_sends {
        &p.server_events
    } else {
        &p.client_events
    };
    let got = Pair::messages(receiver);
    assert_eq!(got.len(), n, "{tag}: messages lost");
    for (i, m) in got.iter().enumerate() {
        assert_eq!(*m, msg(i, sizes[i]), "{tag}: message {i} differs");
    }
    // And the staying end winds down in the end, without a failure.
    p.drive_until(Duration::from_secs(60), |p| {
        let st = if client_exits {
            p.server_h.and_then(|h| p.server.get(h)).map(|a| a.state())
        } else {
            Some(p.client.state())
        };
        matches!(st, None | Some(State::Drained))
    });
    let stay = if client_exits {
        &p.server_events
    } else {
        &p.client_events
    };
    assert!(
        !failed(stay),
        "{tag}: the staying end failed while lingering"
    );
    let _ = Dir::ToServer;
}

/// The last event, briefly.
fn last(ev: &[Event]) -> String {
    match ev.last() {
        Some(Event::Message(m)) => format!("a message of {} bytes", m.len()),
        e => format!("{e:?}"),
    }
}

#[test]
fn lossy_closes_end_promptly_when_the_sender_exits() {
    for loss in [0.05, 0.19] {
        for seed in 0..runs() {
            run(seed, loss, true, true);
        }
    }
}

#[test]
fn lossy_closes_end_promptly_when_the_receiver_exits() {
    for loss in [0.05, 0.19] {
        for seed in std::env::var("SKIFF_CLOSE_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(0..runs(), |s: u64| s..s + 1)
        {
            run(seed, loss, true, false);
        }
    }
}

#[test]
fn lossy_closes_end_promptly_when_the_listener_sends_and_exits() {
    for loss in [0.05, 0.19] {
        for seed in 0..runs() {
            run(seed, loss, false, false);
            run(seed, loss, false, true);
        }
    }
}
