//! cMsg patterns: the second pattern kind, matched over a whole subject or
//! type string rather than token by token (cMsg's subscriptions; see
//! [`Syntax`] for how a subscription chooses it).
//!
//! # Syntax
//! - `*` matches any run of characters, including none and including dots:
//!   `daq.h*b.rate` matches `daq.hallb.rate` and `daq.hb.rate`.
//! - `?` matches exactly one character: `count?` matches `count1`, not
//!   `count` nor `count12`.
//! - `#` matches a non-negative integer, one or more ASCII digits:
//!   `run.#` matches `run.7` and `run.0042`, not `run.` nor `run.x`.
//!   (cMsg's own matcher also lets `#` match no digits; here it needs one.)
//! - `{i>5 & i<10 | i=20}` matches an integer in a range: terms `i<N`,
//!   `i>N`, `i=N` (or `N<i`, `N>i`, `N=i`), joined by `&` (and) and `|`
//!   (or), `&` binding tighter than `|`; spaces inside the braces are
//!   ignored; `{}` and `{i}` match any integer. `#{...}` means the same as
//!   `{...}` (a `#` position with a range). An integer longer than `u64`
//!   compares greater than every bound. (cMsg evaluates the terms left to
//!   right instead; the two agree unless a `|` comes before a `&`.)
//! - Every other character matches itself. There is no escape: a literal
//!   `*`, `?`, `#`, `{` or `}` cannot be matched.
//!
//! A subject pattern is at most [`MAX_SUBJECT`] bytes, a type pattern at
//! most [`MAX_KIND`]; neither holds whitespace or control characters (no
//! subject or type does), a subject pattern holds no `>` (no subject does),
//! and a range holds at most [`MAX_RANGE_TERMS`] terms. An empty type
//! pattern matches only untyped messages; `*` matches every type and none.
//!
//! # Cost
//! [`CmsgPattern::parse`] is one pass, total and bounded (it is fuzzed).
//! [`CmsgPattern::matches`] runs the pattern over the set of positions the
//! text can be at (a bit set, no backtracking and no allocation for texts
//! up to [`MAX_SUBJECT`] bytes): O(pattern elements × text length) plus
//! the literal comparisons, whatever the input. The router indexes cMsg
//! patterns by their literal start, end or inner literal (the private
//! `cindex` module) so that a message is matched only against candidates.

use std::fmt;

use super::subject::SubjectError;
pub use crate::wire::{MAX_KIND, MAX_SUBJECT};

/// Most `&`/`|` terms in one `{...}` range.
pub const MAX_RANGE_TERMS: usize = 16;

/// Which pattern kind a subscription uses; chosen explicitly per
/// subscription and carried with it to the node and across the mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(u8)]
pub enum Syntax {
    /// Dot-separated tokens with `*` (one token) and `>` (the rest); type
    /// patterns `*`, empty or exact. The default.
    #[default]
    Tokens = 0,
    /// cMsg's matching over whole strings, for the subject and the type
    /// (this module).
    Cmsg = 1,
}

impl Syntax {
    /// The wire byte's value, if known.
    pub fn from_u8(b: u8) -> Option<Syntax> {
        match b {
            0 => Some(Syntax::Tokens),
            1 => Some(Syntax::Cmsg),
            _ => None,
        }
    }

    /// `tokens` or `cmsg`.
    pub fn name(self) -> &'static str {
        match self {
            Syntax::Tokens => "tokens",
            Syntax::Cmsg => "cmsg",
        }
    }
}

impl fmt::Display for Syntax {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One comparison of a range: the integer against a bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmp {
    /// `i < n`
    Lt(u64),
    /// `i > n`
    Gt(u64),
    /// `i = n`
    Eq(u64),
}

impl Cmp {
    /// Whether `v` (`None`: larger than any `u64`) passes.
    fn test(self, v: Option<u64>) -> bool {
        match (self, v) {
            (Cmp::Lt(n), Some(v)) => v < n,
            (Cmp::Gt(n), Some(v)) => v > n,
            (Cmp::Eq(n), Some(v)) => v == n,
            (Cmp::Gt(_), None) => true,
            (_, None) => false,
        }
    }
}

/// An integer range: an `|` of `&`s of comparisons; empty means any.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Range {
    pub(crate) any_of: Vec<Vec<Cmp>>,
}

impl Range {
    /// Whether `v` (`None`: larger than any `u64`) is in the range.
    pub(crate) fn contains(&self, v: Option<u64>) -> bool {
        self.any_of.is_empty() || self.any_of.iter().any(|all| all.iter().all(|c| c.test(v)))
    }
}

/// One element of a parsed pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Elem {
    /// These characters, exactly.
    Lit(Box<str>),
    /// `*`
    Star,
    /// `?`
    One,
    /// `#` or a range: one or more digits whose value is in the range.
    Int(Range),
}

/// A parsed cMsg pattern (see the module documentation), ready to match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmsgPattern {
    text: Box<str>,
    pub(crate) elems: Vec<Elem>,
}

/// Where a pattern may be used: subject patterns refuse `>` and the empty
/// string, and the two have different length limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Subject,
    Kind,
}

impl CmsgPattern {
    /// Parses a subject pattern.
    pub fn subject(s: &str) -> Result<CmsgPattern, SubjectError> {
        parse(s, Role::Subject)
    }

    /// Parses a type pattern (the empty string: untyped messages only).
    pub fn kind(s: &str) -> Result<CmsgPattern, SubjectError> {
        parse(s, Role::Kind)
    }

    /// The pattern's text, as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The literal characters every matching text starts with (empty when
    /// the pattern starts with a wildcard): what the router indexes by.
    pub fn literal_prefix(&self) -> &str {
        match self.elems.first() {
            Some(Elem::Lit(l)) => l,
            _ => "",
        }
    }

    /// The literal characters every matching text ends with, when the
    /// pattern ends with a literal and starts with a wildcard (empty
    /// otherwise): what the router's reverse index keys by.
    pub fn literal_suffix(&self) -> &str {
        match (self.elems.first(), self.elems.last()) {
            (Some(Elem::Lit(_)), _) | (_, None) => "",
            (_, Some(Elem::Lit(l))) => l,
            _ => "",
        }
    }

    /// The first two bytes of the pattern's longest literal, when it has
    /// one of two bytes or more: every matching text holds them side by
    /// side (the router's third index keys by them).
    pub fn inner_key(&self) -> Option<[u8; 2]> {
        let longest = self
            .elems
            .iter()
            .filter_map(|e| match e {
                Elem::Lit(l) => Some(l.as_bytes()),
                _ => None,
            })
            .max_by_key(|l| l.len())?;
        (longest.len() >= 2).then(|| [longest[0], longest[1]])
    }

    /// Whether the pattern has no wildcard (it matches only its own text).
    pub fn is_literal(&self) -> bool {
        self.elems.iter().all(|e| matches!(e, Elem::Lit(_)))
    }

    /// The pattern's shape: its elements with every range widened to any
    /// integer, as text (`*#*` for `*{i>7}*`; a literal cannot hold a
    /// wildcard character, so the text is unambiguous). Patterns of one
    /// shape are matched together by the router (the private `cshape`
    /// module).
    pub(crate) fn shape(&self) -> CmsgPattern {
        let mut text = String::new();
        let elems = self
            .elems
            .iter()
            .map(|e| match e {
                Elem::Lit(l) => {
                    text.push_str(l);
                    e.clone()
                }
                Elem::Star => {
                    text.push('*');
                    Elem::Star
                }
                Elem::One => {
                    text.push('?');
                    Elem::One
                }
                Elem::Int(_) => {
                    text.push('#');
                    Elem::Int(Range::default())
                }
            })
            .collect();
        CmsgPattern {
            text: text.into(),
            elems,
        }
    }

    /// Whether `text` (a whole subject or type; untyped is `""`) matches.
    pub fn matches(&self, text: &str) -> bool {
        self.matches_from(text, 0, 0)
    }

    /// Whether `text[at..]` matches the elements from `first` on (the
    /// router calls it past a literal prefix it has already compared).
    pub(crate) fn matches_from(&self, text: &str, first: usize, at: usize) -> bool {
        let elems = &self.elems[first..];
        match elems {
            [] => return at == text.len(),
            [Elem::Star] => return true,
            [Elem::Lit(l)] => return text[at..] == **l,
            _ => {}
        }
        // Cheap necessary conditions first: the literal end, every literal
        // somewhere, the least length, a digit for an integer (the bit-set
        // pass is the costly part).
        let rest = &text[at..];
        if let Some(Elem::Lit(l)) = elems.last() {
            if !rest.ends_with(&**l) {
                return false;
            }
        }
        let (mut need, mut int) = (0, false);
        for e in elems {
            match e {
                Elem::Lit(l) => {
                    if !rest.contains(&**l) {
                        return false;
                    }
                    need += l.len();
                }
                Elem::One => need += 1,
                Elem::Int(_) => {
                    need += 1;
                    int = true;
                }
                Elem::Star => {}
            }
        }
        if need > rest.len() || (int && !rest.bytes().any(|b| b.is_ascii_digit())) {
            return false;
        }
        let words = text.len() / 64 + 1;
        let mut stack = [[0u64; 17]; 2];
        let mut heap;
        let (cur, next): (&mut [u64], &mut [u64]) = if words <= 17 {
            let [a, b] = &mut stack;
            (&mut a[..words], &mut b[..words])
        } else {
            heap = vec![0u64; 2 * words];
            heap.split_at_mut(words)
        };
        set(cur, at);
        let (mut cur, mut next) = (cur, next);
        for e in elems {
            next.fill(0);
            if !step(e, text, cur, next) {
                return false;
            }
            std::mem::swap(&mut cur, &mut next);
        }
        get(cur, text.len())
    }
}

impl fmt::Display for CmsgPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[inline]
pub(super) fn set(bits: &mut [u64], i: usize) {
    bits[i / 64] |= 1 << (i % 64);
}

#[inline]
pub(super) fn get(bits: &[u64], i: usize) -> bool {
    bits[i / 64] & (1 << (i % 64)) != 0
}

/// The set positions, in increasing order.
pub(super) fn ones(bits: &[u64]) -> impl Iterator<Item = usize> + '_ {
    bits.iter().enumerate().flat_map(|(w, &word)| {
        let mut word = word;
        std::iter::from_fn(move || {
            if word == 0 {
                return None;
            }
            let b = word.trailing_zeros() as usize;
            word &= word - 1;
            Some(w * 64 + b)
        })
    })
}

/// Moves the positions in `cur` across `e` into `next`; false when none
/// is left.
pub(super) fn step(e: &Elem, text: &str, cur: &[u64], next: &mut [u64]) -> bool {
    let bytes = text.as_bytes();
    let n = text.len();
    let mut any = false;
    match e {
        Elem::Lit(l) => {
            for j in ones(cur) {
                if bytes[j..].starts_with(l.as_bytes()) {
                    set(next, j + l.len());
                    any = true;
                }
            }
        }
        Elem::One => {
            for j in ones(cur) {
                if let Some(c) = text[j..].chars().next() {
                    set(next, j + c.len_utf8());
                    any = true;
                }
            }
        }
        Elem::Star => {
            if let Some(first) = ones(cur).next() {
                for (k, _) in text[first..].char_indices() {
                    set(next, first + k);
                }
                set(next, n);
                any = true;
            }
        }
        Elem::Int(range) => {
            let zero_ok = range.contains(Some(0));
            let huge_ok = range.contains(None);
            // Positions of the current run of digits: [run_start, run_end).
            let (mut run_end, mut last_z) = (0usize, usize::MAX);
            let mut fill_from = usize::MAX;
            let mut zeros_to: Option<(usize, usize)> = None;
            for j in ones(cur) {
                if j >= n || !bytes[j].is_ascii_digit() {
                    continue;
                }
                if j >= run_end {
                    // A new run: finish the last one's fills.
                    flush(next, &mut fill_from, run_end, &mut zeros_to, &mut any);
                    run_end = j + bytes[j..].iter().take_while(|b| b.is_ascii_digit()).count();
                    last_z = usize::MAX;
                }
                // Leading zeros do not change the value: from j, the ends
                // up to the first non-zero digit z read 0, and the ends past
                // it read what they read from z.
                let z = j + bytes[j..run_end].iter().take_while(|&&b| b == b'0').count();
                if z > j && zero_ok {
                    zeros_to = Some(match zeros_to {
                        Some((a, b)) if b == z => (a.min(j + 1), z),
                        Some(prev) => {
                            fill(next, prev.0, prev.1);
                            any = true;
                            (j + 1, z)
                        }
                        None => (j + 1, z),
                    });
                }
                if z < run_end && z != last_z {
                    last_z = z;
                    let mut v: u64 = 0;
                    for k in z + 1..=run_end {
                        let d = u64::from(bytes[k - 1] - b'0');
                        match v.checked_mul(10).and_then(|v| v.checked_add(d)) {
                            Some(w) => {
                                v = w;
                                if range.contains(Some(v)) {
                                    set(next, k);
                                    any = true;
                                }
                            }
                            None => {
                                // From here on every end is past u64.
                                if huge_ok {
                                    fill_from = fill_from.min(k);
                                }
                                break;
                            }
                        }
                    }
                }
            }
            flush(next, &mut fill_from, run_end, &mut zeros_to, &mut any);
        }
    }
    any
}

/// Sets the pending fills of a run of digits ending at `run_end`.
fn flush(
    next: &mut [u64],
    fill_from: &mut usize,
    run_end: usize,
    zeros_to: &mut Option<(usize, usize)>,
    any: &mut bool,
) {
    if *fill_from <= run_end {
        fill(next, *fill_from, run_end);
        *any = true;
    }
    *fill_from = usize::MAX;
    if let Some((a, b)) = zeros_to.take() {
        fill(next, a, b);
        *any = true;
    }
}

/// Sets positions `a..=b`.
fn fill(next: &mut [u64], a: usize, b: usize) {
    for i in a..=b {
        set(next, i);
    }
}

/// A pattern that breaks the rules: where and why.
fn bad(s: &str, at: usize, why: &'static str) -> SubjectError {
    SubjectError::BadCmsg {
        pattern: s.chars().take(80).collect(),
        at,
        why,
    }
}

fn parse(s: &str, role: Role) -> Result<CmsgPattern, SubjectError> {
    let (what, max) = match role {
        Role::Subject => ("cMsg pattern", MAX_SUBJECT),
        Role::Kind => ("cMsg type pattern", MAX_KIND),
    };
    if s.len() > max {
        return Err(SubjectError::TooLong {
            what,
            len: s.len(),
            max,
        });
    }
    if s.is_empty() && role == Role::Subject {
        return Err(SubjectError::Empty { what });
    }
    let mut elems: Vec<Elem> = Vec::new();
    let mut lit = String::new();
    let mut chars = s.char_indices().peekable();
    let push = |elems: &mut Vec<Elem>, lit: &mut String, e: Option<Elem>| {
        if !lit.is_empty() {
            elems.push(Elem::Lit(std::mem::take(lit).into_boxed_str()));
        }
        match e {
            // `**` is `*`.
            Some(Elem::Star) if elems.last() == Some(&Elem::Star) => {}
            Some(e) => elems.push(e),
            None => {}
        }
    };
    while let Some((at, c)) = chars.next() {
        match c {
            '*' => push(&mut elems, &mut lit, Some(Elem::Star)),
            '?' => push(&mut elems, &mut lit, Some(Elem::One)),
            '#' => {
                let range = if chars.peek().is_some_and(|&(_, c)| c == '{') {
                    let (open, _) = chars.next().expect("peeked");
                    parse_range(s, open, &mut chars)?
                } else {
                    Range::default()
                };
                push(&mut elems, &mut lit, Some(Elem::Int(range)));
            }
            '{' => {
                let range = parse_range(s, at, &mut chars)?;
                push(&mut elems, &mut lit, Some(Elem::Int(range)));
            }
            '}' => return Err(bad(s, at, "`}` without its `{`")),
            c if c.is_whitespace() || c.is_control() => {
                return Err(bad(
                    s,
                    at,
                    "whitespace or a control character (no subject or type holds one)",
                ))
            }
            '>' if role == Role::Subject => {
                return Err(bad(
                    s,
                    at,
                    "`>`, which no subject holds (in a cMsg pattern `*` matches the rest)",
                ))
            }
            c => lit.push(c),
        }
    }
    push(&mut elems, &mut lit, None);
    Ok(CmsgPattern {
        text: s.into(),
        elems,
    })
}

/// Parses a range after its `{` (at byte `open`), through its `}`.
fn parse_range(
    s: &str,
    open: usize,
    chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>,
) -> Result<Range, SubjectError> {
    // The body, spaces dropped.
    let mut body: Vec<(usize, char)> = Vec::new();
    loop {
        match chars.next() {
            None => return Err(bad(s, open, "`{` without its `}`")),
            Some((_, '}')) => break,
            Some((_, ' ')) => {}
            Some((at, c)) => {
                if body.len() > 32 * MAX_RANGE_TERMS {
                    return Err(bad(s, at, "a range that long (at most 16 terms)"));
                }
                body.push((at, c));
            }
        }
    }
    let mut range = Range::default();
    if body.is_empty() || (body.len() == 1 && body[0].1 == 'i') {
        return Ok(range);
    }
    let mut all: Vec<Cmp> = Vec::new();
    let mut terms = 0;
    let mut i = 0;
    loop {
        terms += 1;
        if terms > MAX_RANGE_TERMS {
            return Err(bad(s, open, "a range with more than 16 terms"));
        }
        let (cmp, after) = parse_term(s, open, &body, i)?;
        all.push(cmp);
        i = after;
        match body.get(i) {
            None => break,
            Some((_, '&')) => {}
            Some((_, '|')) => range.any_of.push(std::mem::take(&mut all)),
            Some(&(at, _)) => {
                return Err(bad(
                    s,
                    at,
                    "this in a range (after a term: `&`, `|` or `}`)",
                ))
            }
        }
        i += 1;
    }
    range.any_of.push(all);
    Ok(range)
}

/// One term `i OP N` or `N OP i` from `body[i..]`; returns it and where it
/// ends.
fn parse_term(
    s: &str,
    open: usize,
    body: &[(usize, char)],
    i: usize,
) -> Result<(Cmp, usize), SubjectError> {
    let at = |k: usize| body.get(k).map_or(open, |&(a, _)| a);
    let number = |k: usize| -> Result<(u64, usize), SubjectError> {
        let mut v: u64 = 0;
        let mut end = k;
        while let Some(&(_, c)) = body.get(end) {
            let Some(d) = c.to_digit(10).filter(|_| c.is_ascii_digit()) else {
                break;
            };
            v = v
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(d)))
                .ok_or_else(|| bad(s, at(k), "a bound larger than 2^64 - 1 in a range"))?;
            end += 1;
        }
        if end == k {
            return Err(bad(s, at(k), "this in a range (expected `i` or a number)"));
        }
        Ok((v, end))
    };
    let op = |k: usize| match body.get(k).map(|&(_, c)| c) {
        Some('<') => Ok('<'),
        Some('>') => Ok('>'),
        Some('=') => Ok('='),
        _ => Err(bad(s, at(k), "this in a range (expected `<`, `>` or `=`)")),
    };
    if body.get(i).map(|&(_, c)| c) == Some('i') {
        let o = op(i + 1)?;
        let (n, end) = number(i + 2)?;
        let cmp = match o {
            '<' => Cmp::Lt(n),
            '>' => Cmp::Gt(n),
            _ => Cmp::Eq(n),
        };
        Ok((cmp, end))
    } else {
        let (n, end) = number(i)?;
        let o = op(end)?;
        if body.get(end + 1).map(|&(_, c)| c) != Some('i') {
            return Err(bad(
                s,
                at(end + 1),
                "this in a range (a term compares `i` with a number)",
            ));
        }
        // `N < i` is `i > N`.
        let cmp = match o {
            '<' => Cmp::Gt(n),
            '>' => Cmp::Lt(n),
            _ => Cmp::Eq(n),
        };
        Ok((cmp, end + 2))
    }
}

#[cfg(test)]
pub(crate) mod tests;
