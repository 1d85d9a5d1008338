//! A sliding window of per-second sums, written and read by any thread: the basis of the
//! bandwidth and bytes-per-second gauges. Each slot carries the second it belongs to, so a
//! reader ignores slots older than the window without anyone having to clear them. Writers
//! racing at a second boundary may lose a few counts; these are rates for dashboards.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Seconds kept; windows up to this long can be read.
pub const SLOTS: usize = 64;

pub struct RateWindow {
    origin: Instant,
    sums: [AtomicU64; SLOTS],
    /// The second (since `origin`) each slot's sum belongs to, plus one (0: never written).
    stamps: [AtomicU64; SLOTS],
}

impl RateWindow {
    pub fn new(origin: Instant) -> RateWindow {
        RateWindow {
            origin,
            sums: std::array::from_fn(|_| AtomicU64::new(0)),
            stamps: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    fn second(&self) -> u64 {
        self.origin.elapsed().as_secs()
    }

    /// Adds `n` to the current second.
    pub fn add(&self, n: u64) {
        let sec = self.second();
        let i = (sec % SLOTS as u64) as usize;
        let stamp = sec + 1;
        let old = self.stamps[i].load(Relaxed);
        if old != stamp
            && self.stamps[i]
                .compare_exchange(old, stamp, Relaxed, Relaxed)
                .is_ok()
        {
            // This writer moved the slot to the new second: start its sum over.
            self.sums[i].store(0, Relaxed);
        }
        self.sums[i].fetch_add(n, Relaxed);
    }

    /// The sum over the last `secs` seconds, the current one included.
    pub fn sum(&self, secs: u64) -> u64 {
        let now = self.second();
        let secs = secs.clamp(1, SLOTS as u64 - 1);
        (0..secs)
            .filter_map(|back| now.checked_sub(back))
            .map(|sec| {
                let i = (sec % SLOTS as u64) as usize;
                if self.stamps[i].load(Relaxed) == sec + 1 {
                    self.sums[i].load(Relaxed)
                } else {
                    0
                }
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_the_recent_seconds_only() {
        let w = RateWindow::new(Instant::now());
        w.add(10);
        w.add(5);
        assert_eq!(w.sum(1), 15);
        assert_eq!(w.sum(10), 15);
        let old = RateWindow::new(Instant::now() - std::time::Duration::from_secs(100));
        old.add(7);
        assert_eq!(old.sum(3), 7);
    }
}
