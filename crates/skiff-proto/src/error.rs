//! Errors of skiff-proto, grouped by who is at fault (the rustls habit):
//! the peer sent bad bytes ([`WireError`]), the caller asked for something
//! impossible ([`UsageError`]), or a configured limit was reached
//! ([`LimitError`]).

use std::fmt;

/// Any error skiff-proto reports.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Bytes from the network were malformed; the datagram was dropped.
    #[error("malformed input from peer: {0}")]
    Wire(#[from] WireError),
    /// The caller passed something that can never succeed.
    #[error("invalid use: {0}")]
    Usage(#[from] UsageError),
    /// A configured limit was reached; the operation may succeed later or
    /// with a larger limit.
    #[error("limit reached: {0}")]
    Limit(#[from] LimitError),
}

/// The peer sent bytes that do not decode. Every variant is counted by the
/// receiver and the datagram is dropped whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The input ended in the middle of `what`.
    #[error("truncated {what}")]
    Truncated {
        /// The part of the frame that was cut short.
        what: &'static str,
    },
    /// The datagram does not start with skiff's magic bytes: it is not ours.
    #[error("foreign datagram (bad magic); is another protocol using this port?")]
    Foreign,
    /// The datagram's version is one this build does not speak.
    #[error("unsupported wire version {0} (this build speaks version {v})", v = crate::wire::VERSION)]
    Version(u8),
    /// The frame kind is unknown to this build.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// A varint did not fit in 64 bits.
    #[error("varint longer than 64 bits")]
    VarintOverflow,
    /// A length field exceeds its limit.
    #[error("{what} is {len} bytes, over the limit of {max}")]
    TooLong {
        /// Which field.
        what: &'static str,
        /// The length the peer claimed.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// A string field was not UTF-8.
    #[error("{0} is not valid UTF-8")]
    Utf8(&'static str),
    /// Structurally invalid: reserved bits set, bad tag, trailing bytes, …
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
}

/// The caller asked for something that can never succeed as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UsageError {
    /// The message, encoded, does not fit in one datagram.
    #[error(
        "message needs {needed} bytes encoded but one datagram carries at most {limit} \
         (max_datagram={max_datagram}, minus the {header}-byte header); \
         send a smaller payload or raise max_datagram"
    )]
    TooLarge {
        /// Encoded size of the message.
        needed: usize,
        /// Room for messages in one datagram.
        limit: usize,
        /// The configured datagram size.
        max_datagram: usize,
        /// The header size.
        header: usize,
    },
    /// A field of the message breaks a wire limit.
    #[error("{what} is {len} bytes; the limit is {max}")]
    FieldTooLong {
        /// Which field.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Too many typed fields on one message.
    #[error("message has {0} fields; the limit is {max}", max = crate::wire::MAX_FIELDS)]
    TooManyFields(usize),
    /// The message, encoded, is over the `max_message` of a reliable
    /// association (either end's).
    #[error(
        "message needs {len} bytes encoded but a reliable association carries at most \
         {max} (max_message); send a smaller payload or raise max_message on both ends"
    )]
    OverMaxMessage {
        /// Encoded size of the message.
        len: usize,
        /// The limit in force.
        max: u64,
    },
}

/// A configured limit was reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// The batcher already holds queues for `max` destinations.
    #[error(
        "{max} destinations already have queues (max_destinations); raise it or push to fewer"
    )]
    Destinations {
        /// The limit.
        max: usize,
    },
    /// A reliable queue's backlog for one destination is full: its
    /// association's window and send buffer are full and `max` bytes more
    /// wait behind them. Nothing was queued; the receiver reads slower than
    /// the sender pushes, or is unreachable.
    #[error(
        "the backlog to {dest} is full ({max} bytes wait for the association's window, \
         max_backlog); the receiver is slower than the pushes or unreachable: retry later, \
         push less, or raise max_backlog"
    )]
    Backlog {
        /// The destination.
        dest: std::net::SocketAddr,
        /// The limit.
        max: usize,
    },
}

/// A short label for a drop reason, used as a stats key.
pub trait Reason {
    /// A stable, lowercase, snake_case label.
    fn reason(&self) -> &'static str;
}

impl Reason for WireError {
    fn reason(&self) -> &'static str {
        match self {
            WireError::Truncated { .. } => "truncated",
            WireError::Foreign => "foreign",
            WireError::Version(_) => "version",
            WireError::Kind(_) => "kind",
            WireError::VarintOverflow | WireError::Malformed(_) | WireError::Utf8(_) => "malformed",
            WireError::TooLong { .. } => "oversized",
        }
    }
}

impl fmt::Display for crate::batcher::Dest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.endpoint == crate::batcher::Dest::ANY {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}#{}", self.addr, self.endpoint)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_formats() {
        let all: Vec<Error> = vec![
            WireError::Truncated { what: "header" }.into(),
            WireError::Foreign.into(),
            WireError::Version(9).into(),
            WireError::Kind(7).into(),
            WireError::VarintOverflow.into(),
            WireError::TooLong {
                what: "subject",
                len: 5000,
                max: 1024,
            }
            .into(),
            WireError::Utf8("subject").into(),
            WireError::Malformed("reserved flag bits set").into(),
            UsageError::TooLarge {
                needed: 70000,
                limit: 1446,
                max_datagram: 1472,
                header: 26,
            }
            .into(),
            UsageError::FieldTooLong {
                what: "subject",
                len: 2000,
                max: 1024,
            }
            .into(),
            UsageError::TooManyFields(100).into(),
            LimitError::Destinations { max: 10 }.into(),
            UsageError::OverMaxMessage {
                len: 5000,
                max: 4096,
            }
            .into(),
            LimitError::Backlog {
                dest: "127.0.0.1:4711".parse().unwrap(),
                max: 1 << 20,
            }
            .into(),
        ];
        for e in all {
            let s = e.to_string();
            assert!(s.len() > 10, "{s}");
        }
        let s = Error::from(UsageError::TooLarge {
            needed: 70000,
            limit: 1446,
            max_datagram: 1472,
            header: 26,
        })
        .to_string();
        assert!(s.contains("1446") && s.contains("max_datagram"), "{s}");
    }
}
