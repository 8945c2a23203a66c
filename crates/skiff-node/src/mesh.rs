//! The node's side of the mesh (Iris): a UDP socket, the sans-I/O
//! [`skiff_proto::mesh::Mesh`] behind a lock, and one task that drives it.
//!
//! - **Discovery**: multicast scouting (a hello on [`SCOUT_GROUP`] each
//!   second for ten seconds, then every five), a seed list, and a DNS name
//!   resolved every five seconds (a Kubernetes headless service).
//! - **Frames between nodes** ride the mesh's batched datagrams, one
//!   datagram per destination node carrying many frames. The first byte
//!   says what a frame is:
//!
//! | byte | frame | body |
//! |------|-------|------|
//! | 1 | publish | message (wire encoding) |
//! | 2 | request | origin token u64, flags u8, max u32, target, key, message |
//! | 3 | reply | origin token u64, message |
//! | 4 | done | origin token u64, responders reached u32 |
//! | 5 | broadcast | cluster, message |
//!
//! Names and keys are varint-length-prefixed; integers little-endian. The
//! codec and its byte diagrams are [`skiff_proto::mesh::node_frame`].
//! Frames that do not decode are dropped and counted (`bad_frames`).
//!
//! Tunnels to members on other nodes travel over associations between the
//! nodes instead (reliable and ordered): see [`crate::mesh_tunnel`].
//!
//! The broker calls in with its routing lock held (routing lock, then the
//! mesh lock: never the other way round); the task takes the mesh lock
//! alone, drains what arrived, and calls the broker with no lock held.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use serde::Deserialize;
use skiff_proto::mesh::node_frame::{self, op, NodeFrame};
use skiff_proto::mesh::{Mesh, MeshConfig, MeshEvent, NodeId};
use skiff_proto::stats::MeshView;
use skiff_proto::Message;
use tokio::net::UdpSocket;
use tokio::sync::{watch, Notify};

use crate::broker::Broker;

/// The scouting multicast group and port.
pub const SCOUT_GROUP: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(239, 255, 47, 47)), 4749);

/// How a node joins the mesh (`[mesh]` in the TOML file, `SKIFF_MESH`, …,
/// `--mesh`, `--net`, `--seeds`, …).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshSettings {
    /// UDP address of the mesh socket (port 0: any free port).
    pub bind: SocketAddr,
    /// Network name: nodes of another name are ignored.
    pub net: String,
    /// Seed nodes' mesh addresses (`host:port`).
    pub seeds: Vec<String>,
    /// A DNS name (`name:port`) whose addresses are seeds, re-resolved
    /// every five seconds.
    pub seeds_dns: Option<String>,
    /// Multicast scouting on [`SCOUT_GROUP`].
    pub scout: bool,
    /// Most members tracked.
    pub max_members: usize,
    /// Most patterns and clusters accepted from one peer.
    pub max_interest: usize,
    /// Interest updates accepted per second from one peer.
    pub interest_rate: u32,
    /// Largest datagram sent to a peer.
    pub max_datagram: usize,
}

impl Default for MeshSettings {
    fn default() -> Self {
        let c = MeshConfig::default();
        MeshSettings {
            bind: SocketAddr::from(([0, 0, 0, 0], 0)),
            net: c.net,
            seeds: Vec::new(),
            seeds_dns: None,
            scout: true,
            max_members: c.max_members,
            max_interest: c.max_interest,
            interest_rate: c.interest_rate,
            max_datagram: c.max_datagram,
        }
    }
}

/// Frame kinds between nodes.
/// Counters of the node's mesh driver.
#[derive(Debug, Default)]
struct Counters {
    bad_frames: AtomicU64,
    send_errors: AtomicU64,
    scout_errors: AtomicU64,
    dns_errors: AtomicU64,
}

/// The mesh as the broker sees it: route, send, advertise.
#[derive(Debug)]
pub struct MeshLink {
    pub(crate) core: Mutex<Mesh>,
    pub(crate) wake: Notify,
    /// Tunnels between nodes (lock order: before `core`).
    pub(crate) tunnels: Mutex<crate::mesh_tunnel::Tunnels>,
    /// Notified when acks (or their timeout) may have opened a window.
    room: Notify,
    counters: Counters,
    max_payload: usize,
}

impl MeshLink {
    /// This node's identity in the mesh.
    pub fn id(&self) -> NodeId {
        self.core.lock().id()
    }

    /// What `skiff stats --mesh` shows.
    pub fn view(&self) -> MeshView {
        let tunnels = self.tunnel_stats();
        let m = self.core.lock();
        let c = &self.counters;
        MeshView {
            tunnels,
            me: format!("{}#{}", m.id().addr, m.id().gen),
            net: m.config().net.clone(),
            stats: m.stats(),
            bad_frames: c.bad_frames.load(Relaxed),
            send_errors: c.send_errors.load(Relaxed),
            scout_errors: c.scout_errors.load(Relaxed),
            dns_errors: c.dns_errors.load(Relaxed),
            peers: m.peer_stats(),
        }
    }

    /// Waits while a peer's window is full (flow control: the publisher
    /// slows to what the slowest interested node takes). Returns at once
    /// when there is room.
    pub(crate) async fn wait_room(&self) {
        loop {
            let n = self.room.notified();
            if self.core.lock().room() {
                return;
            }
            // The task also wakes on the ack timeout; the bound here only
            // guards against a notification that raced this check.
            let _ = tokio::time::timeout(Duration::from_millis(5), n).await;
        }
    }

    pub(crate) fn add_interest(&self, pattern: &str, kind: &str) {
        self.core.lock().add_interest(pattern, kind);
        self.wake.notify_one();
    }

    pub(crate) fn remove_interest(&self, pattern: &str, kind: &str) {
        self.core.lock().remove_interest(pattern, kind);
        self.wake.notify_one();
    }

    pub(crate) fn set_cluster(&self, cluster: &str, capacity: u32) {
        self.core.lock().set_cluster(cluster, capacity);
        self.wake.notify_one();
    }

    /// Sends a published message (its wire encoding) once to each node
    /// with matching interest; returns how many.
    pub(crate) fn publish(&self, subject: &str, kind: Option<&str>, raw: &[u8]) -> usize {
        self.publish_many(std::iter::once((subject, kind, raw)))
    }

    /// [`MeshLink::publish`] for a run of messages `(subject, type,
    /// encoding)`: one lock, one clock read and one wake-up for the run,
    /// and one routing lookup per change of subject or type.
    pub(crate) fn publish_many<'a>(
        &self,
        msgs: impl IntoIterator<Item = (&'a str, Option<&'a str>, &'a [u8])>,
    ) -> usize {
        let mut to = Vec::new();
        let mut prev = None;
        let now = Instant::now();
        let mut n = 0;
        let mut m = self.core.lock();
        for (subject, kind, raw) in msgs {
            if prev != Some((subject, kind)) {
                to.clear();
                m.route(subject, kind, &mut to);
                prev = Some((subject, kind));
            }
            for p in &to {
                n += m.send_frame_parts(now, *p, &[&[op::PUB], raw]).is_ok() as usize;
            }
        }
        drop(m);
        if n > 0 {
            self.wake.notify_one();
        }
        n
    }

    /// The nodes a request to subject `subject` goes to.
    pub(crate) fn route(&self, subject: &str, kind: Option<&str>) -> Vec<SocketAddr> {
        let mut to = Vec::new();
        self.core.lock().route(subject, kind, &mut to);
        to
    }

    /// Forwards a request to `peer`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn request(
        &self,
        peer: SocketAddr,
        token: u64,
        flags: u8,
        max: u32,
        target: &str,
        key: &[u8],
        msg: &Message,
    ) -> bool {
        let mut f = Vec::new();
        node_frame::encode_request(&mut f, token, flags, max, target, key, msg);
        self.send(peer, &f)
    }

    pub(crate) fn reply(&self, peer: SocketAddr, token: u64, msg: &Message) -> bool {
        let mut f = Vec::new();
        node_frame::encode_reply(&mut f, token, msg);
        self.send(peer, &f)
    }

    pub(crate) fn done(&self, peer: SocketAddr, token: u64, reached: u32) -> bool {
        let mut f = Vec::new();
        node_frame::encode_done(&mut f, token, reached);
        self.send(peer, &f)
    }

    pub(crate) fn broadcast(&self, peer: SocketAddr, cluster: &str, msg: &Message) -> bool {
        let mut f = Vec::new();
        node_frame::encode_broadcast(&mut f, cluster, msg);
        self.send(peer, &f)
    }

    fn send(&self, peer: SocketAddr, frame: &[u8]) -> bool {
        let ok = self
            .core
            .lock()
            .send_frame(Instant::now(), peer, frame)
            .is_ok();
        self.wake.notify_one();
        ok
    }

    /// Decodes a frame from `from` and hands it to the broker.
    fn handle_frame(&self, broker: &Broker, from: SocketAddr, frame: Bytes) {
        if self.try_frame(broker, from, &frame).is_err() {
            self.counters.bad_frames.fetch_add(1, Relaxed);
        }
    }

    fn try_frame(&self, broker: &Broker, from: SocketAddr, frame: &Bytes) -> Result<(), ()> {
        match NodeFrame::decode(frame, self.max_payload).map_err(drop)? {
            NodeFrame::Pub { msg } => {
                // Normally batched by the task (see `published`); a lone
                // one here. Its encoding follows the op byte.
                broker.deliver_remote(&msg, &frame.slice(1..));
            }
            NodeFrame::Req {
                token,
                flags,
                max,
                target,
                key,
                msg,
            } => broker.remote_request(from, token, flags, max, target, key, msg),
            NodeFrame::Reply { token, msg } => broker.remote_reply(token, msg),
            NodeFrame::Done { token, reached } => broker.remote_done(token, reached),
            NodeFrame::Bcast { cluster, msg } => broker.deliver_broadcast(&cluster, msg),
        }
        Ok(())
    }
}

/// The address peers reach this node at: the bound one, or for a wildcard
/// bind the local address of the route to the first seed (or to the
/// scouting group), else loopback.
fn advertise(bound: SocketAddr, seeds: &[SocketAddr]) -> SocketAddr {
    if !bound.ip().is_unspecified() {
        return bound;
    }
    let probe = seeds.first().copied().unwrap_or(SCOUT_GROUP);
    let ip = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| {
            s.connect(probe)?;
            s.local_addr()
        })
        .map(|a| a.ip())
        .ok()
        .filter(|ip| !ip.is_unspecified())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    SocketAddr::new(ip, bound.port())
}

fn resolve(seeds: &[String]) -> Vec<SocketAddr> {
    use std::net::ToSocketAddrs;
    seeds
        .iter()
        .filter_map(|s| s.to_socket_addrs().ok())
        .flatten()
        .filter(|a| a.is_ipv4())
        .collect()
}

/// The MTU of the route to `peer` (`IP_MTU` on a connected socket), so
/// that data datagrams fill whole IP packets and are never fragmented.
fn path_mtu(peer: SocketAddr) -> Option<usize> {
    use std::os::fd::AsRawFd;
    let s = std::net::UdpSocket::bind(if peer.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    })
    .ok()?;
    s.connect(peer).ok()?;
    let (level, name) = if peer.is_ipv4() {
        (libc::IPPROTO_IP, libc::IP_MTU)
    } else {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU)
    };
    let mut mtu: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `s` is an open socket for the whole call; `mtu` and `len`
    // are valid, writable and sized as the option requires (an int).
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            level,
            name,
            (&mut mtu as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    (r == 0 && mtu > 0).then_some(mtu as usize)
}

/// Socket buffers asked for: a flow-control window of full datagrams
/// from several peers at once must fit (the kernel caps it at
/// `net.core.rmem_max`; `skiff stats --mesh` shows what was granted).
const SOCKET_BUFFER: usize = 4 << 20;

fn mesh_socket(bind: SocketAddr) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(bind), Type::DGRAM, Some(Protocol::UDP))?;
    // Best effort: a smaller buffer still works, with more drops counted.
    let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = s.set_send_buffer_size(SOCKET_BUFFER);
    s.bind(&bind.into())?;
    s.set_nonblocking(true)?;
    UdpSocket::from_std(s.into())
}

fn scout_socket() -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.bind(&SocketAddr::from(([0, 0, 0, 0], SCOUT_GROUP.port())).into())?;
    let IpAddr::V4(g) = SCOUT_GROUP.ip() else {
        unreachable!()
    };
    s.join_multicast_v4(&g, &Ipv4Addr::UNSPECIFIED)?;
    s.set_multicast_loop_v4(true)?;
    s.set_nonblocking(true)?;
    UdpSocket::from_std(s.into())
}

/// Binds the mesh socket, joins the mesh and starts the driver task on the
/// current runtime; the task ends when `stop` turns true (after leaving
/// the mesh gracefully).
pub(crate) async fn start(
    settings: &MeshSettings,
    broker: &Arc<Broker>,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<(Arc<MeshLink>, tokio::task::JoinHandle<()>)> {
    let sock = mesh_socket(settings.bind)?;
    let seeds = resolve(&settings.seeds);
    let me = advertise(sock.local_addr()?, &seeds);
    let config = MeshConfig {
        net: settings.net.clone(),
        max_members: settings.max_members,
        max_interest: settings.max_interest,
        interest_rate: settings.interest_rate,
        max_datagram: settings.max_datagram,
        ..MeshConfig::default()
    };
    let now = Instant::now();
    let gen = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_millis() as u64);
    let seed = gen ^ ((me.port() as u64) << 48) ^ std::process::id() as u64;
    let mut core = Mesh::new(NodeId { addr: me, gen }, config, now, seed);
    core.set_seeds(now, &seeds);
    let link = Arc::new(MeshLink {
        core: Mutex::new(core),
        wake: Notify::new(),
        room: Notify::new(),
        counters: Counters::default(),
        max_payload: broker.limits().max_payload,
        tunnels: Mutex::new(crate::mesh_tunnel::Tunnels::new(
            settings.max_datagram,
            broker.limits().max_payload,
            broker.limits().max_pending_bytes,
        )),
    });
    broker.set_mesh(link.clone());
    let scout = if settings.scout {
        match scout_socket() {
            Ok(s) => Some(s),
            Err(_) => {
                link.counters.scout_errors.fetch_add(1, Relaxed);
                None
            }
        }
    } else {
        None
    };
    let weak = Arc::downgrade(broker);
    let l = link.clone();
    let static_seeds = seeds;
    let dns = settings.seeds_dns.clone();
    let scouting = settings.scout;
    // The node's own client for what other nodes publish: its counters
    // show the mesh's traffic in `skiff stats`.
    let mesh_client = broker
        .attach(format!("mesh:{me}"))
        .map_err(|f| std::io::Error::other(f.text))?;
    let task = tokio::spawn(async move {
        let started = Instant::now();
        let mut next_hello = Instant::now();
        let mut next_dns = Instant::now();
        // Datagrams are received into `buf` and handed on as frozen
        // slices: frames reach the broker with no copy.
        let mut buf = bytes::BytesMut::new();
        let mut sbuf = vec![0u8; 2048];
        loop {
            let now = Instant::now();
            if scouting && now >= next_hello {
                let mut hello = Vec::new();
                l.core.lock().hello(&mut hello);
                if sock.send_to(&hello, SCOUT_GROUP).await.is_err() {
                    l.counters.scout_errors.fetch_add(1, Relaxed);
                }
                let every = if now - started < Duration::from_secs(10) {
                    1
                } else {
                    5
                };
                next_hello = now + Duration::from_secs(every);
            }
            if let Some(name) = dns.as_ref().filter(|_| now >= next_dns) {
                next_dns = now + Duration::from_secs(5);
                match tokio::net::lookup_host(name.as_str()).await {
                    Ok(addrs) => {
                        let me = l.id().addr;
                        let mut all: Vec<SocketAddr> = static_seeds.clone();
                        all.extend(addrs.filter(|a| a.is_ipv4() && *a != me));
                        l.core.lock().set_seeds(Instant::now(), &all);
                    }
                    Err(_) => {
                        l.counters.dns_errors.fetch_add(1, Relaxed);
                    }
                }
            }
            let deadline = {
                let m = l.core.lock();
                let mut d = m.poll_timeout().unwrap_or(now + Duration::from_secs(1));
                if scouting {
                    d = d.min(next_hello);
                }
                if dns.is_some() {
                    d = d.min(next_dns);
                }
                d
            };
            let deadline = crate::mesh_tunnel::deadline(&l, deadline);
            let sleep = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline));
            tokio::select! {
                r = async {
                    buf.reserve(65_536);
                    sock.recv_buf_from(&mut buf).await
                } => {
                    if let Ok((n, from)) = r {
                        let mut m = l.core.lock();
                        m.handle_datagram(Instant::now(), from, buf.split_to(n).freeze());
                        // Whatever else is already queued, under the same lock.
                        for _ in 0..64 {
                            buf.reserve(65_536);
                            match sock.try_recv_buf_from(&mut buf) {
                                Ok((n, from)) => m.handle_datagram(
                                    Instant::now(),
                                    from,
                                    buf.split_to(n).freeze(),
                                ),
                                Err(_) => break,
                            }
                        }
                    }
                }
                r = async {
                    match &scout {
                        Some(s) => s.recv_from(&mut sbuf).await,
                        None => std::future::pending().await,
                    }
                } => {
                    if let Ok((n, from)) = r {
                        let d = Bytes::copy_from_slice(&sbuf[..n]);
                        l.core.lock().handle_datagram(Instant::now(), from, d);
                    }
                }
                _ = sleep => l.core.lock().handle_timeout(Instant::now()),
                _ = l.wake.notified() => {}
                _ = stop.changed() => {
                    l.core.lock().leave(Instant::now());
                    flush(&l, &sock).await;
                    return;
                }
            }
            let Some(broker) = weak.upgrade() else { return };
            let mut events = Vec::new();
            {
                let mut m = l.core.lock();
                while let Some(e) = m.poll_event() {
                    events.push(e);
                }
            }
            // Runs of publishes go to the broker as one batch (one lock
            // and one match per run of the same subject, as for a client).
            let mut batch: Vec<crate::broker::Published> = Vec::new();
            for e in events {
                match e {
                    MeshEvent::Frames { from, frames } => {
                        for frame in frames {
                            if frame.first() == Some(&op::PUB) {
                                batch.extend(published(&l, frame));
                                continue;
                            }
                            if !batch.is_empty() {
                                broker.publish_remote(&mesh_client, &mut batch).await;
                            }
                            l.handle_frame(&broker, from, frame);
                        }
                        continue;
                    }
                    _ if !batch.is_empty() => {
                        broker.publish_remote(&mesh_client, &mut batch).await;
                    }
                    _ => {}
                }
                match e {
                    MeshEvent::Frames { .. } => {}
                    MeshEvent::Cluster {
                        peer,
                        cluster,
                        capacity,
                    } => broker.remote_cluster(peer, &cluster, capacity),
                    MeshEvent::Down(id) => {
                        broker.remote_down(id.addr);
                        crate::mesh_tunnel::peer_down(&l, &broker, id.addr);
                    }
                    MeshEvent::Up(id) => {
                        if let Some(mtu) = path_mtu(id.addr) {
                            l.core.lock().set_path_mtu(id.addr, mtu);
                        }
                    }
                    MeshEvent::Assoc { from, packet } => {
                        l.tunnels.lock().handle_packet(Instant::now(), from, packet)
                    }
                }
            }
            if !batch.is_empty() {
                broker.publish_remote(&mesh_client, &mut batch).await;
            }
            crate::mesh_tunnel::drive(&l, &broker);
            drop(broker);
            flush(&l, &sock).await;
            l.room.notify_waiters();
        }
    });
    Ok((link, task))
}

/// A publish frame as the broker's batch takes it, or `None` (counted) if
/// the message does not decode.
fn published(l: &MeshLink, frame: Bytes) -> Option<crate::broker::Published> {
    match crate::broker::Published::from_frame(frame, l.max_payload) {
        Ok(p) => Some(p),
        Err(_) => {
            l.counters.bad_frames.fetch_add(1, Relaxed);
            None
        }
    }
}

/// Seals pending frames and sends every queued datagram.
async fn flush(l: &MeshLink, sock: &UdpSocket) {
    let out: Vec<(SocketAddr, Vec<u8>)> = {
        let mut m = l.core.lock();
        let mut buf = Vec::new();
        let now = Instant::now();
        std::iter::from_fn(|| {
            let t = m.poll_transmit(now, &mut buf)?;
            Some((t.destination, std::mem::take(&mut buf)))
        })
        .collect()
    };
    for (to, d) in out {
        if sock.send_to(&d, to).await.is_err() {
            l.counters.send_errors.fetch_add(1, Relaxed);
        }
    }
}

/// A weak handle, for tests that need the broker gone.
#[allow(dead_code)]
pub(crate) type WeakBroker = Weak<Broker>;
