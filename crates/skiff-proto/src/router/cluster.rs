//! Clusters (Iris): named groups of members serving the same purpose, and
//! the choice of one member for a request.
//!
//! - **Weighted round robin.** [`Clusters::pick`] without a key uses nginx's
//!   *smooth* weighted round robin: each member's `current` grows by its
//!   weight, the largest is chosen and pays back the total. Over any run of
//!   `W` picks (the sum of the weights) with weights unchanged, each member
//!   is chosen exactly its weight's times, and picks of one member are
//!   spread out rather than bunched (weights 5, 1, 1 give `a a b a c a a`).
//!   It is deterministic: the same calls give the same choices.
//! - **Dynamic weights** (Iris's dynamic weighted round robin): a member's
//!   weight is its advertised capacity minus its current load
//!   ([`Clusters::set_load`], e.g. requests in flight), but at least 1, so a
//!   loaded member is chosen less, yet still probed. Capacity 0 means "do
//!   not send me requests": such a member is never picked, though it still
//!   receives broadcasts ([`Clusters::members`]).
//! - **Key affinity.** [`Clusters::pick`] with a key uses weighted
//!   rendezvous (highest random weight) hashing: every member scores
//!   `capacity / -ln(h)`, where `h` in (0, 1) is a hash of the key and the
//!   member, and the highest score wins. The same key goes to the same
//!   member while the member set and capacities stay the same; when a
//!   member leaves only its keys move, and keys spread in proportion to
//!   capacity. Affinity ignores load, so a key does not move when load
//!   changes.
//!
//! Costs: `pick` is O(members of the cluster); `join`, `leave` and
//! `set_load` are O(members of the cluster + clusters of the member).

use std::hash::{Hash, Hasher};

use rustc_hash::{FxHashMap, FxHasher};

#[derive(Debug)]
struct Slot<M> {
    member: M,
    capacity: u32,
    /// Effective weight: 0 if capacity is 0, else capacity minus load, at
    /// least 1.
    weight: u32,
    /// Smooth WRR state.
    current: i64,
    /// The member's hash, for rendezvous hashing.
    hash: u64,
}

#[derive(Debug)]
struct MemberState {
    load: u32,
    clusters: Vec<Box<str>>,
}

/// Named clusters of members `M` (a client id in a node, a node id in a
/// mesh) with advertised capacities: see the module documentation.
#[derive(Debug)]
pub struct Clusters<M> {
    clusters: FxHashMap<Box<str>, Vec<Slot<M>>>,
    members: FxHashMap<M, MemberState>,
}

impl<M: Copy + Eq + Hash> Default for Clusters<M> {
    fn default() -> Self {
        Clusters::new()
    }
}

fn effective_weight(capacity: u32, load: u32) -> u32 {
    if capacity == 0 {
        0
    } else {
        capacity.saturating_sub(load).max(1)
    }
}

/// SplitMix64's finalizer: a good 64-bit mix.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn hash_of<T: Hash + ?Sized>(t: &T) -> u64 {
    let mut h = FxHasher::default();
    t.hash(&mut h);
    mix(h.finish())
}

impl<M: Copy + Eq + Hash> Clusters<M> {
    /// No clusters.
    pub fn new() -> Clusters<M> {
        Clusters {
            clusters: FxHashMap::default(),
            members: FxHashMap::default(),
        }
    }

    /// Adds `member` to `cluster` (created if new) with `capacity`, its
    /// advertised share of the work (0: receives broadcasts but no
    /// requests). Joining again updates the capacity. Returns whether the
    /// member is new to the cluster.
    pub fn join(&mut self, cluster: &str, member: M, capacity: u32) -> bool {
        let state = self.members.entry(member).or_insert_with(|| MemberState {
            load: 0,
            clusters: Vec::new(),
        });
        let weight = effective_weight(capacity, state.load);
        let slots = match self.clusters.get_mut(cluster) {
            Some(s) => s,
            None => self.clusters.entry(cluster.into()).or_default(),
        };
        if let Some(slot) = slots.iter_mut().find(|s| s.member == member) {
            slot.capacity = capacity;
            slot.weight = weight;
            return false;
        }
        slots.push(Slot {
            member,
            capacity,
            weight,
            current: 0,
            hash: hash_of(&member),
        });
        state.clusters.push(cluster.into());
        true
    }

    /// Removes `member` from `cluster`; returns whether it was there. An
    /// empty cluster is forgotten.
    pub fn leave(&mut self, cluster: &str, member: M) -> bool {
        let Some(slots) = self.clusters.get_mut(cluster) else {
            return false;
        };
        let Some(i) = slots.iter().position(|s| s.member == member) else {
            return false;
        };
        slots.remove(i);
        if slots.is_empty() {
            self.clusters.remove(cluster);
        }
        if let Some(state) = self.members.get_mut(&member) {
            state.clusters.retain(|c| &**c != cluster);
            if state.clusters.is_empty() {
                self.members.remove(&member);
            }
        }
        true
    }

    /// The clusters `member` belongs to.
    pub fn clusters_of(&self, member: M) -> impl Iterator<Item = &str> + '_ {
        self.members
            .get(&member)
            .into_iter()
            .flat_map(|s| s.clusters.iter().map(|c| c.as_ref()))
    }

    /// Removes `member` from every cluster (it disconnected); returns from
    /// how many.
    pub fn remove_member(&mut self, member: M) -> usize {
        let Some(state) = self.members.remove(&member) else {
            return 0;
        };
        for cluster in &state.clusters {
            if let Some(slots) = self.clusters.get_mut(cluster) {
                slots.retain(|s| s.member != member);
                if slots.is_empty() {
                    self.clusters.remove(cluster);
                }
            }
        }
        state.clusters.len()
    }

    /// Sets `member`'s current load (e.g. requests in flight) in every
    /// cluster it belongs to: its weight becomes capacity minus load, at
    /// least 1 (0 stays 0). Returns whether the member is known.
    pub fn set_load(&mut self, member: M, inflight: u32) -> bool {
        let Some(state) = self.members.get_mut(&member) else {
            return false;
        };
        state.load = inflight;
        for cluster in &state.clusters {
            if let Some(slots) = self.clusters.get_mut(cluster) {
                for slot in slots.iter_mut().filter(|s| s.member == member) {
                    slot.weight = effective_weight(slot.capacity, inflight);
                }
            }
        }
        true
    }

    /// Chooses the member of `cluster` that gets the next request: by
    /// smooth weighted round robin, or with `key`, the member with affinity
    /// for that key (see the module documentation). `None` if the cluster
    /// has no member with capacity.
    pub fn pick(&mut self, cluster: &str, key: Option<&[u8]>) -> Option<M> {
        self.pick_where(cluster, key, |_| true)
    }

    /// [`Clusters::pick`] among the members for which `keep` holds (a
    /// node picking among its own clients, not other nodes of a mesh).
    pub fn pick_where(
        &mut self,
        cluster: &str,
        key: Option<&[u8]>,
        keep: impl Fn(M) -> bool,
    ) -> Option<M> {
        let slots = self.clusters.get_mut(cluster)?;
        match key {
            Some(key) => pick_keyed(slots, key, &keep),
            None => pick_wrr(slots, &keep),
        }
    }

    /// Every member of `cluster`, capacity 0 included: the recipients of a
    /// broadcast. In join order.
    pub fn members(&self, cluster: &str) -> impl Iterator<Item = M> + '_ {
        self.clusters
            .get(cluster)
            .into_iter()
            .flat_map(|slots| slots.iter().map(|s| s.member))
    }

    /// Number of members of `cluster`.
    pub fn len(&self, cluster: &str) -> usize {
        self.clusters.get(cluster).map_or(0, Vec::len)
    }

    /// `member`'s advertised capacity and current effective weight in
    /// `cluster`, if it is a member.
    pub fn weight(&self, cluster: &str, member: M) -> Option<(u32, u32)> {
        self.clusters
            .get(cluster)?
            .iter()
            .find(|s| s.member == member)
            .map(|s| (s.capacity, s.weight))
    }

    /// Names of the clusters with at least one member.
    pub fn clusters(&self) -> impl Iterator<Item = &str> + '_ {
        self.clusters.keys().map(|k| &**k)
    }

    /// Number of clusters with at least one member.
    pub fn cluster_count(&self) -> usize {
        self.clusters.len()
    }

    /// Number of members in at least one cluster.
    pub fn member_count(&self) -> usize {
        self.members.len()
    }
}

/// nginx's smooth weighted round robin over effective weights.
fn pick_wrr<M: Copy>(slots: &mut [Slot<M>], keep: &impl Fn(M) -> bool) -> Option<M> {
    let mut total: i64 = 0;
    let mut best: Option<usize> = None;
    let mut best_current = i64::MIN;
    for (i, s) in slots.iter_mut().enumerate() {
        if s.weight == 0 || !keep(s.member) {
            continue;
        }
        s.current += i64::from(s.weight);
        total += i64::from(s.weight);
        if s.current > best_current {
            best_current = s.current;
            best = Some(i);
        }
    }
    let b = best?;
    slots[b].current -= total;
    Some(slots[b].member)
}

/// Weighted rendezvous hashing over advertised capacities.
fn pick_keyed<M: Copy>(slots: &[Slot<M>], key: &[u8], keep: &impl Fn(M) -> bool) -> Option<M> {
    let k = hash_of(key);
    let mut best: Option<(f64, M)> = None;
    for s in slots.iter().filter(|s| s.capacity > 0 && keep(s.member)) {
        let h = mix(k ^ s.hash);
        // A uniform value in (0, 1): 53 random bits, offset by half a step.
        let u = ((h >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64);
        let score = f64::from(s.capacity) / -u.ln();
        match best {
            Some((b, _)) if score <= b => {}
            _ => best = Some((score, s.member)),
        }
    }
    best.map(|(_, m)| m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(c: &mut Clusters<u32>, name: &str, picks: usize, n: usize) -> Vec<usize> {
        let mut out = vec![0; n];
        for _ in 0..picks {
            out[c.pick(name, None).unwrap() as usize] += 1;
        }
        out
    }

    #[test]
    fn smooth_wrr_sequence_is_nginx() {
        let mut c = Clusters::new();
        c.join("s", 0u32, 5);
        c.join("s", 1, 1);
        c.join("s", 2, 1);
        let seq: Vec<u32> = (0..7).map(|_| c.pick("s", None).unwrap()).collect();
        assert_eq!(seq, vec![0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn fairness_is_exact_over_full_cycles() {
        let mut c = Clusters::new();
        for (m, cap) in [(0u32, 1u32), (1, 2), (2, 3), (3, 4)] {
            c.join("db", m, cap);
        }
        assert_eq!(
            counts(&mut c, "db", 10_000, 4),
            vec![1000, 2000, 3000, 4000]
        );
        // Not a whole number of cycles: still within one pick of exact.
        let mut c = Clusters::new();
        for (m, cap) in [(0u32, 7u32), (1, 13), (2, 1), (3, 29)] {
            c.join("db", m, cap);
        }
        let got = counts(&mut c, "db", 10_000, 4);
        for (m, cap) in [7.0, 13.0, 1.0, 29.0].into_iter().enumerate() {
            let want: f64 = 10_000.0 * cap / 50.0;
            assert!((got[m] as f64 - want).abs() <= 1.0, "{got:?}");
        }
    }

    #[test]
    fn capacity_zero_is_never_picked_but_gets_broadcasts() {
        let mut c = Clusters::new();
        c.join("s", 0u32, 0);
        c.join("s", 1, 3);
        c.join("s", 2, 0);
        for i in 0..1000u32 {
            assert_eq!(c.pick("s", None), Some(1));
            assert_eq!(c.pick("s", Some(&i.to_le_bytes())), Some(1));
        }
        assert_eq!(c.members("s").collect::<Vec<_>>(), vec![0, 1, 2]);
        c.leave("s", 1);
        assert_eq!(c.pick("s", None), None);
        assert_eq!(c.pick("s", Some(b"k")), None);
        assert_eq!(c.pick("nope", None), None);
    }

    #[test]
    fn key_affinity_is_stable_and_moves_only_the_leavers_keys() {
        let mut c = Clusters::new();
        let caps = [1u32, 2, 3, 4, 5];
        for (m, &cap) in caps.iter().enumerate() {
            c.join("kv", m as u32, cap);
        }
        let keys: Vec<Vec<u8>> = (0..20_000u32)
            .map(|i| format!("user-{i}").into_bytes())
            .collect();
        let before: Vec<u32> = keys
            .iter()
            .map(|k| c.pick("kv", Some(k)).unwrap())
            .collect();
        // Stable, and unaffected by round-robin picks and load in between.
        c.pick("kv", None);
        c.set_load(3, 100);
        for (k, &m) in keys.iter().zip(&before) {
            assert_eq!(c.pick("kv", Some(k)), Some(m));
        }
        // Spread in proportion to capacity (deterministic, so not flaky).
        let mut n = [0usize; 5];
        for &m in &before {
            n[m as usize] += 1;
        }
        for (m, &cap) in caps.iter().enumerate() {
            let want = 20_000.0 * f64::from(cap) / 15.0;
            assert!((n[m] as f64 - want).abs() < 0.1 * want, "{n:?}");
        }
        // Remove member 2: only its keys move.
        assert_eq!(c.remove_member(2), 1);
        let mut moved = 0;
        for (k, &m) in keys.iter().zip(&before) {
            let now = c.pick("kv", Some(k)).unwrap();
            if m == 2 {
                assert_ne!(now, 2);
                moved += 1;
            } else {
                assert_eq!(now, m, "a key of member {m} moved");
            }
        }
        assert_eq!(moved, n[2]);
    }

    #[test]
    fn dynamic_weights_shift_picks_away_from_load() {
        let mut c = Clusters::new();
        c.join("s", 0u32, 10);
        c.join("s", 1, 10);
        assert_eq!(counts(&mut c, "s", 1200, 2), vec![600, 600]);
        assert!(c.set_load(0, 8));
        assert_eq!(c.weight("s", 0), Some((10, 2)));
        assert_eq!(counts(&mut c, "s", 1200, 2), vec![200, 1000]);
        // Overloaded: floor of 1, still probed.
        c.set_load(0, 50);
        assert_eq!(c.weight("s", 0), Some((10, 1)));
        assert_eq!(counts(&mut c, "s", 1100, 2), vec![100, 1000]);
        c.set_load(0, 0);
        assert_eq!(counts(&mut c, "s", 1000, 2), vec![500, 500]);
        assert!(!c.set_load(9, 1));
    }

    #[test]
    fn load_applies_across_clusters_and_survives_rejoin() {
        let mut c = Clusters::new();
        c.join("a", 1u32, 10);
        c.join("b", 1, 20);
        c.set_load(1, 5);
        assert_eq!(c.weight("a", 1), Some((10, 5)));
        assert_eq!(c.weight("b", 1), Some((20, 15)));
        assert!(!c.join("a", 1, 4));
        assert_eq!(c.weight("a", 1), Some((4, 1)));
    }

    #[test]
    fn membership_leaves_no_residue() {
        let mut c = Clusters::new();
        for m in 0..10u32 {
            c.join("x", m, 1);
            c.join(&format!("own{m}"), m, 1);
        }
        assert_eq!(c.cluster_count(), 11);
        assert_eq!(c.len("x"), 10);
        assert!(c.leave("x", 3));
        assert!(!c.leave("x", 3));
        assert_eq!(c.remove_member(3), 1);
        for m in 0..10u32 {
            c.remove_member(m);
        }
        assert_eq!(c.cluster_count(), 0);
        assert_eq!(c.member_count(), 0);
        assert_eq!(c.clusters().count(), 0);
    }
}
