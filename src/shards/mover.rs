//! The mover: a thread of the process that copies blobs moving down between memory tiers
//! (HBM → DRAM) for the shards' watermark drains, so that a demotion costs the shard a job's
//! hand-over instead of a copy of the blob. In the default configuration every put into a
//! full HBM tier drains a slice of it, and that copy on the shard was as much CPU as the
//! put's own (a 1 MiB put 275 µs median against 194 with no HBM tier, perf/RESULTS.md
//! session 15). The store's move states are the ones a remote rank's demotion uses
//! (`Store::start_move`, `IoJob::Demote`, `finish_demote`): the source stays readable and
//! unevictable (`flushing`) and the destination allocated and pinned until the copy lands.
//! Forced evictions (an allocation that found no room) still copy on the shard: their room
//! is needed now.
//!
//! One group of mover threads per NUMA node a demotion lands on (the node part of its
//! destination, under `ock.mmc.numa.enable`), pinned to that node's CPUs, so the copy writes
//! memory local to the thread and each node's demotions have threads of their own; without
//! placement one group (`mmc-mover`) on every CPU of the process. A group has a thread per
//! eight of its CPUs (one at least), sharing its queue, so that a host with many shards
//! demoting at once is not held to one thread's copy rate.

use std::sync::{Arc, OnceLock};

use crate::shards::store::BlobView;
use crate::shards::store::segment::SegRef;

struct Move {
    src: Arc<SegRef>,
    src_offset: u64,
    dst: Arc<SegRef>,
    dst_offset: u64,
    len: usize,
    done: flume::Sender<bool>,
}

/// Groups by NUMA node id; the last one for memory placed on no node (and node ids past the
/// others, which no machine has).
const GROUPS: usize = 65;
const NO_NODE: usize = GROUPS - 1;

/// CPUs per mover thread of a group.
const CPUS_PER_MOVER: usize = 8;

/// Group `group`'s queue, its threads started at its first move and placed on `cpus` (the
/// node's; `None`: the process's); `None` when no thread could start (the shard then copies
/// itself).
fn queue(group: usize, cpus: Option<&[usize]>) -> Option<&'static flume::Sender<Move>> {
    static QUEUES: [OnceLock<Option<flume::Sender<Move>>>; GROUPS] =
        [const { OnceLock::new() }; GROUPS];
    QUEUES[group]
        .get_or_init(|| {
            let cpus: Option<Vec<usize>> = cpus.map(<[usize]>::to_vec);
            let count = match &cpus {
                Some(c) => c.len(),
                // SAFETY: CPU_COUNT reads the set it is given.
                None => super::runtime::process_cpu_set()
                    .map_or(1, |s| unsafe { libc::CPU_COUNT(&s) } as usize),
            };
            let threads = threads_for(count);
            let name = if group == NO_NODE {
                "mmc-mover".to_string()
            } else {
                format!("mmc-mover-{group}")
            };
            let (tx, rx) = flume::unbounded::<Move>();
            let mut started = 0;
            for _ in 0..threads {
                let (rx, cpus) = (rx.clone(), cpus.clone());
                let spawned = std::thread::Builder::new()
                    .name(name.clone())
                    .spawn(move || {
                        place(cpus.as_deref());
                        while let Ok(m) = rx.recv() {
                            let _ = m.done.send(copy(&m));
                        }
                    });
                match spawned {
                    Ok(_) => started += 1,
                    Err(e) => log::warn!("cannot start a mover thread ({name}): {e}"),
                }
            }
            if started == 0 {
                log::warn!("no mover thread ({name}) started: shards copy those demotions");
                return None;
            }
            Some(tx)
        })
        .as_ref()
}

/// The mover threads of a group that runs on `cpus` CPUs: one per [`CPUS_PER_MOVER`], one at
/// least.
fn threads_for(cpus: usize) -> usize {
    cpus.div_ceil(CPUS_PER_MOVER).max(1)
}

/// Places a mover thread: on its node's CPUs, or on every CPU of the process.
fn place(cpus: Option<&[usize]>) {
    match cpus {
        Some(cpus) => {
            if let Err(e) = crate::common::affinity::pin_to_cpus(cpus) {
                log::debug!("mover: cannot run on its node's CPUs {cpus:?}: {e}");
            }
        }
        None => on_the_process_cpus(),
    }
}

/// Moves the mover off the CPU of the shard that started it (a thread inherits its creator's
/// pinning, and there it could copy only while that shard waits) onto every CPU of the
/// process: its main thread's mask, which `taskset` sets and the shards are chosen from.
fn on_the_process_cpus() {
    if let Some(set) = super::runtime::process_cpu_set()
        && let Err(e) = super::runtime::run_on(&set)
    {
        log::debug!("mover: cannot leave its shard's CPU: {e}");
    }
}

fn copy(m: &Move) -> bool {
    // SAFETY: the job's contract (`demote`): the source blob is readable and kept
    // (`flushing`) until the job ends, nobody writes a readable blob, and the destination
    // range was allocated for this copy and is pinned by the job; both segments stay mapped
    // while these references to them live.
    let res = unsafe {
        m.src
            .backend
            .copy_to(m.src_offset, &m.dst.backend, m.dst_offset, m.len)
    };
    if let Err(e) = &res {
        log::error!("moving a blob from {} down a tier failed: {e}", m.src.name);
    }
    res.is_ok()
}

/// Copies `src`'s bytes into `dst` on a mover thread of `dst`'s node (or here, if none could
/// start); true when every byte landed. Both are memory this process addresses: the store
/// makes a local demotion a job only then (`Store::moves_off_shard`).
pub async fn move_down(src: &BlobView, dst: &BlobView) -> bool {
    let (tx, rx) = flume::bounded(1);
    let m = Move {
        src: src.seg.clone(),
        src_offset: src.offset,
        dst: dst.seg.clone(),
        dst_offset: dst.offset,
        len: src.len as usize,
        done: tx,
    };
    // The group of the node the copy writes to (its destination's part), else the process's.
    let (group, cpus) = match dst.seg.node_part_at(dst.offset) {
        Some(p) if (p.node as usize) < NO_NODE && !p.cpus.is_empty() => {
            (p.node as usize, Some(p.cpus.as_slice()))
        }
        _ => (NO_NODE, None),
    };
    match queue(group, cpus) {
        Some(q) => match q.send(m) {
            Ok(()) => rx.recv_async().await.unwrap_or(false),
            Err(flume::SendError(m)) => copy(&m),
        },
        None => copy(&m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_has_a_mover_thread_per_eight_cpus() {
        let got: Vec<usize> = [0, 1, 2, 8, 9, 16, 64, 65].map(threads_for).into();
        assert_eq!(got, [1, 1, 1, 1, 2, 2, 8, 9]);
    }
}
