//! The harness shared by the node's tests: one node per test, reached in
//! process (`mem://`), over TCP (`skiff://`), over a Unix socket or over
//! shared memory (`shm://`), so one suite runs against every transport.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use skiff::client::{Client, Subscription};
use skiff_node::{Config, Node};

/// How the test's clients reach the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Mem,
    Tcp,
    Unix,
    Shm,
}

/// A node for one test.
pub struct H {
    pub node: Node,
    pub kind: Kind,
    /// The node's `shm://` listener (`Kind::Shm`).
    pub shm: Option<skiff_node::ShmListener>,
    shm_locator: Option<String>,
    _dir: Option<TempDir>,
}

/// A directory removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn temp_dir(tag: &str) -> TempDir {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let p = std::env::temp_dir().join(format!("skiff-{tag}-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&p).unwrap();
    TempDir(p)
}

impl H {
    pub async fn new(kind: Kind) -> H {
        H::with(kind, Config::default()).await
    }

    pub async fn with(kind: Kind, mut config: Config) -> H {
        config.tcp = None;
        config.unix = None;
        let mut dir = None;
        match kind {
            Kind::Mem => {
                return H {
                    node: Node::embedded(&config),
                    kind,
                    shm: None,
                    shm_locator: None,
                    _dir: None,
                }
            }
            Kind::Shm => {
                let d = temp_dir("shm");
                let locator = format!("shm://node?dir={}", d.0.display());
                let node = Node::start(&config).await.unwrap();
                let shm = skiff_node::ShmListener::start(node.broker().clone(), &locator).unwrap();
                return H {
                    node,
                    kind,
                    shm: Some(shm),
                    shm_locator: Some(locator),
                    _dir: Some(d),
                };
            }
            Kind::Tcp => config.tcp = Some("127.0.0.1:0".parse().unwrap()),
            Kind::Unix => {
                let d = temp_dir("sock");
                config.unix = Some(d.0.join("node.sock"));
                dir = Some(d);
            }
        }
        H {
            node: Node::start(&config).await.unwrap(),
            kind,
            shm: None,
            shm_locator: None,
            _dir: dir,
        }
    }

    pub fn locator(&self) -> String {
        match self.kind {
            Kind::Mem => unreachable!("mem clients attach directly"),
            Kind::Tcp => format!("skiff://{}", self.node.tcp_addr().unwrap()),
            Kind::Unix => format!("unix://{}", self.node.unix_path().unwrap().display()),
            Kind::Shm => self.shm_locator.clone().unwrap(),
        }
    }

    pub async fn client(&self) -> Client {
        self.try_client().await.unwrap()
    }

    pub async fn try_client(&self) -> Result<Client, skiff::Error> {
        match self.kind {
            Kind::Mem => Client::attach(&self.node),
            _ => Client::connect(&self.locator()).await,
        }
    }
}

/// Receives `n` messages or fails after a generous timeout.
pub async fn recv_n(sub: &mut Subscription, n: usize) -> Vec<skiff::client::Delivery> {
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(Duration::from_secs(10), sub.recv()).await {
            Ok(Some(d)) => out.push(d),
            Ok(None) => panic!("subscription ended after {} of {n}", out.len()),
            Err(_) => panic!("timed out after {} of {n}", out.len()),
        }
    }
    out
}

/// Publishes `n` messages of 2,000 bytes on `subject` from a task of its
/// own, message `i` carrying `i` in its first 8 bytes; the task returns
/// the client once everything is flushed.
#[allow(dead_code)] // not every test binary publishes numbered messages
pub fn publish_numbered(
    publisher: Client,
    subject: &'static str,
    n: u64,
) -> tokio::task::JoinHandle<Client> {
    tokio::spawn(async move {
        for i in 0..n {
            let mut payload = vec![7u8; 2000];
            payload[..8].copy_from_slice(&i.to_le_bytes());
            publisher
                .publish(skiff::Message::new(subject, payload))
                .await
                .unwrap();
        }
        publisher.flush().await.unwrap();
        publisher
    })
}

/// Sends three requests `q0`..`q2` on `svc.echo` from `requester` and
/// asserts each reply is `re:` followed by the request's payload: the
/// requester's side of the echo tests of shared-buffer responders.
pub async fn ask_echo_three(requester: &Client) {
    for i in 0..3 {
        let got = requester
            .request(
                "svc.echo",
                skiff::Message::new("svc.echo", format!("q{i}")),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        assert_eq!(got.payload, bytes::Bytes::from(format!("re:q{i}")));
    }
}

/// Asserts nothing more arrives within a short while.
pub async fn quiet(sub: &mut Subscription) {
    if let Ok(Some(d)) = tokio::time::timeout(Duration::from_millis(100), sub.recv()).await {
        panic!("unexpected message on {}", d.subject);
    }
}

/// Polls `f` until it holds or 5 s pass.
pub async fn eventually(mut f: impl FnMut() -> bool) {
    let t = std::time::Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(5), "condition never held");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Generates one `#[tokio::test]` per transport for each named async fn
/// taking an [`H`].
#[macro_export]
macro_rules! on_every_transport {
    ($($name:ident),* $(,)?) => {
        mod mem {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(super::common::H::new(super::common::Kind::Mem).await).await
            })*
        }
        mod tcp {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(super::common::H::new(super::common::Kind::Tcp).await).await
            })*
        }
        mod unix {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(super::common::H::new(super::common::Kind::Unix).await).await
            })*
        }
        mod shm {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(super::common::H::new(super::common::Kind::Shm).await).await
            })*
        }
    };
}
