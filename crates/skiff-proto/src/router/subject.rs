//! Subjects, subscription patterns and type patterns: what is valid, and
//! what matches what.
//!
//! # Subjects
//! A subject names what a message is about: dot-separated tokens such as
//! `daq.hallb.rate`.
//! - At most [`MAX_SUBJECT`] bytes of UTF-8 (the wire limit) and at most
//!   [`MAX_TOKENS`] tokens.
//! - Every token is non-empty: no leading, trailing or doubled dot.
//! - A token holds any characters except whitespace (Unicode `White_Space`),
//!   control characters, the separator `.`, and the wildcard characters `*`
//!   and `>`. So `a-b_c`, `Ünïcode` and `x:1` are tokens; `a b`, `a*` and
//!   `x>y` are not.
//!
//! # Patterns
//! A subscription pattern is a subject in which a token may also be a
//! wildcard standing alone:
//! - `*` matches exactly one token: `a.*.c` matches `a.b.c` but not `a.c`
//!   nor `a.b.b.c`.
//! - `>` matches **one or more** remaining tokens and may only be the last
//!   token: `a.>` matches `a.b` and `a.b.c` but **not `a` itself**
//!   (subscribe to `a` as well for that). A pattern of just `>` matches every
//!   subject.
//!
//! # Types
//! A message's type (`kind`, cMsg's "type") is an optional tag of at most
//! [`MAX_KIND`] bytes with no whitespace, no control characters and no `*`;
//! an empty type is the same as none. A type pattern is one of
//! - `*`: any type, including none;
//! - the empty string: only messages without a type;
//! - anything else: exactly that type (case-sensitive).

use std::fmt;

use super::cmsg::{CmsgPattern, Syntax};

pub use crate::wire::{MAX_KIND, MAX_SUBJECT};

/// Most tokens in a subject or pattern.
pub const MAX_TOKENS: usize = 64;

/// A subject, pattern or type that breaks the rules in the module
/// documentation. The caller is at fault; `Display` names the offending
/// token and the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubjectError {
    /// The subject or pattern is the empty string.
    #[error("{what} is empty; give at least one token, such as `orders.created`")]
    Empty {
        /// `"subject"` or `"pattern"`.
        what: &'static str,
    },
    /// Longer than [`MAX_SUBJECT`] bytes.
    #[error("{what} is {len} bytes; the limit is {max}")]
    TooLong {
        /// `"subject"` or `"pattern"`.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// More than [`MAX_TOKENS`] tokens.
    #[error("{what} has more than {max} tokens; use fewer, longer tokens")]
    TooManyTokens {
        /// `"subject"` or `"pattern"`.
        what: &'static str,
        /// The limit.
        max: usize,
    },
    /// Two dots in a row, or a dot at the start or the end.
    #[error(
        "{what} `{text}` has an empty token at position {index}; tokens are separated by \
         single dots, with none at the start or the end"
    )]
    EmptyToken {
        /// `"subject"` or `"pattern"`.
        what: &'static str,
        /// The whole subject or pattern.
        text: String,
        /// Position of the empty token, from 0.
        index: usize,
    },
    /// A token holds whitespace or a control character.
    #[error(
        "token `{token}` (position {index}) contains {ch:?}; tokens may not contain \
         whitespace or control characters"
    )]
    BadChar {
        /// The offending token.
        token: String,
        /// Its position, from 0.
        index: usize,
        /// The character that is not allowed.
        ch: char,
    },
    /// `*` or `>` inside a longer token, such as `ab*` or `x>y`.
    #[error(
        "token `{token}` (position {index}) contains `{ch}`; `*` and `>` are wildcards and \
         may appear only as a whole token of a subscription pattern"
    )]
    WildcardInToken {
        /// The offending token.
        token: String,
        /// Its position, from 0.
        index: usize,
        /// `*` or `>`.
        ch: char,
    },
    /// A published subject has a wildcard token.
    #[error(
        "subject token {index} is the wildcard `{token}`; a message names one subject, \
         only subscription patterns take wildcards"
    )]
    WildcardInSubject {
        /// `"*"` or `">"`.
        token: &'static str,
        /// Its position, from 0.
        index: usize,
    },
    /// `>` that is not the last token of a pattern.
    #[error(
        "`>` at position {index} of pattern `{pattern}` is not the last token; `>` matches \
         the rest of the subject, so it must end the pattern (use `*` for one token)"
    )]
    RestNotLast {
        /// The whole pattern.
        pattern: String,
        /// Position of the `>`, from 0.
        index: usize,
    },
    /// A type or type pattern longer than [`MAX_KIND`] bytes.
    #[error("type is {len} bytes; the limit is {max}")]
    KindTooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A cMsg pattern ([`super::cmsg`]) that does not parse.
    #[error("cMsg pattern `{pattern}`: at byte {at}, {why}")]
    BadCmsg {
        /// The pattern (its first 80 characters).
        pattern: String,
        /// Byte offset of the fault.
        at: usize,
        /// What is wrong there.
        why: &'static str,
    },
    /// A type holds whitespace, a control character, or a `*` that is not
    /// the whole type pattern.
    #[error(
        "type `{kind}` contains {ch:?}; a type may not contain whitespace or control \
         characters, and `*` only stands alone as the pattern for any type"
    )]
    BadKind {
        /// The offending type.
        kind: String,
        /// The character that is not allowed.
        ch: char,
    },
}

/// One token of a [`Pattern`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PatternToken<'a> {
    /// Matches exactly this token.
    Literal(&'a str),
    /// `*`: matches any one token.
    One,
    /// `>`: matches one or more remaining tokens; always last.
    Rest,
}

impl fmt::Display for PatternToken<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PatternToken::Literal(s) => f.write_str(s),
            PatternToken::One => f.write_str("*"),
            PatternToken::Rest => f.write_str(">"),
        }
    }
}

/// A subject checked against the rules in the module documentation. Cheap to
/// copy; validate once where a message enters, then route it as often as
/// needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Subject<'a>(&'a str);

impl<'a> Subject<'a> {
    /// Checks `s`: one pass over its bytes, no allocation unless it is bad.
    pub fn new(s: &'a str) -> Result<Subject<'a>, SubjectError> {
        check("subject", s, false)?;
        Ok(Subject(s))
    }

    /// The subject's text.
    pub fn as_str(&self) -> &'a str {
        self.0
    }

    /// Its tokens, in order.
    pub fn tokens(&self) -> std::str::Split<'a, char> {
        self.0.split('.')
    }
}

impl fmt::Display for Subject<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// A subscription pattern of either kind, checked: a token pattern
/// ([`Pattern::new`], the rules in the module documentation) or a cMsg
/// pattern ([`Pattern::cmsg`], the rules in [`super::cmsg`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pattern<'a> {
    text: &'a str,
    syntax: Syntax,
}

impl<'a> Pattern<'a> {
    /// Checks `s` as a token pattern.
    pub fn new(s: &'a str) -> Result<Pattern<'a>, SubjectError> {
        check("pattern", s, true)?;
        Ok(Pattern {
            text: s,
            syntax: Syntax::Tokens,
        })
    }

    /// Checks `s` as a cMsg pattern (`*` any characters, `?` one, `#` an
    /// integer, `{i>5 & i<10}` an integer in a range; see
    /// [`super::cmsg`]).
    pub fn cmsg(s: &'a str) -> Result<Pattern<'a>, SubjectError> {
        CmsgPattern::subject(s)?;
        Ok(Pattern {
            text: s,
            syntax: Syntax::Cmsg,
        })
    }

    /// Checks `s` as a pattern of kind `syntax`.
    pub fn with_syntax(s: &'a str, syntax: Syntax) -> Result<Pattern<'a>, SubjectError> {
        match syntax {
            Syntax::Tokens => Pattern::new(s),
            Syntax::Cmsg => Pattern::cmsg(s),
        }
    }

    /// The pattern's kind.
    pub fn syntax(&self) -> Syntax {
        self.syntax
    }

    /// The pattern's text.
    pub fn as_str(&self) -> &'a str {
        self.text
    }

    /// Its tokens, in order. Only a token pattern has tokens: for a cMsg
    /// pattern this gives its dot-separated pieces as literals, which is
    /// not how it matches (use [`Pattern::matches`]).
    pub fn tokens(&self) -> impl Iterator<Item = PatternToken<'a>> + 'a {
        let cmsg = self.syntax == Syntax::Cmsg;
        self.text.split('.').map(move |t| match t {
            _ if cmsg => PatternToken::Literal(t),
            "*" => PatternToken::One,
            ">" => PatternToken::Rest,
            lit => PatternToken::Literal(lit),
        })
    }

    /// Whether this pattern matches `subject` (a token pattern token by
    /// token; a cMsg pattern is parsed for each call: keep a
    /// [`CmsgPattern`] to match many). This is the plain definition;
    /// [`crate::router::Router`] answers the same question for many
    /// patterns at once.
    pub fn matches(&self, subject: &Subject<'_>) -> bool {
        if self.syntax == Syntax::Cmsg {
            return CmsgPattern::subject(self.text).is_ok_and(|p| p.matches(subject.as_str()));
        }
        let mut subj = subject.tokens();
        for p in self.tokens() {
            match p {
                PatternToken::Rest => return subj.next().is_some(),
                PatternToken::One => {
                    if subj.next().is_none() {
                        return false;
                    }
                }
                PatternToken::Literal(l) => {
                    if subj.next() != Some(l) {
                        return false;
                    }
                }
            }
        }
        subj.next().is_none()
    }
}

impl fmt::Display for Pattern<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text)
    }
}

/// Which message types a subscription accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KindPattern<'a> {
    /// `*`: any type, and messages without one.
    Any,
    /// The empty pattern: only messages without a type.
    Untyped,
    /// Exactly this type.
    Exact(&'a str),
}

impl<'a> KindPattern<'a> {
    /// Parses a type pattern: `*`, the empty string, or a type.
    pub fn new(s: &'a str) -> Result<KindPattern<'a>, SubjectError> {
        match s {
            "*" => Ok(KindPattern::Any),
            "" => Ok(KindPattern::Untyped),
            kind => {
                check_kind(kind)?;
                Ok(KindPattern::Exact(kind))
            }
        }
    }

    /// Whether a message of type `kind` (`None` or empty: untyped) matches.
    pub fn matches(&self, kind: Option<&str>) -> bool {
        let kind = kind.unwrap_or("");
        match self {
            KindPattern::Any => true,
            KindPattern::Untyped => kind.is_empty(),
            KindPattern::Exact(k) => *k == kind,
        }
    }
}

impl fmt::Display for KindPattern<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KindPattern::Any => f.write_str("*"),
            KindPattern::Untyped => Ok(()),
            KindPattern::Exact(k) => f.write_str(k),
        }
    }
}

/// Checks a message's type (not a pattern: `*` is refused). The empty string
/// is valid and means untyped.
pub fn check_kind(kind: &str) -> Result<(), SubjectError> {
    if kind.len() > MAX_KIND {
        return Err(SubjectError::KindTooLong {
            len: kind.len(),
            max: MAX_KIND,
        });
    }
    match bad_char(kind, true) {
        None => Ok(()),
        Some(ch) => Err(SubjectError::BadKind {
            kind: kind.to_owned(),
            ch,
        }),
    }
}

/// The first character of `token` that may not appear in a literal token,
/// if any. `*` and `>` count as bad; `kind` allows `>` and `.`.
fn bad_char(token: &str, kind: bool) -> Option<char> {
    let bad_ascii = |b: u8| b <= b' ' || b == 0x7f || b == b'*' || (!kind && b == b'>');
    if token.is_ascii() {
        // The common case: a byte test per character.
        return token.bytes().find(|&b| bad_ascii(b)).map(char::from);
    }
    token
        .chars()
        .find(|&c| c.is_whitespace() || c.is_control() || c == '*' || (!kind && c == '>'))
}

/// The common case in one pass over the bytes: an ASCII subject with no
/// wildcards that breaks no rule. Anything else, good or bad, takes the
/// thorough path, which also builds the error.
#[inline]
fn plain_ascii_subject_ok(s: &[u8]) -> bool {
    if s.is_empty() || s.len() > MAX_SUBJECT {
        return false;
    }
    let mut tokens = 1;
    let mut prev_dot = true;
    for &b in s {
        if b == b'.' {
            if prev_dot {
                return false;
            }
            tokens += 1;
            prev_dot = true;
        } else {
            if b <= b' ' || b >= 0x7f || b == b'*' || b == b'>' {
                return false;
            }
            prev_dot = false;
        }
    }
    !prev_dot && tokens <= MAX_TOKENS
}

fn check(what: &'static str, s: &str, pattern: bool) -> Result<(), SubjectError> {
    if plain_ascii_subject_ok(s.as_bytes()) {
        return Ok(());
    }
    check_thorough(what, s, pattern)
}

fn check_thorough(what: &'static str, s: &str, pattern: bool) -> Result<(), SubjectError> {
    if s.is_empty() {
        return Err(SubjectError::Empty { what });
    }
    if s.len() > MAX_SUBJECT {
        return Err(SubjectError::TooLong {
            what,
            len: s.len(),
            max: MAX_SUBJECT,
        });
    }
    let mut count = 0;
    let mut tokens = s.split('.').peekable();
    while let Some(token) = tokens.next() {
        let index = count;
        count += 1;
        if count > MAX_TOKENS {
            return Err(SubjectError::TooManyTokens {
                what,
                max: MAX_TOKENS,
            });
        }
        if token.is_empty() {
            return Err(SubjectError::EmptyToken {
                what,
                text: s.to_owned(),
                index,
            });
        }
        let wildcard = match token {
            "*" => Some("*"),
            ">" => Some(">"),
            _ => None,
        };
        if let Some(w) = wildcard {
            if !pattern {
                return Err(SubjectError::WildcardInSubject { token: w, index });
            }
            if w == ">" && tokens.peek().is_some() {
                return Err(SubjectError::RestNotLast {
                    pattern: s.to_owned(),
                    index,
                });
            }
            continue;
        }
        if let Some(ch) = bad_char(token, false) {
            let token = token.to_owned();
            return Err(if ch == '*' || ch == '>' {
                SubjectError::WildcardInToken { token, index, ch }
            } else {
                SubjectError::BadChar { token, index, ch }
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn fast_path_agrees_with_thorough_check(
            parts in prop::collection::vec(
                prop::sample::select(vec!["a", "b", ".", "*", ">", " ", "é", "\u{7f}", "\u{2028}"]),
                0..12,
            ),
        ) {
            let s = parts.concat();
            let fast = plain_ascii_subject_ok(s.as_bytes());
            let thorough = check_thorough("subject", &s, false);
            if fast {
                prop_assert!(thorough.is_ok(), "{s:?}: {thorough:?}");
            } else if s.is_ascii() {
                // Only non-ASCII subjects take the slow path when valid.
                prop_assert!(thorough.is_err(), "{s:?}");
            }
        }
    }

    #[test]
    fn valid_subjects_and_patterns() {
        for s in ["a", "daq.hallb.rate", "a-b_c.x:1.Ünïcode", "x.y.z.0"] {
            assert!(Subject::new(s).is_ok(), "{s}");
            assert!(Pattern::new(s).is_ok(), "{s}");
        }
        for p in ["*", ">", "a.*", "a.>", "*.*.>", "a.*.c"] {
            assert!(Pattern::new(p).is_ok(), "{p}");
            assert!(Subject::new(p).is_err(), "{p}");
        }
        let long = vec!["a"; MAX_TOKENS].join(".");
        assert!(Subject::new(&long).is_ok());
    }

    #[test]
    fn bad_subjects_name_token_and_rule() {
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("a..b", "position 1"),
            (".a", "position 0"),
            ("a.", "position 1"),
            ("a.b c", "`b c`"),
            ("a.b\tc", "`b\tc`"),
            ("a.\u{a0}", "whitespace"),
            ("a.\u{7}", "control"),
            ("a.b*", "`b*`"),
            ("x>y", "`x>y`"),
            ("a.*", "wildcard `*`"),
            ("a.>", "wildcard `>`"),
        ];
        for (s, want) in cases {
            let e = Subject::new(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s:?}: {e}");
        }
        let e = Pattern::new("a.>.b").unwrap_err();
        assert!(
            matches!(e, SubjectError::RestNotLast { index: 1, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("must end"), "{e}");
        let e = Pattern::new("a.b>").unwrap_err();
        assert!(matches!(e, SubjectError::WildcardInToken { ch: '>', .. }));
        let long = "a".repeat(MAX_SUBJECT + 1);
        assert!(matches!(
            Subject::new(&long),
            Err(SubjectError::TooLong { len: 1025, .. })
        ));
        let many = vec!["a"; MAX_TOKENS + 1].join(".");
        assert!(matches!(
            Pattern::new(&many),
            Err(SubjectError::TooManyTokens { .. })
        ));
    }

    #[test]
    fn kinds() {
        assert_eq!(KindPattern::new("*"), Ok(KindPattern::Any));
        assert_eq!(KindPattern::new(""), Ok(KindPattern::Untyped));
        assert_eq!(KindPattern::new("ev.v1>"), Ok(KindPattern::Exact("ev.v1>")));
        assert!(KindPattern::new("a*").is_err());
        assert!(KindPattern::new("a b").is_err());
        assert!(check_kind(&"k".repeat(MAX_KIND + 1)).is_err());
        assert!(check_kind("*").is_err());
        assert!(KindPattern::Any.matches(None));
        assert!(KindPattern::Untyped.matches(None));
        assert!(KindPattern::Untyped.matches(Some("")));
        assert!(!KindPattern::Untyped.matches(Some("x")));
        assert!(KindPattern::Exact("x").matches(Some("x")));
        assert!(!KindPattern::Exact("x").matches(None));
    }

    #[test]
    fn rest_needs_at_least_one_token() {
        let p = Pattern::new("a.>").unwrap();
        assert!(!p.matches(&Subject::new("a").unwrap()));
        assert!(p.matches(&Subject::new("a.b").unwrap()));
        assert!(p.matches(&Subject::new("a.b.c").unwrap()));
        let one = Pattern::new("a.*").unwrap();
        assert!(!one.matches(&Subject::new("a").unwrap()));
        assert!(!one.matches(&Subject::new("a.b.c").unwrap()));
        assert!(Pattern::new(">")
            .unwrap()
            .matches(&Subject::new("x").unwrap()));
    }

    #[test]
    fn every_variant_formats() {
        let all = vec![
            SubjectError::Empty { what: "subject" },
            SubjectError::TooLong {
                what: "pattern",
                len: 2000,
                max: 1024,
            },
            SubjectError::TooManyTokens {
                what: "subject",
                max: 64,
            },
            SubjectError::EmptyToken {
                what: "subject",
                text: "a..b".into(),
                index: 1,
            },
            SubjectError::BadChar {
                token: "a b".into(),
                index: 0,
                ch: ' ',
            },
            SubjectError::WildcardInToken {
                token: "a*".into(),
                index: 0,
                ch: '*',
            },
            SubjectError::WildcardInSubject {
                token: "*",
                index: 2,
            },
            SubjectError::RestNotLast {
                pattern: "a.>.b".into(),
                index: 1,
            },
            SubjectError::KindTooLong { len: 300, max: 255 },
            SubjectError::BadCmsg {
                pattern: "a{".into(),
                at: 1,
                why: "`{` without its `}`",
            },
            SubjectError::BadKind {
                kind: "a b".into(),
                ch: ' ',
            },
        ];
        for e in all {
            let s = e.to_string();
            assert!(s.len() > 20, "{s}");
        }
    }
}
