//! Frames between nodes about tunnels: a client's tunnel to a cluster
//! member on another node is relayed over an association between the two
//! nodes, one frame per association message. Tunnel ids are the receiving
//! node's unless said otherwise.
//!
//! ```text
//! open      +---+------------+------------+---------+-----+
//!           | 1 | tunnel u64 | window u32 | cluster | key |   sender's tunnel
//!           +---+------------+------------+---------+-----+
//! opened    +---+------------+-----------------+
//!           | 2 | tunnel u64 | peer tunnel u64 |   opener's, then sender's
//!           +---+------------+-----------------+
//! refused   +---+------------+
//!           | 3 | tunnel u64 |   opener's (no member with capacity)
//!           +---+------------+
//! data      +---+------------+-----------------------------------+
//!           | 4 | tunnel u64 | message (wire::encode_message)    |
//!           +---+------------+-----------------------------------+
//! credit    +---+------------+-------+
//!           | 5 | tunnel u64 | n u32 |
//!           +---+------------+-------+
//! close     +---+------------+
//!           | 6 | tunnel u64 |
//!           +---+------------+
//! nodes     +---+-----+--------+-----+--------+-----+
//!           | 7 | len | frame  | len | frame  | ... |   node frames, in order
//!           +---+-----+--------+-----+--------+-----+
//! ```
//!
//! `nodes` carries the node's publishes, requests, replies, done reports
//! and broadcasts to the peer (each a [`super::node_frame`], after a varint
//! length), batched: many frames per association message, sealed when the
//! node's mesh task goes idle. It is the reliable path between nodes: the
//! association repairs loss, keeps order and delivers each batch once.
//!
//! Cluster and key are a varint length and bytes (at most [`MAX_NAME`],
//! the cluster UTF-8); integers little-endian. [`TunnelFrame::decode`] is
//! total and bounded and refuses trailing bytes.

use bytes::{BufMut, Bytes};

use crate::codec::{Reader, Writer};
use crate::error::WireError;
use crate::message::Message;
use crate::wire;

/// Longest cluster name or key in an `open` frame.
pub const MAX_NAME: usize = 1024;

/// Bytes a node frame may add to its message's payload (op, token, names,
/// subject, type, fields), at most: the bound of a frame in a `nodes`
/// batch is `max_payload` plus this.
pub const MAX_NODE_FRAME_OVERHEAD: usize = 64 << 10;

/// The op byte of each frame.
pub mod op {
    /// Open a tunnel to a member of a cluster.
    pub const OPEN: u8 = 1;
    /// The tunnel is open.
    pub const OPENED: u8 = 2;
    /// No member with capacity.
    pub const REFUSED: u8 = 3;
    /// One message through the tunnel.
    pub const DATA: u8 = 4;
    /// Room for more messages.
    pub const CREDIT: u8 = 5;
    /// The tunnel is closed.
    pub const CLOSE: u8 = 6;
    /// A batch of node frames (not about a tunnel).
    pub const NODES: u8 = 7;
}

/// A frame between nodes about a tunnel (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelFrame {
    /// Open a tunnel to a member of `cluster`.
    Open {
        /// The sender's id for the tunnel.
        tunnel: u64,
        /// How many messages the opener can take.
        window: u32,
        /// The cluster.
        cluster: String,
        /// The routing key (may be empty).
        key: Bytes,
    },
    /// The tunnel is open.
    Opened {
        /// The opener's id for the tunnel.
        tunnel: u64,
        /// The sender's id for it.
        peer_tunnel: u64,
    },
    /// No member with capacity: the open failed.
    Refused {
        /// The opener's id for the tunnel.
        tunnel: u64,
    },
    /// One message.
    Data {
        /// The receiver's id for the tunnel.
        tunnel: u64,
        /// The message.
        msg: Message,
    },
    /// Room for `n` more messages.
    Credit {
        /// The receiver's id for the tunnel.
        tunnel: u64,
        /// How many.
        n: u32,
    },
    /// The tunnel is closed.
    Close {
        /// The receiver's id for the tunnel.
        tunnel: u64,
    },
    /// A batch of node frames, checked (lengths within the message).
    Nodes {
        /// The frames, slices of the message.
        frames: super::Frames,
        /// How many.
        count: u64,
    },
}

impl TunnelFrame {
    /// The tunnel id the frame carries first (see each variant).
    pub fn tunnel(&self) -> u64 {
        match self {
            TunnelFrame::Open { tunnel, .. }
            | TunnelFrame::Opened { tunnel, .. }
            | TunnelFrame::Refused { tunnel }
            | TunnelFrame::Data { tunnel, .. }
            | TunnelFrame::Credit { tunnel, .. }
            | TunnelFrame::Close { tunnel } => *tunnel,
            TunnelFrame::Nodes { .. } => 0,
        }
    }

    /// The frame's encoding, as one association message.
    pub fn encode(&self) -> Bytes {
        let mut f = Vec::new();
        self.encode_into(&mut f);
        f.into()
    }

    /// Appends the frame's encoding to `f`.
    pub fn encode_into(&self, f: &mut Vec<u8>) {
        match self {
            TunnelFrame::Open {
                tunnel,
                window,
                cluster,
                key,
            } => {
                f.put_u8(op::OPEN);
                f.put_u64_le(*tunnel);
                f.put_u32_le(*window);
                f.put_prefixed(cluster.as_bytes());
                f.put_prefixed(key);
            }
            TunnelFrame::Opened {
                tunnel,
                peer_tunnel,
            } => {
                f.put_u8(op::OPENED);
                f.put_u64_le(*tunnel);
                f.put_u64_le(*peer_tunnel);
            }
            TunnelFrame::Refused { tunnel } => {
                f.put_u8(op::REFUSED);
                f.put_u64_le(*tunnel);
            }
            TunnelFrame::Data { tunnel, msg } => {
                f.reserve(9 + msg.payload.len() + msg.subject.len() + 16);
                f.put_u8(op::DATA);
                f.put_u64_le(*tunnel);
                wire::encode_message(f, msg, false);
            }
            TunnelFrame::Credit { tunnel, n } => {
                f.put_u8(op::CREDIT);
                f.put_u64_le(*tunnel);
                f.put_u32_le(*n);
            }
            TunnelFrame::Close { tunnel } => {
                f.put_u8(op::CLOSE);
                f.put_u64_le(*tunnel);
            }
            TunnelFrame::Nodes { frames, .. } => {
                f.put_u8(op::NODES);
                f.extend_from_slice(frames.as_bytes());
            }
        }
    }

    /// Decodes a frame, with message payloads up to `max_payload`; total:
    /// any input gives a frame or an error. The message of a `data` frame
    /// is a zero-copy slice of `b`; cluster and key are copied.
    pub fn decode(b: &Bytes, max_payload: usize) -> Result<TunnelFrame, WireError> {
        if b.first() == Some(&op::NODES) {
            // A node frame is at most a message and its header.
            let max_frame = max_payload.saturating_add(MAX_NODE_FRAME_OVERHEAD);
            let (frames, count) = super::Frames::checked(b.slice(1..), max_frame)?;
            return Ok(TunnelFrame::Nodes { frames, count });
        }
        let mut r = Reader::new(b);
        let kind = r.u8("tunnel frame op")?;
        let tunnel = r.u64("tunnel id")?;
        let f = match kind {
            op::OPEN => TunnelFrame::Open {
                tunnel,
                window: r.u32("tunnel window")?,
                cluster: r.str(MAX_NAME, "tunnel cluster")?.to_owned(),
                key: Bytes::copy_from_slice(r.bytes(MAX_NAME, "tunnel key")?),
            },
            op::OPENED => TunnelFrame::Opened {
                tunnel,
                peer_tunnel: r.u64("peer tunnel id")?,
            },
            op::REFUSED => TunnelFrame::Refused { tunnel },
            op::DATA => {
                let msg = wire::decode_message(&r.shared_rest(), max_payload)?;
                TunnelFrame::Data { tunnel, msg }
            }
            op::CREDIT => TunnelFrame::Credit {
                tunnel,
                n: r.u32("tunnel credit")?,
            },
            op::CLOSE => TunnelFrame::Close { tunnel },
            k => return Err(WireError::Kind(k)),
        };
        r.finish()?;
        Ok(f)
    }
}
