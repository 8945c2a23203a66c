//! The system calls behind the UDP driver, and the only `unsafe` code of
//! the crate.
//!
//! Each function wraps one Linux system call (or a few socket options) and
//! returns [`io::Result`]; nothing here keeps state between calls or knows
//! about skiff's protocol. [`crate::udp`] builds the safe socket on top.
//!
//! - [`sendmmsg`]: up to [`MAX_BATCH`] datagrams in one call, each to its own
//!   destination and optionally with a `UDP_SEGMENT` (GSO) segment size.
//! - [`sendto`]: one datagram, for the lone reply that `sendmmsg` would
//!   only slow down.
//! - [`recvmmsg`]: many datagrams in one call into slots of a caller buffer,
//!   with the source, the `MSG_TRUNC` flag, the `UDP_GRO` segment size and
//!   the `SO_RXQ_OVFL` drop counter of each; a waiting receive of one
//!   datagram is a plain `recvfrom(2)` instead (see [`recvmmsg`]).
//!
//! The calls a request/reply exchange makes for every message (`sendto`,
//! `send`, `recvfrom`) enter the kernel through `syscall(2)` rather than
//! glibc's wrappers of the same name: those are thread-cancellation points
//! and bracket the call with two atomic updates of the thread's cancel
//! state, which skiff never uses. Measured with a C ping-pong on this
//! project's 2-core VM (both threads on one CPU): 3.31 → 3.24 µs connected
//! `send`/`recv`, 3.62 → 3.54 µs `sendto`/`recvfrom` per round trip.
//! - Socket options the standard library and `socket2` do not cover
//!   (`UDP_GRO`, `UDP_SEGMENT`, `SO_RXQ_OVFL`, `SO_MEMINFO`) and `poll(2)`.

#[cfg(not(target_os = "linux"))]
compile_error!("skiff's UDP driver needs Linux (sendmmsg, UDP_SEGMENT, UDP_GRO, SO_RXQ_OVFL)");

use std::io;
use std::mem::{self, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::ptr;
use std::time::{Duration, Instant};

use libc::{c_int, c_void, socklen_t};

/// `syscall(2)` for the socket calls below: the same kernel entry as glibc's
/// wrapper, without its cancellation bookkeeping (module documentation).
/// Returns the call's result or the error from `errno`.
///
/// # Safety
/// As for the system call `nr` with these arguments: every pointer among
/// them must be valid for what that call reads or writes.
unsafe fn syscall6(nr: libc::c_long, args: [usize; 6]) -> io::Result<usize> {
    // SAFETY: the caller vouches for the arguments (see above).
    let r = unsafe { libc::syscall(nr, args[0], args[1], args[2], args[3], args[4], args[5]) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Datagrams in one [`sendmmsg`] call at most.
pub(crate) const MAX_BATCH: usize = 64;

/// `UDP_SEGMENT` (linux/udp.h): GSO segment size, a socket option and a
/// cmsg of type `u16`.
const UDP_SEGMENT: c_int = 103;
/// `UDP_GRO` (linux/udp.h): socket option to accept coalesced datagrams; the
/// cmsg carries the segment size as an `int`.
const UDP_GRO: c_int = 104;
/// `SK_MEMINFO_DROPS`: index of the drop counter in the `SO_MEMINFO` array.
const SK_MEMINFO_DROPS: usize = 8;

/// Space for the control messages of one datagram. Every kernel-written
/// cmsg we ask for fits twice over; larger ones set `MSG_CTRUNC` and are
/// ignored.
const CTRL_LEN: usize = 128;

/// A cmsg buffer aligned for `cmsghdr`.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct CtrlBuf([u8; CTRL_LEN]);

/// Space for the one cmsg a send can carry (`UDP_SEGMENT`, a `u16`).
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct SendCtrl([u8; 32]);

/// A socket address in the C layout the kernel reads.
#[repr(C)]
#[derive(Clone, Copy)]
union RawAddr {
    v4: libc::sockaddr_in,
    v6: libc::sockaddr_in6,
}

impl RawAddr {
    /// Encodes `addr`; returns the address and its length.
    fn new(addr: &SocketAddr) -> (RawAddr, socklen_t) {
        match addr {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(a.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                (
                    RawAddr { v4: sin },
                    mem::size_of::<libc::sockaddr_in>() as socklen_t,
                )
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo().to_be(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: a.ip().octets(),
                    },
                    sin6_scope_id: a.scope_id(),
                };
                (
                    RawAddr { v6: sin6 },
                    mem::size_of::<libc::sockaddr_in6>() as socklen_t,
                )
            }
        }
    }
}

/// Decodes a socket address the kernel wrote; `None` for another family.
fn decode_addr(storage: &libc::sockaddr_storage, len: socklen_t) -> Option<SocketAddr> {
    match c_int::from(storage.ss_family) {
        libc::AF_INET if len as usize >= mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: `sockaddr_storage` is larger than and aligned for every
            // sockaddr type; the family says the kernel wrote a sockaddr_in.
            let sin = unsafe { ptr::read(storage as *const _ as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddrV4::new(ip, u16::from_be(sin.sin_port)).into())
        }
        libc::AF_INET6 if len as usize >= mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for a sockaddr_in6.
            let sin6 = unsafe { ptr::read(storage as *const _ as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            let port = u16::from_be(sin6.sin6_port);
            Some(
                SocketAddrV6::new(
                    ip,
                    port,
                    u32::from_be(sin6.sin6_flowinfo),
                    sin6.sin6_scope_id,
                )
                .into(),
            )
        }
        _ => None,
    }
}

/// One datagram for [`sendmmsg`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Transmit<'a> {
    /// Destination, in the socket's own address family.
    pub(crate) dest: SocketAddr,
    /// The bytes (all segments, when `segment_size` is set).
    pub(crate) data: &'a [u8],
    /// GSO segment size: the kernel cuts `data` into datagrams of this size
    /// (the last may be shorter). `None` sends `data` as one datagram.
    pub(crate) segment_size: Option<u16>,
}

/// Sends up to [`MAX_BATCH`] datagrams (more are ignored) in one
/// `sendmmsg(2)` without blocking; returns how many the kernel took.
///
/// Errors: `WouldBlock` when the send buffer is full, otherwise the error of
/// the first datagram (a later datagram's error shortens the count instead;
/// sending again from there reports it). See [`is_gso_error`].
pub(crate) fn sendmmsg(fd: BorrowedFd<'_>, msgs: &[Transmit<'_>]) -> io::Result<usize> {
    let n = msgs.len().min(MAX_BATCH);
    if n == 0 {
        return Ok(0);
    }
    let mut addrs = [MaybeUninit::<RawAddr>::uninit(); MAX_BATCH];
    let mut iovs = [MaybeUninit::<libc::iovec>::uninit(); MAX_BATCH];
    let mut ctrls = [MaybeUninit::<SendCtrl>::uninit(); MAX_BATCH];
    let mut hdrs = [MaybeUninit::<libc::mmsghdr>::uninit(); MAX_BATCH];
    for (i, m) in msgs[..n].iter().enumerate() {
        let (addr, addr_len) = RawAddr::new(&m.dest);
        let addr = addrs[i].write(addr);
        let iov = iovs[i].write(libc::iovec {
            iov_base: m.data.as_ptr() as *mut c_void,
            iov_len: m.data.len(),
        });
        // SAFETY: all-zero bytes are a valid `mmsghdr` (null pointers, zero
        // lengths); the fields that matter are set right below.
        let mut h: libc::mmsghdr = unsafe { mem::zeroed() };
        h.msg_hdr.msg_name = addr as *mut RawAddr as *mut c_void;
        h.msg_hdr.msg_namelen = addr_len;
        h.msg_hdr.msg_iov = iov;
        h.msg_hdr.msg_iovlen = 1;
        if let Some(seg) = m.segment_size {
            let ctrl = ctrls[i].write(SendCtrl([0; 32]));
            h.msg_hdr.msg_control = ctrl.0.as_mut_ptr() as *mut c_void;
            // SAFETY: CMSG_SPACE only computes a size.
            h.msg_hdr.msg_controllen =
                unsafe { libc::CMSG_SPACE(mem::size_of::<u16>() as u32) } as _;
            // SAFETY: msg_control points to `ctrl`, 8-aligned and 32 bytes,
            // which holds one cmsghdr (16 bytes) with 2 bytes of data, so
            // CMSG_FIRSTHDR is non-null and both writes stay inside `ctrl`.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                (*c).cmsg_level = libc::SOL_UDP;
                (*c).cmsg_type = UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(mem::size_of::<u16>() as u32) as _;
                ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, seg);
            }
        }
        hdrs[i].write(h);
    }
    // SAFETY: the first `n` headers are initialized and point to addresses,
    // iovecs and control buffers on this stack frame and to the caller's
    // `data` slices, all alive for the call; the kernel only reads them
    // (and writes each `msg_len`, inside `hdrs`).
    let r = unsafe {
        libc::sendmmsg(
            fd.as_raw_fd(),
            hdrs.as_mut_ptr() as *mut libc::mmsghdr,
            n as u32,
            libc::MSG_DONTWAIT,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as usize)
}

/// Sends one datagram (no GSO segment size) with `sendto(2)` without
/// blocking: the cheapest send the kernel has, for the lone datagram of a
/// request or a reply, where `sendmmsg` would add its per-call work (the
/// header array copied in, a reschedule check per message) for nothing.
///
/// Errors as [`sendmmsg`] for its first datagram: `WouldBlock` when the send
/// buffer is full, else the kernel's error.
pub(crate) fn sendto(fd: BorrowedFd<'_>, dest: &SocketAddr, data: &[u8]) -> io::Result<()> {
    let (addr, addr_len) = RawAddr::new(dest);
    send_raw(fd, data, Some((&addr, addr_len)))
}

/// Sends one datagram on a connected socket (`send(2)`): no address to
/// copy in and no route to look up, as the connection keeps both.
pub(crate) fn send(fd: BorrowedFd<'_>, data: &[u8]) -> io::Result<()> {
    send_raw(fd, data, None)
}

/// `sendto(2)` without blocking, to `to` or (`None`, as `send(2)` is) to
/// the connected peer.
fn send_raw(fd: BorrowedFd<'_>, data: &[u8], to: Option<(&RawAddr, socklen_t)>) -> io::Result<()> {
    let (addr, addr_len) = to.map_or((0, 0), |(a, l)| (a as *const RawAddr as usize, l as usize));
    // SAFETY: `data` is a live slice of `data.len()` bytes and `addr`, if
    // not null, a live socket address of `addr_len` bytes; the kernel only
    // reads both.
    unsafe {
        syscall6(
            libc::SYS_sendto,
            [
                fd.as_raw_fd() as usize,
                data.as_ptr() as usize,
                data.len(),
                libc::MSG_DONTWAIT as usize,
                addr,
                addr_len,
            ],
        )
    }
    .map(drop)
}

/// Whether a send error of a datagram with a GSO segment size may be the
/// kernel or the device refusing segmentation (`EIO`: no checksum offload;
/// `EINVAL`: segment size or count out of range; `EMSGSIZE`: the total is
/// larger than one send may be), so that sending the segments one by one
/// can succeed.
pub(crate) fn is_gso_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO) | Some(libc::EINVAL) | Some(libc::EMSGSIZE)
    )
}

/// Whether the error means GSO itself does not work here (as opposed to a
/// datagram the kernel finds too big), so the socket should stop using it.
pub(crate) fn disables_gso(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::EINVAL))
}

/// What [`recvmmsg`] learned about one datagram.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecvMeta {
    /// Source address (`0.0.0.0:0` if the kernel gave none we know).
    pub(crate) from: SocketAddr,
    /// Bytes written into the slot.
    pub(crate) len: usize,
    /// `MSG_TRUNC`: the datagram was larger than the slot.
    pub(crate) truncated: bool,
    /// `UDP_GRO` cmsg: the slot holds datagrams of this stride.
    pub(crate) gro_segment: Option<usize>,
    /// `SO_RXQ_OVFL` cmsg: the socket's cumulative drop count.
    pub(crate) rxq_ovfl: Option<u32>,
    /// Received by a plain `recvfrom(2)` (no control messages, so no GRO
    /// segment size) on a socket with GRO on: possibly a run. `recvmmsg`
    /// leaves it false; the caller, which knows the socket, sets it.
    pub(crate) maybe_run: bool,
}

impl Default for RecvMeta {
    fn default() -> Self {
        RecvMeta {
            from: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            len: 0,
            truncated: false,
            gro_segment: None,
            rxq_ovfl: None,
            maybe_run: false,
        }
    }
}

/// Per-slot storage for [`recvmmsg`]: headers, iovecs, source addresses and
/// control buffers, kept between calls so receiving allocates nothing.
pub(crate) struct RecvBufs {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_storage>,
    ctrls: Vec<CtrlBuf>,
}

// SAFETY: the raw pointers in `hdrs` and `iovs` are written by `recvmmsg`
// right before each system call and only used by it; no other code reads or
// dereferences them, so moving or sharing the struct between threads cannot
// reach the memory they point to.
unsafe impl Send for RecvBufs {}
// SAFETY: no `&self` method touches the pointers (see above).
unsafe impl Sync for RecvBufs {}

impl std::fmt::Debug for RecvBufs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBufs")
            .field("slots", &self.hdrs.len())
            .finish()
    }
}

impl RecvBufs {
    /// Storage for `slots` datagrams per call.
    pub(crate) fn new(slots: usize) -> RecvBufs {
        // SAFETY: all-zero bytes are valid for these plain C structs (null
        // pointers, zero lengths, family AF_UNSPEC).
        let (hdr, iov, name) = unsafe {
            (
                mem::zeroed::<libc::mmsghdr>(),
                mem::zeroed::<libc::iovec>(),
                mem::zeroed::<libc::sockaddr_storage>(),
            )
        };
        RecvBufs {
            hdrs: vec![hdr; slots],
            iovs: vec![iov; slots],
            names: vec![name; slots],
            ctrls: vec![CtrlBuf([0; CTRL_LEN]); slots],
        }
    }

    /// Slots per call.
    pub(crate) fn slots(&self) -> usize {
        self.hdrs.len()
    }
}

/// Receives up to `bufs.slots()` datagrams in one `recvmmsg(2)` (one
/// `recvmsg(2)` when a single slot is used) without blocking: datagram `i`
/// goes to `arena[i * slot_size..][..slot_size]` and its description to
/// `out[i]` (slots beyond `arena` or `out` are not used). Returns how many
/// arrived; `WouldBlock` if none was waiting.
///
/// With `wait` it instead blocks for one datagram (until the socket's
/// `SO_RCVTIMEO` passes: `WouldBlock`) with a plain `recvfrom(2)`: a
/// request/reply exchange pays this call for every message, and it skips
/// `recvmsg`'s header copy-in and control messages (measured in C on this
/// project's VM: 0.15 µs less per round trip of two receives). What else
/// arrived is read by the next, non-blocking call. What it cannot report:
/// the `SO_RXQ_OVFL` counter (read it with [`meminfo_drops`]) and the
/// `UDP_GRO` segment size, so on a socket with GRO on such a buffer may be
/// a coalesced run whose stride the caller must find (`RecvMeta::maybe_run`).
pub(crate) fn recvmmsg(
    fd: BorrowedFd<'_>,
    bufs: &mut RecvBufs,
    arena: &mut [u8],
    slot_size: usize,
    out: &mut [RecvMeta],
    wait: bool,
) -> io::Result<usize> {
    let slot_size = slot_size.max(1);
    // A waiting receive takes one datagram: a request/reply exchange has
    // only one, and asking the kernel for more costs a second, failing
    // attempt inside the call.
    let slots = if wait { 1 } else { bufs.slots() };
    let n = slots.min(out.len()).min(arena.len() / slot_size);
    if n == 0 {
        return Ok(0);
    }
    if wait {
        out[0] = recvfrom(fd, &mut arena[..slot_size], &mut bufs.names[0])?;
        return Ok(1);
    }
    let RecvBufs {
        hdrs,
        iovs,
        names,
        ctrls,
    } = bufs;
    for (i, slot) in arena.chunks_exact_mut(slot_size).take(n).enumerate() {
        iovs[i] = libc::iovec {
            iov_base: slot.as_mut_ptr() as *mut c_void,
            iov_len: slot.len(),
        };
        let h = &mut hdrs[i];
        h.msg_len = 0;
        h.msg_hdr.msg_name = &mut names[i] as *mut libc::sockaddr_storage as *mut c_void;
        h.msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as socklen_t;
        h.msg_hdr.msg_iov = &mut iovs[i];
        h.msg_hdr.msg_iovlen = 1;
        h.msg_hdr.msg_control = ctrls[i].0.as_mut_ptr() as *mut c_void;
        h.msg_hdr.msg_controllen = CTRL_LEN as _;
        h.msg_hdr.msg_flags = 0;
    }
    let got = if n == 1 {
        // One slot: plain `recvmsg(2)`, which skips recvmmsg's per-call
        // work (its loop, timeout and error bookkeeping).
        // SAFETY: `hdrs[0]` points to the first slot of `arena`, to
        // `names[0]` and `ctrls[0]`, all borrowed mutably for the call and
        // sized as the header says; the kernel writes only inside them.
        let r = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut hdrs[0].msg_hdr, libc::MSG_DONTWAIT) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        hdrs[0].msg_len = r as u32;
        1
    } else {
        // SAFETY: the first `n` headers point to `n` distinct slots of
        // `arena`, to `names[i]` and `ctrls[i]`, all borrowed mutably for
        // the call and sized as the headers say; the kernel writes only
        // inside them.
        let r = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                hdrs.as_mut_ptr(),
                n as u32,
                libc::MSG_DONTWAIT,
                ptr::null_mut(),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        r as usize
    };
    for i in 0..got {
        let h = &hdrs[i];
        let mut m = RecvMeta {
            from: decode_addr(&names[i], h.msg_hdr.msg_namelen)
                .unwrap_or_else(|| RecvMeta::default().from),
            len: (h.msg_len as usize).min(slot_size),
            truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            gro_segment: None,
            rxq_ovfl: None,
            maybe_run: false,
        };
        // SAFETY: the kernel set msg_control/msg_controllen to the cmsgs it
        // wrote inside `ctrls[i]`; the CMSG_* macros walk only that range,
        // and each payload is read unaligned after checking its length.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
            while !c.is_null() {
                let data = libc::CMSG_DATA(c);
                let data_len = ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                match ((*c).cmsg_level, (*c).cmsg_type) {
                    (libc::SOL_UDP, UDP_GRO) if data_len >= mem::size_of::<c_int>() => {
                        let seg = ptr::read_unaligned(data as *const c_int);
                        m.gro_segment = usize::try_from(seg).ok().filter(|&s| s > 0);
                    }
                    (libc::SOL_SOCKET, libc::SO_RXQ_OVFL) if data_len >= mem::size_of::<u32>() => {
                        m.rxq_ovfl = Some(ptr::read_unaligned(data as *const u32));
                    }
                    _ => {}
                }
                c = libc::CMSG_NXTHDR(&h.msg_hdr, c);
            }
        }
        out[i] = m;
    }
    Ok(got)
}

/// Waits for one datagram (up to the socket's `SO_RCVTIMEO`: `WouldBlock`)
/// with `recvfrom(2)` into `slot`, its source into `name`.
fn recvfrom(
    fd: BorrowedFd<'_>,
    slot: &mut [u8],
    name: &mut libc::sockaddr_storage,
) -> io::Result<RecvMeta> {
    let mut name_len = mem::size_of::<libc::sockaddr_storage>() as socklen_t;
    // SAFETY: `slot` is a live, mutably borrowed buffer of `slot.len()`
    // bytes, `name` a live `sockaddr_storage` whose size `name_len` holds;
    // the kernel writes only inside them. With MSG_TRUNC the call returns
    // the datagram's real length, even if longer than `slot`.
    let len = unsafe {
        syscall6(
            libc::SYS_recvfrom,
            [
                fd.as_raw_fd() as usize,
                slot.as_mut_ptr() as usize,
                slot.len(),
                libc::MSG_TRUNC as usize,
                name as *mut libc::sockaddr_storage as usize,
                &mut name_len as *mut socklen_t as usize,
            ],
        )
    }?;
    Ok(RecvMeta {
        from: decode_addr(name, name_len).unwrap_or_else(|| RecvMeta::default().from),
        len: len.min(slot.len()),
        truncated: len > slot.len(),
        gro_segment: None,
        rxq_ovfl: None,
        maybe_run: false,
    })
}

/// Sets an `int` socket option.
fn setsockopt_int(fd: BorrowedFd<'_>, level: c_int, name: c_int, value: c_int) -> io::Result<()> {
    // SAFETY: `value` is a live c_int and the length passed is its size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            &value as *const c_int as *const c_void,
            mem::size_of::<c_int>() as socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Turns `UDP_GRO` on: the kernel may hand several datagrams of one flow
/// over as one buffer with a segment-size cmsg.
pub(crate) fn enable_gro(fd: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_UDP, UDP_GRO, 1)
}

/// Turns `SO_RXQ_OVFL` on: received datagrams carry the socket's cumulative
/// drop counter.
pub(crate) fn enable_rxq_ovfl(fd: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1)
}

/// Sends IPv4 datagrams without a UDP checksum (`SO_NO_CHECK`). The kernel
/// then refuses GSO sends with `EINVAL`, which tests use to reach the
/// fallback without a device lacking checksum offload.
#[cfg(test)]
pub(crate) fn disable_tx_checksum(fd: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_NO_CHECK, 1)
}

/// Whether the kernel knows `UDP_SEGMENT` (GSO): sets the socket's default
/// segment size to 0, which is "off" and changes nothing. The device may
/// still refuse a segmented send later (see [`is_gso_error`]).
pub(crate) fn probe_gso(fd: BorrowedFd<'_>) -> bool {
    setsockopt_int(fd, libc::SOL_UDP, UDP_SEGMENT, 0).is_ok()
}

/// The socket's drop counter now (`SO_MEMINFO`, `SK_MEMINFO_DROPS`): what
/// `SO_RXQ_OVFL` reports, without waiting for a datagram to carry it.
pub(crate) fn meminfo_drops(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut info = [0u32; 16];
    let mut len = mem::size_of_val(&info) as socklen_t;
    // SAFETY: `info` is writable for `len` bytes and `len` is a live
    // socklen_t the kernel updates.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MEMINFO,
            info.as_mut_ptr() as *mut c_void,
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if (len as usize) < (SK_MEMINFO_DROPS + 1) * mem::size_of::<u32>() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "SO_MEMINFO has no drop counter",
        ));
    }
    Ok(info[SK_MEMINFO_DROPS])
}

/// Sets the outgoing interface of IPv4 multicast by interface index
/// (`IP_MULTICAST_IF` with an `ip_mreqn`).
pub(crate) fn set_multicast_if_v4_index(fd: BorrowedFd<'_>, index: u32) -> io::Result<()> {
    let index = c_int::try_from(index)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface index out of range"))?;
    let mreqn = libc::ip_mreqn {
        imr_multiaddr: libc::in_addr { s_addr: 0 },
        imr_address: libc::in_addr { s_addr: 0 },
        imr_ifindex: index,
    };
    // SAFETY: `mreqn` is a live ip_mreqn and the length passed is its size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MULTICAST_IF,
            &mreqn as *const libc::ip_mreqn as *const c_void,
            mem::size_of::<libc::ip_mreqn>() as socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Registers a duplicate of `fd` (the same socket) with the current tokio
/// reactor for `interest`. Panics outside a tokio runtime with I/O enabled,
/// as tokio does.
pub(crate) fn register_async(
    fd: BorrowedFd<'_>,
    interest: tokio::io::Interest,
) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    let owned = fd.try_clone_to_owned()?;
    // SAFETY: the AsyncFd owns `owned`, an open descriptor: it stays open,
    // and `as_raw_fd` returns the same number, until the AsyncFd is dropped
    // or gives it back.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(owned, interest) }
        .map_err(|e| e.into_parts().1)
}

/// Waits until `fd` has one of `events` (`libc::POLLIN`, `libc::POLLOUT`) or
/// `timeout` passes (`None`: forever); returns whether it has. Retries on
/// `EINTR` with the time left. An error condition on the socket counts as
/// ready, so the following call reports it.
pub(crate) fn poll(
    fd: BorrowedFd<'_>,
    events: libc::c_short,
    timeout: Option<Duration>,
) -> io::Result<bool> {
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    loop {
        let ms: c_int = match (timeout, deadline) {
            (None, _) | (Some(_), None) => -1,
            (Some(_), Some(d)) => {
                let left = d.saturating_duration_since(Instant::now());
                // Round up so a short wait does not become a busy loop.
                left.as_nanos().div_ceil(1_000_000).min(c_int::MAX as u128) as c_int
            }
        };
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: `p` is one live pollfd and we pass a count of 1.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(r > 0 && p.revents != 0);
    }
}

/// Sets `SO_RCVTIMEO`: how long a blocking receive waits (`None`: forever).
pub(crate) fn set_recv_timeout(
    fd: BorrowedFd<'_>,
    timeout: Option<std::time::Duration>,
) -> io::Result<()> {
    let tv = match timeout {
        // A zero timeval means "forever" to the kernel: wait at least 1 µs.
        Some(d) => libc::timeval {
            tv_sec: d.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_usec: d.subsec_micros().max(u32::from(d.as_secs() == 0)) as libc::suseconds_t,
        },
        None => libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
    };
    // SAFETY: `tv` is a valid timeval that lives across the call, and the
    // length passed is its size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const c_void,
            mem::size_of::<libc::timeval>() as socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A one-shot `CLOCK_MONOTONIC` timer as a descriptor (`timerfd_create`),
/// non-blocking and close-on-exec: it turns readable when it fires, so a
/// reactor can wait for it beside sockets with microsecond precision, and
/// another thread can re-arm it without waking the waiter.
pub(crate) fn timerfd() -> io::Result<OwnedFd> {
    // SAFETY: no pointers; the flags are valid for timerfd_create.
    let fd = unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by timerfd_create and nothing else
    // owns it.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// Arms the timer to fire once `after` from now (at least 1 ns), or
/// disarms it (`None`); clears expirations not yet read.
pub(crate) fn timerfd_arm(fd: BorrowedFd<'_>, after: Option<Duration>) -> io::Result<()> {
    let value = match after {
        Some(d) => {
            let d = d.max(Duration::from_nanos(1));
            libc::timespec {
                tv_sec: d.as_secs().min(i32::MAX as u64) as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            }
        }
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
    };
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: value,
    };
    // SAFETY: `spec` is a valid itimerspec living across the call; a null
    // old-value pointer is allowed.
    let r = unsafe { libc::timerfd_settime(fd.as_raw_fd(), 0, &spec, ptr::null_mut()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads (and discards) the timer's expiration count, so that it is no
/// longer readable; `WouldBlock` when it had not fired.
pub(crate) fn timerfd_clear(fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut n = 0u64;
    // SAFETY: `n` is 8 writable bytes, the size a timerfd read needs.
    let r = unsafe { libc::read(fd.as_raw_fd(), &mut n as *mut u64 as *mut c_void, 8) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
