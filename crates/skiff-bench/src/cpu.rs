//! Pins every thread of this process and of some child processes to one
//! CPU for a run, and restores them after. On a VM whose cross-CPU wake-up
//! costs tens of microseconds, a request that hops between processes on
//! two CPUs measures the hypervisor's wake-ups; on one CPU it measures the
//! software (both servers get the same treatment).

use std::io;

/// Every thread of the given processes on one CPU until dropped.
pub(crate) struct PinAll {
    pids: Vec<u32>,
    before: libc::cpu_set_t,
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
        let size = std::mem::size_of::<libc::cpu_set_t>();
        if cpu >= 8 * size {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        // SAFETY: cpu_set_t is a plain bit array, valid all-zero; the
        // index is checked above; getaffinity writes only `before`.
        let (before, one) = unsafe {
            let mut before: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, size, &mut before) != 0 {
                return Err(io::Error::last_os_error());
            }
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut one);
            (before, one)
        };
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
/// `skiff_node::wake`) for a whole run, so that skiff's rows and the
/// peer's run under the same machine-wide idle policy. Returns the request
/// (release by dropping) and the note every row's options get.
pub(crate) fn hold_wake(
    micros: Option<u32>,
) -> Result<(Option<skiff_node::WakeLatency>, String), Box<dyn std::error::Error>> {
    match micros {
        None => Ok((None, String::new())),
        Some(us) => {
            let w = skiff_node::WakeLatency::request(us)
                .map_err(|e| format!("--wake-latency-us {us}: {e} (needs root)"))?;
            Ok((Some(w), format!(" wake_latency_us={us}")))
        }
    }
}
