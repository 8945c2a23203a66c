//! A publisher bound to one subject and type ([`Client::publisher`]): the
//! subject and type are checked once, when it is made, and each publish
//! hands the node only the payload. Over `shm://` and over a stream a
//! small payload is encoded straight into the link's run of frames or its
//! write buffer from a head encoded once ([`PubHead`]), with no
//! [`Message`] built; otherwise (a wait, a large payload over shm, an
//! in-process or `file://` client) it takes [`Client::publish`]'s path.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use skiff_proto::client_frame::PubHead;
use skiff_proto::router::{check_kind, Subject};
use skiff_proto::Message;

use super::{Backend, Client, Code};
use crate::Error;

/// Publishes payloads on one subject with one type (see the module doc).
/// Same semantics as [`Client::publish`]: the node's payload limit, the
/// link's back-pressure, publishes held while failing over.
#[derive(Debug, Clone)]
pub struct Publisher {
    client: Client,
    subject: bytestring::ByteString,
    kind: Option<bytestring::ByteString>,
    head: Arc<PubHead>,
}

impl Client {
    /// A publisher of payloads on `subject` with type `kind`, checked here
    /// with the rules of [`Client::publish`] (an error for a subject or
    /// type `publish` would refuse).
    pub fn publisher(&self, subject: &str, kind: Option<&str>) -> Result<Publisher, Error> {
        Subject::new(subject)?;
        let mut m = Message::new(subject, Bytes::new());
        if let Some(k) = kind {
            check_kind(k)?;
            m = m.with_kind(k);
        }
        skiff_proto::wire::check(&m)?;
        Ok(Publisher {
            client: self.clone(),
            head: Arc::new(PubHead::new(subject, kind)),
            subject: m.subject,
            kind: m.kind,
        })
    }
}

impl Publisher {
    /// The subject it publishes on.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// Publishes `payload` (copied into the link's buffer or ring).
    /// Returns once it is handed to the node, as [`Client::publish`] does.
    pub async fn publish(&self, payload: &[u8]) -> Result<(), Error> {
        loop {
            if let Some(r) = self.try_now(payload) {
                return r;
            }
            if !self.wait_room().await {
                break;
            }
        }
        self.slow(Bytes::copy_from_slice(payload)).await
    }

    /// As [`Publisher::publish`], taking the payload as [`Bytes`] (a large
    /// payload over shm is then written once, into the ring).
    pub async fn publish_bytes(&self, payload: Bytes) -> Result<(), Error> {
        loop {
            if let Some(r) = self.try_now(&payload) {
                return r;
            }
            if !self.wait_room().await {
                break;
            }
        }
        self.slow(payload).await
    }

    /// The publish written from the head now, if the link takes it with
    /// no wait.
    fn try_now(&self, payload: &[u8]) -> Option<Result<(), Error>> {
        let inner = &self.client.inner;
        if matches!(inner.backend, Backend::File(_)) || inner.failed.load(Ordering::Acquire) {
            return None;
        }
        let max = inner.max_payload.load(Ordering::Relaxed);
        if payload.len() > max {
            return Some(Err(Error::Refused {
                code: Code::Limit,
                reason: format!(
                    "payload of {} bytes is over the node's limit of {max} (max_payload)",
                    payload.len(),
                ),
            }));
        }
        inner.link.as_ref()?.try_publish_head(&self.head, payload)
    }

    /// Waits for room in the link's ring if the publish found none (see
    /// [`super::link::Link::wait_room`]).
    async fn wait_room(&self) -> bool {
        match &self.client.inner.link {
            Some(l) => l.wait_room().await,
            None => false,
        }
    }

    /// [`Client::publish`]'s path, with a message built.
    async fn slow(&self, payload: Bytes) -> Result<(), Error> {
        let msg = Message {
            subject: self.subject.clone(),
            kind: self.kind.clone(),
            payload,
            ..Message::default()
        };
        self.client.publish_checked(msg).await
    }
}
