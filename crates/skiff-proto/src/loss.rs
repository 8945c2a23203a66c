//! Per-source sequence tracking on the receiving side.
//!
//! Every sender numbers its messages per destination from zero. The
//! [`LossDetector`] keeps, for each source, the highest sequence number seen
//! and a window of the last [`WINDOW`] numbers below it. A gap counts its
//! messages as lost at once; a late message that fills a gap inside the
//! window is delivered and taken back off the lost count; a message seen
//! before is a duplicate and a message older than the window is stale, and
//! both are dropped. So at any moment, for each source within one epoch
//! (below), `delivered + lost == highest + 1`: every message is delivered
//! once or counted lost, never both, never twice.
//!
//! A number too far from the window is not trusted on its own: one more
//! than [`LossDetector::ahead`] numbers above the highest (a forger's far
//! future), or older than the window (a sender that restarted from zero),
//! is refused and counted (`far_ahead`, `stale`) while the source's stream
//! is alive. It starts a new epoch of the source (a fresh window at that
//! number, counted in [`LossStats::epochs`]) only once the old stream has
//! been silent, its highest number unmoved, for [`SILENCE`] since the
//! first such refusal. So one forged datagram, or a burst of them, costs
//! the forged messages, counted, never the real stream. The time is read
//! only on that rare path, through the caller's clock.
//!
//! The table of sources is bounded; when full, the source heard from least
//! recently is forgotten (and counted in [`LossStats::evicted`]).

use std::hash::Hash;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

/// How many sequence numbers below the highest are remembered per source.
pub const WINDOW: u64 = 1024;
const WORDS: usize = (WINDOW / 64) as usize;

/// How far above the highest number a datagram may start and still be
/// trusted on its own, by default: a gap of more messages than this looks
/// like a forgery, not a loss (a lost datagram of 8-byte messages leaves a
/// gap of a few thousand).
pub const AHEAD: u64 = 1 << 16;

/// How long a source's stream must stay silent (its highest number
/// unmoved) after a far-off number before that number starts a new epoch.
pub const SILENCE: Duration = Duration::from_secs(1);

/// What to do with one received message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// New: deliver it.
    Deliver,
    /// Already delivered: drop it.
    Duplicate,
    /// Older than the window; it was counted lost and stays so: drop it.
    Stale,
    /// Too far above the window while the stream is alive (a forgery, or
    /// a new epoch not yet confirmed by silence): drop it.
    FarAhead,
}

/// Counters over all sources.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LossStats {
    /// Messages known missing (gaps not filled).
    pub lost: u64,
    /// Gaps later filled by a reordered message.
    pub recovered: u64,
    /// Duplicates dropped.
    pub duplicates: u64,
    /// Messages older than the window, dropped.
    pub stale: u64,
    /// Sources forgotten because the table was full.
    pub evicted: u64,
    /// Messages too far above the window, refused while the stream lived.
    pub far_ahead: u64,
    /// New epochs of a source begun after its stream fell silent.
    pub epochs: u64,
}

#[derive(Debug)]
struct Window {
    /// Highest sequence number seen.
    high: u64,
    /// A ring: bit `s % WINDOW` says whether number `s` was seen, for `s`
    /// in `(high - WINDOW, high]`; bits of numbers above `high` are clear.
    /// Moving `high` up clears only the bits it passes (one, in order),
    /// where a shifted bitmap would rewrite all of it.
    seen: [u64; WORDS],
    touched: u64,
    /// Since when, and at which `high`, numbers too far from the window
    /// have been refused (`None`: none since `high` last moved).
    doubt: Option<(Instant, u64)>,
}

impl Window {
    /// A window whose highest number is `high`, nothing seen yet.
    fn new(high: u64, touched: u64) -> Window {
        Window {
            high,
            seen: [0; WORDS],
            touched,
            doubt: None,
        }
    }

    /// A run `base..=last` too far from the window: refused while the
    /// stream is alive; once its `high` has not moved for [`SILENCE`] since
    /// the first refusal, it begins a new epoch, marked seen. Returns
    /// whether it was accepted.
    #[cold]
    fn far_off(&mut self, base: u64, last: u64, now: &impl Fn() -> Instant) -> bool {
        let now = now();
        match self.doubt {
            Some((since, high))
                if high == self.high && now.saturating_duration_since(since) >= SILENCE =>
            {
                self.seen = [0; WORDS];
                self.high = base;
                self.set_seq(base);
                if last > base {
                    self.mark_run(base + 1, last);
                }
                self.doubt = None;
                true
            }
            Some((_, high)) if high == self.high => false,
            _ => {
                self.doubt = Some((now, self.high));
                false
            }
        }
    }

    fn get_seq(&self, seq: u64) -> bool {
        let i = seq % WINDOW;
        self.seen[(i / 64) as usize] >> (i % 64) & 1 == 1
    }

    fn set_seq(&mut self, seq: u64) {
        let i = seq % WINDOW;
        self.seen[(i / 64) as usize] |= 1 << (i % 64);
    }

    /// Whether `high - back` was seen (`back < WINDOW`).
    #[cfg(test)]
    fn get(&self, back: u64) -> bool {
        self.get_seq(self.high - back)
    }

    /// Sets (`on`) or clears the bits of numbers `lo..=hi`, at most
    /// `WINDOW` of them.
    fn fill(&mut self, lo: u64, hi: u64, on: bool) {
        debug_assert!(lo <= hi && hi - lo < WINDOW);
        let (mut seq, mut left) = (lo, hi - lo + 1);
        while left > 0 {
            let i = seq % WINDOW;
            let bit = i % 64;
            // The numbers of this run that share a word: from `bit` on.
            let n = (64 - bit).min(left);
            let mask = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << bit
            };
            let word = &mut self.seen[(i / 64) as usize];
            if on {
                *word |= mask;
            } else {
                *word &= !mask;
            }
            seq = seq.wrapping_add(n);
            left -= n;
        }
    }

    /// Moves `high` up to `to`, clearing the bits of the numbers passed.
    fn advance_to(&mut self, to: u64) {
        debug_assert!(to > self.high);
        if to - self.high >= WINDOW {
            self.seen = [0; WORDS];
        } else {
            self.fill(self.high + 1, to, false);
        }
        self.high = to;
    }

    /// Marks a run `base..=last` above `high` as seen (its newest `WINDOW`
    /// numbers; older ones fall outside the window at once).
    fn mark_run(&mut self, base: u64, last: u64) {
        self.advance_to(last);
        let lo = base.max(last.saturating_sub(WINDOW - 1));
        self.fill(lo, last, true);
    }

    /// [`Window::far_off`] for the run `base..=last`, counted: `refused` is
    /// the verdict (and counter) when it is not accepted.
    #[cold]
    fn judge_far(
        &mut self,
        base: u64,
        last: u64,
        stats: &mut LossStats,
        now: &impl Fn() -> Instant,
        refused: Verdict,
    ) -> Verdict {
        if self.far_off(base, last, now) {
            stats.epochs += 1;
            return Verdict::Deliver;
        }
        let n = last - base + 1;
        match refused {
            Verdict::Stale => stats.stale = stats.stale.saturating_add(n),
            _ => stats.far_ahead = stats.far_ahead.saturating_add(n),
        }
        refused
    }

    /// Judges one sequence number against this source's window, trusting
    /// a jump of at most `ahead`; `now` is called only for a number too far
    /// off.
    fn check(
        &mut self,
        seq: u64,
        ahead: u64,
        stats: &mut LossStats,
        now: &impl Fn() -> Instant,
    ) -> Verdict {
        if self.high.checked_add(1) == Some(seq) {
            // The next in order, the common case: its bit, which held the
            // number `WINDOW` below, is set; nothing else changes.
            self.high = seq;
            self.set_seq(seq);
            return Verdict::Deliver;
        }
        if seq > self.high {
            if seq - self.high > ahead {
                return self.judge_far(seq, seq, stats, now, Verdict::FarAhead);
            }
            stats.lost = stats.lost.saturating_add(seq - self.high - 1);
            self.advance_to(seq);
            self.set_seq(seq);
            Verdict::Deliver
        } else {
            let back = self.high - seq;
            if back >= WINDOW {
                self.judge_far(seq, seq, stats, now, Verdict::Stale)
            } else if self.get_seq(seq) {
                stats.duplicates += 1;
                Verdict::Duplicate
            } else {
                self.set_seq(seq);
                stats.lost = stats.lost.saturating_sub(1);
                stats.recovered += 1;
                Verdict::Deliver
            }
        }
    }
}

/// Tracks sequence numbers per source (`K`: its id, or its id and address);
/// see the module documentation.
#[derive(Debug)]
pub struct LossDetector<K = u64> {
    sources: FxHashMap<K, Window>,
    max_sources: usize,
    ahead: u64,
    clock: u64,
    stats: LossStats,
}

impl<K: Hash + Eq + Copy> LossDetector<K> {
    /// A detector remembering at most `max_sources` sources, trusting
    /// jumps of up to [`AHEAD`] numbers.
    pub fn new(max_sources: usize) -> LossDetector<K> {
        LossDetector::with_ahead(max_sources, AHEAD)
    }

    /// A detector trusting jumps of up to `ahead` numbers above a source's
    /// highest (at least 1): a stream numbering datagrams, not messages,
    /// takes a smaller bound.
    pub fn with_ahead(max_sources: usize, ahead: u64) -> LossDetector<K> {
        LossDetector {
            sources: FxHashMap::default(),
            max_sources: max_sources.max(1),
            ahead: ahead.max(1),
            clock: 0,
            stats: LossStats::default(),
        }
    }

    /// How far above a source's highest number a datagram is trusted.
    pub fn ahead(&self) -> u64 {
        self.ahead
    }

    /// Counters so far.
    pub fn stats(&self) -> LossStats {
        self.stats
    }

    /// Number of sources tracked.
    pub fn sources(&self) -> usize {
        self.sources.len()
    }

    /// Judges message `seq` from `source`, updating the counters; `now` is
    /// called only for a number too far from the window.
    pub fn check(&mut self, source: K, seq: u64, now: impl Fn() -> Instant) -> Verdict {
        self.clock += 1;
        if let Some(w) = self.sources.get_mut(&source) {
            w.touched = self.clock;
            return w.check(seq, self.ahead, &mut self.stats, &now);
        }
        if self.sources.len() >= self.max_sources {
            self.evict();
        }
        // Senders number from zero, so the first message seen from a
        // source tells how many before it were missed.
        self.stats.lost = self.stats.lost.saturating_add(seq);
        let mut w = Window::new(seq, self.clock);
        w.set_seq(seq);
        self.sources.insert(source, w);
        Verdict::Deliver
    }

    /// Judges the `count` messages numbered from `base` that one datagram
    /// from `source` carries, writing one verdict each into `verdicts`
    /// (cleared first). Returns `true` when all are to be delivered, the
    /// common case, which costs one table lookup for the whole datagram.
    /// `now` is called only for a number too far from the window.
    pub fn check_run(
        &mut self,
        source: K,
        base: u64,
        count: u64,
        verdicts: &mut Vec<Verdict>,
        now: impl Fn() -> Instant,
    ) -> bool {
        verdicts.clear();
        if count == 0 {
            return true;
        }
        self.clock += 1;
        let last = base.saturating_add(count - 1);
        if let Some(w) = self.sources.get_mut(&source) {
            w.touched = self.clock;
            if count == 1 {
                let v = w.check(base, self.ahead, &mut self.stats, &now);
                if v == Verdict::Deliver {
                    return true;
                }
                verdicts.push(v);
                return false;
            }
            if base > w.high {
                if base - w.high > self.ahead {
                    // Too far ahead: the whole run is refused or begins an
                    // epoch, together.
                    let v = w.judge_far(base, last, &mut self.stats, &now, Verdict::FarAhead);
                    if v == Verdict::Deliver {
                        return true;
                    }
                    verdicts.resize(count as usize, v);
                    return false;
                }
                // Entirely new: open the gap once, then mark the run.
                self.stats.lost = self.stats.lost.saturating_add(base - w.high - 1);
                w.mark_run(base, last);
                return true;
            }
            let mut all = true;
            for i in 0..count {
                let v = w.check(base.saturating_add(i), self.ahead, &mut self.stats, &now);
                all &= v == Verdict::Deliver;
                verdicts.push(v);
            }
            return all;
        }
        if self.sources.len() >= self.max_sources {
            self.evict();
        }
        self.stats.lost = self.stats.lost.saturating_add(base);
        let mut w = Window::new(base, self.clock);
        w.set_seq(base);
        if last > base {
            w.mark_run(base + 1, last);
        }
        self.sources.insert(source, w);
        true
    }

    fn evict(&mut self) {
        if let Some((&victim, _)) = self.sources.iter().min_by_key(|(_, w)| w.touched) {
            self.sources.remove(&victim);
            self.stats.evicted += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    fn now() -> Instant {
        Instant::now()
    }

    #[test]
    fn in_order_is_lossless() {
        let mut d = LossDetector::new(4);
        for s in 0..5000 {
            assert_eq!(d.check(7, s, now), Verdict::Deliver);
        }
        assert_eq!(d.stats(), LossStats::default());
    }

    #[test]
    fn gap_counts_then_late_arrival_recovers() {
        let mut d = LossDetector::new(4);
        d.check(1, 0, now);
        d.check(1, 5, now);
        assert_eq!(d.stats().lost, 4);
        assert_eq!(d.check(1, 3, now), Verdict::Deliver);
        assert_eq!(d.stats().lost, 3);
        assert_eq!(d.check(1, 3, now), Verdict::Duplicate);
        assert_eq!(d.check(1, 5, now), Verdict::Duplicate);
        d.check(1, 5 + WINDOW + 10, now);
        assert_eq!(d.check(1, 4, now), Verdict::Stale);
        assert_eq!(d.stats().lost, 3 + WINDOW + 9);
    }

    #[test]
    fn first_message_counts_missed_prefix() {
        let mut d = LossDetector::new(4);
        d.check(9, 10, now);
        assert_eq!(d.stats().lost, 10);
    }

    /// Numbers at the top of the range neither overflow nor lose track.
    #[test]
    fn top_of_the_sequence_space() {
        let mut d = LossDetector::new(4);
        let mut v = Vec::new();
        assert!(d.check_run(2, u64::MAX - 70, 60, &mut v, now));
        assert_eq!(d.check(2, u64::MAX - 20, now), Verdict::Duplicate);
        assert_eq!(d.check(2, u64::MAX, now), Verdict::Deliver);
        assert_eq!(d.check(2, u64::MAX - 5, now), Verdict::Deliver);
        assert_eq!(d.check(2, u64::MAX - 5, now), Verdict::Duplicate);
        assert_eq!(d.stats().lost, u64::MAX - 70 + 10 - 1);
    }

    #[test]
    fn sources_are_bounded() {
        let mut d = LossDetector::new(3);
        for src in 0..10 {
            d.check(src, 0, now);
        }
        assert_eq!(d.sources(), 3);
        assert_eq!(d.stats().evicted, 7);
    }

    /// A forged number far in the future does not move the window: the
    /// real stream goes on, the forgery is a counted drop.
    #[test]
    fn far_future_forgery_does_not_move_the_window() {
        let t = Instant::now();
        let mut d = LossDetector::new(4);
        for s in 0..100 {
            assert_eq!(d.check(7, s, || t), Verdict::Deliver);
        }
        assert_eq!(d.check(7, u64::MAX / 2, || t), Verdict::FarAhead);
        let mut v = Vec::new();
        assert!(!d.check_run(7, 1 << 62, 10, &mut v, || t));
        assert_eq!(v, [Verdict::FarAhead; 10]);
        for s in 100..400 {
            assert_eq!(d.check(7, s, || t), Verdict::Deliver);
        }
        let st = d.stats();
        assert_eq!((st.far_ahead, st.lost, st.stale, st.epochs), (11, 0, 0, 0));
    }

    /// Forgeries spread over more than the silence, while the real stream
    /// lives, never begin an epoch.
    #[test]
    fn burst_of_forgeries_costs_only_counted_drops() {
        let t = Instant::now();
        let mut d = LossDetector::new(4);
        let mut real = 0;
        for i in 0..50u32 {
            let at = t + SILENCE / 4 * i;
            for _ in 0..3 {
                assert_eq!(d.check(1, real, || at), Verdict::Deliver);
                real += 1;
            }
            let forged = real + AHEAD + 1 + u64::from(i);
            assert_eq!(d.check(1, forged, || at), Verdict::FarAhead);
            assert_eq!(d.check(1, 0, || at), Verdict::Duplicate);
        }
        let st = d.stats();
        assert_eq!((st.far_ahead, st.lost, st.epochs), (50, 0, 0));
    }

    /// A source whose stream fell silent and that starts again, from zero
    /// or far ahead, is accepted as a new epoch once the silence is over.
    #[test]
    fn restart_after_silence_is_accepted() {
        let t = Instant::now();
        let mut d = LossDetector::new(4);
        for s in 0..5000 {
            d.check(3, s, || t);
        }
        // Restarted from zero: refused until the old stream is silent.
        assert_eq!(d.check(3, 0, || t), Verdict::Stale);
        assert_eq!(d.check(3, 1, || t + SILENCE / 2), Verdict::Stale);
        assert_eq!(d.check(3, 2, || t + SILENCE), Verdict::Deliver);
        for s in 3..3000 {
            assert_eq!(d.check(3, s, || t + SILENCE), Verdict::Deliver);
        }
        // Jumped far ahead (a long loss), then silent: accepted likewise.
        let far = 3000 + AHEAD * 10;
        let t2 = t + SILENCE * 3;
        let mut v = Vec::new();
        assert!(!d.check_run(3, far, 5, &mut v, || t2));
        assert!(d.check_run(3, far + 5, 5, &mut v, || t2 + SILENCE));
        assert_eq!(d.check(3, far + 10, || t2 + SILENCE), Verdict::Deliver);
        assert_eq!(d.check(3, far + 7, || t2 + SILENCE), Verdict::Duplicate);
        assert_eq!(d.stats().epochs, 2);
    }

    proptest! {
        /// Whatever the network does (drop, duplicate, reorder), each
        /// message is delivered at most once, and delivered + lost equals
        /// the highest sequence number seen plus one.
        #[test]
        fn delivered_once_or_counted_lost(
            arrivals in proptest::collection::vec(0u64..3000, 1..2000),
        ) {
            let mut d = LossDetector::new(4);
            let mut delivered = HashSet::new();
            for &s in &arrivals {
                if d.check(1, s, now) == Verdict::Deliver {
                    prop_assert!(delivered.insert(s), "{} delivered twice", s);
                }
            }
            let high = *arrivals.iter().max().unwrap();
            prop_assert_eq!(delivered.len() as u64 + d.stats().lost, high + 1);
        }

        /// Judging a datagram's run at once gives the same verdicts and
        /// counters as judging its messages one by one.
        #[test]
        fn check_run_matches_check(
            runs in proptest::collection::vec((0u64..3000, 1u64..40), 1..300),
        ) {
            let (mut one, mut many) = (LossDetector::new(4), LossDetector::new(4));
            let mut verdicts = Vec::new();
            for &(base, count) in &runs {
                let all = many.check_run(3, base, count, &mut verdicts, now);
                let each: Vec<Verdict> = (base..base + count).map(|s| one.check(3, s, now)).collect();
                if all {
                    prop_assert!(each.iter().all(|v| *v == Verdict::Deliver));
                } else {
                    prop_assert_eq!(&verdicts, &each);
                }
                prop_assert_eq!(one.stats(), many.stats());
            }
        }

        #[test]
        fn window_shift_matches_reference(start in 0u64..100, steps in proptest::collection::vec(1u64..2500, 1..50)) {
            let mut w = Window::new(start, 0);
            w.set_seq(start);
            let mut seen: HashSet<u64> = [start].into();
            let mut stats = LossStats::default();
            let mut high = start;
            for by in steps {
                high += by;
                w.check(high, AHEAD, &mut stats, &now);
                seen.insert(high);
                for back in 0..WINDOW.min(high + 1) {
                    prop_assert_eq!(w.get(back), seen.contains(&(high - back)));
                }
            }
        }
    }
}
