//! The memory and the system calls under the shared-memory ring, and the
//! only `unsafe` code of [`crate::shm`].
//!
//! - [`Region`]: a mapping (a file under the buffer directory, or
//!   anonymous memory for a transport's local ring) addressed by byte
//!   offset. Control words are handed out as `&AtomicU64`/`&AtomicU32`
//!   after a bounds and alignment check; data bytes as slices through two
//!   `unsafe fn`s whose callers hold the ring's protocol (credits) as proof
//!   of exclusive access, or copied out with [`Region::copy_out`] under a
//!   sequence lock.
//! - [`futex_wait`] / [`futex_wake`]: `futex(2)` on a word of the mapping,
//!   shared between processes (no `FUTEX_PRIVATE_FLAG`).
//! - [`process_start`]: a process's start time, so a pid can be checked for
//!   liveness without being fooled by pid reuse.
//!
//! A note on the memory model: the mapping is shared with other processes,
//! which Rust's memory model does not describe. Every value read from it is
//! treated as untrusted input (any bit pattern is valid for `u8` and for
//! the atomics), bounds come from a layout validated once and cached in
//! process memory, and never from the mapping itself.
//!
//! Under `--cfg skiff_loom` this module is replaced by a heap model
//! (`loom_region.rs`) with the same method names.

use std::fs::File;
use std::io;
use std::ptr;
use std::time::Duration;

use memmap2::{MmapOptions, MmapRaw};

use super::sync::{AtomicU32, AtomicU64};

/// A mapping addressed by offset. The mapping is never resized or moved
/// while the `Region` lives.
#[derive(Debug)]
pub(crate) struct Region {
    map: MmapRaw,
}

// The mapping is plain memory: sharing its address across threads is as
// safe as sharing it across processes, which the ring protocol is built for.
// (MmapRaw is already Send + Sync; stated for readers.)
const _: fn() = || {
    fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<Region>();
};

impl Region {
    /// Maps all of `file` (its current length), shared and writable.
    pub(crate) fn map_file(file: &File, len: usize) -> io::Result<Region> {
        let map = MmapOptions::new().len(len).map_raw(file)?;
        Ok(Region { map })
    }

    /// Maps `len` bytes of zeroed anonymous memory (a ring private to this
    /// process).
    pub(crate) fn anonymous(len: usize) -> io::Result<Region> {
        let map = MmapOptions::new().len(len).map_anon()?;
        Ok(Region { map: map.into() })
    }

    /// The address of the mapping's first byte (for diagnostics: where a
    /// slice handed out from it lies).
    pub(crate) fn base(&self) -> usize {
        self.map.as_ptr() as usize
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Panics unless `[off, off+size)` is in bounds and `off` is aligned to
    /// `size`. Offsets come from the validated layout, so a failure is a bug
    /// in skiff, not bad input.
    fn check(&self, off: usize, size: usize) {
        assert!(
            off.is_multiple_of(size) && off.checked_add(size).is_some_and(|e| e <= self.len()),
            "shm: control word at {off} (+{size}) outside a {}-byte mapping",
            self.len()
        );
    }

    /// The 64-bit control word at `off`.
    pub(crate) fn u64_at(&self, off: usize) -> &AtomicU64 {
        self.check(off, 8);
        // SAFETY: `check` proved `off..off+8` lies inside the mapping and is
        // 8-aligned (mappings are page-aligned); `AtomicU64` has the size
        // and alignment of `u64` and every bit pattern is valid; the mapping
        // lives as long as `&self`; all accesses to control words, in every
        // process, are atomic.
        unsafe { &*(self.map.as_mut_ptr().add(off) as *const AtomicU64) }
    }

    /// The 32-bit control word at `off`.
    pub(crate) fn u32_at(&self, off: usize) -> &AtomicU32 {
        self.check(off, 4);
        // SAFETY: as for `u64_at`, with 4 bytes and 4-alignment.
        unsafe { &*(self.map.as_mut_ptr().add(off) as *const AtomicU32) }
    }

    /// Panics unless `[off, off+len)` is in bounds.
    fn check_bytes(&self, off: usize, len: usize) {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.len()),
            "shm: bytes {off}+{len} outside a {}-byte mapping",
            self.len()
        );
    }

    /// The bytes `[off, off+len)`, read in place.
    ///
    /// # Safety
    /// Nobody in this process may hold a mutable slice overlapping the range
    /// while the returned one lives. The ring protocol proves it: the range
    /// is a published, unconsumed segment of a credit-flow ring, which its
    /// producer does not write until this consumer consumes it.
    pub(crate) unsafe fn bytes(&self, off: usize, len: usize) -> &[u8] {
        self.check_bytes(off, len);
        // SAFETY: in bounds (checked), the mapping outlives `&self`, `u8`
        // has no invalid values; exclusivity is the caller's contract.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(off), len) }
    }

    /// The bytes `[off, off+len)`, writable in place.
    ///
    /// # Safety
    /// No other slice (shared or mutable) overlapping the range may exist in
    /// this process while the returned one lives. The ring protocol proves
    /// it: the range is this producer's single outstanding reservation, free
    /// of every consumer's unconsumed data (credits), or in overwrite mode
    /// readers only ever [`Region::copy_out`] from it.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn bytes_mut(&self, off: usize, len: usize) -> &mut [u8] {
        self.check_bytes(off, len);
        // SAFETY: in bounds (checked), the mapping outlives `&self`;
        // exclusivity is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(off), len) }
    }

    /// Copies `[off, off+dst.len())` into `dst` with volatile reads: the
    /// reader side of a sequence lock, where the producer may be writing the
    /// same bytes. The caller validates the lock afterwards and discards the
    /// copy if it broke.
    pub(crate) fn copy_out(&self, off: usize, dst: &mut [u8]) {
        self.check_bytes(off, dst.len());
        let src = self.map.as_ptr();
        for (i, d) in dst.iter_mut().enumerate() {
            // SAFETY: `off + i` is in bounds (checked above); a volatile
            // byte read of plain memory is valid whatever another process
            // writes concurrently (any value is a valid `u8`), and the value
            // is only trusted once the sequence lock validates.
            *d = unsafe { ptr::read_volatile(src.add(off + i)) };
        }
    }
}

/// Waits while `word` holds `expected`, at most `timeout`; returns on a
/// wake-up, a timeout, a signal or a changed value alike (callers re-check
/// their condition).
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) -> io::Result<()> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned 32-bit atomic for the duration of
    // the call; FUTEX_WAIT only reads it; `ts` is a valid relative timeout.
    // Not FUTEX_PRIVATE: the word may be shared with other processes.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            ptr::null::<u32>(),
            0u32,
        )
    };
    if r == -1 {
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::ETIMEDOUT) | Some(libc::EINTR) => Ok(()),
            _ => Err(e),
        }
    } else {
        Ok(())
    }
}

/// Wakes every waiter on `word`.
pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a valid, aligned 32-bit atomic; FUTEX_WAKE does not
    // access it. Errors (none expected) are ignored: a missed wake-up is
    // covered by the waiters' timeouts.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            ptr::null::<libc::timespec>(),
            ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Registers this process for `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)`
/// (once per process) and says whether the asymmetric fence pair
/// ([`light_fence`] on the hot path, [`heavy_fence`] on the waiting side)
/// may be used. `false` on kernels without it, under seccomp filters that
/// refuse it, and under miri: then both sides use a `SeqCst` fence.
pub(crate) fn membarrier_ready() -> bool {
    static READY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READY.get_or_init(|| {
        if cfg!(miri) {
            return false;
        }
        // SAFETY: membarrier(2) with a command and zero flags takes no
        // pointers; QUERY returns a bit mask of the supported commands.
        let q = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0) };
        if q < 0 || q & MEMBARRIER_CMD_GLOBAL_EXPEDITED == 0 {
            return false;
        }
        // SAFETY: as above; REGISTER only marks this process as a target.
        let r = unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED,
                0,
                0,
            )
        };
        r == 0
    })
}

const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
const MEMBARRIER_CMD_GLOBAL_EXPEDITED: libc::c_long = 1 << 1;
const MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_long = 1 << 2;

/// The hot side of a Dekker handshake (publish, then check for sleepers):
/// with `asym` (both processes registered, [`membarrier_ready`]) only a
/// compiler fence, paired with the waiter's [`heavy_fence`]; else a
/// `SeqCst` fence. This is what keeps a store-buffer drain (a cache-line
/// round trip to the peer's core) off every publication.
#[inline]
pub(crate) fn light_fence(asym: bool) {
    if asym {
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    } else {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}

/// The waiting side of the handshake (registered as a waiter, then
/// re-check): `membarrier(GLOBAL_EXPEDITED)` runs a full barrier on every
/// running thread of every registered process, so a publisher's plain
/// compiler fence acts as a `SeqCst` one (the pairing documented in
/// membarrier(2)). Falls back to a `SeqCst` fence if the call fails; a
/// wake-up missed that way is covered by the waiters' timed slices.
pub(crate) fn heavy_fence(asym: bool) {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    if asym {
        // SAFETY: membarrier(2) takes no pointers; errors are handled by the
        // fence above and the waiter's bounded sleep.
        unsafe {
            libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0);
        }
    }
}

/// This process's id.
pub(crate) fn pid() -> u32 {
    std::process::id()
}

/// The start time (clock ticks since boot, field 22 of `/proc/PID/stat`)
/// of a live process, `None` if `pid` is gone or a zombie. Safe code: the
/// unsafe-free twin of `kill(pid, 0)` that also defeats pid reuse.
pub(crate) fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields resume
    // after the last ')'. Field 3 (state) is first there; 22 is the 20th.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" || state == "x" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}
