//! TLS on the NATS port (setting `nats_tls`), as nats-server does it:
//! `INFO` in plaintext, then the client's first byte decides (a TLS
//! record starts the handshake on the same connection); or TLS first and
//! `INFO` after it (`handshake_first`). Handshakes are bounded in time,
//! and every one that fails is counted and logged.

use super::*;

/// TLS on the NATS port: how ([`NatsTls`]) and with what.
#[derive(Clone)]
pub(crate) struct NatsTlsSetup {
    pub(crate) mode: NatsTls,
    /// The node's acceptor (its certificate and key; client
    /// certificates when it has `tls_ca`).
    pub(crate) acceptor: tokio_rustls::TlsAcceptor,
    /// Whether clients must present a certificate (`INFO`'s
    /// `tls_verify`).
    pub(crate) verify: bool,
}

impl std::fmt::Debug for NatsTlsSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsTlsSetup")
            .field("mode", &self.mode)
            .field("verify", &self.verify)
            .finish_non_exhaustive()
    }
}

/// The first byte of a TLS handshake record (a ClientHello), which no
/// NATS protocol line begins with.
const TLS_HANDSHAKE: u8 = 0x16;

/// The error nats-server sends a plaintext client on a port that
/// requires TLS.
pub const TLS_REQUIRED: &str = "Secure Connection - TLS Required";

/// Serves one accepted connection: plaintext, or TLS as the listener's
/// mode says. TLS after `INFO` (nats-server's way): `INFO` goes out in
/// plaintext, then the client's first byte decides (a TLS record starts
/// the handshake; anything else is refused with [`TLS_REQUIRED`] where
/// TLS is required). Every handshake must be done within the
/// authentication time limit (`auth_timeout_ms`); a failed, refused or
/// stalled one is counted (`tls_failures`) and logged with its reason.
pub(super) async fn connect(
    this: Arc<NatsListener>,
    mut s: TcpStream,
    peer: SocketAddr,
    stop: watch::Receiver<bool>,
) {
    let Some(tls) = this.tls.clone() else {
        let (r, w) = s.into_split();
        return serve(this, r, w, peer, stop, None).await;
    };
    let limit = this.broker.auth().timeout();
    if tls.mode == NatsTls::HandshakeFirst {
        let Some(t) = handshake(&this, &tls, s, peer, limit).await else {
            return;
        };
        let (r, w) = tokio::io::split(t);
        return serve(this, r, w, peer, stop, None).await;
    }
    let hello = match Hello::new(&this, peer) {
        Ok(h) => h,
        Err(line) => {
            let _ = s.write_all(&line).await;
            let _ = s.shutdown().await;
            return;
        }
    };
    let out_id = hello.out.id;
    let first = tokio::time::timeout(limit, async {
        s.write_all(&hello.info).await?;
        let mut b = [0u8; 1];
        match s.peek(&mut b).await? {
            0 => Ok(None),
            _ => Ok::<_, std::io::Error>(Some(b[0])),
        }
    })
    .await;
    let refuse = |why: &str| {
        this.broker.tls_failure();
        crate::warn_every!("nats tls refused", peer = %peer, reason = %why, "NATS client refused before TLS");
    };
    match first {
        Ok(Ok(Some(TLS_HANDSHAKE))) => match handshake(&this, &tls, s, peer, limit).await {
            Some(t) => {
                let (r, w) = tokio::io::split(t);
                serve(this, r, w, peer, stop, Some(hello)).await
            }
            None => this.broker.detach(out_id, None),
        },
        Ok(Ok(Some(_))) if tls.mode == NatsTls::Optional => {
            let (r, w) = s.into_split();
            serve(this, r, w, peer, stop, Some(hello)).await
        }
        Ok(Ok(Some(_))) => {
            refuse("plaintext on a port that requires TLS");
            let mut b = Vec::new();
            nats::encode_err(&mut b, TLS_REQUIRED);
            let _ = tokio::time::timeout(limit, s.write_all(&b)).await;
            let _ = s.shutdown().await;
            this.broker.detach(out_id, None);
        }
        // Closed before a byte: nothing to count (nats.go does so when it
        // sees `tls_required` and was not given TLS).
        Ok(Ok(None)) | Ok(Err(_)) => this.broker.detach(out_id, None),
        Err(_) => {
            refuse("no TLS handshake in time (auth_timeout_ms)");
            this.broker.detach(out_id, None);
        }
    }
}

/// Runs the server side of a TLS handshake within `limit`; `None`
/// (counted and logged) when it fails or stalls.
async fn handshake(
    this: &NatsListener,
    tls: &NatsTlsSetup,
    s: TcpStream,
    peer: SocketAddr,
    limit: Duration,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let why = match tokio::time::timeout(limit, tls.acceptor.accept(s)).await {
        Ok(Ok(t)) => return Some(t),
        Ok(Err(e)) => e.to_string(),
        Err(_) => "no TLS handshake in time (auth_timeout_ms)".to_owned(),
    };
    this.broker.tls_failure();
    crate::warn_every!("nats tls handshake", peer = %peer, reason = %why, "NATS TLS handshake failed");
    None
}
