//! The NATS front end: NATS core clients (nats.go, nats.py, nats.js, the
//! `nats` CLI, ...) attach to the node unchanged and meet skiff's clients
//! on the same subjects, locally and across the mesh.
//!
//! Per connection a reader and a writer task, as for skiff's own stream
//! clients (`listen::stream`). The reader parses with
//! [`skiff_proto::nats::Parser`] (bounded control line and payload) and
//! turns what it reads into the one client [`Session`]'s publishes and
//! the broker's frames, on the same processing path as every front end
//! ([`super::act`]). The writer takes the client's outbox and writes each
//! frame as the NATS protocol says it.
//!
//! How NATS maps onto skiff:
//! - subjects and wildcards are the same on both sides;
//! - `PUB` is a publish; `PUB` with a reply subject is a request to the
//!   subject (each responder may answer once; a NATS client asking one
//!   reply takes the first), so skiff responders answer NATS requests
//!   with their own `reply`, and "no responders" comes back as the 503
//!   status message a client that set `no_responders` expects. The reply
//!   goes to the requester's subscriptions that match its reply subject
//!   (its `_INBOX`), or, when it has none, is published to the reply
//!   subject;
//! - a message a NATS client must answer (a request from anyone) carries a
//!   reply subject `_SKIFF_REPLY.<token>`; publishing to it is the reply;
//! - a queue group (`SUB subject group sid`): its members join the skiff
//!   cluster named as the group (so skiff clients reach them with cluster
//!   requests and broadcasts), and each message on the subject reaches
//!   one member in the whole mesh, chosen by the cluster's
//!   capacity-weighted choice (`Broker::route`), and so does each request
//!   (skiff clients' subscriptions with a queue group take part alike);
//! - headers are message fields (string values), a skiff message's type
//!   is the header [`TYPE_HEADER`], a header block's status line the
//!   fields [`STATUS_HEADER`] and [`DESCRIPTION_HEADER`]; fields that are
//!   not strings reach NATS clients as text (bytes as `0x` and hex);
//! - a slow consumer, as nats-server treats one: NATS subscriptions take
//!   the node's pending-bytes bound (`max_pending_bytes`) with policy
//!   `block`, so a publisher waits (nats-server stalls a fast producer)
//!   while a subscriber's queue is full, and a client that takes no bytes
//!   for `write_deadline_ms` while the node has some for it is closed
//!   (with no `-ERR`) and counted in `slow_consumers`.
//!
//! TLS (setting `nats_tls`, see [`NatsTls`]): `INFO` in plaintext with
//! `tls_required`, then the client's handshake on the same connection, as
//! nats-server; or `tls_available`; or TLS first (`handshake_first`).
//!
//! Limits: the control line ([`MAX_CONTROL_LINE`]) and payload
//! (`max_payload`, headers included) are checked before anything is
//! held; a request not yet answered is forgotten after
//! [`REQUEST_TTL`] or when the client has `max_requests` of them (the
//! oldest first); an operation begun must be whole within the node's
//! read deadline; the keepalive is the node's (`ping_interval_ms`,
//! `max_pings_out`, then `-ERR 'Stale Connection'`).

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;

use skiff_proto::client_frame::{req_flags, simple_span, ClientFrame, Code, Policy, ServerFrame};
use skiff_proto::nats::{self, ConnectOptions, Op, Parser, MAX_CONTROL_LINE};
use skiff_proto::router::{Pattern, Subject};
use skiff_proto::{Field, Message, Value};

use crate::auth::{Auth, User};
use crate::broker::{Broker, Published};
use crate::config::NatsTls;
use crate::outbox::{Body, ClientOut, Sink};
use crate::session::{Input, Session};

/// The header that carries a skiff message's type.
pub const TYPE_HEADER: &str = "Skiff-Type";
/// The field that carries a NATS header block's status (e.g. `503`).
pub const STATUS_HEADER: &str = "Nats-Status";
/// The field that carries a NATS header block's status description.
pub const DESCRIPTION_HEADER: &str = "Nats-Description";
/// The prefix of the reply subjects of requests to NATS clients.
pub const REPLY_PREFIX: &str = "_SKIFF_REPLY.";
/// How long a NATS client's request waits for replies before the node
/// forgets it (NATS requesters time out on their side; this bounds what
/// the node keeps for them).
pub const REQUEST_TTL: Duration = Duration::from_secs(60);
/// The nats-server version announced in `INFO`, so clients enable what
/// they check the version for (headers, no responders).
pub const ANNOUNCED_VERSION: &str = "2.11.0";

/// Messages a NATS subscription queues before its publishers wait
/// (nats-server stalls a fast producer in the same way), besides the
/// client's `max_pending_bytes`. More than a socket write's worth (about
/// 256 KiB) even of 8-byte messages, so the writer does not run dry, and
/// small enough that a subscriber slower than its publisher holds a few
/// MiB at most, not the whole pending-bytes bound (16 MiB of 8-byte
/// messages held 12 MiB of queue, most of the node's memory).
const SUB_QUEUE: u32 = 16 * 1024;

/// Credit of a NATS subscription (NATS has none): at most this many of
/// its messages go into one write, and the writer gives them back before
/// writing, so a full queue holds [`SUB_QUEUE`] plus at most this many.
const SUB_CREDIT: u32 = 8 * 1024;

/// Where the NATS listener listens, and what it says about itself.
#[derive(Debug, Clone)]
pub(crate) struct NatsListener {
    pub(crate) broker: Arc<Broker>,
    pub(crate) addr: SocketAddr,
    pub(crate) server_id: String,
    /// Polls after traffic (setting `spin_us`), as the stream listeners.
    pub(crate) spin: Option<Arc<skiff::spin::Spin>>,
    /// TLS on this port (setting `nats_tls`); `None`: plaintext.
    pub(crate) tls: Option<NatsTlsSetup>,
}

/// A fresh id for `INFO`'s `server_id` (nats-server's are 56 characters
/// of base32; any unique string does).
pub(crate) fn server_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    format!("NSKIFF{:016X}", h.finish())
}

pub(crate) async fn accept(
    l: TcpListener,
    this: Arc<NatsListener>,
    mut stop: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            r = l.accept() => match r {
                Ok((s, peer)) => {
                    let _ = s.set_nodelay(true);
                    conns.spawn(connect(this.clone(), s, peer, stop.clone()));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            _ = stop.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    while conns.join_next().await.is_some() {}
}

/// A NATS subscription of this connection.
#[derive(Debug)]
struct NatsSub {
    /// The client's sid.
    sid: Bytes,
    pattern: String,
    group: Option<Arc<str>>,
    /// Messages after which it ends (`UNSUB sid max`).
    max: Option<u64>,
    delivered: u64,
}

/// What the reader and the writer of one connection share.
#[derive(Debug, Default)]
struct Shared {
    /// Protocol lines from the reader (`INFO`, `+OK`, `PONG`, `-ERR`),
    /// written after the frames taken with them.
    direct: Vec<u8>,
    /// skiff sid → subscription.
    subs: FxHashMap<u64, NatsSub>,
    /// Request id → reply subject.
    requests: FxHashMap<u64, Bytes>,
    headers: bool,
    no_responders: bool,
}

#[derive(Debug)]
struct Conn {
    shared: Mutex<Shared>,
    /// Wakes the writer for `direct`.
    wake: Notify,
}

impl Conn {
    fn say(&self, bytes: &[u8]) {
        self.shared.lock().direct.extend_from_slice(bytes);
        self.wake.notify_one();
    }

    fn err(&self, text: &str) {
        let mut b = Vec::new();
        nats::encode_err(&mut b, text);
        self.say(&b);
    }
}

/// A session input with nothing in it: the NATS parser feeds the session
/// with `handle_publish`; draining it with this hands out the run.
struct Parsed;

impl Input for Parsed {
    fn next_body(
        &mut self,
        _: &skiff_proto::client_frame::Decoder,
    ) -> Result<Option<Bytes>, skiff_proto::WireError> {
        Ok(None)
    }
}

/// Serves one NATS connection until either side closes it. `hello`:
/// the client attached and its `INFO` already sent (before TLS); else
/// both are done here.
async fn serve<R, W>(
    this: Arc<NatsListener>,
    mut r: R,
    w: W,
    peer: SocketAddr,
    mut stop: watch::Receiver<bool>,
    hello: Option<Hello>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let broker = this.broker.clone();
    let conn = Arc::new(Conn {
        shared: Mutex::new(Shared::default()),
        wake: Notify::new(),
    });
    let Hello {
        out, nonce, users, ..
    } = match hello {
        Some(h) => h,
        None => match Hello::new(&this, peer) {
            Ok(h) => {
                conn.say(&h.info);
                h
            }
            Err(line) => {
                let mut w = w;
                let _ = w.write_all(&line).await;
                let _ = w.shutdown().await;
                return;
            }
        },
    };
    let auth = nonce;
    let limits = broker.limits().clone();
    let writer = tokio::spawn(write_loop(broker.clone(), out.clone(), conn.clone(), w));
    let mut reader = Reader {
        broker: broker.clone(),
        out: out.clone(),
        conn: conn.clone(),
        session: Session::new(&limits, "connection"),
        parser: Parser::new(MAX_CONTROL_LINE, limits.max_payload),
        arena: BytesMut::new(),
        last_subject: bytestring::ByteString::new(),
        opts: ConnectOptions {
            echo: true,
            ..ConnectOptions::default()
        },
        by_sid: FxHashMap::default(),
        next_sid: 1,
        next_rid: 1,
        order: VecDeque::new(),
        groups: FxHashMap::default(),
        auth: users.clone(),
        nonce: auth.clone(),
    };
    // A node with users: the client must authenticate in time.
    let auth_deadline = tokio::time::sleep(users.timeout());
    tokio::pin!(auth_deadline);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut error: Option<&'static str> = None;
    let keepalive = limits.ping_interval_ms > 0;
    let every = Duration::from_millis(limits.ping_interval_ms.max(1));
    let mut ping = tokio::time::interval_at(Instant::now() + every, every);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sweep = tokio::time::interval(Duration::from_secs(5));
    let (mut heard, mut pings_out) = (false, 0u32);
    // When the operation left partly read began (its deadline is the
    // node's `read_timeout_ms` plus time for its length).
    let mut begun: Option<Instant> = None;
    let timer = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(timer);
    loop {
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(64 * 1024);
        }
        tokio::select! {
            n = r.read_buf(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    heard = true;
                    if let Some(s) = &this.spin {
                        s.touch();
                    }
                }
            },
            _ = out.closed() => break,
            _ = stop.changed() => break,
            _ = &mut auth_deadline, if reader.nonce.is_some() => {
                users.count_failure();
                error = Some("Authentication Timeout");
                break;
            }
            _ = &mut timer, if begun.is_some() => {
                broker.limit_hit();
                error = Some("Stale Connection");
                break;
            }
            _ = ping.tick(), if keepalive => {
                if std::mem::take(&mut heard) {
                    pings_out = 0;
                } else if pings_out >= limits.max_pings_out {
                    broker.limit_hit();
                    error = Some("Stale Connection");
                    break;
                } else {
                    pings_out += 1;
                    conn.say(nats::PING);
                }
                continue;
            }
            _ = sweep.tick() => {
                reader.forget_old_requests(Instant::now()).await;
                continue;
            }
        }
        match reader.read(&mut buf).await {
            Ok(()) => {}
            Err(text) => {
                error = Some(text);
                break;
            }
        }
        if reader.parser.mid_op(&buf) {
            if begun.is_none() {
                let now = Instant::now();
                begun = Some(now);
                timer
                    .as_mut()
                    .reset(now + limits.frame_deadline(limits.max_payload));
            }
        } else {
            begun = None;
        }
    }
    if *stop.borrow() && error.is_none() {
        let _ = writer.await;
        return;
    }
    if let Some(text) = error {
        conn.err(text);
    }
    broker.detach(out.id, None);
    let _ = writer.await;
}

/// The reading half of a connection: the parser's output, to the session
/// and the broker.
struct Reader {
    broker: Arc<Broker>,
    out: Arc<ClientOut>,
    conn: Arc<Conn>,
    session: Session,
    parser: Parser,
    /// Where publishes are encoded as skiff messages (one allocation per
    /// many).
    arena: BytesMut,
    /// The subject of the client's last plain publish, checked (a copy:
    /// it holds no read buffer).
    last_subject: bytestring::ByteString,
    opts: ConnectOptions,
    /// The client's sid → skiff sid.
    by_sid: FxHashMap<Bytes, u64>,
    next_sid: u64,
    next_rid: u64,
    /// Requests in the order they were made, with when.
    order: VecDeque<(u64, Instant)>,
    /// Queue groups this client is in → its subscriptions in each.
    groups: FxHashMap<Arc<str>, u32>,
    auth: Arc<Auth>,
    /// The nonce sent in `INFO` while the client has not authenticated
    /// (`None` once it has, or when the node has no users). Who the
    /// client is, and what it may do, is its outbox's user (a reload may
    /// change it).
    nonce: Option<String>,
}

impl Reader {
    /// Everything whole in `buf`, in order. `Err`: close with this
    /// `-ERR` text.
    async fn read(&mut self, buf: &mut BytesMut) -> Result<(), &'static str> {
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
            super::act(&self.broker, &self.out, &mut self.session, e)
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
            return super::handle(&self.broker, &self.out, ClientFrame::Reply { token, msg })
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
            super::act(&self.broker, &self.out, &mut self.session, e)
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
            super::act(&self.broker, &self.out, &mut self.session, e)
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
        super::act(&self.broker, &self.out, &mut self.session, e)
            .await
            .map_err(|_| "Unknown Protocol Operation")?;
        self.flush().await
    }

    /// Stops waiting for replies to `rid`, if still waiting.
    async fn forget(&mut self, rid: u64) -> Result<(), &'static str> {
        if self.conn.shared.lock().requests.remove(&rid).is_some() {
            super::handle(&self.broker, &self.out, ClientFrame::Cancel { rid })
                .await
                .map_err(|_| "Unknown Protocol Operation")?;
        }
        Ok(())
    }

    /// Forgets requests older than [`REQUEST_TTL`].
    async fn forget_old_requests(&mut self, now: Instant) {
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
fn end_sub(broker: &Broker, out: &Arc<ClientOut>, conn: &Conn, id: u64) -> Option<Arc<str>> {
    let s = conn.shared.lock().subs.remove(&id);
    let _ = broker.handle_control(out, ClientFrame::Unsub { sid: id });
    s.and_then(|s| s.group)
}

mod hello;
mod tls;
mod write;
use hello::{authenticate, Hello};
use tls::connect;
pub(crate) use tls::NatsTlsSetup;
pub use tls::TLS_REQUIRED;
use write::write_loop;
