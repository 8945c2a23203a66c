//! Router tests: semantics by example, bookkeeping, and a property test
//! against a naive reference matcher.

use super::*;
use proptest::prelude::*;

fn subj(s: &str) -> Subject<'_> {
    Subject::new(s).unwrap()
}

fn matched(r: &Router<u64>, s: &str, kind: Option<&str>) -> Vec<(SubId, u64)> {
    let mut out = Vec::new();
    r.matches(subj(s), kind, &mut out);
    out.sort();
    out
}

fn ids(r: &Router<u64>, s: &str, kind: Option<&str>) -> Vec<SubId> {
    matched(r, s, kind).into_iter().map(|(id, _)| id).collect()
}

fn sorted(mut v: Vec<SubId>) -> Vec<SubId> {
    v.sort();
    v
}

#[test]
fn wildcards_by_example() {
    let mut r = Router::new();
    let exact = r.subscribe("a.b.c", "*", 1).unwrap();
    let one = r.subscribe("a.*.c", "*", 2).unwrap();
    let rest = r.subscribe("a.>", "*", 3).unwrap();
    let all = r.subscribe(">", "*", 4).unwrap();
    let star = r.subscribe("*", "*", 5).unwrap();
    assert_eq!(ids(&r, "a.b.c", None), sorted(vec![exact, one, rest, all]));
    assert_eq!(ids(&r, "a.x.c", None), sorted(vec![one, rest, all]));
    assert_eq!(ids(&r, "a.b", None), sorted(vec![rest, all]));
    assert_eq!(ids(&r, "a.b.c.d", None), sorted(vec![rest, all]));
    // `a.>` does not match `a`; `*` matches exactly one token.
    assert_eq!(ids(&r, "a", None), sorted(vec![all, star]));
    assert_eq!(ids(&r, "z", None), sorted(vec![all, star]));
    assert_eq!(ids(&r, "z.y", None), vec![all]);
}

#[test]
fn kinds_by_example() {
    let mut r = Router::new();
    let any = r.subscribe("t", "*", 1).unwrap();
    let untyped = r.subscribe("t", "", 2).unwrap();
    let ev = r.subscribe("t", "event", 3).unwrap();
    let ev_rest = r.subscribe(">", "event", 4).unwrap();
    assert_eq!(ids(&r, "t", None), sorted(vec![any, untyped]));
    assert_eq!(ids(&r, "t", Some("")), sorted(vec![any, untyped]));
    assert_eq!(ids(&r, "t", Some("event")), sorted(vec![any, ev, ev_rest]));
    assert_eq!(ids(&r, "t", Some("Event")), vec![any]);
    assert_eq!(ids(&r, "u", Some("other")), vec![]);
    assert!(r.subscribe("t", "ev nt", 1).is_err());
    assert!(r.subscribe("t", "ev*", 1).is_err());
    assert!(r.subscribe("t.>.x", "*", 1).is_err());
    assert!(r.subscribe("", "*", 1).is_err());
    assert_eq!(r.len(), 4);
}

#[test]
fn delivery_is_per_subscription_and_subscribers_dedup() {
    let mut r = Router::new();
    let a1 = r.subscribe("x.*", "*", 7).unwrap();
    let a2 = r.subscribe("x.>", "*", 7).unwrap();
    let a3 = r.subscribe("x.y", "*", 7).unwrap();
    let b = r.subscribe("x.y", "*", 8).unwrap();
    assert_eq!(
        matched(&r, "x.y", None),
        vec![(a1, 7), (a2, 7), (a3, 7), (b, 8)]
            .into_iter()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
    );
    let mut subs = vec![99];
    assert_eq!(r.matching_subscribers(subj("x.y"), None, &mut subs), 2);
    subs.sort();
    assert_eq!(subs, vec![7, 8, 99]);
    // The large-fan-out path (more than 16 matches) dedups too.
    let mut r = Router::new();
    for i in 0..100u64 {
        r.subscribe("big.*", "*", i % 10).unwrap();
        r.subscribe("big.>", "*", i % 10).unwrap();
    }
    let mut subs = Vec::new();
    assert_eq!(r.matching_subscribers(subj("big.one"), None, &mut subs), 10);
    subs.sort();
    assert_eq!(subs, (0..10).collect::<Vec<_>>());
}

#[test]
fn no_residue_after_unsubscribe_and_remove_subscriber() {
    let mut r = Router::new();
    let mut mine = Vec::new();
    for i in 0..500u64 {
        let p = match i % 5 {
            0 => format!("svc.{}.events.{}", i / 10, i),
            1 => format!("svc.{}.*.{}", i / 10, i % 7),
            2 => format!("svc.{}.>", i % 13),
            3 => "*.*.x".to_string(),
            _ => ">".to_string(),
        };
        let kind = ["*", "", "ev", "ev2"][(i % 4) as usize];
        mine.push(r.subscribe(&p, kind, i % 17).unwrap());
    }
    assert!(r.node_count() > 0);
    assert_eq!(r.subscriber_count(), 17);
    // Half by id, in an order unrelated to insertion, the rest by subscriber.
    for (n, id) in mine.iter().enumerate() {
        if n % 3 == 0 {
            assert!(r.unsubscribe(*id).is_some());
            assert!(r.unsubscribe(*id).is_none(), "double unsubscribe");
        }
    }
    let mut removed = 0;
    for s in 0..17 {
        removed += r.remove_subscriber(s);
        assert_eq!(r.subscriptions_of(s).count(), 0);
    }
    assert_eq!(removed + mine.len().div_ceil(3), 500);
    assert_eq!(r.remove_subscriber(3), 0);
    assert!(r.is_empty());
    assert_eq!(r.node_count(), 0);
    assert_eq!(r.string_count(), 0);
    assert_eq!(r.trie.edge_count(), 0);
    assert_eq!(r.subscriber_count(), 0);
    assert_eq!(r.patterns().count(), 0);
}

#[test]
fn stale_ids_do_not_touch_new_subscriptions() {
    let mut r = Router::new();
    let old = r.subscribe("a", "*", 1).unwrap();
    assert_eq!(r.unsubscribe(old), Some(1));
    let new = r.subscribe("a", "*", 2).unwrap();
    assert_ne!(old, new);
    assert_eq!(r.unsubscribe(old), None);
    assert_eq!(ids(&r, "a", None), vec![new]);
    assert!(r.subscription(old).is_none());
    // Also after the router emptied and gave its slot table back.
    let mut seen = vec![old, new];
    r.unsubscribe(new);
    for round in 0..5u64 {
        let id = r.subscribe("b", "*", round).unwrap();
        for &dead in &seen {
            assert_ne!(id, dead);
            assert_eq!(r.unsubscribe(dead), None);
        }
        assert_eq!(r.len(), 1);
        r.unsubscribe(id);
        seen.push(id);
    }
}

#[test]
fn subscriptions_of_and_info() {
    let mut r = Router::new();
    let a = r.subscribe("a.*.>", "ev", 1).unwrap();
    let b = r.subscribe(">", "", 1).unwrap();
    let c = r.subscribe("q", "*", 2).unwrap();
    assert_eq!(r.subscriptions_of(1).collect::<Vec<_>>(), vec![b, a]);
    assert_eq!(r.subscriptions_of(2).collect::<Vec<_>>(), vec![c]);
    let info = r.subscription(a).unwrap();
    assert_eq!(
        (info.subscriber, info.pattern.as_str(), info.kind.as_str()),
        (1, "a.*.>", "ev")
    );
    assert_eq!(info.syntax, Syntax::Tokens);
    let info = r.subscription(b).unwrap();
    assert_eq!((info.pattern.as_str(), info.kind.as_str()), (">", ""));
    assert_eq!(r.subscription(c).unwrap().kind, "*");
    let e = r
        .subscribe_pattern(Pattern::cmsg("a.#").unwrap(), "t?", 2)
        .unwrap();
    let info = r.subscription(e).unwrap();
    assert_eq!(
        (info.syntax, info.pattern.as_str(), info.kind.as_str()),
        (Syntax::Cmsg, "a.#", "t?")
    );
    r.unsubscribe(e);
    // Unlinking from the middle of a subscriber's list keeps the rest.
    let d = r.subscribe("z", "*", 1).unwrap();
    r.unsubscribe(b);
    assert_eq!(r.subscriptions_of(1).collect::<Vec<_>>(), vec![d, a]);
}

#[test]
fn patterns_are_distinct_with_counts() {
    let mut r = Router::new();
    r.subscribe("a.b", "*", 1).unwrap();
    r.subscribe("a.b", "*", 2).unwrap();
    r.subscribe("a.b", "ev", 2).unwrap();
    r.subscribe("a.>", "", 3).unwrap();
    r.subscribe("*", "*", 3).unwrap();
    let mut got: Vec<(String, String, usize)> = r
        .patterns()
        .map(|i| (i.pattern, i.kind.to_string(), i.subscriptions))
        .collect();
    got.sort();
    let want = [
        ("*", "*", 1),
        ("a.>", "", 1),
        ("a.b", "*", 2),
        ("a.b", "ev", 1),
    ];
    let want: Vec<_> = want
        .iter()
        .map(|(p, k, n)| (p.to_string(), k.to_string(), *n))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn has_interest_ignores_kind() {
    let mut r = Router::new();
    assert!(!r.has_interest(subj("a")));
    let id = r.subscribe("a.*", "only-this", 1).unwrap();
    assert!(r.has_interest(subj("a.b")));
    assert!(!r.has_interest(subj("a")));
    assert!(!r.has_interest(subj("a.b.c")));
    r.subscribe("a.b.>", "*", 1).unwrap();
    assert!(r.has_interest(subj("a.b.c")));
    r.unsubscribe(id);
    assert!(!r.has_interest(subj("a.x")));
}

#[test]
fn remote_nodes_as_subscribers() {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    enum Handle {
        Client(u64),
        Node(u32),
    }
    let mut r = Router::new();
    r.subscribe("orders.>", "*", Handle::Client(1)).unwrap();
    r.subscribe("orders.*", "*", Handle::Node(9)).unwrap();
    r.subscribe("orders.eu", "*", Handle::Node(9)).unwrap();
    let mut out = Vec::new();
    r.matching_subscribers(subj("orders.eu"), None, &mut out);
    assert_eq!(out.len(), 2);
    assert_eq!(r.remove_subscriber(Handle::Node(9)), 2);
    assert_eq!(r.node_count(), 1);
}

// --- property test against a naive reference matcher ---

fn naive(p: &[&str], s: &[&str]) -> bool {
    match (p.split_first(), s.split_first()) {
        (None, None) => true,
        (Some((&">", _)), Some(_)) => true,
        (Some((&"*", pt)), Some((_, st))) => naive(pt, st),
        (Some((l, pt)), Some((t, st))) => l == t && naive(pt, st),
        _ => false,
    }
}

fn naive_kind(pattern: &str, kind: Option<&str>) -> bool {
    pattern == "*" || pattern == kind.unwrap_or("")
}

fn pattern_strategy() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(prop::sample::select(vec!["a", "b", "c", "*"]), 0..5),
        any::<bool>(),
    )
        .prop_map(|(mut toks, rest)| {
            if rest || toks.is_empty() {
                toks.push(">");
            }
            toks.join(".")
        })
}

fn subject_strategy() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(vec!["a", "b", "c", "d"]), 1..6)
        .prop_map(|t| t.join("."))
}

const KIND_PATTERNS: [&str; 4] = ["*", "", "x", "y"];
const KINDS: [Option<&str>; 4] = [None, Some(""), Some("x"), Some("z")];

type Sub = (String, usize, u64);

fn check_all(r: &Router<u64>, live: &[(SubId, Sub)], subjects: &[(String, usize)]) {
    for (s, k) in subjects {
        let kind = KINDS[*k];
        let st: Vec<&str> = s.split('.').collect();
        let mut want: Vec<(SubId, u64)> = live
            .iter()
            .filter(|(_, (p, kp, _))| {
                let pt: Vec<&str> = p.split('.').collect();
                naive(&pt, &st) && naive_kind(KIND_PATTERNS[*kp], kind)
            })
            .map(|(id, (_, _, sub))| (*id, *sub))
            .collect();
        want.sort();
        assert_eq!(matched(r, s, kind), want, "subject {s} kind {kind:?}");
        let interest = live.iter().any(|(_, (p, _, _))| {
            let pt: Vec<&str> = p.split('.').collect();
            naive(&pt, &st)
        });
        assert_eq!(r.has_interest(subj(s)), interest, "interest in {s}");
        let mut subs = Vec::new();
        r.matching_subscribers(subj(s), kind, &mut subs);
        subs.sort();
        let mut want_subs: Vec<u64> = want.iter().map(|&(_, s)| s).collect();
        want_subs.sort();
        want_subs.dedup();
        assert_eq!(subs, want_subs);
        for (p, _, _) in live.iter().map(|(_, x)| x) {
            let pt: Vec<&str> = p.split('.').collect();
            assert_eq!(Pattern::new(p).unwrap().matches(&subj(s)), naive(&pt, &st));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn matches_like_the_naive_matcher(
        subs in prop::collection::vec((pattern_strategy(), 0..4usize, 0..6u64), 0..40),
        subjects in prop::collection::vec((subject_strategy(), 0..4usize), 1..24),
        removal in prop::collection::vec(any::<u8>(), 0..40),
    ) {
        let mut r = Router::new();
        let mut live: Vec<(SubId, Sub)> = Vec::new();
        for (p, kp, s) in &subs {
            let id = r.subscribe(p, KIND_PATTERNS[*kp], *s).unwrap();
            live.push((id, (p.clone(), *kp, *s)));
        }
        check_all(&r, &live, &subjects);
        // Patterns: every live (pattern, kind) pair once, with its count.
        let total: usize = r.patterns().map(|i| i.subscriptions).sum();
        prop_assert_eq!(total, live.len());
        // Remove some, by id or by subscriber, and check again.
        for b in removal {
            if live.is_empty() {
                break;
            }
            let i = b as usize % live.len();
            if b % 4 == 0 {
                let sub = live[i].1 .2;
                let n = r.remove_subscriber(sub);
                let before = live.len();
                live.retain(|(_, (_, _, s))| *s != sub);
                prop_assert_eq!(n, before - live.len());
            } else {
                let (id, _) = live.swap_remove(i);
                prop_assert!(r.unsubscribe(id).is_some());
            }
        }
        check_all(&r, &live, &subjects);
        for (id, _) in live.drain(..) {
            r.unsubscribe(id);
        }
        prop_assert_eq!(r.node_count(), 0);
        prop_assert_eq!(r.string_count(), 0);
        prop_assert_eq!(r.trie.edge_count(), 0);
        prop_assert!(r.is_empty());
    }
}

// ---- cMsg subscriptions ----

#[test]
fn cmsg_wildcards_in_the_router() {
    let mut r = Router::new();
    let star = r
        .subscribe_as(Syntax::Cmsg, "daq.h*b.rate", "count?", 1)
        .unwrap();
    let pound = r.subscribe_as(Syntax::Cmsg, "run.#", "*", 2).unwrap();
    let range = r
        .subscribe_as(Syntax::Cmsg, "ch.{i>5 & i<10 | i=20}", "", 3)
        .unwrap();
    let q = r.subscribe_as(Syntax::Cmsg, "a.b?c", "*", 4).unwrap();
    let lead = r.subscribe_as(Syntax::Cmsg, "*.rate", "*", 5).unwrap();
    // The same text as a token pattern is a literal token.
    let tok = r.subscribe("a.b?c", "*", 6).unwrap();
    assert_eq!(
        ids(&r, "daq.hallb.rate", Some("count1")),
        sorted(vec![star, lead])
    );
    assert_eq!(ids(&r, "daq.hallb.rate", Some("count")), vec![lead]);
    assert_eq!(ids(&r, "daq.hallb.rate", None), vec![lead]);
    assert_eq!(ids(&r, "run.42", None), vec![pound]);
    assert_eq!(ids(&r, "run.x", None), vec![]);
    assert_eq!(ids(&r, "ch.7", None), vec![range]);
    assert_eq!(ids(&r, "ch.20", None), vec![range]);
    assert_eq!(ids(&r, "ch.20", Some("t")), vec![]);
    assert_eq!(ids(&r, "ch.10", None), vec![]);
    assert_eq!(ids(&r, "a.bxc", None), vec![q]);
    assert_eq!(ids(&r, "a.b?c", None), sorted(vec![q, tok]));
    assert!(r.has_interest(subj("x.y.rate")));
    assert!(!r.has_interest(subj("x.y.rat")));
    assert!(r.subscribe_as(Syntax::Cmsg, "a{", "*", 1).is_err());
    assert!(r.subscribe_as(Syntax::Cmsg, "a", "t y", 1).is_err());
    assert_eq!(r.len(), 6);
    for id in [star, pound, range, q, lead, tok] {
        assert!(r.unsubscribe(id).is_some());
    }
    assert_eq!(r.node_count(), 0);
    assert!(r.is_empty());
}

#[test]
fn cmsg_prefixes_split_and_merge() {
    let mut r = Router::new();
    let texts = ["abc*", "abd*", "ab*", "a*", "abcdef", "abcdeg#", "*", "b?"];
    let mut live = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        live.push(r.subscribe_as(Syntax::Cmsg, t, "*", i as u64).unwrap());
    }
    let n = |r: &Router<u64>, s: &str| ids(r, s, None).len();
    assert_eq!(n(&r, "abcdef"), 5);
    assert_eq!(n(&r, "abcdeg7"), 5);
    assert_eq!(n(&r, "abd"), 4);
    assert_eq!(n(&r, "bx"), 2);
    // Remove in an order that merges edges back, checking as we go.
    for (k, id) in live.iter().enumerate().rev() {
        r.unsubscribe(*id);
        let left: Vec<CmsgPattern> = texts[..k]
            .iter()
            .map(|t| CmsgPattern::subject(t).unwrap())
            .collect();
        for s in ["abcdef", "abcdeg7", "abd", "bx", "a", "abc"] {
            let want = left.iter().filter(|p| p.matches(s)).count();
            assert_eq!(n(&r, s), want, "{s} after removing {}", texts[k]);
        }
    }
    assert_eq!(r.node_count(), 0);
}

/// cMsg subscriptions held, as (id, subject pattern, type pattern,
/// subscriber).
type Live = Vec<(SubId, CmsgPattern, CmsgPattern, u64)>;

/// Asserts that the router gives, for each (subject, type) of `cases`,
/// exactly the subscriptions of `live` that the reference matcher picks
/// out (besides those of subscriber `other`, token subscriptions held
/// beside them), and interest in every subject one of them matches (and,
/// with `exact`, in no other).
fn agrees_with_reference(
    r: &Router<u64>,
    live: &Live,
    cases: &[(String, &str)],
    other: Option<u64>,
    exact: bool,
) {
    use super::cmsg::tests::reference;
    for (s, kind) in cases {
        let mut want: Vec<(SubId, u64)> = live
            .iter()
            .filter(|(_, p, k, _)| reference(p, s) && reference(k, kind))
            .map(|(id, _, _, sub)| (*id, *sub))
            .collect();
        want.sort();
        let got: Vec<(SubId, u64)> = matched(r, s, Some(kind))
            .into_iter()
            .filter(|(_, sub)| Some(*sub) != other)
            .collect();
        assert_eq!(got, want, "subject {} type {:?}", s, kind);
        let any = live.iter().any(|(_, p, _, _)| reference(p, s));
        if exact {
            assert_eq!(r.has_interest(subj(s)), any, "interest in {}", s);
        } else if any {
            assert!(r.has_interest(subj(s)), "interest in {}", s);
        }
    }
}

/// [`agrees_with_reference`], then again after removing the
/// subscriptions `removal` picks, then removes the rest.
fn agrees_before_and_after_removal(
    r: &mut Router<u64>,
    mut live: Live,
    cases: &[(String, &str)],
    removal: &[u8],
    other: Option<u64>,
) {
    agrees_with_reference(r, &live, cases, other, other.is_none());
    for &b in removal {
        if live.is_empty() {
            break;
        }
        let (id, ..) = live.swap_remove(b as usize % live.len());
        assert!(r.unsubscribe(id).is_some());
    }
    agrees_with_reference(r, &live, cases, other, other.is_none());
    for (id, ..) in live.drain(..) {
        r.unsubscribe(id);
    }
}

fn cmsg_kind() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["*", "", "t", "t?", "t#", "*x"])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The router (token trie and cMsg index together) gives exactly the
    /// subscriptions the reference matcher picks out one by one.
    #[test]
    fn cmsg_matches_like_the_reference(
        subs in prop::collection::vec(
            (prop::collection::vec(super::cmsg::tests::piece(), 1..6), cmsg_kind(), 0..5u64, any::<bool>()),
            0..40,
        ),
        subjects in prop::collection::vec(
            (prop::collection::vec(
                prop::sample::select(vec!["a", "b", "ab", "0", "1", "7", "20", "12"]),
                1..6,
            ), prop::sample::select(vec!["", "t", "t1", "t12", "tx", "x"])),
            1..16,
        ),
        removal in prop::collection::vec(any::<u8>(), 0..40),
    ) {
        let mut r = Router::new();
        let mut live = Live::new();
        for (pieces, kind, sub, tokens_too) in &subs {
            let text = pieces.concat();
            let Ok(p) = CmsgPattern::subject(&text) else { continue };
            let id = r.subscribe_as(Syntax::Cmsg, &text, kind, *sub).unwrap();
            live.push((id, p, CmsgPattern::kind(kind).unwrap(), *sub));
            if *tokens_too {
                // Token subscriptions beside them must not disturb them.
                let _ = r.subscribe(&text, "*", 100);
            }
        }
        let cases: Vec<(String, &str)> =
            subjects.iter().map(|(t, kind)| (t.join("."), *kind)).collect();
        agrees_before_and_after_removal(&mut r, live, &cases, &removal, Some(100));
        r.remove_subscriber(100);
        prop_assert_eq!(r.node_count(), 0);
        prop_assert!(r.is_empty());
    }
}

#[test]
fn cmsg_patterns_in_each_index_match_once() {
    let mut r = Router::new();
    let prefix = r.subscribe_as(Syntax::Cmsg, "ab*", "*", 1).unwrap();
    let suffix = r.subscribe_as(Syntax::Cmsg, "*.ab", "*", 2).unwrap();
    let inner = r.subscribe_as(Syntax::Cmsg, "*ab*", "*", 3).unwrap();
    let none = r.subscribe_as(Syntax::Cmsg, "*?*", "*", 4).unwrap();
    // `ab` three times in the subject: each subscription still once.
    assert_eq!(
        ids(&r, "ab.ab.ab", None),
        sorted(vec![prefix, suffix, inner, none])
    );
    assert_eq!(ids(&r, "x.ab", None), sorted(vec![suffix, inner, none]));
    assert_eq!(ids(&r, "xaby", None), sorted(vec![inner, none]));
    assert_eq!(ids(&r, "xy", None), vec![none]);
    assert!(r.has_interest(subj("xaby")));
    for id in [prefix, suffix, inner, none] {
        r.unsubscribe(id);
    }
    assert_eq!(r.node_count(), 0);
}

fn shape_piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "*",
        "?",
        "#",
        "{i<5}",
        "{i>3&i<9|i=20}",
        "{i=7}",
        "{i>12}",
        "{i<0}",
        "{i>18446744073709551614}",
        ".",
        "0",
        "7",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Patterns with no literal to key by (the index by shape and length):
    /// the router gives exactly what the reference picks out, many
    /// patterns of one shape together, before and after removals.
    #[test]
    fn cmsg_shapes_match_like_the_reference(
        subs in prop::collection::vec(
            (prop::collection::vec(shape_piece(), 1..5), cmsg_kind(), 0..5u64),
            0..60,
        ),
        subjects in prop::collection::vec(
            (prop::collection::vec(
                prop::sample::select(vec![
                    "a", "0", "7", "20", "12", "007", "x1y", "18446744073709551616",
                ]),
                1..4,
            ), prop::sample::select(vec!["", "t", "t1", "x"]), any::<bool>()),
            1..16,
        ),
        removal in prop::collection::vec(any::<u8>(), 0..60),
    ) {
        let mut r = Router::new();
        let mut live = Live::new();
        for (pieces, kind, sub) in &subs {
            let text = pieces.concat();
            let Ok(p) = CmsgPattern::subject(&text) else { continue };
            let id = r.subscribe_as(Syntax::Cmsg, &text, kind, *sub).unwrap();
            live.push((id, p, CmsgPattern::kind(kind).unwrap(), *sub));
        }
        let cases: Vec<(String, &str)> = subjects
            .iter()
            .map(|(t, kind, dots)| (t.join(if *dots { "." } else { "" }), *kind))
            .collect();
        agrees_before_and_after_removal(&mut r, live, &cases, &removal, None);
        prop_assert_eq!(r.node_count(), 0);
    }
}

#[test]
fn cmsg_shapes_by_length_and_digits() {
    let mut r = Router::new();
    let three = r.subscribe_as(Syntax::Cmsg, "???", "*", 1).unwrap();
    let int = r.subscribe_as(Syntax::Cmsg, "#", "*", 2).unwrap();
    let big = r.subscribe_as(Syntax::Cmsg, "*{i>7}*", "*", 3).unwrap();
    let small = r.subscribe_as(Syntax::Cmsg, "*{ i < 3 }*", "*", 4).unwrap();
    let again = r.subscribe_as(Syntax::Cmsg, "*#{i>7}*", "t", 5).unwrap();
    assert_eq!(ids(&r, "abc", None), vec![three]);
    assert_eq!(ids(&r, "123", None), sorted(vec![three, int, big, small]));
    assert_eq!(
        ids(&r, "run.42.rate", Some("t")),
        sorted(vec![big, small, again])
    );
    assert_eq!(ids(&r, "run.7", Some("t")), vec![]);
    assert_eq!(ids(&r, "abcd", None), vec![]);
    for id in [three, int, big, small, again] {
        r.unsubscribe(id);
    }
    assert_eq!(r.node_count(), 0);
}

/// A range of integers in cMsg's syntax, mostly bounded on both sides.
fn range_text() -> impl Strategy<Value = String> {
    let end = prop_oneof![
        4 => 0..40u64,
        1 => Just(u64::MAX - 1),
        1 => Just(u64::MAX),
    ];
    (0..6u8, end.clone(), end.clone(), end).prop_map(|(form, a, b, c)| match form {
        0 | 1 => format!("{{i>{a} & i<{b}}}"),
        2 => format!("{{i>{a} & i<{b} | i={c}}}"),
        3 => format!("{{i>{a} & i<{b} | i>{c} & i<{}}}", c.saturating_add(5)),
        4 => format!("{{i<{a} | i>{b}}}"),
        _ => format!("{{i={a} | i>{b} & i<{c}}}"),
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Integer ranges behind a literal prefix, before a literal suffix,
    /// around a literal inside and with no literal (each of the four
    /// indexes, grouped by shape and found by interval): the router gives
    /// exactly what the reference picks out, before and after removals.
    #[test]
    fn cmsg_ranges_match_like_the_reference(
        subs in prop::collection::vec(
            (
                prop::sample::select(vec!["", "run.", "r", "*ab"]),
                range_text(),
                prop::sample::select(vec!["", ".x", "*", "ab*", "?"]),
                prop::sample::select(vec!["*", "t", "t#"]),
                0..5u64,
            ),
            0..80,
        ),
        subjects in prop::collection::vec(
            (
                prop::sample::select(vec!["", "run.", "r", "xab", "ab"]),
                prop_oneof![
                    (0..45u64).prop_map(|v| v.to_string()),
                    Just("007".to_string()),
                    Just(u64::MAX.to_string()),
                    Just("18446744073709551616".to_string()),
                ],
                prop::sample::select(vec!["", ".x", "ab", "7", "z"]),
                prop::sample::select(vec!["t", "t1", "x"]),
            ),
            1..16,
        ),
        removal in prop::collection::vec(any::<u8>(), 0..80),
    ) {
        let mut r = Router::new();
        let mut live = Live::new();
        for (pre, range, post, kind, sub) in &subs {
            let text = format!("{pre}{range}{post}");
            let p = CmsgPattern::subject(&text).unwrap();
            let id = r.subscribe_as(Syntax::Cmsg, &text, kind, *sub).unwrap();
            live.push((id, p, CmsgPattern::kind(kind).unwrap(), *sub));
        }
        let cases: Vec<(String, &str)> = subjects
            .iter()
            .map(|(pre, n, post, kind)| (format!("{pre}{n}{post}"), *kind))
            .collect();
        agrees_before_and_after_removal(&mut r, live, &cases, &removal, None);
        prop_assert_eq!(r.node_count(), 0);
    }
}

#[test]
fn many_ranges_behind_one_prefix() {
    let mut r = Router::new();
    let ids: Vec<SubId> = (0..2_000u64)
        .map(|k| {
            let p = format!("run.{{i>{k} & i<{}}}.rate", k + 10);
            r.subscribe_as(Syntax::Cmsg, &p, "*", k).unwrap()
        })
        .collect();
    // 42 is in (k, k + 10) for k = 33..=41.
    let got: Vec<u64> = matched(&r, "run.42.rate", None)
        .into_iter()
        .map(|e| e.1)
        .collect();
    assert_eq!(got, (33..=41).collect::<Vec<u64>>());
    assert!(matched(&r, "run.42.rat", None).is_empty());
    assert!(matched(&r, "run.x.rate", None).is_empty());
    for id in ids {
        r.unsubscribe(id);
    }
    assert_eq!(r.node_count(), 0);
}
