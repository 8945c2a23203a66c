//! The task that drives the node's [`Mesh`]: the mesh socket (skiff's UDP
//! driver: `recvmmsg` into a [`RecvBatch`], `sendmmsg` with GSO runs from a
//! [`SendBatch`]), the scouting socket, DNS seeds and the deadlines.
//!
//! One turn of the loop: wait for datagrams, a deadline, the broker's wake
//! or the stop signal; hand every datagram that arrived to the mesh under
//! one lock; take the mesh's events to the broker and the tunnels; then
//! send everything the mesh has to send in one batch (each peer's data
//! datagrams back to back, so consecutive equal-size ones go as one
//! segmented send).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use skiff::udp::{AsyncUdpSocket, RecvBatch, SendBatch, UdpConfig};
use skiff_proto::mesh::node_frame::op;
use skiff_proto::mesh::{Frames, Mesh, MeshConfig, MeshEvent, NodeId};
use tokio::net::UdpSocket as TokioUdpSocket;
use tokio::sync::{mpsc, watch, Notify};

use super::{Counters, Inbound, MeshLink, MeshSettings, SCOUT_GROUP};
use crate::outbox::ClientOut;

/// Socket buffers asked for: a flow-control window of full datagrams
/// from several peers at once must fit (the kernel caps it at
/// `net.core.rmem_max`; `skiff stats --mesh` shows what was granted).
const SOCKET_BUFFER: usize = 4 << 20;

/// Buffers taken per receive call. Each holds a datagram or a GRO run
/// (up to 64 KiB, the largest a loopback peer sends). Frames handed on
/// keep their batch's arena (this many × 64 KiB) alive, and a new arena is
/// zeroed while the broker still holds the last one, so it stays small.
const RECV_SLOTS: usize = 8;

/// Receive calls per turn at most (so up to 64 buffers, as many datagrams
/// as one turn took before receives were batched), so that sending and
/// the broker get their turn under a flood.
const RECV_CALLS: usize = 8;

/// Binds the mesh socket, joins the mesh and starts the driver task on the
/// current runtime; the task ends when `stop` turns true (after leaving
/// the mesh gracefully).
pub(crate) async fn start<L: Inbound>(
    settings: &MeshSettings,
    broker: &Arc<L>,
    stop: watch::Receiver<bool>,
) -> std::io::Result<(Arc<MeshLink>, tokio::task::JoinHandle<()>)> {
    let sock = AsyncUdpSocket::bind(
        settings.bind,
        &UdpConfig {
            send_buffer: Some(SOCKET_BUFFER),
            recv_buffer: Some(SOCKET_BUFFER),
            ..UdpConfig::default()
        },
    )?;
    // The sealing layer, when a secret or trusted keys are given: errors
    // in its keys stop the node here, naming the file or the key.
    let seal = if settings.secret.is_some() || !settings.trusted_keys.is_empty() {
        let private = match &settings.identity {
            Some(p) => super::seal::load_identity(p)?,
            None => super::seal::generate_identity().0,
        };
        let mut trusted = Vec::new();
        for k in &settings.trusted_keys {
            trusted.push(super::seal::parse_public(k).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("mesh trusted_keys: {k:?} is not a base64 X25519 public key"),
                )
            })?);
        }
        Some(super::seal::Seal::new(super::seal::SealConfig::new(
            settings.secret.as_ref().map(|s| s.expose()),
            trusted,
            private,
            &settings.net,
        )))
    } else {
        None
    };
    // A sealed datagram is longer by the seal's overhead: the mesh fills
    // less, so what goes on the wire stays within max_datagram.
    let max_datagram = settings.max_datagram
        - if seal.is_some() {
            super::seal::OVERHEAD
        } else {
            0
        };
    let seeds = resolve(&settings.seeds);
    let (me, loopback_fallback) = advertise(sock.socket().local_addr()?, &seeds);
    if me.ip().is_loopback() {
        // Hellos leave on loopback, where the other nodes of this host
        // listen for them (no route takes them anywhere else).
        socket2::SockRef::from(sock.socket()).set_multicast_if_v4(&Ipv4Addr::LOCALHOST)?;
    }
    let config = MeshConfig {
        net: settings.net.clone(),
        max_members: settings.max_members,
        max_interest: settings.max_interest,
        interest_rate: settings.interest_rate,
        max_datagram,
        probe_period: Duration::from_millis(settings.probe_ms),
        suspect_to_down: Duration::from_millis(settings.suspect_ms),
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
        best_effort: settings.best_effort.clone(),
        send_deadline: Duration::from_millis(settings.send_deadline_ms),
        splice: settings.splice,
        loopback_fallback,
        seal: seal.as_ref().map(|s| (s.identity(), s.counters())),
        tunnels: Mutex::new(crate::mesh_tunnel::Tunnels::new(
            crate::mesh_tunnel::LinkConfig {
                max_datagram,
                max_payload: broker.limits().max_payload,
                max_backlog: broker.limits().max_pending_bytes,
                link_bytes: settings.send_queue,
                link_policy: settings.send_policy,
                seed: 0,
            },
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
    // The node's own client for what other nodes publish: its counters
    // show the mesh's traffic in `skiff stats`.
    let mesh_client = broker.attach_mesh_client(format!("mesh:{me}"))?;
    let now = Instant::now();
    let (delivery, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    tokio::spawn(deliver(
        link.clone(),
        Arc::downgrade(broker),
        mesh_client,
        rx,
        queued.clone(),
    ));
    let driver = Driver {
        link: link.clone(),
        broker: Arc::downgrade(broker),
        delivery,
        queued,
        sock,
        scout,
        scouting: settings.scout,
        static_seeds: seeds,
        dns: settings.seeds_dns.clone(),
        started: now,
        next_hello: now,
        next_seal_tick: now,
        next_dns: now,
        recv: RecvBatch::new(RECV_SLOTS, 65_536),
        send: SendBatch::new(),
        seal,
        scratch: Vec::new(),
        events: Vec::new(),
        last_from: rustc_hash::FxHashMap::default(),
        scout_buf: vec![0u8; 2048],
    };
    let task = tokio::spawn(driver.run(stop));
    Ok((link, task))
}

/// The driver task's state.
struct Driver<L> {
    link: Arc<MeshLink>,
    broker: Weak<L>,
    /// Node frames on their way to the broker's delivery task, in order,
    /// with their bytes; `queued` counts the bytes not yet delivered.
    delivery: mpsc::UnboundedSender<(SocketAddr, Frames, usize)>,
    queued: Arc<AtomicUsize>,
    sock: AsyncUdpSocket,
    scout: Option<TokioUdpSocket>,
    scouting: bool,
    static_seeds: Vec<SocketAddr>,
    dns: Option<String>,
    started: Instant,
    next_hello: Instant,
    /// When the sealing layer's handshakes are next retried.
    next_seal_tick: Instant,
    next_dns: Instant,
    /// Datagrams are received into its arena and handed on as slices of
    /// it: frames reach the broker with no copy.
    recv: RecvBatch,
    send: SendBatch,
    /// Seals and opens every datagram between nodes, when the mesh has a
    /// secret or trusted keys.
    seal: Option<super::seal::Seal>,
    /// Each datagram from `poll_transmit`, on its way into `send`.
    scratch: Vec<u8>,
    /// When a batch of frames last came from each peer (where a gap
    /// begins if it dies).
    last_from: rustc_hash::FxHashMap<SocketAddr, Instant>,
    /// The mesh's events of one turn (kept for its allocation).
    events: Vec<MeshEvent>,
    scout_buf: Vec<u8>,
}

/// Bytes of node frames that may wait for local delivery before the mesh
/// task stops reading the reliable links (and drops best-effort datagrams).
const DELIVERY_BOUND: usize = 16 << 20;

/// Delivers what other nodes sent to local clients, in order, apart from
/// the mesh task: a local subscriber that is slow to read (policy `block`)
/// holds this task, never the mesh task, so the node goes on answering
/// probes, acknowledging and sending while it waits (before, such a
/// subscriber could get its whole node declared down by the mesh). Runs of
/// publishes go to the broker as one batch (one lock and one match per run
/// of the same subject, as for a client).
async fn deliver<L: Inbound>(
    link: Arc<MeshLink>,
    broker: Weak<L>,
    me: Arc<ClientOut>,
    mut rx: mpsc::UnboundedReceiver<(SocketAddr, Frames, usize)>,
    queued: Arc<AtomicUsize>,
) {
    let mut pubs: Vec<Bytes> = Vec::new();
    while let Some(first) = rx.recv().await {
        let Some(broker) = broker.upgrade() else {
            return;
        };
        let mut next = Some(first);
        let mut bytes = 0;
        // What is here now, up to a bound, before the run is flushed.
        let mut batches = 0;
        while let Some((from, frames, n)) = next.take() {
            bytes += n;
            batches += 1;
            for frame in frames {
                if frame.first() == Some(&op::PUB) {
                    pubs.push(frame);
                    continue;
                }
                publish_run(&link, &*broker, &me, &mut pubs).await;
                link.handle_frame(&*broker, from, frame);
            }
            if batches < 64 {
                next = rx.try_recv().ok();
            }
        }
        publish_run(&link, &*broker, &me, &mut pubs).await;
        let before = queued.fetch_sub(bytes, Relaxed);
        if before > DELIVERY_BOUND && before - bytes <= DELIVERY_BOUND {
            // The mesh task reads the links it left unread.
            link.wake.notify_one();
        }
    }
}

async fn publish_run<L: Inbound>(
    link: &MeshLink,
    broker: &L,
    me: &Arc<ClientOut>,
    pubs: &mut Vec<Bytes>,
) {
    if pubs.is_empty() {
        return;
    }
    let bad = broker.publish_remote(me, pubs).await;
    pubs.clear();
    if bad > 0 {
        link.counters.bad_frames.fetch_add(bad as u64, Relaxed);
    }
}

impl<L: Inbound> Driver<L> {
    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let l = self.link.clone();
        loop {
            let now = Instant::now();
            if self.scouting && now >= self.next_hello {
                self.hello(now).await;
            }
            if let Some(name) = self.dns.as_ref().filter(|_| now >= self.next_dns) {
                self.next_dns = now + Duration::from_secs(5);
                match tokio::net::lookup_host(name.as_str()).await {
                    Ok(addrs) => {
                        let me = l.id().addr;
                        let mut all: Vec<SocketAddr> = self.static_seeds.clone();
                        all.extend(addrs.filter(|a| a.is_ipv4() && *a != me));
                        l.core.lock().set_seeds(Instant::now(), &all);
                    }
                    Err(_) => {
                        l.counters.dns_errors.fetch_add(1, Relaxed);
                    }
                }
            }
            let deadline = self.deadline(now);
            let sleep = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline));
            tokio::select! {
                r = self.sock.recv(&mut self.recv) => {
                    if let Ok(n) = r {
                        self.take_received(n);
                    }
                }
                r = async {
                    match &self.scout {
                        Some(s) => s.recv_from(&mut self.scout_buf).await,
                        None => std::future::pending().await,
                    }
                } => {
                    if let Ok((n, from)) = r {
                        let d = &self.scout_buf[..n];
                        // A sealed mesh takes nothing plain but hellos.
                        if self.seal.is_none() || super::seal::is_plain_hello(d) {
                            let d = Bytes::copy_from_slice(d);
                            l.core.lock().handle_datagram(Instant::now(), from, d);
                        }
                    }
                }
                _ = sleep => {
                    self.take_waiting();
                    l.core.lock().handle_timeout(Instant::now());
                }
                _ = l.wake.notified() => {
                    // Only when timers are due this turn: a wake-up to
                    // send costs no extra receive call.
                    if Instant::now() >= deadline {
                        self.take_waiting();
                    }
                }
                _ = stop.changed() => {
                    tracing::info!("leaving the mesh");
                    l.core.lock().leave(Instant::now());
                    self.transmit().await;
                    return;
                }
            }
            let Some(broker) = self.broker.upgrade() else {
                return;
            };
            self.events(&*broker);
            let paused = self.queued.load(Relaxed) > DELIVERY_BOUND;
            let d = crate::mesh_tunnel::drive(&l, &*broker, paused);
            for (from, frames) in d.nodes {
                self.frames(from, frames, true);
            }
            for (peer, n) in d.lost {
                self.link_lost(peer, n, "its association failed");
            }
            for peer in d.failed {
                self.gap(&*broker, peer, "its link to this node failed");
            }
            drop(broker);
            self.transmit().await;
            l.room.notify_waiters();
        }
    }

    /// The earliest of the mesh's, the tunnels', the scouting and the DNS
    /// deadlines.
    fn deadline(&self, now: Instant) -> Instant {
        let mut d = self
            .link
            .core
            .lock()
            .poll_timeout()
            .unwrap_or(now + Duration::from_secs(1));
        if self.scouting {
            d = d.min(self.next_hello);
        }
        if self.dns.is_some() {
            d = d.min(self.next_dns);
        }
        if self.seal.as_ref().is_some_and(|s| s.waiting()) {
            d = d.min(self.next_seal_tick);
        }
        crate::mesh_tunnel::deadline(&self.link, d)
    }

    /// Sends a scouting hello to the multicast group (each second for ten
    /// seconds, then every five).
    async fn hello(&mut self, now: Instant) {
        self.link.core.lock().hello(&mut self.scratch);
        let mut one = SendBatch::new();
        one.push(SCOUT_GROUP, &self.scratch);
        match self.sock.send_batch(&mut one).await {
            Ok(s) if s.refused == 0 => {}
            _ => {
                self.link.counters.scout_errors.fetch_add(1, Relaxed);
            }
        }
        let every = if now - self.started < Duration::from_secs(10) {
            1
        } else {
            5
        };
        self.next_hello = now + Duration::from_secs(every);
    }

    /// Hands on whatever datagrams already wait on the socket (none is
    /// waited for). A turn woken by a deadline or the broker reads them
    /// before the timers act: a task that ran late (a loaded machine) may
    /// find both its deadline passed and the acknowledgements that make
    /// it moot waiting, and an association whose retransmission timer
    /// fired with them unread would send its whole flight again.
    fn take_waiting(&mut self) {
        if let Ok(n) = self.sock.socket().recv(&mut self.recv) {
            self.take_received(n);
        }
    }

    /// Hands what the last receive took (`n` buffers), and whatever else
    /// is already queued on the socket, to the mesh under one lock.
    fn take_received(&mut self, mut n: usize) {
        let mut m = self.link.core.lock();
        let now = Instant::now();
        for call in 1..=RECV_CALLS {
            for r in self.recv.drain() {
                let from = r.from;
                for d in r.into_datagrams() {
                    match &mut self.seal {
                        None => m.handle_datagram(now, from, d),
                        Some(seal) => {
                            if let Some(plain) = seal.open(now, from, &d) {
                                m.handle_datagram(now, from, Bytes::from(plain));
                            }
                        }
                    }
                }
            }
            // Another receive only if the last one filled every slot (the
            // socket may hold more) and this turn will hand it on.
            if n < RECV_SLOTS || call == RECV_CALLS {
                break;
            }
            match self.sock.socket().recv(&mut self.recv) {
                Ok(k) => n = k,
                Err(_) => break,
            }
        }
    }

    /// Takes the mesh's events to the broker and the tunnels.
    fn events(&mut self, broker: &L) {
        let link = self.link.clone();
        let l = &*link;
        let mut events = std::mem::take(&mut self.events);
        {
            let mut m = l.core.lock();
            while let Some(e) = m.poll_event() {
                events.push(e);
            }
        }
        for e in events.drain(..) {
            match e {
                MeshEvent::Frames { from, frames } => self.frames(from, frames, false),
                MeshEvent::Cluster {
                    peer,
                    cluster,
                    capacity,
                } => broker.remote_cluster(peer, &cluster, capacity),
                MeshEvent::Down(id) => {
                    if let Some(s) = &mut self.seal {
                        s.forget(id.addr);
                    }
                    crate::logging::counted();
                    tracing::warn!(peer = %id.addr, generation = id.gen, "mesh member down");
                    broker.remote_down(id.addr);
                    let n = crate::mesh_tunnel::peer_down(l, broker, id.addr);
                    self.link_lost(id.addr, n, "it went down");
                    self.gap(broker, id.addr, "it went down");
                }
                MeshEvent::Rejoined(id) => {
                    crate::logging::counted();
                    tracing::warn!(generation = id.gen, "this node was declared down by the mesh (it did not answer probes in time) and rejoined; its links to peers restart");
                    crate::mesh_tunnel::restart_links(l, broker);
                }
                MeshEvent::Suspect(id) => {
                    crate::logging::counted();
                    tracing::warn!(peer = %id.addr, generation = id.gen, "mesh member suspected down (not answering probes)");
                }
                MeshEvent::Up(id) => {
                    tracing::info!(peer = %id.addr, generation = id.gen, "mesh member up");
                    if let Some(mtu) = path_mtu(id.addr) {
                        // Sealed datagrams are longer by the seal's
                        // overhead: the mesh and the tunnels fill that
                        // much less.
                        let seal = if self.seal.is_some() {
                            super::seal::OVERHEAD
                        } else {
                            0
                        };
                        let mtu = mtu.saturating_sub(seal);
                        l.tunnels.lock().set_path_mtu(id.addr, mtu);
                        l.core.lock().set_path_mtu(id.addr, mtu);
                    }
                }
                MeshEvent::Assoc { from, packet } => {
                    l.tunnels.lock().handle_packet(Instant::now(), from, packet)
                }
            }
        }
        self.events = events;
    }

    /// The frames of one batch from `from` (a datagram, or a reliable
    /// link's message), handed to the delivery task. Past
    /// [`DELIVERY_BOUND`] bytes waiting there, a best-effort datagram's are
    /// dropped and counted (reliable links are not read meanwhile: see
    /// `drive`).
    fn frames(&mut self, from: SocketAddr, frames: Frames, reliable: bool) {
        self.last_from.insert(from, Instant::now());
        let n = frames.byte_len();
        if !reliable && self.queued.load(Relaxed) > DELIVERY_BOUND {
            let dropped = frames.count() as u64;
            self.link
                .counters
                .delivery_dropped
                .fetch_add(dropped, Relaxed);
            self.link.note(format_args!(
                "local delivery is behind by more than {DELIVERY_BOUND} bytes: best-effort messages from node {from} dropped (counted in `skiff stats --mesh`)"
            ));
            return;
        }
        self.queued.fetch_add(n, Relaxed);
        // The delivery task ends only after this task: the send succeeds.
        let _ = self.delivery.send((from, frames, n));
    }

    /// Messages from `peer` may be missing (it went down, its link
    /// failed): local subscribers are told, if it had sent any.
    fn gap(&mut self, broker: &L, peer: SocketAddr, why: &str) {
        let Some(last) = self.last_from.remove(&peer) else {
            return;
        };
        self.link.counters.gaps.fetch_add(1, Relaxed);
        broker.remote_gap(peer, last.elapsed(), why);
    }

    /// `n` frames to `peer` may not have arrived: counted and told.
    fn link_lost(&self, peer: SocketAddr, n: u64, why: &str) {
        if n == 0 {
            return;
        }
        self.link.counters.link_lost.fetch_add(n, Relaxed);
        self.link.note(format_args!(
            "up to {n} frame(s) to node {peer} may not have arrived: {why}"
        ));
    }

    /// Sends every datagram the mesh has, in as few system calls as the
    /// socket allows.
    async fn transmit(&mut self) {
        {
            let mut m = self.link.core.lock();
            let now = Instant::now();
            while let Some(t) = m.poll_transmit(now, &mut self.scratch) {
                let send = &mut self.send;
                match &mut self.seal {
                    None if t.alone => send.push_alone(t.destination, &self.scratch),
                    None => send.push(t.destination, &self.scratch),
                    Some(seal) => seal.seal(now, t.destination, &self.scratch, |to, d| {
                        if t.alone {
                            send.push_alone(to, d)
                        } else {
                            send.push(to, d)
                        }
                    }),
                }
            }
        }
        if let Some(seal) = &mut self.seal {
            let now = Instant::now();
            if now >= self.next_seal_tick {
                seal.handle_timeout(now);
                self.next_seal_tick = now + Duration::from_millis(100);
            }
            while let Some((to, d)) = seal.poll_transmit() {
                self.send.push_alone(to, &d);
            }
        }
        if self.send.is_empty() {
            return;
        }
        let errors = match self.sock.send_batch(&mut self.send).await {
            Ok(sent) => sent.refused,
            Err(_) => {
                let n = self.send.len();
                self.send.clear();
                n
            }
        };
        if errors > 0 {
            self.link
                .counters
                .send_errors
                .fetch_add(errors as u64, Relaxed);
        }
    }
}

/// The address peers reach this node at: the bound one, or for a wildcard
/// bind the local address of the route to the first seed (or to the
/// scouting group), else loopback (then `true`: the caller says so).
fn advertise(bound: SocketAddr, seeds: &[SocketAddr]) -> (SocketAddr, bool) {
    if !bound.ip().is_unspecified() {
        return (bound, false);
    }
    let probe = seeds.first().copied().unwrap_or(SCOUT_GROUP);
    let ip = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| {
            s.connect(probe)?;
            s.local_addr()
        })
        .map(|a| a.ip())
        .ok()
        .filter(|ip| !ip.is_unspecified());
    match ip {
        Some(ip) => (SocketAddr::new(ip, bound.port()), false),
        None => (
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), bound.port()),
            true,
        ),
    }
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

fn scout_socket() -> std::io::Result<TokioUdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.bind(&SocketAddr::from(([0, 0, 0, 0], SCOUT_GROUP.port())).into())?;
    let IpAddr::V4(g) = SCOUT_GROUP.ip() else {
        unreachable!()
    };
    // On the interface of the default route, where hellos of nodes with a
    // routable identity arrive, and on loopback, where those of nodes that
    // took 127.0.0.1 as identity do (a host with no route at all has only
    // the latter).
    let any = s.join_multicast_v4(&g, &Ipv4Addr::UNSPECIFIED);
    let lo = s.join_multicast_v4(&g, &Ipv4Addr::LOCALHOST);
    if let (Err(e), Err(_)) = (any, lo) {
        return Err(e);
    }
    s.set_multicast_loop_v4(true)?;
    s.set_nonblocking(true)?;
    TokioUdpSocket::from_std(s.into())
}
