//! The headers of the `tcp://` buffer transport: a 32-bit buffer id and a
//! 32-bit size (little-endian) before each segment's bytes. A size field
//! above [`MAX_LEN`] (`0xffffff00`) is a control marker.
//!
//! ```text
//! subscriber -> output (8 bytes each)
//!   0       4            8
//!   +-------+------------+
//!   | id    | size       |  subscribe(id, size), size 1..=MAX_LEN
//!   +-------+------------+
//!   | id    | 0xfffffffd |  close: the input unsubscribes `id` cleanly
//!   +-------+------------+
//!
//! output -> subscriber
//!   0       4            8
//!   +-------+------------+
//!   | id    | 0xffffffff |                subscribed (attached)
//!   +-------+------------+----------+
//!   | id    | len        | len bytes|     one segment, len 0..=MAX_LEN
//!   +-------+------------+----------+
//!   | id    | 0xfffffffd | reason u8|     close, after the buffer's last
//!   +-------+------------+----------+     segment (a [`CloseReason`])
//! ```
//!
//! A stream reader takes a fixed 8-byte header, decodes it here, and then
//! reads the reason byte or the segment's bytes itself (through a fixed
//! buffer: nothing is allocated from a length on the wire). The decoders
//! are total.

use super::{header, split, BufferId, CloseReason, CLOSE, MAX_LEN, SUBSCRIBED};
use crate::error::WireError;

/// A header from a subscriber, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Up {
    /// Subscribe with a ring of this many bytes.
    Subscribe(u32),
    /// Unsubscribe cleanly.
    Close,
}

/// A header from an output, decoded (a close frame's reason byte follows
/// its header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Down {
    /// The subscriber is attached.
    Subscribed,
    /// A segment of this many bytes follows.
    Segment(u32),
    /// The buffer's stream ended; a reason byte follows.
    Close,
}

/// Decodes a header a subscriber sent.
pub fn decode_up(h: &[u8; 8]) -> Result<(BufferId, Up), WireError> {
    match split(*h) {
        (id, CLOSE) => Ok((id, Up::Close)),
        (_, 0) => Err(WireError::Malformed("subscribe with size 0")),
        (_, s) if s > MAX_LEN => Err(WireError::Malformed(
            "unknown control marker from a subscriber",
        )),
        (id, s) => Ok((id, Up::Subscribe(s))),
    }
}

/// Decodes a header an output sent.
pub fn decode_down(h: &[u8; 8]) -> Result<(BufferId, Down), WireError> {
    match split(*h) {
        (id, SUBSCRIBED) => Ok((id, Down::Subscribed)),
        (id, CLOSE) => Ok((id, Down::Close)),
        (_, l) if l > MAX_LEN => Err(WireError::Malformed(
            "unknown control marker from an output",
        )),
        (id, l) => Ok((id, Down::Segment(l))),
    }
}

/// The header of a subscribe (`size` 1..=[`MAX_LEN`]).
pub fn subscribe(id: BufferId, size: u32) -> [u8; 8] {
    header(id, size)
}

/// The header of a subscribed acknowledgement.
pub fn subscribed(id: BufferId) -> [u8; 8] {
    header(id, SUBSCRIBED)
}

/// The header of a segment of `len` bytes (the caller sends the bytes).
pub fn segment(id: BufferId, len: u32) -> [u8; 8] {
    header(id, len)
}

/// An unsubscribe from a subscriber (a close header, no reason).
pub fn unsubscribe(id: BufferId) -> [u8; 8] {
    header(id, CLOSE)
}

/// A close frame from an output: header and reason byte.
pub fn close_frame(id: BufferId, reason: CloseReason) -> [u8; 9] {
    let mut f = [0u8; 9];
    f[..8].copy_from_slice(&header(id, CLOSE));
    f[8] = reason.code();
    f
}
