//! Client failover (cMsg): what a `skiff://a:4747,b:4747` client does when
//! its node dies, and how it tells the application.
//!
//! The link is declared lost on end of stream, a read or write error, a
//! `shutdown` error frame from the node, or silence: when nothing arrives
//! for `ping` the client sends a `Ping`, and when still nothing arrives
//! within `ping_timeout` of the last byte heard the node counts as dead.
//! The client then moves round robin through the list (the next address
//! first), retrying with a short bounded backoff until it gets a node or
//! is closed, and re-registers there every subscription and cluster
//! membership it holds (same ids, same options, full credit window).
//!
//! What the application sees:
//! - [`ClientEvent::Disconnected`] then [`ClientEvent::Reconnected`] on
//!   [`super::Client::events`]; the second carries the [`Gap`] (from, to,
//!   when the link went down and came back). `Reconnected` is sent once the
//!   new node holds every restored interest.
//! - On each live subscription the first delivery after a failover carries
//!   the gap ([`super::Delivery::gap`]) and [`super::Subscription::gaps`]
//!   counts failovers; [`super::Member::gaps`] does the same for members.
//! - Calls waiting on the lost node (requests, subscribe, join, stats,
//!   flush, tunnel open) fail at once with [`crate::Error::NodeLost`]; tunnels end.
//!   Replies to requests that came from the lost node fail the same way
//!   (their tokens mean nothing to the new node).
//! - Publishes and broadcasts made while no node is reachable are held in a
//!   bounded buffer (`reconnect_buffer`, default 1 MiB; 0 refuses at once)
//!   and sent after the restore; once it is full a publish fails with
//!   [`crate::Error::NodeLost`]. Both are counted ([`LinkStats`]). Frames queued
//!   to the lost node but not yet written are lost (at most once).
//!
//! Nothing is delivered twice by the client: it never replays messages.

use std::fmt;
use std::future::poll_fn;
use std::net::{Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

use std::sync::atomic::Ordering;

use skiff_proto::client_frame::ClientFrame;

use super::inbox::{self, Inbox, Shared};
use super::link::Link;
use super::link::StreamTx;
use super::{Client, Inner, ReqEvent, NODES_KEPT};
use crate::locator::{parse_bool, parse_bytes, parse_duration, Locator, DEFAULT_PORT};
use crate::LocatorError;

/// Events a listener keeps before it drops the oldest (see
/// [`Events::lagged`]).
const EVENTS_KEPT: usize = 256;

/// Longest wait between two rounds through the address list.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_millis(500);

/// First wait after a round in which no address answered.
pub(crate) const BACKOFF_MIN: Duration = Duration::from_millis(10);

/// One address of a node list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NodeAddr {
    /// `host:port` (a name is resolved at each connection attempt).
    Tcp(String),
    /// A Unix socket path.
    Unix(PathBuf),
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeAddr::Tcp(a) => write!(f, "skiff://{a}"),
            NodeAddr::Unix(p) => write!(f, "unix://{}", p.display()),
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
    /// Longest wait for one address to connect and welcome the client.
    pub(crate) connect_timeout: Duration,
    /// Polling after a read before the runtime sleeps (see
    /// [`crate::spin`]); zero: off.
    pub(crate) spin: Duration,
}

/// A parsed node locator: the addresses and the link options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeTarget {
    pub(crate) addrs: Vec<NodeAddr>,
    pub(crate) opts: LinkOptions,
}

const OPTIONS: &str = "reconnect, ping, ping_timeout, reconnect_buffer, connect_timeout, spin_us";

/// Parses `skiff://h:p[,h:p…]`, `tcp://…` or `unix:///path[,/path…]` with
/// the link options `reconnect`, `ping`, `ping_timeout`,
/// `reconnect_buffer`, `connect_timeout` and `spin_us`.
pub(crate) fn parse_target(locator: &str) -> Result<NodeTarget, LocatorError> {
    let l: Locator = locator.parse()?;
    l.expect_scheme("skiff, tcp, unix")?;
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
        addrs.push(if l.scheme == "unix" {
            NodeAddr::Unix(a.into())
        } else {
            NodeAddr::Tcp(host_port(a)?)
        });
    }
    let mut reconnect = None;
    let mut ping = None;
    let mut ping_timeout = None;
    let mut reconnect_buffer = 1 << 20;
    let mut connect_timeout = Duration::from_millis(1500);
    let mut spin_us = crate::spin::DEFAULT_SPIN_US;
    l.options(OPTIONS, |k, v| {
        match k {
            "reconnect" => reconnect = Some(parse_bool(k, v)?),
            "ping" => ping = Some(parse_duration(k, v)?),
            "ping_timeout" => ping_timeout = Some(parse_duration(k, v)?),
            "reconnect_buffer" => reconnect_buffer = parse_bytes(k, v)?,
            "connect_timeout" => connect_timeout = parse_duration(k, v)?,
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
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    let reconnect = reconnect.unwrap_or(addrs.len() > 1);
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
            connect_timeout,
            spin: Duration::from_micros(spin_us),
        },
    })
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

/// A window during which the client had no node: messages published then
/// (and requests, broadcasts for its clusters) may have been missed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// The node that was lost, as in the locator (`skiff://host:port` or
    /// `unix:///path`).
    pub from: String,
    /// The node reached.
    pub to: String,
    /// When the link was declared lost (wall clock).
    pub down_at: SystemTime,
    /// When the new node welcomed the client (wall clock).
    pub up_at: SystemTime,
    /// How long the client had no node (monotonic clock). The link may
    /// have died up to `ping_timeout` before `down_at` when the node went
    /// silent rather than closing.
    pub down_for: Duration,
    /// Connection attempts it took.
    pub attempts: u32,
}

/// What happened to a client's link to its node (see
/// [`super::Client::events`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientEvent {
    /// The link to `node` was lost; the client is failing over. Calls in
    /// flight failed with [`crate::Error::NodeLost`].
    Disconnected {
        /// The node lost.
        node: String,
        /// When (wall clock).
        at: SystemTime,
        /// Why: end of stream, an error, or no answer to pings.
        reason: String,
    },
    /// The client reached another node (or the same one again) and that
    /// node now holds every restored subscription and membership.
    Reconnected(Gap),
    /// The client is closed for good (by the application, or the node
    /// closed it with an error); no more events follow.
    Closed {
        /// Why.
        reason: String,
    },
}

/// Counters of a client's link: failovers and what happened to publishes
/// made while it had no node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LinkStats {
    /// The node connected to now (`None` while failing over, in process or
    /// closed).
    pub node: Option<String>,
    /// Failovers completed.
    pub failovers: u64,
    /// Publishes and broadcasts held while no node was reachable (sent
    /// after the restore).
    pub held: u64,
    /// Publishes and broadcasts refused with [`crate::Error::NodeLost`] while no
    /// node was reachable (buffer full or `reconnect_buffer=0`).
    pub refused: u64,
}

/// The stream of a client's [`ClientEvent`]s from the moment
/// [`super::Client::events`] was called; ends after
/// [`ClientEvent::Closed`]. Keeps the last 256 events if not read.
#[derive(Debug)]
pub struct Events {
    inbox: Shared<ClientEvent>,
}

impl Events {
    /// The next event; `None` once the client is closed and every event
    /// was read.
    pub async fn recv(&mut self) -> Option<ClientEvent> {
        poll_fn(|cx| self.inbox.lock().poll_pop(cx)).await
    }

    /// The next event if one is here now.
    pub fn try_recv(&mut self) -> Option<ClientEvent> {
        self.inbox.lock().q.pop_front()
    }

    /// Events dropped because more than 256 were waiting.
    pub fn lagged(&self) -> u64 {
        self.inbox.lock().dropped
    }
}

impl futures_core::Stream for Events {
    type Item = ClientEvent;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ClientEvent>> {
        self.inbox.lock().poll_pop(cx)
    }
}

/// The listeners of one client.
#[derive(Debug, Default)]
pub(crate) struct Listeners {
    list: Vec<Weak<Mutex<Inbox<ClientEvent>>>>,
    closed: bool,
}

impl Listeners {
    /// A new listener (already ended if the client is closed).
    pub(crate) fn listen(&mut self) -> Events {
        let inbox = inbox::shared();
        if self.closed {
            inbox.lock().close(None);
        } else {
            self.list.push(Arc::downgrade(&inbox));
        }
        Events { inbox }
    }

    /// Hands `ev` to every listener; a [`ClientEvent::Closed`] ends them.
    pub(crate) fn emit(&mut self, ev: ClientEvent) {
        if self.closed {
            return;
        }
        let last = matches!(ev, ClientEvent::Closed { .. });
        self.list.retain(|w| {
            let Some(i) = w.upgrade() else {
                return false;
            };
            let mut i = i.lock();
            if i.q.len() >= EVENTS_KEPT {
                i.q.pop_front();
                i.dropped += 1;
            }
            i.push(ev.clone());
            if last {
                i.close(None);
            }
            true
        });
        if last {
            self.closed = true;
            self.list.clear();
        }
    }
}

/// What the application asks about its link.
impl Client {
    /// The client's link events (failovers, closing) from now on: see
    /// [`ClientEvent`]. Each call makes an independent listener.
    pub fn events(&self) -> Events {
        self.inner.state.lock().listeners.listen()
    }

    /// The node this client is connected to now, as in its locator; `None`
    /// while failing over, in process (`mem://`) or once closed.
    pub fn node(&self) -> Option<String> {
        self.inner.state.lock().node.clone()
    }

    /// The link's counters: failovers, and publishes held or refused while
    /// no node was reachable.
    pub fn link_stats(&self) -> LinkStats {
        let (held, refused) = match &self.inner.link {
            Some(Link::Stream(tx)) => tx.held_refused(),
            _ => (0, 0),
        };
        let st = self.inner.state.lock();
        LinkStats {
            node: st.node.clone(),
            failovers: st.failovers,
            held,
            refused,
        }
    }
}

/// What the link driver does to the client's state on a failover.
impl Inner {
    /// The link to `node` was lost at `at` (failover follows): calls in
    /// flight fail with [`crate::Error::NodeLost`], tunnels end, and what is
    /// registered stays to be restored on the next node. True if `node`
    /// had not yet confirmed a restore (the previous gap is not over).
    pub(crate) fn lost(&self, tx: &StreamTx, node: &str, at: SystemTime, why: String) -> bool {
        let mut st = self.state.lock();
        let st = &mut *st;
        self.epoch.fetch_add(1, Ordering::AcqRel);
        tx.go_down(node);
        st.node = None;
        let unconfirmed = st.restoring.take().is_some();
        for (_, w) in st.waiters.drain() {
            let _ = w.send(Err(crate::Error::NodeLost { node: node.into() }));
        }
        for (_, r) in st.requests.drain() {
            let _ = r.send(ReqEvent::Lost(node.into()));
        }
        for (_, t) in st.tunnels.drain() {
            t.lose(node);
        }
        st.joins.clear();
        st.subs.retain(|_, s| s.live);
        for s in st.subs.values() {
            s.inbox.lock().lost();
        }
        st.members.retain(|_, m| m.capacity.is_some());
        st.listeners.emit(ClientEvent::Disconnected {
            node: node.into(),
            at,
            reason: why,
        });
        unconfirmed
    }

    /// A new node welcomed the client (id `client`): re-register every
    /// subscription (same id and options, a full credit window) and
    /// membership there, then a ping whose answer reports the gap; the
    /// publishes held meanwhile follow.
    pub(crate) fn restore(&self, tx: &StreamTx, gap: Gap, client: u64, max_payload: u64) {
        self.id.store(client, Ordering::Relaxed);
        self.max_payload
            .store(max_payload as usize, Ordering::Relaxed);
        let mut out = Vec::new();
        let mut st = self.state.lock();
        let st = &mut *st;
        let shared = Arc::new(gap.clone());
        for (&sid, s) in &st.subs {
            ClientFrame::Sub {
                sid,
                pattern: s.pattern.clone(),
                kind: s.kind.clone(),
                policy: s.opts.policy,
                queue: s.opts.queue.max(1),
                credit: s.opts.window.max(1),
            }
            .encode(&mut out);
            let mut i = s.inbox.lock();
            i.gaps += 1;
            i.pending_gap = Some(shared.clone());
        }
        for (name, m) in &st.members {
            if let Some(capacity) = m.capacity {
                let corr = self.next_id();
                st.joins.insert(corr, (name.clone(), capacity));
                ClientFrame::Join {
                    corr,
                    cluster: name.clone(),
                    capacity,
                }
                .encode(&mut out);
                m.inbox.lock().gaps += 1;
            }
        }
        let corr = self.next_id();
        ClientFrame::Ping { corr }.encode(&mut out);
        let epoch = self.epoch();
        if st.nodes.len() >= NODES_KEPT {
            st.nodes.remove(0);
        }
        st.nodes.push((epoch, gap.to.clone()));
        st.node = Some(gap.to.clone());
        st.restoring = Some((corr, gap));
        tx.go_up(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn listeners_keep_a_bounded_tail_and_end_on_close() {
        let mut l = Listeners::default();
        let mut ev = l.listen();
        for i in 0..300 {
            l.emit(ClientEvent::Disconnected {
                node: i.to_string(),
                at: SystemTime::UNIX_EPOCH,
                reason: String::new(),
            });
        }
        assert_eq!(ev.lagged(), 44);
        l.emit(ClientEvent::Closed { reason: "x".into() });
        let mut n = 0;
        while let Some(e) = ev.try_recv() {
            n += 1;
            if let ClientEvent::Disconnected { node, .. } = &e {
                assert_eq!(n, 1 + node.parse::<usize>().unwrap() - 45);
            }
        }
        assert_eq!(n, 256);
        assert!(ev.inbox.lock().closed);
        assert!(l.listen().inbox.lock().closed, "late listeners end at once");
    }
}
