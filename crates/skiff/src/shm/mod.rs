//! RocketBufs buffers: [`Output`] (rOut) and [`Input`] (rIn) over a
//! transport chosen by locator, `shm://name` (a memory-mapped ring per
//! buffer shared between processes), `tcp://host:port` (RocketBufs' 32-bit
//! buffer id + 32-bit size framing) or `udp://host:port?reliable=true` (the
//! same framing over skiff associations, with end-to-end credits).
//!
//! A buffer is a circular byte region with a 32-bit id. The producer asks
//! for a [`SegmentMut`] (one or two slices when it wraps), writes into it
//! in place and delivers it; every subscriber sees `(id, segment)` and reads
//! it in place, then returns space with [`Input::consumed`]. With
//! [`Flow::Credits`] a producer whose subscribers are full gets
//! [`BufferError::WouldBlock`] (or waits, if it asked to block): memory is
//! bounded. With [`Flow::Overwrite`] the producer never waits and the oldest
//! segments are overwritten; each segment carries a sequence lock, and a
//! reader that finds it broken counts the read as torn.
//!
//! What "zero-copy" means per transport:
//! - `shm://`: the producer writes the bytes once into the mapping; every
//!   subscriber reads them there. [`Output::splice`] of an `shm` input into
//!   an `shm` output hard-links the same ring file into the output's
//!   namespace, so downstream subscribers read the upstream producer's
//!   bytes: nothing is copied at all.
//! - `udp://…?reliable=true`: as `tcp://`, but the tunnel API takes owned
//!   messages, so the sender copies each segment once into its message and
//!   the receiver once from it into the subscriber's ring (`assoc/`).
//! - `tcp://`: the producer writes once into a local ring; the sender
//!   thread writes from the ring straight into the socket and the receiver
//!   reads from the socket straight into the subscriber's ring (the kernel's
//!   two copies, no user-space copy). A splice into a `tcp` output sends
//!   from the input's ring directly.
//!
//! Layout, wake-ups and crash handling: see `layout.rs` and `ring.rs`. The
//! only `unsafe` code is in `sys.rs` (mapping, futex), two call sites in
//! `ring.rs` that hand out data slices under the ring protocol's proof, and
//! the one in `host.rs` that pins a received segment.
//!
//! The host's side of a node's `shm://name` attachment is here too
//! ([`host`]; the node's listener in `skiff-node` drives it with its
//! broker): clients of the node's host attach with
//! `Client::connect("shm://name")` over a pair of rings (`attach.rs`:
//! rendezvous on a Unix socket whose end is the peer's end). A publish is encoded once into
//! the client's ring and reaches the broker and in-process subscribers as
//! `Bytes` over the node's mapping of it, released in ring order; frames
//! to the client are copied once into its ring and once out. See
//! `docs/shm.md`, "Node integration".

use std::io;
use std::path::PathBuf;
#[cfg(not(skiff_loom))]
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use skiff_proto::credits::{Delivered, Flow};

#[cfg(not(skiff_loom))]
mod assoc;
#[cfg(not(skiff_loom))]
pub(crate) mod attach;
#[cfg(not(skiff_loom))]
mod buffer;
#[cfg(not(skiff_loom))]
pub mod host;
mod layout;
#[cfg(skiff_loom)]
mod loom;
#[cfg(not(skiff_loom))]
mod msgs;
#[cfg(skiff_loom)]
#[path = "loom_region.rs"]
mod region;
mod ring;
mod sync;
#[cfg(not(skiff_loom))]
mod sys;
#[cfg(not(skiff_loom))]
mod tcp;
#[cfg(not(skiff_loom))]
pub mod topic;

#[cfg(not(skiff_loom))]
pub use buffer::{InSegment, InStats, Input, OutStats, Output, SegmentMut};
#[cfg(not(skiff_loom))]
pub use msgs::MsgWriter;

#[cfg(skiff_loom)]
use region::Region;
#[cfg(not(skiff_loom))]
use sys::Region;

#[cfg(skiff_loom)]
use region as sys;

/// A buffer's identifier, unique per [`Output`] and per [`Input`].
pub type BufferId = u32;

/// Any error of the buffer API, grouped by who is at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BufferError {
    /// The locator or an option is wrong (the caller).
    #[error(transparent)]
    Locator(#[from] crate::error::LocatorError),
    /// A buffer id is already used by this object or by a live process.
    #[error("buffer {id} already exists{owner}; buffer ids are unique per object")]
    DuplicateId {
        /// The id.
        id: BufferId,
        /// Who holds it, if known.
        owner: String,
    },
    /// No buffer with this id (not created, not subscribed).
    #[error("no buffer {id} here: create_buffer or subscribe first")]
    UnknownBuffer {
        /// The id.
        id: BufferId,
    },
    /// A request that can never succeed as made (the caller).
    #[error("buffer {id}: {why}")]
    Usage {
        /// The buffer.
        id: BufferId,
        /// What was wrong.
        why: String,
    },
    /// A segment larger than the buffer can ever hold (names the limit).
    #[error("buffer {id}: a segment of {len} bytes is larger than the buffer's {limit} bytes; request at most {limit} or create a larger buffer")]
    TooLarge {
        /// The buffer.
        id: BufferId,
        /// Bytes asked for.
        len: u64,
        /// The buffer's capacity.
        limit: u64,
    },
    /// No credit now: the subscribers have not consumed enough (a limit;
    /// retry later or block).
    #[error("buffer {id} is full: {len} bytes requested, {free} free (and {records} segment records) until subscribers consume")]
    WouldBlock {
        /// The buffer.
        id: BufferId,
        /// Bytes asked for.
        len: u64,
        /// Bytes free now.
        free: u64,
        /// Segment records of the ring (all in use when `len` is 0).
        records: u64,
    },
    /// Every consumer slot of the ring is taken.
    #[error(
        "buffer {id}: all {slots} subscriber slots are taken; create it with more (consumers=N)"
    )]
    NoSlot {
        /// The buffer.
        id: BufferId,
        /// Slots of the ring.
        slots: u32,
    },
    /// The shared memory holds values that cannot be (a peer misbehaved or
    /// the file was corrupted); the buffer is closed.
    #[error("buffer {id} is corrupt and was closed: {why}")]
    Corrupt {
        /// The buffer.
        id: BufferId,
        /// What was wrong.
        why: String,
    },
    /// The peer process died; its files were reclaimed.
    #[error("buffer {id}: peer process {pid} died")]
    PeerDead {
        /// The buffer.
        id: BufferId,
        /// The dead process.
        pid: u32,
    },
    /// The network peer (`tcp://` or `udp://`) went away without closing
    /// the buffer: its process died or the path failed (over `udp://`, no
    /// answer for the association's `idle_timeout`). Everything received
    /// before was delivered.
    #[error("buffer {id}: lost the network peer without a close (its process died or the path failed); subscribe again once it is back")]
    PeerLost {
        /// The buffer.
        id: BufferId,
    },
    /// The producer closed the buffer and everything was read.
    #[error("buffer {id} was closed by its producer")]
    Closed {
        /// The buffer.
        id: BufferId,
    },
    /// Nothing arrived in time.
    #[error("timed out")]
    Timeout,
    /// The operating system refused.
    #[error("{what}: {source}")]
    Io {
        /// The operation.
        what: &'static str,
        /// The OS error.
        source: io::Error,
    },
}

impl BufferError {
    pub(crate) fn io(what: &'static str) -> impl FnOnce(io::Error) -> BufferError {
        move |source| BufferError::Io { what, source }
    }

    /// The error for a refused credit operation on buffer `id`.
    pub(crate) fn credit(id: BufferId, e: skiff_proto::credits::CreditError) -> BufferError {
        use skiff_proto::credits::CreditError as C;
        match e {
            C::TooLarge { len, capacity } => BufferError::TooLarge {
                id,
                len,
                limit: capacity,
            },
            C::WouldBlock { len, free } => BufferError::WouldBlock {
                id,
                len,
                free,
                records: 0,
            },
            C::NoRecord { records } => BufferError::WouldBlock {
                id,
                len: 0,
                free: 0,
                records,
            },
            other => BufferError::Usage {
                id,
                why: other.to_string(),
            },
        }
    }

    /// Whether retrying later may succeed.
    pub fn is_would_block(&self) -> bool {
        matches!(self, BufferError::WouldBlock { .. })
    }

    /// Whether the peer died or was lost ([`BufferError::PeerDead`] over
    /// shared memory, [`BufferError::PeerLost`] over the network).
    pub fn is_peer_gone(&self) -> bool {
        matches!(
            self,
            BufferError::PeerDead { .. } | BufferError::PeerLost { .. }
        )
    }
}

/// Counters of a network transport (`tcp://`, `udp://`) of one
/// [`Output`] or [`Input`]: everything dropped or refused is counted here.
#[derive(Debug, Clone, Default)]
pub struct LinkStats {
    /// Frames that did not decode (dropped).
    pub frames_malformed: u64,
    /// Frames for a buffer not subscribed or not known here (dropped).
    pub frames_unknown: u64,
    /// Frames that broke the protocol (a segment beyond the credits, a
    /// credit beyond what was sent): the buffer or subscriber concerned
    /// was closed or detached.
    pub protocol_errors: u64,
    /// Subscribe requests refused (duplicate, too many waiting, no slot).
    pub subscribes_refused: u64,
    /// Peers lost without a close (tunnel failed: dead peer).
    pub peers_lost: u64,
    /// Overwrite flow: segments overwritten while being copied for
    /// sending (not sent).
    pub torn_sends: u64,
    /// The association endpoint's own counters (`udp://` outputs).
    pub endpoint: Option<crate::EndpointStats>,
}

/// Transport counters, shared by the threads of one output or input.
#[cfg(not(skiff_loom))]
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) malformed: AtomicU64,
    pub(crate) unknown: AtomicU64,
    pub(crate) protocol: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) peers_lost: AtomicU64,
    pub(crate) torn: AtomicU64,
}

#[cfg(not(skiff_loom))]
impl Counters {
    pub(crate) fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> LinkStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LinkStats {
            frames_malformed: g(&self.malformed),
            frames_unknown: g(&self.unknown),
            protocol_errors: g(&self.protocol),
            subscribes_refused: g(&self.refused),
            peers_lost: g(&self.peers_lost),
            torn_sends: g(&self.torn),
            endpoint: None,
        }
    }
}

/// Options of a buffer object, from the locator's query.
#[derive(Debug, Clone)]
pub struct BufferOptions {
    /// Directory of ring files (`dir=`; default `/dev/shm/skiff`, else
    /// `$XDG_RUNTIME_DIR/skiff`, else the temp dir).
    pub dir: PathBuf,
    /// Busy-poll this long before sleeping on a futex (`spin=20us`).
    pub spin: Duration,
    /// Segment records per ring (`records=`; default capacity/64 within
    /// 64..=65536).
    pub records: Option<u64>,
    /// Consumer slots per ring (`consumers=`, default 8).
    pub consumers: u32,
    /// How long `subscribe` waits for the buffer to appear (`wait=`;
    /// default 5 s).
    pub wait: Duration,
}

impl Default for BufferOptions {
    fn default() -> Self {
        BufferOptions {
            dir: default_dir(),
            spin: Duration::ZERO,
            records: None,
            consumers: 8,
            wait: Duration::from_secs(5),
        }
    }
}

/// The default ring directory.
pub fn default_dir() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        return shm.join("skiff");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => PathBuf::from(d).join("skiff"),
        None => std::env::temp_dir().join("skiff"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_formats() {
        let all = [
            BufferError::DuplicateId {
                id: 1,
                owner: String::new(),
            },
            BufferError::UnknownBuffer { id: 1 },
            BufferError::Usage {
                id: 1,
                why: "x".into(),
            },
            BufferError::TooLarge {
                id: 1,
                len: 9,
                limit: 8,
            },
            BufferError::WouldBlock {
                id: 1,
                len: 9,
                free: 8,
                records: 0,
            },
            BufferError::NoSlot { id: 1, slots: 8 },
            BufferError::Corrupt {
                id: 1,
                why: "x".into(),
            },
            BufferError::PeerDead { id: 1, pid: 2 },
            BufferError::PeerLost { id: 1 },
            BufferError::Closed { id: 1 },
            BufferError::Timeout,
            BufferError::Io {
                what: "open",
                source: io::Error::other("x"),
            },
        ];
        for e in all {
            assert!(!e.to_string().is_empty());
        }
        let e = BufferError::TooLarge {
            id: 1,
            len: 9,
            limit: 8,
        };
        assert!(e.to_string().contains("at most 8"));
    }
}
