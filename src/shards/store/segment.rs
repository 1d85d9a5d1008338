//! Segments: one rank's memory of one medium, `rank-<r>-<medium>`, and where their bytes live.
//!
//! A [`Segment`] is shared by all shards: its capacity is cut into runs that shards take from
//! the segment's pool and sub-allocate inside ([`ShardSegment`]), so allocating for a key never
//! leaves the key's shard; the pool's lock is taken only to take or return a whole run.
//! Used bytes are per-shard atomics summed when read. Every byte access goes through the
//! segment's [`Backend`], so the store never assumes where the bytes are.

use std::collections::BTreeMap;
use std::sync::atomic::{
    AtomicBool, AtomicU8, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, Mutex, RwLock};

use crossbeam_utils::CachePadded;

use super::alloc::RangeAlloc;
pub use super::remote::RemoteRank;
use super::remote::remote_bytes;
use crate::numa::{NodePart, NumaLayout};

mod backend;
mod nodes;

pub use backend::Backend;

pub use crate::common::medium::Medium;
pub use crate::common::segment::{MAX_SEGMENT_BYTES, PAGE_BYTES, segment_name};

/// Segment status codes (the upstream set; `/api/v1/segments/status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum SegmentStatus {
    Undefined = 0,
    Ok = 1,
    Draining = 2,
    Drained = 3,
    GracefullyUnmounting = 4,
    Unmounting = 5,
}

impl SegmentStatus {
    pub fn name(self) -> &'static str {
        match self {
            SegmentStatus::Undefined => "UNDEFINED",
            SegmentStatus::Ok => "OK",
            SegmentStatus::Draining => "DRAINING",
            SegmentStatus::Drained => "DRAINED",
            SegmentStatus::GracefullyUnmounting => "GRACEFULLY_UNMOUNTING",
            SegmentStatus::Unmounting => "UNMOUNTING",
        }
    }

    fn from_u8(v: u8) -> SegmentStatus {
        match v {
            1 => SegmentStatus::Ok,
            2 => SegmentStatus::Draining,
            3 => SegmentStatus::Drained,
            4 => SegmentStatus::GracefullyUnmounting,
            5 => SegmentStatus::Unmounting,
            _ => SegmentStatus::Undefined,
        }
    }
}

pub type SegmentId = u32;

pub struct Segment {
    /// Index in the segment table; never reused while the process runs.
    pub id: SegmentId,
    pub rank: u32,
    pub medium: Medium,
    /// `rank-<r>-<medium-lower>`.
    pub name: String,
    pub capacity: u64,
    /// Global virtual address of offset 0: rank and medium select a disjoint 1 TiB window.
    pub base_gva: u64,
    pub backend: Backend,
    /// Free space no shard holds, at page granularity: one allocator per node part (one in
    /// all without NUMA placement). Locked only to take or return a run.
    pool: Mutex<Vec<RangeAlloc>>, // LOCK-OK: only to take or return a run, not per put
    /// The pool's free bytes, mirrored outside the lock (updated under it), so choosing a
    /// segment for a put reads an atomic instead of taking the pool lock.
    pool_free: AtomicU64,
    /// Bytes allocated to blobs, per shard and node part (`[shard * parts + part]`, one part
    /// without placement; each written only by its shard). Each counter on its own cache line:
    /// two shards writing neighbouring counters on every put would bounce one line between
    /// their cores (false sharing), which the shard-scaling bench showed.
    used_by_shard: Box<[CachePadded<AtomicU64>]>,
    /// Of the bytes used, those of removed blobs still held by a lease, a pin, a flush or a
    /// writer (*zombies*), per shard (each written only by its shard): they come back by
    /// themselves, so eviction leaves them out of the watermark ([`Segment::zombie_bytes`]).
    zombie_by_shard: Box<[CachePadded<AtomicU64>]>,
    /// NUMA placement ([`Segment::place_on_nodes`]): the node parts, by offset (empty: none),
    /// and each shard's own part.
    parts: Box<[NodePart]>,
    shard_part: Box<[usize]>,
    status: AtomicU8,
    /// Size of the runs shards take for small blobs.
    pub run_bytes: u64,
    /// Empty runs one shard may keep instead of returning them to the pool.
    pub spare_runs: usize,
    /// The segment's pages are committed on purpose (`ock.mmc.segment.prefault`): runs that
    /// go back to the pool keep theirs, whatever the segment's use ([`Segment::keep_pages`]).
    keep_pages: AtomicBool,
}

impl Segment {
    pub fn new(
        id: SegmentId,
        rank: u32,
        medium: Medium,
        capacity: u64,
        backend: Backend,
        shards: usize,
        run_bytes: u64,
    ) -> Segment {
        let capacity = capacity / PAGE_BYTES * PAGE_BYTES;
        // Runs small enough that each shard can hold several, large enough to amortize the
        // pool lock over many blobs.
        let per_shard = (capacity / (4 * shards as u64)).max(PAGE_BYTES);
        let run_bytes = (run_bytes.min(per_shard) / PAGE_BYTES).max(1) * PAGE_BYTES;
        // Empty runs a shard keeps (pages committed) instead of returning them to the pool: an
        // eighth of its share of the segment, at least one run. An eighth covers what one
        // watermark eviction frees (the default 90 -> 80 % frees a tenth), so the runs it
        // empties are reused by the puts that caused it. Fewer (it was at most four runs)
        // made a full 1 GB segment of 16 MiB objects return and fault in again three of every
        // seven runs it churned: 39 % of the pages of each put, half the server's CPU.
        let spare_runs = (capacity / shards as u64 / 8 / run_bytes).max(1) as usize;
        Segment {
            id,
            rank,
            medium,
            name: segment_name(rank, medium),
            capacity,
            base_gva: gva_base(rank, medium),
            backend,
            pool: Mutex::new(vec![RangeAlloc::new(0, capacity, PAGE_BYTES)]), // LOCK-OK: see `pool`
            pool_free: AtomicU64::new(capacity),
            used_by_shard: (0..shards)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            zombie_by_shard: (0..shards)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            parts: Box::new([]),
            shard_part: Box::new([]),
            status: AtomicU8::new(SegmentStatus::Ok as u8),
            run_bytes,
            spare_runs,
            keep_pages: AtomicBool::new(false),
        }
    }

    /// From now on no page of this segment goes back to the kernel while it is mounted: the
    /// prefault thread commits it all, and a run emptied by removals would otherwise hand its
    /// pages back (below the low watermark) for the next blobs to fault in again, which is
    /// what committing it was to avoid.
    pub fn keep_pages(&self) {
        self.keep_pages.store(true, Relaxed);
    }

    /// Whether [`Segment::keep_pages`] was called.
    pub fn keeps_pages(&self) -> bool {
        self.keep_pages.load(Relaxed)
    }

    pub fn used_bytes(&self) -> u64 {
        self.used_by_shard
            .iter()
            .map(|u| u.load(Relaxed))
            .sum::<u64>()
            .min(self.capacity)
    }

    /// Of [`Segment::used_bytes`], the bytes of removed blobs that only wait for their leases,
    /// pins, flushes or writers to end before they are freed.
    pub fn zombie_bytes(&self) -> u64 {
        self.zombie_by_shard.iter().map(|u| u.load(Relaxed)).sum()
    }

    /// [`Segment::used_bytes`] less [`Segment::zombie_bytes`]: the bytes of blobs that stay
    /// until something removes them, which the watermark eviction counts.
    pub fn live_bytes(&self) -> u64 {
        self.used_bytes().saturating_sub(self.zombie_bytes())
    }

    /// Of the bytes `shard` uses here, those held by its zombies.
    fn zombie_bytes_of(&self, shard: usize) -> u64 {
        self.zombie_by_shard[shard].load(Relaxed)
    }

    pub fn remaining_bytes(&self) -> u64 {
        self.capacity - self.used_bytes()
    }

    pub fn status(&self) -> SegmentStatus {
        SegmentStatus::from_u8(self.status.load(Relaxed))
    }

    pub fn set_status(&self, s: SegmentStatus) {
        self.status.store(s as u8, Relaxed);
    }

    /// Accepts new blobs (mounted and not being drained or unmounted; for SSD, its file not
    /// faulted by a failed write, here or as a remote rank's last report says).
    pub fn is_allocatable(&self) -> bool {
        self.status() == SegmentStatus::Ok
            && !self.backend.file().is_some_and(|f| f.faulted())
            && !(self.medium == Medium::Ssd
                && self.backend.remote().is_some_and(|r| r.disk_status() != 0))
    }

    fn add_used(&self, shard: usize, offset: u64, delta: i64) {
        let u = &self.used_by_shard[shard * self.part_count() + self.part_of(offset)];
        u.store(u.load(Relaxed).wrapping_add(delta as u64), Relaxed);
    }

    pub fn used_by(&self, shard: usize) -> u64 {
        let n = self.part_count();
        self.used_by_shard[shard * n..(shard + 1) * n]
            .iter()
            .map(|u| u.load(Relaxed))
            .sum()
    }

    /// Bytes in the pool (no shard holds them); an atomic read, no lock.
    pub fn pool_free_bytes(&self) -> u64 {
        self.pool_free.load(Relaxed)
    }

    /// The largest contiguous range in the pool (for fragmentation measurements; takes the
    /// pool lock).
    pub fn pool_largest_free(&self) -> u64 {
        self.pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(RangeAlloc::largest_free)
            .max()
            .unwrap_or(0)
    }

    pub fn gva(&self, offset: u64) -> u64 {
        self.base_gva + offset
    }
}

/// Disjoint address windows: bits 42.. rank, bits 40-41 medium, 40 bits of offset.
pub fn gva_base(rank: u32, medium: Medium) -> u64 {
    ((rank as u64) << 42) | ((medium as u64) << 40)
}

/// All mounted segments, shared by every shard. Changes (mount, unmount) are rare and bump
/// the table's *epoch*; each shard keeps a [`SegmentView`], a cached snapshot it refreshes only
/// when the epoch moved, so the per-put path reads one atomic and takes no lock. The lock here
/// is taken by mount and unmount, by a shard refreshing its view after one, and by readers
/// off the per-put path (listings, scrapes).
pub struct SegmentTable {
    current: RwLock<Arc<Vec<Arc<Segment>>>>, // LOCK-OK: mount/unmount and view refreshes only
    /// Bumped (Release) by every insert and remove, after the new list is in place.
    epoch: AtomicU64,
    next_id: AtomicU64,
    /// Where DRAM segments mounted here put their memory (`None`: no NUMA placement).
    numa: Option<Arc<NumaLayout>>,
}

impl Default for SegmentTable {
    fn default() -> Self {
        SegmentTable {
            current: RwLock::new(Arc::new(Vec::new())), // LOCK-OK: see `current`
            epoch: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
            numa: None,
        }
    }
}

impl SegmentTable {
    /// The mount/unmount epoch: changes whenever the list of segments does.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Acquire)
    }

    /// The mounted segments, in listing order: by medium (HBM, DRAM, SSD), then by rank.
    /// Takes the table's read lock: shards use their [`SegmentView`] instead.
    pub fn snapshot(&self) -> Arc<Vec<Arc<Segment>>> {
        self.read().clone()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Arc<Vec<Arc<Segment>>>> {
        self.current.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn next_id(&self) -> SegmentId {
        self.next_id.fetch_add(1, Relaxed) as SegmentId
    }

    pub fn find(&self, name: &str) -> Option<Arc<Segment>> {
        self.snapshot().iter().find(|s| s.name == name).cloned()
    }

    /// Adds a segment; refuses a second segment with the same name.
    pub fn insert(&self, seg: Arc<Segment>) -> Result<(), String> {
        let mut cur = self.current.write().unwrap_or_else(|p| p.into_inner());
        if cur.iter().any(|s| s.name == seg.name) {
            return Err(format!("Segment {} is already mounted", seg.name));
        }
        let mut next: Vec<Arc<Segment>> = cur.iter().cloned().collect();
        next.push(seg);
        next.sort_by_key(|s| (s.medium, s.rank));
        *cur = Arc::new(next);
        self.epoch.fetch_add(1, Release);
        Ok(())
    }

    /// Removes a segment from the table (its blobs must already be gone).
    /// [`SegmentTable::remove`] only when the segment under `name` is still `id`.
    pub fn remove_id(&self, name: &str, id: SegmentId) -> Option<Arc<Segment>> {
        self.remove_where(|s| s.name == name && s.id == id)
    }

    pub fn remove(&self, name: &str) -> Option<Arc<Segment>> {
        self.remove_where(|s| s.name == name)
    }

    fn remove_where(&self, which: impl Fn(&Segment) -> bool) -> Option<Arc<Segment>> {
        let mut cur = self.current.write().unwrap_or_else(|p| p.into_inner());
        let pos = cur.iter().position(|s| which(s))?;
        let mut next: Vec<Arc<Segment>> = cur.iter().cloned().collect();
        let seg = next.remove(pos);
        *cur = Arc::new(next);
        self.epoch.fetch_add(1, Release);
        Some(seg)
    }
}

/// One shard's cached copy of the [`SegmentTable`]: the snapshot and the epoch it was taken
/// at. [`SegmentView::refresh`] costs one atomic load while nothing was mounted or unmounted;
/// the table's lock is taken only to pick up a change.
pub struct SegmentView {
    epoch: u64,
    segs: Arc<Vec<Arc<Segment>>>,
}

impl Default for SegmentView {
    fn default() -> Self {
        SegmentView {
            // No table is at this epoch: the first refresh always takes a snapshot.
            epoch: u64::MAX,
            segs: Arc::new(Vec::new()),
        }
    }
}

impl SegmentView {
    /// Brings the view up to date with `table`; true when it changed.
    pub fn refresh(&mut self, table: &SegmentTable) -> bool {
        if table.epoch() == self.epoch {
            return false;
        }
        // Read the epoch under the lock: writers bump it while holding the write lock, so
        // the pair (list, epoch) is consistent.
        let cur = table.read();
        self.epoch = table.epoch();
        self.segs = cur.clone();
        true
    }

    /// The segments as of the last refresh, in the table's listing order.
    pub fn segments(&self) -> &[Arc<Segment>] {
        &self.segs
    }

    /// The snapshot itself (shared, for iterating while the view's owner changes).
    pub fn shared(&self) -> Arc<Vec<Arc<Segment>>> {
        self.segs.clone()
    }
}

/// One shard's handle on a segment, for the blob views it hands out. A view holds the
/// segment alive; were it an `Arc<Segment>` clone, every put and get on every shard would
/// increment and decrement the one shared reference count, a cache line bounced between the
/// shards' cores on each request. Each shard's views count on the shard's own `SegRef`
/// instead (which holds the segment once).
pub struct SegRef(Arc<Segment>);

impl SegRef {
    /// The segment itself, for what outlives or leaves the shard's view (I/O jobs, tables).
    pub fn arc(&self) -> &Arc<Segment> {
        &self.0
    }
}

impl std::ops::Deref for SegRef {
    type Target = Segment;
    fn deref(&self) -> &Segment {
        &self.0
    }
}

/// One shard's share of one segment: the runs it holds and the free space inside them.
pub struct ShardSegment {
    pub seg: Arc<Segment>,
    /// What this shard's blob views hold ([`SegRef`]).
    pub local: Arc<SegRef>,
    shard: usize,
    /// Runs held: start → length.
    runs: BTreeMap<u64, u64>,
    /// Free space inside the held runs.
    free: RangeAlloc,
    /// Bytes of blobs this shard allocated here (mirrors the segment's per-shard counter).
    used: u64,
    /// Of `used`, the bytes of this shard's zombies here (mirrors the segment's counter).
    zombie: u64,
}

impl ShardSegment {
    pub fn new(seg: Arc<Segment>, shard: usize) -> ShardSegment {
        ShardSegment {
            local: Arc::new(SegRef(seg.clone())),
            seg,
            shard,
            runs: BTreeMap::new(),
            free: RangeAlloc::empty(PAGE_BYTES),
            used: 0,
            zombie: 0,
        }
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    /// Of [`ShardSegment::used`], the bytes of this shard's zombies here.
    pub fn zombie(&self) -> u64 {
        self.zombie
    }

    /// Bytes used by blobs that are not zombies: what eviction may have to make room from.
    pub fn live(&self) -> u64 {
        self.used - self.zombie
    }

    /// A blob of `len` allocated bytes here became a zombie (`held`), or a zombie stopped
    /// being one (it is about to be freed).
    pub fn count_zombie(&mut self, len: u64, held: bool) {
        let rounded = self.free.round_up(len.max(1));
        self.zombie = if held {
            self.zombie + rounded
        } else {
            self.zombie - rounded
        };
        self.seg.zombie_by_shard[self.shard].store(self.zombie, Relaxed);
    }

    pub fn held_bytes(&self) -> u64 {
        self.runs.values().sum()
    }

    /// Checks the accounting (tests): the runs held are exactly the used plus the free bytes
    /// inside them, and the segment's per-shard counter agrees.
    pub fn check(&self) {
        self.free.check();
        assert_eq!(
            self.used + self.free.free_bytes(),
            self.held_bytes(),
            "{}",
            self.seg.name
        );
        assert_eq!(self.seg.used_by(self.shard), self.used, "{}", self.seg.name);
        assert!(self.zombie <= self.used, "{}", self.seg.name);
        assert_eq!(
            self.seg.zombie_bytes_of(self.shard),
            self.zombie,
            "{}",
            self.seg.name
        );
    }

    /// Runs this shard holds.
    pub fn runs_held(&self) -> usize {
        self.runs.len()
    }

    /// Free bytes inside the runs this shard holds (usable by this shard only).
    pub fn free_in_runs(&self) -> u64 {
        self.free.free_bytes()
    }

    /// The largest contiguous free range inside this shard's runs.
    pub fn largest_free_in_runs(&self) -> u64 {
        self.free.largest_free()
    }

    /// Separate free ranges inside this shard's runs (holes between blobs, run tails).
    pub fn free_ranges_in_runs(&self) -> usize {
        self.free.free_ranges()
    }

    /// Bytes this shard could allocate without evicting: free space in its runs plus the
    /// segment pool.
    pub fn free_bytes_hint(&self) -> u64 {
        self.free.free_bytes() + self.seg.pool_free_bytes()
    }

    /// Allocates `len` bytes (page-rounded). Small blobs go into shared runs; a blob of a run
    /// or more gets a run of its own, so large blobs never fragment small runs.
    pub fn alloc(&mut self, len: u64) -> Option<(u64, u64)> {
        let rounded = self.free.round_up(len.max(1));
        let offset = match self.free.alloc(rounded) {
            Some(o) => o,
            None => {
                let want = rounded.max(self.seg.run_bytes);
                let (start, run_len) = match self.seg.take_run(self.shard, want) {
                    Some(start) => (start, want),
                    // The pool cannot give a full run: take exactly what this blob needs.
                    None if want > rounded => (self.seg.take_run(self.shard, rounded)?, rounded),
                    None => return None,
                };
                self.runs.insert(start, run_len);
                self.free.release(start, run_len);
                self.free.alloc(rounded).expect("a fresh run fits its blob")
            }
        };
        self.used += rounded;
        self.seg.add_used(self.shard, offset, rounded as i64);
        Some((offset, rounded))
    }

    /// Frees a blob's range. Runs that become entirely free go back to the pool, except up to
    /// [`Segment::spare_runs`] kept for the next blobs; their pages go back to the kernel.
    pub fn free(&mut self, offset: u64, len: u64) {
        self.free_keeping(offset, len, false);
    }

    /// [`ShardSegment::free`], and `keep_pages`: runs that go back to the pool keep their pages
    /// committed (the segment is full enough that eviction keeps it so: the room is taken again
    /// at once, and handing the pages back would only make the next blobs fault them in).
    pub fn free_keeping(&mut self, offset: u64, len: u64, keep_pages: bool) {
        let rounded = self.free.round_up(len.max(1));
        self.used -= rounded;
        self.seg.add_used(self.shard, offset, -(rounded as i64));
        // The freed pages stay committed while this shard holds their run: handing them back
        // here would make the next blob placed there fault every page in again (measured:
        // a 64 KiB write costs 44 µs into discarded pages, 5 µs into mapped ones). Memory goes
        // back to the kernel when a whole run returns to the pool (`give_run`) and the caller
        // does not keep its pages (`keep_pages`: the segment above its low watermark).
        let (fs, fl) = self.free.release(offset, rounded);
        let fully_free: Vec<(u64, u64)> = self
            .runs
            .range(fs..fs + fl)
            .filter(|&(&s, &l)| s + l <= fs + fl)
            .map(|(&s, &l)| (s, l))
            .collect();
        if fully_free.is_empty() {
            return;
        }
        // Keep a few empty runs, pages committed, for the next blobs: a shard that churns
        // (puts and removes about as much as a run) then neither takes the pool lock nor
        // faults pages in. Past `spare_runs`, empty runs go back to the pool for every shard.
        let mut idle = self
            .runs
            .iter()
            .filter(|&(&s, &l)| {
                l == self.seg.run_bytes && !fully_free.contains(&(s, l)) && self.free.covers(s, l)
            })
            .count();
        for (s, l) in fully_free {
            if l == self.seg.run_bytes && idle < self.seg.spare_runs {
                idle += 1;
                continue;
            }
            let carved = self.free.alloc_at(s, l);
            debug_assert!(carved);
            self.runs.remove(&s);
            self.seg.give_run(s, l, !keep_pages);
        }
    }

    /// Claims exactly `[offset, offset + len)` (page-aligned) from the segment's pool as a run
    /// of this shard and allocates it whole: a blob adopted from a local service's catalog,
    /// at the range it already occupies there. False when any of it is not in the pool.
    pub fn adopt(&mut self, offset: u64, len: u64) -> bool {
        if offset % PAGE_BYTES != 0 || len == 0 || len % PAGE_BYTES != 0 {
            return false;
        }
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.seg.capacity)
        {
            return false;
        }
        if !self.seg.take_run_at(offset, len) {
            return false;
        }
        self.runs.insert(offset, len);
        self.used += len;
        self.seg.add_used(self.shard, offset, len as i64);
        true
    }

    /// Gives every held run back (the shard holds no blobs here any more).
    pub fn release_all(&mut self) {
        debug_assert_eq!(self.used, 0);
        for (s, l) in std::mem::take(&mut self.runs) {
            self.free.alloc_at(s, l);
            self.seg.give_run(s, l, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::memory::MappedRegion;

    fn host_segment(capacity: u64, shards: usize, run: u64) -> Arc<Segment> {
        Arc::new(Segment::new(
            0,
            0,
            Medium::Dram,
            capacity,
            Backend::Host(MappedRegion::new(capacity).unwrap()),
            shards,
            run,
        ))
    }

    #[test]
    fn addresses() {
        assert_ne!(gva_base(0, Medium::Dram), gva_base(0, Medium::Hbm));
        assert_eq!(gva_base(1, Medium::Hbm), 1 << 42);
    }

    #[test]
    fn shards_take_runs_and_give_them_back() {
        let seg = host_segment(16 << 20, 2, 1 << 20);
        let mut a = ShardSegment::new(seg.clone(), 0);
        let mut b = ShardSegment::new(seg.clone(), 1);
        let (x, lx) = a.alloc(1000).unwrap();
        let (y, ly) = b.alloc(5000).unwrap();
        assert_eq!((lx, ly), (4096, 8192));
        assert_eq!(seg.used_bytes(), 4096 + 8192);
        assert_eq!(seg.used_by(0), 4096);
        // Each shard took one run from the pool.
        assert_eq!(seg.pool_free_bytes(), (16 << 20) - 2 * (1 << 20));
        // A blob larger than a run gets its own run.
        let (big, lbig) = a.alloc(3 << 20).unwrap();
        assert_eq!(lbig, 3 << 20);
        a.free(big, lbig);
        a.free(x, lx);
        b.free(y, ly);
        assert_eq!(seg.used_bytes(), 0);
        // One spare run per shard stays held; the rest went back.
        assert_eq!(seg.pool_free_bytes(), (16 << 20) - 2 * (1 << 20));
        a.release_all();
        b.release_all();
        assert_eq!(seg.pool_free_bytes(), 16 << 20);
    }

    #[test]
    fn spare_runs_cover_a_watermark_eviction() {
        // Segment, shards, run: the default segments, one and several shards, small runs.
        for (capacity, shards, run) in [
            (1u64 << 30, 1usize, 16u64 << 20),
            (1 << 30, 2, 16 << 20),
            (8 << 30, 1, 16 << 20),
            (64 << 30, 8, 16 << 20),
            (256 << 20, 4, 1 << 20),
        ] {
            let seg = Segment::new(
                0,
                0,
                Medium::Dram,
                capacity,
                Backend::Host(MappedRegion::new(capacity).unwrap()),
                shards,
                run,
            );
            // The default watermarks (90 -> 80 %) free a tenth of a shard's share at once.
            let batch = capacity / shards as u64 / 10;
            assert!(
                seg.spare_runs as u64 * seg.run_bytes >= batch,
                "{capacity} bytes, {shards} shards: {} spare runs of {} bytes",
                seg.spare_runs,
                seg.run_bytes
            );
        }
    }

    #[test]
    fn empty_runs_are_kept_up_to_the_spare_budget_with_pages_committed() {
        // 64 MiB, one shard, 1 MiB runs: an eighth of the share is 8 runs.
        let seg = host_segment(64 << 20, 1, 1 << 20);
        assert_eq!(seg.spare_runs, 8);
        let mut a = ShardSegment::new(seg.clone(), 0);
        let keep = a.alloc(4096).unwrap();
        // Fill ten more runs with 256 KiB blobs, written so their pages are committed.
        let blobs: Vec<(u64, u64)> = (0..40).map(|_| a.alloc(256 << 10).unwrap()).collect();
        for &(off, len) in &blobs {
            let region = seg.backend.host_region().unwrap();
            // SAFETY: the range is this test's blob.
            unsafe { region.write(off, &vec![7u8; len as usize]).unwrap() };
        }
        assert_eq!(a.runs_held(), 11);
        for &(off, len) in &blobs {
            a.free(off, len);
        }
        // Eight empty runs stay with the shard (plus the one holding `keep`); two went back.
        assert_eq!(a.runs_held(), 9);
        assert_eq!(seg.pool_free_bytes(), (64 << 20) - (9 << 20));
        a.check();
        // The kept pages were not handed back: the next blob lands on committed memory.
        let (off, _) = a.alloc(256 << 10).unwrap();
        let mut back = vec![0u8; 16];
        // SAFETY: reading this test's blob.
        unsafe {
            seg.backend
                .host_region()
                .unwrap()
                .read(off, &mut back)
                .unwrap()
        };
        assert_eq!(back, [7u8; 16], "pages of a kept run are not discarded");
        a.free(off, 256 << 10);
        a.free(keep.0, keep.1);
        a.release_all();
        assert_eq!(seg.pool_free_bytes(), 64 << 20);
    }

    #[test]
    fn a_view_follows_the_table_only_when_its_epoch_moves() {
        let table = SegmentTable::default();
        let mut view = SegmentView::default();
        assert!(view.refresh(&table), "the first refresh takes a snapshot");
        assert!(!view.refresh(&table), "nothing changed: no new snapshot");
        let seg = host_segment(1 << 20, 1, 1 << 20);
        table.insert(seg.clone()).unwrap();
        assert!(view.segments().is_empty(), "stale until refreshed");
        assert!(view.refresh(&table));
        assert_eq!(view.segments().len(), 1);
        assert!(!view.refresh(&table));
        table.remove(&seg.name).unwrap();
        assert!(view.refresh(&table));
        assert!(view.segments().is_empty());
        // The table and the view no longer hold the segment.
        assert_eq!(Arc::strong_count(&seg), 1);
    }

    #[test]
    fn pool_free_bytes_follow_runs_taken_and_returned() {
        let seg = host_segment(8 << 20, 1, 1 << 20);
        let mut a = ShardSegment::new(seg.clone(), 0);
        assert_eq!(a.free_bytes_hint(), 8 << 20);
        let big = a.alloc(3 << 20).unwrap();
        assert_eq!(seg.pool_free_bytes(), 5 << 20);
        assert_eq!(a.free_bytes_hint(), 5 << 20);
        a.free(big.0, big.1);
        a.release_all();
        assert_eq!(seg.pool_free_bytes(), 8 << 20);
    }

    #[test]
    fn allocation_fails_cleanly_when_full() {
        let seg = host_segment(1 << 20, 1, 1 << 20);
        let mut a = ShardSegment::new(seg.clone(), 0);
        let mut got = Vec::new();
        while let Some(r) = a.alloc(64 << 10) {
            got.push(r);
        }
        assert_eq!(got.len(), 16);
        assert_eq!(seg.remaining_bytes(), 0);
        assert!(a.alloc(1).is_none());
        for (o, l) in got {
            a.free(o, l);
        }
        assert_eq!(seg.remaining_bytes(), 1 << 20);
    }
}
