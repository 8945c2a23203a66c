//! The association endpoint: one UDP socket that carries reliable
//! [`Tunnel`]s (QMP associations) and best-effort messages to the same
//! hosts, sharing datagrams.
//!
//! An [`Endpoint`] owns a [`UdpSocket`], a sans-I/O association endpoint
//! ([`association::Endpoint`]: every tunnel's association, initiated or
//! accepted, with their demultiplexing, set-up and timers) and a
//! [`Batcher`] for best-effort [`Endpoint::push`]es. One driver runs them
//! all, for tunnels and reliable queues alike (a task on the caller's
//! tokio runtime when there is one, as quinn's endpoint driver is, else a
//! thread of its own; [`DriverMode`]):
//! it sleeps until the socket is readable, the application asks for
//! something, or the earliest timer of any state machine is due; each
//! wake-up receives everything waiting (`recvmmsg`, GRO), runs the timers,
//! and sends everything due in one `sendmmsg` (equal-size runs to one host
//! as one GSO send). Application calls touch the state machines under a
//! lock; when nobody is sending (the path is idle), the calling thread
//! sends what became due itself, without a hand-off to the driver (the
//! queue's natural batching: while one thread sends, the calls of others
//! accumulate and leave together in the next batch); otherwise it nudges
//! the driver. A tunnel's small messages do not take that lock one by
//! one: they wait in the tunnel's own send stage and enter the association
//! together, and `recv` takes all of a tunnel's received messages at once
//! into its receive stage (`stage.rs`, with the lock order).
//!
//! **Sharing the path**: within one wake-up, small frames to the same host
//! (acknowledgements, small data packets, best-effort batches) are packed
//! into one compound datagram ([`skiff_proto::compound`], frame kind 3)
//! up to the path's datagram size; the receiver splits it and hands each
//! frame to its decoder. Frames that fill a datagram alone travel alone.
//!
//! What the endpoint guarantees is the association's (see
//! [`crate::tunnel`]) for tunnels and the queue's for pushes: best effort,
//! at most once, loss counted. Everything it drops is counted in
//! [`EndpointStats`], with the association endpoint's and the
//! associations' own rejection counters.
//!
//! The endpoint thread runs the association endpoint through [`Pump`], the
//! one thin driver that the node's mesh uses for its tunnels too.
//!
//! **Where the driver runs.** Bound inside a multi-thread tokio runtime,
//! the driver is a task on it: a packet's arrival wakes a worker, which
//! runs the driver and then, without a hand-off to another thread, the
//! task waiting for the tunnel's message (woken on the same worker). A
//! driver thread of its own costs a wake-up of a second thread for every
//! batch received and for every acknowledgement (measured in
//! `bench/RESULTS.md`, session 32).
//! Blocking calls (`ReliableQueue`, the shared-memory association) keep a
//! thread, since their callers wait on it synchronously.
//!
//! Dropping the endpoint stops the driver at once: its tunnels fail
//! ([`TunnelError::EndpointGone`]) and their peers see them go silent (they
//! detect a dead peer after `idle_timeout`). Close tunnels first to end
//! them gracefully.

use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Mutex, MutexGuard};
use skiff_proto::association::{self, AssociationConfig, AssociationStats};
use skiff_proto::{Batcher, BatcherConfig, Dest, LossDetector, Message};
use tokio::sync::Notify;

use crate::error::Error;
use crate::tunnel::{Tunnel, TunnelError};
use crate::udp::{SendBatch, UdpSocket};

mod config;
mod core;
mod driver;
mod pump;
pub(crate) mod reliable;
pub(crate) mod stage;

pub(crate) use self::config::add_stats;
pub use self::config::{DriverMode, EndpointConfig, EndpointStats};
use self::core::{Conn, Core};
pub use self::pump::{Outlet, Pump};
use self::stage::{Inbound, Move, RecvStage, Stage};

/// What the driver and the handles share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) core: Mutex<Core>,
    /// Datagrams collected and not yet sent. Whoever holds it sends (the
    /// driver, or an application thread finding the path idle); lock it
    /// before `core`.
    pub(crate) out: Mutex<SendBatch>,
    /// The driver's timer (a `timerfd`): armed for the earliest deadline
    /// of any state machine (`Core::timer_armed`).
    pub(crate) timer: OwnedFd,
    pub(crate) socket: UdpSocket,
    pub(crate) config: EndpointConfig,
    /// Nudges the driver: something to send or a new deadline.
    pub(crate) wake: Notify,
    /// Tunnels whose send stage the driver moves at its next wake-up
    /// (staged while data was in flight). Taken alone, or inside `core`.
    pub(crate) stage_asks: Mutex<Vec<u64>>,
    pub(crate) shutdown: AtomicBool,
}

/// An endpoint: see the module documentation.
#[derive(Debug)]
pub struct Endpoint {
    shared: Arc<Shared>,
    local: SocketAddr,
    driver: Option<Driver>,
}

/// The running driver, to stop it.
#[derive(Debug)]
enum Driver {
    Thread(JoinHandle<()>),
    Task(tokio::task::JoinHandle<()>),
}

impl Driver {
    fn is_running(&self) -> bool {
        match self {
            Driver::Thread(h) => !h.is_finished(),
            Driver::Task(h) => !h.is_finished(),
        }
    }
}

impl Endpoint {
    /// Binds an endpoint: `udp://0.0.0.0:4711?mtu=1472&idle_timeout=10s`.
    pub fn bind(locator: &str) -> Result<Endpoint, Error> {
        Endpoint::with_config(EndpointConfig::from_locator(locator)?)
    }

    /// Binds an endpoint with an explicit configuration.
    pub fn with_config(config: EndpointConfig) -> Result<Endpoint, Error> {
        let socket =
            UdpSocket::bind(config.bind, &config.udp).map_err(Error::io("bind UDP socket"))?;
        let local = socket
            .local_addr()
            .map_err(Error::io("read local address"))?;
        let assocs = association::Endpoint::new(association::EndpointConfig {
            service: config.service,
            listen: false,
            max_associations: config.max_associations,
            max_half_open: config.max_half_open,
            seed: rand::random(),
            // A large message reaches `recv` in its pieces, joined by the
            // reader on its own thread, not by the driver (whose thread
            // receives every packet of every tunnel).
            association: AssociationConfig {
                deliver_pieces: true,
                ..config.association.clone()
            },
        });
        let batcher = Batcher::new(BatcherConfig {
            qthresh: config.datagram_limit(),
            timeout: Duration::ZERO,
            max_datagram: config.datagram_limit(),
            max_destinations: 1 << 16,
            source: rand::random(),
        });
        let core = Core::new(assocs, batcher, LossDetector::new(4096), config.max_inbox);
        let timer = crate::sys::timerfd().map_err(Error::io("create the endpoint's timer"))?;
        let shared = Arc::new(Shared {
            core: Mutex::new(core),
            out: Mutex::new(SendBatch::new()),
            timer,
            socket,
            config,
            wake: Notify::new(),
            stage_asks: Mutex::new(Vec::new()),
            shutdown: AtomicBool::new(false),
        });
        let s = shared.clone();
        let runtime = tokio::runtime::Handle::try_current();
        let task = match shared.config.driver {
            DriverMode::Thread => None,
            DriverMode::Auto => runtime
                .ok()
                .filter(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread),
            DriverMode::Task => Some(runtime.map_err(|_| {
                Error::io("start the endpoint's driver (driver=task needs a tokio runtime; driver=thread does not)")(
                    std::io::Error::other("no tokio runtime on this thread"),
                )
            })?),
        };
        let driver = match task {
            Some(h) => Driver::Task(h.spawn(driver::run_task(s))),
            None => Driver::Thread(
                std::thread::Builder::new()
                    .name("skiff-endpoint".into())
                    .spawn(move || driver::run(s))
                    .map_err(Error::io("spawn endpoint driver thread"))?,
            ),
        };
        Ok(Endpoint {
            shared,
            local,
            driver: Some(driver),
        })
    }

    /// The bound address (with the port the OS chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The configuration in force.
    pub fn config(&self) -> &EndpointConfig {
        &self.shared.config
    }

    /// Whether the driver runs as a task on the caller's runtime
    /// ([`DriverMode::Task`], or what [`DriverMode::Auto`] chose).
    pub fn driver_is_task(&self) -> bool {
        matches!(self.driver, Some(Driver::Task(_)))
    }

    /// Starts accepting tunnels (QMP's listening context); before this,
    /// set-ups are dropped and counted (`first_not_listening`).
    pub fn listen(&self) {
        self.shared.core.lock().assocs.set_listening(true);
    }

    /// The next tunnel a peer set up. Fails with
    /// [`TunnelError::NotListening`] unless [`Endpoint::listen`] was called.
    pub async fn accept(&self) -> Result<Tunnel, TunnelError> {
        std::future::poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// The next accepted tunnel, without waiting.
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<Result<Tunnel, TunnelError>> {
        let mut core = self.shared.core.lock();
        if core.stopped {
            return Poll::Ready(Err(TunnelError::EndpointGone));
        }
        if !core.assocs.is_listening() {
            return Poll::Ready(Err(TunnelError::NotListening));
        }
        if let Some((key, peer)) = core.accepted.pop_front() {
            let stage = core.conns.get(&key).map(|c| c.stage.clone());
            return Poll::Ready(Ok(Tunnel {
                shared: self.shared.clone(),
                key,
                peer,
                stage: stage.unwrap_or_default(),
            }));
        }
        register(&mut core.accept_wakers, cx.waker());
        Poll::Pending
    }

    /// Sets up a tunnel to the endpoint listening at `peer` (same service
    /// id), waiting up to `timeout` for its answer.
    pub async fn connect(
        &self,
        peer: SocketAddr,
        timeout: Duration,
    ) -> Result<Tunnel, TunnelError> {
        let (key, stage) = {
            let mut core = self.shared.core.lock();
            if core.stopped {
                return Err(TunnelError::EndpointGone);
            }
            let key = core.connect(Instant::now(), peer, self.shared.config.service);
            let stage = core.conns.get(&key).map(|c| c.stage.clone());
            self.shared.wake.notify_one();
            (key, stage.unwrap_or_default())
        };
        // From here the tunnel owns the association: dropping it on error
        // or timeout cleans up.
        let tunnel = Tunnel {
            shared: self.shared.clone(),
            key,
            peer,
            stage,
        };
        let connected = std::future::poll_fn(|cx| self.shared.poll_connected(key, cx));
        match tokio::time::timeout(timeout, connected).await {
            Ok(Ok(())) => Ok(tunnel),
            Ok(Err(TunnelError::Failed {
                reason: skiff_proto::association::FailReason::HandshakeTimeout,
                ..
            }))
            | Err(_) => {
                self.shared.abort(key);
                Err(TunnelError::ConnectTimeout {
                    peer,
                    service: self.shared.config.service,
                })
            }
            Ok(Err(e)) => Err(e),
        }
    }

    /// Queues a best-effort message for `dest` (batched, sharing datagrams
    /// with tunnels to the same host); never waits on the network.
    pub fn push(&self, dest: SocketAddr, msg: &Message) -> Result<(), Error> {
        let mut core = self.shared.core.lock();
        let now = Instant::now();
        core.batcher.push(now, Dest::any(dest), msg)?;
        core.stats.pushed += 1;
        drop(core);
        self.shared.wake.notify_one();
        Ok(())
    }

    /// A best-effort message that arrived, if any.
    pub fn try_pop(&self) -> Option<Message> {
        self.shared.core.lock().inbox.pop_front()
    }

    /// The next best-effort message, waiting for one.
    pub async fn pop(&self) -> Message {
        std::future::poll_fn(|cx| {
            let mut core = self.shared.core.lock();
            match core.inbox.pop_front() {
                Some(m) => Poll::Ready(m),
                None => {
                    register(&mut core.pop_wakers, cx.waker());
                    Poll::Pending
                }
            }
        })
        .await
    }

    /// Counters so far; see [`EndpointStats`].
    pub fn stats(&self) -> EndpointStats {
        self.shared.core.lock().stats()
    }
}

/// How long a dropped [`Endpoint`] keeps its driver running while a close
/// is still on its way to a peer (see [`Endpoint`]'s `Drop`).
const CLOSE_LINGER: std::time::Duration = std::time::Duration::from_secs(3);

impl Drop for Endpoint {
    /// Stops the driver. An association whose close has still to reach its
    /// peer (our sentinel, or the acknowledgement the peer waits for, not
    /// through yet; [`skiff_proto::association::Association::is_closing`])
    /// keeps the driver running for up to three seconds first, so that a
    /// process that exits right after `close` does not leave its peer
    /// waiting for its idle timeout (the kernel does this for TCP).
    ///
    /// A driver task needs a worker of its runtime while this waits: the
    /// wait gives up this one (`block_in_place`) on a multi-thread
    /// runtime, and is skipped on a current-thread runtime, whose one
    /// thread is this.
    fn drop(&mut self) {
        let linger = || {
            let until = std::time::Instant::now() + CLOSE_LINGER;
            while self.driver.as_ref().is_some_and(Driver::is_running)
                && self.shared.core.lock().assocs.closing() > 0
                && std::time::Instant::now() < until
            {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        };
        match (&self.driver, tokio::runtime::Handle::try_current()) {
            (Some(Driver::Task(_)), Ok(h)) => match h.runtime_flavor() {
                tokio::runtime::RuntimeFlavor::CurrentThread => {}
                _ => tokio::task::block_in_place(linger),
            },
            _ => linger(),
        }
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.wake.notify_one();
        // A task ends at its next wake-up (it holds nothing of ours but the
        // shared state); a thread is joined.
        if let Some(Driver::Thread(h)) = self.driver.take() {
            let _ = h.join();
        }
        self.shared.core.lock().stop();
    }
}

/// Adds `w` to `wakers` unless an equivalent one is there.
pub(crate) fn register(wakers: &mut Vec<Waker>, w: &Waker) {
    if !wakers.iter().any(|x| x.will_wake(w)) {
        wakers.push(w.clone());
    }
}

/// Wakes and clears `wakers`.
pub(crate) fn wake_all(wakers: &mut Vec<Waker>) {
    for w in wakers.drain(..) {
        w.wake();
    }
}

impl Shared {
    fn nudge(&self) {
        self.wake.notify_one();
    }

    /// Arms the driver's timer for `deadline` if that is earlier than it
    /// is armed for, or the timer already fired (`earlier_only` false: the
    /// driver, which has just run every timer due; an application thread
    /// must not postpone a deadline it did not handle, so it only ever
    /// brings the timer forward).
    ///
    /// A later deadline does not re-arm the timer: it fires early, the
    /// driver finds nothing due and arms it then. Deadlines move later on
    /// every packet (the probe timer restarts), and re-arming costs a
    /// system call each time, where the early expiry costs one wake-up per
    /// deadline period.
    pub(crate) fn arm_timer(&self, core: &mut Core, deadline: Option<Instant>, earlier_only: bool) {
        let fired = !earlier_only && core.timer_armed.is_some_and(|a| a <= Instant::now());
        if fired && deadline.is_none() {
            // A one-shot timer that expired is disarmed already.
            core.timer_armed = None;
            return;
        }
        let change = deadline.is_some_and(|d| fired || core.timer_armed.is_none_or(|a| d < a));
        if !change {
            return;
        }
        let after = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        match crate::sys::timerfd_arm(self.timer.as_fd(), after) {
            Ok(()) => core.timer_armed = deadline,
            // Should not happen (the descriptor and value are valid); the
            // driver wakes now and tries again.
            Err(_) => {
                core.timer_armed = None;
                self.nudge();
            }
        }
    }

    /// Sends what became due (after a `send`, a `recv` that opened the
    /// window, a `close`) on the calling thread if nobody else is sending;
    /// otherwise leaves it to the driver. Takes the locked core.
    fn transmit(&self, mut core: MutexGuard<'_, Core>) {
        // Lock order is outbox then core, so only try: a holder is sending
        // (the driver, or another thread) and the driver collects next.
        let Some(mut out) = self.out.try_lock() else {
            drop(core);
            self.nudge();
            return;
        };
        if !out.is_empty() {
            // The driver waits for the socket to drain what is left.
            drop(out);
            drop(core);
            self.nudge();
            return;
        }
        let now = Instant::now();
        let more = core.collect(now, &mut out, self.config.datagram_limit());
        let deadline = core.poll_timeout();
        self.arm_timer(&mut core, deadline, true);
        drop(core);
        if out.is_empty() {
            return;
        }
        let all = driver::send(self, &mut out);
        drop(out);
        if !all || more {
            self.nudge();
        }
    }

    /// Offers `msg` to tunnel `key`: a small one into its send stage
    /// (moved into the association by this call when a packet's worth is
    /// staged or nothing would otherwise move it), another straight into
    /// the association after the stage.
    pub(crate) fn poll_send(
        &self,
        key: u64,
        stage: &Stage,
        cx: &mut Context<'_>,
        msg: &Bytes,
    ) -> Poll<Result<(), TunnelError>> {
        let staged = stage.tx.lock().offer(msg);
        if let Some(how) = staged {
            self.staged(key, how);
            return Poll::Ready(Ok(()));
        }
        let mut core = self.core.lock();
        match core.try_send(key, msg) {
            Ok(true) => {
                self.sent(core, key);
                Poll::Ready(Ok(()))
            }
            Ok(false) => {
                if let Some(c) = core.conns.get_mut(&key) {
                    register(&mut c.writers, cx.waker());
                }
                // The stage may have moved in part: send that.
                self.transmit(core);
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// Stages `msg` (owned) in tunnel `key`'s send stage if it is small and
    /// there is room (see `poll_send`); else gives it back.
    #[inline]
    pub(crate) fn stage_send(&self, key: u64, stage: &Stage, msg: Bytes) -> Result<(), Bytes> {
        let how = stage.tx.lock().offer_owned(msg)?;
        if how != Move::Wait {
            self.staged(key, how);
        }
        Ok(())
    }

    /// After a message was staged in tunnel `key`: moves the stage now, or
    /// asks the driver to at its next wake-up (once until it does), or
    /// nothing.
    #[inline(never)]
    fn staged(&self, key: u64, how: Move) {
        match how {
            Move::Now => {
                let mut core = self.core.lock();
                if core.flush(key) {
                    self.sent(core, key);
                }
            }
            Move::Ask => {
                self.stage_asks.lock().push(key);
                self.nudge();
            }
            Move::Wait => {}
        }
    }

    /// Moves tunnel `key`'s staged messages into its association and sends
    /// them (the caller's flush).
    pub(crate) fn flush(&self, key: u64) {
        let mut core = self.core.lock();
        if core.flush(key) {
            self.transmit(core);
        }
    }

    /// Offers stream bytes (see [`Core::try_write`]): how many were taken,
    /// `Pending` while the send buffer is full.
    pub(crate) fn poll_write(
        &self,
        key: u64,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<Result<usize, TunnelError>> {
        let mut core = self.core.lock();
        match core.try_write(key, data) {
            Ok(0) if !data.is_empty() => {
                if let Some(c) = core.conns.get_mut(&key) {
                    register(&mut c.writers, cx.waker());
                }
                self.transmit(core);
                Poll::Pending
            }
            Ok(n) => {
                if core.send_now(key) {
                    self.transmit(core);
                }
                // Else less than a packet's worth waits behind data in
                // flight (Nagle's rule, without a timer): the arrival of
                // that data's acknowledgement wakes the driver, which
                // collects everything written meanwhile (so do the window
                // opening and the retransmission timer).
                Poll::Ready(Ok(n))
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// After tunnel `key` accepted bytes: sends at once on this thread
    /// when [`Core::send_now`] says so, else nudges the driver (once until
    /// it collects), which sends what gathered meanwhile in one go.
    fn sent(&self, mut core: MutexGuard<'_, Core>, key: u64) {
        if core.send_now(key) {
            return self.transmit(core);
        }
        if !core.flush_wanted {
            core.flush_wanted = true;
            drop(core);
            self.nudge();
        }
    }

    /// The next message of tunnel `key`: from its receive stage, else
    /// every message the core holds for it moves there first (one lock of
    /// the core for all of them). Before waiting, the tunnel's send stage
    /// moves into the association (a reader waiting for an answer must not
    /// hold back its own request).
    pub(crate) fn poll_recv(
        &self,
        key: u64,
        stage: &Stage,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, TunnelError>> {
        self.poll_recv_with(key, stage, cx, RecvStage::pop)
    }

    /// [`Shared::poll_recv`] taking up to `max` messages (at least one)
    /// into `out` under one lock of the stage; `Ready(Ok(0))` at the end.
    pub(crate) fn poll_recv_many(
        &self,
        key: u64,
        stage: &Stage,
        cx: &mut Context<'_>,
        out: &mut Vec<Bytes>,
        max: usize,
    ) -> Poll<Result<usize, TunnelError>> {
        let r = self.poll_recv_with(key, stage, cx, |rx| {
            Some(rx.pop_many(out, max)).filter(|&n| n > 0)
        });
        r.map(|r| r.map(Option::unwrap_or_default))
    }

    /// [`Shared::poll_recv`] lending up to `max` messages (at least one)
    /// to `f` under one lock of the stage; `Ready(Ok(0))` at the end.
    pub(crate) fn poll_recv_each(
        &self,
        key: u64,
        stage: &Stage,
        cx: &mut Context<'_>,
        max: usize,
        f: &mut impl FnMut(&[u8]),
    ) -> Poll<Result<usize, TunnelError>> {
        let r = self.poll_recv_with(key, stage, cx, |rx| {
            Some(rx.pop_each(max, f)).filter(|&n| n > 0)
        });
        r.map(|r| r.map(Option::unwrap_or_default))
    }

    /// [`Shared::poll_recv`] taking the next message as slices into `out`
    /// (a large one in its pieces, not joined); its length.
    pub(crate) fn poll_recv_parts(
        &self,
        key: u64,
        stage: &Stage,
        cx: &mut Context<'_>,
        out: &mut Vec<Bytes>,
    ) -> Poll<Result<Option<usize>, TunnelError>> {
        self.poll_recv_with(key, stage, cx, |rx| rx.pop_parts(out))
    }

    /// [`Shared::poll_recv`] taking a message as it came (a large one in
    /// its pieces).
    pub(crate) fn poll_recv_inbound(
        &self,
        key: u64,
        stage: &Stage,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Inbound>, TunnelError>> {
        self.poll_recv_with(key, stage, cx, RecvStage::pop_inbound)
    }

    fn poll_recv_with<T>(
        &self,
        key: u64,
        stage: &Stage,
        cx: &mut Context<'_>,
        mut pop: impl FnMut(&mut RecvStage) -> Option<T>,
    ) -> Poll<Result<Option<T>, TunnelError>> {
        let mut rx = stage.rx.lock();
        if let Some(b) = pop(&mut rx) {
            return Poll::Ready(Ok(Some(b)));
        }
        let limit = self.config.tunnel_buffer;
        let mut core = self.core.lock();
        let (got, pumped) = core.take_inbox(key, limit, &mut rx.msgs);
        match got {
            Some(r) => {
                if pumped {
                    self.transmit(core);
                } else {
                    drop(core);
                }
                Poll::Ready(r.map(|()| pop(&mut rx)))
            }
            None => {
                if let Some(c) = core.conns.get_mut(&key) {
                    register(&mut c.readers, cx.waker());
                }
                if core.flush(key) || pumped {
                    self.transmit(core);
                }
                Poll::Pending
            }
        }
    }

    pub(crate) fn poll_connected(
        &self,
        key: u64,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), TunnelError>> {
        let mut core = self.core.lock();
        let Some(c) = core.conns.get_mut(&key) else {
            return Poll::Ready(Err(TunnelError::EndpointGone));
        };
        if c.connected {
            return Poll::Ready(Ok(()));
        }
        if let Some(e) = &c.end {
            return Poll::Ready(Err(e.error(c.peer, false)));
        }
        register(&mut c.readers, cx.waker());
        Poll::Pending
    }

    pub(crate) fn start_close(&self, key: u64) {
        let mut core = self.core.lock();
        core.close(key);
        self.transmit(core);
    }

    pub(crate) fn poll_closed(
        &self,
        key: u64,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), TunnelError>> {
        let limit = self.config.tunnel_buffer;
        let mut core = self.core.lock();
        if core.pump(key, limit) {
            self.nudge();
        }
        let Some(c) = core.conns.get_mut(&key) else {
            return Poll::Ready(Err(TunnelError::EndpointGone));
        };
        match &c.end {
            Some(core::End::Closed(_)) => Poll::Ready(Ok(())),
            Some(e) => Poll::Ready(Err(e.error(c.peer, true))),
            None => {
                register(&mut c.readers, cx.waker());
                Poll::Pending
            }
        }
    }

    pub(crate) fn tunnel_stats(&self, key: u64) -> AssociationStats {
        let core = self.core.lock();
        match core.assocs.get(association::Handle(key)) {
            Some(a) => a.stats(),
            None => core
                .conns
                .get(&key)
                .map(|c| c.final_stats)
                .unwrap_or_default(),
        }
    }

    pub(crate) fn tunnel_rtt(&self, key: u64) -> Option<Duration> {
        let core = self.core.lock();
        core.assocs
            .get(association::Handle(key))
            .and_then(|a| a.rtt())
    }

    /// Tunnel `key`'s handle is gone, with `unread` messages left in its
    /// receive stage (discarded, counted).
    pub(crate) fn drop_tunnel(&self, key: u64, unread: usize) {
        let mut core = self.core.lock();
        core.stats.discarded_after_drop += unread as u64;
        core.drop_tunnel(key);
        drop(core);
        self.nudge();
    }

    pub(crate) fn abort(&self, key: u64) {
        self.core.lock().abort(key);
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Endpoint>();
    is::<Tunnel>();
    is::<Conn>();
}
