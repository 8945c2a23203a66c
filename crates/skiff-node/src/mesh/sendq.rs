//! The bounded send queue of the reliable link to one peer: node frames
//! (publishes, requests, replies, done reports, broadcasts) wait here,
//! packed into batches, until the association to the peer has room.
//!
//! - **Batching**: frames are appended to the open batch (a `nodes`
//!   tunnel frame, [`skiff_proto::mesh::tunnel_frame`]) until it reaches
//!   [`BATCH`] bytes; the mesh task hands every batch to the association
//!   when it goes idle, so a burst shares association messages and a lone
//!   frame leaves at once (CMQ's natural batching).
//! - **Bound and policy**: at most `max_bytes` wait. Over it, `drop_newest`
//!   (and `block` once its deadline passed) refuses the frame, and
//!   `drop_oldest` drops whole batches from the head; either way every
//!   frame dropped is counted, per subject too (bounded).
//! - **In flight**: what was handed to the association is remembered by
//!   its end offset, so when the peer dies the frames not known to be
//!   acknowledged can be counted as possibly lost.

use std::collections::VecDeque;

use bytes::Bytes;
use rustc_hash::FxHashMap;
use serde::Deserialize;
use skiff_proto::mesh::node_frame::op;
use skiff_proto::mesh::tunnel_frame::op::NODES;
use skiff_proto::stats::LinkStats;
use skiff_proto::varint;

/// A batch is sealed once it holds this many bytes (a larger frame makes a
/// batch of its own).
pub(crate) const BATCH: usize = 64 << 10;

/// Most subjects whose drops are counted apart; the rest go to `(other)`.
const MAX_SUBJECTS: usize = 256;

/// What a full send queue to a peer does (`send_policy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SendPolicy {
    /// The publisher waits for room, up to `send_deadline_ms`; after that
    /// the queue drops arriving frames until it has drained to half.
    #[default]
    Block,
    /// Drop the oldest batch waiting to make room.
    DropOldest,
    /// Drop the arriving frame.
    DropNewest,
}

impl SendPolicy {
    /// The setting's spelling.
    pub fn name(self) -> &'static str {
        match self {
            SendPolicy::Block => "block",
            SendPolicy::DropOldest => "drop_oldest",
            SendPolicy::DropNewest => "drop_newest",
        }
    }

    /// Parses a setting's value.
    pub fn parse(s: &str) -> Option<SendPolicy> {
        Some(match s {
            "block" => SendPolicy::Block,
            "drop_oldest" => SendPolicy::DropOldest,
            "drop_newest" => SendPolicy::DropNewest,
            _ => return None,
        })
    }
}

#[derive(Debug)]
struct Batch {
    /// The `nodes` op byte, then frames (varint length + bytes); a
    /// spliced frame's body is not here but in `refs`.
    buf: Vec<u8>,
    /// Spliced bodies: (offset in `buf` they follow, bytes), in order.
    refs: Vec<(usize, Bytes)>,
    /// Bytes of the batch (`buf` and `refs`).
    len: usize,
    frames: u32,
}

impl Batch {
    /// The batch as the parts of one association message: `buf` cut at
    /// each spliced body's place, the bodies between (no copy).
    fn into_parts(self) -> Vec<Bytes> {
        if self.refs.is_empty() {
            return vec![Bytes::from(self.buf)];
        }
        let buf = Bytes::from(self.buf);
        let mut parts = Vec::with_capacity(2 * self.refs.len() + 1);
        let mut at = 0;
        for (off, body) in self.refs {
            parts.push(buf.slice(at..off));
            parts.push(body);
            at = off;
        }
        parts.push(buf.slice(at..));
        parts
    }

    /// The frames' bytes in one buffer (a copy; only to count the drops
    /// of a spliced batch per subject).
    fn joined(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        let mut at = 0;
        for (off, body) in &self.refs {
            v.extend_from_slice(&self.buf[at..*off]);
            v.extend_from_slice(body);
            at = *off;
        }
        v.extend_from_slice(&self.buf[at..]);
        v
    }
}

/// A batch taken from the queue for the association: its parts.
#[derive(Debug)]
pub(crate) struct Popped {
    /// The parts of one association message (one part unless spliced).
    pub(crate) parts: Vec<Bytes>,
    /// Their total length.
    pub(crate) len: usize,
    /// Frames in it.
    pub(crate) frames: u32,
}

/// A spliced body is at least this long: below, a copy into the batch is
/// cheaper than the extra chunk header the part costs in packets (and a
/// batch that fits one packet is delivered without reassembly).
pub(crate) const SPLICE_MIN: usize = 1024;

/// What [`SendQueue::push`] did with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// Queued (perhaps after dropping older batches).
    Queued,
    /// Dropped (counted): the queue was full.
    Dropped,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct SendQueue {
    batches: VecDeque<Batch>,
    /// A batch the association had no room for, offered again first.
    back: Option<Popped>,
    bytes: usize,
    frames: u64,
    max_bytes: usize,
    policy: SendPolicy,
    /// `block` after its deadline: drop newest until drained to half.
    stalled: bool,
    /// Handed to the association: (end offset, frames), oldest first.
    sent: VecDeque<(u64, u32)>,
    sent_bytes: u64,
    stats: LinkStats,
    subjects: FxHashMap<String, u64>,
}

impl SendQueue {
    pub(crate) fn new(max_bytes: usize, policy: SendPolicy) -> SendQueue {
        SendQueue {
            batches: VecDeque::new(),
            back: None,
            bytes: 0,
            frames: 0,
            max_bytes,
            policy,
            stalled: false,
            sent: VecDeque::new(),
            sent_bytes: 0,
            stats: LinkStats {
                policy: policy.name().into(),
                max_bytes: max_bytes as u64,
                ..LinkStats::default()
            },
            subjects: FxHashMap::default(),
        }
    }

    /// Whether a frame of `len` bytes fits now. Under `block` (not
    /// stalled) publishers wait once `max_bytes` are queued, and what they
    /// had already handed over may take the queue to twice that.
    pub(crate) fn has_room(&self, len: usize) -> bool {
        let limit = if self.policy == SendPolicy::Block && !self.stalled {
            self.max_bytes.saturating_mul(2)
        } else {
            self.max_bytes
        };
        self.bytes + len + 16 <= limit || self.bytes == 0
    }

    /// Whether a publisher should wait for room: `block`, full, and not
    /// stalled by a deadline that passed.
    pub(crate) fn should_wait(&self) -> bool {
        self.policy == SendPolicy::Block && !self.stalled && self.bytes >= self.max_bytes
    }

    /// A waiting publisher's deadline passed: drop newest until drained.
    pub(crate) fn stall(&mut self) {
        if self.policy == SendPolicy::Block && !self.stalled {
            self.stalled = true;
            self.stats.deadlines += 1;
        }
    }

    /// Counts a publisher's wait for room.
    pub(crate) fn waited(&mut self) {
        self.stats.waits += 1;
    }

    /// Queues the frame made of `parts` (a publish's subject is `subject`,
    /// for the drop counters).
    pub(crate) fn push(&mut self, parts: &[&[u8]], subject: Option<&str>) -> Pushed {
        self.push_with(parts, None, subject)
    }

    /// Queues the frame `head` then `body` where `body` is kept by
    /// reference (spliced: not copied into the batch) when it is at least
    /// [`SPLICE_MIN`] bytes. The reference holds `body`'s memory (a
    /// shared-memory client's ring space) until the association lets go
    /// of it: acknowledged, or the peer lost.
    pub(crate) fn push_spliced(
        &mut self,
        head: &[u8],
        body: &Bytes,
        subject: Option<&str>,
    ) -> Pushed {
        if body.len() < SPLICE_MIN {
            return self.push_with(&[head, body], None, subject);
        }
        self.push_with(&[head], Some(body), subject)
    }

    fn push_with(
        &mut self,
        parts: &[&[u8]],
        body: Option<&Bytes>,
        subject: Option<&str>,
    ) -> Pushed {
        let len: usize = parts.iter().map(|p| p.len()).sum::<usize>() + body.map_or(0, |b| b.len());
        let need = varint::len(len as u64) + len;
        if !self.has_room(need) {
            if self.policy == SendPolicy::DropOldest {
                while !self.has_room(need) {
                    let Some(b) = self.batches.pop_front() else {
                        break;
                    };
                    self.bytes -= b.len;
                    self.frames -= u64::from(b.frames);
                    self.stats.dropped_oldest += u64::from(b.frames);
                    self.count_dropped(&b);
                }
            }
            if !self.has_room(need) {
                self.stats.dropped_newest += 1;
                self.count_subject(subject.unwrap_or_else(|| other_name(parts)), 1);
                return Pushed::Dropped;
            }
        }
        let open = self
            .batches
            .back()
            .is_some_and(|b| b.len + need <= BATCH || b.frames == 0);
        if !open {
            let copied = need - body.map_or(0, |b| b.len());
            let mut buf = Vec::with_capacity(copied.clamp(BATCH / 4, BATCH) + 1);
            buf.push(NODES);
            self.batches.push_back(Batch {
                buf,
                refs: Vec::new(),
                len: 1,
                frames: 0,
            });
            self.bytes += 1;
        }
        let b = self.batches.back_mut().expect("one open");
        varint::put(&mut b.buf, len as u64);
        for p in parts {
            b.buf.extend_from_slice(p);
        }
        if let Some(body) = body {
            b.refs.push((b.buf.len(), body.clone()));
            self.stats.spliced += 1;
        }
        b.len += need;
        b.frames += 1;
        self.bytes += need;
        self.frames += 1;
        Pushed::Queued
    }

    /// The oldest batch, to offer to the association (put back with
    /// [`SendQueue::unpop`] if it has no room).
    pub(crate) fn pop(&mut self) -> Option<Popped> {
        if let Some(p) = self.back.take() {
            self.bytes -= p.len;
            self.frames -= u64::from(p.frames);
            return Some(p);
        }
        let b = self.batches.pop_front()?;
        self.bytes -= b.len;
        self.frames -= u64::from(b.frames);
        let (len, frames) = (b.len, b.frames);
        Some(Popped {
            parts: b.into_parts(),
            len,
            frames,
        })
    }

    /// Puts back a batch [`SendQueue::pop`] gave (the association had no
    /// room): it is offered first next time.
    pub(crate) fn unpop(&mut self, p: Popped) {
        self.bytes += p.len;
        self.frames += u64::from(p.frames);
        debug_assert!(self.back.is_none(), "one batch offered at a time");
        self.back = Some(p);
    }

    /// The association took a batch of `len` bytes and `frames` frames.
    pub(crate) fn sent(&mut self, len: usize, frames: u32) {
        self.sent_bytes += len as u64;
        self.sent.push_back((self.sent_bytes, frames));
        self.stats.sent_frames += u64::from(frames);
        self.stats.sent_batches += 1;
        if self.stalled && self.bytes <= self.max_bytes / 2 {
            self.stalled = false;
        }
    }

    /// Forgets batches the association holds no more (`buffered`: its
    /// bytes accepted and not yet acknowledged).
    pub(crate) fn acked(&mut self, buffered: usize) {
        let upto = self.sent_bytes.saturating_sub(buffered as u64);
        while self.sent.front().is_some_and(|&(end, _)| end <= upto) {
            self.sent.pop_front();
        }
    }

    /// The peer or its association is gone: every frame queued, and every
    /// frame handed over and not known to be acknowledged, is counted lost.
    /// Returns how many.
    pub(crate) fn lose_all(&mut self) -> u64 {
        let mut n = self.frames;
        n += self.sent.iter().map(|&(_, f)| u64::from(f)).sum::<u64>();
        let batches = std::mem::take(&mut self.batches);
        for b in &batches {
            self.count_dropped(b);
        }
        if let Some(p) = self.back.take() {
            let joined: Vec<u8> = p.parts.iter().flat_map(|x| x.iter().copied()).collect();
            self.count_batch(&joined);
        }
        self.sent.clear();
        self.bytes = 0;
        self.frames = 0;
        self.stats.lost += n;
        n
    }

    /// The association failed (the peer is still up): frames handed to it
    /// and not known to be acknowledged are counted lost; queued ones wait
    /// for the next association. Returns how many were lost.
    pub(crate) fn lose_in_flight(&mut self) -> u64 {
        let n = self.sent.iter().map(|&(_, f)| u64::from(f)).sum::<u64>();
        self.sent.clear();
        self.stats.lost += n;
        n
    }

    /// The association refused a batch as too large (it cannot be: the
    /// link's bound is larger than any frame): counted lost.
    pub(crate) fn refused(&mut self, frames: u32) {
        self.stats.lost += u64::from(frames);
    }

    /// Whether frames wait.
    pub(crate) fn has_frames(&self) -> bool {
        !self.batches.is_empty() || self.back.is_some()
    }

    /// Counts frames received over the peer's association.
    pub(crate) fn received(&mut self, n: u64) {
        self.stats.recv_frames += n;
    }

    /// Counters, for `skiff stats --mesh`.
    pub(crate) fn stats(&self, peer: String) -> LinkStats {
        let mut subjects: Vec<(String, u64)> =
            self.subjects.iter().map(|(s, n)| (s.clone(), *n)).collect();
        subjects.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        subjects.truncate(32);
        LinkStats {
            peer,
            queued_frames: self.frames,
            queued_bytes: self.bytes as u64,
            dropped_subjects: subjects,
            ..self.stats.clone()
        }
    }

    fn count_subject(&mut self, subject: &str, n: u64) {
        if let Some(c) = self.subjects.get_mut(subject) {
            *c += n;
        } else if self.subjects.len() < MAX_SUBJECTS {
            self.subjects.insert(subject.to_owned(), n);
        } else {
            *self.subjects.entry("(other)".into()).or_default() += n;
        }
    }

    /// Counts the frames of a dropped batch per subject (a drop is rare:
    /// the frames are decoded only then).
    /// Counts a dropped batch's frames per subject.
    fn count_dropped(&mut self, b: &Batch) {
        if b.refs.is_empty() {
            self.count_batch(&b.buf);
        } else {
            self.count_batch(&b.joined());
        }
    }

    fn count_batch(&mut self, buf: &[u8]) {
        let Ok((frames, _)) =
            skiff_proto::mesh::Frames::checked(Bytes::copy_from_slice(&buf[1..]), usize::MAX)
        else {
            return;
        };
        for f in frames {
            let name = if f.first() == Some(&op::PUB) {
                skiff_proto::wire::decode_message(&f.slice(1..), usize::MAX)
                    .map(|m| m.subject.to_string())
                    .unwrap_or_else(|_| "(other)".into())
            } else {
                other_name(&[&f]).to_owned()
            };
            self.count_subject(&name, 1);
        }
    }
}

/// The drop counter's name of a frame with no subject of its own.
fn other_name(parts: &[&[u8]]) -> &'static str {
    match parts.iter().find(|p| !p.is_empty()).and_then(|p| p.first()) {
        Some(&op::REQ) => "(request)",
        Some(&op::REPLY) | Some(&op::DONE) => "(reply)",
        Some(&op::BCAST) => "(broadcast)",
        Some(&op::GROUP) => "(queue group)",
        _ => "(other)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_proto::Message;

    fn publish(subject: &str, payload: usize) -> Vec<u8> {
        let mut raw = vec![op::PUB];
        skiff_proto::wire::encode_message(
            &mut raw,
            &Message::new(subject, vec![7u8; payload]),
            false,
        );
        raw
    }

    /// Pops a batch as one buffer (its parts joined).
    fn pop1(q: &mut SendQueue) -> Option<(Bytes, u32)> {
        let p = q.pop()?;
        let joined: Vec<u8> = p.parts.iter().flat_map(|x| x.iter().copied()).collect();
        assert_eq!(joined.len(), p.len);
        Some((Bytes::from(joined), p.frames))
    }

    #[test]
    fn spliced_bodies_are_referenced_not_copied_and_let_go_with_the_batch() {
        let mut q = SendQueue::new(1 << 20, SendPolicy::Block);
        let small = publish("s", 10);
        let big = Bytes::from(publish("b", 5000));
        q.push(&[&small], None);
        assert_eq!(q.push_spliced(&[7u8], &big, Some("b")), Pushed::Queued);
        q.push(&[&small], None);
        // A small body is copied as before.
        assert_eq!(
            q.push_spliced(&[7u8], &Bytes::from(small.clone()), None),
            Pushed::Queued
        );
        assert_eq!(q.stats("p".into()).spliced, 1);
        let p = q.pop().unwrap();
        assert_eq!(p.frames, 4);
        // The body is a part of its own: the same memory, not a copy.
        assert_eq!(p.parts.len(), 3);
        assert_eq!(p.parts[1].as_ptr(), big.as_ptr());
        let joined: Vec<u8> = p.parts.iter().flat_map(|x| x.iter().copied()).collect();
        let f = frames_of(&Bytes::from(joined));
        assert_eq!(f[0][..], small[..]);
        assert_eq!(f[1][0], 7);
        assert_eq!(f[1][1..], big[..]);
        assert_eq!(f[2][..], small[..]);
        // Offered again when the association had no room, then let go.
        q.unpop(p);
        assert!(q.has_frames());
        let p = q.pop().unwrap();
        assert!(q.pop().is_none());
        drop(p);
        assert!(big.is_unique(), "the queue holds no reference any more");
        // Lost with the peer: references let go too.
        q.push_spliced(&[7u8], &big, None);
        assert_eq!(q.lose_all(), 1);
        assert!(big.is_unique());
    }

    fn frames_of(batch: &Bytes) -> Vec<Bytes> {
        let (f, n) = skiff_proto::mesh::Frames::checked(batch.slice(1..), usize::MAX).unwrap();
        let v: Vec<Bytes> = f.collect();
        assert_eq!(v.len() as u64, n);
        v
    }

    #[test]
    fn frames_share_batches_in_order() {
        let mut q = SendQueue::new(1 << 20, SendPolicy::Block);
        for i in 0..100 {
            let f = publish(&format!("s.{i}"), 1000);
            assert_eq!(q.push(&[&f], None), Pushed::Queued);
        }
        let mut all = Vec::new();
        let mut batches = 0;
        while let Some((b, n)) = pop1(&mut q) {
            assert!(b.len() <= BATCH + 1100, "{}", b.len());
            let f = frames_of(&b);
            assert_eq!(f.len() as u32, n);
            all.extend(f);
            batches += 1;
        }
        assert_eq!(all.len(), 100);
        assert!((2..10).contains(&batches), "{batches}");
        for (i, f) in all.iter().enumerate() {
            assert_eq!(f[..], publish(&format!("s.{i}"), 1000)[..]);
        }
    }

    #[test]
    fn a_large_frame_is_a_batch_of_its_own() {
        let mut q = SendQueue::new(4 << 20, SendPolicy::DropNewest);
        let big = publish("big", 1 << 20);
        q.push(&[&publish("a", 1)], None);
        q.push(&[&big], None);
        q.push(&[&publish("b", 1)], None);
        let (b1, n1) = pop1(&mut q).unwrap();
        let (b2, n2) = pop1(&mut q).unwrap();
        let (_, n3) = pop1(&mut q).unwrap();
        assert_eq!((n1, n2, n3), (1, 1, 1));
        assert!(b1.len() < 100);
        assert_eq!(frames_of(&b2)[0][..], big[..]);
    }

    #[test]
    fn drop_newest_counts_per_subject() {
        let mut q = SendQueue::new(10_000, SendPolicy::DropNewest);
        let f = publish("x.y", 1000);
        let mut dropped = 0;
        for _ in 0..20 {
            if q.push(&[&f], Some("x.y")) == Pushed::Dropped {
                dropped += 1;
            }
        }
        let s = q.stats("p".into());
        assert!(dropped >= 10, "{dropped}");
        assert_eq!(s.dropped_newest, dropped);
        assert_eq!(s.dropped_subjects, vec![("x.y".to_string(), dropped)]);
        assert_eq!(s.queued_frames, 20 - dropped);
        assert!(s.queued_bytes <= 10_000);
    }

    #[test]
    fn drop_oldest_drops_whole_batches_counted() {
        let mut q = SendQueue::new(200_000, SendPolicy::DropOldest);
        for i in 0..1000 {
            let f = publish(&format!("s.{}", i % 3), 1000);
            assert_eq!(q.push(&[&f], None), Pushed::Queued);
        }
        let s = q.stats("p".into());
        assert!(s.queued_bytes <= 200_000);
        assert_eq!(s.dropped_oldest + s.queued_frames, 1000);
        let by_subject: u64 = s.dropped_subjects.iter().map(|(_, n)| n).sum();
        assert_eq!(by_subject, s.dropped_oldest);
        // What is left is the newest, in order.
        let mut last = None;
        while let Some((b, _)) = pop1(&mut q) {
            for f in frames_of(&b) {
                let m = skiff_proto::wire::decode_message(&f.slice(1..), usize::MAX).unwrap();
                last = Some(m.subject);
            }
        }
        assert_eq!(last.as_deref(), Some("s.0"));
    }

    #[test]
    fn block_stalls_after_its_deadline_until_drained_to_half() {
        let mut q = SendQueue::new(10_000, SendPolicy::Block);
        let f = publish("x", 1000);
        while q.push(&[&f], None) == Pushed::Queued {}
        assert!(q.should_wait());
        q.stall();
        assert!(!q.should_wait());
        while let Some((b, n)) = pop1(&mut q) {
            q.sent(b.len(), n);
        }
        assert_eq!(q.push(&[&f], None), Pushed::Queued);
        while q.push(&[&f], None) == Pushed::Queued {}
        assert!(q.should_wait(), "drained: waits again");
        assert_eq!(q.stats("p".into()).deadlines, 1);
    }

    #[test]
    fn in_flight_frames_are_lost_with_the_peer_unless_acknowledged() {
        let mut q = SendQueue::new(1 << 20, SendPolicy::Block);
        for _ in 0..3 {
            q.push(&[&publish("x", 100_000)], None);
        }
        let (b1, n1) = pop1(&mut q).unwrap();
        q.sent(b1.len(), n1);
        let (b2, n2) = pop1(&mut q).unwrap();
        q.sent(b2.len(), n2);
        // The association holds only the second batch now.
        q.acked(b2.len());
        assert_eq!(q.lose_all(), 2);
        assert_eq!(q.stats("p".into()).lost, 2);
    }
}
