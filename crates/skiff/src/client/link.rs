//! How a client's frames reach its node and the node's frames come back:
//! in process ([`MemLink`], frames as values, no copy) or over a byte
//! stream (TCP or a Unix socket: frames encoded into one buffer that a
//! writer task flushes with one system call per batch, and a reader task
//! that decodes and dispatches).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use bytes::BytesMut;
use parking_lot::Mutex;
use skiff_node::frame::{encode_pub, Decoder, FRAME_OVERHEAD};
use skiff_node::{ClientFrame, Code, MemLink, ServerFrame};
use skiff_proto::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;

use super::Inner;
use crate::Error;

/// Bytes buffered for the socket before a publisher waits.
const HIGH_WATER: usize = 1 << 20;

#[derive(Debug)]
pub(crate) enum Link {
    Mem(MemLink),
    Stream(Arc<StreamTx>),
}

#[derive(Debug, Default)]
pub(crate) struct StreamTx {
    buf: Mutex<Vec<u8>>,
    wake_writer: Notify,
    drained: Notify,
    closed: AtomicBool,
}

impl StreamTx {
    /// Appends a frame (`encode` writes it) to the write buffer, waiting
    /// while the buffer is over its high-water mark. Wakes the writer only
    /// when the buffer becomes non-empty: the writer takes all of it at
    /// once, so one wake-up and one write carry every frame queued since.
    async fn send_with(&self, mut encode: impl FnMut(&mut Vec<u8>)) -> Result<(), Error> {
        loop {
            if self.try_send_with(&mut encode)? {
                return Ok(());
            }
            let n = self.drained.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.try_send_with(&mut encode)? {
                return Ok(());
            }
            n.await;
        }
    }

    fn try_send_with(&self, encode: &mut impl FnMut(&mut Vec<u8>)) -> Result<bool, Error> {
        let mut buf = self.buf.lock();
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if buf.len() >= HIGH_WATER {
            return Ok(false);
        }
        let wake = buf.is_empty();
        encode(&mut buf);
        drop(buf);
        if wake {
            self.wake_writer.notify_one();
        }
        Ok(true)
    }
}

fn refused(code: Code, text: String) -> Error {
    Error::Refused { code, reason: text }
}

impl Link {
    /// Sends a frame, waiting while the node (in process) or the socket
    /// buffer pushes back.
    pub(crate) async fn send(&self, f: ClientFrame) -> Result<(), Error> {
        match self {
            Link::Mem(m) => m.send(f).await.map_err(|e| refused(e.code, e.text)),
            Link::Stream(s) => s.send_with(|buf| f.encode(buf)).await,
        }
    }

    /// Publishes `msg` if that needs no wait: over a stream with room in
    /// the write buffer, encodes it straight into the buffer (no frame
    /// built, nothing moved). `None`: send a `Pub` frame instead.
    pub(crate) fn try_publish(&self, msg: &Message) -> Option<Result<(), Error>> {
        match self {
            Link::Stream(s) => match s.try_send_with(&mut |buf: &mut Vec<u8>| encode_pub(buf, msg))
            {
                Ok(true) => Some(Ok(())),
                Ok(false) => None,
                Err(e) => Some(Err(e)),
            },
            Link::Mem(_) => None,
        }
    }

    /// Sends a frame that never waits (credits, acks of tunnels, leave).
    pub(crate) fn send_now(&self, f: ClientFrame) -> Result<(), Error> {
        match self {
            Link::Mem(m) => m.send_control(f).map_err(|e| refused(e.code, e.text)),
            Link::Stream(s) => {
                if s.closed.load(Ordering::Acquire) {
                    return Err(Error::Closed);
                }
                let mut buf = s.buf.lock();
                let wake = buf.is_empty();
                f.encode(&mut buf);
                drop(buf);
                if wake {
                    s.wake_writer.notify_one();
                }
                Ok(())
            }
        }
    }

    /// Closes the link: the node detaches this client.
    pub(crate) fn close(&self) {
        match self {
            Link::Mem(m) => m.close(),
            Link::Stream(s) => {
                s.closed.store(true, Ordering::Release);
                s.wake_writer.notify_one();
                s.drained.notify_waiters();
            }
        }
    }
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

/// Starts the reader and writer tasks of a stream connection.
pub(crate) fn spawn_stream<R, W>(
    inner: &Arc<Inner>,
    tx: Arc<StreamTx>,
    mut r: R,
    mut w: W,
    mut buf: BytesMut,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let weak = Arc::downgrade(inner);
    let max_payload = inner.max_payload;
    tokio::spawn(async move {
        let dec = Decoder::new(max_payload + FRAME_OVERHEAD);
        let mut frames = Vec::new();
        let mut error = None;
        'read: loop {
            loop {
                match dec.next(&mut buf) {
                    Ok(Some(body)) => match ServerFrame::decode(body, max_payload) {
                        Ok(f) => frames.push(f),
                        Err(e) => {
                            error = Some(format!("bad frame from the node: {e}"));
                            break 'read;
                        }
                    },
                    Ok(None) => break,
                    Err(e) => {
                        error = Some(format!("bad frame from the node: {e}"));
                        break 'read;
                    }
                }
            }
            if !frames.is_empty() && !dispatch_weak(&weak, &mut frames) {
                return;
            }
            if buf.capacity() - buf.len() < 4096 {
                buf.reserve(64 * 1024);
            }
            match r.read_buf(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        if let Some(inner) = weak.upgrade() {
            inner.fail(error.unwrap_or_else(|| "the node closed the connection".into()));
        }
    });
    tokio::spawn(async move {
        let mut out = Vec::with_capacity(64 * 1024);
        loop {
            let n = tx.wake_writer.notified();
            {
                let mut buf = tx.buf.lock();
                std::mem::swap(&mut *buf, &mut out);
            }
            if out.is_empty() {
                if tx.closed.load(Ordering::Acquire) {
                    break;
                }
                n.await;
                continue;
            }
            tx.drained.notify_waiters();
            if w.write_all(&out).await.is_err() {
                tx.closed.store(true, Ordering::Release);
                tx.drained.notify_waiters();
                break;
            }
            out.clear();
            if out.capacity() > 4 << 20 {
                out = Vec::with_capacity(64 * 1024);
            }
        }
        let _ = w.shutdown().await;
    });
}

fn dispatch_weak(weak: &Weak<Inner>, frames: &mut Vec<ServerFrame>) -> bool {
    match weak.upgrade() {
        Some(inner) => {
            inner.dispatch(frames);
            true
        }
        None => false,
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
            if !frames.is_empty() && !dispatch_weak(&weak, &mut frames) {
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
