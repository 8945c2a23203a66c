//! The host's side of an `shm://name` attachment, without the node: the
//! rendezvous socket, the client→node ring read as `Bytes` that point into
//! the mapping, and the node→client ring written in whole frames. The
//! node's listener (in `skiff-node`) drives these with its broker.
//!
//! - [`HostSocket`] binds `dir/name/node.sock`; [`HostSocket::accept`]
//!   gives a [`Rendezvous`], whose [`Rendezvous::run`] makes the
//!   node→client ring, maps the client's ring and asks the caller to attach
//!   the client (its id goes back in the `OK` line).
//! - [`HostReader`] hands out the client's segments in ring order. A
//!   segment read in place is a `Bytes` over the mapping; its space goes
//!   back to the client once the last `Bytes` of it and of every segment
//!   before it is dropped (a dropping thread wakes the reader through the
//!   ring's futex).
//! - [`HostWriter`] copies encoded frames into the node→client ring, whole
//!   frames per segment.
//! - [`PeerWatch`]: the rendezvous socket carries nothing more; its end is
//!   the client's end, which marks the client's ring lost.

use std::collections::VecDeque;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use super::attach::{self, FrameWriter, Place, DOWN, HELLO, UP};
use super::ring::{Ring, RingConsumer};
use super::BufferError;

/// A node's bound `shm://name` rendezvous socket.
#[derive(Debug)]
pub struct HostSocket {
    listener: UnixListener,
    place: Place,
    socket: PathBuf,
}

impl HostSocket {
    /// Binds the rendezvous socket of `locator` (`shm://name`, options
    /// `dir=`, `ring=`, `spin=`), replacing a stale socket of an earlier
    /// run. Must be called within a tokio runtime.
    pub fn bind(locator: &str) -> Result<HostSocket, BufferError> {
        let place = attach::parse(locator)?;
        std::fs::create_dir_all(&place.dir).map_err(BufferError::io("create shm directory"))?;
        let socket = place.dir.join(attach::SOCKET);
        if std::fs::symlink_metadata(&socket).is_ok_and(|m| {
            use std::os::unix::fs::FileTypeExt;
            m.file_type().is_socket()
        }) {
            let _ = std::fs::remove_file(&socket);
        }
        let listener =
            UnixListener::bind(&socket).map_err(BufferError::io("bind the node's shm socket"))?;
        Ok(HostSocket {
            listener,
            place,
            socket,
        })
    }

    /// The attachment directory (`dir/name`), where the socket is.
    pub fn dir(&self) -> &Path {
        &self.place.dir
    }

    /// How long a client's reader busy-polls before it sleeps (`spin=`).
    pub fn spin(&self) -> Duration {
        self.place.spin
    }

    /// The ring size clients ask for by default (`ring=`).
    pub fn ring_size(&self) -> u64 {
        self.place.ring
    }

    /// The socket's path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Waits for the next client.
    pub async fn accept(&self) -> io::Result<Rendezvous> {
        let (s, _) = self.listener.accept().await?;
        let cred = s.peer_cred().ok();
        let pid = cred.and_then(|c| c.pid()).map(|p| p as u32);
        Ok(Rendezvous {
            s: BufReader::new(s),
            pid,
            ids: cred.map(|c| (c.uid(), c.gid())),
            place: self.place.clone(),
            greeted: false,
        })
    }
}

/// Checks a node's `shm://name?…` locator (name and options) without
/// creating anything, so that a node can refuse a bad one before it starts.
pub fn check_locator(locator: &str) -> Result<(), crate::LocatorError> {
    super::attach::parse(locator).map(|_| ())
}

/// Removes a node's rendezvous socket and, once nothing else is in it, its
/// directory (a client still attaching keeps it).
pub fn unbind(socket: &Path) {
    let _ = std::fs::remove_file(socket);
    if let Some(dir) = socket.parent() {
        let _ = std::fs::remove_dir(dir);
    }
}

/// A client that has connected to the rendezvous socket.
#[derive(Debug)]
pub struct Rendezvous {
    s: BufReader<UnixStream>,
    pid: Option<u32>,
    /// The client's (uid, gid), from the kernel (`SO_PEERCRED`).
    ids: Option<(u32, u32)>,
    place: Place,
    /// Its first line was read ([`Rendezvous::hello`]).
    greeted: bool,
}

/// What a connection to the node's socket asks for (its first line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// A client attaching (`SKIFF-SHM 1`): go on with [`Rendezvous::run`].
    Client,
    /// A subscriber of the host asking for the node's buffer of a topic
    /// (`SKIFF-TOPIC 1 …`): answer with [`Rendezvous::serve_topic`].
    Topic(super::topic::TopicAsk),
}

/// Why a rendezvous failed: the reason (sent to the client as `ERR`), and
/// the id the caller attached if it failed after that (detach it).
#[derive(Debug)]
pub struct RendezvousError {
    /// What went wrong.
    pub why: String,
    /// The client id returned by the caller's `attach`, if any.
    pub attached: Option<u64>,
}

/// An attached client's rings and socket.
#[derive(Debug)]
pub struct HostClient {
    /// The client→node ring.
    pub up: HostReader,
    /// The node→client ring.
    pub down: HostWriter,
    /// The rendezvous socket, whose end is the client's end.
    pub watch: PeerWatch,
}

impl Rendezvous {
    /// The client's process id, from the socket's credentials.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The client's user and group ids, from the socket's credentials
    /// (the kernel's word, not the client's).
    pub fn peer_ids(&self) -> Option<(u32, u32)> {
        self.ids
    }

    /// Reads the first line (within the handshake's time): what the
    /// connection asks for.
    pub async fn hello(&mut self) -> Result<Hello, String> {
        let line = tokio::time::timeout(attach::HANDSHAKE, attach::read_line(&mut self.s))
            .await
            .map_err(|_| "the rendezvous took too long".to_string())?
            .map_err(|e| e.to_string())?;
        self.greeted = true;
        if line == HELLO {
            return Ok(Hello::Client);
        }
        super::topic::TopicAsk::parse(&line).map(Hello::Topic)
    }

    /// Answers a topic request with the topic's ring file `name` (in the
    /// attachment directory) and waits, within the handshake's time, for
    /// the subscriber to say it attached. The returned watch ends when
    /// the subscriber's end of the socket closes (it left or died).
    pub async fn serve_topic(mut self, name: &str, max_frame: u64) -> Result<TopicWatch, String> {
        let r = tokio::time::timeout(attach::HANDSHAKE, async {
            attach::write_line(self.s.get_mut(), &format!("TOPIC {name} {max_frame}"))
                .await
                .map_err(|e| e.to_string())?;
            let line = attach::read_line(&mut self.s)
                .await
                .map_err(|e| e.to_string())?;
            if line == "OK" {
                Ok(())
            } else {
                Err(format!("expected OK, got {line:?}"))
            }
        })
        .await
        .unwrap_or_else(|_| Err("the rendezvous took too long".into()));
        match r {
            Ok(()) => Ok(TopicWatch { s: self.s }),
            Err(e) => {
                let _ = attach::write_line(self.s.get_mut(), &format!("ERR {e}")).await;
                Err(e)
            }
        }
    }

    /// Refuses a topic request, telling the subscriber why.
    pub async fn refuse(mut self, why: &str) {
        let _ = attach::write_line(self.s.get_mut(), &format!("ERR {why}")).await;
    }

    /// Runs the rendezvous, bounded by a deadline: makes the node→client
    /// ring (`n{pid}-{seq}.down`, sized for frames of up to `max_frame`
    /// bytes), maps the client's ring (refused unless the client's process
    /// made it), then calls `attach` for the client's id and answers
    /// `OK id max_payload`. On failure the client is told why (`ERR`). The
    /// ring files are unlinked either way (both sides hold the mappings).
    pub async fn run(
        mut self,
        seq: u64,
        max_payload: u64,
        max_frame: u64,
        attach: impl FnOnce() -> Result<u64, String>,
    ) -> Result<HostClient, RendezvousError> {
        let mut files = Vec::new();
        let r = tokio::time::timeout(
            attach::HANDSHAKE,
            self.exchange(seq, max_payload, max_frame, attach, &mut files),
        )
        .await
        .unwrap_or_else(|_| {
            Err(RendezvousError {
                why: "the rendezvous took too long".into(),
                attached: None,
            })
        });
        for f in &files {
            let _ = std::fs::remove_file(f);
        }
        match r {
            Ok((up, down)) => {
                let ring = Arc::clone(&up.ring);
                Ok(HostClient {
                    up: HostReader {
                        cons: up,
                        release: Arc::default(),
                        ring: ring.clone(),
                    },
                    down: HostWriter {
                        w: FrameWriter::new(down, self.place.spin),
                    },
                    watch: PeerWatch { s: self.s, ring },
                })
            }
            Err(e) => {
                let _ = attach::write_line(self.s.get_mut(), &format!("ERR {}", e.why)).await;
                Err(e)
            }
        }
    }

    async fn exchange(
        &mut self,
        seq: u64,
        max_payload: u64,
        max_frame: u64,
        attach: impl FnOnce() -> Result<u64, String>,
        files: &mut Vec<PathBuf>,
    ) -> Result<(RingConsumer, Arc<Ring>), RendezvousError> {
        let fail = |why: String| RendezvousError {
            why,
            attached: None,
        };
        let s = &mut self.s;
        let place = &self.place;
        if !self.greeted {
            let hello = attach::read_line(s)
                .await
                .map_err(|e| fail(e.to_string()))?;
            if hello != HELLO {
                return Err(fail(format!("expected {HELLO:?}")));
            }
        }
        let down_name = format!("n{}-{seq}.down", std::process::id());
        let cap = attach::capacity(place.ring, max_frame);
        let (down, path) = attach::create_ring(&place.dir, &down_name, cap, DOWN)
            .map_err(|e| fail(e.to_string()))?;
        files.push(path);
        attach::write_line(s.get_mut(), &format!("RING {down_name} {max_frame}"))
            .await
            .map_err(|e| fail(e.to_string()))?;
        let line = attach::read_line(s)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let up_name = line
            .strip_prefix("RING ")
            .filter(|n| n.ends_with(".up"))
            .ok_or_else(|| fail("expected RING <name>.up".into()))?;
        files.push(place.dir.join(up_name));
        let up =
            attach::open_peer_ring(&place.dir, up_name, UP).map_err(|e| fail(e.to_string()))?;
        if self.pid.is_some_and(|p| p != up.producer.0) {
            return Err(fail(format!(
                "the ring was made by process {}, not by the client",
                up.producer.0
            )));
        }
        let up = RingConsumer::attach(up).map_err(|e| fail(e.to_string()))?;
        let id = attach().map_err(fail)?;
        attach::write_line(s.get_mut(), &format!("OK {id} {max_payload}"))
            .await
            .map_err(|e| RendezvousError {
                why: e.to_string(),
                attached: Some(id),
            })?;
        Ok((up, down))
    }
}

/// The socket of a topic's subscriber: its end is the subscriber's end.
#[derive(Debug)]
pub struct TopicWatch {
    s: BufReader<UnixStream>,
}

impl TopicWatch {
    /// Waits until the subscriber's end of the socket closes.
    pub async fn closed(&mut self) {
        let mut b = [0u8; 64];
        while let Ok(1..) = self.s.read(&mut b).await {}
    }

    /// The subscriber's next report of what it read and lost
    /// ([`super::topic::Report`]); `None` once its end of the socket
    /// closed (it left or died) or the socket failed. A line that is too
    /// long or does not parse is `Some(Err(why))`; the caller counts it and
    /// reads on (a long line is skipped to its end).
    pub async fn next_report(&mut self) -> Option<Result<super::topic::Report, String>> {
        use tokio::io::AsyncBufReadExt;
        let mut buf = Vec::new();
        let mut limited = (&mut self.s).take(attach::MAX_LINE as u64);
        match limited.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        if buf.last() != Some(&b'\n') {
            // Too long: skip to the end of the line.
            loop {
                buf.clear();
                let mut limited = (&mut self.s).take(attach::MAX_LINE as u64);
                match limited.read_until(b'\n', &mut buf).await {
                    Ok(0) | Err(_) => return None,
                    Ok(_) if buf.last() == Some(&b'\n') => break,
                    Ok(_) => {}
                }
            }
            return Some(Err("a report line longer than a rendezvous line".into()));
        }
        buf.pop();
        Some(
            std::str::from_utf8(&buf)
                .map_err(|_| "a report line that is not UTF-8".to_string())
                .and_then(super::topic::Report::parse),
        )
    }
}

/// The rendezvous socket of an attached client.
#[derive(Debug)]
pub struct PeerWatch {
    s: BufReader<UnixStream>,
    ring: Arc<Ring>,
}

impl PeerWatch {
    /// Waits until the client's end of the socket closes (it closed or
    /// died), then marks its ring lost, which ends the reader after what
    /// was published. Cancel-safe: dropping the future marks nothing.
    pub async fn closed(&mut self) {
        let mut b = [0u8; 64];
        loop {
            match self.s.read(&mut b).await {
                Ok(0) | Err(_) => {
                    attach::mark_lost(&self.ring);
                    return;
                }
                Ok(_) => {}
            }
        }
    }
}

/// A segment of the client's ring.
#[derive(Debug)]
pub struct Segment {
    /// Its bytes: in place in the mapping, or a copy.
    pub bytes: Bytes,
    /// Whether it was read in place.
    pub in_place: bool,
}

/// Reads the client→node ring (see the module doc).
#[derive(Debug)]
pub struct HostReader {
    cons: RingConsumer,
    release: Arc<Release>,
    ring: Arc<Ring>,
}

impl HostReader {
    /// Reads `cons` in place (a topic's subscriber does, as the node reads
    /// a client's ring).
    pub(crate) fn over(cons: RingConsumer) -> HostReader {
        let ring = Arc::clone(&cons.ring);
        HostReader {
            cons,
            release: Arc::default(),
            ring,
        }
    }

    /// The data area of the client's ring as this process maps it.
    pub fn data_range(&self) -> Range<usize> {
        attach::data_range(&self.ring)
    }

    /// The next segment, in ring order, skipping padding; `Ok(None)` once
    /// `stop` says so (checked whenever the reader wakes). Space released
    /// since the last call goes back to the client first. Blocks the
    /// thread: busy-polls for up to `spin`, then sleeps on the futex.
    /// `Closed`, `PeerDead` and `PeerLost` errors are the client's end;
    /// others are its fault.
    pub fn next(
        &mut self,
        spin: Duration,
        stop: &dyn Fn() -> bool,
    ) -> Result<Option<Segment>, BufferError> {
        loop {
            let free = self.release.take();
            if free > 0 {
                self.cons.consume(free)?;
            }
            if stop() {
                return Ok(None);
            }
            let release = &self.release;
            let Some(d) = self
                .cons
                .next_or(None, spin, attach::IDLE_CHECK, || release.ready() || stop())?
            else {
                continue;
            };
            // SAFETY: the segment is consumed only once its release-queue
            // entry and every earlier one are done, which happens when the
            // last `Bytes` made from this `Pinned` (owned by `SegOwner`) is
            // dropped; until then the consumer slot stays attached
            // (`Release::retire`).
            let pinned = unsafe { self.cons.pin(d.start, d.len) };
            let in_place = pinned.is_some();
            let bytes = match pinned {
                Some(p) => {
                    let idx = self.release.push(d.len);
                    Bytes::from_owner(SegOwner {
                        bytes: p,
                        idx,
                        release: self.release.clone(),
                        ring: self.ring.clone(),
                    })
                }
                None => {
                    let mut v = Vec::new();
                    self.cons.copy(d.seg, d.start, d.len, &mut v);
                    // Released now, but in ring order: after the segments
                    // before it (consuming moves one position).
                    let idx = self.release.push(d.len);
                    self.release.done(idx);
                    Bytes::from(v)
                }
            };
            if attach::is_pad(&bytes) {
                continue;
            }
            return Ok(Some(Segment { bytes, in_place }));
        }
    }

    /// As [`HostReader::next`], but `Ok(None)` also after a second with
    /// nothing (the caller looks around, then calls again).
    pub(crate) fn next_once(
        &mut self,
        spin: Duration,
        stop: &dyn Fn() -> bool,
    ) -> Result<Option<Segment>, BufferError> {
        let deadline = std::time::Instant::now() + attach::IDLE_CHECK;
        loop {
            let free = self.release.take();
            if free > 0 {
                self.cons.consume(free)?;
            }
            if stop() || std::time::Instant::now() >= deadline {
                return Ok(None);
            }
            let release = &self.release;
            let Some(d) = self
                .cons
                .next_or(Some(deadline), spin, attach::IDLE_CHECK, || {
                    release.ready() || stop()
                })?
            else {
                continue;
            };
            // SAFETY: as in `next`: the segment is consumed only once the
            // last `Bytes` of it and of every earlier one is dropped.
            let pinned = unsafe { self.cons.pin(d.start, d.len) };
            let bytes = match pinned {
                Some(p) => {
                    let idx = self.release.push(d.len);
                    Bytes::from_owner(SegOwner {
                        bytes: p,
                        idx,
                        release: self.release.clone(),
                        ring: self.ring.clone(),
                    })
                }
                None => {
                    let mut v = Vec::new();
                    self.cons.copy(d.seg, d.start, d.len, &mut v);
                    let idx = self.release.push(d.len);
                    self.release.done(idx);
                    Bytes::from(v)
                }
            };
            if attach::is_pad(&bytes) {
                continue;
            }
            let in_place = in_ring(&self.ring, &bytes);
            return Ok(Some(Segment { bytes, in_place }));
        }
    }

    /// The reader is done: tells a live client that nothing more is read,
    /// and keeps the ring attached while segments are still referred to.
    pub fn finish(self) {
        if self.ring.state() == super::layout::OPEN {
            self.ring.close(super::layout::CLOSED);
        }
        self.release.retire(self.cons);
    }
}

/// Whether `b` lies in `ring`'s data area (it was read in place).
fn in_ring(ring: &Ring, b: &[u8]) -> bool {
    attach::data_range(ring).contains(&(b.as_ptr() as usize))
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

/// Writes the node→client ring.
#[derive(Debug)]
pub struct HostWriter {
    w: FrameWriter,
}

impl HostWriter {
    /// Copies `buf`, a run of whole encoded frames (a 4-byte little-endian
    /// length, then the body), into the ring in segments of whole frames.
    /// Blocks while the ring is full and `go` says to wait; an error means
    /// the client is gone (or `go` stopped the wait).
    pub fn write_frames(
        &mut self,
        buf: &[u8],
        go: &mut dyn FnMut() -> bool,
    ) -> Result<(), BufferError> {
        self.w.write_frames(buf, go)
    }

    /// Closes the ring: a live client reads what was written, then learns
    /// that the node is done with it.
    pub fn close(mut self) {
        self.w.close();
    }
}
