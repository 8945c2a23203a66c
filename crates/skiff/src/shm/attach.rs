//! What both sides of a client's `shm://name` attachment to a node share:
//! the locator, the rendezvous lines on the node's Unix socket, ring files
//! and a writer that puts whole frames into a ring.
//!
//! Rendezvous (`dir/name/node.sock`; lines of at most [`MAX_LINE`] bytes):
//!
//! ```text
//! client -> node   SKIFF-SHM 1
//! node -> client   RING <down ring file> <max frame>   (or ERR <text>)
//! client -> node   RING <up ring file>                  (client attached down)
//! node -> client   OK <client id> <max payload>         (or ERR <text>)
//! ```
//!
//! The node creates the node→client ring, the client the client→node ring
//! (each is the producer of the ring it creates); each side attaches as
//! the only consumer of the other's. After `OK` the node removes both
//! files (the mappings stay), so nothing is left behind whatever happens
//! later. The socket stays open and carries no data: its end is the peer's
//! end (a crash included).
//!
//! A ring segment holds whole frames (`| len u32 | body |`, the stream
//! framing). A segment that would wrap around the end of the ring is
//! preceded by a padding segment up to the end (its first four bytes, or
//! all of it if shorter, are zero; a frame's length is never zero), so
//! every data segment is one slice of the mapping.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use skiff_proto::credits::{CreditError, Flow};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use super::layout::{Layout, OPEN};
use super::ring::{Ring, RingProducer, Writable};
use super::{BufferError, BufferId};
use crate::error::LocatorError;
use crate::locator::Locator;

/// The node's socket in the attachment directory.
pub(crate) const SOCKET: &str = "node.sock";
/// Buffer id in the header of a client→node ring.
pub(crate) const UP: BufferId = 1;
/// Buffer id in the header of a node→client ring.
pub(crate) const DOWN: BufferId = 2;
/// Default ring size (each direction).
pub(crate) const DEFAULT_RING: u64 = 4 << 20;
/// Longest rendezvous line.
pub(crate) const MAX_LINE: usize = 512;
/// How long the rendezvous may take.
pub(crate) const HANDSHAKE: Duration = Duration::from_secs(5);
/// First line of the rendezvous.
pub(crate) const HELLO: &str = "SKIFF-SHM 1";

const ACCEPTED: &str = "dir, ring, spin";

/// How often an idle reader of an attachment's ring checks that the
/// producing process lives: rarely, since the socket's end closes the ring
/// at once.
pub(crate) const IDLE_CHECK: Duration = Duration::from_secs(1);

/// Where an `shm://name` attachment lives and how its rings are sized.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    /// `dir/name`: the socket and (briefly) the ring files.
    pub(crate) dir: PathBuf,
    /// Ring size (bytes) this side asks for; raised to fit the largest
    /// frame twice.
    pub(crate) ring: u64,
    /// Busy-poll before sleeping on a ring's futex.
    pub(crate) spin: Duration,
}

/// Parses `shm://name?dir=/dev/shm/skiff&ring=4M&spin=20us`.
pub(crate) fn parse(locator: &str) -> Result<Place, LocatorError> {
    let loc: Locator = locator.parse()?;
    loc.expect_scheme("shm")?;
    let mut dir = super::default_dir();
    let mut ring = DEFAULT_RING;
    let mut spin = Duration::ZERO;
    let bad = LocatorError::bad_value;
    loc.options(ACCEPTED, |k, v| {
        match k {
            "dir" => dir = PathBuf::from(v),
            "ring" => {
                ring = crate::locator::parse_bytes(k, v)
                    .ok()
                    .map(|n| n as u64)
                    .filter(|&n| (4096..=1 << 34).contains(&n))
                    .ok_or_else(|| bad(k, v, "a size from 4K to 16G, like 4M"))?
            }
            "spin" => spin = crate::locator::parse_duration(k, v)?,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    let name = &loc.address;
    if !valid_name(name) {
        return Err(LocatorError::Name {
            name: name.clone(),
            why: "a node's shm name is one path component of letters, digits, '-', '_' and '.', e.g. shm://skiff",
        });
    }
    Ok(Place {
        dir: dir.join(name),
        ring,
        spin,
    })
}

/// A file or attachment name: one path component, short, no leading dot.
pub(crate) fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The capacity of a ring that asks for `want` bytes and must carry
/// frames of up to `max_frame` bytes (body) in segments of at most half
/// the ring.
pub(crate) fn capacity(want: u64, max_frame: u64) -> u64 {
    want.max(2 * (max_frame + 4)).next_power_of_two()
}

/// Creates ring file `dir/name` (which must not exist) for buffer `id`,
/// one consumer, credit flow; this process is its producer.
pub(crate) fn create_ring(
    dir: &Path,
    name: &str,
    capacity: u64,
    id: BufferId,
) -> Result<(Arc<Ring>, PathBuf), BufferError> {
    create_ring_with(dir, name, capacity, id, 1, Flow::Credits)
}

/// [`create_ring`] with `consumers` reader slots and `flow`.
pub(crate) fn create_ring_with(
    dir: &Path,
    name: &str,
    capacity: u64,
    id: BufferId,
    consumers: u32,
    flow: Flow,
) -> Result<(Arc<Ring>, PathBuf), BufferError> {
    let records = (capacity / 64).clamp(64, 4096);
    let layout = Layout::new(capacity, records, consumers, flow)
        .map_err(|e| BufferError::Usage { id, why: e.0 })?;
    let path = dir.join(name);
    let f = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(BufferError::io("create ring file"))?;
    match super::buffer::init_file(&f, layout, id) {
        Ok(r) => Ok((r, path)),
        Err(e) => {
            let _ = fs::remove_file(&path);
            Err(e)
        }
    }
}

/// Opens the peer's ring file `dir/name` (a regular file, not a link) and
/// validates its header.
pub(crate) fn open_peer_ring(
    dir: &Path,
    name: &str,
    id: BufferId,
) -> Result<Arc<Ring>, BufferError> {
    if !valid_name(name) {
        return Err(BufferError::Usage {
            id,
            why: format!("ring file name {name:?} is not one plain path component"),
        });
    }
    let path = dir.join(name);
    let meta = fs::symlink_metadata(&path).map_err(BufferError::io("stat ring file"))?;
    if !meta.file_type().is_file() {
        return Err(BufferError::Usage {
            id,
            why: format!("{} is not a regular file", path.display()),
        });
    }
    super::buffer::open_ring(&path, id)
}

/// The address range of a ring's data area in this process.
pub(crate) fn data_range(ring: &Ring) -> std::ops::Range<usize> {
    let start = ring.region.base() + ring.layout.data_off;
    start..start + ring.layout.geom.capacity() as usize
}

/// The end of the longest run of whole frames (`| len u32 | body |`) in
/// `buf` from `at` that fits in `max_seg` bytes (at least one frame, if
/// one is whole); `at` when none is.
pub(crate) fn whole_frames(buf: &[u8], at: usize, max_seg: usize) -> usize {
    let mut end = at;
    while end + 4 <= buf.len() {
        let len = u32::from_le_bytes(buf[end..end + 4].try_into().expect("4 bytes"));
        let next = end + 4 + len as usize;
        if next > buf.len() || (end > at && next - at > max_seg) {
            break;
        }
        end = next;
    }
    end
}

/// Whether a segment is padding (see the module doc).
pub(crate) fn is_pad(seg: &[u8]) -> bool {
    seg.len() < 4 || seg[..4] == [0; 4]
}

/// Marks a ring lost (its producer's side went away) if it is still open,
/// waking its consumer, which reads what was published and then ends.
pub(crate) fn mark_lost(ring: &Ring) {
    if ring.state() == OPEN {
        ring.close(super::layout::LOST);
    }
}

/// The producer of a ring of whole frames (see the module doc).
#[derive(Debug)]
pub(crate) struct FrameWriter {
    prod: RingProducer,
    spin: Duration,
    cap: u64,
    /// Padding segments written.
    pub(crate) pads: u64,
    /// The open segment ([`FrameWriter::try_append`]): reserved, holding
    /// the frames appended so far (bytes used), not yet published.
    open: Option<(Writable, usize)>,
}

impl FrameWriter {
    /// The writer of `ring` (this process created it).
    pub(crate) fn new(ring: Arc<Ring>, spin: Duration) -> FrameWriter {
        let cap = ring.layout.geom.capacity();
        FrameWriter {
            prod: RingProducer::new(ring),
            spin,
            cap,
            pads: 0,
            open: None,
        }
    }

    /// Appends one frame of `n` bytes, which `fill` writes in place, to the
    /// open segment, opening one of about `seg` bytes (at least `n`) when
    /// there is none or it is full, if the ring has room for it now (never
    /// waits): `Ok(false)` when it has not (nothing written). The frames
    /// are published by [`FrameWriter::commit_open`] (every other write
    /// commits the open segment first, so order is kept).
    pub(crate) fn try_append(
        &mut self,
        n: usize,
        seg: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<bool, BufferError> {
        if let Some((w, used)) = &mut self.open {
            let (a, _) = w.slices_mut();
            if *used + n <= a.len() {
                fill(&mut a[*used..*used + n]);
                *used += n;
                return Ok(true);
            }
        }
        self.commit_open()?;
        let want = seg.max(n) as u64;
        if n == 0 || want > self.cap / 2 {
            return Ok(false);
        }
        if !self.try_pad_for(want)? {
            return Ok(false);
        }
        let Some(mut w) = self.try_reserve_now(want)? else {
            return Ok(false);
        };
        {
            let (a, b) = w.slices_mut();
            debug_assert!(b.is_empty(), "padding keeps segments in one piece");
            fill(&mut a[..n]);
        }
        self.open = Some((w, n));
        Ok(true)
    }

    /// Waits (while `go` says to) until a segment of `len` bytes fits, as
    /// [`FrameWriter::try_append`] would open it: the padding to the
    /// ring's end written first if it would wrap; nothing else written.
    /// `Timeout` once `go` says to stop.
    pub(crate) fn wait_room(
        &mut self,
        len: usize,
        go: &mut dyn FnMut() -> bool,
    ) -> Result<(), BufferError> {
        self.commit_open()?;
        let len = len as u64;
        if len > self.cap / 2 {
            return Ok(());
        }
        let pos = self.prod.head() % self.cap;
        if pos + len > self.cap {
            self.segment(self.cap - pos, go, |b| b.fill(0))?;
            self.pads += 1;
        }
        loop {
            let until = Instant::now() + Duration::from_millis(100);
            match self.prod.reserve(len, Some(until), self.spin) {
                Ok(_) => {
                    self.prod.abandon();
                    return Ok(());
                }
                Err(BufferError::Timeout) if go() => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Bytes of frames in the open segment, not yet published.
    pub(crate) fn open_len(&self) -> usize {
        self.open.as_ref().map_or(0, |(_, used)| *used)
    }

    /// Publishes the open segment's frames, if any (a system call only if
    /// the reader sleeps).
    pub(crate) fn commit_open(&mut self) -> Result<(), BufferError> {
        let Some((w, used)) = self.open.take() else {
            return Ok(());
        };
        self.prod.finish(w);
        let id = self.prod.ring.id;
        self.prod
            .commit(used as u64)
            .map(|_| ())
            .map_err(|e| BufferError::credit(id, e))
    }

    /// The ring's data area as this process maps it.
    pub(crate) fn data_range(&self) -> std::ops::Range<usize> {
        data_range(&self.prod.ring)
    }

    /// The largest segment this writer makes of several frames.
    /// Copies `buf`, a run of whole encoded frames (a 4-byte
    /// little-endian length, then the body), into the ring in segments of
    /// whole frames, waiting for room while `go` says to.
    pub(crate) fn write_frames(
        &mut self,
        buf: &[u8],
        go: &mut dyn FnMut() -> bool,
    ) -> Result<(), BufferError> {
        let max_seg = self.max_segment();
        let mut at = 0;
        while at < buf.len() {
            let end = whole_frames(buf, at, max_seg);
            if end == at {
                break;
            }
            let chunk = &buf[at..end];
            self.write(chunk.len(), go, |s| s.copy_from_slice(chunk))?;
            at = end;
        }
        Ok(())
    }

    pub(crate) fn max_segment(&self) -> usize {
        (self.cap / 2) as usize
    }

    /// Publishes one segment of exactly `len` bytes, which `fill` writes
    /// in place (one slice: padding first if it would wrap). Waits for
    /// credits while `go()` holds (checked every 100 ms); `Timeout` once it
    /// does not.
    pub(crate) fn write(
        &mut self,
        len: usize,
        go: &mut dyn FnMut() -> bool,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<(), BufferError> {
        self.commit_open()?;
        let len = len as u64;
        let pos = self.prod.head() % self.cap;
        if len <= self.cap && pos + len > self.cap {
            self.segment(self.cap - pos, go, |b| b.fill(0))?;
            self.pads += 1;
        }
        self.segment(len, go, fill)
    }

    /// Publishes one segment of exactly `len` bytes, which `fill` writes
    /// in place, only if the ring has room now (never waits): `Ok(false)`
    /// when it has not (nothing written, or only a padding segment to the
    /// ring's end, which readers skip).
    pub(crate) fn try_write(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<bool, BufferError> {
        self.commit_open()?;
        let len = len as u64;
        if len == 0 || len > self.cap / 2 {
            return Ok(false);
        }
        if !self.try_pad_for(len)? {
            return Ok(false);
        }
        self.try_segment(len, fill)
    }

    /// Pads the ring to its end when a segment of `len` bytes would not
    /// fit before it (segments never wrap), if the ring has room for the
    /// padding now: `Ok(false)` when it has not.
    fn try_pad_for(&mut self, len: u64) -> Result<bool, BufferError> {
        let pos = self.prod.head() % self.cap;
        if pos + len > self.cap {
            if !self.try_segment(self.cap - pos, |b| b.fill(0))? {
                return Ok(false);
            }
            self.pads += 1;
        }
        Ok(true)
    }

    /// Reserves `len` bytes if the ring has room now (never waits):
    /// `Ok(None)` when it has not.
    fn try_reserve_now(&mut self, len: u64) -> Result<Option<Writable>, BufferError> {
        match self.prod.try_reserve(len) {
            Ok(r) => Ok(Some(self.prod.writable(r))),
            Err(CreditError::WouldBlock { .. } | CreditError::NoRecord { .. }) => Ok(None),
            Err(e) => Err(BufferError::credit(self.prod.ring.id, e)),
        }
    }

    fn try_segment(&mut self, len: u64, fill: impl FnOnce(&mut [u8])) -> Result<bool, BufferError> {
        let id = self.prod.ring.id;
        let Some(mut w) = self.try_reserve_now(len)? else {
            return Ok(false);
        };
        {
            let (a, b) = w.slices_mut();
            debug_assert!(b.is_empty(), "padding keeps segments in one piece");
            fill(a);
        }
        self.prod.finish(w);
        self.prod
            .commit(len)
            .map(|_| true)
            .map_err(|e| BufferError::credit(id, e))
    }

    fn segment(
        &mut self,
        len: u64,
        go: &mut dyn FnMut() -> bool,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<(), BufferError> {
        let res = loop {
            let until = Instant::now() + Duration::from_millis(100);
            match self.prod.reserve(len, Some(until), self.spin) {
                Ok(r) => break r,
                Err(BufferError::Timeout) if go() => continue,
                Err(e) => return Err(e),
            }
        };
        let mut w = self.prod.writable(res);
        {
            let (a, b) = w.slices_mut();
            debug_assert!(b.is_empty(), "padding keeps segments in one piece");
            fill(a);
        }
        self.prod.finish(w);
        let id = self.prod.ring.id;
        self.prod
            .commit(len)
            .map(|_| ())
            .map_err(|e| BufferError::credit(id, e))
    }

    /// Marks the ring closed: the consumer reads what was published, then
    /// `Closed`.
    pub(crate) fn close(&mut self) {
        let _ = self.commit_open();
        if self.prod.ring.state() == OPEN {
            self.prod.ring.close(super::layout::CLOSED);
        }
    }
}

/// A ring of the attachment seen from the other side of the socket: the
/// socket's end marks it lost (its consumer ends after the data).
#[derive(Debug, Clone)]
pub(crate) struct LostHandle(Arc<Ring>);

impl LostHandle {
    /// The peer is gone (see [`mark_lost`]).
    pub(crate) fn mark_lost(&self) {
        mark_lost(&self.0);
    }
}

/// The client's reader of the node→client ring: segments are copied out
/// (one copy, like a socket read) and their space returned at once.
#[derive(Debug)]
pub(crate) struct DownReader {
    cons: super::ring::RingConsumer,
    spin: Duration,
}

impl DownReader {
    /// Waits for the next segment and appends its bytes to `out`;
    /// `Ok(false)` for padding (nothing appended). Errors: the node closed
    /// the ring (`Closed`, after everything), died (`PeerDead`), or its
    /// socket ended (`PeerLost`); or the ring is corrupt.
    pub(crate) fn next(&mut self, out: &mut Vec<u8>) -> Result<bool, BufferError> {
        let d = loop {
            if let Some(d) = self.cons.next_or(None, self.spin, IDLE_CHECK, || false)? {
                break d;
            }
        };
        let base = out.len();
        self.cons.copy(d.seg, d.start, d.len, out);
        self.cons.consume(d.len)?;
        if is_pad(&out[base..]) {
            out.truncate(base);
            return Ok(false);
        }
        Ok(true)
    }
}

/// A client's side of an attachment after the rendezvous.
#[derive(Debug)]
pub(crate) struct ClientRings {
    /// The socket, held open while the client lives.
    pub(crate) socket: tokio::net::UnixStream,
    /// The client→node ring's writer.
    pub(crate) up: FrameWriter,
    /// The node→client ring's reader.
    pub(crate) down: DownReader,
    /// To mark the node→client ring lost when the socket ends.
    pub(crate) down_lost: LostHandle,
    /// The node's id for this client.
    pub(crate) client: u64,
    /// The node's payload limit.
    pub(crate) max_payload: u64,
}

/// Attaches to the node at `place` (see the module doc), within
/// [`HANDSHAKE`].
pub(crate) async fn client_rendezvous(place: &Place) -> Result<ClientRings, Rendezvous> {
    let sock = place.dir.join(SOCKET);
    let s = tokio::net::UnixStream::connect(&sock)
        .await
        .map_err(Rendezvous::NoNode)?;
    let mut s = tokio::io::BufReader::new(s);
    let mut up_file = None;
    let r = tokio::time::timeout(HANDSHAKE, client_lines(&mut s, place, &mut up_file))
        .await
        .unwrap_or_else(|_| Err("the node did not answer the rendezvous in time".into()));
    if let Some(f) = up_file {
        // The node removes it after OK; on failure, so do we.
        if r.is_err() {
            let _ = fs::remove_file(f);
        }
    }
    let (up, down, client, max_payload) = r.map_err(Rendezvous::Refused)?;
    let down_lost = LostHandle(Arc::clone(&down.ring));
    Ok(ClientRings {
        socket: s.into_inner(),
        up: FrameWriter::new(up, place.spin),
        down: DownReader {
            cons: down,
            spin: place.spin,
        },
        down_lost,
        client,
        max_payload,
    })
}

/// Why a client's rendezvous with a node failed.
#[derive(Debug)]
pub(crate) enum Rendezvous {
    /// Nothing listens on the node's socket: no node serves this name and
    /// directory (or it runs as another user).
    NoNode(io::Error),
    /// The node answered but the rendezvous failed; why.
    Refused(String),
}

type Lines = (Arc<Ring>, super::ring::RingConsumer, u64, u64);

async fn client_lines(
    s: &mut tokio::io::BufReader<tokio::net::UnixStream>,
    place: &Place,
    up_file: &mut Option<PathBuf>,
) -> Result<Lines, String> {
    let e = |e: io::Error| format!("shm rendezvous: {e}");
    write_line(s.get_mut(), HELLO).await.map_err(e)?;
    let line = read_line(s).await.map_err(e)?;
    let refused = |line: &str| match line.strip_prefix("ERR ") {
        Some(why) => format!("the node refused: {why}"),
        None => format!("unexpected rendezvous line {line:?}"),
    };
    let mut w = line
        .strip_prefix("RING ")
        .ok_or_else(|| refused(&line))?
        .split(' ');
    let (Some(down_name), Some(max_frame), None) = (w.next(), w.next(), w.next()) else {
        return Err(refused(&line));
    };
    let max_frame: u64 = max_frame.parse().map_err(|_| refused(&line))?;
    let down = open_peer_ring(&place.dir, down_name, DOWN).map_err(|e| e.to_string())?;
    let down = super::ring::RingConsumer::attach(down).map_err(|e| e.to_string())?;
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let up_name = format!("c{}-{n}.up", std::process::id());
    let (up, path) = create_ring(&place.dir, &up_name, capacity(place.ring, max_frame), UP)
        .map_err(|e| e.to_string())?;
    *up_file = Some(path);
    write_line(s.get_mut(), &format!("RING {up_name}"))
        .await
        .map_err(e)?;
    let line = read_line(s).await.map_err(e)?;
    let mut w = line
        .strip_prefix("OK ")
        .ok_or_else(|| refused(&line))?
        .split(' ');
    let (Some(Ok(client)), Some(Ok(max_payload))) =
        (w.next().map(str::parse), w.next().map(str::parse))
    else {
        return Err(refused(&line));
    };
    Ok((up, down, client, max_payload))
}

/// Reads one rendezvous line (without its newline), bounded.
pub(crate) async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R) -> io::Result<String> {
    let mut buf = Vec::new();
    let mut limited = tokio::io::AsyncReadExt::take(r, MAX_LINE as u64);
    limited.read_until(b'\n', &mut buf).await?;
    if buf.last() != Some(&b'\n') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "rendezvous line missing, cut short or too long",
        ));
    }
    buf.pop();
    String::from_utf8(buf)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "rendezvous line not UTF-8"))
}

/// Writes one rendezvous line.
pub(crate) async fn write_line<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    line: &str,
) -> io::Result<()> {
    let mut b = Vec::with_capacity(line.len() + 1);
    b.extend_from_slice(line.replace('\n', " ").as_bytes());
    b.push(b'\n');
    w.write_all(&b).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locators_and_sizes() {
        let p = parse("shm://skiff?dir=/tmp/x&ring=64K&spin=5us").unwrap();
        assert_eq!(p.dir, PathBuf::from("/tmp/x/skiff"));
        assert_eq!(p.ring, 64 << 10);
        assert_eq!(p.spin, Duration::from_micros(5));
        assert!(parse("shm://a/b").is_err());
        assert!(parse("shm://..").is_err());
        assert!(parse("shm://x?ring=1").is_err());
        assert!(parse("shm://x?bogus=1").is_err());
        assert_eq!(capacity(4096, 1 << 20), 4 << 20);
        assert!(is_pad(&[0, 0, 0, 0, 5]) && is_pad(&[1]) && !is_pad(&[1, 0, 0, 0]));
    }

    /// A 4 KiB-segment ring in a fresh directory, its writer and a reader
    /// of it (the directory is the caller's to remove).
    fn writer_and_reader(
        tag: &str,
    ) -> (
        std::path::PathBuf,
        super::super::ring::RingConsumer,
        FrameWriter,
    ) {
        let dir = std::env::temp_dir().join(format!("skiff-{tag}-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let (ring, path) = create_ring(&dir, "t.up", 4096, UP).unwrap();
        let peer = open_peer_ring(&dir, "t.up", UP).unwrap();
        fs::remove_file(&path).unwrap();
        let cons = super::super::ring::RingConsumer::attach(peer).unwrap();
        (dir, cons, FrameWriter::new(ring, Duration::ZERO))
    }

    #[test]
    fn frames_never_wrap() {
        let (dir, mut cons, mut w) = writer_and_reader("attach");
        let mut go = || true;
        for k in 0..40u8 {
            w.write(700, &mut go, |b| b.fill(k + 1)).unwrap();
            loop {
                let d = cons.try_next().unwrap().unwrap();
                let (a, b) = cons.slices(d.start, d.len).unwrap();
                assert!(b.is_empty(), "one slice");
                let pad = is_pad(a);
                if !pad {
                    assert_eq!(a, &[k + 1; 700][..]);
                }
                cons.consume(d.len).unwrap();
                if !pad {
                    break;
                }
            }
        }
        assert!(w.pads > 0);
        let _ = fs::remove_dir(&dir);
    }

    /// Frames appended to open segments (the direct path), with other
    /// writes between them and a reader that lags, come out whole, in
    /// order, every data segment in one slice; a full ring refuses an
    /// append until `wait_room` saw room come back.
    #[test]
    fn open_segments_keep_order_and_never_wrap() {
        let (dir, mut cons, mut w) = writer_and_reader("open");
        let mut go = || true;
        let (mut sent, mut got) = (0u32, 0u32);
        let read_all = |cons: &mut super::super::ring::RingConsumer, got: &mut u32| {
            while let Some(d) = cons.try_next().unwrap() {
                let (a, b) = cons.slices(d.start, d.len).unwrap();
                assert!(b.is_empty(), "one slice");
                if !is_pad(a) {
                    let mut at = 0;
                    while at < a.len() {
                        let len = u32::from_le_bytes(a[at..at + 4].try_into().unwrap()) as usize;
                        let k = u32::from_le_bytes(a[at + 4..at + 8].try_into().unwrap());
                        assert_eq!(k, *got, "frame out of order");
                        assert_eq!(len, 4 + (k as usize % 90), "frame {k}");
                        *got += 1;
                        at += 4 + len;
                    }
                }
                cons.consume(d.len).unwrap();
            }
        };
        let frame = |k: u32| {
            let mut f = vec![0u8; 8 + k as usize % 90];
            let len = f.len() as u32 - 4;
            f[..4].copy_from_slice(&len.to_le_bytes());
            f[4..8].copy_from_slice(&k.to_le_bytes());
            f
        };
        for round in 0..200u32 {
            // A burst through open segments of 600 bytes, then (every
            // third round) a frame written as a segment of its own.
            for _ in 0..(round % 13) {
                let f = frame(sent);
                if !w
                    .try_append(f.len(), 600, |b| b.copy_from_slice(&f))
                    .unwrap()
                {
                    // Full: nothing written. The reader catches up, and
                    // room comes back.
                    read_all(&mut cons, &mut got);
                    w.wait_room(600, &mut go).unwrap();
                    assert!(w
                        .try_append(f.len(), 600, |b| b.copy_from_slice(&f))
                        .unwrap());
                }
                sent += 1;
            }
            if round % 3 == 0 {
                let f = frame(sent);
                read_all(&mut cons, &mut got);
                w.write(f.len(), &mut go, |b| b.copy_from_slice(&f))
                    .unwrap();
                sent += 1;
            }
            if round % 5 == 0 {
                w.commit_open().unwrap();
                read_all(&mut cons, &mut got);
            }
        }
        w.commit_open().unwrap();
        read_all(&mut cons, &mut got);
        assert_eq!(got, sent);
        assert_eq!(w.open_len(), 0);
        assert!(w.pads > 0);
        let _ = fs::remove_dir(&dir);
    }
}
