//! Round trips between two queues (natural batching) or two plain UDP
//! sockets, both threads on CPU 1, reporting per round trip the wall time
//! and the user and system CPU time. Run under callgrind it counts the
//! user-space instructions per round trip, which unlike time does not
//! depend on the machine's noise:
//!
//! `cargo run --release -p skiff --example pingpong_cost [ROUND_TRIPS] [queue|udp]`
//!
//! `valgrind --tool=callgrind target/release/examples/pingpong_cost 40000 queue`
//! (then instructions / 40000; subtract a run with 20000 to drop set-up).

use std::time::{Duration, Instant};

use bytes::Bytes;
use skiff::{Message, Queue};

/// User and system CPU time of the process so far, in seconds.
fn cpu_times() -> (f64, f64) {
    // SAFETY: getrusage only writes the struct it is given.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    (t(r.ru_utime), t(r.ru_stime))
}

/// Pins the calling thread (and the threads it starts) to CPU 1.
fn pin() {
    // SAFETY: cpu_set_t is a plain bit array; the call reads it.
    unsafe {
        let mut s: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(1, &mut s);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &s);
    }
}

fn queue(n: usize) {
    let loc = "udp://127.0.0.1:0?timeout=0";
    let a = Queue::bind(loc).unwrap();
    let b = Queue::bind(loc).unwrap();
    let (aa, ba) = (a.local_addr(), b.local_addr());
    let echo = std::thread::spawn(move || {
        for _ in 0..n {
            let m = b.pop_blocking(Some(Duration::from_secs(1))).unwrap();
            b.push(aa, &m).unwrap();
        }
    });
    let ping = Message::from_payload(Bytes::from(vec![0x5Au8; 8]));
    for _ in 0..n {
        a.push(ba, &ping).unwrap();
        a.pop_blocking(Some(Duration::from_secs(1))).unwrap();
    }
    echo.join().unwrap();
}

fn udp(n: usize) {
    let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let ba = b.local_addr().unwrap();
    a.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    b.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        for _ in 0..n {
            let (len, from) = b.recv_from(&mut buf).unwrap();
            b.send_to(&buf[..len], from).unwrap();
        }
    });
    let mut buf = [0u8; 2048];
    for _ in 0..n {
        a.send_to(&[0x5Au8; 8], ba).unwrap();
        a.recv_from(&mut buf).unwrap();
    }
    echo.join().unwrap();
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .map_or(300_000, |s| s.parse().expect("round trips"));
    let mode = args.next().unwrap_or_else(|| "queue".into());
    pin();
    let (u0, s0) = cpu_times();
    let t = Instant::now();
    match mode.as_str() {
        "queue" => queue(n),
        "udp" => udp(n),
        m => panic!("mode {m}: expected queue or udp"),
    }
    let wall = t.elapsed().as_secs_f64();
    let (u1, s1) = cpu_times();
    let per = |v: f64| v / n as f64 * 1e6;
    println!(
        "{mode}: {n} round trips, per round trip: wall {:.3} µs, user {:.3} µs, system {:.3} µs",
        per(wall),
        per(u1 - u0),
        per(s1 - s0)
    );
}
