//! What the node holds for one client until its connection takes it: a
//! queue of control frames and one bounded queue per subscription, each
//! with the subscriber's [`Policy`] and its credit (how many messages the
//! client can take now).
//!
//! The node's fan-out pushes here; the client's writer (a socket writer
//! task, or the in-process client itself) takes everything ready in one
//! batch with [`ClientOut::next_batch`], so one wake-up and one system call
//! carry many messages. A message is queued as a [`Message`] whose payload
//! is a reference-counted [`bytes::Bytes`]: every subscriber's queue holds
//! the same bytes.
//!
//! A slow subscription only fills its own queue, so it never slows another
//! subscription (of this client or any other), except under
//! [`Policy::Block`], where the publisher waits for room by design.

use std::collections::VecDeque;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use skiff_proto::stats::SubCounters;
use skiff_proto::Message;
use tokio::sync::Notify;

use skiff_proto::client_frame::{
    encode_msg, encode_msg_raw, encode_msg_raw_into, msg_raw_frame_len, Code, Policy, ServerFrame,
};

mod drain;

/// Bytes a queued message is charged against the client's pending-bytes
/// limit.
pub(crate) fn cost(msg: &Message) -> usize {
    msg.payload.len() + msg.subject.len() + 32
}

/// Bytes a queued control frame is charged against the client's
/// pending-bytes limit: the frame and what it points to.
pub(crate) fn frame_cost(f: &ServerFrame) -> usize {
    const FRAME: usize = std::mem::size_of::<ServerFrame>();
    FRAME
        + match f {
            ServerFrame::Error { text, .. } => text.len(),
            ServerFrame::Msg { msg, .. }
            | ServerFrame::Reply { msg, .. }
            | ServerFrame::TunData { msg, .. } => cost(msg),
            ServerFrame::Request { cluster, msg, .. } | ServerFrame::Bcast { cluster, msg } => {
                cluster.len() + cost(msg)
            }
            ServerFrame::TunIncoming { cluster, .. } => cluster.len(),
            ServerFrame::Stats { json, .. } => json.len(),
            _ => 0,
        }
}

/// The node's budget of pending bytes across all clients
/// (`max_total_pending_bytes`). A client reserves from it in chunks of
/// [`CHUNK`], so the shared counter moves about once per chunk, not per
/// message.
#[derive(Debug)]
pub(crate) struct Budget {
    used: AtomicUsize,
    max: usize,
}

/// What a client reserves from the [`Budget`] at a time.
const CHUNK: usize = 64 * 1024;

impl Budget {
    pub(crate) fn new(max: usize) -> Budget {
        Budget {
            used: AtomicUsize::new(0),
            max,
        }
    }

    /// Whether the budget is spent (new clients are refused).
    pub(crate) fn exhausted(&self) -> bool {
        self.used() + CHUNK > self.max
    }

    /// Bytes reserved by clients now.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn reserve(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                (u + n <= self.max).then_some(u + n)
            })
            .is_ok()
    }

    fn release(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

/// Most messages taken from one subscription before the writer visits the
/// next one, so a busy subscription does not starve the others.
const BURST: u32 = 256;

/// Most frames handed out in one batch.
const MAX_BATCH: usize = 8192;

/// Bytes encoded for one socket write before the writer writes them.
const MAX_BATCH_BYTES: usize = 256 * 1024;

/// Encoded messages up to this long are copied into the queue entry, so a
/// queued small message pins no receive buffer and costs no reference
/// count.
const SMALL: usize = 38;

/// Memory one queue entry takes besides what it points to.
const ENTRY: usize = std::mem::size_of::<(u64, Body)>();

/// A message queued for subscriptions: its wire encoding (as the
/// publisher sent it), or a value from an in-process publisher.
#[derive(Debug, Clone)]
pub enum Body {
    /// A short encoding, copied.
    Small {
        /// Bytes used in `buf`.
        len: u8,
        /// The encoding.
        buf: [u8; SMALL],
    },
    /// An encoding, a slice of the publisher's receive buffer.
    Raw(Bytes),
    /// A message from an in-process client, shared by every subscriber.
    Val(Arc<Message>),
}

impl Body {
    /// A message encoded by [`skiff_proto::wire::encode_message`] (and
    /// already checked by decoding it).
    pub fn encoded(raw: &Bytes) -> Body {
        if raw.len() <= SMALL {
            let mut buf = [0; SMALL];
            buf[..raw.len()].copy_from_slice(raw);
            Body::Small {
                len: raw.len() as u8,
                buf,
            }
        } else {
            Body::Raw(raw.clone())
        }
    }

    /// Pushes [`Body::encoded`] of `raw` onto `v`: a short encoding is
    /// copied straight into its place in the vector, not onto the stack
    /// and then moved (reading a fresh small copy back with wide loads
    /// stalls each message of a run on store forwarding).
    pub fn push_encoded(v: &mut Vec<Body>, raw: &Bytes) {
        if raw.len() <= SMALL {
            v.push(Body::Small {
                len: raw.len() as u8,
                buf: [0; SMALL],
            });
            if let Some(Body::Small { buf, .. }) = v.last_mut() {
                buf[..raw.len()].copy_from_slice(raw);
            }
        } else {
            v.push(Body::Raw(raw.clone()));
        }
    }

    /// A message as a value.
    pub fn value(msg: Message) -> Body {
        Body::Val(Arc::new(msg))
    }

    /// Bytes charged against the client's pending-bytes limit.
    fn cost(&self) -> usize {
        match self {
            Body::Small { len, .. } => usize::from(*len) + ENTRY,
            Body::Raw(b) => b.len() + ENTRY,
            Body::Val(m) => cost(m) + ENTRY,
        }
    }

    /// Appends the `Msg` frame for subscription `sid`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>, sid: u64, token: u64) {
        match self {
            Body::Small { len, buf } => encode_msg_raw(out, sid, token, &buf[..usize::from(*len)]),
            Body::Raw(b) => encode_msg_raw(out, sid, token, b),
            Body::Val(m) => encode_msg(out, sid, token, m),
        }
    }

    /// Bytes its `Msg` frame for subscription `sid` takes when the
    /// message is already encoded (`None` for a value).
    pub(crate) fn raw_frame_len(&self, sid: u64, token: u64) -> Option<usize> {
        match self {
            Body::Small { len, .. } => Some(msg_raw_frame_len(sid, token, usize::from(*len))),
            Body::Raw(b) => Some(msg_raw_frame_len(sid, token, b.len())),
            Body::Val(_) => None,
        }
    }

    /// Writes its `Msg` frame for subscription `sid` into `out`, exactly
    /// [`Body::raw_frame_len`] bytes; `false` (`out` untouched) for a
    /// value or another length.
    pub(crate) fn encode_into(&self, out: &mut [u8], sid: u64, token: u64) -> bool {
        match self {
            Body::Small { len, buf } => {
                encode_msg_raw_into(out, sid, token, &buf[..usize::from(*len)])
            }
            Body::Raw(b) => encode_msg_raw_into(out, sid, token, b),
            Body::Val(_) => false,
        }
    }

    /// The message as a value (for in-process clients). An encoding was
    /// checked when it arrived, so it decodes.
    fn into_message(self) -> Option<Message> {
        let raw = match self {
            Body::Small { len, buf } => Bytes::copy_from_slice(&buf[..usize::from(len)]),
            Body::Raw(b) => b,
            Body::Val(m) => return Some(Arc::try_unwrap(m).unwrap_or_else(|m| (*m).clone())),
        };
        skiff_proto::wire::decode_message(&raw, usize::MAX).ok()
    }
}

/// What happened to a pushed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Push {
    /// Queued.
    Queued,
    /// Dropped by the policy (counted), or an older one was.
    Dropped,
    /// The queue is full and the policy is `block`: wait for room.
    Full,
    /// The queue is full and the policy is `disconnect`.
    Kill,
    /// The subscription or the client is gone.
    Gone,
    /// Taken at once by the client's direct sink ([`Direct`]): nothing
    /// was queued, so there is no writer to wake.
    Written,
}

/// A sink that takes a client's messages at once, from the publisher's
/// thread, instead of its queue and writer (the node's topic buffers for
/// shm subscribers: `listen::shm_topic`). Called under the broker's
/// routing lock and the client's outbox lock, only while the
/// subscription's queue is empty (so order is kept); it must never wait:
/// it only tries its own lock (lock order: routing lock, outbox lock, then
/// the sink's lock, taken with `try_lock`; the writer thread takes the
/// sink's lock before the outbox lock, which is why these never block).
pub(crate) trait Direct: Send + Sync + std::fmt::Debug {
    /// Writes every one of `msgs` for subscription `sid` (each with
    /// `token`) now, or none: `false` when it cannot without waiting.
    fn try_write(&self, sid: u64, token: u64, msgs: &[Body]) -> bool;
}

#[derive(Debug)]
struct SubQueue {
    q: VecDeque<(u64, Body)>,
    cap: usize,
    policy: Policy,
    credit: u32,
    in_ready: bool,
    dropped: u64,
    delivered: u64,
    drop_reported: bool,
}

impl SubQueue {
    /// Messages the queue may hold: its bound, plus those the client has
    /// credit for (on their way to it as soon as the writer runs, so they
    /// do not count against the bound however late the writer runs).
    fn room(&self) -> usize {
        self.cap.saturating_add(self.credit as usize)
    }
}

#[derive(Debug, Default)]
struct Outbox {
    /// Control frames with the bytes each was charged.
    control: VecDeque<(ServerFrame, usize)>,
    subs: FxHashMap<u64, SubQueue>,
    ready: VecDeque<u64>,
    drop_reports: Vec<u64>,
    pending_bytes: usize,
    max_pending: usize,
    /// Bytes reserved from the node's [`Budget`] (if it has one).
    reserved: usize,
    /// Bytes the client's reader holds of frames not yet whole
    /// ([`ClientOut::hold_input`]): charged to the node's budget, not to
    /// `max_pending` (a frame is bounded by `max_payload`).
    input: usize,
    /// Tunnel credit not yet handed out, by tunnel: a `TunCredit` frame is
    /// queued once per tunnel and carries the sum when taken, so credits
    /// sent faster than the client reads merge instead of queueing.
    tun_credit: FxHashMap<u64, u32>,
    /// A frame to send last, then close.
    closing: Option<ServerFrame>,
    /// Frames not queued because the pending-bytes limit was reached
    /// (broadcasts).
    dropped_control: u64,
    delivered: u64,
}

pub use drain::Sink;

/// One client's outbound side. See the module documentation.
#[derive(Debug)]
pub struct ClientOut {
    /// The node's name for the client.
    pub id: u64,
    inner: Mutex<Outbox>,
    /// Wakes the writer.
    ready: Notify,
    /// Wakes publishers waiting on a full `block` subscription.
    space: Notify,
    closed: AtomicBool,
    closed_notify: Notify,
    budget: Option<Arc<Budget>>,
    /// Whether the client's user's permissions restrict it (`false`: it
    /// may do anything, and nothing is checked on its hot paths). Set
    /// after `user` when a reload changes them.
    restricted: AtomicBool,
    /// The client's user, swapped whole when a reload changes its
    /// permissions ([`ClientOut::set_user`]).
    user: arc_swap::ArcSwap<crate::auth::User>,
    /// The client does not want its own publishes (NATS `echo: false`).
    no_echo: AtomicBool,
    /// Bytes read from and written to the client's connection, counted
    /// by stream listeners once per read and write.
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    /// For a topic buffer's client: its readers' reported counts.
    shared_readers: parking_lot::Mutex<Vec<Arc<SharedReader>>>,
    /// The client asked for `Taken` frames (`Confirm`).
    confirm: AtomicBool,
    /// The count the last `Taken` frame carried.
    told: AtomicU64,
    /// A sink that takes messages at once while a subscription's queue
    /// is empty (see [`Direct`]).
    direct: std::sync::OnceLock<Arc<dyn Direct>>,
    /// The client's publishes are read in place from its shared-memory
    /// ring: the mesh may splice them (reference, not copy; see
    /// `mesh::sendq`).
    ring_input: AtomicBool,
}

/// A shared-buffer subscriber of a topic (see `listen::shm_topic`): what
/// it last reported having read and lost.
#[derive(Debug, Default)]
pub(crate) struct SharedReader {
    pub(crate) peer: String,
    pub(crate) read: AtomicU64,
    pub(crate) dropped: AtomicU64,
}

impl Drop for ClientOut {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.release(self.inner.get_mut().reserved);
        }
    }
}

impl ClientOut {
    pub(crate) fn new(id: u64, max_pending: usize, budget: Option<Arc<Budget>>) -> ClientOut {
        ClientOut {
            id,
            inner: Mutex::new(Outbox {
                max_pending,
                ..Outbox::default()
            }),
            ready: Notify::new(),
            space: Notify::new(),
            closed: AtomicBool::new(false),
            closed_notify: Notify::new(),
            budget,
            restricted: AtomicBool::new(false),
            user: arc_swap::ArcSwap::new(crate::auth::User::anonymous()),
            no_echo: AtomicBool::new(false),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            shared_readers: parking_lot::Mutex::new(Vec::new()),
            confirm: AtomicBool::new(false),
            told: AtomicU64::new(0),
            direct: std::sync::OnceLock::new(),
            ring_input: AtomicBool::new(false),
        }
    }

    /// Marks the client's publishes as read in place from its ring (the
    /// shm listener): the mesh splices them.
    pub(crate) fn set_ring_input(&self) {
        self.ring_input.store(true, Ordering::Relaxed);
    }

    /// Whether the client's publishes are read in place from its ring.
    pub(crate) fn ring_input(&self) -> bool {
        self.ring_input.load(Ordering::Relaxed)
    }

    /// Gives the client a direct sink (once; see [`Direct`]).
    pub(crate) fn set_direct(&self, d: Arc<dyn Direct>) {
        let _ = self.direct.set(d);
    }

    /// Counts a shared-buffer reader of this (topic) client in.
    pub(crate) fn add_shared_reader(&self, r: Arc<SharedReader>) {
        self.shared_readers.lock().push(r);
    }

    /// Counts it out.
    pub(crate) fn remove_shared_reader(&self, r: &Arc<SharedReader>) {
        self.shared_readers.lock().retain(|x| !Arc::ptr_eq(x, r));
    }

    /// The shared-buffer readers' counts, for the stats.
    pub(crate) fn shared_readers(&self) -> Vec<skiff_proto::stats::SharedReaderStats> {
        self.shared_readers
            .lock()
            .iter()
            .map(|r| skiff_proto::stats::SharedReaderStats {
                peer: r.peer.clone(),
                read: r.read.load(Ordering::Relaxed),
                dropped: r.dropped.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Checks this client's operations against `user`'s permissions
    /// (unless they allow everything).
    pub(crate) fn with_user(self, user: &Arc<crate::auth::User>) -> ClientOut {
        self.set_user(user);
        self
    }

    /// Checks this client's operations from now on against `user`'s
    /// permissions (a reload changed them, or a front end authenticated
    /// the client after attaching it).
    pub(crate) fn set_user(&self, user: &Arc<crate::auth::User>) {
        self.user.store(user.clone());
        self.restricted
            .store(!user.permissions.is_open(), Ordering::Release);
    }

    /// The client's user when its permissions restrict it (`None`: it may
    /// do anything).
    pub fn restricted(&self) -> Option<arc_swap::Guard<Arc<crate::auth::User>>> {
        self.restricted
            .load(Ordering::Acquire)
            .then(|| self.user.load())
    }

    /// The client's user.
    pub fn user(&self) -> arc_swap::Guard<Arc<crate::auth::User>> {
        self.user.load()
    }

    /// Whether the client's own publishes skip its subscriptions.
    pub(crate) fn no_echo(&self) -> bool {
        self.no_echo.load(Ordering::Relaxed)
    }

    /// Sets whether the client's own publishes skip its subscriptions.
    pub(crate) fn set_no_echo(&self, no_echo: bool) {
        self.no_echo.store(no_echo, Ordering::Relaxed)
    }

    /// Whether a client that `reserved` bytes may hold `pending` under
    /// the node's budget: within what it reserved, or it reserves more now.
    fn fits(&self, reserved: &mut usize, pending: usize) -> bool {
        let Some(b) = &self.budget else {
            return true;
        };
        if pending <= *reserved {
            return true;
        }
        let more = (pending - *reserved).next_multiple_of(CHUNK);
        if b.reserve(more) {
            *reserved += more;
            true
        } else {
            false
        }
    }

    /// Gives back to the node's budget what `o` reserved beyond its
    /// pending bytes, its input and one chunk.
    fn settle(&self, o: &mut Outbox) {
        if let Some(b) = &self.budget {
            let keep = o.pending_bytes + o.input + CHUNK;
            if o.reserved > keep {
                b.release(o.reserved - keep);
                o.reserved = keep;
            }
        }
    }

    /// Whether `o` is over its bound or the node's budget.
    fn over(&self, o: &mut Outbox, pending: usize) -> bool {
        pending > o.max_pending || !self.fits(&mut o.reserved, pending + o.input)
    }

    /// Charges the `bytes` the client's reader holds of frames not yet
    /// whole (its receive buffer) to the node's budget. `false`: the budget
    /// is spent, and the reader closes the client with
    /// [`ClientOut::budget_error`].
    pub(crate) fn hold_input(&self, bytes: usize) -> bool {
        let mut o = self.inner.lock();
        let o = &mut *o;
        let was = std::mem::replace(&mut o.input, bytes);
        if bytes <= was {
            self.settle(o);
            return true;
        }
        let total = o.pending_bytes + bytes;
        if self.fits(&mut o.reserved, total) {
            return true;
        }
        o.input = was;
        false
    }

    /// The error a client gets when the node's budget refuses it memory.
    pub(crate) fn budget_error(&self) -> String {
        let max = self.budget.as_ref().map_or(0, |b| b.max);
        format!(
            "the node's memory for clients is spent ({max} bytes, max_total_pending_bytes); closing this connection"
        )
    }

    /// The client asked to learn which publishes the node took
    /// (`Confirm`): see [`ClientOut::confirm_taken`].
    pub(crate) fn set_confirm(&self) {
        self.confirm.store(true, Ordering::Relaxed);
    }

    /// Tells a client that asked (`Confirm`) that the node took its first
    /// `n` publishes, if that is news: one small `Taken` frame per read of
    /// the client's input, whatever the number of messages it held.
    pub(crate) fn confirm_taken(&self, n: u64) {
        if self.confirm.load(Ordering::Relaxed) && self.told.load(Ordering::Relaxed) != n {
            self.told.store(n, Ordering::Relaxed);
            self.control(ServerFrame::Taken { n });
        }
    }

    /// Queues a control frame (acks, replies to the client's own frames),
    /// charged against the pending-bytes limit; never refused, since the
    /// client's reader stops reading it while it is over the limit
    /// ([`ClientOut::wait_room`]), which bounds these.
    pub(crate) fn control(&self, f: ServerFrame) {
        let bytes = frame_cost(&f);
        let mut o = self.inner.lock();
        o.pending_bytes += bytes;
        let held = o.pending_bytes + o.input;
        // Over the budget it is queued all the same; `wait_room` holds
        // the reader until it drains.
        self.fits(&mut o.reserved, held);
        o.control.push_back((f, bytes));
        drop(o);
        self.ready.notify_one();
    }

    /// Queues a control frame unless the client's pending bytes are over
    /// the limit (broadcasts, tunnel data, requests to a member: what
    /// others send it, which its reader's pause does not bound); returns
    /// whether it was queued. A refusal is counted (`dropped_control`).
    pub(crate) fn control_bounded(&self, f: ServerFrame, bytes: usize) -> bool {
        let bytes = bytes.max(frame_cost(&f));
        let mut o = self.inner.lock();
        let pending = o.pending_bytes + bytes;
        if self.over(&mut o, pending) {
            o.dropped_control += 1;
            return false;
        }
        o.pending_bytes += bytes;
        o.control.push_back((f, bytes));
        drop(o);
        self.ready.notify_one();
        true
    }

    /// Queues `n` more credit for the client's end of `tunnel`. Credit
    /// already queued for that tunnel and not yet taken grows instead, so a
    /// peer that floods credit holds one frame here, not one per credit.
    pub(crate) fn tun_credit(&self, tunnel: u64, n: u32) {
        let mut o = self.inner.lock();
        let o = &mut *o;
        if let Some(c) = o.tun_credit.get_mut(&tunnel) {
            *c = c.saturating_add(n);
            return;
        }
        o.tun_credit.insert(tunnel, n);
        let f = ServerFrame::TunCredit { tunnel, n: 0 };
        let bytes = frame_cost(&f);
        o.pending_bytes += bytes;
        let held = o.pending_bytes + o.input;
        self.fits(&mut o.reserved, held);
        o.control.push_back((f, bytes));
        self.ready.notify_one();
    }

    /// Drops the queued requests with `token` (its requester left or
    /// cancelled), freeing their bytes.
    pub(crate) fn forget_request(&self, token: u64) {
        let mut o = self.inner.lock();
        let o = &mut *o;
        let mut freed = 0;
        o.control.retain(|(f, bytes)| match f {
            ServerFrame::Request { token: t, .. } if *t == token => {
                freed += *bytes;
                false
            }
            _ => true,
        });
        o.pending_bytes -= freed;
        self.settle(o);
    }

    /// Waits while the client is over its pending-bytes limit and the
    /// writer has something to send it: a client's reader calls this
    /// before each frame that may queue a reply, so a client that does not
    /// read what it asked for stops being read until it drains. (Bytes in
    /// subscription queues without credit do not hold it: the client may
    /// be about to send that credit.)
    pub(crate) async fn wait_room(&self) {
        loop {
            let mut n = pin!(self.space.notified());
            n.as_mut().enable();
            {
                let mut o = self.inner.lock();
                let pending = o.pending_bytes;
                let blocked =
                    (!o.control.is_empty() || !o.ready.is_empty()) && self.over(&mut o, pending);
                if !blocked || self.is_closed() {
                    return;
                }
            }
            n.await;
        }
    }

    pub(crate) fn add_sub(&self, sid: u64, cap: usize, policy: Policy, credit: u32) {
        self.inner.lock().subs.insert(
            sid,
            SubQueue {
                q: VecDeque::new(),
                cap: cap.max(1),
                policy,
                credit,
                in_ready: false,
                dropped: 0,
                delivered: 0,
                drop_reported: true,
            },
        );
    }

    pub(crate) fn remove_sub(&self, sid: u64) {
        let mut o = self.inner.lock();
        if let Some(s) = o.subs.remove(&sid) {
            let bytes: usize = s.q.iter().map(|(_, m)| m.cost()).sum();
            o.pending_bytes -= bytes;
            self.settle(&mut o);
        }
        drop(o);
        self.space.notify_waiters();
    }

    /// Adds `n` to a subscription's credit.
    pub(crate) fn credit(&self, sid: u64, n: u32) {
        let mut o = self.inner.lock();
        let Some(s) = o.subs.get_mut(&sid) else {
            return;
        };
        s.credit = s.credit.saturating_add(n);
        if !s.q.is_empty() && !s.in_ready {
            s.in_ready = true;
            o.ready.push_back(sid);
            drop(o);
            self.ready.notify_one();
        }
    }

    /// Queues `msg` for subscription `sid` under its policy. Does not wake
    /// the writer: call [`ClientOut::wake`] after a batch of pushes.
    pub(crate) fn push(&self, sid: u64, token: u64, msg: &Body) -> Push {
        if self.is_closed() {
            return Push::Gone;
        }
        let mut o = self.inner.lock();
        let size = msg.cost();
        let pending = o.pending_bytes + size;
        let over = self.over(&mut o, pending);
        let o = &mut *o;
        let Some(s) = o.subs.get_mut(&sid) else {
            return Push::Gone;
        };
        if s.q.is_empty() {
            if let Some(d) = self.direct.get() {
                if d.try_write(sid, token, std::slice::from_ref(msg)) {
                    s.delivered += 1;
                    o.delivered += 1;
                    return Push::Written;
                }
            }
        }
        let mut result = Push::Queued;
        if s.q.len() >= s.room() || over {
            match s.policy {
                Policy::Block => return Push::Full,
                Policy::Disconnect => return Push::Kill,
                Policy::DropNewest => {
                    s.dropped += 1;
                    if s.drop_reported {
                        s.drop_reported = false;
                        o.drop_reports.push(sid);
                    }
                    return Push::Dropped;
                }
                Policy::DropOldest => {
                    s.dropped += 1;
                    if s.drop_reported {
                        s.drop_reported = false;
                        o.drop_reports.push(sid);
                    }
                    match s.q.pop_front() {
                        Some((_, old)) => o.pending_bytes -= old.cost(),
                        None => return Push::Dropped,
                    }
                    result = Push::Dropped;
                }
            }
        }
        s.q.push_back((token, msg.clone()));
        o.pending_bytes += size;
        if s.credit > 0 && !s.in_ready {
            s.in_ready = true;
            o.ready.push_back(sid);
        }
        result
    }

    /// Queues `msgs` in order for subscription `sid` (token 0), under one
    /// lock, as [`ClientOut::push`] would one by one; stops at the first
    /// that is not queued or dropped. Returns how many were taken and the
    /// last result. Does not wake the writer.
    pub(crate) fn push_run(&self, sid: u64, msgs: &[Body]) -> (usize, Push) {
        if self.is_closed() {
            return (0, Push::Gone);
        }
        let mut o = self.inner.lock();
        let o = &mut *o;
        let Some(s) = o.subs.get_mut(&sid) else {
            return (0, Push::Gone);
        };
        if s.q.is_empty() && !msgs.is_empty() {
            if let Some(d) = self.direct.get() {
                if d.try_write(sid, 0, msgs) {
                    s.delivered += msgs.len() as u64;
                    o.delivered += msgs.len() as u64;
                    return (msgs.len(), Push::Written);
                }
            }
        }
        // The longest prefix that fits as it is, checked and queued in one
        // go (a run of a fast publisher's messages mostly does); the
        // rest one by one under the subscription's policy, as `push`.
        let room = s.room().saturating_sub(s.q.len());
        let (mut fit, mut bytes) = (0, 0);
        for msg in msgs.iter().take(room) {
            let size = msg.cost();
            if o.pending_bytes + bytes + size > o.max_pending {
                break;
            }
            bytes += size;
            fit += 1;
        }
        if fit > 0 && self.fits(&mut o.reserved, o.pending_bytes + bytes + o.input) {
            s.q.extend(msgs[..fit].iter().map(|m| (0, m.clone())));
            o.pending_bytes += bytes;
        } else {
            fit = 0;
        }
        let mut last = (msgs.len(), Push::Queued);
        for (k, msg) in msgs.iter().enumerate().skip(fit) {
            let size = msg.cost();
            let pending = o.pending_bytes + size;
            if s.q.len() >= s.room()
                || pending > o.max_pending
                || !self.fits(&mut o.reserved, pending + o.input)
            {
                match s.policy {
                    Policy::Block => {
                        last = (k, Push::Full);
                        break;
                    }
                    Policy::Disconnect => {
                        last = (k, Push::Kill);
                        break;
                    }
                    Policy::DropNewest => {
                        s.dropped += 1;
                        if s.drop_reported {
                            s.drop_reported = false;
                            o.drop_reports.push(sid);
                        }
                        last.1 = Push::Dropped;
                        continue;
                    }
                    Policy::DropOldest => {
                        s.dropped += 1;
                        if s.drop_reported {
                            s.drop_reported = false;
                            o.drop_reports.push(sid);
                        }
                        last.1 = Push::Dropped;
                        match s.q.pop_front() {
                            Some((_, old)) => o.pending_bytes -= old.cost(),
                            None => continue,
                        }
                    }
                }
            }
            s.q.push_back((0, msg.clone()));
            o.pending_bytes += size;
        }
        if s.credit > 0 && !s.in_ready && !s.q.is_empty() {
            s.in_ready = true;
            o.ready.push_back(sid);
        }
        last
    }

    /// Wakes the writer.
    pub(crate) fn wake(&self) {
        self.ready.notify_one();
    }

    /// Waits until a `block` subscription may have room.
    pub(crate) async fn wait_space(&self, sid: u64, token: u64, msg: &Body) -> Push {
        loop {
            let mut n = pin!(self.space.notified());
            n.as_mut().enable();
            match self.push(sid, token, msg) {
                Push::Full => {}
                other => {
                    self.wake();
                    return other;
                }
            }
            n.await;
        }
    }

    /// Queues `msgs` in order for a `block` subscription (token 0),
    /// waiting for room as often as it takes: what [`ClientOut::wait_space`]
    /// does for each in turn, but all that fits is queued under one lock
    /// per wake-up (a publisher held back by a slow subscriber otherwise
    /// took the lock and woke the writer once per message). Returns the
    /// last result, never `Push::Full`; stops early at `Push::Gone`.
    pub(crate) async fn wait_space_run(&self, sid: u64, mut msgs: &[Body]) -> Push {
        loop {
            let mut n = pin!(self.space.notified());
            n.as_mut().enable();
            let (k, r) = self.push_run(sid, msgs);
            msgs = &msgs[k..];
            if k > 0 || r == Push::Dropped {
                self.wake();
            }
            if r != Push::Full {
                return r;
            }
            n.await;
        }
    }

    /// Marks the client closed: the writer sends `code`/`text` (if any)
    /// after what is queued, then stops; blocked publishers stop waiting.
    pub(crate) fn close(&self, error: Option<(Code, String)>) {
        {
            let mut o = self.inner.lock();
            if self.closed.swap(true, Ordering::AcqRel) {
                return;
            }
            o.closing = error.map(|(code, text)| ServerFrame::Error {
                corr: 0,
                code,
                text,
            });
        }
        self.ready.notify_one();
        self.space.notify_waiters();
        self.closed_notify.notify_waiters();
    }

    /// Whether the node closed this client (`ClientOut::close`).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Resolves once the client is closed.
    pub async fn closed(&self) {
        let mut n = pin!(self.closed_notify.notified());
        n.as_mut().enable();
        if self.is_closed() {
            return;
        }
        n.await;
    }

    pub(crate) fn sub_counters(&self, sid: u64) -> Option<SubCounters> {
        let o = self.inner.lock();
        o.subs.get(&sid).map(|s| SubCounters {
            queued: s.q.len(),
            delivered: s.delivered,
            dropped: s.dropped,
            credit: s.credit,
        })
    }

    /// Counts `n` bytes read from the client's connection.
    pub(crate) fn count_in(&self, n: usize) {
        self.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts `n` bytes written to the client's connection.
    pub(crate) fn count_out(&self, n: usize) {
        self.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// (bytes read, bytes written) on the client's connection.
    pub(crate) fn bytes(&self) -> (u64, u64) {
        (
            self.bytes_in.load(Ordering::Relaxed),
            self.bytes_out.load(Ordering::Relaxed),
        )
    }

    /// (pending bytes, messages delivered, control frames dropped).
    pub(crate) fn counters(&self) -> (usize, u64, u64) {
        let o = self.inner.lock();
        (o.pending_bytes, o.delivered, o.dropped_control)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body pushed in place encodes exactly as one made by
    /// `Body::encoded`, short (inline) and long (shared), in order.
    #[test]
    fn push_encoded_is_encoded() {
        let mut run = Vec::new();
        let raws: Vec<Bytes> = [0usize, 1, SMALL - 1, SMALL, SMALL + 1, 300]
            .iter()
            .map(|&n| (0..n).map(|i| i as u8).collect::<Vec<u8>>().into())
            .collect();
        for raw in &raws {
            Body::push_encoded(&mut run, raw);
        }
        assert_eq!(run.len(), raws.len());
        for (b, raw) in run.iter().zip(&raws) {
            let (mut x, mut y) = (Vec::new(), Vec::new());
            b.encode(&mut x, 3, 0);
            Body::encoded(raw).encode(&mut y, 3, 0);
            assert_eq!(x, y);
            assert_eq!(b.cost(), Body::encoded(raw).cost());
            assert_eq!(matches!(b, Body::Small { .. }), raw.len() <= SMALL);
        }
    }

    fn request(token: u64) -> ServerFrame {
        ServerFrame::Request {
            token,
            cluster: "c".into(),
            msg: Message::new("c", vec![0u8; 1000]),
        }
    }

    /// Messages `from..to`, each its number as payload.
    fn numbered(from: u8, to: u8) -> Vec<Body> {
        (from..to)
            .map(|i| Body::value(Message::new("s", vec![i])))
            .collect()
    }

    /// The payloads of the messages of subscription `sid` taken now
    /// (given the credit to take them all).
    fn taken(out: &ClientOut, sid: u64) -> Vec<u8> {
        out.credit(sid, 1_000);
        let mut frames = Vec::new();
        out.take(&mut frames);
        frames
            .into_iter()
            .filter_map(|f| match f {
                ServerFrame::Msg { sid: s, msg, .. } if s == sid => Some(msg.payload[0]),
                _ => None,
            })
            .collect()
    }

    /// A run is queued up to the queue's room or the pending-bytes bound,
    /// and what does not fit goes as each policy says, counted.
    #[test]
    fn push_run_queues_what_fits_then_applies_the_policy() {
        let run = numbered(0, 10);
        let out = ClientOut::new(1, 1 << 20, None);
        out.add_sub(1, 4, Policy::Block, 0);
        out.add_sub(2, 4, Policy::DropNewest, 0);
        out.add_sub(3, 4, Policy::DropOldest, 0);
        out.add_sub(4, 4, Policy::Disconnect, 0);
        assert_eq!(out.push_run(1, &run), (4, Push::Full));
        assert_eq!(out.push_run(2, &run), (10, Push::Dropped));
        assert_eq!(out.push_run(3, &run), (10, Push::Dropped));
        assert_eq!(out.push_run(4, &run), (4, Push::Kill));
        assert_eq!(out.sub_counters(2).unwrap().dropped, 6);
        assert_eq!(out.sub_counters(3).unwrap().dropped, 6);
        assert_eq!(taken(&out, 1), [0, 1, 2, 3]);
        assert_eq!(taken(&out, 2), [0, 1, 2, 3]);
        assert_eq!(taken(&out, 3), [6, 7, 8, 9]);
        // The client's pending-bytes bound: three messages' worth.
        let out = ClientOut::new(1, 3 * run[0].cost(), None);
        out.add_sub(1, 100, Policy::Block, 0);
        assert_eq!(out.push_run(1, &run), (3, Push::Full));
        assert_eq!(taken(&out, 1), [0, 1, 2]);
        assert_eq!(out.push_run(1, &run[3..]), (3, Push::Full));
        assert_eq!(taken(&out, 1), [3, 4, 5]);
    }

    /// A publisher held back by a full `block` subscription queues the
    /// rest of its run as room comes, in order, none lost.
    #[tokio::test]
    async fn a_blocked_run_is_queued_in_order_as_room_comes() {
        let out = Arc::new(ClientOut::new(1, 1 << 20, None));
        out.add_sub(1, 3, Policy::Block, 0);
        let run = numbered(0, 20);
        let (k, r) = out.push_run(1, &run);
        assert_eq!((k, r), (3, Push::Full));
        let rest = run[k..].to_vec();
        let blocked = tokio::spawn({
            let out = out.clone();
            async move { out.wait_space_run(1, &rest).await }
        });
        let mut got = Vec::new();
        for _ in 0..10_000 {
            if got.len() >= 20 {
                break;
            }
            got.extend(taken(&out, 1));
            tokio::task::yield_now().await;
        }
        assert_eq!(blocked.await.unwrap(), Push::Queued);
        assert_eq!(got, (0..20).collect::<Vec<u8>>());
    }

    #[test]
    fn control_frames_count_until_taken() {
        let out = ClientOut::new(1, 10_000, None);
        out.control(ServerFrame::Pong { corr: 1 });
        assert!(out.counters().0 >= std::mem::size_of::<ServerFrame>());
        let mut buf = Vec::new();
        assert!(out.take_encoded(&mut buf));
        assert_eq!(out.counters().0, 0);
    }

    #[test]
    fn requests_are_refused_over_the_bound_and_forgotten_with_their_requester() {
        let out = ClientOut::new(1, 2_500, None);
        assert!(out.control_bounded(request(1), 0));
        assert!(out.control_bounded(request(2), 0));
        assert!(!out.control_bounded(request(3), 0));
        assert_eq!(out.counters().2, 1);
        out.forget_request(1);
        out.forget_request(2);
        assert_eq!(out.counters().0, 0);
        assert!(out.control_bounded(request(3), 0));
    }

    #[test]
    fn tunnel_credit_merges_until_taken() {
        let out = ClientOut::new(1, 10_000, None);
        for _ in 0..100_000 {
            out.tun_credit(7, 3);
        }
        out.tun_credit(8, 1);
        let one = out.counters().0;
        assert!(one <= 2 * std::mem::size_of::<ServerFrame>(), "{one}");
        let mut frames = Vec::new();
        assert!(out.take(&mut frames));
        assert_eq!(
            frames,
            vec![
                ServerFrame::TunCredit {
                    tunnel: 7,
                    n: 300_000
                },
                ServerFrame::TunCredit { tunnel: 8, n: 1 },
            ]
        );
        assert_eq!(out.counters().0, 0);
        out.tun_credit(7, 5);
        frames.clear();
        assert!(out.take(&mut frames));
        assert_eq!(frames, vec![ServerFrame::TunCredit { tunnel: 7, n: 5 }]);
    }

    #[test]
    fn input_buffers_are_charged_to_the_budget() {
        let budget = Arc::new(Budget::new(4 * CHUNK));
        let a = ClientOut::new(1, usize::MAX, Some(budget.clone()));
        let b = ClientOut::new(2, usize::MAX, Some(budget.clone()));
        assert!(a.hold_input(3 * CHUNK));
        assert!(!b.hold_input(2 * CHUNK), "over budget");
        assert!(b.budget_error().contains("max_total_pending_bytes"));
        // While a holds its input, what b may queue is bounded too.
        assert!(!b.control_bounded(request(1), 2 * CHUNK));
        assert!(a.hold_input(0));
        assert!(b.hold_input(2 * CHUNK), "given back");
        drop(b);
        drop(a);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn the_budget_is_shared_and_given_back() {
        let budget = Arc::new(Budget::new(3 * CHUNK));
        let a = ClientOut::new(1, usize::MAX, Some(budget.clone()));
        let b = ClientOut::new(2, usize::MAX, Some(budget.clone()));
        let sized = |t, n| ServerFrame::Request {
            token: t,
            cluster: "c".into(),
            msg: Message::new("c", vec![0u8; n]),
        };
        assert!(a.control_bounded(sized(1, 2 * CHUNK + CHUNK / 2), 0));
        assert!(budget.exhausted());
        assert!(
            !b.control_bounded(sized(2, CHUNK + CHUNK / 2), 0),
            "over budget"
        );
        let mut buf = Vec::new();
        assert!(a.take_encoded(&mut buf));
        // An idle client keeps one chunk.
        assert!(
            b.control_bounded(sized(2, CHUNK + CHUNK / 2), 0),
            "given back"
        );
        drop(b);
        assert!(!budget.exhausted());
    }
}
