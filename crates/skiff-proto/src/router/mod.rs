//! Routing by name, sans I/O: who wants a message with this subject and type
//! ([`Router`]), and which member of a cluster gets a request
//! ([`Clusters`]).
//!
//! [`subject`] defines what subjects, patterns and types are valid and what
//! matches what (`*` one token, `>` one or more remaining tokens, so `a.>`
//! does **not** match `a`; types exactly or `*`). [`cmsg`] defines the
//! second pattern kind, cMsg's matching over whole strings of the subject
//! and the type (`*`, `?`, `#`, integer ranges), which a subscription
//! chooses explicitly ([`Syntax`], [`Pattern::cmsg`]).
//!
//! The [`Router`] holds token subscriptions in a trie (the private `trie`
//! module explains the layout) and cMsg subscriptions in a radix trie over
//! their leading literals (the private `cindex` module). It is generic over the subscriber handle `S`, so
//! the same router holds a node's local clients and, later, other nodes of a
//! mesh as subscribers (e.g. `enum Handle { Client(u64), Node(u32) }`): interest
//! from another node is a subscription whose subscriber is that node.
//!
//! Nothing here does I/O, reads a clock or draws randomness: every result
//! depends only on the calls made so far.

mod cindex;
pub mod cluster;
pub mod cmsg;
mod cshape;
mod intervals;
pub mod subject;
mod trie;

#[cfg(test)]
mod tests;

use std::fmt;
use std::hash::Hash;

use rustc_hash::{FxHashMap, FxHashSet};

pub use cluster::Clusters;
pub use cmsg::{CmsgPattern, Syntax};
pub use subject::{
    check_kind, KindPattern, Pattern, PatternToken, Subject, SubjectError, MAX_TOKENS,
};

use trie::{Trie, NONE, ROOT};

/// Names one subscription in one [`Router`]. Ids are not reused while the
/// router lives (a slot's generation changes when it is freed), so a stale
/// id never removes someone else's subscription.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubId(u64);

impl SubId {
    fn new(index: u32, generation: u32) -> SubId {
        SubId((u64::from(generation) << 32) | u64::from(index))
    }

    fn index(self) -> usize {
        (self.0 & 0xffff_ffff) as usize
    }

    fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// The id as a number, e.g. to put it on the wire.
    pub fn to_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for SubId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SubId({}#{})", self.index(), self.generation())
    }
}

impl fmt::Display for SubId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.index(), self.generation())
    }
}

/// One subscription's bookkeeping.
#[derive(Debug)]
struct Entry<S> {
    sub: S,
    node: u32,
    /// Interned exact type, or [`NONE`] for `*`; for a cMsg subscription,
    /// which of the cMsg indexes holds it.
    kind: u32,
    /// Position in its leaf list.
    pos: u32,
    /// Neighbours in the subscriber's list of subscriptions.
    prev: u32,
    next: u32,
    /// The pattern ends in `>`.
    rest: bool,
    /// A cMsg subscription: `node` names its pair in the cMsg index and
    /// `pos` its place in the pair's list.
    cmsg: bool,
}

#[derive(Debug)]
struct Slot<S> {
    generation: u32,
    entry: Option<Entry<S>>,
}

/// A subject trie: subscriptions by pattern and type, matched against
/// published subjects.
///
/// # Delivery is per subscription
/// A subscriber with two subscriptions that both match a message is
/// reported twice, once per [`SubId`] (NATS does the same): each
/// subscription has its own queue, slow-consumer policy and counters in the
/// node, so the node needs to know which ones matched.
/// [`Router::matching_subscribers`] gives the deduplicated set of
/// subscribers instead, which is what forwarding to another node needs (it
/// matches again on arrival).
///
/// # Costs
/// Matching walks, per subject token, only the literal child, the `*` child
/// and the `>` leaf of each live branch, so it does not grow with the number
/// of patterns that do not match; it allocates nothing beyond what `out`
/// needs. Subscribe is O(pattern tokens), unsubscribe O(pattern tokens) with
/// no search, and [`Router::remove_subscriber`] O(that subscriber's
/// subscriptions).
///
/// # Example
/// ```
/// use skiff_proto::router::{Router, Subject};
/// let mut r = Router::new();
/// let a = r.subscribe("daq.*.rate", "*", 1u64).unwrap();
/// let _b = r.subscribe("daq.>", "alarm", 2u64).unwrap();
/// let mut out = Vec::new();
/// r.matches(Subject::new("daq.hallb.rate").unwrap(), None, &mut out);
/// assert_eq!(out, vec![(a, 1)]);
/// ```
#[derive(Debug)]
pub struct Router<S> {
    trie: Trie,
    /// cMsg patterns: by literal start, by literal end, by a two-byte
    /// piece of a literal in the middle, by shape and length for those
    /// with none of these (see the `cindex` and `cshape` modules).
    cmsg: [cindex::Index; 4],
    slots: Vec<Slot<S>>,
    free: Vec<u32>,
    /// The head of each subscriber's list of subscriptions.
    heads: FxHashMap<S, u32>,
    len: usize,
    /// Generation of newly created slots (see [`Router::unsubscribe`]).
    first_generation: u32,
}

impl<S: Copy + Eq + Hash> Default for Router<S> {
    fn default() -> Self {
        Router::new()
    }
}

/// A distinct (pattern, type pattern) pair held by a [`Router`], with the
/// number of subscriptions that hold it: what a node advertises to others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interest {
    /// The pattern kind of both patterns.
    pub syntax: Syntax,
    /// The subject pattern.
    pub pattern: String,
    /// The type pattern's text (`*`, empty for untyped, or a type; for
    /// [`Syntax::Cmsg`], a cMsg pattern).
    pub kind: String,
    /// How many subscriptions hold this pair.
    pub subscriptions: usize,
}

/// What a [`Router`] knows about one subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubInfo<S> {
    /// Who subscribed.
    pub subscriber: S,
    /// The pattern kind of both patterns.
    pub syntax: Syntax,
    /// The subject pattern.
    pub pattern: String,
    /// The type pattern's text (see [`Interest::kind`]).
    pub kind: String,
}

impl<S: Copy + Eq + Hash> Router<S> {
    /// An empty router.
    pub fn new() -> Router<S> {
        Router {
            trie: Trie::default(),
            cmsg: cindex::Mode::ALL.map(cindex::Index::new),
            slots: Vec::new(),
            free: Vec::new(),
            heads: FxHashMap::default(),
            len: 0,
            first_generation: 0,
        }
    }

    /// Number of subscriptions.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no subscriptions.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of distinct subscribers.
    pub fn subscriber_count(&self) -> usize {
        self.heads.len()
    }

    /// Trie nodes in use, not counting the roots, and cMsg pattern pairs
    /// held: zero once every subscription is gone (tests use it to show
    /// nothing is left behind).
    pub fn node_count(&self) -> usize {
        self.trie.node_count() + self.cmsg.iter().map(|c| c.node_count()).sum::<usize>()
    }

    /// Distinct tokens and types held.
    pub fn string_count(&self) -> usize {
        self.trie.strings.len()
    }

    /// Adds a subscription of `sub` to subjects matching `pattern` with a
    /// type matching `kind` (see [`subject`] for both syntaxes). The same
    /// subscriber may subscribe to the same pattern more than once; each
    /// call makes a separate subscription.
    pub fn subscribe(&mut self, pattern: &str, kind: &str, sub: S) -> Result<SubId, SubjectError> {
        self.subscribe_as(Syntax::Tokens, pattern, kind, sub)
    }

    /// Adds a subscription with a pattern of either kind (made with
    /// [`Pattern::new`] or [`Pattern::cmsg`]); `kind` is a type pattern of
    /// the same kind.
    pub fn subscribe_pattern(
        &mut self,
        pattern: Pattern<'_>,
        kind: &str,
        sub: S,
    ) -> Result<SubId, SubjectError> {
        self.subscribe_as(pattern.syntax(), pattern.as_str(), kind, sub)
    }

    /// Adds a subscription whose subject and type patterns are of kind
    /// `syntax`.
    pub fn subscribe_as(
        &mut self,
        syntax: Syntax,
        pattern: &str,
        kind: &str,
        sub: S,
    ) -> Result<SubId, SubjectError> {
        if syntax == Syntax::Cmsg {
            let p = CmsgPattern::subject(pattern)?;
            let k = CmsgPattern::kind(kind)?;
            let (index, generation) = self.slot();
            let id = SubId::new(index, generation);
            // `kind` names the index.
            let which = cindex::Mode::of(&p) as usize;
            let (pair, pos) = self.cmsg[which].insert(p, k, id);
            self.link(index, sub, pair, which as u32, pos, false, true);
            return Ok(id);
        }
        let pattern = Pattern::new(pattern)?;
        let kind = KindPattern::new(kind)?;
        let mut node = ROOT;
        let mut rest = false;
        for token in pattern.tokens() {
            match token {
                PatternToken::Literal(t) => node = self.trie.child(node, Some(t)),
                PatternToken::One => node = self.trie.child(node, None),
                PatternToken::Rest => rest = true,
            }
        }
        let kind = match kind {
            KindPattern::Any => NONE,
            KindPattern::Untyped => self.trie.strings.intern(""),
            KindPattern::Exact(k) => self.trie.strings.intern(k),
        };
        let (index, generation) = self.slot();
        let id = SubId::new(index, generation);
        let pos = self.trie.leaf_mut(node, rest).push(kind, id);
        self.link(index, sub, node, kind, pos, rest, false);
        Ok(id)
    }

    /// A free slot: (index, generation).
    fn slot(&mut self) -> (u32, u32) {
        match self.free.pop() {
            Some(i) => (i, self.slots[i as usize].generation),
            None => {
                let generation = self.first_generation;
                self.slots.push(Slot {
                    generation,
                    entry: None,
                });
                ((self.slots.len() - 1) as u32, generation)
            }
        }
    }

    /// Fills slot `index` and links it into `sub`'s list.
    #[allow(clippy::too_many_arguments)]
    fn link(&mut self, index: u32, sub: S, node: u32, kind: u32, pos: u32, rest: bool, cmsg: bool) {
        let next = self.heads.insert(sub, index).unwrap_or(NONE);
        if next != NONE {
            self.entry_mut(next).prev = index;
        }
        self.slots[index as usize].entry = Some(Entry {
            sub,
            node,
            kind,
            pos,
            prev: NONE,
            next,
            rest,
            cmsg,
        });
        self.len += 1;
    }

    fn entry_mut(&mut self, index: u32) -> &mut Entry<S> {
        self.slots[index as usize]
            .entry
            .as_mut()
            .expect("linked subscription is live")
    }

    fn entry(&self, id: SubId) -> Option<&Entry<S>> {
        let slot = self.slots.get(id.index())?;
        if slot.generation != id.generation() {
            return None;
        }
        slot.entry.as_ref()
    }

    /// Removes a subscription; returns its subscriber, or `None` if `id` is
    /// not (or no longer) held.
    pub fn unsubscribe(&mut self, id: SubId) -> Option<S> {
        self.entry(id)?;
        let index = id.index();
        let slot = &mut self.slots[index];
        let e = slot.entry.take().expect("checked above");
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(index as u32);
        self.len -= 1;
        let moved = if e.cmsg {
            self.cmsg[e.kind as usize].remove(e.node, e.pos)
        } else {
            self.trie.remove(e.node, e.rest, e.kind, e.pos)
        };
        if let Some(moved) = moved {
            self.entry_mut(moved.index() as u32).pos = e.pos;
        }
        if e.prev == NONE {
            if e.next == NONE {
                self.heads.remove(&e.sub);
            } else {
                self.heads.insert(e.sub, e.next);
            }
        } else {
            self.entry_mut(e.prev).next = e.next;
        }
        if e.next != NONE {
            self.entry_mut(e.next).prev = e.prev;
        }
        if self.len == 0 {
            // Give the slot table back, and start the next one above every
            // generation handed out so far so that old ids stay dead.
            let max = self.slots.iter().map(|s| s.generation).max().unwrap_or(0);
            self.first_generation = self.first_generation.max(max);
            self.slots = Vec::new();
            self.free = Vec::new();
        }
        Some(e.sub)
    }

    /// Removes every subscription of `sub` (a client disconnected, or a
    /// node left the mesh); returns how many there were.
    pub fn remove_subscriber(&mut self, sub: S) -> usize {
        let mut n = 0;
        while let Some(&head) = self.heads.get(&sub) {
            let generation = self.slots[head as usize].generation;
            self.unsubscribe(SubId::new(head, generation));
            n += 1;
        }
        n
    }

    /// The subscriptions of `sub`, newest first.
    pub fn subscriptions_of(&self, sub: S) -> impl Iterator<Item = SubId> + '_ {
        let mut at = self.heads.get(&sub).copied().unwrap_or(NONE);
        std::iter::from_fn(move || {
            if at == NONE {
                return None;
            }
            let slot = &self.slots[at as usize];
            let id = SubId::new(at, slot.generation);
            at = slot.entry.as_ref().map_or(NONE, |e| e.next);
            Some(id)
        })
    }

    /// What is known about subscription `id`.
    pub fn subscription(&self, id: SubId) -> Option<SubInfo<S>> {
        let e = self.entry(id)?;
        Some(if e.cmsg {
            let pair = self.cmsg[e.kind as usize].pair(e.node);
            SubInfo {
                subscriber: e.sub,
                syntax: Syntax::Cmsg,
                pattern: pair.subject.as_str().to_owned(),
                kind: pair.kind.as_str().to_owned(),
            }
        } else {
            SubInfo {
                subscriber: e.sub,
                syntax: Syntax::Tokens,
                pattern: self.trie.pattern(e.node, e.rest),
                kind: self.kind_pattern(e.kind).to_string(),
            }
        })
    }

    fn kind_pattern(&self, kind: u32) -> KindPattern<'_> {
        if kind == NONE {
            return KindPattern::Any;
        }
        match self.trie.strings.resolve(kind) {
            "" => KindPattern::Untyped,
            k => KindPattern::Exact(k),
        }
    }

    /// Looks up the subject's tokens ([`NONE`] for a token no pattern
    /// names) into `buf`; returns how many there are.
    #[inline]
    fn tokens(&self, subject: Subject<'_>, buf: &mut [u32; MAX_TOKENS]) -> usize {
        let mut n = 0;
        for (slot, token) in buf.iter_mut().zip(subject.tokens()) {
            *slot = self.trie.strings.get(token).unwrap_or(NONE);
            n += 1;
        }
        n
    }

    /// Calls `f(id, subscriber)` once per subscription matching `subject`
    /// and a message of type `kind` (`None` or empty: untyped), in no
    /// promised order.
    #[inline]
    pub fn for_each_match(
        &self,
        subject: Subject<'_>,
        kind: Option<&str>,
        mut f: impl FnMut(SubId, S),
    ) {
        if self.len == 0 {
            return;
        }
        let mut buf = [NONE; MAX_TOKENS];
        let n = self.tokens(subject, &mut buf);
        let text = kind.unwrap_or("");
        let kind = self.trie.strings.get(text);
        let sub_of = |id: SubId| {
            self.slots[id.index()]
                .entry
                .as_ref()
                .expect("trie holds live subscriptions")
                .sub
        };
        self.trie
            .walk(ROOT, &buf[..n], kind, &mut |id| f(id, sub_of(id)));
        for idx in &self.cmsg {
            if !idx.is_empty() {
                idx.walk(subject.as_str(), Some(text), &mut |pair| {
                    for &id in pair.subs.as_slice() {
                        f(id, sub_of(id));
                    }
                    true
                });
            }
        }
    }

    /// Appends `(id, subscriber)` for every matching subscription to `out`
    /// (see [`Router::for_each_match`]); returns how many it appended.
    pub fn matches(
        &self,
        subject: Subject<'_>,
        kind: Option<&str>,
        out: &mut Vec<(SubId, S)>,
    ) -> usize {
        let start = out.len();
        self.for_each_match(subject, kind, |id, s| out.push((id, s)));
        out.len() - start
    }

    /// Appends every subscriber with at least one matching subscription to
    /// `out`, each once (first match first); returns how many it appended.
    pub fn matching_subscribers(
        &self,
        subject: Subject<'_>,
        kind: Option<&str>,
        out: &mut Vec<S>,
    ) -> usize {
        let start = out.len();
        self.for_each_match(subject, kind, |_, s| out.push(s));
        let found = out.len() - start;
        if found <= 16 {
            // Few: quadratic in place, no allocation.
            let mut keep = start;
            for i in start..out.len() {
                let s = out[i];
                if !out[start..keep].contains(&s) {
                    out[keep] = s;
                    keep += 1;
                }
            }
            out.truncate(keep);
        } else {
            let mut seen = FxHashSet::default();
            seen.reserve(found);
            let mut keep = start;
            for i in start..out.len() {
                let s = out[i];
                if seen.insert(s) {
                    out[keep] = s;
                    keep += 1;
                }
            }
            out.truncate(keep);
        }
        out.len() - start
    }

    /// Whether any subscription, of any type, matches `subject`: the test a
    /// node runs before forwarding to another node.
    pub fn has_interest(&self, subject: Subject<'_>) -> bool {
        if self.len == 0 {
            return false;
        }
        let mut buf = [NONE; MAX_TOKENS];
        let n = self.tokens(subject, &mut buf);
        if self.trie.any_match(ROOT, &buf[..n]) {
            return true;
        }
        let mut found = false;
        for idx in &self.cmsg {
            if !found && !idx.is_empty() {
                idx.walk(subject.as_str(), None, &mut |_| {
                    found = true;
                    false
                });
            }
        }
        found
    }

    /// Every distinct (pattern, type pattern) pair held, with its number of
    /// subscriptions, in no promised order. A node advertises these to the
    /// mesh and, by comparing two snapshots, the changes.
    pub fn patterns(&self) -> impl Iterator<Item = Interest> + '_ {
        self.trie
            .nodes
            .iter()
            .enumerate()
            .flat_map(move |(i, node)| {
                [(&node.here, false), (&node.rest, true)]
                    .into_iter()
                    .filter_map(move |(leaf, rest)| leaf.as_deref().map(|l| (i, rest, l)))
            })
            .flat_map(move |(i, rest, leaf)| {
                let any = (!leaf.any.is_empty()).then_some((NONE, leaf.any.len()));
                let kinds = leaf.kinds.iter().map(|(k, v)| (*k, v.len()));
                any.into_iter().chain(kinds).map(move |(kind, n)| Interest {
                    syntax: Syntax::Tokens,
                    pattern: self.trie.pattern(i as u32, rest),
                    kind: self.kind_pattern(kind).to_string(),
                    subscriptions: n,
                })
            })
            .chain(self.cmsg.iter().flat_map(|c| c.pairs()).map(|p| Interest {
                syntax: Syntax::Cmsg,
                pattern: p.subject.as_str().to_owned(),
                kind: p.kind.as_str().to_owned(),
                subscriptions: p.subs.len(),
            }))
    }
}
