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

/// The mover's queue, started at the first move; `None` when its thread could not start
/// (the shard then copies itself).
fn queue() -> Option<&'static flume::Sender<Move>> {
    static QUEUE: OnceLock<Option<flume::Sender<Move>>> = OnceLock::new();
    QUEUE
        .get_or_init(|| {
            let (tx, rx) = flume::unbounded::<Move>();
            let started = std::thread::Builder::new()
                .name("mmc-mover".into())
                .spawn(move || {
                    on_the_process_cpus();
                    while let Ok(m) = rx.recv() {
                        let _ = m.done.send(copy(&m));
                    }
                });
            match started {
                Ok(_) => Some(tx),
                Err(e) => {
                    log::warn!("cannot start the mover thread ({e}): shards copy demotions");
                    None
                }
            }
        })
        .as_ref()
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

/// Copies `src`'s bytes into `dst` on the mover's thread (or here, if it could not start);
/// true when every byte landed. Both are memory this process addresses: the store makes a
/// local demotion a job only then (`Store::moves_off_shard`).
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
    match queue() {
        Some(q) => match q.send(m) {
            Ok(()) => rx.recv_async().await.unwrap_or(false),
            Err(flume::SendError(m)) => copy(&m),
        },
        None => copy(&m),
    }
}
