//! A sliding window of per-second sums, written by one shard and read by any thread: the
//! basis of the bytes-per-second gauges. A writer keeps one window per shard and a reader
//! sums them (like [`Counter`](super::Counter)s): an addition is a relaxed load and store,
//! never a read-modify-write across cores. Each slot carries the second it belongs to, so a
//! reader ignores slots older than the window without anyone having to clear them. Seconds
//! are the caller's reading of the process clock (`common::clock::Clock::now_secs`).

use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

/// Seconds kept; windows up to this long can be read.
pub const SLOTS: usize = 64;

pub struct RateWindow {
    sums: [AtomicU64; SLOTS],
    /// The second each slot's sum belongs to, plus one (0: never written).
    stamps: [AtomicU64; SLOTS],
}

impl Default for RateWindow {
    fn default() -> RateWindow {
        RateWindow {
            sums: std::array::from_fn(|_| AtomicU64::new(0)),
            stamps: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl RateWindow {
    /// Adds `n` to second `now_secs`. Owner (one shard) only.
    pub fn add(&self, now_secs: u64, n: u64) {
        let i = (now_secs % SLOTS as u64) as usize;
        let stamp = now_secs + 1;
        if self.stamps[i].load(Relaxed) == stamp {
            self.sums[i].store(self.sums[i].load(Relaxed) + n, Relaxed);
        } else {
            // The slot moves to this second: its sum starts over, and is in place before a
            // reader can see the new stamp (Release / Acquire).
            self.sums[i].store(n, Relaxed);
            self.stamps[i].store(stamp, Release);
        }
    }

    /// The sum over the `secs` seconds up to `now_secs`, that one included.
    pub fn sum(&self, now_secs: u64, secs: u64) -> u64 {
        let secs = secs.clamp(1, SLOTS as u64 - 1);
        (0..secs)
            .filter_map(|back| now_secs.checked_sub(back))
            .map(|sec| {
                let i = (sec % SLOTS as u64) as usize;
                if self.stamps[i].load(Acquire) == sec + 1 {
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
        let w = RateWindow::default();
        w.add(100, 10);
        w.add(100, 5);
        assert_eq!(w.sum(100, 1), 15);
        assert_eq!(w.sum(100, 10), 15);
        w.add(102, 7);
        assert_eq!(w.sum(102, 1), 7);
        assert_eq!(w.sum(102, 3), 22);
        // Second 100 has left a 2-second window; its slot, reused SLOTS seconds later,
        // starts over.
        assert_eq!(w.sum(102, 2), 7);
        w.add(100 + SLOTS as u64, 1);
        assert_eq!(w.sum(100 + SLOTS as u64, 1), 1);
        assert_eq!(w.sum(0, 1), 0, "seconds never written read as 0");
    }
}
