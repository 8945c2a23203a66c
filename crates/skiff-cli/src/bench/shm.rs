//! `skiff bench shm`: RocketBufs buffers over shared memory (`shm://`),
//! in one run.
//!
//! - `msgs`: `--messages` messages of each `--sizes` size from a producer
//!   thread to a consumer thread through one credit-flow buffer of
//!   `--buffer` bytes. Modes: one segment per message (`per-msg`: the cost
//!   of one deliver and one receive per message) and messages packed into
//!   segments of up to `--batch` bytes (`batch=…`: RocketBufs' batching,
//!   the application asks for a large segment), each with busy-poll
//!   (`spin=1s`) and futex wake-ups (`spin=0`). `msg api more` rows send
//!   each message with the message layer (`Output::messages`,
//!   `send(msg, more)`; read with `InSegment::messages`): one call per
//!   message on each side, messages sharing segments of up to `--batch`
//!   bytes while `more` is set. `per-msg one thread`: one thread
//!   alternates segment+deliver and recv+consumed, the per-message cost
//!   without a second core.
//! - `pingpong`: one message each way through two buffers, timed per round
//!   trip, busy-poll and futex.
//! - `relay`: three threads and two buffers, as a node between an shm
//!   publisher and a subscriber of the topic's buffer, with no routing: a
//!   producer sends each message with the message layer (`more` set), a
//!   relay thread reads each segment's messages in place and sends each
//!   into the second buffer (one segment out per segment in), a consumer
//!   reads every message. What a 1→1 shm fan-out could reach on this
//!   machine's cores with skiff's own rings (the `relay` rows, busy-poll
//!   and futex).
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
use std::path::PathBuf;
use std::time::{Duration, Instant};

use skiff::shm::{Flow, InSegment, Input, MsgWriter, Output};

use super::report::{self, CpuMeter, Reporter, Row};
use super::{parse_secs, parse_size, round_trips, Limits, OutputArgs};

/// The tests `skiff bench shm` can run.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// Message rate.
    Msgs,
    /// Round-trip latency.
    Pingpong,
    /// A relay between two buffers: the floor of a node's shm fan-out.
    Relay,
}

/// Transports of the buffer tests.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `shm://`.
    Shm,
    /// `udp://127.0.0.1:0?reliable=true` (associations on loopback).
    Udp,
}

/// `skiff bench shm`
#[derive(clap::Args, Debug)]
pub struct ShmArgs {
    /// What to measure and how.
    #[command(flatten)]
    pub params: ShmParams,
    /// Output format.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// The shared-memory benchmark's settings, shared with skiff-bench.
#[derive(clap::Args, Debug, Clone)]
pub struct ShmParams {
    /// Transports the buffer tests run over.
    #[arg(long, value_delimiter = ',', value_enum, default_value = "shm")]
    pub transports: Vec<Transport>,
    /// Message sizes.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "8,4k")]
    pub sizes: Vec<usize>,
    /// Messages per rate test.
    #[arg(long, default_value_t = 20_000_000)]
    pub messages: u64,
    /// Round trips per ping-pong test (after up to 1000 of warm-up).
    #[arg(long, default_value_t = 50_000)]
    pub round_trips: u64,
    /// Longest time one test runs, in seconds.
    #[arg(long, value_parser = parse_secs, default_value = "5")]
    pub duration_secs: Duration,
    /// Buffer (ring) size.
    #[arg(long, value_parser = parse_size, default_value = "4m")]
    pub buffer: usize,
    /// Segment size of the batched mode.
    #[arg(long, value_parser = parse_size, default_value = "64k")]
    pub batch: usize,
    /// Directory of the ring files.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Tests to run.
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "msgs,pingpong"
    )]
    pub tests: Vec<Test>,
}

/// Busy-poll: spin this long before sleeping (longer than any gap).
const BUSY: &str = "1s";

impl ShmParams {
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

    /// Whether the buffer tests run over `shm://` (rather than only udp).
    pub fn over_shm(&self) -> bool {
        self.transports.contains(&Transport::Shm)
    }

    /// Whether test `t` is asked for.
    pub fn wants(&self, t: Test) -> bool {
        self.tests.contains(&t)
    }

    /// When a rate test stops.
    pub fn msgs_limits(&self) -> Limits {
        Limits {
            messages: self.messages,
            duration: self.duration_secs,
        }
    }

    /// When a ping-pong test stops.
    pub fn pingpong_limits(&self) -> Limits {
        Limits {
            messages: self.round_trips,
            duration: self.duration_secs,
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

/// The transports, spin settings and wake-up names the tests run in turn.
const WAKES: [(Transport, &str, &str); 3] = [
    (Transport::Shm, BUSY, "busy-poll"),
    (Transport::Shm, "0us", "futex"),
    (Transport::Udp, "0us", "futex"),
];

/// Measures and reports the rate rows of `size`: each transport and wake-up
/// one segment per message and batched; over shm also the message layer
/// and one thread alone.
pub fn msgs_rows(p: &ShmParams, size: usize, out: &mut Reporter) -> Result<(), Box<dyn Error>> {
    let show = out.progress_enabled();
    let limits = p.msgs_limits();
    for (via, spin, wake) in WAKES {
        if !p.transports.contains(&via) {
            continue;
        }
        for batch in [None, Some(p.batch.max(size))] {
            let mode = match batch {
                None => format!("per-msg {wake}"),
                Some(b) => format!("batch={b}B {wake}"),
            };
            let pb = report::spinner(show, &format!("{} {size} B {mode}", test_names(via).0));
            let row = msgs(p, via, size, batch, spin, &mode, limits);
            pb.finish_and_clear();
            out.push(row?)?;
        }
    }
    if !p.over_shm() {
        return Ok(());
    }
    // Messages packed by the message layer: one send and one read per
    // message, `more` set while the stream goes on.
    for (spin, wake) in [(BUSY, "busy-poll"), ("0us", "futex")] {
        let mode = format!("msg api more {wake}");
        let pb = report::spinner(show, &format!("shm {size} B {mode}"));
        let row = msg_api(p, size, spin, &mode, limits);
        pb.finish_and_clear();
        out.push(row?)?;
    }
    // The per-message software cost without a second core: one thread
    // alternates segment+deliver and recv+consumed.
    let pb = report::spinner(show, &format!("shm {size} B per-msg one thread"));
    let row = one_thread(p, size, limits);
    pb.finish_and_clear();
    out.push(row?)?;
    Ok(())
}

/// Measures and reports the ping-pong rows of `size`, each transport and
/// wake-up.
pub fn pingpong_rows(p: &ShmParams, size: usize, out: &mut Reporter) -> Result<(), Box<dyn Error>> {
    let show = out.progress_enabled();
    let limits = p.pingpong_limits();
    for (via, spin, wake) in WAKES {
        if !p.transports.contains(&via) {
            continue;
        }
        let what = format!("{} {wake}", test_names(via).1);
        let pb = report::progress(show, limits.messages, &what);
        let row = pingpong(p, via, size, spin, wake, limits, &pb);
        pb.finish_and_clear();
        out.push(row?)?;
    }
    Ok(())
}

/// Runs the tests asked for.
pub fn run(args: &ShmArgs, out: &mut Reporter) -> Result<(), Box<dyn Error>> {
    let p = &args.params;
    if p.wants(Test::Msgs) {
        for &size in &p.sizes {
            msgs_rows(p, size, out)?;
        }
    }
    if p.wants(Test::Pingpong) {
        for &size in &p.sizes {
            pingpong_rows(p, size, out)?;
        }
    }
    if p.wants(Test::Relay) {
        for &size in &p.sizes {
            relay_rows(p, size, out)?;
        }
    }
    Ok(())
}

/// Measures and reports the relay rows of `size`: the node's spin (100
/// µs) and futex wake-ups only.
pub fn relay_rows(p: &ShmParams, size: usize, out: &mut Reporter) -> Result<(), Box<dyn Error>> {
    let show = out.progress_enabled();
    for (spin, wake) in [("100us", "spin=100us"), ("0us", "futex")] {
        let mode = format!("relay {wake}");
        let pb = report::spinner(show, &format!("shm {size} B {mode}"));
        let row = relay(p, size, spin, &mode, p.msgs_limits());
        pb.finish_and_clear();
        out.push(row?)?;
    }
    Ok(())
}

/// Producer → buffer → relay thread → buffer → consumer: the relay reads
/// each segment's messages in place and sends each into the second
/// buffer, delivering once per segment read (see the module doc).
fn relay(
    args: &ShmParams,
    size: usize,
    spin: &str,
    mode: &str,
    limits: Limits,
) -> Result<Row, Box<dyn Error>> {
    let buffer = args.buffer.max(args.batch * 2);
    let up_loc = args.locator(&name("relay-up"), spin);
    let down_loc = args.locator(&name("relay-down"), spin);
    let mut up = Output::open(&up_loc)?;
    up.create_buffer(1, buffer, Flow::Credits)?;
    let mut up_in = Input::open(&up_loc)?;
    up_in.subscribe(1, buffer)?;
    let mut down = Output::open(&down_loc)?;
    down.create_buffer(1, buffer, Flow::Credits)?;
    let mut down_in = Input::open(&down_loc)?;
    down_in.subscribe(1, buffer)?;
    let batch = args.batch;
    let cpu = CpuMeter::start();
    let start = Instant::now();
    let (sent, received, last) =
        std::thread::scope(|s| -> Result<_, Box<dyn Error + Send + Sync>> {
            let consumer = s.spawn(move || drain(down_in, touch_messages));
            let relay = s.spawn(move || -> Result<u64, String> {
                let mut w = down.messages(1, batch, true).map_err(|e| e.to_string())?;
                let mut n = 0u64;
                loop {
                    let seg = match up_in.recv(Some(Duration::from_secs(2))) {
                        Ok(Some(seg)) => seg,
                        Ok(None) | Err(skiff::shm::BufferError::Closed { .. }) => break,
                        Err(e) => return Err(e.to_string()),
                    };
                    let len = seg.len();
                    for m in seg.messages().map_err(|e| e.to_string())? {
                        let m = m.map_err(|e| e.to_string())?;
                        w.send(&m, true).map_err(|e| e.to_string())?;
                        n += 1;
                    }
                    w.flush().map_err(|e| e.to_string())?;
                    up_in.consumed(1, len).map_err(|e| e.to_string())?;
                }
                drop(w);
                drop(down);
                Ok(n)
            });
            let mut w = up.messages(1, batch, true)?;
            let sent = send_messages(&mut w, size, limits, start)?;
            drop(w);
            drop(up);
            relay.join().map_err(|_| "relay panicked".to_string())??;
            let (received, last) = consumer
                .join()
                .map_err(|_| "consumer panicked".to_string())??;
            Ok((sent, received, last))
        })
        .map_err(|e| e.to_string())?;
    let mut row = Row::new("shm", mode, size);
    row.messages = sent;
    row.set_throughput(received, last.duration_since(start));
    row.lost = Some(sent - received);
    row.cpu_pct = Some(cpu.pct());
    // All three threads' CPU time per message: what 2 cores divide.
    let per_msg = cpu.elapsed().0.as_nanos() as f64 / received.max(1) as f64;
    row.options = Some(format!(
        "producer -> relay -> consumer, buffers {buffer} B, batch={batch}B, {per_msg:.0} ns CPU per message"
    ));
    Ok(row)
}

/// A unique ring name for one test.
fn name(what: &str) -> String {
    format!("bench-{what}-{}", std::process::id())
}

/// The rate of `size`-byte messages through one buffer over `via`, one
/// segment per message or packed into segments of `batch` bytes: a row
/// `shm` or `buf-udp`, `mode`.
fn msgs(
    args: &ShmParams,
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

/// Reads every message of a segment in place, as a consumer would: the
/// consumer side of the message-layer rows.
fn touch_messages(seg: &InSegment<'_>) -> Result<u64, String> {
    let mut n = 0;
    for m in seg.messages().map_err(|e| e.to_string())? {
        let m = m.map_err(|e| e.to_string())?;
        std::hint::black_box(m.first());
        n += 1;
    }
    Ok(n)
}

/// Sends `size`-byte messages through `w` as a stream (each with `more`
/// but the last) until the limits, then flushes: the producer side of the
/// message-layer rows. Returns how many were sent.
fn send_messages(
    w: &mut MsgWriter<'_>,
    size: usize,
    limits: Limits,
    start: Instant,
) -> Result<u64, Box<dyn Error + Send + Sync>> {
    let payload = vec![0xA5u8; size];
    let mut sent = 0u64;
    while sent < limits.messages {
        if sent.is_multiple_of(1024) && start.elapsed() >= limits.duration {
            break;
        }
        w.send(&payload, sent + 1 < limits.messages)?;
        sent += 1;
    }
    w.flush()?;
    Ok(sent)
}

/// The message layer (`Output::messages`, `InSegment::messages`): the
/// producer sends each message with `more` (a stream; the last without),
/// so messages share segments of up to `--batch` bytes; the consumer reads
/// every message in place. Each message is still its own call on each side.
fn msg_api(
    args: &ShmParams,
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
            let consumer = s.spawn(move || drain(input, touch_messages));
            let mut w = out.messages(1, args.batch, true)?;
            let sent = send_messages(&mut w, size, limits, start)?;
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
fn one_thread(args: &ShmParams, size: usize, limits: Limits) -> Result<Row, Box<dyn Error>> {
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

/// Round trips of one `size`-byte message each way through two buffers
/// over `via`: a row `shm-pingpong` or `buf-udp-pingpong`, `wake`.
fn pingpong(
    args: &ShmParams,
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
