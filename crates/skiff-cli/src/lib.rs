//! The library half of skiff-cli: the measuring code of `skiff bench`.
//!
//! The `skiff` binary runs it as `skiff bench …`; the unpublished
//! `skiff-bench` crate runs the same loops beside its comparisons with
//! other systems, so a skiff row means the same in both. It does I/O
//! (sockets, shared memory, child processes); nothing here is part of
//! skiff's client API.

pub mod bench;
