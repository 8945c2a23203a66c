//! Publish/subscribe: subscriptions, and publishes from clients (one by
//! one or in runs) and from other nodes, fanned out to every matching
//! subscription.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use skiff_proto::client_frame::{Code, Policy, ServerFrame, ASYNC_ERROR};
use skiff_proto::router::{SubId, Subject, Syntax};
use skiff_proto::{Message, WireError};

use super::{Broker, State, SubEntry};
use crate::mesh::MeshLink;
use crate::outbox::{Body, ClientOut, Push};

/// A message from a client's `Pub` frame, for [`Broker::publish_batch`]:
/// its encoding, and the decoded message unless the encoding is the simple
/// kind [`skiff_proto::client_frame::simple_message`] reads in place.
#[derive(Debug)]
pub struct Published {
    /// The message's encoding (checked).
    pub raw: Bytes,
    /// The message, decoded, when it is not simple.
    pub msg: Option<Box<Message>>,
}

impl Published {
    /// A publish frame's body (its op byte first), checked: the encoding
    /// is kept as a slice of `body` (no copy), and decoded only when it is
    /// not the simple kind.
    pub fn from_frame(mut body: Bytes, max_payload: usize) -> Result<Published, WireError> {
        // Past the op byte in place: no reference-count traffic.
        let op = 1.min(body.len());
        bytes::Buf::advance(&mut body, op);
        let msg = if skiff_proto::client_frame::simple_message(&body, max_payload).is_some() {
            None
        } else {
            Some(Box::new(skiff_proto::wire::decode_message(
                &body,
                max_payload,
            )?))
        };
        Ok(Published { raw: body, msg })
    }

    /// (subject, type, payload length).
    fn parts(&self, max_payload: usize) -> (&str, Option<&str>, usize) {
        match &self.msg {
            Some(m) => (&m.subject, m.kind.as_deref(), m.payload.len()),
            None => skiff_proto::client_frame::simple_message(&self.raw, max_payload)
                .map_or(("", None, 0), |(s, n)| (s, None, n)),
        }
    }
}

impl Broker {
    /// Calls `each` with every subscription a message on `subject` of type
    /// `kind` reaches: each plain one, and one member of each queue group
    /// (round robin over the group's matching members). `no_echo`: a
    /// client whose own subscriptions are skipped (it publishes and asked
    /// not to get its messages back). Returns whether a queue group
    /// matched (then the choice is per message, and a match must not be
    /// reused for the next message).
    pub(super) fn route(
        &self,
        st: &State,
        subject: Subject<'_>,
        kind: Option<&str>,
        no_echo: Option<u64>,
        mut each: impl FnMut(SubId, u64),
    ) -> bool {
        let mut grouped: Vec<(&str, SubId, u64)> = Vec::new();
        st.router.for_each_match(subject, kind, |id, client| {
            if Some(client) == no_echo {
                return;
            }
            match st.subs.get(&id).and_then(|e| e.group.as_deref()) {
                Some(g) => grouped.push((g, id, client)),
                None => each(id, client),
            }
        });
        if grouped.is_empty() {
            return false;
        }
        grouped.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        for members in grouped.chunk_by(|a, b| a.0 == b.0) {
            let turn = self.group_turn.fetch_add(1, Relaxed) as usize;
            let (_, id, client) = members[turn % members.len()];
            each(id, client);
        }
        true
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn subscribe(
        &self,
        me: &Arc<ClientOut>,
        sid: u64,
        (syntax, pattern, kind, lossy): (Syntax, String, String, bool),
        policy: Policy,
        queue: u32,
        credit: u32,
        group: Option<Arc<str>>,
    ) -> Result<(), (Code, String)> {
        if pattern.len() > self.limits.load().max_subject {
            return Err(self.limit(format!(
                "pattern of {} bytes is over the node's limit of {} (max_subject)",
                pattern.len(),
                self.limits.load().max_subject
            )));
        }
        let mut st = self.state.lock();
        let st = &mut *st;
        let Some(c) = st.clients.get_mut(&me.id) else {
            return Err((Code::NotFound, "client is closing".into()));
        };
        if c.sids.len() >= self.limits.load().max_subscriptions {
            return Err(self.limit(format!(
                "the client already holds {} subscriptions (max_subscriptions)",
                self.limits.load().max_subscriptions
            )));
        }
        if c.sids.contains_key(&sid) {
            return Err((Code::Invalid, format!("subscription id {sid} is in use")));
        }
        // The queue exists before the interest, so nothing matched is lost.
        me.add_sub(sid, queue as usize, policy, credit);
        match st.router.subscribe_as(syntax, &pattern, &kind, me.id) {
            Ok(id) => {
                st.subs.insert(
                    id,
                    SubEntry {
                        out: me.clone(),
                        sid,
                        group,
                    },
                );
                if let Some(m) = self.mesh.get() {
                    m.add_interest(syntax, &pattern, &kind, lossy);
                }
                c.sids
                    .insert(sid, (id, policy, pattern, kind, (syntax, lossy)));
                Ok(())
            }
            Err(e) => {
                me.remove_sub(sid);
                Err((Code::Invalid, e.to_string()))
            }
        }
    }

    /// Queues `msg` to every subscription matching its subject and type;
    /// returns how many matched. Waits (with no lock held) for full `block`
    /// subscriptions.
    pub(super) async fn fan_out(
        &self,
        me: &Arc<ClientOut>,
        msg: &Message,
        body: &Body,
        token: u64,
        pending: Option<u64>,
    ) -> usize {
        let Ok(subject) = Subject::new(&msg.subject) else {
            return 0;
        };
        let mut blocked: Vec<(Arc<ClientOut>, u64)> = Vec::new();
        let mut kill: Vec<u64> = Vec::new();
        let mut matched = 0usize;
        {
            let mut st = self.state.lock();
            let st = &mut *st;
            if let Some(c) = st.clients.get_mut(&me.id) {
                c.published += 1;
            }
            let subs = &st.subs;
            let no_echo = me.no_echo().then_some(me.id);
            self.route(st, subject, msg.kind.as_deref(), no_echo, |id, client| {
                let Some(e) = subs.get(&id) else { return };
                matched += 1;
                match e.out.push(e.sid, token, body) {
                    Push::Queued | Push::Dropped => e.out.wake(),
                    Push::Full => blocked.push((e.out.clone(), e.sid)),
                    Push::Kill => kill.push(client),
                    Push::Gone => matched -= 1,
                }
            });
            if let Some(p) = pending.and_then(|t| st.pending.get_mut(&t)) {
                p.expect += matched as u32;
            }
            if pending.is_none() {
                if let Some(m) = self.mesh.get() {
                    let mut raw = Vec::new();
                    skiff_proto::wire::encode_message(&mut raw, msg, false);
                    let sent = m.publish(&msg.subject, msg.kind.as_deref(), &raw);
                    tell_dropped(me, sent.dropped);
                }
            }
        }
        for k in kill {
            self.counters.slow_consumers.fetch_add(1, Relaxed);
            self.detach(
                k,
                Some((
                    Code::SlowConsumer,
                    "a subscription with policy `disconnect` was full: slow consumer".into(),
                )),
            );
        }
        for (out, sid) in blocked {
            // Stop waiting if the publisher itself is closed.
            tokio::select! {
                _ = out.wait_space(sid, token, body) => {}
                _ = me.closed() => break,
            }
        }
        matched
    }

    /// Publishes a batch of messages from one client (as read from `Pub`
    /// frames), in order: what [`Broker::handle`] does for each `Pub`, with one routing
    /// lock per run of messages (until one waits for a full `block`
    /// subscription) and one match per run of messages with the same
    /// subject and type. Wakes each subscriber once per run. Empties
    /// `batch`.
    pub async fn publish_batch(&self, me: &Arc<ClientOut>, batch: &mut Vec<Published>) {
        let mesh = self.mesh.get();
        if let Some(m) = mesh {
            if !batch.is_empty() {
                m.wait_room().await;
            }
        }
        self.publish_run(me, batch, mesh.map(|m| &**m)).await
    }

    /// Messages other nodes published, as [`Broker::publish_batch`] does
    /// for a client's, to local subscriptions only (`me` is the node's
    /// mesh client, whose counters they go to). A full `block`
    /// subscription makes the mesh wait, which holds the publishing nodes
    /// back through their flow-control windows.
    pub(crate) async fn publish_remote(&self, me: &Arc<ClientOut>, batch: &mut Vec<Published>) {
        self.publish_run(me, batch, None).await
    }

    async fn publish_run(
        &self,
        me: &Arc<ClientOut>,
        batch: &mut Vec<Published>,
        forward: Option<&MeshLink>,
    ) {
        // A subscription that was full, with what it has still to get.
        let mut blocked: Vec<Blocked> = Vec::new();
        let mut kill: Vec<u64> = Vec::new();
        // Subscriptions matching the previous message: (router id, client).
        let mut targets: Vec<(SubId, u64)> = Vec::new();
        // Messages for `targets` not yet queued to them.
        let mut run: Vec<Body> = Vec::new();
        let mut woken: Vec<u64> = Vec::new();
        // Messages of this round for other nodes (indices into `batch`),
        // handed to the mesh together once the routing lock is released.
        let mut fwd: Vec<usize> = Vec::new();
        let mut i = 0;
        while i < batch.len() {
            {
                let max_payload = self.limits.load().max_payload;
                let mut st = self.state.lock();
                let st = &mut *st;
                let mut prev: Option<usize> = None;
                // Whether the previous match reached a queue group (each
                // message then picks its member anew).
                let mut grouped = false;
                let no_echo = me.no_echo().then_some(me.id);
                let mut published = 0u64;
                fwd.clear();
                while i < batch.len() && blocked.is_empty() && kill.is_empty() {
                    let p = &batch[i];
                    i += 1;
                    let (subject, kind, payload) = p.parts(max_payload);
                    let same = !grouped
                        && prev.is_some_and(|q| {
                            let (s, k, _) = batch[q].parts(max_payload);
                            s == subject && k == kind
                        });
                    // A subject seen just before was checked and matched.
                    if let Err((code, text)) = self.check_parts(subject, kind, payload, !same) {
                        me.control(ServerFrame::Error {
                            corr: ASYNC_ERROR,
                            code,
                            text,
                        });
                        continue;
                    }
                    if !same {
                        if let Err((code, text)) = self.permit(me, super::Op::Publish, subject) {
                            me.control(ServerFrame::Error {
                                corr: ASYNC_ERROR,
                                code,
                                text,
                            });
                            continue;
                        }
                        flush_run(st, &mut run, &targets, &mut woken, &mut blocked, &mut kill);
                        if !blocked.is_empty() || !kill.is_empty() {
                            i -= 1;
                            break;
                        }
                        let Ok(subject) = Subject::new(subject) else {
                            continue;
                        };
                        targets.clear();
                        grouped = self.route(st, subject, kind, no_echo, |id, client| {
                            targets.push((id, client))
                        });
                        prev = Some(i - 1);
                    }
                    published += 1;
                    if forward.is_some() {
                        fwd.push(i - 1);
                    }
                    run.push(Body::encoded(&p.raw));
                }
                flush_run(st, &mut run, &targets, &mut woken, &mut blocked, &mut kill);
                if let Some(c) = st.clients.get_mut(&me.id) {
                    c.published += published;
                }
                self.counters.published.fetch_add(published, Relaxed);
                for c in woken.drain(..) {
                    if let Some(c) = st.clients.get(&c) {
                        c.out.wake();
                    }
                }
            }
            if let (Some(m), false) = (forward, fwd.is_empty()) {
                let max = self.limits.load().max_payload;
                let sent = m.publish_many(fwd.iter().map(|&k| {
                    let p = &batch[k];
                    let (subject, kind, _) = p.parts(max);
                    (subject, kind, &p.raw[..])
                }));
                tell_dropped(me, sent.dropped);
            }
            for k in kill.drain(..) {
                self.counters.slow_consumers.fetch_add(1, Relaxed);
                self.detach(
                    k,
                    Some((
                        Code::SlowConsumer,
                        "a subscription with policy `disconnect` was full: slow consumer".into(),
                    )),
                );
            }
            for (out, sid, rest) in blocked.drain(..) {
                for body in &rest {
                    tokio::select! {
                        r = out.wait_space(sid, 0, body) => if r != Push::Queued && r != Push::Dropped {
                            break;
                        },
                        _ = me.closed() => {
                            batch.clear();
                            return;
                        }
                    }
                }
            }
        }
        batch.clear();
    }

    /// A `Pub` frame's message: checked, then queued to every matching
    /// subscription here and handed to the mesh.
    pub(super) async fn publish(&self, me: &Arc<ClientOut>, msg: Message) {
        let checked = self
            .check_message(&msg, true)
            .and_then(|()| self.permit(me, super::Op::Publish, &msg.subject));
        if let Err((code, text)) = checked {
            me.control(ServerFrame::Error {
                corr: ASYNC_ERROR,
                code,
                text,
            });
            return;
        }
        self.counters.published.fetch_add(1, Relaxed);
        if let Some(m) = self.mesh.get() {
            m.wait_room().await;
        }
        let msg = Arc::new(msg);
        self.fan_out(me, &msg, &Body::Val(msg.clone()), 0, None)
            .await;
    }

    /// Removes subscription `sid` of client `me` (and its interest).
    pub(super) fn unsubscribe(&self, me: &Arc<ClientOut>, sid: u64) {
        let mut st = self.state.lock();
        let removed = st.clients.get_mut(&me.id).and_then(|c| c.sids.remove(&sid));
        if let Some((id, _, pattern, kind, (syntax, lossy))) = removed {
            st.router.unsubscribe(id);
            st.subs.remove(&id);
            if let Some(m) = self.mesh.get() {
                m.remove_interest(syntax, &pattern, &kind, lossy);
            }
        }
        drop(st);
        me.remove_sub(sid);
    }

    /// Queues `body` to every local subscription matching `msg` (with
    /// request `token`, 0 for a publish); a full subscription drops it and
    /// counts it (the mesh task never waits). Returns how many it reached.
    pub(super) fn local_deliver(
        &self,
        st: &State,
        msg: &Message,
        body: &Body,
        token: u64,
    ) -> (usize, Vec<u64>) {
        let Ok(subject) = Subject::new(&msg.subject) else {
            return (0, Vec::new());
        };
        let (mut n, mut kill) = (0, Vec::new());
        self.route(st, subject, msg.kind.as_deref(), None, |id, client| {
            let Some(e) = st.subs.get(&id) else { return };
            match e.out.push(e.sid, token, body) {
                Push::Queued => {
                    n += 1;
                    e.out.wake()
                }
                Push::Dropped => e.out.wake(),
                Push::Full => {
                    self.remote_drops.fetch_add(1, Relaxed);
                }
                Push::Kill => kill.push(client),
                Push::Gone => {}
            }
        });
        (n, kill)
    }

    /// Closes `client` as a slow consumer (counted), as a subscription
    /// with policy `disconnect` is closed; for a front end that finds it
    /// so on its own (the NATS listener's write deadline).
    pub(crate) fn slow_consumer(&self, client: u64) {
        self.kill_slow(vec![client]);
    }

    pub(super) fn kill_slow(&self, kill: Vec<u64>) {
        for k in kill {
            self.counters.slow_consumers.fetch_add(1, Relaxed);
            self.detach(
                k,
                Some((
                    Code::SlowConsumer,
                    "a subscription with policy `disconnect` was full: slow consumer".into(),
                )),
            );
        }
    }

    /// A message another node published: to local subscriptions only.
    pub(crate) fn deliver_remote(&self, msg: &Message, raw: &Bytes) {
        let kill = {
            let st = self.state.lock();
            self.local_deliver(&st, msg, &Body::encoded(raw), 0).1
        };
        self.kill_slow(kill);
    }
}

/// Tells a publisher that `n` copies of its messages for other nodes were
/// dropped at a full send queue (counted per peer and subject in `skiff
/// stats --mesh`): a flushed publish then fails.
fn tell_dropped(me: &ClientOut, n: usize) {
    if n > 0 {
        me.control(ServerFrame::Error {
            corr: ASYNC_ERROR,
            code: Code::Limit,
            text: format!(
                "{n} message(s) not sent to another node: its send queue is full (mesh send_queue, send_policy)"
            ),
        });
    }
}

/// A subscription that was full, with the messages it has still to get.
type Blocked = (Arc<ClientOut>, u64, Vec<Body>);

/// Queues `run` to every subscription in `targets`, one outbox lock per
/// target, and empties it; notes whom to wake, who is blocked and whom to
/// close.
fn flush_run(
    st: &State,
    run: &mut Vec<Body>,
    targets: &[(SubId, u64)],
    woken: &mut Vec<u64>,
    blocked: &mut Vec<Blocked>,
    kill: &mut Vec<u64>,
) {
    if run.is_empty() {
        return;
    }
    for &(id, client) in targets {
        let Some(e) = st.subs.get(&id) else { continue };
        let (k, r) = e.out.push_run(e.sid, run);
        if k > 0 && !woken.contains(&client) {
            woken.push(client);
        }
        match r {
            Push::Full => blocked.push((e.out.clone(), e.sid, run[k..].to_vec())),
            Push::Kill => kill.push(client),
            _ => {}
        }
    }
    run.clear();
}
