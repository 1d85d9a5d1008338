//! A single-writer HDR histogram of atomics: recorded by one shard (a relaxed load and store
//! of one bucket, no lock, no read-modify-write), read by a scrape on any thread.
//!
//! Its buckets are exactly those of an `hdrhistogram::Histogram` with a lowest discernible
//! value of 1 and 3 significant digits, so [`AtomicHdr::add_to`] rebuilds the very histogram
//! the shard would have recorded: percentiles, mean and maximum come out identical.

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
}

impl AtomicHdr {
    pub fn new(max: u64) -> AtomicHdr {
        let len = index_of(max) + 1;
        AtomicHdr {
            max,
            counts: (0..len).map(|_| AtomicU64::new(0)).collect(),
            end: AtomicUsize::new(0),
        }
    }

    /// An empty `hdrhistogram` with the same layout (for merging).
    pub fn empty_histogram(&self) -> Histogram<u64> {
        Histogram::new_with_bounds(1, self.max, 3).expect("valid histogram bounds")
    }

    /// Records one value. Only the owning shard calls this.
    #[inline]
    pub fn record(&self, v: u64) {
        let i = index_of(v.clamp(1, self.max));
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
    }
}
