//! Requests and replies. A request from a client of this node and one
//! forwarded by another node take one path: admission (each origin has its
//! limit), a token and its [`Pending`] entry, the cluster member(s) or
//! matching subscriptions it reaches, then replies relayed back to where it
//! came from until it is done. What differs is said where it differs: a
//! client's request to a subject is forwarded to other nodes too and may
//! wait for a full `block` subscription; another node's reaches local
//! responders only, never waits, and is answered with how many it reached.

use rand::RngExt;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use skiff_proto::client_frame::{req_flags, Code, ServerFrame, ASYNC_ERROR};
use skiff_proto::Message;

use super::cluster::{pick_local, release_members};
use super::{Broker, Pending, State, REMOTE};
use crate::outbox::{Body, ClientOut};

/// A request as a client or another node sent it.
#[derive(Debug)]
pub(super) struct Request {
    /// [`req_flags`].
    pub(super) flags: u8,
    /// Most replies wanted (scatter-gather), at least 1.
    pub(super) max: u32,
    /// A subject, or a cluster with [`req_flags::CLUSTER`].
    pub(super) target: String,
    /// A cluster request's affinity key (empty: none).
    pub(super) key: Bytes,
    /// The request.
    pub(super) msg: Message,
}

impl Request {
    fn to_cluster(&self) -> bool {
        self.flags & req_flags::CLUSTER != 0
    }

    fn many(&self) -> bool {
        self.flags & req_flags::MANY != 0
    }

    /// The message as subscriptions to the target subject get it.
    fn into_subject_message(self) -> Message {
        Message {
            subject: self.target.as_str().into(),
            ..self.msg
        }
    }
}

/// Where a request came from, so where its replies go.
#[derive(Debug, Clone, Copy)]
enum Origin<'a> {
    /// A client of this node and its request id.
    Client(&'a Arc<ClientOut>, u64),
    /// Another node and its token for the request.
    Node(SocketAddr, u64),
}

/// Why a request was not admitted.
enum Refused {
    /// The requesting client is closing: nothing to tell.
    Gone,
    /// A limit was reached: the client is told why.
    Limit(Code, String),
    /// Too many requests from other nodes in flight.
    Busy,
}

impl Broker {
    /// A client's request (`Req` frame): to cluster members (here or on
    /// other nodes) or to every matching subscription here and on other
    /// nodes with interest; "no responders" at once if it reaches none.
    pub(super) async fn request(&self, me: &Arc<ClientOut>, rid: u64, req: Request) {
        self.counters.requests.fetch_add(1, Relaxed);
        let refuse = |code, text: String| {
            me.control(ServerFrame::Error {
                corr: ASYNC_ERROR,
                code,
                text,
            });
            me.control(ServerFrame::ReqDone { rid, code });
        };
        if let Err((code, text)) = self.check_message(&req.msg, false) {
            return refuse(code, text);
        }
        if let Err((code, text)) = self.permit(me, super::Op::Publish, &req.target) {
            return refuse(code, text);
        }
        let token = {
            let mut st = self.state.lock();
            let (token, mut p) = match self.admit(&mut st, Origin::Client(me, rid), &req) {
                Ok(t) => t,
                Err(Refused::Limit(code, text)) => return refuse(code, text),
                Err(Refused::Gone | Refused::Busy) => return,
            };
            if req.to_cluster() {
                self.reach_members(&mut st, token, &mut p, &req, false);
            }
            // A request to a subject goes to other nodes with its local
            // delivery (`fan_out`), which chooses the queue groups' members
            // across the mesh.
            st.pending.insert(token, p);
            token
        };
        if !req.to_cluster() {
            let (flags, max) = (req.flags, req.max);
            let msg = req.into_subject_message();
            if let Err((code, text)) = self.check_message(&msg, true) {
                self.finish(token, None);
                return refuse(code, text);
            }
            let msg = Arc::new(msg);
            self.fan_out(
                me,
                &msg,
                &Body::Val(msg.clone()),
                token,
                Some((token, flags, max)),
            )
            .await;
        }
        let none = self
            .state
            .lock()
            .pending
            .get(&token)
            .is_some_and(|p| p.expect == 0);
        if none {
            self.counters.no_responders.fetch_add(1, Relaxed);
            self.finish(token, Some(Code::NoResponders));
        }
    }

    /// A request another node forwarded (its token `origin`): to local
    /// responders only (of the queue groups, one member of each in
    /// `groups`, or of every group with `None`); tells that node how many
    /// were reached, and relays their replies.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn remote_request(
        &self,
        from: SocketAddr,
        origin: u64,
        flags: u8,
        max: u32,
        target: String,
        key: Bytes,
        groups: Option<Vec<String>>,
        msg: Message,
    ) {
        let Some(l) = self.mesh.get() else { return };
        let req = Request {
            flags,
            max,
            target,
            key,
            msg,
        };
        self.counters.requests.fetch_add(1, Relaxed);
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let (token, mut p) = match self.admit(st, Origin::Node(from, origin), &req) {
            Ok(t) => t,
            Err(_) => {
                drop(guard);
                l.done(from, origin, 0);
                return;
            }
        };
        let mut kill = Vec::new();
        if req.to_cluster() {
            self.reach_members(st, token, &mut p, &req, true);
        } else {
            let msg = Arc::new(req.into_subject_message());
            let groups = match &groups {
                Some(g) => super::pubsub::Groups::Chosen(g),
                None => super::pubsub::Groups::Here,
            };
            let (n, k) = self.local_deliver(st, &msg, &Body::Val(msg.clone()), token, groups);
            p.expect = n as u32;
            kill = k;
        }
        let reached = p.expect;
        if reached > 0 {
            st.pending.insert(token, p);
        }
        l.done(from, origin, reached);
        drop(guard);
        self.kill_slow(kill);
    }

    /// Admits a request within its origin's limit (a client's requests
    /// awaiting replies; all requests in flight for other nodes'): a new
    /// token and its entry, not yet inserted.
    fn admit(
        &self,
        st: &mut State,
        from: Origin<'_>,
        req: &Request,
    ) -> Result<(u64, Pending), Refused> {
        let (requester, rid, origin) = match from {
            Origin::Client(me, rid) => {
                let Some(c) = st.clients.get(&me.id) else {
                    return Err(Refused::Gone);
                };
                if c.requests.len() >= self.limits.load().max_requests {
                    let (code, text) = self.limit(format!(
                        "the client already has {} requests awaiting replies (max_requests)",
                        self.limits.load().max_requests
                    ));
                    return Err(Refused::Limit(code, text));
                }
                (me.id, rid, None)
            }
            Origin::Node(from, theirs) => {
                if st.pending.len() >= self.limits.load().max_requests {
                    // The other node is told none was reached.
                    self.counters.limit_hits.fetch_add(1, Relaxed);
                    return Err(Refused::Busy);
                }
                (0, 0, Some((from, theirs)))
            }
        };
        let rng = st.tokens.get_or_insert_with(token_rng);
        let token = loop {
            let t: u64 = rng.random();
            if t != 0 && !st.pending.contains_key(&t) {
                break t;
            }
        };
        if let Some(c) = st.clients.get_mut(&requester) {
            c.requests.insert(rid, token);
        }
        Ok((
            token,
            Pending {
                requester,
                rid,
                left: if req.many() { req.max.max(1) } else { 1 },
                expect: 0,
                members: Vec::new(),
                origin,
                replied: 0,
            },
        ))
    }

    /// Hands a cluster request to its member(s): every member with
    /// capacity (scatter-gather) or one by weighted round robin (by key
    /// affinity if given), only members on this node if `local_only`;
    /// counts their load. Members on other nodes get it over the mesh.
    fn reach_members(
        &self,
        st: &mut State,
        token: u64,
        p: &mut Pending,
        req: &Request,
        local_only: bool,
    ) {
        let target = &req.target;
        if req.many() {
            p.members = st
                .clusters
                .members(target)
                .filter(|m| !local_only || *m < REMOTE)
                .filter(|m| {
                    st.clusters
                        .weight(target, *m)
                        .is_some_and(|(cap, _)| cap > 0)
                })
                .collect();
        } else {
            let key = (!req.key.is_empty()).then_some(&req.key[..]);
            let picked = if local_only {
                pick_local(&mut st.clusters, target, key)
            } else {
                st.clusters.pick(target, key)
            };
            p.members.extend(picked);
        }
        // A member over its pending-bytes limit is not reached (counted in
        // its `dropped_control`): what waits for a member that does not
        // read stays bounded.
        p.members.retain(|&m| {
            if m >= REMOTE {
                return true;
            }
            let Some(c) = st.clients.get_mut(&m) else {
                return true;
            };
            let f = ServerFrame::Request {
                token,
                cluster: target.clone(),
                msg: req.msg.clone(),
            };
            let queued = c.out.control_bounded(f, 0);
            if queued {
                c.serving.insert(token);
            }
            queued
        });
        for &m in &p.members {
            if m >= REMOTE {
                if let (Some(l), Some(a)) = (self.mesh.get(), st.remote_addrs.get(&m)) {
                    l.request(*a, token, req.flags, req.max, target, &req.key, &req.msg);
                }
            }
            let load = st.load.entry(m).or_default();
            *load += 1;
            let load = *load;
            st.clusters.set_load(m, load);
        }
        p.expect = p.members.len() as u32;
    }

    /// A client cancels its request `rid`: it is forgotten (late replies
    /// are dropped).
    pub(super) fn cancel(&self, me: &Arc<ClientOut>, rid: u64) {
        let mut st = self.state.lock();
        let token = st
            .clients
            .get_mut(&me.id)
            .and_then(|c| c.requests.remove(&rid));
        if let Some((t, p)) = token.and_then(|t| st.pending.remove(&t).map(|p| (t, p))) {
            release_members(&mut st, &p.members);
            forget_queued(&st, t, &p.members);
        }
    }

    /// Forgets request `token`, telling the requester `done` if given.
    fn finish(&self, token: u64, done: Option<Code>) {
        let mut st = self.state.lock();
        let Some(p) = st.pending.remove(&token) else {
            return;
        };
        release_members(&mut st, &p.members);
        if let Some(c) = st.clients.get_mut(&p.requester) {
            c.requests.remove(&p.rid);
            if let Some(code) = done {
                c.out.control(ServerFrame::ReqDone { rid: p.rid, code });
            }
        }
        for m in p.members {
            if let Some(c) = st.clients.get_mut(&m) {
                c.serving.remove(&token);
            }
        }
    }

    /// A reply to request `token`, relayed to whoever asked (a client
    /// here or another node).
    pub(super) fn reply(&self, token: u64, msg: Message) {
        let mut st = self.state.lock();
        let st = &mut *st;
        let Some(p) = st.pending.get_mut(&token) else {
            return; // late or duplicate: the requester stopped waiting
        };
        self.counters.replies.fetch_add(1, Relaxed);
        p.left -= 1;
        p.replied += 1;
        p.expect = p.expect.saturating_sub(1);
        if let (Some((a, t)), Some(l)) = (p.origin, self.mesh.get()) {
            l.reply(a, t, &msg);
        }
        let done = if p.left == 0 {
            Some(None)
        } else if p.expect == 0 {
            Some(Some(Code::Complete))
        } else {
            None
        };
        let (requester, rid) = (p.requester, p.rid);
        // Forget the request (and release the members' load) before the
        // reply can reach the requester, so its next request sees the load
        // as it is.
        if done.is_some() {
            let p = st.pending.remove(&token).expect("present");
            release_members(st, &p.members);
            for m in p.members {
                if let Some(c) = st.clients.get_mut(&m) {
                    c.serving.remove(&token);
                }
            }
        }
        if let Some(c) = st.clients.get_mut(&requester) {
            c.out.control(ServerFrame::Reply { rid, msg });
            if let Some(code) = done {
                c.requests.remove(&rid);
                if let Some(code) = code {
                    c.out.control(ServerFrame::ReqDone { rid, code });
                }
            }
        }
    }

    /// A reply another node relayed for request `token`.
    pub(crate) fn remote_reply(&self, token: u64, msg: Message) {
        self.reply(token, msg);
    }

    /// Another node reached `reached` responders for request `token`.
    pub(crate) fn remote_done(&self, token: u64, reached: u32) {
        let code = {
            let mut st = self.state.lock();
            let Some(p) = st.pending.get_mut(&token) else {
                return;
            };
            p.expect = p.expect.saturating_sub(1).saturating_add(reached);
            if p.expect > 0 {
                return;
            }
            if p.replied == 0 {
                Code::NoResponders
            } else {
                Code::Complete
            }
        };
        if code == Code::NoResponders {
            self.counters.no_responders.fetch_add(1, Relaxed);
        }
        self.finish(token, Some(code));
    }
}

/// Drops request `token` from the queues of the members on this node it
/// was sent to and they have not taken yet (its requester left or
/// cancelled), so no member holds it for nobody.
pub(super) fn forget_queued(st: &State, token: u64, members: &[u64]) {
    for m in members {
        if let Some(c) = st.clients.get(m) {
            c.out.forget_request(token);
        }
    }
}

/// The generator of request tokens: ChaCha seeded from the OS (or, where
/// that fails, from the clock and process id, still unpredictable to a
/// client across the network).
fn token_rng() -> rand::rngs::StdRng {
    use rand::SeedableRng;
    let mut seed = [0u8; 32];
    if getrandom::fill(&mut seed).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        seed[..16].copy_from_slice(&t.to_le_bytes());
        seed[16..20].copy_from_slice(&std::process::id().to_le_bytes());
    }
    rand::rngs::StdRng::from_seed(seed)
}
