//! A local service's SSD file across its restarts. With `ock.mmc.ssd.recover` and its rank
//! configured (`ock.mmc.local_service.rank`: the file is named by it), a local service opens
//! its SSD file at start with what its journal lists, mounts it under that rank and puts the
//! blobs in its catalog, so its first join says the catalog follows and the meta adopts them
//! (the catalog hand-over's rules: a newer version of a key on the meta wins). From then on
//! it journals the catalog's committed SSD entries: a tier move's copy once the meta's log
//! says it landed, a freed record, a range reused, a catalog dropped or replaced
//! (`cluster::catalog::SsdChange`, written by the journals' thread on the slot of producers
//! that are no shard, in the catalog's order). Its memory tiers are not recovered.
//!
//! A recovered blob's bytes are not read back here: every read of an SSD copy on a local
//! service is checked against the checksum the meta holds (a rewarm through a tier move, a
//! redirected read), and a damaged one is dropped on the meta.

use super::Cluster;
use super::store::mount;
use super::store::ssd::journal::Record;
use crate::cluster::catalog::SsdChange;

/// How long a catalog change waits for its journal records before it is acknowledged all the
/// same (a disk that does not answer).
const SETTLE_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Cluster {
    /// At a local service's start (recovery on, rank configured): opens, mounts and catalogs
    /// what its SSD file held.
    pub(super) fn recover_local_ssd(&self) -> Result<(), String> {
        let s = &self.config.store;
        let Some(journals) = &self.journals else {
            return Ok(());
        };
        let Some(rank) = self.config.cluster.local_rank else {
            log::info!(
                "ock.mmc.ssd.recover: a local service recovers its SSD file only with ock.mmc.local_service.rank set (the file is named by the rank): this one's starts empty"
            );
            return Ok(());
        };
        let dir = &s.ssd_dirs[rank as usize % s.ssd_dirs.len()];
        let slot = journals.shared_slot() as usize;
        let started = std::time::Instant::now();
        let file =
            super::store::ssd::recover::open(dir, rank, s.ssd_bytes, slot + 1, journals, &|_| slot)
                .map_err(|e| format!("cannot open the SSD file of rank {rank} in {dir}: {e}"))?;
        let entries = file.take_recovered(slot);
        let (n, bytes) = (
            entries.len() as u64,
            entries.iter().map(|e| e.size).sum::<u64>(),
        );
        let stats = &file.shard_stats()[slot];
        stats.recovered.add(n);
        stats.recovered_bytes.add(bytes);
        let seg = mount::ssd_segment(
            &self.segments,
            rank,
            s.ssd_bytes,
            file,
            self.shard_count(),
            s.run_bytes,
        );
        let name = seg.name.clone();
        self.segments.insert(seg)?;
        let mut catalog = self.local.catalog();
        for e in entries {
            catalog.add(e);
        }
        log::info!(
            "{name}: {n} blobs ({bytes} bytes) recovered from the SSD file in {:.1} ms: they are in the catalog the first join hands over",
            started.elapsed().as_secs_f64() * 1e3
        );
        Ok(())
    }

    /// Journals what a change did to the catalog's committed SSD entries. The caller holds the
    /// catalog's lock (it orders the records as the catalog changed).
    pub fn journal_catalog(&self, changes: Vec<SsdChange>) {
        if changes.is_empty() {
            return;
        }
        let Some(journals) = &self.journals else {
            return;
        };
        let Some(file) = self
            .segments
            .snapshot()
            .iter()
            .find_map(|s| s.backend.file()?.journal().map(|l| l.file))
        else {
            return;
        };
        let shard = journals.shared_slot();
        journals.push_shared(
            file,
            changes.into_iter().map(|c| match c {
                SsdChange::Added(entry) => Record::Add { shard, entry },
                SsdChange::Removed { offset, stamp } => Record::Remove {
                    shard,
                    offset,
                    stamp,
                },
                SsdChange::Cleared => Record::Clear { shard },
            }),
        );
    }

    /// What the journals hold emitted now (`None`: no SSD file is journaled): a change then
    /// waits for what is emitted after it.
    pub fn journal_mark(&self) -> Option<Vec<u64>> {
        self.journals.as_ref().map(|j| j.mark())
    }

    /// Waits (blocking: the agent's thread, never a shard) until every journal record emitted
    /// since `mark` is on file, at most [`SETTLE_LIMIT`].
    pub fn journal_settle_blocking(&self, mark: Option<Vec<u64>>) {
        let (Some(j), Some(mark)) = (&self.journals, mark) else {
            return;
        };
        let deadline = std::time::Instant::now() + SETTLE_LIMIT;
        while !j.settled(&mark) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
}
