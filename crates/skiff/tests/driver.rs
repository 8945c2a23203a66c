//! Where an endpoint's driver runs (`driver=auto|task|thread`): the choice
//! the locator and the caller's runtime make, tunnels through drivers that
//! are tasks, an endpoint dropped right after a close or with messages
//! still queued on a lossy path, and an endpoint whose runtime went away.

use std::time::Duration;

use bytes::Bytes;
use skiff::{Endpoint, TunnelError};

const T: Duration = Duration::from_secs(5);

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn bind(opts: &str) -> Result<Endpoint, skiff::Error> {
    Endpoint::bind(&format!("udp://127.0.0.1:0?{opts}"))
}

#[test]
fn the_driver_runs_where_the_locator_and_the_runtime_say() {
    // No runtime: a thread, and `driver=task` is refused with the reason.
    assert!(!bind("").unwrap().driver_is_task());
    let e = bind("driver=task").unwrap_err().to_string();
    assert!(e.contains("driver=task needs a tokio runtime"), "{e}");
    let e = bind("driver=sometimes").unwrap_err().to_string();
    assert!(e.contains("auto, task or thread"), "{e}");

    let rt = multi_thread();
    {
        let _in = rt.enter();
        assert!(bind("").unwrap().driver_is_task());
        assert!(bind("driver=auto").unwrap().driver_is_task());
        assert!(!bind("driver=thread").unwrap().driver_is_task());
    }
    let rt = current_thread();
    {
        let _in = rt.enter();
        assert!(!bind("").unwrap().driver_is_task());
        assert!(bind("driver=task").unwrap().driver_is_task());
    }
}

/// Message `i`: its number, then a pattern of it, of a size that runs from
/// a few bytes to several packets' worth.
fn message(i: u32) -> Bytes {
    let len = 4 + (i as usize * 7919) % 200_000;
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&i.to_be_bytes());
    m.extend((4..len).map(|k| (k as u32 ^ i) as u8));
    Bytes::from(m)
}

/// Sends `n` messages from one end of a fresh tunnel to the other and
/// checks each arrived once, whole and in order.
async fn exchange(opts: &str, n: u32, want_task: bool) {
    let server = bind(opts).unwrap();
    server.listen();
    let client = bind(opts).unwrap();
    assert_eq!(server.driver_is_task(), want_task);
    assert_eq!(client.driver_is_task(), want_task);
    let (c, s) = tokio::join!(client.connect(server.local_addr(), T), server.accept());
    let (c, s) = (c.unwrap(), s.unwrap());
    let reader = async {
        for i in 0..n {
            let m = s.recv().await.unwrap().expect("a message, not the end");
            assert_eq!(m, message(i), "message {i}");
        }
        assert_eq!(s.recv().await.unwrap(), None);
    };
    let writer = async {
        for i in 0..n {
            c.send(message(i)).await.unwrap();
        }
        c.close().await.unwrap();
    };
    tokio::time::timeout(Duration::from_secs(30), async {
        tokio::join!(reader, writer)
    })
    .await
    .expect("the exchange finished");
    let st = c.stats();
    assert_eq!(
        st.messages_sent - st.bundles_sent + st.bundled_messages_sent,
        n as u64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_through_task_drivers_arrive_once_whole_and_in_order() {
    exchange("", 2_000, true).await;
}

/// On a current-thread runtime the driver shares the test's one thread.
#[tokio::test]
async fn task_drivers_work_on_a_current_thread_runtime() {
    exchange("driver=task", 500, true).await;
}

/// The same exchange with a thread per driver, inside a runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_drivers_carry_the_same_exchange() {
    exchange("driver=thread", 500, false).await;
}

/// Reads `s` to its end (each read within `T`), each message the next of
/// [`message`]; returns how many came.
async fn read_in_order(s: &skiff::Tunnel) -> u32 {
    let mut got = 0;
    while let Some(m) = tokio::time::timeout(T, s.recv()).await.unwrap().unwrap() {
        assert_eq!(m, message(got));
        got += 1;
    }
    got
}

/// A process that closes its tunnel and drops its endpoint at once (as
/// one that exits does) must not leave the peer waiting for its idle
/// timeout: the dropped endpoint's driver task lingers until the close is
/// through, while the drop waits off the runtime's worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_sees_the_end_at_once_when_an_endpoint_is_dropped_right_after_close() {
    let opts = "idle_timeout=30s";
    let server = bind(opts).unwrap();
    server.listen();
    let client = bind(opts).unwrap();
    assert!(client.driver_is_task());
    let (c, s) = tokio::join!(client.connect(server.local_addr(), T), server.accept());
    let (c, s) = (c.unwrap(), s.unwrap());
    let reader = tokio::spawn(async move {
        let got = read_in_order(&s).await;
        tokio::time::timeout(T, s.close()).await.unwrap().unwrap();
        got
    });
    for i in 0..300 {
        c.send(message(i)).await.unwrap();
    }
    tokio::time::timeout(T, c.close()).await.unwrap().unwrap();
    drop(c);
    drop(client);
    let started = std::time::Instant::now();
    assert_eq!(tokio::time::timeout(T, reader).await.unwrap().unwrap(), 300);
    assert!(started.elapsed() < T, "ended in {:?}", started.elapsed());
}

/// Relays datagrams between one client and `server`, dropping every
/// `nth` datagram from the client: a lossy path. Returns the address the
/// client connects to (the server sees the relay as its peer) and the
/// count of datagrams dropped. The relay's thread lives as long as the
/// test process.
fn lossy_relay(
    server: std::net::SocketAddr,
    nth: u64,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let at = sock.local_addr().unwrap();
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = dropped.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65_536];
        let (mut client, mut n) = (None, 0u64);
        while let Ok((len, from)) = sock.recv_from(&mut buf) {
            if from == server {
                if let Some(c) = client {
                    let _ = sock.send_to(&buf[..len], c);
                }
                continue;
            }
            client = Some(from);
            n += 1;
            if n % nth == 0 {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            } else {
                let _ = sock.send_to(&buf[..len], server);
            }
        }
    });
    (at, dropped)
}

/// A process that drops its tunnel and its endpoint right after queueing
/// its last messages, on a path that loses one datagram in ten: what was
/// queued, and the end, still reach the peer, because the dropped
/// endpoint's driver lingers to send and retransmit them (without the
/// linger the peer would wait for its idle timeout, 30 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_endpoint_delivers_what_it_queued_over_a_lossy_path() {
    const N: u32 = 60;
    let opts = "idle_timeout=30s";
    let server = bind(opts).unwrap();
    server.listen();
    let (relay, dropped) = lossy_relay(server.local_addr(), 10);
    let client = bind(opts).unwrap();
    assert!(client.driver_is_task());
    let (c, s) = tokio::join!(client.connect(relay, T), server.accept());
    let (c, s) = (c.unwrap(), s.unwrap());
    let reader = tokio::spawn(async move { read_in_order(&s).await });
    for i in 0..N {
        c.send(message(i)).await.unwrap();
    }
    drop(c);
    drop(client);
    assert_eq!(tokio::time::timeout(T, reader).await.unwrap().unwrap(), N);
    assert!(dropped.load(std::sync::atomic::Ordering::Relaxed) > 0);
}

/// The runtime a driver task runs on shut down: the endpoint stops, and
/// says so to whoever uses it next, instead of hanging.
#[test]
fn an_endpoint_whose_runtime_is_gone_says_so() {
    let rt = multi_thread();
    let ep = {
        let _in = rt.enter();
        bind("").unwrap()
    };
    assert!(ep.driver_is_task());
    ep.listen();
    drop(rt);
    let other = current_thread();
    let r = other.block_on(async { tokio::time::timeout(T, ep.accept()).await });
    assert!(matches!(r, Ok(Err(TunnelError::EndpointGone))), "{r:?}");
}
