//! What the client does with the node's frames: messages go straight into
//! their subscription's inbox (consecutive messages for one subscription
//! under one lock, with one wake-up), answers to the calls waiting for
//! them, requests, broadcasts and tunnels to their members and tunnels.
//!
//! Frames arrive decoded (in process, shared memory: [`ServerFrame`]) or as
//! bytes from a socket ([`RawFrame`]), whose message is then decoded in
//! place in the subscription's queue; [`Inbound`] is what both offer.

use std::sync::Arc;

use bytes::Bytes;
use skiff_proto::client_frame::{ClientFrame, Code, ServerFrame, ASYNC_ERROR};
use skiff_proto::{Message, WireError};

use super::cluster::{Incoming, Request, Tunnel};
use super::inbox::Inbox;
use super::request::ReqEvent;
use super::status::ClientEvent;
use super::sub::Delivery;
use super::{Answer, Inner, State};
use crate::Error;

impl Inner {
    /// Routes frames from the node to the calls and handles waiting for
    /// them. Returns the node's error if it closed this client (the caller
    /// fails the client or, for a shutdown, fails over).
    #[must_use]
    pub(crate) fn dispatch(
        self: &Arc<Self>,
        frames: impl IntoIterator<Item = ServerFrame>,
    ) -> Option<(Code, String)> {
        let mut bad = None;
        let fatal = self.dispatch_inbound(frames, &mut bad);
        debug_assert!(bad.is_none(), "decoded frames cannot be malformed");
        fatal
    }

    /// [`Inner::dispatch`] for frames still to be decoded (see
    /// [`Inbound`]): a message is decoded straight into its
    /// subscription's queue. Stops at the first frame that does not
    /// decode and leaves its error in `bad`; nothing after it is
    /// delivered.
    #[must_use]
    pub(crate) fn dispatch_inbound<I: Inbound>(
        self: &Arc<Self>,
        frames: impl IntoIterator<Item = I>,
        bad: &mut Option<WireError>,
    ) -> Option<(Code, String)> {
        let mut fatal = None;
        let mut pinged = false;
        let mut taken = None;
        let epoch = self.epoch();
        let mut guard = self.state.lock();
        let st = &mut *guard;
        // Consecutive messages for one subscription go straight into its
        // inbox under one lock, with one wake-up.
        let mut run: Option<Run> = None;
        for item in frames {
            if let Some((sid, token)) = item.msg() {
                if run.as_ref().map(|r| r.sid) != Some(sid) {
                    end_run(run.take());
                    run = Some(Run {
                        sid,
                        inbox: st.subs.get(&sid).map(|s| s.inbox.lock_arc()),
                        pushed: false,
                    });
                }
                let r = run.as_mut().expect("set");
                if let Err(e) = r.fill(item, token, epoch) {
                    *bad = Some(e);
                    break;
                }
                continue;
            }
            end_run(run.take());
            match item.frame() {
                Ok(ServerFrame::Ping) => pinged = true,
                Ok(ServerFrame::Taken { n }) => taken = Some(n),
                Ok(f) => {
                    if let Some(f) = self.on_frame(st, f, epoch) {
                        fatal = Some(f);
                    }
                }
                Err(e) => {
                    *bad = Some(e);
                    break;
                }
            }
        }
        end_run(run);
        drop(guard);
        if let (Some(n), Some(super::link::Link::Stream(tx))) = (taken, &self.link) {
            tx.taken(n);
        }
        if pinged {
            // The node's keepalive: any frame answers it.
            let _ = self.send_now(ClientFrame::Ping { corr: 0 });
        }
        fatal
    }

    /// Any frame but a message: to whatever waits for it. `Some`: the
    /// node closed this client with this error.
    fn on_frame(
        self: &Arc<Self>,
        st: &mut State,
        f: ServerFrame,
        epoch: u32,
    ) -> Option<(Code, String)> {
        match f {
            // Taken before (`Inbound::msg`): a frame that decodes to a
            // message here cannot occur, and is ignored, not a panic.
            ServerFrame::Msg { .. } | ServerFrame::Welcome { .. } => {}
            ServerFrame::Dropped { sid, total } => {
                if let Some(s) = st.subs.get(&sid) {
                    let mut i = s.inbox.lock();
                    i.dropped = i.dropped_base + total;
                }
            }
            ServerFrame::Ack { corr } => {
                if let Some(s) = st.subs.get_mut(&corr) {
                    s.live = true;
                }
                if let Some((cluster, capacity)) = st.joins.remove(&corr) {
                    if let Some(m) = st.members.get_mut(&cluster) {
                        m.capacity = Some(capacity);
                    }
                }
                if let Some(w) = st.waiters.remove(&corr) {
                    let _ = w.send(Ok(Answer::Ack));
                }
            }
            ServerFrame::Pong { corr } => {
                if let Some(w) = st.waiters.remove(&corr) {
                    let _ = w.send(Ok(Answer::Ack));
                } else if st.restoring.as_ref().is_some_and(|(c, _)| *c == corr) {
                    // The new node holds everything restored.
                    let (_, gap) = st.restoring.take().expect("checked");
                    st.failovers += 1;
                    st.listeners.emit(ClientEvent::Reconnected(gap));
                }
            }
            ServerFrame::Error {
                corr: 0,
                code,
                text,
            } => return Some((code, text)),
            ServerFrame::Error {
                corr: ASYNC_ERROR,
                text,
                ..
            } => {
                st.async_errors += 1;
                st.last_async_error = Some(text);
            }
            ServerFrame::Error { corr, code, text } => on_refusal(st, corr, code, text),
            ServerFrame::Reply { rid, msg } => {
                if let Some(r) = st.requests.get(&rid) {
                    let _ = r.send(ReqEvent::Reply(msg));
                }
            }
            ServerFrame::ReqDone { rid, code } => {
                if let Some(r) = st.requests.get(&rid) {
                    let _ = r.send(ReqEvent::Done(code));
                }
            }
            ServerFrame::Request {
                token,
                cluster,
                msg,
            } => {
                if let Some(m) = st.members.get(&cluster) {
                    m.inbox.lock().push(Incoming::Request(Request::new(
                        self.clone(),
                        token,
                        epoch,
                        msg,
                    )));
                }
            }
            ServerFrame::Bcast { cluster, msg } => {
                if let Some(m) = st.members.get(&cluster) {
                    m.inbox.lock().push(Incoming::Broadcast(msg));
                }
            }
            f => self.on_tunnel_frame(st, f, epoch),
        }
        None
    }

    /// A tunnel frame (opened, incoming, data, credit, close), or stats.
    fn on_tunnel_frame(self: &Arc<Self>, st: &mut State, f: ServerFrame, epoch: u32) {
        match f {
            ServerFrame::TunIncoming {
                tunnel,
                cluster,
                window,
            } => {
                let (t, shared) = Tunnel::new(self.clone(), tunnel, epoch, window);
                st.tunnels.insert(tunnel, shared);
                match st.members.get(&cluster) {
                    Some(m) => m.inbox.lock().push(Incoming::Tunnel(t)),
                    None => drop(t),
                }
            }
            ServerFrame::TunOpened {
                corr,
                tunnel,
                window,
            } => {
                let (t, shared) = Tunnel::new(self.clone(), tunnel, epoch, window);
                st.tunnels.insert(tunnel, shared);
                match st.waiters.remove(&corr) {
                    Some(w) => {
                        let _ = w.send(Ok(Answer::Tunnel(t)));
                    }
                    None => drop(t),
                }
            }
            ServerFrame::TunData { tunnel, msg } => {
                if let Some(t) = st.tunnels.get(&tunnel) {
                    t.data(msg);
                }
            }
            ServerFrame::TunCredit { tunnel, n } => {
                if let Some(t) = st.tunnels.get(&tunnel) {
                    t.credit(n);
                }
            }
            ServerFrame::TunClose { tunnel } => {
                if let Some(t) = st.tunnels.remove(&tunnel) {
                    t.close_local();
                }
            }
            ServerFrame::Stats { corr, json } => {
                if let Some(w) = st.waiters.remove(&corr) {
                    let _ = w.send(Ok(Answer::Stats(json)));
                }
            }
            // The others are `on_frame`'s.
            _ => {}
        }
    }
}

/// The node refused what `corr` asked: the call waiting for it fails, or a
/// subscription or membership restored after a failover ends.
fn on_refusal(st: &mut State, corr: u64, code: Code, text: String) {
    let join = st.joins.remove(&corr);
    if let Some(w) = st.waiters.remove(&corr) {
        let _ = w.send(Err(Error::Refused { code, reason: text }));
    } else if let Some(s) = st.subs.remove(&corr) {
        // A live subscription the node ended (its permissions changed), or
        // one it would not take back after a failover.
        s.inbox.lock().close(Some(if s.live {
            format!("the node ended this subscription: {text}")
        } else {
            format!("the node refused to restore this subscription after a failover: {text}")
        }));
    } else if let Some(m) = join.and_then(|(c, _)| st.members.remove(&c)) {
        m.inbox.lock().close(Some(format!(
            "the node refused to restore this membership after a failover: {text}"
        )));
    }
}

/// A frame from the node as the client receives it: decoded already (an
/// in-process or shared-memory node hands over [`ServerFrame`]s), or still
/// bytes ([`RawFrame`], from a socket), whose message is then decoded
/// straight into the subscription's queue.
pub(crate) trait Inbound {
    /// A message frame's subscription and reply token (0: none).
    fn msg(&self) -> Option<(u64, u64)>;
    /// Puts a message frame's message into `out`.
    fn fill(self, out: &mut Message) -> Result<(), WireError>;
    /// Any other frame, decoded.
    fn frame(self) -> Result<ServerFrame, WireError>;
}

impl Inbound for ServerFrame {
    fn msg(&self) -> Option<(u64, u64)> {
        match self {
            ServerFrame::Msg { sid, token, .. } => Some((*sid, *token)),
            _ => None,
        }
    }
    fn fill(self, out: &mut Message) -> Result<(), WireError> {
        if let ServerFrame::Msg { msg, .. } = self {
            *out = msg;
        }
        Ok(())
    }
    fn frame(self) -> Result<ServerFrame, WireError> {
        Ok(self)
    }
}

/// A frame body read from a socket, not decoded yet.
pub(crate) struct RawFrame {
    body: Bytes,
    max_payload: usize,
    /// A message frame's subscription, token and where its message starts.
    msg: Option<(u64, u64, usize)>,
}

impl RawFrame {
    /// Reads what kind of frame `body` is (for a message frame, its
    /// subscription and token; the message itself waits for `fill`).
    pub(crate) fn new(body: Bytes, max_payload: usize) -> Result<RawFrame, WireError> {
        Ok(RawFrame {
            msg: ServerFrame::msg_header(&body)?,
            body,
            max_payload,
        })
    }
}

impl Inbound for RawFrame {
    fn msg(&self) -> Option<(u64, u64)> {
        self.msg.map(|(sid, token, _)| (sid, token))
    }
    fn fill(self, out: &mut Message) -> Result<(), WireError> {
        let at = self.msg.map_or(0, |(_, _, at)| at);
        skiff_proto::wire::decode_message_into(&self.body, at, self.max_payload, out)
    }
    fn frame(self) -> Result<ServerFrame, WireError> {
        ServerFrame::decode(self.body, self.max_payload)
    }
}

/// Messages for one subscription being put into its inbox: its lock is
/// held for the run.
struct Run {
    sid: u64,
    inbox: Option<parking_lot::ArcMutexGuard<parking_lot::RawMutex, Inbox<Delivery>>>,
    pushed: bool,
}

impl Run {
    /// Puts a message frame's message into the run's inbox, decoded in
    /// place (the delivery is not moved from frame to queue); checked all
    /// the same when the subscription has ended (a bad frame is bad for
    /// it too).
    #[inline]
    fn fill<I: Inbound>(&mut self, item: I, token: u64, epoch: u32) -> Result<(), WireError> {
        let token = (token != 0).then_some(token);
        let Some(i) = &mut self.inbox else {
            return item.fill(&mut Message::default());
        };
        i.q.push_back(Delivery::new(Message::default(), token, epoch));
        let i = &mut **i;
        let d = i.q.back_mut().expect("just pushed");
        match item.fill(&mut d.msg) {
            Ok(()) => {
                d.gap = i.pending_gap.take();
                self.pushed = true;
                Ok(())
            }
            Err(e) => {
                i.q.pop_back();
                Err(e)
            }
        }
    }
}

/// Ends a run: wakes the subscription once, and releases its inbox.
fn end_run(run: Option<Run>) {
    if let Some(Run {
        inbox: Some(mut i),
        pushed: true,
        ..
    }) = run
    {
        i.wake();
    }
}
