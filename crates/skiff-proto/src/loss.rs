//! Per-source sequence tracking on the receiving side.
//!
//! Every sender numbers its messages per destination from zero. The
//! [`LossDetector`] keeps, for each source, the highest sequence number seen
//! and a window of the last [`WINDOW`] numbers below it. A gap counts its
//! messages as lost at once; a late message that fills a gap inside the
//! window is delivered and taken back off the lost count; a message seen
//! before is a duplicate and a message older than the window is stale, and
//! both are dropped. So at any moment, for each source,
//! `delivered + lost == highest + 1`: every message is delivered once or
//! counted lost, never both, never twice.
//!
//! The table of sources is bounded; when full, the source heard from least
//! recently is forgotten (and counted in [`LossStats::evicted`]).

use rustc_hash::FxHashMap;

/// How many sequence numbers below the highest are remembered per source.
pub const WINDOW: u64 = 1024;
const WORDS: usize = (WINDOW / 64) as usize;

/// What to do with one received message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// New: deliver it.
    Deliver,
    /// Already delivered: drop it.
    Duplicate,
    /// Older than the window; it was counted lost and stays so: drop it.
    Stale,
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
}

impl Window {
    /// A window whose highest number is `high`, nothing seen yet.
    fn new(high: u64, touched: u64) -> Window {
        Window {
            high,
            seen: [0; WORDS],
            touched,
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

    /// Judges one sequence number against this source's window.
    fn check(&mut self, seq: u64, stats: &mut LossStats) -> Verdict {
        if self.high.checked_add(1) == Some(seq) {
            // The next in order, the common case: its bit, which held the
            // number `WINDOW` below, is set; nothing else changes.
            self.high = seq;
            self.set_seq(seq);
            return Verdict::Deliver;
        }
        if seq > self.high {
            stats.lost = stats.lost.saturating_add(seq - self.high - 1);
            self.advance_to(seq);
            self.set_seq(seq);
            Verdict::Deliver
        } else {
            let back = self.high - seq;
            if back >= WINDOW {
                stats.stale += 1;
                Verdict::Stale
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

/// Tracks sequence numbers per source; see the module documentation.
#[derive(Debug)]
pub struct LossDetector {
    sources: FxHashMap<u64, Window>,
    max_sources: usize,
    clock: u64,
    stats: LossStats,
}

impl LossDetector {
    /// A detector remembering at most `max_sources` sources.
    pub fn new(max_sources: usize) -> LossDetector {
        LossDetector {
            sources: FxHashMap::default(),
            max_sources: max_sources.max(1),
            clock: 0,
            stats: LossStats::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> LossStats {
        self.stats
    }

    /// Number of sources tracked.
    pub fn sources(&self) -> usize {
        self.sources.len()
    }

    /// Judges message `seq` from `source`, updating the counters.
    pub fn check(&mut self, source: u64, seq: u64) -> Verdict {
        self.clock += 1;
        if let Some(w) = self.sources.get_mut(&source) {
            w.touched = self.clock;
            return w.check(seq, &mut self.stats);
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
    pub fn check_run(
        &mut self,
        source: u64,
        base: u64,
        count: u64,
        verdicts: &mut Vec<Verdict>,
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
                let v = w.check(base, &mut self.stats);
                if v == Verdict::Deliver {
                    return true;
                }
                verdicts.push(v);
                return false;
            }
            if base > w.high {
                // Entirely new: open the gap once, then mark the run.
                self.stats.lost = self.stats.lost.saturating_add(base - w.high - 1);
                w.mark_run(base, last);
                return true;
            }
            let mut all = true;
            for i in 0..count {
                let v = w.check(base.saturating_add(i), &mut self.stats);
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

    #[test]
    fn in_order_is_lossless() {
        let mut d = LossDetector::new(4);
        for s in 0..5000 {
            assert_eq!(d.check(7, s), Verdict::Deliver);
        }
        assert_eq!(d.stats(), LossStats::default());
    }

    #[test]
    fn gap_counts_then_late_arrival_recovers() {
        let mut d = LossDetector::new(4);
        d.check(1, 0);
        d.check(1, 5);
        assert_eq!(d.stats().lost, 4);
        assert_eq!(d.check(1, 3), Verdict::Deliver);
        assert_eq!(d.stats().lost, 3);
        assert_eq!(d.check(1, 3), Verdict::Duplicate);
        assert_eq!(d.check(1, 5), Verdict::Duplicate);
        d.check(1, 5 + WINDOW + 10);
        assert_eq!(d.check(1, 4), Verdict::Stale);
        assert_eq!(d.stats().lost, 3 + WINDOW + 9);
    }

    #[test]
    fn first_message_counts_missed_prefix() {
        let mut d = LossDetector::new(4);
        d.check(9, 10);
        assert_eq!(d.stats().lost, 10);
    }

    /// Numbers at the top of the range neither overflow nor lose track.
    #[test]
    fn top_of_the_sequence_space() {
        let mut d = LossDetector::new(4);
        let mut v = Vec::new();
        assert!(d.check_run(2, u64::MAX - 70, 60, &mut v));
        assert_eq!(d.check(2, u64::MAX - 20), Verdict::Duplicate);
        assert_eq!(d.check(2, u64::MAX), Verdict::Deliver);
        assert_eq!(d.check(2, u64::MAX - 5), Verdict::Deliver);
        assert_eq!(d.check(2, u64::MAX - 5), Verdict::Duplicate);
        assert_eq!(d.stats().lost, u64::MAX - 70 + 10 - 1);
    }

    #[test]
    fn sources_are_bounded() {
        let mut d = LossDetector::new(3);
        for src in 0..10 {
            d.check(src, 0);
        }
        assert_eq!(d.sources(), 3);
        assert_eq!(d.stats().evicted, 7);
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
                if d.check(1, s) == Verdict::Deliver {
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
                let all = many.check_run(3, base, count, &mut verdicts);
                let each: Vec<Verdict> = (base..base + count).map(|s| one.check(3, s)).collect();
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
                w.check(high, &mut stats);
                seen.insert(high);
                for back in 0..WINDOW.min(high + 1) {
                    prop_assert_eq!(w.get(back), seen.contains(&(high - back)));
                }
            }
        }
    }
}
