//! The datagram queue (CMQ): `push` to an address, `pop` what arrived.
//!
//! A [`Queue`] owns one UDP socket. `push` copies the message into its
//! destination's batch (a [`Batcher`]) and never waits on the network; a
//! batch leaves as one datagram when it reaches `qthresh` bytes, when its
//! oldest message is `timeout` old, when the next message would not fit, or
//! on [`Queue::flush`]. `try_pop` never blocks either (CMQ's `cwPop`): it
//! hands out what was already received, else reads whatever the socket holds
//! in one `recvmmsg`, else returns `None`.
//!
//! **Natural batching** (`timeout=0`, the default): a push that finds the
//! path idle sends at once on the caller's thread, so a lone message costs
//! one system call and no hand-off; while a send is in flight (or one has
//! just finished), pushes only append, and a flusher thread sends whatever
//! accumulated as one batch. Low latency at low load, full datagrams at high
//! load, nothing to tune.
//!
//! Delivery is best effort. What is guaranteed: a message is delivered at
//! most once; each message a source numbered for this queue is either
//! delivered or counted in [`QueueStats::lost`]; every datagram or message
//! dropped on purpose is counted in [`QueueStats::dropped`] under its
//! reason, including the kernel's own receive-buffer drops.
//!
//! **Reliable queues** (`udp://…?reliable=true`): the same calls over QMP
//! associations, one per destination: exactly once, in order, flow
//! controlled; see [`reliable`]. [`Queue`] is either kind, chosen by the
//! locator; [`DatagramQueue`] and [`ReliableQueue`] are the two kinds.

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use serde::{de::DeserializeOwned, Serialize};
use skiff_proto::error::Reason;
use skiff_proto::loss::LossDetector;
use skiff_proto::{wire, Batcher, BatcherConfig, Dest, Message, Verdict};

use crate::error::{Error, LocatorError};
use crate::locator::{self, Locator};
use crate::udp::{MulticastInterface, Outgoing, Received, RecvBatch, UdpConfig, UdpSocket};

pub mod reliable;

pub use reliable::ReliableQueue;

/// Options of a `udp://` queue locator, with their defaults.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// Address to bind.
    pub bind: SocketAddr,
    /// Seal a batch at this many bytes (`qthresh`); default: `max_datagram`.
    pub qthresh: usize,
    /// Seal a batch when its oldest message is this old (`timeout`); zero is
    /// natural batching (the default).
    pub timeout: Duration,
    /// Largest datagram built (`max_datagram`), default 1472 (one Ethernet
    /// frame over IPv4); up to 65507.
    pub max_datagram: usize,
    /// This queue's endpoint id (`endpoint`); datagrams for another id are
    /// dropped. Default 0.
    pub endpoint: u32,
    /// Most destinations with batching state (`max_destinations`).
    pub max_destinations: usize,
    /// Most sources whose sequence numbers are tracked (`max_sources`).
    pub max_sources: usize,
    /// Bytes of datagrams that may wait for a full socket send buffer
    /// before further ones are dropped and counted (`max_backlog`).
    pub max_backlog: usize,
    /// Socket options.
    pub udp: UdpConfig,
    /// Multicast groups to join at bind (`join`, repeatable).
    pub join: Vec<IpAddr>,
    /// The IPv4 interface address for multicast joins and sends
    /// (`interface`), e.g. 127.0.0.1; default: the kernel's choice.
    pub interface: Option<std::net::Ipv4Addr>,
    /// Push over associations, exactly once and in order (`reliable`,
    /// default false); see [`reliable`]. Then `max_backlog` bounds each
    /// destination's backlog, `endpoint` is the association service id,
    /// `max_datagram` the association MTU, and the association options
    /// below apply.
    pub reliable: bool,
    /// The associations' settings when `reliable`: `window` (packets),
    /// `idle_timeout`, `handshake_timeout`, `max_message`.
    pub association: skiff_proto::association::AssociationConfig,
    /// A point-to-point queue's one peer (`peer`), e.g. 10.0.0.2:4711; see
    /// [`DatagramQueue::connect`]. Default: none (any peer).
    pub peer: Option<SocketAddr>,
}

const OPTIONS: &str =
    "qthresh, timeout, max_datagram, endpoint, max_destinations, max_sources, max_backlog, \
                       sndbuf, rcvbuf, gso, gro, multicast_loop, ttl, reuse, join, interface, \
                       reliable, window, idle_timeout, handshake_timeout, max_message, peer";

impl QueueConfig {
    /// Parses a `udp://host:port?…` locator.
    pub fn from_locator(s: &str) -> Result<QueueConfig, LocatorError> {
        let l: Locator = s.parse()?;
        l.expect_scheme("udp")?;
        let mut c = QueueConfig {
            bind: l.socket_addr()?,
            qthresh: 0,
            timeout: Duration::ZERO,
            max_datagram: 1472,
            endpoint: 0,
            max_destinations: 1 << 20,
            max_sources: 4096,
            max_backlog: 4 << 20,
            udp: UdpConfig::default(),
            join: Vec::new(),
            interface: None,
            reliable: false,
            association: skiff_proto::association::AssociationConfig::default(),
            peer: None,
        };
        l.options(OPTIONS, |k, v| {
            match k {
                "qthresh" => c.qthresh = locator::parse_bytes(k, v)?,
                "timeout" => c.timeout = locator::parse_duration(k, v)?,
                "max_datagram" => {
                    c.max_datagram = locator::parse_bytes(k, v)?;
                    if !(wire::HEADER_LEN + 16..=wire::MAX_DATAGRAM).contains(&c.max_datagram) {
                        return Err(LocatorError::BadValue {
                            name: k.into(),
                            value: v.into(),
                            expected: "a datagram size from 42 to 65507 bytes",
                        });
                    }
                }
                "endpoint" => {
                    c.endpoint = locator::parse_uint(k, v, "an endpoint id from 0 to 4294967294")?
                }
                "max_destinations" => {
                    c.max_destinations = locator::parse_uint(k, v, "a positive count")?
                }
                "max_sources" => c.max_sources = locator::parse_uint(k, v, "a positive count")?,
                "max_backlog" => c.max_backlog = locator::parse_bytes(k, v)?,
                "sndbuf" => c.udp.send_buffer = Some(locator::parse_bytes(k, v)?),
                "rcvbuf" => c.udp.recv_buffer = Some(locator::parse_bytes(k, v)?),
                "gso" => c.udp.gso = locator::parse_bool(k, v)?,
                "gro" => c.udp.gro = locator::parse_bool(k, v)?,
                "multicast_loop" => c.udp.multicast_loop = locator::parse_bool(k, v)?,
                "ttl" => c.udp.multicast_ttl = locator::parse_uint(k, v, "a TTL from 0 to 255")?,
                "reuse" => c.udp.reuse_addr = locator::parse_bool(k, v)?,
                "join" => c.join.push(v.parse().map_err(|_| LocatorError::BadValue {
                    name: k.into(),
                    value: v.into(),
                    expected: "a multicast group address such as 239.1.2.3 or ff02::1:5",
                })?),
                "interface" => {
                    c.interface = Some(v.parse().map_err(|_| LocatorError::BadValue {
                        name: k.into(),
                        value: v.into(),
                        expected: "the IPv4 address of a local interface, e.g. 127.0.0.1",
                    })?)
                }
                "reliable" => c.reliable = locator::parse_bool(k, v)?,
                "window" => {
                    let w: u64 = locator::parse_uint(k, v, "a positive packet count")?;
                    c.association.recv_window = w.max(1);
                    c.association.send_window = w.max(1);
                }
                "idle_timeout" => c.association.idle_timeout = locator::parse_duration(k, v)?,
                "handshake_timeout" => {
                    c.association.handshake_timeout = locator::parse_duration(k, v)?
                }
                "max_message" => c.association.max_message = locator::parse_bytes(k, v)? as u64,
                "peer" => {
                    c.peer = Some(v.parse().map_err(|_| LocatorError::BadValue {
                        name: k.into(),
                        value: v.into(),
                        expected: "an IP address and port, e.g. 127.0.0.1:4711 or [::1]:4711",
                    })?)
                }
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        if c.endpoint == Dest::ANY {
            return Err(LocatorError::BadValue {
                name: "endpoint".into(),
                value: c.endpoint.to_string(),
                expected: "an endpoint id from 0 to 4294967294 (4294967295 means any)",
            });
        }
        if c.qthresh == 0 || c.qthresh > c.max_datagram {
            c.qthresh = c.max_datagram;
        }
        if c.reliable && c.peer.is_some() {
            return Err(LocatorError::BadValue {
                name: "peer".into(),
                value: format!("{:?}", c.peer),
                expected: "no peer with reliable=true (associations have their own peers)",
            });
        }
        Ok(c)
    }
}

/// Counters of one queue. Everything dropped on purpose is in `dropped`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueStats {
    /// Messages handed to the kernel.
    pub sent_messages: u64,
    /// Bytes handed to the kernel (datagram bytes, headers included).
    pub sent_bytes: u64,
    /// Datagrams handed to the kernel.
    pub sent_batches: u64,
    /// System calls that sent (one may carry many datagrams).
    pub send_calls: u64,
    /// Messages delivered to `pop`.
    pub recv_messages: u64,
    /// Bytes of accepted datagrams.
    pub recv_bytes: u64,
    /// Datagrams accepted.
    pub recv_batches: u64,
    /// Messages numbered by a source for this queue that never arrived.
    pub lost: u64,
    /// Gaps later filled by a late (reordered) message.
    pub recovered: u64,
    /// Drops by reason.
    pub dropped: Drops,
}

/// Drop counters by reason. Datagram-level reasons count datagrams;
/// message-level ones count messages.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Drops {
    /// Datagrams not starting with skiff's magic.
    pub foreign: u64,
    /// Datagrams of another wire version.
    pub version: u64,
    /// Datagrams of a frame kind this queue does not handle.
    pub kind: u64,
    /// Datagrams cut short.
    pub truncated: u64,
    /// Datagrams that do not decode.
    pub malformed: u64,
    /// Datagrams with a length over a limit.
    pub oversized: u64,
    /// Datagrams for another endpoint id.
    pub endpoint: u64,
    /// Messages received twice.
    pub duplicate: u64,
    /// Messages older than the reorder window (already counted lost).
    pub stale: u64,
    /// Datagrams the kernel dropped because the receive buffer was full.
    pub kernel: u64,
    /// Outgoing messages dropped because the send backlog was full.
    pub backlog: u64,
    /// Outgoing messages dropped because the kernel refused the send.
    pub send_error: u64,
    /// Sources forgotten because `max_sources` was reached.
    pub sources_evicted: u64,
    /// Reliable queues: messages pushed that may not have arrived, because
    /// their association failed before acknowledging them (or the peer's
    /// `max_message` refused them). Always 0 on a datagram queue.
    pub unconfirmed: u64,
}

impl Drops {
    fn count_wire(&mut self, reason: &str) {
        match reason {
            "foreign" => self.foreign += 1,
            "version" => self.version += 1,
            "kind" => self.kind += 1,
            "truncated" => self.truncated += 1,
            "oversized" => self.oversized += 1,
            _ => self.malformed += 1,
        }
    }

    /// Sum over all reasons.
    pub fn total(&self) -> u64 {
        self.foreign
            + self.version
            + self.kind
            + self.truncated
            + self.malformed
            + self.oversized
            + self.endpoint
            + self.duplicate
            + self.stale
            + self.kernel
            + self.backlog
            + self.send_error
            + self.unconfirmed
    }
}

/// A datagram ready to go.
#[derive(Debug)]
struct Pending {
    dest: SocketAddr,
    buf: Vec<u8>,
    segment_size: Option<usize>,
    segments: usize,
    messages: usize,
}

#[derive(Debug)]
struct Tx {
    batcher: Batcher,
    out: VecDeque<Pending>,
    out_bytes: usize,
    pool: Vec<Vec<u8>>,
    /// One thread at a time sends, so datagrams to a destination leave in
    /// order; the others only append.
    in_flight: bool,
    /// The datagrams of the send in progress (kept for its allocation).
    sending: Vec<Pending>,
    /// The buffer of the lone-datagram path (see `Inner::send_alone`).
    alone: Vec<u8>,
    last_send_end: Option<Instant>,
    /// Smoothed duration of one send system call.
    send_cost: Duration,
    flusher_parked: bool,
    flusher_until: Option<Instant>,
    last_error: Option<String>,
    stats: QueueStats,
}

/// A received, validated datagram whose messages are handed out one by one,
/// each decoded straight into the caller's hands.
#[derive(Debug)]
struct Arrived {
    batch: wire::Batch,
    from: SocketAddr,
    /// Verdicts per message when the loss detector refused some; empty when
    /// all are delivered (the common case).
    verdicts: Vec<Verdict>,
}

#[derive(Debug)]
struct Rx {
    batch: RecvBatch,
    arrived: VecDeque<Arrived>,
    loss: LossDetector,
    verdicts: Vec<Verdict>,
    stats: QueueStats,
}

impl Rx {
    /// The next received message, if any.
    #[inline]
    fn take(&mut self) -> Option<Message> {
        if self.arrived.is_empty() {
            return None;
        }
        self.take_arrived()
    }

    /// `take` when something arrived: out of line, so that the common
    /// check for nothing stays small where it is inlined.
    #[inline(never)]
    fn take_arrived(&mut self) -> Option<Message> {
        loop {
            let a = self.arrived.front_mut()?;
            let index = a.batch.header().count as usize - a.batch.remaining();
            match a.batch.next_from(Some(a.from)) {
                Some(m) => {
                    if a.verdicts
                        .get(index)
                        .is_some_and(|v| *v != Verdict::Deliver)
                    {
                        continue;
                    }
                    return Some(m);
                }
                None => {
                    self.arrived.pop_front();
                }
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.arrived.is_empty()
    }

    /// The receive-side counters, loss included.
    fn counters(&self) -> QueueStats {
        let mut s = self.stats.clone();
        let l = self.loss.stats();
        s.lost = l.lost;
        s.recovered = l.recovered;
        s.dropped.duplicate = l.duplicates;
        s.dropped.stale = l.stale;
        s.dropped.sources_evicted = l.evicted;
        s.dropped.kernel = self.batch.kernel_drops();
        s
    }
}

/// The receive-side counters of [`QueueStats`] as of the last receive,
/// readable without the receive lock: one relaxed store per counter per
/// receive, no lock and no copy on the receive path. Each counter is exact;
/// a reading taken during a store may mix two receives' values.
#[derive(Debug, Default)]
struct RxCounters([AtomicU64; RX_COUNTERS]);

const RX_COUNTERS: usize = 16;

impl RxCounters {
    /// The counters of `rx`, in the order `load` reads them; what
    /// [`Rx::counters`] gives, without copying the whole [`QueueStats`].
    fn fields(rx: &Rx) -> [u64; RX_COUNTERS] {
        let (s, l) = (&rx.stats, rx.loss.stats());
        let d = &s.dropped;
        [
            s.recv_messages,
            s.recv_bytes,
            s.recv_batches,
            l.lost,
            l.recovered,
            d.foreign,
            d.version,
            d.kind,
            d.truncated,
            d.malformed,
            d.oversized,
            d.endpoint,
            l.duplicates,
            l.stale,
            rx.batch.kernel_drops(),
            l.evicted,
        ]
    }

    fn store(&self, rx: &Rx) {
        for (a, v) in self.0.iter().zip(RxCounters::fields(rx)) {
            a.store(v, Ordering::Relaxed);
        }
    }

    fn load(&self) -> QueueStats {
        // In the order of `fields`.
        let v = self.0.each_ref().map(|a| a.load(Ordering::Relaxed));
        QueueStats {
            recv_messages: v[0],
            recv_bytes: v[1],
            recv_batches: v[2],
            lost: v[3],
            recovered: v[4],
            dropped: Drops {
                foreign: v[5],
                version: v[6],
                kind: v[7],
                truncated: v[8],
                malformed: v[9],
                oversized: v[10],
                endpoint: v[11],
                duplicate: v[12],
                stale: v[13],
                kernel: v[14],
                sources_evicted: v[15],
                ..Drops::default()
            },
            ..QueueStats::default()
        }
    }
}

#[derive(Debug)]
struct Inner {
    config: QueueConfig,
    socket: UdpSocket,
    local: SocketAddr,
    tx: Mutex<Tx>,
    rx: Mutex<Rx>,
    /// The receive counters as of the last receive, for `stats` while a
    /// blocking pop holds `rx`.
    rx_counters: RxCounters,
    wake: Condvar,
    shutdown: AtomicBool,
    /// Set while a `pop_blocking` waits in the kernel holding `rx`.
    waiting: AtomicBool,
    /// Set when a pop hands out a message; the next idle-path push is then
    /// taken for a reply and sent at once.
    popped: AtomicBool,
    async_fd: OnceLock<tokio::io::unix::AsyncFd<OwnedFd>>,
    /// When the queue was bound: the date natural batching gives every
    /// batch, whose deadline it never reads.
    epoch: Instant,
}

/// A batched, asynchronous datagram queue; see the module documentation.
/// Normally used through [`Queue`].
///
/// `DatagramQueue` is `Send + Sync`: share it with `Arc` to push and pop
/// from several threads. Dropping it flushes what is queued and stops its
/// flusher thread.
#[derive(Debug)]
pub struct DatagramQueue {
    inner: Arc<Inner>,
    flusher: Option<JoinHandle<()>>,
}

/// Datagrams per `sendmmsg`.
const SEND_BATCH: usize = 64;
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
        let iface = config.interface.map(MulticastInterface::Addr);
        if let Some(i) = iface {
            socket
                .set_multicast_interface(i)
                .map_err(Error::io("set multicast interface"))?;
        }
        for g in &config.join {
            socket
                .join_multicast(*g, iface)
                .map_err(Error::io("join multicast group"))?;
        }
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
    /// in `dropped.send_error`. Why: a queue that talks to one
    /// peer need not pay for being able to talk to many; on the development
    /// VM the connected calls make a ping-pong 0.3 µs shorter (4.3 against
    /// 4.6–4.7 µs; `bench/RESULTS.md`).
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
    /// the message type, for [`Queue::try_pop_typed`] (CMQ's polymorphic
    /// queue).
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

    /// Joins a multicast group on this queue's socket.
    pub fn join_multicast(&self, group: IpAddr) -> Result<(), Error> {
        self.inner
            .socket
            .join_multicast(group, self.iface())
            .map_err(Error::io("join multicast group"))
    }

    /// Leaves a multicast group.
    pub fn leave_multicast(&self, group: IpAddr) -> Result<(), Error> {
        self.inner
            .socket
            .leave_multicast(group, self.iface())
            .map_err(Error::io("leave multicast group"))
    }

    fn iface(&self) -> Option<MulticastInterface> {
        self.inner.config.interface.map(MulticastInterface::Addr)
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

/// Builds a message carrying `value` serialized with postcard, typed with
/// its Rust type name.
pub fn typed_message<T: Serialize>(value: &T) -> Result<Message, Error> {
    let payload = postcard::to_allocvec(value).map_err(|e| Error::Codec(e.to_string()))?;
    Ok(Message::from_payload(payload).with_kind(type_tag::<T>()))
}

/// Deserializes a message built by [`typed_message`] as `T`, checking the
/// type first.
pub fn decode_typed<T: DeserializeOwned>(msg: &Message) -> Result<T, Error> {
    let tag = type_tag::<T>();
    if msg.kind.as_deref() != Some(tag) {
        return Err(Error::TypeMismatch {
            expected: tag.to_string(),
            found: msg.kind.as_ref().map(|k| k.to_string()),
        });
    }
    postcard::from_bytes(&msg.payload).map_err(|e| Error::Codec(e.to_string()))
}

fn type_tag<T>() -> &'static str {
    let name = std::any::type_name::<T>();
    if name.len() <= wire::MAX_KIND {
        return name;
    }
    let mut end = wire::MAX_KIND;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

impl Inner {
    fn natural(&self) -> bool {
        self.config.timeout.is_zero()
    }

    fn push(&self, dest: Dest, msg: &Message) -> Result<(), Error> {
        // The clock is read only when a decision needs it: to date a new
        // batch, or to tell a lone push from a burst.
        let mut clock: Option<Instant> = None;
        let mut now = || *clock.get_or_insert_with(Instant::now);
        let mut tx = self.tx.lock();
        if self.natural() {
            // Send on this thread only if the path is idle: nothing else
            // waits, and either this push answers a message popped since
            // the last send (request/reply: latency matters, and the
            // exchange itself paces the sends), or the application is not
            // pushing faster than sends complete (the time since the last
            // send ended exceeds half a send's duration). Otherwise this is
            // a burst, and the flusher sends what accumulates: batches grow
            // exactly when sending one by one could not keep up.
            let idle = !tx.in_flight && tx.batcher.queued() == 0 && tx.out_bytes == 0;
            // A plain load first: the store (a cache-line write) only when set.
            let reply = idle && self.popped.load(Ordering::Relaxed);
            if reply {
                self.popped.store(false, Ordering::Relaxed);
            }
            let cost = tx.send_cost / 2;
            let burst = idle
                && !reply
                && tx
                    .last_send_end
                    .is_some_and(|t| now().saturating_duration_since(t) < cost);
            if idle && !burst {
                // The message becomes a datagram of its own at once; a
                // reply's send is paced by the exchange: not timed.
                return self.send_alone(tx, dest, msg, !reply);
            }
            // Natural batching never reads a batch's date (nothing waits
            // for a deadline: the flusher seals everything it finds), so a
            // fixed one saves the clock read.
            tx.batcher.push_with_clock(|| self.epoch, dest, msg)?;
            // While a send is in flight, its thread picks this up when the
            // call returns; otherwise the flusher does.
            if !tx.in_flight && tx.flusher_parked {
                tx.flusher_parked = false;
                self.wake.notify_one();
            }
            return Ok(());
        }
        let opened = tx.batcher.queued() == 0;
        tx.batcher.push_with_clock(&mut now, dest, msg)?;
        if tx.in_flight {
            // The thread sending now picks this up when its call returns.
            return Ok(());
        }
        if !tx.batcher.has_transmit() {
            // A new batch has a deadline; the flusher must know if it sleeps
            // longer than that.
            if opened
                && tx
                    .flusher_until
                    .is_none_or(|u| u > now() + self.config.timeout)
            {
                self.wake.notify_one();
            }
            return Ok(());
        }
        self.collect(&mut tx);
        self.drain(tx, false, true);
        Ok(())
    }

    /// Sends `msg` as a datagram of its own on this thread, on an idle
    /// path: no send queue, no pooled buffer, one system call between two
    /// short holds of the lock.
    fn send_alone(
        &self,
        mut tx: parking_lot::MutexGuard<'_, Tx>,
        dest: Dest,
        msg: &Message,
        timed: bool,
    ) -> Result<(), Error> {
        let mut buf = std::mem::take(&mut tx.alone);
        buf.clear();
        let t = match tx.batcher.push_alone(dest, msg, &mut buf) {
            Ok(Some(t)) => t,
            Ok(None) => {
                // Something is queued after all: it leaves first, this
                // after it, through the flusher.
                tx.alone = buf;
                tx.batcher.push_with_clock(|| self.epoch, dest, msg)?;
                if tx.flusher_parked {
                    tx.flusher_parked = false;
                    self.wake.notify_one();
                }
                return Ok(());
            }
            Err(e) => {
                tx.alone = buf;
                return Err(e.into());
            }
        };
        tx.in_flight = true;
        drop(tx);
        let started = timed.then(Instant::now);
        let out = Outgoing {
            dest: t.dest.addr,
            data: &buf,
            segment_size: None,
        };
        let r = match self.socket.send(&[out]) {
            Ok(0) => Err(io::Error::from(io::ErrorKind::WouldBlock)),
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        };
        let ended = started.map(|s| (s, Instant::now()));
        let mut tx = self.tx.lock();
        tx.in_flight = false;
        tx.stats.send_calls += 1;
        if let Some((started, ended)) = ended {
            tx.last_send_end = Some(ended);
            tx.send_cost = (tx.send_cost * 7 + (ended - started)) / 8;
        }
        match r {
            Ok(()) => {
                tx.stats.sent_messages += 1;
                tx.stats.sent_bytes += buf.len() as u64;
                tx.stats.sent_batches += 1;
                tx.alone = buf;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // The flusher retries once the socket has room, ahead of
                // anything pushed meanwhile.
                tx.out_bytes += buf.len();
                tx.out.push_front(Pending {
                    dest: t.dest.addr,
                    buf,
                    segment_size: None,
                    segments: 1,
                    messages: 1,
                });
                self.wake.notify_one();
                return Ok(());
            }
            Err(e) => {
                tx.stats.dropped.send_error += 1;
                tx.last_error = Some(e.to_string());
                tx.alone = buf;
            }
        }
        // What was pushed during the call leaves now.
        if tx.batcher.queued() > 0 || !tx.out.is_empty() {
            tx.batcher.flush();
            self.collect(&mut tx);
            self.drain(tx, false, true);
        }
        Ok(())
    }

    /// Moves sealed batches from the batcher to the send queue.
    fn collect(&self, tx: &mut Tx) {
        let segs = self.socket.max_segments().max(1);
        loop {
            let mut buf = tx.pool.pop().unwrap_or_default();
            let Some(t) = tx.batcher.poll_transmit(&mut buf, segs) else {
                tx.pool.push(buf);
                break;
            };
            tx.out_bytes += t.size;
            tx.out.push_back(Pending {
                dest: t.dest.addr,
                buf,
                segment_size: t.segment_size,
                segments: t.segments,
                messages: t.messages,
            });
        }
        self.trim_backlog(tx);
    }

    /// Over the backlog limit, drops the oldest datagrams and counts them.
    fn trim_backlog(&self, tx: &mut Tx) {
        while tx.out_bytes > self.config.max_backlog {
            let Some(p) = tx.out.pop_front() else { break };
            tx.out_bytes -= p.buf.len();
            tx.stats.dropped.backlog += p.messages as u64;
            tx.pool.push(p.buf);
        }
    }

    /// Sends the send queue, releasing the lock during system calls. Only one
    /// thread sends at a time. With `wait`, waits for another sender to
    /// finish rather than leaving the work to it. With `timed`, the calls
    /// are timed for the burst test of natural batching (`send_cost`,
    /// `last_send_end`); a reply's send is not, and reads no clock.
    fn drain<'a>(&'a self, mut tx: parking_lot::MutexGuard<'a, Tx>, wait: bool, timed: bool) {
        if tx.in_flight {
            if !wait {
                return;
            }
            while tx.in_flight {
                drop(tx);
                std::thread::yield_now();
                tx = self.tx.lock();
            }
        }
        // Reused between calls: sending allocates nothing.
        let mut batch = std::mem::take(&mut tx.sending);
        while !tx.out.is_empty() {
            tx.in_flight = true;
            let n = tx.out.len().min(SEND_BATCH);
            batch.extend(tx.out.drain(..n));
            drop(tx);
            let started = timed.then(Instant::now);
            let (sent, calls, result) = self.send_pending(&batch);
            let ended = started.map(|s| (s, Instant::now()));
            tx = self.tx.lock();
            tx.in_flight = false;
            tx.stats.send_calls += u64::from(calls);
            if let Some((started, ended)) = ended {
                tx.last_send_end = Some(ended);
                let cost = (ended - started) / calls.max(1);
                tx.send_cost = (tx.send_cost * 7 + cost) / 8;
            }
            let mut rest = batch.drain(..);
            for p in rest.by_ref().take(sent) {
                tx.out_bytes -= p.buf.len();
                tx.stats.sent_messages += p.messages as u64;
                tx.stats.sent_bytes += p.buf.len() as u64;
                tx.stats.sent_batches += p.segments as u64;
                tx.pool.push(p.buf);
            }
            if let Err(e) = result {
                let would_block = e.kind() == io::ErrorKind::WouldBlock;
                if !would_block {
                    // The first datagram was refused (e.g. unreachable or
                    // too big for the path): drop it, count it, go on with
                    // the rest.
                    if let Some(p) = rest.next() {
                        tx.out_bytes -= p.buf.len();
                        tx.stats.dropped.send_error += p.messages as u64;
                        tx.pool.push(p.buf);
                    }
                    tx.last_error = Some(e.to_string());
                }
                // Put the rest back in front, in order.
                for p in rest.rev() {
                    tx.out.push_front(p);
                }
                if would_block {
                    // The flusher retries once the socket has room.
                    tx.sending = batch;
                    self.wake.notify_one();
                    return;
                }
            } else {
                drop(rest);
            }
            if tx.pool.len() > 256 {
                tx.pool.truncate(256);
            }
            // In natural batching, what was pushed during the call leaves now.
            if self.natural() && tx.batcher.queued() > 0 {
                tx.batcher.flush();
                self.collect(&mut tx);
            }
        }
        tx.sending = batch;
    }

    /// Hands `batch` to the kernel without holding the lock; returns how
    /// many datagrams went, the system calls made, and the error that
    /// stopped it, if any.
    fn send_pending(&self, batch: &[Pending]) -> (usize, u32, io::Result<()>) {
        fn outgoing(p: &Pending) -> Outgoing<'_> {
            Outgoing {
                dest: p.dest,
                data: &p.buf,
                segment_size: p.segment_size,
            }
        }
        if let [p] = batch {
            // The lone datagram of a quiet path (a request, a reply).
            return match self.socket.send(&[outgoing(p)]) {
                Ok(0) => (0, 1, Err(io::ErrorKind::WouldBlock.into())),
                Ok(_) => (1, 1, Ok(())),
                Err(e) => (0, 1, Err(e)),
            };
        }
        let mut out: Vec<Outgoing<'_>> = batch.iter().map(outgoing).collect();
        let (mut sent, mut calls) = (0, 0);
        while sent < batch.len() {
            calls += 1;
            match self.socket.send(&out) {
                Ok(0) => return (sent, calls, Err(io::ErrorKind::WouldBlock.into())),
                Ok(k) => {
                    let k = k.min(out.len());
                    sent += k;
                    out.drain(..k);
                }
                Err(e) => return (sent, calls, Err(e)),
            }
        }
        (sent, calls, Ok(()))
    }

    fn flusher(&self) {
        let mut tx = self.tx.lock();
        loop {
            let now = Instant::now();
            let stopping = self.shutdown.load(Ordering::Acquire);
            if self.natural() || stopping {
                tx.batcher.flush();
            } else {
                tx.batcher.handle_timeout(now);
            }
            self.collect(&mut tx);
            if !tx.out.is_empty() && !tx.in_flight {
                let before = tx.out.len();
                self.drain(tx, stopping, true);
                tx = self.tx.lock();
                if tx.out.len() < before || tx.out.is_empty() {
                    continue;
                }
                // The socket was full: wait a little before retrying.
                if stopping {
                    return;
                }
                tx.flusher_until = Some(now + Duration::from_micros(200));
                let _ = self.wake.wait_for(&mut tx, Duration::from_micros(200));
                continue;
            }
            if stopping {
                return;
            }
            if self.natural() {
                tx.flusher_parked = true;
                tx.flusher_until = None;
                self.wake.wait(&mut tx);
                tx.flusher_parked = false;
            } else {
                let until = tx.batcher.poll_timeout();
                tx.flusher_until = until;
                tx.flusher_parked = true;
                match until {
                    Some(t) => {
                        let _ = self.wake.wait_until(&mut tx, t);
                    }
                    None => self.wake.wait(&mut tx),
                }
                tx.flusher_parked = false;
            }
        }
    }

    /// Notes that a pop handed out a message (see `popped`).
    fn popped(&self) {
        self.popped.store(true, Ordering::Relaxed);
    }

    fn try_pop(&self) -> Option<Message> {
        let mut rx = self.lock_rx()?;
        if let Some(m) = rx.take() {
            return Some(m);
        }
        let mut m = None;
        let _ = self.fill(&mut rx, None, &mut m);
        m
    }

    /// The receive state, or `None` if another thread is waiting inside the
    /// kernel with it (the non-blocking calls must not wait behind it).
    fn lock_rx(&self) -> Option<parking_lot::MutexGuard<'_, Rx>> {
        if self.waiting.load(Ordering::Relaxed) {
            self.rx.try_lock()
        } else {
            Some(self.rx.lock())
        }
    }

    fn pop_many(&self, out: &mut Vec<Message>, max: usize) -> usize {
        if max == 0 {
            return 0;
        }
        let Some(mut rx) = self.lock_rx() else {
            return 0;
        };
        let mut n = 0;
        if rx.is_empty() {
            let mut m = None;
            let _ = self.fill(&mut rx, None, &mut m);
            if let Some(m) = m {
                out.push(m);
                n = 1;
            }
        }
        while n < max {
            let Some(a) = rx.arrived.front_mut() else {
                break;
            };
            if a.verdicts.is_empty() {
                // All delivered: decode straight into `out`.
                n += a.batch.next_into(out, max - n, Some(a.from));
                if a.batch.remaining() == 0 {
                    rx.arrived.pop_front();
                }
            } else {
                let Some(m) = rx.take() else { break };
                out.push(m);
                n += 1;
            }
        }
        n
    }

    /// Reads what the socket holds in one `recvmmsg` and validates it;
    /// with `wait`, first waits up to that long (forever with `Some(None)`)
    /// for one datagram. Call only with nothing left in `rx.arrived`, and
    /// `first` empty: the first message received is put there, for the
    /// caller to hand out (built in place: a message is large); the rest
    /// wait in `rx.arrived`. Returns what the receive call returned.
    fn fill(
        &self,
        rx: &mut Rx,
        wait: Option<Option<Duration>>,
        first: &mut Option<Message>,
    ) -> io::Result<usize> {
        debug_assert!(rx.arrived.is_empty() && first.is_none());
        let Rx {
            batch,
            arrived,
            loss,
            verdicts,
            stats,
            ..
        } = rx;
        let got = match wait {
            None => self.socket.recv(batch),
            Some(t) => self.socket.recv_wait(batch, t),
        };
        let received = got?;
        for d in batch.drain() {
            // The first datagram, when it carries one message (a request
            // or a reply): decoded in one pass and handed out directly.
            if first.is_none() && arrived.is_empty() && !d.truncated {
                if let Some(h) = wire::Batch::single_into(&d.data, Some(d.from), first) {
                    let len = d.data.len() as u64;
                    if judge(&self.config, &h, len, loss, verdicts, stats) == 0 {
                        *first = None;
                    }
                    continue;
                }
            }
            self.admit_received(d, loss, verdicts, stats, arrived);
        }
        self.rx_counters.store(rx);
        if first.is_none() {
            *first = rx.take();
        }
        Ok(received)
    }
}

impl Inner {
    /// Validates what one receive slot holds (a datagram, a GRO run, or a
    /// buffer that may be a run) and queues its messages in `arrived`;
    /// counts what is refused. Kept out of line: the request/reply path
    /// (`fill`'s lone message) stays short, in instructions and in code
    /// the CPU must fetch after each wake-up.
    #[inline(never)]
    fn admit_received(
        &self,
        d: Received,
        loss: &mut LossDetector,
        verdicts: &mut Vec<Verdict>,
        stats: &mut QueueStats,
        arrived: &mut VecDeque<Arrived>,
    ) {
        if d.truncated {
            stats.dropped.truncated += 1;
            return;
        }
        let from = d.from;
        if d.maybe_run {
            self.accept_maybe_run(from, d.data, loss, verdicts, stats, arrived);
            return;
        }
        for data in d.into_datagrams() {
            if let Some(a) = accept(&self.config, from, data, loss, verdicts, stats) {
                arrived.push_back(a);
            }
        }
    }

    /// A buffer that a waiting receive on a GRO socket took: the kernel
    /// does not say whether it coalesced a run. Most often it did not, and
    /// the buffer is one valid datagram. If it is refused as one, the
    /// batches say where they end (`wire::run_stride`); if not even that,
    /// it is refused whole.
    fn accept_maybe_run(
        &self,
        from: SocketAddr,
        data: Bytes,
        loss: &mut LossDetector,
        verdicts: &mut Vec<Verdict>,
        stats: &mut QueueStats,
        arrived: &mut VecDeque<Arrived>,
    ) {
        let len = data.len() as u64;
        let (e, data) = match wire::Batch::try_new(data) {
            Ok(b) => {
                arrived.extend(admit(&self.config, from, b, len, loss, verdicts, stats));
                return;
            }
            Err(refused) => refused,
        };
        let Some(stride) = wire::run_stride(&data) else {
            stats.dropped.count_wire(e.reason());
            return;
        };
        let run = Received {
            from,
            data,
            segment_size: Some(stride),
            maybe_run: false,
            truncated: false,
        };
        for data in run.into_datagrams() {
            arrived.extend(accept(&self.config, from, data, loss, verdicts, stats));
        }
    }
}

/// Validates one datagram and judges its messages with the loss detector;
/// counts everything refused.
fn accept(
    config: &QueueConfig,
    from: SocketAddr,
    data: Bytes,
    loss: &mut LossDetector,
    verdicts: &mut Vec<Verdict>,
    stats: &mut QueueStats,
) -> Option<Arrived> {
    let len = data.len() as u64;
    match wire::Batch::new(data) {
        Ok(b) => admit(config, from, b, len, loss, verdicts, stats),
        Err(e) => {
            stats.dropped.count_wire(e.reason());
            None
        }
    }
}

/// Judges the messages of a valid datagram of `len` bytes with the loss
/// detector; counts what is refused.
fn admit(
    config: &QueueConfig,
    from: SocketAddr,
    batch: wire::Batch,
    len: u64,
    loss: &mut LossDetector,
    verdicts: &mut Vec<Verdict>,
    stats: &mut QueueStats,
) -> Option<Arrived> {
    if judge(config, batch.header(), len, loss, verdicts, stats) == 0 {
        return None;
    }
    Some(Arrived {
        batch,
        from,
        verdicts: std::mem::take(verdicts),
    })
}

/// Judges the messages of a valid datagram of `len` bytes with header `h`:
/// its endpoint, then each message with the loss detector, leaving the
/// verdicts in `verdicts` (empty when all are delivered). Counts what is
/// refused; returns how many messages are delivered.
#[inline]
fn judge(
    config: &QueueConfig,
    h: &wire::Header,
    len: u64,
    loss: &mut LossDetector,
    verdicts: &mut Vec<Verdict>,
    stats: &mut QueueStats,
) -> u64 {
    if h.endpoint != config.endpoint && h.endpoint != Dest::ANY {
        stats.dropped.endpoint += 1;
        return 0;
    }
    let count = u64::from(h.count);
    let delivered = if loss.check_run(h.source, h.base_seq, count, verdicts) {
        verdicts.clear();
        count
    } else {
        verdicts.iter().filter(|v| **v == Verdict::Deliver).count() as u64
    };
    stats.recv_messages += delivered;
    stats.recv_batches += 1;
    stats.recv_bytes += len;
    delivered
}

/// A queue: [`push`](Queue::push) to an address, [`try_pop`](Queue::try_pop)
/// or [`pop`](Queue::pop) what arrived. The locator chooses the kind:
/// best-effort datagrams ([`DatagramQueue`], the default; see the module
/// documentation) or, with `reliable=true`, associations ([`ReliableQueue`]:
/// exactly once, in order, flow controlled).
///
/// `Queue` is `Send + Sync`: share it with `Arc` to push and pop from
/// several threads.
#[derive(Debug)]
pub struct Queue(Kind);

#[derive(Debug)]
enum Kind {
    Datagram(DatagramQueue),
    Reliable(Box<ReliableQueue>),
}

impl Queue {
    /// Binds a queue: `udp://0.0.0.0:4711?qthresh=512&timeout=200ms`, or
    /// `udp://0.0.0.0:4711?reliable=true`. Options are listed on
    /// [`QueueConfig`].
    pub fn bind(locator: &str) -> Result<Queue, Error> {
        Queue::with_config(QueueConfig::from_locator(locator)?)
    }

    /// Binds a queue with an explicit configuration.
    pub fn with_config(config: QueueConfig) -> Result<Queue, Error> {
        Ok(Queue(if config.reliable {
            Kind::Reliable(Box::new(ReliableQueue::with_config(config)?))
        } else {
            Kind::Datagram(DatagramQueue::with_config(config)?)
        }))
    }

    /// The datagram queue, if this is one.
    pub fn as_datagram(&self) -> Option<&DatagramQueue> {
        match &self.0 {
            Kind::Datagram(q) => Some(q),
            Kind::Reliable(_) => None,
        }
    }

    /// The reliable queue, if this is one.
    pub fn as_reliable(&self) -> Option<&ReliableQueue> {
        match &self.0 {
            Kind::Reliable(q) => Some(q),
            Kind::Datagram(_) => None,
        }
    }

    /// The bound address (with the port the OS chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        match &self.0 {
            Kind::Datagram(q) => q.local_addr(),
            Kind::Reliable(q) => q.local_addr(),
        }
    }

    /// Makes a datagram queue point-to-point (see
    /// [`DatagramQueue::connect`]); a reliable queue refuses, since its
    /// associations have their own peers.
    pub fn connect(&self, peer: SocketAddr) -> Result<(), Error> {
        match &self.0 {
            Kind::Datagram(q) => q.connect(peer),
            Kind::Reliable(_) => Err(Error::Io {
                what: "connect to peer",
                source: io::Error::new(
                    io::ErrorKind::Unsupported,
                    "a reliable queue's associations have their own peers; \
                     use a queue without reliable=true",
                ),
            }),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &QueueConfig {
        match &self.0 {
            Kind::Datagram(q) => q.config(),
            Kind::Reliable(q) => q.config(),
        }
    }

    /// Queues `msg` for `dest` (a `SocketAddr` works: any endpoint there);
    /// never waits on the network. Fails if the message can never be sent
    /// as it is (too large: the error names the limit) or a limit is
    /// reached (on a reliable queue, the destination's backlog:
    /// [`ReliableQueue`] explains).
    pub fn push(&self, dest: impl Into<Dest>, msg: &Message) -> Result<(), Error> {
        match &self.0 {
            Kind::Datagram(q) => q.push(dest, msg),
            Kind::Reliable(q) => q.push(dest, msg),
        }
    }

    /// Serializes `value` (postcard) and pushes it with its Rust type name as
    /// the message type, for [`Queue::try_pop_typed`] (CMQ's polymorphic
    /// queue).
    pub fn push_typed<T: Serialize>(&self, dest: impl Into<Dest>, value: &T) -> Result<(), Error> {
        self.push(dest, &typed_message(value)?)
    }

    /// Datagram queue: hands everything queued to the kernel now, waiting
    /// while the socket's send buffer is full. Reliable queue: waits until
    /// every message pushed is acknowledged by its receiver. Either reports
    /// what failed since the previous flush.
    pub fn flush(&self) -> Result<(), Error> {
        match &self.0 {
            Kind::Datagram(q) => q.flush(),
            Kind::Reliable(q) => q.flush(),
        }
    }

    /// The next received message, or `None` at once if there is none
    /// (CMQ's `cwPop`).
    pub fn try_pop(&self) -> Option<Message> {
        match &self.0 {
            Kind::Datagram(q) => q.try_pop(),
            Kind::Reliable(q) => q.try_pop(),
        }
    }

    /// Moves up to `max` received messages into `out` without blocking;
    /// returns how many. Cheaper per message than `try_pop` in a loop.
    pub fn try_pop_many(&self, out: &mut Vec<Message>, max: usize) -> usize {
        match &self.0 {
            Kind::Datagram(q) => q.try_pop_many(out, max),
            Kind::Reliable(q) => q.try_pop_many(out, max),
        }
    }

    /// Waits up to `timeout` (forever with `None`) for a message.
    pub fn pop_blocking(&self, timeout: Option<Duration>) -> Option<Message> {
        match &self.0 {
            Kind::Datagram(q) => q.pop_blocking(timeout),
            Kind::Reliable(q) => q.pop_blocking(timeout),
        }
    }

    /// Waits for the next message (tokio). A datagram queue must be polled
    /// inside a tokio runtime with I/O enabled.
    pub async fn pop(&self) -> Result<Message, Error> {
        match &self.0 {
            Kind::Datagram(q) => q.pop().await,
            Kind::Reliable(q) => q.pop().await,
        }
    }

    /// Pops the next message and deserializes it as `T`; `None` if nothing
    /// is waiting. A message of another type is consumed and reported as
    /// [`Error::TypeMismatch`].
    pub fn try_pop_typed<T: DeserializeOwned>(&self) -> Option<Result<T, Error>> {
        self.try_pop().map(|m| decode_typed(&m))
    }

    /// Joins a multicast group (datagram queues only).
    pub fn join_multicast(&self, group: IpAddr) -> Result<(), Error> {
        match &self.0 {
            Kind::Datagram(q) => q.join_multicast(group),
            Kind::Reliable(_) => Err(no_multicast()),
        }
    }

    /// Leaves a multicast group (datagram queues only).
    pub fn leave_multicast(&self, group: IpAddr) -> Result<(), Error> {
        match &self.0 {
            Kind::Datagram(q) => q.leave_multicast(group),
            Kind::Reliable(_) => Err(no_multicast()),
        }
    }

    /// Counters: sent, received, lost, dropped by reason.
    pub fn stats(&self) -> QueueStats {
        match &self.0 {
            Kind::Datagram(q) => q.stats(),
            Kind::Reliable(q) => q.stats(),
        }
    }
}

fn no_multicast() -> Error {
    Error::Io {
        what: "multicast",
        source: io::Error::new(
            io::ErrorKind::Unsupported,
            "a reliable queue has no multicast: each association has one peer; \
             use a queue without reliable=true",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `stats` reads while a pop holds the receive state is what
    /// `Rx::counters` gives, field for field.
    #[test]
    fn published_counters_are_the_receive_counters() {
        let mut rx = Rx {
            batch: RecvBatch::new(1, 64),
            arrived: VecDeque::new(),
            loss: LossDetector::new(8),
            verdicts: Vec::new(),
            stats: QueueStats::default(),
        };
        let s = &mut rx.stats;
        (s.recv_messages, s.recv_bytes, s.recv_batches) = (11, 12, 13);
        let d = &mut s.dropped;
        (d.foreign, d.version, d.kind, d.truncated) = (21, 22, 23, 24);
        (d.malformed, d.oversized, d.endpoint) = (25, 26, 27);
        // A gap of 5 (lost), then a duplicate.
        let mut v = Vec::new();
        assert!(rx.loss.check_run(7, 5, 1, &mut v));
        assert!(!rx.loss.check_run(7, 5, 1, &mut v));
        let published = RxCounters::default();
        published.store(&rx);
        let want = rx.counters();
        assert_eq!((want.lost, want.dropped.duplicate), (5, 1));
        assert_eq!(published.load(), want);
    }
}
