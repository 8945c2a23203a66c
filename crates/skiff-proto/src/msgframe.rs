//! Messages framed inside a buffer segment: each is a 4-byte little-endian
//! length and that many bytes, back to back; a segment holds whole
//! messages only. Used by the buffer API's message layer
//! (`skiff::shm::MsgWriter` packs them, `InSegment::messages` reads them),
//! so that many small messages share one segment's bookkeeping.
//!
//! ```text
//! | len (u32 LE) | len bytes | len (u32 LE) | len bytes | ...
//! ```
//!
//! A segment may wrap around its ring, so it is given as two slices; a
//! message that straddles them is copied (once per lap of the ring), all
//! others are borrowed in place. The reader is total: a length that runs
//! past the segment, or a segment that ends inside a length, is an error
//! and ends the iteration; nothing is allocated beyond the one straddling
//! message, which is no longer than the segment.

use std::borrow::Cow;

/// Bytes of a message's length prefix.
pub const MSG_PREFIX: usize = 4;

/// Why a segment's messages do not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The segment ends inside a length prefix.
    #[error("message {index}: the segment ends inside its length ({left} bytes left)")]
    CutPrefix {
        /// The message's index in the segment.
        index: u64,
        /// Bytes left in the segment.
        left: usize,
    },
    /// A length runs past the end of the segment.
    #[error("message {index}: length {len} runs past the segment ({left} bytes left)")]
    TooLong {
        /// The message's index in the segment.
        index: u64,
        /// The length read.
        len: u64,
        /// Bytes left after the prefix.
        left: usize,
    },
}

/// The bytes a message takes in a segment: its length prefix and itself.
pub fn frame_len(msg: &[u8]) -> usize {
    MSG_PREFIX + msg.len()
}

/// The messages of a segment given as its two slices (the second empty
/// unless the segment wraps).
#[derive(Debug, Clone)]
pub struct Messages<'a> {
    a: &'a [u8],
    b: &'a [u8],
    index: u64,
    failed: bool,
}

impl<'a> Messages<'a> {
    /// The messages of the segment `a` followed by `b`.
    pub fn new(a: &'a [u8], b: &'a [u8]) -> Messages<'a> {
        Messages {
            a,
            b,
            index: 0,
            failed: false,
        }
    }

    fn left(&self) -> usize {
        self.a.len() + self.b.len()
    }

    /// Takes `n` bytes (`n <= left`), borrowed unless they straddle.
    fn take(&mut self, n: usize) -> Cow<'a, [u8]> {
        if self.a.is_empty() {
            let (x, rest) = self.b.split_at(n);
            self.b = rest;
            return Cow::Borrowed(x);
        }
        if n <= self.a.len() {
            let (x, rest) = self.a.split_at(n);
            self.a = rest;
            return Cow::Borrowed(x);
        }
        let mut v = Vec::with_capacity(n);
        v.extend_from_slice(self.a);
        let (x, rest) = self.b.split_at(n - self.a.len());
        v.extend_from_slice(x);
        self.a = &[];
        self.b = rest;
        Cow::Owned(v)
    }

    fn fail(&mut self, e: FrameError) -> Option<Result<Cow<'a, [u8]>, FrameError>> {
        self.failed = true;
        self.a = &[];
        self.b = &[];
        Some(Err(e))
    }
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<Cow<'a, [u8]>, FrameError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let left = self.left();
        if left == 0 {
            return None;
        }
        let index = self.index;
        if left < MSG_PREFIX {
            return self.fail(FrameError::CutPrefix { index, left });
        }
        let len = match self.a.first_chunk::<MSG_PREFIX>() {
            Some(p) => {
                let len = u32::from_le_bytes(*p);
                self.a = &self.a[MSG_PREFIX..];
                len
            }
            None => {
                let p = self.take(MSG_PREFIX);
                u32::from_le_bytes([p[0], p[1], p[2], p[3]])
            }
        };
        let left = self.left();
        if len as usize > left {
            return self.fail(FrameError::TooLong {
                index,
                len: len.into(),
                left,
            });
        }
        self.index += 1;
        Some(Ok(self.take(len as usize)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(msgs: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in msgs {
            out.extend_from_slice(&(m.len() as u32).to_le_bytes());
            out.extend_from_slice(m);
        }
        out
    }

    #[test]
    fn empty_segment_has_no_messages() {
        assert_eq!(Messages::new(&[], &[]).count(), 0);
    }

    #[test]
    fn cut_prefix_and_long_length_are_errors_that_end_the_iteration() {
        let mut m = Messages::new(&[1, 0, 0, 0, 7, 2, 0], &[]);
        assert_eq!(m.next(), Some(Ok(Cow::Borrowed(&[7u8][..]))));
        assert_eq!(
            m.next(),
            Some(Err(FrameError::CutPrefix { index: 1, left: 2 }))
        );
        assert_eq!(m.next(), None);
        let mut m = Messages::new(&[9, 0, 0, 0, 1], &[2]);
        assert_eq!(
            m.next(),
            Some(Err(FrameError::TooLong {
                index: 0,
                len: 9,
                left: 2
            }))
        );
        assert_eq!(m.next(), None);
        let huge = [0xff, 0xff, 0xff, 0xff];
        assert!(matches!(
            Messages::new(&huge, &[]).next(),
            Some(Err(FrameError::TooLong { .. }))
        ));
    }

    proptest! {
        /// Every split of a segment into two slices reads back the same
        /// messages; only a straddling message is copied.
        #[test]
        fn messages_round_trip_across_any_wrap(
            msgs in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..20),
            cut in any::<prop::sample::Index>(),
        ) {
            let seg = frame(&msgs);
            let at = cut.index(seg.len() + 1);
            let (a, b) = seg.split_at(at);
            let got: Vec<Vec<u8>> = Messages::new(a, b)
                .map(|m| m.expect("well formed").into_owned())
                .collect();
            prop_assert_eq!(got, msgs);
        }

        /// Arbitrary bytes: never a panic, and the messages returned lie
        /// within the segment.
        #[test]
        fn arbitrary_bytes_are_total(
            seg in prop::collection::vec(any::<u8>(), 0..64),
            cut in any::<prop::sample::Index>(),
        ) {
            let at = cut.index(seg.len() + 1);
            let (a, b) = seg.split_at(at);
            let mut total = 0;
            for m in Messages::new(a, b) {
                match m {
                    Ok(m) => total += MSG_PREFIX + m.len(),
                    Err(_) => break,
                }
            }
            prop_assert!(total <= seg.len());
        }
    }
}
