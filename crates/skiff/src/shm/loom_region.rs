//! The heap model of [`Region`] for loom: control words are loom atomics,
//! data bytes are relaxed `AtomicU8`s (so a sequence-lock read racing a
//! write is a legal relaxed race, as the real volatile copy is meant to
//! be). Same method names as `sys.rs`; no `unsafe`.

use std::io;
use std::time::Duration;

use super::sync::{AtomicU32, AtomicU64, AtomicU8, Ordering};

/// A zeroed heap region of `len` bytes.
#[derive(Debug)]
pub(crate) struct Region {
    w64: Vec<AtomicU64>,
    w32: Vec<AtomicU32>,
    bytes: Vec<AtomicU8>,
}

impl Region {
    pub(crate) fn anonymous(len: usize) -> io::Result<Region> {
        Ok(Region {
            w64: (0..len / 8).map(|_| AtomicU64::new(0)).collect(),
            w32: (0..len / 4).map(|_| AtomicU32::new(0)).collect(),
            bytes: (0..len).map(|_| AtomicU8::new(0)).collect(),
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    pub(crate) fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert_eq!(off % 8, 0);
        &self.w64[off / 8]
    }

    pub(crate) fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert_eq!(off % 4, 0);
        &self.w32[off / 4]
    }

    pub(crate) fn copy_out(&self, off: usize, dst: &mut [u8]) {
        for (i, d) in dst.iter_mut().enumerate() {
            *d = self.bytes[off + i].load(Ordering::Relaxed);
        }
    }

    pub(crate) fn write(&self, off: usize, src: &[u8]) {
        for (i, s) in src.iter().enumerate() {
            self.bytes[off + i].store(*s, Ordering::Relaxed);
        }
    }
}

pub(crate) fn futex_wait(_word: &AtomicU32, _expected: u32, _timeout: Duration) -> io::Result<()> {
    loom::thread::yield_now();
    Ok(())
}

pub(crate) fn futex_wake(_word: &AtomicU32) {}

/// The model has no membarrier: both sides of the handshake use a
/// `SeqCst` fence, which is what the real asymmetric pair is equivalent to.
pub(crate) fn membarrier_ready() -> bool {
    false
}

pub(crate) fn light_fence(_asym: bool) {
    super::sync::fence(Ordering::SeqCst);
}

pub(crate) fn heavy_fence(_asym: bool) {
    super::sync::fence(Ordering::SeqCst);
}

pub(crate) fn pid() -> u32 {
    1
}

pub(crate) fn process_start(_pid: u32) -> Option<u64> {
    Some(0)
}
