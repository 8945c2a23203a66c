//! Publish/subscribe: subscriptions, and publishes from clients (one by
//! one or in runs) and from other nodes, fanned out to every matching
//! subscription.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use bytestring::ByteString;
use skiff_proto::client_frame::{Code, Policy, ServerFrame, ASYNC_ERROR};
use skiff_proto::router::{SubId, Subject, Syntax};
use skiff_proto::{Message, WireError};

use std::net::SocketAddr;

use super::{Broker, State, SubEntry, REMOTE};
use crate::mesh::MeshLink;
use crate::outbox::{Body, ClientOut, Push};

/// A message from a client's `Pub` frame, for [`Broker::publish_batch`]:
/// its encoding, and the decoded message unless the encoding is the simple
/// kind [`skiff_proto::client_frame::simple_message`] reads in place; for
/// that kind its subject and payload length, read once here (routing
/// reads them several times per message).
#[derive(Debug)]
pub struct Published {
    /// The message's encoding (checked).
    pub raw: Bytes,
    /// The message, decoded, when it is not simple.
    pub msg: Option<Box<Message>>,
    /// A simple encoding's subject (checked UTF-8) and payload length;
    /// empty and 0 when `msg` is set.
    simple: (ByteString, usize),
}

impl Published {
    /// A publish frame's body (its op byte first), checked: the encoding
    /// is kept as a slice of `body` (no copy), and decoded only when it is
    /// not the simple kind.
    pub fn from_frame(body: Bytes, max_payload: usize) -> Result<Published, WireError> {
        Published::from_frame_after(body, max_payload, &mut LastSubject::default())
    }

    /// [`Published::from_frame`] for one of a client's publishes in turn
    /// (`last` is the client's): a simple message whose subject has the
    /// bytes of the subject the client repeats (held in `last`, checked
    /// before) is not checked as UTF-8 again, and takes `last`'s copy of it
    /// (no reference to the client's ring for the subject).
    pub fn from_frame_after(
        mut body: Bytes,
        max_payload: usize,
        last: &mut LastSubject,
    ) -> Result<Published, WireError> {
        // Past the op byte in place: no reference-count traffic.
        let op = 1.min(body.len());
        bytes::Buf::advance(&mut body, op);
        if let Some((span, len)) = skiff_proto::client_frame::simple_span(&body, max_payload) {
            if body[span.clone()] == *last.checked.as_bytes() {
                return Ok(Published::simple(body, last.checked.clone(), len));
            }
            if let Ok(subject) = ByteString::try_from(body.slice(span)) {
                last.saw(&subject);
                return Ok(Published::simple(body, subject, len));
            }
        }
        let msg = skiff_proto::wire::decode_message(&body, max_payload)?;
        Ok(Published::decoded(body, msg))
    }

    /// A message in the simple encoding `raw`, whose subject is `subject`
    /// and whose payload is the last `payload_len` bytes of `raw` (the
    /// caller wrote or checked `raw` so).
    pub fn simple(raw: Bytes, subject: ByteString, payload_len: usize) -> Published {
        Published {
            raw,
            msg: None,
            simple: (subject, payload_len),
        }
    }

    /// A message that is not in the simple encoding: `raw` is `msg`'s
    /// encoding.
    pub fn decoded(raw: Bytes, msg: Message) -> Published {
        Published {
            raw,
            msg: Some(Box::new(msg)),
            simple: (ByteString::new(), 0),
        }
    }

    /// (subject, type, payload length).
    fn parts(&self) -> (&str, Option<&str>, usize) {
        match &self.msg {
            Some(m) => (&m.subject, m.kind.as_deref(), m.payload.len()),
            None => (&self.simple.0, None, self.simple.1),
        }
    }
}

/// The subject a client's publishes repeat, checked as UTF-8 (at most
/// `MAX_SUBJECT` bytes), so a run of publishes on one subject is checked
/// once ([`Published::from_frame_after`]). Its copy is its own: holding a
/// slice of a client's ring would hold the ring's space.
#[derive(Debug, Default)]
pub struct LastSubject {
    /// The subject seen twice in a row (empty: none; no subject is).
    checked: ByteString,
    /// The previous publish's subject, when it was not `checked`.
    seen: Vec<u8>,
}

impl LastSubject {
    /// A checked subject that was not `checked`: it becomes `checked` when
    /// the previous publish had it too (one copy per run of a subject, none
    /// per message when every subject differs).
    fn saw(&mut self, subject: &str) {
        if self.seen == subject.as_bytes() {
            self.checked = ByteString::from(subject);
            self.seen.clear();
        } else {
            self.seen.clear();
            self.seen.extend_from_slice(subject.as_bytes());
        }
    }
}

/// How a match treats queue groups (NATS `SUB subject group sid`).
pub(super) enum Groups<'a> {
    /// One member of each group across the mesh: a subscription here, or
    /// another node chosen for the group (appended here with the group,
    /// for a group frame to that node). A client's publish.
    Mesh(&'a mut Vec<(SocketAddr, Arc<str>)>),
    /// One member of each group among this node's subscriptions: a
    /// request from a node that sent it to every node with members (a
    /// plain request frame, from nodes before group requests).
    Here,
    /// One member of each of these groups among this node's
    /// subscriptions, none of the others: a request from another node,
    /// which chose this node for these groups (a group request frame).
    Chosen(&'a [String]),
    /// No group member: a publish another node forwarded (that node chose
    /// for the groups, and sends a group frame to the node it chose).
    Skip,
}

/// The subject of the mesh interest that says a node has members of
/// queue group `group` subscribed to `pattern` (or, with a subject for
/// `pattern`, what a message on it matches): `_SKIFF_QUEUE.<tokens of the
/// group>.<group>.<pattern>`. Nodes advertise it besides the pattern
/// itself, so a publishing node knows which nodes have members of which
/// group for a subject.
pub(super) fn queue_interest(group: &str, pattern: &str) -> String {
    let n = group.split('.').count();
    format!("{QUEUE_PREFIX}.{n}.{group}.{pattern}")
}

/// The first token of [`queue_interest`] subjects.
const QUEUE_PREFIX: &str = "_SKIFF_QUEUE";

/// Which member of a queue group gets a message.
enum Pick {
    /// This subscription here.
    Here(SubId, u64),
    /// The node at this address (a group frame).
    Node(SocketAddr),
    None,
}

/// Chooses the member of group `group` that gets a message: among the
/// matching subscriptions here (`here`: router id, client) and the nodes
/// with matching members (`nodes`: cluster member id, address), by the
/// cluster's capacity-weighted choice (the group is the skiff cluster of
/// the same name: clients here weigh their capacity, other nodes what they
/// advertise); among a client's several subscriptions in the group by
/// its own round robin (`sub_turns`: client → turn), and in a group whose
/// members are not cluster members (a join refused) by round robin
/// (`turn`).
fn pick_member(
    clusters: &mut skiff_proto::router::Clusters<u64>,
    sub_turns: &mut rustc_hash::FxHashMap<u64, u32>,
    group: &str,
    here: &[(SubId, u64)],
    nodes: &[(u64, SocketAddr)],
    turn: usize,
) -> Pick {
    let picked = clusters.pick_where(group, None, |m| {
        if m >= REMOTE {
            nodes.iter().any(|n| n.0 == m)
        } else {
            here.iter().any(|h| h.1 == m)
        }
    });
    match picked {
        Some(m) if m >= REMOTE => nodes
            .iter()
            .find(|n| n.0 == m)
            .map_or(Pick::None, |n| Pick::Node(n.1)),
        Some(c) => {
            let mine = here.iter().filter(|h| h.1 == c).count();
            let k = if mine > 1 {
                let t = sub_turns.entry(c).or_default();
                *t = t.wrapping_add(1);
                *t as usize % mine
            } else {
                0
            };
            here.iter()
                .filter(|h| h.1 == c)
                .nth(k)
                .map_or(Pick::None, |h| Pick::Here(h.0, h.1))
        }
        None => {
            let n = here.len() + nodes.len();
            if n == 0 {
                return Pick::None;
            }
            let k = turn % n;
            match here.get(k) {
                Some(h) => Pick::Here(h.0, h.1),
                None => Pick::Node(nodes[k - here.len()].1),
            }
        }
    }
}

impl Broker {
    /// Calls `each` with every subscription a message on `subject` of type
    /// `kind` reaches: each plain one, and of each queue group one member
    /// as `groups` says (here, or on another node: see [`Groups::Mesh`]).
    /// `no_echo`: a client whose own subscriptions are skipped (it
    /// publishes and asked not to get its messages back). Returns whether
    /// a queue group was involved (then the choice is per message, and a
    /// match must not be reused for the next message).
    pub(super) fn route(
        &self,
        st: &mut State,
        subject: Subject<'_>,
        kind: Option<&str>,
        no_echo: Option<u64>,
        mut groups: Groups<'_>,
        mut each: impl FnMut(SubId, u64),
    ) -> bool {
        let State {
            router,
            subs,
            clusters,
            remote_ids,
            remote_clusters,
            sub_turns,
            ..
        } = st;
        let skip = matches!(groups, Groups::Skip);
        let chosen = match &groups {
            Groups::Chosen(c) => Some(*c),
            _ => None,
        };
        let mut grouped: Vec<(&str, SubId, u64)> = Vec::new();
        router.for_each_match(subject, kind, |id, client| {
            if Some(client) == no_echo {
                return;
            }
            match subs.get(&id).and_then(|e| e.group.as_deref()) {
                Some(_) if skip => {}
                Some(g) if chosen.is_some_and(|c| !c.iter().any(|x| x == g)) => {}
                Some(g) => grouped.push((g, id, client)),
                None => each(id, client),
            }
        });
        // Groups with members on other nodes for this subject: each node
        // advertises its members' patterns under `queue_interest`. (The
        // routing lock, then the mesh's `core`: the order every broker
        // path takes; the mesh never calls the broker holding its locks.)
        let mut remote: Vec<(&str, Vec<(u64, SocketAddr)>)> = Vec::new();
        if let (Groups::Mesh(_), Some(m)) = (&groups, self.mesh.get()) {
            for g in remote_clusters.keys() {
                let peers = m.route(&queue_interest(g, subject.as_str()), None);
                let nodes: Vec<(u64, SocketAddr)> = peers
                    .into_iter()
                    .filter_map(|a| remote_ids.get(&a).map(|&id| (id, a)))
                    .collect();
                if !nodes.is_empty() {
                    remote.push((g, nodes));
                }
            }
        }
        if grouped.is_empty() && remote.is_empty() {
            return false;
        }
        grouped.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        let mut names: Vec<&str> = grouped
            .iter()
            .map(|x| x.0)
            .chain(remote.iter().map(|r| r.0))
            .collect();
        names.sort_unstable();
        names.dedup();
        let mut here: Vec<(SubId, u64)> = Vec::new();
        for g in names {
            here.clear();
            here.extend(
                grouped
                    .iter()
                    .filter(|x| x.0 == g)
                    .map(|&(_, id, client)| (id, client)),
            );
            let nodes = remote
                .iter()
                .find(|r| r.0 == g)
                .map_or(&[][..], |r| &r.1[..]);
            let turn = self.group_turn.fetch_add(1, Relaxed) as usize;
            match pick_member(clusters, sub_turns, g, &here, nodes, turn) {
                Pick::Here(id, client) => each(id, client),
                Pick::Node(a) => {
                    if let Groups::Mesh(out) = &mut groups {
                        out.push((a, g.into()));
                    }
                }
                Pick::None => {}
            }
        }
        true
    }

    /// A message another node chose this node for, for one member of
    /// queue group `group` here; dropped and counted (`remote_drops`)
    /// when no member matches any more or its queue is full.
    pub(crate) fn deliver_group(&self, group: &str, msg: Message) {
        let Ok(subject) = Subject::new(&msg.subject) else {
            self.remote_drops.fetch_add(1, Relaxed);
            return;
        };
        let mut kill = Vec::new();
        {
            let mut st = self.state.lock();
            let State {
                router,
                subs,
                clusters,
                sub_turns,
                ..
            } = &mut *st;
            let mut here: Vec<(SubId, u64)> = Vec::new();
            router.for_each_match(subject, msg.kind.as_deref(), |id, client| {
                if subs.get(&id).and_then(|e| e.group.as_deref()) == Some(group) {
                    here.push((id, client));
                }
            });
            let turn = self.group_turn.fetch_add(1, Relaxed) as usize;
            let Pick::Here(id, client) = pick_member(clusters, sub_turns, group, &here, &[], turn)
            else {
                self.remote_drops.fetch_add(1, Relaxed);
                return;
            };
            let Some(e) = subs.get(&id) else { return };
            let msg = Arc::new(msg);
            match e.out.push(e.sid, 0, &Body::Val(msg)) {
                Push::Written => {}
                Push::Queued => e.out.wake(),
                Push::Dropped => e.out.wake(),
                Push::Full | Push::Gone => {
                    self.remote_drops.fetch_add(1, Relaxed);
                }
                Push::Kill => kill.push(client),
            }
        }
        self.kill_slow(kill);
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
        // Other nodes learn of a queue subscription by its interest under
        // `queue_interest`, which must be a pattern too.
        if let Some(g) = &group {
            if let Err(e) = skiff_proto::router::Pattern::new(&queue_interest(g, &pattern)) {
                return Err((
                    Code::Invalid,
                    format!("queue group {g:?} with pattern {pattern:?}: {e}"),
                ));
            }
        }
        // The queue exists before the interest, so nothing matched is lost.
        me.add_sub(sid, queue as usize, policy, credit);
        match st.router.subscribe_as(syntax, &pattern, &kind, me.id) {
            Ok(id) => {
                if let Some(m) = self.mesh.get() {
                    m.add_interest(syntax, &pattern, &kind, lossy);
                    if let Some(g) = &group {
                        m.add_interest(Syntax::Tokens, &queue_interest(g, &pattern), "*", false);
                    }
                }
                st.subs.insert(
                    id,
                    SubEntry {
                        out: me.clone(),
                        sid,
                        group,
                    },
                );
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

    /// Queues `msg` to every subscription matching its subject and type,
    /// and hands it to the mesh: a publish to every node with interest; a
    /// request (`pending`: its token, flags and most replies) to every
    /// node with interest as a group request naming the queue groups this
    /// node chose that node for (each group gets it once in the whole
    /// mesh), each such node counted as one more expected `done`. Returns
    /// how many matched here. Waits (with no lock held) for full `block`
    /// subscriptions.
    pub(super) async fn fan_out(
        &self,
        me: &Arc<ClientOut>,
        msg: &Message,
        body: &Body,
        token: u64,
        pending: Option<(u64, u8, u32)>,
    ) -> usize {
        let Ok(subject) = Subject::new(&msg.subject) else {
            return 0;
        };
        let mut blocked: Vec<(Arc<ClientOut>, u64)> = Vec::new();
        let mut kill: Vec<u64> = Vec::new();
        let mut matched = 0usize;
        // Queue groups this publish goes to on other nodes.
        let mut picks: Vec<(SocketAddr, Arc<str>)> = Vec::new();
        {
            let mut st = self.state.lock();
            let st = &mut *st;
            if let Some(c) = st.clients.get_mut(&me.id) {
                c.published += 1;
            }
            let no_echo = me.no_echo().then_some(me.id);
            let mut hits: Vec<(SubId, u64)> = Vec::new();
            self.route(
                st,
                subject,
                msg.kind.as_deref(),
                no_echo,
                Groups::Mesh(&mut picks),
                |id, client| hits.push((id, client)),
            );
            for (id, client) in hits {
                let Some(e) = st.subs.get(&id) else { continue };
                matched += 1;
                match e.out.push(e.sid, token, body) {
                    Push::Written => {}
                    Push::Queued | Push::Dropped => e.out.wake(),
                    Push::Full => blocked.push((e.out.clone(), e.sid)),
                    Push::Kill => kill.push(client),
                    Push::Gone => matched -= 1,
                }
            }
            if let Some((t, flags, max)) = pending {
                // Other nodes with matching interest, and those chosen for
                // a group: each answers with how many it reached (a `done`
                // frame), then their replies.
                let mut sent = 0u32;
                if let Some(m) = self.mesh.get() {
                    let mut nodes = m.route(&msg.subject, msg.kind.as_deref());
                    for (a, _) in &picks {
                        if !nodes.contains(a) {
                            nodes.push(*a);
                        }
                    }
                    let mut mine: Vec<&str> = Vec::new();
                    for a in nodes {
                        mine.clear();
                        mine.extend(picks.iter().filter(|p| p.0 == a).map(|p| &*p.1));
                        if m.group_request(a, t, flags, max, &msg.subject, &mine, msg) {
                            sent += 1;
                        }
                    }
                }
                if let Some(p) = st.pending.get_mut(&t) {
                    p.expect += matched as u32 + sent;
                }
            }
            if pending.is_none() {
                if let Some(m) = self.mesh.get() {
                    let mut raw = Vec::new();
                    skiff_proto::wire::encode_message(&mut raw, msg, false);
                    let sent = m.publish(&msg.subject, msg.kind.as_deref(), &raw);
                    let lost = picks
                        .drain(..)
                        .filter(|(a, g)| !m.publish_group(*a, g, &msg.subject, &raw))
                        .count();
                    tell_dropped(me, sent.dropped + lost);
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
        self.publish_run(me, batch, mesh.map(|m| &**m), false).await
    }

    /// Messages other nodes published, as [`Broker::publish_batch`] does
    /// for a client's, to local subscriptions only (`me` is the node's
    /// mesh client, whose counters they go to). A full `block`
    /// subscription makes the mesh wait, which holds the publishing nodes
    /// back through their flow-control windows.
    pub(crate) async fn publish_remote(&self, me: &Arc<ClientOut>, batch: &mut Vec<Published>) {
        self.publish_run(me, batch, None, true).await
    }

    async fn publish_run(
        &self,
        me: &Arc<ClientOut>,
        batch: &mut Vec<Published>,
        forward: Option<&MeshLink>,
        from_mesh: bool,
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
        // Of those, the ones for one member of a queue group on a node
        // this node chose: (index, node, group).
        let mut to_groups: Vec<(usize, SocketAddr, Arc<str>)> = Vec::new();
        let mut picks: Vec<(SocketAddr, Arc<str>)> = Vec::new();
        let mut i = 0;
        while i < batch.len() {
            {
                let mut st = self.state.lock();
                let st = &mut *st;
                let mut prev: Option<usize> = None;
                // Whether the previous match reached a queue group (each
                // message then picks its member anew).
                let mut grouped = false;
                let no_echo = me.no_echo().then_some(me.id);
                let mut published = 0u64;
                // Loaded once per round: a reload applies from the next.
                let limits = self.limits.load();
                fwd.clear();
                to_groups.clear();
                while i < batch.len() && blocked.is_empty() && kill.is_empty() {
                    let p = &batch[i];
                    i += 1;
                    let (subject, kind, payload) = p.parts();
                    let same = !grouped
                        && prev.is_some_and(|q| {
                            let (s, k, _) = batch[q].parts();
                            s == subject && k == kind
                        });
                    // A subject seen just before was checked and matched.
                    if let Err((code, text)) =
                        self.check_parts(&limits, subject, kind, payload, !same, same)
                    {
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
                        // A client's publish: its node chooses for the
                        // queue groups across the mesh; another node's:
                        // that node chose.
                        let groups = if from_mesh {
                            Groups::Skip
                        } else {
                            Groups::Mesh(&mut picks)
                        };
                        grouped = self.route(st, subject, kind, no_echo, groups, |id, client| {
                            targets.push((id, client))
                        });
                        to_groups.extend(picks.drain(..).map(|(a, g)| (i - 1, a, g)));
                        prev = Some(i - 1);
                    }
                    published += 1;
                    if forward.is_some() {
                        fwd.push(i - 1);
                    }
                    Body::push_encoded(&mut run, &p.raw);
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
                // An shm client's publishes are slices of its ring: the
                // mesh splices them (holding that ring space until the
                // peer has them) instead of copying them.
                let splice = me.ring_input() && m.splices();
                let sent = m.publish_many(fwd.iter().map(|&k| {
                    let p = &batch[k];
                    let (subject, kind, _) = p.parts();
                    (subject, kind, &p.raw[..], splice.then_some(&p.raw))
                }));
                let lost = to_groups
                    .drain(..)
                    .filter(|(k, a, g)| {
                        let p = &batch[*k];
                        !m.publish_group(*a, g, p.parts().0, &p.raw)
                    })
                    .count();
                tell_dropped(me, sent.dropped + lost);
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
                tokio::select! {
                    _ = out.wait_space_run(sid, &rest) => {}
                    _ = me.closed() => {
                        batch.clear();
                        return;
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
            let group = st.subs.remove(&id).and_then(|e| e.group);
            if let Some(m) = self.mesh.get() {
                m.remove_interest(syntax, &pattern, &kind, lossy);
                if let Some(g) = &group {
                    m.remove_interest(Syntax::Tokens, &queue_interest(g, &pattern), "*", false);
                }
            }
            if let Some(g) = group {
                self.group_sub_removed(&mut st, me.id, &g);
            }
        }
        drop(st);
        me.remove_sub(sid);
    }

    /// Queues `body` to every local subscription matching `msg` (with
    /// request `token`, 0 for a publish), queue groups as `groups` says; a
    /// full subscription drops it and counts it (the mesh task never
    /// waits). Returns how many it reached.
    pub(super) fn local_deliver(
        &self,
        st: &mut State,
        msg: &Message,
        body: &Body,
        token: u64,
        groups: Groups<'_>,
    ) -> (usize, Vec<u64>) {
        let Ok(subject) = Subject::new(&msg.subject) else {
            return (0, Vec::new());
        };
        let (mut n, mut kill) = (0, Vec::new());
        let mut hits: Vec<(SubId, u64)> = Vec::new();
        self.route(
            st,
            subject,
            msg.kind.as_deref(),
            None,
            groups,
            |id, client| hits.push((id, client)),
        );
        for (id, client) in hits {
            let Some(e) = st.subs.get(&id) else { continue };
            match e.out.push(e.sid, token, body) {
                Push::Written => n += 1,
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
        }
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
            let mut st = self.state.lock();
            self.local_deliver(&mut st, msg, &Body::encoded(raw), 0, Groups::Skip)
                .1
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
        if k > 0 && r != Push::Written && !woken.contains(&client) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Pub` frame's body with a simple message: subject bytes, payload.
    fn body(subject: &[u8], payload: &[u8]) -> Bytes {
        // The op byte of `Pub`, as a client encodes it.
        let mut b = Vec::new();
        skiff_proto::client_frame::encode_pub(&mut b, &Message::new("x", Bytes::new()));
        let mut b = vec![b[4], 1];
        skiff_proto::varint::put(&mut b, subject.len() as u64);
        b.extend_from_slice(subject);
        skiff_proto::varint::put(&mut b, payload.len() as u64);
        b.extend_from_slice(payload);
        b.into()
    }

    /// A run of publishes on one subject is checked until it repeats,
    /// then read from the client's copy; a subject that is not UTF-8 is
    /// refused after one that was, however alike.
    #[test]
    fn last_subject_skips_only_the_same_bytes() {
        let mut last = LastSubject::default();
        for n in 0..4 {
            let p = Published::from_frame_after(body(b"a.b", b"x"), 64, &mut last).unwrap();
            assert!(p.msg.is_none());
            assert_eq!(p.parts(), ("a.b", None, 1));
            // Checked twice, then the copy.
            assert_eq!(&*last.checked, if n == 0 { "" } else { "a.b" });
        }
        assert!(Published::from_frame_after(body(b"a.\xff", b"x"), 64, &mut last).is_err());
        assert!(Published::from_frame(body(b"a.\xff", b"x"), 64).is_err());
        assert_eq!(&*last.checked, "a.b");
        let p = Published::from_frame_after(body(b"c", b""), 64, &mut last).unwrap();
        assert_eq!(p.parts(), ("c", None, 0));
        assert_eq!((&*last.checked, &last.seen[..]), ("a.b", &b"c"[..]));
        // Over the payload limit: decoded, which refuses it.
        assert!(Published::from_frame_after(body(b"a.b", b"xy"), 1, &mut last).is_err());
        // Alternating subjects: no copy made.
        let mut alt = LastSubject::default();
        for s in [&b"p"[..], b"q", b"p", b"q"] {
            Published::from_frame_after(body(s, b""), 64, &mut alt).unwrap();
            assert_eq!(&*alt.checked, "");
        }
    }
}
