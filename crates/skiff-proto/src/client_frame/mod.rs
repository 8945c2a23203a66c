//! The client↔node protocol: frames on a byte stream (TCP or a Unix
//! socket), and the same frames as plain values for in-process clients
//! (`mem://`), which skip the encoding.
//!
//! ```text
//! +----------------------+--------+---------------------------------+
//! | body length (u32 LE) | op (u8)| op-specific fields ... [message]|
//! +----------------------+--------+---------------------------------+
//!                        |<------------- body length -------------->|
//! ```
//!
//! Integers are varints (`v`), strings and byte strings a varint length and
//! the bytes (`s`). A message, when a frame carries one, comes last and is
//! encoded by [`crate::wire::encode_message`], so a message has one
//! encoding everywhere; its payload is decoded as a zero-copy slice of the
//! frame.
//!
//! Client → node ([`ClientFrame`]): `Pub [msg]`, `Sub v:sid s:pattern
//! s:type u8:policy v:queue v:credit`, `Unsub v:sid`, `Credit v:sid v:n`,
//! `Req v:rid u8:flags v:max s:target s:key [msg]`, `Reply v:token [msg]`,
//! `Cancel v:rid`, `Join v:corr s:cluster v:capacity`, `Leave v:corr
//! s:cluster`, `Bcast s:cluster [msg]`, `TunOpen v:corr s:cluster s:key
//! v:window`, `TunData v:tunnel [msg]`, `TunCredit v:tunnel v:n`, `TunClose
//! v:tunnel`, `Stats v:corr`, `Ping v:corr`.
//!
//! Node → client ([`ServerFrame`]): `Welcome v:client v:max_payload`,
//! `Ack v:corr`, `Error v:corr v:code s:text` (corr 0: about the
//! connection, which the node then closes), `Msg v:sid v:token [msg]`,
//! `Dropped v:sid v:total`, `Request v:token s:cluster [msg]`, `Bcast
//! s:cluster [msg]`, `Reply v:rid [msg]`, `ReqDone v:rid v:code`,
//! `TunIncoming v:tunnel s:cluster v:window`, `TunOpened v:corr v:tunnel
//! v:window`, `TunData`, `TunCredit`, `TunClose` as above, `Stats v:corr
//! s:json`, `Pong v:corr`.
//!
//! [`Decoder`] is total and bounded: it checks the body length against its
//! limit before it reserves anything, and any input yields a frame, a need
//! for more bytes, or an error.

use crate::codec;
use crate::varint;
use crate::wire::{self, MAX_SUBJECT};
use crate::{Message, WireError};
use bytes::{Buf, Bytes, BytesMut};

/// Bytes before a frame's body: its length.
pub const LEN_PREFIX: usize = 4;
/// Room in a frame beyond the message's payload for ids, subject, type and
/// fields, when checking a frame's length against the message size limit.
pub const FRAME_OVERHEAD: usize = 64 * 1024;

/// The `corr` of an error frame about a publish, broadcast or reply, which
/// has no correlation id of its own; the connection stays open.
pub const ASYNC_ERROR: u64 = u64::MAX;

/// What a subscriber wants done when its subscription's queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Policy {
    /// Drop the oldest queued message to make room (count it). The
    /// default: a subscriber sees the freshest data.
    #[default]
    DropOldest = 0,
    /// Drop the arriving message (count it).
    DropNewest = 1,
    /// Make the publisher wait until there is room: credit flow control
    /// back to the publisher. A blocked subscriber slows every publisher
    /// that sends to it, and so, by design, their other subscribers.
    Block = 2,
    /// Close the subscriber's connection with a "slow consumer" error.
    Disconnect = 3,
}

impl Policy {
    fn from_u8(b: u8) -> Option<Policy> {
        Some(match b {
            0 => Policy::DropOldest,
            1 => Policy::DropNewest,
            2 => Policy::Block,
            3 => Policy::Disconnect,
            _ => return None,
        })
    }

    /// Parses `drop-oldest`, `drop-newest`, `block` or `disconnect`.
    pub fn parse(s: &str) -> Option<Policy> {
        Some(match s {
            "drop-oldest" | "oldest" => Policy::DropOldest,
            "drop-newest" | "newest" => Policy::DropNewest,
            "block" => Policy::Block,
            "disconnect" => Policy::Disconnect,
            _ => return None,
        })
    }

    /// The name [`Policy::parse`] accepts.
    pub fn name(self) -> &'static str {
        match self {
            Policy::DropOldest => "drop-oldest",
            Policy::DropNewest => "drop-newest",
            Policy::Block => "block",
            Policy::Disconnect => "disconnect",
        }
    }
}

/// Why the node refused or ended something; carried by
/// [`ServerFrame::Error`] and [`ServerFrame::ReqDone`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    /// The peer sent bytes that are not this protocol (the peer's fault).
    Protocol,
    /// A configured limit was reached.
    Limit,
    /// A subject, pattern, type or cluster name is not valid (the caller's
    /// fault).
    Invalid,
    /// Nobody subscribes to the subject or is a member of the cluster.
    NoResponders,
    /// The client did not keep up with a `disconnect`-policy subscription.
    SlowConsumer,
    /// The node is shutting down.
    Shutdown,
    /// The tunnel, request or subscription named does not exist.
    NotFound,
    /// Every responder a request reached has answered (`ReqDone` of a
    /// scatter-gather request).
    Complete,
    /// A code this build does not know.
    Other(u16),
}

impl Code {
    /// The code's number on the wire.
    pub fn to_u16(self) -> u16 {
        match self {
            Code::Protocol => 1,
            Code::Limit => 2,
            Code::Invalid => 3,
            Code::NoResponders => 4,
            Code::SlowConsumer => 5,
            Code::Shutdown => 6,
            Code::NotFound => 7,
            Code::Complete => 8,
            Code::Other(n) => n,
        }
    }

    /// The code for a number.
    pub fn from_u16(n: u16) -> Code {
        match n {
            1 => Code::Protocol,
            2 => Code::Limit,
            3 => Code::Invalid,
            4 => Code::NoResponders,
            5 => Code::SlowConsumer,
            6 => Code::Shutdown,
            7 => Code::NotFound,
            8 => Code::Complete,
            n => Code::Other(n),
        }
    }
}

/// A request's flags (`Req` frame).
pub mod req_flags {
    /// The target is a cluster, not a subject.
    pub const CLUSTER: u8 = 1;
    /// Scatter-gather: deliver to every responder, collect up to `max`
    /// replies.
    pub const MANY: u8 = 2;
}

/// What a client sends to its node.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientFrame {
    /// Publish a message on its subject.
    Pub(Message),
    /// Subscribe; the client picks `sid`, unique among its subscriptions.
    /// The node answers `Ack { corr: sid }` once it holds the interest.
    Sub {
        /// The client's name for the subscription.
        sid: u64,
        /// Subject pattern (`*`, `>`).
        pattern: String,
        /// Type pattern (`*`, empty, or exact).
        kind: String,
        /// Policy when the queue is full.
        policy: Policy,
        /// Queue bound in messages, in the node.
        queue: u32,
        /// Messages the client can take before it grants more.
        credit: u32,
    },
    /// End a subscription.
    Unsub {
        /// The subscription.
        sid: u64,
    },
    /// Grant `n` more messages to a subscription.
    Credit {
        /// The subscription.
        sid: u64,
        /// Messages.
        n: u32,
    },
    /// A request (see [`req_flags`]).
    Req {
        /// The client's name for the request.
        rid: u64,
        /// [`req_flags`].
        flags: u8,
        /// Most replies to deliver (1 for a plain request).
        max: u32,
        /// A subject or a cluster name.
        target: String,
        /// Affinity key for a cluster request; empty for none.
        key: Bytes,
        /// The request.
        msg: Message,
    },
    /// Answer the request `token`.
    Reply {
        /// From the `Msg` or `Request` frame.
        token: u64,
        /// The reply.
        msg: Message,
    },
    /// Stop waiting for replies to `rid`.
    Cancel {
        /// The request.
        rid: u64,
    },
    /// Become a member of a cluster (again: update the capacity).
    Join {
        /// Echoed in the `Ack`.
        corr: u64,
        /// The cluster.
        cluster: String,
        /// Advertised capacity (0: broadcasts only).
        capacity: u32,
    },
    /// Stop being a member.
    Leave {
        /// Echoed in the `Ack`.
        corr: u64,
        /// The cluster.
        cluster: String,
    },
    /// Send to every member of a cluster.
    Bcast {
        /// The cluster.
        cluster: String,
        /// The message.
        msg: Message,
    },
    /// Open a tunnel to one member of a cluster.
    TunOpen {
        /// Echoed in `TunOpened`.
        corr: u64,
        /// The cluster.
        cluster: String,
        /// Affinity key; empty for none.
        key: Bytes,
        /// Messages either side may have in flight.
        window: u32,
    },
    /// Data on a tunnel.
    TunData {
        /// The tunnel.
        tunnel: u64,
        /// The message.
        msg: Message,
    },
    /// The receiver consumed `n` messages: the sender may send `n` more.
    TunCredit {
        /// The tunnel.
        tunnel: u64,
        /// Messages.
        n: u32,
    },
    /// Close a tunnel.
    TunClose {
        /// The tunnel.
        tunnel: u64,
    },
    /// Ask for the node's counters.
    Stats {
        /// Echoed in the answer.
        corr: u64,
    },
    /// Ask for a `Pong` once everything sent before has been handled.
    Ping {
        /// Echoed in the `Pong`.
        corr: u64,
    },
}

/// What a node sends to a client.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerFrame {
    /// First frame on a connection.
    Welcome {
        /// The node's name for this client.
        client: u64,
        /// Largest payload the node accepts.
        max_payload: u64,
    },
    /// `corr` succeeded.
    Ack {
        /// A `Sub`'s sid, a `Join`'s or `Leave`'s corr.
        corr: u64,
    },
    /// `corr` failed; corr 0 means the connection is closing.
    Error {
        /// What failed (0: the connection).
        corr: u64,
        /// Why.
        code: Code,
        /// A sentence for a person.
        text: String,
    },
    /// A message for subscription `sid`; `token` is non-zero when it is a
    /// request to answer with `Reply`.
    Msg {
        /// The subscription.
        sid: u64,
        /// Reply token, or 0.
        token: u64,
        /// The message.
        msg: Message,
    },
    /// Subscription `sid` has lost `total` messages so far to its policy.
    Dropped {
        /// The subscription.
        sid: u64,
        /// Drops since it began.
        total: u64,
    },
    /// A request to this member of `cluster`.
    Request {
        /// Answer with `Reply { token }`.
        token: u64,
        /// The cluster it was sent to.
        cluster: String,
        /// The request.
        msg: Message,
    },
    /// A broadcast to the members of `cluster`.
    Bcast {
        /// The cluster.
        cluster: String,
        /// The message.
        msg: Message,
    },
    /// A reply to the client's request `rid`.
    Reply {
        /// The request.
        rid: u64,
        /// The reply.
        msg: Message,
    },
    /// No more replies will come for `rid`.
    ReqDone {
        /// The request.
        rid: u64,
        /// Why, e.g. [`Code::NoResponders`].
        code: Code,
    },
    /// A tunnel to this member was opened.
    TunIncoming {
        /// The tunnel.
        tunnel: u64,
        /// The cluster it was opened to.
        cluster: String,
        /// Messages either side may have in flight.
        window: u32,
    },
    /// The tunnel asked for by `corr` is open.
    TunOpened {
        /// From `TunOpen`.
        corr: u64,
        /// The tunnel.
        tunnel: u64,
        /// Messages either side may have in flight.
        window: u32,
    },
    /// Data on a tunnel.
    TunData {
        /// The tunnel.
        tunnel: u64,
        /// The message.
        msg: Message,
    },
    /// The peer consumed `n` messages.
    TunCredit {
        /// The tunnel.
        tunnel: u64,
        /// Messages.
        n: u32,
    },
    /// The peer closed the tunnel or went away.
    TunClose {
        /// The tunnel.
        tunnel: u64,
    },
    /// The node's counters, as JSON.
    Stats {
        /// From `Stats`.
        corr: u64,
        /// JSON text.
        json: String,
    },
    /// Answer to `Ping`.
    Pong {
        /// From `Ping`.
        corr: u64,
    },
}

mod op {
    pub(super) const PUB: u8 = 1;
    pub(super) const SUB: u8 = 2;
    pub(super) const UNSUB: u8 = 3;
    pub(super) const CREDIT: u8 = 4;
    pub(super) const REQ: u8 = 5;
    pub(super) const REPLY: u8 = 6;
    pub(super) const CANCEL: u8 = 7;
    pub(super) const JOIN: u8 = 8;
    pub(super) const LEAVE: u8 = 9;
    pub(super) const BCAST: u8 = 10;
    pub(super) const TUN_OPEN: u8 = 11;
    pub(super) const TUN_DATA: u8 = 12;
    pub(super) const TUN_CREDIT: u8 = 13;
    pub(super) const TUN_CLOSE: u8 = 14;
    pub(super) const STATS: u8 = 15;
    pub(super) const PING: u8 = 16;

    pub(super) const WELCOME: u8 = 64;
    pub(super) const ACK: u8 = 65;
    pub(super) const ERROR: u8 = 66;
    pub(super) const MSG: u8 = 67;
    pub(super) const DROPPED: u8 = 68;
    pub(super) const REQUEST: u8 = 69;
    pub(super) const S_BCAST: u8 = 70;
    pub(super) const S_REPLY: u8 = 71;
    pub(super) const REQ_DONE: u8 = 72;
    pub(super) const TUN_INCOMING: u8 = 73;
    pub(super) const TUN_OPENED: u8 = 74;
    pub(super) const S_TUN_DATA: u8 = 75;
    pub(super) const S_TUN_CREDIT: u8 = 76;
    pub(super) const S_TUN_CLOSE: u8 = 77;
    pub(super) const S_STATS: u8 = 78;
    pub(super) const PONG: u8 = 79;
}

/// Appends frames to a buffer.
struct Enc<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> Enc<'a> {
    fn new(out: &'a mut Vec<u8>, op: u8) -> Enc<'a> {
        let start = out.len();
        out.extend_from_slice(&[0; LEN_PREFIX]);
        out.push(op);
        Enc { out, start }
    }
    fn v(self, x: u64) -> Self {
        varint::put(self.out, x);
        self
    }
    fn u8(self, x: u8) -> Self {
        self.out.push(x);
        self
    }
    fn s(self, b: &[u8]) -> Self {
        varint::put(self.out, b.len() as u64);
        self.out.extend_from_slice(b);
        self
    }
    fn msg(self, m: &Message) -> Self {
        wire::encode_message(self.out, m, false);
        self
    }
    fn end(self) {
        let len = (self.out.len() - self.start - LEN_PREFIX) as u32;
        self.out[self.start..self.start + LEN_PREFIX].copy_from_slice(&len.to_le_bytes());
    }
}

impl ClientFrame {
    /// Appends the frame, length prefix included, to `out`. The caller has
    /// checked any message with [`crate::wire::check`].
    pub fn encode(&self, out: &mut Vec<u8>) {
        use ClientFrame as F;
        match self {
            F::Pub(m) => Enc::new(out, op::PUB).msg(m).end(),
            F::Sub {
                sid,
                pattern,
                kind,
                policy,
                queue,
                credit,
            } => Enc::new(out, op::SUB)
                .v(*sid)
                .s(pattern.as_bytes())
                .s(kind.as_bytes())
                .u8(*policy as u8)
                .v(u64::from(*queue))
                .v(u64::from(*credit))
                .end(),
            F::Unsub { sid } => Enc::new(out, op::UNSUB).v(*sid).end(),
            F::Credit { sid, n } => Enc::new(out, op::CREDIT).v(*sid).v(u64::from(*n)).end(),
            F::Req {
                rid,
                flags,
                max,
                target,
                key,
                msg,
            } => Enc::new(out, op::REQ)
                .v(*rid)
                .u8(*flags)
                .v(u64::from(*max))
                .s(target.as_bytes())
                .s(key)
                .msg(msg)
                .end(),
            F::Reply { token, msg } => Enc::new(out, op::REPLY).v(*token).msg(msg).end(),
            F::Cancel { rid } => Enc::new(out, op::CANCEL).v(*rid).end(),
            F::Join {
                corr,
                cluster,
                capacity,
            } => Enc::new(out, op::JOIN)
                .v(*corr)
                .s(cluster.as_bytes())
                .v(u64::from(*capacity))
                .end(),
            F::Leave { corr, cluster } => Enc::new(out, op::LEAVE)
                .v(*corr)
                .s(cluster.as_bytes())
                .end(),
            F::Bcast { cluster, msg } => Enc::new(out, op::BCAST)
                .s(cluster.as_bytes())
                .msg(msg)
                .end(),
            F::TunOpen {
                corr,
                cluster,
                key,
                window,
            } => Enc::new(out, op::TUN_OPEN)
                .v(*corr)
                .s(cluster.as_bytes())
                .s(key)
                .v(u64::from(*window))
                .end(),
            F::TunData { tunnel, msg } => Enc::new(out, op::TUN_DATA).v(*tunnel).msg(msg).end(),
            F::TunCredit { tunnel, n } => Enc::new(out, op::TUN_CREDIT)
                .v(*tunnel)
                .v(u64::from(*n))
                .end(),
            F::TunClose { tunnel } => Enc::new(out, op::TUN_CLOSE).v(*tunnel).end(),
            F::Stats { corr } => Enc::new(out, op::STATS).v(*corr).end(),
            F::Ping { corr } => Enc::new(out, op::PING).v(*corr).end(),
        }
    }

    /// Decodes one frame body (after the length prefix).
    pub fn decode(body: Bytes, max_payload: usize) -> Result<ClientFrame, WireError> {
        let mut r = Reader::new(&body, max_payload)?;
        use ClientFrame as F;
        let f = match r.op {
            op::PUB => F::Pub(r.msg()?),
            op::SUB => F::Sub {
                sid: r.v("sid")?,
                pattern: r.string("pattern", MAX_SUBJECT)?,
                kind: r.string("type", wire::MAX_KIND)?,
                policy: Policy::from_u8(r.u8("policy")?)
                    .ok_or(WireError::Malformed("unknown policy"))?,
                queue: r.v32("queue")?,
                credit: r.v32("credit")?,
            },
            op::UNSUB => F::Unsub { sid: r.v("sid")? },
            op::CREDIT => F::Credit {
                sid: r.v("sid")?,
                n: r.v32("credit")?,
            },
            op::REQ => F::Req {
                rid: r.v("rid")?,
                flags: r.u8("flags")?,
                max: r.v32("max")?,
                target: r.string("target", MAX_SUBJECT)?,
                key: r.bytes("key", MAX_SUBJECT)?,
                msg: r.msg()?,
            },
            op::REPLY => F::Reply {
                token: r.v("token")?,
                msg: r.msg()?,
            },
            op::CANCEL => F::Cancel { rid: r.v("rid")? },
            op::JOIN => F::Join {
                corr: r.v("corr")?,
                cluster: r.string("cluster", MAX_SUBJECT)?,
                capacity: r.v32("capacity")?,
            },
            op::LEAVE => F::Leave {
                corr: r.v("corr")?,
                cluster: r.string("cluster", MAX_SUBJECT)?,
            },
            op::BCAST => F::Bcast {
                cluster: r.string("cluster", MAX_SUBJECT)?,
                msg: r.msg()?,
            },
            op::TUN_OPEN => F::TunOpen {
                corr: r.v("corr")?,
                cluster: r.string("cluster", MAX_SUBJECT)?,
                key: r.bytes("key", MAX_SUBJECT)?,
                window: r.v32("window")?,
            },
            op::TUN_DATA => F::TunData {
                tunnel: r.v("tunnel")?,
                msg: r.msg()?,
            },
            op::TUN_CREDIT => F::TunCredit {
                tunnel: r.v("tunnel")?,
                n: r.v32("credit")?,
            },
            op::TUN_CLOSE => F::TunClose {
                tunnel: r.v("tunnel")?,
            },
            op::STATS => F::Stats { corr: r.v("corr")? },
            op::PING => F::Ping { corr: r.v("corr")? },
            _ => return Err(WireError::Malformed("unknown client frame op")),
        };
        r.finish()?;
        Ok(f)
    }
}

/// Appends a `Msg` frame whose message is already encoded (`raw`, as
/// [`crate::wire::encode_message`] writes it, e.g. the body of a
/// client's `Pub` frame after its op): the node forwards a published
/// message without decoding and re-encoding it.
pub fn encode_msg_raw(out: &mut Vec<u8>, sid: u64, token: u64, raw: &[u8]) {
    let start = out.len();
    out.extend_from_slice(&[0; LEN_PREFIX]);
    out.push(op::MSG);
    varint::put(out, sid);
    varint::put(out, token);
    out.extend_from_slice(raw);
    let len = (out.len() - start - LEN_PREFIX) as u32;
    out[start..start + LEN_PREFIX].copy_from_slice(&len.to_le_bytes());
}

/// The subject and payload length of an encoded message with a subject and
/// nothing else but its payload (the common publish), read without
/// building a [`Message`]; `None` for any other encoding, valid or not
/// (decode those with [`crate::wire::decode_message`]). Accepts only
/// what `decode_message(raw, max_payload)` accepts.
pub fn simple_message(raw: &[u8], max_payload: usize) -> Option<(&str, usize)> {
    const F_SUBJECT: u8 = 1;
    if *raw.first()? != F_SUBJECT {
        return None;
    }
    let (n, a) = varint::get(&raw[1..]).ok()?;
    if n == 0 || n > MAX_SUBJECT as u64 {
        return None;
    }
    let start = 1 + a;
    let end = start.checked_add(n as usize)?;
    let subject = std::str::from_utf8(raw.get(start..end)?).ok()?;
    let (len, b) = varint::get(raw.get(end..)?).ok()?;
    if len > max_payload as u64 || (raw.len() - end - b) as u64 != len {
        return None;
    }
    Some((subject, len as usize))
}

/// Appends a `Pub` frame for `msg` (what [`ClientFrame::Pub`] encodes to,
/// without building the frame).
pub fn encode_pub(out: &mut Vec<u8>, msg: &Message) {
    Enc::new(out, op::PUB).msg(msg).end();
}

/// Bytes the `Pub` frame of `msg` takes, length prefix included.
pub fn pub_frame_len(msg: &Message) -> usize {
    LEN_PREFIX + 1 + wire::encoded_len(msg, false)
}

/// Writes the `Pub` frame of `msg` (what [`encode_pub`] appends) into
/// `out`, which must be exactly [`pub_frame_len`] bytes: a publish written
/// once, in place (a shared-memory ring's segment). `false`, with `out`
/// untouched, on any other length or a body over 4 GiB.
pub fn encode_pub_into(out: &mut [u8], msg: &Message) -> bool {
    if out.len() != pub_frame_len(msg) || out.len() - LEN_PREFIX > u32::MAX as usize {
        return false;
    }
    let body = (out.len() - LEN_PREFIX) as u32;
    let (head, rest) = out.split_at_mut(LEN_PREFIX + 1);
    head[..LEN_PREFIX].copy_from_slice(&body.to_le_bytes());
    head[LEN_PREFIX] = op::PUB;
    wire::encode_message_into(rest, msg, false)
}

/// Appends a `Msg` frame for `msg` (what [`ServerFrame::Msg`] encodes to).
pub fn encode_msg(out: &mut Vec<u8>, sid: u64, token: u64, msg: &Message) {
    Enc::new(out, op::MSG).v(sid).v(token).msg(msg).end();
}

/// Whether a frame body is a client's `Pub`; its encoded message is then
/// `body[1..]`.
pub fn is_pub(body: &[u8]) -> bool {
    body.first() == Some(&op::PUB)
}

impl ServerFrame {
    /// Appends the frame, length prefix included, to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        use ServerFrame as F;
        match self {
            F::Welcome {
                client,
                max_payload,
            } => Enc::new(out, op::WELCOME).v(*client).v(*max_payload).end(),
            F::Ack { corr } => Enc::new(out, op::ACK).v(*corr).end(),
            F::Error { corr, code, text } => Enc::new(out, op::ERROR)
                .v(*corr)
                .v(u64::from(code.to_u16()))
                .s(text.as_bytes())
                .end(),
            F::Msg { sid, token, msg } => Enc::new(out, op::MSG).v(*sid).v(*token).msg(msg).end(),
            F::Dropped { sid, total } => Enc::new(out, op::DROPPED).v(*sid).v(*total).end(),
            F::Request {
                token,
                cluster,
                msg,
            } => Enc::new(out, op::REQUEST)
                .v(*token)
                .s(cluster.as_bytes())
                .msg(msg)
                .end(),
            F::Bcast { cluster, msg } => Enc::new(out, op::S_BCAST)
                .s(cluster.as_bytes())
                .msg(msg)
                .end(),
            F::Reply { rid, msg } => Enc::new(out, op::S_REPLY).v(*rid).msg(msg).end(),
            F::ReqDone { rid, code } => Enc::new(out, op::REQ_DONE)
                .v(*rid)
                .v(u64::from(code.to_u16()))
                .end(),
            F::TunIncoming {
                tunnel,
                cluster,
                window,
            } => Enc::new(out, op::TUN_INCOMING)
                .v(*tunnel)
                .s(cluster.as_bytes())
                .v(u64::from(*window))
                .end(),
            F::TunOpened {
                corr,
                tunnel,
                window,
            } => Enc::new(out, op::TUN_OPENED)
                .v(*corr)
                .v(*tunnel)
                .v(u64::from(*window))
                .end(),
            F::TunData { tunnel, msg } => Enc::new(out, op::S_TUN_DATA).v(*tunnel).msg(msg).end(),
            F::TunCredit { tunnel, n } => Enc::new(out, op::S_TUN_CREDIT)
                .v(*tunnel)
                .v(u64::from(*n))
                .end(),
            F::TunClose { tunnel } => Enc::new(out, op::S_TUN_CLOSE).v(*tunnel).end(),
            F::Stats { corr, json } => Enc::new(out, op::S_STATS).v(*corr).s(json.as_bytes()).end(),
            F::Pong { corr } => Enc::new(out, op::PONG).v(*corr).end(),
        }
    }

    /// For a `Msg` frame body: its subscription, its reply token and where
    /// its message starts, without decoding the message (the client
    /// decodes it straight into the subscription's queue with
    /// [`crate::wire::decode_message_into`]); `None` for any other
    /// frame.
    pub fn msg_header(body: &Bytes) -> Result<Option<(u64, u64, usize)>, WireError> {
        if body.first() != Some(&op::MSG) {
            return Ok(None);
        }
        let mut r = codec::Reader::at(body, 1);
        let sid = r.varint("sid")?;
        let token = r.varint("token")?;
        Ok(Some((sid, token, r.pos())))
    }

    /// Decodes one frame body (after the length prefix).
    pub fn decode(body: Bytes, max_payload: usize) -> Result<ServerFrame, WireError> {
        let mut r = Reader::new(&body, max_payload)?;
        use ServerFrame as F;
        let f = match r.op {
            op::WELCOME => F::Welcome {
                client: r.v("client")?,
                max_payload: r.v("max_payload")?,
            },
            op::ACK => F::Ack { corr: r.v("corr")? },
            op::ERROR => F::Error {
                corr: r.v("corr")?,
                code: Code::from_u16(r.v("code")? as u16),
                text: r.string("error text", 64 * 1024)?,
            },
            op::MSG => F::Msg {
                sid: r.v("sid")?,
                token: r.v("token")?,
                msg: r.msg()?,
            },
            op::DROPPED => F::Dropped {
                sid: r.v("sid")?,
                total: r.v("total")?,
            },
            op::REQUEST => F::Request {
                token: r.v("token")?,
                cluster: r.string("cluster", MAX_SUBJECT)?,
                msg: r.msg()?,
            },
            op::S_BCAST => F::Bcast {
                cluster: r.string("cluster", MAX_SUBJECT)?,
                msg: r.msg()?,
            },
            op::S_REPLY => F::Reply {
                rid: r.v("rid")?,
                msg: r.msg()?,
            },
            op::REQ_DONE => F::ReqDone {
                rid: r.v("rid")?,
                code: Code::from_u16(r.v("code")? as u16),
            },
            op::TUN_INCOMING => F::TunIncoming {
                tunnel: r.v("tunnel")?,
                cluster: r.string("cluster", MAX_SUBJECT)?,
                window: r.v32("window")?,
            },
            op::TUN_OPENED => F::TunOpened {
                corr: r.v("corr")?,
                tunnel: r.v("tunnel")?,
                window: r.v32("window")?,
            },
            op::S_TUN_DATA => F::TunData {
                tunnel: r.v("tunnel")?,
                msg: r.msg()?,
            },
            op::S_TUN_CREDIT => F::TunCredit {
                tunnel: r.v("tunnel")?,
                n: r.v32("credit")?,
            },
            op::S_TUN_CLOSE => F::TunClose {
                tunnel: r.v("tunnel")?,
            },
            op::S_STATS => F::Stats {
                corr: r.v("corr")?,
                json: r.string("stats", 16 << 20)?,
            },
            op::PONG => F::Pong { corr: r.v("corr")? },
            _ => return Err(WireError::Malformed("unknown server frame op")),
        };
        r.finish()?;
        Ok(f)
    }
}

/// A cursor over one frame body: the codec's reader and the frame's op.
struct Reader<'a> {
    r: codec::Reader<'a, Bytes>,
    op: u8,
    max_payload: usize,
    /// A message was decoded: it ran to the end.
    done: bool,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a Bytes, max_payload: usize) -> Result<Reader<'a>, WireError> {
        let mut r = codec::Reader::new(buf);
        let op = r.u8("frame op")?;
        Ok(Reader {
            r,
            op,
            max_payload,
            done: false,
        })
    }
    fn v(&mut self, what: &'static str) -> Result<u64, WireError> {
        self.r.varint(what)
    }
    fn v32(&mut self, what: &'static str) -> Result<u32, WireError> {
        self.r.varint_u32(what)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        self.r.u8(what)
    }
    fn bytes(&mut self, what: &'static str, max: usize) -> Result<Bytes, WireError> {
        self.r.shared(max, what)
    }
    fn string(&mut self, what: &'static str, max: usize) -> Result<String, WireError> {
        Ok(self.r.str(max, what)?.to_owned())
    }
    fn msg(&mut self) -> Result<Message, WireError> {
        let rest = self.r.shared_rest();
        self.done = true;
        wire::decode_message(&rest, self.max_payload)
    }
    fn finish(&self) -> Result<(), WireError> {
        if self.done {
            return Ok(());
        }
        self.r.finish()
    }
}

/// Splits a byte stream into frame bodies. Total and bounded: a length
/// above `max_frame` is an error before any byte of the body is reserved.
#[derive(Debug)]
pub struct Decoder {
    max_frame: usize,
}

impl Decoder {
    /// A decoder refusing bodies longer than `max_frame` bytes.
    pub fn new(max_frame: usize) -> Decoder {
        Decoder { max_frame }
    }

    /// The body length a frame's prefix announces, checked: not zero, not
    /// over the limit.
    fn body_len(&self, prefix: &[u8]) -> Result<usize, WireError> {
        let len = u32::from_le_bytes(prefix.try_into().expect("4 bytes")) as usize;
        if len == 0 {
            return Err(WireError::Malformed("empty frame"));
        }
        if len > self.max_frame {
            return Err(WireError::TooLong {
                what: "frame",
                len: len as u64,
                max: self.max_frame,
            });
        }
        Ok(len)
    }

    /// The next frame body in `buf`, removed from it; `Ok(None)` when more
    /// bytes are needed. On `Ok(None)`, `buf` has been given room for the
    /// rest of the frame (never more than `max_frame`).
    pub fn next(&self, buf: &mut BytesMut) -> Result<Option<Bytes>, WireError> {
        if buf.len() < LEN_PREFIX {
            return Ok(None);
        }
        let len = self.body_len(&buf[..LEN_PREFIX])?;
        if buf.len() < LEN_PREFIX + len {
            buf.reserve(LEN_PREFIX + len - buf.len());
            return Ok(None);
        }
        buf.advance(LEN_PREFIX);
        Ok(Some(buf.split_to(len).freeze()))
    }

    /// The next frame body at the front of `buf`, split off it without a
    /// copy (a frame body is then a slice of whatever `buf` refers to,
    /// e.g. a shared-memory segment); `Ok(None)` once `buf` is empty. The
    /// same checks as [`Decoder::next`]; a frame cut short by the end of
    /// `buf` is an error (the caller hands whole frames only).
    pub fn split(&self, buf: &mut Bytes) -> Result<Option<Bytes>, WireError> {
        if buf.is_empty() {
            return Ok(None);
        }
        if buf.len() < LEN_PREFIX {
            return Err(WireError::Malformed("a frame cut short"));
        }
        let len = self.body_len(&buf[..LEN_PREFIX])?;
        if buf.len() - LEN_PREFIX < len {
            return Err(WireError::Malformed("a frame cut short"));
        }
        buf.advance(LEN_PREFIX);
        Ok(Some(buf.split_to(len)))
    }
}

#[cfg(test)]
mod tests;
