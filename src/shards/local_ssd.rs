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

use super::Shared;
use super::store::mount;
use super::store::ssd::journal::Record;
use crate::cluster::catalog::SsdChange;

/// How long a catalog change waits for its journal records before it is acknowledged all the
/// same (a disk that does not answer).
const SETTLE_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Shared {
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
        let mut catalog = self.membership.local.catalog();
        for e in entries {
            catalog.add(e);
        }
        drop(catalog);
        let (in_step, heard_by) = read_in_step(&in_step_path(dir, rank));
        self.membership
            .local
            .in_step
            .store(in_step, std::sync::atomic::Ordering::Release);
        self.membership
            .local
            .heard_by
            .store(heard_by, std::sync::atomic::Ordering::Release);
        log::info!(
            "{name}: {n} blobs ({bytes} bytes) recovered from the SSD file in {:.1} ms: they are in the catalog the first join hands over (last in step with leadership {in_step}, meta lineage {heard_by}; only that one adopts it)",
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

    /// The catalog is in step with leadership `view` from now on: recorded beside the SSD file
    /// a restart recovers (written to a temporary file, synced, renamed), so the next process
    /// says it when it joins (`members::JoinRequest::in_step`). Blocking (the agent's thread).
    /// A record that fails to land leaves an older view there: the next leader may void the
    /// catalog, never adopt one that missed a leadership.
    /// `lineage` is the answering meta's (`cluster::agent::Admission::lineage`): a recovered
    /// catalog is adopted only by that lineage (`members::JoinRequest::heard_by`).
    pub fn record_in_step(&self, view: u64, lineage: u64) {
        self.membership
            .local
            .in_step
            .store(view, std::sync::atomic::Ordering::Release);
        self.membership
            .local
            .heard_by
            .store(lineage, std::sync::atomic::Ordering::Release);
        let s = &self.config.store;
        let (true, Some(rank), false) = (
            s.ssd_enable && s.ssd_recover,
            self.config.cluster.local_rank,
            s.ssd_dirs.is_empty(),
        ) else {
            return;
        };
        let path = in_step_path(&s.ssd_dirs[rank as usize % s.ssd_dirs.len()], rank);
        if let Err(e) = write_in_step(&path, view, lineage) {
            log::warn!(
                "cannot record in {} that the catalog is in step with leadership {view}: {e} (after a restart its SSD blobs may be dropped rather than handed over)",
                path.display()
            );
        }
    }
}

/// Beside rank `rank`'s SSD file: the leadership its catalog was last in step with and the
/// lineage of the meta that heard it last (`<view> <lineage>`; a file of one number, written by
/// an earlier version, names no lineage: 0, which no meta adopts a recovered catalog under).
fn in_step_path(dir: &str, rank: u32) -> std::path::PathBuf {
    let mut p = super::store::ssd::SsdFile::path_in(dir, rank).into_os_string();
    p.push(".in_step");
    p.into()
}

/// 0 when absent or unreadable: a catalog in step with no known leadership.
fn read_in_step(path: &std::path::Path) -> (u64, u64) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return (0, 0);
    };
    let mut words = text.split_ascii_whitespace().map(str::parse::<u64>);
    match (words.next(), words.next(), words.next()) {
        (Some(Ok(view)), Some(Ok(lineage)), None) => (view, lineage),
        (Some(Ok(view)), None, None) => (view, 0),
        _ => (0, 0),
    }
}

fn write_in_step(path: &std::path::Path, view: u64, lineage: u64) -> std::io::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)?;
    writeln!(f, "{view} {lineage}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_in_step_record_is_read_back_and_absent_is_zero() {
        let dir = std::env::temp_dir().join(format!("mmc-in-step-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = in_step_path(dir.to_str().unwrap(), 3);
        assert_eq!(read_in_step(&path), (0, 0));
        write_in_step(&path, 41, 7).unwrap();
        write_in_step(&path, 57, 1_700_000_000_123).unwrap();
        assert_eq!(read_in_step(&path), (57, 1_700_000_000_123));
        // An earlier version's record names no lineage.
        std::fs::write(&path, "58\n").unwrap();
        assert_eq!(read_in_step(&path), (58, 0));
        std::fs::write(&path, "garbage").unwrap();
        assert_eq!(read_in_step(&path), (0, 0));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
