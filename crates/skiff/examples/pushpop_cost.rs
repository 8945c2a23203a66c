//! Per-message CPU cost of `push` and `pop` on one thread, free of the
//! scheduling noise of a two-thread throughput run: pushes a round of
//! messages over loopback, then pops them, and reports the best round.
//!
//! `cargo run --release -p skiff --example pushpop_cost [SIZE] [OPTIONS]`

use std::time::{Duration, Instant};

use bytes::Bytes;
use skiff::{Message, Queue};

fn main() {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().map_or(8, |s| s.parse().expect("size"));
    let opts = args.next().unwrap_or_else(|| "max_datagram=65507".into());
    let rx = Queue::bind(&format!("udp://127.0.0.1:0?rcvbuf=64m&{opts}")).unwrap();
    let tx = Queue::bind(&format!("udp://127.0.0.1:0?sndbuf=64m&{opts}")).unwrap();
    let msg = Message::from_payload(Bytes::from(vec![7u8; size]));
    let round = (2_000_000 / (size + 2)).clamp(1000, 200_000);
    let (mut best_push, mut best_pop) = (f64::MAX, f64::MAX);
    let mut out = Vec::with_capacity(1024);
    for _ in 0..15 {
        let t = Instant::now();
        for _ in 0..round {
            tx.push(rx.local_addr(), &msg).unwrap();
        }
        tx.flush().unwrap();
        best_push = best_push.min(t.elapsed().as_nanos() as f64 / round as f64);
        std::thread::sleep(Duration::from_millis(20));
        let t = Instant::now();
        let mut got = 0;
        loop {
            out.clear();
            let n = rx.try_pop_many(&mut out, 1024);
            if n == 0 {
                break;
            }
            got += n;
        }
        let ns = t.elapsed().as_nanos() as f64 / got.max(1) as f64;
        if got == round {
            best_pop = best_pop.min(ns);
        } else {
            eprintln!("a round delivered {got} of {round} (kernel buffer too small?)");
        }
    }
    let s = tx.stats();
    println!(
        "size {size} B, {round} per round, {:.0} msgs/datagram: push {best_push:.1} ns/msg (incl. send), pop {best_pop:.1} ns/msg (incl. recv)",
        s.sent_messages as f64 / s.sent_batches.max(1) as f64
    );
}
