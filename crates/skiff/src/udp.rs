//! The UDP driver: a non-blocking socket that moves many datagrams per
//! system call.
//!
//! [`UdpSocket::send`] hands up to 64 datagrams at a time to `sendmmsg(2)`,
//! each with **its own destination** (a lone datagram goes with plain
//! `sendto(2)`, which costs less), and cuts large batches into segments
//! in the kernel (`UDP_SEGMENT`, GSO) where it can; [`UdpSocket::recv`]
//! takes whatever is waiting with one `recvmmsg(2)` into a [`RecvBatch`],
//! whose datagrams come out as zero-copy [`Bytes`] slices of one arena, with
//! coalesced runs (`UDP_GRO`) and the kernel's receive-drop counter
//! (`SO_RXQ_OVFL`). [`UdpSocket::recv_wait`], the blocking receive of a
//! request/reply exchange, is instead one plain `recvfrom(2)`, the cheapest
//! receive the kernel has, which reports neither (see there). It promises
//! nothing about delivery; it does promise that the kernel's drops are
//! visible ([`RecvBatch::kernel_drops`], [`UdpSocket::kernel_drops`]) and
//! that a datagram larger than a slot is flagged, never silently cut.
//!
//! Why not `quinn-udp`: it sends one destination per call (QUIC talks to
//! one peer per connection), while the queue (CMQ) batches per destination
//! and flushes many destinations at once, which needs `sendmmsg` across
//! destinations; and it does not read `SO_RXQ_OVFL`, without which receive
//! buffer overflows would be silent loss.
//!
//! Linux only. All system calls live in the crate's `sys` module.

use std::io;
use std::mem;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use socket2::{Domain, InterfaceIndexOrAddress, Protocol, Socket, Type};

use crate::sys;

/// Segments in one GSO send at most (`UDP_MAX_SEGMENTS` of older kernels).
const GSO_MAX_SEGMENTS: usize = 64;
/// Largest UDP payload over IPv4; no GSO send carries more.
const MAX_UDP_PAYLOAD: usize = 65_507;
/// How long `send` waits for room to finish a datagram it has begun to send
/// segment by segment, per wait.
const FINISH_WAIT: Duration = Duration::from_millis(100);
/// Waits for room before `send` gives up on finishing a datagram.
const FINISH_WAITS: u32 = 10;
/// Earlier receive arenas kept for reuse while the application still holds
/// slices of them.
const KEPT_ARENAS: usize = 4;
/// Most slots of a [`RecvBatch`] (`UIO_MAXIOV`).
const MAX_SLOTS: usize = 1024;
/// Largest useful slot: no UDP datagram or GRO run is longer.
const MAX_SLOT: usize = 65_536;

/// Options a locator can set on a UDP socket.
#[derive(Debug, Clone)]
pub struct UdpConfig {
    /// `SO_SNDBUF` to ask for; `None` keeps the system default. The kernel
    /// caps it (`net.core.wmem_max`); [`UdpSocket::send_buffer_size`] says
    /// what it granted.
    pub send_buffer: Option<usize>,
    /// `SO_RCVBUF` to ask for; `None` keeps the system default. The kernel
    /// caps it (`net.core.rmem_max`); [`UdpSocket::recv_buffer_size`] says
    /// what it granted.
    pub recv_buffer: Option<usize>,
    /// Let the kernel cut segmented sends (`UDP_SEGMENT`); default `true`.
    /// Without it, `send` splits them itself.
    pub gso: bool,
    /// Accept coalesced runs of datagrams (`UDP_GRO`); default `true`.
    pub gro: bool,
    /// Deliver this host's own multicast datagrams to its sockets; default
    /// `true`.
    pub multicast_loop: bool,
    /// TTL (IPv4) or hop limit (IPv6) of multicast datagrams; default 1
    /// (this link only).
    pub multicast_ttl: u32,
    /// `SO_REUSEADDR`; default `false`. Needed to bind several sockets to
    /// one multicast group's port.
    pub reuse_addr: bool,
}

impl Default for UdpConfig {
    fn default() -> Self {
        UdpConfig {
            send_buffer: None,
            recv_buffer: None,
            gso: true,
            gro: true,
            multicast_loop: true,
            multicast_ttl: 1,
            reuse_addr: false,
        }
    }
}

/// The local interface of a multicast membership or of outgoing multicast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MulticastInterface {
    /// The IPv4 interface with this address (IPv4 groups only).
    Addr(Ipv4Addr),
    /// The interface with this index (`if_nametoindex`); 0 lets the kernel
    /// choose.
    Index(u32),
}

impl From<Ipv4Addr> for MulticastInterface {
    fn from(a: Ipv4Addr) -> Self {
        MulticastInterface::Addr(a)
    }
}

impl From<u32> for MulticastInterface {
    fn from(index: u32) -> Self {
        MulticastInterface::Index(index)
    }
}

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

/// A non-blocking UDP socket that sends and receives in batches.
///
/// All methods take `&self`; one thread may send while another receives.
#[derive(Debug)]
pub struct UdpSocket {
    socket: Socket,
    v6: bool,
    /// Whether segmented sends go to the kernel whole; cleared when the
    /// kernel refuses one that it then takes segment by segment.
    gso: AtomicBool,
    /// The `SO_RCVTIMEO` last set, in µs (`u64::MAX`: none), so that
    /// `recv_wait` sets it only when it changes.
    recv_timeout: AtomicU64,
    /// The peer of a connected socket (see [`UdpSocket::connect`]).
    peer: std::sync::OnceLock<SocketAddr>,
    /// `UDP_GRO` is on: a buffer may be a coalesced run.
    gro: bool,
}

impl UdpSocket {
    /// Creates a non-blocking socket bound to `addr` (IPv4 or IPv6; an IPv6
    /// socket keeps the system's `IPV6_V6ONLY` default, dual stack on
    /// Linux), sets the options of `cfg`, and turns on `SO_RXQ_OVFL` always
    /// and `UDP_GRO` if `cfg.gro` (each only where the kernel has it).
    pub fn bind(addr: SocketAddr, cfg: &UdpConfig) -> io::Result<UdpSocket> {
        let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
        // Blocking mode, so `recv_wait` can sleep inside recvfrom; every
        // other call passes MSG_DONTWAIT and never blocks.
        socket.set_nonblocking(false)?;
        if cfg.reuse_addr {
            socket.set_reuse_address(true)?;
        }
        if let Some(n) = cfg.send_buffer {
            socket.set_send_buffer_size(n)?;
        }
        if let Some(n) = cfg.recv_buffer {
            socket.set_recv_buffer_size(n)?;
        }
        let v6 = addr.is_ipv6();
        if v6 {
            socket.set_multicast_loop_v6(cfg.multicast_loop)?;
            socket.set_multicast_hops_v6(cfg.multicast_ttl)?;
            // For IPv4 groups reached through a dual-stack socket; an
            // IPV6_V6ONLY socket refuses these, which does not matter.
            let _ = socket.set_multicast_loop_v4(cfg.multicast_loop);
            let _ = socket.set_multicast_ttl_v4(cfg.multicast_ttl);
        } else {
            socket.set_multicast_loop_v4(cfg.multicast_loop)?;
            socket.set_multicast_ttl_v4(cfg.multicast_ttl)?;
        }
        socket.bind(&addr.into())?;
        let fd = socket.as_fd();
        // Without SO_RXQ_OVFL (old kernels) kernel_drops stays 0.
        let _ = sys::enable_rxq_ovfl(fd);
        // Without UDP_GRO every datagram arrives on its own, which is
        // correct, only slower.
        let gro = cfg.gro && sys::enable_gro(fd).is_ok();
        let gso = cfg.gso && sys::probe_gso(fd);
        Ok(UdpSocket {
            socket,
            v6,
            gso: AtomicBool::new(gso),
            recv_timeout: AtomicU64::new(u64::MAX),
            peer: std::sync::OnceLock::new(),
            gro,
        })
    }

    /// The address the socket is bound to (with the port the kernel chose
    /// for port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("socket has no IP address"))
    }

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

    /// The send buffer the kernel granted, in bytes (Linux reports twice
    /// the requested size, the extra being its bookkeeping).
    pub fn send_buffer_size(&self) -> io::Result<usize> {
        self.socket.send_buffer_size()
    }

    /// The receive buffer the kernel granted, in bytes (Linux reports twice
    /// the requested size, the extra being its bookkeeping).
    pub fn recv_buffer_size(&self) -> io::Result<usize> {
        self.socket.recv_buffer_size()
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
    /// Connects the socket to `peer` (once): the kernel then delivers only
    /// `peer`'s datagrams to it, and a lone datagram to `peer` leaves by
    /// `send(2)`, which keeps the route instead of looking it up per call.
    /// Datagrams to other addresses still go (by `sendto`).
    pub fn connect(&self, peer: SocketAddr) -> io::Result<()> {
        let peer = self.adapt(peer);
        if let Some(p) = self.peer.get() {
            return if *p == peer {
                Ok(())
            } else {
                Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("already connected to {p}"),
                ))
            };
        }
        self.socket.connect(&peer.into())?;
        let _ = self.peer.set(peer);
        Ok(())
    }

    /// The peer the socket is connected to, if any.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.peer.get().copied()
    }

    fn adapt(&self, dest: SocketAddr) -> SocketAddr {
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

    /// Receives what is ready now, in one system call, into `batch` (what it
    /// held before is gone); returns how many buffers arrived (a GRO buffer
    /// counts once). `WouldBlock` if nothing was waiting.
    pub fn recv(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        self.recv_inner(batch, false)
    }

    /// Waits up to `timeout` (forever with `None`) for a datagram inside
    /// the receive system call itself (one `recvfrom` taking one datagram;
    /// what else arrived is left for the next `recv`): one system call
    /// where `wait_readable` + `recv` take two, which is what a
    /// request/reply exchange pays per message. `WouldBlock` on timeout,
    /// `Interrupted` if a signal cut the wait short.
    ///
    /// `recvfrom` carries no control messages, which is why it is cheaper
    /// than `recvmsg`, so this receive reports no drop counter (read
    /// [`UdpSocket::kernel_drops`]) and no GRO segment size: with GRO on,
    /// its buffer may be a run of datagrams the kernel coalesced, marked
    /// [`Received::maybe_run`], which only a caller that can tell where its
    /// own datagrams end can split.
    pub fn recv_wait(&self, batch: &mut RecvBatch, timeout: Option<Duration>) -> io::Result<usize> {
        let micros = timeout.map_or(u64::MAX, |d| d.as_micros().min(u64::MAX as u128 - 1) as u64);
        // A plain load first: the common wait repeats the last timeout.
        if self.recv_timeout.load(Ordering::Relaxed) != micros {
            self.recv_timeout.store(micros, Ordering::Relaxed);
            sys::set_recv_timeout(self.socket.as_fd(), timeout)?;
        }
        self.recv_inner(batch, true)
    }

    fn recv_inner(&self, batch: &mut RecvBatch, wait: bool) -> io::Result<usize> {
        batch.count = 0;
        let mut arena = batch.take_arena();
        let r = sys::recvmmsg(
            self.socket.as_fd(),
            &mut batch.bufs,
            &mut arena,
            batch.slot_size,
            &mut batch.meta,
            wait,
        );
        match r {
            Ok(n) if n > 0 => {
                let RecvBatch {
                    meta,
                    drops,
                    last_ovfl,
                    ..
                } = batch;
                for v in meta[..n].iter().filter_map(|m| m.rxq_ovfl) {
                    fold_drops(drops, last_ovfl, v);
                }
                // A waiting receive reads no GRO segment size.
                meta[0].maybe_run = wait && self.gro;
                batch.filled = arena.freeze();
                batch.count = n;
                Ok(n)
            }
            other => {
                batch.arena = Some(arena);
                other
            }
        }
    }

    /// Waits until a datagram is waiting or `timeout` passes (`None`:
    /// forever); returns whether one is. Also true when the socket has an
    /// error to report, which the next `recv` returns.
    pub fn wait_readable(&self, timeout: Option<Duration>) -> io::Result<bool> {
        sys::poll(self.socket.as_fd(), libc::POLLIN, timeout)
    }

    /// Registers the socket with tokio's reactor for `interest` (through a
    /// duplicate descriptor of the same socket, so callers need no `unsafe`),
    /// for a task to await readiness and then call [`Self::recv`] or
    /// [`Self::send`]; after one of them returns `WouldBlock`, clear the
    /// readiness (`guard.clear_ready()`). Must be called inside a tokio
    /// runtime with I/O enabled (tokio panics otherwise).
    pub fn register_async(
        &self,
        interest: tokio::io::Interest,
    ) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
        sys::register_async(self.socket.as_fd(), interest)
    }

    /// The kernel's drop counter for this socket as it is now (`SO_MEMINFO`;
    /// 32 bits, wrapping): unlike [`RecvBatch::kernel_drops`] it does not
    /// wait for a later datagram to bring the news. Same unit: buffers,
    /// which with GRO may each have held several datagrams.
    pub fn kernel_drops(&self) -> io::Result<u64> {
        sys::meminfo_drops(self.socket.as_fd()).map(u64::from)
    }

    /// Joins a multicast group on `interface` (`None`: the kernel chooses).
    /// An IPv6 group takes an interface index.
    pub fn join_multicast(
        &self,
        group: IpAddr,
        interface: Option<MulticastInterface>,
    ) -> io::Result<()> {
        match group {
            IpAddr::V4(g) => self
                .socket
                .join_multicast_v4_n(&g, &v4_interface(interface)),
            IpAddr::V6(g) => self.socket.join_multicast_v6(&g, v6_interface(interface)?),
        }
    }

    /// Leaves a multicast group joined with [`Self::join_multicast`] (same
    /// arguments).
    pub fn leave_multicast(
        &self,
        group: IpAddr,
        interface: Option<MulticastInterface>,
    ) -> io::Result<()> {
        match group {
            IpAddr::V4(g) => self
                .socket
                .leave_multicast_v4_n(&g, &v4_interface(interface)),
            IpAddr::V6(g) => self.socket.leave_multicast_v6(&g, v6_interface(interface)?),
        }
    }

    /// Sends this socket's multicast datagrams out of `interface` rather than
    /// the one the routing table picks (e.g. `127.0.0.1` for loopback).
    /// An address sets it for IPv4 groups; an index sets it for the socket's
    /// own family.
    pub fn set_multicast_interface(&self, interface: MulticastInterface) -> io::Result<()> {
        match (interface, self.v6) {
            (MulticastInterface::Addr(a), _) => self.socket.set_multicast_if_v4(&a),
            (MulticastInterface::Index(i), true) => self.socket.set_multicast_if_v6(i),
            (MulticastInterface::Index(i), false) => {
                sys::set_multicast_if_v4_index(self.socket.as_fd(), i)
            }
        }
    }
}

fn v4_interface(interface: Option<MulticastInterface>) -> InterfaceIndexOrAddress {
    match interface {
        None => InterfaceIndexOrAddress::Address(Ipv4Addr::UNSPECIFIED),
        Some(MulticastInterface::Addr(a)) => InterfaceIndexOrAddress::Address(a),
        Some(MulticastInterface::Index(i)) => InterfaceIndexOrAddress::Index(i),
    }
}

fn v6_interface(interface: Option<MulticastInterface>) -> io::Result<u32> {
    match interface {
        None => Ok(0),
        Some(MulticastInterface::Index(i)) => Ok(i),
        Some(MulticastInterface::Addr(_)) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "an IPv6 multicast group needs an interface index, not an IPv4 address",
        )),
    }
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

impl AsFd for UdpSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

/// Reusable receive buffers for [`UdpSocket::recv`]; received datagrams
/// come out as zero-copy [`Bytes`] slices of one arena.
///
/// Each `recv` fills one arena of `slots × slot_size` bytes, a slot per
/// datagram. The arena is reused once every slice handed out from it is
/// dropped (a few earlier arenas wait for that); otherwise a new one is
/// allocated, so holding on to a payload is safe, only costlier: a slice
/// keeps its whole arena alive, so copy what must live long
/// (`Bytes::copy_from_slice`). New arenas are zeroed (`calloc`), the only
/// per-`recv` cost besides one small reference-count block. Use one batch
/// per socket: the drop counter follows one socket's count.
#[derive(Debug)]
pub struct RecvBatch {
    slot_size: usize,
    bufs: sys::RecvBufs,
    meta: Vec<sys::RecvMeta>,
    /// An arena ready for the next `recv`.
    arena: Option<BytesMut>,
    /// The arena the last `recv` filled.
    filled: Bytes,
    /// Datagrams in `filled` not yet drained.
    count: usize,
    /// Earlier arenas, reused once the application drops their slices.
    kept: Vec<Bytes>,
    drops: u64,
    last_ovfl: u32,
}

impl RecvBatch {
    /// Buffers for up to `slots` datagrams per `recv` (1 to 1024; 32 is a
    /// good start) of up to `slot_size` bytes each (1 to 65,536). Use 65,536
    /// so nothing is ever truncated, and with GRO, whose runs are up to
    /// 64 KiB.
    pub fn new(slots: usize, slot_size: usize) -> Self {
        let slots = slots.clamp(1, MAX_SLOTS);
        RecvBatch {
            slot_size: slot_size.clamp(1, MAX_SLOT),
            bufs: sys::RecvBufs::new(slots),
            meta: vec![sys::RecvMeta::default(); slots],
            arena: None,
            filled: Bytes::new(),
            count: 0,
            kept: Vec::new(),
            drops: 0,
            last_ovfl: 0,
        }
    }

    /// Takes out what the last `recv` filled, in arrival order. Items not
    /// taken when the iterator is dropped are discarded.
    pub fn drain(&mut self) -> impl Iterator<Item = Received> + '_ {
        let n = mem::take(&mut self.count);
        let (filled, slot) = (&self.filled, self.slot_size);
        self.meta[..n].iter().enumerate().map(move |(i, m)| {
            let at = i * slot;
            Received {
                from: m.from,
                data: filled.slice(at..at + m.len),
                segment_size: m.gro_segment,
                maybe_run: m.maybe_run,
                truncated: m.truncated,
            }
        })
    }

    /// Cumulative kernel drops on the socket, as reported by `SO_RXQ_OVFL`
    /// (0 where unsupported). The kernel reports them on the next datagram
    /// it queues, and only to [`UdpSocket::recv`] (a waiting receive reads
    /// no control messages), so drops show up late here; they show up at
    /// once through [`UdpSocket::kernel_drops`].
    ///
    /// The kernel counts dropped *buffers*: with GRO on, one dropped buffer
    /// may have held a run of up to 64 datagrams (measured here: a GSO+GRO
    /// flood lost ~54 datagrams per counted drop). So this is exact without
    /// GRO and a lower bound with it; it says that loss happened, and a
    /// sequence-number loss count says how much.
    pub fn kernel_drops(&self) -> u64 {
        self.drops
    }

    /// An initialized arena of `slots × slot_size` bytes: the spare one, an
    /// earlier one nobody holds any more, or a new zeroed one. (Zeroed, not
    /// just reserved: the slots the kernel does not fill would otherwise be
    /// uninitialized bytes between the slices we hand out.)
    fn take_arena(&mut self) -> BytesMut {
        if let Some(a) = self.arena.take() {
            return a;
        }
        let total = self.meta.len() * self.slot_size;
        let last = mem::take(&mut self.filled);
        if !last.is_empty() {
            // The common case first: the application holds nothing of the
            // last arena any more.
            match last.try_into_mut() {
                Ok(m) if m.len() == total => return m,
                Ok(_) => {}
                Err(b) => self.kept.push(b),
            }
        }
        while let Some(p) = self.kept.iter().position(Bytes::is_unique) {
            match self.kept.swap_remove(p).try_into_mut() {
                Ok(m) if m.len() == total => return m,
                Ok(_) => {}
                Err(b) => drop(b),
            }
        }
        if self.kept.len() > KEPT_ARENAS {
            // Forget the oldest: its memory goes when its last slice does.
            self.kept.remove(0);
        }
        let mut arena = BytesMut::zeroed(total);
        // Make the arena reference-counted now (splitting off an empty
        // handle does that), so that it keeps one count block for life:
        // `freeze` and `try_into_mut` then just hand that block over,
        // where a plain vector would allocate one at the first slice of
        // every receive and free it at every reuse.
        drop(arena.split_to(0));
        arena
    }
}

/// Folds a reading `v` of the kernel's 32-bit drop counter into the 64-bit
/// total `drops`, whose last reading was `last`.
fn fold_drops(drops: &mut u64, last: &mut u32, v: u32) {
    let d = v.wrapping_sub(*last);
    // Readings only grow; a "decrease" is an older reading, not a wrap.
    if d < 1 << 31 {
        *drops += u64::from(d);
        *last = v;
    }
}

/// One received buffer: a datagram, or with `segment_size` a run of
/// datagrams the kernel coalesced (GRO).
#[derive(Debug, Clone)]
pub struct Received {
    /// The sender.
    pub from: SocketAddr,
    /// The bytes, a slice of the batch's arena (no copy).
    pub data: Bytes,
    /// GRO: `data` holds datagrams of this many bytes each, the last
    /// possibly shorter; see [`Received::datagrams`].
    pub segment_size: Option<usize>,
    /// Received by [`UdpSocket::recv_wait`] on a socket with GRO on, which
    /// reports no segment size: `data` may be a run of datagrams all of one
    /// length but the last, which [`Received::datagrams`] yields as one.
    /// A caller whose datagrams say where they end finds the length and
    /// sets `segment_size`.
    pub maybe_run: bool,
    /// The datagram was longer than the slot and was cut (`MSG_TRUNC`):
    /// `data` is only its beginning.
    pub truncated: bool,
}

impl Received {
    /// The datagrams in `data`: one, or each of a GRO run (zero-copy).
    pub fn datagrams(&self) -> Datagrams {
        self.clone().into_datagrams()
    }

    /// As [`Received::datagrams`], consuming the buffer (one reference
    /// count change fewer per datagram).
    pub fn into_datagrams(self) -> Datagrams {
        Datagrams {
            rest: self.data,
            stride: self.segment_size.unwrap_or(0),
            done: false,
        }
    }
}

/// Iterator over the datagrams of a [`Received`]; see
/// [`Received::datagrams`].
#[derive(Debug, Clone)]
pub struct Datagrams {
    rest: Bytes,
    /// 0: `rest` is one datagram.
    stride: usize,
    done: bool,
}

impl Iterator for Datagrams {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        if self.stride == 0 || self.rest.len() <= self.stride {
            self.done = true;
            return Some(mem::take(&mut self.rest));
        }
        Some(self.rest.split_to(self.stride))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match (self.done, self.stride) {
            (true, _) => 0,
            (false, 0) => 1,
            (false, s) => self.rest.len().div_ceil(s).max(1),
        };
        (n, Some(n))
    }
}

impl ExactSizeIterator for Datagrams {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;
    use std::time::Instant;

    const WAIT: Option<Duration> = Some(Duration::from_secs(2));

    fn bind(addr: SocketAddr, cfg: &UdpConfig) -> UdpSocket {
        UdpSocket::bind(addr, cfg).expect("bind")
    }

    fn v4() -> SocketAddr {
        (Ipv4Addr::LOCALHOST, 0).into()
    }

    /// A socket on [::1], or `None` (with a message) where IPv6 is missing.
    fn v6(cfg: &UdpConfig) -> Option<UdpSocket> {
        match UdpSocket::bind((Ipv6Addr::LOCALHOST, 0).into(), cfg) {
            Ok(s) => Some(s),
            Err(e) => {
                println!("SKIPPED: cannot bind [::1] ({e}); IPv6 part not run");
                None
            }
        }
    }

    /// Receives until `want` datagrams (after GRO splitting) arrived or two
    /// seconds of silence; returns them with their senders.
    fn recv_n(s: &UdpSocket, batch: &mut RecvBatch, want: usize) -> Vec<(SocketAddr, Bytes)> {
        let mut got = Vec::new();
        while got.len() < want {
            match s.recv(batch) {
                Ok(_) => {
                    for r in batch.drain() {
                        assert!(!r.truncated, "truncated datagram");
                        got.extend(r.datagrams().map(|d| (r.from, d)));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !s.wait_readable(WAIT).unwrap() {
                        break;
                    }
                }
                Err(e) => panic!("recv: {e}"),
            }
        }
        got
    }

    fn no_gro() -> UdpConfig {
        UdpConfig {
            gro: false,
            ..UdpConfig::default()
        }
    }

    /// A payload whose bytes say which datagram and which byte they are.
    fn pattern(tag: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| tag.wrapping_add(i as u8)).collect()
    }

    fn batch_to_three(make: impl Fn() -> UdpSocket) {
        let tx = make();
        let rx: Vec<UdpSocket> = (0..3).map(|_| make()).collect();
        let dests: Vec<SocketAddr> = rx.iter().map(|s| s.local_addr().unwrap()).collect();
        let payloads: Vec<Vec<u8>> = (0..64).map(|i| pattern(i as u8, 100 + i)).collect();
        let out: Vec<Outgoing<'_>> = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| Outgoing {
                dest: dests[i % 3],
                data: p,
                segment_size: None,
            })
            .collect();
        assert_eq!(tx.send(&out).unwrap(), 64);
        let from = tx.local_addr().unwrap();
        for (r, s) in rx.iter().enumerate() {
            let mut batch = RecvBatch::new(32, 65_536);
            let want: Vec<&Vec<u8>> = payloads.iter().skip(r).step_by(3).collect();
            let got = recv_n(s, &mut batch, want.len());
            assert_eq!(got.len(), want.len(), "receiver {r}");
            for ((f, d), w) in got.iter().zip(want) {
                assert_eq!(*f, from);
                assert_eq!(&d[..], &w[..]);
            }
        }
    }

    #[test]
    fn batch_of_64_reaches_three_destinations_v4() {
        batch_to_three(|| bind(v4(), &no_gro()));
    }

    #[test]
    fn batch_of_64_reaches_three_destinations_v6() {
        if v6(&no_gro()).is_none() {
            return;
        }
        batch_to_three(|| v6(&no_gro()).unwrap());
    }

    #[test]
    fn v4_destination_from_dual_stack_socket() {
        let tx = match UdpSocket::bind((Ipv6Addr::UNSPECIFIED, 0).into(), &no_gro()) {
            Ok(s) => s,
            Err(e) => return println!("SKIPPED: cannot bind [::] ({e})"),
        };
        let rx = bind(v4(), &no_gro());
        let n = tx.send(&[Outgoing {
            dest: rx.local_addr().unwrap(),
            data: b"mapped",
            segment_size: None,
        }]);
        if let Err(e) = n {
            return println!("SKIPPED: [::] socket is IPv6-only here ({e})");
        }
        let got = recv_n(&rx, &mut RecvBatch::new(4, 2048), 1);
        assert_eq!(&got[0].1[..], b"mapped");
    }

    /// 9,500 bytes as ten 1,000-byte segments, the last 500.
    fn segmented() -> Vec<u8> {
        (0..10u8)
            .flat_map(|i| pattern(i * 16, if i == 9 { 500 } else { 1000 }))
            .collect()
    }

    fn check_segments(got: &[(SocketAddr, Bytes)], data: &[u8], seg: usize) {
        let want: Vec<&[u8]> = data.chunks(seg).collect();
        assert_eq!(got.len(), want.len());
        for ((_, g), w) in got.iter().zip(want) {
            assert_eq!(&g[..], w);
        }
    }

    #[test]
    fn gso_send_arrives_as_separate_datagrams_without_gro() {
        let tx = bind(v4(), &UdpConfig::default());
        let rx = bind(v4(), &no_gro());
        if tx.max_segments() == 1 {
            println!("NOTE: no UDP_SEGMENT here; checking the split fallback instead");
        }
        let data = segmented();
        let out = [Outgoing {
            dest: rx.local_addr().unwrap(),
            data: &data,
            segment_size: Some(1000),
        }];
        assert_eq!(tx.send(&out).unwrap(), 1);
        let mut batch = RecvBatch::new(32, 65_536);
        let got = recv_n(&rx, &mut batch, 10);
        check_segments(&got, &data, 1000);
    }

    #[test]
    fn gso_send_arrives_as_one_gro_run() {
        let tx = bind(v4(), &UdpConfig::default());
        let rx = bind(v4(), &UdpConfig::default());
        if tx.max_segments() == 1 {
            return println!("SKIPPED: no UDP_SEGMENT (GSO) on this kernel");
        }
        let data = segmented();
        let out = [Outgoing {
            dest: rx.local_addr().unwrap(),
            data: &data,
            segment_size: Some(1000),
        }];
        assert_eq!(tx.send(&out).unwrap(), 1);
        assert!(rx.wait_readable(WAIT).unwrap());
        let mut batch = RecvBatch::new(32, 65_536);
        assert_eq!(rx.recv(&mut batch).unwrap(), 1, "one coalesced buffer");
        let r: Vec<Received> = batch.drain().collect();
        assert_eq!(r[0].segment_size, Some(1000), "GRO segment size");
        assert_eq!(r[0].data.len(), 9500);
        let parts: Vec<(SocketAddr, Bytes)> = r[0].datagrams().map(|d| (r[0].from, d)).collect();
        assert_eq!(r[0].datagrams().len(), 10);
        check_segments(&parts, &data, 1000);
    }

    #[test]
    fn segmented_send_without_gso_is_split_by_send() {
        let tx = bind(
            v4(),
            &UdpConfig {
                gso: false,
                ..UdpConfig::default()
            },
        );
        assert_eq!(tx.max_segments(), 1);
        let rx = bind(v4(), &no_gro());
        let data = segmented();
        let plain = pattern(7, 300);
        let dest = rx.local_addr().unwrap();
        let out = [
            Outgoing {
                dest,
                data: &data,
                segment_size: Some(1000),
            },
            Outgoing {
                dest,
                data: &plain,
                segment_size: None,
            },
        ];
        assert_eq!(tx.send(&out).unwrap(), 2);
        let got = recv_n(&rx, &mut RecvBatch::new(32, 65_536), 11);
        check_segments(&got[..10], &data, 1000);
        assert_eq!(&got[10].1[..], &plain[..]);
    }

    #[test]
    fn refused_gso_falls_back_to_single_sends_and_stays_off() {
        let tx = bind(v4(), &UdpConfig::default());
        if tx.max_segments() == 1 {
            return println!(
                "SKIPPED: no UDP_SEGMENT (GSO) on this kernel, nothing to fall back from"
            );
        }
        sys::disable_tx_checksum(tx.as_fd()).unwrap();
        let rx = bind(v4(), &no_gro());
        let data = segmented();
        let dest = rx.local_addr().unwrap();
        let out = [
            Outgoing {
                dest,
                data: &data,
                segment_size: Some(1000),
            },
            Outgoing {
                dest,
                data: &data,
                segment_size: Some(1000),
            },
        ];
        assert_eq!(tx.send(&out).unwrap(), 2);
        assert_eq!(
            tx.max_segments(),
            1,
            "GSO turned off after the kernel refused it"
        );
        let got = recv_n(&rx, &mut RecvBatch::new(32, 65_536), 20);
        check_segments(&got[..10], &data, 1000);
        check_segments(&got[10..], &data, 1000);
    }

    #[test]
    fn error_of_a_plain_datagram_leaves_gso_on() {
        let tx = bind(v4(), &UdpConfig::default());
        let gso = tx.max_segments();
        let rx = bind(v4(), &no_gro());
        let data = segmented();
        // Port 0 is not a destination: EINVAL, with or without GSO.
        let bad = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let out = [Outgoing {
            dest: bad,
            data: &data,
            segment_size: Some(1000),
        }];
        assert!(tx.send(&out).is_err());
        assert_eq!(
            tx.max_segments(),
            gso,
            "a bad destination is not a GSO failure"
        );
        // The first datagram went; the error comes on the next call.
        let out = [
            Outgoing {
                dest: rx.local_addr().unwrap(),
                data: b"ok",
                segment_size: None,
            },
            Outgoing {
                dest: bad,
                data: b"no",
                segment_size: None,
            },
        ];
        assert_eq!(tx.send(&out).unwrap(), 1);
        assert!(tx.send(&out[1..]).is_err());
    }

    #[test]
    fn more_segments_than_one_gso_send_takes() {
        let tx = bind(v4(), &UdpConfig::default());
        let rx = bind(v4(), &no_gro());
        // 150 segments of 100 bytes: more than 64, so several GSO sends.
        let data: Vec<u8> = (0..150u8).flat_map(|i| pattern(i, 100)).collect();
        let out = [Outgoing {
            dest: rx.local_addr().unwrap(),
            data: &data,
            segment_size: Some(100),
        }];
        assert_eq!(tx.send(&out).unwrap(), 1);
        let got = recv_n(&rx, &mut RecvBatch::new(64, 65_536), 150);
        check_segments(&got, &data, 100);
    }

    #[test]
    fn sixty_thousand_bytes_arrive_whole() {
        let tx = bind(v4(), &UdpConfig::default());
        let rx = bind(v4(), &UdpConfig::default());
        let data = pattern(3, 60_000);
        let out = [Outgoing {
            dest: rx.local_addr().unwrap(),
            data: &data,
            segment_size: None,
        }];
        assert_eq!(tx.send(&out).unwrap(), 1);
        assert!(rx.wait_readable(WAIT).unwrap());
        let mut batch = RecvBatch::new(8, 65_536);
        assert_eq!(rx.recv(&mut batch).unwrap(), 1);
        let r: Vec<Received> = batch.drain().collect();
        assert!(!r[0].truncated);
        assert_eq!(r[0].segment_size, None);
        assert_eq!(&r[0].data[..], &data[..]);
    }

    #[test]
    fn oversized_datagram_is_flagged_truncated() {
        let tx = bind(v4(), &UdpConfig::default());
        let rx = bind(v4(), &no_gro());
        let data = pattern(5, 1000);
        let out = [Outgoing {
            dest: rx.local_addr().unwrap(),
            data: &data,
            segment_size: None,
        }];
        assert_eq!(tx.send(&out).unwrap(), 1);
        assert!(rx.wait_readable(WAIT).unwrap());
        let mut batch = RecvBatch::new(4, 512);
        assert_eq!(rx.recv(&mut batch).unwrap(), 1);
        let r: Vec<Received> = batch.drain().collect();
        assert!(r[0].truncated);
        assert_eq!(&r[0].data[..], &data[..512]);
    }

    #[test]
    fn kernel_drops_are_counted() {
        let rx = bind(
            v4(),
            &UdpConfig {
                recv_buffer: Some(1),
                gro: false,
                ..UdpConfig::default()
            },
        );
        let tx = bind(v4(), &UdpConfig::default());
        let dest = rx.local_addr().unwrap();
        let data = pattern(1, 1000);
        let out = vec![
            Outgoing {
                dest,
                data: &data,
                segment_size: None
            };
            64
        ];
        for _ in 0..16 {
            let _ = tx.send(&out);
        }
        let mut batch = RecvBatch::new(64, 65_536);
        let mut received = 0;
        while rx.wait_readable(Some(Duration::from_millis(100))).unwrap() {
            received += rx.recv(&mut batch).unwrap();
            assert!(batch.drain().all(|r| r.data.len() == 1000));
        }
        // The count rides on the next datagram queued after the drops.
        tx.send(&out[..1]).unwrap();
        received += recv_n(&rx, &mut batch, 1).len();
        let now = rx.kernel_drops().unwrap();
        println!(
            "received {received} of 1025, kernel_drops {} (SO_MEMINFO: {now})",
            batch.kernel_drops()
        );
        assert!(batch.kernel_drops() > 0);
        assert_eq!(batch.kernel_drops(), now);
        assert_eq!(received as u64 + now, 1025);
    }

    #[test]
    fn drop_counter_readings_fold_without_wrapping_back() {
        let (mut drops, mut last) = (0, 0);
        fold_drops(&mut drops, &mut last, 5);
        fold_drops(&mut drops, &mut last, 3); // an older reading
        for v in [0x7000_0000, 0xe000_0000, u32::MAX] {
            fold_drops(&mut drops, &mut last, v);
        }
        assert_eq!(drops, u64::from(u32::MAX));
        fold_drops(&mut drops, &mut last, 2); // wrapped: 3 more
        assert_eq!(drops, u64::from(u32::MAX) + 3);
    }

    #[test]
    fn would_block_when_nothing_to_receive() {
        let rx = bind(v4(), &UdpConfig::default());
        let mut batch = RecvBatch::new(4, 2048);
        let e = rx.recv(&mut batch).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(batch.drain().count(), 0);
        assert!(!rx.wait_readable(Some(Duration::from_millis(10))).unwrap());
    }

    #[test]
    fn tokio_wakes_a_task_when_a_datagram_arrives() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let rx = bind(v4(), &UdpConfig::default());
        let tx = bind(v4(), &UdpConfig::default());
        let dest = rx.local_addr().unwrap();
        rt.block_on(async {
            let fd = rx.register_async(tokio::io::Interest::READABLE).unwrap();
            let mut batch = RecvBatch::new(4, 2048);
            for round in 0..3u8 {
                let data = [round; 8];
                tx.send(&[Outgoing {
                    dest,
                    data: &data,
                    segment_size: None,
                }])
                .unwrap();
                let got = loop {
                    let mut guard = tokio::time::timeout(Duration::from_secs(2), fd.readable())
                        .await
                        .expect("woken")
                        .unwrap();
                    match rx.recv(&mut batch) {
                        Ok(_) => break batch.drain().next().unwrap(),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                        Err(e) => panic!("recv: {e}"),
                    }
                };
                assert_eq!(&got.data[..], &data);
                // Readiness stays set until cleared: recv says WouldBlock, then clear.
                let mut guard = fd.readable().await.unwrap();
                assert_eq!(
                    rx.recv(&mut batch).unwrap_err().kind(),
                    io::ErrorKind::WouldBlock
                );
                guard.clear_ready();
            }
        });
    }

    #[test]
    fn arena_is_reused_once_slices_are_dropped() {
        let tx = bind(v4(), &UdpConfig::default());
        let rx = bind(v4(), &no_gro());
        let dest = rx.local_addr().unwrap();
        let mut batch = RecvBatch::new(4, 2048);
        let mut one = |tag: u8| {
            let data = pattern(tag, 64);
            tx.send(&[Outgoing {
                dest,
                data: &data,
                segment_size: None,
            }])
            .unwrap();
            let got = recv_n(&rx, &mut batch, 1);
            assert_eq!(&got[0].1[..], &data[..]);
            got.into_iter().next().unwrap().1
        };
        let first = one(1);
        let p1 = first.as_ptr();
        drop(first);
        let second = one(2);
        assert_eq!(second.as_ptr(), p1, "arena reused");
        // Held: the next recv must not write over it.
        let third = one(3);
        assert_ne!(third.as_ptr(), second.as_ptr());
        assert_eq!(&second[..], &pattern(2, 64)[..]);
    }

    #[test]
    fn buffer_sizes_report_what_the_kernel_granted() {
        let max = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok());
        let s = bind(
            v4(),
            &UdpConfig {
                recv_buffer: Some(1 << 20),
                send_buffer: Some(1 << 20),
                ..UdpConfig::default()
            },
        );
        let (r, w) = (s.recv_buffer_size().unwrap(), s.send_buffer_size().unwrap());
        println!("asked 1 MiB each, granted recv {r} send {w} (rmem_max {max:?})");
        assert!(r >= (1 << 20).min(max.unwrap_or(0)));
        assert!(w > 0);
    }

    #[test]
    fn multicast_join_deliver_leave_over_loopback() {
        let group = IpAddr::V4(Ipv4Addr::new(239, 255, 77, 77));
        let cfg = UdpConfig {
            reuse_addr: true,
            gro: false,
            ..UdpConfig::default()
        };
        let rx = bind((Ipv4Addr::UNSPECIFIED, 0).into(), &cfg);
        let port = rx.local_addr().unwrap().port();
        let lo = MulticastInterface::Addr(Ipv4Addr::LOCALHOST);
        if let Err(e) = rx.join_multicast(group, Some(lo)) {
            return println!("SKIPPED: multicast join on 127.0.0.1 refused ({e})");
        }
        let tx = bind(v4(), &UdpConfig::default());
        tx.set_multicast_interface(lo).unwrap();
        let dest = SocketAddr::new(group, port);
        if let Err(e) = tx.send(&[Outgoing {
            dest,
            data: b"to the group",
            segment_size: None,
        }]) {
            return println!("SKIPPED: multicast send over loopback refused ({e})");
        }
        let mut batch = RecvBatch::new(4, 2048);
        let got = recv_n(&rx, &mut batch, 1);
        if got.is_empty() {
            return println!(
                "SKIPPED: joined and sent, but loopback did not deliver multicast here"
            );
        }
        assert_eq!(&got[0].1[..], b"to the group");
        rx.leave_multicast(group, Some(lo)).unwrap();
        tx.send(&[Outgoing {
            dest,
            data: b"after leave",
            segment_size: None,
        }])
        .unwrap();
        assert!(
            !rx.wait_readable(Some(Duration::from_millis(200))).unwrap(),
            "delivered after leave"
        );
    }

    #[test]
    fn ipv6_group_rejects_an_ipv4_interface() {
        let s = bind(v4(), &UdpConfig::default());
        let e = s
            .join_multicast(
                "ff02::1:77".parse().unwrap(),
                Some(Ipv4Addr::LOCALHOST.into()),
            )
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn datagrams_split_a_run_and_keep_a_single() {
        let from = v4();
        let run = Received {
            from,
            data: Bytes::from(pattern(0, 25)),
            segment_size: Some(10),
            maybe_run: false,
            truncated: false,
        };
        let lens: Vec<usize> = run.datagrams().map(|d| d.len()).collect();
        assert_eq!(lens, [10, 10, 5]);
        // A run whose stride the receive did not report is one buffer until
        // the caller names the stride.
        let unknown = Received {
            segment_size: None,
            maybe_run: true,
            ..run.clone()
        };
        assert_eq!(unknown.datagrams().count(), 1);
        let named = Received {
            segment_size: Some(10),
            ..unknown
        };
        assert_eq!(
            named.datagrams().collect::<Vec<_>>(),
            run.datagrams().collect::<Vec<_>>()
        );
        let owned: Vec<Bytes> = run.clone().into_datagrams().collect();
        assert_eq!(owned, run.datagrams().collect::<Vec<_>>());
        let one = Received {
            from,
            data: Bytes::new(),
            segment_size: None,
            maybe_run: false,
            truncated: false,
        };
        assert_eq!(
            one.datagrams().count(),
            1,
            "an empty datagram is still a datagram"
        );
    }

    /// Throughput over loopback, by hand:
    /// `cargo test -p skiff --release --lib udp::tests::throughput -- --ignored --nocapture`
    #[test]
    #[ignore = "measurement, run by hand"]
    fn throughput() {
        // (what, datagram size, Outgoings per send call, GSO, GRO)
        for (name, size, batch, gso, gro) in [
            ("64 B, 1 per call (baseline)", 64, 1, false, false),
            ("64 B, sendmmsg x64", 64, 64, false, false),
            ("1200 B, 1 per call (baseline)", 1200, 1, false, false),
            ("1200 B, sendmmsg x64", 1200, 64, false, false),
            ("1200 B, GSO 54 seg x8, no GRO", 1200, 8, true, false),
            ("1200 B, GSO 54 seg x8, GRO", 1200, 8, true, true),
        ] {
            let (sent, received, drops, secs) =
                run_throughput(size, batch, gso, gro, Duration::from_secs(2));
            println!(
                "{name:31} sent {:>9.0} dgram/s  received {:>9.0} dgram/s ({:.2} Gbit/s)  kernel drops {drops}",
                sent as f64 / secs,
                received as f64 / secs,
                (received * size as u64 * 8) as f64 / secs / 1e9
            );
        }
    }

    fn run_throughput(
        size: usize,
        batch: usize,
        gso: bool,
        gro: bool,
        time: Duration,
    ) -> (u64, u64, u64, f64) {
        use std::sync::atomic::AtomicU64;
        use std::sync::Arc;
        let rx = bind(
            v4(),
            &UdpConfig {
                gro,
                recv_buffer: Some(4 << 20),
                ..UdpConfig::default()
            },
        );
        let tx = bind(
            v4(),
            &UdpConfig {
                gso,
                send_buffer: Some(4 << 20),
                ..UdpConfig::default()
            },
        );
        let dest = rx.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let reader = {
            let (stop, count) = (stop.clone(), count.clone());
            std::thread::spawn(move || {
                let mut batch = RecvBatch::new(64, 65_536);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    match rx.recv(&mut batch) {
                        Ok(_) => {
                            n += batch
                                .drain()
                                .map(|r| r.datagrams().len() as u64)
                                .sum::<u64>()
                        }
                        Err(_) => {
                            let _ = rx.wait_readable(Some(Duration::from_millis(10)));
                        }
                    }
                }
                count.store(n, Ordering::Relaxed);
                batch.kernel_drops().max(rx.kernel_drops().unwrap_or(0))
            })
        };
        let segs = if gso {
            (MAX_UDP_PAYLOAD / size).min(GSO_MAX_SEGMENTS)
        } else {
            1
        };
        let buf = vec![0x5a; size * segs];
        let out: Vec<Outgoing<'_>> = (0..batch)
            .map(|_| Outgoing {
                dest,
                data: &buf,
                segment_size: gso.then_some(size),
            })
            .collect();
        let start = Instant::now();
        let mut sent = 0u64;
        while start.elapsed() < time {
            match tx.send(&out) {
                Ok(k) => sent += (k * segs) as u64,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let _ = sys::poll(tx.as_fd(), libc::POLLOUT, Some(Duration::from_millis(10)));
                }
                Err(e) => panic!("send: {e}"),
            }
        }
        let secs = start.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, Ordering::Relaxed);
        let drops = reader.join().unwrap();
        (sent, count.load(Ordering::Relaxed), drops, secs)
    }
}
