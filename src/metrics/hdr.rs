//! A single-writer HDR histogram of atomics: recorded by one shard (a relaxed load and store
//! of one bucket, no lock, no read-modify-write), read by a scrape on any thread.
//!
//! Its buckets are exactly those of an `hdrhistogram::Histogram` with a lowest discernible
//! value of 1 and 3 significant digits, so [`AtomicHdr::add_to`] rebuilds the very histogram
//! the shard would have recorded: percentiles, mean and maximum come out identical.
//!
//! A bucket only bounds its values (a histogram's maximum is the highest value of the bucket
//! its largest sample fell in: one sample of 73 312 ns reads 73 343), so the exact smallest
//! and largest values and the sum are kept beside the counts; [`Merged`] reports those, and
//! clamps the percentiles to them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use hdrhistogram::Histogram;

/// `hdrhistogram`'s layout for 3 significant digits and unit 1: buckets of 2048 sub-buckets,
/// the upper half of each used past bucket 0.
const SUB_BUCKET_HALF_MAGNITUDE: u32 = 10;
const SUB_BUCKET_MASK: u64 = (1 << (SUB_BUCKET_HALF_MAGNITUDE + 1)) - 1;
const LEADING_ZERO_BASE: u32 = 64 - (SUB_BUCKET_HALF_MAGNITUDE + 1);

/// The counts index of `v` (as `hdrhistogram` computes it).
fn index_of(v: u64) -> usize {
    let bucket = LEADING_ZERO_BASE - (v | SUB_BUCKET_MASK).leading_zeros();
    let sub = v >> bucket;
    ((bucket as u64 + 1) << SUB_BUCKET_HALF_MAGNITUDE) as usize + sub as usize
        - (1 << SUB_BUCKET_HALF_MAGNITUDE)
}

/// The lowest value counted at `index`.
fn value_at(index: usize) -> u64 {
    let half = 1usize << SUB_BUCKET_HALF_MAGNITUDE;
    if index < 2 * half {
        return index as u64;
    }
    let bucket = (index >> SUB_BUCKET_HALF_MAGNITUDE) - 1;
    let sub = (index & (half - 1)) + half;
    (sub as u64) << bucket
}

/// Values from 1 to `max` (larger ones are clamped), 3 significant digits.
pub struct AtomicHdr {
    max: u64,
    counts: Box<[AtomicU64]>,
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
            end: AtomicUsize::new(0),
            lowest: AtomicU64::new(u64::MAX),
            highest: AtomicU64::new(0),
            sum: AtomicU64::new(0),
        }
    }

    /// An empty `hdrhistogram` with the same layout (for merging).
    pub fn empty_histogram(&self) -> Histogram<u64> {
        Histogram::new_with_bounds(1, self.max, 3).expect("valid histogram bounds")
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
        c.store(c.load(Relaxed) + 1, Relaxed);
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
        self.end.store(0, Relaxed);
        self.lowest.store(u64::MAX, Relaxed);
        self.highest.store(0, Relaxed);
        self.sum.store(0, Relaxed);
    }

    /// Nothing recorded (since the last reset).
    pub fn is_empty(&self) -> bool {
        self.end.load(Relaxed) == 0
    }

    /// Adds the recorded counts into `h` (made by [`AtomicHdr::empty_histogram`]).
    pub fn add_to(&self, h: &mut Histogram<u64>) {
        let end = self.end.load(Relaxed).min(self.counts.len());
        for (i, c) in self.counts[..end].iter().enumerate() {
            let n = c.load(Relaxed);
            if n > 0 {
                let _ = h.record_n(value_at(i), n);
            }
        }
    }
}

/// Several [`AtomicHdr`]s (one per shard) merged for one reading: the histogram for the
/// percentiles, and the exact smallest and largest values and the sum beside it.
pub struct Merged {
    hist: Histogram<u64>,
    lowest: u64,
    highest: u64,
    sum: u128,
}

impl Merged {
    /// Nothing merged yet, in the layout of `like`.
    pub fn new(like: &AtomicHdr) -> Merged {
        Merged {
            hist: like.empty_histogram(),
            lowest: u64::MAX,
            highest: 0,
            sum: 0,
        }
    }

    pub fn add(&mut self, h: &AtomicHdr) {
        h.add_to(&mut self.hist);
        self.lowest = self.lowest.min(h.lowest.load(Relaxed));
        self.highest = self.highest.max(h.highest.load(Relaxed));
        self.sum += u128::from(h.sum.load(Relaxed));
    }

    pub fn is_empty(&self) -> bool {
        self.hist.is_empty()
    }

    /// The value at quantile `q` (the highest value of its bucket, as hdrhistogram answers),
    /// within the exact smallest and largest values recorded: a percentile is never above
    /// the maximum nor below the minimum.
    pub fn quantile(&self, q: f64) -> u64 {
        let v = self.hist.value_at_quantile(q);
        if self.lowest > self.highest {
            // A reading that raced the first record: no exact range yet.
            return v;
        }
        v.clamp(self.lowest, self.highest)
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
        match self.hist.len() {
            0 => 0.0,
            n => self.sum as f64 / n as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_hdrhistograms() {
        let max = 3_600_000_000_000;
        let reference = Histogram::<u64>::new_with_bounds(1, max, 3).unwrap();
        let mut v = 1u64;
        while v < max {
            for x in [v, v + 1, v * 3 / 2, v.saturating_sub(1).max(1)] {
                assert_eq!(value_at(index_of(x)), reference.lowest_equivalent(x), "{x}");
            }
            v = v * 7 / 5 + 1;
        }
        // The same counts, up to the one holding `max` (hdrhistogram rounds up to a bucket).
        let len = AtomicHdr::new(max).counts.len();
        assert!(len <= reference.distinct_values() && len > reference.distinct_values() - 1024);
    }

    #[test]
    fn a_rebuilt_histogram_answers_like_the_original() {
        let a = AtomicHdr::new(3_600_000_000);
        let mut direct = a.empty_histogram();
        let mut x = 12345u64;
        for _ in 0..5000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let v = (x >> 33) % 50_000_000 + 1;
            a.record(v);
            direct.record(v).unwrap();
        }
        let mut rebuilt = a.empty_histogram();
        a.add_to(&mut rebuilt);
        for q in [0.5, 0.9, 0.99, 0.999] {
            assert_eq!(rebuilt.value_at_quantile(q), direct.value_at_quantile(q));
        }
        assert_eq!(rebuilt.mean(), direct.mean());
        assert_eq!(rebuilt.max(), direct.max());
        assert_eq!(rebuilt.len(), 5000);
        a.reset();
        let mut empty = a.empty_histogram();
        a.add_to(&mut empty);
        assert!(empty.is_empty());
        let m = Merged::new(&a);
        assert!(m.is_empty());
        assert_eq!((m.min(), m.max(), m.mean()), (0, 0, 0.0));
    }

    /// One sample of 73 312: the bucket's highest value is 73 343, above it; the merged
    /// reading gives the sample itself as maximum, minimum, mean and every percentile.
    #[test]
    fn extremes_and_mean_are_exact_and_bound_the_percentiles() {
        let a = AtomicHdr::new(3_600_000_000_000);
        a.record(73_312);
        let mut bucketed = a.empty_histogram();
        a.add_to(&mut bucketed);
        assert_eq!(bucketed.max(), 73_343, "what a bucket says");
        let mut m = Merged::new(&a);
        m.add(&a);
        assert_eq!((m.min(), m.max()), (73_312, 73_312));
        assert_eq!(m.mean(), 73_312.0);
        for q in [0.0, 0.5, 0.99, 0.999, 1.0] {
            assert_eq!(m.quantile(q), 73_312, "q {q}");
        }
        // Two shards: the extremes and the mean of both.
        let b = AtomicHdr::new(3_600_000_000_000);
        b.record(1_000_003);
        b.record(2_000_001);
        m.add(&b);
        assert_eq!((m.min(), m.max()), (73_312, 2_000_001));
        assert_eq!(m.mean(), (73_312.0 + 1_000_003.0 + 2_000_001.0) / 3.0);
        assert!(m.quantile(1.0) <= m.max() && m.quantile(0.999) <= m.max());
        assert!(m.quantile(0.0) >= m.min());
        b.reset();
        let mut fresh = Merged::new(&b);
        fresh.add(&b);
        assert_eq!((fresh.min(), fresh.max()), (0, 0));
    }
}
