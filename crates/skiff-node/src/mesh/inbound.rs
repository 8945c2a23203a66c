//! The one seam through which the mesh reaches the rest of the node:
//! [`Inbound`], what arrives from other nodes. The broker implements it;
//! the mesh names no broker type. The other direction (the broker's
//! commands: interest, publishes, requests, replies, broadcasts) is
//! [`MeshLink`]'s methods, so calls go broker → mesh, and the mesh reports
//! back only through this trait.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use skiff_proto::client_frame::ServerFrame;
use skiff_proto::Message;

use super::MeshLink;
use crate::config::Limits;
use crate::outbox::ClientOut;

/// What the mesh hands to this node (implemented by the broker).
pub(crate) trait Inbound: Send + Sync + 'static {
    /// The node's limits (payload size, pending bytes) the mesh checks
    /// frames and sizes tunnels by.
    fn limits(&self) -> Arc<Limits>;

    /// Takes the mesh's command side once it is up: from now on local
    /// interest and traffic to other nodes go through `link`.
    fn set_mesh(&self, link: Arc<MeshLink>);

    /// Attaches the client that what other nodes publish is counted to
    /// (its counters show the mesh's traffic in `skiff stats`).
    fn attach_mesh_client(&self, name: String) -> std::io::Result<Arc<ClientOut>>;

    /// A run of publish frames from other nodes (each its op byte, then
    /// the message's encoding), in order, for local subscribers; `frames`
    /// is left empty. Returns how many did not decode (the mesh counts
    /// them). It may wait: a full `block` subscription holds the mesh,
    /// which holds the publishing nodes through flow control.
    fn publish_remote(
        &self,
        client: &Arc<ClientOut>,
        frames: &mut Vec<Bytes>,
    ) -> impl Future<Output = usize> + Send;

    /// One message published on another node (`raw`: its encoding).
    fn deliver_remote(&self, msg: &Message, raw: &Bytes);

    /// A request forwarded by the node at `from` (`origin`: its token
    /// there, for the reply and the done report). `groups`: for a request
    /// to a subject, the queue groups that node chose this node for (a
    /// group request frame), or `None` from a plain request frame (one
    /// member of every group here).
    #[allow(clippy::too_many_arguments)]
    fn remote_request(
        &self,
        from: SocketAddr,
        origin: u64,
        flags: u8,
        max: u32,
        target: String,
        key: Bytes,
        groups: Option<Vec<String>>,
        msg: Message,
    );

    /// A reply to a request this node forwarded (`token`: this node's).
    fn remote_reply(&self, token: u64, msg: Message);

    /// The node a request went to reached `reached` responders.
    fn remote_done(&self, token: u64, reached: u32);

    /// A broadcast to the members of `cluster` on this node.
    fn deliver_broadcast(&self, cluster: &str, msg: Message);

    /// A published message for one member of queue
    /// group `group` on this node: the publishing node chose this node for
    /// the group.
    fn deliver_group(&self, group: &str, msg: Message);

    /// A peer's advertised capacity in `cluster` changed (0: none).
    fn remote_cluster(&self, peer: SocketAddr, cluster: &str, capacity: u32);

    /// A peer went down: its cluster members are gone (the mesh ends its
    /// tunnels through [`Inbound::tunnel_deliver`]).
    fn remote_down(&self, peer: SocketAddr);

    /// Messages from `peer` may be missing: it went down, or its link to
    /// this node failed, `silent` after the last batch received from it.
    /// Local subscribers are told.
    fn remote_gap(&self, peer: SocketAddr, silent: std::time::Duration, why: &str);

    /// Frames for the local end (`client`) of a tunnel whose other end is
    /// on another node; `ended`: the tunnel is gone.
    fn tunnel_deliver(&self, client: u64, tunnel: u64, frames: Vec<ServerFrame>, ended: bool);

    /// The node at `from` opens a tunnel (its id `theirs`) to a member of
    /// `cluster` here: pick a local member and answer through
    /// `MeshLink::tunnel_accept`.
    fn tunnel_incoming(
        &self,
        from: SocketAddr,
        theirs: u64,
        cluster: String,
        key: Bytes,
        window: u32,
    );
}
