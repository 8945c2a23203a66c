//! Integer intervals found by a value they hold (a stabbing query), for
//! the cMsg ranges bounded on both sides (`{i>5 & i<10}`) in
//! [`super::cshape`].
//!
//! A centered interval tree whose centers are fixed in advance: the
//! implicit binary trie over `u64`. An interval `[lo, hi]` sits at the
//! trie node where `lo` and `hi` part: at level `l` (the highest bit in
//! which they differ, plus one; 0 when `lo == hi`) under the prefix
//! `lo >> l`. Every interval of a node at level `l >= 1` holds the node's
//! center, `mid = prefix << l | 1 << (l - 1)` (`lo < mid <= hi`), so for a
//! value `v` under that node:
//!
//! - `v < mid`: the intervals holding `v` are those with `lo <= v`,
//!   the first ones of the node's intervals sorted by `lo`;
//! - `v >= mid`: those with `hi >= v`, the last ones sorted by `hi`.
//!
//! A query visits the node on `v`'s path at each level in use (at most
//! 65, a hash lookup each) and reads only intervals that hold `v`, plus
//! one per node to stop at. Insertion and removal are two ordered-set
//! operations; nothing is rebalanced, so no input can make the structure
//! deep (its depth is fixed) and memory is linear in the intervals held.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

/// The intervals of one trie node: (lo, hi, owner) and (hi, lo, owner).
#[derive(Debug, Default)]
struct Node {
    by_lo: BTreeSet<(u64, u64, u32)>,
    by_hi: BTreeSet<(u64, u64, u32)>,
}

/// Inclusive intervals of `u64`, each owned by a `u32` (see the module
/// doc).
#[derive(Debug, Default)]
pub(super) struct Stabs {
    nodes: FxHashMap<(u8, u64), Node>,
    /// Intervals held at each level, and the levels holding any (bit `l`).
    per_level: Vec<u32>,
    levels: u128,
}

/// The level and prefix of `[lo, hi]` (see the module doc).
fn place(lo: u64, hi: u64) -> (u8, u64) {
    let l = (64 - (lo ^ hi).leading_zeros()) as u8;
    (l, lo.checked_shr(u32::from(l)).unwrap_or(0))
}

impl Stabs {
    /// Intervals held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.per_level.iter().map(|&n| n as usize).sum()
    }

    /// Adds `[lo, hi]` (`lo <= hi`) owned by `owner`; an interval already
    /// held with that owner is held once.
    pub(super) fn insert(&mut self, lo: u64, hi: u64, owner: u32) {
        debug_assert!(lo <= hi);
        let (l, prefix) = place(lo, hi);
        let node = self.nodes.entry((l, prefix)).or_default();
        if !node.by_lo.insert((lo, hi, owner)) {
            return;
        }
        node.by_hi.insert((hi, lo, owner));
        if self.per_level.is_empty() {
            self.per_level = vec![0; 65];
        }
        self.per_level[usize::from(l)] += 1;
        self.levels |= 1 << l;
    }

    /// Removes `[lo, hi]` owned by `owner`, if held.
    pub(super) fn remove(&mut self, lo: u64, hi: u64, owner: u32) {
        let (l, prefix) = place(lo, hi);
        let Some(node) = self.nodes.get_mut(&(l, prefix)) else {
            return;
        };
        if !node.by_lo.remove(&(lo, hi, owner)) {
            return;
        }
        node.by_hi.remove(&(hi, lo, owner));
        if node.by_lo.is_empty() {
            self.nodes.remove(&(l, prefix));
        }
        let n = &mut self.per_level[usize::from(l)];
        *n -= 1;
        if *n == 0 {
            self.levels &= !(1 << l);
        }
    }

    /// Appends the owner of every interval holding `v` (once per
    /// interval) to `out`.
    pub(super) fn stab(&self, v: u64, out: &mut Vec<u32>) {
        let mut levels = self.levels;
        while levels != 0 {
            let l = levels.trailing_zeros();
            levels &= levels - 1;
            let prefix = v.checked_shr(l).unwrap_or(0);
            let Some(node) = self.nodes.get(&(l as u8, prefix)) else {
                continue;
            };
            let mid = if l == 0 {
                u128::MAX
            } else {
                (u128::from(prefix) << l) | (1u128 << (l - 1))
            };
            if u128::from(v) < mid {
                out.extend(node.by_lo.iter().take_while(|e| e.0 <= v).map(|e| e.2));
            } else {
                out.extend(
                    node.by_hi
                        .iter()
                        .rev()
                        .take_while(|e| e.0 >= v)
                        .map(|e| e.2),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn stab(s: &Stabs, v: u64) -> Vec<u32> {
        let mut out = Vec::new();
        s.stab(v, &mut out);
        out.sort_unstable();
        out
    }

    #[test]
    fn finds_what_holds_a_value() {
        let mut s = Stabs::default();
        s.insert(6, 9, 1);
        s.insert(20, 20, 2);
        s.insert(0, u64::MAX, 3);
        s.insert(8, 1 << 40, 4);
        s.insert(u64::MAX - 1, u64::MAX, 5);
        assert_eq!(stab(&s, 5), [3]);
        assert_eq!(stab(&s, 6), [1, 3]);
        assert_eq!(stab(&s, 9), [1, 3, 4]);
        assert_eq!(stab(&s, 20), [2, 3, 4]);
        assert_eq!(stab(&s, u64::MAX), [3, 5]);
        s.remove(8, 1 << 40, 4);
        s.remove(8, 1 << 40, 4);
        assert_eq!(stab(&s, 9), [1, 3]);
        // Held once; another interval of the same owner and start is
        // another interval.
        s.insert(6, 9, 1);
        s.insert(6, 12, 1);
        assert_eq!(s.len(), 5);
        assert_eq!(stab(&s, 11), [1, 3]);
        assert_eq!(stab(&s, 7), [1, 1, 3]);
        for (lo, hi, o) in [
            (6, 9, 1),
            (6, 12, 1),
            (20, 20, 2),
            (0, u64::MAX, 3),
            (u64::MAX - 1, u64::MAX, 5),
        ] {
            s.remove(lo, hi, o);
        }
        assert_eq!((s.len(), s.nodes.len(), s.levels), (0, 0, 0));
    }

    fn end() -> impl Strategy<Value = u64> {
        prop_oneof![0..64u64, any::<u64>(), (u64::MAX - 64)..=u64::MAX]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        #[test]
        fn agrees_with_a_scan(
            ivs in prop::collection::vec((end(), end()), 0..60),
            gone in prop::collection::vec(any::<u8>(), 0..30),
            vs in prop::collection::vec(end(), 1..20),
        ) {
            let mut s = Stabs::default();
            let mut live: Vec<(u64, u64, u32)> = Vec::new();
            for (i, &(a, b)) in ivs.iter().enumerate() {
                let (lo, hi) = (a.min(b), a.max(b));
                // Owners shared by a few intervals each.
                let o = (i % 7) as u32;
                if live.contains(&(lo, hi, o)) {
                    continue;
                }
                s.insert(lo, hi, o);
                live.push((lo, hi, o));
            }
            for g in gone {
                if live.is_empty() {
                    break;
                }
                let (lo, hi, o) = live.swap_remove(g as usize % live.len());
                s.remove(lo, hi, o);
            }
            for v in vs {
                let mut want: Vec<u32> =
                    live.iter().filter(|e| e.0 <= v && v <= e.1).map(|e| e.2).collect();
                want.sort_unstable();
                prop_assert_eq!(stab(&s, v), want, "value {}", v);
            }
        }
    }
}
