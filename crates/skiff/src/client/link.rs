//! How a client's frames reach its node: the one seam over the
//! transports ([`Link`]): in process ([`LocalLink`], frames as values, no
//! copy), over a byte stream ([`StreamTx`], see [`super::stream`]) or over
//! shared memory (`shm_link`). Also the task that takes an in-process
//! client's frames from its outbox in the node.

use std::sync::{Arc, Weak};

use skiff_proto::client_frame::{encode_pub, ClientFrame, PubHead, ServerFrame};
use skiff_proto::Message;

use super::embed::LocalLink;
use super::stream::{holds, refused, StreamTx};
use super::Inner;
use crate::Error;

/// The transport a client's frames go over.
#[derive(Debug)]
pub(crate) enum Link {
    Mem(Box<dyn LocalLink>),
    Stream(Arc<StreamTx>),
    /// Shared memory with a node on this host (`shm://`).
    #[cfg(not(skiff_loom))]
    Shm(Arc<super::shm_link::ShmTx>),
}

impl Link {
    /// Sends a frame, waiting while the node (in process) or the socket
    /// buffer pushes back.
    pub(crate) async fn send(&self, f: ClientFrame) -> Result<(), Error> {
        match self {
            Link::Mem(m) => m.send(f).await.map_err(|e| refused(e.code, e.text)),
            Link::Stream(s) => {
                let publish = matches!(f, ClientFrame::Pub(_));
                s.send_with(holds(&f), publish, |buf| f.encode(buf)).await
            }
            #[cfg(not(skiff_loom))]
            Link::Shm(s) => s.send(f).await,
        }
    }

    /// Publishes `msg` if that needs no wait: over a stream with room in
    /// the write buffer, encodes it straight into the buffer (no frame
    /// built, nothing moved). `None`: send a `Pub` frame instead.
    pub(crate) fn try_publish(&self, msg: &Message) -> Option<Result<(), Error>> {
        match self {
            Link::Stream(s) => {
                match s.try_send_with(true, true, &mut |buf: &mut Vec<u8>| encode_pub(buf, msg)) {
                    Ok(true) => Some(Ok(())),
                    Ok(false) => None,
                    Err(e) => Some(Err(e)),
                }
            }
            #[cfg(not(skiff_loom))]
            Link::Shm(s) => s.try_publish(msg),
            Link::Mem(_) => None,
        }
    }

    /// After a `try_` publish returned `None`: waits for room in an shm
    /// ring and returns `true` (try again), or `false` at once (send the
    /// frame instead).
    pub(crate) async fn wait_room(&self) -> bool {
        match self {
            #[cfg(not(skiff_loom))]
            Link::Shm(s) => s.wait_room().await,
            _ => false,
        }
    }

    /// As [`Link::try_publish`] for a bound publisher: the frame of
    /// `payload` written from its [`PubHead`], no [`Message`] built.
    pub(crate) fn try_publish_head(
        &self,
        head: &PubHead,
        payload: &[u8],
    ) -> Option<Result<(), Error>> {
        match self {
            Link::Stream(s) => {
                match s.try_send_with(true, true, &mut |buf: &mut Vec<u8>| {
                    head.encode(buf, payload)
                }) {
                    Ok(true) => Some(Ok(())),
                    Ok(false) => None,
                    Err(e) => Some(Err(e)),
                }
            }
            #[cfg(not(skiff_loom))]
            Link::Shm(s) => s.try_publish_head(head, payload),
            Link::Mem(_) => None,
        }
    }

    /// Sends a frame that never waits (credits, acks of tunnels, leave).
    pub(crate) fn send_now(&self, f: ClientFrame) -> Result<(), Error> {
        match self {
            Link::Mem(m) => m.send_control(f).map_err(|e| refused(e.code, e.text)),
            Link::Stream(s) => s.send_now(&f),
            #[cfg(not(skiff_loom))]
            Link::Shm(s) => s.send_now(f),
        }
    }

    /// Closes the link: the node detaches this client.
    pub(crate) fn close(&self) {
        match self {
            Link::Mem(m) => m.close(),
            Link::Stream(s) => s.close(),
            #[cfg(not(skiff_loom))]
            Link::Shm(s) => s.close(),
        }
    }
}

fn dispatch_weak(weak: &Weak<Inner>, frames: &mut Vec<ServerFrame>) -> Option<bool> {
    let inner = weak.upgrade()?;
    match inner.dispatch(frames.drain(..)) {
        None => Some(true),
        Some((_, why)) => {
            inner.fail(why);
            Some(false)
        }
    }
}

/// Starts the task that moves an in-process client's frames from its
/// outbox in the node to its subscriptions.
pub(crate) fn spawn_mem(inner: &Arc<Inner>) {
    let weak = Arc::downgrade(inner);
    let Some(Link::Mem(m)) = &inner.link else {
        return;
    };
    // The task holds the outbox, not the client: dropping the client
    // detaches it, which closes the outbox and ends the task.
    let out = m.outbox();
    tokio::spawn(async move {
        let mut frames = Vec::new();
        loop {
            let more = out.next_batch(&mut frames).await;
            if !frames.is_empty() && dispatch_weak(&weak, &mut frames) != Some(true) {
                return;
            }
            if !more {
                if let Some(inner) = weak.upgrade() {
                    inner.fail("the node closed the connection".into());
                }
                return;
            }
        }
    });
}
