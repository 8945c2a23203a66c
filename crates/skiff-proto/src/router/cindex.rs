//! The index of cMsg subscriptions behind [`super::Router`]: a radix trie
//! over the patterns' leading literals.
//!
//! - Each distinct (subject pattern, type pattern) pair is parsed once and
//!   holds its subscriptions (one inline, more in a vector).
//! - A pair sits at the trie node of its subject pattern's literal prefix
//!   (`daq.h` for `daq.h*b.rate`; the root for a pattern that starts with
//!   a wildcard). Edges are labelled by byte strings and split where two
//!   prefixes part, so there are at most about twice as many nodes as
//!   distinct prefixes.
//! - A message walks down the trie along its subject, once, and runs the
//!   full matcher only on the pairs it passes: those whose literal prefix
//!   the subject starts with, each past its prefix. Patterns whose prefix
//!   the subject does not start with cost nothing.
//! - The router keeps a second index, in reverse, for patterns that start
//!   with a wildcard and end with a literal (`*.rate`): keyed by that
//!   literal suffix, walked along the subject from its end.
//! - And a third for patterns with a wildcard at both ends but a literal of
//!   two bytes or more inside (`*hall*`): keyed by the first two bytes of
//!   their longest literal, looked up once for each distinct pair of
//!   adjacent bytes of the subject.
//! - Patterns with none of these (`*`, `???`, `#`, `*{i>7}*`) go to a
//!   fourth index, by shape and length (the private `cshape` module): a
//!   message runs each shape it can match once, for every pattern of that
//!   shape.
//! - In the first three, the pairs of a node whose subject pattern holds
//!   an integer (`run.{i>5 & i<10}`, `*.{i=3}`) are grouped by shape in
//!   the same way at that node, so that 100,000 ranges behind one literal
//!   prefix are not run one by one: a message runs the node's shapes once
//!   and finds the ranges holding the integers it can take.

use rustc_hash::FxHashMap;

use super::cmsg::{CmsgPattern, Elem};
use super::cshape::Shapes;
use super::trie::Subs;
use super::SubId;

const ROOT: u32 = 0;

/// [`Pair::group`] of a pair in its node's `pairs`.
const LISTED: u32 = u32::MAX;

#[derive(Debug, Default)]
struct Node {
    /// The bytes of the edge from the parent (empty for the root).
    label: Box<[u8]>,
    parent: u32,
    /// Children by the first byte of their label, sorted.
    children: Vec<(u8, u32)>,
    /// Pairs whose prefix ends here, run one by one (none in
    /// [`Mode::Shape`]).
    pairs: Vec<u32>,
    /// Pairs whose prefix ends here, grouped by shape: in
    /// [`Mode::Shape`] every pair (at the root), else those whose subject
    /// pattern holds an integer.
    shapes: Option<Box<Shapes>>,
}

/// One distinct (subject pattern, type pattern) pair.
#[derive(Debug)]
pub(super) struct Pair {
    pub(super) subject: CmsgPattern,
    pub(super) kind: CmsgPattern,
    /// Its trie node.
    node: u32,
    /// Its group in the node's [`Shapes`], or [`LISTED`]: in the node's
    /// `pairs`.
    group: u32,
    /// Position in its node's `pairs` (or its group's).
    at: u32,
    pub(super) subs: Subs,
}

/// What an index is keyed by (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// The literal start.
    Prefix = 0,
    /// The literal end, reversed.
    Suffix = 1,
    /// Two bytes of the longest literal.
    Bigram = 2,
    /// None of these: by shape and length ([`Shapes`]).
    Shape = 3,
}

impl Mode {
    /// Every mode, in index order.
    pub(super) const ALL: [Mode; 4] = [Mode::Prefix, Mode::Suffix, Mode::Bigram, Mode::Shape];

    /// Which index a pattern goes to.
    pub(super) fn of(p: &CmsgPattern) -> Mode {
        if !p.literal_prefix().is_empty() {
            Mode::Prefix
        } else if !p.literal_suffix().is_empty() {
            Mode::Suffix
        } else if p.inner_key().is_some() {
            Mode::Bigram
        } else {
            Mode::Shape
        }
    }
}

#[derive(Debug)]
pub(super) struct Index {
    mode: Mode,
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    pairs: Vec<Option<Pair>>,
    free_pairs: Vec<u32>,
    by_text: FxHashMap<(Box<str>, Box<str>), u32>,
}

impl Index {
    /// An empty index keyed as `mode` says.
    pub(super) fn new(mode: Mode) -> Index {
        Index {
            mode,
            nodes: vec![Node::default()],
            free_nodes: Vec::new(),
            pairs: Vec::new(),
            free_pairs: Vec::new(),
            by_text: FxHashMap::default(),
        }
    }

    /// Whether no pair is held.
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.by_text.is_empty()
    }

    /// Trie nodes in use besides the root, plus pairs held.
    pub(super) fn node_count(&self) -> usize {
        let groups: usize = self
            .nodes
            .iter()
            .filter_map(|n| n.shapes.as_ref())
            .map(|s| s.len())
            .sum();
        self.nodes.len() - 1 - self.free_nodes.len() + groups + self.by_text.len()
    }

    /// Adds subscription `id`; returns (pair, position in its list).
    pub(super) fn insert(
        &mut self,
        subject: CmsgPattern,
        kind: CmsgPattern,
        id: SubId,
    ) -> (u32, u32) {
        let key = (Box::from(subject.as_str()), Box::from(kind.as_str()));
        if let Some(&p) = self.by_text.get(&key) {
            let pos = self.pair_mut(p).subs.push(id);
            return (p, pos);
        }
        let node = match self.mode {
            Mode::Prefix => self.node_for(subject.literal_prefix().as_bytes()),
            Mode::Suffix => {
                let key: Vec<u8> = subject.literal_suffix().bytes().rev().collect();
                self.node_for(&key)
            }
            Mode::Bigram => {
                let key = subject.inner_key().unwrap_or([0, 0]);
                self.node_for(&key)
            }
            Mode::Shape => ROOT,
        };
        let p = match self.free_pairs.pop() {
            Some(p) => p,
            None => {
                self.pairs.push(None);
                (self.pairs.len() - 1) as u32
            }
        };
        let shaped =
            self.mode == Mode::Shape || subject.elems.iter().any(|e| matches!(e, Elem::Int(_)));
        let n = &mut self.nodes[node as usize];
        let (group, at) = if shaped {
            n.shapes
                .get_or_insert_with(Box::default)
                .insert(p, &subject)
        } else {
            n.pairs.push(p);
            (LISTED, (n.pairs.len() - 1) as u32)
        };
        let mut subs = Subs::default();
        subs.push(id);
        self.pairs[p as usize] = Some(Pair {
            subject,
            kind,
            node,
            group,
            at,
            subs,
        });
        self.by_text.insert(key, p);
        (p, 0)
    }

    fn pair_mut(&mut self, p: u32) -> &mut Pair {
        self.pairs[p as usize].as_mut().expect("live pair")
    }

    /// A live pair.
    pub(super) fn pair(&self, p: u32) -> &Pair {
        self.pairs[p as usize].as_ref().expect("live pair")
    }

    /// Every live pair.
    pub(super) fn pairs(&self) -> impl Iterator<Item = &Pair> + '_ {
        self.pairs.iter().flatten()
    }

    /// Removes the subscription at `pos` of pair `p`; returns the one that
    /// moved into `pos`.
    pub(super) fn remove(&mut self, p: u32, pos: u32) -> Option<SubId> {
        let pair = self.pair_mut(p);
        let moved = pair.subs.swap_remove(pos);
        if !pair.subs.is_empty() {
            return moved;
        }
        let pair = self.pairs[p as usize].take().expect("live pair");
        self.free_pairs.push(p);
        self.by_text.remove(&(
            Box::from(pair.subject.as_str()),
            Box::from(pair.kind.as_str()),
        ));
        let node = &mut self.nodes[pair.node as usize];
        let moved_pair = if pair.group == LISTED {
            node.pairs.swap_remove(pair.at as usize);
            node.pairs.get(pair.at as usize).copied()
        } else {
            let shapes = node.shapes.as_mut().expect("shaped pair");
            let m = shapes.remove(pair.group, pair.at, p, &pair.subject);
            if shapes.len() == 0 {
                node.shapes = None;
            }
            m
        };
        if let Some(m) = moved_pair {
            self.pair_mut(m).at = pair.at;
        }
        self.prune(pair.node);
        if self.by_text.is_empty() {
            *self = Index::new(self.mode);
        }
        moved
    }

    fn alloc(&mut self, node: Node) -> u32 {
        match self.free_nodes.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn free(&mut self, i: u32) {
        self.nodes[i as usize] = Node::default();
        self.free_nodes.push(i);
    }

    fn child(&self, at: u32, b: u8) -> Option<(usize, u32)> {
        let ch = &self.nodes[at as usize].children;
        ch.binary_search_by_key(&b, |e| e.0)
            .ok()
            .map(|i| (i, ch[i].1))
    }

    /// The node for prefix `key`, made (splitting an edge) if needed.
    fn node_for(&mut self, key: &[u8]) -> u32 {
        let (mut at, mut rest) = (ROOT, key);
        while !rest.is_empty() {
            let Some((slot, c)) = self.child(at, rest[0]) else {
                let c = self.alloc(Node {
                    label: rest.into(),
                    parent: at,
                    ..Node::default()
                });
                let ch = &mut self.nodes[at as usize].children;
                let i = ch.partition_point(|e| e.0 < rest[0]);
                ch.insert(i, (rest[0], c));
                return c;
            };
            let label = &self.nodes[c as usize].label;
            let common = label.iter().zip(rest).take_while(|(a, b)| a == b).count();
            if common == label.len() {
                at = c;
                rest = &rest[common..];
                continue;
            }
            // Split the edge: `at` -> mid (common part) -> c (the rest).
            let tail: Box<[u8]> = label[common..].into();
            let mid = self.alloc(Node {
                label: rest[..common].into(),
                parent: at,
                children: vec![(tail[0], c)],
                ..Node::default()
            });
            let cn = &mut self.nodes[c as usize];
            cn.label = tail;
            cn.parent = mid;
            self.nodes[at as usize].children[slot].1 = mid;
            at = mid;
            rest = &rest[common..];
        }
        at
    }

    /// Frees `node` and its ancestors while they hold nothing, and merges
    /// a node left with one child and no pairs into that child.
    fn prune(&mut self, mut node: u32) {
        while node != ROOT {
            let n = &self.nodes[node as usize];
            if !n.pairs.is_empty() || n.shapes.is_some() {
                return;
            }
            match n.children.len() {
                0 => {
                    let parent = n.parent;
                    let first = n.label[0];
                    let ch = &mut self.nodes[parent as usize].children;
                    let i = ch.binary_search_by_key(&first, |e| e.0).expect("child");
                    ch.remove(i);
                    self.free(node);
                    node = parent;
                }
                1 => {
                    // Merge: the child takes this node's place.
                    let (parent, child) = (n.parent, n.children[0].1);
                    let first = n.label[0];
                    let mut label = n.label.to_vec();
                    label.extend_from_slice(&self.nodes[child as usize].label);
                    let cn = &mut self.nodes[child as usize];
                    cn.label = label.into();
                    cn.parent = parent;
                    let ch = &mut self.nodes[parent as usize].children;
                    let i = ch.binary_search_by_key(&first, |e| e.0).expect("child");
                    ch[i].1 = child;
                    self.free(node);
                    return;
                }
                _ => return,
            }
        }
    }

    /// Calls `f` for the subscriptions of every pair whose subject pattern
    /// matches `subject` and, unless `kind` is `None` (any type will do),
    /// whose type pattern matches `kind`; stops early when `f` returns
    /// false.
    #[inline]
    pub(super) fn walk(
        &self,
        subject: &str,
        kind: Option<&str>,
        f: &mut impl FnMut(&Pair) -> bool,
    ) {
        if self.mode == Mode::Bigram {
            return self.walk_bigrams(subject, kind, f);
        }
        if self.mode == Mode::Shape {
            self.walk_shapes(ROOT, subject, kind, f);
            return;
        }
        let mut rev = [0u8; super::subject::MAX_SUBJECT];
        let bytes = if self.mode == Mode::Suffix {
            let Some(rev) = rev.get_mut(..subject.len()) else {
                return;
            };
            for (r, b) in rev.iter_mut().zip(subject.bytes().rev()) {
                *r = b;
            }
            &rev[..]
        } else {
            subject.as_bytes()
        };
        let (mut at, mut pos) = (ROOT, 0usize);
        loop {
            for &p in &self.nodes[at as usize].pairs {
                let pair = self.pair(p);
                // Forward: past the prefix the walk compared.
                let (first, from) = if self.mode == Mode::Suffix || pos == 0 {
                    (0, 0)
                } else {
                    (1, pos)
                };
                if pair.subject.matches_from(subject, first, from)
                    && kind.is_none_or(|k| pair.kind.matches(k))
                    && !f(pair)
                {
                    return;
                }
            }
            if !self.walk_shapes(at, subject, kind, f) {
                return;
            }
            let Some(&b) = bytes.get(pos) else { return };
            let Some((_, c)) = self.child(at, b) else {
                return;
            };
            let label = &self.nodes[c as usize].label;
            if !bytes[pos..].starts_with(label) {
                return;
            }
            pos += label.len();
            at = c;
        }
    }

    /// The node whose whole path is `key`, if any.
    fn find(&self, key: &[u8]) -> Option<u32> {
        let (mut at, mut rest) = (ROOT, key);
        while !rest.is_empty() {
            let (_, c) = self.child(at, rest[0])?;
            let label = &self.nodes[c as usize].label;
            rest = rest.strip_prefix(&label[..])?;
            at = c;
        }
        Some(at)
    }

    /// [`Index::walk`] for [`Mode::Bigram`]: each distinct pair of adjacent
    /// bytes of the subject once, so no pair is visited twice.
    fn walk_bigrams(&self, subject: &str, kind: Option<&str>, f: &mut impl FnMut(&Pair) -> bool) {
        let b = subject.as_bytes();
        let mut keys = [0u16; super::subject::MAX_SUBJECT];
        let n = b.len().saturating_sub(1).min(keys.len());
        for (k, w) in keys.iter_mut().zip(b.windows(2)) {
            *k = u16::from_be_bytes([w[0], w[1]]);
        }
        let keys = &mut keys[..n];
        keys.sort_unstable();
        let mut last = None;
        for &k in keys.iter() {
            if last == Some(k) {
                continue;
            }
            last = Some(k);
            let Some(node) = self.find(&k.to_be_bytes()) else {
                continue;
            };
            for &p in &self.nodes[node as usize].pairs {
                let pair = self.pair(p);
                if pair.subject.matches(subject)
                    && kind.is_none_or(|k| pair.kind.matches(k))
                    && !f(pair)
                {
                    return;
                }
            }
            if !self.walk_shapes(node, subject, kind, f) {
                return;
            }
        }
    }

    /// [`Index::walk`] over the pairs of `node` grouped by shape; false
    /// when `f` asked to stop.
    #[inline]
    fn walk_shapes(
        &self,
        node: u32,
        subject: &str,
        kind: Option<&str>,
        f: &mut impl FnMut(&Pair) -> bool,
    ) -> bool {
        let Some(shapes) = &self.nodes[node as usize].shapes else {
            return true;
        };
        let full = |p: u32| self.pair(p).subject.matches(subject);
        shapes.walk(subject, &full, &mut |p| {
            let pair = self.pair(p);
            !kind.is_none_or(|k| pair.kind.matches(k)) || f(pair)
        })
    }
}
