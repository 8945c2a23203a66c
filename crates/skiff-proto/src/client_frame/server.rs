//! Node → client frames: [`ServerFrame`]'s encoding and decoding, and the
//! message frames the node writes without building a frame.

use crate::codec;
use crate::varint;
use crate::wire::MAX_SUBJECT;
use crate::{Message, WireError};
use bytes::Bytes;

use super::body::{Enc, Reader};
use super::*;

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

/// Bytes the `Msg` frame [`encode_msg_raw`] appends for a `raw` of
/// `raw_len` bytes takes, length prefix included.
pub fn msg_raw_frame_len(sid: u64, token: u64, raw_len: usize) -> usize {
    LEN_PREFIX + 1 + varint::len(sid) + varint::len(token) + raw_len
}

/// Writes the `Msg` frame [`encode_msg_raw`] appends into `out`, which
/// must be exactly [`msg_raw_frame_len`] bytes: a message written once,
/// in place (a shared-memory ring's segment). `false`, with `out`
/// untouched, on any other length or a body over 4 GiB.
pub fn encode_msg_raw_into(out: &mut [u8], sid: u64, token: u64, raw: &[u8]) -> bool {
    if out.len() != msg_raw_frame_len(sid, token, raw.len())
        || out.len() - LEN_PREFIX > u32::MAX as usize
    {
        return false;
    }
    let body = (out.len() - LEN_PREFIX) as u32;
    let mut w: &mut [u8] = out;
    bytes::BufMut::put_slice(&mut w, &body.to_le_bytes());
    bytes::BufMut::put_u8(&mut w, op::MSG);
    varint::put_buf(&mut w, sid);
    varint::put_buf(&mut w, token);
    bytes::BufMut::put_slice(&mut w, raw);
    true
}

/// Appends a `Msg` frame for `msg` (what [`ServerFrame::Msg`] encodes to).
pub fn encode_msg(out: &mut Vec<u8>, sid: u64, token: u64, msg: &Message) {
    Enc::new(out, op::MSG).v(sid).v(token).msg(msg).end();
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
            F::Ping => Enc::new(out, op::S_PING).end(),
            F::Taken { n } => Enc::new(out, op::TAKEN).v(*n).end(),
            F::Challenge { nonce } => Enc::new(out, op::CHALLENGE).s(nonce).end(),
        }
    }

    /// For a `Msg` frame body: its subscription, its reply token and where
    /// its message starts, without decoding the message (the client
    /// decodes it straight into the subscription's queue with
    /// [`crate::wire::decode_message_into`]); `None` for any other
    /// frame.
    pub fn msg_header(body: &[u8]) -> Result<Option<(u64, u64, usize)>, WireError> {
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
            op::S_PING => F::Ping,
            op::TAKEN => F::Taken { n: r.v("taken")? },
            op::CHALLENGE => F::Challenge {
                nonce: r.bytes("nonce", MAX_NONCE)?,
            },
            _ => return Err(WireError::Malformed("unknown server frame op")),
        };
        r.finish()?;
        Ok(f)
    }
}
