//! The node's `shm://name` listener: clients on the node's host attach
//! over a pair of shared-memory rings (see `attach.rs` for the
//! rendezvous), and publish without a copy between client and node.
//!
//! Per client, two threads and a task:
//! - the **reader** waits on the client→node ring's futex, takes each
//!   segment as a `bytes::Bytes` that points into the mapping (its owner
//!   holds the mapping and a place in an in-order release queue), splits
//!   it into frames with the bounded `Decoder::split` and hands them to the
//!   broker exactly as the socket listener does: runs of publishes as
//!   `Published { raw, .. }` whose `raw` is that slice of the ring. The
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

use std::collections::VecDeque;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use skiff_node::broker::{Broker, Published};
use skiff_node::frame::{is_pub, ClientFrame, Code, Decoder, FRAME_OVERHEAD};
use skiff_node::{ClientOut, Node};
use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::runtime::Handle;

use super::attach::{self, FrameWriter, Place, DOWN, HELLO, UP};
use super::ring::{Ring, RingConsumer};
use super::BufferError;

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
    frames: AtomicU64,
    in_place: AtomicU64,
    copied: AtomicU64,
    protocol_errors: AtomicU64,
}

#[derive(Debug, Default)]
struct Shared {
    c: Counters,
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
        let _ = std::fs::remove_file(&self.socket);
        // The name's directory too, once nothing else is in it (a client
        // still attaching keeps it; `remove_dir` refuses a full one).
        if let Some(dir) = self.socket.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Starts `node`'s listener for `shm://name` clients (options `dir=`, the
/// ring directory, default as for [`super::Output`]; `ring=4M`, the
/// node→client ring's size; `spin=`). Must be called within a tokio
/// runtime. A stale socket of a previous run is replaced.
pub fn serve(node: &Node, locator: &str) -> Result<ShmListener, BufferError> {
    serve_broker(node.broker().clone(), locator)
}

/// [`serve`] for a broker.
pub fn serve_broker(broker: Arc<Broker>, locator: &str) -> Result<ShmListener, BufferError> {
    let place = attach::parse(locator)?;
    let handle = Handle::try_current().map_err(|e| BufferError::Io {
        what: "start the shm listener (needs a tokio runtime)",
        source: std::io::Error::other(e),
    })?;
    std::fs::create_dir_all(&place.dir).map_err(BufferError::io("create shm directory"))?;
    let socket = place.dir.join(attach::SOCKET);
    if std::fs::symlink_metadata(&socket).is_ok_and(|m| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_socket()
    }) {
        let _ = std::fs::remove_file(&socket);
    }
    let _guard = handle.enter();
    let l = UnixListener::bind(&socket).map_err(BufferError::io("bind the node's shm socket"))?;
    let shared = Arc::new(Shared::default());
    let task = handle.spawn(accept(l, broker, place.clone(), shared.clone()));
    Ok(ShmListener {
        dir: place.dir,
        socket,
        shared,
        task,
    })
}

async fn accept(l: UnixListener, broker: Arc<Broker>, place: Place, shared: Arc<Shared>) {
    loop {
        match l.accept().await {
            Ok((s, _)) => {
                tokio::spawn(attach_one(s, broker.clone(), place.clone(), shared.clone()));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// What the rendezvous produced.
struct Attached {
    up: RingConsumer,
    down: FrameWriter,
    out: Arc<ClientOut>,
}

async fn attach_one(s: UnixStream, broker: Arc<Broker>, place: Place, shared: Arc<Shared>) {
    let pid = s.peer_cred().ok().and_then(|c| c.pid()).map(|p| p as u32);
    let mut s = BufReader::new(s);
    let mut files = Vec::new();
    let r = tokio::time::timeout(
        attach::HANDSHAKE,
        rendezvous(&mut s, &broker, &place, &shared, pid, &mut files),
    )
    .await
    .unwrap_or_else(|_| Err("the rendezvous took too long".into()));
    for f in &files {
        let _ = std::fs::remove_file(f);
    }
    let a = match r {
        Ok(a) => a,
        Err(why) => {
            shared.c.refused.fetch_add(1, Relaxed);
            let _ = attach::write_line(s.get_mut(), &format!("ERR {why}")).await;
            return;
        }
    };
    shared.c.attached.fetch_add(1, Relaxed);
    let id = a.out.id;
    let up_ring = Arc::clone(&a.up.ring);
    shared.rings.lock().push((id, attach::data_range(&up_ring)));
    let gone = Arc::new(AtomicBool::new(false));
    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel::<()>();
    let handle = Handle::current();
    {
        let (out, gone, handle) = (a.out.clone(), gone.clone(), handle.clone());
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
        let (b, shared, spin) = (broker.clone(), shared.clone(), place.spin);
        let (up, out) = (a.up, a.out);
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
    let mut b = [0u8; 64];
    loop {
        tokio::select! {
            r = s.read(&mut b) => match r {
                Ok(0) | Err(_) => {
                    gone.store(true, Relaxed);
                    attach::mark_lost(&up_ring);
                    break;
                }
                Ok(_) => {}
            },
            _ = &mut done_rx => break,
        }
    }
}

async fn rendezvous(
    s: &mut BufReader<UnixStream>,
    broker: &Broker,
    place: &Place,
    shared: &Shared,
    pid: Option<u32>,
    files: &mut Vec<PathBuf>,
) -> Result<Attached, String> {
    let hello = attach::read_line(s).await.map_err(|e| e.to_string())?;
    if hello != HELLO {
        return Err(format!("expected {HELLO:?}"));
    }
    let max_payload = broker.limits().max_payload as u64;
    let max_frame = max_payload + FRAME_OVERHEAD as u64;
    let n = shared.seq.fetch_add(1, Relaxed);
    let down_name = format!("n{}-{n}.down", std::process::id());
    let cap = attach::capacity(place.ring, max_frame);
    let (down, path) =
        attach::create_ring(&place.dir, &down_name, cap, DOWN).map_err(|e| e.to_string())?;
    files.push(path);
    attach::write_line(s.get_mut(), &format!("RING {down_name} {max_frame}"))
        .await
        .map_err(|e| e.to_string())?;
    let line = attach::read_line(s).await.map_err(|e| e.to_string())?;
    let up_name = line
        .strip_prefix("RING ")
        .filter(|n| n.ends_with(".up"))
        .ok_or("expected RING <name>.up")?;
    files.push(place.dir.join(up_name));
    let up = attach::open_peer_ring(&place.dir, up_name, UP).map_err(|e| e.to_string())?;
    if pid.is_some_and(|p| p != up.producer.0) {
        return Err(format!(
            "the ring was made by process {}, not by the client",
            up.producer.0
        ));
    }
    let up = RingConsumer::attach(up).map_err(|e| e.to_string())?;
    let peer = format!("shm:{}", pid.unwrap_or(0));
    let out = broker.attach(peer).map_err(|f| f.text)?;
    attach::write_line(s.get_mut(), &format!("OK {} {max_payload}", out.id))
        .await
        .map_err(|e| {
            broker.detach(out.id, None);
            e.to_string()
        })?;
    Ok(Attached {
        up,
        down: FrameWriter::new(down, place.spin),
        out,
    })
}

/// Segments of the client's ring still referred to, oldest first: their
/// lengths and whether every `Bytes` of each was dropped. Space goes back
/// to the client in ring order, so only a released prefix is consumed.
#[derive(Debug, Default)]
struct Release {
    q: Mutex<ReleaseQ>,
}

#[derive(Debug, Default)]
struct ReleaseQ {
    /// Index of `held[0]`.
    base: u64,
    held: VecDeque<(u64, bool)>,
    /// Bytes of the released prefix, not yet consumed.
    free: u64,
    /// The reader is gone: whoever releases last drops the consumer (its
    /// slot keeps the client from writing over bytes still referred to).
    retired: Option<RingConsumer>,
}

impl Release {
    fn push(&self, len: u64) -> u64 {
        let mut q = self.q.lock();
        q.held.push_back((len, false));
        q.base + q.held.len() as u64 - 1
    }

    /// Marks segment `idx` released; whether the released prefix grew.
    fn done(&self, idx: u64) -> bool {
        let mut q = self.q.lock();
        let Some(i) = idx.checked_sub(q.base) else {
            return false;
        };
        if let Some(e) = q.held.get_mut(i as usize) {
            e.1 = true;
        }
        let mut grew = false;
        while q.held.front().is_some_and(|e| e.1) {
            let (len, _) = q.held.pop_front().expect("checked");
            q.base += 1;
            q.free += len;
            grew = true;
        }
        if q.held.is_empty() {
            // The last reference to the retired reader's ring: detach.
            drop(q.retired.take());
        }
        grew
    }

    /// Bytes released and not yet consumed.
    fn take(&self) -> u64 {
        std::mem::take(&mut self.q.lock().free)
    }

    fn ready(&self) -> bool {
        self.q.lock().free > 0
    }

    /// The reader ends: keeps `cons` attached while bytes are referred to.
    fn retire(&self, cons: RingConsumer) {
        let mut q = self.q.lock();
        if !q.held.is_empty() {
            q.retired = Some(cons);
        }
    }
}

/// The owner of a segment's `Bytes`: the pinned mapping and the segment's
/// place in the release queue.
struct SegOwner {
    bytes: super::ring::Pinned,
    idx: u64,
    release: Arc<Release>,
    ring: Arc<Ring>,
}

impl AsRef<[u8]> for SegOwner {
    fn as_ref(&self) -> &[u8] {
        self.bytes.as_ref()
    }
}

impl Drop for SegOwner {
    fn drop(&mut self) {
        if self.release.done(self.idx) {
            // The reader may sleep on the ring's futex: let it consume.
            self.ring.poke_data();
        }
    }
}

/// The reader thread: segments in, frames to the broker, space back in
/// order; detaches the client at the end.
fn read_up(
    mut cons: RingConsumer,
    broker: Arc<Broker>,
    out: Arc<ClientOut>,
    handle: Handle,
    shared: Arc<Shared>,
    spin: Duration,
) {
    let release = Arc::new(Release::default());
    let ring = Arc::clone(&cons.ring);
    let max_payload = broker.limits().max_payload;
    let dec = Decoder::new(max_payload + FRAME_OVERHEAD);
    let mut pubs: Vec<Published> = Vec::new();
    let c = &shared.c;
    let error: Option<(Code, String)> = 'read: loop {
        let free = release.take();
        if free > 0 {
            if let Err(e) = cons.consume(free) {
                break Some(protocol(&broker, c, e.to_string()));
            }
        }
        if out.is_closed() {
            break None;
        }
        let d = match cons.next_or(None, spin, attach::IDLE_CHECK, || {
            release.ready() || out.is_closed()
        }) {
            Ok(Some(d)) => d,
            Ok(None) => continue,
            // The client closed its ring (everything was read), died, or
            // its socket ended.
            Err(
                BufferError::Closed { .. }
                | BufferError::PeerDead { .. }
                | BufferError::PeerLost { .. },
            ) => break None,
            Err(e) => break Some(protocol(&broker, c, e.to_string())),
        };
        // SAFETY: the segment is consumed only once its release-queue
        // entry and every earlier one are done, which happens when the
        // last `Bytes` made from this `Pinned` (owned by `SegOwner`) is
        // dropped; until then the consumer slot stays attached (`retire`).
        let pinned = unsafe { cons.pin(d.start, d.len) };
        let in_place = pinned.is_some();
        let seg = match pinned {
            Some(p) => {
                let idx = release.push(d.len);
                Bytes::from_owner(SegOwner {
                    bytes: p,
                    idx,
                    release: release.clone(),
                    ring: ring.clone(),
                })
            }
            None => {
                let mut v = Vec::new();
                cons.copy(d.seg, d.start, d.len, &mut v);
                // Released now, but in ring order: after the segments
                // before it (consuming moves one position).
                let idx = release.push(d.len);
                release.done(idx);
                if !attach::is_pad(&v) {
                    c.copied.fetch_add(1, Relaxed);
                }
                Bytes::from(v)
            }
        };
        if attach::is_pad(&seg) {
            continue;
        }
        c.segments.fetch_add(1, Relaxed);
        c.in_place.fetch_add(u64::from(in_place), Relaxed);
        let mut rest = seg;
        loop {
            let body = match dec.split(&mut rest) {
                Ok(Some(b)) => b,
                Ok(None) => break,
                Err(e) => {
                    handle.block_on(broker.publish_batch(&out, &mut pubs));
                    break 'read Some(protocol(&broker, c, e.to_string()));
                }
            };
            c.frames.fetch_add(1, Relaxed);
            if is_pub(&body) {
                match Published::from_frame(body, max_payload) {
                    Ok(p) => pubs.push(p),
                    Err(e) => {
                        handle.block_on(broker.publish_batch(&out, &mut pubs));
                        break 'read Some(protocol(&broker, c, e.to_string()));
                    }
                }
                continue;
            }
            let frame = match ClientFrame::decode(body, max_payload) {
                Ok(f) => f,
                Err(e) => {
                    handle.block_on(broker.publish_batch(&out, &mut pubs));
                    break 'read Some(protocol(&broker, c, e.to_string()));
                }
            };
            let r = handle.block_on(async {
                broker.publish_batch(&out, &mut pubs).await;
                broker.handle(&out, frame).await
            });
            if let Err(f) = r {
                broker.protocol_error();
                c.protocol_errors.fetch_add(1, Relaxed);
                break 'read Some((f.code, f.text));
            }
        }
        if !pubs.is_empty() {
            handle.block_on(broker.publish_batch(&out, &mut pubs));
        }
    };
    broker.detach(out.id, error);
    shared.c.detached.fetch_add(1, Relaxed);
    shared.rings.lock().retain(|(id, _)| *id != out.id);
    // Tell a live client that nothing more is read (it also sees the
    // socket close once the writer is done).
    if ring.state() == super::layout::OPEN {
        ring.close(super::layout::CLOSED);
    }
    release.retire(cons);
}

fn protocol(broker: &Broker, c: &Counters, why: String) -> (Code, String) {
    broker.protocol_error();
    c.protocol_errors.fetch_add(1, Relaxed);
    (
        Code::Protocol,
        format!("protocol error, closing this client: {why}"),
    )
}

/// The writer thread: what the broker queued for the client, copied into
/// the node→client ring in segments of whole frames.
fn write_down(mut w: FrameWriter, out: Arc<ClientOut>, handle: Handle, gone: Arc<AtomicBool>) {
    let mut buf = Vec::with_capacity(64 * 1024);
    let max_seg = w.max_segment();
    let mut go = || !gone.load(Relaxed);
    'out: while handle.block_on(out.next_encoded(&mut buf)) {
        let mut at = 0;
        while at < buf.len() {
            // Whole frames (the broker encoded them) up to a segment.
            let mut end = at;
            while end + 4 <= buf.len() {
                let len = u32::from_le_bytes(buf[end..end + 4].try_into().expect("4 bytes"));
                let next = end + 4 + len as usize;
                if next > buf.len() || (end > at && next - at > max_seg) {
                    break;
                }
                end = next;
            }
            if end == at {
                break;
            }
            let chunk = &buf[at..end];
            if w.write(chunk.len(), &mut go, |s| s.copy_from_slice(chunk))
                .is_err()
            {
                break 'out;
            }
            at = end;
        }
        buf.clear();
        if buf.capacity() > 4 << 20 {
            buf = Vec::with_capacity(64 * 1024);
        }
    }
    // A live client reads what was written, then learns that the node
    // is done with it.
    w.close();
}
