//! Slow consumers: one slow subscriber (paused) and three fast ones, for
//! each policy, on every transport; and 1,000 concurrent clients.

mod common;

use std::time::Duration;

use common::{eventually, recv_n, Kind, H};
use skiff::client::{Policy, SubOptions, Subscription};
use skiff::Message;

on_every_transport!(
    drop_oldest_keeps_the_newest,
    drop_newest_keeps_the_oldest,
    disconnect_closes_only_the_slow_client,
    block_holds_the_publisher_until_room,
    many_concurrent_clients,
);

const N: u32 = 2000;
const QUEUE: u32 = 100;
const WINDOW: u32 = 10;

/// One slow (paused, own client) and three fast subscribers to `slow.x`.
async fn setup(
    h: &H,
    policy: Policy,
) -> (
    skiff::Client,
    Subscription,
    Vec<(skiff::Client, Subscription)>,
) {
    let opts = SubOptions::default()
        .policy(policy)
        .queue(QUEUE)
        .window(WINDOW);
    let sc = h.client().await;
    let slow = sc.subscribe_with("slow.x", "*", opts).await.unwrap();
    slow.pause();
    let mut fast = Vec::new();
    for _ in 0..3 {
        let c = h.client().await;
        // The fast ones use the same policy with room for a burst of N
        // (the publisher is open loop): they keep up, so it never acts.
        let s = c
            .subscribe_with("slow.x", "*", opts.queue(N).window(256))
            .await
            .unwrap();
        fast.push((c, s));
    }
    (sc, slow, fast)
}

fn seqs(v: &[skiff::client::Delivery]) -> Vec<u32> {
    v.iter()
        .map(|d| u32::from_le_bytes(d.payload[..4].try_into().unwrap()))
        .collect()
}

/// Publishes N messages on one task while the fast subscribers read theirs
/// on others; returns when all fast subscribers have all N, in order.
async fn publish_and_check_fast(
    h: &H,
    fast: Vec<(skiff::Client, Subscription)>,
) -> Vec<(skiff::Client, Subscription)> {
    let p = h.client().await;
    let readers: Vec<_> = fast
        .into_iter()
        .map(|(c, mut s)| {
            tokio::spawn(async move {
                let got = recv_n(&mut s, N as usize).await;
                assert_eq!(seqs(&got), (0..N).collect::<Vec<_>>());
                assert_eq!(s.dropped(), 0);
                (c, s)
            })
        })
        .collect();
    for i in 0..N {
        p.publish(Message::new("slow.x", i.to_le_bytes().to_vec()))
            .await
            .unwrap();
    }
    p.flush().await.unwrap();
    let mut out = Vec::new();
    for r in readers {
        out.push(r.await.unwrap());
    }
    out
}

/// What the slow subscriber got: at most its window plus its queue, in
/// order, and every message either delivered or counted as dropped.
async fn slow_got(slow: &mut Subscription) -> Vec<u32> {
    let got = seqs(&recv_n(slow, (WINDOW + QUEUE) as usize).await);
    common::quiet(slow).await;
    assert!(got.windows(2).all(|w| w[0] < w[1]), "out of order: {got:?}");
    assert_eq!(got.len() as u64 + slow.dropped(), u64::from(N));
    got
}

async fn drop_oldest_keeps_the_newest(h: H) {
    let (_sc, mut slow, fast) = setup(&h, Policy::DropOldest).await;
    publish_and_check_fast(&h, fast).await;
    slow.resume();
    let got = slow_got(&mut slow).await;
    // The queue kept the newest: it ends with the last QUEUE published.
    assert_eq!(
        got[got.len() - QUEUE as usize..],
        (N - QUEUE..N).collect::<Vec<_>>()[..]
    );
}

async fn drop_newest_keeps_the_oldest(h: H) {
    let (sc, mut slow, fast) = setup(&h, Policy::DropNewest).await;
    publish_and_check_fast(&h, fast).await;
    slow.resume();
    let got = slow_got(&mut slow).await;
    // The queue kept the oldest: it starts with the first QUEUE published.
    assert_eq!(got[..QUEUE as usize], (0..QUEUE).collect::<Vec<_>>()[..]);
    // The node's stats agree.
    let st = sc.stats().await.unwrap();
    let me = st.clients.iter().find(|c| c.id == sc.id()).unwrap();
    assert_eq!(me.subscriptions[0].counters.dropped, slow.dropped());
    assert_eq!(me.subscriptions[0].policy, "drop-newest");
}

async fn disconnect_closes_only_the_slow_client(h: H) {
    let (_sc, mut slow, fast) = setup(&h, Policy::Disconnect).await;
    let fast = publish_and_check_fast(&h, fast).await;
    slow.resume();
    // What was delivered before the node gave up, then the end.
    let mut n = 0;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(5), slow.recv()).await {
        n += 1;
    }
    assert!(n <= (WINDOW + QUEUE) as usize);
    let why = slow.error().expect("ended by the node");
    assert!(why.contains("slow consumer"), "{why}");
    // The fast ones are still subscribed.
    assert_eq!(h.node.broker().subscription_count(), 3);
    drop(fast);
}

async fn block_holds_the_publisher_until_room(h: H) {
    let (_sc, mut slow, fast) = setup(&h, Policy::Block).await;
    let p = h.client().await;
    let published = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let pc = published.clone();
    let pubr = tokio::spawn(async move {
        for i in 0..N {
            p.publish(Message::new("slow.x", i.to_le_bytes().to_vec()))
                .await
                .unwrap();
            pc.store(i + 1, std::sync::atomic::Ordering::Relaxed);
        }
        p.flush().await.unwrap();
    });
    let readers: Vec<_> = fast
        .into_iter()
        .map(|(c, mut s)| {
            tokio::spawn(async move {
                let got = recv_n(&mut s, N as usize).await;
                assert_eq!(seqs(&got), (0..N).collect::<Vec<_>>());
                drop(c);
            })
        })
        .collect();
    // The slow subscriber holds everyone back (by design, documented)...
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!pubr.is_finished(), "publisher was not held back");
    // ...and nothing is lost once it reads.
    slow.resume();
    let got = recv_n(&mut slow, N as usize).await;
    assert_eq!(seqs(&got), (0..N).collect::<Vec<_>>());
    assert_eq!(slow.dropped(), 0);
    pubr.await.unwrap();
    for r in readers {
        r.await.unwrap();
    }
}

async fn many_concurrent_clients(h: H) {
    raise_nofile(8192);
    // Over shm each client has a reader and a writer thread and two rings
    // on each side (by design: few local clients per host), and here both
    // sides live in this one test process: a thousand would be 4000
    // threads and 16 GB of mappings. A hundred still run concurrently.
    let n = if h.kind == Kind::Shm { 100 } else { 1000 };
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        clients.push(h.client().await);
    }
    let mut subs = Vec::with_capacity(n);
    for (i, c) in clients.iter().enumerate() {
        subs.push(c.subscribe(&format!("many.{i}"), "*").await.unwrap());
    }
    assert_eq!(h.node.broker().client_count(), n);
    // Each client publishes to the next one; every one receives.
    let mut tasks = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            c.publish(Message::new(format!("many.{}", (i + 1) % n), i.to_string()))
                .await
                .unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for (i, s) in subs.iter_mut().enumerate() {
        let d = recv_n(s, 1).await;
        assert_eq!(d[0].payload, ((i + n - 1) % n).to_string().as_bytes());
    }
    drop(subs);
    drop(clients);
    let b = h.node.broker().clone();
    eventually(|| b.client_count() == 0).await;
}

fn raise_nofile(want: u64) {
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < want {
            r.rlim_cur = want.min(r.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}
