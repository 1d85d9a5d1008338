//! A single-writer HDR histogram of atomics: recorded by one shard (relaxed loads and stores,
//! no lock, no read-modify-write), read by a scrape on any thread.
//!
//! Its buckets are exactly those of an `hdrhistogram::Histogram` with a lowest discernible
//! value of 1 and 3 significant digits, and [`Reading`] answers what that histogram would
//! answer for the counts of one or several of them added up (several shards, windows), its
//! percentiles and mean identical, without building it: a scrape copies no counts and
//! allocates nothing. Each power-of-two bucket's total is kept beside its counts (the count
//! of values in one read), and a bit per count says whether it is 0, so a reading visits the
//! counts that hold values and skips the rest 64 at a time.
//!
//! A bucket only bounds its values (a histogram's maximum is the highest value of the bucket
//! its largest sample fell in: one sample of 73 312 ns reads 73 343), so the exact smallest
//! and largest values and the sum are kept beside the counts; [`Reading`] reports those, and
//! [`Reading::quantile`] clamps the percentiles to them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use smallvec::SmallVec;

/// `hdrhistogram`'s layout for 3 significant digits and unit 1: buckets of 2048 sub-buckets,
/// the upper half of each used past bucket 0.
const SUB_BUCKET_HALF_MAGNITUDE: u32 = 10;
const SUB_BUCKET_HALF: usize = 1 << SUB_BUCKET_HALF_MAGNITUDE;
const SUB_BUCKET_MASK: u64 = (1 << (SUB_BUCKET_HALF_MAGNITUDE + 1)) - 1;
const LEADING_ZERO_BASE: u32 = 64 - (SUB_BUCKET_HALF_MAGNITUDE + 1);
/// Power-of-two buckets a u64 value can fall in.
const MAX_BUCKETS: usize = LEADING_ZERO_BASE as usize + 1;

/// The power-of-two bucket of `v`.
fn bucket_of(v: u64) -> u32 {
    LEADING_ZERO_BASE - (v | SUB_BUCKET_MASK).leading_zeros()
}

/// The counts index of `v` (as `hdrhistogram` computes it).
fn index_of(v: u64) -> usize {
    let bucket = bucket_of(v);
    let sub = v >> bucket;
    ((bucket as u64 + 1) << SUB_BUCKET_HALF_MAGNITUDE) as usize + sub as usize - SUB_BUCKET_HALF
}

/// The counts indexes of power-of-two bucket `b`: 0..2048 for the first, then 1024 each.
fn bucket_indexes(b: usize) -> std::ops::Range<usize> {
    if b == 0 {
        0..2 * SUB_BUCKET_HALF
    } else {
        (b + 1) * SUB_BUCKET_HALF..(b + 2) * SUB_BUCKET_HALF
    }
}

/// The lowest value counted at `index` (`hdrhistogram`'s `value_for`).
fn value_at(index: usize) -> u64 {
    if index < 2 * SUB_BUCKET_HALF {
        return index as u64;
    }
    let bucket = (index >> SUB_BUCKET_HALF_MAGNITUDE) - 1;
    let sub = (index & (SUB_BUCKET_HALF - 1)) + SUB_BUCKET_HALF;
    (sub as u64) << bucket
}

/// How many values index `index` counts (`hdrhistogram`'s `equivalent_range`).
fn range_at(index: usize) -> u64 {
    1 << bucket_of(value_at(index))
}

/// Values from 1 to `max` (larger ones are clamped), 3 significant digits.
pub struct AtomicHdr {
    max: u64,
    counts: Box<[AtomicU64]>,
    /// Each power-of-two bucket's total: the sum of its counts.
    buckets: Box<[AtomicU64]>,
    /// Bit `i % 64` of word `i / 64`: count `i` is not 0.
    nonzero: Box<[AtomicU64]>,
    /// One past the highest index ever written: a scrape reads no further.
    end: AtomicUsize,
    /// The exact smallest value recorded (`u64::MAX`: none), the largest (0: none) and the
    /// sum of all (saturating), since the last reset.
    lowest: AtomicU64,
    highest: AtomicU64,
    sum: AtomicU64,
}

impl AtomicHdr {
    pub fn new(max: u64) -> AtomicHdr {
        let len = index_of(max) + 1;
        AtomicHdr {
            max,
            counts: (0..len).map(|_| AtomicU64::new(0)).collect(),
            buckets: (0..=bucket_of(max)).map(|_| AtomicU64::new(0)).collect(),
            nonzero: (0..len.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            end: AtomicUsize::new(0),
            lowest: AtomicU64::new(u64::MAX),
            highest: AtomicU64::new(0),
            sum: AtomicU64::new(0),
        }
    }

    /// Records one value. Only the owning shard calls this.
    #[inline]
    pub fn record(&self, v: u64) {
        let v = v.clamp(1, self.max);
        if v < self.lowest.load(Relaxed) {
            self.lowest.store(v, Relaxed);
        }
        if v > self.highest.load(Relaxed) {
            self.highest.store(v, Relaxed);
        }
        self.sum
            .store(self.sum.load(Relaxed).saturating_add(v), Relaxed);
        let i = index_of(v);
        let c = &self.counts[i];
        let n = c.load(Relaxed);
        c.store(n + 1, Relaxed);
        if n == 0 {
            let w = &self.nonzero[i / 64];
            w.store(w.load(Relaxed) | 1 << (i % 64), Relaxed);
        }
        let b = &self.buckets[bucket_of(v) as usize];
        b.store(b.load(Relaxed) + 1, Relaxed);
        if self.end.load(Relaxed) <= i {
            self.end.store(i + 1, Relaxed);
        }
    }

    /// Zeroes every count. Only the owning shard calls this; a scrape racing it may see
    /// part of the old counts.
    pub fn reset(&self) {
        let end = self.end.load(Relaxed);
        for c in &self.counts[..end] {
            c.store(0, Relaxed);
        }
        for w in &self.nonzero[..end.div_ceil(64)] {
            w.store(0, Relaxed);
        }
        for b in self.buckets.iter() {
            b.store(0, Relaxed);
        }
        self.end.store(0, Relaxed);
        self.lowest.store(u64::MAX, Relaxed);
        self.highest.store(0, Relaxed);
        self.sum.store(0, Relaxed);
    }

    /// Nothing recorded (since the last reset).
    pub fn is_empty(&self) -> bool {
        self.end.load(Relaxed) == 0
    }
}

/// Several [`AtomicHdr`]s of one layout (one per shard, or window) read as the one histogram
/// their counts add up to, in place: the percentiles and the mean `hdrhistogram` would give
/// for it, and the exact smallest and largest values and the sum beside them.
pub struct Reading<'a> {
    parts: SmallVec<[&'a AtomicHdr; 4]>,
    /// The parts' bucket totals added up.
    buckets: [u64; MAX_BUCKETS],
    total: u64,
    lowest: u64,
    highest: u64,
    sum: u128,
}

impl Default for Reading<'_> {
    fn default() -> Self {
        Reading {
            parts: SmallVec::new(),
            buckets: [0; MAX_BUCKETS],
            total: 0,
            lowest: u64::MAX,
            highest: 0,
            sum: 0,
        }
    }
}

impl<'a> Reading<'a> {
    /// Adds `h`'s counts (a histogram with nothing recorded adds nothing).
    pub fn add(&mut self, h: &'a AtomicHdr) {
        if h.is_empty() {
            return;
        }
        for (acc, b) in self.buckets.iter_mut().zip(h.buckets.iter()) {
            let n = b.load(Relaxed);
            *acc += n;
            self.total += n;
        }
        self.lowest = self.lowest.min(h.lowest.load(Relaxed));
        self.highest = self.highest.max(h.highest.load(Relaxed));
        self.sum += u128::from(h.sum.load(Relaxed));
        self.parts.push(h);
    }

    /// Calls `f(index, count)` for each index of `range` whose count (all parts added) is not
    /// 0, in order, until `f` answers false. Words of 64 counts that are all 0 in every part
    /// are skipped whole.
    fn each_count(&self, range: std::ops::Range<usize>, mut f: impl FnMut(usize, u64) -> bool) {
        let mut w = range.start / 64;
        while w * 64 < range.end {
            let mut bits = self
                .parts
                .iter()
                .map(|p| p.nonzero.get(w).map_or(0, |b| b.load(Relaxed)))
                .fold(0u64, |a, b| a | b);
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if i < range.start || i >= range.end {
                    continue;
                }
                let c: u64 = self
                    .parts
                    .iter()
                    .map(|p| p.counts.get(i).map_or(0, |c| c.load(Relaxed)))
                    .sum();
                if c != 0 && !f(i, c) {
                    return;
                }
            }
            w += 1;
        }
    }

    /// Values counted.
    pub fn len(&self) -> u64 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// What `hdrhistogram`'s `value_at_quantile(q)` answers for `0 < q <= 1`: the highest
    /// value of the first index at which the counts reach `ceil(q * len)` (at least 1); 0
    /// when empty.
    pub fn bucket_quantile(&self, q: f64) -> u64 {
        let target = ((q.min(1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (b, &n) in self.buckets.iter().enumerate() {
            if n == 0 {
                continue;
            }
            if seen + n < target {
                seen += n;
                continue;
            }
            let mut last = None;
            self.each_count(bucket_indexes(b), |i, c| {
                seen += c;
                last = Some(i);
                seen < target
            });
            // (A bucket total read ahead of its counts, racing the writer, ends at the last
            // index that had a count.)
            return last.map_or(0, |i| value_at(i) + range_at(i) - 1);
        }
        0
    }

    /// [`Reading::bucket_quantile`] within the exact smallest and largest values recorded: a
    /// percentile is never above the maximum nor below the minimum.
    pub fn quantile(&self, q: f64) -> u64 {
        let v = self.bucket_quantile(q);
        if self.lowest > self.highest {
            // A reading that raced the first record: no exact range yet.
            return v;
        }
        v.clamp(self.lowest, self.highest)
    }

    /// What `hdrhistogram`'s `mean()` answers: each recorded index's middle value weighted
    /// by its count, added up in index order as it adds them (so the same float).
    pub fn bucket_mean(&self) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let total = self.total as f64;
        let mut mean = 0.0f64;
        for (b, &n) in self.buckets.iter().enumerate() {
            if n == 0 {
                continue;
            }
            self.each_count(bucket_indexes(b), |i, c| {
                let median = value_at(i) + (range_at(i) >> 1);
                mean += median as f64 * c as f64 / total;
                true
            });
        }
        mean
    }

    /// The exact largest value recorded (0: none).
    pub fn max(&self) -> u64 {
        self.highest
    }

    /// The exact smallest value recorded (0: none).
    pub fn min(&self) -> u64 {
        if self.lowest > self.highest {
            0
        } else {
            self.lowest
        }
    }

    /// The exact mean of the values recorded (0: none).
    pub fn mean(&self) -> f64 {
        match self.total {
            0 => 0.0,
            n => self.sum as f64 / n as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hdrhistogram::Histogram;

    fn reference(max: u64) -> Histogram<u64> {
        Histogram::new_with_bounds(1, max, 3).unwrap()
    }

    #[test]
    fn the_layout_is_hdrhistograms() {
        let max = 3_600_000_000_000;
        let reference = reference(max);
        let mut v = 1u64;
        while v < max {
            for x in [v, v + 1, v * 3 / 2, v.saturating_sub(1).max(1)] {
                let i = index_of(x);
                assert_eq!(value_at(i), reference.lowest_equivalent(x), "{x}");
                assert_eq!(range_at(i), reference.equivalent_range(x), "{x}");
                assert!(bucket_indexes(bucket_of(x) as usize).contains(&i), "{x}");
            }
            v = v * 7 / 5 + 1;
        }
        // The same counts, up to the one holding `max` (hdrhistogram rounds up to a bucket).
        let len = AtomicHdr::new(max).counts.len();
        assert!(len <= reference.distinct_values() && len > reference.distinct_values() - 1024);
    }

    fn lcg(x: &mut u64) -> u64 {
        *x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *x >> 33
    }

    /// Several histograms read together answer what one `hdrhistogram` holding all their
    /// values answers: percentiles, mean and count, to the bit.
    #[test]
    fn a_reading_answers_like_hdrhistogram() {
        let mut x = 12345u64;
        for (spread, parts) in [
            (50_000_000u64, 1usize),
            (3_000, 3),
            (2_000_000_000, 2),
            (1, 2),
        ] {
            let hs: Vec<AtomicHdr> = (0..parts).map(|_| AtomicHdr::new(3_600_000_000)).collect();
            let mut direct = reference(3_600_000_000);
            for k in 0..5000 {
                let v = lcg(&mut x) % spread + 1 + if k % 7 == 0 { lcg(&mut x) % 97 } else { 0 };
                hs[k % parts].record(v);
                direct.record(v).unwrap();
            }
            let mut r = Reading::default();
            for h in &hs {
                r.add(h);
            }
            for q in [0.5, 0.9, 0.99, 0.999, 1.0] {
                assert_eq!(r.bucket_quantile(q), direct.value_at_quantile(q), "q {q}");
            }
            assert_eq!(r.bucket_mean().to_bits(), direct.mean().to_bits());
            assert_eq!(r.len(), direct.len());
        }
        let a = AtomicHdr::new(3_600_000_000);
        a.record(5);
        a.reset();
        let mut r = Reading::default();
        r.add(&a);
        assert!(r.is_empty());
        assert_eq!(
            (r.min(), r.max(), r.mean(), r.bucket_mean()),
            (0, 0, 0.0, 0.0)
        );
        assert_eq!(r.bucket_quantile(0.5), 0);
    }

    /// One sample of 73 312: the bucket's highest value is 73 343, above it; the reading
    /// gives the sample itself as maximum, minimum, mean and every percentile.
    #[test]
    fn extremes_and_mean_are_exact_and_bound_the_percentiles() {
        let a = AtomicHdr::new(3_600_000_000_000);
        let b = AtomicHdr::new(3_600_000_000_000);
        a.record(73_312);
        let mut m = Reading::default();
        m.add(&a);
        assert_eq!(m.bucket_quantile(1.0), 73_343, "what a bucket says");
        assert_eq!((m.min(), m.max()), (73_312, 73_312));
        assert_eq!(m.mean(), 73_312.0);
        for q in [0.5, 0.99, 0.999, 1.0] {
            assert_eq!(m.quantile(q), 73_312, "q {q}");
        }
        // Two shards: the extremes and the mean of both.
        b.record(1_000_003);
        b.record(2_000_001);
        m.add(&b);
        assert_eq!((m.min(), m.max()), (73_312, 2_000_001));
        assert_eq!(m.mean(), (73_312.0 + 1_000_003.0 + 2_000_001.0) / 3.0);
        assert!(m.quantile(1.0) <= m.max() && m.quantile(0.999) <= m.max());
        assert!(m.quantile(0.5) >= m.min());
        drop(m);
        b.reset();
        let mut fresh = Reading::default();
        fresh.add(&b);
        assert_eq!((fresh.min(), fresh.max()), (0, 0));
    }
}
