//! The broker's side of the mesh seam: [`mesh::Inbound`] for [`Broker`],
//! what other nodes send, handed to the broker's own paths (pub/sub,
//! requests, clusters, tunnels).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use skiff_proto::client_frame::ServerFrame;
use skiff_proto::Message;

use super::{Broker, Published};
use crate::config::Limits;
use crate::mesh::{self, MeshLink};
use crate::outbox::ClientOut;

impl mesh::Inbound for Broker {
    fn limits(&self) -> Arc<Limits> {
        Broker::limits(self)
    }

    fn set_mesh(&self, link: Arc<MeshLink>) {
        Broker::set_mesh(self, link)
    }

    fn attach_mesh_client(&self, name: String) -> std::io::Result<Arc<ClientOut>> {
        self.attach(name).map_err(|f| std::io::Error::other(f.text))
    }

    async fn publish_remote(&self, client: &Arc<ClientOut>, frames: &mut Vec<Bytes>) -> usize {
        let max = self.limits().max_payload;
        let mut bad = 0;
        let mut batch: Vec<Published> = Vec::with_capacity(frames.len());
        for f in frames.drain(..) {
            match Published::from_frame(f, max) {
                Ok(p) => batch.push(p),
                Err(_) => bad += 1,
            }
        }
        if !batch.is_empty() {
            Broker::publish_remote(self, client, &mut batch).await;
        }
        bad
    }

    fn deliver_remote(&self, msg: &Message, raw: &Bytes) {
        Broker::deliver_remote(self, msg, raw)
    }

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
    ) {
        Broker::remote_request(self, from, origin, flags, max, target, key, groups, msg)
    }

    fn remote_reply(&self, token: u64, msg: Message) {
        Broker::remote_reply(self, token, msg)
    }

    fn remote_done(&self, token: u64, reached: u32) {
        Broker::remote_done(self, token, reached)
    }

    fn deliver_broadcast(&self, cluster: &str, msg: Message) {
        Broker::deliver_broadcast(self, cluster, msg)
    }

    fn deliver_group(&self, group: &str, msg: Message) {
        Broker::deliver_group(self, group, msg)
    }

    fn remote_cluster(&self, peer: SocketAddr, cluster: &str, capacity: u32) {
        Broker::remote_cluster(self, peer, cluster, capacity)
    }

    fn remote_down(&self, peer: SocketAddr) {
        Broker::remote_down(self, peer)
    }

    fn remote_gap(&self, peer: SocketAddr, silent: std::time::Duration, why: &str) {
        Broker::remote_gap(self, peer, silent, why)
    }

    fn tunnel_deliver(&self, client: u64, tunnel: u64, frames: Vec<ServerFrame>, ended: bool) {
        Broker::tunnel_deliver(self, client, tunnel, frames, ended)
    }

    fn tunnel_incoming(
        &self,
        from: SocketAddr,
        theirs: u64,
        cluster: String,
        key: Bytes,
        window: u32,
    ) {
        Broker::tunnel_incoming(self, from, theirs, cluster, key, window)
    }
}
