//! The subscription trie behind [`super::Router`]: interned tokens, an arena
//! of compact nodes and one global edge table.
//!
//! - Every literal token and exact type is interned once ([`Interner`]) and
//!   named by a `u32`; the string is stored twice (as the map key and for
//!   reverse lookup), however many patterns use it.
//! - A node is 32 bytes: its parent, the label of the edge from the parent,
//!   its `*` child, the number of its literal children, and two optional
//!   leaves: subscriptions whose pattern ends here, and subscriptions whose
//!   pattern is this node's path followed by `>`. A `>` never gets a node of
//!   its own, because nothing may follow it.
//! - Literal children live in one `FxHashMap<(parent, token), child>` shared
//!   by all nodes, so a node with one child does not pay for a map.
//! - A leaf indexes its subscriptions by type: those with type pattern `*`
//!   in one list, the rest in lists by interned type, sorted, so that
//!   matching never looks at a subscription of another type (it binary
//!   searches the types named at that one pattern). A list of one
//!   subscription is stored inline.
//!
//! A match visits, per subject token, at most the literal child and the `*`
//! child of each live branch, so its cost depends on the subject and the
//! patterns that match it, not on how many other patterns are held.

use rustc_hash::FxHashMap;

use super::SubId;

/// "No node" / "no token": `u32::MAX`.
pub(super) const NONE: u32 = u32::MAX;
/// The label of a `*` node.
pub(super) const STAR: u32 = u32::MAX - 1;
/// The root node's index.
pub(super) const ROOT: u32 = 0;

/// Strings to small ids, reference counted so unused ones are forgotten.
#[derive(Debug, Default)]
pub(super) struct Interner {
    ids: FxHashMap<Box<str>, u32>,
    strs: Vec<(Option<Box<str>>, u32)>,
    free: Vec<u32>,
}

impl Interner {
    /// The id of `s`, if some pattern or type uses it.
    #[inline]
    pub(super) fn get(&self, s: &str) -> Option<u32> {
        self.ids.get(s).copied()
    }

    /// The id of `s`, taking a reference.
    pub(super) fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            self.strs[id as usize].1 += 1;
            return id;
        }
        let boxed: Box<str> = s.into();
        let id = match self.free.pop() {
            Some(id) => {
                self.strs[id as usize] = (Some(boxed.clone()), 1);
                id
            }
            None => {
                self.strs.push((Some(boxed.clone()), 1));
                (self.strs.len() - 1) as u32
            }
        };
        self.ids.insert(boxed, id);
        id
    }

    /// Drops a reference to `id`, forgetting the string at the last.
    pub(super) fn release(&mut self, id: u32) {
        let slot = &mut self.strs[id as usize];
        slot.1 -= 1;
        if slot.1 == 0 {
            if let Some(s) = slot.0.take() {
                self.ids.remove(&s);
            }
            if self.ids.is_empty() {
                // Nothing is left: give the memory back.
                *self = Interner::default();
            } else {
                self.free.push(id);
            }
        }
    }

    /// The string of a live id.
    pub(super) fn resolve(&self, id: u32) -> &str {
        self.strs[id as usize].0.as_deref().unwrap_or("")
    }

    /// Number of live strings.
    pub(super) fn len(&self) -> usize {
        self.ids.len()
    }
}

/// A list of subscriptions that stores a single one inline (most patterns
/// have one subscriber) and allocates only for more.
#[derive(Debug)]
pub(super) enum Subs {
    /// Exactly one.
    One(SubId),
    /// None, or two and more.
    Many(Vec<SubId>),
}

impl Default for Subs {
    fn default() -> Self {
        Subs::Many(Vec::new())
    }
}

impl Subs {
    #[inline]
    pub(super) fn as_slice(&self) -> &[SubId] {
        match self {
            Subs::One(id) => std::slice::from_ref(id),
            Subs::Many(v) => v,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    /// Appends `id`; returns its position.
    pub(super) fn push(&mut self, id: SubId) -> u32 {
        match self {
            Subs::Many(v) if v.is_empty() => {
                *self = Subs::One(id);
                0
            }
            Subs::One(first) => {
                *self = Subs::Many(vec![*first, id]);
                1
            }
            Subs::Many(v) => {
                v.push(id);
                (v.len() - 1) as u32
            }
        }
    }

    /// Removes the entry at `pos` by moving the last one there; returns the
    /// one that moved.
    pub(super) fn swap_remove(&mut self, pos: u32) -> Option<SubId> {
        match self {
            Subs::One(_) => {
                *self = Subs::default();
                None
            }
            Subs::Many(v) => {
                v.swap_remove(pos as usize);
                let moved = v.get(pos as usize).copied();
                if v.len() == 1 {
                    // The survivor is at position 0 either way.
                    *self = Subs::One(v[0]);
                } else if v.capacity() > 4 * v.len() {
                    v.shrink_to_fit();
                }
                moved
            }
        }
    }
}

/// Subscriptions that end at one place in the trie, by type pattern.
#[derive(Debug, Default)]
pub(super) struct Leaf {
    /// Type pattern `*`.
    pub(super) any: Subs,
    /// Exact types, sorted by interned id (the empty string, interned,
    /// stands for "untyped"). A sorted vector rather than a map: one
    /// pattern rarely has more than a few types, and a map's smallest table
    /// costs several times more.
    pub(super) kinds: Vec<(u32, Subs)>,
}

impl Leaf {
    fn is_empty(&self) -> bool {
        self.any.is_empty() && self.kinds.is_empty()
    }

    /// Calls `f` for every subscription here that accepts type `kind`
    /// (`None`: a type no subscription names).
    #[inline]
    fn each(&self, kind: Option<u32>, f: &mut impl FnMut(SubId)) {
        for &id in self.any.as_slice() {
            f(id);
        }
        if let (Some(k), false) = (kind, self.kinds.is_empty()) {
            if let Ok(i) = self.kinds.binary_search_by_key(&k, |e| e.0) {
                for &id in self.kinds[i].1.as_slice() {
                    f(id);
                }
            }
        }
    }

    /// Adds `id` to the list for type `kind` (`NONE`: any); returns its
    /// position there.
    pub(super) fn push(&mut self, kind: u32, id: SubId) -> u32 {
        if kind == NONE {
            return self.any.push(id);
        }
        match self.kinds.binary_search_by_key(&kind, |e| e.0) {
            Ok(i) => self.kinds[i].1.push(id),
            Err(i) => {
                self.kinds.reserve_exact(1);
                self.kinds.insert(i, (kind, Subs::One(id)));
                0
            }
        }
    }

    /// Removes the entry at `pos` of the list for `kind`; returns the one
    /// that moved into `pos`.
    fn remove(&mut self, kind: u32, pos: u32) -> Option<SubId> {
        if kind == NONE {
            return self.any.swap_remove(pos);
        }
        let i = self
            .kinds
            .binary_search_by_key(&kind, |e| e.0)
            .expect("subscription's type list");
        let moved = self.kinds[i].1.swap_remove(pos);
        if self.kinds[i].1.is_empty() {
            self.kinds.remove(i);
            if self.kinds.capacity() > 2 * self.kinds.len() {
                self.kinds.shrink_to_fit();
            }
        }
        moved
    }
}

/// One place in the trie; see the module documentation.
#[derive(Debug)]
pub(super) struct Node {
    pub(super) parent: u32,
    /// The token of the edge from the parent, or [`STAR`]; [`NONE`] for the
    /// root and for free nodes.
    pub(super) label: u32,
    star: u32,
    literals: u32,
    /// Patterns that end at this node.
    pub(super) here: Option<Box<Leaf>>,
    /// Patterns that are this node's path followed by `>`.
    pub(super) rest: Option<Box<Leaf>>,
}

impl Node {
    fn new(parent: u32, label: u32) -> Node {
        Node {
            parent,
            label,
            star: NONE,
            literals: 0,
            here: None,
            rest: None,
        }
    }

    fn is_unused(&self) -> bool {
        self.star == NONE && self.literals == 0 && self.here.is_none() && self.rest.is_none()
    }
}

#[inline]
fn edge(parent: u32, token: u32) -> u64 {
    (u64::from(parent) << 32) | u64::from(token)
}

/// The trie proper: nodes, edges and the interner.
#[derive(Debug)]
pub(super) struct Trie {
    pub(super) nodes: Vec<Node>,
    free: Vec<u32>,
    edges: FxHashMap<u64, u32>,
    pub(super) strings: Interner,
}

impl Default for Trie {
    fn default() -> Self {
        Trie {
            nodes: vec![Node::new(NONE, NONE)],
            free: Vec::new(),
            edges: FxHashMap::default(),
            strings: Interner::default(),
        }
    }
}

impl Trie {
    /// Nodes in use besides the root.
    pub(super) fn node_count(&self) -> usize {
        self.nodes.len() - 1 - self.free.len()
    }

    fn alloc(&mut self, parent: u32, label: u32) -> u32 {
        let node = Node::new(parent, label);
        match self.free.pop() {
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

    /// The child of `parent` for a `*` or a literal token, created if
    /// needed.
    pub(super) fn child(&mut self, parent: u32, token: Option<&str>) -> u32 {
        match token {
            None => {
                let star = self.nodes[parent as usize].star;
                if star != NONE {
                    return star;
                }
                let c = self.alloc(parent, STAR);
                self.nodes[parent as usize].star = c;
                c
            }
            Some(lit) => {
                if let Some(t) = self.strings.get(lit) {
                    if let Some(&c) = self.edges.get(&edge(parent, t)) {
                        return c;
                    }
                }
                let t = self.strings.intern(lit);
                let c = self.alloc(parent, t);
                self.edges.insert(edge(parent, t), c);
                self.nodes[parent as usize].literals += 1;
                c
            }
        }
    }

    /// The leaf at `node` (`rest`: its `>` leaf), created if needed.
    pub(super) fn leaf_mut(&mut self, node: u32, rest: bool) -> &mut Leaf {
        let n = &mut self.nodes[node as usize];
        let slot = if rest { &mut n.rest } else { &mut n.here };
        slot.get_or_insert_with(Box::default)
    }

    /// Removes the entry at `pos` of list `kind` in a leaf and frees what
    /// became unused, up towards the root. Returns the subscription that
    /// moved into `pos`, whose position the caller must update.
    pub(super) fn remove(&mut self, node: u32, rest: bool, kind: u32, pos: u32) -> Option<SubId> {
        let n = &mut self.nodes[node as usize];
        let slot = if rest { &mut n.rest } else { &mut n.here };
        let leaf = slot.as_mut().expect("subscription's leaf exists");
        let moved = leaf.remove(kind, pos);
        if leaf.is_empty() {
            *slot = None;
        }
        if kind != NONE {
            self.strings.release(kind);
        }
        self.prune(node);
        moved
    }

    /// Frees `node` and its ancestors while they hold nothing.
    fn prune(&mut self, mut node: u32) {
        while node != ROOT && self.nodes[node as usize].is_unused() {
            let Node { parent, label, .. } = self.nodes[node as usize];
            if label == STAR {
                self.nodes[parent as usize].star = NONE;
            } else {
                self.edges.remove(&edge(parent, label));
                self.nodes[parent as usize].literals -= 1;
                self.strings.release(label);
            }
            self.nodes[node as usize] = Node::new(NONE, NONE);
            self.free.push(node);
            node = parent;
        }
        if self.free.len() == self.nodes.len() - 1 {
            // Everything is gone: give the memory back.
            self.nodes.truncate(1);
            self.nodes.shrink_to_fit();
            self.free = Vec::new();
            self.edges = FxHashMap::default();
        }
    }

    /// Calls `f` for every subscription whose pattern matches the subject
    /// with interned tokens `toks` ([`NONE`]: no pattern names that token)
    /// and accepts type `kind`.
    pub(super) fn walk(
        &self,
        node: u32,
        toks: &[u32],
        kind: Option<u32>,
        f: &mut impl FnMut(SubId),
    ) {
        let n = &self.nodes[node as usize];
        match toks.split_first() {
            None => {
                if let Some(leaf) = &n.here {
                    leaf.each(kind, f);
                }
            }
            Some((&t, tail)) => {
                if let Some(leaf) = &n.rest {
                    leaf.each(kind, f);
                }
                if t != NONE && n.literals > 0 {
                    if let Some(&c) = self.edges.get(&edge(node, t)) {
                        self.walk(c, tail, kind, f);
                    }
                }
                if n.star != NONE {
                    self.walk(n.star, tail, kind, f);
                }
            }
        }
    }

    /// Whether any pattern, whatever its type, matches `toks`.
    pub(super) fn any_match(&self, node: u32, toks: &[u32]) -> bool {
        let n = &self.nodes[node as usize];
        match toks.split_first() {
            None => n.here.is_some(),
            Some((&t, tail)) => {
                n.rest.is_some()
                    || (t != NONE
                        && n.literals > 0
                        && self
                            .edges
                            .get(&edge(node, t))
                            .is_some_and(|&c| self.any_match(c, tail)))
                    || (n.star != NONE && self.any_match(n.star, tail))
            }
        }
    }

    /// The pattern text of `node` (followed by `.>` if `rest`).
    pub(super) fn pattern(&self, node: u32, rest: bool) -> String {
        let mut labels = Vec::new();
        let mut at = node;
        while at != ROOT {
            let n = &self.nodes[at as usize];
            labels.push(n.label);
            at = n.parent;
        }
        let mut out = String::new();
        for &l in labels.iter().rev() {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(if l == STAR {
                "*"
            } else {
                self.strings.resolve(l)
            });
        }
        if rest {
            if !out.is_empty() {
                out.push('.');
            }
            out.push('>');
        }
        out
    }

    /// Number of literal edges (for tests).
    #[cfg(test)]
    pub(super) fn edge_count(&self) -> usize {
        self.edges.len()
    }
}
