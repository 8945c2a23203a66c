//! Best effort per subscription and per publish (issue 16, item 5)
//! between two real `skiff node --mesh` processes on loopback: copies
//! that only best-effort subscriptions want (`skiff sub --best-effort`),
//! and messages published best effort (`skiff pub --best-effort`), cross
//! as datagrams (the peer's `sent_frames` in `skiff stats --mesh`); the
//! rest travels over the reliable link (the link's `sent_frames`), and a
//! reliable subscription keeps a subject reliable however many
//! best-effort ones share it.

use std::sync::mpsc;

mod cli_util;
use cli_util::mesh::{
    mesh_node as start_node, remote_patterns, stats, subscribe, wait_stats, PATIENCE,
};
use cli_util::run;

/// Frames sent to peers (all of them) as datagrams (best effort).
fn datagram_frames(v: &serde_json::Value) -> u64 {
    v["mesh"]["peers"].as_array().map_or(0, |ps| {
        ps.iter()
            .map(|p| p["sent_frames"].as_u64().unwrap_or(0))
            .sum()
    })
}

/// Frames handed to the reliable links.
fn link_frames(v: &serde_json::Value) -> u64 {
    v["mesh"]["links"].as_array().map_or(0, |ls| {
        ls.iter()
            .map(|l| l["sent_frames"].as_u64().unwrap_or(0))
            .sum()
    })
}

/// Takes `n` lines, each `subject payload`, all on `subject`.
fn take(rx: &mpsc::Receiver<String>, n: usize, subject: &str, who: &str) {
    for i in 0..n {
        let l = rx
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("{who}: message {i} of {n} on {subject} did not come"));
        assert!(l.starts_with(subject), "{who}: {l}");
    }
}

#[test]
fn best_effort_subscriptions_and_publishes_cross_as_datagrams() {
    let net = format!("be-{}", std::process::id());
    let (_a, aa, am) = start_node(&net, "");
    let (_b, ba, _) = start_node(&net, &am);
    for n in [&aa, &ba] {
        wait_stats(n, "a member up", |v| {
            v["mesh"]["stats"]["members_up"].as_u64() == Some(1)
        });
    }
    // On B: a reliable and a best-effort subscription to `rel.>`, and a
    // best-effort one alone on `be.>`.
    let (_r, rel) = subscribe(&ba, "rel.>", &[]);
    let (_rb, rel_be) = subscribe(&ba, "rel.>", &["--best-effort"]);
    let (_l, be) = subscribe(&ba, "be.>", &["--best-effort"]);
    wait_stats(&aa, "B's three interests", |v| remote_patterns(v) == 3);
    let a = format!("skiff://{aa}");
    const N: u64 = 20;
    let n = N.to_string();

    // Only best-effort subscriptions want `be.x`: datagrams.
    let v0 = stats(&aa);
    run(&["pub", "-n", &a, "be.x", "p", "--count", &n]);
    take(&be, N as usize, "be.x", "best-effort sub");
    wait_stats(&aa, "be.x as datagrams", |v| {
        datagram_frames(v) == datagram_frames(&v0) + N
    });
    assert_eq!(
        link_frames(&stats(&aa)),
        link_frames(&v0),
        "no be.x on the link"
    );

    // A reliable subscription wants `rel.x`: the reliable link, although
    // a best-effort subscription matches too.
    let v1 = stats(&aa);
    run(&["pub", "-n", &a, "rel.x", "p", "--count", &n]);
    take(&rel, N as usize, "rel.x", "reliable sub");
    take(&rel_be, N as usize, "rel.x", "best-effort sub on rel.>");
    wait_stats(&aa, "rel.x on the link", |v| {
        link_frames(v) >= link_frames(&v1) + N
    });
    assert_eq!(
        datagram_frames(&stats(&aa)),
        datagram_frames(&v1),
        "rel.x took the datagram path"
    );

    // Published best effort: datagrams even for the reliable subscription.
    let v2 = stats(&aa);
    run(&[
        "pub",
        "-n",
        &a,
        "rel.y",
        "p",
        "--count",
        &n,
        "--best-effort",
    ]);
    take(&rel, N as usize, "rel.y", "reliable sub");
    take(&rel_be, N as usize, "rel.y", "best-effort sub on rel.>");
    wait_stats(&aa, "rel.y as datagrams", |v| {
        datagram_frames(v) == datagram_frames(&v2) + N
    });
    assert_eq!(
        link_frames(&stats(&aa)),
        link_frames(&v2),
        "no rel.y on the link"
    );
    assert!(be.try_recv().is_err(), "be.> got what it did not match");
}
