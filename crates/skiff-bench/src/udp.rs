//! The UDP floors `skiff-bench queue` compares the queue with, measured in
//! the same run with plain sockets and nothing of skiff's:
//!
//! - `udp` / `datagram-per-msg`: a sender thread sends each message as its
//!   own datagram (one `send` per message) to a receiver thread on
//!   127.0.0.1 that reads one datagram per `recv`. Loopback never blocks
//!   the sender, so what the receiver cannot keep up with is lost in the
//!   kernel and reported as `lost`.
//! - `udp-pingpong` / `blocking`: one datagram each way between two threads
//!   blocked in `recv`; the round trip is the latency floor of any
//!   datagram protocol on this machine.
//! - `udp-pingpong` / `unconnected`: the same on unconnected sockets
//!   (`send_to`, `recv_from`), as an exchange that answers whoever sent
//!   must run: a route lookup per send and the source per receive. The
//!   like-for-like floor of a queue that talks to many peers.
//! - `udp-pingpong` / `queue-calls`: the same exchange made with the
//!   system calls the queue's natural-batching ping-pong makes (skiff's
//!   `UdpSocket`: `sendto` on an unconnected socket, which a queue talking
//!   to many peers must use, and one blocking `recvfrom` with the source
//!   address and a receive timeout), and no queue:
//!   the floor of any queue built on those calls, so a ping-pong row splits
//!   into system calls and the queue's own work.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use socket2::{Domain, Protocol, Socket, Type};

use skiff_cli::bench::report::{CpuMeter, Row};
use skiff_cli::bench::{Exchange, Limits, PingPong, Window, QUIET, STALL};

/// A UDP socket bound to 127.0.0.1 on a free port with both socket
/// buffers asked to be `sockbuf` bytes (the kernel caps this at
/// `net.core.rmem_max`/`wmem_max`).
fn socket(sockbuf: usize) -> io::Result<UdpSocket> {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    s.set_recv_buffer_size(sockbuf)?;
    s.set_send_buffer_size(sockbuf)?;
    s.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())?;
    Ok(s.into())
}

/// Throughput of one datagram per message: `limits.messages` datagrams of
/// `size` bytes, or as many as fit in `limits.duration`.
pub(crate) fn udp_throughput(
    size: usize,
    limits: Limits,
    sockbuf: usize,
    window: u64,
    pb: &ProgressBar,
) -> io::Result<Row> {
    let rx = socket(sockbuf)?;
    let tx = socket(sockbuf)?;
    tx.connect(rx.local_addr()?)?;
    rx.set_read_timeout(Some(Duration::from_millis(20)))?;

    let sent = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(2));
    let window = Arc::new(Window::new(window, sockbuf / 2, size, STALL));
    let cpu = CpuMeter::start();

    let sender = {
        let (sent, done, barrier, window) =
            (sent.clone(), done.clone(), barrier.clone(), window.clone());
        thread::spawn(move || -> io::Result<()> {
            let buf = vec![0xA5u8; size];
            barrier.wait();
            let start = Instant::now();
            let (mut n, mut forgiven) = (0u64, 0u64);
            while n < limits.messages {
                window.wait(n, &mut forgiven);
                // One system call per message is the point of this floor;
                // a full buffer (ENOBUFS) loses the message like the wire.
                match tx.send(&buf) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
                    Err(e) => return Err(e),
                }
                n += 1;
                if n.is_multiple_of(1024) {
                    sent.store(n, Ordering::Release);
                    if start.elapsed() >= limits.duration {
                        break;
                    }
                }
            }
            sent.store(n, Ordering::Release);
            done.store(true, Ordering::Release);
            Ok(())
        })
    };

    let mut buf = vec![0u8; 65536];
    barrier.wait();
    let start = Instant::now();
    let mut last = start;
    let mut received = 0u64;
    let mut shown = 0u64;
    loop {
        match rx.recv(&mut buf) {
            Ok(_) => {
                received += 1;
                window.received(received);
                last = Instant::now();
                if received - shown >= 4096 {
                    pb.inc(received - shown);
                    shown = received;
                }
                continue;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        // The socket was empty for a read timeout.
        if done.load(Ordering::Acquire)
            && (received >= sent.load(Ordering::Acquire) || last.elapsed() >= QUIET)
        {
            break;
        }
    }
    let end = if received > 0 {
        last.max(start)
    } else {
        Instant::now()
    };
    sender
        .join()
        .map_err(|_| io::Error::other("udp sender thread panicked"))??;
    pb.inc(received - shown);
    let messages = sent.load(Ordering::Acquire);

    let mut row = Row::new("udp", "datagram-per-msg", size);
    row.messages = messages;
    row.set_throughput(received, end - start);
    row.batches = Some(messages);
    row.lost = Some(messages.saturating_sub(received));
    row.cpu_pct = Some(cpu.pct());
    row.options = Some(format!(
        "127.0.0.1 send()/recv() per message, rcvbuf={sockbuf}, window={}",
        window.limit()
    ));
    Ok(row)
}

/// Whether a receive error only means "nothing yet" (a timeout or a
/// signal): the ping-pong loops go on.
fn nothing_yet(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// Waits for the echo with `recv` (a blocking receive with a timeout):
/// `true` when it came, `false` when the timeout passed first.
fn pong(mut recv: impl FnMut() -> io::Result<()>) -> io::Result<bool> {
    loop {
        match recv() {
            Ok(()) => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if nothing_yet(&e) => return Ok(false),
            Err(e) => return Err(e),
        }
    }
}

/// A ping-pong row of `mode` ready to time: `ping` sends one datagram and
/// waits for the echo (`false` if none came in time), while a thread runs
/// `echo` (wait a little for a datagram, send it back) until the row is
/// done.
fn pingpong(
    mode: &str,
    size: usize,
    options: &str,
    echo: impl FnMut() -> io::Result<()> + Send + 'static,
    ping: impl FnMut() -> io::Result<bool> + 'static,
) -> PingPong {
    let mut row = Row::new("udp-pingpong", mode, size);
    row.options = Some(options.into());
    PingPong {
        row,
        exchange: Exchange::spawn(echo, ping),
    }
}

/// Round trips of one `size`-byte datagram each way between two threads.
pub(crate) fn udp_pingpong(size: usize) -> io::Result<PingPong> {
    let a = socket(1 << 20)?;
    let b = socket(1 << 20)?;
    a.connect(b.local_addr()?)?;
    b.connect(a.local_addr()?)?;
    b.set_read_timeout(Some(Duration::from_millis(50)))?;
    a.set_read_timeout(Some(Duration::from_secs(1)))?;
    let mut echo_buf = vec![0u8; 65536];
    let echo = move || match b.recv(&mut echo_buf) {
        Ok(n) => b.send(&echo_buf[..n]).map(drop),
        Err(e) if nothing_yet(&e) => Ok(()),
        Err(e) => Err(e),
    };
    let ping = vec![0x5Au8; size];
    let mut buf = vec![0u8; 65536];
    Ok(pingpong(
        "blocking",
        size,
        "127.0.0.1 one datagram each way, blocking recv",
        echo,
        move || {
            a.send(&ping)?;
            pong(|| a.recv(&mut buf).map(drop))
        },
    ))
}

/// Round trips of one `size`-byte datagram each way between two threads on
/// unconnected sockets (`send_to`, `recv_from`): a plain UDP exchange that
/// can answer anyone, as a multi-peer queue can (see the module
/// documentation).
pub(crate) fn udp_pingpong_unconnected(size: usize) -> io::Result<PingPong> {
    let a = socket(1 << 20)?;
    let b = socket(1 << 20)?;
    let ba = b.local_addr()?;
    b.set_read_timeout(Some(Duration::from_millis(50)))?;
    a.set_read_timeout(Some(Duration::from_secs(1)))?;
    let mut echo_buf = vec![0u8; 65536];
    let echo = move || match b.recv_from(&mut echo_buf) {
        Ok((n, from)) => b.send_to(&echo_buf[..n], from).map(drop),
        Err(e) if nothing_yet(&e) => Ok(()),
        Err(e) => Err(e),
    };
    let ping = vec![0x5Au8; size];
    let mut buf = vec![0u8; 65536];
    Ok(pingpong(
        "unconnected",
        size,
        "127.0.0.1 one datagram each way, unconnected send_to/recv_from, blocking recv",
        echo,
        move || {
            a.send_to(&ping, ba)?;
            pong(|| a.recv_from(&mut buf).map(drop))
        },
    ))
}

/// Round trips of one `size`-byte datagram each way between two threads
/// with the queue's system calls (see the module documentation).
pub(crate) fn udp_pingpong_queue_calls(size: usize) -> io::Result<PingPong> {
    use skiff::udp::{Outgoing, RecvBatch, UdpConfig, UdpSocket as Udp};
    let cfg = UdpConfig::default();
    let any = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let (a, b) = (Udp::bind(any, &cfg)?, Udp::bind(any, &cfg)?);
    let (aa, ba) = (a.local_addr()?, b.local_addr()?);
    let mut echo_batch = RecvBatch::new(32, 65536);
    let echo = move || match b.recv_wait(&mut echo_batch, Some(Duration::from_millis(50))) {
        Ok(_) => {
            for d in echo_batch.drain() {
                b.send(&[Outgoing {
                    dest: aa,
                    data: &d.data,
                    segment_size: None,
                }])?;
            }
            Ok(())
        }
        Err(e) if nothing_yet(&e) => Ok(()),
        Err(e) => Err(e),
    };
    let ping = vec![0x5Au8; size];
    let mut batch = RecvBatch::new(32, 65536);
    Ok(pingpong(
        "queue-calls",
        size,
        "127.0.0.1 the queue's system calls (unconnected sendto, recvfrom with a timeout), no queue",
        echo,
        move || {
            a.send(&[Outgoing {
                dest: ba,
                data: &ping,
                segment_size: None,
            }])?;
            pong(|| {
                a.recv_wait(&mut batch, Some(Duration::from_secs(1)))?;
                batch.drain().for_each(drop);
                Ok(())
            })
        },
    ))
}

#[cfg(test)]
mod tests {
    use skiff_cli::bench::time_interleaved;

    use super::*;

    #[test]
    fn udp_throughput_counts_every_message() {
        let limits = Limits {
            messages: 2000,
            duration: Duration::from_secs(5),
        };
        let row = udp_throughput(64, limits, 1 << 20, 0, &ProgressBar::hidden()).unwrap();
        assert_eq!(row.received.unwrap() + row.lost.unwrap(), 2000);
        let row = udp_throughput(64, limits, 1 << 20, 100, &ProgressBar::hidden()).unwrap();
        assert!(row.options.as_deref().unwrap().ends_with("window=100"));
        assert_eq!(row.messages, 2000);
        assert_eq!(row.received.unwrap() + row.lost.unwrap(), 2000);
        assert!(row.mb_per_s.is_some() && row.p50_us.is_none());
    }

    #[test]
    fn udp_pingpongs_time_round_trips() {
        let limits = Limits {
            messages: 200,
            duration: Duration::from_secs(5),
        };
        let set = vec![
            udp_pingpong(8).unwrap(),
            udp_pingpong_queue_calls(8).unwrap(),
            udp_pingpong_unconnected(8).unwrap(),
        ];
        let rows = time_interleaved(limits, 4, &ProgressBar::hidden(), set).unwrap();
        let modes: Vec<&str> = rows.iter().map(|r| r.mode.as_str()).collect();
        assert_eq!(modes, ["blocking", "queue-calls", "unconnected"]);
        for row in &rows {
            assert_eq!(row.test, "udp-pingpong");
            assert_eq!(row.messages + row.lost.unwrap(), 200);
            assert!(row.p50_us.unwrap() > 0.0 && row.p99_us.unwrap() >= row.p50_us.unwrap());
            assert!(row.msgs_per_s.is_none() && row.cpu_pct.is_some());
            let o = row.options.as_deref().unwrap();
            assert!(o.ends_with(", interleaved in 4 rounds"), "{o}");
        }
    }
}
