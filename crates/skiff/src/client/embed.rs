//! The seam an in-process node plugs into: what `mem://` attaches to.
//!
//! The client API does not know the node (the `skiff-node` crate depends on
//! this one, not the other way round). A node that runs in this process
//! implements [`LocalNode`]; a client attached to it exchanges frames with
//! it as values, with no encoding and no copy, through a [`LocalLink`].
//!
//! `mem://name` asks the process's node factory for the node called `name`
//! (one per name, created on first use). `skiff-node` installs its factory
//! with `skiff_node::embed::install()`; the `skiff` binary and the Python
//! package do so at start. Without a factory, `mem://` is refused with an
//! error that says so; [`super::Client::attach`] takes a node directly.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};

use skiff_proto::client_frame::{ClientFrame, Code, ServerFrame};

/// What a node answers when it refuses a frame and closes the client: the
/// same code and text a remote node sends in its `Error` frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Why, by cause.
    pub code: Code,
    /// What happened, for people.
    pub text: String,
}

/// A boxed future of a [`LocalLink`] or [`LocalOutbox`] call.
pub type LocalFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A node running in this process, as the client API sees it.
pub trait LocalNode: Send + Sync + fmt::Debug {
    /// Attaches a new client. The node's first frame for it, in its
    /// outbox, is `Welcome`.
    fn attach(&self) -> Result<Box<dyn LocalLink>, Refusal>;
}

/// One in-process client's attachment to a [`LocalNode`].
pub trait LocalLink: Send + Sync + fmt::Debug {
    /// Hands one frame to the node, waiting while it pushes back (a full
    /// subscription with the `Block` policy). An error means the node
    /// closed this client.
    fn send(&self, frame: ClientFrame) -> LocalFuture<'_, Result<(), Refusal>>;
    /// Hands a frame that never waits (anything but publish and request)
    /// to the node at once.
    fn send_control(&self, frame: ClientFrame) -> Result<(), Refusal>;
    /// The client's outbox in the node (for a task that must not keep the
    /// link alive).
    fn outbox(&self) -> Arc<dyn LocalOutbox>;
    /// The node's id for this client.
    fn id(&self) -> u64;
    /// The largest payload the node takes.
    fn max_payload(&self) -> usize;
    /// Detaches the client (the node also does so when the link drops).
    fn close(&self);
}

/// Where the node queues frames for an in-process client.
pub trait LocalOutbox: Send + Sync + fmt::Debug {
    /// Moves every queued frame into `out` without waiting.
    fn take(&self, out: &mut Vec<ServerFrame>);
    /// Moves every queued frame into `out`, waiting until there is one;
    /// `false` once the client is closed.
    fn next_batch<'a>(&'a self, out: &'a mut Vec<ServerFrame>) -> LocalFuture<'a, bool>;
}

/// Makes the node that `mem://name` attaches to.
pub type Factory = fn(name: &str) -> Arc<dyn LocalNode>;

static FACTORY: OnceLock<Factory> = OnceLock::new();

/// Installs the factory of `mem://` nodes for this process. The first
/// installation wins; `false` if one was already installed.
pub fn install(factory: Factory) -> bool {
    FACTORY.set(factory).is_ok()
}

/// The process's node called `name`, made on first use.
pub(crate) fn node(name: &str) -> Option<Arc<dyn LocalNode>> {
    static NODES: OnceLock<Mutex<HashMap<String, Arc<dyn LocalNode>>>> = OnceLock::new();
    let factory = FACTORY.get()?;
    let mut nodes = NODES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    Some(
        nodes
            .entry(name.to_owned())
            .or_insert_with(|| factory(name))
            .clone(),
    )
}
