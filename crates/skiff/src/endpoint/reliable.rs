//! An endpoint serving a reliable queue (`udp://…?reliable=true`): pushes
//! travel over associations, one per destination, and every association
//! accepted feeds one shared inbox.
//!
//! What it owns: the association chosen for each destination, a bounded
//! backlog per destination for messages the association's send buffer
//! cannot take yet, the inbox of received messages in arrival order, and
//! the counters. The driver thread moves the backlog into the association
//! as acknowledgements free room, and received messages into the inbox
//! while it holds under `inbox_limit` bytes (beyond that the associations'
//! windows close, so a slow reader slows the writers).
//!
//! Destinations: the first push to an address connects to it; an
//! association a peer set up from that address is used as well (so two
//! queues that push to each other share one association). A destination
//! keeps its association until it ends; the next push then connects anew.
//! When an association fails, the messages it had not acknowledged and
//! those in its backlog are counted (`unconfirmed`), never silently lost.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rustc_hash::FxHashMap;
use skiff_proto::association::{bundle, Association, Event, Handle, SendError, State};
use skiff_proto::error::{LimitError, UsageError};
use skiff_proto::{wire, Message};

use super::core::{Core, End};
use super::{add_stats, register, wake_all, Endpoint};
use crate::error::Error;

/// A destination's association and the messages waiting for its room.
#[derive(Debug)]
struct Dest {
    key: u64,
    backlog: VecDeque<Bytes>,
    backlog_bytes: usize,
}

impl Dest {
    fn new(key: u64) -> Dest {
        Dest {
            key,
            backlog: VecDeque::new(),
            backlog_bytes: 0,
        }
    }
}

/// Counters of a reliable queue beyond the endpoint's.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct QueueCounters {
    /// Messages handed to associations.
    pub(crate) sent: u64,
    /// Their encoded bytes.
    pub(crate) sent_bytes: u64,
    /// Messages put in the inbox.
    pub(crate) received: u64,
    /// Their encoded bytes.
    pub(crate) received_bytes: u64,
    /// Messages that arrived but did not decode (dropped).
    pub(crate) undecodable: u64,
    /// Messages pushed that may not have arrived: their association ended
    /// before acknowledging them, or the peer's `max_message` refused them.
    pub(crate) unconfirmed: u64,
}

/// The reliable queue's state, under the endpoint's lock.
#[derive(Debug)]
pub(crate) struct QueueState {
    dests: FxHashMap<SocketAddr, Dest>,
    pub(crate) inbox: VecDeque<Message>,
    inbox_bytes: usize,
    inbox_limit: usize,
    max_backlog: usize,
    max_message: usize,
    /// The pump stopped for a full inbox; pops restart it.
    held: bool,
    pub(crate) waiters: Vec<Waker>,
    pub(crate) counters: QueueCounters,
    /// What went wrong since the last flush, for `flush` to report.
    pub(crate) last_error: Option<String>,
}

impl QueueState {
    pub(crate) fn new(max_backlog: usize, inbox_limit: usize, max_message: u64) -> QueueState {
        QueueState {
            dests: FxHashMap::default(),
            inbox: VecDeque::new(),
            inbox_bytes: 0,
            inbox_limit: inbox_limit.max(1),
            max_backlog,
            max_message: usize::try_from(max_message).unwrap_or(usize::MAX),
            held: false,
            waiters: Vec::new(),
            counters: QueueCounters::default(),
            last_error: None,
        }
    }

    /// An association a peer set up: use it for pushes to that peer if no
    /// other serves it.
    pub(crate) fn adopt(&mut self, peer: SocketAddr, key: u64) {
        self.dests.entry(peer).or_insert_with(|| Dest::new(key));
    }

    /// The next message, releasing the pump once the inbox drained to half.
    fn take(&mut self) -> (Option<Message>, bool) {
        let Some(m) = self.inbox.pop_front() else {
            return (None, false);
        };
        self.inbox_bytes -= inbox_cost(&m);
        let release = self.held && self.inbox_bytes < self.inbox_limit / 2;
        if release {
            self.held = false;
        }
        (Some(m), release)
    }

    /// Moves backlog of `peer` into association `key` while it takes them.
    fn feed(&mut self, key: u64, peer: SocketAddr, a: &mut Association) {
        let Some(d) = self.dests.get_mut(&peer) else {
            return;
        };
        if d.key != key {
            return;
        }
        while let Some(m) = d.backlog.front() {
            match a.send(m.clone()) {
                Ok(()) => {
                    self.counters.sent += 1;
                    self.counters.sent_bytes += m.len() as u64;
                }
                Err(SendError::WouldBlock) => break,
                Err(SendError::TooLarge { len, max }) => {
                    self.counters.unconfirmed += 1;
                    self.last_error = Some(format!(
                        "a message of {len} bytes to {peer} is over the peer's max_message \
                         ({max}); dropped"
                    ));
                }
                // Closing or finished: the end is handled by the pump.
                Err(_) => break,
            }
            d.backlog_bytes -= m.len();
            d.backlog.pop_front();
        }
    }

    /// Association `key` to `peer` ended: forget it as a destination and
    /// count what it may not have delivered.
    fn ended(&mut self, key: u64, peer: SocketAddr, end: End, unacked: u64) {
        let mut lost = unacked;
        if self.dests.get(&peer).is_some_and(|d| d.key == key) {
            let d = self.dests.remove(&peer).expect("checked");
            lost += d.backlog.len() as u64;
        }
        if lost > 0 {
            self.counters.unconfirmed += lost;
            let why = match end {
                End::Failed(r) => r.to_string(),
                End::Closed(_) => "closed".to_string(),
                End::Gone => "endpoint stopped".to_string(),
            };
            self.last_error = Some(format!(
                "association with {peer} ended ({why}); {lost} pushed messages unconfirmed"
            ));
        }
    }
}

/// Bytes a message holds in the inbox, for its limit.
fn inbox_cost(m: &Message) -> usize {
    m.payload.len() + m.subject.len() + 64
}

impl QueueState {
    /// Decodes one message frame from tunnel `key` into the inbox (or
    /// counts it undecodable); whether it was delivered.
    fn take_frame(&mut self, c: &mut super::core::Conn, key: u64, b: &Bytes) -> bool {
        match wire::decode_message(b, self.max_message) {
            Ok(mut m) => {
                m.meta.from = Some(c.peer);
                m.meta.source = key;
                m.meta.seq = c.delivered;
                c.delivered += 1;
                self.counters.received += 1;
                self.counters.received_bytes += b.len() as u64;
                self.inbox_bytes += inbox_cost(&m);
                self.inbox.push_back(m);
                true
            }
            Err(_) => {
                self.counters.undecodable += 1;
                false
            }
        }
    }
}

impl Core {
    /// `pump` for an association of the reliable queue: events into the
    /// shared inbox, the destination's backlog into the association.
    pub(super) fn pump_queue(&mut self, key: u64) -> bool {
        let Core {
            assocs,
            conns,
            finished,
            queue,
            ..
        } = self;
        let Some(q) = queue.as_mut() else {
            return false;
        };
        let Some(c) = conns.get_mut(&key) else {
            return false;
        };
        let Some(a) = assocs.association(Handle(key)) else {
            if c.end.is_none() {
                c.end = Some(End::Gone);
                q.ended(key, c.peer, End::Gone, 0);
            }
            return false;
        };
        let mut any = false;
        let mut delivered = false;
        loop {
            let done = matches!(a.state(), State::Closed | State::Drained);
            if q.inbox_bytes >= q.inbox_limit && !done {
                q.held = true;
                break;
            }
            let Some(ev) = a.poll_event() else { break };
            any = true;
            match ev {
                Event::Connected => c.connected = true,
                Event::Message(b) => delivered |= q.take_frame(c, key, &b),
                Event::Pieces(p) => delivered |= q.take_frame(c, key, &p.join()),
                // A queue's senders do not bundle; split all the same.
                Event::Bundle(b) => {
                    for m in bundle::records(b) {
                        delivered |= q.take_frame(c, key, &m);
                    }
                }
                Event::Writable => {}
                Event::Closed(r) => c.end = Some(End::Closed(r)),
                Event::Failed(r) => c.end = Some(End::Failed(r)),
            }
        }
        match c.end {
            None => q.feed(key, c.peer, a),
            Some(end) if !c.folded => {
                c.folded = true;
                c.final_stats = a.stats();
                add_stats(finished, &c.final_stats);
                let s = c.final_stats;
                q.ended(key, c.peer, end, s.messages_sent - s.messages_acked);
            }
            Some(_) => {}
        }
        if delivered {
            wake_all(&mut q.waiters);
        }
        any
    }

    /// Pumps every association of the reliable queue.
    fn pump_all_queue(&mut self) -> bool {
        let keys: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.queue)
            .map(|(k, _)| *k)
            .collect();
        let mut any = false;
        for k in keys {
            any |= self.pump_queue(k);
        }
        any
    }
}

/// Wakes a thread parked in `pop_blocking`.
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

impl Endpoint {
    /// Turns this endpoint into a reliable queue's: it listens and accepts
    /// every association itself, and `queue_*` calls work.
    pub(crate) fn serve_queue(&self, max_backlog: usize) {
        let mut core = self.shared.core.lock();
        core.queue = Some(QueueState::new(
            max_backlog,
            self.shared.config.tunnel_buffer,
            self.shared.config.association.max_message,
        ));
        core.assocs.set_listening(true);
    }

    /// Pushes `msg` to the reliable queue at `dest` (service `service`);
    /// never waits on the network.
    pub(crate) fn queue_push(
        &self,
        dest: SocketAddr,
        service: u32,
        msg: &Message,
    ) -> Result<(), Error> {
        wire::check(msg)?;
        let mut buf = Vec::with_capacity(wire::encoded_len(msg, false));
        wire::encode_message(&mut buf, msg, false);
        let max = self.shared.config.association.max_message;
        if buf.len() as u64 > max {
            return Err(UsageError::OverMaxMessage {
                len: buf.len(),
                max,
            }
            .into());
        }
        let bytes = Bytes::from(buf);
        let len = bytes.len();
        let mut guard = self.shared.core.lock();
        if guard.stopped {
            return Err(Error::Closed);
        }
        for _attempt in 0..2 {
            let key = self.queue_dest(&mut guard, dest, service);
            let core = &mut *guard;
            let q = core.queue.as_mut().expect("a reliable queue's endpoint");
            let d = q.dests.get_mut(&dest).expect("just chosen");
            if !d.backlog.is_empty() {
                if d.backlog_bytes + len > q.max_backlog {
                    return Err(LimitError::Backlog {
                        dest,
                        max: q.max_backlog,
                    }
                    .into());
                }
                d.backlog_bytes += len;
                d.backlog.push_back(bytes);
                return Ok(());
            }
            let Some(a) = core.assocs.association(Handle(key)) else {
                // Gone under us: forget it and connect anew.
                q.dests.remove(&dest);
                continue;
            };
            match a.send(bytes.clone()) {
                Ok(()) => {
                    q.counters.sent += 1;
                    q.counters.sent_bytes += len as u64;
                }
                Err(SendError::WouldBlock) => {
                    // The first message of a backlog is let in whatever its
                    // size, as the association's own buffer does.
                    d.backlog_bytes += len;
                    d.backlog.push_back(bytes);
                }
                Err(SendError::TooLarge { len, max }) => {
                    return Err(UsageError::OverMaxMessage { len, max }.into());
                }
                Err(_) => {
                    // Closing or closed (the peer closed it): a new one.
                    q.dests.remove(&dest);
                    continue;
                }
            }
            drop(guard);
            self.shared.wake.notify_one();
            return Ok(());
        }
        Err(Error::Closed)
    }

    /// The association serving `dest`, connecting if there is none live.
    fn queue_dest(&self, core: &mut Core, dest: SocketAddr, service: u32) -> u64 {
        let q = core.queue.as_mut().expect("a reliable queue's endpoint");
        if let Some(d) = q.dests.get(&dest) {
            if core.conns.get(&d.key).is_some_and(|c| c.end.is_none()) {
                return d.key;
            }
            q.dests.remove(&dest);
        }
        let key = core.connect(Instant::now(), dest, service);
        if let Some(c) = core.conns.get_mut(&key) {
            c.queue = true;
        }
        let q = core.queue.as_mut().expect("checked");
        q.dests.insert(dest, Dest::new(key));
        key
    }

    /// The next message that arrived on any association, if any.
    pub(crate) fn queue_try_pop(&self) -> Option<Message> {
        self.queue_take(None)
    }

    /// Takes the next message; with `cx`, registers it if there is none.
    fn queue_take(&self, cx: Option<&mut Context<'_>>) -> Option<Message> {
        let mut core = self.shared.core.lock();
        let q = core.queue.as_mut()?;
        let (m, release) = q.take();
        if m.is_none() {
            if let Some(cx) = cx {
                register(&mut q.waiters, cx.waker());
            }
        }
        if release {
            // The inbox has room again: take what the associations hold
            // (their windows open; the driver sends the updates).
            core.pump_all_queue();
            drop(core);
            self.shared.wake.notify_one();
        }
        m
    }

    /// Moves up to `max` messages into `out`; returns how many.
    pub(crate) fn queue_pop_many(&self, out: &mut Vec<Message>, max: usize) -> usize {
        let mut core = self.shared.core.lock();
        let Some(q) = core.queue.as_mut() else {
            return 0;
        };
        let mut n = 0;
        let mut release = false;
        while n < max {
            let (m, r) = q.take();
            release |= r;
            let Some(m) = m else { break };
            out.push(m);
            n += 1;
        }
        if release {
            core.pump_all_queue();
            drop(core);
            self.shared.wake.notify_one();
        }
        n
    }

    /// The next message, registering `cx` if there is none.
    pub(crate) fn queue_poll_pop(&self, cx: &mut Context<'_>) -> Poll<Result<Message, Error>> {
        if let Some(m) = self.queue_take(Some(cx)) {
            return Poll::Ready(Ok(m));
        }
        if self.shared.core.lock().stopped {
            return Poll::Ready(Err(Error::Closed));
        }
        Poll::Pending
    }

    /// Waits up to `timeout` (forever with `None`) for a message.
    pub(crate) fn queue_pop_blocking(&self, timeout: Option<Duration>) -> Option<Message> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        loop {
            match self.queue_poll_pop(&mut cx) {
                Poll::Ready(r) => return r.ok(),
                Poll::Pending => {}
            }
            match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return None;
                    }
                    std::thread::park_timeout(d - now);
                }
                None => std::thread::park(),
            }
        }
    }

    /// Waits until every message pushed so far is acknowledged by its
    /// receiver or counted unconfirmed; reports what went wrong since the
    /// last flush.
    pub(crate) fn queue_flush(&self) -> Result<(), Error> {
        loop {
            let mut guard = self.shared.core.lock();
            if guard.stopped {
                return Err(Error::Closed);
            }
            let core = &mut *guard;
            let Some(q) = core.queue.as_ref() else {
                return Ok(());
            };
            let mut pending = false;
            for d in q.dests.values() {
                if !d.backlog.is_empty() {
                    pending = true;
                    break;
                }
                let a = core.assocs.get(Handle(d.key));
                if a.is_some_and(|a| a.buffered() > 0 && !a.is_drained()) {
                    pending = true;
                    break;
                }
            }
            if !pending {
                let q = core.queue.as_mut().expect("checked");
                return match q.last_error.take() {
                    Some(e) => Err(Error::Io {
                        what: "reliable delivery",
                        source: std::io::Error::new(std::io::ErrorKind::ConnectionAborted, e),
                    }),
                    None => Ok(()),
                };
            }
            drop(guard);
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The reliable queue's own counters.
    pub(crate) fn queue_counters(&self) -> QueueCounters {
        let core = self.shared.core.lock();
        core.queue.as_ref().map(|q| q.counters).unwrap_or_default()
    }
}
