//! Re-replication: an object left with copies on fewer distinct ranks than its put asked for
//! (`replicas`) gets a new copy on a rank that holds none, in the background.
//!
//! Copies are lost by a rank's segments being dropped (lost, restarted or left), by a damaged
//! SSD copy being dropped and by an unmount that found no room for a copy; each of those
//! already has the object in hand and calls [`Store::want_copies`], which queues it when it is
//! below its count with a readable copy left. Nothing walks the keys to find such objects: the
//! queue is the only record, bounded by [`RereplicateLimits::queue`]; an object that finds it
//! full is counted (`rereplicate_overflow`) and stays below its count until it is rewritten
//! or another lost copy queues it again.
//!
//! The shard's re-replication task (`shards/rereplicate.rs`) asks [`Store::begin_rereplicate`]
//! for work while objects are queued: each gets a new blob allocated like a drain's move
//! (ALLOCATED, pinned; memory only, below the high watermark, never by forced eviction) and
//! its source copy pinned, the caller copies the bytes, and [`Store::finish_rereplicate`]
//! makes the new blob readable when the object is still the one queued (its generation), or
//! frees it. At most `concurrency` copies are in flight and `bytes_per_sec` bytes start per
//! second (a token bucket); an object that finds no room or no rank waits in the queue.

use std::collections::VecDeque;

use super::*;
use relocate::Move;

/// Copies tried for one object, in all, before it is left below its count.
const MAX_ATTEMPTS: u8 = 3;

/// Queue entries one [`Store::begin_rereplicate`] looks at, at most: those it cannot place
/// go to the back, so a call's work is bounded whatever is queued.
const SCAN_PER_CALL: usize = 256;

/// What bounds one shard's re-replication (`ock.mmc.cluster.rereplicate.*`). The default
/// does none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RereplicateLimits {
    /// Copies in flight at once; 0: no re-replication (nothing is queued).
    pub concurrency: usize,
    /// Bytes of copies started per second, this shard's share (0: no cap).
    pub bytes_per_sec: u64,
    /// Objects queued at most; one more is counted and not queued.
    pub queue: usize,
}

/// An object waiting for a new copy.
#[derive(Clone, Copy, Debug)]
struct Queued {
    obj: u32,
    generation: u64,
    /// Copies of it that failed so far.
    attempts: u8,
}

/// A copy in flight: its pins on the source and the new blob, let go of early when their
/// segment is dropped (its bytes are gone; the copy then fails or is let go).
#[derive(Clone, Copy, Debug)]
struct Copying {
    src: BlobHandle,
    dst: BlobHandle,
    generation: u64,
    attempts: u8,
    src_held: bool,
    dst_held: bool,
}

/// A shard's re-replication state.
#[derive(Debug, Default)]
pub(super) struct Rereplication {
    queue: VecDeque<Queued>,
    copying: Vec<Copying>,
    /// The byte rate's token bucket: bytes that may start now (negative after a copy larger
    /// than what was left), and when it was last filled (`None`: never, so it starts full).
    allowance: i64,
    filled_ms: Option<u64>,
}

impl Store {
    /// Distinct ranks holding a copy of the object: readable, or being made (a tier move's
    /// destination is on its source's rank; a drain's move or a re-replication adds a rank).
    pub(super) fn copy_ranks(&self, obj: u32) -> usize {
        let mut ranks: SmallVec<[u32; 4]> = self.objects[obj as usize]
            .blobs
            .iter()
            .map(|&b| self.blobs[b as usize].rank)
            .collect();
        ranks.sort_unstable();
        ranks.dedup();
        ranks.len()
    }

    /// Whether the object should get a new copy: live, committed, readable, and on fewer
    /// distinct ranks than its count.
    fn below_count(&self, obj: u32) -> bool {
        !self.doomed(obj)
            && !self.uncommitted.contains_key(&obj)
            && self.object_readable(obj)
            && self.copy_ranks(obj) < self.objects[obj as usize].replicas as usize
    }

    /// The object may have lost a copy: queued for a new one when it is below its count (see
    /// the module's documentation), unless it is queued already.
    pub(super) fn want_copies(&mut self, obj: u32) {
        self.queue_copy(obj, 0);
    }

    fn queue_copy(&mut self, obj: u32, attempts: u8) {
        let limits = self.cfg.rereplicate;
        if limits.concurrency == 0 || self.objects[obj as usize].queued || !self.below_count(obj) {
            return;
        }
        if self.rerepl.queue.len() >= limits.queue {
            self.stats.rereplicate_overflow.inc();
            return;
        }
        let generation = self.objects[obj as usize].generation;
        self.rerepl.queue.push_back(Queued {
            obj,
            generation,
            attempts,
        });
        self.objects[obj as usize].queued = true;
        self.note_rereplicate_pending();
    }

    fn note_rereplicate_pending(&self) {
        let n = self.rerepl.queue.len() + self.rerepl.copying.len();
        self.stats.rereplicate_pending.set(n as i64);
    }

    /// Whether objects are queued or copies in flight (the task has work or results coming).
    pub fn rereplication_waiting(&self) -> bool {
        !self.rerepl.queue.is_empty() || !self.rerepl.copying.is_empty()
    }

    /// Copies to start now, within the concurrency and the byte rate: each queued object still
    /// below its count gets a new blob (see [`Store::start_copy`]); one that finds no room or
    /// no rank goes to the back of the queue, one no longer below its count leaves it.
    pub fn begin_rereplicate(&mut self) -> Vec<Move> {
        let now = self.now_ms();
        self.refresh_segments();
        let limits = self.cfg.rereplicate;
        self.fill_allowance(limits.bytes_per_sec, now);
        let mut out = Vec::new();
        let looks = self.rerepl.queue.len().min(SCAN_PER_CALL);
        for _ in 0..looks {
            if self.rerepl.copying.len() >= limits.concurrency
                || (limits.bytes_per_sec > 0 && self.rerepl.allowance <= 0)
            {
                break;
            }
            let Some(q) = self.rerepl.queue.pop_front() else {
                break;
            };
            // An entry of a removed object (its slot may hold another one now) is dropped.
            let live = self
                .objects
                .get(q.obj as usize)
                .is_some_and(|o| o.generation == q.generation);
            if !live {
                continue;
            }
            self.objects[q.obj as usize].queued = false;
            if !self.below_count(q.obj) {
                continue;
            }
            match self.start_copy(q, now) {
                Some(m) => {
                    if limits.bytes_per_sec > 0 {
                        self.rerepl.allowance -= m.from.len as i64;
                    }
                    out.push(m);
                }
                None => {
                    self.objects[q.obj as usize].queued = true;
                    self.rerepl.queue.push_back(q);
                }
            }
        }
        self.note_rereplicate_pending();
        out
    }

    /// Refills the byte rate's allowance for the time since the last call (up to one second's
    /// worth).
    fn fill_allowance(&mut self, bytes_per_sec: u64, now: u64) {
        let cap = bytes_per_sec.min(i64::MAX as u64) as i64;
        let r = &mut self.rerepl;
        let elapsed = r
            .filled_ms
            .map_or(1000, |t| now.saturating_sub(t))
            .min(1000);
        let gained = (bytes_per_sec as u128 * elapsed as u128 / 1000) as i64;
        r.allowance = r.allowance.saturating_add(gained).min(cap);
        r.filled_ms = Some(now);
    }

    /// A new blob for one more copy of `q`'s object, on a rank holding none of its copies: on
    /// the fastest memory medium it has a copy on (DRAM when its copies are all on SSD), else
    /// the memory tier below, while the medium stays under its high watermark (nothing is
    /// evicted for it). The source is a readable copy, preferring one that stays (not on a
    /// leaving segment), in memory, in this process. Both are pinned until the copy ends.
    /// `None` when there is no room or no such rank now.
    fn start_copy(&mut self, q: Queued, now: u64) -> Option<Move> {
        let obj = q.obj;
        let size = self.objects[obj as usize].size;
        let blobs = self.objects[obj as usize].blobs.clone();
        let src = blobs
            .iter()
            .copied()
            .filter(|&b| self.blobs[b as usize].state == BlobState::Readable)
            .min_by_key(|&b| {
                let r = &self.blobs[b as usize];
                (
                    self.leaving(r.seg),
                    !r.medium.is_memory(),
                    self.is_remote_blob(b),
                )
            })?;
        let avoid: SmallVec<[u32; 4]> =
            blobs.iter().map(|&b| self.blobs[b as usize].rank).collect();
        let fastest = blobs
            .iter()
            .map(|&b| self.blobs[b as usize].medium)
            .filter(|m| m.is_memory())
            .min_by_key(|&m| m as usize)
            .unwrap_or(Medium::Dram);
        let mut target = Some(fastest);
        while let Some(medium) = target.filter(|m| m.is_memory()) {
            target = medium.lower_tier();
            let (cap, used) = self.watermark_totals(medium, now);
            if cap == 0 || (used + size) * 100 > cap * self.cfg.high_percent {
                continue;
            }
            let Some((seg, off, alen)) = self.alloc_blob_in(medium, size, &avoid, None, true)
            else {
                continue;
            };
            let dst = self.insert_blob(obj, seg, off, alen, BlobState::Allocated, now);
            self.blobs[dst as usize].pins = 1;
            self.blobs[src as usize].pins += 1;
            let (src, dst) = (self.handle(src), self.handle(dst));
            self.rerepl.copying.push(Copying {
                src,
                dst,
                generation: q.generation,
                attempts: q.attempts,
                src_held: true,
                dst_held: true,
            });
            let o = &self.objects[obj as usize];
            return Some(Move {
                key: o.key.clone(),
                from: self.view(src.id, size),
                to: self.view(dst.id, size),
                stamp: o.stamp,
            });
        }
        None
    }

    /// The copy into the re-replication blob `dst` ended: `ok` makes it readable when its
    /// object is still the one queued; otherwise (failed, or the key removed or overwritten
    /// meanwhile) the blob is freed, and a failed copy's object is queued again unless it
    /// failed [`MAX_ATTEMPTS`] times. An object whose other copies all went while this one
    /// was made, and whose copy failed, is removed.
    pub fn finish_rereplicate(&mut self, dst: BlobHandle, ok: bool) {
        let now = self.now_ms();
        let Some(i) = self.rerepl.copying.iter().position(|c| c.dst == dst) else {
            return;
        };
        let c = self.rerepl.copying.swap_remove(i);
        let src_rank = self.blob_by_handle(c.src).map(|b| b.rank);
        if c.src_held {
            self.unpin(c.src);
        }
        let attached = self
            .blob_by_handle(dst)
            .filter(|_| c.dst_held)
            .map(|b| b.obj)
            .filter(|&o| o != NIL);
        let current = attached
            .filter(|&o| self.objects[o as usize].generation == c.generation && !self.doomed(o));
        match current {
            Some(_) if ok => {
                self.blobs[dst.id as usize].pins -= 1;
                self.make_readable(dst.id, now);
                self.stats.rereplicated.inc();
            }
            _ => {
                if !ok {
                    self.stats.rereplicate_failed.inc();
                }
                if let Some(obj) = attached {
                    self.detach_blob(dst.id, now);
                    if current.is_some() && self.objects[obj as usize].blobs.is_empty() {
                        self.remove_object(obj, now);
                        self.stats.record(Op::Remove, Outcome::Success, src_rank);
                    } else if !ok && c.attempts + 1 < MAX_ATTEMPTS {
                        self.queue_copy(obj, c.attempts + 1);
                    }
                }
                if c.dst_held {
                    self.unpin(dst);
                }
            }
        }
        self.note_rereplicate_pending();
    }

    /// A segment whose bytes are gone is being dropped: the copies in flight let go of their
    /// pins on it (nothing is read from or written to it any more, and the drop must not wait
    /// for them); their copy fails or is let go when it ends.
    pub(super) fn release_copies_on(&mut self, seg: SegmentId) {
        for i in 0..self.rerepl.copying.len() {
            let c = self.rerepl.copying[i];
            for (h, held) in [(c.src, c.src_held), (c.dst, c.dst_held)] {
                if !held || self.blob_by_handle(h).is_none_or(|b| b.seg != seg) {
                    continue;
                }
                self.blobs[h.id as usize].pins -= 1;
                let c = &mut self.rerepl.copying[i];
                if h == c.src {
                    c.src_held = false;
                } else {
                    c.dst_held = false;
                }
            }
        }
    }

    /// The re-replication queue and copies against the objects (`check`): the queue within
    /// its bound, every queued object named by an entry of its generation, every copy within
    /// the concurrency with its held blobs pinned and its new blob ALLOCATED.
    pub(super) fn check_rereplication(&self) {
        let r = &self.rerepl;
        let limits = self.cfg.rereplicate;
        assert!(
            r.queue.len() <= limits.queue,
            "re-replication queue over its bound"
        );
        assert!(
            r.copying.len() <= limits.concurrency,
            "re-replications over the concurrency"
        );
        let entries: std::collections::HashSet<(u32, u64)> =
            r.queue.iter().map(|q| (q.obj, q.generation)).collect();
        for (i, o) in self.objects.iter() {
            assert!(
                !o.queued || entries.contains(&(i as u32, o.generation)),
                "object {i} is marked queued without an entry"
            );
        }
        for c in &r.copying {
            for (h, held) in [(c.src, c.src_held), (c.dst, c.dst_held)] {
                if held {
                    let b = self
                        .blob_by_handle(h)
                        .expect("a held blob of a copy was freed");
                    assert!(b.pins >= 1, "a copy's blob is not pinned");
                }
            }
            if let Some(b) = self
                .blob_by_handle(c.dst)
                .filter(|b| c.dst_held && b.obj != NIL)
            {
                assert_eq!(b.state, BlobState::Allocated, "a copy's new blob");
            }
        }
        let pending = (r.queue.len() + r.copying.len()) as i64;
        assert_eq!(self.stats.rereplicate_pending.get(), pending);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shards::store::testing::TestStore;

    const MB: u64 = 1 << 20;

    /// Three remote ranks (1, 2, 3) of 16 MiB DRAM each.
    fn three_ranks(f: impl FnOnce(&mut RereplicateLimits)) -> Store {
        let mut s = TestStore::new()
            .remote_segment(1, Medium::Dram, 16 * MB)
            .remote_segment(2, Medium::Dram, 16 * MB)
            .remote_segment(3, Medium::Dram, 16 * MB)
            .config(|c| f(&mut c.rereplicate))
            .build();
        s.set_manual_clock(1000);
        s
    }

    /// A committed put of `replicas` copies of `size` bytes, the first on `rank`.
    fn put(s: &mut Store, key: &str, size: u64, replicas: u8, rank: u32) {
        let placement = Placement {
            prefer_rank: Some(rank),
            ..Placement::on(Some(Medium::Dram), replicas)
        };
        let step = s.alloc(key.as_bytes().into(), size, placement);
        let AllocStep::Granted { obj, .. } = step else {
            panic!("alloc refused: {step:?}");
        };
        assert!(s.commit(obj, true));
    }

    /// The ranks of `key`'s readable copies, ascending.
    fn ranks_of(s: &Store, key: &str) -> Vec<u32> {
        let obj = s.find(key.as_bytes()).expect("the key");
        let mut r: Vec<u32> = s.objects[obj as usize]
            .blobs
            .iter()
            .map(|&b| &s.blobs[b as usize])
            .filter(|b| b.state == BlobState::Readable)
            .map(|b| b.rank)
            .collect();
        r.sort_unstable();
        r
    }

    /// Rank `rank` is lost: its segment is dropped (nothing holds it back) and forgotten, as
    /// `Shard::drop_remote_segment` does.
    fn lose(s: &mut Store, rank: u32) {
        let seg = s
            .segs
            .iter()
            .flatten()
            .find(|ss| ss.seg.rank == rank)
            .map(|ss| ss.seg.clone())
            .unwrap();
        seg.set_status(segment::SegmentStatus::Unmounting);
        assert!(s.drop_segment(seg.id), "nothing holds rank {rank} back");
        s.table.remove_id(&seg.name, seg.id);
        s.forget_segment(seg.id);
        s.check();
    }

    /// `k`, put with two copies (one on rank 1) on [`three_ranks`], lost rank 1's.
    fn k_lost_a_copy() -> Store {
        let mut s = three_ranks(|_| {});
        put(&mut s, "k", MB, 2, 1);
        lose(&mut s, 1);
        s
    }

    fn used(s: &Store) -> u64 {
        s.my_used(Medium::Dram)
    }

    fn pending(s: &Store) -> i64 {
        s.stats.rereplicate_pending.get()
    }

    #[test]
    fn a_lost_ranks_replicas_get_a_copy_on_a_rank_holding_none() {
        let mut s = three_ranks(|_| {});
        put(&mut s, "two", MB, 2, 1);
        put(&mut s, "one", MB, 1, 1);
        put(&mut s, "elsewhere", MB, 2, 2);
        let two = ranks_of(&s, "two");
        assert!(two.len() == 2 && two.contains(&1), "{two:?}");
        lose(&mut s, 1);
        s.check();
        // The single copy went with its rank; the replicated object is queued, once.
        assert!(s.find(b"one").is_none());
        assert_eq!(ranks_of(&s, "two").len(), 1);
        let queued = if ranks_of(&s, "elsewhere").len() == 1 {
            2
        } else {
            1
        };
        assert_eq!(pending(&s), queued);
        s.want_copies(s.find(b"two").unwrap());
        assert_eq!(pending(&s), queued, "queued once");
        let moves = s.begin_rereplicate();
        assert_eq!(moves.len() as i64, queued);
        s.check();
        let m = moves.iter().find(|m| &*m.key == b"two").unwrap();
        let survivor = ranks_of(&s, "two")[0];
        assert_eq!(m.from.seg.rank, survivor, "copied from the surviving copy");
        assert!(
            ![1, survivor].contains(&m.to.seg.rank),
            "to a rank holding none"
        );
        for m in &moves {
            s.finish_rereplicate(m.to.handle, true);
        }
        s.check();
        let now = ranks_of(&s, "two");
        assert!(now.len() == 2 && !now.contains(&1), "{now:?}");
        assert_eq!(s.stats.rereplicated.get() as i64, queued);
        assert_eq!(pending(&s), 0);
        assert!(!s.rereplication_waiting());
        // Nothing more to do: a second look starts nothing.
        assert!(s.begin_rereplicate().is_empty());
    }

    #[test]
    fn a_damaged_replica_dropped_or_an_unmount_without_room_queues_a_copy() {
        let mut s = three_ranks(|_| {});
        put(&mut s, "d", MB, 2, 1);
        put(&mut s, "u", MB, 2, 1);
        let obj = s.find(b"d").unwrap();
        let on_1 = s.objects[obj as usize].blobs[0];
        assert_eq!(s.blobs[on_1 as usize].rank, 1);
        s.drop_damaged(s.handle(on_1));
        assert_eq!(pending(&s), 1);
        s.check();
        // An unmount's evacuation of rank 1 (it copies no remote rank's blob here, so it
        // drops them): `u` keeps one copy.
        let seg = s.segs.iter().flatten().find(|x| x.seg.rank == 1).unwrap();
        seg.seg.set_status(segment::SegmentStatus::Unmounting);
        let id = seg.seg.id;
        assert!(s.evacuate(id));
        assert_eq!(ranks_of(&s, "u").len(), 1);
        assert_eq!(pending(&s), 2);
        s.check();
    }

    #[test]
    fn a_key_removed_or_overwritten_during_its_copy_keeps_no_stale_copy() {
        for overwrite in [false, true] {
            let mut s = k_lost_a_copy();
            let moves = s.begin_rereplicate();
            assert_eq!(moves.len(), 1);
            assert!(s.remove(b"k"));
            if overwrite {
                put(&mut s, "k", 2 * MB, 1, moves[0].to.seg.rank);
            }
            s.check();
            s.finish_rereplicate(moves[0].to.handle, true);
            s.check();
            // The copy's blob is freed; the new object, if any, is only what its put wrote.
            let want = if overwrite { 2 * MB } else { 0 };
            assert_eq!(used(&s), want);
            if overwrite {
                assert_eq!(ranks_of(&s, "k").len(), 1);
            }
            assert_eq!(s.stats.rereplicated.get(), 0);
            assert_eq!(s.stats.rereplicate_failed.get(), 0);
            assert_eq!(pending(&s), 0);
        }
    }

    #[test]
    fn a_failed_copy_frees_its_blob_and_is_tried_three_times() {
        let mut s = k_lost_a_copy();
        for attempt in 1..=MAX_ATTEMPTS {
            let moves = s.begin_rereplicate();
            assert_eq!(moves.len(), 1, "attempt {attempt}");
            assert_eq!(used(&s), 2 * MB);
            s.finish_rereplicate(moves[0].to.handle, false);
            s.check();
            assert_eq!(used(&s), MB, "the failed copy's blob is freed");
            assert_eq!(s.stats.rereplicate_failed.get(), attempt as u64);
        }
        assert_eq!(pending(&s), 0, "given up after {MAX_ATTEMPTS} attempts");
        assert_eq!(
            ranks_of(&s, "k").len(),
            1,
            "the surviving copy stays readable"
        );
    }

    #[test]
    fn the_queue_is_bounded_and_what_does_not_fit_is_counted() {
        let mut s = three_ranks(|l| l.queue = 2);
        for i in 0..5 {
            put(&mut s, &format!("k{i}"), 64 << 10, 2, 1);
        }
        lose(&mut s, 1);
        s.check();
        assert_eq!(pending(&s), 2);
        assert_eq!(s.stats.rereplicate_overflow.get(), 3);
    }

    #[test]
    fn concurrency_and_the_byte_rate_bound_the_copies_started() {
        let mut s = three_ranks(|l| {
            l.concurrency = 2;
            l.bytes_per_sec = 2 * MB;
        });
        for i in 0..6 {
            put(&mut s, &format!("k{i}"), MB, 2, 1);
        }
        lose(&mut s, 1);
        assert_eq!(pending(&s), 6);
        let first = s.begin_rereplicate();
        assert_eq!(first.len(), 2, "two in flight at most");
        assert!(s.begin_rereplicate().is_empty());
        for m in &first {
            s.finish_rereplicate(m.to.handle, true);
        }
        // Two seconds' worth of bytes went: nothing more within the same second.
        assert!(s.begin_rereplicate().is_empty());
        s.advance_clock(500);
        assert_eq!(s.begin_rereplicate().len(), 1, "half a second: 1 MiB");
        s.check();
        assert_eq!(pending(&s), 3 + 1);
    }

    #[test]
    fn no_room_below_the_high_watermark_leaves_the_object_queued() {
        let mut s = TestStore::new()
            .remote_segment(1, Medium::Dram, 4 * MB)
            .remote_segment(2, Medium::Dram, 4 * MB)
            .remote_segment(3, Medium::Dram, 4 * MB)
            .build();
        put(&mut s, "k", MB, 2, 1);
        let survivor = ranks_of(&s, "k").into_iter().find(|&r| r != 1).unwrap();
        let third = [2, 3].into_iter().find(|&r| r != survivor).unwrap();
        put(&mut s, "fill", 5 * MB / 2, 1, survivor);
        put(&mut s, "full", 3 * MB, 1, third);
        assert_eq!(ranks_of(&s, "fill"), [survivor]);
        assert_eq!(ranks_of(&s, "full"), [third]);
        // Rank 1 gone, 6.5 of 8 MiB are used: a copy would take the medium over 90 %, though
        // the third rank has room for it.
        lose(&mut s, 1);
        assert!(
            s.begin_rereplicate().is_empty(),
            "nothing evicted for a copy"
        );
        assert_eq!(pending(&s), 1);
        assert_eq!(s.stats.tier.evict.get(), 0);
        s.check();
        assert!(s.remove(b"fill"));
        let moves = s.begin_rereplicate();
        assert_eq!(moves.len(), 1);
        assert_eq!(moves[0].to.seg.rank, third);
    }

    #[test]
    fn a_dropped_destination_does_not_hold_its_segment_back() {
        let mut s = k_lost_a_copy();
        let moves = s.begin_rereplicate();
        let to = moves[0].to.seg.rank;
        // The new copy's rank is lost while the copy runs: dropped at once, queued again.
        lose(&mut s, to);
        s.check();
        assert_eq!(pending(&s), 2, "queued again, the first copy still running");
        s.finish_rereplicate(moves[0].to.handle, true);
        s.check();
        assert_eq!(s.stats.rereplicated.get(), 0);
        assert_eq!(ranks_of(&s, "k").len(), 1);
        assert_eq!(pending(&s), 1);
        // No rank left to hold a second copy: it waits.
        assert!(s.begin_rereplicate().is_empty());
        assert_eq!(pending(&s), 1);
    }

    #[test]
    fn a_lost_source_with_a_failed_copy_removes_the_object() {
        let mut s = k_lost_a_copy();
        let moves = s.begin_rereplicate();
        let from = moves[0].from.seg.rank;
        lose(&mut s, from);
        s.check();
        s.finish_rereplicate(moves[0].to.handle, false);
        s.check();
        assert!(s.find(b"k").is_none(), "no copy is left");
        assert_eq!(used(&s), 0);
    }
}
