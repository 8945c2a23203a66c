//! RBMQ's splice between real `skiff node` processes (issue 21, item 3):
//! an shm client of node A publishes large messages that a subscriber of
//! meshed node B gets. A's reliable link to B keeps each message by
//! reference to the client's ring (spliced, not copied into the link's
//! batch) until B has it; the ring space comes back when B acknowledges,
//! and when B dies (the frames are counted lost), so the publisher is
//! never left waiting for ring space that leaked.

use std::time::{Duration, Instant};

use skiff::client::Client;
use skiff::Message;

mod cli_util;
use cli_util::mesh::{mesh_node_with, remote_patterns, stats, wait_stats, Proc, PATIENCE};

/// A meshed node (seeded by `seeds`), with shm at `shm` if given, and
/// more `skiff node` arguments (`extra`): its process, client and mesh
/// addresses.
fn node(net: &str, seeds: &str, shm: Option<&str>, extra: &[&str]) -> (Proc, String, String) {
    let mut args = extra.to_vec();
    if let Some(name) = shm {
        args.extend(["--shm", name]);
    }
    mesh_node_with(net, seeds, &args)
}

/// A's link to B's spliced count.
fn spliced(addr: &str) -> u64 {
    let v = stats(addr);
    v["mesh"]["links"].as_array().map_or(0, |ls| {
        ls.iter().map(|l| l["spliced"].as_u64().unwrap_or(0)).sum()
    })
}

/// Messages of 8 KiB per round.
const N: u32 = 1200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_publishes_reach_another_node_spliced_and_ring_space_comes_back() {
    let net = format!("splice-{}", std::process::id());
    let dir = std::env::temp_dir().join(format!("skiff-splice-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let shm = format!("shm://sa?dir={}", dir.display());
    let (_a, aa, am) = node(&net, "", Some(&shm), &[]);
    let (b, ba, _bm) = node(&net, &am, None, &[]);
    let sub = Client::connect(&format!("skiff://{ba}")).await.unwrap();
    let mut s = sub.subscribe("sp.>", "*").await.unwrap();
    wait_stats(&aa, "B's interest", |v| remote_patterns(v) >= 1);

    // 1200 messages of 8 KiB are more than two rings' worth (a client's
    // ring holds twice the largest frame, 4 MiB here), so the publisher
    // goes on only as A's link to B lets go of what it spliced.
    let p = Client::connect(&shm).await.unwrap();
    let body = |i: u32| {
        let mut v = vec![(i % 251) as u8; 8192];
        v[..4].copy_from_slice(&i.to_le_bytes());
        v
    };
    for i in 0..N {
        p.publish(Message::new("sp.x", body(i))).await.unwrap();
    }
    p.flush().await.unwrap();
    for i in 0..N {
        let d = tokio::time::timeout(PATIENCE, s.recv())
            .await
            .expect("in time")
            .expect("open");
        assert_eq!(&d.msg.payload[..], &body(i)[..], "message {i}");
    }
    let n = spliced(&aa);
    assert!(n >= u64::from(N), "spliced {n}");

    // B dies with messages on the way: A counts them lost and lets go of
    // their ring space; the publisher is not left waiting.
    b.signal(libc::SIGSTOP);
    let publisher = tokio::spawn(async move {
        for i in 0..N {
            p.publish(Message::new("sp.y", body(i))).await.unwrap();
        }
        p.flush().await.unwrap();
        p
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // B takes nothing: what A's link spliced for it holds the ring (more
    // than a ring's worth was published), so the publisher waits.
    assert!(
        !publisher.is_finished(),
        "the link holds the ring space of what it spliced for B"
    );
    b.signal(libc::SIGKILL);
    let t = Instant::now();
    let p = tokio::time::timeout(PATIENCE, publisher)
        .await
        .expect("the publisher finished: no ring space held for a dead peer")
        .unwrap();
    assert!(t.elapsed() < PATIENCE);
    // What was on the way to B is counted lost.
    let lost: u64 = stats(&aa)["mesh"]["links"].as_array().map_or(0, |ls| {
        ls.iter().map(|l| l["lost"].as_u64().unwrap_or(0)).sum()
    });
    assert!(lost > 0, "frames on the way to B counted lost");
    // And A still takes publishes from it (its ring is free).
    let local = Client::connect(&format!("skiff://{aa}")).await.unwrap();
    let mut l = local.subscribe("sp.z", "*").await.unwrap();
    for i in 0..20u32 {
        p.publish(Message::new("sp.z", body(i))).await.unwrap();
    }
    p.flush().await.unwrap();
    for i in 0..20u32 {
        let d = tokio::time::timeout(PATIENCE, l.recv())
            .await
            .expect("in time")
            .expect("open");
        assert_eq!(&d.msg.payload[..4], &i.to_le_bytes());
    }
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

/// With `splice = false` the same publishes reach B, copied into the
/// link's batches: nothing is spliced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn splice_off_copies_and_delivers_the_same() {
    let net = format!("nosplice-{}", std::process::id());
    let dir = std::env::temp_dir().join(format!("skiff-nosplice-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let shm = format!("shm://sn?dir={}", dir.display());
    let (_a, aa, am) = node(&net, "", Some(&shm), &["--set", "splice=false"]);
    let (_b, ba, _bm) = node(&net, &am, None, &[]);
    let sub = Client::connect(&format!("skiff://{ba}")).await.unwrap();
    let mut s = sub.subscribe("sp.>", "*").await.unwrap();
    wait_stats(&aa, "B's interest", |v| remote_patterns(v) >= 1);
    let p = Client::connect(&shm).await.unwrap();
    let n = 300u32;
    for i in 0..n {
        let mut v = vec![(i % 251) as u8; 8192];
        v[..4].copy_from_slice(&i.to_le_bytes());
        p.publish(Message::new("sp.x", v)).await.unwrap();
    }
    p.flush().await.unwrap();
    for i in 0..n {
        let d = tokio::time::timeout(PATIENCE, s.recv())
            .await
            .expect("in time")
            .expect("open");
        assert_eq!(&d.msg.payload[..4], &i.to_le_bytes(), "message {i}");
        assert_eq!(d.msg.payload.len(), 8192);
    }
    assert_eq!(spliced(&aa), 0, "splice = false: nothing spliced");
    let _ = std::fs::remove_dir_all(&dir);
}
