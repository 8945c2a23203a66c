//! `mem://`: the client API's seam for an in-process node, served by this
//! crate's node once installed. One test, since installing is per process.

use std::time::Duration;

use skiff::client::Client;
use skiff::{Error, LocatorError, Message};

#[tokio::test]
async fn mem_locator_needs_an_installed_node_then_attaches_one_per_name() {
    let e = Client::connect("mem://a").await.unwrap_err();
    assert!(
        matches!(e, Error::Locator(LocatorError::NoLocalNode)),
        "before install: {e}"
    );
    assert!(e.to_string().contains("skiff_node::embed::install"), "{e}");

    skiff_node::embed::install();
    let sub = Client::connect("mem://a").await.unwrap();
    let mut s = sub.subscribe("t.>", "*").await.unwrap();
    let other = Client::connect("mem://b").await.unwrap();
    let mut s_other = other.subscribe("t.>", "*").await.unwrap();
    let publ = Client::connect("mem://a").await.unwrap();
    publ.publish(Message::new("t.x", "hello")).await.unwrap();
    publ.flush().await.unwrap();

    let m = tokio::time::timeout(Duration::from_secs(5), s.recv())
        .await
        .expect("delivered on the same named node")
        .expect("subscription open");
    assert_eq!(&m.into_message().payload[..], b"hello");
    // mem://b is another node: nothing published there.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), s_other.recv())
            .await
            .is_err(),
        "mem://b must be a node of its own"
    );
}
