//! A client attached to a node on its host over shared memory
//! (`shm://name`): see `shm/attach.rs` for the rendezvous, and the node's
//! shm listener (skiff-node's `listen/shm.rs`) for the node's side.
//!
//! A small publish is written by the publishing task straight into an
//! open segment of the client→node ring while nothing is queued before it
//! (the direct path, [`ShmTx::try_encode_with`]): no copy and no hand-off
//! to another thread; the segment is published when full, or by the
//! writer thread once it stopped growing. With no room in the ring for a
//! segment, publishers wait ([`ShmTx::wait_room`]) while the writer thread
//! waits for the node to free one. Other senders queue frames as values in
//! [`ShmTx`] (bounded: a publisher waits once about 1 MiB of publishes is
//! queued); one writer thread takes them in batches and writes each batch
//! into segments of the ring, after the open segment. A publish is
//! encoded straight into the ring (`encode_pub_into`): its payload is
//! written once, there, and the node reads it in place. Other frames are
//! encoded into a scratch buffer and copied in. A full ring blocks the
//! writer thread (credits), which fills the queue, which makes publishers
//! wait.
//!
//! A reader thread waits on the node→client ring, copies each segment out
//! (one copy, like a socket read; the ring space goes back at once),
//! decodes the frames with the bounded decoder (payloads are slices of
//! that copy) and dispatches them. A tokio task holds the rendezvous
//! socket: its end means the node is gone. No failover here: a client
//! given a list of nodes takes the stream link over the rings instead
//! (`shm_stream`).

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use skiff_proto::client_frame::{encode_pub_into, pub_frame_len, Decoder, PubHead, FRAME_OVERHEAD};
use skiff_proto::client_frame::{ClientFrame, Code, ServerFrame};
use skiff_proto::Message;
use tokio::io::AsyncReadExt;
use tokio::sync::Notify;

use super::Inner;
use crate::shm::attach::{ClientRings, DownReader, FrameWriter};
use crate::shm::BufferError;
use crate::Error;

/// Bytes of queued publishes (payload and subject) before publishers wait.
const HIGH_WATER: usize = 1 << 20;

/// How long a closed client's writer keeps trying to flush to a node that
/// does not take its frames.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Publishes of at most this many payload bytes are encoded at once into
/// a run of frames (a copy of the payload, but no clone of the message to
/// move to the writer thread and drop there); larger ones are queued and
/// encoded straight into the ring (the payload written once).
const ENCODE_NOW: usize = 512;

/// Most bytes of one run of publishes encoded at once.
const RUN: usize = 64 << 10;

/// Most emptied runs kept for reuse.
const SPARE_RUNS: usize = 4;

/// How long the writer thread looks for more frames (yielding its CPU at
/// each look) before it sleeps: a publisher that publishes again within
/// it finds the writer awake, with no futex wake-up and no context switch
/// for each small batch.
const WRITER_SPIN: Duration = Duration::from_micros(20);

/// The size of a segment a publisher fills frame by frame in the ring
/// (the direct path, see [`ShmTx::try_encode_with`]): it is published
/// once the next frame does not fit, or by the writer thread once it
/// stopped growing ([`LINGER`]). Large, as the writer thread's batches
/// were: the node's work and wake-ups per segment are spread over more
/// messages.
const DIRECT_SEG: usize = 256 << 10;

/// How often the writer thread looks at a publisher's open segment: one
/// that did not grow since the last look is published (the tail of a
/// burst; the first publish after a quiet spell is published at once).
/// Each look is a wake-up of the writer thread while a publisher keeps
/// publishing, so not too often.
const LINGER: Duration = Duration::from_micros(200);

/// What waits for the writer thread.
#[derive(Debug)]
// Frames are queued by value, as before runs existed: a box would cost an
// allocation per frame.
#[allow(clippy::large_enum_variant)]
enum Pending {
    Frame(ClientFrame),
    /// Whole encoded publish frames, in order.
    Encoded(Vec<u8>),
}

#[derive(Debug, Default)]
struct TxQ {
    frames: VecDeque<Pending>,
    bytes: usize,
    /// Emptied runs the writer thread gave back, for the next runs of
    /// publishes (no allocation, no growth per run); at most [`SPARE_RUNS`].
    spare: Vec<Vec<u8>>,
    closed: Option<Instant>,
    lost: Option<String>,
    /// The ring holds an open segment (frames written by publishers on the
    /// direct path, not yet published).
    open: bool,
    /// The writer thread sleeps until woken (not lingering): a publisher
    /// that opens a segment wakes it.
    writer_waits: bool,
    /// A publisher found no room in the ring for a segment: the writer
    /// thread waits for the node to free it, then wakes the publishers
    /// ([`ShmTx::wait_room`]), which write into the ring again (instead of
    /// queueing behind each other's frames).
    need_room: bool,
}

/// The send side of an shm link: a bounded queue of frames for the
/// writer thread.
#[derive(Debug, Default)]
pub(crate) struct ShmTx {
    q: Mutex<TxQ>,
    wake_writer: Condvar,
    space: Notify,
    /// The node this is attached to (the locator), for errors.
    node: String,
    /// The client→node ring's writer, once started. Lock order: `q`, then
    /// `up`. A publisher takes `up` only with `try_lock`, while it holds `q`
    /// and nothing is queued; the writer thread takes it while it holds `q`
    /// and keeps it, `q` released, while it writes the batch it took then
    /// (publishers that find `up` taken queue behind that batch; the
    /// writer's `go` check takes `q` under `up`, which cannot deadlock
    /// since no one waits for `up` while holding `q` but the writer).
    up: Mutex<Option<FrameWriter>>,
}

fn cost(f: &ClientFrame) -> usize {
    match f {
        ClientFrame::Pub(m) => m.payload.len() + m.subject.len() + 16,
        _ => 64,
    }
}

impl ShmTx {
    fn push(&self, f: &mut Option<ClientFrame>, bounded: bool) -> Result<bool, Error> {
        let mut q = self.q.lock();
        if let Some(why) = &q.lost {
            let _ = why;
            return Err(Error::NodeLost {
                node: self.node.clone(),
            });
        }
        if q.closed.is_some() {
            return Err(Error::Closed);
        }
        if bounded && q.bytes >= HIGH_WATER {
            return Ok(false);
        }
        let Some(f) = f.take() else {
            return Ok(true);
        };
        q.bytes += cost(&f);
        let wake = q.frames.is_empty();
        q.frames.push_back(Pending::Frame(f));
        drop(q);
        if wake {
            self.wake_writer.notify_one();
        }
        Ok(true)
    }

    /// Queues a frame, waiting while the queue is over its bound.
    pub(crate) async fn send(&self, f: ClientFrame) -> Result<(), Error> {
        let mut f = Some(f);
        loop {
            let n = self.space.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.push(&mut f, true)? {
                return Ok(());
            }
            n.await;
        }
    }

    /// Queues a frame that never waits.
    pub(crate) fn send_now(&self, f: ClientFrame) -> Result<(), Error> {
        self.push(&mut Some(f), false).map(|_| ())
    }

    /// Queues a publish if there is room now.
    pub(crate) fn try_publish(&self, msg: &Message) -> Option<Result<(), Error>> {
        if msg.payload.len() <= ENCODE_NOW {
            return self.try_encode(msg);
        }
        match self.push(&mut Some(ClientFrame::Pub(msg.clone())), true) {
            Ok(true) => Some(Ok(())),
            Ok(false) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Encodes a small publish into the ring's open segment or at the end
    /// of the queue's last run of encoded frames (or a new one) if there
    /// is room now.
    fn try_encode(&self, msg: &Message) -> Option<Result<(), Error>> {
        self.try_encode_with(
            pub_frame_len(msg),
            |seg| {
                let ok = encode_pub_into(seg, msg);
                debug_assert!(ok, "sized by pub_frame_len");
            },
            |run, n| {
                let at = run.len();
                run.resize(at + n, 0);
                let ok = encode_pub_into(&mut run[at..], msg);
                debug_assert!(ok, "sized by pub_frame_len");
            },
        )
    }

    /// Queues a bound publisher's publish of a small `payload` ([`PubHead`])
    /// if there is room now; `None`: take the frame path.
    pub(crate) fn try_publish_head(
        &self,
        head: &PubHead,
        payload: &[u8],
    ) -> Option<Result<(), Error>> {
        if payload.len() > ENCODE_NOW {
            return None;
        }
        // Appended, not written over a zero fill: the run's bytes are
        // written once (their lines were last read by the writer thread).
        self.try_encode_with(
            head.frame_len(payload.len()),
            |seg| {
                let ok = head.encode_into(seg, payload);
                debug_assert!(ok, "sized by frame_len");
            },
            |run, _| head.encode(run, payload),
        )
    }

    /// Writes a publish frame of `n` bytes if there is room now: when
    /// nothing is queued and the writer thread is not writing, straight
    /// into the ring's open segment with `direct(frame)` (the direct path:
    /// no run, no copy and no hand-off to the writer thread); else with
    /// `encode(run, n)` at the end of the queue's last run of encoded
    /// frames (or a new one).
    fn try_encode_with(
        &self,
        n: usize,
        direct: impl FnOnce(&mut [u8]),
        encode: impl FnOnce(&mut Vec<u8>, usize),
    ) -> Option<Result<(), Error>> {
        let mut q = self.q.lock();
        if q.lost.is_some() {
            return Some(Err(Error::NodeLost {
                node: self.node.clone(),
            }));
        }
        if q.closed.is_some() {
            return Some(Err(Error::Closed));
        }
        if q.bytes >= HIGH_WATER {
            return None;
        }
        // Nothing queued before it and the writer not writing (it holds
        // `up` while it writes a batch): the frame goes after everything
        // written so far, so order is kept.
        if q.frames.is_empty() {
            if let Some(mut up) = self.up.try_lock() {
                if let Some(w) = up.as_mut() {
                    let r = w.try_append(n, DIRECT_SEG, direct);
                    let open = w.open_len() > 0;
                    drop(up);
                    match r {
                        Ok(true) => {
                            let wake = open && !q.open && q.writer_waits;
                            q.open = open;
                            drop(q);
                            if wake {
                                self.wake_writer.notify_one();
                            }
                            return Some(Ok(()));
                        }
                        // No room now: the writer thread waits for it,
                        // the publisher too ([`ShmTx::wait_room`]).
                        Ok(false) => {
                            q.open = open;
                            q.need_room = true;
                            drop(q);
                            self.wake_writer.notify_one();
                            return None;
                        }
                        Err(e) => {
                            drop(q);
                            self.lose(&format!("writing to the node's ring failed: {e}"));
                            return Some(Err(Error::NodeLost {
                                node: self.node.clone(),
                            }));
                        }
                    }
                }
            } else if q.need_room {
                // The writer thread holds the ring while it waits for
                // room: wait for it too.
                return None;
            }
        }
        let wake = q.frames.is_empty();
        let run = match q.frames.back_mut() {
            Some(Pending::Encoded(v)) if v.len() + n <= RUN => v,
            _ => {
                let v = q
                    .spare
                    .pop()
                    .unwrap_or_else(|| Vec::with_capacity(RUN.min(n * 64)));
                q.frames.push_back(Pending::Encoded(v));
                match q.frames.back_mut() {
                    Some(Pending::Encoded(v)) => v,
                    _ => unreachable!("just pushed"),
                }
            }
        };
        let at = run.len();
        encode(run, n);
        debug_assert_eq!(run.len(), at + n, "sized by the caller");
        q.bytes += n;
        drop(q);
        if wake {
            self.wake_writer.notify_one();
        }
        Some(Ok(()))
    }

    /// After a publish found no room in the ring (`None` from a `try_`
    /// method): waits until the writer thread saw room come back, and
    /// returns `true` (try again); `false` at once when no publisher is
    /// waiting for room (take the frame path).
    pub(crate) async fn wait_room(&self) -> bool {
        let n = self.space.notified();
        tokio::pin!(n);
        n.as_mut().enable();
        {
            let q = self.q.lock();
            if !q.need_room || q.lost.is_some() || q.closed.is_some() {
                return false;
            }
        }
        n.await;
        true
    }

    /// The application closes the client: the writer flushes what is
    /// queued, closes the ring and the socket.
    pub(crate) fn close(&self) {
        let mut q = self.q.lock();
        q.closed.get_or_insert_with(Instant::now);
        drop(q);
        self.wake_writer.notify_one();
        self.space.notify_waiters();
    }

    fn is_closed(&self) -> bool {
        self.q.lock().closed.is_some()
    }

    /// The node is gone: nothing more is written.
    fn lose(&self, why: &str) {
        let mut q = self.q.lock();
        q.lost.get_or_insert_with(|| why.to_owned());
        q.frames.clear();
        drop(q);
        self.wake_writer.notify_one();
        self.space.notify_waiters();
    }
}

/// A client attached to a node over shared memory, not started yet: the
/// caller makes the client's state over [`Attached::tx`], then
/// [`Attached::start`]s the threads that move its frames.
#[derive(Debug)]
pub(crate) struct Attached {
    rings: ClientRings,
    tx: Arc<ShmTx>,
}

/// Attaches to the node at `locator` (`shm://name?dir=…`).
pub(crate) async fn attach(locator: &str) -> Result<Attached, Error> {
    let place = crate::shm::attach::parse(locator)?;
    use crate::shm::attach::Rendezvous;
    let rings = crate::shm::attach::client_rendezvous(&place)
        .await
        .map_err(|e| match e {
            Rendezvous::NoNode(source) => Error::Io {
                what: "no node serves shared memory under this name and dir= (start one with `skiff node --shm NAME`); connecting to its socket",
                source,
            },
            Rendezvous::Refused(reason) => Error::Refused {
                code: Code::Shutdown,
                reason,
            },
        })?;
    let tx = Arc::new(ShmTx {
        node: locator.to_owned(),
        ..ShmTx::default()
    });
    Ok(Attached { rings, tx })
}

impl Attached {
    /// The write side, for the client's link.
    pub(crate) fn tx(&self) -> Arc<ShmTx> {
        self.tx.clone()
    }

    /// The node's id for this client.
    pub(crate) fn client(&self) -> u64 {
        self.rings.client
    }

    /// The node's payload limit.
    pub(crate) fn max_payload(&self) -> u64 {
        self.rings.max_payload
    }

    /// Starts the writer and reader threads and the task that watches the
    /// rendezvous socket, for the client `inner`.
    pub(crate) fn start(self, inner: &Arc<Inner>) -> Result<(), Error> {
        let Attached { rings, tx } = self;
        let ClientRings {
            socket,
            up,
            down,
            down_lost,
            client,
            max_payload,
        } = rings;
        let handle = tokio::runtime::Handle::current();
        let (done_tx, mut done_rx) = tokio::sync::oneshot::channel::<()>();
        *tx.up.lock() = Some(up);
        {
            let tx = tx.clone();
            std::thread::Builder::new()
                .name(format!("skiff-shm-up-{client}"))
                .spawn(move || {
                    write_up(&tx);
                    let _ = done_tx.send(());
                })
                .map_err(Error::io("start the shm writer thread"))?;
        }
        {
            let (tx, weak) = (tx.clone(), Arc::downgrade(inner));
            let max = max_payload as usize;
            std::thread::Builder::new()
                .name(format!("skiff-shm-down-{client}"))
                .spawn(move || {
                    let _g = handle.enter();
                    read_down(down, weak, &tx, max);
                })
                .map_err(Error::io("start the shm reader thread"))?;
        }
        // The socket: its end is the node's end; it is closed once the
        // writer is done (the node then knows this client is gone).
        let watch = tx;
        tokio::spawn(async move {
            let mut socket = socket;
            let mut b = [0u8; 64];
            loop {
                tokio::select! {
                    r = socket.read(&mut b) => match r {
                        Ok(0) | Err(_) => {
                            watch.lose("the node closed its shm socket");
                            down_lost.mark_lost();
                            return;
                        }
                        Ok(_) => {}
                    },
                    _ = &mut done_rx => return,
                }
            }
        });
        Ok(())
    }
}

/// An item of a batch: a publish written in place, frame bytes encoded
/// into the scratch buffer, or whole frames of a run the publishers
/// encoded (`runs[k]`, copied from there into the ring: one copy).
enum Item {
    Pub(Message, usize),
    Enc(std::ops::Range<usize>),
    Run(usize, std::ops::Range<usize>),
}

impl Item {
    fn len(&self) -> usize {
        match self {
            Item::Pub(_, n) => *n,
            Item::Enc(r) | Item::Run(_, r) => r.len(),
        }
    }
}

/// Bytes in the open segment of the direct path (under `q`, which the
/// caller holds).
fn open_len(tx: &ShmTx) -> usize {
    tx.up.lock().as_ref().map_or(0, FrameWriter::open_len)
}

/// Publishes the open segment of the direct path (under `q`, which the
/// caller holds: no publisher appends meanwhile).
fn commit_open(tx: &ShmTx, q: &mut TxQ) -> Result<(), BufferError> {
    q.open = false;
    match tx.up.lock().as_mut() {
        Some(w) => w.commit_open(),
        None => Ok(()),
    }
}

/// The writer thread: batches of frames into ring segments until the
/// client closes (then the ring is closed after the last frame) or the
/// node is gone; and the publishers' open segment published once it has
/// lingered (see [`LINGER`]).
fn write_up(tx: &ShmTx) {
    let mut batch = VecDeque::new();
    let mut items: Vec<Item> = Vec::new();
    let mut scratch = Vec::new();
    let mut runs: Vec<Vec<u8>> = Vec::new();
    let max_seg = tx.up.lock().as_ref().map_or(0, FrameWriter::max_segment);
    let mut go = || {
        let q = tx.q.lock();
        q.lost.is_none() && q.closed.is_none_or(|t| t.elapsed() < CLOSE_GRACE)
    };
    // Whether the writer just woke from a sleep without a deadline (a
    // publish after a quiet spell: its open segment is published at once).
    let mut woke = false;
    loop {
        let mut w = {
            let mut q = tx.q.lock();
            let idle = |q: &TxQ| {
                q.frames.is_empty()
                    && !q.open
                    && !q.need_room
                    && q.closed.is_none()
                    && q.lost.is_none()
            };
            if q.frames.is_empty() && q.need_room && q.lost.is_none() {
                // Publishers wait for room: the ring is held (so none
                // queues meanwhile) until the node freed a segment's worth.
                let mut w = tx.up.lock();
                drop(q);
                let r = match w.as_mut() {
                    Some(w) => w.wait_room(DIRECT_SEG, &mut go),
                    None => Ok(()),
                };
                drop(w);
                tx.q.lock().need_room = false;
                tx.space.notify_waiters();
                match r {
                    Ok(()) | Err(BufferError::Timeout) => continue,
                    Err(e) => {
                        tx.lose(&format!("writing to the node's ring failed: {e}"));
                        break;
                    }
                }
            }
            if q.frames.is_empty() && q.open && q.lost.is_none() {
                let mut grew = false;
                if !woke && q.closed.is_none() {
                    // A publisher is filling the open segment: it
                    // publishes it when full; the tail is published here,
                    // once it stopped growing.
                    let before = open_len(tx);
                    tx.wake_writer.wait_for(&mut q, LINGER);
                    grew = q.open && open_len(tx) != before;
                }
                woke = false;
                if q.frames.is_empty() && q.open && !grew {
                    if let Err(e) = commit_open(tx, &mut q) {
                        drop(q);
                        tx.lose(&format!("writing to the node's ring failed: {e}"));
                        break;
                    }
                }
                continue;
            }
            if idle(&q) {
                let until = Instant::now() + WRITER_SPIN;
                while idle(&q) && Instant::now() < until {
                    parking_lot::MutexGuard::unlocked(&mut q, std::thread::yield_now);
                }
                while idle(&q) {
                    q.writer_waits = true;
                    tx.wake_writer.wait(&mut q);
                    q.writer_waits = false;
                }
                // The first publish after a quiet spell: its open segment
                // is published at once, not after a look.
                woke = true;
            }
            if q.frames.is_empty() && (q.open || q.need_room) && q.lost.is_none() {
                continue;
            }
            if q.lost.is_some() || q.frames.is_empty() {
                break;
            }
            // `up` before `q` is released: no publisher writes into the
            // ring until this batch is written (it commits the open
            // segment first).
            q.open = false;
            woke = false;
            let w = tx.up.lock();
            std::mem::swap(&mut q.frames, &mut batch);
            q.bytes = 0;
            // The runs written last time, emptied, for the next publishes.
            while q.spare.len() < SPARE_RUNS {
                let Some(mut v) = runs.pop() else { break };
                v.clear();
                q.spare.push(v);
            }
            w
        };
        let Some(wr) = w.as_mut() else { break };
        runs.clear();
        tx.space.notify_waiters();
        for f in batch.drain(..) {
            match f {
                Pending::Frame(ClientFrame::Pub(m)) => {
                    let n = pub_frame_len(&m);
                    items.push(Item::Pub(m, n));
                }
                Pending::Frame(other) => {
                    let s = scratch.len();
                    other.encode(&mut scratch);
                    items.push(Item::Enc(s..scratch.len()));
                }
                Pending::Encoded(v) => {
                    // Whole frames, cut to fit segments.
                    let k = runs.len();
                    let mut at = 0;
                    while at < v.len() {
                        let end = crate::shm::attach::whole_frames(&v, at, max_seg);
                        debug_assert!(end > at, "frames encoded here are whole");
                        if end == at {
                            break;
                        }
                        items.push(Item::Run(k, at..end));
                        at = end;
                    }
                    runs.push(v);
                }
            }
        }
        let mut i = 0;
        let mut failed = None;
        while i < items.len() {
            let mut total = 0;
            let mut j = i;
            while j < items.len() && (j == i || total + items[j].len() <= max_seg) {
                total += items[j].len();
                j += 1;
            }
            let run = &items[i..j];
            let r = wr.write(total, &mut go, |buf| {
                let mut at = 0;
                for it in run {
                    let n = it.len();
                    match it {
                        Item::Pub(m, _) => {
                            let ok = encode_pub_into(&mut buf[at..at + n], m);
                            debug_assert!(ok, "sized by pub_frame_len");
                        }
                        Item::Enc(r) => buf[at..at + n].copy_from_slice(&scratch[r.clone()]),
                        Item::Run(k, r) => buf[at..at + n].copy_from_slice(&runs[*k][r.clone()]),
                    }
                    at += n;
                }
            });
            if let Err(e) = r {
                failed = Some(e);
                break;
            }
            i = j;
        }
        drop(w);
        items.clear();
        // Kept until the next batch is taken, to be given back then.
        runs.truncate(SPARE_RUNS);
        scratch.clear();
        if scratch.capacity() > 4 << 20 {
            scratch = Vec::new();
        }
        if let Some(e) = failed {
            tx.lose(&format!("writing to the node's ring failed: {e}"));
            break;
        }
    }
    // Closed (or lost): the node reads what was written (the open
    // segment's frames too), then ends.
    if let Some(mut w) = tx.up.lock().take() {
        w.close();
    }
}

/// How the reader thread ended.
enum End {
    Closed,
    Fatal(String),
    Lost(String),
    /// A frame this client cannot read.
    BadFrame(String),
}

/// The reader thread: segments copied out, frames decoded and dispatched.
fn read_down(mut r: DownReader, weak: Weak<Inner>, tx: &ShmTx, max_payload: usize) {
    let dec = Decoder::new(max_payload + FRAME_OVERHEAD);
    let mut frames = Vec::new();
    let end = loop {
        let mut seg = Vec::new();
        match r.next(&mut seg) {
            Ok(false) => continue,
            Ok(true) => {}
            Err(BufferError::Closed { .. }) if tx.is_closed() => break End::Closed,
            Err(BufferError::Closed { .. }) => {
                break End::Lost("the node closed the connection".into())
            }
            Err(e) => break End::Lost(format!("the node is gone: {e}")),
        }
        let mut rest = Bytes::from(seg);
        let mut bad = None;
        loop {
            match dec.split(&mut rest) {
                Ok(Some(body)) => match ServerFrame::decode(body, max_payload) {
                    Ok(ServerFrame::Welcome { .. }) => {}
                    Ok(f) => frames.push(f),
                    Err(e) => {
                        bad = Some(e);
                        break;
                    }
                },
                Ok(None) => break,
                Err(e) => {
                    bad = Some(e);
                    break;
                }
            }
        }
        if !frames.is_empty() {
            let Some(inner) = weak.upgrade() else {
                break End::Closed;
            };
            match inner.dispatch(frames.drain(..)) {
                None => {}
                Some((_, why)) => break End::Fatal(why),
            }
        }
        if let Some(e) = bad {
            break End::BadFrame(format!("bad frame from the node: {e}"));
        }
    };
    match end {
        End::Closed => {
            if let Some(inner) = weak.upgrade() {
                inner.shut(None);
            }
        }
        End::Fatal(why) | End::Lost(why) => {
            tx.lose(&why);
            if let Some(inner) = weak.upgrade() {
                inner.fail(why);
            }
        }
        End::BadFrame(why) => {
            tx.lose(&why);
            if let Some(inner) = weak.upgrade() {
                inner.fail_with(Code::Protocol, why);
            }
        }
    }
}
