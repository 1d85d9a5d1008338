//! What a scrape reads, as the exposition sees it: metrics read what they are handed.
//!
//! The server's cluster implements [`Source`] (in `src/shards/figures.rs`); the exposition
//! knows only this view, never the shards' types. Everything here is a reference to figures
//! the shards keep anyway, or a snapshot the scrape took before: handing the view allocates
//! nothing (a segment snapshot is the table's `Arc`, coerced to [`SegmentList`]).

use std::sync::Arc;

use super::ShardStats;
use super::bus::{BusStats, TierStats};
use super::client::{ClientStats, OpView};
use super::kv_events::KvEventStats;
use super::store::StoreStats;
use super::trace::Tracer;
use crate::common::clock::Clock;
use crate::common::medium::Medium;
use crate::config::Config;
use crate::numa::NodePart;

/// The figures one scrape reads.
pub trait Source {
    fn config(&self) -> &Config;
    fn clock(&self) -> &Clock;
    fn shard_count(&self) -> usize;
    /// Shard `i`'s figures (`i < shard_count()`).
    fn shard(&self, i: usize) -> ShardFigures<'_>;
    /// The mounted segments, in listing order (one consistent snapshot per call).
    fn segments(&self) -> Arc<dyn SegmentList>;
    /// Remote ranks declared lost (no report past the heartbeat timeout), ascending.
    fn lost_ranks(&self) -> Vec<u32>;
    fn kv_stats(&self) -> &KvEventStats;
    fn ha(&self) -> HaFigures;
    /// The SSD figures the local service of remote rank `rank` last reported (default
    /// while it is not live).
    fn remote_disk(&self, rank: u32) -> RemoteDiskFigures;
    /// Where the client figures of mounted rank `rank` come from.
    fn rank_client(&self, rank: u32) -> RankClient;
}

/// Where a rank's client figures (`memcache_bandwidth_*`, `memcache_metric_stale`) come from.
#[derive(Debug, PartialEq)]
pub enum RankClient {
    /// This process moves the rank's bytes and records them itself: a meta service's own
    /// ranks, a local service's rank on that service. Always fresh.
    Own,
    /// A remote rank whose local service reports: the figures of its last report (beside
    /// what this process recorded for the rank itself, such as its exist operations).
    Reported(Vec<OpView>),
    /// A remote rank whose local service has not reported since it joined: no figures yet.
    Silent,
}

impl dyn Source + '_ {
    /// Every shard's figures, in shard order.
    pub fn shards(&self) -> impl Iterator<Item = ShardFigures<'_>> + Clone {
        (0..self.shard_count()).map(|i| self.shard(i))
    }

    /// The client figures this process recorded, merged over its shards, by rank and
    /// operation (only the pairs something was recorded for).
    pub fn recorded_client_views(&self) -> Vec<OpView> {
        let mut acc = Vec::new();
        for s in self.shards() {
            s.client.merge_into(&mut acc);
        }
        super::client::finish(acc)
    }
}

/// One shard's statistics (each written by that shard only).
#[derive(Clone, Copy)]
pub struct ShardFigures<'a> {
    pub stats: &'a ShardStats,
    pub store_stats: &'a StoreStats,
    pub tracer: &'a Tracer,
    pub client: &'a ClientStats,
    pub bus_stats: &'a BusStats,
    pub tier_stats: &'a TierStats,
}

/// The HA facts a scrape shows.
pub struct HaFigures {
    /// Every role's label, in output order, and whether it is this node's now.
    pub roles: [(&'static str, bool); 3],
    /// The leader, serving (HA off: always).
    pub serving: bool,
    pub view_version: u64,
}

/// One mounted segment's figures.
pub trait SegmentFigures {
    /// `rank-<r>-<medium>`.
    fn name(&self) -> &str;
    fn rank(&self) -> u32;
    fn medium(&self) -> Medium;
    fn capacity(&self) -> u64;
    fn used_bytes(&self) -> u64;
    /// The NUMA node parts, by offset (empty without placement).
    fn node_parts(&self) -> &[NodePart];
    /// Bytes allocated to blobs in node part `part`.
    fn used_in_part(&self, part: usize) -> u64;
    /// The SSD file behind the segment, if it is one.
    fn disk(&self) -> Option<&dyn DiskFigures>;
    /// For a remote rank's SSD segment, the status of its file its local service last
    /// reported (0 normal, else an errno); `None` for every other segment.
    fn remote_disk_status(&self) -> Option<u64>;
}

/// A remote rank's SSD as its local service last reported it (`Source::remote_disk`).
#[derive(Default)]
pub struct RemoteDiskFigures {
    pub path: String,
    pub status: u64,
    pub read_bps: u64,
    pub write_bps: u64,
}

/// An SSD segment's file.
pub trait DiskFigures {
    /// Its directory.
    fn dir(&self) -> &str;
    /// 0 normal, else an errno.
    fn status(&self) -> u64;
    /// (bytes read, bytes written) in the `secs` seconds up to `now_secs`.
    fn window_bytes(&self, now_secs: u64, secs: u64) -> (u64, u64);
    /// What the start recovered from the file's journal, and the journal's figures; `None`
    /// when the file keeps no journal (`ock.mmc.ssd.recover=false`).
    fn recovery(&self) -> Option<RecoveryFigures>;
}

/// An SSD file's recovery at the start and its journal since, summed over the shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecoveryFigures {
    /// Blobs taken back into the index at the start, and their bytes.
    pub blobs: u64,
    pub bytes: u64,
    /// Blobs the journal listed that were not taken or were dropped since: past the end of the
    /// file or outside the segment, malformed, refused by the index (their range or key
    /// taken), or whose bytes failed their checksum when read back.
    pub dropped_length: u64,
    pub dropped_invalid: u64,
    pub dropped_conflict: u64,
    pub dropped_checksum: u64,
    /// Recovered blobs read back intact, and those still to read back.
    pub verified: u64,
    pub verify_pending: u64,
    /// How long the recovery held the start (reading and rewriting the journal, indexing).
    pub micros: u64,
    /// The journal: its size, records appended, rewrites, records it could not take (it was
    /// dropped: nothing will be recovered from this file at the next start).
    pub journal_bytes: u64,
    pub journal_records: u64,
    pub journal_compactions: u64,
    pub journal_dropped_records: u64,
}

/// A snapshot of the mounted segments.
pub trait SegmentList {
    fn count(&self) -> usize;
    fn at(&self, i: usize) -> &dyn SegmentFigures;
}

impl<T: SegmentFigures> SegmentList for Vec<Arc<T>> {
    fn count(&self) -> usize {
        self.len()
    }

    fn at(&self, i: usize) -> &dyn SegmentFigures {
        &*self[i]
    }
}

impl dyn SegmentList + '_ {
    pub fn iter(&self) -> impl Iterator<Item = &dyn SegmentFigures> + Clone {
        (0..self.count()).map(|i| self.at(i))
    }
}
