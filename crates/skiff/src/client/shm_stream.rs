//! Shared memory as one more connection of a failover list: a client
//! given several nodes (`shm://a,b?dir=…`, `shm://a,skiff://host:4747`) or
//! `reconnect=true` over `shm://` reaches each shm node through these
//! halves, so the stream link's driver ([`super::failover`]) replaces a
//! lost shm node as it does a lost socket: same restore, same gap, same
//! unconfirmed publishes.
//!
//! [`ShmWrite`] takes whole encoded frames (what the stream link's writer
//! writes) and a thread copies them into the client→node ring in segments
//! of whole frames, waiting there for credits; [`ShmRead`] gets the
//! segments of the node→client ring, copied out by a thread (one copy, as
//! a socket read). The rendezvous socket is watched by a task: its end (the
//! node's process died, even by SIGKILL) ends the read half at once, so
//! the driver sees end of stream and fails over.
//!
//! What this costs against a lone `shm://` client ([`super::shm_link`]): a
//! publish is encoded into the link's write buffer and copied from there
//! into the ring (as a socket write copies it into the kernel), where a
//! lone client encodes it straight into the ring; the node still reads it
//! in place. The write buffer is what keeps publishes while no node is
//! reachable and until a node confirms them.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;

use crate::shm::attach::{whole_frames, ClientRings, FrameWriter};

/// Bytes waiting for the writer thread before `poll_write` pushes back.
const HIGH_WATER: usize = 1 << 20;

/// Segments copied out of the node→client ring and not yet read.
const DOWN_QUEUE: usize = 16;

/// How long a shut-down write half keeps trying to flush to a node that
/// takes nothing.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
struct Up {
    /// Whole frames waiting for the ring.
    pending: Vec<u8>,
    /// The write half was shut down (flush, then close the ring) or
    /// dropped (close at once).
    shut: Option<Instant>,
    dropped: bool,
    /// The node is gone or the ring failed: writes fail.
    lost: Option<String>,
    /// A `poll_write` waiting for room.
    waker: Option<Waker>,
}

#[derive(Debug, Default)]
struct UpShared {
    s: Mutex<Up>,
    wake: Condvar,
}

impl UpShared {
    fn lose(&self, why: &str) {
        let mut s = self.s.lock();
        s.lost.get_or_insert_with(|| why.to_owned());
        let w = s.waker.take();
        drop(s);
        self.wake.notify_one();
        if let Some(w) = w {
            w.wake();
        }
    }
}

/// The write half of a link session over shared memory.
#[derive(Debug)]
pub(crate) struct ShmWrite {
    up: Arc<UpShared>,
    max_seg: usize,
}

/// The read half of a link session over shared memory.
#[derive(Debug)]
pub(crate) struct ShmRead {
    rx: mpsc::Receiver<Bytes>,
    cur: Bytes,
}

/// Starts the threads and the socket's watcher of an attachment made by
/// the rendezvous.
pub(crate) fn start(rings: ClientRings) -> io::Result<(ShmRead, ShmWrite)> {
    let ClientRings {
        socket,
        up,
        mut down,
        down_lost,
        client,
        ..
    } = rings;
    let shared = Arc::new(UpShared::default());
    let max_seg = up.max_segment();
    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel::<()>();
    {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name(format!("skiff-shm-up-{client}"))
            .spawn(move || {
                write_up(up, &shared);
                let _ = done_tx.send(());
            })?;
    }
    let (tx, rx) = mpsc::channel(DOWN_QUEUE);
    std::thread::Builder::new()
        .name(format!("skiff-shm-down-{client}"))
        .spawn(move || loop {
            let mut seg = Vec::new();
            match down.next(&mut seg) {
                Ok(false) => {}
                // The reader half is gone: stop.
                Ok(true) => {
                    if tx.blocking_send(Bytes::from(seg)).is_err() {
                        return;
                    }
                }
                // Closed, lost or corrupt: end of stream for the driver
                // (it fails over or, if the client closed, ends).
                Err(_) => return,
            }
        })?;
    // The socket: its end is the node's end. Once the writer is done (the
    // session was given up or closed) it is closed, which tells the node,
    // and the down ring is marked lost so that its reader ends.
    let up_watch = shared.clone();
    tokio::spawn(async move {
        let mut socket = socket;
        let mut b = [0u8; 64];
        loop {
            tokio::select! {
                r = socket.read(&mut b) => match r {
                    Ok(0) | Err(_) => {
                        up_watch.lose("the node closed its shm socket");
                        down_lost.mark_lost();
                        return;
                    }
                    Ok(_) => {}
                },
                _ = &mut done_rx => {
                    down_lost.mark_lost();
                    return;
                }
            }
        }
    });
    Ok((
        ShmRead {
            rx,
            cur: Bytes::new(),
        },
        ShmWrite {
            up: shared,
            max_seg,
        },
    ))
}

/// The writer thread: what `poll_write` queued goes into the ring in
/// segments of whole frames; ends when the half is dropped, shut down
/// (after flushing) or the node is gone, then closes the ring.
fn write_up(mut w: FrameWriter, up: &UpShared) {
    let mut batch = Vec::new();
    let mut go = || {
        let s = up.s.lock();
        s.lost.is_none() && !s.dropped && s.shut.is_none_or(|t| t.elapsed() < CLOSE_GRACE)
    };
    loop {
        {
            let mut s = up.s.lock();
            while s.pending.is_empty() && s.shut.is_none() && !s.dropped && s.lost.is_none() {
                up.wake.wait(&mut s);
            }
            if s.lost.is_some() || s.dropped || s.pending.is_empty() {
                break;
            }
            std::mem::swap(&mut s.pending, &mut batch);
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        }
        if let Err(e) = w.write_frames(&batch, &mut go) {
            up.lose(&format!("writing to the node's ring failed: {e}"));
            break;
        }
        batch.clear();
        if batch.capacity() > 4 << 20 {
            batch = Vec::new();
        }
    }
    w.close();
}

impl Drop for ShmWrite {
    fn drop(&mut self) {
        let mut s = self.up.s.lock();
        s.dropped = true;
        drop(s);
        self.up.wake.notify_one();
    }
}

fn lost_error(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, why.to_owned())
}

impl AsyncWrite for ShmWrite {
    /// Takes the whole frames at the start of `buf` (at most a segment's
    /// worth). The link's writer writes whole frames only; a buffer that
    /// does not start with a whole frame is refused.
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let mut s = this.up.s.lock();
        if let Some(why) = &s.lost {
            return Poll::Ready(Err(lost_error(why)));
        }
        if s.shut.is_some() {
            return Poll::Ready(Err(lost_error("the shm link was shut down")));
        }
        if s.pending.len() >= HIGH_WATER {
            s.waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let end = whole_frames(buf, 0, this.max_seg.max(1));
        if end == 0 {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a whole frame (or one larger than the ring's half)",
            )));
        }
        let wake = s.pending.is_empty();
        s.pending.extend_from_slice(&buf[..end]);
        drop(s);
        if wake {
            this.up.wake.notify_one();
        }
        Poll::Ready(Ok(end))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// The writer thread flushes what is queued, then closes the ring;
    /// the socket closes after it.
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut s = self.up.s.lock();
        s.shut.get_or_insert_with(Instant::now);
        drop(s);
        self.up.wake.notify_one();
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for ShmRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while this.cur.is_empty() {
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(b)) => this.cur = b,
                // The node's ring ended: end of stream.
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = this.cur.len().min(buf.remaining());
        buf.put_slice(&this.cur.split_to(n));
        Poll::Ready(Ok(()))
    }
}

/// Why an shm node could not be reached, as the failover driver reports
/// it.
pub(crate) fn rendezvous_error(e: crate::shm::attach::Rendezvous) -> crate::Error {
    use crate::shm::attach::Rendezvous;
    match e {
        Rendezvous::NoNode(source) => crate::Error::Io {
            what: "no node serves shared memory under this name and dir= (start one with `skiff node --shm NAME`); connecting to its socket",
            source,
        },
        Rendezvous::Refused(reason) => crate::Error::Refused {
            code: skiff_proto::client_frame::Code::Shutdown,
            reason,
        },
    }
}
