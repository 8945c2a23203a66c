//! `skiff bench queue`: the batched datagram queue against its floors, in
//! one run.
//!
//! Throughput rows, at every size in `--sizes` (interleaved by size, so the
//! rows compared at one size ran close together in time):
//! - `queue` in each `--modes` mode: a sender thread pushes `--messages`
//!   messages (or as many as fit in `--duration-secs`) and flushes; the
//!   receiver pops until it has them all or nothing arrives for a quiet
//!   period. msgs/s is messages received over the time from the start to
//!   the last one received; what never arrived is `lost`, what the queues
//!   dropped and counted (kernel buffer overflow in datagrams, full send
//!   backlog in messages, …) is `dropped`. The sender keeps at most
//!   `--window` messages in flight ([`Window`]), so the row shows what the
//!   receiver sustains; `--window 0` is open loop.
//! - `udp`: one datagram per message ([`super::baseline`]).
//! - `zmq`: ZeroMQ PUSH/PULL over TCP, run as a child process
//!   (`bench/zmq/build.sh` builds it).
//!
//! Latency rows, at every size in `--latency-sizes`: `queue-pingpong` in
//! each mode (one message each way, no `flush`: with natural batching a
//! lone message leaves at once; with `timeout=200ms` it waits for the
//! timeout on both sides, which is what the row is there to show) and
//! `udp-pingpong`, the floor: `blocking` (connected sockets, the bar the
//! targets use), `queue-calls` and `unconnected` (see [`super::baseline`]).
//! Both sides of every ping-pong row run on one
//! CPU (`--latency-cpu`, shown in the row's options): a round trip then
//! measures the software, not where the scheduler happened to wake the
//! echo thread (on a virtual machine a wake-up on the other, idle CPU costs
//! tens of microseconds, and which one happens changes from run to run).
//!
//! The ping-pong rows of one size run interleaved
//! ([`super::interleaved_round_trips`]): all are set up and warmed up
//! first, then timed in `--rounds` rounds, each row running its share of
//! the round trips in turn, in an order rotated every round. The targets
//! are ratios of rows, and a virtual machine's speed drifts by about 10%
//! over seconds: rows run one after another would each see a different
//! machine, interleaved they see the same one.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use indicatif::ProgressBar;
use skiff::{Message, Queue};

use super::report::{self, CpuMeter, Reporter, Row};
use super::{
    baseline, parse_secs, parse_size, time_interleaved, Exchange, Limits, OutputArgs, PingPong,
    Window, QUIET, STALL,
};

/// The tests `skiff bench queue` can run.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Test {
    /// skiff queue throughput, in each mode.
    Queue,
    /// One UDP datagram per message.
    Udp,
    /// ZeroMQ PUSH/PULL over TCP.
    Zmq,
    /// skiff queue ping-pong latency, in each mode.
    QueuePingpong,
    /// Plain UDP ping-pong latency.
    UdpPingpong,
}

/// `skiff bench queue`
#[derive(clap::Args, Debug)]
pub(crate) struct QueueArgs {
    /// Message sizes of the throughput tests, in bytes (`4k` = 4096).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "8,64,512,4096,16384")]
    pub(crate) sizes: Vec<usize>,
    /// Messages per throughput test.
    #[arg(long, default_value_t = 10_000_000)]
    pub(crate) messages: u64,
    /// Longest time a throughput test sends, or a ping-pong test times
    /// round trips, in seconds; whichever of this and the count comes first
    /// ends the test.
    #[arg(long, value_parser = parse_secs, default_value = "3")]
    pub(crate) duration_secs: Duration,
    /// Round trips per ping-pong test (after 1000 of warm-up).
    #[arg(long, default_value_t = 20_000)]
    pub(crate) round_trips: u64,
    /// Rounds the ping-pong rows of one size are timed in: each round,
    /// every row runs its share of --round-trips (and of --duration-secs)
    /// in turn, so the rows compared see the same machine.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) rounds: u64,
    /// Message sizes of the ping-pong tests.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "8")]
    pub(crate) latency_sizes: Vec<usize>,
    /// Queue batching modes: `natural` (timeout=0), `paper`
    /// (qthresh=512&timeout=200ms, CMQ's setting), `max` (qthresh at the
    /// datagram size, timeout=1ms), or any locator options joined by `&`.
    #[arg(long, value_delimiter = ',', default_value = "natural,paper")]
    pub(crate) modes: Vec<String>,
    /// Tests to run.
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "queue,udp,zmq,queue-pingpong,udp-pingpong"
    )]
    pub(crate) tests: Vec<Test>,
    /// The ZeroMQ peer (bench/zmq/build.sh builds it); by default
    /// target/zmq_bench is looked for beside this binary and under the
    /// current directory, and the zmq rows are skipped with a note if it is
    /// not found.
    #[arg(long, value_name = "PATH")]
    pub(crate) zmq: Option<PathBuf>,
    /// Socket send and receive buffer sizes for the queue and UDP tests
    /// (the kernel caps them at net.core.rmem_max/wmem_max).
    #[arg(long, value_parser = parse_size, default_value = "4m")]
    pub(crate) sockbuf: usize,
    /// Flow control of the throughput tests (queue and udp): the sender
    /// waits while this many messages, or half of --sockbuf in payload
    /// bytes, are sent and not yet received, so a row shows what the
    /// receiver sustains; 0 sends open loop and shows what is lost instead.
    /// The default leaves the byte limit in charge: a message-count window
    /// smaller than a datagram's worth of small messages would stop the
    /// sender before it fills one batch.
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) window: u64,
    /// The CPU both threads of every ping-pong row run on: a CPU number,
    /// `auto` (the one this command is running on when the rows start), or
    /// `none` (the scheduler chooses, each row may differ).
    #[arg(long, default_value = "auto")]
    pub(crate) latency_cpu: String,
    /// Largest datagram the queue builds: a byte count, or `auto` (65507,
    /// the most loopback carries).
    #[arg(long, default_value = "auto")]
    pub(crate) max_datagram: String,
    /// Output format.
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

/// A named batching mode and the locator options it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mode {
    name: String,
    options: String,
}

fn mode(s: &str) -> Result<Mode, String> {
    // The row's mode names the setting, so a table or plot legend read
    // alone says what was measured.
    let (name, options) = match s {
        "natural" => ("natural", "timeout=0"),
        "paper" => ("qthresh=512,timeout=200ms", "qthresh=512&timeout=200ms"),
        "max" => ("qthresh=max,timeout=1ms", "timeout=1ms"),
        o if o.contains('=') => (o, o),
        o => {
            return Err(format!(
                "unknown queue mode `{o}`: expected natural, paper, max, or locator options such as qthresh=8k&timeout=1ms"
            ))
        }
    };
    Ok(Mode {
        name: name.replace('&', ","),
        options: options.to_string(),
    })
}

/// The locator of a benchmark queue for messages of `size` bytes: the
/// mode's options plus the datagram limit and socket buffers unless the
/// mode sets them.
fn locator(mode: &Mode, max_datagram: usize, sockbuf: usize) -> String {
    let mut opts = mode.options.clone();
    let has = |k: &str| {
        mode.options
            .split('&')
            .any(|kv| kv.split('=').next() == Some(k))
    };
    if !has("max_datagram") {
        opts.push_str(&format!("&max_datagram={max_datagram}"));
    }
    if !has("rcvbuf") {
        opts.push_str(&format!("&rcvbuf={sockbuf}"));
    }
    if !has("sndbuf") {
        opts.push_str(&format!("&sndbuf={sockbuf}"));
    }
    format!("udp://127.0.0.1:0?{opts}")
}

/// Runs the tests asked for.
pub(crate) fn run(args: &QueueArgs, out: &mut Reporter) -> Result<(), Box<dyn Error>> {
    let modes = args
        .modes
        .iter()
        .map(|m| mode(m))
        .collect::<Result<Vec<_>, _>>()?;
    let max_datagram = match args.max_datagram.as_str() {
        "auto" => 65507,
        s => parse_size(s)?,
    };
    let wants = |t: Test| args.tests.contains(&t);
    let zmq = if wants(Test::Zmq) {
        zmq_path(args.zmq.as_deref())?
    } else {
        None
    };
    let show = out.progress_enabled();
    let limits = Limits {
        messages: args.messages,
        duration: args.duration_secs,
    };
    for &size in &args.sizes {
        if wants(Test::Queue) {
            for m in &modes {
                let loc = locator(m, max_datagram, args.sockbuf);
                let pb =
                    report::progress(show, limits.messages, &format!("queue {} {size} B", m.name));
                let window = Window::new(args.window, args.sockbuf / 2, size, STALL);
                let row = queue_throughput(size, &m.name, &loc, limits, window, &pb);
                pb.finish_and_clear();
                out.push(row?)?;
            }
        }
        if wants(Test::Udp) {
            let pb = report::progress(show, limits.messages, &format!("udp {size} B"));
            let row = baseline::udp_throughput(size, limits, args.sockbuf, args.window, &pb);
            pb.finish_and_clear();
            out.push(row?)?;
        }
        if let Some(path) = &zmq {
            let pb = report::spinner(show, &format!("zmq {size} B"));
            let rows = zmq_throughput(path, size, limits);
            pb.finish_and_clear();
            for row in rows? {
                out.push(row)?;
            }
        }
    }
    let limits = Limits {
        messages: args.round_trips,
        duration: args.duration_secs,
    };
    let wants_latency = wants(Test::QueuePingpong) || wants(Test::UdpPingpong);
    // Threads inherit the mask: the echo threads (and the queues' flusher
    // threads) spawned below run on the same CPU. Restored on drop.
    let pinned = match wants_latency && !args.latency_sizes.is_empty() {
        true => Pin::latency_cpu(&args.latency_cpu)?,
        false => None,
    };
    let on_cpu = |mut row: Row| {
        if let Some(p) = &pinned {
            let o = row.options.take().unwrap_or_default();
            row.options = Some(format!("{o}, both threads on cpu {}", p.cpu));
        }
        row
    };
    for &size in &args.latency_sizes {
        // Every row of this size is set up before any is timed, then all
        // are timed interleaved (see the module documentation).
        let mut set = Vec::new();
        if wants(Test::QueuePingpong) {
            for m in &modes {
                let loc = locator(m, max_datagram, args.sockbuf);
                set.push(queue_pingpong(size, &m.name, &loc, false)?);
            }
            // Natural batching again, each queue connected to the other
            // (a point-to-point queue: `peer=`, `Queue::connect`).
            if let Some(m) = modes.iter().find(|m| m.name == "natural") {
                let loc = locator(m, max_datagram, args.sockbuf);
                set.push(queue_pingpong(size, "natural,peer", &loc, true)?);
            }
        }
        if wants(Test::UdpPingpong) {
            set.push(baseline::udp_pingpong(size)?);
            set.push(baseline::udp_pingpong_queue_calls(size)?);
            set.push(baseline::udp_pingpong_unconnected(size)?);
        }
        if set.is_empty() {
            continue;
        }
        let pb = report::progress(
            show,
            limits.messages * set.len() as u64,
            &format!("{} ping-pongs {size} B interleaved", set.len()),
        );
        let rows = time_interleaved(limits, args.rounds, &pb, set);
        pb.finish_and_clear();
        for row in rows? {
            out.push(on_cpu(row))?;
        }
    }
    drop(pinned);
    Ok(())
}

/// The calling thread held to one CPU; the previous mask comes back on drop.
struct Pin {
    cpu: usize,
    before: libc::cpu_set_t,
}

impl Pin {
    /// Pins as `--latency-cpu` says (`None` for `none`).
    fn latency_cpu(spec: &str) -> Result<Option<Pin>, Box<dyn Error>> {
        let cpu = match spec {
            "none" => return Ok(None),
            // SAFETY: sched_getcpu takes no arguments and only returns a number.
            "auto" => usize::try_from(unsafe { libc::sched_getcpu() }).unwrap_or(0),
            n => n
                .parse()
                .map_err(|_| format!("--latency-cpu {n}: expected a CPU number, auto or none"))?,
        };
        Pin::to(cpu)
            .map(Some)
            .map_err(|e| format!("--latency-cpu: cannot pin to cpu {cpu}: {e}").into())
    }

    fn to(cpu: usize) -> std::io::Result<Pin> {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        if cpu >= 8 * size {
            return Err(std::io::ErrorKind::InvalidInput.into());
        }
        // SAFETY: cpu_set_t is a plain bit array, valid all-zero; the calls
        // read and write only the sets we own, with their true size, for
        // the calling thread (pid 0); CPU_SET's index is checked above.
        unsafe {
            let mut before: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, size, &mut before) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut one);
            if libc::sched_setaffinity(0, size, &one) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(Pin { cpu, before })
        }
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        // SAFETY: restores the set read in `to`, with its true size.
        unsafe {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.before);
        }
    }
}

impl std::fmt::Debug for Pin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pin").field("cpu", &self.cpu).finish()
    }
}

/// The targets checked against `rows`, one line each (nothing for
/// a target whose rows were not measured): at 8 B the queue moves at least
/// 10 million messages/s and at least twice ZeroMQ's rate; the
/// natural-batching ping-pong median is within 1.25x of plain UDP's.
pub(crate) fn targets(rows: &[Row]) -> Vec<String> {
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let mut out = Vec::new();
    let best = rows
        .iter()
        .filter(|r| r.test == "queue" && r.size == 8)
        .filter_map(|r| Some((r, r.msgs_per_s?)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((q, rate)) = best {
        out.push(format!(
            "target: queue at 8 B >= 10 M msgs/s: {} msgs/s ({}): {}",
            report::si(rate),
            q.mode,
            verdict(rate >= 10e6)
        ));
        let zmq = rows
            .iter()
            .find(|r| r.test == "zmq" && r.size == 8)
            .and_then(|r| r.msgs_per_s);
        if let Some(z) = zmq.filter(|z| *z > 0.0) {
            out.push(format!(
                "target: queue at 8 B >= 2x zmq: {:.2}x ({} vs {} msgs/s): {}",
                rate / z,
                report::si(rate),
                report::si(z),
                verdict(rate >= 2.0 * z)
            ));
        }
    }
    for q in rows
        .iter()
        .filter(|r| r.test == "queue-pingpong" && (r.mode == "natural" || r.mode == "natural,peer"))
    {
        let p50 = |mode: &str| {
            rows.iter()
                .find(|r| r.test == "udp-pingpong" && r.mode == mode && r.size == q.size)
                .and_then(|r| r.p50_us)
        };
        if let (Some(p), Some(f)) = (q.p50_us, p50("blocking")) {
            out.push(format!(
                "target: queue-pingpong {} p50 <= 1.25x udp-pingpong p50 at {} B: {:.2}x ({:.1} vs {:.1} µs): {}",
                q.mode,
                q.size,
                p / f,
                p,
                f,
                verdict(p <= 1.25 * f)
            ));
            if let (Some(c), "natural") = (p50("queue-calls"), q.mode.as_str()) {
                out.push(format!(
                    "floor: the queue's system calls alone (udp-pingpong queue-calls) at {} B: {:.1} µs = {:.2}x udp-pingpong; the queue's own work adds {:.1} µs",
                    q.size,
                    c,
                    c / f,
                    p - c
                ));
            }
            if let (Some(u), "natural") = (p50("unconnected"), q.mode.as_str()) {
                out.push(format!(
                    "like for like: queue-pingpong natural (many peers) against plain UDP on unconnected sockets (udp-pingpong unconnected, {:.2}x udp-pingpong) at {} B: {:.2}x ({:.1} vs {:.1} µs)",
                    u / f,
                    q.size,
                    p / u,
                    p,
                    u
                ));
            }
        }
    }
    out
}

/// Throughput of the skiff queue: see the module documentation.
fn queue_throughput(
    size: usize,
    mode: &str,
    loc: &str,
    limits: Limits,
    window: Window,
    pb: &ProgressBar,
) -> Result<Row, Box<dyn Error>> {
    let rx = Queue::bind(loc).map_err(|e| format!("cannot bind {loc}: {e}"))?;
    let tx = Queue::bind(loc).map_err(|e| format!("cannot bind {loc}: {e}"))?;
    let dest = rx.local_addr();
    let sent = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(2));
    let window = Arc::new(window);
    let cpu = CpuMeter::start();

    let sender = {
        let (sent, done, barrier, window) =
            (sent.clone(), done.clone(), barrier.clone(), window.clone());
        thread::spawn(move || -> Result<skiff::QueueStats, skiff::Error> {
            let msg = Message::from_payload(Bytes::from(vec![0xA5u8; size]));
            barrier.wait();
            let start = Instant::now();
            let (mut n, mut forgiven) = (0u64, 0u64);
            let result = (|| {
                while n < limits.messages {
                    window.wait(n, &mut forgiven);
                    tx.push(dest, &msg)?;
                    n += 1;
                    if n.is_multiple_of(1024) {
                        sent.store(n, Ordering::Release);
                        if start.elapsed() >= limits.duration {
                            break;
                        }
                    }
                }
                tx.flush()
            })();
            sent.store(n, Ordering::Release);
            done.store(true, Ordering::Release);
            result.map(|()| tx.stats())
        })
    };

    let mut batch: Vec<Message> = Vec::with_capacity(1024);
    barrier.wait();
    let start = Instant::now();
    let mut last = start;
    let (mut received, mut shown) = (0u64, 0u64);
    loop {
        batch.clear();
        let n = rx.try_pop_many(&mut batch, 1024) as u64;
        let n = if n > 0 {
            n
        } else {
            match rx.pop_blocking(Some(Duration::from_millis(20))) {
                Some(_) => 1,
                None => 0,
            }
        };
        if n > 0 {
            received += n;
            window.received(received);
            last = Instant::now();
            if received - shown >= 16384 {
                pb.inc(received - shown);
                shown = received;
            }
            continue;
        }
        if done.load(Ordering::Acquire)
            && (received >= sent.load(Ordering::Acquire) || last.elapsed() >= QUIET)
        {
            break;
        }
    }
    let tx_stats = sender
        .join()
        .map_err(|_| "queue sender thread panicked")??;
    pb.inc(received - shown);
    let rx_stats = rx.stats();
    let messages = sent.load(Ordering::Acquire);

    let mut row = Row::new("queue", mode, size);
    row.messages = messages;
    row.set_throughput(received, last - start);
    row.batches = Some(tx_stats.sent_batches);
    row.lost = Some(messages.saturating_sub(received));
    row.dropped = Some(tx_stats.dropped.total() + rx_stats.dropped.total());
    row.cpu_pct = Some(cpu.pct());
    row.options = Some(format!("{loc} window={}", window.limit()));
    Ok(row)
}

/// Ping-pong round trips through two skiff queues, ready to time: see the
/// module documentation.
fn queue_pingpong(
    size: usize,
    mode: &str,
    loc: &str,
    connect: bool,
) -> Result<PingPong, Box<dyn Error>> {
    let a = Queue::bind(loc).map_err(|e| format!("cannot bind {loc}: {e}"))?;
    let b = Queue::bind(loc).map_err(|e| format!("cannot bind {loc}: {e}"))?;
    let (a_addr, b_addr) = (a.local_addr(), b.local_addr());
    if connect {
        a.connect(b_addr)?;
        b.connect(a_addr)?;
    }
    // Long enough for a timeout-batched ping and pong, short enough that a
    // lost one does not stall the run.
    let wait = a.config().timeout * 2 + Duration::from_secs(1);
    let echo = move || -> Result<(), skiff::Error> {
        if let Some(m) = b.pop_blocking(Some(Duration::from_millis(50))) {
            b.push(a_addr, &m)?;
        }
        Ok(())
    };
    let ping = Message::from_payload(Bytes::from(vec![0x5Au8; size]));
    let round_trip = move || -> Result<bool, skiff::Error> {
        a.push(b_addr, &ping)?;
        Ok(a.pop_blocking(Some(wait)).is_some())
    };
    let mut row = Row::new("queue-pingpong", mode, size);
    row.options = Some(if connect {
        format!("{loc}, each queue connected to the other (peer=)")
    } else {
        loc.to_string()
    });
    Ok(PingPong {
        row,
        exchange: Exchange::spawn(echo, round_trip),
    })
}

/// The ZeroMQ peer to run: `explicit` if given (it must exist), else the
/// first `zmq_bench` found in the usual target directories, else `None`
/// with a note on stderr.
fn zmq_path(explicit: Option<&Path>) -> Result<Option<PathBuf>, String> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(Some(p.to_path_buf()))
        } else {
            Err(format!(
                "--zmq {}: no such file (bench/zmq/build.sh builds it)",
                p.display()
            ))
        };
    }
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        candidates.push(PathBuf::from(dir).join("zmq_bench"));
    }
    // target/release/skiff → target/zmq_bench
    if let Some(target) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent().map(Path::to_path_buf))
    {
        candidates.push(target.join("zmq_bench"));
    }
    candidates.push(PathBuf::from("target/zmq_bench"));
    match candidates.into_iter().find(|p| p.is_file()) {
        Some(p) => Ok(Some(p)),
        None => {
            eprintln!("note: zmq rows skipped: target/zmq_bench not found (run bench/zmq/build.sh or pass --zmq PATH)");
            Ok(None)
        }
    }
}

/// Runs the ZeroMQ peer for one size and reads its rows (one JSON line
/// each, in the [`Row`] schema).
fn zmq_throughput(path: &Path, size: usize, limits: Limits) -> Result<Vec<Row>, Box<dyn Error>> {
    // Two contexts, one I/O thread each: the layout of a sender and a
    // receiver in two processes, and the faster of the two on two cores.
    let output = Command::new(path)
        .args([
            size.to_string(),
            limits.messages.to_string(),
            format!("{}", limits.duration.as_secs_f64()),
            "1".into(),
            "2".into(),
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
        .map(|l| {
            serde_json::from_str::<Row>(l)
                .map_err(|e| format!("bad row from {}: {e}: {l}", path.display()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if rows.is_empty() {
        return Err(format!("{} printed no row", path.display()).into());
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_expand_to_locator_options() {
        assert_eq!(mode("natural").unwrap().options, "timeout=0");
        assert_eq!(mode("paper").unwrap().options, "qthresh=512&timeout=200ms");
        assert_eq!(mode("paper").unwrap().name, "qthresh=512,timeout=200ms");
        assert_eq!(
            mode("qthresh=8k&timeout=1ms").unwrap().name,
            "qthresh=8k,timeout=1ms"
        );
        assert_eq!(
            mode("qthresh=8k&timeout=1ms").unwrap().options,
            "qthresh=8k&timeout=1ms"
        );
        assert!(mode("fast").unwrap_err().contains("natural, paper, max"));
    }

    #[test]
    fn locators_carry_limits_unless_the_mode_sets_them() {
        let l = locator(&mode("paper").unwrap(), 65507, 1 << 22);
        assert_eq!(
            l,
            "udp://127.0.0.1:0?qthresh=512&timeout=200ms&max_datagram=65507&rcvbuf=4194304&sndbuf=4194304"
        );
        let l = locator(
            &mode("timeout=0&max_datagram=1472").unwrap(),
            65507,
            1 << 22,
        );
        assert!(
            l.contains("max_datagram=1472") && !l.contains("65507"),
            "{l}"
        );
        skiff::QueueConfig::from_locator(&l).unwrap();
    }

    #[test]
    fn latency_cpu_pins_and_restores() {
        assert!(Pin::latency_cpu("none").unwrap().is_none());
        let e = Pin::latency_cpu("fast").unwrap_err().to_string();
        assert!(e.contains("a CPU number, auto or none"), "{e}");
        let cpu = {
            let p = Pin::latency_cpu("auto").unwrap().expect("pinned");
            // SAFETY: sched_getcpu only returns a number.
            assert_eq!(unsafe { libc::sched_getcpu() } as usize, p.cpu);
            p.cpu
        };
        let p = Pin::latency_cpu(&cpu.to_string()).unwrap().unwrap();
        assert_eq!(p.cpu, cpu);
    }

    #[test]
    fn targets_compare_with_the_baselines_of_the_same_run() {
        let mut q = Row::new("queue", "natural", 8);
        q.msgs_per_s = Some(12e6);
        let mut p = Row::new("queue", "paper", 8);
        p.msgs_per_s = Some(3e6);
        let mut z = Row::new("zmq", "push-pull-tcp", 8);
        z.msgs_per_s = Some(8e6);
        let mut qp = Row::new("queue-pingpong", "natural", 8);
        qp.p50_us = Some(9.0);
        let mut up = Row::new("udp-pingpong", "blocking", 8);
        up.p50_us = Some(8.0);
        let mut calls = Row::new("udp-pingpong", "queue-calls", 8);
        calls.p50_us = Some(8.6);
        let mut unconnected = Row::new("udp-pingpong", "unconnected", 8);
        unconnected.p50_us = Some(8.8);
        let t = targets(&[q, p, z, qp, up, calls, unconnected]);
        assert_eq!(t.len(), 5, "{t:?}");
        assert!(
            t[4].starts_with("like for like:")
                && t[4].contains("1.10x udp")
                && t[4].contains(": 1.02x"),
            "{}",
            t[4]
        );
        assert!(
            t[3].starts_with("floor:") && t[3].contains("1.07x") && t[3].contains("adds 0.4 µs"),
            "{}",
            t[3]
        );
        assert!(
            t[0].contains("12.00 M") && t[0].contains("(natural)") && t[0].ends_with(": met"),
            "{}",
            t[0]
        );
        assert!(
            t[1].contains("1.50x") && t[1].ends_with("NOT met"),
            "{}",
            t[1]
        );
        assert!(
            t[2].contains("1.12x") && t[2].ends_with(": met"),
            "{}",
            t[2]
        );
        assert!(targets(&[]).is_empty());
    }

    #[test]
    fn queue_throughput_counts_every_message() {
        let limits = Limits {
            messages: 5000,
            duration: Duration::from_secs(5),
        };
        let loc = locator(&mode("natural").unwrap(), 65507, 1 << 20);
        let window = Window::new(1000, 1 << 20, 64, STALL);
        let row =
            queue_throughput(64, "natural", &loc, limits, window, &ProgressBar::hidden()).unwrap();
        assert_eq!(row.messages, 5000);
        assert_eq!(row.received.unwrap() + row.lost.unwrap(), 5000);
        assert!(row.batches.unwrap() >= 1);
    }

    #[test]
    fn queue_pingpongs_time_round_trips_interleaved() {
        let limits = Limits {
            messages: 100,
            duration: Duration::from_secs(5),
        };
        let loc = locator(&mode("natural").unwrap(), 65507, 1 << 20);
        let set = vec![
            queue_pingpong(8, "natural", &loc, false).unwrap(),
            queue_pingpong(8, "natural,peer", &loc, true).unwrap(),
        ];
        let rows = time_interleaved(limits, 3, &ProgressBar::hidden(), set).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].mode, "natural");
        assert_eq!(rows[1].mode, "natural,peer");
        for row in &rows {
            assert_eq!(row.messages + row.lost.unwrap(), 100);
            assert!(row.p50_us.unwrap() > 0.0);
        }
        let o = rows[1].options.as_deref().unwrap();
        assert!(
            o.starts_with(&loc) && o.ends_with("(peer=), interleaved in 3 rounds"),
            "{o}"
        );
    }
}
