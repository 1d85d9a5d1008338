//! Prometheus-style histograms with fixed buckets, one per shard, written only by their shard
//! and summed when scraped.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Upper bounds for durations in seconds (chunk lifetimes, idle times).
pub const SECONDS_BUCKETS: &[f64] = &[
    0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// Upper bounds for throughput in GB/s (SSD flush and load).
pub const GBS_BUCKETS: &[f64] = &[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0];

pub struct BucketHistogram {
    pub bounds: &'static [f64],
    /// Per-bucket (not cumulative) counts; the last slot is `+Inf`.
    counts: Box<[AtomicU64]>,
    /// The sum of observations, as f64 bits.
    sum: AtomicU64,
}

impl BucketHistogram {
    pub fn new(bounds: &'static [f64]) -> BucketHistogram {
        BucketHistogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// Records one observation. Only the owning shard calls this.
    pub fn observe(&self, v: f64) {
        if !v.is_finite() {
            return;
        }
        let i = self
            .bounds
            .iter()
            .position(|&b| v <= b)
            .unwrap_or(self.bounds.len());
        let c = &self.counts[i];
        c.store(c.load(Relaxed) + 1, Relaxed);
        let s = f64::from_bits(self.sum.load(Relaxed)) + v;
        self.sum.store(s.to_bits(), Relaxed);
    }

    /// Adds this histogram into `acc` (cumulative-ready per-bucket counts, sum).
    pub fn add_to(&self, counts: &mut [u64], sum: &mut f64) {
        for (a, c) in counts.iter_mut().zip(self.counts.iter()) {
            *a += c.load(Relaxed);
        }
        *sum += f64::from_bits(self.sum.load(Relaxed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_sum() {
        let h = BucketHistogram::new(&[1.0, 10.0]);
        for v in [0.5, 1.0, 2.0, 50.0] {
            h.observe(v);
        }
        let mut counts = vec![0; 3];
        let mut sum = 0.0;
        h.add_to(&mut counts, &mut sum);
        assert_eq!(counts, vec![2, 1, 1]);
        assert_eq!(sum, 53.5);
    }
}
