//! The floors of `skiff-bench shm`, in this process with nothing of
//! skiff's: a Unix domain socket pair (std) carrying the same load, and a
//! bare single-producer single-consumer ring of 8-byte slots, the floor
//! of the hardware and the scheduler.

use std::error::Error;
use std::io::{BufWriter, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use skiff_cli::bench::report::{CpuMeter, Row};
use skiff_cli::bench::{round_trips, Limits};

/// A bare single-producer single-consumer ring of 65536 8-byte slots in
/// process memory (no validation, no records, no wake-ups): the producer
/// caches the consumer's position and re-reads it only when the ring
/// looks full, the consumer caches the producer's and reads every slot
/// below it; one release store per message on each side. With
/// `threads == 1` one thread alternates rounds of 1024.
pub(crate) fn spsc_floor(threads: usize, limits: Limits) -> Result<Row, Box<dyn Error>> {
    use std::sync::atomic::{AtomicU64, Ordering};
    const SLOTS: u64 = 1 << 16;
    #[repr(align(128))]
    struct Line(AtomicU64);
    let slots: Vec<AtomicU64> = (0..SLOTS).map(|_| AtomicU64::new(0)).collect();
    let lines = (Line(AtomicU64::new(0)), Line(AtomicU64::new(0)));
    let (head, tail) = (&lines.0, &lines.1);
    let slots = &slots;
    let stop = &std::sync::atomic::AtomicBool::new(false);
    let total = limits.messages;
    let deadline = Instant::now() + limits.duration;
    let cpu = CpuMeter::start();
    let start = Instant::now();
    // Producer step: publish up to `max` messages; returns how many.
    let produce = |next: &mut u64, seen_tail: &mut u64, max: u64| -> u64 {
        let mut n = 0;
        while n < max && *next < total {
            if *next - *seen_tail == SLOTS {
                *seen_tail = tail.0.load(Ordering::Acquire);
                if *next - *seen_tail == SLOTS {
                    break;
                }
            }
            slots[(*next % SLOTS) as usize].store(*next, Ordering::Relaxed);
            *next += 1;
            head.0.store(*next, Ordering::Release);
            n += 1;
        }
        n
    };
    // Consumer step: read everything published; returns how many.
    let consume = |next: &mut u64, seen_head: &mut u64, sum: &mut u64| -> u64 {
        if *next == *seen_head {
            *seen_head = head.0.load(Ordering::Acquire);
        }
        let n = *seen_head - *next;
        while *next < *seen_head {
            *sum = sum.wrapping_add(slots[(*next % SLOTS) as usize].load(Ordering::Relaxed));
            *next += 1;
            tail.0.store(*next, Ordering::Release);
        }
        n
    };
    let (sent, received) = if threads == 1 {
        let (mut p, mut st, mut c, mut sh, mut sum) = (0, 0, 0, 0, 0);
        while p < total && Instant::now() < deadline {
            produce(&mut p, &mut st, 1024);
            consume(&mut c, &mut sh, &mut sum);
        }
        std::hint::black_box(sum);
        (p, c)
    } else {
        std::thread::scope(|s| {
            let consumer = s.spawn(move || {
                let (mut c, mut sh, mut sum) = (0, 0, 0);
                while c < total {
                    if consume(&mut c, &mut sh, &mut sum) == 0 {
                        if stop.load(Ordering::Acquire) && c == head.0.load(Ordering::Acquire) {
                            break;
                        }
                        std::hint::spin_loop();
                    }
                }
                std::hint::black_box(sum);
                c
            });
            let (mut p, mut st) = (0, 0);
            while p < total && Instant::now() < deadline {
                if produce(&mut p, &mut st, 1024) == 0 {
                    std::hint::spin_loop();
                }
            }
            stop.store(true, Ordering::Release);
            (p, consumer.join().unwrap_or(0))
        })
    };
    let elapsed = start.elapsed();
    let mode = if threads == 1 {
        "bare spsc 8B slots one thread"
    } else {
        "bare spsc 8B slots busy-poll"
    };
    let mut row = Row::new("floor", mode, 8);
    row.messages = sent;
    row.set_throughput(received, elapsed);
    row.lost = Some(sent - received);
    row.cpu_pct = Some(cpu.pct());
    row.options = Some(format!(
        "{SLOTS} AtomicU64 slots, cached positions, in-process"
    ));
    Ok(row)
}

/// `size`-byte messages over a Unix stream socket pair, one `write` each
/// or through a 64 KiB `BufWriter`: a row `uds`.
pub(crate) fn uds_msgs(size: usize, buffered: bool, limits: Limits) -> Result<Row, Box<dyn Error>> {
    let (tx, mut rx) = UnixStream::pair()?;
    let cpu = CpuMeter::start();
    let start = Instant::now();
    let reader = std::thread::spawn(move || -> (u64, Instant) {
        let mut buf = vec![0u8; 256 << 10];
        let (mut bytes, mut last) = (0u64, Instant::now());
        while let Ok(n) = rx.read(&mut buf) {
            if n == 0 {
                break;
            }
            bytes += n as u64;
            last = Instant::now();
        }
        (bytes, last)
    });
    let msg = vec![0xA5u8; size];
    let mut sent = 0u64;
    {
        let mut w: Box<dyn Write> = if buffered {
            Box::new(BufWriter::with_capacity(64 << 10, &tx))
        } else {
            Box::new(&tx)
        };
        while sent < limits.messages {
            if sent.is_multiple_of(1024) && start.elapsed() >= limits.duration {
                break;
            }
            w.write_all(&msg)?;
            sent += 1;
        }
        w.flush()?;
    }
    drop(tx);
    let (bytes, last) = reader.join().map_err(|_| "uds reader panicked")?;
    let received = bytes / size as u64;
    let mode = if buffered {
        "BufWriter 64KiB"
    } else {
        "write per msg"
    };
    let mut row = Row::new("uds", mode, size);
    row.messages = sent;
    row.set_throughput(received, last.duration_since(start));
    row.lost = Some(sent - received);
    row.cpu_pct = Some(cpu.pct());
    row.options = Some("std UnixStream::pair (SOCK_STREAM)".into());
    Ok(row)
}

/// Round trips of one `size`-byte message each way over a Unix stream
/// socket pair: a row `uds-pingpong`, `blocking`.
pub(crate) fn uds_pingpong(
    size: usize,
    limits: Limits,
    pb: &indicatif::ProgressBar,
) -> Result<Row, Box<dyn Error>> {
    let (mut a, mut b) = UnixStream::pair()?;
    let echo = std::thread::spawn(move || {
        let mut buf = vec![0u8; size];
        while b.read_exact(&mut buf).is_ok() {
            if b.write_all(&buf).is_err() {
                break;
            }
        }
    });
    let mut msg = vec![0xA5u8; size];
    let cpu = CpuMeter::start();
    let (hist, lost) = round_trips(limits, pb, || -> Result<bool, Box<dyn Error>> {
        a.write_all(&msg)?;
        a.read_exact(&mut msg)?;
        Ok(true)
    })?;
    drop(a);
    let _ = echo.join();
    let mut row = Row::new("uds-pingpong", "blocking", size);
    row.set_latency(&hist);
    row.lost = Some(lost);
    row.cpu_pct = Some(cpu.pct());
    row.options = Some("std UnixStream::pair".into());
    Ok(row)
}
