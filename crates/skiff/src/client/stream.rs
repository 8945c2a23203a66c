//! A client's link to its node over a byte stream (TCP or a Unix socket):
//! the write buffer ([`StreamTx`]) that every sender encodes frames into
//! and one writer task flushes with one system call per batch, connecting
//! and the welcome, and the reader that decodes what the node sends and
//! hands it to the client's dispatcher, pinging a silent node.
//!
//! The write buffer outlives connections; while no node is reachable it
//! holds publishes only, up to a bound (the failover driver,
//! [`super::failover`], replaces the connection).

use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use bytes::BytesMut;
use parking_lot::Mutex;
use skiff_proto::client_frame::{
    ClientFrame, Code, Decoder, ServerFrame, FRAME_OVERHEAD, LEN_PREFIX,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{tcp, unix, TcpStream, UnixStream};
use tokio::sync::{oneshot, Notify};

use super::dispatch::RawFrame;
use super::status::Unconfirmed;
use super::target::{LinkOptions, NodeAddr};
use super::Inner;
use crate::spin::Spin;
use crate::Error;

/// Bytes buffered for the socket before a publisher waits.
const HIGH_WATER: usize = 1 << 20;

/// `corr` of keepalive pings (never a waiter's: ids start at 1).
const KEEPALIVE: u64 = 0;

#[derive(Debug, Default)]
struct TxBuf {
    /// Encoded frames for the writer.
    out: Vec<u8>,
    /// The node lost, while failing over: only publishes and broadcasts
    /// are taken then, up to `hold_max` bytes.
    down: Option<String>,
    hold_max: usize,
    /// Publishes held while down, and refused.
    held: u64,
    refused: u64,
    /// Publishes not yet confirmed by the node (`Taken`).
    track: Track,
}

/// The publishes a node has not confirmed yet (`Confirm`, `Taken`), kept
/// so a failover can say which may not have reached the lost node and
/// hand them back. Bounded by `max` bytes: when full, the oldest are
/// forgotten (counted).
///
/// They are kept as their encoded `Pub` frames, copied once into one
/// buffer of bytes (no reference counts taken, no allocation per
/// publish), and decoded back into messages only when a connection is
/// lost.
#[derive(Debug, Default)]
struct Track {
    /// Bytes of unconfirmed publishes kept (`unconfirmed_buffer`); 0:
    /// nothing is tracked.
    max: usize,
    /// The number the next publish gets (1 first).
    next: u64,
    /// The number of the first publish on the current connection (what
    /// `Taken { n }` counts from).
    conn_first: u64,
    /// Every publish up to this one is confirmed.
    confirmed: u64,
    /// Unconfirmed publishes kept, oldest first: their `Pub` frames
    /// (length prefix included) in `frames[head..]`, numbered from
    /// `kept_first` on.
    frames: Vec<u8>,
    head: usize,
    kept_first: u64,
    kept: usize,
    /// Publishes of lost nodes not yet taken back, and their bytes.
    lost: Vec<(u64, skiff_proto::Message)>,
    lost_bytes: usize,
    /// Counters for [`super::LinkStats`].
    forgotten: u64,
    maybe_lost: u64,
}

/// What keeping `m` costs against `unconfirmed_buffer`: its `Pub` frame,
/// kept or decoded back.
fn kept_cost(m: &skiff_proto::Message) -> usize {
    skiff_proto::client_frame::pub_frame_len(m)
}

/// The length of the frame at the start of `b` (prefix included).
fn frame_len(b: &[u8]) -> usize {
    let mut len = [0u8; LEN_PREFIX];
    len.copy_from_slice(&b[..LEN_PREFIX]);
    LEN_PREFIX + u32::from_le_bytes(len) as usize
}

impl Track {
    fn new(max: usize) -> Track {
        Track {
            max,
            next: 1,
            conn_first: 1,
            kept_first: 1,
            ..Track::default()
        }
    }

    /// Bytes of frames kept.
    fn bytes(&self) -> usize {
        self.frames.len() - self.head
    }

    /// A publish went to the write buffer (or was held for the next node)
    /// as the `Pub` frame `frame`.
    #[inline]
    fn sent(&mut self, frame: &[u8]) {
        let n = self.next;
        self.next += 1;
        if self.max == 0 {
            return;
        }
        if self.kept == 0 {
            self.frames.clear();
            self.head = 0;
            self.kept_first = n;
        }
        self.frames.extend_from_slice(frame);
        self.kept += 1;
        while self.bytes() > self.max && self.kept > 0 {
            self.pop();
            self.forgotten += 1;
        }
    }

    /// Lets the oldest kept frame go.
    fn pop(&mut self) {
        self.head += frame_len(&self.frames[self.head..]);
        self.kept -= 1;
        self.kept_first += 1;
        if self.kept == 0 {
            self.frames.clear();
            self.head = 0;
        } else if self.head >= self.frames.len() / 2 && self.head >= 4096 {
            // Moves what is left to the front: each byte moves at most
            // about once per time it was kept.
            self.frames.drain(..self.head);
            self.head = 0;
        }
    }

    /// The node took the first `n` publishes of this connection.
    fn taken(&mut self, n: u64) {
        let upto = self
            .conn_first
            .saturating_add(n)
            .saturating_sub(1)
            .min(self.next - 1);
        self.confirmed = self.confirmed.max(upto);
        while self.kept > 0 && self.kept_first <= self.confirmed {
            self.pop();
        }
    }

    /// The connection was lost: what it had not confirmed moves to `lost`
    /// (to be taken back), numbering starts afresh for the next one.
    fn lose(&mut self, node: &str) -> Option<Unconfirmed> {
        let last = self.next - 1;
        let first = self.confirmed + 1;
        self.conn_first = self.next;
        self.confirmed = last;
        if self.max == 0 || first > last {
            return None;
        }
        let held = self.kept as u64;
        let mut subjects: Vec<String> = Vec::new();
        let mut at = self.head;
        let mut n = self.kept_first;
        while at < self.frames.len() {
            let len = frame_len(&self.frames[at..]);
            let body = bytes::Bytes::copy_from_slice(&self.frames[at + LEN_PREFIX..at + len]);
            at += len;
            // Frames this client encoded itself: a failure here is a bug,
            // counted as a forgotten publish rather than a panic.
            match ClientFrame::decode(body, usize::MAX) {
                Ok(ClientFrame::Pub(m)) => {
                    if subjects.len() < 16 && !subjects.iter().any(|s| s == &*m.subject) {
                        subjects.push(m.subject.to_string());
                    }
                    self.lost_bytes += kept_cost(&m);
                    self.lost.push((n, m));
                }
                _ => self.forgotten += 1,
            }
            n += 1;
        }
        self.frames.clear();
        self.head = 0;
        self.kept = 0;
        self.kept_first = self.next;
        // Not taken back from an earlier loss: the oldest go first.
        let mut drop = 0;
        while self.lost_bytes > self.max && drop < self.lost.len() {
            self.lost_bytes -= kept_cost(&self.lost[drop].1);
            drop += 1;
        }
        self.lost.drain(..drop);
        self.forgotten += drop as u64;
        self.maybe_lost += last + 1 - first;
        Some(Unconfirmed {
            node: node.into(),
            first,
            last,
            held,
            forgotten: last + 1 - first - held,
            subjects,
        })
    }
}

/// The write side of a stream link, shared by every sender and the writer
/// task of the current connection.
#[derive(Debug, Default)]
pub(crate) struct StreamTx {
    buf: Mutex<TxBuf>,
    wake_writer: Notify,
    drained: Notify,
    /// Wakes the driver when the application closes the client.
    closing: Notify,
    closed: AtomicBool,
}

impl StreamTx {
    /// A write buffer that holds up to `hold_max` bytes of publishes while
    /// failing over, and up to `unconfirmed_max` bytes of publishes the
    /// node has not confirmed (0: none; then nothing is asked of the node).
    pub(crate) fn new(hold_max: usize, unconfirmed_max: usize) -> StreamTx {
        StreamTx {
            buf: Mutex::new(TxBuf {
                hold_max,
                track: Track::new(unconfirmed_max),
                ..TxBuf::default()
            }),
            ..StreamTx::default()
        }
    }

    /// Whether publishes are tracked until the node confirms them (ask
    /// the node with `Confirm` on each connection).
    pub(crate) fn confirms(&self) -> bool {
        self.buf.lock().track.max > 0
    }

    /// The node took the first `n` publishes of this connection.
    pub(crate) fn taken(&self, n: u64) {
        self.buf.lock().track.taken(n);
    }

    /// Takes back the publishes lost nodes may not have taken, oldest
    /// first, with their numbers.
    pub(crate) fn take_unconfirmed(&self) -> Vec<(u64, skiff_proto::Message)> {
        let mut b = self.buf.lock();
        b.track.lost_bytes = 0;
        std::mem::take(&mut b.track.lost)
    }

    /// (unconfirmed now, forgotten, maybe lost) for [`super::LinkStats`].
    pub(crate) fn confirm_counts(&self) -> (u64, u64, u64) {
        let b = self.buf.lock();
        let t = &b.track;
        (t.next - 1 - t.confirmed, t.forgotten, t.maybe_lost)
    }

    /// Appends a frame (`encode` writes it) to the write buffer, waiting
    /// while the buffer is over its high-water mark. Wakes the writer only
    /// when the buffer becomes non-empty: the writer takes all of it at
    /// once, so one wake-up and one write carry every frame queued since.
    /// `hold`: a publish, which may wait in the buffer while failing over.
    /// `publish`: `encode` writes one `Pub` frame, numbered and kept until
    /// the node confirms it.
    pub(crate) async fn send_with(
        &self,
        hold: bool,
        publish: bool,
        mut encode: impl FnMut(&mut Vec<u8>),
    ) -> Result<(), Error> {
        loop {
            if self.try_send_with(hold, publish, &mut encode)? {
                return Ok(());
            }
            let n = self.drained.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.try_send_with(hold, publish, &mut encode)? {
                return Ok(());
            }
            n.await;
        }
    }

    pub(crate) fn try_send_with(
        &self,
        hold: bool,
        publish: bool,
        encode: &mut impl FnMut(&mut Vec<u8>),
    ) -> Result<bool, Error> {
        let mut b = self.buf.lock();
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if let Some(node) = &b.down {
            let node = node.clone();
            return if hold {
                let before = b.out.len();
                let r = b.hold(encode, node);
                if let (Ok(true), true) = (&r, publish) {
                    let b = &mut *b;
                    b.track.sent(&b.out[before..]);
                }
                r
            } else {
                Err(Error::NodeLost { node })
            };
        }
        if b.out.len() >= HIGH_WATER {
            return Ok(false);
        }
        let wake = b.out.is_empty();
        let before = b.out.len();
        encode(&mut b.out);
        if publish {
            let b = &mut *b;
            b.track.sent(&b.out[before..]);
        }
        drop(b);
        if wake {
            self.wake_writer.notify_one();
        }
        Ok(true)
    }

    /// Queues a frame that never waits; refused while failing over.
    pub(crate) fn send_now(&self, f: &ClientFrame) -> Result<(), Error> {
        let mut b = self.buf.lock();
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if let Some(node) = &b.down {
            return Err(Error::NodeLost { node: node.clone() });
        }
        let wake = b.out.is_empty();
        f.encode(&mut b.out);
        drop(b);
        if wake {
            self.wake_writer.notify_one();
        }
        Ok(())
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake_writer.notify_one();
        self.drained.notify_waiters();
        self.closing.notify_one();
    }

    /// Fires when the application closes the client.
    pub(crate) fn closing(&self) -> tokio::sync::futures::Notified<'_> {
        self.closing.notified()
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The link to `node` is lost: what was queued for it is dropped, and
    /// from now on only publishes are taken (held). Returns which
    /// publishes `node` may not have taken.
    pub(crate) fn go_down(&self, node: &str) -> Option<Unconfirmed> {
        let mut b = self.buf.lock();
        b.out.clear();
        b.down = Some(node.into());
        let lost = b.track.lose(node);
        drop(b);
        // Publishers waiting for room: there is room now, or a refusal.
        self.drained.notify_waiters();
        lost
    }

    /// A new node welcomed the client: `first` (the restore) goes out
    /// before the publishes held meanwhile.
    pub(crate) fn go_up(&self, mut first: Vec<u8>) {
        let mut b = self.buf.lock();
        first.append(&mut b.out);
        b.out = first;
        b.down = None;
        drop(b);
        self.wake_writer.notify_one();
    }

    /// Publishes held and refused while failing over, so far.
    pub(crate) fn held_refused(&self) -> (u64, u64) {
        let b = self.buf.lock();
        (b.held, b.refused)
    }
}

impl TxBuf {
    /// Holds a publish while failing over, if it fits.
    fn hold(&mut self, encode: &mut impl FnMut(&mut Vec<u8>), node: String) -> Result<bool, Error> {
        let before = self.out.len();
        encode(&mut self.out);
        if self.out.len() > self.hold_max {
            self.out.truncate(before);
            self.refused += 1;
            return Err(Error::NodeLost { node });
        }
        self.held += 1;
        Ok(true)
    }
}

pub(crate) fn refused(code: Code, text: String) -> Error {
    Error::Refused { code, reason: text }
}

/// Whether `f` may wait in the buffer while failing over (publishes and
/// broadcasts).
pub(crate) fn holds(f: &ClientFrame) -> bool {
    matches!(f, ClientFrame::Pub(_) | ClientFrame::Bcast { .. })
}

/// The read half of a node connection.
#[derive(Debug)]
pub(crate) enum ReadHalf {
    Tcp(tcp::OwnedReadHalf),
    Unix(unix::OwnedReadHalf),
    Tls(tokio::io::ReadHalf<tokio_rustls::client::TlsStream<TcpStream>>),
    /// A node on this host over shared memory (see `shm_stream`).
    #[cfg(not(skiff_loom))]
    Shm(super::shm_stream::ShmRead),
}

/// The write half of a node connection.
#[derive(Debug)]
pub(crate) enum WriteHalf {
    Tcp(tcp::OwnedWriteHalf),
    Unix(unix::OwnedWriteHalf),
    Tls(tokio::io::WriteHalf<tokio_rustls::client::TlsStream<TcpStream>>),
    /// A node on this host over shared memory (see `shm_stream`).
    #[cfg(not(skiff_loom))]
    Shm(super::shm_stream::ShmWrite),
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Tcp(r) => Pin::new(r).poll_read(cx, buf),
            ReadHalf::Unix(r) => Pin::new(r).poll_read(cx, buf),
            ReadHalf::Tls(r) => Pin::new(r).poll_read(cx, buf),
            #[cfg(not(skiff_loom))]
            ReadHalf::Shm(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_write(cx, buf),
            WriteHalf::Unix(w) => Pin::new(w).poll_write(cx, buf),
            WriteHalf::Tls(w) => Pin::new(w).poll_write(cx, buf),
            #[cfg(not(skiff_loom))]
            WriteHalf::Shm(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_flush(cx),
            WriteHalf::Unix(w) => Pin::new(w).poll_flush(cx),
            WriteHalf::Tls(w) => Pin::new(w).poll_flush(cx),
            #[cfg(not(skiff_loom))]
            WriteHalf::Shm(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_shutdown(cx),
            WriteHalf::Unix(w) => Pin::new(w).poll_shutdown(cx),
            WriteHalf::Tls(w) => Pin::new(w).poll_shutdown(cx),
            #[cfg(not(skiff_loom))]
            WriteHalf::Shm(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

/// A connection whose node has welcomed this client.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) r: ReadHalf,
    pub(crate) w: WriteHalf,
    pub(crate) buf: BytesMut,
    /// The node's id for this client.
    pub(crate) client: u64,
    /// The node's payload limit.
    pub(crate) max_payload: u64,
    /// The address's index in the list.
    pub(crate) at: usize,
}

/// Connects to `addr` and reads the node's welcome, within `timeout`.
/// When a TCP connect has not completed after this long, another attempt
/// starts beside it (and again, doubling, up to `SYN_ATTEMPTS`): a lost
/// SYN or SYN-ACK otherwise costs TCP's initial retransmission timeout of
/// 1 s, which a client failing over to its next node would spend without
/// one. A connect on a working network takes one round trip.
const SYN_RETRY: std::time::Duration = std::time::Duration::from_millis(200);

/// Connect attempts that may be in flight at once (see `SYN_RETRY`).
const SYN_ATTEMPTS: u32 = 3;

/// Connects to `addr`, racing a fresh attempt against one whose handshake
/// is slow (see `SYN_RETRY`); the first to connect wins and the others are
/// dropped. An attempt that fails (refused, unreachable) fails the
/// connect: a second SYN would be answered the same way.
async fn connect_tcp(addr: &str) -> io::Result<TcpStream> {
    let mut attempts = tokio::task::JoinSet::new();
    let mut started = 0u32;
    let mut wait = SYN_RETRY;
    loop {
        if started < SYN_ATTEMPTS {
            let addr = addr.to_string();
            attempts.spawn(async move { TcpStream::connect(addr).await });
            started += 1;
        }
        let more = started < SYN_ATTEMPTS;
        let done = tokio::select! {
            r = attempts.join_next() => r,
            _ = tokio::time::sleep(wait), if more => None,
        };
        match done {
            Some(Ok(r)) => return r,
            Some(Err(e)) => return Err(io::Error::other(e)),
            None if !more => {
                return Err(io::Error::other("no connect attempt left"));
            }
            None => wait *= 2,
        }
    }
}

pub(crate) async fn open(addr: &NodeAddr, at: usize, opts: &LinkOptions) -> Result<Session, Error> {
    let timeout = opts.connect_timeout;
    let open = async {
        let mut known = None;
        let (mut r, mut w) = match addr {
            #[cfg(not(skiff_loom))]
            NodeAddr::Shm(locator) => {
                let place = crate::shm::attach::parse(locator)?;
                let rings = crate::shm::attach::client_rendezvous(&place)
                    .await
                    .map_err(super::shm_stream::rendezvous_error)?;
                known = Some((rings.client, rings.max_payload));
                let (r, w) = super::shm_stream::start(rings)
                    .map_err(Error::io("start the shm link's threads"))?;
                (ReadHalf::Shm(r), WriteHalf::Shm(w))
            }
            #[cfg(skiff_loom)]
            NodeAddr::Shm(_) => return Err(Error::Closed),
            NodeAddr::Tcp(a) => {
                let s = connect_tcp(a.as_str())
                    .await
                    .map_err(Error::io("connect to node"))?;
                let _ = s.set_nodelay(true);
                let (r, w) = s.into_split();
                (ReadHalf::Tcp(r), WriteHalf::Tcp(w))
            }
            NodeAddr::Tls(a) => {
                let s = connect_tcp(a.as_str())
                    .await
                    .map_err(Error::io("connect to node"))?;
                let _ = s.set_nodelay(true);
                let cfg = opts.tls.as_ref().ok_or(Error::Closed)?;
                let name = crate::tls::server_name(a).map_err(|e| Error::Refused {
                    code: Code::Invalid,
                    reason: e,
                })?;
                let s = tokio_rustls::TlsConnector::from(cfg.0.clone())
                    .connect(name, s)
                    .await
                    .map_err(Error::io("TLS handshake with node"))?;
                let (r, w) = tokio::io::split(s);
                (ReadHalf::Tls(r), WriteHalf::Tls(w))
            }
            NodeAddr::Unix(p) => {
                let s = UnixStream::connect(PathBuf::from(p))
                    .await
                    .map_err(Error::io("connect to node socket"))?;
                let (r, w) = s.into_split();
                (ReadHalf::Unix(r), WriteHalf::Unix(w))
            }
        };
        let mut buf = BytesMut::with_capacity(64 * 1024);
        // Over shm the rendezvous gave the id and the limit (the node's
        // welcome frame in the ring is skipped by the dispatcher).
        let (client, max_payload) = match known {
            Some(k) => k,
            None => read_welcome(&mut r, &mut w, &mut buf, &opts.creds).await?,
        };
        if let Some(name) = &opts.name {
            let mut out = Vec::new();
            ClientFrame::Hello { name: name.clone() }.encode(&mut out);
            w.write_all(&out)
                .await
                .map_err(Error::io("write to node"))?;
        }
        Ok(Session {
            r,
            w,
            buf,
            client,
            max_payload,
            at,
        })
    };
    tokio::time::timeout(timeout, open)
        .await
        .unwrap_or(Err(Error::Timeout))
}

/// Reads frames until the Welcome: (client id, max payload). A node that
/// asks for authentication first (`Challenge`) is answered once with
/// `creds`' proof.
pub(crate) async fn read_welcome<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    r: &mut R,
    w: &mut W,
    buf: &mut BytesMut,
    creds: &super::target::Creds,
) -> Result<(u64, u64), Error> {
    let dec = Decoder::new(64 * 1024);
    let mut answered = false;
    loop {
        if let Some(body) = dec.next(buf).map_err(|e| Error::Codec(e.to_string()))? {
            return match ServerFrame::decode(body, 0).map_err(|e| Error::Codec(e.to_string()))? {
                ServerFrame::Welcome {
                    client,
                    max_payload,
                } => Ok((client, max_payload)),
                ServerFrame::Challenge { nonce } if !answered => {
                    answered = true;
                    let mut out = Vec::new();
                    ClientFrame::Auth(creds.proof(&nonce)).encode(&mut out);
                    w.write_all(&out)
                        .await
                        .map_err(Error::io("write to node"))?;
                    continue;
                }
                ServerFrame::Error { code, text, .. } => Err(refused(code, text)),
                other => Err(Error::Codec(format!(
                    "the node's first frame was {other:?}, not a welcome"
                ))),
            };
        }
        if r.read_buf(buf).await.map_err(Error::io("read from node"))? == 0 {
            return Err(Error::Closed);
        }
    }
}

/// How a connection ended.
#[derive(Debug)]
pub(crate) enum End {
    /// The application closed the client (or dropped it).
    Closed,
    /// The node closed this client with an error: no failover.
    Fatal(String),
    /// The connection or the node is gone.
    Lost(String),
    /// The node sent a frame this client cannot read (a lost connection
    /// too, but reported as such, not as the node shutting down).
    BadFrame(String),
}

/// What a session's reader needs besides the connection.
pub(crate) struct Reading<'a> {
    pub(crate) max_payload: usize,
    pub(crate) opts: &'a LinkOptions,
    /// Told of every read (see [`crate::spin`]).
    pub(crate) spin: Option<&'a Spin>,
}

/// Reads and dispatches one connection's frames until it ends; pings the
/// node when it is silent for `opts.ping`, and gives it up when it stays
/// silent for `opts.ping_timeout`. Returns how it ended and when bytes
/// were last read from the node (where a gap in what it sent begins).
pub(crate) async fn read_session(
    weak: &Weak<Inner>,
    tx: &StreamTx,
    r: &mut ReadHalf,
    buf: &mut BytesMut,
    how: Reading<'_>,
    writer_done: &mut oneshot::Receiver<()>,
) -> (End, std::time::Instant) {
    let mut last_read = std::time::Instant::now();
    let end = read_frames(weak, tx, r, buf, how, writer_done, &mut last_read).await;
    (end, last_read)
}

async fn read_frames(
    weak: &Weak<Inner>,
    tx: &StreamTx,
    r: &mut ReadHalf,
    buf: &mut BytesMut,
    how: Reading<'_>,
    writer_done: &mut oneshot::Receiver<()>,
    last_read: &mut std::time::Instant,
) -> End {
    let Reading {
        max_payload,
        opts,
        spin,
    } = how;
    let dec = Decoder::new(max_payload + FRAME_OVERHEAD);
    let keepalive = !opts.ping.is_zero();
    let mut heard = tokio::time::Instant::now();
    let mut pinged = false;
    // Armed for when the silence would call for a ping (or for giving up);
    // re-armed only when it fires, not on every read.
    let timer = tokio::time::sleep(opts.ping);
    tokio::pin!(timer);
    loop {
        // Every whole frame read goes to the client as it is decoded (no
        // list of frames between them).
        if !buf.is_empty() {
            let Some(inner) = weak.upgrade() else {
                return End::Closed;
            };
            let mut bad = None;
            let mut bad_msg = None;
            let frames = std::iter::from_fn(|| match dec.next(buf) {
                Ok(Some(body)) => match RawFrame::new(body, max_payload) {
                    Ok(f) => Some(f),
                    Err(e) => {
                        bad = Some(e);
                        None
                    }
                },
                Ok(None) => None,
                Err(e) => {
                    bad = Some(e);
                    None
                }
            });
            match inner.dispatch_inbound(frames, &mut bad_msg) {
                None => {}
                // The node is going away: that is a lost node.
                Some((Code::Shutdown, why)) => return End::Lost(why),
                Some((_, why)) => return End::Fatal(why),
            }
            if let Some(e) = bad.or(bad_msg) {
                return End::BadFrame(format!("bad frame from the node: {e}"));
            }
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(64 * 1024);
        }
        tokio::select! {
            biased;
            _ = tx.closing.notified() => return End::Closed,
            n = r.read_buf(buf) => match n {
                Ok(0) => return End::Lost("the node closed the connection".into()),
                Err(e) => return End::Lost(format!("reading from the node failed: {e}")),
                Ok(_) => {
                    *last_read = std::time::Instant::now();
                    if let Some(s) = spin {
                        s.touch();
                    }
                    if keepalive {
                        heard = tokio::time::Instant::now();
                        pinged = false;
                    }
                }
            },
            _ = &mut *writer_done => {
                return if tx.is_closed() {
                    End::Closed
                } else {
                    End::Lost("writing to the node failed".into())
                };
            }
            () = &mut timer, if keepalive => {
                let silent = heard.elapsed();
                if pinged && silent >= opts.ping_timeout {
                    return End::Lost(format!(
                        "the node did not answer for {:?} (ping_timeout)",
                        opts.ping_timeout
                    ));
                }
                if !pinged && silent >= opts.ping {
                    pinged = true;
                    let _ = tx.send_now(&ClientFrame::Ping { corr: KEEPALIVE });
                }
                let next = if pinged { opts.ping_timeout } else { opts.ping };
                timer.as_mut().reset(heard + next);
            }
        }
    }
}

/// Writes what senders queue until the client closes or a write fails;
/// `done` fires when it stops.
pub(crate) async fn write_loop(tx: Arc<StreamTx>, mut w: WriteHalf, done: oneshot::Sender<()>) {
    let mut out = Vec::with_capacity(64 * 1024);
    loop {
        let n = tx.wake_writer.notified();
        // Let every task that is ready now queue its frames first. A task
        // that wakes this one puts it in tokio's LIFO slot, so without the
        // yield it runs next and writes one frame: 16 requesters answered
        // by one read made 16 writes. Yielding defers it until the worker
        // has run the others and polled its sockets, so one write carries
        // their frames (`bench/RESULTS.md` has the runs).
        tokio::task::yield_now().await;
        {
            let mut b = tx.buf.lock();
            std::mem::swap(&mut b.out, &mut out);
        }
        if out.is_empty() {
            if tx.is_closed() {
                break;
            }
            n.await;
            continue;
        }
        tx.drained.notify_waiters();
        if w.write_all(&out).await.is_err() {
            tx.drained.notify_waiters();
            let _ = done.send(());
            return;
        }
        out.clear();
        if out.capacity() > 4 << 20 {
            out = Vec::with_capacity(64 * 1024);
        }
    }
    let _ = w.shutdown().await;
    let _ = done.send(());
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_proto::Message;

    fn m(i: u64) -> Message {
        Message::new("t.x", i.to_string())
    }

    /// The `Pub` frame of `m(i)`.
    fn f(i: u64) -> Vec<u8> {
        let mut out = Vec::new();
        skiff_proto::client_frame::encode_pub(&mut out, &m(i));
        out
    }

    #[test]
    fn confirmed_publishes_are_let_go_and_the_rest_reported_on_loss() {
        let mut t = Track::new(1 << 20);
        for i in 1..=10 {
            t.sent(&f(i));
        }
        t.taken(4);
        assert_eq!(t.kept, 6);
        // A count that only grows; a stale or forged one changes nothing.
        t.taken(2);
        t.taken(u64::MAX);
        assert_eq!((t.kept, t.bytes()), (0, 0));
        for i in 11..=13 {
            t.sent(&f(i));
        }
        let u = t.lose("a").expect("three unconfirmed");
        assert_eq!((u.first, u.last, u.held, u.forgotten), (11, 13, 3, 0));
        // The next connection counts from 14.
        t.sent(&f(14));
        t.taken(1);
        assert!(t.lose("b").is_none());
        let back: Vec<u64> = t.lost.iter().map(|(n, _)| *n).collect();
        assert_eq!(back, [11, 12, 13]);
        // Handed back as the messages that were published.
        let msgs: Vec<Message> = t.lost.iter().map(|(_, m)| m.clone()).collect();
        assert_eq!(msgs, [m(11), m(12), m(13)]);
    }

    #[test]
    fn a_full_buffer_forgets_the_oldest_and_counts_them() {
        let mut t = Track::new(3 * f(1).len());
        for i in 1..=5 {
            t.sent(&f(i));
        }
        assert_eq!(t.forgotten, 2);
        let u = t.lose("a").unwrap();
        assert_eq!((u.first, u.last, u.held, u.forgotten), (1, 5, 3, 2));
        assert_eq!(t.lost[0].0, 3);
        assert_eq!(t.lost[0].1, m(3));
        // Nothing kept with no buffer, nothing reported.
        let mut off = Track::new(0);
        off.sent(&f(1));
        assert!(off.lose("a").is_none());
    }

    #[test]
    fn many_frames_confirmed_in_steps_keep_the_rest_in_order() {
        // Enough to move the kept frames to the front a few times.
        let mut t = Track::new(1 << 20);
        for i in 1..=5_000 {
            t.sent(&f(i));
            if i % 7 == 0 {
                t.taken(i - 3);
            }
        }
        // The last `taken` (at 4,998) confirmed up to 4,995.
        assert_eq!(t.kept, 5);
        let u = t.lose("a").unwrap();
        assert_eq!((u.first, u.last, u.held), (4_996, 5_000, 5));
        let want: Vec<(u64, Message)> = (4_996..=5_000).map(|i| (i, m(i))).collect();
        assert_eq!(t.lost, want);
    }
}
