//! Creating segments: the ones the configuration names at start, and `mount` at run time.

use std::sync::Arc;

use super::memory::MappedRegion;
use super::segment::{Backend, MAX_SEGMENT_BYTES, Medium, PAGE_BYTES, Segment, SegmentTable};
use super::ssd::SsdFile;
use crate::accel::HostEmulated;
use crate::config::Config;

/// Creates a segment's backing memory or file. Errors are the message for the operator or
/// client.
pub fn build_segment(
    table: &SegmentTable,
    rank: u32,
    medium: Medium,
    size: u64,
    ssd_dir: Option<&str>,
    shards: usize,
    run_bytes: u64,
) -> Result<Arc<Segment>, String> {
    if !(PAGE_BYTES..=MAX_SEGMENT_BYTES).contains(&size) {
        return Err(format!(
            "Segment size must be from {PAGE_BYTES} bytes to 1TB"
        ));
    }
    let name = super::segment::segment_name(rank, medium);
    let backend = match medium {
        Medium::Dram => Backend::Host(
            MappedRegion::new(size)
                .map_err(|e| format!("cannot reserve {size} bytes of DRAM for {name}: {e}"))?,
        ),
        Medium::Hbm => {
            Backend::Device(Box::new(HostEmulated::new(size).map_err(|e| {
                format!("cannot reserve {size} bytes of HBM for {name}: {e}")
            })?))
        }
        Medium::Ssd => {
            let dir = ssd_dir.ok_or_else(|| format!("{name}: an SSD segment needs a directory"))?;
            Backend::File(Box::new(SsdFile::create(dir, rank, size).map_err(|e| {
                format!("cannot create the SSD file for {name} in {dir}: {e}")
            })?))
        }
    };
    Ok(Arc::new(Segment::new(
        table.next_id(),
        rank,
        medium,
        size,
        backend,
        shards,
        run_bytes,
    )))
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
