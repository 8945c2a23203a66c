//! The `tcp://` transport of the buffer API: RocketBufs' framing, a 32-bit
//! buffer id and a 32-bit size (little-endian) before each segment's bytes.
//!
//! ```text
//! subscriber -> output:  | id u32 | size u32 |              subscribe(id, size)
//! output -> subscriber:  | id u32 | 0xffffffff |            subscribed (attached)
//! output -> subscriber:  | id u32 | len u32 | len bytes |  one segment
//! ```
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

use std::collections::HashMap;
use std::collections::HashSet;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use skiff_proto::credits::{Delivered, Flow};

use super::layout::{CLOSED, CORRUPT};
use super::ring::{Ring, RingConsumer, RingProducer};
use super::{BufferError, BufferId};

type Registry = Arc<Mutex<HashMap<BufferId, Arc<Ring>>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The output side: a listener and one sender thread per subscriber.
#[derive(Debug)]
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    rings: Registry,
    stop: Arc<AtomicBool>,
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
        let rings: Registry = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (Arc::clone(&rings), Arc::clone(&stop));
        let accept = std::thread::Builder::new()
            .name("skiff-buf-accept".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    match l.accept() {
                        Ok((stream, _)) => {
                            let (r, s) = (Arc::clone(&r), Arc::clone(&s));
                            let _ = std::thread::Builder::new()
                                .name("skiff-buf-send".into())
                                .spawn(move || sender(stream, r, s, spin));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(2)),
                    }
                }
            })
            .map_err(BufferError::io("spawn accept thread"))?;
        Ok(Server {
            addr,
            rings,
            stop,
            accept: Some(accept),
        })
    }

    /// Makes ring `id` available to subscribers.
    pub(crate) fn publish(&self, id: BufferId, ring: Arc<Ring>) {
        lock(&self.rings).insert(id, ring);
    }

    /// Stops accepting; sender threads drain what is published and exit.
    pub(crate) fn shutdown(mut self) {
        self.stop.store(true, Ordering::Release);
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
        let mut n = stream.write_vectored(&slices)?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
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

/// Sends segment `d` of `cons` as one frame, then consumes it.
fn send(
    stream: &mut TcpStream,
    id: BufferId,
    cons: &mut RingConsumer,
    d: Delivered,
    scratch: &mut Vec<u8>,
) -> Result<(), BufferError> {
    let mut hdr = [0u8; 8];
    hdr[..4].copy_from_slice(&id.to_le_bytes());
    hdr[4..].copy_from_slice(&(d.len as u32).to_le_bytes());
    let w = match cons.slices(d.start, d.len) {
        Some((a, b)) => write_all(stream, &[&hdr, a, b]),
        None => {
            scratch.clear();
            if !cons.copy(d.seg, d.start, d.len, scratch) {
                // Overwritten while copied (counted): not sent.
                return Ok(());
            }
            write_all(stream, &[&hdr, scratch])
        }
    };
    w.map_err(BufferError::io("tcp send"))?;
    if cons.ring.layout.flow == Flow::Credits {
        cons.consume(d.len)?;
    }
    Ok(())
}

/// The acknowledgement's length field.
const ACK: u32 = u32::MAX;

/// One subscriber connection (see [`sender_loop`]); the socket is shut
/// down when it ends, which also ends the helper thread.
fn sender(stream: TcpStream, rings: Registry, stop: Arc<AtomicBool>, spin: Duration) {
    let Ok(s) = stream.try_clone() else {
        return;
    };
    sender_loop(stream, rings, stop, spin);
    let _ = s.shutdown(Shutdown::Both);
}

/// Reads subscribe frames on a helper thread, sends segments of the
/// subscribed rings on this one.
fn sender_loop(mut stream: TcpStream, rings: Registry, stop: Arc<AtomicBool>, spin: Duration) {
    let _ = stream.set_nodelay(true);
    let wanted: Arc<Mutex<Vec<BufferId>>> = Arc::default();
    let dead = Arc::new(AtomicBool::new(false));
    let Ok(mut rd) = stream.try_clone() else {
        return;
    };
    let (w, d) = (Arc::clone(&wanted), Arc::clone(&dead));
    let _ = std::thread::Builder::new()
        .name("skiff-buf-subs".into())
        .spawn(move || {
            let mut f = [0u8; 8];
            while rd.read_exact(&mut f).is_ok() {
                let id = u32::from_le_bytes([f[0], f[1], f[2], f[3]]);
                lock(&w).push(id);
            }
            d.store(true, Ordering::Release);
        });
    let mut pending: Vec<BufferId> = Vec::new();
    let mut subs: Vec<(BufferId, RingConsumer)> = Vec::new();
    let mut scratch = Vec::new();
    loop {
        if dead.load(Ordering::Acquire) {
            return;
        }
        let stopping = stop.load(Ordering::Acquire);
        pending.append(&mut lock(&wanted));
        let mut acks = Vec::new();
        pending.retain(|id| match lock(&rings).get(id) {
            Some(r) => {
                if let Ok(c) = RingConsumer::attach(Arc::clone(r)) {
                    subs.push((*id, c));
                    acks.push(*id);
                }
                false
            }
            None => true,
        });
        for id in acks {
            let mut f = [0u8; 8];
            f[..4].copy_from_slice(&id.to_le_bytes());
            f[4..].copy_from_slice(&ACK.to_le_bytes());
            if stream.write_all(&f).is_err() {
                return;
            }
        }
        let mut sent = false;
        let mut failed = false;
        subs.retain_mut(|(id, cons)| {
            for _ in 0..64 {
                match cons.try_next() {
                    Ok(Some(d)) => {
                        if send(&mut stream, *id, cons, d, &mut scratch).is_err() {
                            failed = true;
                            return false;
                        }
                        sent = true;
                    }
                    Ok(None) => return true,
                    Err(_) => return false,
                }
            }
            true
        });
        if failed {
            return;
        }
        if stopping && !sent {
            return;
        }
        if !sent {
            match subs.first_mut() {
                Some((id, cons)) => {
                    let until = Instant::now() + Duration::from_millis(5);
                    match cons.next(Some(until), spin) {
                        Ok(Some(d)) => {
                            if send(&mut stream, *id, cons, d, &mut scratch).is_err() {
                                return;
                            }
                        }
                        Ok(None) => {}
                        Err(_) => {
                            subs.remove(0);
                        }
                    }
                }
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    }
}

type Producers = Arc<Mutex<HashMap<BufferId, Arc<Mutex<RingProducer>>>>>;
type Acks = Arc<(Mutex<HashSet<BufferId>>, Condvar)>;

/// The input side: a connection and its receiver thread.
#[derive(Debug)]
pub(crate) struct Client {
    stream: Mutex<TcpStream>,
    rings: Producers,
    acks: Acks,
    wait: Duration,
}

impl Client {
    pub(crate) fn connect(addr: SocketAddr, wait: Duration) -> Result<Client, BufferError> {
        let stream = TcpStream::connect_timeout(&addr, wait.max(Duration::from_millis(1)))
            .map_err(BufferError::io("tcp connect"))?;
        let _ = stream.set_nodelay(true);
        let rd = stream.try_clone().map_err(BufferError::io("tcp clone"))?;
        let rings: Producers = Arc::default();
        let acks: Acks = Arc::default();
        let (r, a) = (Arc::clone(&rings), Arc::clone(&acks));
        std::thread::Builder::new()
            .name("skiff-buf-recv".into())
            .spawn(move || receiver(rd, r, a))
            .map_err(BufferError::io("spawn receiver thread"))?;
        Ok(Client {
            stream: Mutex::new(stream),
            rings,
            acks,
            wait,
        })
    }

    /// Registers the local ring of `id`, asks the output for it and waits
    /// (up to the `wait` option) for its acknowledgement.
    pub(crate) fn subscribe(
        &self,
        id: BufferId,
        size: u32,
        prod: RingProducer,
    ) -> Result<(), BufferError> {
        lock(&self.rings).insert(id, Arc::new(Mutex::new(prod)));
        let mut f = [0u8; 8];
        f[..4].copy_from_slice(&id.to_le_bytes());
        f[4..].copy_from_slice(&size.to_le_bytes());
        lock(&self.stream)
            .write_all(&f)
            .map_err(BufferError::io("tcp subscribe"))?;
        let until = Instant::now() + self.wait;
        let (set, cv) = &*self.acks;
        let mut acked = lock(set);
        while !acked.contains(&id) {
            let now = Instant::now();
            if now >= until {
                drop(acked);
                lock(&self.rings).remove(&id);
                return Err(BufferError::UnknownBuffer { id });
            }
            acked = cv
                .wait_timeout(acked, until - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        Ok(())
    }

    /// Closes the connection; the receiver thread closes the rings and
    /// exits.
    pub(crate) fn shutdown(self) {
        let _ = lock(&self.stream).shutdown(Shutdown::Both);
    }
}

/// Reads frames into the local rings until the connection ends, then
/// closes every ring (subscribers read what arrived, then `Closed`).
fn receiver(mut rd: TcpStream, rings: Producers, acks: Acks) {
    let mut hdr = [0u8; 8];
    let mut sink = vec![0u8; 64 << 10];
    while rd.read_exact(&mut hdr).is_ok() {
        let id = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
        let len = u32::from_le_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]);
        if len == ACK {
            lock(&acks.0).insert(id);
            acks.1.notify_all();
            continue;
        }
        let len = u64::from(len);
        let prod = lock(&rings).get(&id).cloned();
        let ok = match prod {
            Some(p) => {
                let mut p = lock(&p);
                if len > p.ring.layout.geom.capacity() {
                    // The subscriber's ring is smaller than the segment:
                    // nothing sensible can follow.
                    p.ring.close(CORRUPT);
                    false
                } else {
                    receive_into(&mut rd, &mut p, len).is_ok()
                }
            }
            None => discard(&mut rd, len, &mut sink).is_ok(),
        };
        if !ok {
            break;
        }
    }
    for p in lock(&rings).values() {
        let p = lock(p);
        if p.ring.state() != CORRUPT {
            p.ring.close(CLOSED);
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
