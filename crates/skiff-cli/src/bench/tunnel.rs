//! `skiff bench tunnel`: a reliable tunnel against plain TCP on the same
//! path, in one process and one run.
//!
//! - `bulk`: `--bytes` (default 1 GiB) in `--chunk`-byte messages through
//!   a tunnel (`tunnel`) and through one TCP connection (`tcp`, plain
//!   `write_all`/`read`); goodput is payload bytes over the time from the
//!   first send to the last byte received.
//! - `msgs`: `--messages` messages of `--size` bytes (64 B by default)
//!   through a tunnel (one `send` each) and through TCP (each message one
//!   64-byte record written through a 64 KiB `BufWriter`, the TCP analogue
//!   of the tunnel packing small messages into packets).
//! - `pingpong`: one `--size` message each way, timed per round trip,
//!   through a tunnel and through TCP with `TCP_NODELAY`.
//!
//! Every test stops at its count or after `--duration-secs`, whichever
//! comes first. With `--port P` the receivers bind fixed ports (tunnel P,
//! TCP P+1, tunnel ping-pong P+2, TCP ping-pong P+3) so that a firewall
//! rule can drop packets on their way to the receivers only, as
//! `bench/tunnel.sh` does in a network namespace.

use std::error::Error;
use std::io::{BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use indicatif::ProgressBar;
use skiff::{Endpoint, Tunnel};

use super::report::{self, CpuMeter, Reporter, Row};
use super::{parse_secs, parse_size, round_trips, Limits, OutputArgs};

/// The tests `skiff bench tunnel` can run.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Test {
    /// Bulk goodput.
    Bulk,
    /// Small-message rate.
    Msgs,
    /// Round-trip latency.
    Pingpong,
}

/// `skiff bench tunnel`
#[derive(clap::Args, Debug)]
pub(crate) struct TunnelArgs {
    /// Bytes per bulk test (`1024m` = 1 GiB).
    #[arg(long, value_parser = parse_size, default_value = "1024m")]
    pub(crate) bytes: usize,
    /// Message size of the bulk tests.
    #[arg(long, value_parser = parse_size, default_value = "64k")]
    pub(crate) chunk: usize,
    /// Messages per small-message test.
    #[arg(long, default_value_t = 2_000_000)]
    pub(crate) messages: u64,
    /// Message size of the small-message and ping-pong tests.
    #[arg(long, value_parser = parse_size, default_value = "64")]
    pub(crate) size: usize,
    /// Round trips per ping-pong test (after up to 1000 of warm-up).
    #[arg(long, default_value_t = 20_000)]
    pub(crate) round_trips: u64,
    /// Longest time one test runs, in seconds.
    #[arg(long, value_parser = parse_secs, default_value = "20")]
    pub(crate) duration_secs: Duration,
    /// The tunnel's datagram size (`mtu`): 1472 fits an Ethernet frame;
    /// loopback carries up to 65507.
    #[arg(long, default_value_t = 1472)]
    pub(crate) mtu: usize,
    /// More endpoint locator options, joined by `&` (e.g. `window=512`).
    #[arg(long, default_value = "")]
    pub(crate) options: String,
    /// Address the receivers bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) host: String,
    /// First fixed receiver port (0: ports the OS picks); see the module
    /// documentation.
    #[arg(long, default_value_t = 0)]
    pub(crate) port: u16,
    /// A label appended to every row's mode (e.g. `drop=1.4%`).
    #[arg(long, default_value = "")]
    pub(crate) label: String,
    /// Tests to run.
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "bulk,msgs,pingpong"
    )]
    pub(crate) tests: Vec<Test>,
    /// Output format.
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

impl TunnelArgs {
    fn mode(&self, what: &str) -> String {
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

    fn port(&self, offset: u16) -> u16 {
        if self.port == 0 {
            0
        } else {
            self.port + offset
        }
    }
}

/// Runs the tests asked for.
pub(crate) fn run(args: &TunnelArgs, out: &mut Reporter) -> Result<(), Box<dyn Error>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let show = out.progress_enabled();
    let wants = |t: Test| args.tests.contains(&t);
    if wants(Test::Bulk) {
        let n = (args.bytes / args.chunk.max(1)).max(1) as u64;
        let limits = Limits {
            messages: n,
            duration: args.duration_secs,
        };
        let pb = report::progress(show, n, "tunnel bulk");
        let row = tunnel_stream(&rt, args, args.chunk, limits, "bulk", &pb);
        pb.finish_and_clear();
        out.push(row?)?;
        let pb = report::spinner(show, "tcp bulk");
        let row = tcp_stream(args, args.chunk, limits, "bulk", false);
        pb.finish_and_clear();
        out.push(row?)?;
    }
    if wants(Test::Msgs) {
        let limits = Limits {
            messages: args.messages,
            duration: args.duration_secs,
        };
        let pb = report::progress(show, args.messages, "tunnel msgs");
        let row = tunnel_stream(&rt, args, args.size, limits, "msgs", &pb);
        pb.finish_and_clear();
        out.push(row?)?;
        let pb = report::spinner(show, "tcp msgs");
        let row = tcp_stream(args, args.size, limits, "msgs", true);
        pb.finish_and_clear();
        out.push(row?)?;
    }
    if wants(Test::Pingpong) {
        let limits = Limits {
            messages: args.round_trips,
            duration: args.duration_secs,
        };
        let pb = report::progress(show, limits.messages, "tunnel pingpong");
        let row = tunnel_pingpong(&rt, args, limits, &pb);
        pb.finish_and_clear();
        out.push(row?)?;
        let pb = report::progress(show, limits.messages, "tcp pingpong");
        let row = tcp_pingpong(args, limits, &pb);
        pb.finish_and_clear();
        out.push(row?)?;
    }
    Ok(())
}

/// The label of a row's mode (what `--label` added), or "".
fn label(r: &Row) -> &str {
    let skip = if r.mode.starts_with("tunnel") { 2 } else { 1 };
    r.mode.splitn(skip + 1, ' ').nth(skip).unwrap_or("")
}

/// The target that one run can check: tunnel bulk goodput at
/// least 0.8x TCP's on the same path (rows with the same label). The
/// targets across runs (goodput and p99 at 1.4 % drop against lossless)
/// are checked by `bench/tunnel.sh`.
pub(crate) fn targets(rows: &[Row]) -> Vec<String> {
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let mut out = Vec::new();
    for t in rows
        .iter()
        .filter(|r| r.test == "bulk" && r.mode.starts_with("tunnel"))
    {
        let tcp = rows
            .iter()
            .find(|r| r.test == "bulk" && r.mode.starts_with("tcp") && label(r) == label(t));
        if let (Some(a), Some(b)) = (t.mb_per_s, tcp.and_then(|r| r.mb_per_s)) {
            out.push(format!(
                "target: tunnel bulk >= 0.8x tcp ({}): {:.2}x ({a:.0} vs {b:.0} MB/s): {}",
                t.mode,
                a / b.max(1e-9),
                verdict(a >= 0.8 * b)
            ));
        }
    }
    out
}

fn endpoints(args: &TunnelArgs, port: u16) -> Result<(Endpoint, Endpoint), Box<dyn Error>> {
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

/// A one-way stream of `limits.messages` messages of `size` bytes.
fn tunnel_stream(
    rt: &tokio::runtime::Runtime,
    args: &TunnelArgs,
    size: usize,
    limits: Limits,
    test: &str,
    pb: &ProgressBar,
) -> Result<Row, Box<dyn Error>> {
    let (server, client) = endpoints(args, args.port(0))?;
    let mut row = Row::new(test, &args.mode("tunnel"), size);
    rt.block_on(async {
        let (c, s) = pair(&server, &client).await?;
        let cpu = CpuMeter::start();
        let start = Instant::now();
        let receiver = tokio::spawn(async move {
            let mut n = 0u64;
            let mut last = Instant::now();
            while let Some(_m) = s.recv().await? {
                n += 1;
                last = Instant::now();
            }
            Ok::<_, skiff::TunnelError>((n, last))
        });
        let msg = Bytes::from(vec![0xA5u8; size]);
        let mut sent = 0u64;
        while sent < limits.messages && start.elapsed() < limits.duration {
            c.send(msg.clone()).await?;
            sent += 1;
            if sent.is_multiple_of(256) {
                pb.set_position(sent);
            }
        }
        c.close().await?;
        let (got, last) = receiver.await??;
        row.set_throughput(got, last - start);
        row.messages = sent;
        row.lost = Some(sent - got);
        row.cpu_pct = Some(cpu.pct());
        let st = c.stats();
        row.batches = Some(st.packets_sent);
        row.dropped = Some(st.retransmits);
        row.options = Some(args.locator(args.port(0)));
        Ok::<_, Box<dyn Error>>(())
    })?;
    Ok(row)
}

/// The same stream over one TCP connection; `buffered` writes through a
/// 64 KiB `BufWriter`.
fn tcp_stream(
    args: &TunnelArgs,
    size: usize,
    limits: Limits,
    test: &str,
    buffered: bool,
) -> Result<Row, Box<dyn Error>> {
    let l = TcpListener::bind((args.host.as_str(), args.port(1)))?;
    let addr = l.local_addr()?;
    let receiver = std::thread::spawn(move || -> std::io::Result<(u64, Instant)> {
        let (mut s, _) = l.accept()?;
        let mut buf = vec![0u8; 256 << 10];
        let mut total = 0u64;
        let mut last = Instant::now();
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Ok((total, last));
            }
            total += n as u64;
            last = Instant::now();
        }
    });
    let cpu = CpuMeter::start();
    let start = Instant::now();
    let s = TcpStream::connect(addr)?;
    let msg = vec![0xA5u8; size];
    let mut sent = 0u64;
    {
        let mut w: Box<dyn Write> = if buffered {
            Box::new(BufWriter::with_capacity(64 << 10, &s))
        } else {
            Box::new(&s)
        };
        while sent < limits.messages && start.elapsed() < limits.duration {
            w.write_all(&msg)?;
            sent += 1;
        }
        w.flush()?;
    }
    s.shutdown(std::net::Shutdown::Write)?;
    let (bytes, last) = receiver.join().map_err(|_| "tcp receiver panicked")??;
    let got = bytes / size as u64;
    let mut row = Row::new(test, &args.mode("tcp"), size);
    row.set_throughput(got, last - start);
    row.messages = sent;
    row.lost = Some(sent - got);
    row.cpu_pct = Some(cpu.pct());
    row.options = Some(format!("tcp://{addr}"));
    Ok(row)
}

fn tunnel_pingpong(
    rt: &tokio::runtime::Runtime,
    args: &TunnelArgs,
    limits: Limits,
    pb: &ProgressBar,
) -> Result<Row, Box<dyn Error>> {
    let (server, client) = endpoints(args, args.port(2))?;
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

fn tcp_pingpong(
    args: &TunnelArgs,
    limits: Limits,
    pb: &ProgressBar,
) -> Result<Row, Box<dyn Error>> {
    let l = TcpListener::bind((args.host.as_str(), args.port(3)))?;
    let addr: SocketAddr = l.local_addr()?;
    let size = args.size;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = l.accept()?;
        s.set_nodelay(true)?;
        let mut buf = vec![0u8; size];
        loop {
            if s.read_exact(&mut buf).is_err() {
                return Ok(());
            }
            s.write_all(&buf)?;
        }
    });
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let msg = vec![0x5Au8; size];
    let mut buf = vec![0u8; size];
    let (hist, _lost) = round_trips(limits, pb, || -> std::io::Result<bool> {
        s.write_all(&msg)?;
        s.read_exact(&mut buf)?;
        Ok(true)
    })?;
    drop(s);
    let _ = echo.join();
    let mut row = Row::new("pingpong", &args.mode("tcp"), size);
    row.set_latency(&hist);
    row.options = Some(format!("tcp://{addr}"));
    Ok(row)
}
