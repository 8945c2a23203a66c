//! Reading a topic's buffer in place ([`Client::topic_reader`]): over
//! `shm://`, the node writes each message of a topic once into one ring
//! that every subscriber of the host reads (see [`super::SubOptions::shared_buffer`]).
//! A [`TopicReader`] reads that ring in the application's own thread: no
//! reader thread, no inbox, no [`super::Delivery`] or [`Message`] per
//! message. [`TopicReader::read`] hands each message of a segment to a
//! closure as a [`TopicMessage`], whose subject, type and payload are
//! slices of the ring; the segment goes back to the node once the closure
//! has seen all of its messages.
//!
//! What the subscription's reader thread does is done here, in the
//! caller's thread: frames decoded bounded and total (a bad frame ends the
//! reader with an error), the ring's flow (credits: the node waits for
//! this reader; overwrite: what was overwritten before it was read is
//! counted in [`TopicReader::dropped`]), and reports of what was read and
//! lost to the node every [`REPORT_EVERY`] (`shared_readers` in its
//! stats), sent from within the calls to `read` (a reader not called for
//! a while reports on its next call).

use std::cell::Cell;
use std::time::{Duration, Instant};

use skiff_proto::client_frame::{Decoder, ServerFrame, FRAME_OVERHEAD};
use skiff_proto::credits::Flow;
use skiff_proto::wire::{decode_message_ref, MessageRef};
use skiff_proto::Message;

use super::sub::{check_patterns, SubOptions};
use super::{Client, Code};
use crate::shm::topic::{self, Report, TopicAsk, TopicSeg, REPORT_EVERY};
use crate::shm::BufferError;
use crate::Error;

/// A request's reply token as read in place ([`TopicMessage::reply_token`]),
/// answered with [`Client::reply_to`] on the client that made the reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyToken {
    token: u64,
    epoch: u32,
}

/// One message of a topic, read in place (see the module doc): the
/// message's parts borrowed from the ring, and the reply token of a
/// request. Dereferences to the [`MessageRef`].
#[derive(Debug, Clone, Copy)]
pub struct TopicMessage<'a> {
    msg: MessageRef<'a>,
    token: Option<ReplyToken>,
}

impl<'a> std::ops::Deref for TopicMessage<'a> {
    type Target = MessageRef<'a>;
    fn deref(&self) -> &MessageRef<'a> {
        &self.msg
    }
}

impl TopicMessage<'_> {
    /// Whether the message is a request (answer it with
    /// [`Client::reply_to`] and [`TopicMessage::reply_token`]).
    pub fn is_request(&self) -> bool {
        self.token.is_some()
    }

    /// The reply token of a request (`None` for a published message).
    pub fn reply_token(&self) -> Option<ReplyToken> {
        self.token
    }
}

/// A reader of a topic's buffer in the application's thread (see the
/// module doc). Its calls block the calling thread: call them from a
/// thread of its own (or `spawn_blocking`), not from an async task.
/// Dropping it closes its socket, which tells the node it left. It has no
/// failover: when its node goes, [`TopicReader::read`] fails with an error.
#[derive(Debug)]
pub struct TopicReader {
    r: topic::TopicReader,
    dec: Decoder,
    max_payload: usize,
    epoch: u32,
    counts: Report,
    /// A report held back by the throttle is due then.
    due: Option<Instant>,
    /// Why the reader ended, once it did (every later call says so again).
    end: Option<String>,
}

impl TopicReader {
    /// Reads the next segment of the topic, waiting up to `timeout` for
    /// one, and hands each of its messages, in order, to `f`. Returns how
    /// many messages `f` saw (0 when none came in time). An error once the
    /// node ended the topic, its buffer failed, a frame in it was bad or
    /// the node went away; the reader is then over (the same error again).
    pub fn read<F>(&mut self, timeout: Duration, mut f: F) -> Result<usize, Error>
    where
        F: FnMut(&TopicMessage<'_>),
    {
        let deadline = Instant::now() + timeout;
        self.read_until(&|| Instant::now() >= deadline, &mut f)
    }

    /// As [`TopicReader::read`] without waiting: the messages of the next
    /// segment if one is there now, else `Ok(0)`.
    pub fn try_read<F>(&mut self, mut f: F) -> Result<usize, Error>
    where
        F: FnMut(&TopicMessage<'_>),
    {
        // One look at the ring, then stop.
        let looked = Cell::new(false);
        self.read_until(&|| looked.replace(true), &mut f)
    }

    /// Messages read so far.
    pub fn read_count(&self) -> u64 {
        self.counts.read
    }

    /// Messages lost so far: overwritten before this reader read them
    /// (overwrite flow; never with credits). Reported to the node too.
    pub fn dropped(&self) -> u64 {
        self.counts.dropped
    }

    /// Why the reader ended, once it did.
    pub fn error(&self) -> Option<&str> {
        self.end.as_deref()
    }

    fn read_until(
        &mut self,
        stop: &dyn Fn() -> bool,
        f: &mut dyn FnMut(&TopicMessage<'_>),
    ) -> Result<usize, Error> {
        if let Some(why) = &self.end {
            return Err(ended(why.clone()));
        }
        loop {
            let due = self.due;
            let look = || stop() || due.is_some_and(|t| Instant::now() >= t);
            match self.r.next(&look) {
                Ok(TopicSeg::Frames(seg)) => {
                    let (n, res) = deliver(&self.dec, self.max_payload, self.epoch, &seg, f);
                    // The segment goes back to the node here.
                    drop(seg);
                    self.counts.read += n as u64;
                    if let Err(e) = res {
                        return Err(
                            self.finish(format!("bad frame in the node's topic buffer: {e}"))
                        );
                    }
                    self.report(false);
                    if n > 0 {
                        return Ok(n);
                    }
                }
                Ok(TopicSeg::Lost(n)) => {
                    self.counts.dropped += n;
                    self.report(false);
                }
                Ok(TopicSeg::Idle) => {
                    if self.due.is_some_and(|t| Instant::now() >= t) {
                        self.report(true);
                    }
                    if stop() {
                        return Ok(0);
                    }
                }
                Err(BufferError::Closed { .. }) => {
                    return Err(self.finish("the node ended the topic".into()))
                }
                Err(e) => return Err(self.finish(format!("the node's topic buffer failed: {e}"))),
            }
        }
    }

    /// Tells the node the counts (see `topic::TopicReader::report`); one
    /// held back by the throttle is due [`REPORT_EVERY`] later.
    fn report(&mut self, now: bool) {
        if self.r.report(self.counts, now) {
            self.due = None;
        } else if now || self.due.is_none() {
            self.due = Some(Instant::now() + REPORT_EVERY);
        }
    }

    fn finish(&mut self, why: String) -> Error {
        self.end = Some(why.clone());
        ended(why)
    }
}

fn ended(reason: String) -> Error {
    Error::Refused {
        code: Code::Shutdown,
        reason,
    }
}

/// Hands the messages of one segment's frames to `f`, in order; returns
/// how many it saw. The node's other frames to the topic (its welcome)
/// are skipped.
fn deliver(
    dec: &Decoder,
    max_payload: usize,
    epoch: u32,
    seg: &[u8],
    f: &mut dyn FnMut(&TopicMessage<'_>),
) -> (usize, Result<(), String>) {
    let mut rest = seg;
    let mut n = 0;
    loop {
        match dec.split_slice(&mut rest) {
            Ok(Some(body)) => match ServerFrame::msg_header(body) {
                Ok(Some((_, token, at))) => match decode_message_ref(body, at, max_payload) {
                    Ok(msg) => {
                        let token = (token != 0).then_some(ReplyToken { token, epoch });
                        f(&TopicMessage { msg, token });
                        n += 1;
                    }
                    Err(e) => return (n, Err(e.to_string())),
                },
                Ok(None) => {}
                Err(e) => return (n, Err(e.to_string())),
            },
            Ok(None) => return (n, Ok(())),
            Err(e) => return (n, Err(e.to_string())),
        }
    }
}

impl Client {
    /// Opens a reader of the node's buffer of the topic `pattern` and
    /// `kind` ([`super::SubOptions::shared_buffer`]) to be read in place in
    /// the caller's thread ([`TopicReader`]); the flow is
    /// `opts.shared` (credits when unset); the window, queue and policy do
    /// not apply (the ring is the reader's window; the topic's queue in
    /// the node has its own). Over `shm://` only, with token patterns: any
    /// other transport or pattern syntax is refused.
    pub async fn topic_reader(
        &self,
        pattern: &str,
        kind: &str,
        opts: SubOptions,
    ) -> Result<TopicReader, Error> {
        check_patterns(opts.syntax, pattern, kind)?;
        let invalid = |reason: String| Error::Refused {
            code: Code::Invalid,
            reason,
        };
        if opts.syntax != skiff_proto::router::Syntax::Tokens {
            return Err(invalid(
                "a topic's buffer is read with token patterns only, not cMsg patterns".into(),
            ));
        }
        let loc = self.node().unwrap_or_default();
        if !loc.starts_with("shm://") {
            return Err(invalid(format!(
                "reading a topic in place needs a node over shm:// (this client is at {loc:?})"
            )));
        }
        let place = crate::shm::attach::parse(&loc)?;
        let ask = TopicAsk {
            flow: opts.shared.unwrap_or(Flow::Credits),
            pattern: pattern.into(),
            kind: kind.into(),
        };
        let r = topic::TopicReader::open(&place, &ask)
            .await
            .map_err(|why| Error::Io {
                what: "open the node's buffer of the topic",
                source: std::io::Error::other(why),
            })?;
        let max_payload = self.max_payload();
        Ok(TopicReader {
            dec: Decoder::new(r.max_frame.min((max_payload + FRAME_OVERHEAD) as u64) as usize),
            r,
            max_payload,
            epoch: self.inner.epoch(),
            counts: Report::default(),
            due: None,
            end: None,
        })
    }

    /// Answers a request read in place ([`TopicMessage::reply_token`]).
    /// A reply to a request no longer waited for is dropped by the node.
    pub async fn reply_to(&self, to: ReplyToken, msg: Message) -> Result<(), Error> {
        self.inner.reply(to.token, to.epoch, msg).await
    }
}
