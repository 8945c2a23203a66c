//! The datagram queue: its socket, its send and receive state, and the
//! calls an application makes. How a push leaves is in `send`, how a pop
//! finds its message in `recv`.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde::{de::DeserializeOwned, Serialize};
use skiff_proto::loss::LossDetector;
use skiff_proto::{wire, Batcher, BatcherConfig, Dest, Message};

use super::recv::{Rx, RxCounters};
use super::send::Tx;
use super::{decode_typed, multicast, typed_message, Drops, QueueConfig, QueueStats};
use crate::error::Error;
use crate::udp::{RecvBatch, UdpSocket};

/// A datagram queue's state, shared by the application's threads and the
/// flusher thread.
#[derive(Debug)]
pub(super) struct Inner {
    pub(super) config: QueueConfig,
    pub(super) socket: UdpSocket,
    pub(super) local: SocketAddr,
    pub(super) tx: Mutex<Tx>,
    pub(super) rx: Mutex<Rx>,
    /// The receive counters as of the last receive, for `stats` while a
    /// blocking pop holds `rx`.
    pub(super) rx_counters: RxCounters,
    pub(super) wake: Condvar,
    pub(super) shutdown: AtomicBool,
    /// Set while a `pop_blocking` waits in the kernel holding `rx`.
    pub(super) waiting: AtomicBool,
    /// Set when a pop hands out a message; the next idle-path push is then
    /// taken for a reply and sent at once.
    pub(super) popped: AtomicBool,
    pub(super) async_fd: OnceLock<tokio::io::unix::AsyncFd<OwnedFd>>,
    /// When the queue was bound: the date natural batching gives every
    /// batch, whose deadline it never reads.
    pub(super) epoch: Instant,
}

/// A batched, asynchronous datagram queue; see the [module
/// documentation](super). Normally used through [`Queue`](super::Queue).
///
/// `DatagramQueue` is `Send + Sync`: share it with `Arc` to push and pop
/// from several threads. Dropping it flushes what is queued and stops its
/// flusher thread.
#[derive(Debug)]
pub struct DatagramQueue {
    pub(super) inner: Arc<Inner>,
    flusher: Option<JoinHandle<()>>,
}

/// Datagrams per `recvmmsg`.
const RECV_SLOTS: usize = 32;

impl DatagramQueue {
    /// Binds a queue: `udp://0.0.0.0:4711?qthresh=512&timeout=200ms`.
    /// Options are listed on [`QueueConfig`].
    pub fn bind(locator: &str) -> Result<DatagramQueue, Error> {
        DatagramQueue::with_config(QueueConfig::from_locator(locator)?)
    }

    /// Binds a queue with an explicit configuration (`reliable` ignored).
    pub fn with_config(config: QueueConfig) -> Result<DatagramQueue, Error> {
        let socket =
            UdpSocket::bind(config.bind, &config.udp).map_err(Error::io("bind UDP socket"))?;
        multicast::setup(&socket, &config)?;
        if let Some(p) = config.peer {
            socket.connect(p).map_err(Error::io("connect to peer"))?;
        }
        let local = socket
            .local_addr()
            .map_err(Error::io("read local address"))?;
        let source = rand::random::<u64>();
        let batcher = Batcher::new(BatcherConfig {
            qthresh: config.qthresh,
            timeout: config.timeout,
            max_datagram: config.max_datagram,
            max_destinations: config.max_destinations,
            source,
        });
        let slot = if config.udp.gro {
            65_536
        } else {
            wire::MAX_DATAGRAM + 1
        };
        let inner = Arc::new(Inner {
            tx: Mutex::new(Tx {
                batcher,
                out: VecDeque::new(),
                out_bytes: 0,
                pool: Vec::new(),
                in_flight: false,
                sending: Vec::new(),
                alone: Vec::new(),
                last_send_end: None,
                send_cost: Duration::ZERO,
                flusher_parked: false,
                flusher_until: None,
                last_error: None,
                stats: QueueStats::default(),
            }),
            rx: Mutex::new(Rx {
                batch: RecvBatch::new(RECV_SLOTS, slot),
                arrived: VecDeque::new(),
                loss: LossDetector::new(config.max_sources),
                verdicts: Vec::new(),
                stats: QueueStats::default(),
            }),
            rx_counters: RxCounters::default(),
            config,
            socket,
            local,
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            waiting: AtomicBool::new(false),
            popped: AtomicBool::new(false),
            async_fd: OnceLock::new(),
            epoch: Instant::now(),
        });
        let i = inner.clone();
        let flusher = std::thread::Builder::new()
            .name("skiff-flusher".into())
            .spawn(move || i.flusher())
            .map_err(Error::io("spawn flusher thread"))?;
        Ok(DatagramQueue {
            inner,
            flusher: Some(flusher),
        })
    }

    /// The bound address (with the port the OS chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local
    }

    /// Makes this a point-to-point queue with `peer` (locator option
    /// `peer`; once per queue): the kernel then delivers only `peer`'s
    /// datagrams (others are refused before the queue sees them, with an
    /// ICMP port-unreachable to their sender, and are not counted here),
    /// and a lone message to `peer` leaves by `send(2)` on the connected
    /// socket, which keeps the route instead of looking it up per call.
    /// Pushes to other addresses still go. After the peer refused a
    /// datagram (an ICMP port-unreachable: nothing bound there), the next
    /// send fails once with "connection refused" and its message is counted
    /// in `dropped.send_error`. Why: a queue that talks to one peer need
    /// not pay for being able to talk to many: the connected calls skip the
    /// address copy and the route lookup of every send.
    pub fn connect(&self, peer: SocketAddr) -> Result<(), Error> {
        self.inner
            .socket
            .connect(peer)
            .map_err(Error::io("connect to peer"))
    }

    /// The peer of a point-to-point queue ([`DatagramQueue::connect`]).
    pub fn peer(&self) -> Option<SocketAddr> {
        self.inner.socket.peer()
    }

    /// The configuration in force.
    pub fn config(&self) -> &QueueConfig {
        &self.inner.config
    }

    /// Queues `msg` for `dest` (a `SocketAddr` works: any endpoint there).
    /// Copies the message into the destination's batch; never waits on the
    /// network. Fails only if the message can never be sent as it is (too
    /// large: the error names the limit) or a limit is reached.
    pub fn push(&self, dest: impl Into<Dest>, msg: &Message) -> Result<(), Error> {
        self.inner.push(dest.into(), msg)
    }

    /// Serializes `value` (postcard) and pushes it with its Rust type name as
    /// the message type, for
    /// [`Queue::try_pop_typed`](super::Queue::try_pop_typed) (CMQ's
    /// polymorphic queue).
    pub fn push_typed<T: Serialize>(&self, dest: impl Into<Dest>, value: &T) -> Result<(), Error> {
        self.push(dest, &typed_message(value)?)
    }

    /// Hands everything queued to the kernel now, whatever its age or
    /// size, waiting while the socket's send buffer is full. Reports the
    /// last send error since the previous flush, if any (the messages
    /// concerned are counted in `dropped.send_error`).
    pub fn flush(&self) -> Result<(), Error> {
        let inner = &self.inner;
        loop {
            let mut tx = inner.tx.lock();
            tx.batcher.flush();
            inner.collect(&mut tx);
            if tx.out.is_empty() && !tx.in_flight {
                break;
            }
            inner.drain(tx, true, true);
            let tx = inner.tx.lock();
            if !tx.out.is_empty() {
                drop(tx);
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        match inner.tx.lock().last_error.take() {
            Some(e) => Err(Error::Io {
                what: "send",
                source: io::Error::other(e),
            }),
            None => Ok(()),
        }
    }

    /// The next received message, or `None` at once if there is none
    /// (CMQ's `cwPop`).
    pub fn try_pop(&self) -> Option<Message> {
        let m = self.inner.try_pop();
        if m.is_some() {
            self.inner.popped();
        }
        m
    }

    /// Moves up to `max` received messages into `out` without blocking;
    /// returns how many. Cheaper per message than `try_pop` in a loop.
    pub fn try_pop_many(&self, out: &mut Vec<Message>, max: usize) -> usize {
        let n = self.inner.pop_many(out, max);
        if n > 0 {
            self.inner.popped();
        }
        n
    }

    /// Waits up to `timeout` (forever with `None`) for a message. The wait
    /// happens inside the receive system call, so a message costs one call
    /// as in a plain blocking `recv`. While one thread waits here, `try_pop`
    /// on other threads returns `None` rather than wait behind it.
    ///
    /// The first wait is given the whole `timeout` and reads no clock; only
    /// if it ends without a message to hand out (the datagram was refused,
    /// a signal interrupted the call) is a deadline set, `timeout` from
    /// then, so such a pop may wait up to twice `timeout` in all.
    pub fn pop_blocking(&self, timeout: Option<Duration>) -> Option<Message> {
        let mut deadline: Option<Instant> = None;
        let mut first = true;
        loop {
            let mut rx = self.inner.rx.lock();
            let m = rx.take();
            if m.is_some() {
                self.inner.popped();
                return m;
            }
            let left = match timeout {
                Some(t) if !first => {
                    let now = Instant::now();
                    let d = *deadline.get_or_insert(now + t);
                    if now >= d {
                        return None;
                    }
                    Some(d - now)
                }
                t => t,
            };
            first = false;
            self.inner.waiting.store(true, Ordering::Relaxed);
            let mut m = None;
            let got = self.inner.fill(&mut rx, Some(left), &mut m);
            self.inner.waiting.store(false, Ordering::Relaxed);
            if m.is_some() {
                self.inner.popped();
                return m;
            }
            if got.is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock) {
                // The kernel's receive timeout, `left`, passed.
                return None;
            }
        }
    }

    /// Waits for the next message (tokio). Must be called inside a tokio
    /// runtime with I/O enabled.
    pub async fn pop(&self) -> Result<Message, Error> {
        let fd = match self.inner.async_fd.get() {
            Some(fd) => fd,
            None => {
                let fd = self
                    .inner
                    .socket
                    .register_async(tokio::io::Interest::READABLE)
                    .map_err(Error::io("register socket with tokio"))?;
                let _ = self.inner.async_fd.set(fd);
                self.inner.async_fd.get().expect("just set")
            }
        };
        loop {
            if let Some(m) = self.try_pop() {
                return Ok(m);
            }
            let mut guard = fd
                .readable()
                .await
                .map_err(Error::io("wait for datagrams"))?;
            if let Some(m) = self.try_pop() {
                return Ok(m);
            }
            guard.clear_ready();
        }
    }

    /// Pops the next message and deserializes it as `T`; `None` if nothing
    /// is waiting. A message of another type is consumed and reported as
    /// [`Error::TypeMismatch`].
    pub fn try_pop_typed<T: DeserializeOwned>(&self) -> Option<Result<T, Error>> {
        self.try_pop().map(|m| decode_typed(&m))
    }

    /// Counters: sent, received, lost, dropped by reason.
    pub fn stats(&self) -> QueueStats {
        let tx = self.inner.tx.lock().stats.clone();
        // A `pop_blocking` may hold the receive state while it waits in the
        // kernel; then the counters come from the copy the last receive left.
        let rx = match self.inner.rx.try_lock() {
            Some(rx) => rx.counters(),
            None => self.inner.rx_counters.load(),
        };
        let mut rx = rx;
        // The socket's own drop counter is read now, not at the next arrival.
        if let Ok(k) = self.inner.socket.kernel_drops() {
            rx.dropped.kernel = rx.dropped.kernel.max(k);
        }
        QueueStats {
            sent_messages: tx.sent_messages,
            sent_bytes: tx.sent_bytes,
            sent_batches: tx.sent_batches,
            send_calls: tx.send_calls,
            dropped: Drops {
                backlog: tx.dropped.backlog,
                send_error: tx.dropped.send_error,
                ..rx.dropped
            },
            ..rx
        }
    }
}

impl Drop for DatagramQueue {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::Release);
        {
            let _tx = self.inner.tx.lock();
            self.inner.wake.notify_all();
        }
        if let Some(h) = self.flusher.take() {
            let _ = h.join();
        }
    }
}
