//! TLS on the NATS port over raw sockets, as nats-server does it: `INFO`
//! in plaintext with `tls_required`, then the client's TLS handshake on
//! the same connection (here tokio-rustls, since `openssl s_client
//! -starttls` knows no NATS); TLS first with `handshake_first`; a
//! plaintext client refused with nats-server's error; garbage and silence
//! instead of a handshake closed and counted. Real NATS clients over TLS
//! are run by `tests/nats/run.sh`. Certificates are made at run time.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{temp_dir, TempDir};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use skiff_node::{Config, Node};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

const PATIENCE: Duration = Duration::from_secs(10);

/// A CA and the node's certificate signed by it.
struct Pki {
    dir: TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = temp_dir("nats-tls");
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "skiff nats test ca");
        let ca = CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.0.join("ca.pem"), ca.pem()).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        std::fs::write(dir.0.join("node.pem"), cert.pem()).unwrap();
        std::fs::write(dir.0.join("node.key"), key.serialize_pem()).unwrap();
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.0.join(name)
    }

    async fn node(&self, mode: &str, edit: impl FnOnce(&mut Config)) -> Node {
        let mut c = Config {
            tcp: Some("127.0.0.1:0".parse().unwrap()),
            nats: Some("127.0.0.1:0".parse().unwrap()),
            ..Config::default()
        };
        c.set("tls_cert", self.path("node.pem").to_str().unwrap())
            .unwrap();
        c.set("tls_key", self.path("node.key").to_str().unwrap())
            .unwrap();
        c.set("nats_tls", mode).unwrap();
        edit(&mut c);
        Node::start(&c).await.unwrap()
    }

    fn connector(&self) -> tokio_rustls::TlsConnector {
        let c = skiff::tls::client_config(Some(&self.path("ca.pem")), None, None).unwrap();
        tokio_rustls::TlsConnector::from(c)
    }

    async fn upgrade(&self, s: TcpStream) -> tokio_rustls::client::TlsStream<TcpStream> {
        let name = skiff::tls::server_name("127.0.0.1").unwrap();
        self.connector().connect(name, s).await.unwrap()
    }
}

/// Reads until `what` has been seen; what came before it, with it.
async fn expect<S: AsyncRead + Unpin>(s: &mut S, seen: &mut Vec<u8>, what: &str) -> String {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(i) = seen.windows(what.len()).position(|w| w == what.as_bytes()) {
            let upto = i + what.len();
            let before = String::from_utf8_lossy(&seen[..upto]).into_owned();
            seen.drain(..upto);
            return before;
        }
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout_at(deadline, s.read(&mut buf))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "waited for {what:?}; got {:?}",
                    String::from_utf8_lossy(seen)
                )
            })
            .unwrap();
        assert!(
            n > 0,
            "closed before {what:?}; got {:?}",
            String::from_utf8_lossy(seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
}

/// Reads the plaintext `INFO` line byte by byte (so nothing after it is
/// taken from the socket before the handshake), as JSON.
async fn read_info(s: &mut TcpStream) -> serde_json::Value {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        let n = tokio::time::timeout(PATIENCE, s.read(&mut b))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n, 1, "closed in INFO: {:?}", String::from_utf8_lossy(&line));
        line.push(b[0]);
    }
    let text = String::from_utf8(line).unwrap();
    serde_json::from_str(text.trim_start_matches("INFO ").trim()).unwrap()
}

/// Publishes, subscribes and answers a request over `s`.
async fn exercise<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) {
    let mut seen = Vec::new();
    s.write_all(
        b"CONNECT {\"verbose\":false,\"headers\":true,\"protocol\":1}\r\nSUB t.* 1\r\nSUB svc 2\r\nPING\r\n",
    )
    .await
    .unwrap();
    expect(s, &mut seen, "PONG\r\n").await;
    s.write_all(b"PUB t.x 8\r\nover tls\r\n").await.unwrap();
    expect(s, &mut seen, "MSG t.x 1 8\r\nover tls\r\n").await;
    // A request to ourselves: the node hands it with a reply subject,
    // and the answer comes back on the inbox.
    s.write_all(b"SUB _INBOX.me 3\r\nPUB svc _INBOX.me 1\r\nq\r\n")
        .await
        .unwrap();
    let line = expect(s, &mut seen, "\r\nq\r\n").await;
    let reply = line
        .split_whitespace()
        .find(|w| w.starts_with("_SKIFF_REPLY."))
        .unwrap_or_else(|| panic!("no reply subject: {line}"))
        .to_owned();
    s.write_all(format!("PUB {reply} 1\r\na\r\n").as_bytes())
        .await
        .unwrap();
    expect(s, &mut seen, "MSG _INBOX.me 3 1\r\na\r\n").await;
}

fn tls_failures(n: &Node) -> u64 {
    n.broker().stats().tls_failures
}

#[tokio::test]
async fn info_in_plaintext_then_tls_on_the_same_connection() {
    let pki = Pki::new();
    let n = pki.node("required", |_| {}).await;
    let mut s = TcpStream::connect(n.nats_addr().unwrap()).await.unwrap();
    let info = read_info(&mut s).await;
    assert_eq!(info["tls_required"], true, "{info}");
    assert!(info.get("tls_available").is_none(), "{info}");
    let mut t = pki.upgrade(s).await;
    exercise(&mut t).await;
    assert_eq!(tls_failures(&n), 0);
    n.shutdown().await;
}

#[tokio::test]
async fn a_plaintext_client_is_refused_as_nats_server_refuses_it() {
    let pki = Pki::new();
    let n = pki.node("required", |_| {}).await;
    let mut s = TcpStream::connect(n.nats_addr().unwrap()).await.unwrap();
    read_info(&mut s).await;
    s.write_all(b"CONNECT {}\r\nPING\r\n").await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut rest))
        .await
        .expect("the node closes")
        .ok();
    let text = String::from_utf8_lossy(&rest);
    assert_eq!(text, "-ERR 'Secure Connection - TLS Required'\r\n");
    assert_eq!(tls_failures(&n), 1);
    // The node still serves TLS clients.
    let mut s = TcpStream::connect(n.nats_addr().unwrap()).await.unwrap();
    read_info(&mut s).await;
    exercise(&mut pki.upgrade(s).await).await;
    n.shutdown().await;
}

#[tokio::test]
async fn garbage_or_silence_instead_of_a_handshake_is_closed_and_counted() {
    let pki = Pki::new();
    let n = pki
        .node("required", |c| c.set("auth_timeout_ms", "300").unwrap())
        .await;
    // A TLS record header followed by nonsense.
    let mut s = TcpStream::connect(n.nats_addr().unwrap()).await.unwrap();
    read_info(&mut s).await;
    s.write_all(&[0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5, 6, 7, 8])
        .await
        .unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut rest))
        .await
        .expect("the node closes")
        .ok();
    assert!(!rest.windows(4).any(|w| w == b"PONG"), "{rest:?}");
    // Silence: the handshake has a deadline (auth_timeout_ms).
    let mut s = TcpStream::connect(n.nats_addr().unwrap()).await.unwrap();
    read_info(&mut s).await;
    let mut rest = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut rest))
        .await
        .expect("the node closes a client that does not start TLS")
        .ok();
    // A handshake begun and stalled.
    let mut s = TcpStream::connect(n.nats_addr().unwrap()).await.unwrap();
    read_info(&mut s).await;
    s.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut rest))
        .await
        .expect("the node closes a stalled handshake")
        .ok();
    assert_eq!(tls_failures(&n), 3);
    assert_eq!(n.broker().stats().clients.len(), 0, "none left attached");
    n.shutdown().await;
}

#[tokio::test]
async fn handshake_first_sends_info_over_tls() {
    let pki = Pki::new();
    let n = pki.node("handshake_first", |_| {}).await;
    let s = TcpStream::connect(n.nats_addr().unwrap()).await.unwrap();
    let mut t = pki.upgrade(s).await;
    let mut seen = Vec::new();
    let line = expect(&mut t, &mut seen, "\r\n").await;
    let info: serde_json::Value =
        serde_json::from_str(line.trim_start_matches("INFO ").trim()).unwrap();
    assert_eq!(info["tls_required"], true, "{info}");
    exercise(&mut t).await;
    // A plaintext client gets nothing but a failed handshake.
    let mut s = TcpStream::connect(n.nats_addr().unwrap()).await.unwrap();
    s.write_all(b"CONNECT {}\r\n").await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut rest))
        .await
        .expect("the node closes")
        .ok();
    assert!(!String::from_utf8_lossy(&rest).contains("INFO"));
    assert_eq!(tls_failures(&n), 1);
    n.shutdown().await;
}

#[tokio::test]
async fn optional_tls_lets_the_client_choose() {
    let pki = Pki::new();
    let n = pki.node("optional", |_| {}).await;
    let mut s = TcpStream::connect(n.nats_addr().unwrap()).await.unwrap();
    let info = read_info(&mut s).await;
    assert_eq!(info["tls_available"], true, "{info}");
    assert!(info.get("tls_required").is_none(), "{info}");
    exercise(&mut s).await;
    let mut s = TcpStream::connect(n.nats_addr().unwrap()).await.unwrap();
    read_info(&mut s).await;
    exercise(&mut pki.upgrade(s).await).await;
    assert_eq!(tls_failures(&n), 0);
    n.shutdown().await;
}

#[tokio::test]
async fn nats_tls_needs_the_nodes_certificate() {
    let mut c = Config {
        tcp: None,
        nats: Some("127.0.0.1:0".parse().unwrap()),
        ..Config::default()
    };
    c.set("nats_tls", "required").unwrap();
    let e = Node::start(&c).await.err().unwrap().to_string();
    assert!(e.contains("tls_cert"), "{e}");
    assert!(c.set("nats_tls", "sometimes").is_err());
}
