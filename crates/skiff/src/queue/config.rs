//! A queue's options: [`QueueConfig`], parsed from a `udp://` locator's
//! query parameters (or built by hand), with their defaults.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use skiff_proto::{wire, Dest};

use crate::error::LocatorError;
use crate::locator::{self, Locator};
use crate::udp::UdpConfig;

/// Options of a `udp://` queue locator, with their defaults.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// Address to bind.
    pub bind: SocketAddr,
    /// Seal a batch at this many bytes (`qthresh`); default: `max_datagram`.
    pub qthresh: usize,
    /// Seal a batch when its oldest message is this old (`timeout`); zero is
    /// natural batching (the default).
    pub timeout: Duration,
    /// Largest datagram built (`max_datagram`), default 1472 (one Ethernet
    /// frame over IPv4); up to 65507.
    pub max_datagram: usize,
    /// This queue's endpoint id (`endpoint`); datagrams for another id are
    /// dropped. Default 0.
    pub endpoint: u32,
    /// Most destinations with batching state (`max_destinations`).
    pub max_destinations: usize,
    /// Most sources whose sequence numbers are tracked (`max_sources`).
    pub max_sources: usize,
    /// Bytes of datagrams that may wait for a full socket send buffer
    /// before further ones are dropped and counted (`max_backlog`).
    pub max_backlog: usize,
    /// Socket options.
    pub udp: UdpConfig,
    /// Multicast groups to join at bind (`join`, repeatable).
    pub join: Vec<IpAddr>,
    /// The IPv4 interface address for multicast joins and sends
    /// (`interface`), e.g. 127.0.0.1; default: the kernel's choice.
    pub interface: Option<std::net::Ipv4Addr>,
    /// Push over associations, exactly once and in order (`reliable`,
    /// default false); see [`reliable`](super::reliable). Then
    /// `max_backlog` bounds each destination's backlog, `endpoint` is the
    /// association service id, `max_datagram` the association MTU, and the
    /// association options below apply.
    pub reliable: bool,
    /// The associations' settings when `reliable`: `window` (packets),
    /// `idle_timeout`, `handshake_timeout`, `max_message`.
    pub association: skiff_proto::association::AssociationConfig,
    /// A point-to-point queue's one peer (`peer`), e.g. 10.0.0.2:4711; see
    /// [`DatagramQueue::connect`](super::DatagramQueue::connect). Default:
    /// none (any peer).
    pub peer: Option<SocketAddr>,
}

const OPTIONS: &str =
    "qthresh, timeout, max_datagram, endpoint, max_destinations, max_sources, max_backlog, \
                       sndbuf, rcvbuf, gso, gro, multicast_loop, ttl, reuse, join, interface, \
                       reliable, window, idle_timeout, handshake_timeout, max_message, peer";

impl QueueConfig {
    /// Parses a `udp://host:port?…` locator.
    pub fn from_locator(s: &str) -> Result<QueueConfig, LocatorError> {
        let l: Locator = s.parse()?;
        l.expect_scheme("udp")?;
        let mut c = QueueConfig {
            bind: l.socket_addr()?,
            qthresh: 0,
            timeout: Duration::ZERO,
            max_datagram: 1472,
            endpoint: 0,
            max_destinations: 1 << 20,
            max_sources: 4096,
            max_backlog: 4 << 20,
            udp: UdpConfig::default(),
            join: Vec::new(),
            interface: None,
            reliable: false,
            association: skiff_proto::association::AssociationConfig::default(),
            peer: None,
        };
        l.options(OPTIONS, |k, v| {
            match k {
                "qthresh" => c.qthresh = locator::parse_bytes(k, v)?,
                "timeout" => c.timeout = locator::parse_duration(k, v)?,
                "max_datagram" => {
                    c.max_datagram = locator::parse_bytes(k, v)?;
                    if !(wire::HEADER_LEN + 16..=wire::MAX_DATAGRAM).contains(&c.max_datagram) {
                        return Err(LocatorError::BadValue {
                            name: k.into(),
                            value: v.into(),
                            expected: "a datagram size from 42 to 65507 bytes",
                        });
                    }
                }
                "endpoint" => {
                    c.endpoint = locator::parse_uint(k, v, "an endpoint id from 0 to 4294967294")?
                }
                "max_destinations" => {
                    c.max_destinations = locator::parse_uint(k, v, "a positive count")?
                }
                "max_sources" => c.max_sources = locator::parse_uint(k, v, "a positive count")?,
                "max_backlog" => c.max_backlog = locator::parse_bytes(k, v)?,
                "sndbuf" => c.udp.send_buffer = Some(locator::parse_bytes(k, v)?),
                "rcvbuf" => c.udp.recv_buffer = Some(locator::parse_bytes(k, v)?),
                "gso" => c.udp.gso = locator::parse_bool(k, v)?,
                "gro" => c.udp.gro = locator::parse_bool(k, v)?,
                "multicast_loop" => c.udp.multicast_loop = locator::parse_bool(k, v)?,
                "ttl" => c.udp.multicast_ttl = locator::parse_uint(k, v, "a TTL from 0 to 255")?,
                "reuse" => c.udp.reuse_addr = locator::parse_bool(k, v)?,
                "join" => c.join.push(v.parse().map_err(|_| LocatorError::BadValue {
                    name: k.into(),
                    value: v.into(),
                    expected: "a multicast group address such as 239.1.2.3 or ff02::1:5",
                })?),
                "interface" => {
                    c.interface = Some(v.parse().map_err(|_| LocatorError::BadValue {
                        name: k.into(),
                        value: v.into(),
                        expected: "the IPv4 address of a local interface, e.g. 127.0.0.1",
                    })?)
                }
                "reliable" => c.reliable = locator::parse_bool(k, v)?,
                "window" => {
                    let w: u64 = locator::parse_uint(k, v, "a positive packet count")?;
                    c.association.recv_window = w.max(1);
                    c.association.send_window = w.max(1);
                }
                "idle_timeout" => c.association.idle_timeout = locator::parse_duration(k, v)?,
                "handshake_timeout" => {
                    c.association.handshake_timeout = locator::parse_duration(k, v)?
                }
                "max_message" => c.association.max_message = locator::parse_bytes(k, v)? as u64,
                "peer" => {
                    c.peer = Some(v.parse().map_err(|_| LocatorError::BadValue {
                        name: k.into(),
                        value: v.into(),
                        expected: "an IP address and port, e.g. 127.0.0.1:4711 or [::1]:4711",
                    })?)
                }
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        if c.endpoint == Dest::ANY {
            return Err(LocatorError::BadValue {
                name: "endpoint".into(),
                value: c.endpoint.to_string(),
                expected: "an endpoint id from 0 to 4294967294 (4294967295 means any)",
            });
        }
        if c.qthresh == 0 || c.qthresh > c.max_datagram {
            c.qthresh = c.max_datagram;
        }
        if c.reliable && c.peer.is_some() {
            return Err(LocatorError::BadValue {
                name: "peer".into(),
                value: format!("{:?}", c.peer),
                expected: "no peer with reliable=true (associations have their own peers)",
            });
        }
        Ok(c)
    }
}
