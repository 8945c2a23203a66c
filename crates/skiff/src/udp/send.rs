//! Sending: many datagrams per `sendmmsg(2)`, each to its own destination,
//! with the kernel cutting equal-size runs into datagrams (`UDP_SEGMENT`,
//! GSO) where it can and `send` cutting them itself where it cannot; a lone
//! datagram by plain `sendto(2)` (or `send(2)` to a connected peer).

use std::io;
use std::mem;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::UdpSocket;
use crate::sys;

/// Segments in one GSO send at most (`UDP_MAX_SEGMENTS` of older kernels).
pub(super) const GSO_MAX_SEGMENTS: usize = 64;
/// Largest UDP payload over IPv4; no GSO send carries more.
pub(super) const MAX_UDP_PAYLOAD: usize = 65_507;
/// How long `send` waits for room to finish a datagram it has begun to send
/// segment by segment, per wait.
const FINISH_WAIT: Duration = Duration::from_millis(100);
/// Waits for room before `send` gives up on finishing a datagram.
const FINISH_WAITS: u32 = 10;

/// One datagram to send, or a run of equal segments (GSO).
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    /// Where it goes. An IPv4 address is sent v4-mapped from an IPv6 socket.
    pub dest: SocketAddr,
    /// The bytes: one datagram, or with `segment_size`, several back to back.
    pub data: &'a [u8],
    /// With `Some(n)`, `data` is several datagrams of `n` bytes each, the
    /// last possibly shorter; the receiver sees them as separate datagrams.
    pub segment_size: Option<usize>,
}

impl UdpSocket {
    /// Segments one [`Outgoing`] may carry for the kernel to cut (GSO): 64
    /// where GSO works, else 1. `send` accepts more (it cuts them itself),
    /// but a caller sizing its batches should use this, and keep a
    /// segmented datagram within 65,507 bytes.
    pub fn max_segments(&self) -> usize {
        if self.gso.load(Ordering::Relaxed) {
            GSO_MAX_SEGMENTS
        } else {
            1
        }
    }

    /// Sends as many of `datagrams` as the kernel takes now without blocking,
    /// in order, and returns how many went (all of each: a segmented
    /// datagram counts once all its segments went). A lone unsegmented
    /// datagram goes with one `sendto`, anything else with `sendmmsg`.
    ///
    /// Errors: `WouldBlock` if the send buffer took none; otherwise the error
    /// of `datagrams[0]`. When a later datagram fails, the count stops before
    /// it and sending again from there returns its error.
    ///
    /// Segmented datagrams go to the kernel whole where GSO works. If the
    /// kernel refuses one (`EIO`, `EINVAL`) and then takes its segments one
    /// by one, GSO is turned off for this socket ([`Self::max_segments`]
    /// becomes 1). Once some segments of a datagram went one by one, `send`
    /// waits (up to about a second) for buffer room to send the rest; if it
    /// cannot, that datagram is reported unsent, so a retry may repeat its
    /// first segments.
    pub fn send(&self, datagrams: &[Outgoing<'_>]) -> io::Result<usize> {
        if let [d] = datagrams {
            if d.segment_size.is_none_or(|s| s == 0 || s >= d.data.len()) {
                // One whole datagram: `sendto`, cheaper than `sendmmsg`.
                let fd = self.socket.as_fd();
                let mapped;
                let dest = match (self.v6, &d.dest) {
                    (true, SocketAddr::V4(_)) | (false, SocketAddr::V6(_)) => {
                        mapped = self.adapt(d.dest);
                        &mapped
                    }
                    (_, dest) => dest,
                };
                if self.peer.get() == Some(dest) {
                    return sys::send(fd, d.data).map(|()| 1);
                }
                return sys::sendto(fd, dest, d.data).map(|()| 1);
            }
        }
        self.send_batch(datagrams)
    }

    /// `send` of several datagrams, or of segmented ones: out of line, so
    /// that a lone datagram's call does not set up (or probe the stack
    /// for) the batch's arrays.
    #[inline(never)]
    fn send_batch(&self, datagrams: &[Outgoing<'_>]) -> io::Result<usize> {
        let fd = self.socket.as_fd();
        let empty = sys::Transmit {
            dest: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            data: &[],
            iov: &[],
            segment_size: None,
        };
        let mut tx = [empty; sys::MAX_BATCH];
        // For each entry of `tx`: the datagram and the offset after it.
        let mut ends = [(0usize, 0usize); sys::MAX_BATCH];
        // Next datagram, and the bytes of it already sent.
        let (mut at, mut off) = (0usize, 0usize);
        // The datagram to send segment by segment after a GSO refusal, and
        // whether success then means GSO does not work here.
        let mut split: Option<usize> = None;
        let mut disable_on_success = false;
        let mut waits = 0;
        while at < datagrams.len() {
            let gso = self.gso.load(Ordering::Relaxed);
            let (mut n, mut j, mut o) = (0, at, off);
            while n < sys::MAX_BATCH && j < datagrams.len() {
                let d = &datagrams[j];
                let len = d.data.len();
                let seg = d.segment_size.filter(|&s| s > 0 && s < len);
                let (end, segment_size) = match seg {
                    None => (len, None),
                    Some(s) if gso && split != Some(j) => {
                        let run = (MAX_UDP_PAYLOAD / s).clamp(1, GSO_MAX_SEGMENTS) * s;
                        let end = (o + run).min(len);
                        // `s < end - o <= MAX_UDP_PAYLOAD` here, so it fits u16.
                        (end, (end - o > s).then_some(s as u16))
                    }
                    Some(s) => ((o + s).min(len), None),
                };
                tx[n] = sys::Transmit {
                    dest: self.adapt(d.dest),
                    data: &d.data[o..end],
                    iov: &[],
                    segment_size,
                };
                ends[n] = (j, end);
                n += 1;
                if end >= len {
                    (j, o) = (j + 1, 0);
                } else {
                    o = end;
                }
            }
            match sys::sendmmsg(fd, &tx[..n]) {
                Ok(k) => {
                    if mem::take(&mut disable_on_success) {
                        self.gso.store(false, Ordering::Relaxed);
                    }
                    let (j, end) = ends[k.clamp(1, n) - 1];
                    (at, off) = if end >= datagrams[j].data.len() {
                        (j + 1, 0)
                    } else {
                        (j, end)
                    };
                    waits = 0;
                }
                Err(e) => {
                    if tx[0].segment_size.is_some() && sys::is_gso_error(&e) {
                        split = Some(at);
                        disable_on_success = sys::disables_gso(&e);
                        continue;
                    }
                    disable_on_success = false;
                    if off > 0 && e.kind() == io::ErrorKind::WouldBlock && waits < FINISH_WAITS {
                        waits += 1;
                        if sys::poll(fd, libc::POLLOUT, Some(FINISH_WAIT))? {
                            continue;
                        }
                    }
                    return if at > 0 { Ok(at) } else { Err(e) };
                }
            }
        }
        Ok(datagrams.len())
    }

    /// Puts `dest` in the socket's address family where it can be.
    pub(super) fn adapt(&self, dest: SocketAddr) -> SocketAddr {
        match (self.v6, dest) {
            (true, SocketAddr::V4(a)) => {
                SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0).into()
            }
            (false, SocketAddr::V6(a)) => match a.ip().to_ipv4_mapped() {
                Some(ip) => SocketAddrV4::new(ip, a.port()).into(),
                None => dest,
            },
            _ => dest,
        }
    }
}
