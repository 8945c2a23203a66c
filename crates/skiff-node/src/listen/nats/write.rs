//! The writing half of a NATS connection: the client's outbox encoded as
//! NATS protocol (`MSG`/`HMSG`, replies through `_INBOX` subjects), then
//! the reader's own lines (`+OK`, `PONG`, `-ERR`).

use super::*;

/// The writing half: the client's outbox as NATS protocol, then the
/// reader's lines.
pub(super) async fn write_loop<W: AsyncWrite + Unpin>(
    broker: Arc<Broker>,
    out: Arc<ClientOut>,
    conn: Arc<Conn>,
    mut w: W,
) {
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut scratch = Scratch::default();
    let mut republish = Vec::new();
    let mut ended = Vec::new();
    // When the writer last wrote.
    let mut wrote: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = out.ready() => {}
            _ = conn.wake.notified() => {}
        }
        // On a busy connection, the readers that are ready run first, so
        // what they route to it goes out in this write: requests from
        // many connections to one responder share a write. That costs a
        // poll of the runtime's driver, so a connection that was quiet
        // (one request at a time) writes at once (bench/RESULTS.md,
        // session 26).
        if wrote.is_some_and(|t: Instant| t.elapsed() < COALESCE) {
            tokio::task::yield_now().await;
        }
        let direct = std::mem::take(&mut conn.shared.lock().direct);
        // Frames queued before a line the reader wrote (a `PONG` after
        // the publishes before its `PING`) go first.
        {
            let mut sh = conn.shared.lock();
            let mut sink = Nats {
                sh: &mut sh,
                out: &mut buf,
                s: &mut scratch,
                republish: &mut republish,
                ended: &mut ended,
            };
            out.take_into(&mut sink);
            if let Some(f) = out.take_closing() {
                sink.frame(f);
            }
        }
        buf.extend_from_slice(&direct);
        scratch.end_run();
        for (sid, n) in scratch.credit.drain() {
            out.credit(sid, n);
        }
        for id in ended.drain(..) {
            end_sub(&broker, &out, &conn, id);
        }
        if !buf.is_empty() {
            let deadline = broker.limits().write_deadline_ms;
            let r = if deadline == 0 {
                w.write_all(&buf).await
            } else {
                match tokio::time::timeout(Duration::from_millis(deadline), w.write_all(&buf)).await
                {
                    Ok(r) => r,
                    Err(_) => {
                        // nats-server's write deadline: a slow consumer,
                        // closed (with no -ERR) and counted.
                        broker.slow_consumer(out.id);
                        return;
                    }
                }
            };
            if r.is_err() {
                broker.detach(out.id, None);
                return;
            }
            wrote = Some(Instant::now());
            buf.clear();
            if buf.capacity() > 4 << 20 {
                buf = Vec::with_capacity(64 * 1024);
            }
        }
        for msg in republish.drain(..) {
            let _ = super::super::handle(&broker, &out, ClientFrame::Pub(msg)).await;
        }
        if out.is_closed() && out.is_drained() {
            break;
        }
    }
    // What the reader said last (an `-ERR` before the close).
    let direct = std::mem::take(&mut conn.shared.lock().direct);
    let _ = w.write_all(&direct).await;
    let _ = w.shutdown().await;
}

/// Buffers the writer reuses.
#[derive(Debug, Default)]
struct Scratch {
    headers: Vec<u8>,
    reply: String,
    /// Credit to give back per subscription.
    credit: FxHashMap<u64, u32>,
    /// The subscription of the run of messages being taken, and how many
    /// of them: added to `credit` when the run ends (the outbox hands a
    /// subscription's messages out in runs).
    run: Option<(u64, u32)>,
    /// The line of the last `MSG` written without a reply (`MSG <subject>
    /// <sid> <size>\r\n`), and what it was made of: the next message with
    /// the same subject, subscription and size copies it.
    head: Vec<u8>,
    head_of: (Vec<u8>, u64, usize),
}

impl Scratch {
    /// Counts a message of subscription `sid` taken (its credit, given
    /// back before the write).
    fn taken(&mut self, sid: u64) {
        match &mut self.run {
            Some((s, n)) if *s == sid => *n += 1,
            _ => {
                self.end_run();
                self.run = Some((sid, 1));
            }
        }
    }

    /// Adds the current run to `credit`.
    fn end_run(&mut self) {
        if let Some((sid, n)) = self.run.take() {
            *self.credit.entry(sid).or_default() += n;
        }
    }

    /// Appends `MSG <subject> <sid> <size>\r\n<payload>\r\n` (no reply)
    /// to `out`, the line copied when the last one is the same.
    fn encode_msg(
        &mut self,
        out: &mut Vec<u8>,
        subject: &[u8],
        sid: u64,
        nats_sid: &[u8],
        payload: &[u8],
    ) {
        let (s, id, len) = &self.head_of;
        if *id == sid && *len == payload.len() && s[..] == *subject && !self.head.is_empty() {
            out.reserve(self.head.len() + payload.len() + 2);
            out.extend_from_slice(&self.head);
            out.extend_from_slice(payload);
            out.extend_from_slice(b"\r\n");
            return;
        }
        let start = out.len();
        nats::encode_msg(out, subject, nats_sid, b"", payload);
        self.head.clear();
        self.head
            .extend_from_slice(&out[start..out.len() - payload.len() - 2]);
        self.head_of.0.clear();
        self.head_of.0.extend_from_slice(subject);
        self.head_of.1 = sid;
        self.head_of.2 = payload.len();
    }
}

/// Encodes what the outbox hands out as NATS protocol.
struct Nats<'a> {
    sh: &'a mut Shared,
    out: &'a mut Vec<u8>,
    s: &'a mut Scratch,
    /// Replies for nobody here: published to their reply subjects.
    republish: &'a mut Vec<Message>,
    /// Subscriptions that reached their `UNSUB` count.
    ended: &'a mut Vec<u64>,
}

/// A writer woken within this long of its last write lets the ready
/// readers run before it writes (see `write_loop`).
const COALESCE: Duration = Duration::from_micros(50);

/// Bytes written for one socket write before the writer writes them.
const BATCH_BYTES: usize = 256 * 1024;

impl Sink for Nats<'_> {
    fn full(&self) -> bool {
        self.out.len() >= BATCH_BYTES
    }

    fn msg(&mut self, sid: u64, token: u64, body: Body) {
        self.s.taken(sid);
        let headers = self.sh.headers;
        let Some(sub) = self.sh.subs.get_mut(&sid) else {
            return;
        };
        if sub.max.is_some_and(|m| sub.delivered >= m) {
            return;
        }
        sub.delivered += 1;
        if sub.max == Some(sub.delivered) {
            self.ended.push(sid);
        }
        self.s.reply.clear();
        if token != 0 {
            let _ = write!(self.s.reply, "{REPLY_PREFIX}{token}");
        }
        // The common message (a subject and a payload) straight from its
        // encoding; others decoded.
        let raw = match &body {
            Body::Small { len, buf } => &buf[..usize::from(*len)],
            Body::Raw(b) => &b[..],
            Body::Val(m) => {
                message(
                    self.out,
                    m,
                    m.subject.as_bytes(),
                    &sub.sid,
                    &self.s.reply,
                    headers,
                    &mut self.s.headers,
                );
                return;
            }
        };
        // Checked when it was published: its subject is not checked again
        // (it is only copied).
        if let Some((subject, len)) = simple_span(raw, usize::MAX) {
            let payload = &raw[raw.len() - len..];
            if token == 0 {
                self.s
                    .encode_msg(self.out, &raw[subject], sid, &sub.sid, payload);
                return;
            }
            nats::encode_msg(
                self.out,
                &raw[subject],
                &sub.sid,
                self.s.reply.as_bytes(),
                payload,
            );
            return;
        }
        if let Ok(m) = skiff_proto::wire::decode_message(&Bytes::copy_from_slice(raw), usize::MAX) {
            message(
                self.out,
                &m,
                m.subject.as_bytes(),
                &sub.sid,
                &self.s.reply,
                headers,
                &mut self.s.headers,
            );
        }
    }

    fn frame(&mut self, f: ServerFrame) {
        let (sh, out, s) = (&mut *self.sh, &mut *self.out, &mut *self.s);
        match f {
            ServerFrame::Msg { sid, token, msg } => self.msg(sid, token, Body::value(msg)),
            ServerFrame::Request {
                token,
                cluster,
                msg,
            } => {
                let headers = sh.headers;
                if let Some(sub) = sh
                    .subs
                    .values()
                    .find(|x| x.group.as_deref() == Some(&*cluster))
                {
                    s.reply.clear();
                    let _ = write!(s.reply, "{REPLY_PREFIX}{token}");
                    message(
                        out,
                        &msg,
                        msg.subject.as_bytes(),
                        &sub.sid,
                        &s.reply,
                        headers,
                        &mut s.headers,
                    );
                }
            }
            ServerFrame::Bcast { cluster, msg } => {
                let headers = sh.headers;
                if let Some(sub) = sh
                    .subs
                    .values()
                    .find(|x| x.group.as_deref() == Some(&*cluster))
                {
                    message(
                        out,
                        &msg,
                        msg.subject.as_bytes(),
                        &sub.sid,
                        "",
                        headers,
                        &mut s.headers,
                    );
                }
            }
            ServerFrame::Reply { rid, msg } => {
                let Some(reply) = sh.requests.get(&rid).cloned() else {
                    return;
                };
                if !to_inbox(sh, out, &reply, &msg, s) {
                    if let Ok(subject) = bytestring::ByteString::try_from(reply) {
                        self.republish.push(Message { subject, ..msg });
                    }
                }
            }
            ServerFrame::ReqDone { rid, code } => {
                let Some(reply) = sh.requests.remove(&rid) else {
                    return;
                };
                if code == Code::NoResponders && sh.no_responders {
                    s.headers.clear();
                    nats::write_headers(&mut s.headers, Some((503, "")), []);
                    let h = std::mem::take(&mut s.headers);
                    for_inbox(sh, &reply, |sid| {
                        nats::encode_hmsg(out, &reply, sid, b"", &h, b"");
                    });
                    s.headers = h;
                }
            }
            // Closed by a reload of the users, as nats-server does.
            ServerFrame::Error {
                corr: 0,
                code: Code::Auth,
                ..
            } => nats::encode_err(out, "Authorization Violation"),
            // A subscription the reloaded permissions refuse, ended.
            ServerFrame::Error {
                corr,
                code: Code::Denied,
                ..
            } => {
                if let Some(sub) = sh.subs.remove(&corr) {
                    nats::encode_err(
                        out,
                        &format!(
                            "Permissions Violation for Subscription to {:?}",
                            sub.pattern
                        ),
                    );
                }
            }
            // Acks, pongs, drop reports (counted in stats), other errors
            // (the reader says what a NATS client is told), tunnels, stats.
            _ => {}
        }
    }
}

/// Delivers a reply to the requester's subscriptions that match its
/// reply subject; whether any did.
fn to_inbox(
    sh: &mut Shared,
    out: &mut Vec<u8>,
    reply: &Bytes,
    msg: &Message,
    s: &mut Scratch,
) -> bool {
    let headers = sh.headers;
    let mut any = false;
    for_inbox(sh, reply, |sid| {
        any = true;
        message(out, msg, reply, sid, "", headers, &mut s.headers);
    });
    any
}

/// Calls `each` with the sid of every subscription matching `subject`.
fn for_inbox(sh: &Shared, subject: &[u8], mut each: impl FnMut(&[u8])) {
    let Ok(subject) = std::str::from_utf8(subject) else {
        return;
    };
    let Ok(subject) = Subject::new(subject) else {
        return;
    };
    for sub in sh.subs.values() {
        if sub.max.is_some_and(|m| sub.delivered >= m) {
            continue;
        }
        if Pattern::new(&sub.pattern).is_ok_and(|p| p.matches(&subject)) {
            each(&sub.sid);
        }
    }
}

/// Appends `MSG`, or `HMSG` when the message has a type or fields and the
/// client takes headers.
fn message(
    out: &mut Vec<u8>,
    msg: &Message,
    subject: &[u8],
    sid: &[u8],
    reply: &str,
    headers: bool,
    scratch: &mut Vec<u8>,
) {
    if !headers || (msg.kind.is_none() && msg.fields.is_empty()) {
        nats::encode_msg(out, subject, sid, reply.as_bytes(), &msg.payload);
        return;
    }
    scratch.clear();
    let status = msg
        .field(STATUS_HEADER)
        .and_then(|v| match v {
            Value::Str(s) => s.parse::<u16>().ok(),
            _ => None,
        })
        .filter(|s| (100..1000).contains(s));
    let description = match msg.field(DESCRIPTION_HEADER) {
        Some(Value::Str(s)) => s.to_string(),
        _ => String::new(),
    };
    let texts: Vec<(&[u8], String)> = msg
        .kind
        .iter()
        .map(|k| (TYPE_HEADER.as_bytes(), k.to_string()))
        .chain(
            msg.fields
                .iter()
                .filter(|f| {
                    status.is_none() || (&*f.key != STATUS_HEADER && &*f.key != DESCRIPTION_HEADER)
                })
                .map(|f| (str::as_bytes(&f.key), text(&f.value))),
        )
        .collect();
    nats::write_headers(
        scratch,
        status.map(|s| (s, description.as_str())),
        texts.iter().map(|(k, v)| (*k, v.as_bytes())),
    );
    nats::encode_hmsg(out, subject, sid, reply.as_bytes(), scratch, &msg.payload);
}

/// A field's value as header text.
fn text(v: &Value) -> String {
    match v {
        Value::Str(s) => s.to_string(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Bytes(b) => {
            let mut s = String::with_capacity(2 + 2 * b.len());
            s.push_str("0x");
            for x in b.iter() {
                let _ = write!(s, "{x:02x}");
            }
            s
        }
    }
}
