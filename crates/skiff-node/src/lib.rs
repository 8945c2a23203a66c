//! skiff-node: the skiff node (the daemon, one per host, as Iris and the
//! cMsg server have) as a library.
//!
//! Clients attach over TCP, a Unix socket or shared memory (every listener
//! [`Node::start`] starts from its [`Config`]), or in the same process ([`Node::embedded`], [`MemLink`]: what `mem://` uses). The
//! node routes by name:
//! - **publish/subscribe**: subject patterns with `*` (one token) and `>`
//!   (one or more remaining tokens, so `a.>` does not match `a`), types
//!   exactly or `*`; each subscription has a bounded queue in the node and
//!   a slow-consumer [`Policy`] of its own;
//! - **request/reply**: to a subject (every matching subscription gets it,
//!   the first reply wins, or up to `max` for scatter-gather) or to a
//!   cluster (one member, by smooth weighted round robin over capacity
//!   minus load, or by key affinity), with an immediate "no responders";
//! - **clusters** (Iris): join/leave with a capacity, broadcast to every
//!   member, tunnels (ordered, credit flow-controlled streams relayed over
//!   the clients' connections).
//!
//! Layout: [`frame`] is the client↔node protocol (no I/O, in
//! `skiff_proto`); [`session`] one client's sans-I/O session, into which
//! every front end feeds what it reads (frame bounds, runs of publishes,
//! order, accounting); [`broker`] the shared state and what each frame does
//! (no I/O, no clock: it queues frames into each client's [`outbox`]);
//! [`listen`] the front ends (TCP and Unix sockets, shared memory,
//! in-process), each a thin driver of a session; [`node`] starts them and
//! the [`mesh`] from the configuration. Routing itself is
//! `skiff_proto::router`.
//!
//! The client side (`Client::connect("skiff://…")`, `mem://`) is in the
//! `skiff` crate, which this one depends on; [`embed::install`] plugs this
//! node in behind `mem://`.

pub mod auth;
pub mod broker;
pub mod config;
pub mod embed;
pub mod listen;
pub mod logging;
pub mod logsink;
pub mod mesh;
pub mod mesh_tunnel;
pub mod monitor;
pub mod node;
pub mod outbox;
pub mod reload;
pub mod session;
pub mod wake;

pub use broker::{Broker, Fatal};
pub use config::{Config, ConfigError, Limits, NatsTls};
pub use listen::mem::MemLink;
pub use listen::shm::{ShmListener, ShmStats};
pub use mesh::{MeshLink, MeshSettings};
pub use node::Node;
pub use outbox::ClientOut;
pub use session::Session;
pub use skiff_proto::client_frame::{
    self as frame, ClientFrame, Code, Policy, ServerFrame, ASYNC_ERROR,
};
pub use skiff_proto::stats::{
    ClientStats, MeshView, NodeStats, SubCounters, SubStats, TunnelStats,
};
pub use wake::WakeLatency;

pub use skiff::locator::DEFAULT_PORT;
