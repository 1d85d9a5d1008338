//! Creating segments: the ones the configuration names at start, and `mount` at run time.

use std::sync::Arc;

use super::memory::MappedRegion;
use super::segment::{Backend, MAX_SEGMENT_BYTES, Medium, PAGE_BYTES, Segment, SegmentTable};
use super::ssd::SsdFile;
use crate::accel::HostEmulated;
use crate::config::Config;

/// Creates a segment's backing memory or file. Errors are the message for the operator or
/// client. Blocks on file syscalls for SSD: for the start-up thread; a shard thread uses
/// [`build_segment_off_shard`].
pub fn build_segment(
    table: &SegmentTable,
    rank: u32,
    medium: Medium,
    size: u64,
    ssd_dir: Option<&str>,
    shards: usize,
    run_bytes: u64,
) -> Result<Arc<Segment>, String> {
    check_size(size)?;
    let name = super::segment::segment_name(rank, medium);
    let backend = match medium {
        Medium::Ssd => {
            let dir = ssd_dir.ok_or_else(|| format!("{name}: an SSD segment needs a directory"))?;
            let file = SsdFile::create(dir, rank, size).map_err(|e| ssd_error(&name, dir, e))?;
            Backend::File(Box::new(file))
        }
        m => memory_backend(m, size, &name)?,
    };
    Ok(new_segment(
        table, rank, medium, size, backend, shards, run_bytes,
    ))
}

/// [`build_segment`] for a shard thread: an SSD file's creation (`create_dir_all`, open with
/// truncate, `set_len`) runs on a helper thread and is awaited, so the shard never blocks on
/// a file. Memory segments are only reserved (an anonymous mapping), which is no file I/O.
pub async fn build_segment_off_shard(
    table: &SegmentTable,
    rank: u32,
    medium: Medium,
    size: u64,
    ssd_dir: Option<String>,
    shards: usize,
    run_bytes: u64,
) -> Result<Arc<Segment>, String> {
    check_size(size)?;
    let name = super::segment::segment_name(rank, medium);
    let backend = match medium {
        Medium::Ssd => {
            let dir = ssd_dir.ok_or_else(|| format!("{name}: an SSD segment needs a directory"))?;
            let file = create_ssd_file_off_shard(dir.clone(), rank, size)
                .await
                .map_err(|e| ssd_error(&name, &dir, e))?;
            Backend::File(Box::new(file))
        }
        m => memory_backend(m, size, &name)?,
    };
    Ok(new_segment(
        table, rank, medium, size, backend, shards, run_bytes,
    ))
}

/// Creates the SSD file on a short-lived helper thread (mounts are rare) and awaits it.
async fn create_ssd_file_off_shard(dir: String, rank: u32, size: u64) -> std::io::Result<SsdFile> {
    let (tx, rx) = flume::bounded(1);
    std::thread::Builder::new()
        .name("mmc-ssd-create".into())
        .spawn(move || {
            let _ = tx.send(SsdFile::create(&dir, rank, size));
        })?;
    rx.recv_async()
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("the SSD file creation thread died")))
}

fn check_size(size: u64) -> Result<(), String> {
    if (PAGE_BYTES..=MAX_SEGMENT_BYTES).contains(&size) {
        Ok(())
    } else {
        Err(format!(
            "Segment size must be from {PAGE_BYTES} bytes to 1TB"
        ))
    }
}

fn ssd_error(name: &str, dir: &str, e: std::io::Error) -> String {
    format!("cannot create the SSD file for {name} in {dir}: {e}")
}

/// Reserves a memory segment's address space (DRAM: an anonymous mapping; HBM: the device).
fn memory_backend(medium: Medium, size: u64, name: &str) -> Result<Backend, String> {
    match medium {
        Medium::Dram => Ok(Backend::Host(MappedRegion::new(size).map_err(|e| {
            format!("cannot reserve {size} bytes of DRAM for {name}: {e}")
        })?)),
        Medium::Hbm => Ok(Backend::Device(Box::new(HostEmulated::new(size).map_err(
            |e| format!("cannot reserve {size} bytes of HBM for {name}: {e}"),
        )?))),
        Medium::Ssd => unreachable!("an SSD segment has a file backend"),
    }
}

/// A remote rank's segment: no memory or file here, its bytes are on the rank's local
/// service (`backend` is a [`Backend::Remote`]).
pub fn build_remote_segment(
    table: &SegmentTable,
    rank: u32,
    medium: Medium,
    size: u64,
    backend: Backend,
    shards: usize,
    run_bytes: u64,
) -> Result<Arc<Segment>, String> {
    check_size(size)?;
    if !medium.is_memory() {
        return Err(format!(
            "{}: a remote rank lends memory segments only",
            super::segment::segment_name(rank, medium)
        ));
    }
    debug_assert!(backend.remote().is_some());
    Ok(new_segment(
        table, rank, medium, size, backend, shards, run_bytes,
    ))
}

fn new_segment(
    table: &SegmentTable,
    rank: u32,
    medium: Medium,
    size: u64,
    backend: Backend,
    shards: usize,
    run_bytes: u64,
) -> Arc<Segment> {
    Arc::new(Segment::new(
        table.next_id(),
        rank,
        medium,
        size,
        backend,
        shards,
        run_bytes,
    ))
}

/// Bytes one prefault step commits before it looks whether the segment is still mounted.
const PREFAULT_STEP_BYTES: u64 = 64 << 20;

/// Commits a memory segment's pages on a background thread (`ock.mmc.segment.prefault`), so
/// that no request pays for their first-touch faults; the server serves meanwhile. The thread
/// stops early when the segment is unmounted.
pub fn prefault_in_background(seg: &Arc<Segment>) {
    if !seg.medium.is_memory() {
        return;
    }
    let weak = Arc::downgrade(seg);
    let name = seg.name.clone();
    let spawned = std::thread::Builder::new()
        .name("mmc-prefault".into())
        .spawn(move || {
            let started = std::time::Instant::now();
            let mut offset = 0;
            loop {
                let Some(seg) = weak.upgrade() else {
                    log::info!("prefault of {name} stopped: the segment was unmounted");
                    return;
                };
                if offset >= seg.capacity {
                    break;
                }
                let len = PREFAULT_STEP_BYTES.min(seg.capacity - offset);
                if let Err(e) = seg.backend.prefault(offset, len) {
                    log::warn!(
                        "prefault of {name} stopped at {offset} bytes: {e} (pages are committed at first write instead)"
                    );
                    return;
                }
                offset += len;
            }
            log::info!(
                "prefaulted {name}: {offset} bytes in {:.2} s",
                started.elapsed().as_secs_f64()
            );
        });
    if let Err(e) = spawned {
        log::warn!("cannot start the prefault thread for {}: {e}", seg.name);
    }
}

/// Mounts the segments of the embedded default / configuration: for each rank, HBM and DRAM
/// of the configured sizes (when non-zero) and SSD when enabled.
pub fn mount_configured(
    config: &Config,
    table: &SegmentTable,
    shards: usize,
) -> Result<(), String> {
    let s = &config.store;
    for rank in 0..s.ranks as u32 {
        let mut plan = vec![
            (Medium::Hbm, s.hbm_bytes, None),
            (Medium::Dram, s.dram_bytes, None),
        ];
        if s.ssd_enable {
            let dir = &s.ssd_dirs[rank as usize % s.ssd_dirs.len()];
            plan.push((Medium::Ssd, s.ssd_bytes, Some(dir.as_str())));
        }
        for (medium, size, dir) in plan {
            if size == 0 {
                continue;
            }
            let seg = build_segment(table, rank, medium, size, dir, shards, s.run_bytes)?;
            if s.prefault {
                prefault_in_background(&seg);
            }
            table.insert(seg)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ssd_segment_built_off_the_shard_has_its_file() {
        let dir = std::env::temp_dir().join(format!("mmc-mount-unit-{}", std::process::id()));
        let table = SegmentTable::default();
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .build()
            .unwrap();
        let dir_s = dir.to_str().unwrap().to_string();
        let seg = rt
            .block_on(build_segment_off_shard(
                &table,
                3,
                Medium::Ssd,
                1 << 20,
                Some(dir_s),
                1,
                1 << 20,
            ))
            .unwrap();
        assert_eq!(seg.name, "rank-3-ssd");
        let meta = std::fs::metadata(dir.join("mmc-rank-3.ssd")).unwrap();
        assert_eq!(meta.len(), 1 << 20, "sized sparsely to the segment");
        // An unusable directory is a message, not a panic.
        let bad = rt.block_on(build_segment_off_shard(
            &table,
            4,
            Medium::Ssd,
            1 << 20,
            Some("/proc/mmc-cannot-create".into()),
            1,
            1 << 20,
        ));
        let Err(msg) = bad else {
            panic!("an SSD file under /proc was created")
        };
        assert!(msg.contains("cannot create the SSD file"), "{msg}");
        let tiny = rt.block_on(build_segment_off_shard(
            &table,
            0,
            Medium::Dram,
            1,
            None,
            1,
            4096,
        ));
        assert!(tiny.is_err(), "a segment below a page is refused");
        drop(seg);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
