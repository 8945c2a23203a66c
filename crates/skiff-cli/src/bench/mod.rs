//! `skiff bench`: end-to-end benchmarks of skiff on this machine, as
//! `nats bench` measures NATS: each subcommand runs one kind of load
//! through skiff and prints what it sustained.
//!
//! Every subcommand prints the same rows ([`report::Row`]): an aligned
//! table by default, one JSON object per line with `--json`. A progress
//! bar runs on stderr while a test runs, when stderr is a terminal and
//! `--json` is off.
//!
//! - `queue`: the batched datagram queue (CMQ): throughput and ping-pong
//!   latency in each batching mode.
//! - `pubsub`, `request`: publish/subscribe and request/reply through a
//!   node (one it starts, or one or several given: `--node`, `--pub-at`,
//!   `--sub-at`; bench/mesh.sh runs them across a mesh).
//! - `tunnel`: a reliable tunnel (QMP association): bulk goodput, small
//!   message rate, ping-pong latency.
//! - `shm`: RocketBufs buffers over shared memory: message rate and round
//!   trip, busy-poll and futex.
//! - `failover`: how long a subscriber goes without messages when its
//!   node is killed and its client moves to the next node of a mesh.
//!
//! This module is also a library: the `skiff-bench` crate (not
//! published) runs the same measuring code beside its comparisons with
//! other systems (plain sockets, ZeroMQ, nats-server), CPU pinning, plots
//! and the Markdown for bench/RESULTS.md, none of which ship in `skiff`.

use std::error::Error;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;

pub mod failover;
pub mod pubsub;
pub mod queue;
pub mod report;
pub mod request;
pub mod server;
pub mod shm;
pub mod tunnel;

use report::{CpuMeter, Histogram, Reporter, Row};

/// `skiff bench …`
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Which benchmark to run.
    #[command(subcommand)]
    pub command: BenchCommand,
}

/// The benchmarks.
#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// The batched datagram queue: throughput and ping-pong latency at
    /// several message sizes, in each batching mode.
    Queue(queue::QueueArgs),
    /// Publish/subscribe through a node (1→1, 1→4, 4→4).
    Pubsub(pubsub::PubsubArgs),
    /// Request/reply through a node with 1 and 16 requesters.
    Request(request::RequestArgs),
    /// A reliable tunnel: bulk goodput, small-message rate and ping-pong
    /// latency.
    Tunnel(tunnel::TunnelArgs),
    /// RocketBufs buffers over shared memory: message rate and round
    /// trip, busy-poll and futex.
    Shm(shm::ShmArgs),
    /// Failover time of a subscriber whose node is killed (kill -9), over
    /// a mesh of nodes on loopback that this command starts.
    Failover(failover::FailoverArgs),
}

/// Output options every benchmark takes.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct OutputArgs {
    /// Print one JSON object per row and line instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `skiff bench …`. The nodes that `pubsub`, `request` and
/// `failover` start are `skiff node` of this very binary.
pub fn run(args: BenchArgs) -> Result<(), Box<dyn Error>> {
    let skiff = std::env::current_exe()?;
    let json = match &args.command {
        BenchCommand::Queue(a) => a.output.json,
        BenchCommand::Pubsub(a) => a.output.json,
        BenchCommand::Request(a) => a.output.json,
        BenchCommand::Tunnel(a) => a.output.json,
        BenchCommand::Shm(a) => a.output.json,
        BenchCommand::Failover(a) => a.output.json,
    };
    let mut reporter = Reporter::new(json);
    let result = match &args.command {
        BenchCommand::Queue(a) => queue::run(a, &mut reporter),
        BenchCommand::Pubsub(a) => pubsub::run(a, &skiff, &mut reporter),
        BenchCommand::Request(a) => request::run(a, &skiff, &mut reporter),
        BenchCommand::Tunnel(a) => tunnel::run(a, &mut reporter),
        BenchCommand::Shm(a) => shm::run(a, &mut reporter),
        BenchCommand::Failover(a) => failover::run(&a.params, &skiff, &mut reporter),
    };
    // Whatever was measured before a failure is still shown.
    reporter.finish(&[])?;
    result
}

/// When a test stops: after `messages` messages (or round trips) or after
/// `duration`, whichever comes first.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most messages sent, or round trips timed.
    pub messages: u64,
    /// Longest time spent sending, or timing round trips.
    pub duration: Duration,
}

impl Limits {
    /// Whether a sender that began at `start` and has sent `sent` is past
    /// `duration`. The clock is read every 64 messages only: a clock read
    /// per message costs a small message's loop a good share of its time
    /// (every transport's loop alike).
    pub fn timed_out(&self, sent: u64, start: std::time::Instant) -> bool {
        sent.is_multiple_of(64) && start.elapsed() >= self.duration
    }
}

/// Flow control between a benchmark's sender and receiver threads, which
/// share a process and so can share a counter for free: the sender waits
/// while `limit` or more messages are sent and not yet received, so it
/// measures what the receiver can sustain instead of how fast a sender can
/// bury it (with two cores, an open-loop sender mostly measures the
/// scheduler). `limit` 0 is open loop.
///
/// A message lost on the way is never received, so a sender that has seen
/// no progress for `stall` takes everything outstanding as lost and goes
/// on.
#[derive(Debug)]
pub struct Window {
    received: std::sync::atomic::AtomicU64,
    limit: u64,
    stall: Duration,
}

impl Window {
    /// A window of at most `messages` messages and at most `bytes` payload
    /// bytes of `size`-byte messages in flight; `messages` 0 is open loop.
    pub fn new(messages: u64, bytes: usize, size: usize, stall: Duration) -> Window {
        let by_bytes = (bytes / size.max(1)).max(1) as u64;
        Window {
            received: Default::default(),
            limit: if messages == 0 {
                0
            } else {
                messages.min(by_bytes)
            },
            stall,
        }
    }

    /// The most messages in flight (0: no limit).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Receiver side: `n` messages received so far in total.
    pub fn received(&self, n: u64) {
        self.received.store(n, std::sync::atomic::Ordering::Release);
    }

    /// Sender side, before sending message number `sent` (counting from 0):
    /// waits for room. `forgiven` carries the messages taken as lost.
    pub fn wait(&self, sent: u64, forgiven: &mut u64) {
        if self.limit == 0 {
            return;
        }
        let load = || self.received.load(std::sync::atomic::Ordering::Acquire);
        let mut seen = load();
        if sent.saturating_sub(seen + *forgiven) < self.limit {
            return;
        }
        let mut since = Instant::now();
        let mut spins = 0u32;
        loop {
            // Yield first (the receiver may be waiting for this core), then
            // sleep briefly so a waiting sender costs almost nothing.
            if spins < 64 {
                std::thread::yield_now();
                spins += 1;
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
            let now = load();
            if sent.saturating_sub(now + *forgiven) < self.limit {
                return;
            }
            if now != seen {
                seen = now;
                since = Instant::now();
            } else if since.elapsed() >= self.stall {
                *forgiven = sent.saturating_sub(now);
                return;
            }
        }
    }
}

/// How long a windowed sender waits for a receiver that makes no progress
/// before it takes what is outstanding as lost.
pub const STALL: Duration = Duration::from_millis(50);

/// How long a receiver waits with nothing arriving, after its sender has
/// finished, before it takes the rest as lost.
pub const QUIET: Duration = Duration::from_millis(300);

/// Round trips before timing starts (or until a tenth of the duration has
/// passed): they fill caches, fault in buffers and wake the CPUs.
const WARMUP: u64 = 1000;

/// Times round trips: calls `round_trip` (which sends one message and waits
/// for its answer, returning `false` if the answer timed out) first to warm
/// up, then within `limits`. Returns the histogram of answered round trips
/// in nanoseconds and the number that timed out.
pub fn round_trips<E>(
    limits: Limits,
    pb: &ProgressBar,
    mut round_trip: impl FnMut() -> Result<bool, E>,
) -> Result<(Histogram, u64), E> {
    let start = Instant::now();
    for _ in 0..WARMUP.min(limits.messages) {
        if start.elapsed() >= limits.duration / 10 {
            break;
        }
        round_trip()?;
    }
    let mut hist = report::histogram();
    let mut lost = 0u64;
    let start = Instant::now();
    while hist.len() + lost < limits.messages && start.elapsed() < limits.duration {
        let t = Instant::now();
        if round_trip()? {
            report::record(&mut hist, t.elapsed());
        } else {
            lost += 1;
        }
        pb.inc(1);
    }
    Ok((hist, lost))
}

/// The error an echo thread ends with, handed back across its join.
type EchoError = Box<dyn Error + Send + Sync>;

/// One ping-pong set up and ready to be timed, so that several can be set
/// up first and then timed together ([`interleaved_round_trips`]): a round
/// trip (send one message, wait for its answer; `false` if the answer timed
/// out) and the thread that answers it, which runs until
/// [`Exchange::finish`] or drop stops it.
pub struct Exchange {
    round_trip: Box<dyn FnMut() -> Result<bool, Box<dyn Error>>>,
    stop: Arc<AtomicBool>,
    echo: Option<JoinHandle<Result<(), EchoError>>>,
}

impl Exchange {
    /// Starts a thread that calls `echo` (wait a little for a message,
    /// answer it) until the exchange is finished, and keeps `round_trip`
    /// for the timing. `echo` must return now and then (a receive with a
    /// timeout) so that the thread sees the stop.
    pub fn spawn<E, R>(
        mut echo: impl FnMut() -> Result<(), E> + Send + 'static,
        mut round_trip: impl FnMut() -> Result<bool, R> + 'static,
    ) -> Exchange
    where
        E: Into<EchoError>,
        R: Into<Box<dyn Error>>,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let echo = {
            let stop = stop.clone();
            std::thread::spawn(move || -> Result<(), EchoError> {
                while !stop.load(Ordering::Relaxed) {
                    echo().map_err(Into::into)?;
                }
                Ok(())
            })
        };
        Exchange {
            round_trip: Box::new(move || round_trip().map_err(Into::into)),
            stop,
            echo: Some(echo),
        }
    }

    /// Stops the echo thread and waits for it; its error if it failed.
    pub fn finish(mut self) -> Result<(), Box<dyn Error>> {
        self.stop.store(true, Ordering::Relaxed);
        match self.echo.take() {
            Some(echo) => match echo.join() {
                Ok(result) => result.map_err(|e| e as Box<dyn Error>),
                Err(_) => Err("ping-pong echo thread panicked".into()),
            },
            None => Ok(()),
        }
    }
}

impl Drop for Exchange {
    /// An exchange dropped unfinished (another row failed) still stops and
    /// joins its echo thread.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(echo) = self.echo.take() {
            let _ = echo.join();
        }
    }
}

impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchange")
            .field("echo_running", &self.echo.is_some())
            .finish_non_exhaustive()
    }
}

/// What [`interleaved_round_trips`] measured of one exchange.
#[derive(Debug)]
pub struct Timed {
    /// Answered round trips, nanoseconds.
    pub hist: Histogram,
    /// Round trips whose answer timed out.
    pub lost: u64,
    /// Process CPU over the exchange's own timed stretches, % of one core.
    pub cpu_pct: f64,
}

/// The rounds `rounds` asks for, at least one and at most one per round
/// trip.
fn rounds_for(limits: Limits, rounds: u64) -> u64 {
    rounds.clamp(1, limits.messages.max(1))
}

/// Times several exchanges close together in time, so that figures
/// compared with each other were measured on the same machine (a virtual
/// machine's speed drifts by several percent over seconds): each exchange
/// warms up as in [`round_trips`], then in each of `rounds` rounds every
/// exchange in turn runs its share of `limits.messages` (the last round
/// takes the remainder), in an order rotated by one each round so no
/// exchange always runs first or last.
///
/// `limits.duration` bounds each exchange's total timed time: a round
/// gives it what is left over the rounds left, and its turn ends when that
/// is used up (a slow exchange does at least one round trip per round
/// while it has time left). Returns one [`Timed`] per exchange, in order.
pub fn interleaved_round_trips(
    limits: Limits,
    rounds: u64,
    exchanges: &mut [Exchange],
    pb: &ProgressBar,
) -> Result<Vec<Timed>, Box<dyn Error>> {
    let rounds = rounds_for(limits, rounds);
    for x in exchanges.iter_mut() {
        let start = Instant::now();
        for _ in 0..WARMUP.min(limits.messages) {
            if start.elapsed() >= limits.duration / 10 {
                break;
            }
            (x.round_trip)()?;
        }
    }
    let mut timed: Vec<(Histogram, u64, report::CpuTotal)> = exchanges
        .iter()
        .map(|_| (report::histogram(), 0, report::CpuTotal::default()))
        .collect();
    let n = exchanges.len();
    for round in 0..rounds {
        let share = match round + 1 == rounds {
            true => limits.messages - (rounds - 1) * (limits.messages / rounds),
            false => limits.messages / rounds,
        };
        for k in 0..n {
            let i = (round as usize + k) % n;
            let (hist, lost, cpu) = &mut timed[i];
            let round_trip = &mut exchanges[i].round_trip;
            let budget = limits
                .duration
                .saturating_sub(cpu.wall())
                .div_f64((rounds - round) as f64);
            let meter = CpuMeter::start();
            let start = Instant::now();
            for _ in 0..share {
                let t = Instant::now();
                if t - start >= budget {
                    break;
                }
                if round_trip()? {
                    report::record(hist, t.elapsed());
                } else {
                    *lost += 1;
                }
                pb.inc(1);
            }
            cpu.add(&meter);
        }
    }
    Ok(timed
        .into_iter()
        .map(|(hist, lost, cpu)| Timed {
            hist,
            lost,
            cpu_pct: cpu.pct(),
        })
        .collect())
}

/// A ping-pong row waiting to be timed: the row with its test, mode, size
/// and options set, and the exchange that measures it.
#[derive(Debug)]
pub struct PingPong {
    /// The row to fill in.
    pub row: Row,
    /// What its round trips run.
    pub exchange: Exchange,
}

/// Times `set` interleaved in `rounds` rounds ([`interleaved_round_trips`]),
/// stops the echo threads and returns the rows filled in, in the order
/// given, each row's options saying it was interleaved.
pub fn time_interleaved(
    limits: Limits,
    rounds: u64,
    pb: &ProgressBar,
    set: Vec<PingPong>,
) -> Result<Vec<Row>, Box<dyn Error>> {
    let (mut rows, mut exchanges): (Vec<Row>, Vec<Exchange>) =
        set.into_iter().map(|p| (p.row, p.exchange)).unzip();
    let timed = interleaved_round_trips(limits, rounds, &mut exchanges, pb)?;
    for x in exchanges {
        x.finish()?;
    }
    let rounds = rounds_for(limits, rounds);
    for (row, t) in rows.iter_mut().zip(timed) {
        row.set_latency(&t.hist);
        row.lost = Some(t.lost);
        row.cpu_pct = Some(t.cpu_pct);
        let o = row.options.take().unwrap_or_default();
        row.options = Some(format!("{o}, interleaved in {rounds} rounds"));
    }
    Ok(rows)
}

/// Parses a message size: `512`, `4k`/`4K`/`4KiB` (×1024), `1m` (×2^20),
/// as locators do ([`skiff::locator::parse_bytes`]), and more than zero.
pub fn parse_size(s: &str) -> Result<usize, String> {
    match skiff::locator::parse_bytes("size", s) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "`{s}` is not a message size: expected a positive byte count such as 8, 512, 4k or 16k"
        )),
    }
}

/// Parses a positive duration for a flag, in skiff's one syntax
/// ([`skiff::locator::parse_duration`]: `0.5`, `200ms`, `1s`).
pub fn parse_secs(s: &str) -> Result<Duration, String> {
    match skiff::locator::parse_duration("duration", s) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(format!(
            "`{s}` is not a duration above zero: use seconds such as 3 or 0.5, or a unit: 200ms, 1s"
        )),
    }
}

/// Parses a duration for a flag that takes zero, in skiff's one syntax.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    skiff::locator::parse_duration("duration", s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::sync::atomic::AtomicU64;

    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("16KiB"), Ok(16384));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert!(parse_size("0").unwrap_err().contains("positive byte count"));
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_secs("0.5"), Ok(Duration::from_millis(500)));
        assert!(parse_secs("-1").is_err());
        assert_eq!(parse_secs("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_secs("1s"), Ok(Duration::from_secs(1)));
        assert!(parse_secs("0").is_err());
        assert!(parse_secs("abc").unwrap_err().contains("seconds"));
    }

    #[test]
    fn window_limits_messages_and_bytes_in_flight() {
        let stall = Duration::from_millis(5);
        assert_eq!(Window::new(4096, 2 << 20, 8, stall).limit(), 4096);
        assert_eq!(Window::new(4096, 2 << 20, 16384, stall).limit(), 128);
        assert_eq!(Window::new(0, 2 << 20, 8, stall).limit(), 0);
        assert_eq!(Window::new(10, 100, 1000, stall).limit(), 1);
    }

    #[test]
    fn window_waits_for_the_receiver_and_forgives_a_stall() {
        let w = Window::new(10, 1 << 20, 8, Duration::from_millis(20));
        let mut forgiven = 0;
        w.wait(9, &mut forgiven); // room: returns at once
        assert_eq!(forgiven, 0);
        w.received(5);
        w.wait(14, &mut forgiven); // 9 in flight: room, nothing forgiven
        assert_eq!(forgiven, 0);
        // 15 in flight and the receiver never moves: after the stall the
        // outstanding messages are taken as lost.
        w.wait(20, &mut forgiven);
        assert_eq!(forgiven, 15);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(5));
                w.received(6);
            });
            let mut f = 0;
            w.wait(15, &mut f); // 10 in flight until the receiver moves
            assert_eq!(f, 0);
        });
    }

    /// A fake exchange `id` that logs each round trip's id in `log`, loses
    /// every `lose_every`-th call (0: none), and whose echo thread counts
    /// its turns in `echoes` (or fails at once if `echo_fails`).
    fn fake(
        id: usize,
        log: &Rc<RefCell<Vec<usize>>>,
        lose_every: u64,
        echoes: &Arc<AtomicU64>,
        echo_fails: bool,
    ) -> Exchange {
        let (log, echoes) = (log.clone(), echoes.clone());
        let mut calls = 0u64;
        Exchange::spawn(
            move || {
                echoes.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
                match echo_fails {
                    true => Err(std::io::Error::other("echo failed")),
                    false => Ok(()),
                }
            },
            move || -> Result<bool, std::io::Error> {
                log.borrow_mut().push(id);
                calls += 1;
                Ok(lose_every == 0 || !calls.is_multiple_of(lose_every))
            },
        )
    }

    /// Waits (at most 5 s) until `count` reaches `n`.
    fn wait_for(count: &AtomicU64, n: u64) {
        let start = Instant::now();
        while count.load(Ordering::Relaxed) < n {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "never reached {n}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn interleaved_round_trips_take_turns_in_rotated_rounds() {
        let limits = Limits {
            messages: 10,
            duration: Duration::from_secs(60),
        };
        let log = Rc::new(RefCell::new(Vec::new()));
        let echoes = Arc::new(AtomicU64::new(0));
        let mut xs = [
            fake(0, &log, 2, &echoes, false),
            fake(1, &log, 0, &echoes, false),
            fake(2, &log, 5, &echoes, false),
        ];
        let timed = interleaved_round_trips(limits, 3, &mut xs, &ProgressBar::hidden()).unwrap();
        // Warm-up (10 each, one exchange after another), then three rounds
        // of 3, 3 and 4 (the remainder) round trips each, the order rotated
        // by one each round.
        let mut want = Vec::new();
        for id in [0, 1, 2] {
            want.extend([id; 10]);
        }
        for (share, order) in [(3, [0, 1, 2]), (3, [1, 2, 0]), (4, [2, 0, 1])] {
            for id in order {
                want.extend(std::iter::repeat_n(id, share));
            }
        }
        assert_eq!(*log.borrow(), want);
        // Calls 11..=20 of each are timed: every 2nd lost, none, every 5th.
        let lost: Vec<u64> = timed.iter().map(|t| t.lost).collect();
        assert_eq!(lost, [5, 0, 2]);
        for t in &timed {
            assert_eq!(t.hist.len() + t.lost, 10);
        }
        // The echo threads run until finished, then stop: the count no
        // longer grows.
        wait_for(&echoes, 6);
        for x in xs {
            x.finish().unwrap();
        }
        let n = echoes.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(echoes.load(Ordering::Relaxed), n);
    }

    #[test]
    fn interleaved_round_trips_share_the_duration_and_report_echo_errors() {
        // Each round trip takes 2 ms and an exchange has 40 ms in all, over
        // 4 rounds: about 20 round trips each, not the 1000 asked for, and
        // every round gets some.
        let limits = Limits {
            messages: 1000,
            duration: Duration::from_millis(40),
        };
        let log = Rc::new(RefCell::new(Vec::new()));
        let echoes = Arc::new(AtomicU64::new(0));
        let slow = |id| {
            let (log, echoes) = (log.clone(), echoes.clone());
            Exchange::spawn(
                move || {
                    echoes.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(1));
                    Ok::<(), std::io::Error>(())
                },
                move || -> Result<bool, std::io::Error> {
                    log.borrow_mut().push(id);
                    std::thread::sleep(Duration::from_millis(2));
                    Ok(true)
                },
            )
        };
        let mut xs = [slow(0), slow(1)];
        let timed = interleaved_round_trips(limits, 4, &mut xs, &ProgressBar::hidden()).unwrap();
        for t in &timed {
            let n = t.hist.len();
            // At most 40 ms of 2 ms round trips plus one overrun per round.
            assert!((2..=24).contains(&n), "{n} round trips in 40 ms");
        }
        // The turns alternate: warm-up, then both exchanges in each round.
        let log = log.borrow();
        let changes = log.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(changes >= 3, "{log:?}");
        drop(xs);

        let tried = Arc::new(AtomicU64::new(0));
        let failing = fake(0, &Rc::new(RefCell::new(Vec::new())), 0, &tried, true);
        wait_for(&tried, 1);
        let e = failing.finish().unwrap_err().to_string();
        assert_eq!(e, "echo failed");
    }

    #[test]
    fn round_trips_stop_at_the_count_and_count_timeouts() {
        let limits = Limits {
            messages: 10,
            duration: Duration::from_secs(10),
        };
        let mut n = 0;
        let (hist, lost) = round_trips::<()>(limits, &ProgressBar::hidden(), || {
            n += 1;
            Ok(n % 5 != 0)
        })
        .unwrap();
        assert_eq!(hist.len() + lost, 10);
        assert!(lost >= 1);
    }
}
