//! The mesh's datagrams on arbitrary bytes: `packet::decode` never panics,
//! and a node fed them (from a stranger, then as if from itself) never
//! panics either and counts each one it drops.
#![no_main]

use std::net::SocketAddr;
use std::time::Instant;

use libfuzzer_sys::fuzz_target;
use skiff_proto::mesh::{packet, Mesh, MeshConfig, NodeId};

fuzz_target!(|data: &[u8]| {
    let _ = packet::decode(data);
    let me: SocketAddr = "10.0.0.1:4748".parse().unwrap();
    let now = Instant::now();
    let mut m = Mesh::new(NodeId { addr: me, gen: 1 }, MeshConfig::default(), now, 1);
    let mut d = data.to_vec();
    if d.len() >= 8 {
        // Most inputs then pass the envelope check and reach the bodies.
        d[..2].copy_from_slice(&packet::MAGIC);
        d[2] = packet::VERSION;
        d[4..8].copy_from_slice(&packet::net_hash("skiff").to_le_bytes());
    }
    let d = bytes::Bytes::from(d);
    m.handle_datagram(now, "10.0.0.2:4748".parse().unwrap(), d.clone());
    m.handle_datagram(now, me, d);
    m.handle_timeout(now);
    while m.poll_event().is_some() {}
    let mut buf = Vec::new();
    while m.poll_transmit(now, &mut buf).is_some() {}
});
