//! Client → node frames: [`ClientFrame`]'s encoding and decoding, and the
//! publish frame written without building a frame.

use crate::router::Syntax;
use crate::varint;
use crate::wire::{self, MAX_SUBJECT};
use crate::{Message, WireError};
use bytes::Bytes;

use super::body::{Enc, Reader};
use super::*;

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
                syntax,
                best_effort,
                group,
            } => {
                let e = Enc::new(out, op::SUB)
                    .v(*sid)
                    .s(pattern.as_bytes())
                    .s(kind.as_bytes())
                    .u8(*policy as u8)
                    .v(u64::from(*queue))
                    .v(u64::from(*credit));
                match (syntax, best_effort, group) {
                    (Syntax::Tokens, false, None) => e.end(),
                    (s, false, None) => e.u8(*s as u8).end(),
                    (s, true, None) => e.u8(*s as u8).u8(1).end(),
                    (s, b, Some(g)) => e.u8(*s as u8).u8(u8::from(*b) | 2).s(g.as_bytes()).end(),
                }
            }
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
            F::Reload { corr } => Enc::new(out, op::RELOAD).v(*corr).end(),
            F::Hello { name } => Enc::new(out, op::HELLO).s(name.as_bytes()).end(),
            F::Confirm => Enc::new(out, op::CONFIRM).end(),
            F::StatsFrom { corr, from } => Enc::new(out, op::STATS_FROM)
                .v(*corr)
                .v(from.client)
                .u8(u8::from(from.sid.is_some()))
                .v(from.sid.unwrap_or(0))
                .end(),
            F::Auth(p) => match p {
                Proof::None => Enc::new(out, op::AUTH).u8(0).end(),
                Proof::Token(t) => Enc::new(out, op::AUTH).u8(1).s(t.as_bytes()).end(),
                Proof::Password { user, password } => Enc::new(out, op::AUTH)
                    .u8(2)
                    .s(user.as_bytes())
                    .s(password.as_bytes())
                    .end(),
                Proof::Signature {
                    public_key,
                    signature,
                } => Enc::new(out, op::AUTH)
                    .u8(3)
                    .s(public_key)
                    .s(signature)
                    .end(),
            },
        }
    }

    /// Decodes one frame body (after the length prefix).
    pub fn decode(body: Bytes, max_payload: usize) -> Result<ClientFrame, WireError> {
        let mut r = Reader::new(&body, max_payload)?;
        use ClientFrame as F;
        let mut group: Option<String> = None;
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
                syntax: if r.more() {
                    Syntax::from_u8(r.u8("syntax")?)
                        .ok_or(WireError::Malformed("unknown pattern syntax"))?
                } else {
                    Syntax::Tokens
                },
                best_effort: if r.more() {
                    match r.u8("subscription flags")? {
                        f @ 0..=1 => f == 1,
                        f @ 2..=3 => {
                            let g = r.string("queue group", MAX_GROUP)?;
                            if g.is_empty() {
                                return Err(WireError::Malformed("empty queue group"));
                            }
                            group = Some(g);
                            f == 3
                        }
                        _ => return Err(WireError::Malformed("unknown subscription flags")),
                    }
                } else {
                    false
                },
                group: group.take(),
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
            op::RELOAD => F::Reload { corr: r.v("corr")? },
            op::HELLO => {
                let name = r.string("client name", MAX_CLIENT_NAME)?;
                if !valid_client_name(&name) {
                    return Err(WireError::Malformed(
                        "a client name holds no control characters",
                    ));
                }
                F::Hello { name }
            }
            op::CONFIRM => F::Confirm,
            op::STATS_FROM => F::StatsFrom {
                corr: r.v("corr")?,
                from: {
                    let client = r.v("client")?;
                    let mid = r.u8("mid")?;
                    let sid = r.v("sid")?;
                    crate::stats::StatsCursor {
                        client,
                        sid: match mid {
                            0 => None,
                            1 => Some(sid),
                            _ => return Err(WireError::Malformed("bad stats cursor")),
                        },
                    }
                },
            },
            op::AUTH => F::Auth(match r.u8("proof kind")? {
                0 => Proof::None,
                1 => Proof::Token(r.string("token", MAX_PROOF_FIELD)?),
                2 => Proof::Password {
                    user: r.string("user", MAX_PROOF_FIELD)?,
                    password: r.string("password", MAX_PROOF_FIELD)?,
                },
                3 => Proof::Signature {
                    public_key: r
                        .bytes("public key", 32)?
                        .as_ref()
                        .try_into()
                        .map_err(|_| WireError::Malformed("a public key is 32 bytes"))?,
                    signature: r
                        .bytes("signature", 64)?
                        .as_ref()
                        .try_into()
                        .map_err(|_| WireError::Malformed("a signature is 64 bytes"))?,
                },
                _ => return Err(WireError::Malformed("unknown proof kind")),
            }),
            _ => return Err(WireError::Malformed("unknown client frame op")),
        };
        r.finish()?;
        Ok(f)
    }
}

/// The subject and payload length of an encoded message with a subject and
/// nothing else but its payload (the common publish), read without
/// building a [`Message`]; `None` for any other encoding, valid or not
/// (decode those with [`crate::wire::decode_message`]). Accepts only
/// what `decode_message(raw, max_payload)` accepts.
pub fn simple_message(raw: &[u8], max_payload: usize) -> Option<(&str, usize)> {
    let (subject, len) = simple_span(raw, max_payload)?;
    Some((std::str::from_utf8(&raw[subject]).ok()?, len))
}

/// What [`simple_message`] reads, without checking that the subject is
/// UTF-8: where the subject lies in `raw`, and the payload length (the
/// payload is the last that many bytes of `raw`). For an encoding already
/// checked once (a message read back where it is only copied, not
/// matched), so the check is not paid again; `None` where
/// [`simple_message`] would say `None` for any other reason.
pub fn simple_span(raw: &[u8], max_payload: usize) -> Option<(std::ops::Range<usize>, usize)> {
    const F_SUBJECT: u8 = 1;
    if *raw.first()? & !wire::F_BEST_EFFORT != F_SUBJECT {
        return None;
    }
    let (n, a) = varint::get(&raw[1..]).ok()?;
    if n == 0 || n > MAX_SUBJECT as u64 {
        return None;
    }
    let start = 1 + a;
    let end = start.checked_add(n as usize)?;
    let (len, b) = varint::get(raw.get(end..)?).ok()?;
    if len > max_payload as u64 || (raw.len() - end - b) as u64 != len {
        return None;
    }
    Some((start..end, len as usize))
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

/// The fixed part of the `Pub` frames of one subject and type, encoded
/// once (a bound publisher's): each publish then writes the length
/// prefix, this, the payload's length and the payload, with no
/// [`Message`] built and no check of the subject or type per publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubHead {
    /// The op and the message's flags, subject and type.
    head: Vec<u8>,
}

impl PubHead {
    /// The head of `Pub` frames of `subject` and `kind`; the caller has
    /// checked both (as [`wire::check`] and the router do for a publish).
    pub fn new(subject: &str, kind: Option<&str>) -> PubHead {
        let mut m = Message::new(subject, Bytes::new());
        if let Some(k) = kind {
            m = m.with_kind(k);
        }
        let mut head = vec![op::PUB];
        wire::encode_message(&mut head, &m, false);
        // The empty payload's length (one byte, 0) is written per publish.
        head.pop();
        PubHead { head }
    }

    /// Bytes the frame of a `payload` of `len` bytes takes, length prefix
    /// included (what [`pub_frame_len`] says of the same message).
    pub fn frame_len(&self, len: usize) -> usize {
        LEN_PREFIX + self.head.len() + varint::len(len as u64) + len
    }

    /// Appends the frame of `payload` to `out` (what [`encode_pub`] would):
    /// each byte written once (no zero fill first), and nothing appended
    /// for a body over 4 GiB.
    pub fn encode(&self, out: &mut Vec<u8>, payload: &[u8]) {
        let n = self.frame_len(payload.len());
        let Ok(body) = u32::try_from(n - LEN_PREFIX) else {
            return;
        };
        out.reserve(n);
        out.extend_from_slice(&body.to_le_bytes());
        out.extend_from_slice(&self.head);
        varint::put(out, payload.len() as u64);
        out.extend_from_slice(payload);
    }

    /// Writes the frame of `payload` into `out`, which must be exactly
    /// [`PubHead::frame_len`] bytes; `false`, with `out` untouched, on any
    /// other length or a body over 4 GiB.
    pub fn encode_into(&self, out: &mut [u8], payload: &[u8]) -> bool {
        if out.len() != self.frame_len(payload.len()) || out.len() - LEN_PREFIX > u32::MAX as usize
        {
            return false;
        }
        let body = (out.len() - LEN_PREFIX) as u32;
        out[..LEN_PREFIX].copy_from_slice(&body.to_le_bytes());
        let mut w = &mut out[LEN_PREFIX..];
        w[..self.head.len()].copy_from_slice(&self.head);
        w = &mut w[self.head.len()..];
        varint::put_buf(&mut w, payload.len() as u64);
        w.copy_from_slice(payload);
        true
    }
}

/// Whether a frame body is a client's `Pub`; its encoded message is then
/// `body[1..]`.
pub fn is_pub(body: &[u8]) -> bool {
    body.first() == Some(&op::PUB)
}
