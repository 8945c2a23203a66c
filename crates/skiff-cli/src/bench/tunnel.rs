//! `skiff bench tunnel`: a reliable tunnel (a QMP association) on
//! loopback or the path `--host` names, in one process and one run.
//!
//! - `bulk`: `--bytes` (default 1 GiB) in `--chunk`-byte messages through
//!   a tunnel; goodput is payload bytes over the time from the first send
//!   to the last byte received.
//! - `msgs`: `--messages` messages of `--size` bytes (64 B by default),
//!   one `send` each (each `recv` returns one message).
//! - `stream`: the same count of `--size`-byte writes into the tunnel's
//!   byte stream, read back as bytes ([`skiff::TunnelStream`]): what a TCP
//!   connection carrying 64 B records does. The writes go through a tokio
//!   `BufWriter` of `--stream-buffer` bytes (64 KiB, as the TCP rows of
//!   skiff-bench go through a 64 KiB `BufWriter`: like for like); with
//!   `--stream-buffer 0` each is one [`Tunnel::write_all`], gathered by the
//!   tunnel as a TCP send buffer gathers small writes.
//! - `pingpong`: one `--size` message each way, timed per round trip.
//!
//! Every test stops at its count or after `--duration-secs`, whichever
//! comes first. With `--port P` the receivers bind fixed ports (tunnel P,
//! tunnel ping-pong P+2; P+1 and P+3 are kept for skiff-bench's TCP rows)
//! so that a firewall rule can drop packets on their way to the receivers
//! only, as `bench/tunnel.sh` does in a network namespace.

use std::error::Error;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use indicatif::ProgressBar;
use skiff::{Endpoint, Tunnel};

use super::report::{self, CpuMeter, Reporter, Row};
use super::{parse_secs, parse_size, round_trips, Limits, OutputArgs};

/// The tests `skiff bench tunnel` can run.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// Bulk goodput.
    Bulk,
    /// Small-message rate.
    Msgs,
    /// Small writes into the tunnel's byte stream.
    Stream,
    /// Round-trip latency.
    Pingpong,
}

impl Test {
    /// The test's name in rows.
    pub fn name(self) -> &'static str {
        match self {
            Test::Bulk => "bulk",
            Test::Msgs => "msgs",
            Test::Stream => "stream",
            Test::Pingpong => "pingpong",
        }
    }
}

/// `skiff bench tunnel`
#[derive(clap::Args, Debug)]
pub struct TunnelArgs {
    /// What to measure and how.
    #[command(flatten)]
    pub params: TunnelParams,
    /// Output format.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// The tunnel benchmark's settings, shared with skiff-bench.
#[derive(clap::Args, Debug, Clone)]
pub struct TunnelParams {
    /// Bytes per bulk test (`1024m` = 1 GiB).
    #[arg(long, value_parser = parse_size, default_value = "1024m")]
    pub bytes: usize,
    /// Message size of the bulk tests.
    #[arg(long, value_parser = parse_size, default_value = "64k")]
    pub chunk: usize,
    /// Messages per small-message test.
    #[arg(long, default_value_t = 2_000_000)]
    pub messages: u64,
    /// Message size of the small-message and ping-pong tests.
    #[arg(long, value_parser = parse_size, default_value = "64")]
    pub size: usize,
    /// Round trips per ping-pong test (after up to 1000 of warm-up).
    #[arg(long, default_value_t = 20_000)]
    pub round_trips: u64,
    /// Longest time one test runs, in seconds.
    #[arg(long, value_parser = parse_secs, default_value = "20")]
    pub duration_secs: Duration,
    /// The tunnel's datagram size (`mtu`): 1472 fits an Ethernet frame;
    /// loopback carries up to 65507.
    #[arg(long, default_value_t = 1472)]
    pub mtu: usize,
    /// More endpoint locator options, joined by `&` (e.g. `window=512`).
    #[arg(long, default_value = "")]
    pub options: String,
    /// User-space write buffer of the `stream` test, in bytes (0: none):
    /// the tunnel's writes then go through a tokio `BufWriter` of this
    /// size, as the TCP rows' go through a 64 KiB `BufWriter`.
    #[arg(long, value_parser = parse_buffer, default_value = "64k")]
    pub stream_buffer: usize,
    /// Address the receivers bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// First fixed receiver port (0: ports the OS picks); see the module
    /// documentation.
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// A label appended to every row's mode (e.g. `drop=1.4%`).
    #[arg(long, default_value = "")]
    pub label: String,
    /// Tests to run.
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "bulk,msgs,stream,pingpong"
    )]
    pub tests: Vec<Test>,
    /// Runs of each test; the row printed is the median run (by its MB/s,
    /// msgs/s or p50), with the lowest and highest figure beside it. On a
    /// shared or virtual machine one run can stray by half; skiff-bench
    /// alternates the tunnel's runs with TCP's.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=101))]
    pub repeat: u32,
}

impl TunnelParams {
    /// The mode of a row of `what` (`tunnel`, or `tcp` in skiff-bench):
    /// the tunnel's mtu and the label.
    pub fn mode(&self, what: &str) -> String {
        let mut m = what.to_string();
        if what == "tunnel" {
            m.push_str(&format!(" mtu={}", self.mtu));
        }
        if !self.label.is_empty() {
            m.push(' ');
            m.push_str(&self.label);
        }
        m
    }

    fn locator(&self, port: u16) -> String {
        let mut l = format!(
            "udp://{}:{port}?mtu={}&idle_timeout=30s",
            self.host, self.mtu
        );
        if !self.options.is_empty() {
            l.push('&');
            l.push_str(&self.options);
        }
        l
    }

    /// The receiver port of test `offset` (see the module documentation),
    /// or 0 when the OS picks.
    pub fn port(&self, offset: u16) -> u16 {
        if self.port == 0 {
            0
        } else {
            self.port + offset
        }
    }

    /// Whether test `t` is asked for.
    pub fn wants(&self, t: Test) -> bool {
        self.tests.contains(&t)
    }

    /// When test `t` stops.
    pub fn limits(&self, t: Test) -> Limits {
        match t {
            Test::Bulk => self.bulk_limits(),
            Test::Msgs | Test::Stream => self.msgs_limits(),
            Test::Pingpong => self.pingpong_limits(),
        }
    }

    /// When the bulk tests stop.
    pub fn bulk_limits(&self) -> Limits {
        Limits {
            messages: (self.bytes / self.chunk.max(1)).max(1) as u64,
            duration: self.duration_secs,
        }
    }

    /// When the small-message tests stop.
    pub fn msgs_limits(&self) -> Limits {
        Limits {
            messages: self.messages,
            duration: self.duration_secs,
        }
    }

    /// When the ping-pong tests stop.
    pub fn pingpong_limits(&self) -> Limits {
        Limits {
            messages: self.round_trips,
            duration: self.duration_secs,
        }
    }
}

/// A buffer size: 0, or a size as `parse_size` reads it.
fn parse_buffer(s: &str) -> Result<usize, String> {
    if s == "0" {
        Ok(0)
    } else {
        parse_size(s)
    }
}

/// The runtime the tunnels run on.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// Runs the tests asked for.
pub fn run(args: &TunnelArgs, out: &mut Reporter) -> Result<(), Box<dyn Error>> {
    let p = &args.params;
    let rt = runtime()?;
    for t in p.tests.iter().copied() {
        let mut runs = Vec::new();
        for _ in 0..p.repeat {
            runs.push(run_one(&rt, p, t, out.progress_enabled())?);
        }
        if let Some(row) = Row::median(runs) {
            out.push(row)?;
        }
    }
    Ok(())
}

/// Runs test `t` through a tunnel: its row (the one row printer that
/// `skiff bench tunnel` and skiff-bench share).
pub fn run_one(
    rt: &tokio::runtime::Runtime,
    p: &TunnelParams,
    t: Test,
    show: bool,
) -> Result<Row, Box<dyn Error>> {
    let limits = p.limits(t);
    let pb = report::progress(show, limits.messages, &format!("tunnel {}", t.name()));
    let row = match t {
        Test::Bulk => stream(rt, p, p.chunk, limits, "bulk", &pb),
        Test::Msgs => stream(rt, p, p.size, limits, "msgs", &pb),
        Test::Stream => byte_stream(rt, p, p.size, limits, &pb),
        Test::Pingpong => pingpong(rt, p, limits, &pb),
    };
    pb.finish_and_clear();
    row
}

/// The two endpoints of a row, bound inside `rt` so that their drivers
/// are tasks on it (`driver=auto`), as a tokio application's are.
fn endpoints(
    rt: &tokio::runtime::Runtime,
    args: &TunnelParams,
    port: u16,
) -> Result<(Endpoint, Endpoint), Box<dyn Error>> {
    let _in = rt.enter();
    let server = Endpoint::bind(&args.locator(port))?;
    server.listen();
    let client = Endpoint::bind(&args.locator(0))?;
    Ok((server, client))
}

async fn pair(server: &Endpoint, client: &Endpoint) -> Result<(Tunnel, Tunnel), Box<dyn Error>> {
    let (c, s) = tokio::join!(
        client.connect(server.local_addr(), Duration::from_secs(5)),
        server.accept()
    );
    Ok((c?, s?))
}

/// A one-way stream of `limits.messages` messages of `size` bytes through
/// a tunnel: a row `test` (`bulk` or `msgs`), `tunnel mtu=…`.
pub fn stream(
    rt: &tokio::runtime::Runtime,
    args: &TunnelParams,
    size: usize,
    limits: Limits,
    test: &str,
    pb: &ProgressBar,
) -> Result<Row, Box<dyn Error>> {
    let (server, client) = endpoints(rt, args, args.port(0))?;
    let mut row = Row::new(test, &args.mode("tunnel"), size);
    rt.block_on(async {
        let (c, s) = pair(&server, &client).await?;
        let cpu = CpuMeter::start();
        let start = Instant::now();
        let bulk = test == "bulk";
        let receiver = tokio::spawn(async move {
            // Messages are taken as many as are ready at a time
            // (`recv_each`: each lent where it lies, its bytes counted), as
            // a reader of a stream of records takes what one read
            // returned. The clock is read when the receiver catches
            // up (the next message is not there yet), not once per message:
            // that stamp is the time of the last message taken.
            // Bulk messages are taken in the pieces they arrived in
            // (`recv_parts`), as a TCP reader takes what one read returned,
            // without a copy into one buffer.
            const BATCH: usize = 256;
            let mut n = 0u64;
            let mut bytes = 0usize;
            let mut last = Instant::now();
            let mut got = Vec::with_capacity(BATCH);
            loop {
                got.clear();
                let k = if bulk {
                    let ready =
                        s.poll_recv_parts(&mut Context::from_waker(Waker::noop()), &mut got);
                    let m = match ready {
                        Poll::Ready(m) => m?,
                        Poll::Pending => {
                            last = Instant::now();
                            s.recv_parts(&mut got).await?
                        }
                    };
                    usize::from(m.is_some())
                } else {
                    let ready =
                        s.poll_recv_each(&mut Context::from_waker(Waker::noop()), BATCH, |m| {
                            bytes += m.len()
                        });
                    match ready {
                        Poll::Ready(k) => k?,
                        Poll::Pending => {
                            last = Instant::now();
                            s.recv_each(BATCH, |m| bytes += m.len()).await?
                        }
                    }
                };
                if k == 0 {
                    break;
                }
                n += k as u64;
            }
            if n > 0 && last < start {
                last = Instant::now();
            }
            if !bulk {
                assert_eq!(bytes as u64, n * size as u64, "every message whole");
            }
            Ok::<_, skiff::TunnelError>((n, last))
        });
        // The message is static (leaked once per row), as TCP's row writes
        // from a borrowed buffer: a send then takes no reference to it (a
        // shared `Bytes` costs two atomic operations per message on the
        // sending thread, its clone and its drop).
        let msg: &'static [u8] = Vec::leak(vec![0xA5u8; size]);
        let mut sent = 0u64;
        while sent < limits.messages && !limits.timed_out(sent, start) {
            c.send(Bytes::from_static(msg)).await?;
            sent += 1;
            if sent.is_multiple_of(256) {
                pb.set_position(sent);
            }
        }
        c.close().await?;
        let (got, last) = receiver.await??;
        let run = Run {
            sent,
            got,
            took: last - start,
            cpu: cpu.pct(),
        };
        run.fill(&mut row, &c, args.locator(args.port(0)));
        Ok::<_, Box<dyn Error>>(())
    })?;
    Ok(row)
}

/// `limits.messages` writes of `size` bytes into a tunnel's byte stream,
/// read back as bytes: a row `stream`, `tunnel mtu=…` (messages are the
/// bytes received over `size`).
pub fn byte_stream(
    rt: &tokio::runtime::Runtime,
    args: &TunnelParams,
    size: usize,
    limits: Limits,
    pb: &ProgressBar,
) -> Result<Row, Box<dyn Error>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (server, client) = endpoints(rt, args, args.port(0))?;
    let mut row = Row::new("stream", &args.mode("tunnel"), size);
    rt.block_on(async {
        let (c, s) = pair(&server, &client).await?;
        let cpu = CpuMeter::start();
        let start = Instant::now();
        let receiver = tokio::spawn(async move {
            let mut s = s.into_stream();
            let mut buf = vec![0u8; 256 << 10];
            let mut total = 0u64;
            let mut last = Instant::now();
            loop {
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    return Ok::<_, std::io::Error>((total, last));
                }
                total += n as u64;
                last = Instant::now();
            }
        });
        let msg = vec![0xA5u8; size];
        let mut sent = 0u64;
        let mut w = tokio::io::BufWriter::with_capacity(args.stream_buffer, c.into_stream());
        while sent < limits.messages && !limits.timed_out(sent, start) {
            if args.stream_buffer == 0 {
                w.get_ref().tunnel().write_all(&msg).await?;
            } else {
                w.write_all(&msg).await?;
            }
            sent += 1;
            if sent.is_multiple_of(4096) {
                pb.set_position(sent);
            }
        }
        w.flush().await?;
        let c = w.into_inner();
        c.tunnel().close().await?;
        let (bytes, last) = receiver.await??;
        let run = Run {
            sent,
            got: bytes / size.max(1) as u64,
            took: last - start,
            cpu: cpu.pct(),
        };
        let mut options = args.locator(args.port(0));
        if args.stream_buffer > 0 {
            options.push_str(&format!(" + BufWriter {}", args.stream_buffer));
        }
        run.fill(&mut row, c.tunnel(), options);
        Ok::<_, Box<dyn Error>>(())
    })?;
    Ok(row)
}

/// What a one-way test measured, for its row.
struct Run {
    sent: u64,
    got: u64,
    took: Duration,
    cpu: f64,
}

impl Run {
    /// Fills `row` with this run and the sending tunnel's counters.
    fn fill(&self, row: &mut Row, c: &Tunnel, options: String) {
        row.set_throughput(self.got, self.took);
        row.messages = self.sent;
        row.lost = Some(self.sent - self.got);
        row.cpu_pct = Some(self.cpu);
        let st = c.stats();
        row.batches = Some(st.packets_sent);
        row.dropped = Some(st.retransmits);
        row.options = Some(options);
    }
}

/// Round trips of one `--size` message each way through a tunnel: a row
/// `pingpong`, `tunnel mtu=…`.
pub fn pingpong(
    rt: &tokio::runtime::Runtime,
    args: &TunnelParams,
    limits: Limits,
    pb: &ProgressBar,
) -> Result<Row, Box<dyn Error>> {
    let (server, client) = endpoints(rt, args, args.port(2))?;
    let (c, s) = rt.block_on(pair(&server, &client))?;
    let echo = rt.spawn(async move {
        while let Ok(Some(m)) = s.recv().await {
            if s.send(m).await.is_err() {
                break;
            }
        }
    });
    let c = Arc::new(c);
    let msg = Bytes::from(vec![0x5Au8; args.size]);
    let (hist, _lost) = round_trips(limits, pb, || {
        rt.block_on(async {
            c.send(msg.clone()).await?;
            c.recv().await.map(|m| m.is_some())
        })
    })?;
    rt.block_on(c.close())?;
    let _ = rt.block_on(echo);
    let mut row = Row::new("pingpong", &args.mode("tunnel"), args.size);
    row.set_latency(&hist);
    row.options = Some(args.locator(args.port(2)));
    Ok(row)
}
