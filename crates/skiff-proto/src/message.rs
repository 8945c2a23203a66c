//! The message: what applications send and receive, apart from its encoding
//! (the zenoh habit). [`crate::wire`] turns it into bytes and back.

use std::net::SocketAddr;

use bytes::Bytes;
use bytestring::ByteString;

/// One message: a subject, an optional type, optional typed fields and a
/// payload, plus metadata the receiver fills in.
///
/// Cloning is cheap: strings and payload are reference-counted slices, so a
/// received message shares the receive buffer instead of copying it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    /// Dot-separated tokens such as `daq.hallb.rate`; may be empty for queue
    /// messages addressed by destination alone.
    pub subject: ByteString,
    /// The message's type (cMsg's "type"; `type` is a Rust keyword), a short
    /// tag such as `event` or the name of a serialized Rust type.
    pub kind: Option<ByteString>,
    /// Typed key/value pairs. Empty by default, which costs no allocation.
    pub fields: Vec<Field>,
    /// The application's bytes.
    pub payload: Bytes,
    /// Best effort (`reliable=false`): between nodes this message may
    /// travel as a datagram whose loss is counted, never repaired, even
    /// where subscribers asked for reliable delivery. Carried on the wire
    /// (flag bit 4), so a receiver sees how it was sent.
    pub best_effort: bool,
    /// Filled in on receive; ignored on send.
    pub meta: Meta,
}

/// Where and when a received message came from. The sender never sets this:
/// the receiver derives it from the datagram.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Meta {
    /// The sender's per-destination sequence number.
    pub seq: u64,
    /// The stream's 64-bit identity: one per sending queue and destination
    /// (a sender's messages to one destination are numbered on their own).
    pub source: u64,
    /// The address the datagram came from, where the transport knows it.
    pub from: Option<SocketAddr>,
}

/// A named, typed value carried beside the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The key; at most [`crate::wire::MAX_FIELD_KEY`] bytes.
    pub key: ByteString,
    /// The value.
    pub value: Value,
}

/// The value of a [`Field`].
///
/// Equality is equality of what goes on the wire: floats compare by their
/// bits, so a message holding NaN equals its own decoded copy.
#[derive(Debug, Clone)]
pub enum Value {
    /// A boolean.
    Bool(bool),
    /// A signed 64-bit integer (zigzag varint on the wire).
    Int(i64),
    /// A 64-bit float.
    Float(f64),
    /// A UTF-8 string.
    Str(ByteString),
    /// Opaque bytes.
    Bytes(Bytes),
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::Int(a), Value::Int(b)) => a == b,
            (Value::Float(a), Value::Float(b)) => a.to_bits() == b.to_bits(),
            (Value::Str(a), Value::Str(b)) => a == b,
            (Value::Bytes(a), Value::Bytes(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Value {}

impl Message {
    /// A message with a subject and a payload, no type and no fields.
    pub fn new(subject: impl Into<ByteString>, payload: impl Into<Bytes>) -> Self {
        Message {
            subject: subject.into(),
            payload: payload.into(),
            ..Default::default()
        }
    }

    /// A message with only a payload (queue messages need no subject).
    pub fn from_payload(payload: impl Into<Bytes>) -> Self {
        Message {
            payload: payload.into(),
            ..Default::default()
        }
    }

    /// Sets the type.
    #[must_use]
    pub fn with_kind(mut self, kind: impl Into<ByteString>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// Marks the message best effort (see [`Message::best_effort`]).
    #[must_use]
    pub fn with_best_effort(mut self, best_effort: bool) -> Self {
        self.best_effort = best_effort;
        self
    }

    /// Adds a typed field.
    #[must_use]
    pub fn with_field(mut self, key: impl Into<ByteString>, value: impl Into<Value>) -> Self {
        self.fields.push(Field {
            key: key.into(),
            value: value.into(),
        });
        self
    }

    /// The value of the first field named `key`.
    pub fn field(&self, key: &str) -> Option<&Value> {
        self.fields
            .iter()
            .find(|f| &*f.key == key)
            .map(|f| &f.value)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Float(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(v.into())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Str(v.into())
    }
}
impl From<Bytes> for Value {
    fn from(v: Bytes) -> Self {
        Value::Bytes(v)
    }
}
