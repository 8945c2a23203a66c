//! The frames of the `udp://…?reliable=true` buffer transport: RocketBufs'
//! 32-bit buffer id and 32-bit size header, one frame per tunnel message
//! (the tunnel keeps message boundaries, so a frame's length is the
//! message's). All integers little-endian. A size field of
//! [`MAX_LEN`] + 1 or more is a control marker.
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
use skiff_proto::credits::Flow;

use crate::shm::BufferId;

/// Largest buffer or segment size a frame carries.
pub(crate) const MAX_LEN: u32 = 0xffff_ff00;
const SUBSCRIBED: u32 = 0xffff_ffff;
const CREDIT: u32 = 0xffff_fffe;
const CLOSE: u32 = 0xffff_fffd;

/// Why a buffer's stream ended ([`Frame::Close`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CloseReason {
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
    /// The reason a ring consumer's error ends a buffer with.
    pub(crate) fn of(e: &crate::shm::BufferError) -> CloseReason {
        match e {
            crate::shm::BufferError::Closed { .. } => CloseReason::Producer,
            e if e.is_peer_gone() => CloseReason::Lost,
            _ => CloseReason::Corrupt,
        }
    }
}

/// One frame, decoded; see the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame<'a> {
    Subscribe {
        id: BufferId,
        size: u32,
        records: u32,
    },
    Credit {
        id: BufferId,
        consumed: u64,
        read: u64,
    },
    Subscribed {
        id: BufferId,
        flow: Flow,
    },
    Segment {
        id: BufferId,
        data: &'a [u8],
    },
    Close {
        id: BufferId,
        reason: CloseReason,
    },
}

/// A frame that does not decode: what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Malformed(pub(crate) &'static str);

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Decodes a frame a subscriber sent (subscribe or credit).
pub(crate) fn decode_up(b: &[u8]) -> Result<Frame<'_>, Malformed> {
    if b.len() < 8 {
        return Err(Malformed("shorter than the 8-byte header"));
    }
    let (id, size) = (u32_at(b, 0), u32_at(b, 4));
    match size {
        CREDIT if b.len() == 24 => Ok(Frame::Credit {
            id,
            consumed: u64_at(b, 8),
            read: u64_at(b, 16),
        }),
        CREDIT => Err(Malformed("a credit frame is 24 bytes")),
        0 => Err(Malformed("subscribe with size 0")),
        s if s > MAX_LEN => Err(Malformed("unknown control marker from a subscriber")),
        _ if b.len() != 12 => Err(Malformed("a subscribe frame is 12 bytes")),
        _ => match u32_at(b, 8) {
            0 => Err(Malformed("subscribe with 0 records")),
            records => Ok(Frame::Subscribe { id, size, records }),
        },
    }
}

/// Decodes a frame an output sent (subscribed, segment or close).
pub(crate) fn decode_down(b: &[u8]) -> Result<Frame<'_>, Malformed> {
    if b.len() < 8 {
        return Err(Malformed("shorter than the 8-byte header"));
    }
    let (id, len) = (u32_at(b, 0), u32_at(b, 4));
    match len {
        SUBSCRIBED if b.len() == 9 => match b[8] {
            1 => Ok(Frame::Subscribed {
                id,
                flow: Flow::Credits,
            }),
            2 => Ok(Frame::Subscribed {
                id,
                flow: Flow::Overwrite,
            }),
            _ => Err(Malformed("unknown flow code")),
        },
        SUBSCRIBED => Err(Malformed("a subscribed frame is 9 bytes")),
        CLOSE if b.len() == 9 => match b[8] {
            0 => Ok(Frame::Close {
                id,
                reason: CloseReason::Producer,
            }),
            1 => Ok(Frame::Close {
                id,
                reason: CloseReason::Corrupt,
            }),
            2 => Ok(Frame::Close {
                id,
                reason: CloseReason::Lost,
            }),
            _ => Err(Malformed("unknown close reason")),
        },
        CLOSE => Err(Malformed("a close frame is 9 bytes")),
        l if l > MAX_LEN => Err(Malformed("unknown control marker from an output")),
        l if b.len() - 8 != l as usize => Err(Malformed("segment length differs from the frame")),
        _ => Ok(Frame::Segment { id, data: &b[8..] }),
    }
}

/// The header of a segment frame of `len` bytes (the caller appends them).
pub(crate) fn segment_header(id: BufferId, len: u32, out: &mut Vec<u8>) {
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
}

/// Encodes a control frame (every kind but [`Frame::Segment`], which is
/// built in place with [`segment_header`], though it encodes here too).
pub(crate) fn encode(f: &Frame<'_>) -> Bytes {
    let mut b = BytesMut::with_capacity(24);
    match *f {
        Frame::Subscribe { id, size, records } => {
            b.put_u32_le(id);
            b.put_u32_le(size);
            b.put_u32_le(records);
        }
        Frame::Credit { id, consumed, read } => {
            b.put_u32_le(id);
            b.put_u32_le(CREDIT);
            b.put_u64_le(consumed);
            b.put_u64_le(read);
        }
        Frame::Subscribed { id, flow } => {
            b.put_u32_le(id);
            b.put_u32_le(SUBSCRIBED);
            b.put_u8(match flow {
                Flow::Credits => 1,
                Flow::Overwrite => 2,
            });
        }
        Frame::Segment { id, data } => {
            b.put_u32_le(id);
            b.put_u32_le(data.len() as u32);
            b.put_slice(data);
        }
        Frame::Close { id, reason } => {
            b.put_u32_le(id);
            b.put_u32_le(CLOSE);
            b.put_u8(match reason {
                CloseReason::Producer => 0,
                CloseReason::Corrupt => 1,
                CloseReason::Lost => 2,
            });
        }
    }
    b.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Frame<'static>> {
        vec![
            Frame::Subscribe {
                id: 7,
                size: 4096,
                records: 64,
            },
            Frame::Credit {
                id: 7,
                consumed: 1 << 40,
                read: 3,
            },
            Frame::Subscribed {
                id: 1,
                flow: Flow::Credits,
            },
            Frame::Subscribed {
                id: 1,
                flow: Flow::Overwrite,
            },
            Frame::Segment {
                id: 2,
                data: b"hello",
            },
            Frame::Segment { id: 2, data: b"" },
            Frame::Close {
                id: 3,
                reason: CloseReason::Producer,
            },
            Frame::Close {
                id: 3,
                reason: CloseReason::Corrupt,
            },
            Frame::Close {
                id: 3,
                reason: CloseReason::Lost,
            },
        ]
    }

    #[test]
    fn every_frame_round_trips() {
        for f in all() {
            let b = encode(&f);
            let up = matches!(f, Frame::Subscribe { .. } | Frame::Credit { .. });
            let got = if up { decode_up(&b) } else { decode_down(&b) };
            assert_eq!(got, Ok(f.clone()));
            if let Frame::Segment { id, data } = f {
                let mut v = Vec::new();
                segment_header(id, data.len() as u32, &mut v);
                v.extend_from_slice(data);
                assert_eq!(v, b[..]);
            }
        }
    }

    #[test]
    fn every_truncation_and_extension_is_refused_or_exact() {
        for f in all() {
            let b = encode(&f);
            let up = matches!(f, Frame::Subscribe { .. } | Frame::Credit { .. });
            let dec = |x: &[u8]| {
                if up {
                    decode_up(x).is_err()
                } else {
                    decode_down(x).is_err()
                }
            };
            for cut in 0..b.len() {
                assert!(dec(&b[..cut]), "{f:?} cut at {cut}");
            }
            let mut longer = b.to_vec();
            longer.push(0);
            assert!(dec(&longer), "{f:?} with a byte more");
        }
    }

    #[test]
    fn hostile_values_are_refused() {
        let mut b = encode(&Frame::Subscribed {
            id: 1,
            flow: Flow::Credits,
        })
        .to_vec();
        b[8] = 9;
        assert!(decode_down(&b).is_err());
        // A segment length claiming more than the frame holds.
        let mut s = encode(&Frame::Segment { id: 1, data: b"ab" }).to_vec();
        s[4..8].copy_from_slice(&1000u32.to_le_bytes());
        assert!(decode_down(&s).is_err());
        // Markers from the wrong side.
        assert!(decode_up(&encode(&Frame::Close {
            id: 1,
            reason: CloseReason::Producer
        }))
        .is_err());
        assert!(decode_down(&encode(&Frame::Credit {
            id: 1,
            consumed: 0,
            read: 0
        }))
        .is_err());
        let zero = encode(&Frame::Subscribe {
            id: 1,
            size: 8,
            records: 0,
        });
        assert!(decode_up(&zero).is_err());
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 40) as usize;
            let bytes: Vec<u8> = (0..len).map(|i| (x >> (i % 8 * 8)) as u8).collect();
            let _ = decode_up(&bytes);
            let _ = decode_down(&bytes);
        }
    }
}

/// For `cargo fuzz` (feature `fuzzing`): decodes `b` as a frame from a
/// subscriber and as one from an output; whatever decodes must encode back
/// to the same bytes (the decoders accept one encoding of each frame).
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz(b: &[u8]) {
    for f in [decode_up(b), decode_down(b)].into_iter().flatten() {
        assert_eq!(&encode(&f)[..], b, "{f:?}");
    }
}
