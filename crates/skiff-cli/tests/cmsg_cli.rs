//! cMsg patterns from the shell: `skiff sub --cmsg` with a type pattern,
//! against `skiff pub` processes; a type no one could subscribe to is
//! refused by `skiff pub`.

mod cli_util;

use std::process::Stdio;
use std::time::Duration;

use cli_util::{fails, read_all, run, skiff, start_node, wait_line};

#[test]
fn sub_cmsg_matches_subject_and_type_as_patterns() {
    let node = start_node(&["--no-mesh"], "listening on tcp");
    let mut sub = skiff()
        .args(["sub", "-n", &node.loc, "--cmsg", "daq.h*b.{i>5 & i<10}"])
        .args(["--type", "count?", "--count", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_line(
        sub.stderr.take().unwrap(),
        "subscribed",
        Duration::from_secs(20),
    );
    for (subject, kind, payload) in [
        ("daq.hallb.7", "count1", "yes-1"),
        ("daq.hallb.7", "count", "no-type"),
        ("daq.hallb.10", "count1", "no-range"),
        ("daq.hallc.7", "count1", "no-subject"),
        ("daq.hb.6", "countx", "yes-2"),
    ] {
        run(&["pub", "-n", &node.loc, subject, payload, "--type", kind]);
    }
    let out = read_all(sub.stdout.take().unwrap());
    assert!(sub.wait().unwrap().success());
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["daq.hallb.7 [count1] yes-1", "daq.hb.6 [countx] yes-2"]
    );
    // A bad cMsg pattern is refused before anything waits.
    let e = fails(&["sub", "-n", &node.loc, "--cmsg", "a{i<"]);
    assert!(e.contains("without its `}`"), "{e}");
    // A type no subscription could name is refused on publish.
    for bad in ["*", "a b"] {
        let e = fails(&["pub", "-n", &node.loc, "t", "x", "--type", bad]);
        assert!(e.contains("type"), "{bad:?}: {e}");
    }
}
