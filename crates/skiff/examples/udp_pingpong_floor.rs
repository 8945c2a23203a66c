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
//!   (one blocking `recvfrom` with room for the source address, into a
//!   `RecvBatch` arena), with and without a receive timeout: the calls the
//!   queue's ping-pong makes.
//!
//! - io_uring (`IORING_OP_SENDMSG` + `IORING_OP_RECVMSG` submitted together,
//!   one `io_uring_enter` per side and round trip instead of two system
//!   calls), with default ring flags and with `SINGLE_ISSUER |
//!   DEFER_TASKRUN | COOP_TASKRUN`: whether fewer system calls beat plain
//!   ones for one datagram at a time (`bench/RESULTS.md` has the answer
//!   measured so far).
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

    for tuned in [false, true] {
        let p = io_uring_pingpong(n, tuned);
        let what = if tuned { "tuned flags" } else { "default" };
        println!("io_uring sendmsg+recvmsg {what:<8} p50 {p:?}");
    }
}

/// One side of an io_uring ping-pong: a ring, its socket, and the message
/// headers the kernel reads and writes while an operation is in flight
/// (boxed, so their addresses hold).
struct Ring {
    ring: io_uring::IoUring,
    fd: i32,
    dest: libc::sockaddr_in,
    send_iov: libc::iovec,
    send_hdr: libc::msghdr,
    payload: Vec<u8>,
    buf: Vec<u8>,
    recv_iov: libc::iovec,
    name: libc::sockaddr_storage,
    ctrl: [u8; 64],
    recv_hdr: libc::msghdr,
}

const RECV: u64 = 2;

impl Ring {
    /// A ring for `sock`, sending to `dest` (IPv4); `tuned` sets the
    /// single-issuer, deferred and cooperative task-run flags. Must be
    /// built on the thread that uses it.
    fn new(sock: &StdUdp, dest: std::net::SocketAddr, tuned: bool) -> Box<Ring> {
        use std::os::fd::AsRawFd;
        let std::net::SocketAddr::V4(d) = dest else {
            panic!("IPv4 only")
        };
        let ring = if tuned {
            io_uring::IoUring::builder()
                .setup_single_issuer()
                .setup_defer_taskrun()
                .setup_coop_taskrun()
                .build(8)
        } else {
            io_uring::IoUring::new(8)
        }
        .expect("io_uring");
        // SAFETY: msghdr and sockaddr_storage are plain C structs, valid
        // all-zero.
        let (send_hdr, recv_hdr, name) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed(), std::mem::zeroed()) };
        let mut r = Box::new(Ring {
            ring,
            fd: sock.as_raw_fd(),
            dest: libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: d.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(d.ip().octets()),
                },
                sin_zero: [0; 8],
            },
            send_iov: libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            },
            send_hdr,
            payload: b"pingpong".to_vec(),
            buf: vec![0; 65536],
            recv_iov: libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            },
            name,
            ctrl: [0; 64],
            recv_hdr,
        });
        let r_ = &mut *r;
        r_.send_iov = libc::iovec {
            iov_base: r_.payload.as_mut_ptr().cast(),
            iov_len: r_.payload.len(),
        };
        r_.send_hdr.msg_name = (&raw mut r_.dest).cast();
        r_.send_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        r_.send_hdr.msg_iov = &raw mut r_.send_iov;
        r_.send_hdr.msg_iovlen = 1;
        r_.recv_iov = libc::iovec {
            iov_base: r_.buf.as_mut_ptr().cast(),
            iov_len: r_.buf.len(),
        };
        r
    }

    fn push_send(&mut self) {
        let e = io_uring::opcode::SendMsg::new(io_uring::types::Fd(self.fd), &self.send_hdr)
            .build()
            .user_data(1);
        // SAFETY: the header, its iovec, payload and address live in this
        // box until the completion is reaped (`wait_recv` reaps every
        // completion before the next push).
        unsafe { self.ring.submission().push(&e).expect("room") };
    }

    fn push_recv(&mut self) {
        self.recv_hdr.msg_name = (&raw mut self.name).cast();
        self.recv_hdr.msg_namelen =
            std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        self.recv_hdr.msg_iov = &raw mut self.recv_iov;
        self.recv_hdr.msg_iovlen = 1;
        self.recv_hdr.msg_control = self.ctrl.as_mut_ptr().cast();
        self.recv_hdr.msg_controllen = self.ctrl.len() as _;
        let e = io_uring::opcode::RecvMsg::new(io_uring::types::Fd(self.fd), &mut self.recv_hdr)
            .build()
            .user_data(RECV);
        // SAFETY: as in `push_send`; the kernel writes only into the
        // buffers the header names, all owned by this box.
        unsafe { self.ring.submission().push(&e).expect("room") };
    }

    /// Submits what is queued and waits until the receive completes.
    fn wait_recv(&mut self) {
        loop {
            self.ring.submit_and_wait(1).expect("io_uring_enter");
            let mut got = false;
            for c in self.ring.completion() {
                assert!(c.result() >= 0, "io_uring op failed: {}", c.result());
                got |= c.user_data() == RECV;
            }
            if got {
                return;
            }
        }
    }
}

/// The io_uring ping-pong: `n` round trips, p50.
fn io_uring_pingpong(n: usize, tuned: bool) -> Duration {
    let (a, b) = std_pair(false);
    let (aa, ba) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    let echo = std::thread::spawn(move || {
        let mut r = Ring::new(&b, aa, tuned);
        // Each wait takes the next ping; the reply to it leaves with the
        // next wait's submission, the last one on its own.
        r.push_recv();
        r.wait_recv();
        for _ in 1..n {
            r.push_send();
            r.push_recv();
            r.wait_recv();
        }
        r.push_send();
        r.ring.submit_and_wait(1).expect("io_uring_enter");
    });
    let mut r = Ring::new(&a, ba, tuned);
    let mut t = Vec::with_capacity(n);
    for _ in 0..n {
        let s = Instant::now();
        r.push_send();
        r.push_recv();
        r.wait_recv();
        t.push(s.elapsed());
    }
    echo.join().unwrap();
    p50(t)
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
