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
//! frame as the NATS protocol says it. Files: this one has the listener,
//! a connection's task and its subscriptions; `hello.rs` how a connection
//! opens (`INFO`, the nonce, `CONNECT`'s credentials), `read.rs` the
//! reader, `write.rs` the writer, `tls.rs` TLS on the NATS port.
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
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;

use skiff_proto::client_frame::{simple_span, ClientFrame, Code, ServerFrame};
use skiff_proto::nats::{self, ConnectOptions, Parser, MAX_CONTROL_LINE};
use skiff_proto::router::{Pattern, Subject};
use skiff_proto::{Message, Value};

use crate::broker::Broker;
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

/// The least room a connection's reader reads into.
const READ_MIN: usize = 64 * 1024;

/// The most room a connection's reader reads into, reached while each
/// read fills what it had (a publisher faster than the node): fewer,
/// larger reads.
const READ_MAX: usize = 256 * 1024;

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
    let mut buf = BytesMut::with_capacity(READ_MIN);
    // Room for the next read: grows while reads fill it (a fast
    // publisher: fewer, larger reads), back to the least when one does
    // not, and then the buffer shrinks back too.
    let mut room = READ_MIN;
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
            buf.reserve(room);
        }
        let space = buf.capacity() - buf.len();
        tokio::select! {
            n = r.read_buf(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if n == space {
                        room = (room * 2).min(READ_MAX);
                    } else {
                        room = READ_MIN;
                    }
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
        if room == READ_MIN && buf.is_empty() && buf.capacity() > 2 * READ_MIN {
            buf = BytesMut::with_capacity(READ_MIN);
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

mod hello;
mod read;
mod tls;
mod write;
use hello::{authenticate, Hello};
use read::{end_sub, Reader};
use tls::connect;
pub(crate) use tls::NatsTlsSetup;
pub use tls::TLS_REQUIRED;
use write::write_loop;
