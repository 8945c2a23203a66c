//! A node locator as a client reads it: the addresses of its node list
//! (`skiff://h:p[,h:p…]`, `tcp://…`, `unix:///path[,/path…]`) and the
//! options that say how the link watches and replaces its connection.

use std::fmt;
use std::net::{Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::locator::{parse_bool, parse_bytes, parse_duration, Locator, DEFAULT_PORT};
use crate::LocatorError;

/// One address of a node list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NodeAddr {
    /// `host:port` (a name is resolved at each connection attempt).
    Tcp(String),
    /// A Unix socket path.
    Unix(PathBuf),
    /// `host:port` over TLS (`tls://`).
    Tls(String),
    /// A node on this host over shared memory: its locator
    /// (`shm://name`, with the list's `dir`, `ring` and `spin` options).
    Shm(String),
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeAddr::Tcp(a) => write!(f, "skiff://{a}"),
            NodeAddr::Unix(p) => write!(f, "unix://{}", p.display()),
            NodeAddr::Tls(a) => write!(f, "tls://{a}"),
            NodeAddr::Shm(l) => f.write_str(l),
        }
    }
}

/// How a node link watches and replaces its connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LinkOptions {
    /// Silence after which the client pings; zero: never (EOF and errors
    /// only).
    pub(crate) ping: Duration,
    /// Silence after which the node counts as dead.
    pub(crate) ping_timeout: Duration,
    /// Whether a lost link is replaced (on by default with two or more
    /// addresses).
    pub(crate) reconnect: bool,
    /// Most bytes of publishes held while no node is reachable.
    pub(crate) reconnect_buffer: usize,
    /// Most bytes of publishes kept until the node confirms them
    /// (`unconfirmed_buffer`; 0: none kept, nothing reported; default 1
    /// MiB where the client fails over, else 0).
    pub(crate) unconfirmed_buffer: usize,
    /// Longest wait for one address to connect and welcome the client.
    pub(crate) connect_timeout: Duration,
    /// Polling after a read before the runtime sleeps (see
    /// [`crate::spin`]); zero: off.
    pub(crate) spin: Duration,
    /// What to prove the client's identity with, if the node asks.
    pub(crate) creds: Creds,
    /// The TLS configuration (`tls://`).
    pub(crate) tls: Option<TlsClient>,
    /// The name the client gives itself (`name=`, [`super::ClientOptions`]),
    /// sent in `Hello` on every connection.
    pub(crate) name: Option<String>,
}

/// A client's TLS configuration, built when the locator is parsed (so a
/// bad file is reported then).
#[derive(Clone)]
pub(crate) struct TlsClient(pub(crate) std::sync::Arc<crate::tls::ClientConfig>);

impl PartialEq for TlsClient {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for TlsClient {}

impl fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TlsClient")
    }
}

/// A client's credentials from its locator (`token`, `user` and
/// `password`, `key`); `Debug` shows none of them.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Creds {
    pub(crate) token: Option<String>,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    /// The private key's seed, read from the `key` file.
    pub(crate) seed: Option<[u8; 32]>,
}

impl fmt::Debug for Creds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Creds {{ token: {}, user: {:?}, password: {}, key: {} }}",
            if self.token.is_some() { "***" } else { "-" },
            self.user,
            if self.password.is_some() { "***" } else { "-" },
            if self.seed.is_some() { "***" } else { "-" },
        )
    }
}

impl Creds {
    /// The answer to a node's challenge with `nonce`: a key's signature
    /// first, then a user's password, then the token.
    pub(crate) fn proof(&self, nonce: &[u8]) -> skiff_proto::client_frame::Proof {
        use skiff_proto::client_frame::Proof;
        if let Some(seed) = &self.seed {
            return Proof::Signature {
                public_key: crate::keys::public_of(seed),
                signature: crate::keys::sign(seed, nonce),
            };
        }
        if let Some(user) = &self.user {
            return Proof::Password {
                user: user.clone(),
                password: self.password.clone().unwrap_or_default(),
            };
        }
        match &self.token {
            Some(t) => Proof::Token(t.clone()),
            None => Proof::None,
        }
    }

    /// Reads a credential option; `Ok(false)`: not one. Errors never
    /// repeat a secret. (`key=` naming a PEM file is a TLS client key,
    /// which the caller takes first.)
    pub(crate) fn option(&mut self, k: &str, v: &str) -> Result<bool, LocatorError> {
        let v = percent_decode(v);
        match k {
            "token" => self.token = Some(v),
            "user" => self.user = Some(v),
            "password" => self.password = Some(v),
            "key" | "auth_key" => {
                let text = std::fs::read_to_string(&v).map_err(|e| LocatorError::BadValue {
                    name: "key".into(),
                    value: v.clone(),
                    expected: leak_reason(format!("a readable key file ({e})")),
                })?;
                self.seed = Some(crate::keys::parse_seed(&text).ok_or_else(|| {
                    LocatorError::BadValue {
                        name: "key".into(),
                        value: v.clone(),
                        expected: "a file holding an Ed25519 private key (32 bytes as base64 or hex, or a NATS seed SU…; `skiff keygen` writes one)",
                    }
                })?);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// `expected` texts are static; a reason read at run time is kept for the
/// life of the process (errors about key files are few).
fn leak_reason(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Decodes `%XX` escapes (so a secret may hold `&`, `=` or `?`); anything
/// malformed is kept as it is.
pub(crate) fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_owned())
}

/// A parsed node locator: the addresses and the link options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeTarget {
    pub(crate) addrs: Vec<NodeAddr>,
    pub(crate) opts: LinkOptions,
}

/// How long one connection attempt to a node may take (`connect_timeout`):
/// longer than Linux's 1 s SYN retransmission, so that one lost SYN does not
/// skip a live node.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(1500);

const OPTIONS: &str = "reconnect, ping, ping_timeout, reconnect_buffer, unconfirmed_buffer, connect_timeout, spin_us, token, user, password, key, auth_key, ca, cert, tls_key, name, and for shm:// nodes dir, ring, spin";

/// Parses `skiff://h:p[,h:p…]`, `tcp://…`, `unix:///path[,/path…]` or
/// `shm://name[,name…]` with the link options `reconnect`, `ping`,
/// `ping_timeout`, `reconnect_buffer`, `unconfirmed_buffer`,
/// `connect_timeout` and `spin_us`. An entry of the list may name its own
/// scheme (`shm://a,skiff://10.0.0.2:4747`: shared memory first, then a
/// node over TCP); shm entries take the `dir`, `ring` and `spin` options.
pub(crate) fn parse_target(locator: &str) -> Result<NodeTarget, LocatorError> {
    let l: Locator = locator.parse()?;
    l.expect_scheme("skiff, tcp, unix, tls, shm")?;
    // The shm options, given to every shm entry of the list.
    let shm_opts: Vec<String> = l
        .options
        .iter()
        .filter(|(k, _)| matches!(k.as_str(), "dir" | "ring" | "spin"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mut addrs = Vec::new();
    for a in l.address.split(',') {
        let a = a.trim();
        if a.is_empty() {
            return Err(LocatorError::Address {
                addr: l.address.clone(),
                why: "an address in the list is empty (a doubled, leading or trailing comma?)"
                    .into(),
            });
        }
        let (scheme, a) = match a.split_once("://") {
            Some((s, rest)) => (s.to_ascii_lowercase(), rest),
            None => (l.scheme.clone(), a),
        };
        addrs.push(match scheme.as_str() {
            "unix" => NodeAddr::Unix(a.into()),
            "tls" => NodeAddr::Tls(host_port(a)?),
            "skiff" | "tcp" => NodeAddr::Tcp(host_port(a)?),
            "shm" => {
                let mut loc = format!("shm://{a}");
                if !shm_opts.is_empty() {
                    loc.push('?');
                    loc.push_str(&shm_opts.join("&"));
                }
                // Checked now (name and options), as the other entries are.
                #[cfg(not(skiff_loom))]
                crate::shm::attach::parse(&loc)?;
                NodeAddr::Shm(loc)
            }
            _ => {
                return Err(LocatorError::Scheme {
                    scheme,
                    accepted: "skiff, tcp, unix, tls, shm",
                })
            }
        });
    }
    let mut reconnect = None;
    let mut ping = None;
    let mut ping_timeout = None;
    let mut reconnect_buffer = 1 << 20;
    let mut unconfirmed_buffer = None;
    let mut connect_timeout = DEFAULT_CONNECT_TIMEOUT;
    let mut spin_us = crate::spin::DEFAULT_SPIN_US;
    let mut creds = Creds::default();
    let mut name = None;
    let has_shm = addrs.iter().any(|a| matches!(a, NodeAddr::Shm(_)));
    let (mut ca, mut cert, mut tls_key) = (None::<PathBuf>, None::<PathBuf>, None::<PathBuf>);
    l.options(OPTIONS, |k, v| {
        // `key=` is the TLS client key when it names a PEM file, else the
        // Ed25519 key that signs the node's challenge.
        let pem = |v: &str| {
            std::fs::read(v).is_ok_and(|b| b.trim_ascii_start().starts_with(b"-----BEGIN"))
        };
        match k {
            "ca" => ca = Some(v.into()),
            "cert" => cert = Some(v.into()),
            "tls_key" => tls_key = Some(v.into()),
            "key" if pem(v) => tls_key = Some(v.into()),
            "reconnect" => reconnect = Some(parse_bool(k, v)?),
            "ping" => ping = Some(parse_duration(k, v)?),
            "ping_timeout" => ping_timeout = Some(parse_duration(k, v)?),
            "reconnect_buffer" => reconnect_buffer = parse_bytes(k, v)?,
            "unconfirmed_buffer" => unconfirmed_buffer = Some(parse_bytes(k, v)?),
            "connect_timeout" => connect_timeout = parse_duration(k, v)?,
            "name" => name = Some(check_name(&percent_decode(v))?),
            // Checked with each shm entry (above).
            "dir" | "ring" | "spin" if has_shm => {}
            "spin_us" => {
                spin_us = v
                    .parse::<u64>()
                    .ok()
                    .filter(|&n| n <= 1_000_000)
                    .ok_or_else(|| LocatorError::BadValue {
                        name: k.into(),
                        value: v.into(),
                        expected: "a whole number of µs from 0 (off) to 1000000",
                    })?
            }
            _ => return creds.option(k, v),
        }
        Ok(true)
    })?;
    let tls = if addrs.iter().any(|a| matches!(a, NodeAddr::Tls(_))) {
        let cfg = crate::tls::client_config(ca.as_deref(), cert.as_deref(), tls_key.as_deref())
            .map_err(|why| LocatorError::Address {
                addr: l.address.clone(),
                why: format!("TLS: {why}"),
            })?;
        Some(TlsClient(cfg))
    } else if ca.is_some() || cert.is_some() || tls_key.is_some() {
        return Err(LocatorError::BadValue {
            name: "ca, cert or key".into(),
            value: l.scheme.clone(),
            expected: "the tls:// scheme (certificates are for TLS connections)",
        });
    } else {
        None
    };
    let reconnect = reconnect.unwrap_or(addrs.len() > 1);
    // Unconfirmed publishes are reported on a failover: kept by default
    // only where a lost node is replaced (a lone client just ends).
    let unconfirmed_buffer = unconfirmed_buffer.unwrap_or(if reconnect { 1 << 20 } else { 0 });
    // Keepalive is on by default only where a lost node is replaced: a
    // lone client keeps the old behaviour (EOF and errors only).
    let ping = ping.unwrap_or(if reconnect {
        Duration::from_millis(150)
    } else {
        Duration::ZERO
    });
    let ping_timeout = ping_timeout.unwrap_or((ping * 4).max(Duration::from_millis(600)));
    if !ping.is_zero() && ping_timeout <= ping {
        return Err(LocatorError::BadValue {
            name: "ping_timeout".into(),
            value: format!("{ping_timeout:?}"),
            expected: "a duration longer than ping (the node needs time to answer)",
        });
    }
    if connect_timeout.is_zero() {
        return Err(LocatorError::BadValue {
            name: "connect_timeout".into(),
            value: "0".into(),
            expected: "a duration above zero, such as 1s",
        });
    }
    Ok(NodeTarget {
        addrs,
        opts: LinkOptions {
            ping,
            ping_timeout,
            reconnect,
            reconnect_buffer,
            unconfirmed_buffer,
            connect_timeout,
            spin: Duration::from_micros(spin_us),
            creds,
            tls,
            name,
        },
    })
}

/// Checks a client name (`name=`, [`super::ClientOptions::name`]): what a
/// `Hello` frame may carry.
pub(crate) fn check_name(name: &str) -> Result<String, LocatorError> {
    if skiff_proto::client_frame::valid_client_name(name) {
        Ok(name.to_owned())
    } else {
        Err(LocatorError::BadValue {
            name: "name".into(),
            value: name.chars().take(64).collect(),
            expected: "a client name of at most 128 bytes without control characters",
        })
    }
}

/// Checks `host:port`, `host` (default port), `[v6]:port`, `[v6]` or a
/// bare IPv6 address, without resolving; returns it with its port.
fn host_port(a: &str) -> Result<String, LocatorError> {
    let bad = |why: &str| LocatorError::Address {
        addr: a.into(),
        why: why.into(),
    };
    if let Ok(s) = a.parse::<SocketAddr>() {
        if s.port() == 0 {
            return Err(bad("port 0 cannot be connected to"));
        }
        return Ok(a.into());
    }
    if let Ok(ip) = a.parse::<Ipv6Addr>() {
        return Ok(format!("[{ip}]:{DEFAULT_PORT}"));
    }
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (ip, after) = rest
            .split_once(']')
            .ok_or_else(|| bad("an IPv6 address opened with [ is not closed with ]"))?;
        ip.parse::<Ipv6Addr>()
            .map_err(|_| bad("the part in brackets is not an IPv6 address"))?;
        match after {
            "" => (format!("[{ip}]"), None),
            p => (
                format!("[{ip}]"),
                Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("expected :port after ]"))?,
                ),
            ),
        }
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (a.to_owned(), None),
        }
    };
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == '/' || c == ':') {
        return Err(bad("the host name is empty or has a space, / or :"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(0) => return Err(bad("port 0 cannot be connected to")),
            Ok(p) => p,
            Err(_) => return Err(bad("the port is not a number from 1 to 65535")),
        },
    };
    Ok(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shm_lists_mix_schemes_and_share_the_shm_options() {
        let t =
            parse_target("shm://a,b,skiff://10.0.0.2:4800?dir=/tmp/x&ring=1M&ping=50ms").unwrap();
        assert_eq!(
            t.addrs,
            vec![
                NodeAddr::Shm("shm://a?dir=/tmp/x&ring=1M".into()),
                NodeAddr::Shm("shm://b?dir=/tmp/x&ring=1M".into()),
                NodeAddr::Tcp("10.0.0.2:4800".into()),
            ]
        );
        assert!(t.opts.reconnect);
        assert_eq!(t.opts.ping, Duration::from_millis(50));
        let t = parse_target("skiff://h:1,shm://n").unwrap();
        assert_eq!(t.addrs[1], NodeAddr::Shm("shm://n".into()));
        // shm options only with an shm entry; bad names and schemes refused.
        assert!(parse_target("skiff://a,b?dir=/tmp").is_err());
        assert!(parse_target("shm://a,bad/name").is_err());
        assert!(parse_target("shm://a,udp://h:1").is_err());
        assert!(parse_target("shm://a?ring=1").is_err());
    }

    #[test]
    fn parses_address_lists_and_options() {
        let t = parse_target("skiff://a:4747,b.example:4800,10.0.0.1,[::1]:9,::1").unwrap();
        assert_eq!(
            t.addrs,
            vec![
                NodeAddr::Tcp("a:4747".into()),
                NodeAddr::Tcp("b.example:4800".into()),
                NodeAddr::Tcp("10.0.0.1:4747".into()),
                NodeAddr::Tcp("[::1]:9".into()),
                NodeAddr::Tcp("[::1]:4747".into()),
            ]
        );
        assert!(t.opts.reconnect, "a list fails over by default");
        assert_eq!(t.opts.ping, Duration::from_millis(150));
        assert_eq!(t.opts.ping_timeout, Duration::from_millis(600));
        assert_eq!(t.opts.reconnect_buffer, 1 << 20);
        assert_eq!(t.opts.unconfirmed_buffer, 1 << 20);
        let lone = parse_target("skiff://h").unwrap();
        assert_eq!(lone.opts.unconfirmed_buffer, 0);

        let one = parse_target("tcp://127.0.0.1:1").unwrap();
        assert!(!one.opts.reconnect && one.opts.ping.is_zero());
        let one = parse_target("skiff://h?reconnect&ping=50ms&reconnect_buffer=0").unwrap();
        assert!(one.opts.reconnect);
        assert_eq!(one.opts.ping, Duration::from_millis(50));
        assert_eq!(one.opts.ping_timeout, Duration::from_millis(600));
        assert_eq!(one.opts.reconnect_buffer, 0);
        let off = parse_target("skiff://a,b?reconnect=false").unwrap();
        assert!(!off.opts.reconnect && off.opts.ping.is_zero());
        assert_eq!(
            off.opts.spin,
            Duration::from_micros(crate::spin::DEFAULT_SPIN_US)
        );
        assert!(parse_target("skiff://h?spin_us=0")
            .unwrap()
            .opts
            .spin
            .is_zero());
        assert_eq!(
            parse_target("skiff://h?spin_us=20").unwrap().opts.spin,
            Duration::from_micros(20)
        );
        for bad in ["-5", "fast", "2000000"] {
            let e = parse_target(&format!("skiff://h?spin_us={bad}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("spin_us") && e.contains("µs"), "{e}");
        }

        let u = parse_target("unix:///run/a.sock,/run/b.sock").unwrap();
        assert_eq!(
            u.addrs,
            vec![
                NodeAddr::Unix("/run/a.sock".into()),
                NodeAddr::Unix("/run/b.sock".into())
            ]
        );
        assert_eq!(u.addrs[1].to_string(), "unix:///run/b.sock");
        assert_eq!(t.addrs[0].to_string(), "skiff://a:4747");
    }

    #[test]
    fn bad_address_lists_name_the_bad_part() {
        for (loc, says) in [
            ("skiff://", "empty"),
            ("skiff://a:1,,b:2", "empty"),
            ("skiff://a:1,", "trailing comma"),
            ("skiff://,a:1", "empty"),
            ("skiff://a:99999", "port"),
            ("skiff://a:x", "port"),
            ("skiff://a:0", "port 0"),
            ("skiff://:4747", "host"),
            ("skiff://a b:1", "host"),
            ("skiff://[::1:4747", "not closed"),
            ("skiff://[zz]:1", "IPv6"),
            ("skiff://[::1]x", ":port"),
            ("unix:///a.sock,,/b.sock", "empty"),
        ] {
            let e = parse_target(loc).unwrap_err();
            assert!(matches!(e, LocatorError::Address { .. }), "{loc}: {e}");
            assert!(e.to_string().contains(says), "{loc}: {e}");
        }
        let e = parse_target("skiff://a,b?pong=1s").unwrap_err().to_string();
        assert!(e.contains("pong") && e.contains("ping_timeout"), "{e}");
        let e = parse_target("skiff://a,b?ping=fast")
            .unwrap_err()
            .to_string();
        assert!(e.contains("ping") && e.contains("duration"), "{e}");
        let e = parse_target("skiff://a,b?ping=1s&ping_timeout=500ms")
            .unwrap_err()
            .to_string();
        assert!(e.contains("longer than ping"), "{e}");
        let e = parse_target("skiff://a?reconnect=maybe")
            .unwrap_err()
            .to_string();
        assert!(e.contains("true or false"), "{e}");
        let e = parse_target("udp://a:1").unwrap_err().to_string();
        assert!(e.contains("skiff, tcp, unix"), "{e}");
    }
}
