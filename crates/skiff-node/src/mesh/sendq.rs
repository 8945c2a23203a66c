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
    /// The `nodes` op byte, then frames (varint length + bytes).
    buf: Vec<u8>,
    frames: u32,
}

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
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let need = varint::len(len as u64) + len;
        if !self.has_room(need) {
            if self.policy == SendPolicy::DropOldest {
                while !self.has_room(need) {
                    let Some(b) = self.batches.pop_front() else {
                        break;
                    };
                    self.bytes -= b.buf.len();
                    self.frames -= u64::from(b.frames);
                    self.stats.dropped_oldest += u64::from(b.frames);
                    self.count_batch(&b.buf);
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
            .is_some_and(|b| b.buf.len() + need <= BATCH || b.frames == 0);
        if !open {
            let mut buf = Vec::with_capacity(need.clamp(BATCH / 4, BATCH) + 1);
            buf.push(NODES);
            self.batches.push_back(Batch { buf, frames: 0 });
            self.bytes += 1;
        }
        let b = self.batches.back_mut().expect("one open");
        varint::put(&mut b.buf, len as u64);
        for p in parts {
            b.buf.extend_from_slice(p);
        }
        b.frames += 1;
        self.bytes += need;
        self.frames += 1;
        Pushed::Queued
    }

    /// The oldest batch, to offer to the association (put back with
    /// [`SendQueue::unpop`] if it has no room).
    pub(crate) fn pop(&mut self) -> Option<(Bytes, u32)> {
        let b = self.batches.pop_front()?;
        self.bytes -= b.buf.len();
        self.frames -= u64::from(b.frames);
        Some((Bytes::from(b.buf), b.frames))
    }

    /// Puts back a batch [`SendQueue::pop`] gave (the association had no
    /// room).
    pub(crate) fn unpop(&mut self, batch: Bytes, frames: u32) {
        self.bytes += batch.len();
        self.frames += u64::from(frames);
        self.batches.push_front(Batch {
            buf: batch.into(),
            frames,
        });
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
            self.count_batch(&b.buf);
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
        !self.batches.is_empty()
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
        while let Some((b, n)) = q.pop() {
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
        let (b1, n1) = q.pop().unwrap();
        let (b2, n2) = q.pop().unwrap();
        let (_, n3) = q.pop().unwrap();
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
        while let Some((b, _)) = q.pop() {
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
        while let Some((b, n)) = q.pop() {
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
        let (b1, n1) = q.pop().unwrap();
        q.sent(b1.len(), n1);
        let (b2, n2) = q.pop().unwrap();
        q.sent(b2.len(), n2);
        // The association holds only the second batch now.
        q.acked(b2.len());
        assert_eq!(q.lose_all(), 2);
        assert_eq!(q.stats("p".into()).lost, 2);
    }
}
