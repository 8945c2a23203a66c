//! Where a run's threads execute and how deeply idle CPUs sleep: pinning
//! to one CPU and holding a PM QoS wake-up latency for a whole run. All
//! of skiff-bench's unsafe code is here, each call behind a small wrapper
//! that returns `io::Result`.
//!
//! Why pin: on a VM whose cross-CPU wake-up costs tens of microseconds, a
//! round trip between threads (or processes) on two CPUs measures the
//! hypervisor's wake-ups; on one CPU it measures the software. Every
//! system compared gets the same treatment.

use std::error::Error;
use std::io;

/// The CPU the calling thread is running on now.
pub(crate) fn current_cpu() -> usize {
    // SAFETY: sched_getcpu takes no arguments and only returns a number.
    usize::try_from(unsafe { libc::sched_getcpu() }).unwrap_or(0)
}

/// An empty CPU set.
fn empty_set() -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is a plain bit array, valid all-zero.
    unsafe { std::mem::zeroed() }
}

/// The set holding `cpu` alone.
fn only(cpu: usize) -> io::Result<libc::cpu_set_t> {
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    let mut one = empty_set();
    // SAFETY: the index is checked above against the set's size in bits.
    unsafe { libc::CPU_SET(cpu, &mut one) };
    Ok(one)
}

/// The affinity of thread `tid` (0: the calling thread).
fn get(tid: i32) -> io::Result<libc::cpu_set_t> {
    let mut set = empty_set();
    // SAFETY: `set` is a cpu_set_t we own, passed with its true size; the
    // call writes only into it.
    let r =
        unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(set)
}

/// The affinity of thread `tid` (0: the calling thread) set to `set`.
fn set(tid: i32, set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: `set` is a valid cpu_set_t passed with its true size; the
    // call only reads it.
    let r = unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread held to one CPU; the previous mask comes back on
/// drop. Threads it starts meanwhile inherit the mask.
pub(crate) struct Pin {
    /// The CPU.
    pub(crate) cpu: usize,
    before: libc::cpu_set_t,
}

impl Pin {
    /// Pins as `--latency-cpu` says: a CPU number, `auto` (the one this
    /// thread runs on now) or `none` (`None`).
    pub(crate) fn latency_cpu(spec: &str) -> Result<Option<Pin>, Box<dyn Error>> {
        let cpu = match spec {
            "none" => return Ok(None),
            "auto" => current_cpu(),
            n => n
                .parse()
                .map_err(|_| format!("--latency-cpu {n}: expected a CPU number, auto or none"))?,
        };
        Pin::to(cpu)
            .map(Some)
            .map_err(|e| format!("--latency-cpu: cannot pin to cpu {cpu}: {e}").into())
    }

    fn to(cpu: usize) -> io::Result<Pin> {
        let one = only(cpu)?;
        let before = get(0)?;
        set(0, &one)?;
        Ok(Pin { cpu, before })
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let _ = set(0, &self.before);
    }
}

impl std::fmt::Debug for Pin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pin").field("cpu", &self.cpu).finish()
    }
}

/// Every thread of this process and of some child processes on one CPU
/// until dropped.
pub(crate) struct PinAll {
    pids: Vec<u32>,
    before: libc::cpu_set_t,
}

impl std::fmt::Debug for PinAll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinAll").field("pids", &self.pids).finish()
    }
}

/// The thread ids of process `pid` (from /proc; threads may come and go).
fn threads(pid: u32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

impl PinAll {
    /// Pins this process and `others` to `cpu`. Threads started later
    /// inherit it, and so do child processes this process starts.
    pub(crate) fn to(cpu: usize, others: &[u32]) -> io::Result<PinAll> {
        let one = only(cpu)?;
        let before = get(0)?;
        let mut pids = vec![std::process::id()];
        pids.extend_from_slice(others);
        let pin = PinAll { pids, before };
        for &pid in &pin.pids {
            for tid in threads(pid) {
                set(tid, &one)?;
            }
        }
        Ok(pin)
    }
}

impl Drop for PinAll {
    fn drop(&mut self) {
        for &pid in &self.pids {
            for tid in threads(pid) {
                let _ = set(tid, &self.before);
            }
        }
    }
}

/// Holds a CPU wake-up latency (`--wake-latency-us`, see
/// `skiff_node::WakeLatency`) for a whole run, so that skiff's rows and
/// the peer's run under the same machine-wide idle policy. Returns the
/// request (release by dropping) and the note every row's options get.
pub(crate) fn hold_wake(
    micros: Option<u32>,
) -> Result<(Option<skiff_node::WakeLatency>, String), Box<dyn Error>> {
    match micros {
        None => Ok((None, String::new())),
        Some(us) => {
            let w = skiff_node::WakeLatency::request(us)
                .map_err(|e| format!("--wake-latency-us {us}: {e} (needs root)"))?;
            Ok((Some(w), format!(" wake_latency_us={us}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_cpu_pins_and_restores() {
        assert!(Pin::latency_cpu("none").unwrap().is_none());
        let e = Pin::latency_cpu("fast").unwrap_err().to_string();
        assert!(e.contains("a CPU number, auto or none"), "{e}");
        let cpu = {
            let p = Pin::latency_cpu("auto").unwrap().expect("pinned");
            assert_eq!(current_cpu(), p.cpu);
            p.cpu
        };
        let p = Pin::latency_cpu(&cpu.to_string()).unwrap().unwrap();
        assert_eq!(p.cpu, cpu);
    }

    #[test]
    fn a_cpu_beyond_the_set_is_refused() {
        let e = only(1 << 20).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
