//! The buffer API (RocketBufs rOut/rIn) over `shm://`, `tcp://` and
//! `udp://…?reliable=true`: one suite, run unchanged over every transport
//! by the `suite!` macro (the crash tests too: a producer or subscriber
//! killed with SIGKILL), plus what only shared memory has (torn reads,
//! corrupted headers, file clean-up and reclaim) and the tcp wire's close
//! frames and hostile headers.
//!
//! Crash tests re-execute this test binary with `SKIFF_SHM_ROLE` set; the
//! `child_role` test then plays the producer or the subscriber and prints
//! `ready <locator of its side>`.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use skiff::shm::{BufferError, Flow, Input, Output};

/// A fresh ring directory per test, removed when the test process exits
/// (whatever the tests left in it; a process killed by a signal leaves it).
fn dir() -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    let d = std::env::temp_dir().join(format!(
        "skiff-shm-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    DIRS.lock().unwrap().push(d.clone());
    AT_EXIT.call_once(|| {
        // SAFETY: `remove_dirs` is a plain function that neither unwinds
        // (it ignores every error) nor calls `exit`.
        unsafe { libc::atexit(remove_dirs) };
    });
    d
}

/// The directories [`dir`] made in this process.
static DIRS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

extern "C" fn remove_dirs() {
    if let Ok(dirs) = DIRS.lock() {
        for d in dirs.iter() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum T {
    Shm,
    Tcp,
    Udp,
}

/// Association options of the udp locators: a dead peer is detected
/// within a second.
const UDP: &str = "reliable=true&keepalive=100ms&idle_timeout=1s";

/// The locator an output of transport `t` opens (a fresh name or port).
fn output_locator(t: T) -> String {
    match t {
        T::Shm => format!("shm://suite?dir={}", dir().display()),
        T::Tcp => "tcp://127.0.0.1:0".into(),
        T::Udp => format!("udp://127.0.0.1:0?{UDP}"),
    }
}

/// The locator inputs of `out` (opened on `loc`) open.
fn input_locator(out: &Output, loc: &str) -> String {
    match (loc.split_once("://"), out.local_addr()) {
        (Some(("tcp", _)), Some(a)) => format!("tcp://{a}"),
        (Some(("udp", _)), Some(a)) => format!("udp://{a}?{UDP}"),
        _ => loc.to_string(),
    }
}

/// An output and the locator its inputs open.
fn output(t: T) -> (Output, String) {
    let loc = output_locator(t);
    let out = Output::open(&loc).unwrap();
    let input = input_locator(&out, &loc);
    (out, input)
}

/// Receives one segment within 5 s as bytes and consumes it.
fn recv(input: &mut Input) -> (u32, Vec<u8>) {
    let seg = input
        .recv(Some(Duration::from_secs(5)))
        .unwrap()
        .expect("a segment within 5 s");
    let (id, data) = (seg.id(), seg.to_vec());
    input.consumed(id, data.len()).unwrap();
    (id, data)
}

fn roundtrip_and_wraparound(t: T) {
    let (mut out, loc) = output(t);
    out.create_buffer(1, 64, Flow::Credits).unwrap();
    let mut input = Input::open(&loc).unwrap();
    input.subscribe(1, 64).unwrap();
    let mut wrapped = 0;
    for i in 0..20u8 {
        let mut seg = out.segment(1, 24, true).unwrap();
        if !seg.slices_mut().1.is_empty() {
            wrapped += 1;
        }
        seg.write(0, &[i; 24]);
        out.deliver(seg, 20).unwrap();
        // In place, then consumed.
        let seg = input.recv(Some(Duration::from_secs(5))).unwrap().unwrap();
        assert_eq!(seg.id(), 1);
        let (a, b) = seg.slices().unwrap();
        let mut got = a.to_vec();
        got.extend_from_slice(b);
        assert_eq!(got, vec![i; 20], "segment {i}");
        input.consumed(1, 20).unwrap();
    }
    assert!(wrapped > 0, "some segments wrapped around");
    // Everything consumed reached every subscriber.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut delivered = 0;
    while delivered < 20 && Instant::now() < deadline {
        match out.poll_delivered() {
            Some((1, _)) => delivered += 1,
            _ => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    assert_eq!(delivered, 20);
}

fn credit_exhaustion_and_recovery(t: T) {
    const SIZE: usize = 64 << 10;
    const SEG: usize = 8 << 10;
    let (mut out, loc) = output(t);
    out.create_buffer(7, SIZE, Flow::Credits).unwrap();
    let mut input = Input::open(&loc).unwrap();
    input.subscribe(7, SIZE).unwrap();
    // Fill until the producer is refused for 200 ms running (over tcp the
    // socket buffers and the subscriber's ring hold more first); memory is
    // bounded, so the loop must end.
    let mut sent = 0u32;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut refused_since: Option<Instant> = None;
    loop {
        match out.segment(7, SEG, false) {
            Ok(mut seg) => {
                seg.write(0, &sent.to_le_bytes());
                out.deliver(seg, SEG).unwrap();
                sent += 1;
                refused_since = None;
            }
            Err(e) if e.is_would_block() => {
                let since = *refused_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_millis(200) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("{e}"),
        }
        assert!(Instant::now() < deadline, "never refused after {sent}");
    }
    assert!(sent as usize >= SIZE / SEG);
    let e = out.segment(7, SEG, false).unwrap_err();
    assert!(e.to_string().contains("full"), "{e}");
    // The subscriber drains; the producer recovers.
    for want in 0..sent {
        let (_, data) = recv(&mut input);
        assert_eq!(data[..4], want.to_le_bytes());
    }
    let mut seg = out.segment(7, SEG, true).unwrap();
    seg.write(0, &sent.to_le_bytes());
    out.deliver(seg, SEG).unwrap();
    assert_eq!(recv(&mut input).1[..4], sent.to_le_bytes());
}

fn overwrite_never_blocks(t: T) {
    let (mut out, loc) = output(t);
    out.create_buffer(3, 64, Flow::Overwrite).unwrap();
    let mut input = Input::open(&loc).unwrap();
    input.subscribe(3, 4096).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    for i in 0..10_000u32 {
        out.send(3, &i.to_le_bytes().repeat(4), false).unwrap();
    }
    // The reader sees some of them, in order, each whole.
    let mut last = None;
    while let Ok(Some(seg)) = input.recv(Some(Duration::from_millis(300))) {
        let mut v = Vec::new();
        if seg.copy_to(&mut v) {
            let n = u32::from_le_bytes(v[..4].try_into().unwrap());
            assert_eq!(v, n.to_le_bytes().repeat(4));
            assert!(last.is_none_or(|l| n > l));
            last = Some(n);
        }
        let len = seg.len();
        let _ = input.consumed(3, len);
    }
    assert!(last.is_some(), "read something");
}

fn splice_forwarding(t: T) {
    // publisher -> broker (input spliced into output) -> subscriber
    let (mut publisher, up) = output(t);
    publisher.create_buffer(9, 1024, Flow::Credits).unwrap();
    let mut broker_in = Input::open(&up).unwrap();
    broker_in.subscribe(9, 1024).unwrap();
    let (mut broker_out, down) = output(t);
    broker_out.splice(&mut broker_in, 9).unwrap();
    assert!(matches!(
        broker_out.create_buffer(9, 64, Flow::Credits),
        Err(BufferError::DuplicateId { .. })
    ));
    let mut sub = Input::open(&down).unwrap();
    sub.subscribe(9, 1024).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    for i in 0..100u32 {
        publisher.send(9, &i.to_le_bytes(), true).unwrap();
        let (id, data) = recv(&mut sub);
        assert_eq!((id, data), (9, i.to_le_bytes().to_vec()));
    }
}

fn bad_requests(t: T) {
    let (mut out, loc) = output(t);
    out.create_buffer(1, 128, Flow::Credits).unwrap();
    let e = out.create_buffer(1, 128, Flow::Credits).unwrap_err();
    assert!(matches!(e, BufferError::DuplicateId { id: 1, .. }), "{e}");
    let e = out.segment(1, 129, false).unwrap_err();
    assert!(e.to_string().contains("128"), "names the limit: {e}");
    assert!(matches!(
        out.segment(2, 1, false),
        Err(BufferError::UnknownBuffer { id: 2 })
    ));
    let seg = out.segment(1, 8, false).unwrap();
    assert!(out.segment(1, 8, false).is_err(), "one outstanding segment");
    drop(seg);
    assert!(out.segment(1, 8, false).is_ok(), "dropped segment freed");
    let mut input = Input::open(&loc).unwrap();
    input.subscribe(1, 128).unwrap();
    assert!(matches!(
        input.subscribe(1, 128),
        Err(BufferError::DuplicateId { .. })
    ));
    assert!(input.consumed(1, 1).is_err(), "nothing received yet");
}

fn multiple_buffers_and_subscribers(t: T) {
    let (mut out, loc) = output(t);
    out.create_buffer(1, 256, Flow::Credits).unwrap();
    out.create_buffer(2, 256, Flow::Credits).unwrap();
    let mut a = Input::open(&loc).unwrap();
    a.subscribe(1, 256).unwrap();
    a.subscribe(2, 256).unwrap();
    let mut b = Input::open(&loc).unwrap();
    b.subscribe(1, 256).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    out.send(1, b"one", true).unwrap();
    out.send(2, b"two", true).unwrap();
    let mut got = [recv(&mut a), recv(&mut a)];
    got.sort();
    assert_eq!(got, [(1, b"one".to_vec()), (2, b"two".to_vec())]);
    assert_eq!(recv(&mut b), (1, b"one".to_vec()));
    // Closing the output ends every input, after the data.
    out.send(1, b"last", true).unwrap();
    drop(out);
    assert_eq!(recv(&mut b), (1, b"last".to_vec()));
    let e = b.recv(Some(Duration::from_secs(5))).unwrap_err();
    assert!(matches!(e, BufferError::Closed { id: 1 }), "{e}");
}

/// A producer child is killed: the subscriber gets a clean error
/// (`PeerDead` over shm, `PeerLost` over tcp and udp) promptly, not a hang.
fn producer_killed_is_a_clean_error(t: T) {
    let (mut child, loc) = spawn_role("producer", &output_locator(t));
    let mut input = Input::open(&loc).unwrap();
    input.subscribe(1, 4096).unwrap();
    // Joined after "before": nothing yet. Kill -9 the producer.
    child.kill().unwrap();
    // An error within the wait, not `Ok(None)`: detected, not a hang.
    let e = input.recv(Some(Duration::from_secs(10))).unwrap_err();
    assert!(e.is_peer_gone(), "{e}");
    let _ = child.wait();
}

/// A producer child feeding a broker (its input spliced into the broker's
/// output) is killed: the downstream subscriber learns that the source is
/// gone (`PeerDead` over shm, where it reads the producer's own ring;
/// `PeerLost` over tcp and udp, from the broker's close frame of reason
/// 2), not `Closed` or `Corrupt`.
fn spliced_producer_killed_reaches_downstream(t: T) {
    let (mut child, up) = spawn_role("producer", &output_locator(t));
    let mut broker_in = Input::open(&up).unwrap();
    broker_in.subscribe(1, 4096).unwrap();
    let (mut broker_out, down) = output(t);
    broker_out.splice(&mut broker_in, 1).unwrap();
    let mut sub = Input::open(&down).unwrap();
    sub.subscribe(1, 4096).unwrap();
    child.kill().unwrap();
    let e = sub.recv(Some(Duration::from_secs(10))).unwrap_err();
    assert!(e.is_peer_gone(), "{e}");
    let _ = child.wait();
}

/// A subscriber child that never consumes fills the buffer; once it is
/// killed, a blocked producer goes on and the loss is counted.
fn subscriber_killed_unblocks_the_producer(t: T) {
    let (mut out, loc) = output(t);
    out.create_buffer(1, 256, Flow::Credits).unwrap();
    let (mut child, _) = spawn_role("subscriber", &loc);
    // Over tcp the sockets hold more than the rings: full once refused
    // for a while running.
    fill_until_refused(&mut out, 1, 64);
    child.kill().unwrap();
    // Blocking: waits, finds the subscriber dead, detaches it, goes on.
    let seg = out.segment(1, 64, true).unwrap();
    out.deliver(seg, 64).unwrap();
    // Counted before its credits were given up (over tcp the sender
    // thread counts it as it ends: wait for that).
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.stats(1).unwrap().subscribers_lost == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(out.stats(1).unwrap().subscribers_lost, 1);
    let _ = child.wait();
}

/// Sends `len`-byte segments of buffer `id` until the producer has been
/// refused for 200 ms running (memory is bounded: this ends).
fn fill_until_refused(out: &mut Output, id: u32, len: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut refused_since: Option<Instant> = None;
    loop {
        match out.send(id, &vec![0; len], false) {
            Ok(()) => refused_since = None,
            Err(e) if e.is_would_block() => {
                let since = *refused_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_millis(200) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("{e}"),
        }
        assert!(Instant::now() < deadline, "never refused");
    }
}

/// The message layer: messages of many sizes, `more` set at random,
/// through a small buffer (segments wrap, and a message sometimes straddles
/// the wrap): every message arrives once, in order, and messages sent with
/// `more` share segments.
fn messages_round_trip_in_order(t: T) {
    let (mut out, loc) = output(t);
    out.create_buffer(1, 512, Flow::Credits).unwrap();
    let mut input = Input::open(&loc).unwrap();
    input.subscribe(1, 512).unwrap();
    let msgs: Vec<Vec<u8>> = (0..400u32)
        .map(|i| vec![i as u8; (i as usize * 7) % 61])
        .collect();
    let consumer = std::thread::spawn(move || {
        let mut got = Vec::new();
        let mut segments = 0;
        while got.len() < 400 {
            let seg = input
                .recv(Some(Duration::from_secs(5)))
                .unwrap()
                .expect("a segment within 5 s");
            segments += 1;
            let len = seg.len();
            for m in seg.messages().unwrap() {
                got.push(m.unwrap().into_owned());
            }
            input.consumed(1, len).unwrap();
        }
        (got, segments)
    });
    let mut w = out.messages(1, 128, true).unwrap();
    for (i, m) in msgs.iter().enumerate() {
        // Bursts of 1 to 10 messages: the last of each without `more`.
        w.send(m, (i * 31) % 10 != 0).unwrap();
    }
    w.flush().unwrap();
    let (sent, delivered) = w.counts();
    drop(w);
    let (got, segments) = consumer.join().unwrap();
    assert_eq!(got, msgs);
    assert_eq!(sent, 400);
    assert_eq!(segments, delivered);
    assert!(
        delivered < 200,
        "messages with more share segments: {delivered} segments"
    );
}

/// Without `more` every message leaves at once in a segment of its own;
/// one longer than the buffer is refused with the limit; a writer that
/// may not wait takes nothing when the subscribers are full.
fn messages_without_more_and_limits(t: T) {
    let (mut out, loc) = output(t);
    out.create_buffer(1, 256, Flow::Credits).unwrap();
    let mut input = Input::open(&loc).unwrap();
    input.subscribe(1, 256).unwrap();
    {
        let mut w = out.messages(1, 64, false).unwrap();
        w.send(b"one", false).unwrap();
        let seg = input.recv(Some(Duration::from_secs(5))).unwrap().unwrap();
        let got: Vec<Vec<u8>> = seg
            .messages()
            .unwrap()
            .map(|m| m.unwrap().into_owned())
            .collect();
        assert_eq!(got, vec![b"one".to_vec()]);
        let len = seg.len();
        input.consumed(1, len).unwrap();
        let e = w.send(&[0; 253], false).unwrap_err();
        assert!(e.to_string().contains("256"), "names the limit: {e}");
        // Fill the buffer without consuming: then a send is refused and
        // takes nothing (over tcp and udp once the path behind the ring is
        // full too).
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut sent = 0u64;
        loop {
            match w.send(&[7; 60], false) {
                Ok(()) => sent += 1,
                Err(e) if e.is_would_block() => break,
                Err(e) => panic!("{e}"),
            }
            if sent.is_multiple_of(64) {
                assert!(Instant::now() < deadline, "a full buffer never refused");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let (sent, segments) = w.counts();
        assert_eq!(sent, segments, "one segment per message without more");
    }
    let mut n = 0;
    while let Some(seg) = input.recv(Some(Duration::from_millis(500))).unwrap() {
        let len = seg.len();
        for m in seg.messages().unwrap() {
            assert_eq!(m.unwrap().as_ref(), &[7; 60][..]);
            n += 1;
        }
        input.consumed(1, len).unwrap();
    }
    assert!(n > 0, "what was taken arrives");
}

macro_rules! suite {
    ($t:ident: $($name:ident),* $(,)?) => {
        $(#[test] fn $name() { super::$name(super::T::$t) })*
    };
}

/// The same tests over every transport, crash tests included, and a lost
/// source forwarded through a splice.
macro_rules! transports {
    (
        all: [$($all:ident),* $(,)?]
        crash: [$($crash:ident),* $(,)?]
        lost_upstream: [$($lost:ident),* $(,)?]
    ) => {
        mod over_shm {
            suite!(Shm: $($all,)* $($crash,)* $($lost,)*);
        }
        mod over_tcp {
            suite!(Tcp: $($all,)* $($crash,)* $($lost,)*);
        }
        mod over_udp {
            suite!(Udp: $($all,)* $($crash,)* $($lost,)*);
        }
    };
}

transports!(
    all: [
        roundtrip_and_wraparound,
        credit_exhaustion_and_recovery,
        overwrite_never_blocks,
        splice_forwarding,
        bad_requests,
        multiple_buffers_and_subscribers,
        messages_round_trip_in_order,
        messages_without_more_and_limits,
    ]
    crash: [
        producer_killed_is_a_clean_error,
        subscriber_killed_unblocks_the_producer,
    ]
    lost_upstream: [
        spliced_producer_killed_reaches_downstream,
    ]
);

// ---- shared memory only ----

/// A segment that is not a run of framed messages (a length running past
/// its end) reads as an error that says so, after the whole messages
/// before it; never a panic.
#[test]
fn messages_of_a_bad_segment_are_an_error() {
    let (mut out, loc) = output(T::Shm);
    out.create_buffer(1, 256, Flow::Credits).unwrap();
    let mut input = Input::open(&loc).unwrap();
    input.subscribe(1, 256).unwrap();
    out.send(1, &[1, 0, 0, 0, 42, 9, 0, 0, 0, 1, 2], true)
        .unwrap();
    let seg = input.recv(Some(Duration::from_secs(5))).unwrap().unwrap();
    let got: Vec<_> = seg.messages().unwrap().collect();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].as_ref().unwrap().as_ref(), &[42]);
    match &got[1] {
        Err(BufferError::Corrupt { id: 1, why }) => {
            assert!(why.contains("runs past the segment"), "{why}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn overwrite_slow_reader_detects_torn_data() {
    let (mut out, loc) = output(T::Shm);
    out.create_buffer(1, 64, Flow::Overwrite).unwrap();
    let mut input = Input::open(&loc).unwrap();
    input.subscribe(1, 64).unwrap();
    out.send(1, &[1; 32], false).unwrap();
    {
        let seg = input.recv(Some(Duration::from_secs(1))).unwrap().unwrap();
        let mut v = Vec::new();
        assert!(seg.copy_to(&mut v));
        // The producer laps the reader while it holds the segment.
        out.send(1, &[2; 32], false).unwrap();
        out.send(1, &[3; 32], false).unwrap();
        assert!(!seg.intact(), "the sequence lock broke");
        assert!(!seg.copy_to(&mut v), "a copy now is torn");
        assert!(seg.slices().is_err(), "no in-place reads in overwrite mode");
    }
    let s = input.stats(1).unwrap();
    assert_eq!(s.torn, 2);
    // Many more: the slow reader skips what was overwritten, counted.
    for i in 0..100u8 {
        out.send(1, &[i; 16], false).unwrap();
    }
    let seg = input.recv(Some(Duration::from_secs(1))).unwrap().unwrap();
    assert!(seg.intact());
    assert!(input.stats(1).unwrap().lost > 90);
}

#[test]
fn clean_shutdown_removes_files() {
    let d = dir();
    let loc = format!("shm://clean?dir={}", d.display());
    let mut out = Output::open(&loc).unwrap();
    out.create_buffer(5, 4096, Flow::Credits).unwrap();
    let file = d.join("clean").join("5.ring");
    assert!(file.exists());
    drop(out);
    assert!(!file.exists());
    assert!(!d.join("clean").exists(), "empty namespace removed");
}

#[test]
fn corrupted_header_is_a_clean_error() {
    let d = dir();
    let loc = format!("shm://bad?dir={}", d.display());
    let mut out = Output::open(&loc).unwrap();
    out.create_buffer(1, 4096, Flow::Credits).unwrap();
    let file = d.join("bad").join("1.ring");
    let orig = std::fs::read(&file).unwrap();
    // Each corruption of the header: refused at subscribe.
    for (off, val) in [
        (0usize, 0xffu8),
        (8, 9),
        (12, 7),
        (16, 0xff),
        (28, 0xff),
        (48, 1),
    ] {
        let mut bytes = orig.clone();
        bytes[off] ^= val;
        write_at(&file, 0, &bytes[..64]);
        let e = Input::open(&loc).unwrap().subscribe(1, 4096).unwrap_err();
        assert!(
            matches!(e, BufferError::Corrupt { id: 1, .. }),
            "offset {off}: {e}"
        );
    }
    write_at(&file, 0, &orig[..64]);
    let mut input = Input::open(&loc).unwrap();
    input.subscribe(1, 4096).unwrap();
    out.send(1, b"ok", true).unwrap();
    assert_eq!(recv(&mut input).1, b"ok");
    // A producer line claiming segments that were never written: the reader
    // refuses it and closes the buffer.
    write_at(&file, 72, &1000u64.to_le_bytes());
    let e = input.recv(Some(Duration::from_secs(1))).unwrap_err();
    assert!(matches!(e, BufferError::Corrupt { .. }), "{e}");
    let e = input.recv(Some(Duration::from_secs(1))).unwrap_err();
    assert!(matches!(e, BufferError::Closed { .. }), "{e}");
}

fn write_at(path: &PathBuf, off: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, off).unwrap();
}

/// Spawns this binary as a child playing `role` on `loc`; returns once
/// it printed "ready", with the locator it printed (the producer's for its
/// inputs).
fn spawn_role(role: &str, loc: &str) -> (Child, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["child_role", "--exact", "--nocapture", "--test-threads=1"])
        .env("SKIFF_SHM_ROLE", role)
        .env("SKIFF_SHM_LOC", loc)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    let printed = loop {
        match lines.next() {
            Some(Ok(l)) => {
                if let Some((_, printed)) = l.trim_end().split_once("ready ") {
                    break Some(printed.to_string());
                }
            }
            Some(Err(_)) => {}
            None => break None,
        }
    };
    match printed {
        Some(p) => (child, p),
        None => {
            let _ = child.wait();
            panic!("child {role} exited before ready")
        }
    }
}

/// Not a test by itself: the body of a child process in the crash tests.
#[test]
fn child_role() {
    let Ok(role) = std::env::var("SKIFF_SHM_ROLE") else {
        return;
    };
    let loc = std::env::var("SKIFF_SHM_LOC").unwrap();
    match role.as_str() {
        "producer" => {
            let mut out = Output::open(&loc).unwrap();
            out.create_buffer(1, 4096, Flow::Credits).unwrap();
            out.send(1, b"before", true).unwrap();
            println!("ready {}", input_locator(&out, &loc));
            std::thread::sleep(Duration::from_secs(60));
        }
        "subscriber" => {
            let mut input = Input::open(&loc).unwrap();
            input.subscribe(1, 256).unwrap();
            println!("ready {loc}");
            // Never consumes.
            std::thread::sleep(Duration::from_secs(60));
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn producer_killed_is_detected_and_reclaimed() {
    let d = dir();
    let loc = format!("shm://crash?dir={}", d.display());
    let (mut child, _) = spawn_role("producer", &loc);
    let mut input = Input::open(&loc).unwrap();
    input.subscribe(1, 4096).unwrap();
    // Joined after "before": nothing yet. Kill -9 the producer.
    child.kill().unwrap();
    // An error within the wait, not `Ok(None)`: detected, not a hang.
    let e = input.recv(Some(Duration::from_secs(10))).unwrap_err();
    assert!(matches!(e, BufferError::PeerDead { id: 1, .. }), "{e}");
    assert!(!d.join("crash").join("1.ring").exists(), "file reclaimed");
    let _ = child.wait();
    // The name is free again.
    let mut out = Output::open(&loc).unwrap();
    out.create_buffer(1, 4096, Flow::Credits).unwrap();
}

#[test]
fn producer_file_of_a_dead_process_is_reclaimed_on_create() {
    let d = dir();
    let loc = format!("shm://stale?dir={}", d.display());
    let (mut child, _) = spawn_role("producer", &loc);
    let mut out = Output::open(&loc).unwrap();
    let e = out.create_buffer(1, 4096, Flow::Credits).unwrap_err();
    assert!(matches!(e, BufferError::DuplicateId { .. }), "{e}");
    assert!(e.to_string().contains("pid"), "{e}");
    child.kill().unwrap();
    let _ = child.wait();
    out.create_buffer(1, 4096, Flow::Credits).unwrap();
}

#[test]
fn bad_locators_are_refused() {
    for l in [
        "shm://",
        "shm://a/b",
        "udp://x:1",
        "udp://127.0.0.1:0",
        "udp://127.0.0.1:0?reliable=false",
        "udp://127.0.0.1:0?reliable=true&bogus=1",
        "udp://127.0.0.1:0?reliable=true&idle_timeout=soon",
        "shm://x?spin=fast",
        "shm://x?bogus=1",
    ] {
        assert!(Output::open(l).is_err(), "{l}");
    }
    assert!(Output::open(&format!("shm://ok?spin=20us&dir={}", dir().display())).is_ok());
}

// ---- the tcp wire: close frames, dead peers, hostile headers ----

const TCP_SUBSCRIBED: u32 = 0xffff_ffff;
const TCP_CLOSE: u32 = 0xffff_fffd;

fn tcp_header(id: u32, size: u32) -> [u8; 8] {
    let mut h = [0u8; 8];
    h[..4].copy_from_slice(&id.to_le_bytes());
    h[4..].copy_from_slice(&size.to_le_bytes());
    h
}

fn read_header(s: &mut std::net::TcpStream) -> (u32, u32) {
    use std::io::Read;
    let mut h = [0u8; 8];
    s.read_exact(&mut h).unwrap();
    (
        u32::from_le_bytes(h[..4].try_into().unwrap()),
        u32::from_le_bytes(h[4..].try_into().unwrap()),
    )
}

/// Waits (up to 10 s) until `f` holds.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A raw subscriber that unsubscribes one buffer with a close frame and
/// then drops the connection: only the other is counted lost.
#[test]
fn tcp_subscriber_close_frame_is_not_a_loss() {
    use std::io::Write;
    let (mut out, _) = output(T::Tcp);
    out.create_buffer(1, 256, Flow::Credits).unwrap();
    out.create_buffer(2, 256, Flow::Credits).unwrap();
    let mut s = std::net::TcpStream::connect(out.local_addr().unwrap()).unwrap();
    s.write_all(&tcp_header(1, 256)).unwrap();
    s.write_all(&tcp_header(2, 256)).unwrap();
    let mut acked = [read_header(&mut s), read_header(&mut s)];
    acked.sort();
    assert_eq!(acked, [(1, TCP_SUBSCRIBED), (2, TCP_SUBSCRIBED)]);
    s.write_all(&tcp_header(1, TCP_CLOSE)).unwrap();
    drop(s);
    eventually("buffer 2's subscriber counted lost", || {
        out.stats(2).unwrap().subscribers_lost == 1
    });
    assert_eq!(out.stats(1).unwrap().subscribers_lost, 0);
    assert_eq!(out.link_stats().unwrap().peers_lost, 1);
}

/// A raw subscriber that sends an unknown marker is refused: counted, its
/// connection ended, its subscription lost, and the producer is not held.
#[test]
fn tcp_subscriber_unknown_marker_is_refused() {
    use std::io::Write;
    let (mut out, _) = output(T::Tcp);
    out.create_buffer(1, 256, Flow::Credits).unwrap();
    let mut s = std::net::TcpStream::connect(out.local_addr().unwrap()).unwrap();
    s.write_all(&tcp_header(1, 256)).unwrap();
    assert_eq!(read_header(&mut s), (1, TCP_SUBSCRIBED));
    s.write_all(&tcp_header(1, 0xffff_fff0)).unwrap();
    eventually("the subscriber detached", || {
        out.stats(1).unwrap().subscribers_lost == 1
    });
    assert_eq!(out.link_stats().unwrap().frames_malformed, 1);
    // Nobody holds credits: the producer writes freely.
    for _ in 0..100 {
        out.send(1, &[7; 64], true).unwrap();
    }
}

/// A raw output: accepts one input, acknowledges its subscription to
/// buffer 1, then runs `then` on the connection.
fn fake_output(
    then: impl FnOnce(&mut std::net::TcpStream) + Send + 'static,
) -> (String, std::thread::JoinHandle<()>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let loc = format!("tcp://{}", l.local_addr().unwrap());
    let t = std::thread::spawn(move || {
        use std::io::Write;
        let (mut s, _) = l.accept().unwrap();
        assert_eq!(read_header(&mut s), (1, 4096));
        s.write_all(&tcp_header(1, TCP_SUBSCRIBED)).unwrap();
        then(&mut s);
    });
    (loc, t)
}

fn segment_frame(id: u32, data: &[u8]) -> Vec<u8> {
    let mut f = tcp_header(id, data.len() as u32).to_vec();
    f.extend_from_slice(data);
    f
}

#[test]
fn tcp_close_frame_reads_closed_and_eof_reads_lost() {
    use std::io::Write;
    // With a close frame (the connection stays up): Closed after the data.
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let (loc, t) = fake_output(move |s| {
        s.write_all(&segment_frame(1, b"x")).unwrap();
        s.write_all(&tcp_header(1, TCP_CLOSE)).unwrap();
        s.write_all(&[0]).unwrap();
        let _ = done_rx.recv();
    });
    let mut input = Input::open(&loc).unwrap();
    input.subscribe(1, 4096).unwrap();
    assert_eq!(recv(&mut input), (1, b"x".to_vec()));
    let e = input.recv(Some(Duration::from_secs(5))).unwrap_err();
    assert!(matches!(e, BufferError::Closed { id: 1 }), "{e}");
    done_tx.send(()).unwrap();
    t.join().unwrap();
    assert_eq!(input.link_stats().unwrap().peers_lost, 0);

    // Without one (EOF): PeerLost after the data.
    let (loc, t) = fake_output(|s| {
        s.write_all(&segment_frame(1, b"y")).unwrap();
    });
    let mut input = Input::open(&loc).unwrap();
    input.subscribe(1, 4096).unwrap();
    t.join().unwrap();
    assert_eq!(recv(&mut input), (1, b"y".to_vec()));
    let e = input.recv(Some(Duration::from_secs(5))).unwrap_err();
    assert!(matches!(e, BufferError::PeerLost { id: 1 }), "{e}");
    assert_eq!(input.link_stats().unwrap().peers_lost, 1);
}

#[test]
fn tcp_unknown_marker_or_reason_from_an_output_is_refused() {
    use std::io::Write;
    let cases: [&[u8]; 2] = [
        // An unknown marker.
        &tcp_header(1, 0xffff_fffe),
        // A close frame with an unknown reason.
        &[1, 0, 0, 0, 0xfd, 0xff, 0xff, 0xff, 9],
    ];
    for bad in cases {
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let bad = bad.to_vec();
        let (loc, t) = fake_output(move |s| {
            s.write_all(&bad).unwrap();
            let _ = done_rx.recv();
        });
        let mut input = Input::open(&loc).unwrap();
        input.subscribe(1, 4096).unwrap();
        let e = input.recv(Some(Duration::from_secs(5))).unwrap_err();
        assert!(matches!(e, BufferError::Corrupt { id: 1, .. }), "{e}");
        assert_eq!(input.link_stats().unwrap().frames_malformed, 1);
        done_tx.send(()).unwrap();
        t.join().unwrap();
    }
}

#[test]
fn tcp_segment_larger_than_the_ring_closes_that_buffer_only() {
    use std::io::Write;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let loc = format!("tcp://{}", l.local_addr().unwrap());
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        for _ in 0..2 {
            let (id, _) = read_header(&mut s);
            s.write_all(&tcp_header(id, TCP_SUBSCRIBED)).unwrap();
        }
        s.write_all(&segment_frame(1, &[1; 100])).unwrap();
        s.write_all(&segment_frame(2, b"ok")).unwrap();
        let _ = done_rx.recv();
    });
    let mut input = Input::open(&loc).unwrap();
    input.subscribe(1, 64).unwrap();
    input.subscribe(2, 64).unwrap();
    let mut saw = (false, false);
    while !(saw.0 && saw.1) {
        match input.recv(Some(Duration::from_secs(5))) {
            Ok(Some(seg)) => {
                assert_eq!((seg.id(), seg.to_vec()), (2, b"ok".to_vec()));
                saw.1 = true;
            }
            Err(BufferError::Corrupt { id: 1, .. }) => saw.0 = true,
            // Reported once; closed for this reader from then on.
            Err(BufferError::Closed { id: 1 }) if saw.0 => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(input.link_stats().unwrap().protocol_errors, 1);
    done_tx.send(()).unwrap();
    t.join().unwrap();
}

/// A dropped input unsubscribes with a close frame before it hangs up.
#[test]
fn tcp_input_drop_sends_close_frames() {
    let (tx, rx) = std::sync::mpsc::channel();
    let (loc, t) = fake_output(move |s| {
        tx.send(read_header(s)).unwrap();
    });
    let mut input = Input::open(&loc).unwrap();
    input.subscribe(1, 4096).unwrap();
    drop(input);
    t.join().unwrap();
    assert_eq!(rx.recv().unwrap(), (1, TCP_CLOSE));
}
