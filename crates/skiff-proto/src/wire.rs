//! The wire format: a datagram is a fixed header followed by a batch of
//! messages. The full specification, with byte diagrams, is `docs/wire.md`;
//! this module is its only implementation.
//!
//! ```text
//!  0       2     3      4                              12
//! +-------+-----+------+-------------------------------+
//! | magic | ver | kind |   source (u64, little end.)   |
//! +-------+-----+------+---------------+---------------+
//! 12                     16                            24     26
//! | endpoint (u32 LE)    |   base seq (u64 LE)          | count |
//! +----------------------+------------------------------+-------+
//! | message 0 | message 1 | ... | message count-1 | zero padding |
//! ```
//!
//! Message `i` has sequence number `base seq + i`. Each message is:
//!
//! ```text
//! +-------+-------------------------+---------------+----------+---------------------+
//! | flags | [subject: varint len+b] | [type: u8+b]  | [fields] | payload: varint+b   |
//! +-------+-------------------------+---------------+----------+---------------------+
//! flags: bit0 S subject follows; bit1 R subject repeats the previous message's;
//!        bit2 T type follows;    bit3 F fields follow;
//!        bit4 B best effort (`reliable=false`: may cross nodes as a datagram);
//!        bits 5..7 reserved (0).
//! ```
//!
//! Decoders are total and bounded: every length is checked against both its
//! limit and the bytes that remain before anything is sliced or allocated,
//! and a datagram decodes whole or not at all.

use bytes::{BufMut, Bytes};
use bytestring::ByteString;

use crate::codec::Reader;
use crate::error::{UsageError, WireError};
use crate::message::{Field, Message, Meta, Value};
use crate::varint;

/// The two bytes every skiff datagram starts with: `SK`.
pub const MAGIC: [u8; 2] = *b"SK";
/// The wire version this build writes and reads.
pub const VERSION: u8 = 1;
/// Size of the datagram header in bytes.
pub const HEADER_LEN: usize = 26;
/// Longest subject, in bytes.
pub const MAX_SUBJECT: usize = 1024;
/// Longest type, in bytes (its length is one byte on the wire).
pub const MAX_KIND: usize = 255;
/// Most fields on one message.
pub const MAX_FIELDS: usize = 64;
/// Longest field key, in bytes.
pub const MAX_FIELD_KEY: usize = 255;
/// Largest UDP payload over IPv4, and so the largest datagram skiff builds.
pub const MAX_DATAGRAM: usize = 65_507;
/// Most messages in one datagram (the count is a `u16`).
pub const MAX_COUNT: usize = u16::MAX as usize;

const F_SUBJECT: u8 = 1;
const F_REPEAT: u8 = 2;
const F_KIND: u8 = 4;
const F_FIELDS: u8 = 8;
/// The publisher asked for best effort (`reliable=false`): between nodes
/// the message may travel as a datagram, its loss counted, never repaired.
pub const F_BEST_EFFORT: u8 = 16;
const F_RESERVED: u8 = 0xe0;

const TAG_BOOL: u8 = 0;
const TAG_INT: u8 = 1;
const TAG_FLOAT: u8 = 2;
const TAG_STR: u8 = 3;
const TAG_BYTES: u8 = 4;

/// What a datagram carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A batch of best-effort messages (CMQ).
    Batch = 1,
}

impl Kind {
    fn from_u8(b: u8) -> Result<Kind, WireError> {
        match b {
            1 => Ok(Kind::Batch),
            other => Err(WireError::Kind(other)),
        }
    }
}

/// The fixed 26-byte datagram header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What follows the header.
    pub kind: Kind,
    /// The stream's identity: one per sending queue and destination, so
    /// that sequence numbers are per stream.
    pub source: u64,
    /// The endpoint id the datagram is for ([`crate::Dest::ANY`] for any).
    pub endpoint: u32,
    /// Sequence number of the first message.
    pub base_seq: u64,
    /// Number of messages.
    pub count: u16,
}

impl Header {
    /// Writes the header into the first [`HEADER_LEN`] bytes of `out`.
    ///
    /// # Panics
    /// If `out` is shorter than [`HEADER_LEN`]; callers reserve it first.
    pub fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&MAGIC);
        out[2] = VERSION;
        out[3] = self.kind as u8;
        out[4..12].copy_from_slice(&self.source.to_le_bytes());
        out[12..16].copy_from_slice(&self.endpoint.to_le_bytes());
        out[16..24].copy_from_slice(&self.base_seq.to_le_bytes());
        out[24..26].copy_from_slice(&self.count.to_le_bytes());
    }

    /// Reads a header from the front of `buf`.
    pub fn read(buf: &[u8]) -> Result<Header, WireError> {
        if buf.len() < 2 || buf[0..2] != MAGIC {
            return Err(if buf.len() < 2 && MAGIC.starts_with(buf) {
                WireError::Truncated { what: "header" }
            } else {
                WireError::Foreign
            });
        }
        if buf.len() < 3 {
            return Err(WireError::Truncated { what: "header" });
        }
        if buf[2] != VERSION {
            return Err(WireError::Version(buf[2]));
        }
        if buf.len() < HEADER_LEN {
            return Err(WireError::Truncated { what: "header" });
        }
        let kind = Kind::from_u8(buf[3])?;
        let u64_at = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().expect("8 bytes"));
        Ok(Header {
            kind,
            source: u64_at(4),
            endpoint: u32::from_le_bytes(buf[12..16].try_into().expect("4 bytes")),
            base_seq: u64_at(16),
            count: u16::from_le_bytes([buf[24], buf[25]]),
        })
    }
}

/// Checks a message against the wire limits before it is queued, so that a
/// bad message is refused at `push`, not discovered by the receiver.
pub fn check(msg: &Message) -> Result<(), UsageError> {
    let too_long = |what, len, max| UsageError::FieldTooLong { what, len, max };
    if msg.subject.len() > MAX_SUBJECT {
        return Err(too_long("subject", msg.subject.len(), MAX_SUBJECT));
    }
    if let Some(k) = &msg.kind {
        if k.len() > MAX_KIND {
            return Err(too_long("type", k.len(), MAX_KIND));
        }
    }
    if msg.fields.len() > MAX_FIELDS {
        return Err(UsageError::TooManyFields(msg.fields.len()));
    }
    for f in &msg.fields {
        if f.key.len() > MAX_FIELD_KEY {
            return Err(too_long("field key", f.key.len(), MAX_FIELD_KEY));
        }
    }
    Ok(())
}

/// Bytes `msg` takes encoded; `repeat` when its subject equals the previous
/// message's in the same datagram.
pub fn encoded_len(msg: &Message, repeat: bool) -> usize {
    let mut n = 1;
    if !repeat && !msg.subject.is_empty() {
        n += varint::len(msg.subject.len() as u64) + msg.subject.len();
    }
    if let Some(k) = &msg.kind {
        n += 1 + k.len();
    }
    if !msg.fields.is_empty() {
        n += varint::len(msg.fields.len() as u64);
        for f in &msg.fields {
            n += 1 + f.key.len() + 1 + value_len(&f.value);
        }
    }
    n + varint::len(msg.payload.len() as u64) + msg.payload.len()
}

fn value_len(v: &Value) -> usize {
    match v {
        Value::Bool(_) => 1,
        Value::Int(i) => varint::len(varint::zigzag(*i)),
        Value::Float(_) => 8,
        Value::Str(s) => varint::len(s.len() as u64) + s.len(),
        Value::Bytes(b) => varint::len(b.len() as u64) + b.len(),
    }
}

/// Appends `msg` to `out`. The caller has checked it with [`check`]; `repeat`
/// as for [`encoded_len`].
pub fn encode_message(out: &mut Vec<u8>, msg: &Message, repeat: bool) {
    encode_to(out, msg, repeat);
}

/// Writes `msg` into `out`, which must be exactly [`encoded_len`] bytes
/// long (e.g. a reserved segment of a shared-memory ring: the message is
/// written once, in place); `false`, with `out` untouched, if it is not.
/// The caller has checked `msg` with [`check`].
pub fn encode_message_into(out: &mut [u8], msg: &Message, repeat: bool) -> bool {
    if out.len() != encoded_len(msg, repeat) {
        return false;
    }
    let mut w: &mut [u8] = out;
    encode_to(&mut w, msg, repeat);
    debug_assert!(w.is_empty());
    true
}

#[inline(always)]
fn put_varint<B: BufMut>(out: &mut B, v: u64) {
    varint::put_buf(out, v)
}

fn encode_to<B: BufMut>(out: &mut B, msg: &Message, repeat: bool) {
    let mut flags = 0;
    let subject = !repeat && !msg.subject.is_empty();
    if subject {
        flags |= F_SUBJECT;
    }
    if repeat {
        flags |= F_REPEAT;
    }
    if msg.kind.is_some() {
        flags |= F_KIND;
    }
    if !msg.fields.is_empty() {
        flags |= F_FIELDS;
    }
    if msg.best_effort {
        flags |= F_BEST_EFFORT;
    }
    out.put_u8(flags);
    if subject {
        put_varint(out, msg.subject.len() as u64);
        out.put_slice(msg.subject.as_bytes());
    }
    if let Some(k) = &msg.kind {
        out.put_u8(k.len() as u8);
        out.put_slice(k.as_bytes());
    }
    if !msg.fields.is_empty() {
        put_varint(out, msg.fields.len() as u64);
        for f in &msg.fields {
            out.put_u8(f.key.len() as u8);
            out.put_slice(f.key.as_bytes());
            match &f.value {
                Value::Bool(b) => out.put_slice(&[TAG_BOOL, u8::from(*b)]),
                Value::Int(i) => {
                    out.put_u8(TAG_INT);
                    put_varint(out, varint::zigzag(*i));
                }
                Value::Float(x) => {
                    out.put_u8(TAG_FLOAT);
                    out.put_slice(&x.to_le_bytes());
                }
                Value::Str(s) => {
                    out.put_u8(TAG_STR);
                    put_varint(out, s.len() as u64);
                    out.put_slice(s.as_bytes());
                }
                Value::Bytes(b) => {
                    out.put_u8(TAG_BYTES);
                    put_varint(out, b.len() as u64);
                    out.put_slice(b);
                }
            }
        }
    }
    put_varint(out, msg.payload.len() as u64);
    out.put_slice(&msg.payload);
}

/// Encodes a whole datagram from a header and messages (subjects repeated
/// between neighbours are sent once). For tests, tools and fuzz seeds; the
/// batcher builds datagrams incrementally.
pub fn encode_datagram(
    source: u64,
    endpoint: u32,
    base_seq: u64,
    msgs: &[Message],
) -> Result<Vec<u8>, UsageError> {
    let mut out = vec![0; HEADER_LEN];
    let mut prev: Option<&ByteString> = None;
    for m in msgs {
        check(m)?;
        let repeat = prev.is_some_and(|p| !p.is_empty() && *p == m.subject);
        encode_message(&mut out, m, repeat);
        prev = Some(&m.subject);
    }
    let count = u16::try_from(msgs.len()).map_err(|_| UsageError::TooManyFields(msgs.len()))?;
    Header {
        kind: Kind::Batch,
        source,
        endpoint,
        base_seq,
        count,
    }
    .write(&mut out);
    Ok(out)
}

/// The message decoders, on the codec's cursor over a datagram (strings
/// and payloads come out as zero-copy slices of it).
impl Reader<'_, Bytes> {
    fn string(
        &mut self,
        len: u64,
        max: usize,
        what: &'static str,
    ) -> Result<ByteString, WireError> {
        let b = self.shared_len(len, max, what)?;
        ByteString::try_from(b).map_err(|_| WireError::Utf8(what))
    }

    fn message(&mut self, prev: Option<&ByteString>) -> Result<Message, WireError> {
        self.message_max(prev, MAX_DATAGRAM)
    }

    #[inline(always)]
    fn message_max(
        &mut self,
        prev: Option<&ByteString>,
        max_payload: usize,
    ) -> Result<Message, WireError> {
        let (subject, kind, fields, payload, best_effort) = self.parts(prev, max_payload)?;
        Ok(Message {
            subject,
            kind,
            fields,
            payload,
            best_effort,
            meta: Meta::default(),
        })
    }

    /// The parts of one message, decoded.
    #[allow(clippy::type_complexity)]
    #[inline(always)]
    fn parts(
        &mut self,
        prev: Option<&ByteString>,
        max_payload: usize,
    ) -> Result<(ByteString, Option<ByteString>, Vec<Field>, Bytes, bool), WireError> {
        let flags = self.u8("message flags")?;
        if flags & F_RESERVED != 0 {
            return Err(WireError::Malformed("reserved message flag bits set"));
        }
        let subject = match (flags & F_SUBJECT != 0, flags & F_REPEAT != 0) {
            (true, true) => return Err(WireError::Malformed("subject both sent and repeated")),
            (true, false) => {
                let n = self.varint("subject length")?;
                if n == 0 {
                    return Err(WireError::Malformed("empty subject sent explicitly"));
                }
                self.string(n, MAX_SUBJECT, "subject")?
            }
            (false, true) => match prev {
                Some(p) if !p.is_empty() => p.clone(),
                _ => {
                    return Err(WireError::Malformed(
                        "repeated subject with no previous subject",
                    ))
                }
            },
            (false, false) => ByteString::new(),
        };
        let kind = if flags & F_KIND != 0 {
            let n = self.u8("type length")?;
            Some(self.string(u64::from(n), MAX_KIND, "type")?)
        } else {
            None
        };
        let mut fields = Vec::new();
        if flags & F_FIELDS != 0 {
            let n = field_count(self)?;
            // Each field takes at least 3 bytes, so a claimed count cannot
            // make us allocate more than the datagram could hold.
            fields.reserve((n as usize).min(self.remaining() / 3));
            for _ in 0..n {
                let klen = self.u8("field key length")?;
                let key = self.string(u64::from(klen), MAX_FIELD_KEY, "field key")?;
                let value = match self.u8("field tag")? {
                    TAG_BOOL => match self.u8("bool")? {
                        0 => Value::Bool(false),
                        1 => Value::Bool(true),
                        _ => return Err(WireError::Malformed("bool is neither 0 nor 1")),
                    },
                    TAG_INT => Value::Int(varint::unzigzag(self.varint("int")?)),
                    TAG_FLOAT => {
                        let b = self.shared_len(8, 8, "float")?;
                        Value::Float(f64::from_le_bytes(b[..].try_into().expect("8 bytes")))
                    }
                    TAG_STR => {
                        let n = self.varint("string length")?;
                        Value::Str(self.string(n, MAX_DATAGRAM, "string field")?)
                    }
                    TAG_BYTES => {
                        let n = self.varint("bytes length")?;
                        Value::Bytes(self.shared_len(n, MAX_DATAGRAM, "bytes field")?)
                    }
                    _ => return Err(WireError::Malformed("unknown field tag")),
                };
                fields.push(Field { key, value });
            }
        }
        let n = self.varint("payload length")?;
        let payload = self.shared_len(n, max_payload, "payload")?;
        Ok((subject, kind, fields, payload, flags & F_BEST_EFFORT != 0))
    }
}

impl Reader<'_, Bytes> {
    /// Skips `len` bytes, checked as [`Reader::shared_len`] does, returning
    /// them as a plain slice (no reference count taken).
    #[inline]
    fn skip(&mut self, len: u64, max: usize, what: &'static str) -> Result<&[u8], WireError> {
        self.take_len(len, max, what)
    }

    fn skip_str(&mut self, len: u64, max: usize, what: &'static str) -> Result<(), WireError> {
        let b = self.skip(len, max, what)?;
        std::str::from_utf8(b)
            .map(|_| ())
            .map_err(|_| WireError::Utf8(what))
    }

    /// Checks one message exactly as [`Reader::message_max`] decodes it,
    /// building nothing. Returns whether its subject is non-empty (what a
    /// following repeat needs). `validate_agrees_with_decode` in the tests
    /// and the fuzz target hold the two to the same verdicts.
    fn skip_message(&mut self, prev_nonempty: bool) -> Result<bool, WireError> {
        let flags = self.u8("message flags")?;
        if flags & F_RESERVED != 0 {
            return Err(WireError::Malformed("reserved message flag bits set"));
        }
        let nonempty = match (flags & F_SUBJECT != 0, flags & F_REPEAT != 0) {
            (true, true) => return Err(WireError::Malformed("subject both sent and repeated")),
            (true, false) => {
                let n = self.varint("subject length")?;
                if n == 0 {
                    return Err(WireError::Malformed("empty subject sent explicitly"));
                }
                self.skip_str(n, MAX_SUBJECT, "subject")?;
                true
            }
            (false, true) if prev_nonempty => true,
            (false, true) => {
                return Err(WireError::Malformed(
                    "repeated subject with no previous subject",
                ))
            }
            (false, false) => false,
        };
        if flags & F_KIND != 0 {
            let n = self.u8("type length")?;
            self.skip_str(u64::from(n), MAX_KIND, "type")?;
        }
        if flags & F_FIELDS != 0 {
            skip_fields(self)?;
        }
        let n = self.varint("payload length")?;
        self.skip(n, MAX_DATAGRAM, "payload")?;
        Ok(nonempty)
    }
}

/// One message of a frame, read in place: its subject, type and payload
/// are borrowed from the buffer it was decoded from (a shared-memory
/// ring's segment), nothing is allocated or reference-counted. Made by
/// [`decode_message_ref`], which checks the whole message as
/// [`decode_message_into`] does (fields included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageRef<'a> {
    /// The subject (empty for a message addressed by destination alone).
    pub subject: &'a str,
    /// The type, if the message has one.
    pub kind: Option<&'a str>,
    /// The application's bytes.
    pub payload: &'a [u8],
    /// Sent best effort (see [`Message::best_effort`]).
    pub best_effort: bool,
    /// The whole encoded message (flags to payload), for
    /// [`MessageRef::to_message`].
    pub raw: &'a [u8],
    /// Whether it carries fields (read them with [`MessageRef::to_message`]).
    pub has_fields: bool,
}

impl MessageRef<'_> {
    /// The message as an owned [`Message`] (its bytes copied once), fields
    /// included.
    pub fn to_message(&self) -> Result<Message, WireError> {
        let buf = Bytes::copy_from_slice(self.raw);
        let mut m = Message::default();
        decode_message_into(&buf, 0, usize::MAX, &mut m)?;
        Ok(m)
    }
}

/// `b` as UTF-8, or the error naming `what`.
fn utf8<'a>(b: &'a [u8], what: &'static str) -> Result<&'a str, WireError> {
    std::str::from_utf8(b).map_err(|_| WireError::Utf8(what))
}

/// A message's field count, read and bounded: present only when non-zero
/// (the flag says so), at most [`MAX_FIELDS`].
#[inline]
fn field_count<B: AsRef<[u8]> + ?Sized>(r: &mut Reader<'_, B>) -> Result<u64, WireError> {
    let n = r.varint("field count")?;
    if n == 0 || n > MAX_FIELDS as u64 {
        return Err(WireError::TooLong {
            what: "field count",
            len: n,
            max: MAX_FIELDS,
        });
    }
    Ok(n)
}

/// Checks a message's fields (their count, then each key, tag and value)
/// as [`Reader::message_max`] decodes them, building nothing: what both
/// the datagram's validation and [`decode_message_ref`] need.
#[inline]
fn skip_fields<B: AsRef<[u8]> + ?Sized>(r: &mut Reader<'_, B>) -> Result<(), WireError> {
    let n = field_count(r)?;
    for _ in 0..n {
        let klen = r.u8("field key length")?;
        utf8(
            r.take_len(u64::from(klen), MAX_FIELD_KEY, "field key")?,
            "field key",
        )?;
        match r.u8("field tag")? {
            TAG_BOOL => {
                if r.u8("bool")? > 1 {
                    return Err(WireError::Malformed("bool is neither 0 nor 1"));
                }
            }
            TAG_INT => {
                r.varint("int")?;
            }
            TAG_FLOAT => {
                r.take_len(8, 8, "float")?;
            }
            TAG_STR => {
                let n = r.varint("string length")?;
                utf8(r.take_len(n, MAX_DATAGRAM, "string field")?, "string field")?;
            }
            TAG_BYTES => {
                let n = r.varint("bytes length")?;
                r.take_len(n, MAX_DATAGRAM, "bytes field")?;
            }
            _ => return Err(WireError::Malformed("unknown field tag")),
        }
    }
    Ok(())
}

/// Decodes the message that fills `buf[start..]` in place (see
/// [`MessageRef`]), with the checks and verdicts of
/// [`decode_message_into`]: bounded and total on any bytes.
pub fn decode_message_ref(
    buf: &[u8],
    start: usize,
    max_payload: usize,
) -> Result<MessageRef<'_>, WireError> {
    if start > buf.len() {
        return Err(WireError::Truncated { what: "message" });
    }
    let mut r = Reader::at(buf, start);
    let flags = r.u8("message flags")?;
    if flags & F_RESERVED != 0 {
        return Err(WireError::Malformed("reserved message flag bits set"));
    }
    let subject = match (flags & F_SUBJECT != 0, flags & F_REPEAT != 0) {
        (true, true) => return Err(WireError::Malformed("subject both sent and repeated")),
        (true, false) => {
            let n = r.varint("subject length")?;
            if n == 0 {
                return Err(WireError::Malformed("empty subject sent explicitly"));
            }
            utf8(r.take_len(n, MAX_SUBJECT, "subject")?, "subject")?
        }
        (false, true) => {
            return Err(WireError::Malformed(
                "repeated subject with no previous subject",
            ))
        }
        (false, false) => "",
    };
    let kind = if flags & F_KIND != 0 {
        let n = r.u8("type length")?;
        Some(utf8(r.take_len(u64::from(n), MAX_KIND, "type")?, "type")?)
    } else {
        None
    };
    let has_fields = flags & F_FIELDS != 0;
    if has_fields {
        skip_fields(&mut r)?;
    }
    let n = r.varint("payload length")?;
    let payload = r.take_len(n, max_payload, "payload")?;
    if r.pos() != buf.len() {
        return Err(WireError::Malformed("trailing bytes after the message"));
    }
    Ok(MessageRef {
        subject,
        kind,
        payload,
        best_effort: flags & F_BEST_EFFORT != 0,
        raw: &buf[start..],
        has_fields,
    })
}

/// A validated datagram whose messages are decoded one at a time, each
/// straight into wherever the caller wants it: the receive path's way to
/// avoid building every message in a buffer first and moving it again.
///
/// [`Batch::new`] checks the whole datagram with the same rules as
/// [`decode_into`] (accepted whole or refused whole) without building or
/// reference-counting anything; iterating then yields exactly the messages
/// `decode_into` would.
#[derive(Debug, Clone)]
pub struct Batch {
    buf: Bytes,
    header: Header,
    pos: usize,
    index: u16,
    prev: ByteString,
}

impl Batch {
    /// Validates `buf` as a whole datagram.
    pub fn new(buf: Bytes) -> Result<Batch, WireError> {
        Batch::try_new(buf).map_err(|(e, _)| e)
    }

    /// As [`Batch::new`], handing `buf` back with the error, for a caller
    /// that looks at a refused buffer again (a run of datagrams the kernel
    /// coalesced without saying so: [`run_stride`]).
    pub fn try_new(buf: Bytes) -> Result<Batch, (WireError, Bytes)> {
        match validate(&buf) {
            Ok(header) => Ok(Batch {
                buf,
                header,
                pos: HEADER_LEN,
                index: 0,
                prev: ByteString::new(),
            }),
            Err(e) => Err((e, buf)),
        }
    }

    /// Decodes the message of a datagram that carries exactly one into
    /// `out` and returns the datagram's header: what [`Batch::new`] and
    /// then [`Batch::next_from`] give, in one pass (they read the message
    /// twice, once to validate and once to decode) and built where the
    /// caller wants it (a message is large; each move is a copy). A request
    /// or a reply travels alone, so this is a ping-pong's receive path.
    /// `None`, with `out` untouched, for anything else (a batch of several
    /// messages, or a datagram `Batch::new` refuses): the caller then takes
    /// `Batch::new`, which says why.
    #[inline]
    pub fn single_into(
        buf: &Bytes,
        from: Option<std::net::SocketAddr>,
        out: &mut Option<Message>,
    ) -> Option<Header> {
        let h = Header::read(buf).ok()?;
        if h.count != 1 || buf.len() > MAX_DATAGRAM {
            return None;
        }
        let mut r = Reader::resume(buf, HEADER_LEN); // Header::read checked the length
        let (subject, kind, fields, payload, best_effort) = r.parts(None, MAX_DATAGRAM).ok()?;
        if buf[r.pos()..].iter().any(|&b| b != 0) {
            return None;
        }
        *out = Some(Message {
            subject,
            kind,
            fields,
            payload,
            best_effort,
            meta: Meta {
                seq: h.base_seq,
                source: h.source,
                from,
            },
        });
        Some(h)
    }

    /// The datagram's header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The whole datagram.
    pub fn bytes(&self) -> &Bytes {
        &self.buf
    }

    /// Messages not yet yielded.
    pub fn remaining(&self) -> usize {
        usize::from(self.header.count - self.index)
    }
}

impl Iterator for Batch {
    type Item = Message;

    #[inline]
    fn next(&mut self) -> Option<Message> {
        self.next_from(None)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining(), Some(self.remaining()))
    }
}

impl Batch {
    /// The next message, as `next` yields it but with `from` as its origin:
    /// built in place, where setting `meta.from` afterwards would move the
    /// whole message once more.
    #[inline(always)]
    pub fn next_from(&mut self, from: Option<std::net::SocketAddr>) -> Option<Message> {
        if self.index == self.header.count {
            return None;
        }
        let mut r = Reader::resume(&self.buf, self.pos);
        let prev = (self.index > 0).then_some(&self.prev);
        // Validated in `new`, so this cannot fail; if it ever did, the
        // batch ends rather than yield garbage.
        let Ok((subject, kind, fields, payload, best_effort)) = r.parts(prev, MAX_DATAGRAM) else {
            self.index = self.header.count;
            return None;
        };
        let seq = self.header.base_seq.wrapping_add(u64::from(self.index));
        self.pos = r.pos();
        self.index += 1;
        remember(&mut self.prev, &subject);
        Some(Message {
            subject,
            kind,
            fields,
            payload,
            best_effort,
            meta: Meta {
                seq,
                source: self.header.source,
                from,
            },
        })
    }

    /// Decodes up to `max` messages onto the end of `out`, each built in
    /// place (no intermediate moves of the message), with `from` as their
    /// origin; returns how many. The receive path's bulk form of `next`.
    #[inline]
    pub fn next_into(
        &mut self,
        out: &mut Vec<Message>,
        max: usize,
        from: Option<std::net::SocketAddr>,
    ) -> usize {
        let n = self.remaining().min(max);
        out.reserve(n);
        let mut r = Reader::resume(&self.buf, self.pos);
        for done in 0..n {
            let prev = (self.index > 0).then_some(&self.prev);
            // Validated in `new`, so this cannot fail; if it ever did, the
            // batch ends rather than yield garbage.
            let Ok((subject, kind, fields, payload, best_effort)) = r.parts(prev, MAX_DATAGRAM)
            else {
                self.index = self.header.count;
                return done;
            };
            let seq = self.header.base_seq.wrapping_add(u64::from(self.index));
            self.index += 1;
            remember(&mut self.prev, &subject);
            out.push(Message {
                subject,
                kind,
                fields,
                payload,
                best_effort,
                meta: Meta {
                    seq,
                    source: self.header.source,
                    from,
                },
            });
        }
        self.pos = r.pos();
        n
    }
}

/// Keeps `subject` in `prev` as the one the next message may repeat.
#[inline(always)]
fn remember(prev: &mut ByteString, subject: &ByteString) {
    if subject.is_empty() {
        if !prev.is_empty() {
            *prev = ByteString::new();
        }
    } else if subject != prev {
        *prev = subject.clone();
    }
}

/// Checks a whole datagram by the rules of [`decode_into`] without
/// building anything, returning its header.
pub fn validate(buf: &Bytes) -> Result<Header, WireError> {
    let h = Header::read(buf)?;
    if buf.len() > MAX_DATAGRAM {
        return Err(WireError::TooLong {
            what: "datagram",
            len: buf.len() as u64,
            max: MAX_DATAGRAM,
        });
    }
    if h.count == 0 {
        return Err(WireError::Malformed("empty batch"));
    }
    if usize::from(h.count) > (buf.len() - HEADER_LEN) / 2 {
        return Err(WireError::Truncated { what: "batch" });
    }
    let mut r = Reader::resume(buf, HEADER_LEN); // Header::read checked the length
    let mut prev_nonempty = false;
    for _ in 0..h.count {
        prev_nonempty = r.skip_message(prev_nonempty)?;
    }
    if buf[r.pos()..].iter().any(|&b| b != 0) {
        return Err(WireError::Malformed(
            "trailing bytes after the last message",
        ));
    }
    Ok(h)
}

/// The datagram length of a run the kernel coalesced (GRO) but did not
/// report, found from the run itself: where the first batch's messages and
/// zero padding end, if a header starts there. Every datagram of a GRO run
/// but the last has one length, and the batcher pads the batches of a GSO
/// send to that length with zeros (see "Zero padding" in `docs/wire.md`),
/// so that offset is the stride. `None` if `buf` holds one datagram, or if
/// its first batch is not valid (the caller then judges `buf` whole).
/// Reads at most one batch's messages and its padding.
pub fn run_stride(buf: &Bytes) -> Option<usize> {
    let h = Header::read(buf).ok()?;
    if h.count == 0 {
        return None;
    }
    let mut r = Reader::resume(buf, HEADER_LEN); // Header::read checked the length
    let mut prev_nonempty = false;
    for _ in 0..h.count {
        prev_nonempty = r.skip_message(prev_nonempty).ok()?;
    }
    let next = r.pos() + buf[r.pos()..].iter().position(|&b| b != 0)?;
    (next <= MAX_DATAGRAM && buf[next..].starts_with(&MAGIC)).then_some(next)
}

/// Decodes a whole datagram, appending its messages to `out` with their
/// sequence numbers and source filled in. On error nothing is appended:
/// a datagram is accepted whole or dropped whole.
pub fn decode_into(buf: &Bytes, out: &mut Vec<Message>) -> Result<Header, WireError> {
    let header = Header::read(buf)?;
    if buf.len() > MAX_DATAGRAM {
        return Err(WireError::TooLong {
            what: "datagram",
            len: buf.len() as u64,
            max: MAX_DATAGRAM,
        });
    }
    let start = out.len();
    let res = decode_body(buf, &header, out);
    if res.is_err() {
        out.truncate(start);
    }
    res.map(|()| header)
}

fn decode_body(buf: &Bytes, h: &Header, out: &mut Vec<Message>) -> Result<(), WireError> {
    if h.count == 0 {
        return Err(WireError::Malformed("empty batch"));
    }
    // A message takes at least 2 bytes (flags and a payload length).
    if usize::from(h.count) > (buf.len() - HEADER_LEN) / 2 {
        return Err(WireError::Truncated { what: "batch" });
    }
    out.reserve(usize::from(h.count));
    let mut r = Reader::resume(buf, HEADER_LEN); // Header::read checked the length
    let mut prev: Option<ByteString> = None;
    for i in 0..u64::from(h.count) {
        let mut m = r.message(prev.as_ref())?;
        m.meta = Meta {
            seq: h.base_seq.wrapping_add(i),
            source: h.source,
            from: None,
        };
        prev = Some(m.subject.clone());
        out.push(m);
    }
    if buf[r.pos()..].iter().any(|&b| b != 0) {
        return Err(WireError::Malformed(
            "trailing bytes after the last message",
        ));
    }
    Ok(())
}

/// Decodes one message that fills `buf` exactly (no header, no subject
/// repeat), with payloads up to `max_payload` bytes: what a stream protocol
/// such as the node's client protocol carries inside its own frames, so a
/// message has one encoding everywhere. Strings and payload are zero-copy
/// slices of `buf`. Total and bounded like [`decode_into`].
pub fn decode_message(buf: &Bytes, max_payload: usize) -> Result<Message, WireError> {
    let mut r = Reader::new(buf);
    let m = r.message_max(None, max_payload)?;
    if r.pos() != buf.len() {
        return Err(WireError::Malformed("trailing bytes after the message"));
    }
    Ok(m)
}

/// Decodes the message that fills `buf[start..]` into `out`, replacing
/// its subject, type, fields and payload (its `meta` is left as it is):
/// [`decode_message`] for a receiver that decodes straight into the slot
/// where the message will wait, without slicing `buf` first or moving a
/// whole `Message` into place. On error `out` is unchanged.
pub fn decode_message_into(
    buf: &Bytes,
    start: usize,
    max_payload: usize,
    out: &mut Message,
) -> Result<(), WireError> {
    if start > buf.len() {
        return Err(WireError::Truncated { what: "message" });
    }
    let mut r = Reader::resume(buf, start); // start <= buf.len(), checked above
    let (subject, kind, fields, payload, best_effort) = r.parts(None, max_payload)?;
    if r.pos() != buf.len() {
        return Err(WireError::Malformed("trailing bytes after the message"));
    }
    out.subject = subject;
    out.kind = kind;
    out.fields = fields;
    out.payload = payload;
    out.best_effort = best_effort;
    Ok(())
}

/// Decodes a datagram into a new vector (see [`decode_into`]).
pub fn decode(buf: &Bytes) -> Result<(Header, Vec<Message>), WireError> {
    let mut out = Vec::new();
    let h = decode_into(buf, &mut out)?;
    Ok((h, out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn message_ref_agrees_with_decode_message_into() {
        let msgs = [
            Message::new("a.b", "payload")
                .with_kind("t")
                .with_field("k", 1i64)
                .with_field("s", "v"),
            Message::new("x", ""),
            Message::from_payload("z"),
        ];
        for m in &msgs {
            let mut v = vec![9u8, 9];
            encode_message(&mut v, m, false);
            let b = Bytes::from(v.clone());
            let r = decode_message_ref(&v, 2, 1 << 20).expect("valid");
            let mut owned = Message::default();
            decode_message_into(&b, 2, 1 << 20, &mut owned).expect("valid");
            assert_eq!(r.subject, &*owned.subject);
            assert_eq!(r.kind, owned.kind.as_deref());
            assert_eq!(r.payload, &owned.payload[..]);
            assert_eq!(r.has_fields, !owned.fields.is_empty());
            assert_eq!(r.to_message().expect("valid").fields, owned.fields);
            // Every cut is refused, never a panic, as the owned decoder does.
            for cut in 2..v.len() {
                let short = Bytes::copy_from_slice(&v[..cut]);
                let mut slot = Message::default();
                assert_eq!(
                    decode_message_ref(&v[..cut], 2, 1 << 20).is_err(),
                    decode_message_into(&short, 2, 1 << 20, &mut slot).is_err()
                );
            }
        }
        assert!(decode_message_ref(&[1, 2], 3, 10).is_err());
    }

    proptest! {
        #[test]
        fn message_ref_verdicts_match_the_owned_decoder(
            bytes in proptest::collection::vec(any::<u8>(), 0..64),
            max in 0usize..32,
        ) {
            let b = Bytes::from(bytes.clone());
            let mut slot = Message::default();
            let owned = decode_message_into(&b, 0, max, &mut slot);
            let r = decode_message_ref(&bytes, 0, max);
            prop_assert_eq!(owned.is_ok(), r.is_ok());
            if let Ok(r) = r {
                prop_assert_eq!(r.payload, &slot.payload[..]);
                prop_assert_eq!(r.subject, &*slot.subject);
            }
        }
    }

    #[test]
    fn encode_into_a_slice_matches_encode() {
        let m = Message::new("a.b", "payload")
            .with_kind("t")
            .with_field("k", 1i64)
            .with_field("s", "v");
        for repeat in [false, true] {
            let mut v = Vec::new();
            encode_message(&mut v, &m, repeat);
            let mut s = vec![0u8; encoded_len(&m, repeat)];
            assert!(encode_message_into(&mut s, &m, repeat));
            assert_eq!(s, v);
            let mut short = vec![0u8; s.len() - 1];
            assert!(!encode_message_into(&mut short, &m, repeat));
        }
    }

    fn sample() -> Vec<u8> {
        let msgs = vec![
            Message::new("a.b", "x")
                .with_kind("t")
                .with_field("k", 1i64),
            Message::new("a.b", "y"),
            Message::from_payload("z"),
            Message::new("c", "w")
                .with_field("s", "v")
                .with_field("f", 1.5)
                .with_field("b", true),
        ];
        let mut d = encode_datagram(7, 0, 3, &msgs).unwrap();
        d.extend_from_slice(&[0, 0]);
        d
    }

    fn agree(buf: &[u8]) -> Result<(), TestCaseError> {
        let b = Bytes::copy_from_slice(buf);
        let decoded = decode(&b);
        let batch = Batch::new(b.clone());
        match (&decoded, batch) {
            (Ok((h, msgs)), Ok(batch)) => {
                prop_assert_eq!(h, batch.header());
                // In bulk, in two uneven steps, as the receive path does.
                let mut bulk = Vec::new();
                let mut b2 = batch.clone();
                let first = b2.next_into(&mut bulk, 2, None);
                let rest = b2.next_into(&mut bulk, usize::MAX, None);
                prop_assert_eq!(first + rest, msgs.len());
                prop_assert_eq!(msgs, &bulk);
                let lazy: Vec<Message> = batch.collect();
                prop_assert_eq!(msgs, &lazy);
            }
            (Err(a), Err(b)) => prop_assert_eq!(a, &b),
            (a, b) => prop_assert!(
                false,
                "decode {:?} but validate {:?}",
                a.as_ref().err(),
                b.err()
            ),
        }
        Ok(())
    }

    /// Found by CI: a flipped byte turned the float field into NaN, and
    /// NaN != NaN made two identical decodes compare unequal.
    #[test]
    fn regression_nan_field_decodes_equal() {
        let mut d = sample();
        d[65] = 127;
        agree(&d).unwrap();
        let (_, msgs) = decode(&Bytes::from(d)).unwrap();
        let nan = msgs.iter().flat_map(|m| &m.fields).any(|f| match f.value {
            crate::message::Value::Float(x) => x.is_nan(),
            _ => false,
        });
        assert!(nan, "the flip no longer produces a NaN; pick another byte");
    }

    proptest! {
        /// Decoding in place accepts and refuses exactly what
        /// `decode_message` does, with the same error and the same message,
        /// from any start, and leaves the slot alone when it refuses.
        #[test]
        fn decode_message_into_agrees(
            prefix in proptest::collection::vec(any::<u8>(), 0..4),
            tail in proptest::collection::vec(any::<u8>(), 0..40),
            flips in proptest::collection::vec((0usize..60, any::<u8>()), 0..3),
            max_payload in 0usize..64,
        ) {
            let m = Message::new("a.b", "payload").with_kind("t").with_field("k", 1i64);
            let mut enc = Vec::new();
            encode_message(&mut enc, &m, false);
            enc.extend_from_slice(&tail);
            for (at, b) in flips {
                if let Some(x) = enc.get_mut(at) {
                    *x ^= b;
                }
            }
            let whole = Bytes::from([prefix.clone(), enc.clone()].concat());
            let expected = decode_message(&Bytes::from(enc), max_payload);
            let mut slot = Message::new("old", "slot");
            let got = decode_message_into(&whole, prefix.len(), max_payload, &mut slot);
            match expected {
                Ok(e) => {
                    prop_assert_eq!(got, Ok(()));
                    prop_assert_eq!(slot, e);
                }
                Err(e) => {
                    prop_assert_eq!(got, Err(e));
                    prop_assert_eq!(slot, Message::new("old", "slot"));
                }
            }
        }

        /// `validate` + `Batch` accept and refuse exactly what `decode`
        /// does, with the same error, and yield the same messages.
        #[test]
        fn validate_agrees_with_decode(flips in proptest::collection::vec((0usize..200, any::<u8>()), 0..4)) {
            let mut d = sample();
            for (at, v) in flips {
                let n = d.len();
                d[at % n] = v;
            }
            agree(&d)?;
        }

        #[test]
        fn validate_agrees_on_prefixes(cut in 0usize..200) {
            let d = sample();
            agree(&d[..cut.min(d.len())])?;
        }

        #[test]
        fn validate_agrees_on_noise(mut noise in proptest::collection::vec(any::<u8>(), 0..100)) {
            if noise.len() >= HEADER_LEN {
                noise[..4].copy_from_slice(&[b'S', b'K', VERSION, 1]);
            }
            agree(&noise)?;
        }
    }
}
