//! The frames of the `udp://…?reliable=true` buffer transport: RocketBufs'
//! 32-bit buffer id and 32-bit size header, one frame per tunnel message
//! (the tunnel keeps message boundaries, so a frame's length is the
//! message's). All integers little-endian. A size field of
//! [`MAX_LEN`] + 1 or more is a control marker. The decoders are total
//! and allocate nothing (a segment is a slice of the frame).
//!
//! ```text
//! subscriber -> output   subscribe(id, size): the subscriber's ring holds
//!                        `size` bytes and `records` segments
//!   0       4       8       12
//!   +-------+-------+-------+
//!   | id    | size  |records|
//!   +-------+-------+-------+
//! subscriber -> output   credit: the subscriber consumed `consumed` bytes
//!                        and read `read` segments since it subscribed
//!   0       4            8               16              24
//!   +-------+------------+---------------+---------------+
//!   | id    | 0xfffffffe | consumed u64  | read u64      |
//!   +-------+------------+---------------+---------------+
//! output -> subscriber   subscribed: segments of `id` follow; flow 1 =
//!                        credits, 2 = overwrite
//!   0       4            8    9
//!   +-------+------------+----+
//!   | id    | 0xffffffff |flow|
//!   +-------+------------+----+
//! output -> subscriber   one segment of `len` bytes
//!   0       4       8
//!   +-------+-------+----------------+
//!   | id    | len   | len bytes      |
//!   +-------+-------+----------------+
//! output -> subscriber   closed: 0 = by the producer (after its last
//!                        segment), 1 = corrupt (a segment was larger than
//!                        the subscribed size, or the output's ring broke),
//!                        2 = lost (the buffer's own source died: a spliced
//!                        input whose producer was lost; as over tcp)
//!   0       4            8      9
//!   +-------+------------+------+
//!   | id    | 0xfffffffd |reason|
//!   +-------+------------+------+
//! ```

use bytes::{BufMut, Bytes, BytesMut};

use super::{header, split, BufferId, CloseReason, CLOSE, CREDIT, MAX_LEN, SUBSCRIBED};
use crate::credits::Flow;
use crate::error::WireError;

/// One frame, decoded; see the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A subscriber asks for a buffer's segments.
    Subscribe {
        /// The buffer.
        id: BufferId,
        /// Bytes of the subscriber's ring.
        size: u32,
        /// Segments the subscriber's ring holds.
        records: u32,
    },
    /// What a subscriber consumed so far (credit flow control).
    Credit {
        /// The buffer.
        id: BufferId,
        /// Bytes consumed since it subscribed.
        consumed: u64,
        /// Segments read since it subscribed.
        read: u64,
    },
    /// The output attached the subscriber: segments follow.
    Subscribed {
        /// The buffer.
        id: BufferId,
        /// The buffer's flow control.
        flow: Flow,
    },
    /// One segment.
    Segment {
        /// The buffer.
        id: BufferId,
        /// Its bytes.
        data: &'a [u8],
    },
    /// The buffer's stream ended.
    Close {
        /// The buffer.
        id: BufferId,
        /// Why.
        reason: CloseReason,
    },
}

fn malformed(why: &'static str) -> WireError {
    WireError::Malformed(why)
}

fn head(b: &[u8]) -> Result<(BufferId, u32), WireError> {
    match b.first_chunk::<8>() {
        Some(h) => Ok(split(*h)),
        None => Err(malformed("shorter than the 8-byte header")),
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Decodes a frame a subscriber sent (subscribe or credit).
pub fn decode_up(b: &[u8]) -> Result<Frame<'_>, WireError> {
    let (id, size) = head(b)?;
    match size {
        CREDIT if b.len() == 24 => Ok(Frame::Credit {
            id,
            consumed: u64_at(b, 8),
            read: u64_at(b, 16),
        }),
        CREDIT => Err(malformed("a credit frame is 24 bytes")),
        0 => Err(malformed("subscribe with size 0")),
        s if s > MAX_LEN => Err(malformed("unknown control marker from a subscriber")),
        _ if b.len() != 12 => Err(malformed("a subscribe frame is 12 bytes")),
        _ => match u32_at(b, 8) {
            0 => Err(malformed("subscribe with 0 records")),
            records => Ok(Frame::Subscribe { id, size, records }),
        },
    }
}

/// Decodes a frame an output sent (subscribed, segment or close).
pub fn decode_down(b: &[u8]) -> Result<Frame<'_>, WireError> {
    let (id, len) = head(b)?;
    match len {
        SUBSCRIBED if b.len() == 9 => match Flow::from_code(u32::from(b[8])) {
            Some(flow) => Ok(Frame::Subscribed { id, flow }),
            None => Err(malformed("unknown flow code")),
        },
        SUBSCRIBED => Err(malformed("a subscribed frame is 9 bytes")),
        CLOSE if b.len() == 9 => match CloseReason::decode(b[8]) {
            Some(reason) => Ok(Frame::Close { id, reason }),
            None => Err(malformed("unknown close reason")),
        },
        CLOSE => Err(malformed("a close frame is 9 bytes")),
        l if l > MAX_LEN => Err(malformed("unknown control marker from an output")),
        l if b.len() - 8 != l as usize => Err(malformed("segment length differs from the frame")),
        _ => Ok(Frame::Segment { id, data: &b[8..] }),
    }
}

/// Appends the header of a segment frame of `len` bytes (the caller
/// appends the bytes).
pub fn segment_header(id: BufferId, len: u32, out: &mut Vec<u8>) {
    out.extend_from_slice(&header(id, len));
}

/// Encodes a frame (a segment is usually built in place with
/// [`segment_header`] instead, though it encodes here too).
pub fn encode(f: &Frame<'_>) -> Bytes {
    let mut b = BytesMut::with_capacity(24);
    match *f {
        Frame::Subscribe { id, size, records } => {
            b.put_slice(&header(id, size));
            b.put_u32_le(records);
        }
        Frame::Credit { id, consumed, read } => {
            b.put_slice(&header(id, CREDIT));
            b.put_u64_le(consumed);
            b.put_u64_le(read);
        }
        Frame::Subscribed { id, flow } => {
            b.put_slice(&header(id, SUBSCRIBED));
            b.put_u8(flow.code() as u8);
        }
        Frame::Segment { id, data } => {
            b.put_slice(&header(id, data.len() as u32));
            b.put_slice(data);
        }
        Frame::Close { id, reason } => {
            b.put_slice(&header(id, CLOSE));
            b.put_u8(reason.code());
        }
    }
    b.freeze()
}
