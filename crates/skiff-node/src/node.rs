//! A running node: its state ([`Broker`]) and its front ends, each
//! started from the [`Config`] by [`Node::start`]: TCP and Unix-socket
//! listeners (`listen::stream`), the shared-memory listener
//! ([`crate::listen::shm`]), the mesh ([`crate::mesh`]), and in-process
//! clients ([`crate::listen::mem`], what `mem://` uses); then graceful
//! shutdown.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::broker::{Broker, Fatal};
use crate::config::Config;
use crate::listen::mem::{refusal, MemLink};
use crate::listen::shm::ShmListener;
use crate::listen::stream;
use skiff::client::embed::{LocalLink, LocalNode, Refusal};
use skiff::spin::Spin;
use skiff_proto::client_frame::Code;

/// Descriptors a node keeps for other than its clients (listeners, the
/// mesh, shared memory, the runtime, files).
pub const FD_RESERVE: u64 = 32;

/// Raises this process's soft limit on open files to its hard limit;
/// returns the soft limit then in force, `None` if it cannot be read.
fn raise_nofile_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the `rlimit`
    // passed, a valid local that outlives the calls.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return None;
        }
        if r.rlim_cur < r.rlim_max {
            let up = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &up) == 0 {
                r = up;
            }
        }
    }
    // `rlim_t` is u64 on Linux, not on every Unix.
    #[allow(clippy::useless_conversion)]
    Some(u64::try_from(r.rlim_cur).unwrap_or(u64::MAX))
}

/// Has the C allocator return the free pages inside its arenas to the
/// system: after many clients left, what their buffers took is given back
/// instead of staying in the node's resident memory.
fn trim_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// How often the node looks whether clients left (and trims, if so).
const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// The most clients the open-file limit leaves room for (raising the
/// soft limit to the hard one first), `None` if it cannot be read.
pub(crate) fn connection_room() -> Option<usize> {
    raise_nofile_limit().map(|fds| (fds.saturating_sub(FD_RESERVE) as usize).max(1))
}

/// A running node: its listeners and connections run as tokio tasks on the
/// runtime that started it.
#[derive(Debug)]
pub struct Node {
    broker: Arc<Broker>,
    tcp: Option<SocketAddr>,
    unix: Option<PathBuf>,
    shm: Option<ShmListener>,
    nats: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    tasks: Option<tokio::task::JoinHandle<()>>,
    /// The wake-up latency request held while the node lives.
    wake: Option<crate::wake::WakeLatency>,
    /// Polls after traffic (setting `spin_us`).
    spin: Option<Arc<Spin>>,
    /// Whether the TCP listener speaks TLS.
    tls: bool,
    /// What `/healthz` reports, and the monitoring listener's address.
    health: Arc<crate::monitor::Health>,
    monitor: Option<SocketAddr>,
    /// Stops the monitoring listener: after the drain, so `/healthz`
    /// answers 503 during it.
    monitor_stop: watch::Sender<bool>,
}

impl Node {
    /// A node with no listeners, for in-process clients only (`mem://`),
    /// which are trusted: `[auth]` applies to listeners only.
    /// Needs no runtime until a client uses it.
    pub fn embedded(config: &Config) -> Node {
        Node::with_broker(Broker::new(config.limits.clone()))
    }

    fn with_broker(broker: Broker) -> Node {
        let (stop, _) = watch::channel(false);
        let (monitor_stop, _) = watch::channel(false);
        Node {
            broker: Arc::new(broker),
            tcp: None,
            unix: None,
            shm: None,
            nats: None,
            stop,
            tasks: None,
            wake: None,
            spin: None,
            tls: false,
            health: Arc::new(crate::monitor::Health::default()),
            monitor: None,
            monitor_stop,
        }
    }

    /// Binds the listeners named in `config` and starts serving on the
    /// current tokio runtime. A TCP port of 0 picks a free port (see
    /// [`Node::tcp_addr`]). With `wake_latency_us` set, fails if the
    /// request cannot be held (it needs root): a setting asked for is not
    /// silently dropped.
    ///
    /// Raises the soft limit on open files to the hard one, and lowers
    /// `max_connections` below what the limit leaves ([`FD_RESERVE`] kept
    /// for listeners, the mesh and files): a client past it is then
    /// refused with an error, where a node out of descriptors could not
    /// even accept it.
    pub async fn start(config: &Config) -> io::Result<Node> {
        let mut capped;
        let mut config = config;
        if let Some(fds) = raise_nofile_limit() {
            let room = (fds.saturating_sub(FD_RESERVE) as usize).max(1);
            if config.limits.max_connections > room {
                capped = config.clone();
                capped.limits.max_connections = room;
                config = &capped;
            }
        }
        let auth = crate::auth::Auth::new(&config.auth)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let mut node = Node::with_broker(Broker::with_auth(config.limits.clone(), Arc::new(auth)));
        crate::monitor::log_start(config);
        let mut set = JoinSet::new();
        // The monitor first: `/healthz` says 503 until the rest is up.
        if let Some(addr) = config.monitor {
            let l = TcpListener::bind(addr)
                .await
                .map_err(|e| io::Error::new(e.kind(), format!("monitor {addr}: {e}")))?;
            let a = l.local_addr()?;
            node.monitor = Some(a);
            tracing::info!(addr = %a, "listening: monitor (http)");
            set.spawn(crate::monitor::serve(
                l,
                crate::monitor::Monitor::new(node.broker.clone(), node.health.clone(), config),
                node.monitor_stop.subscribe(),
            ));
        }
        if let Some(us) = config.wake_latency_us {
            node.wake = Some(crate::wake::WakeLatency::request(us).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("wake_latency_us={us}: {e} (needs root; unset the setting to run without it)"),
                )
            })?);
        }
        let spin = Spin::start(Duration::from_micros(config.spin_us));
        node.spin = spin.clone();
        let tls = match (&config.tls_cert, &config.tls_key) {
            (Some(cert), Some(key)) => {
                let c = skiff::tls::server_config(cert, key, config.tls_ca.as_deref())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                Some(tokio_rustls::TlsAcceptor::from(c))
            }
            (None, None) if config.tls_ca.is_none() => None,
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "TLS needs both tls_cert and tls_key (tls_ca only with them)",
                ))
            }
        };
        node.tls = tls.is_some();
        let nats_tls = match (config.nats_tls, &tls) {
            (crate::config::NatsTls::Off, _) => None,
            (mode, Some(acceptor)) => Some(crate::listen::nats::NatsTlsSetup {
                mode,
                acceptor: acceptor.clone(),
                verify: config.tls_ca.is_some(),
            }),
            (_, None) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "nats_tls needs the node's tls_cert and tls_key",
                ))
            }
        };
        if let Some(addr) = config.tcp {
            let l = TcpListener::bind(addr)
                .await
                .map_err(|e| io::Error::new(e.kind(), format!("listen on tcp {addr}: {e}")))?;
            node.tcp = Some(l.local_addr()?);
            tracing::info!(addr = %l.local_addr()?, "listening: clients over tcp");
            set.spawn(stream::accept_tcp(
                l,
                node.broker.clone(),
                node.stop.subscribe(),
                spin.clone(),
                tls,
            ));
        }
        if let Some(path) = &config.unix {
            // A stale socket file from a previous run would make bind fail.
            if std::fs::symlink_metadata(path).is_ok_and(|m| {
                use std::os::unix::fs::FileTypeExt;
                m.file_type().is_socket()
            }) {
                let _ = std::fs::remove_file(path);
            }
            let l = UnixListener::bind(path).map_err(|e| {
                io::Error::new(e.kind(), format!("listen on unix {}: {e}", path.display()))
            })?;
            node.unix = Some(path.clone());
            tracing::info!(path = %path.display(), "listening: clients over a unix socket");
            set.spawn(stream::accept_unix(
                l,
                node.broker.clone(),
                node.stop.subscribe(),
                spin.clone(),
            ));
        }
        if let Some(loc) = &config.shm {
            let l = ShmListener::start(node.broker.clone(), loc)
                .map_err(|e| io::Error::other(format!("shm {loc}: {e}")))?;
            tracing::info!(locator = %loc, dir = %l.dir().display(), "listening: clients over shared memory");
            node.shm = Some(l);
        }
        if let Some(addr) = config.nats {
            let l = TcpListener::bind(addr)
                .await
                .map_err(|e| io::Error::new(e.kind(), format!("nats {addr}: {e}")))?;
            let addr = l.local_addr()?;
            node.nats = Some(addr);
            let this = Arc::new(crate::listen::nats::NatsListener {
                broker: node.broker.clone(),
                addr,
                server_id: crate::listen::nats::server_id(),
                spin: spin.clone(),
                tls: nats_tls,
            });
            set.spawn(crate::listen::nats::accept(l, this, node.stop.subscribe()));
        }
        if !node.broker.auth().enabled() {
            let what = if node.tls { "tls" } else { "tcp" };
            for (what, a) in [(what, node.tcp), ("nats", node.nats)] {
                if let Some(a) = a.filter(|a| !a.ip().is_loopback()) {
                    node.broker.warn(format!(
                        "listening on {what} {a}, beyond loopback, without authentication: \
                         anyone who reaches it can publish, subscribe to everything and answer \
                         requests (set a token with --auth-token or SKIFF_TOKEN, or users in [auth])"
                    ));
                }
            }
        }
        if let Some(m) = config
            .mesh
            .as_ref()
            .filter(|m| m.secret.is_none() && m.trusted_keys.is_empty())
        {
            node.broker.warn(format!(
                "the mesh on udp {} is not authenticated or encrypted: any host that reaches it \
                 with the network name can join, read and inject messages (set mesh_secret or \
                 mesh_trusted_keys)",
                m.bind
            ));
        }
        if let Some(m) = &config.mesh {
            let (link, task) = crate::mesh::start(m, &node.broker, node.stop.subscribe())
                .await
                .map_err(|e| io::Error::new(e.kind(), format!("mesh on udp {}: {e}", m.bind)))?;
            let v = link.view();
            tracing::info!(me = %v.me, net = %v.net, seeds = ?m.seeds, seeds_dns = ?m.seeds_dns, scout = m.scout, "joining the mesh");
            set.spawn(async move {
                let _ = task.await;
            });
        }
        for sink in &config.log {
            let client = skiff::client::Client::attach(&node)
                .map_err(|e| io::Error::other(format!("log sink: {e}")))?;
            let running = crate::logsink::open(client, sink).await?;
            set.spawn(crate::logsink::run(running));
        }
        set.spawn(crate::monitor::watchdog(
            node.broker.clone(),
            node.stop.subscribe(),
        ));
        node.health.set_listening(config.mesh.as_ref());
        node.tasks = Some(tokio::spawn(async move {
            while set.join_next().await.is_some() {}
        }));
        Ok(node)
    }

    /// The wake-up latency the node holds (see [`crate::wake`]), in µs.
    pub fn wake_latency_us(&self) -> Option<u32> {
        self.wake.as_ref().map(crate::wake::WakeLatency::micros)
    }

    /// Whether the TCP listener speaks TLS (clients use `tls://`).
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The monitoring listener's address (`--monitor`).
    pub fn monitor_addr(&self) -> Option<SocketAddr> {
        self.monitor
    }

    /// The TCP address the node listens on.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp
    }

    /// The address the NATS listener listens on, when it has one.
    pub fn nats_addr(&self) -> Option<SocketAddr> {
        self.nats
    }

    /// The node's mesh address, when it is part of a mesh.
    pub fn mesh_addr(&self) -> Option<SocketAddr> {
        self.broker.mesh().map(|m| m.id().addr)
    }

    /// The Unix socket path the node listens on.
    pub fn unix_path(&self) -> Option<&std::path::Path> {
        self.unix.as_deref()
    }

    /// The node's shared-memory listener, when it has one.
    pub fn shm(&self) -> Option<&ShmListener> {
        self.shm.as_ref()
    }

    /// The node's state (for stats and tests).
    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    /// Attaches an in-process client.
    pub fn attach_mem(&self) -> Result<MemLink, Fatal> {
        MemLink::attach(self.broker.clone())
    }

    /// Graceful shutdown: stops accepting clients and reading from them,
    /// waits (up to the configured drain timeout) until everything queued
    /// for them has been handed to their connections, then closes every
    /// client with a `shutdown` error frame.
    pub async fn shutdown(mut self) {
        let limits = self.broker.limits();
        tracing::info!(
            clients = self.broker.client_count(),
            drain_timeout_ms = limits.drain_timeout_ms,
            "shutting down: refusing new clients, draining queues, leaving the mesh"
        );
        self.health.set_stopping();
        self.broker.begin_shutdown();
        let _ = self.stop.send(true);
        let deadline = tokio::time::Instant::now() + self.broker.limits().drain_timeout();
        while !self.broker.drained() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if self.broker.drained() {
            tracing::info!("queues drained");
        } else {
            let pending: usize = self
                .broker
                .stats()
                .clients
                .iter()
                .map(|c| c.pending_bytes)
                .sum();
            crate::logging::counted();
            tracing::warn!(
                pending_bytes = pending,
                drain_timeout_ms = limits.drain_timeout_ms,
                "drain deadline passed: closing clients with bytes still queued"
            );
        }
        self.broker
            .close_all(Code::Shutdown, "the node is shutting down");
        let _ = self.monitor_stop.send(true);
        if let Some(t) = self.tasks.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
        }
        if let Some(p) = &self.unix {
            let _ = std::fs::remove_file(p);
        }
        tracing::info!("stopped");
    }
}

/// Runs a node from `config` as the host's daemon: on a tokio runtime of
/// [`Config::workers`] threads, until SIGINT or SIGTERM, then shuts it
/// down gracefully ([`Node::shutdown`]). `ready` is called once the node
/// serves (to say where), `stopping` when a signal arrives.
pub fn run_until_signal(
    config: &Config,
    ready: impl FnOnce(&Node),
    stopping: impl FnOnce(),
) -> io::Result<()> {
    run_with_reload(config, None, ready, stopping)
}

/// Rebuilds the configuration for a reload: rereads the file and applies
/// what overrides it (environment, flags), as at start.
pub type ConfigSource = Box<dyn Fn() -> Result<Config, crate::ConfigError> + Send + Sync>;

/// [`run_until_signal`], and on SIGHUP (or a client's `Reload` frame,
/// `skiff reload`) rebuilds the configuration from `source` and applies
/// what can change while the node runs ([`crate::reload`]). A second
/// SIGINT or SIGTERM during the graceful shutdown exits at once.
pub fn run_with_reload(
    config: &Config,
    source: Option<ConfigSource>,
    ready: impl FnOnce(&Node),
    stopping: impl FnOnce(),
) -> io::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.workers())
        .enable_all()
        .build()?
        .block_on(async move {
            use tokio::signal::unix::{signal, SignalKind};
            // Handlers first: a signal right after `ready` must shut down
            // gracefully, not kill the process.
            let mut term = signal(SignalKind::terminate())?;
            let mut int = signal(SignalKind::interrupt())?;
            let mut hup = signal(SignalKind::hangup())?;
            let node = Node::start(config).await?;
            let reload = source.map(|s| {
                // What runs: the limits as the node capped them.
                let mut running = config.clone();
                running.limits = (*node.broker.limits()).clone();
                let r = Arc::new(crate::reload::Reloader::new(s, running, node.broker.clone()));
                let r2 = r.clone();
                node.broker.set_reloader(Box::new(move || r2.reload()));
                r
            });
            ready(&node);
            let mut tick = tokio::time::interval(TRIM_EVERY);
            let mut left = node.broker().clients_left();
            let why = loop {
                tokio::select! {
                    _ = int.recv() => break "SIGINT",
                    _ = term.recv() => break "SIGTERM",
                    _ = hup.recv() => match &reload {
                        Some(r) => {
                            tracing::info!("SIGHUP: reloading the configuration");
                            let _ = r.reload();
                        }
                        None => {
                            crate::logging::counted();
                            tracing::warn!("SIGHUP: this node has no configuration file to reload (started without --config)");
                        }
                    },
                    _ = tick.tick() => {
                        let now = node.broker().clients_left();
                        if now != left {
                            left = now;
                            let _ = tokio::task::spawn_blocking(trim_freed_memory).await;
                        }
                    }
                }
            };
            tracing::info!(signal = why, "signal received");
            stopping();
            let shutdown = node.shutdown();
            tokio::pin!(shutdown);
            tokio::select! {
                _ = &mut shutdown => {}
                _ = int.recv() => exit_now("SIGINT"),
                _ = term.recv() => exit_now("SIGTERM"),
            }
            Ok(())
        })
}

/// A second signal during the graceful shutdown: exit without waiting.
fn exit_now(signal: &str) -> ! {
    tracing::warn!(signal, "second signal during shutdown: exiting at once");
    std::process::exit(1)
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(s) = &self.spin {
            s.close();
        }
        let _ = self.stop.send(true);
        let _ = self.monitor_stop.send(true);
        self.broker
            .close_all(Code::Shutdown, "the node was dropped");
    }
}

impl LocalNode for Node {
    fn attach(&self) -> Result<Box<dyn LocalLink>, Refusal> {
        Ok(Box::new(self.attach_mem().map_err(refusal)?))
    }
}
