//! `skiff bench shm`: RocketBufs buffers over shared memory (`shm://`)
//! against a Unix domain socket (Rust std) and ZeroMQ `ipc://`, in one run.
//!
//! - `msgs`: `--messages` messages of each `--sizes` size from a producer
//!   thread to a consumer thread through one credit-flow buffer of
//!   `--buffer` bytes. Modes: one segment per message (`per-msg`: the cost
//!   of one deliver and one receive per message) and messages packed into
//!   segments of up to `--batch` bytes (`batch=…`: RocketBufs' batching,
//!   the application asks for a large segment), each with busy-poll
//!   (`spin=1s`) and futex wake-ups (`spin=0`). The Unix socket carries
//!   the same load one `write` per message and through a 64 KiB
//!   `BufWriter`; ZeroMQ PUSH/PULL over `ipc://` runs as a child process.
//!   `msg api more` rows send each message with the message layer
//!   (`Output::messages`, `send(msg, more)`; read with
//!   `InSegment::messages`): one call per message on each side, messages
//!   sharing segments of up to `--batch` bytes while `more` is set.
//! - `pingpong`: one message each way through two buffers, timed per round
//!   trip, busy-poll and futex; the Unix socket and ZeroMQ PAIR over
//!   `ipc://` likewise.
//!
//! Producer and consumer run as two threads of this process; the ring
//! files live in `--dir` (default `/dev/shm/skiff`) exactly as between two
//! processes, so the figures are those of the shared-memory path.
//!
//! `--transports shm,udp` also runs the same buffer tests over
//! `udp://127.0.0.1:0?reliable=true` (skiff associations on loopback,
//! credits end to end): rows `buf-udp` and `buf-udp-pingpong`, futex
//! wake-ups only (the tunnel's threads sit between the rings).

use std::error::Error;
use std::io::{BufWriter, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use skiff::shm::{Flow, InSegment, Input, Output};

use super::report::{self, CpuMeter, Reporter, Row};
use super::{parse_secs, parse_size, round_trips, Limits, OutputArgs};

/// The tests `skiff bench shm` can run.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Test {
    /// Message rate.
    Msgs,
    /// Round-trip latency.
    Pingpong,
}

/// Transports of the buffer tests.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// `shm://` (with the Unix socket and ZeroMQ baselines).
    Shm,
    /// `udp://127.0.0.1:0?reliable=true` (associations on loopback).
    Udp,
}

/// `skiff bench shm`
#[derive(clap::Args, Debug)]
pub(crate) struct ShmArgs {
    /// Transports the buffer tests run over.
    #[arg(long, value_delimiter = ',', value_enum, default_value = "shm")]
    pub(crate) transports: Vec<Transport>,
    /// Message sizes.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "8,4k")]
    pub(crate) sizes: Vec<usize>,
    /// Messages per rate test.
    #[arg(long, default_value_t = 20_000_000)]
    pub(crate) messages: u64,
    /// Round trips per ping-pong test (after up to 1000 of warm-up).
    #[arg(long, default_value_t = 50_000)]
    pub(crate) round_trips: u64,
    /// Longest time one test runs, in seconds.
    #[arg(long, value_parser = parse_secs, default_value = "5")]
    pub(crate) duration_secs: Duration,
    /// Buffer (ring) size.
    #[arg(long, value_parser = parse_size, default_value = "4m")]
    pub(crate) buffer: usize,
    /// Segment size of the batched mode.
    #[arg(long, value_parser = parse_size, default_value = "64k")]
    pub(crate) batch: usize,
    /// Directory of the ring files.
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
    /// The ZeroMQ peer (bench/zmq/build.sh builds it); by default
    /// target/zmq_bench, skipped with a note if missing.
    #[arg(long)]
    pub(crate) zmq: Option<PathBuf>,
    /// Tests to run.
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "msgs,pingpong"
    )]
    pub(crate) tests: Vec<Test>,
    /// Output format.
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

/// Busy-poll: spin this long before sleeping (longer than any gap).
const BUSY: &str = "1s";

impl ShmArgs {
    fn locator(&self, name: &str, spin: &str) -> String {
        let dir = self.dir.clone().unwrap_or_else(skiff::shm::default_dir);
        format!("shm://{name}?spin={spin}&dir={}", dir.display())
    }

    /// An output of `via` and the locator its input opens.
    fn open(
        &self,
        via: Transport,
        name: &str,
        spin: &str,
    ) -> Result<(Output, String), Box<dyn Error>> {
        match via {
            Transport::Shm => {
                let loc = self.locator(name, spin);
                Ok((Output::open(&loc)?, loc))
            }
            Transport::Udp => {
                let out = Output::open(&format!("udp://127.0.0.1:0?{UDP_OPTS}&spin={spin}"))?;
                let addr = out.local_addr().ok_or("udp output without an address")?;
                Ok((out, format!("udp://{addr}?{UDP_OPTS}&spin={spin}")))
            }
        }
    }
}

/// Options of the udp locators.
const UDP_OPTS: &str = "reliable=true";

/// The row names of `via`: rate test and round-trip test.
fn test_names(via: Transport) -> (&'static str, &'static str) {
    match via {
        Transport::Shm => ("shm", "shm-pingpong"),
        Transport::Udp => ("buf-udp", "buf-udp-pingpong"),
    }
}

/// Runs the tests asked for.
pub(crate) fn run(args: &ShmArgs, out: &mut Reporter) -> Result<(), Box<dyn Error>> {
    let show = out.progress_enabled();
    let zmq = zmq_path(args.zmq.as_deref());
    let limits = Limits {
        messages: args.messages,
        duration: args.duration_secs,
    };
    let shm = args.transports.contains(&Transport::Shm);
    if args.tests.contains(&Test::Msgs) {
        for &size in &args.sizes {
            for (via, spin, wake) in [
                (Transport::Shm, BUSY, "busy-poll"),
                (Transport::Shm, "0us", "futex"),
                (Transport::Udp, "0us", "futex"),
            ] {
                if !args.transports.contains(&via) {
                    continue;
                }
                for batch in [None, Some(args.batch.max(size))] {
                    let mode = match batch {
                        None => format!("per-msg {wake}"),
                        Some(b) => format!("batch={b}B {wake}"),
                    };
                    let pb =
                        report::spinner(show, &format!("{} {size} B {mode}", test_names(via).0));
                    let row = shm_msgs(args, via, size, batch, spin, &mode, limits);
                    pb.finish_and_clear();
                    out.push(row?)?;
                }
            }
            if !shm {
                continue;
            }
            // Messages packed by the message layer: one send and one read
            // per message, `more` set while the stream goes on.
            for (spin, wake) in [(BUSY, "busy-poll"), ("0us", "futex")] {
                let mode = format!("msg api more {wake}");
                let pb = report::spinner(show, &format!("shm {size} B {mode}"));
                let row = shm_msg_api(args, size, spin, &mode, limits);
                pb.finish_and_clear();
                out.push(row?)?;
            }
            // The per-message software cost without a second core: one
            // thread alternates segment+deliver and recv+consumed.
            let pb = report::spinner(show, &format!("shm {size} B per-msg one thread"));
            let row = shm_one_thread(args, size, limits);
            pb.finish_and_clear();
            out.push(row?)?;
            if size == 8 {
                // The floor of the hardware and the scheduler here: a bare
                // ring of 8-byte slots, nothing but one release store per
                // message and cached peer positions.
                for threads in [2, 1] {
                    let pb = report::spinner(show, &format!("spsc floor {threads} thread(s)"));
                    let row = spsc_floor(threads, limits);
                    pb.finish_and_clear();
                    out.push(row?)?;
                }
            }
            for buffered in [false, true] {
                let pb = report::spinner(show, &format!("uds {size} B"));
                let row = uds_msgs(size, buffered, limits);
                pb.finish_and_clear();
                out.push(row?)?;
            }
            if let Some(z) = &zmq {
                let pb = report::spinner(show, &format!("zmq ipc {size} B"));
                let rows = zmq_rows(z, size, limits.messages, limits.duration, "ipc");
                pb.finish_and_clear();
                for r in rows? {
                    out.push(r)?;
                }
            }
        }
    }
    if args.tests.contains(&Test::Pingpong) {
        let limits = Limits {
            messages: args.round_trips,
            duration: args.duration_secs,
        };
        for &size in &args.sizes {
            for (via, spin, wake) in [
                (Transport::Shm, BUSY, "busy-poll"),
                (Transport::Shm, "0us", "futex"),
                (Transport::Udp, "0us", "futex"),
            ] {
                if !args.transports.contains(&via) {
                    continue;
                }
                let what = format!("{} {wake}", test_names(via).1);
                let pb = report::progress(show, limits.messages, &what);
                let row = shm_pingpong(args, via, size, spin, wake, limits, &pb);
                pb.finish_and_clear();
                out.push(row?)?;
            }
            if !shm {
                continue;
            }
            let pb = report::progress(show, limits.messages, "uds pingpong");
            let row = uds_pingpong(size, limits, &pb);
            pb.finish_and_clear();
            out.push(row?)?;
            if let Some(z) = &zmq {
                let rows = zmq_rows(z, size, limits.messages, limits.duration, "ipc-pingpong");
                for r in rows? {
                    out.push(r)?;
                }
            }
        }
    }
    Ok(())
}

/// A unique ring name for one test.
fn name(what: &str) -> String {
    format!("bench-{what}-{}", std::process::id())
}

fn shm_msgs(
    args: &ShmArgs,
    via: Transport,
    size: usize,
    batch: Option<usize>,
    spin: &str,
    mode: &str,
    limits: Limits,
) -> Result<Row, Box<dyn Error>> {
    let (mut out, loc) = args.open(via, &name("msgs"), spin)?;
    let buffer = args.buffer.max(batch.unwrap_or(size) * 2);
    out.create_buffer(1, buffer, Flow::Credits)?;
    let mut input = Input::open(&loc)?;
    input.subscribe(1, buffer)?;
    let per_seg = batch.map_or(1, |b| (b / size).max(1)) as u64;
    let cpu = CpuMeter::start();
    let start = Instant::now();
    let (sent, received, last) =
        std::thread::scope(|s| -> Result<_, Box<dyn Error + Send + Sync>> {
            let consumer = s.spawn(move || {
                drain(input, |seg| {
                    // Touch every message as a consumer would.
                    let (a, b) = seg.slices().map_err(|e| e.to_string())?;
                    for m in a.chunks(size).chain(b.chunks(size)) {
                        std::hint::black_box(m.first());
                    }
                    Ok((seg.len() / size) as u64)
                })
            });
            let payload = vec![0xA5u8; size * per_seg as usize];
            let mut sent = 0u64;
            while sent < limits.messages {
                if sent.is_multiple_of(1024) && start.elapsed() >= limits.duration {
                    break;
                }
                let k = per_seg.min(limits.messages - sent) as usize;
                let mut seg = out.segment(1, k * size, true)?;
                // Each message written on its own, as an application
                // packing messages into a segment would.
                for i in 0..k {
                    seg.write(i * size, &payload[i * size..(i + 1) * size]);
                }
                out.deliver(seg, k * size)?;
                sent += k as u64;
            }
            drop(out);
            let (received, last) = consumer
                .join()
                .map_err(|_| "consumer panicked".to_string())??;
            Ok((sent, received, last))
        })
        .map_err(|e| e.to_string())?;
    let mut row = Row::new(test_names(via).0, mode, size);
    row.messages = sent;
    row.set_throughput(received, last.duration_since(start));
    row.lost = Some(sent - received);
    row.cpu_pct = Some(cpu.pct());
    row.options = Some(format!("{loc} buffer={}", args.buffer));
    Ok(row)
}

/// A rate test's consumer: receives segments of buffer 1 until the
/// producer closes it (or nothing comes for 2 s), counts the messages of
/// each with `count`, consumes it; returns the count and when the last
/// segment arrived.
fn drain(
    mut input: Input,
    mut count: impl FnMut(&InSegment<'_>) -> Result<u64, String>,
) -> Result<(u64, Instant), String> {
    let mut n = 0u64;
    let mut last = Instant::now();
    loop {
        let seg = match input.recv(Some(Duration::from_secs(2))) {
            Ok(Some(seg)) => seg,
            Ok(None) => return Ok((n, last)),
            Err(skiff::shm::BufferError::Closed { .. }) => return Ok((n, last)),
            Err(e) => return Err(e.to_string()),
        };
        let len = seg.len();
        n += count(&seg)?;
        last = Instant::now();
        input.consumed(1, len).map_err(|e| e.to_string())?;
    }
}

/// The message layer (`Output::messages`, `InSegment::messages`): the
/// producer sends each message with `more` (a stream; the last without),
/// so messages share segments of up to `--batch` bytes; the consumer reads
/// every message in place. Each message is still its own call on each side.
fn shm_msg_api(
    args: &ShmArgs,
    size: usize,
    spin: &str,
    mode: &str,
    limits: Limits,
) -> Result<Row, Box<dyn Error>> {
    let (mut out, loc) = args.open(Transport::Shm, &name("msgapi"), spin)?;
    let buffer = args.buffer.max(args.batch * 2);
    out.create_buffer(1, buffer, Flow::Credits)?;
    let mut input = Input::open(&loc)?;
    input.subscribe(1, buffer)?;
    let cpu = CpuMeter::start();
    let start = Instant::now();
    let (sent, received, segments, last) =
        std::thread::scope(|s| -> Result<_, Box<dyn Error + Send + Sync>> {
            let consumer = s.spawn(move || {
                drain(input, |seg| {
                    let mut n = 0;
                    for m in seg.messages().map_err(|e| e.to_string())? {
                        let m = m.map_err(|e| e.to_string())?;
                        std::hint::black_box(m.first());
                        n += 1;
                    }
                    Ok(n)
                })
            });
            let payload = vec![0xA5u8; size];
            let mut sent = 0u64;
            let mut w = out.messages(1, args.batch, true)?;
            while sent < limits.messages {
                if sent.is_multiple_of(1024) && start.elapsed() >= limits.duration {
                    break;
                }
                w.send(&payload, sent + 1 < limits.messages)?;
                sent += 1;
            }
            w.flush()?;
            let segments = w.counts().1;
            drop(w);
            drop(out);
            let (received, last) = consumer
                .join()
                .map_err(|_| "consumer panicked".to_string())??;
            Ok((sent, received, segments, last))
        })
        .map_err(|e| e.to_string())?;
    let mut row = Row::new("shm", mode, size);
    row.messages = sent;
    row.set_throughput(received, last.duration_since(start));
    row.lost = Some(sent - received);
    row.batches = Some(segments);
    row.cpu_pct = Some(cpu.pct());
    row.options = Some(format!(
        "{loc} buffer={buffer} batch={}B, one send and one read per message",
        args.batch
    ));
    Ok(row)
}

/// One thread, one buffer: up to 1024 segments of one message each are
/// delivered, then received and consumed one by one; repeated. No second
/// core, no cache-line transfers: what the calls themselves cost.
fn shm_one_thread(args: &ShmArgs, size: usize, limits: Limits) -> Result<Row, Box<dyn Error>> {
    let loc = args.locator(&name("one"), "0us");
    let mut out = Output::open(&loc)?;
    let buffer = args.buffer.max(size * 2);
    out.create_buffer(1, buffer, Flow::Credits)?;
    let mut input = Input::open(&loc)?;
    input.subscribe(1, buffer)?;
    let payload = vec![0xA5u8; size];
    let cpu = CpuMeter::start();
    let start = Instant::now();
    let (mut sent, mut received) = (0u64, 0u64);
    while sent < limits.messages && start.elapsed() < limits.duration {
        let round = 1024.min(limits.messages - sent);
        for _ in 0..round {
            let mut seg = match out.segment(1, size, false) {
                Ok(seg) => seg,
                Err(e) if e.is_would_block() => break,
                Err(e) => return Err(e.into()),
            };
            seg.write(0, &payload);
            out.deliver(seg, size)?;
            sent += 1;
        }
        while let Some(seg) = input.try_recv()? {
            let len = seg.len();
            let (a, _) = seg.slices()?;
            std::hint::black_box(a.first());
            received += 1;
            input.consumed(1, len)?;
        }
    }
    let mut row = Row::new("shm", "per-msg one thread", size);
    row.messages = sent;
    row.set_throughput(received, start.elapsed());
    row.lost = Some(sent - received);
    row.cpu_pct = Some(cpu.pct());
    row.options = Some(format!("{loc} buffer={buffer}, rounds of 1024"));
    Ok(row)
}

/// A bare single-producer single-consumer ring of 65536 8-byte slots in
/// process memory (no validation, no records, no wake-ups): the producer
/// caches the consumer's position and re-reads it only when the ring
/// looks full, the consumer caches the producer's and reads every slot
/// below it; one release store per message on each side. With
/// `threads == 1` one thread alternates rounds of 1024.
fn spsc_floor(threads: usize, limits: Limits) -> Result<Row, Box<dyn Error>> {
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

fn uds_msgs(size: usize, buffered: bool, limits: Limits) -> Result<Row, Box<dyn Error>> {
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

fn shm_pingpong(
    args: &ShmArgs,
    via: Transport,
    size: usize,
    spin: &str,
    wake: &str,
    limits: Limits,
    pb: &indicatif::ProgressBar,
) -> Result<Row, Box<dyn Error>> {
    let (mut ping_out, ping) = args.open(via, &name("ping"), spin)?;
    ping_out.create_buffer(1, 1 << 16, Flow::Credits)?;
    let (mut pong_out, pong) = args.open(via, &name("pong"), spin)?;
    pong_out.create_buffer(2, 1 << 16, Flow::Credits)?;
    let mut ping_in = Input::open(&ping)?;
    ping_in.subscribe(1, 1 << 16)?;
    let mut pong_in = Input::open(&pong)?;
    pong_in.subscribe(2, 1 << 16)?;
    let echo = std::thread::spawn(move || {
        let mut buf = Vec::new();
        while let Ok(Some(seg)) = ping_in.recv(Some(Duration::from_secs(2))) {
            buf.clear();
            seg.copy_to(&mut buf);
            let len = seg.len();
            if ping_in.consumed(1, len).is_err() || pong_out.send(2, &buf, true).is_err() {
                break;
            }
        }
    });
    let msg = vec![0xA5u8; size];
    let cpu = CpuMeter::start();
    let (hist, lost) = round_trips(limits, pb, || -> Result<bool, Box<dyn Error>> {
        ping_out.send(1, &msg, true)?;
        let got = match pong_in.recv(Some(Duration::from_secs(1)))? {
            Some(seg) => seg.len(),
            None => return Ok(false),
        };
        pong_in.consumed(2, got)?;
        Ok(true)
    })?;
    drop(ping_out);
    let _ = echo.join();
    let mut row = Row::new(test_names(via).1, wake, size);
    row.set_latency(&hist);
    row.lost = Some(lost);
    row.cpu_pct = Some(cpu.pct());
    row.options = Some(ping);
    Ok(row)
}

fn uds_pingpong(
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

/// The ZeroMQ peer: `explicit`, else target/zmq_bench beside this binary
/// or under the current directory; `None` with a note if missing.
fn zmq_path(explicit: Option<&Path>) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = explicit.into_iter().map(Path::to_path_buf).collect();
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        candidates.push(PathBuf::from(dir).join("zmq_bench"));
    }
    if let Some(t) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent().map(Path::to_path_buf))
    {
        candidates.push(t.join("zmq_bench"));
    }
    candidates.push(PathBuf::from("target/zmq_bench"));
    let found = candidates.into_iter().find(|p| p.is_file());
    if found.is_none() {
        eprintln!("note: zmq rows skipped: zmq_bench not found (run bench/zmq/build.sh or pass --zmq PATH)");
    }
    found
}

/// Runs the ZeroMQ peer in `transport` mode (`ipc` or `ipc-pingpong`).
fn zmq_rows(
    path: &Path,
    size: usize,
    messages: u64,
    duration: Duration,
    transport: &str,
) -> Result<Vec<Row>, Box<dyn Error>> {
    let output = Command::new(path)
        .args([
            size.to_string(),
            messages.to_string(),
            format!("{}", duration.as_secs_f64()),
            "1".into(),
            // One context: with two, libzmq 4.3.4's ipc PUSH/PULL in this
            // harness stalled before the end marker (not investigated).
            "1".into(),
            transport.into(),
        ])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", path.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} failed ({}): {}",
            path.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    let rows = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str::<Row>(l).map_err(|e| format!("bad row: {e}: {l}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

/// The targets: at least 30 M 8-byte messages/s over shm, and a
/// busy-poll round trip p50 of at most 2 µs; with the ZeroMQ ipc ratio.
pub(crate) fn targets(rows: &[Row]) -> Vec<String> {
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let mut notes = Vec::new();
    // `keep` picks the rows (by mode) a figure may come from.
    let best = |test: &str, size: usize, keep: &dyn Fn(&str) -> bool| {
        rows.iter()
            .filter(|r| r.test == test && r.size == size && keep(&r.mode))
            .filter_map(|r| r.msgs_per_s.map(|m| (m, r.mode.clone())))
            .max_by(|a, b| a.0.total_cmp(&b.0))
    };
    let zmq = best("zmq-ipc", 8, &|_| true).filter(|z| z.0 > 0.0);
    // The verdict counts one send and one read per message across two
    // threads (the message layer, as ZeroMQ's own sends are one call per
    // message and batched inside); a segment per message and the bare
    // packed segments are shown beside it (one thread alone is a cost
    // measure, not a rate).
    let api = |m: &str| m.starts_with("msg api");
    if let Some((m, mode)) = best("shm", 8, &api) {
        notes.push(format!(
            "target: >= 30M 8 B msgs/s over shm, one send and one read per message: {} ({mode}): {}{}",
            report::si(m),
            verdict(m >= 30e6),
            zmq.as_ref()
                .map_or(String::new(), |(z, _)| format!(", {:.1}x zmq ipc", m / z))
        ));
    }
    if let Some((m, mode)) = best("shm", 8, &|m: &str| api(m) && m.contains("futex")) {
        notes.push(format!(
            "the same with futex wake-ups: {} ({mode})",
            report::si(m)
        ));
    }
    let per_msg = |m: &str| m.starts_with("per-msg") && !m.contains("one thread");
    if let Some((m, mode)) = best("shm", 8, &per_msg) {
        notes.push(format!(
            "one segment per message (no packing): {} ({mode}){}",
            report::si(m),
            zmq.as_ref()
                .map_or(String::new(), |(z, _)| format!(", {:.1}x zmq ipc", m / z))
        ));
    }
    if let Some((m, mode)) = best("shm", 8, &|m: &str| m.starts_with("batch")) {
        notes.push(format!(
            "8 B messages packed into segments: {} ({mode}){}",
            report::si(m),
            zmq.as_ref()
                .map_or(String::new(), |(z, _)| format!(", {:.1}x zmq ipc", m / z))
        ));
    }
    if let Some(p50) = rows
        .iter()
        .find(|r| r.test == "shm-pingpong" && r.mode == "busy-poll" && r.size == 8)
        .and_then(|r| r.p50_us)
    {
        notes.push(format!(
            "target: busy-poll round trip p50 <= 2 us at 8 B: {p50:.2} us: {}",
            verdict(p50 <= 2.0)
        ));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(test: &str, mode: &str, size: usize, rate: f64) -> Row {
        Row {
            msgs_per_s: Some(rate),
            ..Row::new(test, mode, size)
        }
    }

    #[test]
    fn rate_verdict_counts_one_send_and_one_read_per_message() {
        let rows = [
            row("shm", "per-msg busy-poll", 8, 4e6),
            row("shm", "per-msg one thread", 8, 40e6),
            row("shm", "batch=65536B busy-poll", 8, 200e6),
            row("shm", "msg api more busy-poll", 8, 20e6),
            row("shm", "msg api more futex", 8, 10e6),
            row("zmq-ipc", "push-pull-ipc", 8, 4e6),
        ];
        let t = targets(&rows);
        // The best message-layer row decides; packed segments and one
        // thread alone never do.
        assert!(
            t[0].contains("one send and one read per message")
                && t[0].contains("20.00 M")
                && t[0].contains("NOT met")
                && t[0].ends_with("5.0x zmq ipc"),
            "{t:?}"
        );
        assert!(t[1].contains("futex") && t[1].contains("10.00 M"), "{t:?}");
        assert!(
            t[2].contains("one segment per message") && t[2].contains("1.0x"),
            "{t:?}"
        );
        assert!(t[3].contains("200.0 M") && t[3].contains("50.0x"), "{t:?}");
        let fast = [row("shm", "msg api more busy-poll", 8, 31e6)];
        assert!(targets(&fast)[0].contains(": met"), "{:?}", targets(&fast));
        // Without message-layer rows there is no verdict to give.
        let segs = [row("shm", "per-msg busy-poll", 8, 40e6)];
        assert!(targets(&segs)
            .iter()
            .all(|l| !l.starts_with("target: >= 30M")));
    }
}
