//! The atomics the ring protocol uses, from `loom` under `--cfg skiff_loom` and
//! from `std` otherwise (the shim of tokio's `src/loom`), so the same
//! protocol code runs in the real mapping and in loom's model checker.

#[cfg(skiff_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicU8, Ordering};
#[cfg(not(skiff_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Lets a spinning thread give way (loom needs to know to switch threads).
pub(crate) fn spin_hint() {
    #[cfg(skiff_loom)]
    loom::thread::yield_now();
    #[cfg(not(skiff_loom))]
    std::hint::spin_loop();
}
