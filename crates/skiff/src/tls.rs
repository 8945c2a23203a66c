//! TLS for node connections, with rustls (TLS 1.3 only, the `ring`
//! provider; no OpenSSL): the node's server configuration (its
//! certificate chain and key, and optionally a CA that client certificates
//! must chain to: mutual TLS), and a client's (the CA it trusts, else the
//! system's roots, and optionally its own certificate and key).
//!
//! Certificates are checked by rustls' WebPKI verifiers only: skiff adds no
//! check of its own. Errors name the file and what is wrong with it, and
//! never hold key material.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub use rustls::{ClientConfig, ServerConfig};
pub use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The crypto provider every skiff TLS configuration uses: ring's, with
/// AES-128-GCM preferred over AES-256-GCM and ChaCha20-Poly1305 (all three
/// offered; on CPUs with AES instructions AES-128-GCM is the cheapest, and
/// it is what Go's TLS, and so nats-server, prefers there).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites
        .sort_by_key(|s| s.suite() != TLS13_AES_128_GCM_SHA256.suite());
    Arc::new(p)
}

/// Reads every certificate in a PEM file (at least one).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .collect();
    let certs = certs.map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

/// Reads the first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| format!("{}: no usable PEM private key ({e})", path.display()))
}

fn roots(ca: &Path) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in load_certs(ca)? {
        roots
            .add(c)
            .map_err(|e| format!("{}: not a usable CA certificate ({e})", ca.display()))?;
    }
    Ok(roots)
}

/// A node's TLS configuration: its certificate chain and key; with `ca`,
/// clients must present a certificate that chains to it (mutual TLS).
pub fn server_config(
    cert: &Path,
    key: &Path,
    ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, String> {
    let chain = load_certs(cert)?;
    let key_der = load_key(key)?;
    let b = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?;
    let b = match ca {
        Some(ca) => {
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(ca)?),
                provider(),
            )
            .build()
            .map_err(|e| format!("{}: {e}", ca.display()))?;
            b.with_client_cert_verifier(v)
        }
        None => b.with_no_client_auth(),
    };
    let c = b.with_single_cert(chain, key_der).map_err(|e| {
        format!(
            "{} and {}: the key does not fit the certificate ({e})",
            cert.display(),
            key.display()
        )
    })?;
    Ok(Arc::new(c))
}

/// A client's TLS configuration: it trusts `ca` (else the system's root
/// certificates) and presents `cert` and `key` when both are given.
pub fn client_config(
    ca: Option<&Path>,
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<Arc<ClientConfig>, String> {
    let roots = match ca {
        Some(ca) => roots(ca)?,
        None => {
            let mut r = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for c in found.certs {
                let _ = r.add(c);
            }
            if r.is_empty() {
                return Err("no CA given (ca=FILE) and no system root certificates found".into());
            }
            r
        }
    };
    let b = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let c = match (cert, key) {
        (Some(cert), Some(key)) => b
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .map_err(|e| {
                format!(
                    "{} and {}: the key does not fit the certificate ({e})",
                    cert.display(),
                    key.display()
                )
            })?,
        (None, None) => b.with_no_client_auth(),
        _ => return Err("give both cert= and key= for a client certificate, or neither".into()),
    };
    Ok(Arc::new(c))
}

/// The name a client checks the node's certificate against: the host part
/// of `host:port` (an IP address, or a DNS name).
pub fn server_name(host_port: &str) -> Result<rustls::pki_types::ServerName<'static>, String> {
    let host = match host_port.rsplit_once(':') {
        Some((h, p)) if p.parse::<u16>().is_ok() => h,
        _ => host_port,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|e| format!("{host:?} is not a host name a certificate can name ({e})"))
}

#[cfg(test)]
mod tests {
    use rustls::crypto::ring::cipher_suite as cs;

    #[test]
    fn aes_128_gcm_is_preferred_and_every_suite_is_still_offered() {
        let p = super::provider();
        let suites: Vec<_> = p.cipher_suites.iter().map(|s| s.suite()).collect();
        assert_eq!(suites[0], cs::TLS13_AES_128_GCM_SHA256.suite());
        for s in [
            cs::TLS13_AES_256_GCM_SHA384,
            cs::TLS13_CHACHA20_POLY1305_SHA256,
        ] {
            assert!(suites.contains(&s.suite()), "{suites:?}");
        }
    }
}
