//! Polling instead of sleeping, for a short while after traffic.
//!
//! When a runtime has nothing to do, its worker sleeps in `epoll_wait`, and
//! the next frame from a peer on another CPU must wake it: an
//! inter-processor interrupt. On a virtual machine without guest halt
//! polling that costs tens of microseconds (`bench/RESULTS.md` has the
//! figures), and a request crosses the node twice, so a round trip can pay
//! it four times. With a spin budget, the runtime keeps
//! polling its sockets without blocking for that long after the last read,
//! so a peer that answers within the budget finds it awake and no
//! interrupt is sent. Go's scheduler spins the same way, by default.
//!
//! The cost is CPU: up to the budget after each burst of traffic, none
//! while idle. The budget adapts as the kernel's guest halt polling does: a
//! spin that catches nothing halves the next one (down to an eighth); a
//! read that comes soon after a spin ended doubles it (up to the setting).
//! Each turn also yields the CPU (`sched_yield`), so a thread that shares
//! it runs first.
//!
//! Used by the node (setting `spin_us`) and by clients (locator option
//! `spin_us`); 0 turns it off. A thread that may use only one CPU never
//! spins: the event it waits for has to come from a thread
//! on that same CPU, which its polling only delays. That is checked at each burst, since a process can be pinned while it
//! runs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// The default spin budget for nodes and clients, in µs: above a
/// request's round trip between two spinning peers on a loopback, with
/// room for scheduling noise, and far below a scheduler tick (the runs
/// that chose it are in `bench/RESULTS.md`).
pub const DEFAULT_SPIN_US: u64 = 100;

/// How many CPUs the calling thread may run on (1 if that is unknown).
fn cpus_allowed() -> usize {
    // SAFETY: cpu_set_t is a plain bit array, valid all-zero, and is
    // passed with its true size; the call only writes it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return 1;
        }
        libc::CPU_COUNT(&set) as usize
    }
}

/// Traffic seen by one runtime's readers, and the spinner that watches it.
#[derive(Debug, Default)]
pub struct Spin {
    activity: AtomicU64,
    spinning: AtomicBool,
    /// Set while the thread may use one CPU only: reads do not wake the
    /// spinner, which looks again after [`PINNED_RECHECK`].
    pinned: AtomicBool,
    closed: AtomicBool,
    wake: Notify,
}

/// How often a spinner whose thread may use one CPU only checks whether
/// that is still so: one system call per period instead of one per burst.
const PINNED_RECHECK: Duration = Duration::from_millis(100);

impl Spin {
    /// Starts a spinner with at most `budget` of polling after each read,
    /// on the current tokio runtime; `None` for a zero budget.
    pub fn start(budget: Duration) -> Option<Arc<Spin>> {
        if budget.is_zero() {
            return None;
        }
        let s = Arc::new(Spin::default());
        tokio::spawn(s.clone().run(budget));
        Some(s)
    }

    /// Called by a reader after each read: keeps (or starts) the spinner.
    #[inline]
    pub fn touch(&self) {
        self.activity.fetch_add(1, Ordering::Relaxed);
        if !self.spinning.load(Ordering::Relaxed) && !self.pinned.load(Ordering::Relaxed) {
            self.wake.notify_one();
        }
    }

    /// Whether the spinner is polling now.
    pub fn is_spinning(&self) -> bool {
        self.spinning.load(Ordering::Relaxed)
    }

    /// Ends the spinner's task.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.wake.notify_one();
    }

    async fn run(self: Arc<Self>, max: Duration) {
        let mut budget = max;
        let mut stopped = Instant::now();
        loop {
            self.wake.notified().await;
            if self.closed.load(Ordering::Relaxed) {
                return;
            }
            if cpus_allowed() < 2 {
                self.pinned.store(true, Ordering::Relaxed);
                tokio::time::sleep(PINNED_RECHECK).await;
                self.pinned.store(false, Ordering::Relaxed);
                continue;
            }
            let start = Instant::now();
            budget = after_sleep(budget, max, start - stopped);
            self.spinning.store(true, Ordering::Relaxed);
            let mut seen = self.activity.load(Ordering::Relaxed);
            let mut until = start + budget;
            let mut caught = false;
            loop {
                // Deferred until the worker has polled its sockets once
                // without blocking and run whatever that made ready.
                tokio::task::yield_now().await;
                if self.closed.load(Ordering::Relaxed) {
                    return;
                }
                let now = self.activity.load(Ordering::Relaxed);
                let t = Instant::now();
                if now != seen {
                    seen = now;
                    caught = true;
                    until = t + budget;
                } else if t >= until {
                    break;
                }
                std::thread::yield_now();
            }
            stopped = Instant::now();
            budget = after_spin(budget, max, caught);
            self.spinning.store(false, Ordering::Relaxed);
            // A read between the last look and the store above did not
            // notify: look once more.
            if self.activity.load(Ordering::Relaxed) != seen {
                self.wake.notify_one();
            }
        }
    }
}

/// The next budget after a spin that caught a read (`caught`) or did not.
fn after_spin(budget: Duration, max: Duration, caught: bool) -> Duration {
    if caught {
        budget
    } else {
        (budget / 2).max(max / 8)
    }
}

/// The budget for a spin started by a read `slept` after the last spin
/// ended: a read the full budget would have caught doubles it.
fn after_sleep(budget: Duration, max: Duration, slept: Duration) -> Duration {
    if slept < max {
        (budget * 2).min(max)
    } else {
        budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_micros(80);

    #[test]
    fn misses_shrink_the_budget_to_an_eighth_and_near_misses_grow_it_back() {
        let mut b = MAX;
        for want in [40, 20, 10, 10, 10] {
            b = after_spin(b, MAX, false);
            assert_eq!(b, Duration::from_micros(want));
        }
        assert_eq!(after_spin(b, MAX, true), b, "a caught read keeps it");
        assert_eq!(
            after_sleep(b, MAX, Duration::from_millis(5)),
            b,
            "a late read keeps it"
        );
        for want in [20, 40, 80, 80] {
            b = after_sleep(b, MAX, Duration::from_micros(30));
            assert_eq!(b, Duration::from_micros(want));
        }
    }

    #[test]
    fn zero_budget_starts_nothing() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async { assert!(Spin::start(Duration::ZERO).is_none()) });
    }

    /// Spins after a read, stops within the budget once reads stop, spins
    /// again on the next read, and ends when closed. Pinned to one CPU, it
    /// never spins.
    #[test]
    fn spins_after_reads_and_sleeps_when_they_stop() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let s = Spin::start(Duration::from_millis(20)).unwrap();
            let poll = |want: bool| {
                let s = s.clone();
                async move {
                    let t = Instant::now();
                    while s.is_spinning() != want {
                        assert!(
                            t.elapsed() < Duration::from_secs(5),
                            "spinning never became {want}"
                        );
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    t.elapsed()
                }
            };
            assert!(!s.is_spinning());
            if cpus_allowed() < 2 {
                s.touch();
                tokio::time::sleep(Duration::from_millis(30)).await;
                assert!(!s.is_spinning(), "spins on one CPU");
            } else {
                s.touch();
                poll(true).await;
                let took = poll(false).await;
                assert!(took >= Duration::from_millis(10), "stopped after {took:?}");
                s.touch();
                poll(true).await;
            }
            s.close();
            // Pinned, the spinner may be resting for PINNED_RECHECK first.
            let t = Instant::now();
            while Arc::strong_count(&s) > 1 {
                assert!(
                    t.elapsed() < Duration::from_secs(5),
                    "the spinner task still holds it"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }
}
