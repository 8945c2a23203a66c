//! The input side of the udp buffer transport: an endpoint, one tunnel to
//! the output, and the I/O thread that fills the input's local rings and
//! reports credits.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll};
use std::thread::Thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use skiff_proto::credits::Flow;

use super::frame::{self, CloseReason, Frame};
use super::{close_tunnel, endpoint, lock, thread_waker, Counters};
use super::{CREDIT_EVERY, TICK};
use crate::shm::layout::{Layout, CLOSED, CORRUPT, LOST, OPEN};
use crate::shm::ring::{Ring, RingConsumer, RingProducer};
use crate::shm::{BufferError, BufferId, LinkStats, Region};
use crate::tunnel::Tunnel;

/// A subscription the application waits for.
#[derive(Debug)]
struct Pending {
    capacity: u64,
    records: u64,
    consumers: u32,
    /// The frame was sent (else the I/O thread sends it).
    requested: bool,
    /// The application gave up waiting (the ring is still made if the
    /// output answers, and drained so the output is not held back).
    abandoned: bool,
    done: Option<Result<RingConsumer, BufferError>>,
}

/// What the application and the I/O thread share.
#[derive(Debug, Default)]
struct ClientShared {
    pending: Mutex<HashMap<BufferId, Pending>>,
    cv: Condvar,
    nudged: AtomicBool,
    stop: AtomicBool,
    /// How the tunnel ended (`CLOSED` or `LOST`), once it did.
    ended: Mutex<Option<u32>>,
    stats: Counters,
}

/// The input side: an endpoint, one tunnel and its I/O thread.
#[derive(Debug)]
pub(crate) struct Client {
    shared: Arc<ClientShared>,
    io: Thread,
    wait: Duration,
}

impl Client {
    /// Binds an endpoint and sets up a tunnel to the output at `addr`
    /// (waiting up to `wait`).
    pub(crate) fn connect(
        addr: SocketAddr,
        options: &str,
        wait: Duration,
    ) -> Result<Client, BufferError> {
        let any = match addr.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        let ep = endpoint(SocketAddr::new(any, 0), options)?;
        // `Endpoint::connect` needs a tokio timer: a private runtime on a
        // short-lived thread, so that callers inside a runtime work too.
        let timeout = wait.max(Duration::from_millis(1));
        let (ep, tunnel) = std::thread::scope(|s| {
            s.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .map_err(BufferError::io("tokio runtime for connect"))?;
                rt.block_on(ep.connect(addr, timeout))
                    .map_err(|e| BufferError::Io {
                        what: "udp connect (is an Output listening there, same service?)",
                        source: e.into(),
                    })
            })
            .join()
            .unwrap_or_else(|_| {
                Err(BufferError::io("udp connect")(std::io::Error::other(
                    "panicked",
                )))
            })
        })
        .map(|t| (ep, t))?;
        let shared = Arc::new(ClientShared::default());
        let sh = Arc::clone(&shared);
        let io = std::thread::Builder::new()
            .name("skiff-buf-urecv".into())
            .spawn(move || {
                let mut io = ClientIo {
                    sh,
                    tunnel,
                    rings: HashMap::new(),
                    out: VecDeque::new(),
                };
                io.run();
                // Closes gracefully before the endpoint goes.
                if !io.sh.stop.load(Ordering::Acquire) {
                    return;
                }
                close_tunnel(&io.tunnel, &thread_waker());
                drop(io);
                drop(ep);
            })
            .map_err(BufferError::io("spawn receiver thread"))?;
        Ok(Client {
            shared,
            io: io.thread().clone(),
            wait,
        })
    }

    /// Asks the output for buffer `id` and waits (up to the `wait` option)
    /// until it answered; returns the consumer of the local ring, which
    /// the I/O thread created and fills.
    pub(crate) fn subscribe(
        &self,
        id: BufferId,
        layout: &Layout,
    ) -> Result<RingConsumer, BufferError> {
        match *lock(&self.shared.ended) {
            Some(LOST) => return Err(BufferError::PeerLost { id }),
            Some(_) => return Err(BufferError::Closed { id }),
            None => {}
        }
        {
            let mut p = lock(&self.shared.pending);
            match p.get_mut(&id) {
                // An earlier attempt timed out: wait for the same answer.
                Some(old) if old.abandoned && old.done.is_none() => old.abandoned = false,
                Some(_) => {
                    return Err(BufferError::DuplicateId {
                        id,
                        owner: String::new(),
                    })
                }
                None => {
                    p.insert(
                        id,
                        Pending {
                            capacity: layout.geom.capacity(),
                            records: layout.geom.records(),
                            consumers: layout.consumers,
                            requested: false,
                            abandoned: false,
                            done: None,
                        },
                    );
                }
            }
        }
        self.nudge();
        let until = Instant::now() + self.wait;
        let mut p = lock(&self.shared.pending);
        loop {
            let entry = p.get_mut(&id).ok_or(BufferError::UnknownBuffer { id })?;
            if let Some(r) = entry.done.take() {
                p.remove(&id);
                return r;
            }
            let now = Instant::now();
            if now >= until {
                entry.abandoned = true;
                return Err(BufferError::UnknownBuffer { id });
            }
            p = self
                .shared
                .cv
                .wait_timeout(p, until - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Wakes the I/O thread to report credits (cheap when it is awake).
    pub(crate) fn nudge(&self) {
        if !self.shared.nudged.swap(true, Ordering::AcqRel) {
            self.io.unpark();
        }
    }

    pub(crate) fn stats(&self) -> LinkStats {
        self.shared.stats.snapshot()
    }

    /// Closes the tunnel gracefully in the background; the I/O thread
    /// closes the rings and exits.
    pub(crate) fn shutdown(self) {
        self.shared.stop.store(true, Ordering::Release);
        self.io.unpark();
    }
}

/// One local ring, filled by the I/O thread.
#[derive(Debug)]
struct Local {
    prod: RingProducer,
    /// Last credit reported and when.
    reported: (u64, u64),
    at: Instant,
}

/// The input's I/O thread.
struct ClientIo {
    sh: Arc<ClientShared>,
    tunnel: Tunnel,
    rings: HashMap<BufferId, Local>,
    out: VecDeque<Bytes>,
}

impl ClientIo {
    fn run(&mut self) {
        let waker = thread_waker();
        let mut cx = Context::from_waker(&waker);
        let end = loop {
            // Receive everything there is.
            let mut ended = None;
            while ended.is_none() {
                match self.tunnel.poll_recv(&mut cx) {
                    Poll::Ready(Ok(Some(m))) => self.handle(&m),
                    Poll::Ready(Ok(None)) => ended = Some(CLOSED),
                    Poll::Ready(Err(_)) => ended = Some(LOST),
                    Poll::Pending => break,
                }
            }
            if let Some(e) = ended {
                break e;
            }
            if self.sh.stop.load(Ordering::Acquire) {
                break CLOSED;
            }
            self.requests();
            let force = self.sh.nudged.swap(false, Ordering::AcqRel);
            let dirty = self.credits(force);
            while let Some(f) = self.out.front() {
                match self.tunnel.poll_send(&mut cx, f) {
                    Poll::Ready(Ok(())) => {
                        self.out.pop_front();
                    }
                    Poll::Ready(Err(_)) => break,
                    Poll::Pending => break,
                }
            }
            // Soon again if a credit waits for its turn; else until a nudge
            // (consumption that matters always nudges) or a tick.
            std::thread::park_timeout(if dirty { CREDIT_EVERY } else { TICK });
        };
        self.finish(end);
    }

    /// Ends every open ring with `state` and fails waiting subscriptions.
    fn finish(&mut self, state: u32) {
        if state == LOST {
            Counters::bump(&self.sh.stats.peers_lost);
        }
        for l in self.rings.values() {
            if l.prod.ring.state() == OPEN {
                l.prod.ring.close(state);
            }
        }
        let mut p = lock(&self.sh.pending);
        for (&id, e) in p.iter_mut() {
            if e.done.is_none() {
                e.done = Some(Err(if state == LOST {
                    BufferError::PeerLost { id }
                } else {
                    BufferError::Closed { id }
                }));
            }
        }
        *lock(&self.sh.ended) = Some(state);
        self.sh.cv.notify_all();
    }

    /// Sends the subscribe frames the application asked for; a buffer
    /// whose ring exists already (an abandoned earlier attempt) gets a new
    /// consumer at once.
    fn requests(&mut self) {
        let mut p = lock(&self.sh.pending);
        let mut woke = false;
        for (&id, e) in p.iter_mut() {
            if e.done.is_some() || e.abandoned {
                continue;
            }
            if let Some(l) = self.rings.get(&id) {
                e.done = Some(RingConsumer::attach(Arc::clone(&l.prod.ring)));
                woke = true;
            } else if !e.requested {
                e.requested = true;
                let (size, records) = (e.capacity as u32, e.records as u32);
                self.out
                    .push_back(frame::encode(&Frame::Subscribe { id, size, records }));
            }
        }
        if woke {
            self.sh.cv.notify_all();
        }
    }

    /// Queues a credit frame for every credit ring whose consumer moved,
    /// now if `force`, else at most every [`CREDIT_EVERY`]. A ring without
    /// consumers (abandoned, or spliced onward with no subscriber yet)
    /// reports everything consumed: its data is dropped, as a shared
    /// ring's would be. Returns whether a changed credit is still unsent.
    fn credits(&mut self, force: bool) -> bool {
        let now = Instant::now();
        let mut dirty = false;
        for (&id, l) in self.rings.iter_mut() {
            if l.prod.ring.layout.flow != Flow::Credits || l.prod.ring.state() != OPEN {
                continue;
            }
            let pos = match l.prod.slowest() {
                Some(s) => (s.consumed, s.records_read),
                None => (l.prod.head(), l.prod.segments()),
            };
            if pos == l.reported {
                continue;
            }
            if !force && now - l.at < CREDIT_EVERY {
                dirty = true;
            } else {
                l.reported = pos;
                l.at = now;
                self.out.push_back(frame::encode(&Frame::Credit {
                    id,
                    consumed: pos.0,
                    read: pos.1,
                }));
            }
        }
        dirty
    }

    fn handle(&mut self, m: &[u8]) {
        let stats = &self.sh.stats;
        match frame::decode_down(m) {
            Ok(Frame::Segment { id, data }) => match self.rings.get_mut(&id) {
                Some(l) if l.prod.ring.state() == OPEN => {
                    if write_segment(&mut l.prod, data).is_err() {
                        // Beyond the credits or the ring: the output broke
                        // the protocol; this buffer cannot continue.
                        Counters::bump(&stats.protocol);
                        l.prod.ring.close(CORRUPT);
                    }
                }
                _ => Counters::bump(&stats.unknown),
            },
            Ok(Frame::Subscribed { id, flow }) => self.subscribed(id, flow),
            Ok(Frame::Close { id, reason }) => match self.rings.get(&id) {
                Some(l) if l.prod.ring.state() == OPEN => l.prod.ring.close(match reason {
                    CloseReason::Producer => CLOSED,
                    CloseReason::Corrupt => CORRUPT,
                    CloseReason::Lost => LOST,
                }),
                _ => Counters::bump(&stats.unknown),
            },
            Ok(_) | Err(_) => Counters::bump(&stats.malformed),
        }
    }

    /// The output acknowledged `id`: make the local ring (with the
    /// output's flow), attach the application's consumer before any
    /// segment can arrive, and hand it over.
    fn subscribed(&mut self, id: BufferId, flow: Flow) {
        let mut p = lock(&self.sh.pending);
        let Some(e) = p.get_mut(&id).filter(|e| e.requested && e.done.is_none()) else {
            Counters::bump(&self.sh.stats.unknown);
            return;
        };
        if self.rings.contains_key(&id) {
            Counters::bump(&self.sh.stats.unknown);
            return;
        }
        let made = (|| {
            let layout = Layout::new(e.capacity, e.records, e.consumers, flow)
                .map_err(|b| BufferError::Usage { id, why: b.0 })?;
            let region = Region::anonymous(layout.total).map_err(BufferError::io("map ring"))?;
            let ring = Arc::new(Ring::init(region, layout, id));
            let cons = if e.abandoned {
                None
            } else {
                Some(RingConsumer::attach(Arc::clone(&ring))?)
            };
            Ok((ring, cons))
        })();
        match made {
            Ok((ring, cons)) => {
                self.rings.insert(
                    id,
                    Local {
                        prod: RingProducer::new(ring),
                        reported: (0, 0),
                        at: Instant::now(),
                    },
                );
                if let Some(c) = cons {
                    e.done = Some(Ok(c));
                } else {
                    p.remove(&id);
                }
            }
            Err(err) => e.done = Some(Err(err)),
        }
        self.sh.cv.notify_all();
    }
}

/// Copies one segment into the local ring; fails (without writing) when
/// it does not fit now.
fn write_segment(p: &mut RingProducer, data: &[u8]) -> Result<(), ()> {
    let len = data.len() as u64;
    let res = p.try_reserve(len).map_err(|_| ())?;
    let mut w = p.writable(res);
    {
        let (a, b) = w.slices_mut();
        let (x, y) = data.split_at(a.len());
        a.copy_from_slice(x);
        b.copy_from_slice(y);
    }
    drop(w);
    p.commit(len).map_err(|_| ())?;
    Ok(())
}
