//! Creating segments: the ones the configuration names at start, and `mount` at run time.

use std::sync::Arc;

use super::segment::{Backend, MAX_SEGMENT_BYTES, Medium, PAGE_BYTES, Segment, SegmentTable};
use super::ssd::SsdFile;
use super::ssd::journaling::Journals;
use crate::accel::HostEmulated;
use crate::common::memory::MappedRegion;
use crate::config::Config;
use crate::numa::{self, NumaLayout};

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
            let file =
                SsdFile::create(dir, rank, size, shards).map_err(|e| ssd_error(&name, dir, e))?;
            Backend::File(Box::new(file))
        }
        m => memory_backend(m, size, &name)?,
    };
    Ok(new_segment(
        table, rank, medium, size, backend, shards, run_bytes,
    ))
}

/// Rank `rank`'s SSD segment over `file`, opened already (with what it held: a start with
/// `ock.mmc.ssd.recover`, `ssd::recover::open`).
pub fn ssd_segment(
    table: &SegmentTable,
    rank: u32,
    size: u64,
    file: SsdFile,
    shards: usize,
    run_bytes: u64,
) -> Arc<Segment> {
    let backend = Backend::File(Box::new(file));
    new_segment(table, rank, Medium::Ssd, size, backend, shards, run_bytes)
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
    let Some(dir) = ssd_dir.filter(|_| medium == Medium::Ssd) else {
        // No file to create (or no directory, which build_segment refuses).
        return build_segment(table, rank, medium, size, None, shards, run_bytes);
    };
    check_size(size)?;
    let name = super::segment::segment_name(rank, medium);
    let file = create_ssd_file_off_shard(dir.clone(), rank, size, shards)
        .await
        .map_err(|e| ssd_error(&name, &dir, e))?;
    let backend = Backend::File(Box::new(file));
    Ok(new_segment(
        table, rank, medium, size, backend, shards, run_bytes,
    ))
}

/// Creates the SSD file on a short-lived helper thread (mounts are rare) and awaits it.
async fn create_ssd_file_off_shard(
    dir: String,
    rank: u32,
    size: u64,
    shards: usize,
) -> std::io::Result<SsdFile> {
    let (tx, rx) = flume::bounded(1);
    std::thread::Builder::new()
        .name("mmc-ssd-create".into())
        .spawn(move || {
            let _ = tx.send(SsdFile::create(&dir, rank, size, shards));
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

/// Reserves a memory segment's address space (DRAM: a shared memfd mapping; HBM: the device).
fn memory_backend(medium: Medium, size: u64, name: &str) -> Result<Backend, String> {
    match medium {
        // A memfd, which same-host clients may map read-only (mapped gets); anonymous memory
        // where memfds are not to be had.
        Medium::Dram => Ok(Backend::Host(
            MappedRegion::new_shared(size)
                .or_else(|e| {
                    log::warn!("{name}: no memfd for the DRAM segment ({e}); anonymous memory, no mapped same-host gets");
                    MappedRegion::new(size)
                })
                .map_err(|e| format!("cannot reserve {size} bytes of DRAM for {name}: {e}"))?,
        )),
        Medium::Hbm => Ok(Backend::Device(Box::new(HostEmulated::new(size).map_err(
            |e| format!("cannot reserve {size} bytes of HBM for {name}: {e}"),
        )?))),
        Medium::Ssd => unreachable!("an SSD segment has a file backend"),
    }
}

/// A remote rank's segment (memory or SSD): no memory or file here, its bytes are on the
/// rank's local service (`backend` is a [`Backend::Remote`]).
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
    let seg = Segment::new(
        table.next_id(),
        rank,
        medium,
        size,
        backend,
        shards,
        run_bytes,
    );
    Arc::new(match table.numa() {
        Some(layout) if medium == Medium::Dram => place_on_nodes(seg, layout),
        _ => seg,
    })
}

/// Cuts a DRAM segment into node parts ([`Segment::place_on_nodes`]) and binds each part's
/// memory to its node (`mbind`, `ock.mmc.numa.policy`) before anything is written there. A
/// refused `mbind` (a kernel without NUMA, a seccomp profile) is logged and leaves that part to
/// first touch: its shards still take their runs there.
fn place_on_nodes(seg: Segment, layout: &NumaLayout) -> Segment {
    let seg = seg.place_on_nodes(layout);
    let Some(region) = seg.backend.host_region() else {
        return seg;
    };
    for p in seg.node_parts() {
        let (end, node, policy) = (p.start + p.len, p.node, layout.policy);
        // SAFETY: the segment's own mapping; nothing is written in it yet.
        match unsafe { numa::bind_to_node(region.ptr(p.start), p.len as usize, node, policy) } {
            Ok(()) => log::info!(
                "{}: bytes {}..{end} bound to NUMA node {node} ({policy:?})",
                seg.name,
                p.start
            ),
            Err(e) => log::warn!(
                "{}: cannot bind bytes {}..{end} to NUMA node {node}: {e} (placed by first touch instead)",
                seg.name,
                p.start
            ),
        }
    }
    seg
}

/// Bytes one prefault step commits before it looks whether the segment is still mounted.
const PREFAULT_STEP_BYTES: u64 = 64 << 20;

/// What one prefault pass commits: start, end, the node and its CPUs (without placement the
/// whole segment, no node).
type PrefaultRange = (u64, u64, Option<(u32, Vec<usize>)>);

/// Commits a memory segment's pages on a background thread (`ock.mmc.segment.prefault`), so
/// that no request pays for their first-touch faults; the server serves meanwhile, and the
/// segment keeps its pages from then on ([`Segment::keep_pages`]). The thread
/// stops early when the segment is unmounted. With NUMA placement it commits one node part
/// after the other, pinned to that node's CPUs, so the pages (bound to the node) are also
/// zeroed by a CPU of the node.
pub fn prefault_in_background(seg: &Arc<Segment>) {
    if !seg.medium.is_memory() {
        return;
    }
    seg.keep_pages();
    let weak = Arc::downgrade(seg);
    let name = seg.name.clone();
    let ranges: Vec<PrefaultRange> = if seg.node_parts().is_empty() {
        vec![(0, seg.capacity, None)]
    } else {
        seg.node_parts()
            .iter()
            .map(|p| (p.start, p.start + p.len, Some((p.node, p.cpus.clone()))))
            .collect()
    };
    let spawned = std::thread::Builder::new()
        .name("mmc-prefault".into())
        .spawn(move || {
            let started = std::time::Instant::now();
            let mut done = 0;
            for (start, end, node) in ranges {
                if let Some((node, cpus)) = &node {
                    if let Err(e) = crate::common::affinity::pin_to_cpus(cpus) {
                        log::warn!("prefault of {name}: cannot run on NUMA node {node}'s CPUs: {e}");
                    }
                }
                let mut offset = start;
                while offset < end {
                    let Some(seg) = weak.upgrade() else {
                        log::info!("prefault of {name} stopped: the segment was unmounted");
                        return;
                    };
                    let len = PREFAULT_STEP_BYTES.min(end - offset);
                    if let Err(e) = seg.backend.prefault(offset, len) {
                        log::warn!(
                            "prefault of {name} stopped at {offset} bytes: {e} (pages are committed at first write instead)"
                        );
                        return;
                    }
                    offset += len;
                    done += len;
                }
            }
            log::info!(
                "prefaulted {name}: {done} bytes in {:.2} s",
                started.elapsed().as_secs_f64()
            );
        });
    if let Err(e) = spawned {
        log::warn!("cannot start the prefault thread for {}: {e}", seg.name);
    }
}

/// Mounts the segments of the embedded default / configuration: for each rank, HBM and DRAM
/// of the configured sizes (when non-zero) and SSD when enabled. With `journals` (recovery
/// on), each SSD file is opened with what its journal lists (`ssd::recover::open`; `owner`
/// maps a key to its shard), else created empty.
pub fn mount_configured(
    config: &Config,
    table: &SegmentTable,
    shards: usize,
    journals: Option<&Arc<Journals>>,
    owner: &dyn Fn(&[u8]) -> usize,
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
            let seg = match (medium, dir, journals) {
                (Medium::Ssd, Some(dir), Some(journals)) => {
                    let name = super::segment::segment_name(rank, medium);
                    check_size(size)?;
                    let file = super::ssd::recover::open(dir, rank, size, shards, journals, owner)
                        .map_err(|e| ssd_error(&name, dir, e))?;
                    ssd_segment(table, rank, size, file, shards, s.run_bytes)
                }
                _ => build_segment(table, rank, medium, size, dir, shards, s.run_bytes)?,
            };
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
    use crate::config::{MemPolicy, NumaMode};
    use crate::numa::Topology;

    /// A table placing segments per a synthetic two-node topology (node 0: CPUs 0-1, node 1:
    /// CPUs 2-3) with shards on `cpus`.
    fn numa_table(cpus: &[usize]) -> SegmentTable {
        let t = Topology::two_nodes();
        let p = numa::plan(NumaMode::On, &t, cpus);
        SegmentTable::with_numa(NumaLayout::new(p, &t, MemPolicy::Preferred).map(Arc::new))
    }

    /// Shards all on node 0 (which every machine has): the DRAM segment is one part, bound to
    /// node 0, and its pages, prefaulted from node 0's CPUs, are there.
    #[test]
    fn a_dram_segment_is_bound_to_its_shards_node_and_prefaulted_there() {
        let table = numa_table(&[0, 1]);
        let seg = build_segment(&table, 0, Medium::Dram, 8 << 20, None, 2, 1 << 20).unwrap();
        let hbm = build_segment(&table, 0, Medium::Hbm, 1 << 20, None, 2, 1 << 20).unwrap();
        assert!(hbm.node_parts().is_empty(), "only DRAM is placed");
        assert_eq!(seg.node_parts().len(), 1);
        assert_eq!(
            (seg.node_parts()[0].node, seg.node_parts()[0].len),
            (0, 8 << 20)
        );
        let region = seg.backend.host_region().unwrap();
        match numa::policy_at(region.ptr(4 << 20) as usize) {
            Ok((mode, nodes)) => {
                assert_eq!(
                    (mode as libc::c_long, nodes),
                    (MemPolicy::Preferred.mode(), vec![0])
                )
            }
            // A seccomp profile without get_mempolicy: nothing to check here.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => return,
            Err(e) => panic!("{e}"),
        }
        prefault_in_background(&seg);
        assert!(seg.keeps_pages());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while region.resident_bytes(0, 8 << 20).unwrap() < 8 << 20 {
            assert!(
                std::time::Instant::now() < deadline,
                "prefault did not finish"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let nodes = numa::page_nodes(region.ptr(0), 8 << 20).unwrap();
        assert_eq!(nodes.len(), 2048);
        assert!(nodes.iter().all(|&n| n == 0), "{:?}", &nodes[..8]);
    }

    /// Shards on two nodes: one part each; a node this machine lacks is refused by `mbind`
    /// (logged), and the segment still serves both shards from their parts.
    #[test]
    fn a_dram_segment_is_cut_between_two_nodes() {
        let table = numa_table(&[0, 2]);
        let seg = build_segment(&table, 1, Medium::Dram, 8 << 20, None, 2, 1 << 20).unwrap();
        let parts: Vec<(u32, u64, u64)> = seg
            .node_parts()
            .iter()
            .map(|p| (p.node, p.start, p.len))
            .collect();
        assert_eq!(parts, vec![(0, 0, 4 << 20), (1, 4 << 20, 4 << 20)]);
        let region = seg.backend.host_region().unwrap();
        if let Ok((mode, nodes)) = numa::policy_at(region.ptr(0) as usize) {
            assert_eq!(
                (mode as libc::c_long, nodes),
                (MemPolicy::Preferred.mode(), vec![0])
            );
        }
        let mut s1 = super::super::segment::ShardSegment::new(seg.clone(), 1);
        let (off, len) = s1.alloc(64 << 10).unwrap();
        assert!(off >= 4 << 20);
        assert_eq!(seg.used_in_part(1), len);
        s1.free(off, len);
        s1.release_all();
    }

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
