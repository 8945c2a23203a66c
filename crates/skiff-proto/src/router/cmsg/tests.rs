//! cMsg patterns: each wildcard and range form by example, refusals, and a
//! property test against a plain backtracking reference.

use super::*;
use proptest::prelude::*;

/// The reference: tries every way to split `text` over the elements
/// (exponential, for tests only), on characters, with integer values read
/// the long way.
pub(crate) fn reference(p: &CmsgPattern, text: &str) -> bool {
    let t: Vec<char> = text.chars().collect();
    go(&p.elems, &t)
}

fn go(e: &[Elem], t: &[char]) -> bool {
    match e.split_first() {
        None => t.is_empty(),
        Some((Elem::Lit(l), rest)) => {
            let l: Vec<char> = l.chars().collect();
            t.starts_with(&l) && go(rest, &t[l.len()..])
        }
        Some((Elem::One, rest)) => !t.is_empty() && go(rest, &t[1..]),
        Some((Elem::Star, rest)) => (0..=t.len()).any(|k| go(rest, &t[k..])),
        Some((Elem::Int(r), rest)) => {
            let digits = t.iter().take_while(|c| c.is_ascii_digit()).count();
            (1..=digits).any(|k| in_range(r, &t[..k]) && go(rest, &t[k..]))
        }
    }
}

/// The digits' value; `None` past `u64`.
fn value(d: &[char]) -> Option<u64> {
    let s: String = d.iter().collect();
    let s = s.trim_start_matches('0');
    if s.is_empty() {
        return Some(0);
    }
    if s.len() > 20 {
        return None;
    }
    s.parse::<u128>().ok().and_then(|v| u64::try_from(v).ok())
}

fn in_range(r: &Range, d: &[char]) -> bool {
    let v = value(d);
    if r.any_of.is_empty() {
        return true;
    }
    r.any_of.iter().any(|all| {
        all.iter().all(|c| match (c, v) {
            (Cmp::Lt(n), Some(v)) => v < *n,
            (Cmp::Gt(n), Some(v)) => v > *n,
            (Cmp::Eq(n), Some(v)) => v == *n,
            (Cmp::Gt(_), None) => true,
            _ => false,
        })
    })
}

fn yes(p: &str, texts: &[&str]) {
    let pat = CmsgPattern::subject(p).unwrap();
    for t in texts {
        assert!(pat.matches(t), "{p} should match {t}");
        assert!(reference(&pat, t), "reference: {p} should match {t}");
    }
}

fn no(p: &str, texts: &[&str]) {
    let pat = CmsgPattern::subject(p).unwrap();
    for t in texts {
        assert!(!pat.matches(t), "{p} should not match {t}");
        assert!(!reference(&pat, t), "reference: {p} should not match {t}");
    }
}

#[test]
fn star_is_any_run_of_characters() {
    yes(
        "daq.h*b.rate",
        &["daq.hallb.rate", "daq.hb.rate", "daq.h.x.b.rate"],
    );
    no(
        "daq.h*b.rate",
        &["daq.hallb.rates", "daq.hall.rate", "xdaq.hb.rate"],
    );
    yes("*", &["a", "a.b.c", "é"]);
    yes("a*", &["a", "ab", "a.b"]);
    yes("*.rate", &["x.rate", "a.b.rate", ".rate"]);
    yes("a**b", &["ab", "axxb"]);
}

#[test]
fn question_is_one_character() {
    yes("count?", &["count1", "countx", "counté"]);
    no("count?", &["count", "count12"]);
    yes("a.b?c", &["a.bxc", "a.b.c"]);
    no("a.b?c", &["a.bc", "a.bxxc"]);
    yes("??", &["ab", "éé"]);
    no("??", &["a", "abc"]);
}

#[test]
fn pound_is_a_non_negative_integer() {
    yes(
        "run.#",
        &["run.0", "run.7", "run.0042", "run.18446744073709551616000"],
    );
    no("run.#", &["run.", "run.x", "run.7x", "run.-1", "run"]);
    yes("run#.x", &["run1.x", "run123.x"]);
    yes("#.#", &["1.2"]);
    no("#.#", &["1.", ".2", "1.2.3"]);
    yes("a*#", &["a1", "ab12"]);
    no("a*#", &["ab"]);
}

#[test]
fn ranges() {
    let p = CmsgPattern::subject("ch.{i>5 & i<10 | i=20}").unwrap();
    for v in 0..40u32 {
        let want = (v > 5 && v < 10) || v == 20;
        assert_eq!(p.matches(&format!("ch.{v}")), want, "{v}");
        assert_eq!(p.matches(&format!("ch.00{v}")), want, "00{v}");
    }
    assert!(!p.matches("ch."));
    assert!(!p.matches("ch.x"));
    // `#{...}` is the same as `{...}`; `{}` and `{i}` are any integer.
    yes("ch.#{i<3}", &["ch.0", "ch.2", "ch.002"]);
    no("ch.#{i<3}", &["ch.3", "ch.30"]);
    yes("ch.{}", &["ch.0", "ch.99"]);
    yes("ch.{i}", &["ch.0", "ch.99"]);
    no("ch.{}", &["ch.", "ch.a"]);
    // A bound on either side; `N<i` is `i>N`.
    yes("x{5<i}", &["x6", "x100"]);
    no("x{5<i}", &["x5", "x4"]);
    yes("x{i=18446744073709551615}", &["x18446744073709551615"]);
    // Past u64: greater than every bound.
    yes("x{i>18446744073709551615}", &["x18446744073709551616"]);
    no("x{i<18446744073709551615}", &["x99999999999999999999999"]);
    // `&` binds tighter than `|`.
    yes("x{i=20 | i>5 & i<10}", &["x20", "x7"]);
    // Digits may split between an integer and what follows.
    yes("x{i<5}1", &["x41", "x01"]);
    yes("x*{i<5}", &["x123", "x94"]);
    no("x*{i<5}", &["x99", "x5"]);
    yes("x{i>9}{i<3}", &["x1002", "x9990"]);
}

#[test]
fn types_are_patterns_too() {
    let k = CmsgPattern::kind("count?").unwrap();
    assert!(k.matches("count1"));
    assert!(!k.matches("count"));
    let any = CmsgPattern::kind("*").unwrap();
    assert!(any.matches(""));
    assert!(any.matches("x"));
    let untyped = CmsgPattern::kind("").unwrap();
    assert!(untyped.matches(""));
    assert!(!untyped.matches("x"));
    // Types may hold `>`; subjects may not.
    assert!(CmsgPattern::kind("a>b").unwrap().matches("a>b"));
    assert!(CmsgPattern::subject("a>b").is_err());
}

#[test]
fn bad_patterns_say_where_and_why() {
    let cases: &[(&str, &str)] = &[
        ("", "empty"),
        ("a b", "whitespace"),
        ("a\u{7}", "control"),
        ("a>", "`>`"),
        ("a{i<5", "without its `}`"),
        ("a}", "without its `{`"),
        ("a{x<5}", "expected `i` or a number"),
        ("a{i<}", "expected `i` or a number"),
        ("a{i~5}", "expected `<`, `>` or `=`"),
        ("a{i<5 i>2}", "after a term"),
        ("a{5<6}", "compares `i`"),
        ("a{i<99999999999999999999}", "larger than"),
        ("a{i<5&}", "expected `i` or a number"),
    ];
    for (p, want) in cases {
        let e = CmsgPattern::subject(p).unwrap_err().to_string();
        assert!(e.contains(want), "{p:?}: {e}");
    }
    let many = format!("{{{}}}", vec!["i>1"; MAX_RANGE_TERMS + 1].join("&"));
    assert!(CmsgPattern::subject(&many).is_err());
    let ok = format!("{{{}}}", vec!["i>1"; MAX_RANGE_TERMS].join("|"));
    assert!(CmsgPattern::subject(&ok).is_ok());
    assert!(CmsgPattern::subject(&"a".repeat(MAX_SUBJECT + 1)).is_err());
    assert!(CmsgPattern::kind(&"a".repeat(MAX_KIND + 1)).is_err());
    // A long range body is refused before it is stored.
    let long = format!("{{{}", "1".repeat(100_000));
    assert!(CmsgPattern::subject(&long[..MAX_SUBJECT]).is_err());
}

#[test]
fn prefixes() {
    let p = CmsgPattern::subject("daq.h*b").unwrap();
    assert_eq!(p.literal_prefix(), "daq.h");
    assert!(!p.is_literal());
    assert_eq!(CmsgPattern::subject("*x").unwrap().literal_prefix(), "");
    let l = CmsgPattern::subject("a.b").unwrap();
    assert!(l.is_literal());
    assert_eq!(l.literal_prefix(), "a.b");
}

#[test]
fn worst_cases_stay_bounded() {
    // Long runs of digits and stars: one pass per element.
    let zeros = "0".repeat(MAX_SUBJECT - 2);
    let p = CmsgPattern::subject("*{i<5}*{i>5}*").unwrap();
    assert!(!p.matches(&format!("x{zeros}")));
    assert!(p.matches(&format!("x{zeros}6")));
    let p = CmsgPattern::subject(&"*a".repeat(300)).unwrap();
    assert!(!p.matches(&"a".repeat(299)));
    assert!(p.matches(&"a".repeat(300)));
    // Longer than a subject: the heap path.
    let p = CmsgPattern::subject("*#").unwrap();
    assert!(p.matches(&"9".repeat(5000)));
}

/// A piece of a pattern: literals, wildcards and ranges (the router's
/// property tests draw from it too).
pub(crate) fn piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "a",
        "b",
        ".",
        "*",
        "?",
        "#",
        "{i<5}",
        "{i>3&i<9|i=20}",
        "{}",
        "{i>18446744073709551614}",
        "0",
        "1",
        "7",
        "é",
        "ab",
    ])
}

fn text_piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "a",
        "b",
        ".",
        "0",
        "1",
        "7",
        "9",
        "é",
        "00",
        "20",
        "12",
        "18446744073709551615",
        "18446744073709551616",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn matcher_agrees_with_reference(
        p in prop::collection::vec(piece(), 1..7),
        t in prop::collection::vec(text_piece(), 0..8),
    ) {
        let p = p.concat();
        let t = t.concat();
        let pat = CmsgPattern::subject(&p).unwrap();
        prop_assert_eq!(pat.matches(&t), reference(&pat, &t), "{} on {}", p, t);
    }

    #[test]
    fn parser_is_total(s in "[a-z0-9{}#*?&|<>=i .]{0,40}") {
        if let Ok(p) = CmsgPattern::subject(&s) {
            prop_assert_eq!(p.as_str(), s.as_str());
        }
        let _ = CmsgPattern::kind(&s);
    }
}
