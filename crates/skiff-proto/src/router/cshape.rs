//! The fourth cMsg index of [`super::Router`]: patterns with no literal to
//! key by (no literal start, no literal end, no literal of two bytes
//! inside: `*`, `???`, `#`, `*{i>7}*`, `*.*`), grouped by shape.
//!
//! - A pattern's shape is the pattern with each range widened to any
//!   integer (`*#*` for `*{i>7}*` and `*{i<3}*`; `???` for `???`). Each
//!   distinct shape is a group; a message runs a group's matcher once,
//!   whatever the number of patterns (and subscriptions) of that shape.
//! - Groups are looked up by length bounds: a shape with no `*` and no
//!   integer matches only subjects of one length in characters (`???`
//!   only subjects of 3), kept in a map by that length; a shape made only
//!   of integers and digits (`#`, `##`) only all-digit subjects; the others
//!   only subjects at least as long as their least length, and, with an
//!   integer, holding a digit.
//! - Within a group whose shape holds one integer, the message's run of
//!   the shape gives the set of integers that position can take in a
//!   whole match (`run.42.rate` under `*#*`: 2, 4 and 42); the patterns'
//!   ranges are kept as intervals, keyed so that the ones containing a
//!   value of that set are found without visiting the others: intervals
//!   open above (`i>N`) by their lower end, intervals open below (`i<N`)
//!   by their upper end, single values (`i=N`) by value, and ranges
//!   bounded on both sides (`{i>5 & i<10}`) in an interval tree
//!   ([`super::intervals`]) that finds those holding a value without
//!   visiting the others.
//! - A shape with two integers or more is run once as a filter; its
//!   patterns then run their own matchers.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use super::cmsg::{self, CmsgPattern, Elem, Range};
use super::intervals::Stabs;
use super::subject::MAX_SUBJECT;

/// An integer larger than any `u64` (the value of a longer run of digits).
const HUGE: u128 = u64::MAX as u128 + 1;
/// Words of a position set over a subject.
const WORDS: usize = MAX_SUBJECT / 64 + 1;

/// One shape and the pairs of that shape.
#[derive(Debug)]
struct Group {
    shape: CmsgPattern,
    /// Least length of a match, in characters.
    min: usize,
    /// Greatest, when bounded (no `*`, no integer).
    max: Option<usize>,
    /// Only integers and digits: matches all-digit subjects only.
    digits_only: bool,
    /// Integer elements.
    ints: usize,
    /// The pairs (ids in the index) of this shape.
    pairs: Vec<u32>,
    /// With one integer: the pairs' intervals (see the module doc).
    above: BTreeSet<(u128, u32)>,
    below: BTreeSet<(u128, u32)>,
    points: BTreeSet<(u128, u32)>,
    /// Intervals bounded on both sides, found by the values they hold.
    bounded: Stabs,
}

/// Where a group is filed (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bucket {
    Fixed(usize),
    Digits,
    Open(usize),
}

/// The groups of one index.
#[derive(Debug, Default)]
pub(super) struct Shapes {
    groups: Vec<Option<Group>>,
    free: Vec<u32>,
    by_shape: FxHashMap<Box<str>, u32>,
    fixed: FxHashMap<usize, Vec<u32>>,
    digits: Vec<u32>,
    /// (least length, group).
    open: BTreeSet<(usize, u32)>,
}

/// The integer intervals of a range, inclusive, `HUGE` standing for every
/// integer past `u64`.
fn intervals(r: &Range) -> Vec<(u128, u128)> {
    if r.any_of.is_empty() {
        return vec![(0, HUGE)];
    }
    let mut out = Vec::new();
    for all in &r.any_of {
        let (mut lo, mut hi) = (0u128, HUGE);
        for c in all {
            match *c {
                cmsg::Cmp::Lt(0) => {
                    // Nothing is below 0.
                    (lo, hi) = (1, 0);
                }
                cmsg::Cmp::Lt(n) => hi = hi.min(u128::from(n) - 1),
                cmsg::Cmp::Gt(n) => lo = lo.max(u128::from(n) + 1),
                cmsg::Cmp::Eq(n) => {
                    lo = lo.max(u128::from(n));
                    hi = hi.min(u128::from(n));
                }
            }
        }
        if lo <= hi {
            out.push((lo, hi));
        }
    }
    out
}

/// The range of a pattern's only integer element.
fn only_range(p: &CmsgPattern) -> &Range {
    p.elems
        .iter()
        .find_map(|e| match e {
            Elem::Int(r) => Some(r),
            _ => None,
        })
        .expect("a shape with one integer")
}

impl Group {
    fn bucket(&self) -> Bucket {
        if self.digits_only {
            Bucket::Digits
        } else if let Some(max) = self.max {
            Bucket::Fixed(max)
        } else {
            Bucket::Open(self.min)
        }
    }

    fn add_ranges(&mut self, p: u32, subject: &CmsgPattern) {
        for (lo, hi) in intervals(only_range(subject)) {
            if hi == HUGE {
                self.above.insert((lo, p));
            } else if lo == 0 {
                self.below.insert((hi, p));
            } else if lo == hi {
                self.points.insert((lo, p));
            } else {
                // Both ends below `HUGE`: they fit a `u64`.
                self.bounded.insert(lo as u64, hi as u64, p);
            }
        }
    }

    fn remove_ranges(&mut self, p: u32, subject: &CmsgPattern) {
        for (lo, hi) in intervals(only_range(subject)) {
            if hi == HUGE {
                self.above.remove(&(lo, p));
            } else if lo == 0 {
                self.below.remove(&(hi, p));
            } else if lo == hi {
                self.points.remove(&(lo, p));
            } else {
                self.bounded.remove(lo as u64, hi as u64, p);
            }
        }
    }
}

impl Shapes {
    /// Groups held.
    pub(super) fn len(&self) -> usize {
        self.by_shape.len()
    }

    /// Files pair `p` (subject pattern `subject`); returns (group,
    /// position in the group's pairs).
    pub(super) fn insert(&mut self, p: u32, subject: &CmsgPattern) -> (u32, u32) {
        let shape = subject.shape();
        let g = match self.by_shape.get(shape.as_str()) {
            Some(&g) => g,
            None => self.new_group(shape),
        };
        let group = self.groups[g as usize].as_mut().expect("live group");
        let at = group.pairs.len() as u32;
        group.pairs.push(p);
        if group.ints == 1 {
            group.add_ranges(p, subject);
        }
        (g, at)
    }

    fn new_group(&mut self, shape: CmsgPattern) -> u32 {
        let (mut min, mut bounded, mut ints) = (0, true, 0);
        let mut digits_only = true;
        for e in &shape.elems {
            match e {
                Elem::Lit(l) => {
                    min += l.chars().count();
                    digits_only &= l.bytes().all(|b| b.is_ascii_digit());
                }
                Elem::One => {
                    min += 1;
                    digits_only = false;
                }
                Elem::Star => {
                    bounded = false;
                    digits_only = false;
                }
                Elem::Int(_) => {
                    min += 1;
                    bounded = false;
                    ints += 1;
                }
            }
        }
        let group = Group {
            min,
            max: bounded.then_some(min),
            digits_only,
            ints,
            pairs: Vec::new(),
            above: BTreeSet::new(),
            below: BTreeSet::new(),
            points: BTreeSet::new(),
            bounded: Stabs::default(),
            shape,
        };
        let bucket = group.bucket();
        let key: Box<str> = group.shape.as_str().into();
        let g = match self.free.pop() {
            Some(g) => {
                self.groups[g as usize] = Some(group);
                g
            }
            None => {
                self.groups.push(Some(group));
                (self.groups.len() - 1) as u32
            }
        };
        self.by_shape.insert(key, g);
        match bucket {
            Bucket::Fixed(n) => self.fixed.entry(n).or_default().push(g),
            Bucket::Digits => self.digits.push(g),
            Bucket::Open(min) => {
                self.open.insert((min, g));
            }
        }
        g
    }

    /// Takes pair `p` (at position `at` of group `g`) out; returns the
    /// pair that moved into position `at`, if one did.
    pub(super) fn remove(&mut self, g: u32, at: u32, p: u32, subject: &CmsgPattern) -> Option<u32> {
        let group = self.groups[g as usize].as_mut().expect("live group");
        if group.ints == 1 {
            group.remove_ranges(p, subject);
        }
        group.pairs.swap_remove(at as usize);
        let moved = group.pairs.get(at as usize).copied();
        if group.pairs.is_empty() {
            let group = self.groups[g as usize].take().expect("live group");
            self.free.push(g);
            self.by_shape.remove(group.shape.as_str());
            match group.bucket() {
                Bucket::Fixed(n) => {
                    let v = self.fixed.get_mut(&n).expect("filed");
                    v.retain(|&x| x != g);
                    if v.is_empty() {
                        self.fixed.remove(&n);
                    }
                }
                Bucket::Digits => self.digits.retain(|&x| x != g),
                Bucket::Open(min) => {
                    self.open.remove(&(min, g));
                }
            }
        }
        moved
    }

    /// Calls `f` with every pair whose subject pattern matches `subject`
    /// (each at most once), a group at a time; `full(p)` runs pair `p`'s
    /// own matcher (for shapes of two integers or more). Stops when `f`
    /// returns false, and returns false then.
    pub(super) fn walk(
        &self,
        subject: &str,
        full: &impl Fn(u32) -> bool,
        f: &mut impl FnMut(u32) -> bool,
    ) -> bool {
        if subject.len() > MAX_SUBJECT {
            return true;
        }
        let len = subject.chars().count();
        let bytes = subject.as_bytes();
        let has_digit = bytes.iter().any(u8::is_ascii_digit);
        let all_digits = has_digit && bytes.iter().all(u8::is_ascii_digit);
        let mut hits: Vec<u32> = Vec::new();
        let mut visit = |g: u32| -> bool {
            let group = self.groups[g as usize].as_ref().expect("live group");
            if group.ints > 0 && !has_digit {
                return true;
            }
            if group.ints == 1 {
                let values = values(&group.shape, subject);
                if values.is_empty() {
                    return true;
                }
                hits.clear();
                group.hits(&values, &mut hits);
                hits.sort_unstable();
                hits.dedup();
                return hits.iter().all(|&p| f(p));
            }
            if !group.shape.matches(subject) {
                return true;
            }
            if group.ints == 0 {
                group.pairs.iter().all(|&p| f(p))
            } else {
                group.pairs.iter().all(|&p| !full(p) || f(p))
            }
        };
        if let Some(gs) = self.fixed.get(&len) {
            for &g in gs {
                if !visit(g) {
                    return false;
                }
            }
        }
        if all_digits {
            for &g in &self.digits {
                let group = self.groups[g as usize].as_ref().expect("live group");
                if group.min <= len && group.max.is_none_or(|m| len <= m) && !visit(g) {
                    return false;
                }
            }
        }
        for &(_, g) in self.open.range(..=(len, u32::MAX)) {
            if !visit(g) {
                return false;
            }
        }
        true
    }
}

impl Group {
    /// The pairs with an interval holding one of `values` (sorted, not
    /// empty), each once or more.
    fn hits(&self, values: &[u128], out: &mut Vec<u32>) {
        let (least, most) = (values[0], values[values.len() - 1]);
        out.extend(self.above.range(..=(most, u32::MAX)).map(|&(_, p)| p));
        out.extend(self.below.range((least, 0)..).map(|&(_, p)| p));
        for &v in values {
            out.extend(self.points.range((v, 0)..=(v, u32::MAX)).map(|&(_, p)| p));
        }
        for &v in values {
            if let Ok(v) = u64::try_from(v) {
                self.bounded.stab(v, out);
            }
        }
    }
}

/// The integers that the only integer element of `shape` can take in a
/// whole match of `text`, sorted and distinct (`HUGE` for any past
/// `u64`); empty when the shape does not match.
fn values(shape: &CmsgPattern, text: &str) -> Vec<u128> {
    let n = text.len();
    let bytes = text.as_bytes();
    let k = shape
        .elems
        .iter()
        .position(|e| matches!(e, Elem::Int(_)))
        .expect("one integer");
    let (before, after) = (&shape.elems[..k], &shape.elems[k + 1..]);
    // Where the integer can start: the elements before it, forward.
    let mut cur = [0u64; WORDS];
    let mut next = [0u64; WORDS];
    cmsg::set(&mut cur, 0);
    for e in before {
        next.fill(0);
        if !cmsg::step(e, text, &cur, &mut next) {
            return Vec::new();
        }
        std::mem::swap(&mut cur, &mut next);
    }
    let starts = cur;
    // Where it can end: the elements after it (no integer among them),
    // backward from the end of the text.
    let mut cur = [0u64; WORDS];
    cmsg::set(&mut cur, n);
    for e in after.iter().rev() {
        next.fill(0);
        let mut any = false;
        match e {
            Elem::Lit(l) => {
                let l = l.as_bytes();
                for j in cmsg::ones(&cur) {
                    if j >= l.len() && &bytes[j - l.len()..j] == l {
                        cmsg::set(&mut next, j - l.len());
                        any = true;
                    }
                }
            }
            Elem::One => {
                for j in cmsg::ones(&cur) {
                    if j > 0 {
                        let mut i = j - 1;
                        while !text.is_char_boundary(i) {
                            i -= 1;
                        }
                        cmsg::set(&mut next, i);
                        any = true;
                    }
                }
            }
            Elem::Star => {
                if let Some(last) = cmsg::ones(&cur).last() {
                    for (i, _) in text[..last].char_indices() {
                        cmsg::set(&mut next, i);
                    }
                    cmsg::set(&mut next, last);
                    any = true;
                }
            }
            Elem::Int(_) => unreachable!("one integer"),
        }
        if !any {
            return Vec::new();
        }
        std::mem::swap(&mut cur, &mut next);
    }
    let ends = cur;
    let mut out = Vec::new();
    for j in cmsg::ones(&starts) {
        if j >= n || !bytes[j].is_ascii_digit() {
            continue;
        }
        let mut v: Option<u64> = Some(0);
        let mut last: Option<u128> = None;
        for end in j + 1..=n {
            let b = bytes[end - 1];
            if !b.is_ascii_digit() {
                break;
            }
            v = v
                .and_then(|v| v.checked_mul(10))
                .and_then(|v| v.checked_add(u64::from(b - b'0')));
            let value = v.map_or(HUGE, u128::from);
            if cmsg::get(&ends, end) && last != Some(value) {
                out.push(value);
                last = Some(value);
            }
            if v.is_none() {
                // Past `u64` from here on: one `HUGE` is enough, if this
                // run can end anywhere further on.
                if last != Some(HUGE) {
                    let mut e = end + 1;
                    while e <= n && bytes[e - 1].is_ascii_digit() {
                        if cmsg::get(&ends, e) {
                            out.push(HUGE);
                            break;
                        }
                        e += 1;
                    }
                }
                break;
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vals(p: &str, t: &str) -> Vec<u128> {
        values(&CmsgPattern::subject(p).unwrap().shape(), t)
    }

    #[test]
    fn values_an_integer_can_take() {
        assert_eq!(vals("*#*", "run.42.rate"), vec![2, 4, 42]);
        // Whole matches only: `#` must take all of `0042`.
        assert_eq!(vals("#", "0042"), vec![42]);
        assert_eq!(vals("*.#", "a.17"), vec![17]);
        assert_eq!(vals("?#?", "x123y"), vec![123]);
        assert_eq!(vals("*#", "99999999999999999999"), {
            let mut v: Vec<u128> = (1..=19)
                .map(|k| "9".repeat(k).parse::<u128>().unwrap())
                .collect();
            v.push(HUGE);
            v
        });
        assert!(vals("*#*", "abc").is_empty());
    }

    #[test]
    fn ranges_as_intervals() {
        let r = |s: &str| intervals(only_range(&CmsgPattern::subject(s).unwrap()));
        assert_eq!(r("{i>7}"), vec![(8, HUGE)]);
        assert_eq!(r("{i<3}"), vec![(0, 2)]);
        assert_eq!(r("{i<0}"), vec![]);
        assert_eq!(r("{i>5 & i<10 | i=20}"), vec![(6, 9), (20, 20)]);
        assert_eq!(r("#"), vec![(0, HUGE)]);
        assert_eq!(r("{i>18446744073709551615}"), vec![(HUGE, HUGE)]);
    }
}
