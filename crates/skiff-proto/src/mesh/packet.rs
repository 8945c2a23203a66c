//! The mesh's datagrams between nodes. Every datagram starts with an
//! 8-byte envelope; the body depends on the kind:
//!
//! ```text
//!  0      2     3      4            8
//! +------+-----+------+------------+----------------------------+
//! | "SM" | ver | kind | net (u32)  | body ...                   |
//! +------+-----+------+------------+----------------------------+
//! ```
//!
//! `net` is the FNV-1a hash of the network name: datagrams of another
//! network are dropped (and counted) before anything else is read.
//!
//! | kind | body |
//! |------|------|
//! | 1 swim     | foca's packet, as foca encodes it |
//! | 2 delta    | epoch u64, from-version u64, ops |
//! | 3 digest   | epoch u64, version u64 |
//! | 4 sync     | (empty): "send me your full interest" |
//! | 5 full     | epoch u64, version u64, part u16, parts u16, ops (adds only) |
//! | 6 data     | seq u64, then frames: varint length + bytes, repeated ([`super::node_frame`]) |
//! | 7 hello    | net name (len u8 + bytes), gen u64: multicast scouting |
//! | 8 ack      | next data sequence number expected, u64: flow control |
//! | 9 assoc    | one association packet (`crate::association::frame`), whole |
//!
//! An op is `1 pattern kind` (subscribe), `2 pattern kind` (unsubscribe),
//! `3 cluster capacity-u32` (the node's capacity in a cluster; 0 = none),
//! or `4 pattern kind` / `5 pattern kind`: subscribe / unsubscribe with
//! cMsg patterns (`crate::router::cmsg`), so interest travels with its kind
//! (a node that predates them refuses the packet as malformed), or
//! `6 syntax-u8 pattern kind` / `7 syntax-u8 pattern kind`: subscribe /
//! unsubscribe for best-effort subscriptions (`reliable=false`; copies
//! that only these want may travel as datagrams), strings as a varint length and UTF-8. Integers are little-endian.
//! Decoding is total and bounded: lengths are checked against what is left,
//! counts against [`MAX_OPS`], strings against [`MAX_NAME`].

use crate::router::Syntax;
use crate::varint;
use crate::WireError;

/// The envelope's first two bytes.
pub const MAGIC: [u8; 2] = *b"SM";
/// The mesh protocol version this code speaks.
pub const VERSION: u8 = 1;
/// Envelope length.
pub const ENVELOPE: usize = 8;
/// Most ops one datagram may carry.
pub const MAX_OPS: usize = 4096;
/// Longest pattern, type or cluster name, in bytes.
pub const MAX_NAME: usize = 1024;

/// What a datagram carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Membership (foca's SWIM).
    Swim = 1,
    /// An interest delta.
    Delta = 2,
    /// The sender's interest version, for anti-entropy.
    Digest = 3,
    /// A request for the receiver's full interest.
    Sync = 4,
    /// One part of a full interest snapshot.
    Full = 5,
    /// Application frames (a batch).
    Data = 6,
    /// A multicast scouting hello.
    Hello = 7,
    /// Data received so far (flow control).
    Ack = 8,
    /// An association packet (tunnels between nodes), opaque to the mesh.
    Assoc = 9,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Swim,
            2 => Kind::Delta,
            3 => Kind::Digest,
            4 => Kind::Sync,
            5 => Kind::Full,
            6 => Kind::Data,
            7 => Kind::Hello,
            8 => Kind::Ack,
            9 => Kind::Assoc,
            _ => return None,
        })
    }
}

/// One change of a node's advertised interest.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Op {
    /// The node has (at least one) subscription with this pattern and type.
    Sub(String, String),
    /// The node no longer has any.
    Unsub(String, String),
    /// The node's total capacity in a cluster (0: it has no members).
    Cluster(String, u32),
    /// As [`Op::Sub`], with cMsg patterns.
    CmsgSub(String, String),
    /// As [`Op::Unsub`], with cMsg patterns.
    CmsgUnsub(String, String),
    /// As [`Op::Sub`] (or [`Op::CmsgSub`]), for best-effort subscriptions
    /// (`reliable=false`): copies that only such subscriptions want may
    /// travel as datagrams, their loss counted, never repaired.
    LossySub(Syntax, String, String),
    /// As [`Op::Unsub`], for best-effort subscriptions.
    LossyUnsub(Syntax, String, String),
}

impl Op {
    /// A subscribe op for patterns of kind `syntax`.
    pub fn sub(syntax: Syntax, pattern: String, kind: String) -> Op {
        match syntax {
            Syntax::Tokens => Op::Sub(pattern, kind),
            Syntax::Cmsg => Op::CmsgSub(pattern, kind),
        }
    }

    /// An unsubscribe op for patterns of kind `syntax`.
    pub fn unsub(syntax: Syntax, pattern: String, kind: String) -> Op {
        match syntax {
            Syntax::Tokens => Op::Unsub(pattern, kind),
            Syntax::Cmsg => Op::CmsgUnsub(pattern, kind),
        }
    }

    /// A subscribe op for patterns of kind `syntax`, best effort when
    /// `lossy`.
    pub fn sub_as(syntax: Syntax, pattern: String, kind: String, lossy: bool) -> Op {
        if lossy {
            Op::LossySub(syntax, pattern, kind)
        } else {
            Op::sub(syntax, pattern, kind)
        }
    }

    /// An unsubscribe op for patterns of kind `syntax`, best effort when
    /// `lossy`.
    pub fn unsub_as(syntax: Syntax, pattern: String, kind: String, lossy: bool) -> Op {
        if lossy {
            Op::LossyUnsub(syntax, pattern, kind)
        } else {
            Op::unsub(syntax, pattern, kind)
        }
    }

    /// Whether it withdraws interest.
    pub fn is_unsub(&self) -> bool {
        matches!(self, Op::Unsub(..) | Op::CmsgUnsub(..) | Op::LossyUnsub(..))
    }
}

/// FNV-1a of a network name: the envelope's `net`.
pub fn net_hash(name: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// Writes an envelope into `out` (which it clears).
pub fn envelope(out: &mut Vec<u8>, kind: Kind, net: u32) {
    out.clear();
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(kind as u8);
    out.extend_from_slice(&net.to_le_bytes());
}

/// Reads an envelope: (kind, net, body).
pub fn open(buf: &[u8]) -> Result<(Kind, u32, &[u8]), WireError> {
    if buf.len() < ENVELOPE {
        return Err(WireError::Truncated {
            what: "mesh envelope",
        });
    }
    if buf[..2] != MAGIC {
        return Err(WireError::Foreign);
    }
    if buf[2] != VERSION {
        return Err(WireError::Version(buf[2]));
    }
    let kind = Kind::from_u8(buf[3]).ok_or(WireError::Kind(buf[3]))?;
    let net = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    Ok((kind, net, &buf[ENVELOPE..]))
}

/// The codec's cursor, which every mesh body is read with.
pub use crate::codec::Reader;

/// Reads a varint-length-prefixed UTF-8 name of at most [`MAX_NAME`] bytes.
pub fn name<'a>(r: &mut Reader<'a>) -> Result<&'a str, WireError> {
    r.str(MAX_NAME, "mesh name")
}

fn put_name(out: &mut Vec<u8>, s: &str) {
    varint::put(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// Encoded length of one op.
pub fn op_len(op: &Op) -> usize {
    let name = |s: &str| varint::len(s.len() as u64) + s.len();
    1 + match op {
        Op::Sub(p, k) | Op::Unsub(p, k) | Op::CmsgSub(p, k) | Op::CmsgUnsub(p, k) => {
            name(p) + name(k)
        }
        Op::LossySub(_, p, k) | Op::LossyUnsub(_, p, k) => 1 + name(p) + name(k),
        Op::Cluster(c, _) => name(c) + 4,
    }
}

/// Appends a count-prefixed list of ops.
pub fn put_ops<'a>(out: &mut Vec<u8>, ops: impl ExactSizeIterator<Item = &'a Op>) {
    varint::put(out, ops.len() as u64);
    for op in ops {
        match op {
            Op::Sub(p, k) | Op::Unsub(p, k) | Op::CmsgSub(p, k) | Op::CmsgUnsub(p, k) => {
                out.push(match op {
                    Op::Sub(..) => 1,
                    Op::Unsub(..) => 2,
                    Op::CmsgSub(..) => 4,
                    _ => 5,
                });
                put_name(out, p);
                put_name(out, k);
            }
            Op::LossySub(syntax, p, k) | Op::LossyUnsub(syntax, p, k) => {
                out.push(if matches!(op, Op::LossySub(..)) { 6 } else { 7 });
                out.push(*syntax as u8);
                put_name(out, p);
                put_name(out, k);
            }
            Op::Cluster(c, cap) => {
                out.push(3);
                put_name(out, c);
                out.extend_from_slice(&cap.to_le_bytes());
            }
        }
    }
}

/// Reads a count-prefixed list of ops (at most [`MAX_OPS`]).
pub fn get_ops(r: &mut Reader<'_>) -> Result<Vec<Op>, WireError> {
    let n = r.varint("interest op count")?;
    if n > MAX_OPS as u64 {
        return Err(WireError::TooLong {
            what: "interest op count",
            len: n,
            max: MAX_OPS,
        });
    }
    // Each op takes at least 3 bytes: no allocation beyond what is there.
    let mut ops = Vec::with_capacity((n as usize).min(r.remaining() / 3));
    for _ in 0..n {
        let op = match r.u8("mesh packet")? {
            1 => Op::Sub(name(r)?.to_owned(), name(r)?.to_owned()),
            2 => Op::Unsub(name(r)?.to_owned(), name(r)?.to_owned()),
            4 => Op::CmsgSub(name(r)?.to_owned(), name(r)?.to_owned()),
            5 => Op::CmsgUnsub(name(r)?.to_owned(), name(r)?.to_owned()),
            code @ (6 | 7) => {
                let syntax = Syntax::from_u8(r.u8("mesh packet")?)
                    .ok_or(WireError::Malformed("unknown pattern syntax"))?;
                let (p, k) = (name(r)?.to_owned(), name(r)?.to_owned());
                if code == 6 {
                    Op::LossySub(syntax, p, k)
                } else {
                    Op::LossyUnsub(syntax, p, k)
                }
            }
            3 => {
                let c = name(r)?.to_owned();
                Op::Cluster(c, r.u32("mesh packet")?)
            }
            _ => return Err(WireError::Malformed("unknown interest op")),
        };
        ops.push(op);
    }
    Ok(ops)
}

/// A decoded body, for the fuzz target and tests: every kind but `Swim`
/// (foca decodes its own), `Data` frames (the node decodes those) and
/// `Assoc` (the association decodes its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// foca's bytes.
    Swim(Vec<u8>),
    /// An interest delta.
    Delta {
        /// The sender's interest epoch (per process start).
        epoch: u64,
        /// The version this delta applies to (it makes `from + 1`).
        from: u64,
        /// The changes, in order.
        ops: Vec<Op>,
    },
    /// The sender's interest version.
    Digest {
        /// Epoch.
        epoch: u64,
        /// Version.
        version: u64,
    },
    /// "Send me your full interest."
    Sync,
    /// Part of a full snapshot.
    Full {
        /// Epoch.
        epoch: u64,
        /// Version the snapshot is of.
        version: u64,
        /// This part's index.
        part: u16,
        /// How many parts.
        parts: u16,
        /// Subscriptions and clusters (adds only).
        ops: Vec<Op>,
    },
    /// Application frames with the sender's data sequence number.
    Data {
        /// Per-destination sequence number.
        seq: u64,
        /// The frames.
        frames: Vec<Vec<u8>>,
    },
    /// Data received so far.
    Ack {
        /// The next data sequence number expected.
        next: u64,
    },
    /// An association packet, undecoded.
    Assoc(Vec<u8>),
    /// Scouting hello.
    Hello {
        /// The network name.
        net: String,
        /// The sender's identity generation.
        gen: u64,
    },
}

/// Largest data frame accepted.
pub const MAX_FRAME: usize = 1 << 20;

/// Decodes a whole datagram: envelope and body. Total: any input gives a
/// value or an error.
pub fn decode(buf: &[u8]) -> Result<(u32, Body), WireError> {
    let (kind, net, body) = open(buf)?;
    let mut r = Reader::new(body);
    let b = match kind {
        Kind::Swim => Body::Swim(body.to_vec()),
        Kind::Assoc if body.is_empty() => {
            return Err(WireError::Truncated {
                what: "association packet",
            })
        }
        Kind::Assoc => Body::Assoc(body.to_vec()),
        Kind::Delta => Body::Delta {
            epoch: r.u64("mesh packet")?,
            from: r.u64("mesh packet")?,
            ops: get_ops(&mut r)?,
        },
        Kind::Digest => Body::Digest {
            epoch: r.u64("mesh packet")?,
            version: r.u64("mesh packet")?,
        },
        Kind::Sync => Body::Sync,
        Kind::Ack => Body::Ack {
            next: r.u64("mesh packet")?,
        },
        Kind::Full => {
            let (epoch, version, part, parts) = (
                r.u64("mesh packet")?,
                r.u64("mesh packet")?,
                r.u16("mesh packet")?,
                r.u16("mesh packet")?,
            );
            if part >= parts {
                return Err(WireError::Malformed("full-sync part index past its count"));
            }
            let ops = get_ops(&mut r)?;
            if ops.iter().any(Op::is_unsub) {
                return Err(WireError::Malformed("a full snapshot holds only adds"));
            }
            Body::Full {
                epoch,
                version,
                part,
                parts,
                ops,
            }
        }
        Kind::Data => {
            let seq = r.u64("mesh packet")?;
            let mut frames = Vec::new();
            while !r.is_empty() {
                frames.push(r.bytes(MAX_FRAME, "mesh frame")?.to_vec());
            }
            Body::Data { seq, frames }
        }
        Kind::Hello => {
            let n = r.u8("mesh packet")? as usize;
            let name = std::str::from_utf8(r.take(n, "network name")?)
                .map_err(|_| WireError::Utf8("network name"))?
                .to_owned();
            Body::Hello {
                net: name,
                gen: r.u64("mesh packet")?,
            }
        }
    };
    if !matches!(kind, Kind::Swim | Kind::Data | Kind::Assoc) && !r.is_empty() {
        return Err(WireError::Malformed("trailing bytes after a mesh packet"));
    }
    Ok((net, b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Vec<u8> {
        let mut out = Vec::new();
        envelope(&mut out, Kind::Delta, net_hash("n"));
        out.extend_from_slice(&7u64.to_le_bytes());
        out.extend_from_slice(&3u64.to_le_bytes());
        let ops = [
            Op::Sub("a.*".into(), "".into()),
            Op::Unsub("b.>".into(), "t".into()),
            Op::CmsgSub("daq.h*b.{i<5}".into(), "count?".into()),
            Op::CmsgUnsub("x#".into(), "*".into()),
            Op::Cluster("c".into(), 9),
            Op::LossySub(Syntax::Tokens, "l.>".into(), "".into()),
            Op::LossyUnsub(Syntax::Cmsg, "l*".into(), "t".into()),
        ];
        put_ops(&mut out, ops.iter());
        out
    }

    #[test]
    fn delta_round_trips() {
        let (net, b) = decode(&sample()).unwrap();
        assert_eq!(net, net_hash("n"));
        let Body::Delta { epoch, from, ops } = b else {
            panic!("{b:?}")
        };
        assert_eq!((epoch, from, ops.len()), (7, 3, 7));
        assert_eq!(ops[2], Op::CmsgSub("daq.h*b.{i<5}".into(), "count?".into()));
        assert_eq!(ops[3], Op::CmsgUnsub("x#".into(), "*".into()));
        assert_eq!(ops[4], Op::Cluster("c".into(), 9));
        assert_eq!(
            ops[6],
            Op::LossyUnsub(Syntax::Cmsg, "l*".into(), "t".into())
        );
        assert_eq!(
            sample().len() - ENVELOPE - 16,
            1 + ops.iter().map(op_len).sum::<usize>()
        );
    }

    #[test]
    fn every_prefix_is_refused() {
        let s = sample();
        for n in 0..s.len() {
            assert!(decode(&s[..n]).is_err(), "prefix {n} accepted");
        }
    }

    #[test]
    fn a_huge_op_count_allocates_nothing() {
        let mut out = Vec::new();
        envelope(&mut out, Kind::Delta, 0);
        out.extend_from_slice(&[0; 16]);
        varint::put(&mut out, MAX_OPS as u64);
        assert!(matches!(decode(&out), Err(WireError::Truncated { .. })));
        let mut out2 = out[..ENVELOPE + 16].to_vec();
        varint::put(&mut out2, u64::MAX >> 1);
        assert!(matches!(decode(&out2), Err(WireError::TooLong { .. })));
    }

    #[test]
    fn bad_envelopes_are_named() {
        assert_eq!(decode(b"XX\x01\x02\0\0\0\0"), Err(WireError::Foreign));
        assert_eq!(decode(b"SM\x09\x02\0\0\0\0"), Err(WireError::Version(9)));
        assert_eq!(decode(b"SM\x01\x63\0\0\0\0"), Err(WireError::Kind(0x63)));
    }

    #[test]
    fn full_refuses_unsubscribe_and_bad_part() {
        let mut out = Vec::new();
        envelope(&mut out, Kind::Full, 0);
        out.extend_from_slice(&[0; 16]);
        out.extend_from_slice(&2u16.to_le_bytes());
        out.extend_from_slice(&2u16.to_le_bytes());
        put_ops(&mut out, [].iter());
        assert!(matches!(decode(&out), Err(WireError::Malformed(_))));
    }

    proptest! {
        #[test]
        fn decode_is_total(mut noise in proptest::collection::vec(any::<u8>(), 0..200), kind in 1u8..10) {
            if noise.len() >= 4 {
                noise[..4].copy_from_slice(&[b'S', b'M', VERSION, kind]);
            }
            let _ = decode(&noise);
        }
    }
}
