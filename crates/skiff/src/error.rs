//! The one public error of the `skiff` crate, grouped by who is at fault
//! (the rustls habit): the caller ([`Error::Locator`], [`Error::Usage`]),
//! a limit ([`Error::Limit`]), the system ([`Error::Io`]), or the state of
//! the object ([`Error::Closed`], [`Error::Timeout`]).

use std::io;

use skiff_proto::error::{LimitError, UsageError};

/// Any error the `skiff` API reports.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The locator string or one of its options is wrong.
    #[error(transparent)]
    Locator(#[from] LocatorError),
    /// The call can never succeed as made (e.g. a message too large).
    #[error("{0}")]
    Usage(#[from] UsageError),
    /// A configured limit was reached.
    #[error("{0}")]
    Limit(#[from] LimitError),
    /// A typed message did not serialize or deserialize.
    #[error("typed message: {0}")]
    Codec(String),
    /// A typed pop found a message of another type.
    #[error("expected a message of type {expected:?} but got {found:?}")]
    TypeMismatch {
        /// The type asked for.
        expected: String,
        /// The type the message carried.
        found: Option<String>,
    },
    /// The operating system refused; the message says which call.
    #[error("{what}: {source}")]
    Io {
        /// The operation that failed.
        what: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The object was closed.
    #[error("closed")]
    Closed,
    /// Nothing arrived in time.
    #[error("timed out")]
    Timeout,
    /// A request or tunnel found nobody to answer: no subscription matches
    /// the subject, or the cluster has no member with capacity.
    #[error("no responders for {target:?}: nobody subscribes to it or is a member of it")]
    NoResponders {
        /// The subject or cluster.
        target: String,
    },
    /// The node refused (a limit, an invalid name) or closed this client
    /// (protocol error, slow consumer, shutdown); `reason` says which.
    #[error("the node refused ({code:?}): {reason}")]
    Refused {
        /// The node's code.
        code: crate::client::Code,
        /// The node's explanation.
        reason: String,
    },
    /// A subject, pattern or type is not valid.
    #[error(transparent)]
    Subject(#[from] skiff_proto::router::SubjectError),
    /// The client lost its node (`skiff://a,b` failover): the call was in
    /// flight on it, was made while no node was reachable, or answers a
    /// request that came from it. With a failover list the client moves to
    /// the next node on its own; retry once it has
    /// ([`crate::client::ClientEvent::Reconnected`]).
    #[error("lost the connection to node {node}; the client fails over to the next node in its list (retry the call; see Client::events)")]
    NodeLost {
        /// The node lost, as in the locator.
        node: String,
    },
}

impl From<skiff_proto::Error> for Error {
    fn from(e: skiff_proto::Error) -> Self {
        match e {
            skiff_proto::Error::Usage(u) => Error::Usage(u),
            skiff_proto::Error::Limit(l) => Error::Limit(l),
            // The batcher never reports wire errors on push; keep the text.
            other => Error::Codec(other.to_string()),
        }
    }
}

impl Error {
    /// Whether this error means the client's node was lost (the call may
    /// succeed once the client has failed over).
    pub fn is_node_lost(&self) -> bool {
        matches!(self, Error::NodeLost { .. })
    }

    pub(crate) fn io(what: &'static str) -> impl FnOnce(io::Error) -> Error {
        move |source| Error::Io { what, source }
    }
}

/// What is wrong with a locator string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LocatorError {
    /// The string has no `scheme://`.
    #[error("locator {0:?} has no scheme; write it as scheme://address, e.g. udp://0.0.0.0:4711")]
    NoScheme(String),
    /// A node's locator has no `scheme://`.
    #[error("node locator {0:?} has no scheme; write it as skiff://host:port, unix:///path, shm://name or file:///path")]
    NoNodeScheme(String),
    /// The scheme is unknown or not usable for this object.
    #[error("scheme {scheme:?} is not accepted here; accepted: {accepted}")]
    Scheme {
        /// The scheme given.
        scheme: String,
        /// The schemes this object accepts.
        accepted: &'static str,
    },
    /// The address part did not parse or resolve.
    #[error("address {addr:?} is not valid: {why} (expected host:port, e.g. 127.0.0.1:4711 or [::1]:4711)")]
    Address {
        /// The address given.
        addr: String,
        /// Why it was refused.
        why: String,
    },
    /// A name in a locator (such as a node's shm name) is not valid.
    #[error("name {name:?} is not valid: {why}")]
    Name {
        /// The name given.
        name: String,
        /// What a name must be.
        why: &'static str,
    },
    /// An option name is unknown.
    #[error("unknown option {name:?}; accepted options: {accepted}")]
    UnknownOption {
        /// The option given.
        name: String,
        /// The options accepted.
        accepted: &'static str,
    },
    /// An option's value did not parse.
    #[error("option {name}={value:?} is not valid: expected {expected}")]
    BadValue {
        /// The option.
        name: String,
        /// The value given.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// `mem://` was asked for but no node runs in this process.
    #[error("mem:// needs a node in this process: call skiff_node::embed::install() once at start (the skiff binary and the Python package do), or attach to a node with Client::attach")]
    NoLocalNode,
}

impl LocatorError {
    /// Option `name` has a `value` that is not `expected`.
    pub(crate) fn bad_value(name: &str, value: &str, expected: &'static str) -> LocatorError {
        LocatorError::BadValue {
            name: name.into(),
            value: value.into(),
            expected,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_formats() {
        let all = vec![
            Error::Locator(LocatorError::NoScheme("x".into())),
            Error::Locator(LocatorError::NoNodeScheme("x".into())),
            Error::Locator(LocatorError::Scheme {
                scheme: "ftp".into(),
                accepted: "udp",
            }),
            Error::Locator(LocatorError::Address {
                addr: "x".into(),
                why: "no port".into(),
            }),
            Error::Locator(LocatorError::Name {
                name: "a/b".into(),
                why: "one path component",
            }),
            Error::Locator(LocatorError::UnknownOption {
                name: "q".into(),
                accepted: "qthresh",
            }),
            Error::Locator(LocatorError::BadValue {
                name: "qthresh".into(),
                value: "x".into(),
                expected: "bytes",
            }),
            Error::Locator(LocatorError::NoLocalNode),
            Error::Usage(UsageError::TooManyFields(99)),
            Error::Limit(LimitError::Destinations { max: 3 }),
            Error::Codec("bad".into()),
            Error::TypeMismatch {
                expected: "A".into(),
                found: None,
            },
            Error::Io {
                what: "bind",
                source: io::Error::other("nope"),
            },
            Error::Closed,
            Error::Timeout,
            Error::NoResponders { target: "x".into() },
            Error::Refused {
                code: crate::client::Code::Limit,
                reason: "max_subscriptions".into(),
            },
            Error::Subject(skiff_proto::router::Subject::new("").unwrap_err()),
            Error::NodeLost {
                node: "skiff://a:4747".into(),
            },
        ];
        for e in all {
            assert!(!e.to_string().is_empty());
        }
    }
}
