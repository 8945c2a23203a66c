//! What a user may do: subject patterns from the configuration, allow/deny
//! rules, and the permissions they make (publish, subscribe, responses,
//! join).

use std::fmt;

use serde::{Deserialize, Deserializer};
use skiff_proto::router::{CmsgPattern, Pattern, PatternToken, Subject, Syntax};

/// A subject pattern read from the configuration, checked when read.
#[derive(Clone, PartialEq, Eq)]
pub struct PatternText(String);

impl PatternText {
    /// Checks `s` as a subject pattern (`*` one token, `>` the rest).
    pub fn new(s: &str) -> Result<PatternText, skiff_proto::router::SubjectError> {
        Pattern::new(s)?;
        Ok(PatternText(s.to_owned()))
    }

    /// The pattern's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn pattern(&self) -> Pattern<'_> {
        // Checked in `new`.
        Pattern::new(&self.0).expect("checked when read")
    }
}

impl fmt::Debug for PatternText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl<'de> Deserialize<'de> for PatternText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        PatternText::new(&s)
            .map_err(|e| serde::de::Error::custom(format!("bad permission pattern `{s}`: {e}")))
    }
}

/// An allow list and a deny list of subject patterns. No allow list
/// (`allow` absent) allows everything not denied; an empty one allows
/// nothing. Deny wins over allow.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Rule {
    /// What is allowed; `None`: everything.
    pub allow: Option<Vec<PatternText>>,
    /// What is refused even if allowed.
    pub deny: Vec<PatternText>,
}

impl Rule {
    /// Nothing at all.
    pub fn nothing() -> Rule {
        Rule {
            allow: Some(Vec::new()),
            deny: Vec::new(),
        }
    }

    /// Whether `subject` (a published subject or a cluster name) is
    /// allowed: matched by an allow pattern and by no deny pattern.
    pub fn permits(&self, subject: &str) -> bool {
        let Ok(s) = Subject::new(subject) else {
            // Not a subject: only an unrestricted rule lets it through (the
            // broker then refuses it for what it is).
            return self.allow.is_none() && self.deny.is_empty();
        };
        let allowed = match &self.allow {
            None => true,
            Some(a) => a.iter().any(|p| p.pattern().matches(&s)),
        };
        allowed && !self.deny.iter().any(|p| p.pattern().matches(&s))
    }

    /// Whether a subscription to `pattern` is allowed: every subject it
    /// can match is allowed (it lies within an allow pattern) and none is
    /// denied (it overlaps no deny pattern). So with `deny = ["payroll.>"]`
    /// a subscription to `>` is refused, not silently filtered: the client
    /// learns at once what it may not see.
    pub fn permits_pattern(&self, pattern: &str) -> bool {
        let Ok(p) = Pattern::new(pattern) else {
            return self.allow.is_none() && self.deny.is_empty();
        };
        let allowed = match &self.allow {
            None => true,
            Some(a) => a.iter().any(|a| covers(a.pattern(), p)),
        };
        allowed && !self.deny.iter().any(|d| overlaps(d.pattern(), p))
    }
}

/// Whether every subject `inner` matches is matched by `outer`.
pub fn covers(outer: Pattern<'_>, inner: Pattern<'_>) -> bool {
    let mut i = inner.tokens();
    for o in outer.tokens() {
        match (o, i.next()) {
            // `>` matches one or more tokens: `inner` must have one left,
            // whatever it is.
            (PatternToken::Rest, t) => return t.is_some(),
            (_, None) => return false,
            (PatternToken::One, Some(PatternToken::Rest)) => return false,
            (PatternToken::One, Some(_)) => {}
            (PatternToken::Literal(a), Some(PatternToken::Literal(b))) if a == b => {}
            (PatternToken::Literal(_), Some(_)) => return false,
        }
    }
    i.next().is_none()
}

/// Whether some subject is matched by both `a` and `b`.
pub fn overlaps(a: Pattern<'_>, b: Pattern<'_>) -> bool {
    let (mut x, mut y) = (a.tokens(), b.tokens());
    loop {
        match (x.next(), y.next()) {
            (None, None) => return true,
            // `>` needs one token or more: the other must have one here.
            (Some(PatternToken::Rest), t) | (t, Some(PatternToken::Rest)) => return t.is_some(),
            (None, Some(_)) | (Some(_), None) => return false,
            (Some(PatternToken::Literal(p)), Some(PatternToken::Literal(q))) if p != q => {
                return false
            }
            _ => {}
        }
    }
}

fn yes() -> bool {
    true
}

/// What one user may do. The default allows everything.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Permissions {
    /// Subjects it may publish to (and send requests to).
    pub publish: Rule,
    /// Patterns it may subscribe to.
    pub subscribe: Rule,
    /// Whether it may reply to requests delivered to it (nats-server's
    /// `allow_responses`). Default true: what it may receive is already
    /// bounded by `subscribe` and `join`.
    #[serde(default = "yes")]
    pub allow_responses: bool,
    /// Clusters it may join (names are subjects; patterns allowed).
    pub join: Rule,
}

impl Default for Permissions {
    fn default() -> Self {
        Permissions {
            publish: Rule::default(),
            subscribe: Rule::default(),
            allow_responses: true,
            join: Rule::default(),
        }
    }
}

impl Permissions {
    /// Whether these permissions allow everything (then nothing is checked).
    pub fn is_open(&self) -> bool {
        let open = |r: &Rule| r.allow.is_none() && r.deny.is_empty();
        open(&self.publish) && open(&self.subscribe) && open(&self.join) && self.allow_responses
    }

    /// Whether it may publish to (or send a request to) `subject`.
    pub fn may_publish(&self, subject: &str) -> bool {
        self.publish.permits(subject)
    }

    /// Whether it may subscribe to `pattern`.
    pub fn may_subscribe(&self, pattern: &str) -> bool {
        self.subscribe.permits_pattern(pattern)
    }

    /// Whether it may subscribe to `pattern` of kind `syntax`. A cMsg
    /// pattern with a wildcard can match subjects of any number of tokens,
    /// which token rules cannot bound: it is allowed only where subscribing
    /// is unrestricted. A cMsg pattern without one matches only its own
    /// text, and is checked as that subject.
    pub fn may_subscribe_as(&self, syntax: Syntax, pattern: &str) -> bool {
        match syntax {
            Syntax::Tokens => self.may_subscribe(pattern),
            Syntax::Cmsg => match CmsgPattern::subject(pattern) {
                Ok(p) if p.is_literal() && Subject::new(pattern).is_ok() => {
                    self.subscribe.permits_pattern(pattern)
                }
                _ => self.subscribe.allow.is_none() && self.subscribe.deny.is_empty(),
            },
        }
    }

    /// Whether it may join `cluster`.
    pub fn may_join(&self, cluster: &str) -> bool {
        self.join.permits(cluster)
    }
}
