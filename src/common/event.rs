//! The store's lifecycle events: what the store tells the rest of the process about its
//! objects. The store produces them (on its shard); the event bus (`metrics::bus`) and the
//! KV-event publisher (`kv_events`) read them, so they live below all three.

use super::medium::Medium;

/// A lifecycle event of the store.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// An object became readable on a medium (put, demotion, rewarm, flush landing).
    Stored {
        chunk: Option<u64>,
        medium: Medium,
        size: u64,
    },
    /// An object left a medium.
    Removed {
        chunk: Option<u64>,
        medium: Medium,
        size: u64,
    },
    /// Every object was removed.
    Cleared,
    /// A read served from a memory medium.
    Read {
        medium: Medium,
        bytes: u64,
    },
    /// Eviction moved or dropped a blob.
    Evicted {
        medium: Medium,
        bytes: u64,
        lifetime_ms: u64,
        idle_ms: u64,
    },
    FlushStarted {
        bytes: u64,
    },
    Flushed {
        bytes: u64,
        ok: bool,
        micros: u64,
    },
    RewarmStarted {
        bytes: u64,
        prefetch: bool,
    },
    Rewarmed {
        bytes: u64,
        ok: bool,
        micros: u64,
        prefetch: bool,
    },
}
