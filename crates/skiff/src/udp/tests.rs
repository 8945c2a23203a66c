//! Tests of the UDP driver over loopback, and the helpers they share.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::recv::fold_drops;
use super::send::{GSO_MAX_SEGMENTS, MAX_UDP_PAYLOAD};
use super::*;
use crate::sys;

pub(super) const WAIT: Option<Duration> = Some(Duration::from_secs(2));

pub(super) fn bind(addr: SocketAddr, cfg: &UdpConfig) -> UdpSocket {
    UdpSocket::bind(addr, cfg).expect("bind")
}

pub(super) fn v4() -> SocketAddr {
    (Ipv4Addr::LOCALHOST, 0).into()
}

/// A socket on [::1], or `None` (with a message) where IPv6 is missing.
pub(super) fn v6(cfg: &UdpConfig) -> Option<UdpSocket> {
    match UdpSocket::bind((Ipv6Addr::LOCALHOST, 0).into(), cfg) {
        Ok(s) => Some(s),
        Err(e) => {
            println!("SKIPPED: cannot bind [::1] ({e}); IPv6 part not run");
            None
        }
    }
}

/// Receives until `want` datagrams (after GRO splitting) arrived or two
/// seconds of silence; returns them with their senders.
pub(super) fn recv_n(
    s: &UdpSocket,
    batch: &mut RecvBatch,
    want: usize,
) -> Vec<(SocketAddr, Bytes)> {
    let mut got = Vec::new();
    while got.len() < want {
        match s.recv(batch) {
            Ok(_) => {
                for r in batch.drain() {
                    assert!(!r.truncated, "truncated datagram");
                    got.extend(r.datagrams().map(|d| (r.from, d)));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if !s.wait_readable(WAIT).unwrap() {
                    break;
                }
            }
            Err(e) => panic!("recv: {e}"),
        }
    }
    got
}

pub(super) fn no_gro() -> UdpConfig {
    UdpConfig {
        gro: false,
        ..UdpConfig::default()
    }
}

/// A payload whose bytes say which datagram and which byte they are.
pub(super) fn pattern(tag: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| tag.wrapping_add(i as u8)).collect()
}

fn batch_to_three(make: impl Fn() -> UdpSocket) {
    let tx = make();
    let rx: Vec<UdpSocket> = (0..3).map(|_| make()).collect();
    let dests: Vec<SocketAddr> = rx.iter().map(|s| s.local_addr().unwrap()).collect();
    let payloads: Vec<Vec<u8>> = (0..64).map(|i| pattern(i as u8, 100 + i)).collect();
    let out: Vec<Outgoing<'_>> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| Outgoing {
            dest: dests[i % 3],
            data: p,
            segment_size: None,
        })
        .collect();
    assert_eq!(tx.send(&out).unwrap(), 64);
    let from = tx.local_addr().unwrap();
    for (r, s) in rx.iter().enumerate() {
        let mut batch = RecvBatch::new(32, 65_536);
        let want: Vec<&Vec<u8>> = payloads.iter().skip(r).step_by(3).collect();
        let got = recv_n(s, &mut batch, want.len());
        assert_eq!(got.len(), want.len(), "receiver {r}");
        for ((f, d), w) in got.iter().zip(want) {
            assert_eq!(*f, from);
            assert_eq!(&d[..], &w[..]);
        }
    }
}

#[test]
fn batch_of_64_reaches_three_destinations_v4() {
    batch_to_three(|| bind(v4(), &no_gro()));
}

#[test]
fn batch_of_64_reaches_three_destinations_v6() {
    if v6(&no_gro()).is_none() {
        return;
    }
    batch_to_three(|| v6(&no_gro()).unwrap());
}

#[test]
fn v4_destination_from_dual_stack_socket() {
    let tx = match UdpSocket::bind((Ipv6Addr::UNSPECIFIED, 0).into(), &no_gro()) {
        Ok(s) => s,
        Err(e) => return println!("SKIPPED: cannot bind [::] ({e})"),
    };
    let rx = bind(v4(), &no_gro());
    let n = tx.send(&[Outgoing {
        dest: rx.local_addr().unwrap(),
        data: b"mapped",
        segment_size: None,
    }]);
    if let Err(e) = n {
        return println!("SKIPPED: [::] socket is IPv6-only here ({e})");
    }
    let got = recv_n(&rx, &mut RecvBatch::new(4, 2048), 1);
    assert_eq!(&got[0].1[..], b"mapped");
}

/// 9,500 bytes as ten 1,000-byte segments, the last 500.
fn segmented() -> Vec<u8> {
    (0..10u8)
        .flat_map(|i| pattern(i * 16, if i == 9 { 500 } else { 1000 }))
        .collect()
}

fn check_segments(got: &[(SocketAddr, Bytes)], data: &[u8], seg: usize) {
    let want: Vec<&[u8]> = data.chunks(seg).collect();
    assert_eq!(got.len(), want.len());
    for ((_, g), w) in got.iter().zip(want) {
        assert_eq!(&g[..], w);
    }
}

#[test]
fn gso_send_arrives_as_separate_datagrams_without_gro() {
    let tx = bind(v4(), &UdpConfig::default());
    let rx = bind(v4(), &no_gro());
    if tx.max_segments() == 1 {
        println!("NOTE: no UDP_SEGMENT here; checking the split fallback instead");
    }
    let data = segmented();
    let out = [Outgoing {
        dest: rx.local_addr().unwrap(),
        data: &data,
        segment_size: Some(1000),
    }];
    assert_eq!(tx.send(&out).unwrap(), 1);
    let mut batch = RecvBatch::new(32, 65_536);
    let got = recv_n(&rx, &mut batch, 10);
    check_segments(&got, &data, 1000);
}

#[test]
fn gso_send_arrives_as_one_gro_run() {
    let tx = bind(v4(), &UdpConfig::default());
    let rx = bind(v4(), &UdpConfig::default());
    if tx.max_segments() == 1 {
        return println!("SKIPPED: no UDP_SEGMENT (GSO) on this kernel");
    }
    let data = segmented();
    let out = [Outgoing {
        dest: rx.local_addr().unwrap(),
        data: &data,
        segment_size: Some(1000),
    }];
    assert_eq!(tx.send(&out).unwrap(), 1);
    assert!(rx.wait_readable(WAIT).unwrap());
    let mut batch = RecvBatch::new(32, 65_536);
    assert_eq!(rx.recv(&mut batch).unwrap(), 1, "one coalesced buffer");
    let r: Vec<Received> = batch.drain().collect();
    assert_eq!(r[0].segment_size, Some(1000), "GRO segment size");
    assert_eq!(r[0].data.len(), 9500);
    let parts: Vec<(SocketAddr, Bytes)> = r[0].datagrams().map(|d| (r[0].from, d)).collect();
    assert_eq!(r[0].datagrams().len(), 10);
    check_segments(&parts, &data, 1000);
}

#[test]
fn segmented_send_without_gso_is_split_by_send() {
    let tx = bind(
        v4(),
        &UdpConfig {
            gso: false,
            ..UdpConfig::default()
        },
    );
    assert_eq!(tx.max_segments(), 1);
    let rx = bind(v4(), &no_gro());
    let data = segmented();
    let plain = pattern(7, 300);
    let dest = rx.local_addr().unwrap();
    let out = [
        Outgoing {
            dest,
            data: &data,
            segment_size: Some(1000),
        },
        Outgoing {
            dest,
            data: &plain,
            segment_size: None,
        },
    ];
    assert_eq!(tx.send(&out).unwrap(), 2);
    let got = recv_n(&rx, &mut RecvBatch::new(32, 65_536), 11);
    check_segments(&got[..10], &data, 1000);
    assert_eq!(&got[10].1[..], &plain[..]);
}

#[test]
fn refused_gso_falls_back_to_single_sends_and_stays_off() {
    let tx = bind(v4(), &UdpConfig::default());
    if tx.max_segments() == 1 {
        return println!("SKIPPED: no UDP_SEGMENT (GSO) on this kernel, nothing to fall back from");
    }
    sys::disable_tx_checksum(tx.as_fd()).unwrap();
    let rx = bind(v4(), &no_gro());
    let data = segmented();
    let dest = rx.local_addr().unwrap();
    let out = [
        Outgoing {
            dest,
            data: &data,
            segment_size: Some(1000),
        },
        Outgoing {
            dest,
            data: &data,
            segment_size: Some(1000),
        },
    ];
    assert_eq!(tx.send(&out).unwrap(), 2);
    assert_eq!(
        tx.max_segments(),
        1,
        "GSO turned off after the kernel refused it"
    );
    let got = recv_n(&rx, &mut RecvBatch::new(32, 65_536), 20);
    check_segments(&got[..10], &data, 1000);
    check_segments(&got[10..], &data, 1000);
}

#[test]
fn error_of_a_plain_datagram_leaves_gso_on() {
    let tx = bind(v4(), &UdpConfig::default());
    let gso = tx.max_segments();
    let rx = bind(v4(), &no_gro());
    let data = segmented();
    // Port 0 is not a destination: EINVAL, with or without GSO.
    let bad = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let out = [Outgoing {
        dest: bad,
        data: &data,
        segment_size: Some(1000),
    }];
    assert!(tx.send(&out).is_err());
    assert_eq!(
        tx.max_segments(),
        gso,
        "a bad destination is not a GSO failure"
    );
    // The first datagram went; the error comes on the next call.
    let out = [
        Outgoing {
            dest: rx.local_addr().unwrap(),
            data: b"ok",
            segment_size: None,
        },
        Outgoing {
            dest: bad,
            data: b"no",
            segment_size: None,
        },
    ];
    assert_eq!(tx.send(&out).unwrap(), 1);
    assert!(tx.send(&out[1..]).is_err());
}

#[test]
fn more_segments_than_one_gso_send_takes() {
    let tx = bind(v4(), &UdpConfig::default());
    let rx = bind(v4(), &no_gro());
    // 150 segments of 100 bytes: more than 64, so several GSO sends.
    let data: Vec<u8> = (0..150u8).flat_map(|i| pattern(i, 100)).collect();
    let out = [Outgoing {
        dest: rx.local_addr().unwrap(),
        data: &data,
        segment_size: Some(100),
    }];
    assert_eq!(tx.send(&out).unwrap(), 1);
    let got = recv_n(&rx, &mut RecvBatch::new(64, 65_536), 150);
    check_segments(&got, &data, 100);
}

#[test]
fn sixty_thousand_bytes_arrive_whole() {
    let tx = bind(v4(), &UdpConfig::default());
    let rx = bind(v4(), &UdpConfig::default());
    let data = pattern(3, 60_000);
    let out = [Outgoing {
        dest: rx.local_addr().unwrap(),
        data: &data,
        segment_size: None,
    }];
    assert_eq!(tx.send(&out).unwrap(), 1);
    assert!(rx.wait_readable(WAIT).unwrap());
    let mut batch = RecvBatch::new(8, 65_536);
    assert_eq!(rx.recv(&mut batch).unwrap(), 1);
    let r: Vec<Received> = batch.drain().collect();
    assert!(!r[0].truncated);
    assert_eq!(r[0].segment_size, None);
    assert_eq!(&r[0].data[..], &data[..]);
}

#[test]
fn oversized_datagram_is_flagged_truncated() {
    let tx = bind(v4(), &UdpConfig::default());
    let rx = bind(v4(), &no_gro());
    let data = pattern(5, 1000);
    let out = [Outgoing {
        dest: rx.local_addr().unwrap(),
        data: &data,
        segment_size: None,
    }];
    assert_eq!(tx.send(&out).unwrap(), 1);
    assert!(rx.wait_readable(WAIT).unwrap());
    let mut batch = RecvBatch::new(4, 512);
    assert_eq!(rx.recv(&mut batch).unwrap(), 1);
    let r: Vec<Received> = batch.drain().collect();
    assert!(r[0].truncated);
    assert_eq!(&r[0].data[..], &data[..512]);
}

#[test]
fn kernel_drops_are_counted() {
    let rx = bind(
        v4(),
        &UdpConfig {
            recv_buffer: Some(1),
            gro: false,
            ..UdpConfig::default()
        },
    );
    let tx = bind(v4(), &UdpConfig::default());
    let dest = rx.local_addr().unwrap();
    let data = pattern(1, 1000);
    let out = vec![
        Outgoing {
            dest,
            data: &data,
            segment_size: None
        };
        64
    ];
    for _ in 0..16 {
        let _ = tx.send(&out);
    }
    let mut batch = RecvBatch::new(64, 65_536);
    let mut received = 0;
    while rx.wait_readable(Some(Duration::from_millis(100))).unwrap() {
        received += rx.recv(&mut batch).unwrap();
        assert!(batch.drain().all(|r| r.data.len() == 1000));
    }
    // The count rides on the next datagram queued after the drops.
    tx.send(&out[..1]).unwrap();
    received += recv_n(&rx, &mut batch, 1).len();
    let now = rx.kernel_drops().unwrap();
    println!(
        "received {received} of 1025, kernel_drops {} (SO_MEMINFO: {now})",
        batch.kernel_drops()
    );
    assert!(batch.kernel_drops() > 0);
    assert_eq!(batch.kernel_drops(), now);
    assert_eq!(received as u64 + now, 1025);
}

#[test]
fn drop_counter_readings_fold_without_wrapping_back() {
    let (mut drops, mut last) = (0, 0);
    fold_drops(&mut drops, &mut last, 5);
    fold_drops(&mut drops, &mut last, 3); // an older reading
    for v in [0x7000_0000, 0xe000_0000, u32::MAX] {
        fold_drops(&mut drops, &mut last, v);
    }
    assert_eq!(drops, u64::from(u32::MAX));
    fold_drops(&mut drops, &mut last, 2); // wrapped: 3 more
    assert_eq!(drops, u64::from(u32::MAX) + 3);
}

#[test]
fn would_block_when_nothing_to_receive() {
    let rx = bind(v4(), &UdpConfig::default());
    let mut batch = RecvBatch::new(4, 2048);
    let e = rx.recv(&mut batch).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    assert_eq!(batch.drain().count(), 0);
    assert!(!rx.wait_readable(Some(Duration::from_millis(10))).unwrap());
}

#[test]
fn tokio_wakes_a_task_when_a_datagram_arrives() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let rx = bind(v4(), &UdpConfig::default());
    let tx = bind(v4(), &UdpConfig::default());
    let dest = rx.local_addr().unwrap();
    rt.block_on(async {
        let fd = rx.register_async(tokio::io::Interest::READABLE).unwrap();
        let mut batch = RecvBatch::new(4, 2048);
        for round in 0..3u8 {
            let data = [round; 8];
            tx.send(&[Outgoing {
                dest,
                data: &data,
                segment_size: None,
            }])
            .unwrap();
            let got = loop {
                let mut guard = tokio::time::timeout(Duration::from_secs(2), fd.readable())
                    .await
                    .expect("woken")
                    .unwrap();
                match rx.recv(&mut batch) {
                    Ok(_) => break batch.drain().next().unwrap(),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                    Err(e) => panic!("recv: {e}"),
                }
            };
            assert_eq!(&got.data[..], &data);
            // Readiness stays set until cleared: recv says WouldBlock, then clear.
            let mut guard = fd.readable().await.unwrap();
            assert_eq!(
                rx.recv(&mut batch).unwrap_err().kind(),
                io::ErrorKind::WouldBlock
            );
            guard.clear_ready();
        }
    });
}

#[test]
fn a_slot_is_reused_once_its_slices_are_dropped() {
    let tx = bind(v4(), &UdpConfig::default());
    let rx = bind(v4(), &no_gro());
    let dest = rx.local_addr().unwrap();
    let mut batch = RecvBatch::new(4, 2048);
    let mut one = |tag: u8| {
        let data = pattern(tag, 64);
        tx.send(&[Outgoing {
            dest,
            data: &data,
            segment_size: None,
        }])
        .unwrap();
        let got = recv_n(&rx, &mut batch, 1);
        assert_eq!(&got[0].1[..], &data[..]);
        got.into_iter().next().unwrap().1
    };
    let first = one(1);
    let p1 = first.as_ptr();
    drop(first);
    let second = one(2);
    assert_eq!(second.as_ptr(), p1, "slot reused");
    // Held: the next recv must not write over it.
    let third = one(3);
    assert_ne!(third.as_ptr(), second.as_ptr());
    assert_eq!(&second[..], &pattern(2, 64)[..]);
}

#[test]
fn a_held_slot_pins_only_itself_and_free_slots_are_bounded() {
    let tx = bind(v4(), &UdpConfig::default());
    let rx = bind(v4(), &no_gro());
    let dest = rx.local_addr().unwrap();
    let slots = 4;
    let mut batch = RecvBatch::new(slots, 2048);
    let send = |tag: u8| {
        let data = pattern(tag, 100 + usize::from(tag));
        tx.send(&[Outgoing {
            dest,
            data: &data,
            segment_size: None,
        }])
        .unwrap();
    };
    // Two datagrams of one receive (or two): hold the second, drop the first.
    send(1);
    send(2);
    let mut got = recv_n(&rx, &mut batch, 2).into_iter().map(|(_, b)| b);
    let (first, second) = (got.next().unwrap(), got.next().unwrap());
    assert_eq!(&first[..], &pattern(1, 101)[..]);
    let p1 = first.as_ptr();
    drop(first);
    // The next datagram lands in the first's slot, though the second's is held.
    send(3);
    let third = recv_n(&rx, &mut batch, 1).pop().unwrap().1;
    assert_eq!(third.as_ptr(), p1, "the freed slot is reused first");
    assert_eq!(
        &second[..],
        &pattern(2, 102)[..],
        "a held slot is not written over"
    );
    assert_eq!(&third[..], &pattern(3, 103)[..]);
    // Many slots held at once, then all dropped: the pool keeps a bounded few.
    let mut held = Vec::new();
    for round in 0..40u8 {
        send(round);
        held.extend(recv_n(&rx, &mut batch, 1).into_iter().map(|(_, b)| b));
    }
    assert_eq!(held.len(), 40);
    for (round, b) in held.iter().enumerate() {
        assert_eq!(&b[..], &pattern(round as u8, 100 + round)[..]);
    }
    drop(held);
    assert!(
        batch.free_slots() <= slots * 4,
        "{} free slots kept for {slots} slots",
        batch.free_slots()
    );
    assert!(
        batch.free_slots() >= slots,
        "freed slots are kept for reuse"
    );
}

#[test]
fn buffer_sizes_report_what_the_kernel_granted() {
    let max = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok());
    let s = bind(
        v4(),
        &UdpConfig {
            recv_buffer: Some(1 << 20),
            send_buffer: Some(1 << 20),
            ..UdpConfig::default()
        },
    );
    let (r, w) = (s.recv_buffer_size().unwrap(), s.send_buffer_size().unwrap());
    println!("asked 1 MiB each, granted recv {r} send {w} (rmem_max {max:?})");
    assert!(r >= (1 << 20).min(max.unwrap_or(0)));
    assert!(w > 0);
}

#[test]
fn multicast_join_deliver_leave_over_loopback() {
    let group = IpAddr::V4(Ipv4Addr::new(239, 255, 77, 77));
    let cfg = UdpConfig {
        reuse_addr: true,
        gro: false,
        ..UdpConfig::default()
    };
    let rx = bind((Ipv4Addr::UNSPECIFIED, 0).into(), &cfg);
    let port = rx.local_addr().unwrap().port();
    let lo = MulticastInterface::Addr(Ipv4Addr::LOCALHOST);
    if let Err(e) = rx.join_multicast(group, Some(lo)) {
        return println!("SKIPPED: multicast join on 127.0.0.1 refused ({e})");
    }
    let tx = bind(v4(), &UdpConfig::default());
    tx.set_multicast_interface(lo).unwrap();
    let dest = SocketAddr::new(group, port);
    if let Err(e) = tx.send(&[Outgoing {
        dest,
        data: b"to the group",
        segment_size: None,
    }]) {
        return println!("SKIPPED: multicast send over loopback refused ({e})");
    }
    let mut batch = RecvBatch::new(4, 2048);
    let got = recv_n(&rx, &mut batch, 1);
    if got.is_empty() {
        return println!("SKIPPED: joined and sent, but loopback did not deliver multicast here");
    }
    assert_eq!(&got[0].1[..], b"to the group");
    rx.leave_multicast(group, Some(lo)).unwrap();
    tx.send(&[Outgoing {
        dest,
        data: b"after leave",
        segment_size: None,
    }])
    .unwrap();
    assert!(
        !rx.wait_readable(Some(Duration::from_millis(200))).unwrap(),
        "delivered after leave"
    );
}

#[test]
fn ipv6_group_rejects_an_ipv4_interface() {
    let s = bind(v4(), &UdpConfig::default());
    let e = s
        .join_multicast(
            "ff02::1:77".parse().unwrap(),
            Some(Ipv4Addr::LOCALHOST.into()),
        )
        .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn datagrams_split_a_run_and_keep_a_single() {
    let from = v4();
    let run = Received {
        from,
        data: Bytes::from(pattern(0, 25)),
        segment_size: Some(10),
        maybe_run: false,
        truncated: false,
    };
    let lens: Vec<usize> = run.datagrams().map(|d| d.len()).collect();
    assert_eq!(lens, [10, 10, 5]);
    // A run whose stride the receive did not report is one buffer until
    // the caller names the stride.
    let unknown = Received {
        segment_size: None,
        maybe_run: true,
        ..run.clone()
    };
    assert_eq!(unknown.datagrams().count(), 1);
    let named = Received {
        segment_size: Some(10),
        ..unknown
    };
    assert_eq!(
        named.datagrams().collect::<Vec<_>>(),
        run.datagrams().collect::<Vec<_>>()
    );
    let owned: Vec<Bytes> = run.clone().into_datagrams().collect();
    assert_eq!(owned, run.datagrams().collect::<Vec<_>>());
    let one = Received {
        from,
        data: Bytes::new(),
        segment_size: None,
        maybe_run: false,
        truncated: false,
    };
    assert_eq!(
        one.datagrams().count(),
        1,
        "an empty datagram is still a datagram"
    );
}

/// Throughput over loopback, by hand:
/// `cargo test -p skiff --release --lib udp::tests::throughput -- --ignored --nocapture`
#[test]
#[ignore = "measurement, run by hand"]
fn throughput() {
    // (what, datagram size, Outgoings per send call, GSO, GRO)
    for (name, size, batch, gso, gro) in [
        ("64 B, 1 per call (baseline)", 64, 1, false, false),
        ("64 B, sendmmsg x64", 64, 64, false, false),
        ("1200 B, 1 per call (baseline)", 1200, 1, false, false),
        ("1200 B, sendmmsg x64", 1200, 64, false, false),
        ("1200 B, GSO 54 seg x8, no GRO", 1200, 8, true, false),
        ("1200 B, GSO 54 seg x8, GRO", 1200, 8, true, true),
    ] {
        let (sent, received, drops, secs) =
            run_throughput(size, batch, gso, gro, Duration::from_secs(2));
        println!(
            "{name:31} sent {:>9.0} dgram/s  received {:>9.0} dgram/s ({:.2} Gbit/s)  kernel drops {drops}",
            sent as f64 / secs,
            received as f64 / secs,
            (received * size as u64 * 8) as f64 / secs / 1e9
        );
    }
}

fn run_throughput(
    size: usize,
    batch: usize,
    gso: bool,
    gro: bool,
    time: Duration,
) -> (u64, u64, u64, f64) {
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    let rx = bind(
        v4(),
        &UdpConfig {
            gro,
            recv_buffer: Some(4 << 20),
            ..UdpConfig::default()
        },
    );
    let tx = bind(
        v4(),
        &UdpConfig {
            gso,
            send_buffer: Some(4 << 20),
            ..UdpConfig::default()
        },
    );
    let dest = rx.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let reader = {
        let (stop, count) = (stop.clone(), count.clone());
        std::thread::spawn(move || {
            let mut batch = RecvBatch::new(64, 65_536);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match rx.recv(&mut batch) {
                    Ok(_) => {
                        n += batch
                            .drain()
                            .map(|r| r.datagrams().len() as u64)
                            .sum::<u64>()
                    }
                    Err(_) => {
                        let _ = rx.wait_readable(Some(Duration::from_millis(10)));
                    }
                }
            }
            count.store(n, Ordering::Relaxed);
            batch.kernel_drops().max(rx.kernel_drops().unwrap_or(0))
        })
    };
    let segs = if gso {
        (MAX_UDP_PAYLOAD / size).min(GSO_MAX_SEGMENTS)
    } else {
        1
    };
    let buf = vec![0x5a; size * segs];
    let out: Vec<Outgoing<'_>> = (0..batch)
        .map(|_| Outgoing {
            dest,
            data: &buf,
            segment_size: gso.then_some(size),
        })
        .collect();
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < time {
        match tx.send(&out) {
            Ok(k) => sent += (k * segs) as u64,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let _ = sys::poll(tx.as_fd(), libc::POLLOUT, Some(Duration::from_millis(10)));
            }
            Err(e) => panic!("send: {e}"),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    let drops = reader.join().unwrap();
    (sent, count.load(Ordering::Relaxed), drops, secs)
}
