//! TLS against a real node: `tls://` clients, a client trusting another CA,
//! mutual TLS refusing a client without a certificate, a plaintext client
//! refused, and `openssl s_client -tls1_3` (a client nobody here wrote)
//! completing a TLS 1.3 handshake. Certificates are made at run time.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{temp_dir, TempDir};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use skiff::client::Client;
use skiff::{Error, Message};
use skiff_node::{Config, Node};

/// Files of one test's PKI: a CA, the node's certificate, a client's, and
/// an unrelated CA.
struct Pki {
    dir: TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = temp_dir("tls");
        let ca = |name: &str| {
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.distinguished_name
                .push(rcgen::DnType::CommonName, format!("skiff test {name}"));
            CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap()
        };
        let main = ca("ca");
        let other = ca("other ca");
        let write = |name: &str, text: String| std::fs::write(dir.0.join(name), text).unwrap();
        write("ca.pem", main.pem());
        write("other-ca.pem", other.pem());
        let leaf = |sans: Vec<String>, file: &str| {
            let key = KeyPair::generate().unwrap();
            let p = CertificateParams::new(sans).unwrap();
            let cert = p.signed_by(&key, &main).unwrap();
            write(&format!("{file}.pem"), cert.pem());
            write(&format!("{file}.key"), key.serialize_pem());
        };
        leaf(vec!["127.0.0.1".into(), "localhost".into()], "node");
        leaf(vec!["client.test".into()], "client");
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.0.join(name)
    }

    async fn node(&self, mutual: bool) -> Node {
        let mut c = Config {
            tcp: Some("127.0.0.1:0".parse().unwrap()),
            ..Config::default()
        };
        c.set("tls_cert", self.path("node.pem").to_str().unwrap())
            .unwrap();
        c.set("tls_key", self.path("node.key").to_str().unwrap())
            .unwrap();
        if mutual {
            c.set("tls_ca", self.path("ca.pem").to_str().unwrap())
                .unwrap();
        }
        let n = Node::start(&c).await.unwrap();
        assert!(n.tls());
        n
    }

    fn locator(&self, node: &Node, extra: &str) -> String {
        format!(
            "tls://{}?ca={}{extra}",
            node.tcp_addr().unwrap(),
            self.path("ca.pem").display()
        )
    }
}

async fn round_trip(c: &Client) {
    let mut sub = c.subscribe("t.x", "*").await.unwrap();
    c.publish(Message::new("t.x", "over tls")).await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(5), sub.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&d.payload[..], b"over tls");
}

#[tokio::test]
async fn a_tls_client_publishes_and_subscribes() {
    let pki = Pki::new();
    let node = pki.node(false).await;
    let c = Client::connect(&pki.locator(&node, "")).await.unwrap();
    round_trip(&c).await;
    let s = c.stats().await.unwrap();
    assert!(
        s.clients[0].peer.starts_with("tls:"),
        "{}",
        s.clients[0].peer
    );
}

#[tokio::test]
async fn a_client_trusting_another_ca_fails() {
    let pki = Pki::new();
    let node = pki.node(false).await;
    let l = format!(
        "tls://{}?ca={}",
        node.tcp_addr().unwrap(),
        pki.path("other-ca.pem").display()
    );
    match Client::connect(&l).await {
        Err(Error::Io { what, source }) => {
            assert!(what.contains("TLS"), "{what}");
            let t = source.to_string();
            assert!(t.contains("certificate"), "{t}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("trusted a certificate from a CA it does not know"),
    }
    // A plaintext client gets nowhere either.
    let plain = format!("skiff://{}?connect_timeout=2s", node.tcp_addr().unwrap());
    assert!(Client::connect(&plain).await.is_err());
    // Both are counted; the node still serves.
    let c = Client::connect(&pki.locator(&node, "")).await.unwrap();
    assert!(c.stats().await.unwrap().tls_failures >= 2);
}

#[tokio::test]
async fn mutual_tls_refuses_a_client_without_a_certificate() {
    let pki = Pki::new();
    let node = pki.node(true).await;
    let without = Client::connect(&pki.locator(&node, "")).await;
    assert!(without.is_err(), "connected without a client certificate");
    let with = Client::connect(&pki.locator(
        &node,
        &format!(
            "&cert={}&key={}",
            pki.path("client.pem").display(),
            pki.path("client.key").display()
        ),
    ))
    .await
    .unwrap();
    round_trip(&with).await;
    assert!(with.stats().await.unwrap().tls_failures >= 1);
}

#[tokio::test]
async fn openssl_s_client_completes_a_tls13_handshake() {
    let Ok(out) = std::process::Command::new("openssl")
        .arg("version")
        .output()
    else {
        eprintln!("SKIPPED: no openssl binary on this machine");
        return;
    };
    assert!(out.status.success());
    let pki = Pki::new();
    let node = pki.node(false).await;
    let addr = node.tcp_addr().unwrap().to_string();
    let ca = pki.path("ca.pem");
    let run = move |ca: PathBuf| {
        let addr = addr.clone();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new("openssl")
                .args(["s_client", "-tls1_3", "-brief", "-verify_return_error"])
                .args(["-connect", &addr, "-CAfile"])
                .arg(ca)
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap()
        })
    };
    let out = run(ca).await.unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("TLSv1.3"), "{text}");
    assert!(text.contains("Verification: OK"), "{text}");
    // Trusting another CA, openssl refuses the node's certificate.
    let out = run(pki.path("other-ca.pem")).await.unwrap();
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("verify"), "{text}");
}

#[tokio::test]
async fn tls_errors_name_the_file() {
    let pki = Pki::new();
    let mut c = Config {
        tcp: Some("127.0.0.1:0".parse().unwrap()),
        ..Config::default()
    };
    c.set("tls_cert", "/nonexistent/node.pem").unwrap();
    c.set("tls_key", pki.path("node.key").to_str().unwrap())
        .unwrap();
    let e = Node::start(&c).await.unwrap_err().to_string();
    assert!(e.contains("/nonexistent/node.pem"), "{e}");
    let e = Client::connect("tls://127.0.0.1:1?ca=/nonexistent/ca.pem")
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("/nonexistent/ca.pem"), "{e}");
}
