//! Per-shard statistics primitives.
//!
//! A [`Counter`] is written only by the shard that owns it, so an increment is a relaxed load
//! and a relaxed store: no read-modify-write, no cache-line ping-pong. Any thread may read it;
//! a scrape sums the shards' counters. Readers may see a value a few increments old, never a
//! torn or decreasing one (single writer, 64-bit atomics).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

#[derive(Default, Debug)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`. Must only be called on the owning shard's thread.
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }

    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }

    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }

    /// Adds `n` from a thread that may not be the only writer (a read-modify-write): for
    /// slots shared by callers that are no shard, never on a shard's own counters.
    #[inline]
    pub fn add_shared(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }

    /// Sets the value (the owner clearing it).
    #[inline]
    pub fn set(&self, v: u64) {
        self.0.store(v, Relaxed);
    }
}

/// A gauge owned by one shard (it may go down). Summed across shards when read.
#[derive(Default, Debug)]
pub struct Gauge(AtomicI64);

impl Gauge {
    /// Adds `d` (may be negative). Must only be called on the owning shard's thread.
    #[inline]
    pub fn add(&self, d: i64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(d), Relaxed);
    }

    #[inline]
    pub fn set(&self, v: i64) {
        self.0.store(v, Relaxed);
    }

    #[inline]
    pub fn get(&self) -> i64 {
        self.0.load(Relaxed)
    }
}
