//! The node's buffers of topics for its shared-memory subscribers (RBMQ's
//! broker of buffers; the ring and the rendezvous are
//! `skiff::shm::topic`). A subscriber of the host asks on the node's
//! socket for a topic (subject pattern, type pattern, credits or
//! overwrite); the first such request creates the topic:
//!
//! - a ring file in the attachment directory with room for
//!   `skiff::shm::topic::TOPIC_READERS` readers;
//! - the topic's own client of the broker with one subscription to the
//!   pattern (policy `block` with credits: the topic rides its slowest
//!   reader and back-pressures publishers; `drop-oldest` with overwrite,
//!   whose ring never waits), so the broker routes each message to the
//!   topic once, however many readers it has;
//! - a writer thread that copies what the broker queued for the topic
//!   into the ring, whole frames per segment: one copy per message for
//!   every subscriber of the host together.
//!
//! Later requests for the same topic share it. Each subscriber's socket
//! stays open, and carries its reports of what it read and lost (shown in
//! the stats as the `shared_readers` of the topic's client); when the last one closes (its subscriber left or died), the
//! topic is removed: the broker's client detached, the ring closed and its
//! file removed. A request is checked as an shm client's attachment is:
//! with authentication on, its uid or gid must map to a user allowed to
//! subscribe to the pattern. Requests are bounded (the rendezvous lines, the handshake
//! time, the topics: at most [`MAX_TOPICS`]); a bad one is refused with
//! `ERR`, never the node.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use skiff::shm::host::Rendezvous;
use skiff::shm::topic::{TopicAsk, TopicRing};
use skiff::shm::Flow;
use skiff_proto::client_frame::{ClientFrame, Policy, FRAME_OVERHEAD};
use skiff_proto::router::{KindPattern, Pattern, Syntax};
use tokio::runtime::Handle;

use crate::broker::Broker;
use crate::outbox::{Body, ClientOut, SharedReader};

/// Most topics a node keeps buffers for at once.
pub const MAX_TOPICS: usize = 1024;
/// The topic's subscription id in its own client.
const SID: u64 = 1;
/// Messages the topic's queue in the broker holds (its ring holds more).
const QUEUE: u32 = 65_536;

/// Counters of the topic buffers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicStats {
    /// Topics with a buffer now.
    pub topics: u64,
    /// Subscriptions served from them now.
    pub readers: u64,
    /// Topic requests refused (bad lines, limits, failures).
    pub refused: u64,
    /// Bytes of frames written into topic rings (once per message, for
    /// all readers).
    pub bytes_written: u64,
    /// Report lines from readers that did not parse (ignored).
    pub bad_reports: u64,
    /// Messages written into topic rings by the publishing thread itself
    /// (the direct path: the topic's queue was empty and its ring had
    /// room); the others went through the topic's queue and writer thread.
    pub direct: u64,
}

#[derive(Debug)]
struct Topic {
    name: String,
    readers: u64,
    out: Arc<ClientOut>,
}

/// The node's topics (one per listener).
#[derive(Debug, Default)]
pub(crate) struct Topics {
    map: Mutex<HashMap<TopicAsk, Topic>>,
    seq: AtomicU64,
    refused: AtomicU64,
    bad_reports: AtomicU64,
    bytes: Arc<AtomicU64>,
    direct: Arc<AtomicU64>,
}

impl Topics {
    pub(crate) fn stats(&self) -> TopicStats {
        let m = self.map.lock();
        TopicStats {
            topics: m.len() as u64,
            readers: m.values().map(|t| t.readers).sum(),
            refused: self.refused.load(Relaxed),
            bytes_written: self.bytes.load(Relaxed),
            bad_reports: self.bad_reports.load(Relaxed),
            direct: self.direct.load(Relaxed),
        }
    }
}

/// Where topic rings go and how they are sized.
#[derive(Debug, Clone)]
pub(crate) struct TopicPlace {
    pub(crate) dir: PathBuf,
    pub(crate) ring: u64,
    pub(crate) spin: Duration,
}

/// Serves one topic request (see the module doc), until its subscriber's
/// socket closes.
pub(crate) async fn serve(
    r: Rendezvous,
    ask: TopicAsk,
    broker: Arc<Broker>,
    topics: Arc<Topics>,
    place: TopicPlace,
) {
    let max_frame = (broker.limits().max_payload + FRAME_OVERHEAD) as u64;
    // As for an shm client: the requester is the user its uid or gid maps
    // to, and must be allowed to subscribe to the topic's pattern.
    let user = match r.peer_ids() {
        Some((uid, gid)) => broker.auth().local_user(uid, gid),
        None => broker.auth().local_user(u32::MAX, u32::MAX),
    };
    let allowed = match &user {
        None => {
            broker.auth().count_failure();
            Err(crate::auth::AuthError::Refused.to_string())
        }
        Some(u) if !u.permissions.may_subscribe(&ask.pattern) => {
            Err(format!("not permitted to subscribe to {}", ask.pattern))
        }
        Some(_) => Ok(()),
    };
    if let Err(why) = allowed {
        topics.refused.fetch_add(1, Relaxed);
        r.refuse(&why).await;
        return;
    }
    let peer = r
        .pid()
        .map_or_else(|| "unknown".to_string(), |p| format!("pid {p}"));
    let (name, out) = match join(&ask, &broker, &topics, &place, max_frame) {
        Ok(joined) => joined,
        Err(why) => {
            topics.refused.fetch_add(1, Relaxed);
            r.refuse(&why).await;
            return;
        }
    };
    match r.serve_topic(&name, max_frame).await {
        Ok(mut watch) => {
            let me = Arc::new(SharedReader {
                peer,
                ..SharedReader::default()
            });
            out.add_shared_reader(me.clone());
            while let Some(report) = watch.next_report().await {
                match report {
                    Ok(r) => {
                        me.read.store(r.read, Relaxed);
                        me.dropped.store(r.dropped, Relaxed);
                    }
                    Err(_) => {
                        topics.bad_reports.fetch_add(1, Relaxed);
                    }
                }
            }
            out.remove_shared_reader(&me);
        }
        Err(_) => {
            topics.refused.fetch_add(1, Relaxed);
        }
    }
    leave(&ask, &broker, &topics);
}

/// Counts a reader of `ask`'s topic in, creating the topic first if need
/// be; returns its ring file's name and the topic's client.
fn join(
    ask: &TopicAsk,
    broker: &Arc<Broker>,
    topics: &Arc<Topics>,
    place: &TopicPlace,
    max_frame: u64,
) -> Result<(String, Arc<ClientOut>), String> {
    Pattern::new(&ask.pattern).map_err(|e| e.to_string())?;
    KindPattern::new(&ask.kind).map_err(|e| e.to_string())?;
    let mut map = topics.map.lock();
    if let Some(t) = map.get_mut(ask) {
        t.readers += 1;
        return Ok((t.name.clone(), t.out.clone()));
    }
    if map.len() >= MAX_TOPICS {
        return Err(format!("the node keeps at most {MAX_TOPICS} topic buffers"));
    }
    let name = format!(
        "t{}-{}.topic",
        std::process::id(),
        topics.seq.fetch_add(1, Relaxed)
    );
    let ring = TopicRing::create(
        &place.dir, &name, place.ring, max_frame, ask.flow, place.spin,
    )
    .map_err(|e| e.to_string())?;
    let out = broker
        .attach(format!("shm-topic:{} [{}]", ask.pattern, ask.kind))
        .map_err(|f| f.text)?;
    let policy = match ask.flow {
        Flow::Credits => Policy::Block,
        Flow::Overwrite => Policy::DropOldest,
    };
    let sub = ClientFrame::Sub {
        sid: SID,
        pattern: ask.pattern.clone(),
        kind: ask.kind.clone(),
        policy,
        queue: QUEUE,
        credit: u32::MAX,
        syntax: Syntax::Tokens,
        best_effort: false,
        group: None,
    };
    if let Err(f) = broker.handle_control(&out, sub) {
        broker.detach(out.id, None);
        ring.close();
        return Err(f.text);
    }
    let sink = Arc::new(TopicSink {
        ring: Mutex::new(Some(ring)),
        scratch: Mutex::new(Vec::new()),
        bytes: topics.bytes.clone(),
        direct: topics.direct.clone(),
    });
    out.set_direct(sink.clone());
    let (o, handle) = (out.clone(), Handle::current());
    let spawned = std::thread::Builder::new()
        .name(format!("skiff-shm-topic-{}", out.id))
        .spawn(move || write_topic(&sink, o, handle));
    if spawned.is_err() {
        broker.detach(out.id, None);
        return Err("no thread for the topic".into());
    }
    map.insert(
        ask.clone(),
        Topic {
            name: name.clone(),
            readers: 1,
            out: out.clone(),
        },
    );
    Ok((name, out))
}

/// Counts a reader of `ask`'s topic out; the last one removes the topic.
fn leave(ask: &TopicAsk, broker: &Broker, topics: &Topics) {
    let mut map = topics.map.lock();
    let Some(t) = map.get_mut(ask) else { return };
    t.readers -= 1;
    if t.readers == 0 {
        let t = map.remove(ask).expect("present");
        drop(map);
        // Its writer sees the client closed, closes the ring and removes
        // the file.
        broker.detach(t.out.id, None);
    }
}

/// A topic's ring as the broker's direct sink ([`crate::outbox::Direct`]):
/// while nothing is queued for the topic, the thread that publishes (an
/// shm client's reader, a socket's task, the mesh) writes the message
/// into the ring itself, one segment per run of messages, and the
/// topic's readers wake from the ring's futex. No hop through the topic's
/// queue and its writer thread. When the ring is full (credits), its lock
/// is held by the writer thread, or messages are already queued, the
/// message is queued as before and the writer thread takes it.
///
/// Lock order: the broker's routing lock, the topic client's outbox lock,
/// then `ring` (only with `try_lock` there); the writer thread takes
/// `ring` then the outbox lock. `scratch` is taken only under `ring`.
#[derive(Debug)]
struct TopicSink {
    /// `None` once the writer thread closed it.
    ring: Mutex<Option<TopicRing>>,
    /// Frames being encoded by the direct path when a message is a value
    /// (encoded messages are written in place).
    scratch: Mutex<Vec<u8>>,
    bytes: Arc<AtomicU64>,
    /// Messages written by the direct path (all topics).
    direct: Arc<AtomicU64>,
}

impl crate::outbox::Direct for TopicSink {
    fn try_write(&self, sid: u64, token: u64, msgs: &[Body]) -> bool {
        let Some(mut ring) = self.ring.try_lock() else {
            return false;
        };
        let Some(ring) = ring.as_mut() else {
            return false;
        };
        // Encoded messages (all a publish routes): their frames written
        // in place into the ring's segment, no scratch copy.
        let len: Option<usize> = msgs.iter().map(|m| m.raw_frame_len(sid, token)).sum();
        if let Some(len) = len {
            let written = ring.try_write(len, |seg| {
                let mut rest = seg;
                for m in msgs {
                    // Lengths from `raw_frame_len`: each frame fits its
                    // piece exactly.
                    let n = m.raw_frame_len(sid, token).unwrap_or(0).min(rest.len());
                    let (frame, after) = std::mem::take(&mut rest).split_at_mut(n);
                    let ok = m.encode_into(frame, sid, token);
                    debug_assert!(ok, "a frame of the length it was measured at");
                    rest = after;
                }
            });
            let ok = matches!(written, Ok(true));
            if ok {
                self.bytes.fetch_add(len as u64, Relaxed);
                self.direct.fetch_add(msgs.len() as u64, Relaxed);
            }
            return ok;
        }
        let mut buf = self.scratch.lock();
        buf.clear();
        for m in msgs {
            m.encode(&mut buf, sid, token);
        }
        let ok = matches!(
            ring.try_write(buf.len(), |seg| seg.copy_from_slice(&buf)),
            Ok(true)
        );
        if ok {
            self.bytes.fetch_add(buf.len() as u64, Relaxed);
            self.direct.fetch_add(msgs.len() as u64, Relaxed);
        }
        if buf.capacity() > 1 << 20 {
            *buf = Vec::new();
        }
        ok
    }
}

/// The topic's writer thread: what the broker queued for the topic (the
/// direct path could not take it), into its ring; credit back to the
/// topic's subscription as frames leave. It holds the ring's lock from
/// taking frames to writing them, so the direct path cannot write a later
/// message before them.
fn write_topic(sink: &TopicSink, out: Arc<ClientOut>, handle: Handle) {
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut go = || !out.is_closed();
    loop {
        handle.block_on(out.ready());
        let mut guard = sink.ring.lock();
        let Some(ring) = guard.as_mut() else { return };
        if !out.take_encoded(&mut buf) {
            if out.is_closed() {
                // The final frame, if any, then the end.
                if let Some(f) = out.take_closing() {
                    f.encode(&mut buf);
                    let _ = ring.write_frames(&buf, &mut go);
                }
                break;
            }
            continue;
        }
        if ring.write_frames(&buf, &mut go).is_err() {
            break;
        }
        drop(guard);
        sink.bytes.fetch_add(buf.len() as u64, Relaxed);
        let frames = count_frames(&buf);
        out.credit(SID, frames);
        buf.clear();
        if buf.capacity() > 4 << 20 {
            buf = Vec::with_capacity(64 * 1024);
        }
    }
    if let Some(ring) = sink.ring.lock().take() {
        ring.close();
    }
}

/// Whole frames in `buf` (`| len u32 | body |`…).
fn count_frames(buf: &[u8]) -> u32 {
    let (mut at, mut n) = (0usize, 0u32);
    while at + 4 <= buf.len() {
        let len = u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes")) as usize;
        at += 4 + len;
        n = n.saturating_add(1);
    }
    n
}
