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
//! s:type u8:policy v:queue v:credit [u8:syntax]` (syntax present only
//! for a cMsg subscription: 1), `Unsub v:sid`, `Credit v:sid v:n`,
//! `Req v:rid u8:flags v:max s:target s:key [msg]`, `Reply v:token [msg]`,
//! `Cancel v:rid`, `Join v:corr s:cluster v:capacity`, `Leave v:corr
//! s:cluster`, `Bcast s:cluster [msg]`, `TunOpen v:corr s:cluster s:key
//! v:window`, `TunData v:tunnel [msg]`, `TunCredit v:tunnel v:n`, `TunClose
//! v:tunnel`, `Stats v:corr`, `Ping v:corr`, `StatsFrom v:corr v:client
//! u8:mid v:sid`, `Auth u8:kind …` (see [`Proof`]), `Reload v:corr`,
//! `Hello s:name`, `Confirm`.
//!
//! Node → client ([`ServerFrame`]): `Welcome v:client v:max_payload`,
//! `Ack v:corr`, `Error v:corr v:code s:text` (corr 0: about the
//! connection, which the node then closes), `Msg v:sid v:token [msg]`,
//! `Dropped v:sid v:total`, `Request v:token s:cluster [msg]`, `Bcast
//! s:cluster [msg]`, `Reply v:rid [msg]`, `ReqDone v:rid v:code`,
//! `TunIncoming v:tunnel s:cluster v:window`, `TunOpened v:corr v:tunnel
//! v:window`, `TunData`, `TunCredit`, `TunClose` as above, `Stats v:corr
//! s:json`, `Pong v:corr`, `Ping`, `Challenge s:nonce`, `Taken v:n`.
//!
//! # Handshake
//! A node without authentication sends `Welcome` first. A node with
//! authentication sends `Challenge` first, with a fresh nonce; the client
//! answers with one `Auth` frame (its [`Proof`]: a token, a user and
//! password, or an Ed25519 signature over the nonce) and then waits for
//! `Welcome`, or `Error` with [`Code::Auth`] (the node closes). Nothing
//! else is read before `Auth`, and a client that has not authenticated
//! within the node's time limit is closed.
//!
//! ```text
//! Challenge: | len | 81 | v:n | nonce (n ≤ 64 bytes) |
//! Auth:      | len | 18 | 0 (none)                              |
//!            | len | 18 | 1 | s:token                           |
//!            | len | 18 | 2 | s:user | s:password              |
//!            | len | 18 | 3 | s:public key (32) | s:signature (64) |
//! ```
//!
//! After `Welcome` a client may name itself with `Hello` (shown by the
//! node's `/connz` and stats; optional, so a client that never sends it
//! works as before). The name is UTF-8 of at most [`MAX_CLIENT_NAME`]
//! bytes without control characters; anything else is a protocol error.
//!
//! ```text
//! Hello:     | len | 19 | v:n | name (n ≤ 128 bytes, UTF-8) |
//! ```
//!
//! Stats come in pages: a `Stats` reply holds at most about
//! [`STATS_PAGE`] bytes of JSON, and when more remain its JSON carries
//! `next` ([`crate::stats::StatsCursor`]), which the client asks for with
//! `StatsFrom` (the way `/connz?offset=` pages in NATS). One page is in
//! flight at a time, so a big answer flows as the client reads it. A
//! client that does not know `next` sees the first page.
//!
//! [`Decoder`] is total and bounded: it checks the body length against its
//! limit before it reserves anything, and any input yields a frame, a need
//! for more bytes, or an error.

use crate::router::Syntax;
use crate::Message;
use bytes::Bytes;

/// Bytes before a frame's body: its length.
pub const LEN_PREFIX: usize = 4;
/// Room in a frame beyond the message's payload for ids, subject, type and
/// fields, when checking a frame's length against the message size limit.
pub const FRAME_OVERHEAD: usize = 64 * 1024;

/// Bytes of stats JSON a node puts in one `Stats` reply (about: a page
/// ends at the first client or subscription that does not fit, and holds
/// at least one).
pub const STATS_PAGE: usize = 256 * 1024;

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
    /// Authentication failed or is missing (the node closes).
    Auth,
    /// The user may not do this (its permissions); only this operation
    /// fails.
    Denied,
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
            Code::Auth => 9,
            Code::Denied => 10,
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
            9 => Code::Auth,
            10 => Code::Denied,
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

/// Longest queue group name in a `Sub` frame.
pub const MAX_GROUP: usize = 255;

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
        /// The kind of both patterns. Encoded as a trailing byte only when
        /// not [`Syntax::Tokens`], so a token subscription reads the same
        /// to a node that predates cMsg patterns.
        syntax: Syntax,
        /// Best effort (`reliable=false`): copies that reach this node from
        /// other nodes for this subscription alone may travel as datagrams,
        /// their loss counted. Encoded as one more trailing byte (flags,
        /// bit 0) after the syntax byte, only when set.
        best_effort: bool,
        /// A queue group (NATS `SUB subject group sid`): of the matching
        /// subscriptions in one group, skiff's and NATS clients' alike,
        /// one in the whole mesh gets each message and request. Flags bit
        /// 1, then the name (a literal subject, at most [`MAX_GROUP`]
        /// bytes) after the flags byte; a node that predates queue groups
        /// refuses the frame (unknown subscription flags).
        group: Option<String>,
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
    /// Ask for the page of the node's counters that starts at `from` (the
    /// `next` of the previous page); answered with `Stats`.
    StatsFrom {
        /// Echoed in the answer.
        corr: u64,
        /// Where the page starts.
        from: crate::stats::StatsCursor,
    },
    /// The answer to the node's `Challenge`: who the client is.
    Auth(Proof),
    /// Ask the node to reread its configuration file and apply what can
    /// change while it runs (`skiff reload`); answered with `Ack`, or
    /// `Error` with the reason the file was refused. Nodes take it only
    /// from clients on the same host.
    Reload {
        /// Echoed in the answer.
        corr: u64,
    },
    /// The client's name, for the node's monitoring (`/connz`, stats);
    /// sent after `Welcome`, optional. See [`valid_client_name`].
    Hello {
        /// The name.
        name: String,
    },
    /// Asks the node to confirm what it takes: from now on it sends
    /// [`ServerFrame::Taken`] after each read that held publishes, so the
    /// client knows which of its publishes reached the node (and which
    /// may not have, when the node is lost).
    Confirm,
}

/// Longest client name in a `Hello` frame, in bytes.
pub const MAX_CLIENT_NAME: usize = 128;

/// Whether `name` is a client name a `Hello` frame may carry: at most
/// [`MAX_CLIENT_NAME`] bytes, no control characters.
pub fn valid_client_name(name: &str) -> bool {
    name.len() <= MAX_CLIENT_NAME && !name.chars().any(char::is_control)
}

/// Longest secret, user name or nonce in a handshake frame, in bytes.
pub const MAX_PROOF_FIELD: usize = 1024;

/// Longest nonce in a `Challenge`, in bytes.
pub const MAX_NONCE: usize = 64;

/// What a client proves its identity with (`Auth` frame). `Debug` never
/// shows a secret.
#[derive(Clone, PartialEq, Eq)]
pub enum Proof {
    /// Nothing (the node refuses it when it requires authentication).
    None,
    /// The node's shared token.
    Token(String),
    /// A user name and its password.
    Password {
        /// The user's name.
        user: String,
        /// The password.
        password: String,
    },
    /// An Ed25519 public key and its signature over the challenge's nonce.
    Signature {
        /// The public key.
        public_key: [u8; 32],
        /// The signature.
        signature: [u8; 64],
    },
}

impl std::fmt::Debug for Proof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Proof::None => f.write_str("None"),
            Proof::Token(_) => f.write_str("Token(***)"),
            Proof::Password { user, .. } => write!(f, "Password {{ user: {user:?}, .. }}"),
            Proof::Signature { .. } => f.write_str("Signature { .. }"),
        }
    }
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
    /// The node's keepalive: it has read nothing from this client for
    /// `ping_interval_ms`; the client answers with any frame (a `Ping`),
    /// or is closed after `max_pings_out` unanswered.
    Ping,
    /// First frame from a node that requires authentication: answer with
    /// `Auth`, whose signature (if any) covers `nonce`.
    Challenge {
        /// Fresh random bytes, at most [`MAX_NONCE`].
        nonce: Bytes,
    },
    /// The node has taken the first `n` publishes (`Pub` frames) this
    /// connection carried and handed them on; sent (after `Confirm`) at
    /// most once per read of the client's input, not per message.
    Taken {
        /// Publishes taken since the connection began.
        n: u64,
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
    pub(super) const STATS_FROM: u8 = 17;
    pub(super) const AUTH: u8 = 18;
    pub(super) const HELLO: u8 = 19;
    /// Out of the run of the others, so frames added elsewhere meanwhile
    /// do not collide with it.
    pub(super) const RELOAD: u8 = 40;
    pub(super) const CONFIRM: u8 = 41;

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
    pub(super) const S_PING: u8 = 80;
    pub(super) const CHALLENGE: u8 = 81;
    pub(super) const TAKEN: u8 = 82;
}

mod body;
mod client;
mod server;

pub use body::Decoder;
pub use client::{
    encode_pub, encode_pub_into, is_pub, pub_frame_len, simple_message, simple_span, PubHead,
};
pub use server::{encode_msg, encode_msg_raw, encode_msg_raw_into, msg_raw_frame_len};

#[cfg(test)]
mod tests;
