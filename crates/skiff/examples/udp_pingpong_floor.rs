//! Round-trip floor of skiff's own UDP calls against plain send/recv, one
//! 8-byte datagram each way on 127.0.0.1, so the queue's ping-pong can be
//! split into system-call cost and queue cost. Rows, cheapest first:
//!
//! - std, connected sockets, `send`/`recv`: what `skiff bench queue`'s
//!   `udp-pingpong` row runs (the kernel keeps the route and the peer);
//! - std, unconnected, `send_to`/`recv_from`: a route lookup per send and
//!   the source address per receive, which a queue talking to many peers
//!   cannot do without;
//! - skiff's `UdpSocket::send` (one datagram: `sendto`) and `recv_wait`
//!   (one blocking `recvmsg` with room for the source address and the GRO
//!   and drop-counter control messages, into a `RecvBatch` arena), with and
//!   without a receive timeout: the calls the queue's ping-pong makes.
//!
//! Both threads run on one CPU (the one this starts on), as in `skiff bench
//! queue`, so a wake-up is a context switch, not a cross-CPU interrupt.
//!
//! `cargo run --release -p skiff --example udp_pingpong_floor [ROUND_TRIPS]`

use std::net::UdpSocket as StdUdp;
use std::time::{Duration, Instant};

use skiff::udp::{Outgoing, RecvBatch, UdpConfig, UdpSocket};

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Times `n` round trips of `ping` against an echo thread running `echo`
/// `n` times; returns the median.
fn time(n: usize, mut ping: impl FnMut(), echo: impl FnMut() + Send + 'static) -> Duration {
    let mut echo = echo;
    let e = std::thread::spawn(move || (0..n).for_each(|_| echo()));
    let mut t = Vec::with_capacity(n);
    for _ in 0..n {
        let s = Instant::now();
        ping();
        t.push(s.elapsed());
    }
    e.join().unwrap();
    p50(t)
}

fn std_pair(connect: bool) -> (StdUdp, StdUdp) {
    let (a, b) = (
        StdUdp::bind("127.0.0.1:0").unwrap(),
        StdUdp::bind("127.0.0.1:0").unwrap(),
    );
    if connect {
        a.connect(b.local_addr().unwrap()).unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
    }
    (a, b)
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(20_000, |s| s.parse().unwrap());
    pin_to_current_cpu();

    let (a, b) = std_pair(true);
    let mut buf = [0u8; 64];
    let p = time(
        n,
        || {
            a.send(b"pingpong").unwrap();
            a.recv(&mut buf).unwrap();
        },
        move || {
            let mut buf = [0u8; 64];
            let len = b.recv(&mut buf).unwrap();
            b.send(&buf[..len]).unwrap();
        },
    );
    println!("std connected send/recv          p50 {p:?}");

    let (a, b) = std_pair(false);
    let ba = b.local_addr().unwrap();
    let p = time(
        n,
        || {
            a.send_to(b"pingpong", ba).unwrap();
            a.recv_from(&mut buf).unwrap();
        },
        move || {
            let mut buf = [0u8; 64];
            let (len, from) = b.recv_from(&mut buf).unwrap();
            b.send_to(&buf[..len], from).unwrap();
        },
    );
    println!("std unconnected send_to/recv_from p50 {p:?}");

    for timeout in [None, Some(Duration::from_secs(1))] {
        let cfg = UdpConfig::default();
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &cfg).unwrap();
        let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &cfg).unwrap();
        let (aa, ba) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        let mut batch = RecvBatch::new(32, 65536);
        let mut echo_batch = RecvBatch::new(32, 65536);
        let p = time(
            n,
            || {
                a.send(&[Outgoing {
                    dest: ba,
                    data: b"pingpong",
                    segment_size: None,
                }])
                .unwrap();
                a.recv_wait(&mut batch, timeout).unwrap();
                batch.drain().for_each(drop);
            },
            move || {
                b.recv_wait(&mut echo_batch, timeout).unwrap();
                let d = echo_batch.drain().next().unwrap();
                b.send(&[Outgoing {
                    dest: aa,
                    data: &d.data,
                    segment_size: None,
                }])
                .unwrap();
            },
        );
        let what = if timeout.is_some() {
            "timeout"
        } else {
            "forever"
        };
        println!("skiff send/recv_wait {what:<12} p50 {p:?}");
    }
}

/// Holds this thread, and the threads it spawns, to the CPU it runs on.
fn pin_to_current_cpu() {
    // SAFETY: sched_getcpu only returns a number; cpu_set_t is a plain bit
    // array, valid all-zero, and sched_setaffinity reads the set we own,
    // with its true size, for this thread (pid 0).
    unsafe {
        let cpu = usize::try_from(libc::sched_getcpu()).unwrap_or(0);
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
