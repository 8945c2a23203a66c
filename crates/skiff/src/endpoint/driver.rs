//! The endpoint's driver: a task on the caller's runtime, or a thread
//! running one current-thread tokio runtime, that
//! waits for the socket, the application's nudges and the earliest timer,
//! and on each wake-up receives everything waiting, runs the state
//! machines, and sends everything due in as few `sendmmsg` calls as it can
//! (equal-size datagrams to one host as one GSO run) through the crate's
//! one batching path, [`SendBatch`].
//!
//! The timer is a `timerfd` rather than tokio's (whose wheel rounds up to
//! a millisecond, longer than a loopback probe timeout), and the
//! application's threads may re-arm it earlier without waking the driver
//! when they send on their own (see `Shared::transmit`). The outbox is
//! shared the same way: whoever holds it sends.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::Shared;
use crate::udp::{RecvBatch, SendBatch};

/// Datagrams per `recvmmsg`.
const RECV_SLOTS: usize = 64;
/// `recvmmsg` calls per wake-up before the driver sends and comes back.
const RECV_ROUNDS: usize = 8;
/// Bytes collected for sending per wake-up (or per send of an
/// application thread), about. Each collection is written into the send
/// batch and then copied by the kernel out of it: a batch that stays within
/// the CPU's cache is copied from there (at 2 MiB per collection the
/// kernel's copy took about twice the time per byte: the bulk runs in
/// `bench/RESULTS.md`).
pub(crate) const SEND_BYTES: usize = 256 << 10;
/// The driver thread's body: the driver's task, on a current-thread
/// runtime of its own.
pub(crate) fn run(shared: Arc<Shared>) {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(run_task(shared)),
        Err(e) => {
            tracing::error!(error = %e, "endpoint driver stopped");
            shared.core.lock().stop();
        }
    }
}

/// The driver as a task on the caller's runtime. The endpoint stops when
/// the task ends, also when its runtime drops it unfinished or before it
/// ever ran (the guard is made here, not in the task's first poll).
pub(crate) fn run_task(shared: Arc<Shared>) -> impl std::future::Future<Output = ()> + Send {
    struct Stop(Arc<Shared>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.core.lock().stop();
        }
    }
    let stop = Stop(shared);
    async move {
        if let Err(e) = drive(&stop.0).await {
            tracing::error!(error = %e, "endpoint driver stopped");
        }
    }
}

async fn drive(shared: &Shared) -> io::Result<()> {
    // Readable only: a socket registered for writability too wakes this
    // thread whenever the kernel frees send-buffer space, i.e. on every
    // send of an application thread (`Shared::transmit`) while the driver
    // sleeps. Writability is waited for only while blocked (`writable`).
    let fd = shared.socket.register_async(Interest::READABLE)?;
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
                        let from = d.from;
                        core.handle_run(now, from, d.into_datagrams());
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
                // Send stages staged behind data in flight (see
                // `Shared::staged`).
                let asks = std::mem::take(&mut *shared.stage_asks.lock());
                for key in asks {
                    core.flush(key);
                }
                if out.is_empty() {
                    more |= core.collect(now, &mut out, max_datagram);
                }
                let deadline = core.poll_timeout();
                shared.arm_timer(&mut core, deadline, false);
            }
            if out.is_empty() {
                false
            } else {
                let blocked = !send(shared, &mut out);
                drop(out);
                blocked
            }
        };
        if more && !blocked {
            tokio::task::yield_now().await;
            continue;
        }
        let out_fd = match blocked.then(|| writable(shared)).transpose() {
            Ok(fd) => fd,
            // No descriptor to spare: try the send again after the other
            // tasks had their turn.
            Err(_) => {
                tokio::task::yield_now().await;
                continue;
            }
        };
        tokio::select! {
            r = fd.readable() => {
                if let Ok(mut g) = r {
                    g.clear_ready();
                }
            }
            _ = async {
                match &out_fd {
                    Some(f) => drop(f.writable().await),
                    None => std::future::pending().await,
                }
            } => {}
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

/// A registration of the socket for writability, made when a send found
/// its buffer full and dropped once the driver wakes. Registering reports
/// a socket that is writable already (`epoll_ctl` checks the state), so
/// space freed between the failed send and this call is not missed.
fn writable(shared: &Shared) -> io::Result<AsyncFd<OwnedFd>> {
    shared.socket.register_async(Interest::WRITABLE)
}

/// Sends what `out` holds until it is empty (`true`) or the socket's
/// buffer is full (`false`), and counts it. A datagram the kernel refuses
/// is dropped: the association retransmits. Call with `out` locked and the
/// core not.
pub(crate) fn send(shared: &Shared, out: &mut SendBatch) -> bool {
    let sent = shared.socket.try_send_batch(out);
    let mut core = shared.core.lock();
    core.stats.datagrams_sent += sent.datagrams as u64;
    core.stats.send_calls += sent.calls as u64;
    core.stats.send_errors += sent.refused as u64;
    out.is_empty()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::udp::{UdpConfig, UdpSocket};

    /// The driver registers for writability only after a send found the
    /// buffer full; if the space came back before that, the registration
    /// itself must report it, or the driver would sleep until its timer.
    #[tokio::test]
    async fn a_late_registration_for_writability_reports_a_writable_socket() {
        let socket =
            UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &UdpConfig::default()).unwrap();
        let fd = socket.register_async(Interest::WRITABLE).unwrap();
        let ready = tokio::time::timeout(Duration::from_secs(5), fd.writable()).await;
        assert!(ready.is_ok_and(|g| g.is_ok()));
    }
}
