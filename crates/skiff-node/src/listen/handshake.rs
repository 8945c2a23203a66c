//! The skiff client protocol's authentication handshake on a stream
//! connection (TCP, TLS, Unix socket), before the client is attached: the
//! node sends `Challenge` with a fresh nonce, reads exactly one `Auth`
//! frame within the time limit (`[auth] timeout_ms`), and checks it with
//! [`crate::auth::Auth::verify`]. A node without authentication skips it
//! (its first frame is `Welcome`, as before), and so does a Unix-socket
//! peer whose uid or gid maps to a user (`SO_PEERCRED`).
//!
//! Bounded: the handshake's decoder takes frames of at most
//! [`MAX_HANDSHAKE_FRAME`] bytes, and nothing but `Auth` is accepted.
//! Every failure (wrong or missing credentials, another frame, time out)
//! is counted as an authentication failure and answered with one error
//! with [`Code::Auth`], which never says which part was wrong.

use std::sync::Arc;

use bytes::BytesMut;
use skiff_proto::client_frame::{ClientFrame, Code, Decoder, Proof, ServerFrame};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::auth::{AuthError, Credentials, Secret, User};
use crate::broker::Broker;

/// Largest handshake frame, in bytes (two credentials of
/// [`skiff_proto::client_frame::MAX_PROOF_FIELD`] and their lengths).
pub(crate) const MAX_HANDSHAKE_FRAME: usize = 4096;

/// What a client proved, as the node's [`Credentials`].
pub(crate) fn credentials(p: Proof) -> Credentials {
    match p {
        Proof::None => Credentials::None,
        Proof::Token(t) => Credentials::Token(Secret::new(t)),
        Proof::Password { user, password } => Credentials::Password {
            user,
            password: Secret::new(password),
        },
        Proof::Signature {
            public_key,
            signature,
        } => Credentials::Signature {
            public_key,
            signature,
        },
    }
}

/// Checks `creds` off the runtime's worker threads (a password costs an
/// argon2 verification).
pub(crate) async fn verify(
    broker: &Broker,
    creds: Credentials,
    nonce: [u8; crate::auth::NONCE_LEN],
) -> Result<Arc<User>, (Code, String)> {
    let auth = broker.auth().clone();
    let r = match creds {
        Credentials::Password { .. } => {
            tokio::task::spawn_blocking(move || auth.verify(&creds, &nonce))
                .await
                .unwrap_or(Err(AuthError::Refused))
        }
        c => auth.verify(&c, &nonce),
    };
    r.map_err(|e| (Code::Auth, e.to_string()))
}

/// Runs the handshake on a new connection (see the module documentation):
/// the user the client proved to be; `Err`: close it with this error.
/// `local`: the peer's (uid, gid) on a Unix socket. What the client sent
/// after its `Auth` frame stays in `buf`.
pub(crate) async fn authenticate<R, W>(
    broker: &Broker,
    r: &mut R,
    w: &mut W,
    buf: &mut BytesMut,
    local: Option<(u32, u32)>,
) -> Result<Arc<User>, (Code, String)>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let auth = broker.auth();
    if !auth.enabled() {
        return Ok(User::anonymous());
    }
    if let Some(u) = local.and_then(|(uid, gid)| auth.local_user(uid, gid)) {
        return Ok(u);
    }
    let nonce = crate::auth::new_nonce();
    let mut hello = Vec::new();
    ServerFrame::Challenge {
        nonce: bytes::Bytes::copy_from_slice(&nonce),
    }
    .encode(&mut hello);
    let timeout = auth.timeout();
    let read = async {
        w.write_all(&hello)
            .await
            .map_err(|_| AuthError::Refused.to_string())?;
        let dec = Decoder::new(MAX_HANDSHAKE_FRAME);
        loop {
            match dec.next(buf) {
                Ok(Some(body)) => {
                    return match ClientFrame::decode(body, 0) {
                        Ok(ClientFrame::Auth(p)) => Ok(credentials(p)),
                        _ => Err(
                            "authentication required: the node asked for credentials first".into(),
                        ),
                    }
                }
                Ok(None) => {}
                Err(_) => {
                    return Err(
                        "authentication required: the node asked for credentials first".into(),
                    )
                }
            }
            match r.read_buf(buf).await {
                Ok(0) | Err(_) => return Err("the client closed during authentication".into()),
                Ok(_) => {}
            }
        }
    };
    let creds = match tokio::time::timeout(timeout, read).await {
        Ok(Ok(c)) => c,
        Ok(Err(text)) => {
            auth.count_failure();
            return Err((Code::Auth, text));
        }
        Err(_) => {
            auth.count_failure();
            return Err((
                Code::Auth,
                format!(
                    "authentication timed out: no credentials within {} ms ([auth] timeout_ms)",
                    timeout.as_millis()
                ),
            ));
        }
    };
    verify(broker, creds, nonce).await
}
