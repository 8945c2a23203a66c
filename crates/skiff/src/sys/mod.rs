//! The system calls behind the UDP driver (and the endpoint's timer): the
//! crate's `unsafe` code outside shared memory, in one place.
//!
//! Each function wraps one Linux system call (or a few socket options) and
//! returns [`io::Result`]; nothing here keeps state between calls or knows
//! about skiff's protocol. [`crate::udp`] builds the safe socket on top.
//!
//! - `msg`, the datagram calls: [`sendmmsg`], up to [`MAX_BATCH`]
//!   datagrams in one call, each to its own destination and optionally
//!   with a `UDP_SEGMENT` (GSO) segment size; [`sendto`] and [`send`], one
//!   datagram, for the lone reply that `sendmmsg` would only slow down;
//!   [`recvmmsg`], many datagrams in one call into slots of a caller
//!   buffer, with the source, the `MSG_TRUNC` flag, the `UDP_GRO` segment
//!   size and the `SO_RXQ_OVFL` drop counter of each (a waiting receive of
//!   one datagram is a plain `recvfrom(2)` instead).
//! - Here: socket options the standard library and `socket2` do not cover
//!   (`UDP_GRO`, `UDP_SEGMENT`, `SO_RXQ_OVFL`, `SO_MEMINFO`,
//!   `IP_MULTICAST_IF` by index, `SO_RCVTIMEO`), `poll(2)`, registration
//!   with tokio's reactor, and a `timerfd`.
//!
//! The calls a request/reply exchange makes for every message (`sendto`,
//! `send`, `recvfrom`) enter the kernel through `syscall(2)` rather than
//! glibc's wrappers of the same name: those are thread-cancellation points
//! and bracket the call with two atomic updates of the thread's cancel
//! state, which skiff never uses (`bench/RESULTS.md` has the difference
//! this makes to a round trip).

#[cfg(not(target_os = "linux"))]
compile_error!("skiff's UDP driver needs Linux (sendmmsg, UDP_SEGMENT, UDP_GRO, SO_RXQ_OVFL)");

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::ptr;
use std::time::{Duration, Instant};

use libc::{c_int, c_void, socklen_t};

mod msg;

pub(crate) use msg::{
    disables_gso, is_gso_error, recvmmsg, send, sendmmsg, sendto, RecvBufs, RecvMeta, Transmit,
    MAX_BATCH,
};

/// `syscall(2)` for the socket calls of `msg`: the same kernel entry as glibc's
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

/// `UDP_SEGMENT` (linux/udp.h): GSO segment size, a socket option and a
/// cmsg of type `u16`.
const UDP_SEGMENT: c_int = 103;
/// `UDP_GRO` (linux/udp.h): socket option to accept coalesced datagrams; the
/// cmsg carries the segment size as an `int`.
const UDP_GRO: c_int = 104;
/// `SK_MEMINFO_DROPS`: index of the drop counter in the `SO_MEMINFO` array.
const SK_MEMINFO_DROPS: usize = 8;

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
