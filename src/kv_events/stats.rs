//! The KV-event publisher's statistics (`/kv_events/status`, `memcache_kv_events_*`), shared by
//! the shards that produce events and the publisher thread that sends them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use crate::shards::store::segment::Medium;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Stored = 0,
    Removed = 1,
    Cleared = 2,
}

impl EventType {
    pub const ALL: [EventType; 3] = [EventType::Stored, EventType::Removed, EventType::Cleared];

    pub fn name(self) -> &'static str {
        match self {
            EventType::Stored => "stored",
            EventType::Removed => "removed",
            EventType::Cleared => "cleared",
        }
    }
}

/// Media in the by-medium counts, `unknown` last (a cleared event has no medium).
pub const MEDIUM_LABELS: [&str; 4] = ["hbm", "dram", "ssd", "unknown"];

pub fn medium_index(m: Option<Medium>) -> usize {
    match m {
        Some(Medium::Hbm) => 0,
        Some(Medium::Dram) => 1,
        Some(Medium::Ssd) => 2,
        None => 3,
    }
}

#[derive(Default, Debug)]
pub struct KvEventStats {
    /// Configured on (and built in).
    pub enabled: AtomicBool,
    /// The publisher thread runs and its socket is bound.
    pub publisher_active: AtomicBool,
    pub published_events: AtomicU64,
    pub published_batches: AtomicU64,
    pub published_by_type: [AtomicU64; 3],
    pub published_by_medium: [AtomicU64; 4],
    pub dropped_events: AtomicU64,
    pub dropped_stored: AtomicU64,
    pub dropped_high_priority: AtomicU64,
    pub skipped_unparsed_keys: AtomicU64,
    /// Events produced (accepted into the queue or dropped); `published + dropped +
    /// queue_size == produced` at every quiescent moment.
    pub produced_events: AtomicU64,
    pub queue_size: AtomicU64,
    pub queue_capacity: AtomicU64,
    /// Sequence number of the last batch sent (0 before the first).
    pub last_sequence: AtomicU64,
    /// Times a shard woke the publisher (an eventfd write); not exported, for tests and
    /// profiling: a steady stream should cost about one per batch.
    pub wakeups: AtomicU64,
}

impl KvEventStats {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Relaxed)
    }
}
