//! The one thin driver of a sans-I/O association
//! [`Endpoint`](association::Endpoint), shared by this crate's endpoint
//! thread (tunnels, reliable queues, buffers over udp) and the node's mesh
//! task (tunnels between nodes): it fires the endpoint's due timers, hands
//! its events out, and moves the packets it has to send to an [`Outlet`]
//! (here a socket's [`SendBatch`](crate::udp::SendBatch), in the node the
//! mesh's envelope), a bounded number of bytes per round. What arrives
//! goes in through [`Pump::input`] wherever the caller found it (a socket
//! here, the mesh's datagrams in the node).
//!
//! The outlet is a type parameter, so the per-packet path is monomorphic:
//! the endpoint writes each packet straight into the outlet's buffer.

use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;
use skiff_proto::association::{self, EndpointEvent, Step, Transmit};

/// Where a [`Pump`]'s packets go.
pub trait Outlet {
    /// Lets `poll` append the next packet to a buffer of the outlet's and
    /// takes it; returns its size, or `None` when `poll` had nothing to
    /// send (the buffer is then as it was).
    fn take(
        &mut self,
        now: Instant,
        poll: impl FnOnce(&mut Vec<u8>) -> Option<Transmit>,
    ) -> Option<usize>;

    /// Whether the outlet takes a packet's large payload by reference
    /// ([`Outlet::take_split`]) rather than copied into its buffer.
    const SPLIT: bool = false;

    /// Like [`Outlet::take`], but `poll` may set the packet's last bytes in
    /// its second argument instead of appending them (see
    /// [`Endpoint::poll_transmit_split`](association::Endpoint::poll_transmit_split)).
    /// Called only when [`Outlet::SPLIT`]; by default the bytes are
    /// appended.
    fn take_split(
        &mut self,
        now: Instant,
        poll: impl FnOnce(&mut Vec<u8>, &mut Option<Bytes>) -> Option<Transmit>,
    ) -> Option<usize> {
        self.take(now, |buf| {
            let mut tail = None;
            let t = poll(buf, &mut tail)?;
            if let Some(b) = tail {
                buf.extend_from_slice(&b);
            }
            Some(t)
        })
    }
}

/// Drives one association endpoint: see the module documentation. Order
/// per round: [`Pump::input`] for what arrived, then [`Pump::timers`],
/// [`Pump::events`], the caller's own sends, and last [`Pump::transmit`].
#[derive(Debug, Clone, Copy)]
pub struct Pump {
    /// Bytes moved to the outlet per [`Pump::transmit`], about.
    max_bytes: usize,
}

impl Pump {
    /// A pump that moves about `max_bytes` per [`Pump::transmit`]
    /// (`usize::MAX`: everything the endpoint has).
    pub fn new(max_bytes: usize) -> Pump {
        Pump { max_bytes }
    }

    /// Feeds one association packet from `from`; the endpoint routes it
    /// (set-ups, associations) and counts what it drops.
    #[inline]
    pub fn input(
        &self,
        ep: &mut association::Endpoint,
        now: Instant,
        from: SocketAddr,
        packet: Bytes,
    ) {
        ep.handle_datagram(now, from, packet);
    }

    /// Feeds association packets that arrived together from `from` (the
    /// segments of one GRO run), in order: the endpoint finds the
    /// association of a run of packets for it once.
    #[inline]
    pub fn input_run(
        &self,
        ep: &mut association::Endpoint,
        now: Instant,
        from: SocketAddr,
        packets: impl IntoIterator<Item = Bytes>,
    ) {
        ep.handle_datagrams(now, from, packets);
    }

    /// Acts on the endpoint's timers that are due at `now`.
    pub fn timers(&self, ep: &mut association::Endpoint, now: Instant) {
        ep.handle_timeout(now);
    }

    /// Hands every event the endpoint has (new associations, associations
    /// with new input) to `f`, with the endpoint to reach the association.
    #[inline]
    pub fn events(
        &self,
        ep: &mut association::Endpoint,
        mut f: impl FnMut(&mut association::Endpoint, EndpointEvent),
    ) {
        while let Some(ev) = ep.poll_event() {
            f(ep, ev);
        }
    }

    /// Moves the packets the endpoint has to send to `out`, until it has
    /// none or about the pump's byte budget went; returns whether more
    /// may be waiting.
    #[inline]
    pub fn transmit<O: Outlet>(
        &self,
        ep: &mut association::Endpoint,
        now: Instant,
        out: &mut O,
    ) -> bool {
        let (mut bytes, mut more) = (0usize, false);
        ep.transmit_with(|a| {
            if bytes >= self.max_bytes {
                more = true;
                return Step::Stop;
            }
            let n = if O::SPLIT {
                out.take_split(now, |buf, tail| a.poll_transmit_split(now, buf, tail))
            } else {
                out.take(now, |buf| a.poll_transmit_append(now, buf))
            };
            match n {
                Some(n) => {
                    bytes = bytes.saturating_add(n);
                    Step::Sent
                }
                None => Step::Idle,
            }
        });
        more
    }
}
