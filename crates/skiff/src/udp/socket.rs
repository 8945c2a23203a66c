//! The socket itself: binding with the options of a [`UdpConfig`], the
//! buffers the kernel granted, connecting to one peer, readiness (`poll`,
//! tokio) and multicast membership.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

use socket2::{Domain, InterfaceIndexOrAddress, Protocol, Socket, Type};

use super::UdpSocket;
use crate::sys;

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
    /// 32 bits, wrapping): unlike
    /// [`RecvBatch::kernel_drops`](super::RecvBatch::kernel_drops) it does
    /// not wait for a later datagram to bring the news. Same unit: buffers,
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
