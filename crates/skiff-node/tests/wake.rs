//! The node holds the wake-up latency it is configured with for as long as
//! it runs, and releases it when it stops.

use skiff_node::{wake, Config, Node};

#[tokio::test]
async fn node_holds_its_wake_latency_while_it_runs() {
    let Ok(before) = wake::current() else {
        eprintln!(
            "SKIPPED node_holds_its_wake_latency_while_it_runs: {} cannot be read",
            wake::DEVICE
        );
        return;
    };
    // An odd value, below the default and any other request a test
    // machine is likely to hold.
    let want = 7;
    if before <= want {
        eprintln!("SKIPPED node_holds_its_wake_latency_while_it_runs: something holds {before} µs already");
        return;
    }
    let config = Config {
        tcp: Some("127.0.0.1:0".parse().unwrap()),
        wake_latency_us: Some(want),
        ..Config::default()
    };
    let node = match Node::start(&config).await {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            eprintln!("SKIPPED node_holds_its_wake_latency_while_it_runs: {e}");
            return;
        }
        Err(e) => panic!("node start: {e}"),
    };
    assert_eq!(node.wake_latency_us(), Some(want));
    assert_eq!(wake::current().unwrap(), want);
    node.shutdown().await;
    assert_eq!(wake::current().unwrap(), before, "released with the node");
}

#[tokio::test]
async fn a_node_without_the_setting_requests_nothing() {
    let node = Node::start(&Config {
        tcp: Some("127.0.0.1:0".parse().unwrap()),
        ..Config::default()
    })
    .await
    .unwrap();
    assert_eq!(node.wake_latency_us(), None);
}
