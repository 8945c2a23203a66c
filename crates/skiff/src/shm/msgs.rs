//! Messages over a buffer: one call per message on each side, many
//! messages per segment. A segment's bookkeeping (a reservation, a
//! record, the positions both sides publish) costs tens of nanoseconds and
//! a cache-line transfer between the cores; a message framed inside a
//! segment (`skiff_proto::msgframe`: a 4-byte length, then the bytes)
//! costs a copy of its bytes.
//!
//! [`MsgWriter::send`] takes `more` as `send(2)` takes `MSG_MORE`: with
//! `more` the message waits in the open segment for the ones that follow
//! (it leaves when the segment is full, at the next send without `more`,
//! at [`MsgWriter::flush`] or when the writer is dropped); without it the
//! open segment, this message included, is delivered at once. A producer
//! that streams sets `more` until its burst ends; one that talks
//! request/reply never sets it and pays one segment per message.
//! [`InSegment::messages`] reads them back in place.

use std::borrow::Cow;

use skiff_proto::msgframe::{frame_len, Messages, MSG_PREFIX};

use super::buffer::{InSegment, Output, SegmentMut};
use super::{BufferError, BufferId};

/// Writes messages into segments of one buffer of an [`Output`]; see the
/// module documentation. Flushes when dropped.
#[derive(Debug)]
pub struct MsgWriter<'a> {
    out: &'a mut Output,
    id: BufferId,
    open: Option<SegmentMut>,
    used: usize,
    batch: usize,
    capacity: usize,
    blocking: bool,
    messages: u64,
    segments: u64,
}

impl Output {
    /// A message writer on buffer `id` that packs up to `batch` bytes
    /// into a segment (at most half the buffer, so that the subscribers
    /// can read one segment while the next fills). With `blocking`, a
    /// send waits for credit; without it, a send that finds the
    /// subscribers full returns [`BufferError::WouldBlock`] and took
    /// nothing.
    pub fn messages(
        &mut self,
        id: BufferId,
        batch: usize,
        blocking: bool,
    ) -> Result<MsgWriter<'_>, BufferError> {
        let capacity = self.capacity(id)?;
        Ok(MsgWriter {
            out: self,
            id,
            open: None,
            used: 0,
            batch: batch.clamp(MSG_PREFIX, (capacity / 2).max(MSG_PREFIX)),
            capacity,
            blocking,
            messages: 0,
            segments: 0,
        })
    }
}

impl MsgWriter<'_> {
    /// Writes `msg`; delivers the open segment unless `more` (see the
    /// module documentation). A message longer than the buffer (with its
    /// 4-byte length) is refused with the limit.
    pub fn send(&mut self, msg: &[u8], more: bool) -> Result<(), BufferError> {
        let need = frame_len(msg);
        if need > self.capacity || msg.len() > u32::MAX as usize {
            return Err(BufferError::Usage {
                id: self.id,
                why: format!(
                    "a message of {} bytes (plus its {MSG_PREFIX}-byte length) does not fit the buffer's {} bytes",
                    msg.len(),
                    self.capacity
                ),
            });
        }
        if self
            .open
            .as_ref()
            .is_some_and(|seg| self.used + need > seg.len())
        {
            self.flush()?;
        }
        let seg = match &mut self.open {
            Some(seg) => seg,
            None => {
                let seg = self
                    .out
                    .segment(self.id, need.max(self.batch), self.blocking)?;
                self.used = 0;
                self.open.insert(seg)
            }
        };
        seg.write(self.used, &(msg.len() as u32).to_le_bytes());
        seg.write(self.used + MSG_PREFIX, msg);
        self.used += need;
        self.messages += 1;
        if !more {
            self.flush()?;
        }
        Ok(())
    }

    /// Delivers the open segment, if it holds a message.
    pub fn flush(&mut self) -> Result<(), BufferError> {
        let Some(seg) = self.open.take() else {
            return Ok(());
        };
        let used = std::mem::take(&mut self.used);
        if used == 0 {
            // Dropping it gives the space back.
            return Ok(());
        }
        self.segments += 1;
        self.out.deliver(seg, used)
    }

    /// Messages sent and segments delivered so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.messages, self.segments)
    }
}

impl Drop for MsgWriter<'_> {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

impl<'a> InSegment<'a> {
    /// The messages a [`MsgWriter`] packed into this segment, in place
    /// (a message that straddles the ring's wrap is copied). A frame that
    /// does not parse is an error ([`BufferError::Corrupt`]) and ends the
    /// iteration. Credit flow only, as [`InSegment::slices`].
    pub fn messages(
        &self,
    ) -> Result<impl Iterator<Item = Result<Cow<'_, [u8]>, BufferError>> + '_, BufferError> {
        let (a, b) = self.slices()?;
        let id = self.id();
        Ok(Messages::new(a, b).map(move |m| {
            m.map_err(|e| BufferError::Corrupt {
                id,
                why: e.to_string(),
            })
        }))
    }
}
