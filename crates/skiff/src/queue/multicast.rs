//! Multicast on a datagram queue: the groups joined at bind (`join`) or
//! later, and the interface they use (`interface`). A reliable queue has
//! none: each association has one peer.

use std::net::IpAddr;

use super::{DatagramQueue, QueueConfig};
use crate::error::Error;
use crate::udp::{MulticastInterface, UdpSocket};

/// Sets the multicast interface of a new queue's socket and joins the
/// groups of its configuration.
pub(super) fn setup(socket: &UdpSocket, config: &QueueConfig) -> Result<(), Error> {
    let iface = config.interface.map(MulticastInterface::Addr);
    if let Some(i) = iface {
        socket
            .set_multicast_interface(i)
            .map_err(Error::io("set multicast interface"))?;
    }
    for g in &config.join {
        socket
            .join_multicast(*g, iface)
            .map_err(Error::io("join multicast group"))?;
    }
    Ok(())
}

impl DatagramQueue {
    /// Joins a multicast group on this queue's socket.
    pub fn join_multicast(&self, group: IpAddr) -> Result<(), Error> {
        self.inner
            .socket
            .join_multicast(group, self.iface())
            .map_err(Error::io("join multicast group"))
    }

    /// Leaves a multicast group.
    pub fn leave_multicast(&self, group: IpAddr) -> Result<(), Error> {
        self.inner
            .socket
            .leave_multicast(group, self.iface())
            .map_err(Error::io("leave multicast group"))
    }

    fn iface(&self) -> Option<MulticastInterface> {
        self.inner.config.interface.map(MulticastInterface::Addr)
    }
}
