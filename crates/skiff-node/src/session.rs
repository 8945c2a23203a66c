//! One client's session, sans I/O: what every front end (TCP, Unix
//! socket, shared memory, and later other protocols) turns its input into
//! before the broker sees it. It owns no socket, no task and no clock: a
//! driver hands it bytes and asks it what the broker must do next.
//!
//! The session applies, once for every front end, the frame decoder's
//! bounds (no frame above the payload limit plus [`FRAME_OVERHEAD`]), the
//! payload limit of a publish, the grouping of consecutive publishes into
//! runs (at most [`MAX_RUN`], handed to [`crate::Broker::publish_batch`]
//! together: one routing lock and one match per run of a subject), the
//! order of everything else, and the counting of frames. Message limits
//! (subject length and syntax, payload) are then checked by the broker on
//! its one processing path, which every front end and the mesh reach.
//!
//! Polling: feed input with [`Session::poll_event`] until it returns
//! `None` (it needs more input, or the session is closed):
//! - [`Event::Publish`]: a run of publishes is in [`Session::run`]; hand
//!   it to the broker (which empties it) before polling again;
//! - [`Event::Frame`]: any other frame, for [`crate::Broker::handle`];
//! - [`Event::Close`]: the client broke the protocol; close it with this
//!   error. Nothing more is read.
//!
//! Any run read before a frame or an error is handed out first, so the
//! broker sees the client's frames in the order they were sent.
//!
//! In-process clients (`mem://`) hand decoded frames one at a time, from
//! many tasks at once: they have no bytes to bound and no run to gather,
//! so they enter the same processing path (`listen::handle`) without a
//! session of their own, which would cost a lock per frame.
//!
//! A front end with a protocol of its own (the NATS listener to come)
//! parses into the same session with [`Session::handle_publish`],
//! [`Session::handle_frame`] and [`Session::handle_error`]: a new front end
//! adds a parser, not a broker path. A payload stays a slice of what was
//! read (`bytes::Bytes`), never copied here.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use skiff_proto::client_frame::{is_pub, ClientFrame, Code, Decoder, FRAME_OVERHEAD};
use skiff_proto::WireError;

use crate::broker::{LastSubject, Published};
use crate::config::Limits;

/// Most publishes in one run handed to the broker: a bound on what one
/// client holds back from the broker while it reads on.
pub const MAX_RUN: usize = 1024;

/// What the broker must do next for a session's client (see the module
/// documentation for the order).
// A frame is moved once from the decoder to the broker, never stored in
// bulk: boxing it would cost an allocation per frame.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Event {
    /// Publishes, in order, are in [`Session::run`]: hand them to
    /// [`crate::Broker::publish_batch`] before polling again.
    Publish,
    /// A frame other than a publish, for [`crate::Broker::handle`].
    Frame(ClientFrame),
    /// The client broke the protocol: close it with this error.
    Close(Code, String),
}

/// Where a session reads the skiff client protocol from: each kind of
/// buffer splits into frame bodies with the same bounded decoder.
pub trait Input {
    /// The next frame body, removed from `self`; `Ok(None)` when `self`
    /// holds no whole frame (more is needed, or it is empty).
    fn next_body(&mut self, dec: &Decoder) -> Result<Option<Bytes>, WireError>;
}

/// A stream's read buffer (TCP, Unix socket): a frame may be cut anywhere;
/// what is left waits for the next read (the decoder reserves room for the
/// rest of a frame it has begun).
impl Input for BytesMut {
    fn next_body(&mut self, dec: &Decoder) -> Result<Option<Bytes>, WireError> {
        dec.next(self)
    }
}

/// A segment of whole frames (shared memory): each body is a slice of the
/// segment, with no copy; a frame cut short is an error.
impl Input for Bytes {
    fn next_body(&mut self, dec: &Decoder) -> Result<Option<Bytes>, WireError> {
        dec.split(self)
    }
}

/// One client's session (see the module documentation).
#[derive(Debug)]
pub struct Session {
    dec: Decoder,
    max_payload: usize,
    /// How an error names what it closes ("connection", "client").
    closing: &'static str,
    run: Vec<Published>,
    /// The subject of the client's last publish (checked once per run of
    /// publishes on one subject).
    last_subject: LastSubject,
    /// What was read after the run, handed out once the run is.
    held: Option<Event>,
    closed: bool,
    frames: u64,
    /// Publishes read (what `Taken` confirms to a client that asked).
    publishes: u64,
    /// A front end's shared count of frames read, brought up to date
    /// before each event is handed out (so before the broker acts on it).
    counter: Option<Arc<AtomicU64>>,
    /// Frames read and not yet added to `counter`.
    uncounted: u64,
}

impl Session {
    /// A session under `limits`; `closing` names what a protocol error
    /// closes in the error text ("connection", "client").
    pub fn new(limits: &Limits, closing: &'static str) -> Session {
        Session {
            dec: Decoder::new(limits.max_payload + FRAME_OVERHEAD),
            max_payload: limits.max_payload,
            last_subject: LastSubject::default(),
            closing,
            run: Vec::new(),
            held: None,
            closed: false,
            frames: 0,
            publishes: 0,
            counter: None,
            uncounted: 0,
        }
    }

    /// Also counts the frames read into `counter` (a front end's total
    /// over its clients), once per event rather than per frame.
    pub fn count_frames_into(mut self, counter: Arc<AtomicU64>) -> Session {
        self.counter = Some(counter);
        self
    }

    /// Reads frames from `input` until the broker has something to do;
    /// `None` when `input` holds no more whole frames or the session is
    /// closed.
    #[must_use]
    pub fn poll_event<I: Input + ?Sized>(&mut self, input: &mut I) -> Option<Event> {
        let e = self.next_event(input);
        if let (Some(c), true) = (&self.counter, self.uncounted > 0) {
            c.fetch_add(self.uncounted, Relaxed);
            self.uncounted = 0;
        }
        e
    }

    fn next_event<I: Input + ?Sized>(&mut self, input: &mut I) -> Option<Event> {
        if let Some(e) = self.held.take() {
            return Some(e);
        }
        if self.closed {
            return None;
        }
        loop {
            let body = match input.next_body(&self.dec) {
                Ok(Some(b)) => b,
                Ok(None) => return (!self.run.is_empty()).then_some(Event::Publish),
                Err(e) => return Some(self.handle_error(e)),
            };
            self.frames += 1;
            self.uncounted += 1;
            if is_pub(&body) {
                match Published::from_frame_after(body, self.max_payload, &mut self.last_subject) {
                    Ok(p) => {
                        if let Some(e) = self.handle_publish(p) {
                            return Some(e);
                        }
                    }
                    Err(e) => return Some(self.handle_error(e)),
                }
                continue;
            }
            return Some(match ClientFrame::decode(body, self.max_payload) {
                Ok(f) => self.handle_frame(f),
                Err(e) => self.handle_error(e),
            });
        }
    }

    /// A publish read by a parser: joins the current run; `Some` when the
    /// run is full and must go to the broker now.
    #[inline]
    #[must_use]
    pub fn handle_publish(&mut self, p: Published) -> Option<Event> {
        self.publishes += 1;
        self.run.push(p);
        (self.run.len() >= MAX_RUN).then_some(Event::Publish)
    }

    /// Any other frame read by a parser: handed out after the current run.
    #[must_use]
    pub fn handle_frame(&mut self, f: ClientFrame) -> Event {
        self.after_run(Event::Frame(f))
    }

    /// Input that does not parse: the session closes, after the current
    /// run.
    #[must_use]
    pub fn handle_error(&mut self, e: WireError) -> Event {
        self.closed = true;
        let text = format!("protocol error, closing this {}: {e}", self.closing);
        self.after_run(Event::Close(Code::Protocol, text))
    }

    fn after_run(&mut self, e: Event) -> Event {
        if self.run.is_empty() {
            e
        } else {
            self.held = Some(e);
            Event::Publish
        }
    }

    /// The run of publishes an [`Event::Publish`] announced, for
    /// [`crate::Broker::publish_batch`] (which empties it).
    pub fn run(&mut self) -> &mut Vec<Published> {
        &mut self.run
    }

    /// Frames read so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Publishes read so far; once every event up to now was handed to
    /// the broker, the broker has taken them all.
    pub fn publishes(&self) -> u64 {
        self.publishes
    }

    /// Whether the session closed for a protocol error.
    pub fn is_closed(&self) -> bool {
        self.closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_proto::client_frame::encode_pub;
    use skiff_proto::Message;

    fn limits() -> Limits {
        Limits::default()
    }

    fn publish(out: &mut Vec<u8>, subject: &str) {
        encode_pub(out, &Message::new(subject, &b"x"[..]));
    }

    fn frame(out: &mut Vec<u8>, f: &ClientFrame) {
        f.encode(out);
    }

    /// Drains `input`, emptying each run as a broker would; returns what
    /// the broker was asked to do, as (publishes per run | frame | close).
    fn drain<I: Input>(s: &mut Session, input: &mut I) -> Vec<String> {
        let mut seen = Vec::new();
        while let Some(e) = s.poll_event(input) {
            seen.push(match e {
                Event::Publish => {
                    let n = s.run().len();
                    s.run().clear();
                    format!("pub{n}")
                }
                Event::Frame(f) => format!("{f:?}").split(' ').next().unwrap().to_owned(),
                Event::Close(code, _) => format!("close:{code:?}"),
            });
        }
        seen
    }

    fn stream() -> Vec<u8> {
        let mut b = Vec::new();
        publish(&mut b, "a.b");
        publish(&mut b, "a.b");
        frame(&mut b, &ClientFrame::Ping { corr: 1 });
        publish(&mut b, "c");
        b
    }

    #[test]
    fn runs_and_frames_in_order_from_a_stream() {
        let mut s = Session::new(&limits(), "connection");
        let mut buf = BytesMut::from(&stream()[..]);
        assert_eq!(drain(&mut s, &mut buf), ["pub2", "Ping", "pub1"]);
        assert_eq!(s.frames(), 4);
        assert!(buf.is_empty());
    }

    #[test]
    fn every_buffer_shape_gives_the_same_frames_in_order() {
        let bytes = stream();
        for chunk in 1..=bytes.len() {
            let mut s = Session::new(&limits(), "connection");
            let mut buf = BytesMut::new();
            let mut seen = Vec::new();
            for c in bytes.chunks(chunk) {
                buf.extend_from_slice(c);
                seen.extend(drain(&mut s, &mut buf));
            }
            // Runs may be cut where a read ends; the frames and their
            // order are the same.
            let flat: Vec<String> = seen
                .iter()
                .flat_map(|e| match e.strip_prefix("pub") {
                    Some(n) => vec!["pub".to_string(); n.parse().unwrap()],
                    None => vec![e.clone()],
                })
                .collect();
            assert_eq!(flat, ["pub", "pub", "Ping", "pub"], "chunks of {chunk}");
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn a_segment_is_split_in_place() {
        let mut s = Session::new(&limits(), "client");
        let seg = Bytes::from(stream());
        let range = seg.as_ptr() as usize..seg.as_ptr() as usize + seg.len();
        let mut rest = seg.clone();
        let e = s.poll_event(&mut rest);
        assert!(matches!(e, Some(Event::Publish)));
        for p in s.run().iter() {
            assert!(range.contains(&(p.raw.as_ptr() as usize)), "copied");
        }
    }

    #[test]
    fn runs_are_bounded() {
        let mut s = Session::new(&limits(), "connection");
        let mut b = Vec::new();
        for _ in 0..MAX_RUN + 1 {
            publish(&mut b, "a");
        }
        let mut buf = BytesMut::from(&b[..]);
        assert_eq!(
            drain(&mut s, &mut buf),
            [format!("pub{MAX_RUN}"), "pub1".into()]
        );
    }

    #[test]
    fn an_error_comes_after_the_run_before_it_and_ends_the_session() {
        let mut s = Session::new(&limits(), "connection");
        let mut b = Vec::new();
        publish(&mut b, "a");
        b.extend_from_slice(&[0, 0, 0, 0]); // an empty frame
        publish(&mut b, "a");
        let mut buf = BytesMut::from(&b[..]);
        assert_eq!(drain(&mut s, &mut buf), ["pub1", "close:Protocol"]);
        assert!(s.is_closed());
        assert!(s.poll_event(&mut buf).is_none());
    }

    #[test]
    fn a_frame_over_the_bound_is_refused_before_it_is_read() {
        let l = limits();
        let mut s = Session::new(&l, "client");
        let len = (l.max_payload + FRAME_OVERHEAD + 1) as u32;
        let mut buf = BytesMut::from(&len.to_le_bytes()[..]);
        match s.poll_event(&mut buf) {
            Some(Event::Close(Code::Protocol, text)) => {
                assert!(
                    text.starts_with("protocol error, closing this client"),
                    "{text}"
                )
            }
            e => panic!("{e:?}"),
        }
    }
}
