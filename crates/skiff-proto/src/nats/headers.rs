//! NATS message headers: a block in HTTP/1 style after a version line
//! that may carry a status.
//!
//! ```text
//! NATS/1.0[ <status>[ <description>]]\r\n
//! <Name>: <value>\r\n ...
//! \r\n
//! ```
//!
//! [`parse_headers`] is total and bounded (at most [`MAX_HEADERS`]
//! headers; names and values are slices of the block, not copies).

use bytes::Bytes;

/// Most headers read from one message (skiff's limit on fields).
pub const MAX_HEADERS: usize = crate::wire::MAX_FIELDS;

/// A parsed header block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    /// The status on the version line (e.g. 503), if any.
    pub status: Option<u16>,
    /// The words after the status.
    pub description: Bytes,
    /// `(name, value)` in order; a name may repeat.
    pub fields: Vec<(Bytes, Bytes)>,
}

/// Why a header block does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// The block does not start with `NATS/1.0`.
    #[error("header block does not start with NATS/1.0")]
    Version,
    /// The block does not end with an empty line.
    #[error("header block does not end with CRLF CRLF")]
    End,
    /// A line has no `:`, or a name is empty or holds spaces.
    #[error("malformed header line")]
    Line,
    /// More than [`MAX_HEADERS`] headers.
    #[error("more than {MAX_HEADERS} headers")]
    TooMany,
}

/// Parses a header block (as an `HPUB` carries it).
pub fn parse_headers(block: &Bytes) -> Result<Headers, HeaderError> {
    let body = block.strip_suffix(b"\r\n\r\n").ok_or(HeaderError::End)?;
    let mut lines = body
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let first = lines.next().ok_or(HeaderError::Version)?;
    let rest = first
        .strip_prefix(b"NATS/1.0")
        .ok_or(HeaderError::Version)?;
    let mut h = Headers::default();
    let rest = trim(rest);
    if !rest.is_empty() {
        let (code, desc) = match rest.iter().position(|&b| b == b' ') {
            Some(i) => (&rest[..i], trim(&rest[i..])),
            None => (rest, &b""[..]),
        };
        if code.len() == 3 && code.iter().all(u8::is_ascii_digit) {
            h.status = Some(code.iter().fold(0u16, |n, &c| n * 10 + u16::from(c - b'0')));
            h.description = block.slice_ref(desc);
        } else {
            h.description = block.slice_ref(rest);
        }
    }
    for line in lines {
        if line.is_empty() {
            continue;
        }
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or(HeaderError::Line)?;
        let name = &line[..colon];
        if name.is_empty() || name.iter().any(|&b| b <= b' ' || b == 127) {
            return Err(HeaderError::Line);
        }
        if h.fields.len() == MAX_HEADERS {
            return Err(HeaderError::TooMany);
        }
        let value = trim(&line[colon + 1..]);
        h.fields
            .push((block.slice_ref(name), block.slice_ref(value)));
    }
    Ok(h)
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|&c| c != b' ' && c != b'\t')
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|&c| c != b' ' && c != b'\t')
        .map_or(start, |e| e + 1);
    &b[start..end.max(start)]
}

/// Appends a header block: the version line with `status` (and its
/// description) if given, each `(name, value)`, the empty line. Carriage
/// returns and line feeds in names and values are written as spaces, so
/// the block always parses back.
pub fn write_headers<'a>(
    out: &mut Vec<u8>,
    status: Option<(u16, &str)>,
    fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
) {
    out.extend_from_slice(b"NATS/1.0");
    if let Some((code, desc)) = status {
        out.push(b' ');
        super::push_num(out, u64::from(code));
        if !desc.is_empty() {
            out.push(b' ');
            clean(out, desc.as_bytes());
        }
    }
    out.extend_from_slice(b"\r\n");
    for (name, value) in fields {
        let start = out.len();
        clean(out, name);
        for b in &mut out[start..] {
            if *b == b':' || *b == b' ' {
                *b = b'-';
            }
        }
        out.extend_from_slice(b": ");
        clean(out, value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

fn clean(out: &mut Vec<u8>, s: &[u8]) {
    out.extend(
        s.iter()
            .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
    );
}
