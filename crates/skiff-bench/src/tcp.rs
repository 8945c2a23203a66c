//! The TCP floors: one TCP connection on the same path as the skiff rows
//! beside them, with plain `std::net` calls and nothing of skiff's.
//!
//! - request: one round trip between two threads over loopback, the floor
//!   of a request through a node;
//! - tunnel: the tunnel's bulk and small-message streams and its ping-pong
//!   over one TCP connection on the tunnel's host (ports `--port`+1 and
//!   +3 when fixed, so that bench/tunnel.sh's firewall rule drops their
//!   packets too).

use std::error::Error;
use std::io::{BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use skiff_cli::bench::report::{histogram, record, CpuMeter, Row};
use skiff_cli::bench::tunnel::TunnelParams;
use skiff_cli::bench::{round_trips, Limits};

/// One TCP round trip between two threads over loopback, timed for `dur`
/// after 1000 of warm-up: the floor of request/reply through a node (a
/// request crosses the node twice, so this is about half of the best
/// possible). A row `tcp-pingpong`, `floor`.
pub(crate) fn request_floor(size: usize, dur: Duration) -> Result<Row, Box<dyn Error>> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
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
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut buf = vec![0x5au8; size];
    let mut hist = histogram();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < dur {
        let t = Instant::now();
        s.write_all(&buf)?;
        s.read_exact(&mut buf)?;
        if n >= 1000 {
            record(&mut hist, t.elapsed());
        }
        n += 1;
    }
    drop(s);
    let _ = echo.join();
    let mut row = Row::new("tcp-pingpong", "floor", size);
    row.set_latency(&hist);
    row.set_throughput(hist.len(), start.elapsed());
    Ok(row)
}

/// The tunnel's one-way stream over one TCP connection (a row `test`,
/// `tcp`); `buffered` writes through a 64 KiB `BufWriter`, the TCP
/// analogue of the tunnel packing small messages into packets.
pub(crate) fn stream(
    args: &TunnelParams,
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
        while sent < limits.messages && !limits.timed_out(sent, start) {
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

/// Round trips of one `--size` message each way over TCP with
/// `TCP_NODELAY`: a row `pingpong`, `tcp`.
pub(crate) fn pingpong(
    args: &TunnelParams,
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
