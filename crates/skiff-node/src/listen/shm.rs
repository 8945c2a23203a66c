//! The node's `shm://name` listener: clients on the node's host attach
//! over a pair of shared-memory rings (`skiff::shm::host` holds the
//! rendezvous and the rings' side; this is the broker's), and publish
//! without a copy between client and node.
//!
//! Per client, two threads and a task:
//! - the **reader** waits on the client→node ring's futex, takes each
//!   segment as a `bytes::Bytes` that points into the mapping (its owner
//!   holds the mapping and a place in an in-order release queue), and
//!   feeds it to the client's [`Session`] as the socket listener feeds its
//!   read buffer: frames split with the bounded `Decoder::split`, runs of
//!   publishes as `Published { raw, .. }` whose `raw` is that slice of the
//!   ring. The
//!   broker fans the same bytes out by reference count. When the last
//!   `Bytes` of a segment and of every segment before it is dropped, the
//!   reader returns the space with `consume` (a dropping thread wakes it
//!   through the ring's futex);
//! - the **writer** takes what the broker queued for the client (the
//!   outbox's `next_encoded`, as a socket writer does) and copies it into
//!   the node→client ring in segments of whole frames: one copy, where a
//!   socket write would make the kernel's;
//! - a tokio task watches the rendezvous socket: its end (the client
//!   closed or died) marks the client's ring lost, which ends the reader
//!   after what was published; the reader then detaches the client.
//!
//! Bounded everywhere: each ring is fixed (credits: a full ring blocks its
//! producer); segments are taken one at a time; frames are checked against
//! the payload limit before anything is handed on; a segment that is not
//! in one piece (only a misbehaving client sends one) is copied and
//! counted. Anything from shared memory is hostile: a bad frame closes that
//! client with an error frame, never the node.
//!
//! The payload bytes stay in the client's mapping while subscribers' queues
//! hold them: a client that rewrites its ring after publishing can change
//! only what its own messages say (their lengths are fixed by the `Bytes`,
//! and every later decoding is bounded), and holding them back-pressures
//! that client once its ring is full of unreleased messages.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use skiff::shm::host::{self, Hello, HostReader, HostSocket, HostWriter, Rendezvous};
use skiff::shm::BufferError;
use skiff_proto::client_frame::{Code, FRAME_OVERHEAD};
use tokio::runtime::Handle;

use super::shm_topic::{self, TopicPlace, TopicStats, Topics};
use crate::broker::Broker;
use crate::outbox::ClientOut;
use crate::session::Session;

/// Counters of an [`ShmListener`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShmStats {
    /// Clients attached so far.
    pub attached: u64,
    /// Rendezvous refused or failed (bad lines, bad ring files, limits).
    pub refused: u64,
    /// Clients detached so far (closed, died or closed for an error).
    pub detached: u64,
    /// Client→node data segments read.
    pub segments: u64,
    /// Frames read from them.
    pub frames: u64,
    /// Data segments read in place (their frames point into the ring).
    pub in_place: u64,
    /// Data segments that were not in one piece and were copied (a
    /// well-behaved client never sends one).
    pub copied: u64,
    /// Clients closed for a bad frame or a corrupt ring.
    pub protocol_errors: u64,
}

#[derive(Debug, Default)]
struct Counters {
    attached: AtomicU64,
    refused: AtomicU64,
    detached: AtomicU64,
    segments: AtomicU64,
    frames: Arc<AtomicU64>,
    in_place: AtomicU64,
    copied: AtomicU64,
    protocol_errors: AtomicU64,
}

#[derive(Debug, Default)]
struct Shared {
    c: Counters,
    /// The buffers of topics for the host's subscribers.
    topics: Arc<Topics>,
    /// The data areas of the attached clients' rings as mapped here (by
    /// client id).
    rings: Mutex<Vec<(u64, Range<usize>)>>,
    seq: AtomicU64,
}

/// A node's `shm://name` listener (see the module doc); stops accepting
/// when dropped (attached clients go on until they detach).
#[derive(Debug)]
pub struct ShmListener {
    dir: PathBuf,
    socket: PathBuf,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl ShmListener {
    /// Starts `broker`'s listener for `shm://name` clients (options `dir=`,
    /// the ring directory, default as for `skiff::shm::Output`; `ring=4M`,
    /// the node→client ring's size; `spin=`). Must be called within a
    /// tokio runtime. A stale socket of a previous run is replaced.
    pub fn start(broker: Arc<Broker>, locator: &str) -> Result<ShmListener, BufferError> {
        let handle = Handle::try_current().map_err(|e| BufferError::Io {
            what: "start the shm listener (needs a tokio runtime)",
            source: std::io::Error::other(e),
        })?;
        let _guard = handle.enter();
        let sock = HostSocket::bind(locator)?;
        let spin = sock.spin();
        let (dir, socket) = (sock.dir().to_owned(), sock.socket().to_owned());
        let place = TopicPlace {
            dir: dir.clone(),
            ring: sock.ring_size(),
            spin,
        };
        let shared = Arc::new(Shared::default());
        let task = handle.spawn(accept(sock, broker, spin, shared.clone(), place));
        Ok(ShmListener {
            dir,
            socket,
            shared,
            task,
        })
    }

    /// The attachment directory (`dir/name`), where the node's socket is.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The counters so far.
    pub fn stats(&self) -> ShmStats {
        let c = &self.shared.c;
        ShmStats {
            attached: c.attached.load(Relaxed),
            refused: c.refused.load(Relaxed),
            detached: c.detached.load(Relaxed),
            segments: c.segments.load(Relaxed),
            frames: c.frames.load(Relaxed),
            in_place: c.in_place.load(Relaxed),
            copied: c.copied.load(Relaxed),
            protocol_errors: c.protocol_errors.load(Relaxed),
        }
    }

    /// The counters of the topic buffers (see [`shm_topic`]).
    pub fn topic_stats(&self) -> TopicStats {
        self.shared.topics.stats()
    }

    /// Whether `addr` lies in the data area of an attached client's ring
    /// as this process maps it (diagnostics and tests: a payload at such an
    /// address reached the broker without a copy).
    pub fn in_client_ring(&self, addr: usize) -> bool {
        self.shared
            .rings
            .lock()
            .iter()
            .any(|(_, r)| r.contains(&addr))
    }
}

impl Drop for ShmListener {
    fn drop(&mut self) {
        self.task.abort();
        host::unbind(&self.socket);
    }
}

async fn accept(
    sock: HostSocket,
    broker: Arc<Broker>,
    spin: Duration,
    shared: Arc<Shared>,
    place: TopicPlace,
) {
    loop {
        match sock.accept().await {
            Ok(r) => {
                tokio::spawn(route(
                    r,
                    broker.clone(),
                    spin,
                    shared.clone(),
                    place.clone(),
                ));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// A connection to the socket: a client attaching, or a subscriber asking
/// for a topic's buffer.
async fn route(
    mut r: Rendezvous,
    broker: Arc<Broker>,
    spin: Duration,
    shared: Arc<Shared>,
    place: TopicPlace,
) {
    match r.hello().await {
        Ok(Hello::Client) => attach_one(r, broker, spin, shared).await,
        Ok(Hello::Topic(ask)) => {
            let topics = shared.topics.clone();
            shm_topic::serve(r, ask, broker, topics, place).await
        }
        Err(why) => {
            shared.c.refused.fetch_add(1, Relaxed);
            r.refuse(&why).await;
        }
    }
}

async fn attach_one(r: Rendezvous, broker: Arc<Broker>, spin: Duration, shared: Arc<Shared>) {
    let peer = format!("shm:{}", r.pid().unwrap_or(0));
    let max_payload = broker.limits().max_payload as u64;
    let max_frame = max_payload + FRAME_OVERHEAD as u64;
    let seq = shared.seq.fetch_add(1, Relaxed);
    // Shared memory carries no credentials: with authentication on, the
    // client is the user its uid or gid maps to, or it is refused.
    let user = match r.peer_ids() {
        Some((uid, gid)) => broker.auth().local_user(uid, gid),
        None => broker.auth().local_user(u32::MAX, u32::MAX),
    };
    if user.is_none() {
        broker.auth().count_failure();
    }
    let mut out = None;
    let attached = r
        .run(seq, max_payload, max_frame, || {
            let user = user.ok_or_else(|| crate::auth::AuthError::Refused.to_string())?;
            let o = broker.attach_as(peer, user).map_err(|f| f.text)?;
            let id = o.id;
            out = Some(o);
            Ok(id)
        })
        .await;
    let (a, out) = match (attached, out) {
        (Ok(a), Some(out)) => (a, out),
        (r, _) => {
            if let Err(e) = r {
                if let Some(id) = e.attached {
                    broker.detach(id, None);
                }
            }
            shared.c.refused.fetch_add(1, Relaxed);
            return;
        }
    };
    shared.c.attached.fetch_add(1, Relaxed);
    // Its publishes are slices of its ring: the mesh splices them.
    out.set_ring_input();
    let id = out.id;
    shared.rings.lock().push((id, a.up.data_range()));
    let gone = Arc::new(AtomicBool::new(false));
    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel::<()>();
    let handle = Handle::current();
    {
        let (out, gone, handle) = (out.clone(), gone.clone(), handle.clone());
        let down = a.down;
        let spawned = std::thread::Builder::new()
            .name(format!("skiff-shm-out-{id}"))
            .spawn(move || {
                write_down(down, out, handle, gone);
                let _ = done_tx.send(());
            });
        if spawned.is_err() {
            broker.detach(id, Some((Code::Limit, "no thread for this client".into())));
            return;
        }
    }
    {
        let (b, shared) = (broker.clone(), shared.clone());
        let up = a.up;
        let spawned = std::thread::Builder::new()
            .name(format!("skiff-shm-in-{id}"))
            .spawn(move || read_up(up, b, out, handle, shared, spin));
        if spawned.is_err() {
            broker.detach(id, Some((Code::Limit, "no thread for this client".into())));
            return;
        }
    }
    // The socket carries nothing more: its end is the client's end. It is
    // held until the writer is done, so the client reads everything sent.
    let mut watch = a.watch;
    tokio::select! {
        _ = watch.closed() => gone.store(true, Relaxed),
        _ = &mut done_rx => {}
    }
}

/// The reader thread: segments in, through the client's session to the
/// broker, space back in order; detaches the client at the end.
fn read_up(
    mut up: HostReader,
    broker: Arc<Broker>,
    out: Arc<ClientOut>,
    handle: Handle,
    shared: Arc<Shared>,
    spin: Duration,
) {
    let mut session =
        Session::new(&broker.limits(), "client").count_frames_into(shared.c.frames.clone());
    let c = &shared.c;
    let error: Option<(Code, String)> = loop {
        let seg = match up.next(spin, &|| out.is_closed()) {
            Ok(Some(seg)) => seg,
            Ok(None) => break None,
            // The client closed its ring (everything was read), died, or
            // its socket ended.
            Err(
                BufferError::Closed { .. }
                | BufferError::PeerDead { .. }
                | BufferError::PeerLost { .. },
            ) => break None,
            Err(e) => {
                broker.protocol_error();
                c.protocol_errors.fetch_add(1, Relaxed);
                break Some((
                    Code::Protocol,
                    format!("protocol error, closing this client: {e}"),
                ));
            }
        };
        c.segments.fetch_add(1, Relaxed);
        c.in_place.fetch_add(u64::from(seg.in_place), Relaxed);
        c.copied.fetch_add(u64::from(!seg.in_place), Relaxed);
        let mut rest = seg.bytes;
        // One entry into the runtime per segment, for all its frames.
        if let Err(e) = handle.block_on(super::feed(&broker, &out, &mut session, &mut rest)) {
            c.protocol_errors.fetch_add(1, Relaxed);
            break Some(e);
        }
        // The broker took every publish of the segment: say so, once per
        // segment, to a client that asked (`Confirm`: one that fails over).
        out.confirm_taken(session.publishes());
    };
    broker.detach(out.id, error);
    shared.c.detached.fetch_add(1, Relaxed);
    shared.rings.lock().retain(|(id, _)| *id != out.id);
    up.finish();
}

/// The writer thread: what the broker queued for the client, copied into
/// the node→client ring in segments of whole frames.
fn write_down(mut w: HostWriter, out: Arc<ClientOut>, handle: Handle, gone: Arc<AtomicBool>) {
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut go = || !gone.load(Relaxed);
    while handle.block_on(out.next_encoded(&mut buf)) {
        if w.write_frames(&buf, &mut go).is_err() {
            break;
        }
        buf.clear();
        if buf.capacity() > 4 << 20 {
            buf = Vec::with_capacity(64 * 1024);
        }
    }
    w.close();
}
