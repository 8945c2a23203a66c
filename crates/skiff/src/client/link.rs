//! How a client's frames reach its node and the node's frames come back:
//! in process ([`LocalLink`], frames as values, no copy) or over a byte
//! stream (TCP or a Unix socket: frames encoded into one buffer that a
//! writer task flushes with one system call per batch).
//!
//! A stream link is driven by one task per client: it reads and
//! dispatches, pings a silent node, and when the link is lost either fails
//! the client or, with a failover list, connects to the next node and
//! restores the client there (see [`super::failover`]). The write buffer
//! ([`StreamTx`]) outlives connections; while no node is reachable it holds
//! publishes only, up to a bound.

use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime};

use crate::spin::Spin;
use bytes::BytesMut;
use parking_lot::Mutex;
use skiff_proto::client_frame::{encode_pub, Decoder, FRAME_OVERHEAD};
use skiff_proto::client_frame::{ClientFrame, Code, ServerFrame};

use super::embed::LocalLink;
use skiff_proto::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{tcp, unix, TcpStream, UnixStream};
use tokio::sync::{oneshot, Notify};

use super::failover::{Gap, LinkOptions, NodeAddr, NodeTarget, BACKOFF_MAX, BACKOFF_MIN};
use super::{Inner, RawFrame};
use crate::Error;

/// Bytes buffered for the socket before a publisher waits.
const HIGH_WATER: usize = 1 << 20;

/// `corr` of keepalive pings (never a waiter's: ids start at 1).
const KEEPALIVE: u64 = 0;

#[derive(Debug)]
pub(crate) enum Link {
    Mem(Box<dyn LocalLink>),
    Stream(Arc<StreamTx>),
    /// Shared memory with a node on this host (`shm://`).
    #[cfg(not(skiff_loom))]
    Shm(Arc<super::shm_link::ShmTx>),
}

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
    /// failing over.
    pub(crate) fn new(hold_max: usize) -> StreamTx {
        StreamTx {
            buf: Mutex::new(TxBuf {
                hold_max,
                ..TxBuf::default()
            }),
            ..StreamTx::default()
        }
    }

    /// Appends a frame (`encode` writes it) to the write buffer, waiting
    /// while the buffer is over its high-water mark. Wakes the writer only
    /// when the buffer becomes non-empty: the writer takes all of it at
    /// once, so one wake-up and one write carry every frame queued since.
    /// `hold`: a publish, which may wait in the buffer while failing over.
    async fn send_with(
        &self,
        hold: bool,
        mut encode: impl FnMut(&mut Vec<u8>),
    ) -> Result<(), Error> {
        loop {
            if self.try_send_with(hold, &mut encode)? {
                return Ok(());
            }
            let n = self.drained.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.try_send_with(hold, &mut encode)? {
                return Ok(());
            }
            n.await;
        }
    }

    fn try_send_with(
        &self,
        hold: bool,
        encode: &mut impl FnMut(&mut Vec<u8>),
    ) -> Result<bool, Error> {
        let mut b = self.buf.lock();
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if let Some(node) = &b.down {
            let node = node.clone();
            return if hold {
                b.hold(encode, node)
            } else {
                Err(Error::NodeLost { node })
            };
        }
        if b.out.len() >= HIGH_WATER {
            return Ok(false);
        }
        let wake = b.out.is_empty();
        encode(&mut b.out);
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

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake_writer.notify_one();
        self.drained.notify_waiters();
        self.closing.notify_one();
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The link to `node` is lost: what was queued for it is dropped, and
    /// from now on only publishes are taken (held).
    pub(crate) fn go_down(&self, node: &str) {
        let mut b = self.buf.lock();
        b.out.clear();
        b.down = Some(node.into());
        drop(b);
        // Publishers waiting for room: there is room now, or a refusal.
        self.drained.notify_waiters();
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

fn refused(code: Code, text: String) -> Error {
    Error::Refused { code, reason: text }
}

fn holds(f: &ClientFrame) -> bool {
    matches!(f, ClientFrame::Pub(_) | ClientFrame::Bcast { .. })
}

impl Link {
    /// Sends a frame, waiting while the node (in process) or the socket
    /// buffer pushes back.
    pub(crate) async fn send(&self, f: ClientFrame) -> Result<(), Error> {
        match self {
            Link::Mem(m) => m.send(f).await.map_err(|e| refused(e.code, e.text)),
            Link::Stream(s) => s.send_with(holds(&f), |buf| f.encode(buf)).await,
            #[cfg(not(skiff_loom))]
            Link::Shm(s) => s.send(f).await,
        }
    }

    /// Publishes `msg` if that needs no wait: over a stream with room in
    /// the write buffer, encodes it straight into the buffer (no frame
    /// built, nothing moved). `None`: send a `Pub` frame instead.
    pub(crate) fn try_publish(&self, msg: &Message) -> Option<Result<(), Error>> {
        match self {
            Link::Stream(s) => {
                match s.try_send_with(true, &mut |buf: &mut Vec<u8>| encode_pub(buf, msg)) {
                    Ok(true) => Some(Ok(())),
                    Ok(false) => None,
                    Err(e) => Some(Err(e)),
                }
            }
            #[cfg(not(skiff_loom))]
            Link::Shm(s) => s.try_publish(msg),
            Link::Mem(_) => None,
        }
    }

    /// Sends a frame that never waits (credits, acks of tunnels, leave).
    pub(crate) fn send_now(&self, f: ClientFrame) -> Result<(), Error> {
        match self {
            Link::Mem(m) => m.send_control(f).map_err(|e| refused(e.code, e.text)),
            Link::Stream(s) => s.send_now(&f),
            #[cfg(not(skiff_loom))]
            Link::Shm(s) => s.send_now(f),
        }
    }

    /// Closes the link: the node detaches this client.
    pub(crate) fn close(&self) {
        match self {
            Link::Mem(m) => m.close(),
            Link::Stream(s) => s.close(),
            #[cfg(not(skiff_loom))]
            Link::Shm(s) => s.close(),
        }
    }
}

/// The read half of a node connection.
#[derive(Debug)]
pub(crate) enum ReadHalf {
    Tcp(tcp::OwnedReadHalf),
    Unix(unix::OwnedReadHalf),
}

/// The write half of a node connection.
#[derive(Debug)]
pub(crate) enum WriteHalf {
    Tcp(tcp::OwnedWriteHalf),
    Unix(unix::OwnedWriteHalf),
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
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_flush(cx),
            WriteHalf::Unix(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_shutdown(cx),
            WriteHalf::Unix(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

/// A connection whose node has welcomed this client.
#[derive(Debug)]
pub(crate) struct Session {
    r: ReadHalf,
    w: WriteHalf,
    buf: BytesMut,
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

pub(crate) async fn open(
    addr: &NodeAddr,
    at: usize,
    timeout: std::time::Duration,
) -> Result<Session, Error> {
    let open = async {
        let (mut r, w) = match addr {
            NodeAddr::Tcp(a) => {
                let s = connect_tcp(a.as_str())
                    .await
                    .map_err(Error::io("connect to node"))?;
                let _ = s.set_nodelay(true);
                let (r, w) = s.into_split();
                (ReadHalf::Tcp(r), WriteHalf::Tcp(w))
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
        let (client, max_payload) = read_welcome(&mut r, &mut buf).await?;
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

/// Reads frames until the Welcome: (client id, max payload).
pub(crate) async fn read_welcome<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
) -> Result<(u64, u64), Error> {
    let dec = Decoder::new(64 * 1024);
    loop {
        if let Some(body) = dec.next(buf).map_err(|e| Error::Codec(e.to_string()))? {
            return match ServerFrame::decode(body, 0).map_err(|e| Error::Codec(e.to_string()))? {
                ServerFrame::Welcome {
                    client,
                    max_payload,
                } => Ok((client, max_payload)),
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
enum End {
    /// The application closed the client (or dropped it).
    Closed,
    /// The node closed this client with an error: no failover.
    Fatal(String),
    /// The connection or the node is gone.
    Lost(String),
}

/// Starts the task that drives a stream link from its first session on.
pub(crate) fn spawn_stream(
    inner: &Arc<Inner>,
    tx: Arc<StreamTx>,
    target: NodeTarget,
    first: Session,
) {
    tokio::spawn(drive(Arc::downgrade(inner), tx, target, first));
}

/// Ends a link's spinner with the link.
struct SpinGuard(Option<Arc<Spin>>);

impl Drop for SpinGuard {
    fn drop(&mut self) {
        if let Some(s) = &self.0 {
            s.close();
        }
    }
}

async fn drive(weak: Weak<Inner>, tx: Arc<StreamTx>, target: NodeTarget, first: Session) {
    let opts = &target.opts;
    let mut s = first;
    // The gap being reported: the node first lost and when.
    let mut open_gap: Option<(String, SystemTime, Instant)> = None;
    let spin = SpinGuard(Spin::start(opts.spin));
    loop {
        let (done, mut writer_done) = oneshot::channel();
        let writer = tokio::spawn(write_loop(tx.clone(), s.w, done));
        let end = read_session(
            &weak,
            &tx,
            &mut s.r,
            &mut s.buf,
            Reading {
                max_payload: s.max_payload as usize,
                opts,
                spin: spin.0.as_deref(),
            },
            &mut writer_done,
        )
        .await;
        let why = match end {
            // The writer flushes what is queued, then shuts the socket.
            End::Closed => {
                if let Some(inner) = weak.upgrade() {
                    inner.shut(None);
                }
                return;
            }
            End::Lost(why) if opts.reconnect => why,
            End::Fatal(why) | End::Lost(why) => {
                writer.abort();
                if let Some(inner) = weak.upgrade() {
                    inner.fail(why);
                }
                return;
            }
        };
        // Nothing more goes to the old connection.
        writer.abort();
        let _ = writer.await;
        let lost = target.addrs[s.at].to_string();
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let now = SystemTime::now();
        // A node lost before it confirmed the restore: the gap that began
        // with the previous loss goes on.
        let unconfirmed = inner.lost(&tx, &lost, now, why);
        drop(inner);
        if !unconfirmed || open_gap.is_none() {
            open_gap = Some((lost, now, Instant::now()));
        }
        let (from, down_at, down) = open_gap.clone().expect("set");
        let mut at = s.at;
        let mut attempts = 0u32;
        let mut in_round = 0;
        let mut backoff = BACKOFF_MIN;
        let next = loop {
            at = (at + 1) % target.addrs.len();
            attempts = attempts.saturating_add(1);
            let r = tokio::select! {
                r = open(&target.addrs[at], at, opts.connect_timeout) => r,
                _ = tx.closing.notified() => return closed_between_nodes(&weak),
            };
            if tx.is_closed() || weak.strong_count() == 0 {
                return closed_between_nodes(&weak);
            }
            if let Ok(s) = r {
                break s;
            }
            // A round with no node: wait a little (with jitter, so that
            // the clients of a dead node do not come back in step).
            in_round += 1;
            if in_round == target.addrs.len() {
                in_round = 0;
                let wait = backoff.mul_f64(0.75 + rand::random::<f64>() / 2.0);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = tx.closing.notified() => return closed_between_nodes(&weak),
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        };
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let gap = Gap {
            from,
            to: target.addrs[at].to_string(),
            down_at,
            up_at: SystemTime::now(),
            down_for: down.elapsed(),
            attempts,
        };
        inner.restore(&tx, gap, next.client, next.max_payload);
        drop(inner);
        s = next;
    }
}

/// The application closed the client while it had no node: everything
/// waiting ends.
fn closed_between_nodes(weak: &Weak<Inner>) {
    if let Some(inner) = weak.upgrade() {
        inner.shut(None);
    }
}

/// What a session's reader needs besides the connection.
struct Reading<'a> {
    max_payload: usize,
    opts: &'a LinkOptions,
    /// Told of every read (see [`crate::spin`]).
    spin: Option<&'a Spin>,
}

/// Reads and dispatches one connection's frames until it ends; pings the
/// node when it is silent for `opts.ping`, and gives it up when it stays
/// silent for `opts.ping_timeout`.
async fn read_session(
    weak: &Weak<Inner>,
    tx: &StreamTx,
    r: &mut ReadHalf,
    buf: &mut BytesMut,
    how: Reading<'_>,
    writer_done: &mut oneshot::Receiver<()>,
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
                return End::Lost(format!("bad frame from the node: {e}"));
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
async fn write_loop(tx: Arc<StreamTx>, mut w: WriteHalf, done: oneshot::Sender<()>) {
    let mut out = Vec::with_capacity(64 * 1024);
    loop {
        let n = tx.wake_writer.notified();
        // Let every task that is ready now queue its frames first. A task
        // that wakes this one puts it in tokio's LIFO slot, so without the
        // yield it runs next and writes one frame: 16 requesters answered
        // by one read made 16 writes. Yielding defers it until the worker
        // has run the others and polled its sockets; measured (`skiff bench
        // request`, 16 requesters, node and clients spinning): 182 k to
        // 245 k requests/s on two CPUs, 170 k to 277 k on one; one
        // requester's p50 29 to 32 µs.
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

fn dispatch_weak(weak: &Weak<Inner>, frames: &mut Vec<ServerFrame>) -> Option<bool> {
    let inner = weak.upgrade()?;
    match inner.dispatch(frames.drain(..)) {
        None => Some(true),
        Some((_, why)) => {
            inner.fail(why);
            Some(false)
        }
    }
}

/// Starts the task that moves an in-process client's frames from its
/// outbox in the node to its subscriptions.
pub(crate) fn spawn_mem(inner: &Arc<Inner>) {
    let weak = Arc::downgrade(inner);
    let Some(Link::Mem(m)) = &inner.link else {
        return;
    };
    // The task holds the outbox, not the client: dropping the client
    // detaches it, which closes the outbox and ends the task.
    let out = m.outbox();
    tokio::spawn(async move {
        let mut frames = Vec::new();
        loop {
            let more = out.next_batch(&mut frames).await;
            if !frames.is_empty() && dispatch_weak(&weak, &mut frames) != Some(true) {
                return;
            }
            if !more {
                if let Some(inner) = weak.upgrade() {
                    inner.fail("the node closed the connection".into());
                }
                return;
            }
        }
    });
}
