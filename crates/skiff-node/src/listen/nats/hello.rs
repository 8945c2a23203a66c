//! How a NATS connection opens: the `INFO` line the node sends first
//! (with the nonce to sign when the node has users), and the check of
//! `CONNECT`'s credentials against the node's users.

use std::net::SocketAddr;
use std::sync::Arc;

use skiff_proto::client_frame::Code;
use skiff_proto::nats::{self, ConnectOptions};

use super::{NatsListener, ANNOUNCED_VERSION};
use crate::auth::{Auth, Credentials, PublicKey, Secret, User};
use crate::config::NatsTls;
use crate::outbox::ClientOut;

/// What a connection begins with: its client in the broker, the nonce
/// to sign when the node has users, and the `INFO` line.
pub(super) struct Hello {
    pub(super) out: Arc<ClientOut>,
    pub(super) nonce: Option<String>,
    /// The node's users as they were when the client came (a reload may
    /// replace them; this connection authenticates against these).
    pub(super) users: Arc<Auth>,
    pub(super) info: Vec<u8>,
}

impl Hello {
    /// Attaches the client; `Err`: the `-ERR` line to close with.
    pub(super) fn new(this: &NatsListener, peer: SocketAddr) -> Result<Hello, Vec<u8>> {
        let broker = &this.broker;
        let out = broker
            .attach_as(format!("nats:{peer}"), User::anonymous())
            .map_err(|f| {
                let mut b = Vec::new();
                nats::encode_err(
                    &mut b,
                    if f.code == Code::Limit {
                        "maximum connections exceeded"
                    } else {
                        "Server Shutdown"
                    },
                );
                b
            })?;
        let users = broker.auth();
        let nonce = users.enabled().then(|| {
            use base64::Engine;
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(crate::auth::new_nonce())
        });
        let mode = this.tls.as_ref().map_or(NatsTls::Off, |t| t.mode);
        let mut info = Vec::new();
        let host = this.addr.ip().to_string();
        let client_ip = peer.ip().to_string();
        nats::encode_info(
            &mut info,
            &nats::Info {
                server_id: &this.server_id,
                server_name: &this.server_id,
                version: ANNOUNCED_VERSION,
                proto: nats::PROTO,
                go: concat!("skiff ", env!("CARGO_PKG_VERSION")),
                host: &host,
                port: this.addr.port(),
                headers: true,
                max_payload: broker.limits().max_payload as u64,
                client_id: out.id,
                client_ip: &client_ip,
                auth_required: nonce.is_some(),
                tls_required: matches!(mode, NatsTls::Required | NatsTls::HandshakeFirst),
                tls_available: mode == NatsTls::Optional,
                tls_verify: this.tls.as_ref().is_some_and(|t| t.verify),
                nonce: nonce.as_deref(),
            },
        );
        Ok(Hello {
            out,
            nonce,
            users,
            info,
        })
    }
}

/// Checks `CONNECT`'s credentials against the node's users (off the
/// runtime's threads: a password costs an argon2 verification). `Err`:
/// close with this `-ERR` text.
pub(super) async fn authenticate(
    auth: &Arc<Auth>,
    o: &ConnectOptions,
    nonce: String,
) -> Result<Arc<User>, &'static str> {
    let creds = credentials(o).ok_or_else(|| {
        auth.count_failure();
        "Authorization Violation"
    })?;
    let auth = auth.clone();
    tokio::task::spawn_blocking(move || auth.verify(&creds, nonce.as_bytes()))
        .await
        .ok()
        .and_then(Result::ok)
        .ok_or("Authorization Violation")
}

/// The credentials in `CONNECT`: a key and its signature, a user and
/// password, a token, or none; `None` when they do not decode (a JWT,
/// which this node does not take, or a bad key or signature).
fn credentials(o: &ConnectOptions) -> Option<Credentials> {
    use base64::Engine;
    if o.jwt.is_some() {
        return None;
    }
    if let Some(nkey) = &o.nkey {
        if nkey.len() != 56 || !nkey.starts_with('U') {
            return None;
        }
        let key = PublicKey::parse(nkey)?;
        let sig = o.sig.as_deref()?;
        if sig.len() > 128 {
            return None;
        }
        let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(sig.trim_end_matches('='))
            .or_else(|_| base64::engine::general_purpose::STANDARD.decode(sig))
            .ok()?;
        return Some(Credentials::Signature {
            public_key: key.0,
            signature: sig.try_into().ok()?,
        });
    }
    if let (Some(user), Some(pass)) = (&o.user, &o.pass) {
        return Some(Credentials::Password {
            user: user.clone(),
            password: Secret::new(pass.clone()),
        });
    }
    if let Some(t) = &o.auth_token {
        return Some(Credentials::Token(Secret::new(t.clone())));
    }
    Some(Credentials::None)
}
