//! skiff: messaging middleware for clusters and clouds.
//!
//! This crate holds the I/O drivers and the application API. Applications
//! exchange [`Message`]s by name or address; the locator string given to
//! each object picks the transport at run time (`udp://…` today).
//!
//! - [`Queue`]: CMQ's batched datagram queue — `push` to an address without
//!   waiting on the network, `try_pop`/`pop` what arrived, loss counted.
//! - [`Client`]: a node's client (`skiff://`, `unix://`, in-process
//!   `mem://`, or a `file://` log): publish/subscribe, request/reply,
//!   clusters, broadcast and tunnels. The node itself is `skiff-node`.
//! - [`Endpoint`] and [`Tunnel`]: QMP associations over UDP — `connect`,
//!   `listen`/`accept`, then `send`/`recv` exactly once and in order with
//!   back-pressure; best-effort `push` sharing the same datagrams.
//!
//! The wire format and the state machines live in `skiff-proto`, which
//! does no I/O; this crate owns sockets, threads and clocks.

// The loom build (`--cfg skiff_loom`, see `shm::loom`) model-checks the
// shared-memory ring alone: the code around it is compiled but unused
// there, and its warnings would only bury the model checker's output.
#![cfg_attr(skiff_loom, allow(dead_code, unused_mut, unused_variables))]

pub mod client;
pub mod endpoint;
pub mod error;
pub mod keys;
pub mod locator;
pub mod queue;
pub mod shm;
pub mod spin;
mod sys;
pub mod tls;
pub mod tunnel;
pub mod udp;

pub use client::{Client, ClientOptions};
pub use endpoint::{DriverMode, Endpoint, EndpointConfig, EndpointStats};
pub use error::{Error, LocatorError};
pub use locator::Locator;
pub use queue::{decode_typed, typed_message, Drops, Queue, QueueConfig, QueueStats};
pub use skiff_proto::{Dest, Field, Message, Meta, Value};
pub use tunnel::{Tunnel, TunnelError, TunnelStream};
