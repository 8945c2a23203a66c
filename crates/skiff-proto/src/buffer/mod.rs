//! The frames of the buffer API's network transports (RocketBufs): a
//! 32-bit buffer id and a 32-bit size before each segment's bytes, all
//! little-endian. A size field above [`MAX_LEN`] is a control marker
//! ([`SUBSCRIBED`], [`CREDIT`], [`CLOSE`]).
//!
//! - [`assoc`]: the `udp://…?reliable=true` transport, one frame per
//!   association message (the association keeps message boundaries).
//! - [`tcp`]: the `tcp://` transport, a stream of 8-byte headers (and a
//!   close reason byte, and segment bytes) that a reader takes in pieces.
//!
//! The decoders are total and allocate nothing: a segment is a slice of the
//! frame, and a stream header is a fixed 8 bytes.

pub mod assoc;
pub mod tcp;

/// A buffer's identifier on the wire.
pub type BufferId = u32;

/// Largest buffer or segment size a frame carries; larger size fields are
/// control markers.
pub const MAX_LEN: u32 = 0xffff_ff00;
/// The size field of a subscribed acknowledgement.
pub const SUBSCRIBED: u32 = 0xffff_ffff;
/// The size field of a credit frame (reliable udp only).
pub const CREDIT: u32 = 0xffff_fffe;
/// The size field of a close frame.
pub const CLOSE: u32 = 0xffff_fffd;

/// Why a buffer's stream ended (the reason byte of a close frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The producer closed it after its last segment.
    Producer,
    /// The subscriber's copy is unusable: a segment was larger than its
    /// ring, or the output's ring broke.
    Corrupt,
    /// The buffer's own source was lost (a spliced input whose producer
    /// died or whose link failed).
    Lost,
}

impl CloseReason {
    /// The reason's byte on the wire.
    pub fn code(self) -> u8 {
        match self {
            CloseReason::Producer => 0,
            CloseReason::Corrupt => 1,
            CloseReason::Lost => 2,
        }
    }

    /// The reason of a close byte; `None` for an unknown one.
    pub fn decode(b: u8) -> Option<CloseReason> {
        match b {
            0 => Some(CloseReason::Producer),
            1 => Some(CloseReason::Corrupt),
            2 => Some(CloseReason::Lost),
            _ => None,
        }
    }
}

/// The id and size field of a header.
fn split(h: [u8; 8]) -> (BufferId, u32) {
    (
        u32::from_le_bytes([h[0], h[1], h[2], h[3]]),
        u32::from_le_bytes([h[4], h[5], h[6], h[7]]),
    )
}

/// A header: `id` then `size`, little-endian.
pub fn header(id: BufferId, size: u32) -> [u8; 8] {
    let mut h = [0u8; 8];
    h[..4].copy_from_slice(&id.to_le_bytes());
    h[4..].copy_from_slice(&size.to_le_bytes());
    h
}
