//! A subscription served from the node's buffer of its topic
//! ([`crate::shm::topic`], RBMQ's broker of buffers): over `shm://`, with
//! [`super::SubOptions::shared_buffer`], the node writes each message of
//! the topic once into one ring that every subscriber of the host reads in
//! place; the subscription's messages are slices of that ring.
//!
//! A request published to the topic reaches the subscription with its
//! reply token, and is answered through the client's own link to the node
//! ([`super::Client::reply`]).
//!
//! One thread per such subscription reads the ring: it decodes the frames
//! of each segment (bounded, as any frame from a node), puts the messages
//! into the subscription's inbox under one lock, and waits while the inbox
//! holds the subscription's window (credits then hold the ring, and the
//! node's queue for the topic, back). It ends when the subscription is
//! dropped (seen within a second) or the node ends the topic, and its end
//! closes the socket, which tells the node. Meanwhile it reports on that
//! socket how many messages it read and lost, which the node shows in its
//! stats (`shared_readers` of the topic's client).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use skiff_proto::client_frame::{Decoder, ServerFrame, FRAME_OVERHEAD};
use skiff_proto::credits::Flow;
use skiff_proto::wire::decode_message_into;
use skiff_proto::Message;

use super::inbox::{self, Shared};
use super::sub::{Delivery, SubOptions, Subscription};
use super::{Inner, SubEntry};
use crate::shm::topic::{Report, TopicAsk, TopicReader, TopicSeg, REPORT_EVERY};
use crate::shm::BufferError;
use crate::Error;

/// Subscribes `inner`, attached at `locator` (`shm://…`), to `pattern` and
/// `kind` through the node's buffer of that topic, with `flow`.
pub(crate) async fn subscribe(
    inner: Arc<Inner>,
    locator: &str,
    pattern: &str,
    kind: &str,
    flow: Flow,
    window: u32,
    max_payload: usize,
) -> Result<Subscription, Error> {
    let place = crate::shm::attach::parse(locator)?;
    let ask = TopicAsk {
        flow,
        pattern: pattern.into(),
        kind: kind.into(),
    };
    let reader = TopicReader::open(&place, &ask)
        .await
        .map_err(|why| Error::Io {
            what: "subscribe through the node's buffer of the topic",
            source: std::io::Error::other(why),
        })?;
    let box_ = inbox::shared();
    let weak = Arc::downgrade(&box_);
    let window = window.max(1) as usize;
    // Requests among the messages are answered through the client's own
    // link to the node (a reply token is good node-wide).
    let epoch = inner.epoch();
    std::thread::Builder::new()
        .name("skiff-shm-topic".into())
        .spawn(move || read_topic(reader, &weak, max_payload, window, epoch, None))
        .map_err(Error::io("start the topic reader thread"))?;
    // No sid of the node's: the node holds the topic's one subscription.
    Ok(Subscription::new(inner, 0, box_, u32::MAX))
}

/// A reader of the current generation of a kept subscription: it stops
/// once `gen` moves on (the node was lost).
type Guard = (Arc<AtomicU64>, u64);

/// Opens the topic's buffer on the node at `locator` and starts a reader
/// thread feeding `inbox`, for the generation `guard` (see [`Guard`]).
async fn start_reader(
    locator: &str,
    ask: TopicAsk,
    inbox: &Shared<Delivery>,
    window: u32,
    max_payload: usize,
    epoch: u32,
    guard: Guard,
) -> Result<(), Error> {
    let place = crate::shm::attach::parse(locator)?;
    let reader = TopicReader::open(&place, &ask)
        .await
        .map_err(|why| Error::Io {
            what: "subscribe through the node's buffer of the topic",
            source: std::io::Error::other(why),
        })?;
    let weak = Arc::downgrade(inbox);
    let window = window.max(1) as usize;
    std::thread::Builder::new()
        .name("skiff-shm-topic".into())
        .spawn(move || read_topic(reader, &weak, max_payload, window, epoch, Some(guard)))
        .map_err(Error::io("start the topic reader thread"))?;
    Ok(())
}

/// A shared-buffer subscription of a client that fails over: registered
/// with the client (a sid, so that a failover can restore it) and read
/// from the topic's buffer of the shm node at `locator`. On a node that
/// is not shm it is restored as a plain subscription.
pub(crate) async fn subscribe_kept(
    inner: Arc<Inner>,
    locator: &str,
    pattern: &str,
    kind: &str,
    opts: SubOptions,
    gated: bool,
    gen: Arc<AtomicU64>,
) -> Result<Subscription, Error> {
    let flow = opts.shared.unwrap_or(Flow::Credits);
    let sid = inner.next_id();
    let box_ = inbox::shared();
    let g = gen.load(Ordering::Acquire);
    {
        let mut st = inner.state.lock();
        box_.lock().stopped = gated && st.stopped;
        st.subs.insert(
            sid,
            SubEntry {
                gated,
                inbox: box_.clone(),
                pattern: pattern.into(),
                kind: kind.into(),
                opts,
                live: true,
                topic: Some(gen.clone()),
            },
        );
    }
    let ask = TopicAsk {
        flow,
        pattern: pattern.into(),
        kind: kind.into(),
    };
    let r = start_reader(
        locator,
        ask,
        &box_,
        opts.window,
        inner.max_payload.load(Ordering::Relaxed),
        inner.epoch(),
        (gen, g),
    )
    .await;
    if let Err(e) = r {
        inner.forget_sub(sid);
        return Err(e);
    }
    // Credits for this sid mean nothing to an shm node (the topic's
    // credits are the ring's) and are ignored there; after a failover to
    // a node over a socket they are the subscription's window.
    Ok(Subscription::new(inner, sid, box_, opts.window.max(1)))
}

/// Restores a kept shared-buffer subscription on the shm node at
/// `locator` after a failover (in the background: the restore itself does
/// not wait). A node that refuses the topic ends the subscription with
/// the reason.
pub(crate) fn restore_kept(inner: &Inner, locator: String, s: &SubEntry, gen: Arc<AtomicU64>) {
    let g = gen.load(Ordering::Acquire);
    let ask = TopicAsk {
        flow: s.opts.shared.unwrap_or(Flow::Credits),
        pattern: s.pattern.clone(),
        kind: s.kind.clone(),
    };
    let inbox = s.inbox.clone();
    let window = s.opts.window;
    let max_payload = inner.max_payload.load(Ordering::Relaxed);
    let epoch = inner.epoch();
    tokio::spawn(async move {
        let r = start_reader(&locator, ask, &inbox, window, max_payload, epoch, (gen, g)).await;
        if let Err(e) = r {
            inbox.lock().close(Some(format!(
                "the shared-buffer subscription could not be restored on {locator}: {e}"
            )));
        }
    });
}

/// The reader thread (see the module doc).
fn read_topic(
    mut r: TopicReader,
    weak: &std::sync::Weak<parking_lot::Mutex<inbox::Inbox<Delivery>>>,
    max_payload: usize,
    window: usize,
    epoch: u32,
    guard: Option<Guard>,
) {
    let current = || {
        guard
            .as_ref()
            .is_none_or(|(g, n)| g.load(Ordering::Acquire) == *n)
    };
    let dec = Decoder::new(r.max_frame.min((max_payload + FRAME_OVERHEAD) as u64) as usize);
    let gone = || weak.strong_count() == 0 || !current();
    let mut counts = Report::default();
    // A report held back by the throttle (see `TopicReader::report`) is
    // due then: a wait for the next segment ends at that time, and the
    // report goes out.
    let due: std::cell::Cell<Option<Instant>> = std::cell::Cell::new(None);
    let retry = || Some(Instant::now() + REPORT_EVERY);
    let note = |sent: bool| {
        if sent {
            due.set(None);
        } else if due.get().is_none() {
            due.set(retry());
        }
    };
    let stop = || gone() || due.get().is_some_and(|t| Instant::now() >= t);
    let end: Option<String> = loop {
        // The window: wait while the application has this many waiting.
        loop {
            let Some(b) = weak.upgrade() else { return };
            if !current() {
                return;
            }
            if b.lock().q.len() < window {
                break;
            }
            drop(b);
            std::thread::sleep(Duration::from_micros(50));
        }
        match r.next(&stop) {
            Ok(TopicSeg::Frames(mut rest)) => {
                let Some(b) = weak.upgrade() else { return };
                if !current() {
                    return;
                }
                let (n, res) = deliver(&b, &dec, &mut rest, max_payload, epoch);
                counts.read += n;
                if let Err(e) = res {
                    break Some(format!("bad frame in the node's topic buffer: {e}"));
                }
                note(r.report(counts, false));
            }
            Ok(TopicSeg::Lost(n)) => {
                let Some(b) = weak.upgrade() else { return };
                b.lock().dropped += n;
                counts.dropped += n;
                note(r.report(counts, false));
            }
            Ok(TopicSeg::Idle) => {
                if gone() {
                    return;
                }
                if due.get().is_some_and(|t| Instant::now() >= t) {
                    due.set(if r.report(counts, true) {
                        None
                    } else {
                        retry()
                    });
                }
            }
            // A kept subscription lives on: the client fails over and
            // restores it on the next node (the gap is reported there).
            Err(
                BufferError::Closed { .. }
                | BufferError::PeerDead { .. }
                | BufferError::PeerLost { .. },
            ) if guard.is_some() => return,
            Err(BufferError::Closed { .. }) => break Some("the node ended the topic".into()),
            Err(e) => break Some(format!("the node's topic buffer failed: {e}")),
        }
    };
    if let Some(b) = weak.upgrade() {
        b.lock().close(end);
    }
}

/// Decodes the frames of one segment into the inbox, under one lock with
/// one wake-up; returns how many messages it queued. Only messages are for the subscriber (the node's own
/// frames to the topic, such as its welcome, are skipped).
fn deliver(
    b: &Shared<Delivery>,
    dec: &Decoder,
    rest: &mut bytes::Bytes,
    max_payload: usize,
    epoch: u32,
) -> (u64, Result<(), String>) {
    let mut i = b.lock();
    let before = i.q.len();
    let r = loop {
        match dec.split(rest) {
            // A message is decoded straight into its place in the queue
            // (its payload a slice of the ring), as from a socket.
            Ok(Some(body)) => match ServerFrame::msg_header(&body) {
                Ok(Some((_, token, at))) => {
                    let token = (token != 0).then_some(token);
                    let mut d = Delivery::new(Message::default(), token, epoch);
                    // The first message after a failover carries its gap.
                    d.gap = i.pending_gap.take();
                    i.q.push_back(d);
                    let d = i.q.back_mut().expect("just pushed");
                    if let Err(e) = decode_message_into(&body, at, max_payload, &mut d.msg) {
                        i.q.pop_back();
                        break Err(e.to_string());
                    }
                }
                Ok(None) => {}
                Err(e) => break Err(e.to_string()),
            },
            Ok(None) => break Ok(()),
            Err(e) => break Err(e.to_string()),
        }
    };
    let n = i.q.len() - before;
    if n > 0 {
        i.wake();
    }
    (n as u64, r)
}
