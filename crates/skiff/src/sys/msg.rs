//! The datagram calls: `sendmmsg(2)`, `sendto(2)`/`send(2)`,
//! `recvmmsg(2)`/`recvmsg(2)` and `recvfrom(2)`, with the socket addresses
//! and control messages (`UDP_SEGMENT`, `UDP_GRO`, `SO_RXQ_OVFL`) they
//! carry.

use std::io;
use std::mem::{self, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr;

use libc::{c_int, c_void, socklen_t};

use super::{syscall6, UDP_GRO, UDP_SEGMENT};

/// Datagrams in one [`sendmmsg`] call at most.
pub(crate) const MAX_BATCH: usize = 64;

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
    /// When not empty, the bytes instead of `data`: these slices one after
    /// the other (scatter-gather, so that a payload is sent from where it
    /// lies; GSO cuts segments whatever the slices' bounds).
    pub(crate) iov: &'a [std::io::IoSlice<'a>],
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
        // SAFETY: all-zero bytes are a valid `mmsghdr` (null pointers, zero
        // lengths); the fields that matter are set right below.
        let mut h: libc::mmsghdr = unsafe { mem::zeroed() };
        h.msg_hdr.msg_name = addr as *mut RawAddr as *mut c_void;
        h.msg_hdr.msg_namelen = addr_len;
        if m.iov.is_empty() {
            h.msg_hdr.msg_iov = iovs[i].write(libc::iovec {
                iov_base: m.data.as_ptr() as *mut c_void,
                iov_len: m.data.len(),
            });
            h.msg_hdr.msg_iovlen = 1;
        } else {
            // `IoSlice` is ABI compatible with `iovec` (std guarantees it
            // on Unix); the kernel only reads them.
            h.msg_hdr.msg_iov = m.iov.as_ptr() as *mut libc::iovec;
            h.msg_hdr.msg_iovlen = m.iov.len() as _;
        }
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
    // `data` slices or `iov` slices (and the bytes they point to), all
    // alive for the call; the kernel only reads them
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
/// goes to `slots[i]` and its description to `out[i]` (slots beyond
/// `slots` or `out` are not used). Returns how many arrived; `WouldBlock`
/// if none was waiting.
///
/// With `wait` it instead blocks for one datagram (until the socket's
/// `SO_RCVTIMEO` passes: `WouldBlock`) with a plain `recvfrom(2)`: a
/// request/reply exchange pays this call for every message, and it skips
/// `recvmsg`'s header copy-in and control messages. What else arrived is
/// read by the next, non-blocking call. What it cannot report: the
/// `SO_RXQ_OVFL` counter (read it with
/// [`meminfo_drops`](super::meminfo_drops)) and the `UDP_GRO` segment
/// size, so on a socket with GRO on such a buffer may be a coalesced run
/// whose stride the caller must find (`RecvMeta::maybe_run`).
pub(crate) fn recvmmsg<S: AsMut<[u8]>>(
    fd: BorrowedFd<'_>,
    bufs: &mut RecvBufs,
    slots: &mut [S],
    out: &mut [RecvMeta],
    wait: bool,
) -> io::Result<usize> {
    // A waiting receive takes one datagram: a request/reply exchange has
    // only one, and asking the kernel for more costs a second, failing
    // attempt inside the call.
    let most = if wait { 1 } else { bufs.slots() };
    let n = most.min(out.len()).min(slots.len());
    if n == 0 {
        return Ok(0);
    }
    if wait {
        out[0] = recvfrom(fd, slots[0].as_mut(), &mut bufs.names[0])?;
        return Ok(1);
    }
    let RecvBufs {
        hdrs,
        iovs,
        names,
        ctrls,
    } = bufs;
    for (i, slot) in slots.iter_mut().take(n).enumerate() {
        let slot = slot.as_mut();
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
        // SAFETY: `hdrs[0]` points to `slots[0]`, to
        // `names[0]` and `ctrls[0]`, all borrowed mutably for the call and
        // sized as the header says; the kernel writes only inside them.
        let r = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut hdrs[0].msg_hdr, libc::MSG_DONTWAIT) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        hdrs[0].msg_len = r as u32;
        1
    } else {
        // SAFETY: the first `n` headers point to the `n` distinct buffers
        // of `slots`, to `names[i]` and `ctrls[i]`, all borrowed mutably for
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
            len: (h.msg_len as usize).min(iovs[i].iov_len),
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
