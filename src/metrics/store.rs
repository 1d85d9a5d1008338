//! The store's business statistics, with the seed's counting rules.
//!
//! `success` is an operation that returned OK; `fail` a real error (a duplicated object
//! included); `not_found` an unmatched key, never also a failure. A batch call counts once at
//! batch level (real error wins over not-found) and each item counts at its single-operation
//! counter. One [`StoreStats`] per shard, written only by that shard, summed when read.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use super::{Counter, Gauge};

/// Ranks with per-rank series (`ock.mmc.metrics.per_rank`). Ranks at or above this are
/// counted only in the totals.
pub const MAX_RANKS: usize = 64;

/// The seed's business operations, in its output order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Alloc,
    BatchAlloc,
    Get,
    BatchGet,
    Remove,
    BatchRemove,
    RemoveAll,
    UpdateState,
    BatchUpdateState,
    Query,
    BatchQuery,
    GetAllKeys,
    ExistKey,
    BatchExistKey,
    Mount,
    Unmount,
}

impl Op {
    pub const ALL: [Op; 16] = [
        Op::Alloc,
        Op::BatchAlloc,
        Op::Get,
        Op::BatchGet,
        Op::Remove,
        Op::BatchRemove,
        Op::RemoveAll,
        Op::UpdateState,
        Op::BatchUpdateState,
        Op::Query,
        Op::BatchQuery,
        Op::GetAllKeys,
        Op::ExistKey,
        Op::BatchExistKey,
        Op::Mount,
        Op::Unmount,
    ];

    /// The name in metric families and summary fields (`batch_get`).
    pub fn name(self) -> &'static str {
        match self {
            Op::Alloc => "alloc",
            Op::BatchAlloc => "batch_alloc",
            Op::Get => "get",
            Op::BatchGet => "batch_get",
            Op::Remove => "remove",
            Op::BatchRemove => "batch_remove",
            Op::RemoveAll => "remove_all",
            Op::UpdateState => "update_state",
            Op::BatchUpdateState => "batch_update_state",
            Op::Query => "query",
            Op::BatchQuery => "batch_query",
            Op::GetAllKeys => "get_all_keys",
            Op::ExistKey => "exist_key",
            Op::BatchExistKey => "batch_exist_key",
            Op::Mount => "mount",
            Op::Unmount => "unmount",
        }
    }

    /// Whether the seed exports a `not_found` counter for this operation.
    pub fn has_not_found(self) -> bool {
        matches!(
            self,
            Op::Get
                | Op::BatchGet
                | Op::Remove
                | Op::BatchRemove
                | Op::UpdateState
                | Op::BatchUpdateState
                | Op::Query
                | Op::BatchQuery
                | Op::ExistKey
                | Op::BatchExistKey
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
    NotFound,
}

impl Outcome {
    /// The batch-level outcome of items: a real error wins, then not-found, else success.
    pub fn of_batch(items: impl IntoIterator<Item = Outcome>) -> Outcome {
        let mut out = Outcome::Success;
        for o in items {
            match o {
                Outcome::Failure => return Outcome::Failure,
                Outcome::NotFound => out = Outcome::NotFound,
                Outcome::Success => {}
            }
        }
        out
    }
}

#[derive(Default, Debug)]
pub struct OpCounters {
    pub requests: Counter,
    pub successes: Counter,
    pub failures: Counter,
    pub not_found: Counter,
}

impl OpCounters {
    fn record(&self, o: Outcome) {
        self.requests.inc();
        match o {
            Outcome::Success => self.successes.inc(),
            Outcome::Failure => self.failures.inc(),
            Outcome::NotFound => self.not_found.inc(),
        }
    }
}

/// Tier counters that the seed also breaks down by rank.
#[derive(Default, Debug)]
pub struct TierCounters {
    pub evict: Counter,
    pub get_hits_dram: Counter,
    pub get_hits_ssd: Counter,
    pub rewarm: Counter,
    pub rewarm_failed: Counter,
    pub rewarm_bytes: Counter,
    /// Object bytes (counted as `rewarm_bytes` counts them) of the DRAM copies made by rewarm
    /// that still exist, so never more than `rewarm_bytes`.
    pub rewarm_bytes_current: Gauge,
    pub flush_blobs: Counter,
    pub flush_bytes: Counter,
}

#[derive(Debug)]
pub struct StoreStats {
    pub ops: [OpCounters; 16],
    pub ops_by_rank: Box<[[OpCounters; 16]]>,
    pub tier: TierCounters,
    pub tier_by_rank: Box<[TierCounters]>,
    /// Objects with at least one readable copy (a running count: scrapes never walk keys).
    pub stored_keys: Gauge,
    /// Eviction passes in progress on this shard (0 or 1).
    pub evict_running: Gauge,
    /// Flush writes that failed (the memory copy was kept).
    pub flush_failed: Counter,
    /// Blobs moved down one tier between memory media (HBM → DRAM).
    pub demoted_blobs: Counter,
    /// Objects deleted by eviction because no lower tier had room.
    pub evicted_objects_deleted: Counter,
    /// Bytes of `/metadata` and objects are in other gauges; this is the blobs' bytes in
    /// flight to SSD.
    pub flush_in_flight_bytes: Gauge,
    /// Objects below their replica count given a new copy on another rank.
    pub rereplicated: Counter,
    /// Re-replication copies that failed (the new blob was freed).
    pub rereplicate_failed: Counter,
    /// Objects below their replica count not queued for re-replication: the queue was full.
    pub rereplicate_overflow: Counter,
    /// Objects queued for re-replication or being copied.
    pub rereplicate_pending: Gauge,
    /// While set, [`StoreStats::record`] counts nothing: the owner shard sets it around a
    /// read it applies for a HEAD request, which is not a business operation. Written only by
    /// the owning shard.
    muted: AtomicBool,
}

impl Default for StoreStats {
    fn default() -> Self {
        StoreStats {
            ops: Default::default(),
            ops_by_rank: (0..MAX_RANKS).map(|_| Default::default()).collect(),
            tier: TierCounters::default(),
            tier_by_rank: (0..MAX_RANKS).map(|_| TierCounters::default()).collect(),
            stored_keys: Gauge::default(),
            evict_running: Gauge::default(),
            flush_failed: Counter::default(),
            demoted_blobs: Counter::default(),
            evicted_objects_deleted: Counter::default(),
            flush_in_flight_bytes: Gauge::default(),
            rereplicated: Counter::default(),
            rereplicate_failed: Counter::default(),
            rereplicate_overflow: Counter::default(),
            rereplicate_pending: Gauge::default(),
            muted: AtomicBool::new(false),
        }
    }
}

impl StoreStats {
    /// Records one operation's outcome (and, when known, the rank it concerned).
    pub fn record(&self, op: Op, outcome: Outcome, rank: Option<u32>) {
        if self.muted.load(Relaxed) {
            return;
        }
        self.ops[op as usize].record(outcome);
        if let Some(r) = rank.filter(|&r| (r as usize) < MAX_RANKS) {
            self.ops_by_rank[r as usize][op as usize].record(outcome);
        }
    }

    /// Stops (`true`) or resumes counting operations. Only the owning shard calls it.
    pub fn set_muted(&self, muted: bool) {
        self.muted.store(muted, Relaxed);
    }

    /// Applies `f` to the totals and to the rank's tier counters.
    pub fn tier(&self, rank: u32, f: impl Fn(&TierCounters)) {
        f(&self.tier);
        if let Some(t) = self.tier_by_rank.get(rank as usize) {
            f(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_outcome_rules() {
        use Outcome::*;
        assert_eq!(Outcome::of_batch([Success, Success]), Success);
        assert_eq!(Outcome::of_batch([Success, NotFound]), NotFound);
        assert_eq!(Outcome::of_batch([NotFound, Failure, NotFound]), Failure);
        assert_eq!(Outcome::of_batch([]), Success);
    }

    #[test]
    fn counts_by_outcome_and_rank() {
        let s = StoreStats::default();
        s.record(Op::Get, Outcome::NotFound, None);
        s.record(Op::Get, Outcome::Success, Some(1));
        s.record(Op::Alloc, Outcome::Failure, Some(200));
        let g = &s.ops[Op::Get as usize];
        assert_eq!(
            (
                g.requests.get(),
                g.successes.get(),
                g.not_found.get(),
                g.failures.get()
            ),
            (2, 1, 1, 0)
        );
        assert_eq!(s.ops_by_rank[1][Op::Get as usize].successes.get(), 1);
        assert_eq!(s.ops[Op::Alloc as usize].failures.get(), 1);
        s.set_muted(true);
        s.record(Op::Get, Outcome::Success, Some(1));
        s.set_muted(false);
        assert_eq!(
            s.ops[Op::Get as usize].requests.get(),
            2,
            "a muted record counts nothing"
        );
        assert_eq!(Op::ALL.iter().filter(|o| o.has_not_found()).count(), 10);
        for (i, op) in Op::ALL.iter().enumerate() {
            assert_eq!(*op as usize, i);
        }
    }
}
