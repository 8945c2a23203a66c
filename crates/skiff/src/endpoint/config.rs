//! An endpoint's configuration (its locator's options) and its counters.

use std::net::SocketAddr;

use skiff_proto::association::{AssociationConfig, AssociationStats, ListenerStats};

use crate::error::LocatorError;
use crate::locator::{self, Locator};
use crate::udp::UdpConfig;

/// Options of an endpoint locator (`udp://0.0.0.0:4711?…`), with their
/// defaults.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// Address to bind.
    pub bind: SocketAddr,
    /// The service id this endpoint accepts and connects to (`service`,
    /// default 0): QMP's explicit addressing.
    pub service: u32,
    /// Every association's settings: `mtu` (default 1472), `window`
    /// (packets, both directions, default 4096) and `window_bytes` (what a
    /// window may span, default 3 MiB: the window is the smaller of the
    /// two), `recv_buffer`, `send_buffer` (default 2 MiB each),
    /// `max_message`, `sreq_every`, `ack_delay`, `min_rto`, `min_pto`, `initial_rto`,
    /// `keepalive`, `idle_timeout`, `handshake_timeout`, `bundles` (on:
    /// a tunnel's small messages travel in bundles when the peer offers
    /// them too; `bundles=false` makes this end offer none, as an end built
    /// before bundles).
    pub association: AssociationConfig,
    /// Most accepted associations at once (`max_associations`).
    pub max_associations: usize,
    /// Most accepted set-ups waiting for confirmation (`max_half_open`).
    pub max_half_open: usize,
    /// Bytes of received messages a tunnel holds for `recv` beyond its
    /// association's window (`tunnel_buffer`, default 1 MiB).
    pub tunnel_buffer: usize,
    /// Best-effort messages held for `pop` before further ones are dropped
    /// and counted (`max_inbox`, default 65536).
    pub max_inbox: usize,
    /// Largest datagram built, best-effort batches and compound datagrams
    /// included; default: the association `mtu`.
    pub max_datagram: usize,
    /// Socket options (`sndbuf`, `rcvbuf` default 4 MiB; `gso`, `gro`).
    pub udp: UdpConfig,
    /// Where the driver runs (`driver=auto|task|thread`, default `auto`).
    pub driver: DriverMode,
}

/// Where an endpoint's driver runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DriverMode {
    /// A task on the caller's runtime when [`Endpoint::with_config`] is
    /// called inside a multi-thread tokio runtime, else a thread. A
    /// current-thread runtime gets a thread: its one thread may block in
    /// code that waits for the driver.
    #[default]
    Auto,
    /// A task on the caller's tokio runtime (which must enable I/O and
    /// time, as `#[tokio::main]` does): no thread hand-off between the
    /// socket and the tasks using the tunnels. The runtime must outlive the
    /// endpoint's use: when it shuts down, the endpoint stops.
    Task,
    /// A thread of its own, whatever runtime the caller has: the
    /// endpoint keeps running while the caller's threads block.
    Thread,
}

const OPTIONS: &str =
    "service, mtu, window, window_bytes, recv_buffer, send_buffer, max_message, sreq_every, \
     ack_delay, min_rto, min_pto, initial_rto, keepalive, idle_timeout, handshake_timeout, \
     max_associations, max_half_open, tunnel_buffer, max_inbox, max_datagram, sndbuf, rcvbuf, \
     gso, gro, bundles, driver";

impl EndpointConfig {
    /// Defaults, bound to `bind`.
    pub fn new(bind: SocketAddr) -> EndpointConfig {
        EndpointConfig {
            bind,
            service: 0,
            // Tunnels bundle small messages when the peer takes them.
            association: AssociationConfig {
                bundles: true,
                ..AssociationConfig::default()
            },
            max_associations: 4096,
            max_half_open: 256,
            tunnel_buffer: 1 << 20,
            max_inbox: 1 << 16,
            max_datagram: 0,
            udp: UdpConfig {
                send_buffer: Some(4 << 20),
                recv_buffer: Some(4 << 20),
                ..UdpConfig::default()
            },
            driver: DriverMode::Auto,
        }
    }

    /// Parses a `udp://host:port?…` locator; options are listed on the
    /// fields.
    pub fn from_locator(s: &str) -> Result<EndpointConfig, LocatorError> {
        let l: Locator = s.parse()?;
        l.expect_scheme("udp")?;
        let mut c = EndpointConfig::new(l.socket_addr()?);
        let a = &mut c.association;
        l.options(OPTIONS, |k, v| {
            let count = || locator::parse_uint::<u64>(k, v, "a positive count");
            match k {
                "service" => c.service = locator::parse_uint(k, v, "a service id (u32)")?,
                "mtu" => {
                    a.mtu = locator::parse_bytes(k, v)?;
                    if !(skiff_proto::association::frame::MIN_MTU..=skiff_proto::wire::MAX_DATAGRAM)
                        .contains(&a.mtu)
                    {
                        return Err(LocatorError::BadValue {
                            name: k.into(),
                            value: v.into(),
                            expected: "a datagram size from 128 to 65507 bytes",
                        });
                    }
                }
                "window" => {
                    a.recv_window = count()?.max(1);
                    a.send_window = a.recv_window;
                }
                "window_bytes" => a.window_bytes = locator::parse_bytes(k, v)?,
                "recv_buffer" => a.recv_buffer = locator::parse_bytes(k, v)?,
                "send_buffer" => a.send_buffer = locator::parse_bytes(k, v)?,
                "max_message" => a.max_message = locator::parse_bytes(k, v)? as u64,
                "sreq_every" => a.sreq_every = locator::parse_uint(k, v, "a packet count")?,
                "ack_delay" => a.ack_delay = locator::parse_duration(k, v)?,
                "min_rto" => a.min_rto = locator::parse_duration(k, v)?,
                "min_pto" => a.min_pto = locator::parse_duration(k, v)?,
                "initial_rto" => a.initial_rto = locator::parse_duration(k, v)?,
                "keepalive" => a.keepalive = locator::parse_duration(k, v)?,
                "idle_timeout" => a.idle_timeout = locator::parse_duration(k, v)?,
                "handshake_timeout" => a.handshake_timeout = locator::parse_duration(k, v)?,
                "max_associations" => c.max_associations = count()? as usize,
                "max_half_open" => c.max_half_open = count()? as usize,
                "tunnel_buffer" => c.tunnel_buffer = locator::parse_bytes(k, v)?,
                "max_inbox" => c.max_inbox = count()? as usize,
                "max_datagram" => c.max_datagram = locator::parse_bytes(k, v)?,
                "sndbuf" => c.udp.send_buffer = Some(locator::parse_bytes(k, v)?),
                "rcvbuf" => c.udp.recv_buffer = Some(locator::parse_bytes(k, v)?),
                "gso" => c.udp.gso = locator::parse_bool(k, v)?,
                "bundles" => a.bundles = locator::parse_bool(k, v)?,
                "gro" => c.udp.gro = locator::parse_bool(k, v)?,
                "driver" => {
                    c.driver = match v {
                        "auto" => DriverMode::Auto,
                        "task" => DriverMode::Task,
                        "thread" => DriverMode::Thread,
                        _ => {
                            return Err(LocatorError::BadValue {
                                name: k.into(),
                                value: v.into(),
                                expected: "auto, task or thread",
                            })
                        }
                    }
                }
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(c)
    }

    pub(crate) fn datagram_limit(&self) -> usize {
        let d = if self.max_datagram == 0 {
            self.association.mtu
        } else {
            self.max_datagram
        };
        d.clamp(
            skiff_proto::wire::HEADER_LEN + 16,
            skiff_proto::wire::MAX_DATAGRAM,
        )
    }
}

/// Counters of an endpoint. Everything dropped on purpose is counted
/// somewhere in here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Datagrams handed to the kernel.
    pub datagrams_sent: u64,
    /// Datagrams received.
    pub datagrams_received: u64,
    /// `sendmmsg` calls.
    pub send_calls: u64,
    /// `recvmmsg` calls that returned datagrams.
    pub recv_calls: u64,
    /// Driver wake-ups.
    pub wakeups: u64,
    /// Compound datagrams sent (several frames sharing one datagram).
    pub compound_sent: u64,
    /// Frames that travelled inside compound datagrams sent.
    pub frames_shared: u64,
    /// Compound datagrams received and split.
    pub compound_received: u64,
    /// Datagrams that were not skiff's (bad magic).
    pub dropped_foreign: u64,
    /// Datagrams of another wire version.
    pub dropped_version: u64,
    /// Datagrams or frames of an unknown kind.
    pub dropped_kind: u64,
    /// Datagrams or frames that did not decode (compound, batch).
    pub dropped_malformed: u64,
    /// Datagrams cut by the receive buffer slot.
    pub dropped_truncated: u64,
    /// FIRSTs received while not listening.
    pub first_not_listening: u64,
    /// Datagrams the kernel refused to send (the association
    /// retransmits; best-effort messages in them are lost).
    pub send_errors: u64,
    /// Tunnel messages that arrived after their `Tunnel` was dropped.
    pub discarded_after_drop: u64,
    /// Small messages a tunnel's `send` accepted into its send stage that
    /// never reached the association: the tunnel failed or the peer closed
    /// first (or the peer's `max_message` refused them).
    pub staged_refused: u64,
    /// Best-effort messages accepted by `push`.
    pub pushed: u64,
    /// Best-effort messages received and kept for `pop`.
    pub popped_ready: u64,
    /// Best-effort messages numbered for us that never arrived.
    pub lost: u64,
    /// Best-effort messages received twice (dropped).
    pub duplicate: u64,
    /// Best-effort messages older than the reorder window, or numbered too
    /// far ahead of it while their stream is alive (dropped).
    pub stale: u64,
    /// Best-effort messages dropped because `max_inbox` were unread.
    pub inbox_full: u64,
    /// Tunnels open (handed out and not yet finished).
    pub tunnels_open: u64,
    /// The association endpoint's counters: FIRSTs accepted and rejected
    /// (full, half-open limit, wrong service, not listening, duplicates),
    /// unknown keys, wrong sources, malformed packets.
    pub listener: ListenerStats,
    /// The associations' counters, summed over live and finished ones:
    /// retransmissions, duplicates, out-of-window, acks of unsent data,
    /// wrong keys and sources, protocol violations.
    pub associations: AssociationStats,
}

/// Sums association counters.
pub(crate) fn add_stats(a: &mut AssociationStats, b: &AssociationStats) {
    a.packets_sent += b.packets_sent;
    a.packets_received += b.packets_received;
    a.messages_sent += b.messages_sent;
    a.messages_delivered += b.messages_delivered;
    a.data_packets += b.data_packets;
    a.retransmits += b.retransmits;
    a.fast_retransmits += b.fast_retransmits;
    a.rto_expired += b.rto_expired;
    a.tail_probes += b.tail_probes;
    a.copies += b.copies;
    a.acks_held += b.acks_held;
    a.messages_acked += b.messages_acked;
    a.probes += b.probes;
    a.duplicates += b.duplicates;
    a.out_of_window += b.out_of_window;
    a.ack_of_unsent += b.ack_of_unsent;
    a.malformed += b.malformed;
    a.wrong_key += b.wrong_key;
    a.wrong_source += b.wrong_source;
    a.stray += b.stray;
    a.protocol_violations += b.protocol_violations;
    a.bundles_sent += b.bundles_sent;
    a.bundled_messages_sent += b.bundled_messages_sent;
    a.bundles_delivered += b.bundles_delivered;
    a.bundled_messages_delivered += b.bundled_messages_delivered;
    a.window_stalls += b.window_stalls;
    a.window_stalled_us += b.window_stalled_us;
    a.gaps += b.gaps;
    a.gap_us += b.gap_us;
}
