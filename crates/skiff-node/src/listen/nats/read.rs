//! The reading half of a NATS connection ([`Reader`]): the parser's
//! operations to the session and the broker (publishes, subscriptions,
//! requests and their replies, `CONNECT` after the first), in the order
//! the client sent them.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use rustc_hash::FxHashMap;
use tokio::time::Instant;

use skiff_proto::client_frame::{req_flags, ClientFrame, Code, Policy};
use skiff_proto::nats::{self, ConnectOptions, Op, Parser};
use skiff_proto::router::Pattern;
use skiff_proto::{Field, Message, Value};

use super::{
    authenticate, Conn, NatsSub, Parsed, DESCRIPTION_HEADER, REPLY_PREFIX, REQUEST_TTL,
    STATUS_HEADER, SUB_CREDIT, SUB_QUEUE, TYPE_HEADER,
};
use crate::auth::{Auth, User};
use crate::broker::{Broker, Published};
use crate::outbox::ClientOut;
use crate::session::Session;

/// The reading half of a connection: the parser's output, to the session
/// and the broker.
pub(super) struct Reader {
    pub(super) broker: Arc<Broker>,
    pub(super) out: Arc<ClientOut>,
    pub(super) conn: Arc<Conn>,
    pub(super) session: Session,
    pub(super) parser: Parser,
    /// Where publishes are encoded as skiff messages (one allocation per
    /// many).
    pub(super) arena: BytesMut,
    /// The subject of the client's last plain publish, checked (a copy:
    /// it holds no read buffer).
    pub(super) last_subject: bytestring::ByteString,
    pub(super) opts: ConnectOptions,
    /// The client's sid → skiff sid.
    pub(super) by_sid: FxHashMap<Bytes, u64>,
    pub(super) next_sid: u64,
    pub(super) next_rid: u64,
    /// Requests in the order they were made, with when.
    pub(super) order: VecDeque<(u64, Instant)>,
    /// Queue groups this client is in → its subscriptions in each.
    pub(super) groups: FxHashMap<Arc<str>, u32>,
    pub(super) auth: Arc<Auth>,
    /// The nonce sent in `INFO` while the client has not authenticated
    /// (`None` once it has, or when the node has no users). Who the
    /// client is, and what it may do, is its outbox's user (a reload may
    /// change it).
    pub(super) nonce: Option<String>,
}

impl Reader {
    /// Everything whole in `buf`, in order. `Err`: close with this
    /// `-ERR` text.
    pub(super) async fn read(&mut self, buf: &mut BytesMut) -> Result<(), &'static str> {
        // The client's user for a run of plain publishes: loaded once per
        // run (a reload's new permissions apply from the next read, or
        // the next operation of another kind).
        let mut user: Option<Arc<User>> = None;
        loop {
            // The common operation, a plain publish, read in place: no
            // `Bytes` made for its line, subject and payload. (Replies
            // to `_SKIFF_REPLY.` subjects take the general way.)
            if self.nonce.is_none() {
                if let Some(pp) = self.parser.plain_pub(buf) {
                    let subject = &buf[pp.subject.clone()];
                    if !subject.starts_with(REPLY_PREFIX.as_bytes()) {
                        let u = &*user
                            .get_or_insert_with(|| arc_swap::Guard::into_inner(self.out.user()));
                        self.publish_plain(u, subject, &buf[pp.payload.clone()])
                            .await?;
                        bytes::Buf::advance(buf, pp.len);
                        if self.opts.verbose {
                            self.conn.say(nats::OK);
                        }
                        continue;
                    }
                }
            }
            user = None;
            let op = match self.parser.next(buf) {
                Ok(Some(op)) => op,
                Ok(None) => break,
                Err(e) => {
                    self.flush().await?;
                    self.broker.protocol_error();
                    return Err(e.text());
                }
            };
            if self.nonce.is_some() && !matches!(op, Op::Connect(_)) {
                // nats-server: anything before CONNECT on a node with
                // users is an authorization violation.
                self.auth.count_failure();
                return Err("Authorization Violation");
            }
            let ok = self.opts.verbose;
            match op {
                Op::Pub {
                    subject,
                    reply,
                    headers,
                    payload,
                } => {
                    self.publish(subject, reply, headers, payload).await?;
                }
                Op::Ping => {
                    self.flush().await?;
                    self.conn.say(nats::PONG);
                    continue;
                }
                Op::Pong | Op::Ignored => continue,
                Op::Connect(json) => {
                    let o = ConnectOptions::parse(&json).map_err(|e| {
                        self.broker.protocol_error();
                        e.text()
                    })?;
                    if let Some(nonce) = self.nonce.take() {
                        let user = authenticate(&self.auth, &o, nonce).await?;
                        self.broker
                            .set_user(&self.out, user)
                            .map_err(|_| "Authorization Violation")?;
                    }
                    self.broker.set_name(self.out.id, &o.name);
                    self.out.set_no_echo(!o.echo);
                    {
                        let mut sh = self.conn.shared.lock();
                        sh.headers = o.headers;
                        sh.no_responders = o.no_responders;
                    }
                    self.opts = o;
                    if self.opts.verbose {
                        self.conn.say(nats::OK);
                    }
                    continue;
                }
                Op::Sub {
                    subject,
                    queue,
                    sid,
                } => {
                    self.flush().await?;
                    if !self.subscribe(subject, queue, sid) {
                        continue;
                    }
                }
                Op::Unsub { sid, max } => {
                    self.flush().await?;
                    self.unsubscribe(sid, max);
                }
            }
            if ok {
                self.conn.say(nats::OK);
            }
        }
        self.flush().await
    }

    /// Hands the session's run of publishes to the broker.
    async fn flush(&mut self) -> Result<(), &'static str> {
        while let Some(e) = self.session.poll_event(&mut Parsed) {
            crate::listen::act(&self.broker, &self.out, &mut self.session, e)
                .await
                .map_err(|_| "Unknown Protocol Operation")?;
        }
        Ok(())
    }

    async fn publish(
        &mut self,
        subject: Bytes,
        reply: Option<Bytes>,
        headers: Option<Bytes>,
        payload: Bytes,
    ) -> Result<(), &'static str> {
        if self.opts.pedantic && !nats::valid_literal_subject(&subject) {
            self.conn.err("Invalid Publish Subject");
            return Ok(());
        }
        let Ok(subject_str) = bytestring::ByteString::try_from(subject.clone()) else {
            // Not UTF-8: no skiff subject can match it; counted.
            self.broker.limit_hit();
            return Ok(());
        };
        if !self.may_publish(&self.out.user(), &subject_str) {
            return Ok(());
        }
        // A reply to a request a NATS client was handed.
        if let Some(token) = subject_str
            .strip_prefix(REPLY_PREFIX)
            .and_then(|t| t.parse::<u64>().ok())
        {
            let Some(msg) = self.message(subject_str, headers, payload) else {
                return Ok(());
            };
            self.flush().await?;
            return crate::listen::handle(
                &self.broker,
                &self.out,
                ClientFrame::Reply { token, msg },
            )
            .await
            .map_err(|_| "Unknown Protocol Operation");
        }
        if let Some(reply) = reply {
            let Some(msg) = self.message(subject_str.clone(), headers, payload) else {
                return Ok(());
            };
            self.flush().await?;
            return self.request(subject_str, reply, msg).await;
        }
        let p = match headers {
            None => self.simple(subject_str, &payload),
            Some(h) => {
                let Some(msg) = self.message(subject_str, Some(h), payload) else {
                    return Ok(());
                };
                let mut raw = Vec::with_capacity(skiff_proto::wire::encoded_len(&msg, false));
                skiff_proto::wire::encode_message(&mut raw, &msg, false);
                Published::decoded(raw.into(), msg)
            }
        };
        if let Some(e) = self.session.handle_publish(p) {
            crate::listen::act(&self.broker, &self.out, &mut self.session, e)
                .await
                .map_err(|_| "Unknown Protocol Operation")?;
        }
        Ok(())
    }

    /// A plain `PUB` (no reply subject, no headers, a subject that is
    /// not a `_SKIFF_REPLY.` one), its subject and payload read in place:
    /// what [`Reader::publish`] does with it, without its `Bytes`. A
    /// client's repeated subject is checked as UTF-8 once.
    async fn publish_plain(
        &mut self,
        user: &User,
        subject: &[u8],
        payload: &[u8],
    ) -> Result<(), &'static str> {
        if self.opts.pedantic && !nats::valid_literal_subject(subject) {
            self.conn.err("Invalid Publish Subject");
            return Ok(());
        }
        let subject_str = if subject == self.last_subject.as_bytes() {
            self.last_subject.clone()
        } else {
            let Ok(s) = std::str::from_utf8(subject) else {
                // Not UTF-8: no skiff subject can match it; counted.
                self.broker.limit_hit();
                return Ok(());
            };
            self.last_subject = s.into();
            self.last_subject.clone()
        };
        if !self.may_publish(user, &subject_str) {
            return Ok(());
        }
        let p = self.simple(subject_str, payload);
        if let Some(e) = self.session.handle_publish(p) {
            crate::listen::act(&self.broker, &self.out, &mut self.session, e)
                .await
                .map_err(|_| "Unknown Protocol Operation")?;
        }
        Ok(())
    }

    /// Whether the client may publish to `subject` (else `-ERR` was sent
    /// and the denial counted).
    fn may_publish(&self, user: &User, subject: &str) -> bool {
        let p = &user.permissions;
        let open = p.publish.allow.is_none() && p.publish.deny.is_empty();
        let allowed = open
            || if subject.starts_with(REPLY_PREFIX) {
                p.allow_responses || p.may_publish(subject)
            } else {
                p.may_publish(subject)
            };
        if !allowed {
            user.denied.publish.fetch_add(1, Relaxed);
            self.conn.err(&format!(
                "Permissions Violation for Publish to {:?}",
                subject
            ));
        }
        allowed
    }

    /// A message of a subject (checked) and a payload, in the simple
    /// encoding as `client_frame::simple_message` reads it (subject flag,
    /// subject, payload), written into the arena.
    fn simple(&mut self, subject: bytestring::ByteString, payload: &[u8]) -> Published {
        let a = &mut self.arena;
        let need = subject.len() + payload.len() + 21;
        if a.capacity() - a.len() < need {
            // A fresh block for many messages (what was split off
            // stays with the messages that hold it).
            a.reserve(need.max(64 * 1024));
        }
        a.put_u8(1);
        skiff_proto::varint::put_buf(a, subject.len() as u64);
        a.extend_from_slice(subject.as_bytes());
        skiff_proto::varint::put_buf(a, payload.len() as u64);
        a.extend_from_slice(payload);
        // The subject as read (checked), not read back.
        Published::simple(a.split().freeze(), subject, payload.len())
    }

    /// A skiff message from a NATS publish; `None` (counted) when its
    /// headers do not parse or do not fit skiff's fields.
    fn message(
        &self,
        subject: bytestring::ByteString,
        headers: Option<Bytes>,
        payload: Bytes,
    ) -> Option<Message> {
        let mut msg = Message {
            subject,
            payload,
            ..Message::default()
        };
        if let Some(h) = headers {
            let Ok(h) = nats::parse_headers(&h) else {
                self.broker.protocol_error();
                return None;
            };
            if let Some(s) = h.status {
                msg.fields.push(Field {
                    key: STATUS_HEADER.into(),
                    value: Value::Str(s.to_string().into()),
                });
                if !h.description.is_empty() {
                    msg.fields
                        .push(field(DESCRIPTION_HEADER.into(), h.description));
                }
            }
            for (name, value) in h.fields {
                let Ok(name) = bytestring::ByteString::try_from(name) else {
                    self.broker.protocol_error();
                    return None;
                };
                if &*name == TYPE_HEADER && msg.kind.is_none() {
                    msg.kind = bytestring::ByteString::try_from(value).ok();
                    continue;
                }
                msg.fields.push(field(name, value));
            }
            if skiff_proto::wire::check(&msg).is_err() {
                self.broker.limit_hit();
                return None;
            }
        }
        Some(msg)
    }

    /// A NATS publish with a reply subject: a request to the subject.
    async fn request(
        &mut self,
        subject: bytestring::ByteString,
        reply: Bytes,
        msg: Message,
    ) -> Result<(), &'static str> {
        // Room for it within `max_requests`: the oldest is forgotten.
        while self.order.len() >= self.broker.limits().max_requests.max(1) {
            let (rid, _) = self.order.pop_front().expect("not empty");
            self.forget(rid).await?;
        }
        let rid = self.next_rid;
        self.next_rid += 1;
        self.conn.shared.lock().requests.insert(rid, reply);
        self.order.push_back((rid, Instant::now()));
        let f = ClientFrame::Req {
            rid,
            flags: req_flags::MANY,
            max: u32::MAX,
            target: subject.to_string(),
            key: Bytes::new(),
            msg,
        };
        let e = self.session.handle_frame(f);
        crate::listen::act(&self.broker, &self.out, &mut self.session, e)
            .await
            .map_err(|_| "Unknown Protocol Operation")?;
        self.flush().await
    }

    /// Stops waiting for replies to `rid`, if still waiting.
    async fn forget(&mut self, rid: u64) -> Result<(), &'static str> {
        if self.conn.shared.lock().requests.remove(&rid).is_some() {
            crate::listen::handle(&self.broker, &self.out, ClientFrame::Cancel { rid })
                .await
                .map_err(|_| "Unknown Protocol Operation")?;
        }
        Ok(())
    }

    /// Forgets requests older than [`REQUEST_TTL`].
    pub(super) async fn forget_old_requests(&mut self, now: Instant) {
        while let Some(&(rid, at)) = self.order.front() {
            if now.duration_since(at) < REQUEST_TTL {
                break;
            }
            self.order.pop_front();
            let _ = self.forget(rid).await;
        }
        // Those already answered leave no trace in `order` for long.
        if self.order.len() > 64 {
            let sh = self.conn.shared.lock();
            self.order.retain(|(rid, _)| sh.requests.contains_key(rid));
        }
    }

    /// `SUB`; whether it was taken (else `-ERR` was sent).
    fn subscribe(&mut self, subject: Bytes, queue: Option<Bytes>, sid: Bytes) -> bool {
        let pattern = match std::str::from_utf8(&subject) {
            Ok(p) if nats::valid_subject(&subject) && Pattern::new(p).is_ok() => p.to_owned(),
            _ => {
                self.conn.err("Invalid Subject");
                return false;
            }
        };
        let group: Option<Arc<str>> = match queue.as_deref().map(std::str::from_utf8) {
            None => None,
            Some(Ok(g)) if nats::valid_literal_subject(g.as_bytes()) => Some(g.into()),
            Some(_) => {
                self.conn.err("Invalid Queue Name");
                return false;
            }
        };
        let user = self.out.user();
        if !user.permissions.may_subscribe(&pattern) {
            user.denied.subscribe.fetch_add(1, Relaxed);
            let sid = String::from_utf8_lossy(&sid);
            self.conn.err(&match &group {
                Some(g) => format!(
                    "Permissions Violation for Subscription to {pattern:?} using queue {:?} (sid {sid:?})",
                    &**g
                ),
                None => format!("Permissions Violation for Subscription to {pattern:?} (sid {sid:?})"),
            });
            return false;
        }
        if self.by_sid.contains_key(&sid) {
            // nats-server keeps the first subscription of a sid.
            return true;
        }
        let id = self.next_sid;
        let r = self.broker.subscribe_in_group(
            &self.out,
            id,
            pattern.clone(),
            group.clone(),
            // nats-server stalls a fast producer while a subscriber's
            // buffer is nearly full, and closes a subscriber that stops
            // taking bytes (the write deadline, in the writer). Here the
            // queue's bound is SUB_QUEUE messages or the client's
            // pending bytes, whichever is reached first.
            Policy::Block,
            SUB_QUEUE,
            SUB_CREDIT,
        );
        match r {
            Ok(()) => {
                self.next_sid += 1;
                self.by_sid.insert(sid.clone(), id);
                self.conn.shared.lock().subs.insert(
                    id,
                    NatsSub {
                        sid,
                        pattern,
                        group: group.clone(),
                        max: None,
                        delivered: 0,
                    },
                );
                if let Some(g) = group {
                    let n = self.groups.entry(g.clone()).or_default();
                    *n += 1;
                    if *n == 1 && !user.permissions.may_join(&g) {
                        // Still a queue subscriber; not a cluster member
                        // for skiff's cluster requests.
                        user.denied.join.fetch_add(1, Relaxed);
                    } else if *n == 1 {
                        let _ = self.broker.handle_control(
                            &self.out,
                            ClientFrame::Join {
                                corr: 0,
                                cluster: g.to_string(),
                                capacity: 1,
                            },
                        );
                    }
                }
                true
            }
            Err((Code::Limit, _)) => {
                self.conn.err("Maximum Subscriptions Exceeded");
                false
            }
            Err(_) => {
                self.conn.err("Invalid Subject");
                false
            }
        }
    }

    /// `UNSUB sid [max]`.
    fn unsubscribe(&mut self, sid: Bytes, max: Option<u64>) {
        let Some(&id) = self.by_sid.get(&sid) else {
            return;
        };
        {
            let mut sh = self.conn.shared.lock();
            if let (Some(s), Some(max)) = (sh.subs.get_mut(&id), max) {
                if max > s.delivered {
                    s.max = Some(max);
                    return;
                }
            }
        }
        self.by_sid.remove(&sid);
        let group = end_sub(&self.broker, &self.out, &self.conn, id);
        if let Some(g) = group {
            if let Some(n) = self.groups.get_mut(&g) {
                *n -= 1;
                if *n == 0 {
                    self.groups.remove(&g);
                    let _ = self.broker.handle_control(
                        &self.out,
                        ClientFrame::Leave {
                            corr: 0,
                            cluster: g.to_string(),
                        },
                    );
                }
            }
        }
    }
}

fn field(key: bytestring::ByteString, value: Bytes) -> Field {
    Field {
        key,
        value: bytestring::ByteString::try_from(value.clone())
            .map(Value::Str)
            .unwrap_or(Value::Bytes(value)),
    }
}

/// Ends subscription `id` (in the broker and in `conn`); its queue group.
pub(super) fn end_sub(
    broker: &Broker,
    out: &Arc<ClientOut>,
    conn: &Conn,
    id: u64,
) -> Option<Arc<str>> {
    let s = conn.shared.lock().subs.remove(&id);
    let _ = broker.handle_control(out, ClientFrame::Unsub { sid: id });
    s.and_then(|s| s.group)
}
