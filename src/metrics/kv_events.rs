//! The KV-event publisher's statistics (`/kv_events/status`, `memcache_kv_events_*`), shared by
//! the shards that produce events and the publisher thread (`kv_events`) that sends them. Here,
//! below both, so the exposition reads them without importing the publisher.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use super::Counter;
use crate::common::medium::Medium;

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
pub const MEDIUM_LABELS: [&str; 4] = [
    Medium::Hbm.lower(),
    Medium::Dram.lower(),
    Medium::Ssd.lower(),
    "unknown",
];

pub fn medium_index(m: Option<Medium>) -> usize {
    m.map_or(Medium::ALL.len(), |m| m as usize)
}

/// What one shard counts as it produces events. Written only by that shard (relaxed load and
/// store), summed when read.
#[derive(Default, Debug)]
pub struct ShardKvCounters {
    /// Events produced (accepted into the queue or dropped).
    pub produced: Counter,
    pub dropped_stored: Counter,
    pub dropped_high_priority: Counter,
    pub skipped_unparsed_keys: Counter,
    /// Times this shard woke the publisher (an eventfd write).
    pub wakeups: Counter,
}

/// A shard's counters on their own cache line, so shards never write a line another writes.
#[derive(Default, Debug)]
#[repr(align(128))]
struct Padded(ShardKvCounters);

#[derive(Debug)]
pub struct KvEventStats {
    /// Configured on (and built in).
    pub enabled: AtomicBool,
    /// The publisher thread runs and its socket is bound.
    pub publisher_active: AtomicBool,
    /// Written only by the publisher thread.
    pub published_events: Counter,
    pub published_batches: Counter,
    pub published_by_type: [Counter; 3],
    pub published_by_medium: [Counter; 4],
    /// One slot per shard; the last one is shared by callers past the shard count (tests and
    /// benches that produce from other threads) and written with read-modify-writes.
    shards: Box<[Padded]>,
    /// Stored by whoever pushed or popped last (a plain store, no read-modify-write).
    pub queue_size: AtomicU64,
    pub queue_capacity: AtomicU64,
    /// Sequence number of the last batch sent (0 before the first).
    pub last_sequence: AtomicU64,
    /// Written only by the publisher thread (not exported): leadership epochs begun, and
    /// events of an ended leadership that were not sent.
    pub epochs: Counter,
    pub discarded_not_leader: Counter,
}

impl Default for KvEventStats {
    fn default() -> Self {
        KvEventStats::new(1)
    }
}

/// Sums a field over the shards' slots.
macro_rules! summed {
    ($($(#[$doc:meta])* $name:ident),*) => {
        $(
            $(#[$doc])*
            pub fn $name(&self) -> u64 {
                self.shards.iter().map(|s| s.0.$name.get()).sum()
            }
        )*
    };
}

impl KvEventStats {
    /// Statistics for `shards` producing shards.
    pub fn new(shards: usize) -> KvEventStats {
        KvEventStats {
            enabled: AtomicBool::new(false),
            publisher_active: AtomicBool::new(false),
            published_events: Counter::default(),
            published_batches: Counter::default(),
            published_by_type: Default::default(),
            published_by_medium: Default::default(),
            shards: (0..=shards).map(|_| Padded::default()).collect(),
            queue_size: AtomicU64::new(0),
            queue_capacity: AtomicU64::new(0),
            last_sequence: AtomicU64::new(0),
            epochs: Counter::default(),
            discarded_not_leader: Counter::default(),
        }
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Relaxed)
    }

    /// Counts one event of `shard` with `f` (e.g. `|c| &c.produced`): a single-writer
    /// increment on the shard's own slot; a caller that is no shard shares the last slot.
    pub fn count(&self, shard: usize, f: impl Fn(&ShardKvCounters) -> &Counter) {
        let last = self.shards.len() - 1;
        if shard < last {
            f(&self.shards[shard].0).inc();
        } else {
            f(&self.shards[last].0).add_shared(1);
        }
    }

    summed!(
        /// Events produced; `published + dropped + discarded_not_leader + queue_size ==
        /// produced` at every quiescent moment (an epoch's opening `AllBlocksCleared` counts
        /// as produced and published).
        produced,
        dropped_stored,
        dropped_high_priority,
        skipped_unparsed_keys,
        /// Not exported, for tests and profiling: a steady stream should cost about one per
        /// batch.
        wakeups
    );

    /// Events dropped on queue pressure (both kinds).
    pub fn dropped_events(&self) -> u64 {
        self.dropped_stored() + self.dropped_high_priority()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_slots_sum_when_read() {
        let s = KvEventStats::new(2);
        s.count(0, |c| &c.produced);
        s.count(1, |c| &c.produced);
        s.count(1, |c| &c.dropped_stored);
        s.count(0, |c| &c.dropped_high_priority);
        // Not a shard (a bench's producer, the stopping publisher): the shared slot.
        s.count(usize::MAX, |c| &c.produced);
        s.count(7, |c| &c.wakeups);
        assert_eq!(s.produced(), 3);
        assert_eq!(
            (
                s.dropped_stored(),
                s.dropped_high_priority(),
                s.dropped_events()
            ),
            (1, 1, 2)
        );
        assert_eq!(s.wakeups(), 1);
        assert_eq!(s.skipped_unparsed_keys(), 0);
    }
}
