//! Round-trip floor of skiff's own UDP calls (sendmmsg + blocking
//! recvmmsg) against plain send/recv, one 8-byte datagram each way, so the
//! queue's ping-pong can be split into system-call cost and queue cost.
//!
//! `cargo run --release -p skiff --example udp_pingpong_floor [ROUND_TRIPS]`

use std::net::UdpSocket as StdUdp;
use std::time::{Duration, Instant};

use skiff::udp::{Outgoing, RecvBatch, UdpConfig, UdpSocket};

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(20_000, |s| s.parse().unwrap());
    // Plain std sockets.
    let (a, b) = (
        StdUdp::bind("127.0.0.1:0").unwrap(),
        StdUdp::bind("127.0.0.1:0").unwrap(),
    );
    let (aa, ba) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        for _ in 0..n {
            let (len, from) = b.recv_from(&mut buf).unwrap();
            b.send_to(&buf[..len], from).unwrap();
        }
    });
    let mut buf = [0u8; 64];
    let mut t = Vec::with_capacity(n);
    for _ in 0..n {
        let s = Instant::now();
        a.send_to(b"pingpong", ba).unwrap();
        a.recv_from(&mut buf).unwrap();
        t.push(s.elapsed());
    }
    echo.join().unwrap();
    println!("std send_to/recv_from       p50 {:?}", p50(t));
    let _ = aa;

    // skiff's UdpSocket: sendmmsg + recvmmsg(MSG_WAITFORONE), with and
    // without a receive timeout.
    for timeout in [None, Some(Duration::from_secs(1))] {
        let cfg = UdpConfig::default();
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &cfg).unwrap();
        let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &cfg).unwrap();
        let (aa, ba) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        let echo = std::thread::spawn(move || {
            let mut batch = RecvBatch::new(32, 65536);
            for _ in 0..n {
                b.recv_wait(&mut batch, timeout).unwrap();
                let d: Vec<_> = batch.drain().collect();
                b.send(&[Outgoing {
                    dest: aa,
                    data: &d[0].data,
                    segment_size: None,
                }])
                .unwrap();
            }
        });
        let mut batch = RecvBatch::new(32, 65536);
        let mut t = Vec::with_capacity(n);
        for _ in 0..n {
            let s = Instant::now();
            a.send(&[Outgoing {
                dest: ba,
                data: b"pingpong",
                segment_size: None,
            }])
            .unwrap();
            a.recv_wait(&mut batch, timeout).unwrap();
            batch.drain().for_each(drop);
            t.push(s.elapsed());
        }
        echo.join().unwrap();
        println!(
            "skiff sendmmsg/recvmmsg {:<9} p50 {:?}",
            if timeout.is_some() {
                "timeout"
            } else {
                "forever"
            },
            p50(t)
        );
    }
}
