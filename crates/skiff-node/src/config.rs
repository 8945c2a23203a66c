//! The node's configuration: where it listens and the limits it enforces,
//! from a TOML file, then `SKIFF_*` environment variables, then flags (each
//! overrides the one before).
//!
//! ```toml
//! tcp = "127.0.0.1:4747"        # "" to not listen on TCP
//! unix = "/tmp/skiff.sock"      # optional
//! shm = "shm://skiff"           # optional: clients of this host over shared memory
//! nats = "127.0.0.1:4222"       # optional: NATS clients (a host alone: port 4222)
//! wake_latency_us = 0           # optional: keep idle CPUs this quick to wake (see `wake`)
//! workers = 1                   # optional: threads serving clients (default: CPUs - 1)
//! spin_us = 100                 # poll this long after traffic before sleeping (0: off; see `spin`)
//! log_level = "info"            # level or RUST_LOG-style directives (default: $RUST_LOG, else info)
//! log_format = "text"           # or "json": one object per line
//! monitor = "127.0.0.1:8222"    # optional: the HTTP monitoring listener (docs/monitoring.md)
//! [limits]
//! max_subject = 256             # bytes
//! max_payload = 1048576         # bytes
//! max_subscriptions = 10000     # per client
//! max_pending_bytes = 16777216  # queued for one client, bytes
//! max_total_pending_bytes = 0   # held for all clients together (default: half the memory; 0: no budget)
//! max_connections = 65536
//! max_requests = 65536          # requests in flight per client
//! drain_timeout_ms = 2000       # graceful shutdown
//! read_timeout_ms = 10000       # floor of the time a begun frame has to arrive
//! ping_interval_ms = 120000     # ping a client silent this long (0: never)
//! max_pings_out = 2             # close it after this many unanswered
//! max_connections_per_ip = 0    # TCP clients from one address (0: no limit)
//! max_connection_rate = 0       # TCP connection attempts accepted per second (0: no limit)
//! tls_cert = "node.pem"         # optional: the TCP listener speaks TLS 1.3 only
//! tls_key = "node.key"
//! tls_ca = "clients-ca.pem"     # optional: require client certificates (mutual TLS)
//! nats_tls = "required"         # optional: TLS on the NATS port with the node's certificate
//!                               # (off, required, optional, handshake_first; see `NatsTls`)
//! write_deadline_ms = 10000     # a NATS client taking nothing this long is a slow consumer
//! [auth]                        # optional: see `crate::auth` (SKIFF_TOKEN, --auth-token)
//! token = "…"
//! [[log]]                       # optional, repeatable: a log file many clients write (`crate::logsink`)
//! pattern = "logs.>"
//! path = "/var/log/skiff/app.log"
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::auth::{AuthConfig, Secret};
use crate::mesh::MeshSettings;

/// What a node enforces. Every limit is reported when reached: the client
/// gets an error frame with [`crate::Code::Limit`] that names it, and the
/// node counts it in its stats.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Longest subject or pattern, in bytes.
    pub max_subject: usize,
    /// Largest payload, in bytes.
    pub max_payload: usize,
    /// Most subscriptions one client may hold.
    pub max_subscriptions: usize,
    /// Most bytes of messages queued in the node for one client; past it the
    /// subscription's policy applies as if its queue were full. Default
    /// 16 MiB: it bounds the node's memory per slow client, and a larger
    /// queue does not move more (`bench/RESULTS.md` has the runs).
    pub max_pending_bytes: usize,
    /// Most bytes held in the node for all clients together: what is
    /// queued for them and receive buffers grown for large frames (0: no
    /// budget). Past it, no client may queue more than it already holds
    /// (as if over its own bound), a client whose frame needs more buffer
    /// is closed with an error naming it, and new clients are refused.
    /// Default: half the machine's memory ([`default_total_pending`]), so
    /// that hostile clients together cannot get the node killed for memory.
    pub max_total_pending_bytes: usize,
    /// Most clients at once (TCP, Unix and in-process together). A node
    /// with listeners lowers it below its file-descriptor limit at start,
    /// so that a client past it is refused with an error, not left waiting.
    pub max_connections: usize,
    /// Most requests one client may have awaiting replies.
    pub max_requests: usize,
    /// How long a graceful shutdown waits for queues to drain, in ms.
    pub drain_timeout_ms: u64,
    /// Least time, in ms, a stream client has to send the rest of a frame
    /// it has begun; a large frame gets more, at [`MIN_READ_RATE`]. Past
    /// it the client is closed with an error naming it: a sender that
    /// stops mid-frame holds no buffer for long.
    pub read_timeout_ms: u64,
    /// A stream client the node has read nothing from for this long, in
    /// ms, is sent a `Ping` (any frame answers it); 0: never.
    pub ping_interval_ms: u64,
    /// Pings left unanswered after which the client is closed with an
    /// error naming these settings (nats-server's `max_pings_out`).
    pub max_pings_out: u32,
    /// Most clients at once from one source address over TCP (0: no
    /// limit beyond `max_connections`).
    pub max_connections_per_ip: usize,
    /// Most TCP connection attempts the node accepts per second (0: no
    /// limit); past it a connection is closed at once, before any
    /// handshake (a flood costs the node no TLS or argon2 work).
    pub max_connection_rate: u32,
    /// How long, in ms, a NATS client may take no bytes while the node
    /// has some for it before it is closed as a slow consumer
    /// (nats-server's `write_deadline`); 0: no deadline.
    pub write_deadline_ms: u64,
}

/// The default of `max_total_pending_bytes`: half the machine's physical
/// memory, or 1 GiB where that cannot be read.
pub fn default_total_pending() -> usize {
    // SAFETY: sysconf reads a system setting; it takes no pointers.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    match (usize::try_from(pages), usize::try_from(page)) {
        (Ok(n), Ok(p)) if n > 0 && p > 0 => n.saturating_mul(p) / 2,
        _ => 1 << 30,
    }
}

/// The slowest rate, in bytes per second, a client may send a frame at
/// (above the `read_timeout_ms` floor).
pub const MIN_READ_RATE: u64 = 64 * 1024;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_subject: 256,
            max_payload: 1 << 20,
            max_subscriptions: 10_000,
            max_pending_bytes: 16 << 20,
            max_total_pending_bytes: default_total_pending(),
            max_connections: 65_536,
            max_requests: 65_536,
            drain_timeout_ms: 2_000,
            read_timeout_ms: 10_000,
            ping_interval_ms: 120_000,
            max_pings_out: 2,
            max_connections_per_ip: 0,
            max_connection_rate: 0,
            write_deadline_ms: 10_000,
        }
    }
}

impl Limits {
    /// How long a graceful shutdown waits for queues to drain.
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_millis(self.drain_timeout_ms)
    }

    /// How long a frame of `len` bytes, once begun, may take to arrive:
    /// `read_timeout_ms`, plus the time to send `len` at [`MIN_READ_RATE`].
    pub fn frame_deadline(&self, len: usize) -> Duration {
        Duration::from_millis(self.read_timeout_ms)
            + Duration::from_millis(len as u64 * 1000 / MIN_READ_RATE)
    }
}

/// The NATS listener's port when only a host is given (the port NATS
/// clients expect).
pub const NATS_PORT: u16 = 4222;

/// How the NATS listener speaks TLS, as nats-server does on its client
/// port. Every mode but `Off` needs the node's `tls_cert` and `tls_key`
/// (and with `tls_ca`, clients must present a certificate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NatsTls {
    /// Plaintext only.
    #[default]
    Off,
    /// `INFO` in plaintext says `tls_required`; the client then starts
    /// TLS on the same connection, and everything after is encrypted. A
    /// client that sends plaintext instead is told
    /// `-ERR 'Secure Connection - TLS Required'` and closed.
    Required,
    /// `INFO` says `tls_available`: the client may start TLS or go on in
    /// plaintext (nats-server's `allow_non_tls`).
    Optional,
    /// TLS from the first byte, `INFO` after it (nats-server's
    /// `handshake_first`; clients must be configured for it).
    HandshakeFirst,
}

impl NatsTls {
    /// Parses a setting's value.
    pub fn parse(v: &str) -> Option<NatsTls> {
        Some(match v {
            "" | "off" | "none" | "false" | "no" => NatsTls::Off,
            "on" | "true" | "yes" | "required" => NatsTls::Required,
            "optional" | "available" => NatsTls::Optional,
            "handshake_first" | "first" => NatsTls::HandshakeFirst,
            _ => return None,
        })
    }
}

/// The largest `spin_us` accepted: a second of polling is already far past
/// any use.
const MAX_SPIN_US: u64 = 1_000_000;
const SPIN_US_EXPECTED: &str = "a whole number of µs from 0 (off) to 1000000";

/// Every name [`Config::set`] takes, one per line (also `SKIFF_<NAME>`).
const SETTINGS: &[&str] = &[
    "token",
    "auth_timeout_ms",
    "tls_cert",
    "tls_key",
    "tls_ca",
    "mesh_secret",
    "mesh_identity",
    "mesh_trusted_keys",
    "tcp",
    "unix",
    "shm",
    "nats",
    "nats_tls",
    "wake_latency_us",
    "workers",
    "spin_us",
    "log_level",
    "log_format",
    "monitor",
    "mesh",
    "net",
    "seeds",
    "seeds_dns",
    "scout",
    "max_members",
    "max_interest",
    "interest_rate",
    "send_queue",
    "send_policy",
    "send_deadline_ms",
    "probe_ms",
    "suspect_ms",
    "best_effort",
    "splice",
    "max_subject",
    "max_payload",
    "max_subscriptions",
    "max_pending_bytes",
    "max_total_pending_bytes",
    "max_connections",
    "max_requests",
    "drain_timeout_ms",
    "read_timeout_ms",
    "ping_interval_ms",
    "max_pings_out",
    "max_connections_per_ip",
    "max_connection_rate",
    "write_deadline_ms",
];

/// A node's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// TCP address to listen on; `None` for no TCP listener.
    pub tcp: Option<SocketAddr>,
    /// Unix socket path to listen on; `None` for none.
    pub unix: Option<PathBuf>,
    /// Shared-memory listener for clients of this host (`shm://name`, with
    /// the options of `skiff::shm::host::HostSocket::bind`); `None` for
    /// none.
    pub shm: Option<String>,
    /// Address of the NATS client protocol listener (`nats = "host:port"`;
    /// a host alone takes port [`NATS_PORT`]); `None` for none.
    pub nats: Option<SocketAddr>,
    /// Whether and how the NATS listener speaks TLS (with the node's
    /// `tls_cert` and `tls_key`, and `tls_ca` for client certificates).
    pub nats_tls: NatsTls,
    /// Limits.
    pub limits: Limits,
    /// The mesh (`[mesh]`); `None`: a standalone node.
    pub mesh: Option<MeshSettings>,
    /// While the node runs, ask the kernel to keep idle CPUs able to wake
    /// within this many µs (PM QoS; 0: idle CPUs poll). `None` (the
    /// default): the machine's own idle policy. See [`crate::wake`].
    pub wake_latency_us: Option<u32>,
    /// Threads that serve clients (`skiff node`'s runtime); `None`: one
    /// fewer than the CPUs, at least one ([`Config::workers`]).
    pub workers: Option<usize>,
    /// Keep polling the sockets this many µs after the last read before
    /// sleeping (at most; it adapts), so a quick answer finds the node
    /// awake; 0: sleep at once. See [`skiff::spin`].
    pub spin_us: u64,
    /// Authentication and permissions (`[auth]`, see [`crate::auth`]);
    /// the default has none.
    pub auth: AuthConfig,
    /// The node's TLS certificate chain (PEM): with it, the TCP listener
    /// speaks TLS 1.3 only (clients use `tls://`).
    pub tls_cert: Option<PathBuf>,
    /// The private key of `tls_cert` (PEM).
    pub tls_key: Option<PathBuf>,
    /// A CA (PEM): clients must present a certificate that chains to it
    /// (mutual TLS).
    pub tls_ca: Option<PathBuf>,
    /// Log sinks (`[[log]]`: cMsg's LogFile subdomain, see
    /// [`crate::logsink`]).
    pub log: Vec<crate::logsink::LogSink>,
    /// The log's filter: a level (`info`) or directives
    /// (`skiff_node=debug,warn`); `None`: `RUST_LOG`, else `info`. Changes
    /// on reload.
    pub log_level: Option<String>,
    /// How log lines are written (text or JSON).
    pub log_format: crate::logging::Format,
    /// Where the HTTP monitoring listener listens (`/healthz`, `/varz`,
    /// `/connz`, `/subsz`, `/meshz`, `/metrics`); `None`: no listener.
    pub monitor: Option<SocketAddr>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            tcp: Some(SocketAddr::from(([127, 0, 0, 1], crate::DEFAULT_PORT))),
            unix: None,
            shm: None,
            nats: None,
            nats_tls: NatsTls::Off,
            limits: Limits::default(),
            mesh: None,
            wake_latency_us: None,
            workers: None,
            spin_us: skiff::spin::DEFAULT_SPIN_US,
            auth: AuthConfig::default(),
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            log: Vec::new(),
            log_level: None,
            log_format: crate::logging::Format::Text,
            monitor: None,
        }
    }
}

/// What is wrong with a configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The TOML is not valid or names unknown keys.
    #[error("{path}: {message}")]
    Toml {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// An environment variable or flag has a bad value.
    #[error("{name}={value:?} is not valid: expected {expected}")]
    Value {
        /// The variable or flag.
        name: String,
        /// Its value.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// A flag or environment variable names no setting.
    #[error("{name}={value:?} is not valid: expected a known setting: {}", SETTINGS.join(", "))]
    Unknown {
        /// The name given.
        name: String,
        /// Its value.
        value: String,
    },
}

impl Config {
    /// Parses TOML text (see the module documentation).
    pub fn from_toml(text: &str, path: &std::path::Path) -> Result<Config, ConfigError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            tcp: Option<String>,
            unix: Option<PathBuf>,
            shm: Option<String>,
            nats: Option<String>,
            nats_tls: Option<String>,
            #[serde(default)]
            limits: Limits,
            mesh: Option<MeshSettings>,
            wake_latency_us: Option<u32>,
            workers: Option<usize>,
            spin_us: Option<u64>,
            #[serde(default)]
            auth: AuthConfig,
            tls_cert: Option<PathBuf>,
            tls_key: Option<PathBuf>,
            tls_ca: Option<PathBuf>,
            #[serde(default)]
            log: Vec<crate::logsink::LogSink>,
            log_level: Option<String>,
            log_format: Option<String>,
            monitor: Option<String>,
        }
        let raw: Raw = toml::from_str(text).map_err(|e| ConfigError::Toml {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let mut c = Config {
            unix: raw.unix,
            shm: None,
            limits: raw.limits,
            mesh: raw.mesh,
            wake_latency_us: raw.wake_latency_us,
            workers: raw.workers,
            spin_us: raw.spin_us.unwrap_or(skiff::spin::DEFAULT_SPIN_US),
            auth: raw.auth,
            tls_cert: raw.tls_cert,
            tls_key: raw.tls_key,
            tls_ca: raw.tls_ca,
            log: raw.log,
            ..Config::default()
        };
        if let Some(t) = raw.tcp {
            c.set("tcp", &t)?;
        }
        if let Some(t) = raw.shm {
            c.set("shm", &t)?;
        }
        if let Some(t) = raw.nats {
            c.set("nats", &t)?;
        }
        if let Some(t) = raw.nats_tls {
            c.set("nats_tls", &t)?;
        }
        if let Err(e) = crate::auth::Auth::new(&c.auth) {
            return Err(ConfigError::Toml {
                path: path.to_owned(),
                message: e.to_string(),
            });
        }
        for (name, v) in [
            ("log_level", raw.log_level),
            ("log_format", raw.log_format),
            ("monitor", raw.monitor),
        ] {
            if let Some(v) = v {
                c.set(name, &v)?;
            }
        }
        if c.spin_us > MAX_SPIN_US {
            return Err(ConfigError::Value {
                name: "spin_us".into(),
                value: c.spin_us.to_string(),
                expected: SPIN_US_EXPECTED,
            });
        }
        Ok(c)
    }

    /// The threads to serve clients with: `workers` if set, else one fewer
    /// than the CPUs this process may use, at least one.
    ///
    /// Why not one per CPU: a node serves the applications of its own host
    /// (over loopback, a Unix socket or shared memory), and they need CPU
    /// too. On a small host, more workers add hand-offs between node
    /// threads, and each hand-off that wakes another CPU costs a wake-up
    /// (on a virtual machine, a trip through the hypervisor) without
    /// making the node faster (`bench/RESULTS.md` has the runs).
    pub fn workers(&self) -> usize {
        self.workers.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(1, |n| n.get().saturating_sub(1))
                .max(1)
        })
    }

    /// Reads a TOML file.
    pub fn from_file(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::from_toml(&text, path)
    }

    /// Sets one setting by name (`tcp`, `unix`, `wake_latency_us`, a mesh
    /// setting or a [`Limits`] field), as
    /// given by a flag or an environment variable.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), ConfigError> {
        let bad = |expected| ConfigError::Value {
            name: name.into(),
            value: value.into(),
            expected,
        };
        let num = || {
            value
                .trim()
                .parse::<u64>()
                .map_err(|_| bad("a whole number"))
        };
        let mesh_field = matches!(
            name,
            "net"
                | "seeds"
                | "seeds_dns"
                | "scout"
                | "max_members"
                | "max_interest"
                | "interest_rate"
                | "max_datagram"
                | "send_queue"
                | "send_policy"
                | "send_deadline_ms"
                | "probe_ms"
                | "suspect_ms"
                | "best_effort"
                | "splice"
                | "mesh_secret"
                | "mesh_identity"
                | "mesh_trusted_keys"
        );
        if mesh_field && self.mesh.is_none() {
            self.mesh = Some(MeshSettings::default());
        }
        if let Some(m) = self.mesh.as_mut() {
            match name {
                "mesh_secret" => {
                    // A secret: no error may repeat it.
                    if value.is_empty() || value.len() > crate::auth::MAX_CREDENTIAL {
                        return Err(ConfigError::Value {
                            name: name.into(),
                            value: "***".into(),
                            expected: "a secret of 1 to 1024 bytes",
                        });
                    }
                    m.secret = Some(Secret::new(value));
                    return Ok(());
                }
                "mesh_identity" => {
                    m.identity = (!value.is_empty()).then(|| PathBuf::from(value));
                    return Ok(());
                }
                "mesh_trusted_keys" => {
                    m.trusted_keys = value
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect();
                    return Ok(());
                }
                _ => {}
            }
        }
        if name == "token" || name == "auth_token" {
            // The value is a secret: no error may repeat it.
            if value.is_empty() || value.len() > crate::auth::MAX_CREDENTIAL {
                return Err(ConfigError::Value {
                    name: name.into(),
                    value: "***".into(),
                    expected: "a token of 1 to 1024 bytes",
                });
            }
            self.auth.token = Some(Secret::new(value));
            return Ok(());
        }
        if let Some(slot) = match name {
            "tls_cert" => Some(&mut self.tls_cert),
            "tls_key" => Some(&mut self.tls_key),
            "tls_ca" => Some(&mut self.tls_ca),
            _ => None,
        } {
            *slot = (!value.is_empty() && value != "none").then(|| PathBuf::from(value));
            return Ok(());
        }
        if name == "auth_timeout_ms" {
            self.auth.timeout_ms = num()?;
            return Ok(());
        }
        if name == "log" {
            let sink = crate::logsink::LogSink::parse(value)
                .ok_or_else(|| bad("PATTERN=PATH, e.g. logs.>=/var/log/skiff/app.log"))?;
            self.log.push(sink);
            return Ok(());
        }
        let l = &mut self.limits;
        match name {
            "mesh" => {
                self.mesh = if value.is_empty() || value == "off" || value == "none" {
                    None
                } else {
                    let bind = value
                        .parse()
                        .map_err(|_| bad("host:port (e.g. 0.0.0.0:4748), or off"))?;
                    Some(MeshSettings {
                        bind,
                        ..self.mesh.take().unwrap_or_default()
                    })
                }
            }
            "net" | "seeds" | "seeds_dns" | "scout" | "max_members" | "max_interest"
            | "interest_rate" | "max_datagram" | "send_queue" | "send_policy"
            | "send_deadline_ms" | "probe_ms" | "suspect_ms" | "best_effort" | "splice" => {
                let m = self.mesh.as_mut().expect("set above");
                match name {
                    "net" if !value.is_empty() && value.len() <= 255 => m.net = value.into(),
                    "net" => return Err(bad("a name of 1 to 255 bytes")),
                    "seeds" => {
                        m.seeds = value
                            .split(',')
                            .map(str::trim)
                            .filter(|s| !s.is_empty())
                            .map(str::to_owned)
                            .collect();
                        if m.seeds.iter().any(|s| !s.contains(':')) {
                            return Err(bad("host:port[,host:port…]"));
                        }
                    }
                    "seeds_dns" => {
                        m.seeds_dns = (!value.is_empty()).then(|| value.to_owned());
                        if value
                            .rsplit_once(':')
                            .is_none_or(|(_, p)| p.parse::<u16>().is_err())
                        {
                            return Err(bad("name:port"));
                        }
                    }
                    "scout" | "splice" => {
                        let on = match value {
                            "1" | "true" | "on" | "yes" => true,
                            "0" | "false" | "off" | "no" => false,
                            _ => return Err(bad("true or false")),
                        };
                        if name == "scout" {
                            m.scout = on;
                        } else {
                            m.splice = on;
                        }
                    }
                    "max_members" => m.max_members = num()? as usize,
                    "max_interest" => m.max_interest = num()? as usize,
                    "interest_rate" => m.interest_rate = num()?.min(u32::MAX as u64) as u32,
                    "send_queue" => m.send_queue = num()?.min(1 << 40) as usize,
                    "send_deadline_ms" => m.send_deadline_ms = num()?,
                    "probe_ms" => m.probe_ms = num()?.clamp(50, 60_000),
                    "suspect_ms" => m.suspect_ms = num()?.clamp(100, 600_000),
                    "send_policy" => {
                        m.send_policy = crate::mesh::SendPolicy::parse(value.trim())
                            .ok_or_else(|| bad("block, drop_oldest or drop_newest"))?
                    }
                    "best_effort" => {
                        m.best_effort = value
                            .split(',')
                            .map(str::trim)
                            .filter(|s| !s.is_empty())
                            .map(str::to_owned)
                            .collect();
                        if m.best_effort
                            .iter()
                            .any(|p| skiff_proto::router::Pattern::new(p).is_err())
                        {
                            return Err(bad(
                                "subject patterns, comma-separated (e.g. metrics.>,log.*)",
                            ));
                        }
                    }
                    _ => m.max_datagram = (num()? as usize).clamp(512, 65_000),
                }
            }
            "tcp" => {
                self.tcp = if value.is_empty() || value == "none" {
                    None
                } else {
                    Some(
                        value
                            .parse()
                            .map_err(|_| bad("host:port, e.g. 127.0.0.1:4747, or none"))?,
                    )
                }
            }
            "nats" => self.nats = match value.trim() {
                "" | "none" | "off" => None,
                "on" | "true" | "yes" => Some(SocketAddr::from(([127, 0, 0, 1], NATS_PORT))),
                v => Some(
                    v.parse()
                        .or_else(|_| {
                            v.trim_matches(|c| c == '[' || c == ']')
                                .parse::<std::net::IpAddr>()
                                .map(|ip| SocketAddr::new(ip, NATS_PORT))
                        })
                        .map_err(|_| {
                            bad("host:port (e.g. 127.0.0.1:4222), a host (port 4222), on, or none")
                        })?,
                ),
            },
            "nats_tls" => {
                self.nats_tls = NatsTls::parse(value.trim())
                    .ok_or_else(|| bad("off, required, optional or handshake_first"))?
            }
            "unix" => {
                self.unix = (!value.is_empty() && value != "none").then(|| PathBuf::from(value))
            }
            // A bare name is `shm://name`.
            "shm" => {
                self.shm = match value.trim() {
                    "" | "none" | "off" => None,
                    v if v.contains("://") => Some(v.to_owned()),
                    v => Some(format!("shm://{v}")),
                };
                if let Some(loc) = &self.shm {
                    skiff::shm::host::check_locator(loc).map_err(|_| {
                        bad("a shm name of letters, digits, '-', '_' and '.' (e.g. skiff), or shm://NAME?dir=…&ring=…&spin=…")
                    })?;
                }
            }
            "wake_latency_us" => {
                self.wake_latency_us = if value.is_empty() || value == "off" || value == "none" {
                    None
                } else {
                    Some(
                        value
                            .trim()
                            .parse::<u32>()
                            .ok()
                            .filter(|&v| v <= i32::MAX as u32)
                            .ok_or_else(|| bad("a whole number of µs up to 2147483647, or off"))?,
                    )
                }
            }
            "workers" => {
                self.workers = if value.is_empty() || value == "auto" {
                    None
                } else {
                    Some(
                        value
                            .trim()
                            .parse::<usize>()
                            .ok()
                            .filter(|&n| (1..=1024).contains(&n))
                            .ok_or_else(|| bad("a thread count from 1 to 1024, or auto"))?,
                    )
                }
            }
            "spin_us" => {
                self.spin_us = value
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|&v| v <= MAX_SPIN_US)
                    .ok_or_else(|| bad(SPIN_US_EXPECTED))?
            }
            "log_level" => {
                self.log_level = if value.trim().is_empty() {
                    None
                } else {
                    crate::logging::check_filter(value.trim()).map_err(|_| {
                        bad("a level (error, warn, info, debug, trace) or directives such as skiff_node=debug,info")
                    })?;
                    Some(value.trim().to_owned())
                }
            }
            "log_format" => {
                self.log_format =
                    crate::logging::Format::parse(value).ok_or_else(|| bad("text or json"))?
            }
            "monitor" => {
                self.monitor = match value.trim() {
                    "" | "none" | "off" => None,
                    v => Some(
                        v.parse()
                            .map_err(|_| bad("host:port, e.g. 127.0.0.1:8222, or off"))?,
                    ),
                }
            }
            "max_subject" => l.max_subject = num()? as usize,
            "max_payload" => l.max_payload = num()? as usize,
            "max_subscriptions" => l.max_subscriptions = num()? as usize,
            "max_pending_bytes" => l.max_pending_bytes = num()? as usize,
            "max_total_pending_bytes" => l.max_total_pending_bytes = num()? as usize,
            "max_connections" => l.max_connections = num()? as usize,
            "max_requests" => l.max_requests = num()? as usize,
            "drain_timeout_ms" => l.drain_timeout_ms = num()?,
            "read_timeout_ms" => l.read_timeout_ms = num()?,
            "ping_interval_ms" => l.ping_interval_ms = num()?,
            "max_connections_per_ip" => l.max_connections_per_ip = num()? as usize,
            "max_connection_rate" => {
                l.max_connection_rate =
                    u32::try_from(num()?).map_err(|_| bad("a number up to 2^32 - 1"))?
            }
            "write_deadline_ms" => l.write_deadline_ms = num()?,
            "max_pings_out" => {
                l.max_pings_out =
                    u32::try_from(num()?).map_err(|_| bad("a number up to 2^32 - 1"))?
            }
            _ => {
                return Err(ConfigError::Unknown {
                    name: name.into(),
                    value: value.into(),
                })
            }
        }
        Ok(())
    }

    /// Applies `SKIFF_TCP`, `SKIFF_UNIX`, `SKIFF_MAX_PAYLOAD`, … (the
    /// setting's name in upper case after `SKIFF_`) from `vars`, e.g.
    /// `std::env::vars()`. Other variables are ignored.
    pub fn apply_env(
        &mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), ConfigError> {
        for (k, v) in vars {
            let Some(rest) = k.strip_prefix("SKIFF_") else {
                continue;
            };
            let lower = rest.to_ascii_lowercase();
            if let Some(name) = SETTINGS.iter().find(|n| **n == lower) {
                self.set(name, &v)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_env_and_flags_layer() {
        let mut c = Config::from_toml(
            "tcp = \"127.0.0.1:5000\"\n[limits]\nmax_payload = 100\n",
            std::path::Path::new("x.toml"),
        )
        .unwrap();
        assert_eq!(c.tcp, Some("127.0.0.1:5000".parse().unwrap()));
        assert_eq!(c.limits.max_payload, 100);
        assert_eq!(c.limits.max_subject, Limits::default().max_subject);
        c.apply_env([
            ("SKIFF_MAX_PAYLOAD".into(), "200".into()),
            ("SKIFF_TCP".into(), "none".into()),
            ("HOME".into(), "/".into()),
        ])
        .unwrap();
        assert_eq!(c.limits.max_payload, 200);
        assert_eq!(c.tcp, None);
        c.set("max_subscriptions", "3").unwrap();
        assert_eq!(c.limits.max_subscriptions, 3);
        let e = c.set("max_payload", "lots").unwrap_err().to_string();
        assert!(e.contains("whole number"), "{e}");
        let e = c.set("seeds", "nohostport").unwrap_err().to_string();
        assert!(e.contains("host:port"), "{e}");
        c.apply_env([
            ("SKIFF_NET".into(), "prod".into()),
            ("SKIFF_SEEDS".into(), "10.0.0.1:4748, 10.0.0.2:4748".into()),
            ("SKIFF_SCOUT".into(), "0".into()),
        ])
        .unwrap();
        let m = c.mesh.clone().unwrap();
        assert_eq!((m.net.as_str(), m.seeds.len(), m.scout), ("prod", 2, false));
        assert_eq!((m.probe_ms, m.suspect_ms), (1000, 4000));
        assert!(m.splice, "splicing is on by default");
        c.apply_env([("SKIFF_SPLICE".into(), "0".into())]).unwrap();
        assert!(!c.mesh.clone().unwrap().splice);
        assert!(c.set("splice", "maybe").is_err());
        c.apply_env([
            ("SKIFF_PROBE_MS".into(), "250".into()),
            ("SKIFF_SUSPECT_MS".into(), "1".into()),
        ])
        .unwrap();
        let m = c.mesh.clone().unwrap();
        assert_eq!((m.probe_ms, m.suspect_ms), (250, 100), "clamped to 100 ms");
        c.set("mesh", "off").unwrap();
        assert_eq!(c.mesh, None);
        let t = Config::from_toml(
            "[mesh]\nbind = \"127.0.0.1:4748\"\nnet = \"x\"\nseeds_dns = \"skiff-mesh:4748\"\n",
            std::path::Path::new("m.toml"),
        )
        .unwrap();
        let m = t.mesh.unwrap();
        assert_eq!((m.bind.port(), m.net.as_str(), m.scout), (4748, "x", true));
        let e = Config::from_toml("bogus = 1", std::path::Path::new("x.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("x.toml"), "{e}");
    }

    #[test]
    fn wake_latency_from_toml_env_and_flags() {
        let mut c =
            Config::from_toml("wake_latency_us = 5", std::path::Path::new("w.toml")).unwrap();
        assert_eq!(c.wake_latency_us, Some(5));
        c.apply_env([("SKIFF_WAKE_LATENCY_US".into(), "0".into())])
            .unwrap();
        assert_eq!(c.wake_latency_us, Some(0));
        c.set("wake_latency_us", "off").unwrap();
        assert_eq!(c.wake_latency_us, None);
        for bad in ["-1", "soon", "3000000000"] {
            let e = c.set("wake_latency_us", bad).unwrap_err().to_string();
            assert!(e.contains("wake_latency_us") && e.contains("µs"), "{e}");
        }
        assert_eq!(Config::default().wake_latency_us, None);
    }

    #[test]
    fn spin_from_toml_env_and_flags() {
        assert_eq!(Config::default().spin_us, skiff::spin::DEFAULT_SPIN_US);
        let mut c = Config::from_toml("spin_us = 0", std::path::Path::new("s.toml")).unwrap();
        assert_eq!(c.spin_us, 0);
        c.apply_env([("SKIFF_SPIN_US".into(), "250".into())])
            .unwrap();
        assert_eq!(c.spin_us, 250);
        for bad in ["-1", "soon", "2000000", ""] {
            let e = c.set("spin_us", bad).unwrap_err().to_string();
            assert!(e.contains("spin_us") && e.contains("µs"), "{e}");
        }
        assert_eq!(c.spin_us, 250, "a bad value changes nothing");
        let e = Config::from_toml("spin_us = 5000000", std::path::Path::new("s.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("spin_us"), "{e}");
    }

    #[test]
    fn deadlines_from_toml_env_and_flags() {
        let mut c = Config::from_toml(
            "[limits]\nread_timeout_ms = 500\nping_interval_ms = 1000\n",
            std::path::Path::new("d.toml"),
        )
        .unwrap();
        assert_eq!(
            (c.limits.read_timeout_ms, c.limits.ping_interval_ms),
            (500, 1000)
        );
        c.apply_env([("SKIFF_MAX_PINGS_OUT".into(), "5".into())])
            .unwrap();
        assert_eq!(c.limits.max_pings_out, 5);
        c.set("ping_interval_ms", "0").unwrap();
        assert_eq!(c.limits.ping_interval_ms, 0);
        assert!(c.set("max_pings_out", "5000000000").is_err());
        // A frame's deadline: the floor, plus its size at MIN_READ_RATE.
        assert_eq!(c.limits.frame_deadline(0), Duration::from_millis(500));
        assert_eq!(
            c.limits.frame_deadline(MIN_READ_RATE as usize),
            Duration::from_millis(1500)
        );
    }

    #[test]
    fn log_and_monitor_from_toml_env_and_flags() {
        let mut c = Config::from_toml(
            "log_level = \"warn\"\nlog_format = \"json\"\nmonitor = \"127.0.0.1:8222\"\n",
            std::path::Path::new("l.toml"),
        )
        .unwrap();
        assert_eq!(c.log_level.as_deref(), Some("warn"));
        assert_eq!(c.log_format, crate::logging::Format::Json);
        assert_eq!(c.monitor, Some("127.0.0.1:8222".parse().unwrap()));
        c.apply_env([("SKIFF_LOG_LEVEL".into(), "skiff_node=debug,info".into())])
            .unwrap();
        assert_eq!(c.log_level.as_deref(), Some("skiff_node=debug,info"));
        c.set("monitor", "off").unwrap();
        assert_eq!(c.monitor, None);
        for (name, v) in [
            ("log_format", "xml"),
            ("monitor", "8222"),
            ("log_level", "x=["),
        ] {
            let e = c.set(name, v).unwrap_err().to_string();
            assert!(e.contains(name), "{e}");
        }
        assert_eq!(Config::default().monitor, None, "off by default");
    }

    #[test]
    fn workers_default_leaves_a_cpu_to_the_clients() {
        let mut c = Config::default();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(c.workers(), (cpus - 1).max(1));
        c.apply_env([("SKIFF_WORKERS".into(), "3".into())]).unwrap();
        assert_eq!(c.workers(), 3);
        c.set("workers", "auto").unwrap();
        assert_eq!(c.workers, None);
        for bad in ["0", "many", "5000"] {
            let e = c.set("workers", bad).unwrap_err().to_string();
            assert!(e.contains("thread count"), "{e}");
        }
        let t = Config::from_toml("workers = 2", std::path::Path::new("w.toml")).unwrap();
        assert_eq!(t.workers(), 2);
    }
}

#[cfg(test)]
mod nats_setting {
    use super::*;

    #[test]
    fn nats_from_every_source() {
        let mut c = Config::default();
        assert_eq!(c.nats, None);
        c.set("nats", "0.0.0.0").unwrap();
        assert_eq!(c.nats, Some(SocketAddr::from(([0, 0, 0, 0], NATS_PORT))));
        c.set("nats", "127.0.0.1:5222").unwrap();
        assert_eq!(c.nats.unwrap().port(), 5222);
        c.set("nats", "on").unwrap();
        assert_eq!(c.nats, Some(SocketAddr::from(([127, 0, 0, 1], 4222))));
        c.set("nats", "off").unwrap();
        assert_eq!(c.nats, None);
        assert!(c.set("nats", "nowhere:x").is_err());
        c.apply_env([("SKIFF_NATS".to_string(), "[::1]".to_string())])
            .unwrap();
        assert_eq!(c.nats, Some("[::1]:4222".parse().unwrap()));
        let t =
            Config::from_toml("nats = \"127.0.0.1:4333\"", std::path::Path::new("x.toml")).unwrap();
        assert_eq!(t.nats.unwrap().port(), 4333);
    }

    #[test]
    fn nats_tls_from_every_source() {
        use super::NatsTls;
        let mut c = Config::default();
        assert_eq!(c.nats_tls, NatsTls::Off);
        for (v, m) in [
            ("required", NatsTls::Required),
            ("on", NatsTls::Required),
            ("optional", NatsTls::Optional),
            ("handshake_first", NatsTls::HandshakeFirst),
            ("off", NatsTls::Off),
        ] {
            c.set("nats_tls", v).unwrap();
            assert_eq!(c.nats_tls, m, "{v}");
        }
        assert!(c.set("nats_tls", "maybe").is_err());
        let t = Config::from_toml(
            "nats_tls = \"handshake_first\"",
            std::path::Path::new("x.toml"),
        )
        .unwrap();
        assert_eq!(t.nats_tls, NatsTls::HandshakeFirst);
        assert!(Config::from_toml("nats_tls = \"x\"", std::path::Path::new("x.toml")).is_err());
    }
}
