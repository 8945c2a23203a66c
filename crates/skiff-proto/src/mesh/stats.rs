//! The mesh's counters: node-wide ([`MeshStats`], where every dropped
//! datagram is counted) and per peer ([`PeerStats`], for
//! `skiff stats --mesh`).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::NodeId;

/// Node-wide mesh counters; every dropped datagram is in one of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeshStats {
    /// Members up now (not counting this node).
    pub members_up: usize,
    /// Datagrams of another network name.
    pub wrong_net: u64,
    /// Datagrams that did not decode.
    pub malformed: u64,
    /// Interest or data datagrams from a node that is not an up member.
    pub unknown_sender: u64,
    /// SWIM datagrams from new senders while at `max_members`.
    pub member_limit: u64,
    /// SWIM datagrams foca refused (bad membership data).
    pub bad_membership: u64,
    /// Interest datagrams over a peer's rate.
    pub rate_limited: u64,
    /// Patterns or clusters dropped over `max_interest`.
    pub interest_limit: u64,
    /// Deltas already applied (duplicates, replays).
    pub stale_interest: u64,
    /// Full snapshots asked for.
    pub syncs_requested: u64,
    /// Full snapshots sent.
    pub syncs_sent: u64,
    /// Frames too large for one datagram, refused by `send_frame`.
    pub frames_too_large: u64,
    /// Windows opened by the ack timeout rather than an ack.
    pub ack_timeouts: u64,
}

/// One peer, for `skiff stats --mesh`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStats {
    /// Mesh address.
    pub addr: SocketAddr,
    /// Identity generation.
    pub gen: u64,
    /// Up (true) or down.
    pub up: bool,
    /// Up but suspected down by SWIM (not answering probes): declared
    /// down unless it refutes the suspicion in time.
    #[serde(default)]
    pub suspect: bool,
    /// Patterns it advertises.
    pub patterns: usize,
    /// Clusters it has members in.
    pub clusters: usize,
    /// Interest version held.
    pub version: u64,
    /// Frames sent to it.
    pub sent_frames: u64,
    /// Datagrams sent to it.
    pub sent_datagrams: u64,
    /// Bytes sent to it.
    pub sent_bytes: u64,
    /// Frames received from it.
    pub recv_frames: u64,
    /// Datagrams received from it.
    pub recv_datagrams: u64,
    /// Bytes received from it.
    pub recv_bytes: u64,
    /// Data datagrams from it known lost (sequence gaps).
    pub lost: u64,
    /// Data datagrams from it received twice (dropped).
    pub duplicates: u64,
    /// Data datagrams numbered too far ahead of its stream, refused (a
    /// forgery, or a restart before its old stream fell silent).
    #[serde(default)]
    pub far_ahead: u64,
}

impl PeerStats {
    /// Zero counters for the peer `id`.
    pub(super) fn new(id: NodeId) -> PeerStats {
        PeerStats {
            addr: id.addr,
            gen: id.gen,
            up: false,
            suspect: false,
            patterns: 0,
            clusters: 0,
            version: 0,
            sent_frames: 0,
            sent_datagrams: 0,
            sent_bytes: 0,
            recv_frames: 0,
            recv_datagrams: 0,
            recv_bytes: 0,
            lost: 0,
            duplicates: 0,
            far_ahead: 0,
        }
    }
}
