//! `skiff bench queue`: the batched datagram queue, in one run.
//!
//! Throughput rows `queue`, at every size in `--sizes`, in each `--modes`
//! mode: a sender thread pushes `--messages` messages (or as many as fit
//! in `--duration-secs`) and flushes; the receiver pops until it has them
//! all or nothing arrives for a quiet period. msgs/s is messages received
//! over the time from the start to the last one received; what never
//! arrived is `lost`, what the queues dropped and counted (kernel buffer
//! overflow in datagrams, full send backlog in messages, …) is `dropped`.
//! The sender keeps at most `--window` messages in flight ([`Window`]), so
//! the row shows what the receiver sustains; `--window 0` is open loop.
//!
//! Latency rows `queue-pingpong`, at every size in `--latency-sizes`, in
//! each mode (one message each way, no `flush`: with natural batching a
//! lone message leaves at once; with `timeout=200ms` it waits for the
//! timeout on both sides, which is what the row is there to show), and
//! `natural,peer` with each queue connected to the other.
//!
//! The ping-pong rows of one size run interleaved
//! ([`super::interleaved_round_trips`]): all are set up and warmed up
//! first, then timed in `--rounds` rounds, each row running its share of
//! the round trips in turn, in an order rotated every round. A virtual
//! machine's speed drifts over seconds: rows run one after another would
//! each see a different machine, interleaved they see the same one.

use std::error::Error;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use indicatif::ProgressBar;
use skiff::{Message, Queue};

use super::report::{self, CpuMeter, Reporter, Row};
use super::{
    parse_secs, parse_size, time_interleaved, Exchange, Limits, OutputArgs, PingPong, Window,
    QUIET, STALL,
};

/// The tests `skiff bench queue` can run.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// skiff queue throughput, in each mode.
    Queue,
    /// skiff queue ping-pong latency, in each mode.
    QueuePingpong,
}

/// `skiff bench queue`
#[derive(clap::Args, Debug)]
pub struct QueueArgs {
    /// What to measure and how.
    #[command(flatten)]
    pub params: QueueParams,
    /// Tests to run.
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "queue,queue-pingpong"
    )]
    pub tests: Vec<Test>,
    /// Output format.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// The queue benchmark's settings, shared with skiff-bench (which runs
/// the same rows beside its baselines).
#[derive(clap::Args, Debug, Clone)]
pub struct QueueParams {
    /// Message sizes of the throughput tests, in bytes (`4k` = 4096).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "8,64,512,4096,16384")]
    pub sizes: Vec<usize>,
    /// Messages per throughput test.
    #[arg(long, default_value_t = 10_000_000)]
    pub messages: u64,
    /// Longest time a throughput test sends, or a ping-pong test times
    /// round trips, in seconds; whichever of this and the count comes first
    /// ends the test.
    #[arg(long, value_parser = parse_secs, default_value = "3")]
    pub duration_secs: Duration,
    /// Round trips per ping-pong test (after 1000 of warm-up).
    #[arg(long, default_value_t = 20_000)]
    pub round_trips: u64,
    /// Rounds the ping-pong rows of one size are timed in: each round,
    /// every row runs its share of --round-trips (and of --duration-secs)
    /// in turn, so the rows compared see the same machine.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub rounds: u64,
    /// Message sizes of the ping-pong tests.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "8")]
    pub latency_sizes: Vec<usize>,
    /// Queue batching modes: `natural` (timeout=0), `paper`
    /// (qthresh=512&timeout=200ms, CMQ's setting), `max` (qthresh at the
    /// datagram size, timeout=1ms), or any locator options joined by `&`.
    #[arg(long, value_delimiter = ',', default_value = "natural,paper")]
    pub modes: Vec<String>,
    /// Socket send and receive buffer sizes of the throughput tests
    /// (the kernel caps them at net.core.rmem_max/wmem_max).
    #[arg(long, value_parser = parse_size, default_value = "4m")]
    pub sockbuf: usize,
    /// Flow control of the throughput tests: the sender waits while this
    /// many messages, or half of --sockbuf in payload bytes, are sent and
    /// not yet received, so a row shows what the receiver sustains; 0
    /// sends open loop and shows what is lost instead. The default leaves
    /// the byte limit in charge: a message-count window smaller than a
    /// datagram's worth of small messages would stop the sender before it
    /// fills one batch.
    #[arg(long, default_value_t = 1_000_000)]
    pub window: u64,
    /// Largest datagram the queue builds: a byte count, or `auto` (65507,
    /// the most loopback carries).
    #[arg(long, default_value = "auto")]
    pub max_datagram: String,
}

impl QueueParams {
    /// When a throughput test stops.
    pub fn throughput_limits(&self) -> Limits {
        Limits {
            messages: self.messages,
            duration: self.duration_secs,
        }
    }

    /// When a ping-pong test stops.
    pub fn latency_limits(&self) -> Limits {
        Limits {
            messages: self.round_trips,
            duration: self.duration_secs,
        }
    }
}

/// A named batching mode and the locator options it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mode {
    /// The row's mode: the setting, so a table or plot legend read alone
    /// says what was measured.
    pub name: String,
    /// The locator options.
    pub options: String,
}

fn mode(s: &str) -> Result<Mode, String> {
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

/// The locator of a benchmark queue: the mode's options plus the datagram
/// limit and socket buffers unless the mode sets them.
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

/// [`QueueParams`] checked and resolved: the modes and the datagram limit.
/// Runs the queue's rows of one size at a time, so that a caller can put
/// other rows beside them.
#[derive(Debug, Clone)]
pub struct Setup {
    params: QueueParams,
    modes: Vec<Mode>,
    max_datagram: usize,
}

impl Setup {
    /// Checks the modes and the datagram limit.
    pub fn new(params: &QueueParams) -> Result<Setup, String> {
        let modes = params
            .modes
            .iter()
            .map(|m| mode(m))
            .collect::<Result<Vec<_>, _>>()?;
        let max_datagram = match params.max_datagram.as_str() {
            "auto" => 65507,
            s => parse_size(s)?,
        };
        Ok(Setup {
            params: params.clone(),
            modes,
            max_datagram,
        })
    }

    /// The settings.
    pub fn params(&self) -> &QueueParams {
        &self.params
    }

    fn locator(&self, m: &Mode) -> String {
        locator(m, self.max_datagram, self.params.sockbuf)
    }

    /// Measures and reports the `queue` rows of `size`, one per mode.
    pub fn throughput(&self, size: usize, out: &mut Reporter) -> Result<(), Box<dyn Error>> {
        let limits = self.params.throughput_limits();
        let show = out.progress_enabled();
        for m in &self.modes {
            let loc = self.locator(m);
            let pb = report::progress(show, limits.messages, &format!("queue {} {size} B", m.name));
            let window = Window::new(self.params.window, self.params.sockbuf / 2, size, STALL);
            let row = throughput(size, &m.name, &loc, limits, window, &pb);
            pb.finish_and_clear();
            out.push(row?)?;
        }
        Ok(())
    }

    /// The `queue-pingpong` rows of `size`, set up and ready to time: one
    /// per mode, and natural batching again with each queue connected to
    /// the other (a point-to-point queue: `peer=`, `Queue::connect`).
    pub fn pingpongs(&self, size: usize) -> Result<Vec<PingPong>, Box<dyn Error>> {
        let mut set = Vec::new();
        for m in &self.modes {
            set.push(pingpong(size, &m.name, &self.locator(m), false)?);
        }
        if let Some(m) = self.modes.iter().find(|m| m.name == "natural") {
            set.push(pingpong(size, "natural,peer", &self.locator(m), true)?);
        }
        Ok(set)
    }

    /// Times `set` (the ping-pong rows of `size`) interleaved in
    /// `--rounds` rounds and reports each row after `finish` has had its
    /// say (e.g. noting where the threads ran).
    pub fn time(
        &self,
        size: usize,
        set: Vec<PingPong>,
        out: &mut Reporter,
        finish: impl Fn(Row) -> Row,
    ) -> Result<(), Box<dyn Error>> {
        if set.is_empty() {
            return Ok(());
        }
        let limits = self.params.latency_limits();
        let pb = report::progress(
            out.progress_enabled(),
            limits.messages * set.len() as u64,
            &format!("{} ping-pongs {size} B interleaved", set.len()),
        );
        let rows = time_interleaved(limits, self.params.rounds, &pb, set);
        pb.finish_and_clear();
        for row in rows? {
            out.push(finish(row))?;
        }
        Ok(())
    }
}

/// Runs the tests asked for.
pub fn run(args: &QueueArgs, out: &mut Reporter) -> Result<(), Box<dyn Error>> {
    let setup = Setup::new(&args.params)?;
    let wants = |t: Test| args.tests.contains(&t);
    if wants(Test::Queue) {
        for &size in &args.params.sizes {
            setup.throughput(size, out)?;
        }
    }
    if wants(Test::QueuePingpong) {
        for &size in &args.params.latency_sizes {
            // Every row of this size is set up before any is timed, then
            // all are timed interleaved (see the module documentation).
            let set = setup.pingpongs(size)?;
            setup.time(size, set, out, |row| row)?;
        }
    }
    Ok(())
}

/// Throughput of the skiff queue at `size` bytes through locator `loc`
/// (a row `queue`, `mode`): see the module documentation.
pub fn throughput(
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

/// Ping-pong round trips through two skiff queues (a row `queue-pingpong`,
/// `mode`), ready to time; `connect` connects each queue to the other
/// (`peer=`). See the module documentation.
pub fn pingpong(
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
    fn queue_throughput_counts_every_message() {
        let limits = Limits {
            messages: 5000,
            duration: Duration::from_secs(5),
        };
        let loc = locator(&mode("natural").unwrap(), 65507, 1 << 20);
        let window = Window::new(1000, 1 << 20, 64, STALL);
        let row = throughput(64, "natural", &loc, limits, window, &ProgressBar::hidden()).unwrap();
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
            pingpong(8, "natural", &loc, false).unwrap(),
            pingpong(8, "natural,peer", &loc, true).unwrap(),
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
