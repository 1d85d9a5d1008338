//! The cluster as a scrape sees it: `Shared` hands the exposition its figures through
//! [`metrics::view::Source`](crate::metrics::view::Source), so `src/metrics` reads what it is
//! handed and knows none of the shards' types. Nothing here allocates beyond what the
//! figures themselves do (the rank registry's lost list, the HA snapshot).

use std::sync::Arc;

use super::Shared;
use super::store::segment::Segment;
use super::store::ssd::SsdFile;
use crate::common::clock::Clock;
use crate::common::medium::Medium;
use crate::config::Config;
use crate::ha::Role;
use crate::metrics::kv_events::KvEventStats;
use crate::metrics::view::{
    DiskFigures, HaFigures, RankClient, RecoveryFigures, RemoteDiskFigures, SegmentFigures,
    SegmentList, ShardFigures, Source,
};
use crate::numa::NodePart;

impl Source for Shared {
    fn config(&self) -> &Config {
        &self.config
    }

    fn clock(&self) -> &Clock {
        &self.clock
    }

    fn shard_count(&self) -> usize {
        self.shards.len()
    }

    fn shard(&self, i: usize) -> ShardFigures<'_> {
        let s = &self.shards[i];
        ShardFigures {
            stats: &s.stats,
            store_stats: &s.store_stats,
            tracer: &s.tracer,
            client: &s.client,
            bus_stats: &s.bus_stats,
            tier_stats: &s.tier_stats,
        }
    }

    fn segments(&self) -> Arc<dyn SegmentList> {
        self.segments.snapshot()
    }

    fn remote_disk(&self, rank: u32) -> RemoteDiskFigures {
        let r = self.membership.ranks.report(rank).unwrap_or_default();
        RemoteDiskFigures {
            path: r.ssd_path,
            status: r.ssd_status as u64,
            read_bps: r.ssd_read_bps,
            write_bps: r.ssd_write_bps,
        }
    }

    fn lost_ranks(&self) -> Vec<u32> {
        self.membership.ranks.lost()
    }

    fn rank_client(&self, rank: u32) -> RankClient {
        let remote = self
            .segments
            .snapshot()
            .iter()
            .any(|s| s.rank == rank && s.backend.remote().is_some());
        if !remote {
            return RankClient::Own;
        }
        match self.membership.ranks.report(rank) {
            Some(r) => RankClient::Reported(r.client),
            None => RankClient::Silent,
        }
    }

    fn kv_stats(&self) -> &KvEventStats {
        &self.exports.kv_stats
    }

    fn ha(&self) -> HaFigures {
        let now = self.ha.snapshot();
        HaFigures {
            roles: [Role::Leader, Role::Standby, Role::Unknown]
                .map(|r| (r.as_str(), r == now.role)),
            // A local service serves its data plane once joined, but is never the leader.
            serving: self.ha.serving() && now.role == Role::Leader,
            view_version: now.view_version,
        }
    }
}

impl SegmentFigures for Segment {
    fn name(&self) -> &str {
        &self.name
    }

    fn rank(&self) -> u32 {
        self.rank
    }

    fn medium(&self) -> Medium {
        self.medium
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn used_bytes(&self) -> u64 {
        Segment::used_bytes(self)
    }

    fn node_parts(&self) -> &[NodePart] {
        Segment::node_parts(self)
    }

    fn used_in_part(&self, part: usize) -> u64 {
        Segment::used_in_part(self, part)
    }

    fn disk(&self) -> Option<&dyn DiskFigures> {
        self.backend.file().map(|f| f as &dyn DiskFigures)
    }

    fn remote_disk_status(&self) -> Option<u64> {
        self.backend
            .remote()
            .filter(|_| self.medium == Medium::Ssd)
            .map(|r| r.disk_status() as u64)
    }
}

impl DiskFigures for SsdFile {
    fn dir(&self) -> &str {
        &self.dir
    }

    fn status(&self) -> u64 {
        SsdFile::status(self) as u64
    }

    fn window_bytes(&self, now_secs: u64, secs: u64) -> (u64, u64) {
        SsdFile::window_bytes(self, now_secs, secs)
    }

    fn recovery(&self) -> Option<RecoveryFigures> {
        let j = self.journal()?;
        let (r, f) = (&self.recovery, &j.figures);
        let mut v = RecoveryFigures {
            dropped_length: r.dropped_length.get(),
            dropped_invalid: r.dropped_invalid.get(),
            micros: self.recovery_micros(),
            journal_bytes: f.bytes.get(),
            journal_records: f.records.get(),
            journal_compactions: f.compactions.get(),
            journal_dropped_records: f.dropped_records.get(),
            ..Default::default()
        };
        for s in self.shard_stats() {
            v.blobs += s.recovered.get();
            v.bytes += s.recovered_bytes.get();
            v.dropped_conflict += s.recover_refused.get();
            v.dropped_checksum += s.verify_damaged.get();
            v.verified += s.verified.get();
            v.verify_pending += s.verify_pending.get().max(0) as u64;
        }
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use crate::metrics::exposition::render_summary;
    use crate::shards::{FrontAssets, Shared};

    #[test]
    fn summary_has_the_seed_fields_in_order() {
        let shared =
            Shared::new(crate::config::Config::defaults(), 2, FrontAssets::default()).unwrap();
        let mut buf = Vec::new();
        render_summary(&*shared, &mut buf);
        let line = String::from_utf8(buf).unwrap();
        assert!(!line.contains('\n'));
        let keys: Vec<&str> = line
            .split(' ')
            .map(|kv| kv.split('=').next().unwrap())
            .collect();
        let expected = "keys evict rewarm rewarm_fail rewarm_bytes_total rewarm_bytes_current flush_blobs flush_bytes get_hit_dram get_hit_ssd hbm_used dram_used ssd_used alloc_req alloc_success alloc_fail batch_alloc_req batch_alloc_success batch_alloc_fail get_req get_success get_fail get_not_found batch_get_req batch_get_success batch_get_fail batch_get_not_found remove_req remove_success remove_fail remove_not_found batch_remove_req batch_remove_success batch_remove_fail batch_remove_not_found remove_all_req remove_all_success remove_all_fail update_state_req update_state_success update_state_fail update_state_not_found batch_update_state_req batch_update_state_success batch_update_state_fail batch_update_state_not_found query_req query_success query_fail query_not_found batch_query_req batch_query_success batch_query_fail batch_query_not_found get_all_keys_req get_all_keys_success get_all_keys_fail exist_key_req exist_key_success exist_key_fail exist_key_not_found batch_exist_key_req batch_exist_key_success batch_exist_key_fail batch_exist_key_not_found mount_req mount_success mount_fail unmount_req unmount_success unmount_fail";
        assert_eq!(keys.join(" "), expected);
        assert_eq!(keys.len(), 71);
        assert!(
            line.contains(" hbm_used=0/1073741824 dram_used=0/1073741824 ssd_used=0/0 "),
            "{line}"
        );
    }
}
