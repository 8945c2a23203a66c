//! The `tcp://` transport of the buffer API: RocketBufs' framing, a 32-bit
//! buffer id and a 32-bit size (little-endian) before each segment's bytes.
//! A size field above [`MAX_LEN`] (`0xffffff00`) is a control marker.
//!
//! ```text
//! subscriber -> output (8 bytes each)
//!   0       4            8
//!   +-------+------------+
//!   | id    | size       |  subscribe(id, size), size 1..=MAX_LEN
//!   +-------+------------+
//!   | id    | 0xfffffffd |  close: the input unsubscribes `id` cleanly
//!   +-------+------------+  (sent for each of its buffers when it closes)
//!
//! output -> subscriber
//!   0       4            8
//!   +-------+------------+
//!   | id    | 0xffffffff |                subscribed (attached)
//!   +-------+------------+----------+
//!   | id    | len        | len bytes|     one segment, len 0..=MAX_LEN
//!   +-------+------------+----------+
//!   | id    | 0xfffffffd | reason u8|     close, after the buffer's last
//!   +-------+------------+----------+     segment: 0 = by its producer,
//!                                         1 = corrupt, 2 = lost upstream
//! ```
//!
//! The close marker and reasons 0 and 1 are the udp transport's
//! (`assoc/frame.rs`); reason 2 is tcp's so far. A clean end sends it: an [`Output`] dropped (or a
//! buffer closed by its producer) ends each subscribed buffer with a close
//! frame after its data, and a dropped [`Input`] unsubscribes each of its
//! buffers before it shuts the connection. A connection that ends (EOF,
//! reset) without it means the peer died or the path failed:
//!
//! - the subscriber's buffers still open end with
//!   [`BufferError::PeerLost`] after the data received (counted in
//!   `LinkStats::peers_lost`), as over `udp://`;
//! - the output detaches that connection's subscribers (counted in
//!   `OutStats::subscribers_lost` per buffer), which frees their credits: a
//!   producer waiting for them goes on.
//!
//! **Hostile input**: headers are decoded by total functions
//! ([`decode_up`], [`decode_down`], in `skiff_proto::buffer::tcp`, which
//! also holds the header layouts). A stream cannot be resynchronised after
//! a header it does not understand, so an unknown marker, a subscribe of
//! size 0 or an unknown close reason is counted (`frames_malformed`) and
//! ends the connection (an output then counts that connection's
//! subscribers as lost; an input closes its open buffers as corrupt). A
//! segment longer than the subscriber's ring closes that buffer as corrupt
//! (`protocol_errors`) and its bytes are skipped; a frame for a buffer not
//! subscribed is skipped (`frames_unknown`). Bytes are skipped through a
//! fixed 64 KiB buffer: nothing is allocated from a length on the wire.
//!
//! `subscribe` returns once the output acknowledged: from then on every
//! segment delivered reaches the subscriber (as over shared memory).
//!
//! Each side keeps rings exactly as over shared memory; threads move bytes
//! between rings and sockets. The output's sender thread (one per
//! subscriber connection) is a consumer of each subscribed ring: it writes
//! a segment straight from the ring into the socket and then consumes it.
//! The subscriber's receiver thread is the producer of its local rings: it
//! reserves a segment and reads the socket straight into it. Flow control
//! is TCP's: a subscriber that does not consume fills its ring, its
//! receiver stops reading, the sender blocks in `write`, the output's ring
//! fills and its producer gets `WouldBlock`. Memory stays bounded on both
//! sides. (Overwrite rings are copied out under their sequence lock before
//! sending, since their bytes may change while the kernel copies them.)
//!
//! [`Output`]: super::Output
//! [`Input`]: super::Input

use std::collections::HashMap;
use std::collections::HashSet;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use skiff_proto::buffer::tcp::{close_frame, decode_down, decode_up, Down, Up};
use skiff_proto::buffer::{header, CloseReason as Reason, CLOSE, SUBSCRIBED};
use skiff_proto::credits::{Delivered, Flow};

use super::layout::{CLOSED, CORRUPT, LOST, OPEN};
use super::ring::{Ring, RingConsumer, RingProducer};
use super::{BufferError, BufferId, Counters, LinkStats};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) use skiff_proto::buffer::MAX_LEN;

/// How long a closing side waits to write its close frames.
const LINGER: Duration = Duration::from_secs(1);

/// The reason a ring consumer's error ends a buffer with.
fn reason_of(e: &BufferError) -> Reason {
    match e {
        BufferError::Closed { .. } => Reason::Producer,
        e if e.is_peer_gone() => Reason::Lost,
        _ => Reason::Corrupt,
    }
}

/// The state the subscriber's ring closes with.
fn ring_state(r: Reason) -> u32 {
    match r {
        Reason::Producer => CLOSED,
        Reason::Corrupt => CORRUPT,
        Reason::Lost => LOST,
    }
}

/// What the output's threads share.
#[derive(Debug)]
struct Shared {
    rings: Mutex<HashMap<BufferId, Arc<Ring>>>,
    stop: AtomicBool,
    spin: Duration,
    /// Subscribers of each buffer lost with their connection.
    lost: Mutex<HashMap<BufferId, u64>>,
    stats: Counters,
}

/// The output side: a listener and one sender thread per subscriber.
#[derive(Debug)]
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    sh: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    pub(crate) fn bind(addr: SocketAddr, spin: Duration) -> Result<Server, BufferError> {
        let l = TcpListener::bind(addr).map_err(BufferError::io("tcp listen"))?;
        let addr = l
            .local_addr()
            .map_err(BufferError::io("tcp local address"))?;
        l.set_nonblocking(true)
            .map_err(BufferError::io("tcp nonblocking"))?;
        let sh = Arc::new(Shared {
            rings: Mutex::default(),
            stop: AtomicBool::new(false),
            spin,
            lost: Mutex::default(),
            stats: Counters::default(),
        });
        let s = Arc::clone(&sh);
        let accept = std::thread::Builder::new()
            .name("skiff-buf-accept".into())
            .spawn(move || {
                while !s.stop.load(Ordering::Acquire) {
                    match l.accept() {
                        Ok((stream, _)) => {
                            let s = Arc::clone(&s);
                            let _ = std::thread::Builder::new()
                                .name("skiff-buf-send".into())
                                .spawn(move || sender(stream, s));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(2)),
                    }
                }
            })
            .map_err(BufferError::io("spawn accept thread"))?;
        Ok(Server {
            addr,
            sh,
            accept: Some(accept),
        })
    }

    /// Makes ring `id` available to subscribers.
    pub(crate) fn publish(&self, id: BufferId, ring: Arc<Ring>) {
        lock(&self.sh.rings).insert(id, ring);
    }

    /// Subscribers of `id` lost because their connection ended without a
    /// close.
    pub(crate) fn lost(&self, id: BufferId) -> u64 {
        lock(&self.sh.lost).get(&id).copied().unwrap_or(0)
    }

    /// The transport's counters.
    pub(crate) fn stats(&self) -> LinkStats {
        self.sh.stats.snapshot()
    }

    /// Stops accepting; sender threads drain what is published, end each
    /// subscribed buffer with a close frame and exit.
    pub(crate) fn shutdown(mut self) {
        self.sh.stop.store(true, Ordering::Release);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Writes all of `bufs` (a header and up to two slices).
fn write_all(stream: &mut TcpStream, bufs: &[&[u8]]) -> io::Result<()> {
    let mut bufs: Vec<&[u8]> = bufs.iter().copied().filter(|b| !b.is_empty()).collect();
    while !bufs.is_empty() {
        let slices: Vec<IoSlice<'_>> = bufs.iter().map(|b| IoSlice::new(b)).collect();
        let mut n = match stream.write_vectored(&slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while n > 0 {
            if n >= bufs[0].len() {
                n -= bufs[0].len();
                bufs.remove(0);
            } else {
                bufs[0] = &bufs[0][n..];
                n = 0;
            }
        }
    }
    Ok(())
}

/// The connection failed (a write did not go through).
#[derive(Debug)]
struct Dead;

/// How a subscriber connection's sender ended.
enum End {
    /// The output shuts down: the remaining buffers get a close frame.
    Clean,
    /// The connection ended without the subscriber's close frames.
    Dead,
}

/// One subscriber connection on the output side.
struct Conn {
    stream: TcpStream,
    sh: Arc<Shared>,
    /// Headers the reader thread decoded, in order.
    ups: Arc<Mutex<Vec<(BufferId, Up)>>>,
    /// Set by the reader thread when the connection's reading side ended.
    dead: Arc<AtomicBool>,
    pending: Vec<BufferId>,
    subs: Vec<(BufferId, RingConsumer)>,
    scratch: Vec<u8>,
}

/// One subscriber connection: a reader thread takes its headers, this one
/// sends; the socket is shut down when it ends, which also ends the reader.
fn sender(stream: TcpStream, sh: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let Ok(rd) = stream.try_clone() else {
        return;
    };
    let Ok(end) = stream.try_clone() else {
        return;
    };
    let ups: Arc<Mutex<Vec<(BufferId, Up)>>> = Arc::default();
    let dead = Arc::new(AtomicBool::new(false));
    let (u, d, s) = (Arc::clone(&ups), Arc::clone(&dead), Arc::clone(&sh));
    let Ok(reader) = std::thread::Builder::new()
        .name("skiff-buf-subs".into())
        .spawn(move || read_ups(rd, &u, &d, &s))
    else {
        return;
    };
    let mut c = Conn {
        stream,
        sh,
        ups,
        dead,
        pending: Vec::new(),
        subs: Vec::new(),
        scratch: Vec::new(),
    };
    match c.run() {
        End::Clean => {
            // Buffers still subscribed (spliced ones, which this output
            // does not close) end with a close frame too.
            let _ = c.stream.set_write_timeout(Some(LINGER));
            for (id, _) in std::mem::take(&mut c.subs) {
                if c.stream
                    .write_all(&close_frame(id, Reason::Producer))
                    .is_err()
                {
                    break;
                }
            }
        }
        End::Dead => {
            // Every header the subscriber sent before the end counts (its
            // close frames in particular): the reader ends once the dead
            // socket is drained. Bounded: after a second it is cut off.
            let until = Instant::now() + LINGER;
            while !reader.is_finished() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            c.apply_ups();
            if !c.subs.is_empty() {
                Counters::bump(&c.sh.stats.peers_lost);
                let mut lost = lock(&c.sh.lost);
                for (id, _) in &c.subs {
                    *lost.entry(*id).or_default() += 1;
                }
            }
        }
    }
    // Counted before: dropping the consumers detaches them, which wakes a
    // producer waiting for their credits.
    c.subs.clear();
    let _ = end.shutdown(Shutdown::Both);
}

/// Reads the subscriber's headers until the connection ends or a header
/// does not decode (counted; the connection is then given up).
fn read_ups(mut rd: TcpStream, ups: &Mutex<Vec<(BufferId, Up)>>, dead: &AtomicBool, sh: &Shared) {
    let mut h = [0u8; 8];
    while rd.read_exact(&mut h).is_ok() {
        match decode_up(&h) {
            Ok(up) => lock(ups).push(up),
            Err(_) => {
                Counters::bump(&sh.stats.malformed);
                break;
            }
        }
    }
    dead.store(true, Ordering::Release);
}

impl Conn {
    /// Takes the headers the reader decoded: subscriptions wait for their
    /// ring; a close detaches its subscriber (not counted as lost).
    fn apply_ups(&mut self) {
        let ups = std::mem::take(&mut *lock(&self.ups));
        for (id, up) in ups {
            match up {
                Up::Subscribe(_) => self.pending.push(id),
                Up::Close => {
                    self.pending.retain(|p| *p != id);
                    self.subs.retain(|(s, _)| *s != id);
                }
            }
        }
    }

    /// Sends segments of the subscribed rings until the output shuts down
    /// or the connection dies.
    fn run(&mut self) -> End {
        loop {
            if self.dead.load(Ordering::Acquire) {
                return End::Dead;
            }
            let stopping = self.sh.stop.load(Ordering::Acquire);
            self.apply_ups();
            if self.attach_pending().is_err() {
                return End::Dead;
            }
            let mut sent = false;
            let mut i = 0;
            while i < self.subs.len() {
                match self.pump(i, &mut sent) {
                    Ok(true) => i += 1,
                    Ok(false) => {
                        self.subs.remove(i);
                    }
                    Err(Dead) => return End::Dead,
                }
            }
            if stopping && !sent {
                return End::Clean;
            }
            if !sent {
                let Some((id, cons)) = self.subs.first_mut() else {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                };
                let id = *id;
                let until = Instant::now() + Duration::from_millis(5);
                match cons.next(Some(until), self.sh.spin) {
                    Ok(Some(d)) => match self.send(0, d) {
                        Ok(true) => {}
                        Ok(false) => {
                            self.subs.remove(0);
                        }
                        Err(Dead) => return End::Dead,
                    },
                    Ok(None) => {}
                    Err(e) => {
                        if self.end_buffer(id, &e).is_err() {
                            return End::Dead;
                        }
                        self.subs.remove(0);
                    }
                }
            }
        }
    }

    /// Attaches waiting subscriptions whose ring exists and acknowledges
    /// them.
    fn attach_pending(&mut self) -> Result<(), Dead> {
        let mut acks = Vec::new();
        let rings = lock(&self.sh.rings);
        let subs = &mut self.subs;
        self.pending.retain(|id| match rings.get(id) {
            Some(r) => {
                if let Ok(c) = RingConsumer::attach(Arc::clone(r)) {
                    subs.push((*id, c));
                    acks.extend_from_slice(&header(*id, SUBSCRIBED));
                } else {
                    Counters::bump(&self.sh.stats.refused);
                }
                false
            }
            None => true,
        });
        drop(rings);
        if !acks.is_empty() {
            self.stream.write_all(&acks).map_err(|_| Dead)?;
        }
        Ok(())
    }

    /// Sends up to 64 segments of subscription `i`; `Ok(false)` once its
    /// buffer ended (its close frame sent).
    fn pump(&mut self, i: usize, sent: &mut bool) -> Result<bool, Dead> {
        for _ in 0..64 {
            match self.subs[i].1.try_next() {
                Ok(Some(d)) => {
                    if !self.send(i, d)? {
                        return Ok(false);
                    }
                    *sent = true;
                }
                Ok(None) => return Ok(true),
                Err(e) => {
                    let id = self.subs[i].0;
                    self.end_buffer(id, &e)?;
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Ends buffer `id` with the close frame `e` calls for.
    fn end_buffer(&mut self, id: BufferId, e: &BufferError) -> Result<(), Dead> {
        self.stream
            .write_all(&close_frame(id, reason_of(e)))
            .map_err(|_| Dead)
    }

    /// Sends segment `d` of subscription `i` as one frame, then consumes
    /// it; `Ok(false)` if the ring refused (its buffer ended, close frame
    /// sent).
    fn send(&mut self, i: usize, d: Delivered) -> Result<bool, Dead> {
        let (id, cons) = &mut self.subs[i];
        let id = *id;
        let hdr = header(id, d.len as u32);
        match cons.slices(d.start, d.len) {
            Some((a, b)) => write_all(&mut self.stream, &[&hdr, a, b]),
            None => {
                self.scratch.clear();
                if !cons.copy(d.seg, d.start, d.len, &mut self.scratch) {
                    // Overwritten while copied: not sent.
                    Counters::bump(&self.sh.stats.torn);
                    return Ok(true);
                }
                write_all(&mut self.stream, &[&hdr, &self.scratch])
            }
        }
        .map_err(|_| Dead)?;
        if cons.ring.layout.flow == Flow::Credits {
            if let Err(e) = cons.consume(d.len) {
                self.end_buffer(id, &e)?;
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// What the input's receiver thread shares with the input.
#[derive(Debug, Default)]
struct ClientShared {
    rings: Mutex<HashMap<BufferId, Arc<Mutex<RingProducer>>>>,
    acks: (Mutex<HashSet<BufferId>>, Condvar),
    /// The input closes: the end of the connection is ours.
    closing: AtomicBool,
    stats: Counters,
}

/// The input side: a connection and its receiver thread.
#[derive(Debug)]
pub(crate) struct Client {
    stream: Mutex<TcpStream>,
    sh: Arc<ClientShared>,
    wait: Duration,
}

impl Client {
    pub(crate) fn connect(addr: SocketAddr, wait: Duration) -> Result<Client, BufferError> {
        let stream = TcpStream::connect_timeout(&addr, wait.max(Duration::from_millis(1)))
            .map_err(BufferError::io("tcp connect"))?;
        let _ = stream.set_nodelay(true);
        let rd = stream.try_clone().map_err(BufferError::io("tcp clone"))?;
        let sh = Arc::new(ClientShared::default());
        let s = Arc::clone(&sh);
        std::thread::Builder::new()
            .name("skiff-buf-recv".into())
            .spawn(move || receiver(rd, &s))
            .map_err(BufferError::io("spawn receiver thread"))?;
        Ok(Client {
            stream: Mutex::new(stream),
            sh,
            wait,
        })
    }

    /// The transport's counters.
    pub(crate) fn stats(&self) -> LinkStats {
        self.sh.stats.snapshot()
    }

    /// Registers the local ring of `id`, asks the output for it and waits
    /// (up to the `wait` option) for its acknowledgement.
    pub(crate) fn subscribe(
        &self,
        id: BufferId,
        size: u32,
        prod: RingProducer,
    ) -> Result<(), BufferError> {
        lock(&self.sh.rings).insert(id, Arc::new(Mutex::new(prod)));
        lock(&self.stream)
            .write_all(&header(id, size))
            .map_err(BufferError::io("tcp subscribe"))?;
        let until = Instant::now() + self.wait;
        let (set, cv) = &self.sh.acks;
        let mut acked = lock(set);
        while !acked.contains(&id) {
            let now = Instant::now();
            if now >= until {
                drop(acked);
                lock(&self.sh.rings).remove(&id);
                return Err(BufferError::UnknownBuffer { id });
            }
            acked = cv
                .wait_timeout(acked, until - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        Ok(())
    }

    /// Unsubscribes every buffer (close frames, so the output does not
    /// count this input as lost) and closes the connection; the receiver
    /// thread closes the rings and exits.
    pub(crate) fn shutdown(self) {
        self.sh.closing.store(true, Ordering::Release);
        let ids: Vec<BufferId> = lock(&self.sh.rings).keys().copied().collect();
        let mut frames = Vec::with_capacity(ids.len() * 8);
        for id in ids {
            frames.extend_from_slice(&header(id, CLOSE));
        }
        let mut s = lock(&self.stream);
        let _ = s.set_write_timeout(Some(LINGER));
        let _ = s.write_all(&frames);
        let _ = s.shutdown(Shutdown::Both);
    }
}

/// Reads frames into the local rings until the connection ends. A close
/// frame ends its buffer (subscribers read what arrived, then `Closed`,
/// `Corrupt` or `PeerLost` as it says); at the end of the connection every
/// buffer still open ends: `Closed` if this input closed it, `Corrupt`
/// after a header that did not decode, else `PeerLost`.
fn receiver(mut rd: TcpStream, sh: &ClientShared) {
    let mut hdr = [0u8; 8];
    let mut sink = vec![0u8; 64 << 10];
    let broken = loop {
        if rd.read_exact(&mut hdr).is_err() {
            break false;
        }
        let (id, down) = match decode_down(&hdr) {
            Ok(h) => h,
            Err(_) => {
                Counters::bump(&sh.stats.malformed);
                break true;
            }
        };
        match down {
            Down::Subscribed => {
                lock(&sh.acks.0).insert(id);
                sh.acks.1.notify_all();
            }
            Down::Close => {
                let mut b = [0u8; 1];
                if rd.read_exact(&mut b).is_err() {
                    break false;
                }
                let Some(reason) = Reason::decode(b[0]) else {
                    Counters::bump(&sh.stats.malformed);
                    break true;
                };
                match lock(&sh.rings).remove(&id) {
                    Some(p) => {
                        let p = lock(&p);
                        if p.ring.state() == OPEN {
                            p.ring.close(ring_state(reason));
                        }
                    }
                    None => Counters::bump(&sh.stats.unknown),
                }
            }
            Down::Segment(len) => {
                let len = u64::from(len);
                let prod = lock(&sh.rings).get(&id).cloned();
                let ok = match prod {
                    Some(p) => {
                        let mut p = lock(&p);
                        if len > p.ring.layout.geom.capacity() {
                            // The subscriber's ring is smaller than the
                            // segment: the buffer cannot go on.
                            Counters::bump(&sh.stats.protocol);
                            p.ring.close(CORRUPT);
                            drop(p);
                            lock(&sh.rings).remove(&id);
                            discard(&mut rd, len, &mut sink).is_ok()
                        } else {
                            receive_into(&mut rd, &mut p, len).is_ok()
                        }
                    }
                    None => {
                        Counters::bump(&sh.stats.unknown);
                        discard(&mut rd, len, &mut sink).is_ok()
                    }
                };
                if !ok {
                    break false;
                }
            }
        }
    };
    let state = if broken {
        CORRUPT
    } else if sh.closing.load(Ordering::Acquire) {
        CLOSED
    } else {
        LOST
    };
    let rings = lock(&sh.rings);
    // Counted before any ring is closed: a reader that sees the loss
    // finds it in the stats.
    if state == LOST && rings.values().any(|p| lock(p).ring.state() == OPEN) {
        Counters::bump(&sh.stats.peers_lost);
    }
    for p in rings.values() {
        let p = lock(p);
        if p.ring.state() == OPEN {
            p.ring.close(state);
        }
    }
}

fn receive_into(rd: &mut TcpStream, p: &mut RingProducer, len: u64) -> Result<(), BufferError> {
    let res = p.reserve(len, None, Duration::ZERO)?;
    let mut w = p.writable(res);
    {
        let (a, b) = w.slices_mut();
        rd.read_exact(a).map_err(BufferError::io("tcp receive"))?;
        rd.read_exact(b).map_err(BufferError::io("tcp receive"))?;
    }
    drop(w);
    p.commit(len)
        .map_err(|e| BufferError::credit(p.ring.id, e))?;
    Ok(())
}

fn discard(rd: &mut TcpStream, mut len: u64, sink: &mut [u8]) -> io::Result<()> {
    while len > 0 {
        let n = len.min(sink.len() as u64) as usize;
        rd.read_exact(&mut sink[..n])?;
        len -= n as u64;
    }
    Ok(())
}
