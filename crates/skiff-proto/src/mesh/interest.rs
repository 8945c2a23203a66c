//! Interest: what this node advertises (patterns its clients subscribe
//! to, its capacity in each cluster) and what each peer advertises, kept
//! in step by versioned deltas, digests and full snapshots; and routing
//! over the peers' interest ([`Mesh::route`], [`Mesh::cluster_peers`]).
//!
//! A receiver applies a delta only on top of the version it holds, so a
//! duplicate or replay is counted and ignored; a gap, an unknown epoch or
//! a digest that differs makes it ask for a snapshot, which may travel in
//! many parts. Interest packets from one peer are rate-limited (a token
//! bucket of [`MeshConfig::interest_rate`](super::MeshConfig) per second)
//! and what one peer may hold is bounded (`max_interest`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rustc_hash::{FxHashMap, FxHashSet};

use super::packet::{self, Kind, Op, Reader};
use super::{Mesh, MeshEvent};
use crate::router::{SubId, Subject, Syntax};
use crate::WireError;

/// This node's own advertised interest.
#[derive(Debug, Default)]
pub(super) struct Local {
    /// Changes with every process start: a peer that sees a new epoch
    /// asks for a snapshot.
    pub(super) epoch: u64,
    /// Deltas sent in this epoch.
    pub(super) version: u64,
    /// Local subscriptions per (pattern kind, pattern, type).
    subs: FxHashMap<Key, u32>,
    clusters: FxHashMap<String, u32>,
    /// Changes not yet sent.
    pending: Vec<Op>,
}

impl Local {
    pub(super) fn new(epoch: u64) -> Local {
        Local {
            epoch,
            ..Local::default()
        }
    }
}

/// One advertised interest: (pattern kind, pattern, type pattern, best
/// effort). A best-effort subscription (`reliable=false`) is interest of
/// its own, so a node knows which copies no reliable subscriber wants.
pub(super) type Key = (Syntax, String, String, bool);

/// The key of a subscribe or unsubscribe op.
fn key_of(op: &Op) -> Option<(Syntax, &str, &str, bool)> {
    match op {
        Op::Sub(p, k) | Op::Unsub(p, k) => Some((Syntax::Tokens, p, k, false)),
        Op::CmsgSub(p, k) | Op::CmsgUnsub(p, k) => Some((Syntax::Cmsg, p, k, false)),
        Op::LossySub(s, p, k) | Op::LossyUnsub(s, p, k) => Some((*s, p, k, true)),
        Op::Cluster(..) => None,
    }
}

/// A snapshot arriving in parts.
#[derive(Debug)]
struct Staging {
    epoch: u64,
    version: u64,
    parts: u16,
    got: Vec<bool>,
    ops: Vec<Op>,
}

/// What one peer advertises, as far as this node knows.
#[derive(Debug)]
pub(super) struct PeerInterest {
    /// Interest epoch and version held (epoch 0: none yet).
    epoch: u64,
    pub(super) version: u64,
    pub(super) subs: FxHashMap<Key, SubId>,
    pub(super) clusters: FxHashMap<String, u32>,
    staging: Option<Staging>,
    sync_asked: Option<Instant>,
    /// The rate limit's token bucket.
    tokens: f64,
    refilled: Instant,
}

impl PeerInterest {
    pub(super) fn new(now: Instant, rate: u32) -> PeerInterest {
        PeerInterest {
            epoch: 0,
            version: 0,
            subs: FxHashMap::default(),
            clusters: FxHashMap::default(),
            staging: None,
            sync_asked: None,
            tokens: rate as f64,
            refilled: now,
        }
    }
}

impl Mesh {
    // ---- local interest ----

    /// A local subscription to token pattern `pattern` and type `kind` was
    /// added. Peers learn of the first one per (pattern, type) at the next
    /// [`Mesh::poll_transmit`].
    pub fn add_interest(&mut self, pattern: &str, kind: &str) {
        self.add_interest_as(Syntax::Tokens, pattern, kind);
    }

    /// A local subscription with patterns of kind `syntax` was added (see
    /// [`Mesh::add_interest`]); the kind travels with the interest.
    pub fn add_interest_as(&mut self, syntax: Syntax, pattern: &str, kind: &str) {
        self.add_interest_with(syntax, pattern, kind, false);
    }

    /// As [`Mesh::add_interest_as`], for a best-effort subscription when
    /// `lossy` (`reliable=false`): a peer sends copies that no reliable
    /// subscription here wants as datagrams.
    pub fn add_interest_with(&mut self, syntax: Syntax, pattern: &str, kind: &str, lossy: bool) {
        let n = self
            .local
            .subs
            .entry((syntax, pattern.to_owned(), kind.to_owned(), lossy))
            .or_default();
        *n += 1;
        if *n == 1 {
            self.local.pending.push(Op::sub_as(
                syntax,
                pattern.to_owned(),
                kind.to_owned(),
                lossy,
            ));
        }
    }

    /// A local token subscription was removed; the last one per (pattern,
    /// type) is withdrawn from peers at the next [`Mesh::poll_transmit`].
    pub fn remove_interest(&mut self, pattern: &str, kind: &str) {
        self.remove_interest_as(Syntax::Tokens, pattern, kind);
    }

    /// As [`Mesh::remove_interest`], for patterns of kind `syntax`.
    pub fn remove_interest_as(&mut self, syntax: Syntax, pattern: &str, kind: &str) {
        self.remove_interest_with(syntax, pattern, kind, false);
    }

    /// As [`Mesh::remove_interest_as`], for a best-effort subscription
    /// when `lossy`.
    pub fn remove_interest_with(&mut self, syntax: Syntax, pattern: &str, kind: &str, lossy: bool) {
        let key = (syntax, pattern.to_owned(), kind.to_owned(), lossy);
        if let Some(n) = self.local.subs.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.local.subs.remove(&key);
                self.local
                    .pending
                    .push(Op::unsub_as(key.0, key.1, key.2, key.3));
            }
        }
    }

    /// This node's total capacity in `cluster` (0: no local members).
    pub fn set_cluster(&mut self, cluster: &str, capacity: u32) {
        let old = if capacity == 0 {
            self.local.clusters.remove(cluster).unwrap_or(0)
        } else {
            self.local
                .clusters
                .insert(cluster.to_owned(), capacity)
                .unwrap_or(0)
        };
        if old != capacity {
            self.local
                .pending
                .push(Op::Cluster(cluster.to_owned(), capacity));
        }
    }

    // ---- routing ----

    /// Appends to `out` each up peer (once) with interest in a message on
    /// `subject` of type `kind`.
    pub fn route(&self, subject: &str, kind: Option<&str>, out: &mut Vec<SocketAddr>) {
        let Ok(s) = Subject::new(subject) else { return };
        let start = out.len();
        self.interest.for_each_match(s, kind, |_, (peer, _)| {
            if !out[start..].contains(&peer) {
                out.push(peer);
            }
        });
    }

    /// As [`Mesh::route`], with whether each peer wants the message
    /// reliably: `true` if any of its matching subscriptions is reliable,
    /// `false` if all are best effort (`reliable=false`).
    pub fn route_reliable(
        &self,
        subject: &str,
        kind: Option<&str>,
        out: &mut Vec<(SocketAddr, bool)>,
    ) {
        let Ok(s) = Subject::new(subject) else { return };
        let start = out.len();
        self.interest.for_each_match(s, kind, |_, (peer, lossy)| {
            match out[start..].iter_mut().find(|(p, _)| *p == peer) {
                Some((_, reliable)) => *reliable |= !lossy,
                None => out.push((peer, !lossy)),
            }
        });
    }

    /// Each up peer with members in `cluster`, with its capacity there.
    pub fn cluster_peers<'a>(
        &'a self,
        cluster: &'a str,
    ) -> impl Iterator<Item = (SocketAddr, u32)> + 'a {
        self.peers
            .values()
            .filter(|p| p.up)
            .filter_map(move |p| p.interest.clusters.get(cluster).map(|c| (p.id.addr, *c)))
    }

    // ---- sending ----

    /// Sends the pending local changes to every up member, as deltas of
    /// at most one datagram each.
    pub(super) fn send_deltas(&mut self) {
        if self.local.pending.is_empty() {
            return;
        }
        let ops = std::mem::take(&mut self.local.pending);
        let room = self.config.max_datagram.max(512) - packet::ENVELOPE - 16 - 5;
        let mut start = 0;
        while start < ops.len() {
            let end = fill(&ops, start, room);
            let mut d = self.out.buffer();
            packet::envelope(&mut d, Kind::Delta, self.net);
            d.extend_from_slice(&self.local.epoch.to_le_bytes());
            d.extend_from_slice(&self.local.version.to_le_bytes());
            packet::put_ops(&mut d, ops[start..end].iter());
            self.local.version += 1;
            self.send_to_up_members(&d);
            self.out.recycle(d);
            start = end;
        }
    }

    /// Sends the digest of this node's interest (epoch, version) to every
    /// up member.
    pub(super) fn send_digest(&mut self) {
        let mut d = self.out.buffer();
        packet::envelope(&mut d, Kind::Digest, self.net);
        d.extend_from_slice(&self.local.epoch.to_le_bytes());
        d.extend_from_slice(&self.local.version.to_le_bytes());
        self.send_to_up_members(&d);
        self.out.recycle(d);
    }

    fn send_to_up_members(&mut self, d: &[u8]) {
        for p in self.peers.values().filter(|p| p.up) {
            let mut c = self.out.buffer();
            c.extend_from_slice(d);
            self.out.push(p.id.addr, c);
        }
    }

    /// Sends this node's whole interest to `to`, in as many parts as it
    /// takes.
    pub(super) fn send_full(&mut self, to: SocketAddr) {
        self.stats.syncs_sent += 1;
        let ops: Vec<Op> = self
            .local
            .subs
            .keys()
            .map(|(s, p, k, l)| Op::sub_as(*s, p.clone(), k.clone(), *l))
            .chain(
                self.local
                    .clusters
                    .iter()
                    .map(|(c, n)| Op::Cluster(c.clone(), *n)),
            )
            .collect();
        let room = self.config.max_datagram.max(512) - packet::ENVELOPE - 20 - 5;
        let mut chunks: Vec<&[Op]> = Vec::new();
        let mut start = 0;
        while start < ops.len() || chunks.is_empty() {
            let end = fill(&ops, start, room);
            chunks.push(&ops[start..end]);
            start = end;
            if chunks.len() == u16::MAX as usize {
                break;
            }
        }
        let parts = chunks.len() as u16;
        for (i, c) in chunks.iter().enumerate() {
            let mut d = self.out.buffer();
            packet::envelope(&mut d, Kind::Full, self.net);
            d.extend_from_slice(&self.local.epoch.to_le_bytes());
            d.extend_from_slice(&self.local.version.to_le_bytes());
            d.extend_from_slice(&(i as u16).to_le_bytes());
            d.extend_from_slice(&parts.to_le_bytes());
            packet::put_ops(&mut d, c.iter());
            self.out.push(to, d);
        }
    }

    /// Asks `addr` for its whole interest (at most once per 300 ms).
    pub(super) fn ask_sync(&mut self, addr: SocketAddr) {
        let now = self.now;
        let Some(p) = self.peers.get_mut(&addr) else {
            return;
        };
        if p.interest
            .sync_asked
            .is_some_and(|t| now < t + Duration::from_millis(300))
        {
            return;
        }
        p.interest.sync_asked = Some(now);
        self.stats.syncs_requested += 1;
        let mut d = self.out.buffer();
        packet::envelope(&mut d, Kind::Sync, self.net);
        self.out.push(addr, d);
    }

    // ---- receiving ----

    /// Whether an interest packet from `from` is within its rate (takes a
    /// token if so).
    pub(super) fn take_token(&mut self, from: SocketAddr) -> bool {
        let rate = self.config.interest_rate as f64;
        let now = self.now;
        let Some(p) = self.peers.get_mut(&from) else {
            return false;
        };
        let i = &mut p.interest;
        let dt = now.saturating_duration_since(i.refilled).as_secs_f64();
        i.refilled = now;
        i.tokens = (i.tokens + dt * rate).min(rate.max(1.0));
        if i.tokens >= 1.0 {
            i.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// An interest packet (delta, digest, sync request or snapshot part)
    /// from the up member `from`.
    pub(super) fn handle_interest(
        &mut self,
        kind: Kind,
        from: SocketAddr,
        body: &[u8],
    ) -> Result<(), WireError> {
        let mut r = Reader::new(body);
        match kind {
            Kind::Delta => {
                let (epoch, base) = (r.u64("mesh packet")?, r.u64("mesh packet")?);
                let ops = packet::get_ops(&mut r)?;
                let p = &self.peers.get(&from).expect("up").interest;
                if epoch != p.epoch || base > p.version {
                    self.ask_sync(from);
                } else if base < p.version {
                    self.stats.stale_interest += 1;
                } else {
                    self.apply(from, ops);
                    if let Some(p) = self.peers.get_mut(&from) {
                        p.interest.version += 1;
                    }
                }
            }
            Kind::Digest => {
                let (epoch, version) = (r.u64("mesh packet")?, r.u64("mesh packet")?);
                let p = &self.peers.get(&from).expect("up").interest;
                if epoch != p.epoch || version != p.version {
                    self.ask_sync(from);
                }
            }
            Kind::Sync => self.send_full(from),
            Kind::Full => {
                let (epoch, version, part, parts) = (
                    r.u64("mesh packet")?,
                    r.u64("mesh packet")?,
                    r.u16("mesh packet")?,
                    r.u16("mesh packet")?,
                );
                if part >= parts {
                    return Err(WireError::Malformed("part index past its count"));
                }
                let ops = packet::get_ops(&mut r)?;
                if ops.iter().any(Op::is_unsub) {
                    return Err(WireError::Malformed("unsubscribe in a snapshot"));
                }
                self.stage(from, epoch, version, part, parts, ops);
            }
            _ => {}
        }
        Ok(())
    }

    /// Takes one part of a snapshot; the last one missing replaces the
    /// peer's interest.
    fn stage(
        &mut self,
        from: SocketAddr,
        epoch: u64,
        version: u64,
        part: u16,
        parts: u16,
        ops: Vec<Op>,
    ) {
        let limit = self.config.max_interest;
        let p = &mut self.peers.get_mut(&from).expect("up").interest;
        let fresh = p
            .staging
            .as_ref()
            .is_none_or(|s| s.epoch != epoch || s.version != version || s.parts != parts);
        if fresh {
            p.staging = Some(Staging {
                epoch,
                version,
                parts,
                got: vec![false; parts as usize],
                ops: Vec::new(),
            });
        }
        let s = p.staging.as_mut().expect("set");
        if !s.got[part as usize] {
            s.got[part as usize] = true;
            let room = limit.saturating_sub(s.ops.len());
            if ops.len() > room {
                self.stats.interest_limit += (ops.len() - room) as u64;
            }
            s.ops.extend(ops.into_iter().take(room));
        }
        if s.got.iter().all(|g| *g) {
            let s = p.staging.take().expect("set");
            self.replace(from, s.epoch, s.version, s.ops);
        }
    }

    /// Applies a peer's ops in order.
    fn apply(&mut self, from: SocketAddr, ops: Vec<Op>) {
        let limit = self.config.max_interest;
        let p = &mut self.peers.get_mut(&from).expect("known").interest;
        for op in ops {
            let (syntax, lossy) = match &op {
                Op::CmsgSub(..) | Op::CmsgUnsub(..) => (Syntax::Cmsg, false),
                Op::LossySub(s, ..) | Op::LossyUnsub(s, ..) => (*s, true),
                _ => (Syntax::Tokens, false),
            };
            match op {
                Op::Sub(pat, kind) | Op::CmsgSub(pat, kind) | Op::LossySub(_, pat, kind) => {
                    let key = (syntax, pat, kind, lossy);
                    if p.subs.contains_key(&key) {
                        continue;
                    }
                    if p.subs.len() + p.clusters.len() >= limit {
                        self.stats.interest_limit += 1;
                        continue;
                    }
                    // A pattern that does not parse is the peer's bug:
                    // counted, not routed.
                    match self
                        .interest
                        .subscribe_as(syntax, &key.1, &key.2, (from, lossy))
                    {
                        Ok(id) => {
                            p.subs.insert(key, id);
                        }
                        Err(_) => self.stats.malformed += 1,
                    }
                }
                Op::Unsub(pat, kind) | Op::CmsgUnsub(pat, kind) | Op::LossyUnsub(_, pat, kind) => {
                    if let Some(id) = p.subs.remove(&(syntax, pat, kind, lossy)) {
                        self.interest.unsubscribe(id);
                    }
                }
                Op::Cluster(c, cap) => {
                    let changed = if cap == 0 {
                        p.clusters.remove(&c).is_some()
                    } else if p.clusters.len() + p.subs.len() >= limit
                        && !p.clusters.contains_key(&c)
                    {
                        self.stats.interest_limit += 1;
                        false
                    } else {
                        p.clusters.insert(c.clone(), cap) != Some(cap)
                    };
                    if changed {
                        self.events.push_back(MeshEvent::Cluster {
                            peer: from,
                            cluster: c,
                            capacity: cap,
                        });
                    }
                }
            }
        }
    }

    /// Replaces a peer's interest by a complete snapshot.
    fn replace(&mut self, from: SocketAddr, epoch: u64, version: u64, ops: Vec<Op>) {
        let p = &mut self.peers.get_mut(&from).expect("known").interest;
        let new_clusters: FxHashMap<&str, u32> = ops
            .iter()
            .filter_map(|o| match o {
                Op::Cluster(c, n) => Some((c.as_str(), *n)),
                _ => None,
            })
            .collect();
        let mut ops2 = Vec::new();
        // Withdraw what the snapshot no longer holds.
        let new_subs: FxHashSet<(Syntax, &str, &str, bool)> =
            ops.iter().filter_map(key_of).collect();
        for (s, a, b, l) in p.subs.keys() {
            if !new_subs.contains(&(*s, a.as_str(), b.as_str(), *l)) {
                ops2.push(Op::unsub_as(*s, a.clone(), b.clone(), *l));
            }
        }
        for c in p.clusters.keys() {
            if !new_clusters.contains_key(c.as_str()) {
                ops2.push(Op::Cluster(c.clone(), 0));
            }
        }
        p.epoch = epoch;
        p.version = version;
        p.sync_asked = None;
        ops2.extend(ops);
        self.apply(from, ops2);
    }

    /// Drops everything a peer that went down advertised.
    pub(super) fn forget_interest(&mut self, addr: SocketAddr) {
        let Some(p) = self.peers.get_mut(&addr) else {
            return;
        };
        let p = &mut p.interest;
        for (_, id) in p.subs.drain() {
            self.interest.unsubscribe(id);
        }
        for (c, _) in p.clusters.drain() {
            self.events.push_back(MeshEvent::Cluster {
                peer: addr,
                cluster: c,
                capacity: 0,
            });
        }
        p.epoch = 0;
        p.version = 0;
        p.staging = None;
    }
}

/// The end of the run of `ops` from `start` whose encoding fits in
/// `room` bytes (at least one op).
fn fill(ops: &[Op], start: usize, room: usize) -> usize {
    let (mut end, mut size) = (start, 0);
    while end < ops.len() && (end == start || size + packet::op_len(&ops[end]) <= room) {
        size += packet::op_len(&ops[end]);
        end += 1;
    }
    end
}
