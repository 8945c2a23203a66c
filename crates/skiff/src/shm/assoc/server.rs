//! The output side of the udp buffer transport: an endpoint that listens,
//! and per tunnel a reader thread (subscribe and credit frames) and a
//! sender thread (segments within the subscriber's credits).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use skiff_proto::credits::{Delivered, Flow};
use std::task::Waker;

use super::frame::{self, CloseReason, Frame};
use super::{block_on, close_tunnel, endpoint, lock, thread_waker, Counters};
use super::{LINGER, MAX_PENDING, TICK};
use crate::endpoint::Endpoint;
use crate::shm::ring::{Ring, RingConsumer};
use crate::shm::{BufferError, BufferId, LinkStats};
use crate::tunnel::{Tunnel, TunnelError};

/// What the output's threads share.
#[derive(Debug)]
struct ServerShared {
    endpoint: Endpoint,
    rings: Mutex<HashMap<BufferId, Arc<Ring>>>,
    stop: AtomicBool,
    spin: Duration,
    stats: Counters,
    /// Subscribers detached because their tunnel failed, per buffer.
    lost: Mutex<HashMap<BufferId, u64>>,
}

/// The output side: an endpoint that listens, and two threads per tunnel.
#[derive(Debug)]
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    shared: Arc<ServerShared>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    pub(crate) fn bind(
        addr: SocketAddr,
        options: &str,
        spin: Duration,
    ) -> Result<Server, BufferError> {
        let endpoint = endpoint(addr, options)?;
        endpoint.listen();
        let addr = endpoint.local_addr();
        let shared = Arc::new(ServerShared {
            endpoint,
            rings: Mutex::default(),
            stop: AtomicBool::new(false),
            spin,
            stats: Counters::default(),
            lost: Mutex::default(),
        });
        let sh = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name("skiff-buf-uaccept".into())
            .spawn(move || accept_loop(sh))
            .map_err(BufferError::io("spawn accept thread"))?;
        Ok(Server {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    /// Makes ring `id` available to subscribers.
    pub(crate) fn publish(&self, id: BufferId, ring: Arc<Ring>) {
        lock(&self.shared.rings).insert(id, ring);
    }

    /// Subscribers of `id` lost because their tunnel failed.
    pub(crate) fn lost(&self, id: BufferId) -> u64 {
        lock(&self.shared.lost).get(&id).copied().unwrap_or(0)
    }

    pub(crate) fn stats(&self) -> LinkStats {
        let mut s = self.shared.stats.snapshot();
        s.endpoint = Some(self.shared.endpoint.stats());
        s
    }

    /// Stops accepting; sender threads send what is published (within the
    /// subscribers' credits, for at most a short linger), close every
    /// buffer and the tunnel, and exit; the endpoint goes with the last.
    pub(crate) fn shutdown(mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(sh: Arc<ServerShared>) {
    let waker = thread_waker();
    while !sh.stop.load(Ordering::Acquire) {
        let got = block_on(&waker, Some(Instant::now() + TICK), |cx| {
            sh.endpoint.poll_accept(cx)
        });
        match got {
            Some(Ok(t)) => {
                let conn = Arc::new(Conn {
                    tunnel: t,
                    inbox: Mutex::default(),
                    cv: Condvar::new(),
                    dead: AtomicBool::new(false),
                    failed: AtomicBool::new(false),
                    quit: AtomicBool::new(false),
                });
                let (c, s) = (Arc::clone(&conn), Arc::clone(&sh));
                let reader = std::thread::Builder::new()
                    .name("skiff-buf-usubs".into())
                    .spawn(move || conn_reader(c, s));
                if reader.is_err() {
                    continue;
                }
                let s = Arc::clone(&sh);
                let _ = std::thread::Builder::new()
                    .name("skiff-buf-usend".into())
                    .spawn(move || {
                        let waker = thread_waker();
                        conn_sender(&conn, &s, &waker);
                        conn.quit.store(true, Ordering::Release);
                        close_tunnel(&conn.tunnel, &waker);
                    });
            }
            Some(Err(_)) => return,
            None => {}
        }
    }
}

/// What a subscriber asked for, from the reader thread to the sender.
#[derive(Debug, Default)]
struct Inbox {
    wanted: Vec<(BufferId, u64, u64)>,
    credits: HashMap<BufferId, (u64, u64)>,
}

/// One tunnel to a subscriber.
#[derive(Debug)]
struct Conn {
    tunnel: Tunnel,
    inbox: Mutex<Inbox>,
    cv: Condvar,
    /// The tunnel ended (closed or failed).
    dead: AtomicBool,
    /// It failed (the subscriber is lost, not gone).
    failed: AtomicBool,
    /// The sender is done: the reader stops.
    quit: AtomicBool,
}

/// Reads subscribe and credit frames until the tunnel ends.
fn conn_reader(c: Arc<Conn>, sh: Arc<ServerShared>) {
    let waker = thread_waker();
    loop {
        if c.quit.load(Ordering::Acquire) {
            break;
        }
        let got = block_on(&waker, Some(Instant::now() + TICK), |cx| {
            c.tunnel.poll_recv(cx)
        });
        match got {
            None => {}
            Some(Ok(Some(m))) => match frame::decode_up(&m) {
                Ok(Frame::Subscribe { id, size, records }) => {
                    let mut inbox = lock(&c.inbox);
                    if inbox.wanted.len() >= MAX_PENDING || inbox.wanted.iter().any(|w| w.0 == id) {
                        Counters::bump(&sh.stats.refused);
                    } else {
                        inbox.wanted.push((id, u64::from(size), u64::from(records)));
                        c.cv.notify_all();
                    }
                }
                Ok(Frame::Credit { id, consumed, read }) => {
                    let mut inbox = lock(&c.inbox);
                    if inbox.credits.len() >= MAX_PENDING && !inbox.credits.contains_key(&id) {
                        Counters::bump(&sh.stats.unknown);
                    } else {
                        inbox.credits.insert(id, (consumed, read));
                        c.cv.notify_all();
                    }
                }
                Ok(_) => Counters::bump(&sh.stats.malformed),
                Err(_) => Counters::bump(&sh.stats.malformed),
            },
            Some(Ok(None)) => break,
            Some(Err(_)) => {
                c.failed.store(true, Ordering::Release);
                break;
            }
        }
    }
    c.dead.store(true, Ordering::Release);
    c.cv.notify_all();
}

/// One subscription of a tunnel, as the sender sees it.
#[derive(Debug)]
struct Sub {
    id: BufferId,
    cons: RingConsumer,
    /// The subscriber's ring: bytes and segment records.
    cap: u64,
    records: u64,
    /// Bytes and segments sent, and the subscriber's last credit.
    sent: u64,
    segs: u64,
    consumed: u64,
    read: u64,
    /// A segment taken from the ring and not yet sent (no credit yet).
    held: Option<Delivered>,
    /// How the ring ended, seen while waiting for data; sent as a close
    /// frame at the next step.
    ended: Option<BufferError>,
}

impl Sub {
    fn credits(&self) -> bool {
        self.cons.ring.layout.flow == Flow::Credits
    }

    /// Whether the subscriber's ring has room for `d` now.
    fn fits(&self, d: &Delivered) -> bool {
        !self.credits()
            || (self.sent - self.consumed + d.len <= self.cap
                && self.segs - self.read < self.records)
    }

    /// Applies the subscriber's credit: the output's ring gets back what
    /// it consumed. A credit beyond what was sent is a protocol error.
    fn apply(&mut self, consumed: u64, read: u64) -> Result<(), ()> {
        if consumed < self.consumed || consumed > self.sent || read < self.read || read > self.segs
        {
            return Err(());
        }
        if self.credits() && consumed > self.consumed {
            self.cons
                .consume(consumed - self.consumed)
                .map_err(|_| ())?;
        }
        self.consumed = consumed;
        self.read = read;
        Ok(())
    }
}

/// What happened to one sending attempt.
enum Sent {
    Yes,
    /// Not sent: the subscriber's ring is full (the segment is held).
    NoCredit,
    /// Nothing to send.
    Idle,
    /// The subscription ended (closed, corrupt, too large): drop it.
    Ended,
}

/// Sends one tunnel message, waiting while the tunnel's buffer is full;
/// gives up when the tunnel dies.
fn send_msg(c: &Conn, waker: &Waker, msg: &Bytes) -> Result<(), TunnelError> {
    loop {
        let r = block_on(waker, Some(Instant::now() + TICK), |cx| {
            c.tunnel.poll_send(cx, msg)
        });
        match r {
            Some(r) => return r,
            None if c.dead.load(Ordering::Acquire) => return Err(TunnelError::Closed),
            None => {}
        }
    }
}

/// The next step of `s`: send one segment if there is one and room for it.
fn step(
    c: &Conn,
    sh: &ServerShared,
    waker: &Waker,
    s: &mut Sub,
    buf: &mut Vec<u8>,
) -> Result<Sent, TunnelError> {
    let d = match s.held.take() {
        Some(d) => d,
        None => match s.ended.take().map_or_else(|| s.cons.try_next(), Err) {
            Ok(Some(d)) => d,
            Ok(None) => return Ok(Sent::Idle),
            Err(e) => {
                let reason = frame::close_reason(&e);
                send_msg(c, waker, &frame::encode(&Frame::Close { id: s.id, reason }))?;
                return Ok(Sent::Ended);
            }
        },
    };
    if s.credits() && d.len > s.cap {
        // The subscriber's ring can never hold it (as over tcp, its copy
        // of the buffer is corrupt from here).
        let reason = CloseReason::Corrupt;
        send_msg(c, waker, &frame::encode(&Frame::Close { id: s.id, reason }))?;
        return Ok(Sent::Ended);
    }
    if !s.fits(&d) {
        s.held = Some(d);
        return Ok(Sent::NoCredit);
    }
    buf.clear();
    frame::segment_header(s.id, d.len as u32, buf);
    match s.cons.slices(d.start, d.len) {
        Some((a, b)) => {
            buf.extend_from_slice(a);
            buf.extend_from_slice(b);
        }
        None => {
            if !s.cons.copy(d.seg, d.start, d.len, buf) {
                // Overwritten while copied (counted by the ring): skipped.
                Counters::bump(&sh.stats.torn);
                return Ok(Sent::Yes);
            }
        }
    }
    let msg = Bytes::copy_from_slice(buf);
    send_msg(c, waker, &msg)?;
    s.sent += d.len;
    s.segs += 1;
    Ok(Sent::Yes)
}

/// Attaches the subscriptions whose buffer exists and acknowledges them;
/// keeps the others waiting.
fn attach_wanted(
    c: &Conn,
    sh: &ServerShared,
    waker: &Waker,
    subs: &mut Vec<Sub>,
    pending: &mut Vec<(BufferId, u64, u64)>,
) -> Result<(), TunnelError> {
    pending.append(&mut lock(&c.inbox).wanted);
    let mut i = 0;
    while i < pending.len() {
        let (id, cap, records) = pending[i];
        if subs.iter().any(|s| s.id == id) {
            Counters::bump(&sh.stats.refused);
            pending.swap_remove(i);
            continue;
        }
        let ring = lock(&sh.rings).get(&id).cloned();
        let Some(ring) = ring else {
            i += 1;
            continue;
        };
        pending.swap_remove(i);
        let Ok(cons) = RingConsumer::attach(ring) else {
            // No consumer slot: the subscriber times out (as over tcp).
            Counters::bump(&sh.stats.refused);
            continue;
        };
        let flow = cons.ring.layout.flow;
        subs.push(Sub {
            id,
            cons,
            cap,
            records,
            sent: 0,
            segs: 0,
            consumed: 0,
            read: 0,
            held: None,
            ended: None,
        });
        send_msg(c, waker, &frame::encode(&Frame::Subscribed { id, flow }))?;
    }
    Ok(())
}

/// The sender thread of one tunnel: see the module documentation.
fn conn_sender(c: &Conn, sh: &ServerShared, waker: &Waker) {
    let mut subs: Vec<Sub> = Vec::new();
    let mut pending = Vec::new();
    let mut buf = Vec::new();
    let mut stopping_since: Option<Instant> = None;
    let res = (|| -> Result<(), TunnelError> {
        loop {
            if c.dead.load(Ordering::Acquire) {
                return Err(TunnelError::Closed);
            }
            if sh.stop.load(Ordering::Acquire) && stopping_since.is_none() {
                stopping_since = Some(Instant::now());
            }
            attach_wanted(c, sh, waker, &mut subs, &mut pending)?;
            // Credits.
            let credits: Vec<_> = lock(&c.inbox).credits.drain().collect();
            for (id, (consumed, read)) in credits {
                match subs.iter().position(|s| s.id == id) {
                    Some(i) => {
                        if subs[i].apply(consumed, read).is_err() {
                            Counters::bump(&sh.stats.protocol);
                            subs.swap_remove(i);
                        }
                    }
                    None => Counters::bump(&sh.stats.unknown),
                }
            }
            // Sending.
            let mut sent = false;
            let mut waiting_credit = false;
            let mut i = 0;
            while i < subs.len() {
                let mut ended = false;
                for _ in 0..64 {
                    match step(c, sh, waker, &mut subs[i], &mut buf)? {
                        Sent::Yes => sent = true,
                        Sent::NoCredit => {
                            waiting_credit = true;
                            break;
                        }
                        Sent::Idle => break,
                        Sent::Ended => {
                            ended = true;
                            break;
                        }
                    }
                }
                if ended {
                    subs.swap_remove(i);
                } else {
                    i += 1;
                }
            }
            if let Some(since) = stopping_since {
                // Every buffer closed and sent (or given up after a linger
                // while subscribers hold no credit): done.
                if subs.is_empty() || (!sent && since.elapsed() >= LINGER) {
                    for s in &subs {
                        let reason = CloseReason::Producer;
                        let _ =
                            send_msg(c, waker, &frame::encode(&Frame::Close { id: s.id, reason }));
                    }
                    return Ok(());
                }
            }
            if sent {
                continue;
            }
            // Nothing sent: wait for credits, a ring, or a subscription.
            if waiting_credit || subs.is_empty() {
                let inbox = lock(&c.inbox);
                if inbox.credits.is_empty() && inbox.wanted.is_empty() {
                    let slice = if subs.len() > 1 || !pending.is_empty() {
                        Duration::from_millis(1)
                    } else {
                        Duration::from_millis(5)
                    };
                    let _ = c.cv.wait_timeout(inbox, slice);
                }
            } else if let Some(s) = subs.first_mut() {
                let until = Instant::now() + Duration::from_millis(5);
                match s.cons.next(Some(until), sh.spin) {
                    Ok(Some(d)) => s.held = Some(d),
                    Ok(None) => {}
                    // The ring ended (its consumer is detached now): the
                    // next step sends the close frame with this reason.
                    Err(e) => s.ended = Some(e),
                }
            }
        }
    })();
    if res.is_err() && c.failed.load(Ordering::Acquire) {
        Counters::bump(&sh.stats.peers_lost);
        let mut lost = lock(&sh.lost);
        for s in &subs {
            *lost.entry(s.id).or_default() += 1;
        }
    }
    // Dropping the consumers detaches them: the producer's ring is freed
    // of this subscriber.
    drop(subs);
}
