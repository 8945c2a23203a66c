//! Membership: who is in the mesh. SWIM by the `foca` crate, whose
//! runtime output (packets, timers, notifications) this module turns into
//! the mesh's datagrams, deadlines and [`MeshEvent::Up`] /
//! [`MeshEvent::Down`]; plus seeds, scouting hellos and the bound on the
//! member table.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::num::{NonZeroU8, NonZeroUsize};
use std::time::{Duration, Instant};

use foca::{
    AccumulatingRuntime, Foca, Identity, NoCustomBroadcast, OwnedNotification, PostcardCodec,
};
use rand::rngs::SmallRng;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::packet::{self, Kind, Reader};
use super::{Mesh, MeshConfig, MeshEvent, Peer};

/// A node's identity in the mesh: its mesh address and a generation that
/// grows when it rejoins after being declared down (SWIM forbids reusing
/// a dead identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeId {
    /// The node's mesh (UDP) address.
    pub addr: SocketAddr,
    /// Generation; the higher wins for the same address.
    pub gen: u64,
}

impl Identity for NodeId {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        Some(NodeId {
            addr: self.addr,
            gen: self.gen.checked_add(1)?,
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.gen > adversary.gen
    }
}

type Swim = Foca<NodeId, PostcardCodec, SmallRng, NoCustomBroadcast>;

/// foca and what it asked of its runtime: timers by deadline, and the
/// seeds announced to until they are members.
pub(super) struct Membership {
    foca: Swim,
    rt: AccumulatingRuntime<NodeId>,
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    timer_events: FxHashMap<u64, foca::Timer<NodeId>>,
    next_timer: u64,
    seeds: Vec<SocketAddr>,
}

impl Membership {
    /// SWIM for `me`, its timings from `config`, its random choices from
    /// `rng`.
    pub(super) fn new(me: NodeId, config: &MeshConfig, rng: SmallRng) -> Membership {
        let fc = foca::Config {
            probe_period: config.probe_period,
            probe_rtt: config.probe_period * 2 / 5,
            num_indirect_probes: NonZeroUsize::new(3).expect("3"),
            max_transmissions: NonZeroU8::new(8).expect("8"),
            suspect_to_down_after: config.suspect_to_down,
            remove_down_after: Some(Duration::from_secs(60)),
            max_packet_size: NonZeroUsize::new(
                config.max_datagram.clamp(512, 65_000) - packet::ENVELOPE,
            )
            .expect("non-zero"),
            notify_down_members: true,
            periodic_announce: Some(foca::PeriodicParams {
                frequency: Duration::from_secs(10),
                num_members: NonZeroUsize::new(1).expect("1"),
            }),
            periodic_announce_to_down_members: Some(foca::PeriodicParams {
                frequency: Duration::from_secs(2),
                num_members: NonZeroUsize::new(2).expect("2"),
            }),
            periodic_gossip: Some(foca::PeriodicParams {
                frequency: Duration::from_millis(200),
                num_members: NonZeroUsize::new(3).expect("3"),
            }),
        };
        Membership {
            foca: Foca::new(me, fc, rng, PostcardCodec),
            rt: AccumulatingRuntime::new(),
            timers: BinaryHeap::new(),
            timer_events: FxHashMap::default(),
            next_timer: 0,
            seeds: Vec::new(),
        }
    }

    pub(super) fn id(&self) -> NodeId {
        *self.foca.identity()
    }

    /// Whether timer `t` would only do harm: a suspicion's timer whose
    /// member refuted it (or rejoined) meanwhile. foca 2.0.0 then rightly
    /// leaves the member up, but still sends it the message that says it
    /// was declared down, on which the member gives up its identity and
    /// rejoins under a new generation: a healthy node's links restarted,
    /// and what was in flight on them lost, for nothing. The timer is
    /// dropped instead; what it would have done otherwise (declare down a
    /// member still suspected at that incarnation) it still does.
    fn moot(&self, t: &foca::Timer<NodeId>) -> bool {
        let foca::Timer::ChangeSuspectToDown {
            member_id,
            incarnation,
            ..
        } = t
        else {
            return false;
        };
        !self.foca.iter_membership_state().any(|m| {
            m.id() == member_id
                && m.incarnation() == *incarnation
                && m.state() == foca::State::Suspect
        })
    }

    /// The earliest foca timer.
    pub(super) fn next_timer(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((at, _))| *at)
    }
}

impl Mesh {
    /// Asks the node at `addr` (a seed, or one found by scouting) to let
    /// this node in.
    pub fn announce(&mut self, now: Instant, addr: SocketAddr) {
        self.now = now;
        if addr == self.id().addr || self.is_up(addr) {
            return;
        }
        let m = &mut self.membership;
        let _ = m.foca.announce(NodeId { addr, gen: 0 }, &mut m.rt);
        self.drain_membership();
    }

    /// Sets the seed addresses (from configuration or DNS): each is
    /// announced to now, and again at every digest while it is not an up
    /// member, so a lost announce, a seed that starts later or a healed
    /// partition still joins. At most `max_members` are kept.
    pub fn set_seeds(&mut self, now: Instant, seeds: &[SocketAddr]) {
        self.membership.seeds.clear();
        self.membership
            .seeds
            .extend(seeds.iter().copied().take(self.config.max_members));
        self.announce_seeds(now);
    }

    /// Announces to every seed (those already up are skipped).
    pub(super) fn announce_seeds(&mut self, now: Instant) {
        for i in 0..self.membership.seeds.len() {
            let a = self.membership.seeds[i];
            self.announce(now, a);
        }
    }

    /// Writes a scouting hello for the multicast group into `buf`
    /// (replacing what it held): network name and identity.
    pub fn hello(&self, buf: &mut Vec<u8>) {
        packet::envelope(buf, Kind::Hello, self.net);
        let name = &self.config.net.as_bytes()[..self.config.net.len().min(255)];
        buf.push(name.len() as u8);
        buf.extend_from_slice(name);
        buf.extend_from_slice(&self.id().gen.to_le_bytes());
    }

    /// Leaves the mesh gracefully: members learn it at once instead of
    /// suspecting this node.
    pub fn leave(&mut self, now: Instant) {
        self.now = now;
        let m = &mut self.membership;
        let _ = m.foca.leave_cluster(&mut m.rt);
        self.drain_membership();
    }

    /// Members up now.
    pub fn members(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.peers.values().filter(|p| p.up).map(|p| p.id)
    }

    /// Whether the peer at `addr` is an up member.
    pub fn is_up(&self, addr: SocketAddr) -> bool {
        self.peers.get(&addr).is_some_and(|p| p.up)
    }

    pub(super) fn handle_swim(&mut self, from: SocketAddr, body: &[u8]) {
        if !self.peers.contains_key(&from) && self.peers.len() >= self.config.max_members {
            self.stats.member_limit += 1;
            return;
        }
        let m = &mut self.membership;
        if m.foca.handle_data(body, &mut m.rt).is_err() {
            self.stats.bad_membership += 1;
        }
    }

    pub(super) fn handle_hello(&mut self, from: SocketAddr, body: &[u8]) {
        let mut r = Reader::new(body);
        let ok = (|| {
            let n = r.u8("hello")? as usize;
            let name = r
                .rest()
                .get(..n)
                .ok_or(crate::WireError::Truncated { what: "hello" })?;
            Ok::<bool, crate::WireError>(name == self.config.net.as_bytes())
        })();
        match ok {
            Ok(true) => {
                let now = self.now;
                self.announce(now, from);
            }
            Ok(false) => self.stats.wrong_net += 1,
            Err(_) => self.stats.malformed += 1,
        }
    }

    /// The members SWIM suspects now (alive to it until declared down).
    pub(super) fn suspects(&self) -> Vec<SocketAddr> {
        self.membership
            .foca
            .iter_membership_state()
            .filter(|m| m.state() == foca::State::Suspect)
            .map(|m| m.id().addr)
            .collect()
    }

    /// Fires the foca timers due at `now`.
    pub(super) fn membership_timeout(&mut self, now: Instant) {
        while let Some(Reverse((at, n))) = self.membership.timers.peek().copied() {
            if at > now {
                break;
            }
            let m = &mut self.membership;
            m.timers.pop();
            if let Some(t) = m.timer_events.remove(&n) {
                if m.moot(&t) {
                    continue;
                }
                let _ = m.foca.handle_timer(t, &mut m.rt);
                self.drain_membership();
            }
        }
    }

    /// Takes what foca asked of its runtime: packets to send, timers to
    /// set, members that came up or went down.
    pub(super) fn drain_membership(&mut self) {
        while let Some((to, data)) = self.membership.rt.to_send() {
            let mut d = self.out.buffer();
            packet::envelope(&mut d, Kind::Swim, self.net);
            d.extend_from_slice(&data);
            self.out.push(to.addr, d);
        }
        while let Some((after, t)) = self.membership.rt.to_schedule() {
            // Foca arms this timer when it starts suspecting a member.
            if let foca::Timer::ChangeSuspectToDown { member_id, .. } = &t {
                self.events.push_back(MeshEvent::Suspect(*member_id));
            }
            let m = &mut self.membership;
            let n = m.next_timer;
            m.next_timer += 1;
            m.timers.push(Reverse((self.now + after, n)));
            m.timer_events.insert(n, t);
        }
        while let Some(n) = self.membership.rt.to_notify() {
            match n {
                OwnedNotification::MemberUp(id) => self.member_up(id),
                OwnedNotification::MemberDown(id) => self.member_down(id),
                OwnedNotification::Rename(old, new) => {
                    if let Some(p) = self.peers.get_mut(&old.addr) {
                        p.id = new;
                        p.stats.gen = new.gen;
                    }
                }
                OwnedNotification::Rejoin(id) => self.events.push_back(MeshEvent::Rejoined(id)),
                _ => {}
            }
        }
    }

    fn member_up(&mut self, id: NodeId) {
        let (now, rate) = (self.now, self.config.interest_rate);
        let p = self
            .peers
            .entry(id.addr)
            .or_insert_with(|| Peer::new(id, now, rate));
        p.id = id;
        p.stats.gen = id.gen;
        if p.up {
            return;
        }
        p.up = true;
        p.stats.up = true;
        // A fresh stream of data sequence numbers each way.
        p.flow.restart(now);
        self.events.push_back(MeshEvent::Up(id));
        // Both ways: it may have refused ours while it did not know us yet.
        self.send_full(id.addr);
        self.ask_sync(id.addr);
    }

    fn member_down(&mut self, id: NodeId) {
        let Some(p) = self.peers.get_mut(&id.addr) else {
            return;
        };
        if !p.up {
            return;
        }
        p.up = false;
        p.stats.up = false;
        p.flow.drop_pending();
        self.forget_interest(id.addr);
        self.events.push_back(MeshEvent::Down(id));
    }
}
