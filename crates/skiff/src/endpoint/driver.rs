//! The endpoint's driver thread: one current-thread tokio runtime that
//! waits for the socket, the application's nudges and the earliest timer,
//! and on each wake-up receives everything waiting, runs the state
//! machines, and sends everything due in as few `sendmmsg` calls as it can
//! (equal-size datagrams to one host as one GSO run).
//!
//! The timer is a `timerfd` rather than tokio's (whose wheel rounds up to
//! a millisecond, longer than a loopback probe timeout), and the
//! application's threads may re-arm it earlier without waking the driver
//! when they send on their own (see `Shared::transmit`). The outbox is
//! shared the same way: whoever holds it sends.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tokio::io::Interest;

use super::Shared;
use crate::udp::{Outgoing, RecvBatch, UdpSocket};

/// Datagrams per `recvmmsg`.
const RECV_SLOTS: usize = 64;
/// `recvmmsg` calls per wake-up before the driver sends and comes back.
const RECV_ROUNDS: usize = 8;
/// Bytes collected for sending per wake-up, about.
pub(crate) const SEND_BYTES: usize = 2 << 20;
/// Datagrams in one GSO run at most.
const GSO_SEGMENTS: usize = 64;

/// Datagrams ready to send, back to back in one buffer.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    buf: Vec<u8>,
    /// Destination, start, end, and whether it must travel alone (not in
    /// a GSO run: a super-packet shares one fate on the path).
    dgrams: Vec<(SocketAddr, usize, usize, bool)>,
    next: usize,
}

impl Outbox {
    pub(crate) fn push(&mut self, dest: SocketAddr, bytes: &[u8]) {
        let s = self.buf.len();
        self.buf.extend_from_slice(bytes);
        self.dgrams.push((dest, s, self.buf.len(), false));
    }

    /// Starts a datagram written directly into the buffer.
    pub(crate) fn begin(&mut self) -> (&mut Vec<u8>, usize) {
        let s = self.buf.len();
        (&mut self.buf, s)
    }

    /// Ends the datagram started at `start`.
    pub(crate) fn end(&mut self, dest: SocketAddr, start: usize) {
        self.dgrams.push((dest, start, self.buf.len(), false));
    }

    /// Ends the datagram started at `start`, to travel alone: not in a GSO
    /// run with others (the copy of a packet must not share the
    /// original's fate).
    pub(crate) fn end_alone(&mut self, dest: SocketAddr, start: usize) {
        self.dgrams.push((dest, start, self.buf.len(), true));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.next >= self.dgrams.len()
    }

    fn clear(&mut self) {
        self.buf.clear();
        self.dgrams.clear();
        self.next = 0;
    }

    /// Sends what is left; `Ok(true)` when everything went, `Ok(false)`
    /// when the socket buffer is full. Returns datagrams sent and calls
    /// made through the counters.
    pub(crate) fn send(
        &mut self,
        socket: &UdpSocket,
        sent: &mut u64,
        calls: &mut u64,
        errors: &mut u64,
    ) -> bool {
        let gso = socket.max_segments() > 1;
        while !self.is_empty() {
            // Group equal-size runs to one host (the last may be shorter).
            let mut out: Vec<Outgoing<'_>> = Vec::new();
            let mut counts: Vec<usize> = Vec::new();
            let mut i = self.next;
            while i < self.dgrams.len() && out.len() < 64 {
                let (dest, s, e, alone) = self.dgrams[i];
                let len = e - s;
                let mut j = i + 1;
                let mut end = e;
                if gso && !alone {
                    while j < self.dgrams.len() && j - i < GSO_SEGMENTS {
                        let (d, s2, e2, alone2) = self.dgrams[j];
                        if d != dest || s2 != end || e2 - s2 > len || alone2 {
                            break;
                        }
                        end = e2;
                        j += 1;
                        if e2 - s2 < len {
                            break;
                        }
                    }
                }
                out.push(Outgoing {
                    dest,
                    data: &self.buf[s..end],
                    segment_size: (j - i > 1).then_some(len),
                });
                counts.push(j - i);
                i = j;
            }
            *calls += 1;
            match socket.send(&out) {
                Ok(k) => {
                    let n: usize = counts[..k.min(counts.len())].iter().sum();
                    self.next += n;
                    *sent += n as u64;
                    if k == 0 {
                        return false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(_) => {
                    // The first datagram was refused (unreachable, too
                    // big): the association retransmits; move on.
                    self.next += counts[0];
                    *errors += 1;
                }
            }
        }
        self.clear();
        true
    }
}

/// The driver thread's body.
pub(crate) fn run(shared: Arc<Shared>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let result = match rt {
        Ok(rt) => rt.block_on(drive(&shared)),
        Err(e) => Err(e),
    };
    if let Err(e) = result {
        eprintln!("skiff: endpoint driver stopped: {e}");
    }
    shared.core.lock().stop();
}

async fn drive(shared: &Shared) -> io::Result<()> {
    let fd = shared
        .socket
        .register_async(Interest::READABLE | Interest::WRITABLE)?;
    let slot = if shared.config.udp.gro {
        65_536
    } else {
        skiff_proto::wire::MAX_DATAGRAM + 1
    };
    let mut batch = RecvBatch::new(RECV_SLOTS, slot);
    let timer = crate::sys::register_async(shared.timer.as_fd(), Interest::READABLE)?;
    let max_datagram = shared.config.datagram_limit();
    let limit = shared.config.tunnel_buffer;
    loop {
        if shared.shutdown.load(Ordering::Acquire) {
            return Ok(());
        }
        let now = Instant::now();
        let mut more = false;
        for round in 0..=RECV_ROUNDS {
            if round == RECV_ROUNDS {
                more = true;
                break;
            }
            match shared.socket.recv(&mut batch) {
                Ok(n) => {
                    // Fewer buffers than slots: the socket was empty a
                    // moment ago. What arrives from now on sets its
                    // readiness again (it was cleared before this call), so
                    // the empty `recvmmsg` that would confirm it is saved.
                    let drained = n < RECV_SLOTS;
                    let mut core = shared.core.lock();
                    core.stats.recv_calls += 1;
                    for d in batch.drain() {
                        if d.truncated {
                            core.stats.dropped_truncated += 1;
                            continue;
                        }
                        for dg in d.datagrams() {
                            core.handle_datagram(now, d.from, dg);
                        }
                    }
                    if drained {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // An ICMP error reported on the socket: the association's
                // timers deal with the peer; go on.
                Err(_) => break,
            }
        }
        let blocked = {
            // Lock order: the outbox, then the core.
            let mut out = shared.out.lock();
            {
                let mut core = shared.core.lock();
                core.stats.wakeups += 1;
                core.after_input(now, limit);
                if out.is_empty() {
                    more |= core.collect(now, &mut out, max_datagram, SEND_BYTES);
                }
                let deadline = core.poll_timeout();
                shared.arm_timer(&mut core, deadline, false);
            }
            if out.is_empty() {
                false
            } else {
                let (mut sent, mut calls, mut errors) = (0, 0, 0);
                let blocked = !out.send(&shared.socket, &mut sent, &mut calls, &mut errors);
                let mut core = shared.core.lock();
                core.stats.datagrams_sent += sent;
                core.stats.send_calls += calls;
                core.stats.send_errors += errors;
                blocked
            }
        };
        if more && !blocked {
            tokio::task::yield_now().await;
            continue;
        }
        tokio::select! {
            r = fd.readable() => {
                if let Ok(mut g) = r {
                    g.clear_ready();
                }
            }
            r = fd.writable(), if blocked => {
                if let Ok(mut g) = r {
                    g.clear_ready();
                }
            }
            _ = shared.wake.notified() => {}
            r = timer.readable() => {
                if let Ok(mut g) = r {
                    let _ = crate::sys::timerfd_clear(shared.timer.as_fd());
                    g.clear_ready();
                }
            }
        }
    }
}
