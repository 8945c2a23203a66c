//! The NATS core client protocol, sans I/O: a parser for what NATS
//! clients send (`CONNECT`, `PUB`, `HPUB`, `SUB`, `UNSUB`, `PING`,
//! `PONG`) and encoders for what a server sends (`INFO`, `MSG`, `HMSG`,
//! `PING`, `PONG`, `+OK`, `-ERR`), modelled on nats-server's
//! `server/parser.go` and `server/client.go`. It owns no socket: the
//! node's NATS listener (`skiff_node::listen::nats`) hands it its read
//! buffer and writes what the encoders append.
//!
//! ```text
//! PUB <subject> [reply-to] <#bytes>\r\n<payload>\r\n
//! HPUB <subject> [reply-to] <#header bytes> <#total bytes>\r\n<headers><payload>\r\n
//! SUB <subject> [queue group] <sid>\r\n
//! UNSUB <sid> [max_msgs]\r\n
//! CONNECT {json}\r\n   PING\r\n   PONG\r\n
//! MSG <subject> <sid> [reply-to] <#bytes>\r\n<payload>\r\n
//! HMSG <subject> <sid> [reply-to] <#header bytes> <#total bytes>\r\n...
//! ```
//!
//! [`Parser`] is total and bounded: a control line longer than its limit,
//! a payload over its limit, a size that is not a number of at most nine
//! digits, or arguments in the wrong number are errors (each with the text
//! nats-server answers, [`NatsError::text`]); nothing is reserved for a
//! payload before its length has been checked. Operation names are read
//! in any case, as nats-server reads them; arguments are split on spaces
//! and tabs.

use bytes::{Buf, Bytes, BytesMut};
use std::ops::Range;

mod headers;

pub use headers::{parse_headers, write_headers, HeaderError, Headers, MAX_HEADERS};

/// nats-server's default longest control line (`max_control_line`).
pub const MAX_CONTROL_LINE: usize = 4096;

/// The protocol version announced in `INFO` (1: headers and no
/// responders, as current servers announce).
pub const PROTO: u32 = 1;

/// What a client sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `CONNECT` and its JSON options, as sent ([`ConnectOptions::parse`]).
    Connect(Bytes),
    /// `PUB` or `HPUB`.
    Pub {
        /// Where to publish.
        subject: Bytes,
        /// Where replies go, if given.
        reply: Option<Bytes>,
        /// The header block (`NATS/1.0 ...\r\n\r\n`) of an `HPUB`.
        headers: Option<Bytes>,
        /// The payload (after the headers).
        payload: Bytes,
    },
    /// `SUB`.
    Sub {
        /// The subject pattern (`*`, `>`).
        subject: Bytes,
        /// The queue group, if given.
        queue: Option<Bytes>,
        /// The client's name for the subscription.
        sid: Bytes,
    },
    /// `UNSUB`, now or after `max` messages in all.
    Unsub {
        /// The subscription.
        sid: Bytes,
        /// Messages after which it ends (counted from its start).
        max: Option<u64>,
    },
    /// `PING`: answer `PONG`.
    Ping,
    /// `PONG`: the answer to the server's `PING`.
    Pong,
    /// `INFO`, `+OK` or `-ERR` sent by a client: accepted and ignored,
    /// as nats-server does for clients.
    Ignored,
}

/// Why the input is not the NATS client protocol, or breaks a limit.
/// Every variant closes the connection, after [`NatsError::text`] is sent
/// as `-ERR`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NatsError {
    /// An operation name this protocol does not have.
    #[error("unknown protocol operation")]
    UnknownOp,
    /// A control line longer than the limit.
    #[error("control line of more than {max} bytes")]
    ControlLine {
        /// The limit.
        max: usize,
    },
    /// A payload larger than the limit.
    #[error("payload of {len} bytes is over the limit of {max}")]
    Payload {
        /// What the client announced.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// Arguments in the wrong number or form (`what` says which operation).
    #[error("{0}")]
    Args(&'static str),
    /// The bytes after a payload were not `\r\n`.
    #[error("payload not followed by CRLF")]
    PayloadEnd,
}

impl NatsError {
    /// What nats-server sends for this error, inside `-ERR '...'`.
    pub fn text(&self) -> &'static str {
        match self {
            NatsError::UnknownOp | NatsError::PayloadEnd => "Unknown Protocol Operation",
            NatsError::ControlLine { .. } => "Maximum Control Line Exceeded",
            NatsError::Payload { .. } => "Maximum Payload Violation",
            NatsError::Args(what) => what,
        }
    }
}

/// A payload announced by a `PUB`/`HPUB` line and not yet whole.
#[derive(Debug, Clone)]
struct Awaiting {
    subject: Bytes,
    reply: Option<Bytes>,
    /// Header bytes (0: a `PUB`; an `HPUB`'s header block is never empty).
    hdr: usize,
    total: usize,
    hpub: bool,
}

/// The client protocol's parser (see the module documentation). Feed it
/// the read buffer with [`Parser::next`] until it returns `Ok(None)`.
#[derive(Debug, Clone)]
pub struct Parser {
    max_control: usize,
    max_payload: usize,
    awaiting: Option<Awaiting>,
}

impl Parser {
    /// A parser with these limits (control line, payload including
    /// headers).
    pub fn new(max_control: usize, max_payload: usize) -> Parser {
        Parser {
            max_control,
            max_payload,
            awaiting: None,
        }
    }

    /// Whether an operation has begun and is not whole (a payload, or a
    /// line without its end).
    pub fn mid_op(&self, buf: &[u8]) -> bool {
        self.awaiting.is_some() || !buf.is_empty()
    }

    /// The next whole operation in `buf`, removed from it; `Ok(None)` when
    /// more bytes are needed. After an error the connection must close.
    pub fn next(&mut self, buf: &mut BytesMut) -> Result<Option<Op>, NatsError> {
        loop {
            if let Some(a) = &self.awaiting {
                let need = a.total + 2;
                if buf.len() < need {
                    // Room for the rest of this payload only: it was
                    // checked against the limit.
                    buf.reserve(need - buf.len());
                    return Ok(None);
                }
                let a = self.awaiting.take().expect("checked");
                let mut body = buf.split_to(a.total).freeze();
                if &buf[..2] != b"\r\n" {
                    return Err(NatsError::PayloadEnd);
                }
                buf.advance(2);
                let headers = a.hpub.then(|| body.split_to(a.hdr));
                return Ok(Some(Op::Pub {
                    subject: a.subject,
                    reply: a.reply,
                    headers,
                    payload: body,
                }));
            }
            let Some(end) = memchr_nl(buf, self.max_control + 2) else {
                if buf.len() > self.max_control + 1 {
                    return Err(NatsError::ControlLine {
                        max: self.max_control,
                    });
                }
                return Ok(None);
            };
            let mut line = buf.split_to(end + 1).freeze();
            line.truncate(end);
            if line.last() == Some(&b'\r') {
                line.truncate(end - 1);
            }
            if line.len() > self.max_control {
                return Err(NatsError::ControlLine {
                    max: self.max_control,
                });
            }
            if let Some(op) = self.line(line)? {
                return Ok(Some(op));
            }
        }
    }

    /// The next operation in place, when it is a whole plain publish:
    /// `PUB <subject> <size>\r\n`, single spaces, no reply subject, with
    /// its payload and its CRLF all in `buf`, within the limits. The
    /// caller reads the subject and the payload as slices of `buf` and
    /// consumes [`PlainPub::len`] bytes; no `Bytes` is made. Anything
    /// else (and any error) is `None`: [`Parser::next`] reads it. For the
    /// bytes it takes, this is exactly the `Op::Pub` that `next` returns.
    pub fn plain_pub(&self, buf: &[u8]) -> Option<PlainPub> {
        if self.awaiting.is_some() || !buf.starts_with(b"PUB ") {
            return None;
        }
        let end = memchr_nl(buf, self.max_control + 2)?;
        // The line without its CRLF (a bare LF: left to `next`).
        if end < 1 || buf[end - 1] != b'\r' || end - 1 > self.max_control {
            return None;
        }
        let rest = &buf[4..end - 1];
        let space = rest.iter().position(|&b| b == b' ')?;
        let (subject, digits) = (&rest[..space], &rest[space + 1..]);
        if subject.is_empty() || subject.contains(&b'\t') {
            return None;
        }
        let total = size(digits)?;
        if total > self.max_payload as u64 {
            return None;
        }
        let start = end + 1;
        let stop = start + total as usize;
        if buf.get(stop..stop + 2)? != b"\r\n" {
            return None;
        }
        Some(PlainPub {
            subject: 4..4 + space,
            payload: start..stop,
            len: stop + 2,
        })
    }

    /// One control line (without its CRLF): an operation, or `None` when
    /// a payload follows (then `self.awaiting` is set).
    fn line(&mut self, line: Bytes) -> Result<Option<Op>, NatsError> {
        let name_end = line
            .iter()
            .position(|&b| b == b' ' || b == b'\t')
            .unwrap_or(line.len());
        let name = &line[..name_end];
        let rest = &line[name_end..];
        let eq = |s: &[u8]| name.eq_ignore_ascii_case(s);
        // An argument as its own `Bytes` (only those kept are sliced).
        let arg = |r: &Range<usize>| line.slice(name_end + r.start..name_end + r.end);
        let mut a: [Range<usize>; 4] = Default::default();
        if eq(b"PUB") {
            let (subject, reply, total) = match split(rest, &mut a[..3]) {
                Some(2) => (arg(&a[0]), None, &rest[a[1].clone()]),
                Some(3) => (arg(&a[0]), Some(arg(&a[1])), &rest[a[2].clone()]),
                _ => return Err(NatsError::Args("processPub Parse Error")),
            };
            let total = size(total).ok_or(NatsError::Args("processPub Bad or Missing Size"))?;
            self.awaiting = Some(Awaiting {
                subject,
                reply,
                hdr: 0,
                total: self.check_payload(total)?,
                hpub: false,
            });
            Ok(None)
        } else if eq(b"HPUB") {
            let (subject, reply, hdr, total) = match split(rest, &mut a) {
                Some(3) => (arg(&a[0]), None, &rest[a[1].clone()], &rest[a[2].clone()]),
                Some(4) => (
                    arg(&a[0]),
                    Some(arg(&a[1])),
                    &rest[a[2].clone()],
                    &rest[a[3].clone()],
                ),
                _ => return Err(NatsError::Args("processHeaderPub Parse Error")),
            };
            let hdr = size(hdr).ok_or(NatsError::Args(
                "processHeaderPub Bad or Missing Header Size",
            ))?;
            let total = size(total).ok_or(NatsError::Args(
                "processHeaderPub Bad or Missing Total Size",
            ))?;
            if hdr > total {
                return Err(NatsError::Args(
                    "processHeaderPub Header Size larger then TotalSize",
                ));
            }
            self.awaiting = Some(Awaiting {
                subject,
                reply,
                hdr: hdr as usize,
                total: self.check_payload(total)?,
                hpub: true,
            });
            Ok(None)
        } else if eq(b"SUB") {
            match split(rest, &mut a[..3]) {
                Some(2) => Ok(Some(Op::Sub {
                    subject: arg(&a[0]),
                    queue: None,
                    sid: arg(&a[1]),
                })),
                Some(3) => Ok(Some(Op::Sub {
                    subject: arg(&a[0]),
                    queue: Some(arg(&a[1])),
                    sid: arg(&a[2]),
                })),
                _ => Err(NatsError::Args("processSub Parse Error")),
            }
        } else if eq(b"UNSUB") {
            match split(rest, &mut a[..2]) {
                Some(1) => Ok(Some(Op::Unsub {
                    sid: arg(&a[0]),
                    max: None,
                })),
                Some(2) => Ok(Some(Op::Unsub {
                    sid: arg(&a[0]),
                    max: Some(
                        size(&rest[a[1].clone()])
                            .ok_or(NatsError::Args("processUnsub Parse Error"))?,
                    ),
                })),
                _ => Err(NatsError::Args("processUnsub Parse Error")),
            }
        } else if eq(b"PING") && blank(rest) {
            Ok(Some(Op::Ping))
        } else if eq(b"PONG") && blank(rest) {
            Ok(Some(Op::Pong))
        } else if eq(b"CONNECT") {
            Ok(Some(Op::Connect(trim(line.slice(name_end..)))))
        } else if eq(b"INFO") || eq(b"+OK") || eq(b"-ERR") {
            Ok(Some(Op::Ignored))
        } else {
            Err(NatsError::UnknownOp)
        }
    }

    fn check_payload(&self, total: u64) -> Result<usize, NatsError> {
        if total > self.max_payload as u64 {
            return Err(NatsError::Payload {
                len: total,
                max: self.max_payload,
            });
        }
        Ok(total as usize)
    }
}

/// A whole plain `PUB` at the start of a buffer ([`Parser::plain_pub`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainPub {
    /// Where its subject lies in the buffer.
    pub subject: Range<usize>,
    /// Where its payload lies in the buffer.
    pub payload: Range<usize>,
    /// Bytes it takes, from the buffer's start (control line, payload
    /// and their CRLFs).
    pub len: usize,
}

/// The index of the first `\n` within the first `limit` bytes.
fn memchr_nl(buf: &[u8], limit: usize) -> Option<usize> {
    buf[..buf.len().min(limit)].iter().position(|&b| b == b'\n')
}

fn blank(b: &[u8]) -> bool {
    b.iter().all(|&c| c == b' ' || c == b'\t')
}

fn trim(b: Bytes) -> Bytes {
    let start = b
        .iter()
        .position(|&c| c != b' ' && c != b'\t')
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|&c| c != b' ' && c != b'\t')
        .map_or(start, |e| e + 1);
    b.slice(start..end.max(start))
}

/// Splits `rest` on spaces and tabs into `out` (where each argument lies
/// in `rest`); the number of arguments, or `None` when there are more than
/// `out` holds.
fn split(rest: &[u8], out: &mut [Range<usize>]) -> Option<usize> {
    let mut n = 0;
    let mut start = None;
    for (i, &b) in rest.iter().enumerate() {
        if b == b' ' || b == b'\t' {
            if let Some(s) = start.take() {
                *out.get_mut(n)? = s..i;
                n += 1;
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        *out.get_mut(n)? = s..rest.len();
        n += 1;
    }
    Some(n)
}

/// A size as nats-server's `parseSize` reads it: one to nine digits.
fn size(d: &[u8]) -> Option<u64> {
    if d.is_empty() || d.len() > 9 || !d.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(d.iter().fold(0u64, |n, &c| n * 10 + u64::from(c - b'0')))
}

/// A client's `CONNECT` options (the fields this server acts on; others
/// are ignored, as nats-server ignores unknown ones). `Debug` hides the
/// secrets.
#[derive(Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default)]
pub struct ConnectOptions {
    /// Answer every operation with `+OK`.
    pub verbose: bool,
    /// Check subjects strictly (`-ERR 'Invalid Publish Subject'`).
    pub pedantic: bool,
    /// Whether the client wants its own messages (default true).
    #[serde(default = "yes")]
    pub echo: bool,
    /// The client understands `HMSG`.
    pub headers: bool,
    /// The client wants a 503 status message for requests nobody answers.
    pub no_responders: bool,
    /// The client's name.
    pub name: String,
    /// Its language.
    pub lang: String,
    /// Its version.
    pub version: String,
    /// Protocol version.
    pub protocol: u32,
    /// Token authentication.
    pub auth_token: Option<String>,
    /// User name.
    pub user: Option<String>,
    /// Password.
    pub pass: Option<String>,
    /// Public key (nkey) for nonce signing.
    pub nkey: Option<String>,
    /// The nonce signed with the key, base64url.
    pub sig: Option<String>,
    /// A user JWT (not supported: refused as an authorization violation).
    pub jwt: Option<String>,
}

fn yes() -> bool {
    true
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |o: &Option<String>| o.as_ref().map(|_| "***");
        f.debug_struct("ConnectOptions")
            .field("verbose", &self.verbose)
            .field("pedantic", &self.pedantic)
            .field("echo", &self.echo)
            .field("headers", &self.headers)
            .field("no_responders", &self.no_responders)
            .field("name", &self.name)
            .field("lang", &self.lang)
            .field("version", &self.version)
            .field("protocol", &self.protocol)
            .field("auth_token", &hidden(&self.auth_token))
            .field("user", &self.user)
            .field("pass", &hidden(&self.pass))
            .field("nkey", &self.nkey)
            .field("sig", &hidden(&self.sig))
            .field("jwt", &hidden(&self.jwt))
            .finish()
    }
}

impl ConnectOptions {
    /// Parses `CONNECT`'s JSON (bounded by the control line).
    pub fn parse(json: &[u8]) -> Result<ConnectOptions, NatsError> {
        let mut o: ConnectOptions = serde_json::from_slice(json)
            .map_err(|_| NatsError::Args("processConnect Parse Error"))?;
        // Clients that speak protocol 0 do not take headers.
        if o.headers && o.protocol < 1 {
            o.headers = false;
        }
        if !o.headers {
            o.no_responders = false;
        }
        Ok(o)
    }
}

/// What goes into `INFO`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Info<'a> {
    /// The node's id.
    pub server_id: &'a str,
    /// The node's name.
    pub server_name: &'a str,
    /// The version announced (a nats-server version string clients
    /// accept, and skiff's own in `skiff`).
    pub version: &'a str,
    /// Protocol version ([`PROTO`]).
    pub proto: u32,
    /// Implementation language.
    pub go: &'a str,
    /// Listening host.
    pub host: &'a str,
    /// Listening port.
    pub port: u16,
    /// Headers supported.
    pub headers: bool,
    /// Largest payload (headers included).
    pub max_payload: u64,
    /// The connection's id.
    pub client_id: u64,
    /// The client's address.
    pub client_ip: &'a str,
    /// Whether authentication is needed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub auth_required: bool,
    /// Whether TLS is needed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub tls_required: bool,
    /// Whether the client may start TLS (after this `INFO`) though it
    /// need not (nats-server's `allow_non_tls`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub tls_available: bool,
    /// Whether the client must present a certificate (mutual TLS).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub tls_verify: bool,
    /// A nonce to sign (nkey authentication).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nonce: Option<&'a str>,
}

/// Appends `INFO {json}\r\n`.
pub fn encode_info(out: &mut Vec<u8>, info: &Info<'_>) {
    out.extend_from_slice(b"INFO ");
    // Serializing a struct of strings and numbers cannot fail.
    let _ = serde_json::to_writer(&mut *out, info);
    out.extend_from_slice(b"\r\n");
}

/// Appends `-ERR '<text>'\r\n`.
pub fn encode_err(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(b"-ERR '");
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(b"'\r\n");
}

/// `+OK\r\n`.
pub const OK: &[u8] = b"+OK\r\n";
/// `PING\r\n`.
pub const PING: &[u8] = b"PING\r\n";
/// `PONG\r\n`.
pub const PONG: &[u8] = b"PONG\r\n";

/// Appends `MSG <subject> <sid> [reply] <#bytes>\r\n<payload>\r\n`.
pub fn encode_msg(out: &mut Vec<u8>, subject: &[u8], sid: &[u8], reply: &[u8], payload: &[u8]) {
    // One capacity check for the whole message (the size takes at most
    // 20 digits).
    out.reserve(subject.len() + sid.len() + reply.len() + payload.len() + 32);
    out.extend_from_slice(b"MSG ");
    out.extend_from_slice(subject);
    out.push(b' ');
    out.extend_from_slice(sid);
    out.push(b' ');
    if !reply.is_empty() {
        out.extend_from_slice(reply);
        out.push(b' ');
    }
    push_num(out, payload.len() as u64);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
}

/// Appends `HMSG <subject> <sid> [reply] <#hdr> <#total>\r\n<headers><payload>\r\n`
/// with `headers` a whole header block ([`write_headers`]).
pub fn encode_hmsg(
    out: &mut Vec<u8>,
    subject: &[u8],
    sid: &[u8],
    reply: &[u8],
    headers: &[u8],
    payload: &[u8],
) {
    out.extend_from_slice(b"HMSG ");
    out.extend_from_slice(subject);
    out.push(b' ');
    out.extend_from_slice(sid);
    out.push(b' ');
    if !reply.is_empty() {
        out.extend_from_slice(reply);
        out.push(b' ');
    }
    push_num(out, headers.len() as u64);
    out.push(b' ');
    push_num(out, (headers.len() + payload.len()) as u64);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(headers);
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
}

/// Appends `n` in decimal.
pub fn push_num(out: &mut Vec<u8>, mut n: u64) {
    let mut d = [0u8; 20];
    let mut i = d.len();
    loop {
        i -= 1;
        d[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&d[i..]);
}

/// Whether `s` is a valid subject to publish to (no wildcards, no empty
/// tokens, no whitespace), as nats-server's `IsValidLiteralSubject`.
pub fn valid_literal_subject(s: &[u8]) -> bool {
    valid_subject(s) && s.split(|&b| b == b'.').all(|t| t != b"*" && t != b">")
}

/// Whether `s` is a valid subscription subject: non-empty tokens without
/// whitespace, `>` only last, as nats-server's `IsValidSubject`.
pub fn valid_subject(s: &[u8]) -> bool {
    if s.is_empty() {
        return false;
    }
    let mut tokens = s.split(|&b| b == b'.').peekable();
    while let Some(t) = tokens.next() {
        if t.is_empty()
            || t.iter()
                .any(|&b| b == b' ' || b == b'\t' || b == b'\r' || b == b'\n')
        {
            return false;
        }
        if t == b">" && tokens.peek().is_some() {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests;
