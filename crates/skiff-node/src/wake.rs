//! A bound on how long an idle CPU takes to wake, held through the kernel's
//! PM QoS interface (`/dev/cpu_dma_latency`) for as long as the value lives.
//!
//! Why: an idle CPU sleeps in the deepest idle state its governor allows.
//! On a virtual machine that state is a halted vCPU, and waking one costs
//! a trip through the hypervisor, several times a round trip between two
//! polling CPUs (`bench/RESULTS.md` has the runs). Every hop of a request
//! through the node (client → node → replier → node → client) pays one
//! such wake-up. Asking for a
//! wake-up latency of 0 keeps idle CPUs polling, as tuned's
//! `latency-performance` profile does; the price is CPU time burnt while
//! idle, which is why it is a setting and off by default.
//!
//! The request is machine-wide (every process benefits while it is held)
//! and ends when the file is closed, i.e. when [`WakeLatency`] is dropped
//! or the process exits. Opening the device needs root (or write access
//! to it).

use std::fs::File;
use std::io::{self, Read, Write};

/// The PM QoS device.
pub const DEVICE: &str = "/dev/cpu_dma_latency";

/// A held wake-up latency request; dropping it releases the request.
#[derive(Debug)]
pub struct WakeLatency {
    _file: File,
    micros: u32,
}

impl WakeLatency {
    /// Asks the kernel to keep every CPU able to wake within `micros` µs
    /// (0: idle CPUs poll). Fails if the device is missing or not writable
    /// by this process; the error names the device.
    pub fn request(micros: u32) -> io::Result<WakeLatency> {
        let named = |e: io::Error| io::Error::new(e.kind(), format!("{DEVICE}: {e}"));
        let value = i32::try_from(micros).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "wake latency above i32::MAX µs",
            )
        })?;
        let mut file = File::options().write(true).open(DEVICE).map_err(named)?;
        file.write_all(&value.to_ne_bytes()).map_err(named)?;
        Ok(WakeLatency {
            _file: file,
            micros,
        })
    }

    /// The latency requested, in µs.
    pub fn micros(&self) -> u32 {
        self.micros
    }
}

/// The machine-wide bound in force now (the lowest of all requests held by
/// any process; the kernel's default, 2,000,000,000 µs, when none is).
pub fn current() -> io::Result<u32> {
    let mut buf = [0u8; 4];
    File::open(DEVICE)?.read_exact(&mut buf)?;
    Ok(i32::from_ne_bytes(buf).max(0) as u32)
}
