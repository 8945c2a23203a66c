//! What a node reports about itself: the body of a `Stats` reply
//! (`skiff stats`), carried as JSON in the client↔node protocol
//! ([`crate::client_frame`]). Plain data, shared by the node that fills it
//! and the client that reads it.

use serde::{Deserialize, Serialize};

use crate::mesh::{MeshStats, PeerStats};

/// The node's counters (the node's `Broker::stats`, `skiff stats`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeStats {
    /// Seconds since the node started.
    pub uptime_s: f64,
    /// Clients attached now.
    pub connections: usize,
    /// Clients attached since the start.
    pub connections_total: u64,
    /// Subscriptions held.
    pub subscriptions: usize,
    /// Clusters with members.
    pub clusters: usize,
    /// Tunnels open.
    pub tunnels: usize,
    /// Messages published.
    pub published: u64,
    /// Requests received.
    pub requests: u64,
    /// Replies relayed.
    pub replies: u64,
    /// Requests and tunnels refused for want of a responder.
    pub no_responders: u64,
    /// Broadcasts received.
    pub broadcasts: u64,
    /// Times a limit was reached.
    pub limit_hits: u64,
    /// Clients closed for protocol errors.
    pub protocol_errors: u64,
    /// Clients closed as slow consumers.
    pub slow_consumers: u64,
    /// Messages from other nodes dropped because a subscription was full.
    #[serde(default)]
    pub remote_drops: u64,
    /// Messages handed to clients' connections since the start (clients
    /// gone included).
    #[serde(default)]
    pub delivered: u64,
    /// Messages subscriptions' policies dropped since the start (clients
    /// gone included).
    #[serde(default)]
    pub dropped: u64,
    /// Broadcasts and tunnel frames not queued for a client over its
    /// pending bytes, since the start (clients gone included).
    #[serde(default)]
    pub dropped_control: u64,
    /// Bytes the clients hold reserved from the node's budget of pending
    /// bytes (`max_total_pending_bytes`; 0 without one).
    #[serde(default)]
    pub pending_budget_used: usize,
    /// The mesh, when the node is part of one (`skiff stats --mesh`).
    #[serde(default)]
    pub mesh: Option<MeshView>,
    /// TLS handshakes that failed or ran out of time (e.g. a client
    /// without the certificate mutual TLS asks for).
    #[serde(default)]
    pub tls_failures: u64,
    /// Whether clients must authenticate.
    #[serde(default)]
    pub auth: bool,
    /// Failed authentications (wrong or missing credentials, handshakes
    /// that ran out of time).
    #[serde(default)]
    pub auth_failures: u64,
    /// Operations refused by users' permissions (per user in `users`).
    #[serde(default)]
    pub denied: u64,
    /// Per configured user: what its permissions refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<UserStats>,
    /// Warnings for the operator, such as a listener beyond loopback that
    /// asks for no authentication.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Each cluster with its members (first page only, like `mesh`).
    #[serde(default)]
    pub cluster_members: Vec<ClusterStats>,
    /// Per client, in order of id (on a page: those the page holds; a
    /// client cut by the page's end is on the next page too, with the rest
    /// of its subscriptions).
    pub clients: Vec<ClientStats>,
    /// Where the next page starts, when this is a page and more remain
    /// (ask with `StatsFrom`); absent on the last or only page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<StatsCursor>,
}

/// One user's refused operations.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserStats {
    /// The user's name.
    pub name: String,
    /// Publishes (and requests, broadcasts, tunnels) refused.
    pub denied_publish: u64,
    /// Subscriptions refused.
    pub denied_subscribe: u64,
    /// Replies refused.
    pub denied_reply: u64,
    /// Cluster joins refused.
    pub denied_join: u64,
}

/// A place in the node's stats, in order of client id then subscription
/// id: where a page starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StatsCursor {
    /// The first client on the page (the first with this id or above).
    pub client: u64,
    /// When set, the page starts inside that client, at its first
    /// subscription above this id.
    #[serde(default)]
    pub sid: Option<u64>,
}

/// One client's counters.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientStats {
    /// The node's id for it.
    pub id: u64,
    /// Where it connected from.
    pub peer: String,
    /// Who it authenticated as (`anonymous` without authentication).
    #[serde(default)]
    pub user: String,
    /// The name it gave itself (skiff `Hello`, NATS `CONNECT`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// When it connected, in ms since the Unix epoch (0 from a node that
    /// does not say).
    #[serde(default)]
    pub since_unix_ms: u64,
    /// Bytes read from its connection (TCP and Unix-socket clients).
    #[serde(default)]
    pub bytes_in: u64,
    /// Bytes written to its connection (TCP and Unix-socket clients).
    #[serde(default)]
    pub bytes_out: u64,
    /// Messages it published.
    pub published: u64,
    /// Messages delivered to it.
    pub delivered: u64,
    /// Bytes queued for it.
    pub pending_bytes: usize,
    /// Broadcasts and tunnel data not queued for it (pending-bytes limit).
    pub dropped_control: u64,
    /// Its requests awaiting replies.
    pub requests_waiting: usize,
    /// Per subscription.
    pub subscriptions: Vec<SubStats>,
    /// For the node's client of a shared-memory topic buffer (RBMQ's
    /// broker of buffers): each subscriber of the host that reads the
    /// topic's ring, as it last reported. Empty for every other client.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_readers: Vec<SharedReaderStats>,
}

/// One shared-buffer subscriber of a topic, as it reported to the node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedReaderStats {
    /// The reader's process (`pid N`, or `unknown`).
    pub peer: String,
    /// Messages it read from the topic's ring.
    pub read: u64,
    /// Messages (overwrite: ring segments) it lost: overwritten before
    /// it read them, or dropped by its own queue.
    pub dropped: u64,
}

/// A cluster and its members, as `skiff stats` lists them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterStats {
    /// The cluster's name.
    pub name: String,
    /// Its members on this node and, through the mesh, on other nodes.
    pub members: Vec<ClusterMember>,
}

/// One member of a cluster.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterMember {
    /// `client ID` for a client of this node, `node ADDR` for another node
    /// of the mesh with members.
    pub member: String,
    /// The capacity it advertises.
    pub capacity: u32,
}

/// One subscription's counters.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubStats {
    /// The client's id for it.
    pub sid: u64,
    /// Subject pattern.
    pub pattern: String,
    /// Type pattern.
    pub kind: String,
    /// Both patterns are cMsg patterns (absent: tokens).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cmsg: bool,
    /// Slow-consumer policy.
    pub policy: String,
    /// Queue counters.
    #[serde(flatten)]
    pub counters: SubCounters,
}

/// A subscription's counters, for stats.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct SubCounters {
    /// Messages waiting in the node.
    pub queued: usize,
    /// Messages handed to the client's connection.
    pub delivered: u64,
    /// Messages lost to the policy.
    pub dropped: u64,
    /// Messages the client may take now.
    pub credit: u32,
}

/// What `skiff stats --mesh` shows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MeshView {
    /// This node's identity.
    pub me: String,
    /// Network name.
    pub net: String,
    /// The sans-I/O mesh's counters.
    pub stats: MeshStats,
    /// Frames between nodes that did not decode.
    pub bad_frames: u64,
    /// Datagrams the socket refused to send.
    pub send_errors: u64,
    /// Scouting hellos that could not be sent.
    pub scout_errors: u64,
    /// Failed resolutions of `seeds_dns`.
    pub dns_errors: u64,
    /// Every peer known.
    pub peers: Vec<PeerStats>,
    /// Tunnels between nodes.
    #[serde(default)]
    pub tunnels: TunnelStats,
    /// The reliable link to each peer: its send queue and what it lost.
    #[serde(default)]
    pub links: Vec<LinkStats>,
    /// Frames to peers that may not have arrived (lost with the peer or
    /// its association; per peer in `links`).
    #[serde(default)]
    pub link_lost: u64,
    /// Gaps told to local subscribers: a peer that had sent messages went
    /// down or its link failed.
    #[serde(default)]
    pub gaps_reported: u64,
    /// Best-effort frames from peers dropped because local delivery was
    /// behind (a slow local subscriber); reliable links are held instead.
    #[serde(default)]
    pub delivery_dropped: u64,
    /// The encryption of the mesh's datagrams, when it is on.
    #[serde(default)]
    pub seal: Option<SealStats>,
}

/// The mesh's sealing layer (Noise handshakes, AEAD datagrams): every
/// datagram it dropped, by cause.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealStats {
    /// This node's identity (X25519 public key, base64).
    pub identity: String,
    /// Handshakes completed.
    pub handshakes: u64,
    /// Data datagrams dropped as replays (a nonce seen, or older than the
    /// window).
    pub replayed: u64,
    /// Data datagrams whose tag did not verify (altered, or sealed with
    /// other keys).
    pub forged: u64,
    /// Plain datagrams dropped (not sealed, other than scouting hellos).
    pub plain: u64,
    /// Handshakes refused: the peer's key is not in `trusted_keys`.
    pub untrusted: u64,
    /// Handshake messages that did not verify (e.g. another mesh secret)
    /// or came out of turn.
    pub bad_handshakes: u64,
    /// Data for a session this node does not hold (a peer restarted).
    pub unknown_session: u64,
    /// Datagrams dropped while waiting for a handshake (too many, or too
    /// long).
    pub queue_drops: u64,
    /// Handshakes not answered: over the rate or the peer limit.
    pub refused_busy: u64,
}

/// The reliable link to one peer (node frames over the association this
/// node opened to it): its bounded send queue and every drop.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkStats {
    /// The peer's mesh address.
    pub peer: String,
    /// The send queue's policy (`block`, `drop_oldest`, `drop_newest`).
    pub policy: String,
    /// Frames waiting in the send queue now.
    pub queued_frames: u64,
    /// Bytes waiting in the send queue now.
    pub queued_bytes: u64,
    /// The queue's bound in bytes.
    pub max_bytes: u64,
    /// Frames handed to the association.
    pub sent_frames: u64,
    /// Batches (association messages) handed to the association.
    pub sent_batches: u64,
    /// Frames received from the peer over its association.
    pub recv_frames: u64,
    /// Frames dropped as they arrived at a full queue (`drop_newest`, or
    /// `block` after its deadline).
    pub dropped_newest: u64,
    /// Frames dropped from the head of a full queue (`drop_oldest`).
    pub dropped_oldest: u64,
    /// Frames lost with the peer or its association: queued, or handed to
    /// the association and not known to be acknowledged.
    pub lost: u64,
    /// Publishes spliced into the link: their bytes referenced where
    /// they were read (a shared-memory client's ring), not copied into the
    /// queue's batch; packets copy them from there.
    #[serde(default)]
    pub spliced: u64,
    /// Times a publisher waited for room (`block`).
    pub waits: u64,
    /// Waits that reached the deadline (the queue then drops newest until
    /// it drains to half).
    pub deadlines: u64,
    /// Drops per subject, most first (bounded; `(other)` holds the rest,
    /// `(request)`, `(reply)`, `(broadcast)` the frames with no subject
    /// of their own).
    pub dropped_subjects: Vec<(String, u64)>,
}

/// Counters of tunnels between nodes (`skiff stats --mesh`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelStats {
    /// Tunnels with a remote end open now (pending opens included).
    pub open: usize,
    /// Associations this node opened that are up or setting up.
    pub associations: usize,
    /// Frames sent to peers.
    pub frames_sent: u64,
    /// Frames received from peers.
    pub frames_received: u64,
    /// Frames that did not decode (dropped).
    pub bad_frames: u64,
    /// Frames naming a tunnel the peer does not hold, or from a superseded
    /// association (dropped).
    pub stray_frames: u64,
    /// Data dropped because too much waited for a peer's association.
    pub backlog_drops: u64,
    /// Opens refused over the node's tunnel limit.
    pub limit_refused: u64,
    /// Associations that failed (every tunnel with the peer ended).
    pub assoc_failures: u64,
    /// Tunnels ended because their peer went down or its association
    /// failed.
    pub tunnels_lost: u64,
    /// Association packets the mesh refused to send.
    pub send_refused: u64,
    /// Association packets dropped on arrival: undecodable, an unknown or
    /// forged key, the wrong source, refused set-ups, and (on the live
    /// associations) duplicates and replays, packets outside the window,
    /// acknowledgements of data never sent.
    #[serde(default)]
    pub packets_dropped: u64,
    /// Association packets retransmitted (loss repaired), on the live
    /// associations.
    #[serde(default)]
    pub retransmits: u64,
    /// Of those, packets declared lost from selective acknowledgements
    /// (repaired within a round trip or so), on the live associations.
    #[serde(default)]
    pub fast_retransmits: u64,
    /// Tail-loss probes sent (a silent flight's newest packet sent again),
    /// on the live associations.
    #[serde(default)]
    pub tail_probes: u64,
    /// Retransmission timer expiries with data outstanding (the slow
    /// repair: every unacknowledged packet sent again), on the live
    /// associations.
    #[serde(default)]
    pub rto_expired: u64,
    /// Data packets that arrived twice (a retransmission whose original
    /// was not lost, or a lone small packet's second copy), on the live
    /// associations; also in `packets_dropped`.
    #[serde(default)]
    pub duplicates: u64,
    /// Times new data waited for a peer's window (shut while a hole is
    /// repaired, or while the peer reads slowly), on the live associations.
    #[serde(default)]
    pub window_stalls: u64,
    /// Microseconds new data waited for a peer's window, in all.
    #[serde(default)]
    pub window_stalled_us: u64,
    /// Times delivery from a peer waited for a missing packet (a packet
    /// arrived above a gap), on the live associations.
    #[serde(default)]
    pub gaps: u64,
    /// Microseconds delivery from peers waited for missing packets, in all.
    #[serde(default)]
    pub gap_us: u64,
}
