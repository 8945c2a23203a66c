//! The in-process front end (`mem://`): a client in the node's process
//! hands frames to the broker as values (no encoding, no copy) and takes
//! its outbox's frames the same way. Its frames need no decoding, so they
//! enter the one processing path at `listen::handle`, as a decoded frame
//! from any other front end does. This is the node's side of the seam
//! `skiff::client::embed` defines.

use std::sync::Arc;

use crate::broker::{Broker, Fatal};
use crate::outbox::ClientOut;
use skiff::client::embed::{LocalFuture, LocalLink, LocalOutbox, Refusal};
use skiff_proto::client_frame::{ClientFrame, Code, ServerFrame};

/// An in-process client's attachment to a node (`mem://`): frames go in
/// and come out as values, with no encoding and no copy.
#[derive(Debug)]
pub struct MemLink {
    broker: Arc<Broker>,
    out: Arc<ClientOut>,
}

impl MemLink {
    /// Attaches a new client to `broker`.
    pub fn attach(broker: Arc<Broker>) -> Result<MemLink, Fatal> {
        let out = broker.attach("mem".into())?;
        Ok(MemLink { broker, out })
    }

    /// Hands one frame to the node. An error means the node closed this
    /// client.
    pub async fn send(&self, frame: ClientFrame) -> Result<(), Fatal> {
        if self.out.is_closed() {
            return Err(Fatal {
                code: Code::Shutdown,
                text: "closed".into(),
            });
        }
        // As for a stream client: one that has not taken what it asked for
        // waits before asking for more (publishes and the frames that
        // queue nothing for it go on).
        if !matches!(
            frame,
            ClientFrame::Pub(_)
                | ClientFrame::Reply { .. }
                | ClientFrame::Credit { .. }
                | ClientFrame::TunData { .. }
                | ClientFrame::TunCredit { .. }
        ) {
            self.out.wait_room().await;
        }
        match super::handle(&self.broker, &self.out, frame).await {
            Ok(()) => Ok(()),
            Err((code, text)) => {
                self.broker.detach(self.out.id, Some((code, text.clone())));
                Err(Fatal { code, text })
            }
        }
    }

    /// Hands a frame that never waits (anything but publish and request)
    /// to the node at once.
    pub fn send_control(&self, frame: ClientFrame) -> Result<(), Fatal> {
        match self.broker.handle_control(&self.out, frame) {
            Ok(()) => Ok(()),
            Err(f) => {
                self.broker
                    .detach(self.out.id, Some((f.code, f.text.clone())));
                Err(f)
            }
        }
    }

    /// Moves every frame the node has for this client into `out`, waiting
    /// until there is one; `false` once the client is closed.
    pub async fn recv(&self, out: &mut Vec<ServerFrame>) -> bool {
        self.out.next_batch(out).await
    }

    /// The client's outbox in the node, from which [`MemLink::recv`] takes
    /// frames (for a task that must not keep the link alive).
    pub fn outbox(&self) -> Arc<ClientOut> {
        self.out.clone()
    }

    /// The node's id for this client.
    pub fn id(&self) -> u64 {
        self.out.id
    }

    /// Detaches the client (also done on drop).
    pub fn close(&self) {
        self.broker.detach(self.out.id, None);
    }
}

impl Drop for MemLink {
    fn drop(&mut self) {
        self.close();
    }
}

pub(crate) fn refusal(f: Fatal) -> Refusal {
    Refusal {
        code: f.code,
        text: f.text,
    }
}

impl LocalLink for MemLink {
    fn send(&self, frame: ClientFrame) -> LocalFuture<'_, Result<(), Refusal>> {
        Box::pin(async move { MemLink::send(self, frame).await.map_err(refusal) })
    }

    fn send_control(&self, frame: ClientFrame) -> Result<(), Refusal> {
        MemLink::send_control(self, frame).map_err(refusal)
    }

    fn outbox(&self) -> Arc<dyn LocalOutbox> {
        self.out.clone()
    }

    fn id(&self) -> u64 {
        self.out.id
    }

    fn max_payload(&self) -> usize {
        self.broker.limits().max_payload
    }

    fn close(&self) {
        MemLink::close(self)
    }
}

impl LocalOutbox for ClientOut {
    fn take(&self, out: &mut Vec<ServerFrame>) {
        ClientOut::take(self, out);
    }

    fn next_batch<'a>(&'a self, out: &'a mut Vec<ServerFrame>) -> LocalFuture<'a, bool> {
        Box::pin(ClientOut::next_batch(self, out))
    }
}
