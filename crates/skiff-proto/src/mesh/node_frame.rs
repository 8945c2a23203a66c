//! Frames between nodes: what a node's publishes, requests, replies and
//! broadcasts look like inside the mesh's data datagrams ([`super::packet`]
//! kind 6, one varint-length-prefixed frame each). The first byte says what
//! a frame is:
//!
//! ```text
//! publish     +----+-----------------------------------+
//!             | 1  | message (wire::encode_message)    |
//!             +----+-----------------------------------+
//! request     +----+-----------+-------+---------+--------+-----+---------+
//!             | 2  | token u64 | flags | max u32 | target | key | message |
//!             +----+-----------+-------+---------+--------+-----+---------+
//! reply       +----+-----------+---------+
//!             | 3  | token u64 | message |
//!             +----+-----------+---------+
//! done        +----+-----------+-------------+
//!             | 4  | token u64 | reached u32 |
//!             +----+-----------+-------------+
//! broadcast   +----+---------+---------+
//!             | 5  | cluster | message |
//!             +----+---------+---------+
//! group       +----+-------+---------+
//!             | 6  | group | message |
//!             +----+-------+---------+
//! group req   +----+-----------+-------+---------+--------+-------+--------+---------+
//!             | 7  | token u64 | flags | max u32 | target | count | group… | message |
//!             +----+-----------+-------+---------+--------+-------+--------+---------+
//! ```
//!
//! A group frame is a published message for one member of a queue group
//! on the receiving node: the publishing node chose that node for the
//! group (the plain publish frame reaches plain subscriptions only).
//! A group request is a request to a subject for the receiving node's
//! plain subscriptions and one member of each listed queue group there
//! (the requesting node chose that node for them; `count` a varint, at
//! most [`MAX_GROUPS`]); a plain request frame to a subject reaches one
//! member of every group on the receiving node (what nodes before group
//! requests did).
//!
//! `token` is the origin node's id for the request; `reached` the number
//! of responders a request reached. Target, key, cluster and group are a varint
//! length and bytes (at most [`MAX_NAME`]; target and cluster UTF-8);
//! integers little-endian. A message runs to the end of the frame.
//!
//! [`NodeFrame::decode`] is total and bounded: lengths are checked against
//! their limits and what is left before anything is copied, and trailing
//! bytes are refused.

use bytes::{BufMut, Bytes};

use crate::codec::{Reader, Writer};
use crate::error::WireError;
use crate::message::Message;
use crate::wire;

pub use super::packet::MAX_NAME;

/// The op byte of each frame.
pub mod op {
    /// A published message.
    pub const PUB: u8 = 1;
    /// A request forwarded to a node with a responder.
    pub const REQ: u8 = 2;
    /// A reply to a forwarded request.
    pub const REPLY: u8 = 3;
    /// The end of a forwarded request.
    pub const DONE: u8 = 4;
    /// A cluster broadcast.
    pub const BCAST: u8 = 5;
    /// A published message for one member of a queue group.
    pub const GROUP: u8 = 6;
    /// A request to a subject with the queue groups chosen for the node.
    pub const GREQ: u8 = 7;
}

/// Most queue groups one group request names (a subject that more groups
/// match is answered by the first this many, in the order of their names).
pub const MAX_GROUPS: usize = 64;

/// A frame between nodes, decoded (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub enum NodeFrame {
    /// A published message for the receiving node's subscribers.
    Pub {
        /// The message.
        msg: Message,
    },
    /// A request for a responder on the receiving node.
    Req {
        /// The origin node's id for the request.
        token: u64,
        /// The request's flags (as the client sent them).
        flags: u8,
        /// Most responders wanted.
        max: u32,
        /// The subject or cluster the request is for.
        target: String,
        /// The cluster routing key (may be empty).
        key: Bytes,
        /// The request message.
        msg: Message,
    },
    /// A reply to the origin node.
    Reply {
        /// The origin node's id for the request.
        token: u64,
        /// The reply message.
        msg: Message,
    },
    /// A forwarded request is over on the sending node.
    Done {
        /// The origin node's id for the request.
        token: u64,
        /// How many responders it reached there.
        reached: u32,
    },
    /// A broadcast to the members of a cluster on the receiving node.
    Bcast {
        /// The cluster.
        cluster: String,
        /// The message.
        msg: Message,
    },
    /// A request to a subject for the receiving node's plain
    /// subscriptions and one member of each of `groups` there.
    GroupReq {
        /// The origin node's id for the request.
        token: u64,
        /// The request's flags (as the client sent them).
        flags: u8,
        /// Most responders wanted.
        max: u32,
        /// The subject the request is for.
        target: String,
        /// The queue groups the origin node chose this node for (at most
        /// [`MAX_GROUPS`]).
        groups: Vec<String>,
        /// The request message.
        msg: Message,
    },
    /// A published message for one member of a queue group on the
    /// receiving node.
    Group {
        /// The queue group.
        group: String,
        /// The message.
        msg: Message,
    },
}

/// Appends a request frame (what [`NodeFrame::Req`] encodes to, from
/// borrowed parts).
#[allow(clippy::too_many_arguments)]
pub fn encode_request(
    out: &mut Vec<u8>,
    token: u64,
    flags: u8,
    max: u32,
    target: &str,
    key: &[u8],
    msg: &Message,
) {
    out.put_u8(op::REQ);
    out.put_u64_le(token);
    out.put_u8(flags);
    out.put_u32_le(max);
    out.put_prefixed(target.as_bytes());
    out.put_prefixed(key);
    wire::encode_message(out, msg, false);
}

/// Appends a group request frame (what [`NodeFrame::GroupReq`] encodes
/// to, from borrowed parts; at most [`MAX_GROUPS`] of `groups` are
/// written).
#[allow(clippy::too_many_arguments)]
pub fn encode_group_request<S: AsRef<str>>(
    out: &mut Vec<u8>,
    token: u64,
    flags: u8,
    max: u32,
    target: &str,
    groups: &[S],
    msg: &Message,
) {
    let groups = &groups[..groups.len().min(MAX_GROUPS)];
    out.put_u8(op::GREQ);
    out.put_u64_le(token);
    out.put_u8(flags);
    out.put_u32_le(max);
    out.put_prefixed(target.as_bytes());
    out.put_varint(groups.len() as u64);
    for g in groups {
        out.put_prefixed(g.as_ref().as_bytes());
    }
    wire::encode_message(out, msg, false);
}

/// Appends a reply frame.
pub fn encode_reply(out: &mut Vec<u8>, token: u64, msg: &Message) {
    out.put_u8(op::REPLY);
    out.put_u64_le(token);
    wire::encode_message(out, msg, false);
}

/// Appends a done frame.
pub fn encode_done(out: &mut Vec<u8>, token: u64, reached: u32) {
    out.put_u8(op::DONE);
    out.put_u64_le(token);
    out.put_u32_le(reached);
}

/// Appends a broadcast frame.
pub fn encode_broadcast(out: &mut Vec<u8>, cluster: &str, msg: &Message) {
    out.put_u8(op::BCAST);
    out.put_prefixed(cluster.as_bytes());
    wire::encode_message(out, msg, false);
}

/// The head of a group frame for `group` (its op byte and name): the
/// message's encoding follows it, so a node sends the two as parts.
pub fn group_head(out: &mut Vec<u8>, group: &str) {
    out.put_u8(op::GROUP);
    out.put_prefixed(group.as_bytes());
}

/// Appends a publish frame (the node itself sends the op byte and an
/// already encoded message as two parts, without copying them together).
pub fn encode_publish(out: &mut Vec<u8>, msg: &Message) {
    out.put_u8(op::PUB);
    wire::encode_message(out, msg, false);
}

impl NodeFrame {
    /// Appends the frame's encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            NodeFrame::Pub { msg } => encode_publish(out, msg),
            NodeFrame::Req {
                token,
                flags,
                max,
                target,
                key,
                msg,
            } => encode_request(out, *token, *flags, *max, target, key, msg),
            NodeFrame::GroupReq {
                token,
                flags,
                max,
                target,
                groups,
                msg,
            } => encode_group_request(out, *token, *flags, *max, target, groups, msg),
            NodeFrame::Reply { token, msg } => encode_reply(out, *token, msg),
            NodeFrame::Done { token, reached } => encode_done(out, *token, *reached),
            NodeFrame::Bcast { cluster, msg } => encode_broadcast(out, cluster, msg),
            NodeFrame::Group { group, msg } => {
                group_head(out, group);
                wire::encode_message(out, msg, false);
            }
        }
    }

    /// Decodes one frame, with message payloads up to `max_payload`.
    /// Strings and key are copied out (a pending request must not pin the
    /// datagram); the message is a zero-copy slice of `frame`.
    pub fn decode(frame: &Bytes, max_payload: usize) -> Result<NodeFrame, WireError> {
        let mut r = Reader::new(frame);
        let op = r.u8("node frame op")?;
        let msg = |r: &mut Reader<'_, Bytes>| wire::decode_message(&r.shared_rest(), max_payload);
        let f = match op {
            op::PUB => NodeFrame::Pub { msg: msg(&mut r)? },
            op::REQ => NodeFrame::Req {
                token: r.u64("request token")?,
                flags: r.u8("request flags")?,
                max: r.u32("request max")?,
                target: r.str(MAX_NAME, "request target")?.to_owned(),
                key: Bytes::copy_from_slice(r.bytes(MAX_NAME, "request key")?),
                msg: msg(&mut r)?,
            },
            op::GREQ => {
                let token = r.u64("group request token")?;
                let flags = r.u8("group request flags")?;
                let max = r.u32("group request max")?;
                let target = r.str(MAX_NAME, "group request target")?.to_owned();
                let n = r.varint("group request count")?;
                let n = r.check_len(n, MAX_GROUPS, "group request count")?;
                let mut groups = Vec::new();
                for _ in 0..n {
                    groups.push(r.str(MAX_NAME, "group request group")?.to_owned());
                }
                NodeFrame::GroupReq {
                    token,
                    flags,
                    max,
                    target,
                    groups,
                    msg: msg(&mut r)?,
                }
            }
            op::REPLY => NodeFrame::Reply {
                token: r.u64("reply token")?,
                msg: msg(&mut r)?,
            },
            op::DONE => NodeFrame::Done {
                token: r.u64("done token")?,
                reached: r.u32("done reached")?,
            },
            op::BCAST => NodeFrame::Bcast {
                cluster: r.str(MAX_NAME, "broadcast cluster")?.to_owned(),
                msg: msg(&mut r)?,
            },
            op::GROUP => NodeFrame::Group {
                group: r.str(MAX_NAME, "queue group")?.to_owned(),
                msg: msg(&mut r)?,
            },
            k => return Err(WireError::Kind(k)),
        };
        r.finish()?;
        Ok(f)
    }
}
