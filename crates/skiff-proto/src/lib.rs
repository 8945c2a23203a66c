//! skiff-proto: skiff's wire format and its sans-I/O state machines.
//!
//! This crate does no I/O. It owns no sockets, threads or clocks and draws no
//! randomness from the OS: time arrives as a `now: Instant` argument and bytes
//! move in and out through the caller's buffers, in the style of `quinn-proto`
//! and `rustls`. The I/O drivers that run these machines live in the `skiff`
//! crate.
//!
//! - [`codec`]: the one `Reader`/`Writer` (on the one [`varint`]) that
//!   every wire format below is decoded and encoded with.
//! - [`wire`]: the versioned datagram format (a header and a batch of
//!   [`Message`]s). Decoders are total and bounded.
//! - Frame formats, one module each: [`association::frame`] (QMP packets),
//!   [`client_frame`] (client↔node), [`mesh::packet`] (node↔node
//!   datagrams), [`mesh::node_frame`] and [`mesh::tunnel_frame`] (frames
//!   between nodes), [`buffer`] (the buffer transports' frames),
//!   [`msgframe`], [`compound`] and [`record`] (the `file://` log).
//! - [`batcher`]: CMQ's per-destination batching (flush on `qthresh` bytes, on
//!   a timeout, or when the next message would overflow the datagram).
//! - [`loss`]: per-source sequence tracking on the receiving side: gaps are
//!   counted as lost, duplicates and stale messages are dropped.
#![forbid(unsafe_code)]

pub mod association;
pub mod batcher;
pub mod buffer;
pub mod client_frame;
pub mod codec;
pub mod compound;
pub mod credits;
pub mod error;
pub mod loss;
pub mod mesh;
pub mod message;
pub mod msgframe;
pub mod nats;
pub mod record;
pub mod router;
pub mod stats;
pub mod varint;
pub mod wire;

pub use batcher::{Batcher, BatcherConfig, Dest, Transmit};
pub use error::{Error, LimitError, UsageError, WireError};
pub use loss::{LossDetector, Verdict};
pub use message::{Field, Message, Meta, Value};
