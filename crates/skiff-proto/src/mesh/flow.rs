//! Flow: the data between nodes. Application frames to one peer share
//! data datagrams, each with the next of that peer's sequence numbers; the
//! receiver checks them against a loss detector, hands the frames on as
//! slices of the datagram ([`Frames`]) and acknowledges once per burst.
//! A sender whose window to a peer is full has no [`Mesh::room`] until an
//! ack (or its timeout) opens it. Association packets ride datagrams of
//! their own, unread.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;

use super::outbox::Outbox;
use super::packet::{self, Kind, Reader};
use super::{Mesh, MeshConfig, MeshEvent, Peer};
use crate::loss::{LossDetector, Verdict, WINDOW};
use crate::{varint, WireError};

/// Largest datagram the mesh sends, whatever the path allows.
const MAX_DATAGRAM: usize = 65_000;

/// The flow of data to and from one peer.
#[derive(Debug)]
pub(super) struct PeerFlow {
    /// Sequence number of the next data datagram to the peer.
    tx_seq: u64,
    /// The data datagram being filled (empty: none).
    tx: Vec<u8>,
    tx_frames: u64,
    /// Data datagrams sealed and waiting for [`Mesh::poll_transmit`].
    pub(super) sealed: VecDeque<Vec<u8>>,
    /// Largest data datagram to this peer: its path MTU when known.
    max_data: usize,
    /// Data datagrams the peer acknowledged (next it expects).
    acked: u64,
    /// When the window last moved (or first filled).
    acked_at: Instant,
    /// Next data sequence number expected from the peer.
    rx_next: u64,
    ack_due: bool,
    pub(super) rx: LossDetector,
}

impl PeerFlow {
    pub(super) fn new(now: Instant) -> PeerFlow {
        PeerFlow {
            tx_seq: 0,
            tx: Vec::new(),
            tx_frames: 0,
            sealed: VecDeque::new(),
            max_data: 0,
            acked: 0,
            acked_at: now,
            rx_next: 0,
            ack_due: false,
            rx: rx_detector(),
        }
    }

    /// A fresh stream of sequence numbers each way (the peer came up).
    pub(super) fn restart(&mut self, now: Instant) {
        self.rx = rx_detector();
        self.tx_seq = 0;
        self.acked = 0;
        self.rx_next = 0;
        self.acked_at = now;
    }

    /// Forgets the frames not yet sealed (the peer went down).
    pub(super) fn drop_pending(&mut self) {
        self.tx.clear();
        self.tx_frames = 0;
    }

    /// Whether the window is full under `config`.
    fn full(&self, config: &MeshConfig) -> bool {
        self.tx_seq.saturating_sub(self.acked) >= self.window(config)
    }

    /// The window in datagrams.
    fn window(&self, config: &MeshConfig) -> u64 {
        (config.window / self.datagram_size(config) as u64).max(4)
    }

    fn datagram_size(&self, config: &MeshConfig) -> usize {
        if self.max_data > 0 {
            self.max_data
        } else {
            config.max_datagram.max(512)
        }
    }
}

/// The loss detector of data from one peer: it numbers datagrams, and its
/// sender has at most a window of them in flight, so a number more than
/// [`WINDOW`] ahead is not a loss but a forgery (or a restart, accepted
/// after the old stream's silence). Trusting only jumps within the window
/// keeps the real stream's next datagrams inside it, delivered.
fn rx_detector() -> LossDetector {
    LossDetector::with_ahead(1, WINDOW)
}

/// The frames of one data datagram (validated): each is a slice of the
/// received datagram, no copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frames {
    buf: Bytes,
}

impl Frames {
    /// The bytes of the frames left (with their length prefixes).
    pub fn byte_len(&self) -> usize {
        self.buf.len()
    }

    /// The frames of `buf`, each a varint length and that many bytes (at
    /// most `max_frame`), checked whole before any is handed on; with their
    /// count. Total: any input gives frames or an error.
    pub fn checked(buf: Bytes, max_frame: usize) -> Result<(Frames, u64), WireError> {
        let mut check = Reader::new(&buf);
        let mut n = 0;
        while !check.is_empty() {
            check.bytes(max_frame, "mesh frame")?;
            n += 1;
        }
        Ok((Frames { buf }, n))
    }

    /// The frames not yet taken, encoded (each a varint length and bytes).
    pub fn as_bytes(&self) -> &Bytes {
        &self.buf
    }
}

impl Iterator for Frames {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        let (n, used) = varint::get(&self.buf).ok()?;
        let end = used.checked_add(usize::try_from(n).ok()?)?;
        if end > self.buf.len() {
            return None;
        }
        // One reference-count increment per frame (`split_to`), none to
        // move past it: the count is shared by every frame of the datagram.
        let mut f = self.buf.split_to(end);
        bytes::Buf::advance(&mut f, used);
        Some(f)
    }
}

/// Why [`Mesh::send_frame`] refused a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Larger than one datagram.
    #[error("a frame of {len} bytes is over the mesh's datagram limit of {max} bytes")]
    TooLarge {
        /// The frame's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The peer is not an up member.
    #[error("mesh peer {0} is not up")]
    NotUp(SocketAddr),
}

impl Mesh {
    /// Queues `frame` for the peer at `to`, sharing a datagram with the
    /// frames queued before it; a datagram is sealed when the next frame
    /// would not fit or at the next [`Mesh::poll_transmit`]. Refuses (and
    /// counts) a frame larger than one datagram, or a peer that is not up.
    pub fn send_frame(
        &mut self,
        now: Instant,
        to: SocketAddr,
        frame: &[u8],
    ) -> Result<(), FrameError> {
        self.send_frame_parts(now, to, &[frame])
    }

    /// [`Mesh::send_frame`] of the frame made of `parts` in order (a tag
    /// and a body, say), so the caller need not join them first.
    pub fn send_frame_parts(
        &mut self,
        now: Instant,
        to: SocketAddr,
        parts: &[&[u8]],
    ) -> Result<(), FrameError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        self.now = self.now.max(now);
        let max = match self.peers.get(&to) {
            Some(p) if p.flow.max_data > 0 => p.flow.max_data,
            _ => self.config.max_datagram.max(512),
        };
        let need = varint::len(len as u64) + len;
        if packet::ENVELOPE + 8 + need > MAX_DATAGRAM.max(max) {
            self.stats.frames_too_large += 1;
            return Err(FrameError::TooLarge {
                len,
                max: MAX_DATAGRAM - packet::ENVELOPE - 8 - 4,
            });
        }
        let (net, now) = (self.net, self.now);
        let Some(p) = self.peers.get_mut(&to).filter(|p| p.up) else {
            return Err(FrameError::NotUp(to));
        };
        if !p.flow.tx.is_empty() && p.flow.tx.len() + need > max {
            seal(p, &mut self.out);
        }
        let f = &mut p.flow;
        if f.tx.is_empty() {
            if f.tx_seq == f.acked {
                // Nothing in flight: the ack clock starts now.
                f.acked_at = now;
            }
            if f.tx.capacity() == 0 {
                f.tx = self.out.buffer();
            }
            // Once, to the whole datagram: no growth frame by frame.
            f.tx.clear();
            f.tx.reserve(max);
            packet::envelope(&mut f.tx, Kind::Data, net);
            f.tx.extend_from_slice(&f.tx_seq.to_le_bytes());
            f.tx_seq += 1;
        }
        varint::put(&mut f.tx, len as u64);
        for part in parts {
            f.tx.extend_from_slice(part);
        }
        f.tx_frames += 1;
        Ok(())
    }

    /// Queues one association packet for the up member at `to`, in a
    /// datagram of its own; with `alone` (the association's
    /// [`Transmit::alone`](crate::association::Transmit::alone): a repeat
    /// that must not share the fate of the first) never in a segmented run
    /// with its neighbours. Refuses (and counts) a packet too large for a
    /// datagram, or a peer that is not up.
    pub fn send_assoc(
        &mut self,
        now: Instant,
        to: SocketAddr,
        packet: &[u8],
        alone: bool,
    ) -> Result<(), FrameError> {
        self.now = self.now.max(now);
        let max = MAX_DATAGRAM - packet::ENVELOPE;
        if packet.len() > max {
            self.stats.frames_too_large += 1;
            return Err(FrameError::TooLarge {
                len: packet.len(),
                max,
            });
        }
        let Some(p) = self.peers.get_mut(&to).filter(|p| p.up) else {
            return Err(FrameError::NotUp(to));
        };
        let mut d = self.out.buffer();
        packet::envelope(&mut d, Kind::Assoc, self.net);
        d.extend_from_slice(packet);
        p.stats.sent_datagrams += 1;
        p.stats.sent_bytes += d.len() as u64;
        if alone {
            self.out.push_alone(to, d);
        } else {
            self.out.push(to, d);
        }
        Ok(())
    }

    /// A buffer holding an association datagram's envelope, for the
    /// caller to append one association packet to and hand back with
    /// [`Mesh::send_assoc_datagram`]: the packet is written in place, no
    /// copy.
    pub fn assoc_buffer(&mut self) -> Vec<u8> {
        let mut d = self.out.buffer();
        packet::envelope(&mut d, Kind::Assoc, self.net);
        d
    }

    /// Takes back a buffer from [`Mesh::assoc_buffer`] that was not used.
    pub fn recycle_assoc_buffer(&mut self, d: Vec<u8>) {
        self.out.recycle(d);
    }

    /// [`Mesh::send_assoc`] of a datagram built in a buffer from
    /// [`Mesh::assoc_buffer`] (its envelope, then one packet). Refuses (and
    /// counts) one too large or a peer that is not up; the buffer is kept
    /// for reuse either way.
    pub fn send_assoc_datagram(
        &mut self,
        now: Instant,
        to: SocketAddr,
        d: Vec<u8>,
        alone: bool,
    ) -> Result<(), FrameError> {
        self.now = self.now.max(now);
        if d.len() > MAX_DATAGRAM || d.len() <= packet::ENVELOPE {
            self.stats.frames_too_large += 1;
            let len = d.len();
            self.out.recycle(d);
            return Err(FrameError::TooLarge {
                len,
                max: MAX_DATAGRAM - packet::ENVELOPE,
            });
        }
        let Some(p) = self.peers.get_mut(&to).filter(|p| p.up) else {
            self.out.recycle(d);
            return Err(FrameError::NotUp(to));
        };
        p.stats.sent_datagrams += 1;
        p.stats.sent_bytes += d.len() as u64;
        if alone {
            self.out.push_alone(to, d);
        } else {
            self.out.push(to, d);
        }
        Ok(())
    }

    /// Whether every up peer's window has room for more data datagrams:
    /// the node holds publishers back while it has none.
    pub fn room(&self) -> bool {
        self.peers
            .values()
            .all(|p| !p.up || !p.flow.full(&self.config))
    }

    /// Sizes data datagrams to `addr` by its path MTU (the driver asks the
    /// kernel, `IP_MTU`): a whole datagram per IP packet, never fragmented,
    /// and as few datagrams as the path allows (a loopback peer takes 64 KB
    /// ones, an Ethernet peer 1,472-byte ones).
    pub fn set_path_mtu(&mut self, addr: SocketAddr, mtu: usize) {
        let ip_udp = if addr.is_ipv4() { 28 } else { 48 };
        if let Some(p) = self.peers.get_mut(&addr) {
            p.flow.max_data = mtu.saturating_sub(ip_udp).clamp(512, MAX_DATAGRAM);
        }
    }

    /// Seals every peer's pending frames into datagrams, acknowledges what
    /// arrived, and sends pending interest changes as deltas.
    pub(super) fn flush(&mut self) {
        let net = self.net;
        for p in self.peers.values_mut() {
            seal(p, &mut self.out);
            if p.flow.ack_due {
                p.flow.ack_due = false;
                let mut d = self.out.buffer();
                packet::envelope(&mut d, Kind::Ack, net);
                d.extend_from_slice(&p.flow.rx_next.to_le_bytes());
                self.out.push(p.id.addr, d);
            }
        }
        self.send_deltas();
    }

    /// Opens the windows whose ack is later than the timeout (counted).
    pub(super) fn flow_timeout(&mut self, now: Instant) {
        let t = self.config.ack_timeout;
        for p in self.peers.values_mut() {
            let f = &mut p.flow;
            if p.up && f.full(&self.config) && now >= f.acked_at + t {
                f.acked = f.tx_seq;
                f.acked_at = now;
                self.stats.ack_timeouts += 1;
            }
        }
    }

    /// When the first full window opens by its timeout, if one is full.
    pub(super) fn flow_deadline(&self) -> Option<Instant> {
        self.peers
            .values()
            .filter(|p| p.up && p.flow.full(&self.config))
            .map(|p| p.flow.acked_at + self.config.ack_timeout)
            .min()
    }

    /// An ack from the up member `from`.
    pub(super) fn handle_ack(&mut self, from: SocketAddr, body: &[u8]) -> Result<(), WireError> {
        let next = Reader::new(body).u64("mesh packet")?;
        let now = self.now;
        let f = &mut self.peers.get_mut(&from).expect("up").flow;
        let next = next.min(f.tx_seq);
        if next > f.acked {
            f.acked = next;
            f.acked_at = now;
        }
        Ok(())
    }

    /// A data datagram from the up member `from`: its frames become one
    /// [`MeshEvent::Frames`], slices of `datagram`.
    pub(super) fn handle_data(
        &mut self,
        from: SocketAddr,
        body: &[u8],
        datagram: &Bytes,
    ) -> Result<(), WireError> {
        let mut r = Reader::new(body);
        let seq = r.u64("mesh packet")?;
        let now = self.now;
        let p = self.peers.get_mut(&from).expect("up");
        let f = &mut p.flow;
        f.ack_due = true;
        p.stats.recv_datagrams += 1;
        p.stats.recv_bytes += body.len() as u64 + packet::ENVELOPE as u64;
        if f.rx.check(0, seq, || now) != Verdict::Deliver {
            return Ok(());
        }
        // Only a datagram delivered moves the ack: a refused one (a
        // forgery far ahead, say) must not tell the peer it arrived.
        f.rx_next = f.rx_next.max(seq.saturating_add(1));
        // Checked whole before any frame is handed on.
        let mut check = Reader::new(r.rest());
        let mut n = 0;
        while !check.is_empty() {
            check.bytes(packet::MAX_FRAME, "mesh frame")?;
            n += 1;
        }
        p.stats.recv_frames += n;
        let at = datagram.len() - r.rest().len();
        self.events.push_back(MeshEvent::Frames {
            from,
            frames: Frames {
                buf: datagram.slice(at..),
            },
        });
        Ok(())
    }

    /// An association packet from the up member `from`.
    pub(super) fn handle_assoc(&mut self, from: SocketAddr, body: &[u8]) -> Result<(), WireError> {
        if body.is_empty() {
            return Err(WireError::Truncated {
                what: "association packet",
            });
        }
        let p = self.peers.get_mut(&from).expect("up");
        p.stats.recv_datagrams += 1;
        p.stats.recv_bytes += body.len() as u64 + packet::ENVELOPE as u64;
        self.events.push_back(MeshEvent::Assoc {
            from,
            packet: Bytes::copy_from_slice(body),
        });
        Ok(())
    }
}

/// Seals the datagram being filled for `p`, if any: it waits in the
/// peer's queue for [`Mesh::poll_transmit`].
fn seal(p: &mut Peer, out: &mut Outbox) {
    let f = &mut p.flow;
    if f.tx.is_empty() {
        return;
    }
    let d = std::mem::take(&mut f.tx);
    p.stats.sent_datagrams += 1;
    p.stats.sent_bytes += d.len() as u64;
    p.stats.sent_frames += std::mem::take(&mut f.tx_frames);
    out.sealed(p.id.addr, &mut f.sealed, d);
}
