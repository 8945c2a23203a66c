//! The node behind `mem://`: installs this crate's node as the process's
//! in-process node (the seam `skiff::client::embed` defines), so a client
//! that connects to `mem://name` attaches to a node made for that name.

use std::sync::Arc;

use skiff::client::embed::{self, LocalNode};

use crate::{Config, Node};

/// Makes `mem://` clients of this process attach to a [`Node::embedded`]
/// with the default configuration (one per name, made on first use).
/// Idempotent; call it once at start.
pub fn install() {
    embed::install(make);
}

fn make(_name: &str) -> Arc<dyn LocalNode> {
    Arc::new(Node::embedded(&Config::default()))
}
