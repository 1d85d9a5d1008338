//! The tiered object store of one shard: objects, their blobs on HBM, DRAM and SSD segments,
//! leases, LRU eviction down the tiers, SSD flush and rewarm.
//!
//! Objects live in a slab indexed by a hash table of their keys; blobs live in a second slab
//! so that pins, leases and asynchronous operations can refer to a blob by a stable handle
//! even after its object is gone. Everything here runs on the owner shard's thread; bytes
//! are touched only through segment [`Backend`]s. The store never awaits: work that needs I/O
//! (a flush to SSD, a rewarm from SSD) is handed to the shard as a job and finished by
//! `finish_flush` / `finish_rewarm`.
//!
//! Blob states follow upstream: ALLOCATED (0) → READABLE (1) → REMOVING (2) → gone; a failed
//! write goes ALLOCATED → REMOVING. A read takes a lease (`ock.mmc.lease_ms`) and, while the
//! bytes are being sent, a pin; leased or pinned blobs are never evicted, and a removed one
//! is freed only when its lease and pins end.
//!
//! A put's blobs carry their writer's pin from alloc until the writer's grant ends (its commit
//! or its abort): removing the object, or reclaiming an allocation whose writer made no
//! progress for `alloc_timeout_ms`, only detaches the blobs and revokes the grant
//! ([`WriterLink`]); the bytes are freed when the writer lets go, so a connection still
//! receiving a body can never write into memory that another object was given.

pub mod alloc;
pub mod keys;
pub mod lru;
pub mod memory;
pub mod mount;
pub mod segment;
pub mod ssd;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use hashbrown::HashTable;
use slab::Slab;
use smallvec::SmallVec;

use crate::metrics::bus::Event;
use crate::metrics::store::{Op, Outcome, StoreStats};
use crate::metrics::trace::{Tp, Tracer};
use lru::{Lru, NIL};
use segment::{Medium, Segment, SegmentId, SegmentTable, SegmentView, ShardSegment};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum BlobState {
    Allocated = 0,
    Readable = 1,
    Removing = 2,
}

/// A stable reference to a blob: its slot and a tag that changes when the slot is reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlobHandle {
    pub id: u32,
    pub tag: u64,
}

/// A stable reference to an object (slot and generation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjHandle {
    pub id: u32,
    pub generation: u64,
}

/// Where a blob's bytes are, for the shard that reads or writes them.
#[derive(Clone)]
pub struct BlobView {
    pub seg: Arc<Segment>,
    pub offset: u64,
    /// The object's size (the blob may be larger: allocations are page-rounded).
    pub len: u64,
    pub handle: BlobHandle,
}

impl std::fmt::Debug for BlobView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "BlobView({}+{}, {} bytes)",
            self.seg.name, self.offset, self.len
        )
    }
}

struct Object {
    key: Box<[u8]>,
    size: u64,
    prot: u16,
    blobs: SmallVec<[u32; 2]>,
    generation: u64,
    created_ms: u64,
    /// A rewarm from SSD is in flight; other readers wait for it.
    rewarming: bool,
    chunk: Option<u64>,
}

struct BlobRec {
    /// Owning object, or `NIL` once detached (a zombie waiting for its lease and pins).
    obj: u32,
    seg: SegmentId,
    medium: Medium,
    rank: u32,
    offset: u64,
    /// Allocated bytes (page-rounded).
    len: u64,
    state: BlobState,
    lease_until_ms: u64,
    pins: u32,
    lru: u32,
    tag: u64,
    since_ms: u64,
    /// A flush of this blob to SSD is in flight.
    flushing: bool,
    /// Made by a rewarm: the object bytes it counts in `rewarm_bytes_current` while it lives
    /// (the object's size, as `rewarm_bytes_total` counts it, not the page-rounded `len`).
    rewarmed_bytes: u64,
    /// A put's writer holds one of `pins` on this blob until its grant ends (commit or
    /// abort); the blob cannot be freed before.
    writing: bool,
    /// SSD blobs: the checksum of the object's bytes, taken when they were flushed and
    /// checked on every read back ([`ssd::checksum`]).
    sum: u64,
}

/// What the owner and a put's writer share while the body is being written: the writer
/// reports progress, the owner revokes the grant when the object is removed or the allocation
/// reclaimed. The writer checks `revoked` between reads and stops writing into its blobs
/// once it is set; the blobs stay allocated until its grant ends.
#[derive(Debug, Default)]
pub struct WriterLink {
    revoked: AtomicBool,
    written_bytes: AtomicU64,
}

impl WriterLink {
    /// The object was removed or its allocation reclaimed: stop writing into its blobs.
    pub fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// The writer moved `n` more bytes into its blobs (read by the reclaiming tick).
    pub fn wrote(&self, n: u64) {
        // One writer: a load and a store, no read-modify-write across cores.
        let w = self.written_bytes.load(Ordering::Relaxed);
        self.written_bytes.store(w + n, Ordering::Relaxed);
    }

    fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
    }
}

/// An object whose writer has not committed yet.
struct Uncommitted {
    link: Arc<WriterLink>,
    /// `written_bytes` when the tick last looked, and when it last changed (`now_ms`).
    seen_bytes: u64,
    progress_ms: u64,
}

/// What one object looks like to `/query_key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryInfo {
    pub size: u64,
    pub prot: u16,
    pub valid: bool,
    pub blobs: Vec<BlobInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobInfo {
    pub rank: u32,
    pub medium: Medium,
    pub gva: u64,
    pub state: u8,
    pub lease_ttl_ms: u64,
}

/// Asynchronous work the shard runs for the store.
#[derive(Debug)]
pub enum IoJob {
    /// Copy a memory blob to an SSD blob (ALLOCATED) and swap them.
    Flush {
        src: BlobHandle,
        dst: BlobHandle,
        src_view: BlobView,
        dst_view: BlobView,
    },
    /// Copy an SSD blob into a DRAM blob (ALLOCATED) for a reader or a prefetch; `sum` is
    /// the SSD copy's checksum, which the bytes read must match.
    Rewarm {
        prefetch: bool,
        obj: ObjHandle,
        src: BlobHandle,
        dst: BlobHandle,
        src_view: BlobView,
        dst_view: BlobView,
        sum: u64,
    },
    /// Read an SSD blob straight into a buffer for one reader (DRAM had no room to rewarm,
    /// or the reader waited too long); the bytes must match `sum`.
    ReadSsd {
        src: BlobHandle,
        src_view: BlobView,
        sum: u64,
    },
}

/// How the I/O of a read from SSD ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoOutcome {
    /// The bytes were read and match their checksum.
    Done,
    /// The read failed (an I/O error): the copy is kept, it may read fine later.
    Failed,
    /// The bytes came back short or failed their checksum: the copy is damaged and dropped.
    Damaged,
}

/// How a read looks for an object's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadMode {
    /// Memory, else rewarm from SSD (or read SSD directly when memory has no room).
    First,
    /// As `First`, after this reader's own rewarm (a memory hit counts as an SSD hit).
    AfterRewarm,
    /// Memory, else the SSD copy directly, whatever DRAM looks like.
    Direct,
}

/// The answer to an allocation.
#[derive(Debug)]
pub enum AllocStep {
    Granted {
        obj: ObjHandle,
        blobs: SmallVec<[BlobView; 2]>,
        link: Arc<WriterLink>,
    },
    Refused(Cow<'static, str>),
    /// No room now, but flushes in flight will free some: wait for one and try again.
    WaitForFlush,
}

/// The answer to a read.
#[derive(Debug)]
pub enum GetStep {
    /// Pinned for the caller; release with `unpin`.
    Ready(BlobView),
    NotFound,
    /// The only copy is on SSD: run this rewarm, then read again.
    Rewarm(IoJob),
    /// Another reader's rewarm is in flight: wait, then read again.
    Wait,
    /// DRAM is full but flushes in flight will free room: wait for one, then read again.
    WaitForFlush,
    /// DRAM has no room to rewarm (its blobs are leased): run this read of the SSD copy and
    /// serve the bytes from it.
    ReadDirect(IoJob),
    Failed(Cow<'static, str>),
}

#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub lease_ms: u64,
    pub high_percent: u64,
    pub low_percent: u64,
    /// An allocation whose writer neither committed nor made progress for this long is
    /// reclaimed: the grant is revoked, the blobs freed once the writer lets go.
    pub alloc_timeout_ms: u64,
}

pub const MAX_REPLICAS: usize = 8;

/// How far one eviction pass scans past leased or pinned blobs before giving up.
const EVICT_SCAN_LIMIT: usize = 4096;

/// Watermark eviction goes in slices: an allocation that finds its medium draining evicts at
/// least this many blobs or [`EVICT_SLICE_BYTES`] (and at least twice its own size), not the
/// whole excess at once.
/// Evicting a tenth of a 1 GiB segment of 64 KiB objects in one go held the shard 1.2-2.5 ms
/// (~0.75 us per blob), which was the p99 of every request queued behind it.
const EVICT_SLICE_BLOBS: usize = 32;

/// A slice also ends past this many bytes (when that covers twice the allocation): evicting a
/// blob may copy it down a tier, and 32 blobs of 1 MiB were 32 MiB of copying in one slice.
const EVICT_SLICE_BYTES: u64 = 4 << 20;

/// LRU candidates collected per pass of an eviction loop (re-collected as they are used).
const EVICT_CANDIDATES: usize = 128;

pub struct Store {
    shard: usize,
    cfg: StoreConfig,
    table: Arc<SegmentTable>,
    /// This shard's cached copy of the segment table (refreshed on a mount/unmount epoch).
    view: SegmentView,
    segs: Vec<Option<ShardSegment>>,
    objects: Slab<Object>,
    index: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    /// Objects whose key carries a chunk hash, hashed by that chunk hash (for `/memory/evict`
    /// and `/memory/prefetch`); the objects of one chunk are separate entries. An entry is
    /// just the object's id, the chunk being read from the object: a map from chunk hash to a
    /// list of ids cost 33 bytes per bucket, 69 bytes per key at 1 M keys
    /// (`benches/store_footprint.rs`), against 5 here.
    chunks: HashTable<u32>,
    blobs: Slab<BlobRec>,
    /// Objects allocated but not yet committed by their writer, so the tick that reclaims
    /// abandoned allocations looks at these only, never at every object.
    uncommitted: HashMap<u32, Uncommitted, foldhash::fast::RandomState>,
    /// Blobs of objects removed (or reclaimed) while their writer was still at work, by the
    /// object's generation: the writer's commit or abort releases its pins on them, and they
    /// are freed then. Bounded by the grants outstanding.
    orphaned: HashMap<u64, SmallVec<[u32; 2]>, foldhash::fast::RandomState>,
    lru: Lru,
    next_tag: u64,
    zombies: Vec<u32>,
    jobs: Vec<IoJob>,
    events: Vec<Event>,
    flushes_in_flight: usize,
    /// Media whose watermark eviction is under way: set when an allocation takes the medium
    /// above the high threshold, cleared when this shard's share is back under the low one.
    draining: [bool; Medium::ALL.len()],
    stats: Arc<StoreStats>,
    tracer: Arc<Tracer>,
    clock: Instant,
}

fn now_ms(clock: Instant) -> u64 {
    clock.elapsed().as_millis() as u64
}

impl Store {
    pub fn new(
        shard: usize,
        cfg: StoreConfig,
        table: Arc<SegmentTable>,
        stats: Arc<StoreStats>,
        tracer: Arc<Tracer>,
        clock: Instant,
    ) -> Store {
        let mut s = Store {
            shard,
            cfg,
            table,
            view: SegmentView::default(),
            segs: Vec::new(),
            objects: Slab::new(),
            index: HashTable::new(),
            hasher: Default::default(),
            chunks: HashTable::new(),
            blobs: Slab::new(),
            uncommitted: HashMap::default(),
            orphaned: HashMap::default(),
            lru: Lru::new(Medium::ALL.len()),
            next_tag: 1,
            zombies: Vec::new(),
            jobs: Vec::new(),
            events: Vec::new(),
            flushes_in_flight: 0,
            draining: [false; Medium::ALL.len()],
            stats,
            tracer,
            clock,
        };
        s.refresh_segments();
        s
    }

    pub fn now_ms(&self) -> u64 {
        now_ms(self.clock)
    }

    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    /// Objects this shard holds (readable or being written).
    pub fn object_count(&self) -> usize {
        self.objects.len()
    }

    pub fn take_jobs(&mut self) -> Vec<IoJob> {
        std::mem::take(&mut self.jobs)
    }

    /// Queues an event produced outside the store (the coordinator of a remove_all).
    pub fn push_event(&mut self, ev: Event) {
        self.events.push(ev);
    }

    /// Exchanges the store's event buffer with `other` (which should be empty).
    pub fn swap_events(&mut self, other: &mut Vec<Event>) {
        std::mem::swap(&mut self.events, other);
    }

    /// Adopts mounted segments this shard has not seen yet.
    /// One atomic load while nothing was mounted or unmounted.
    fn refresh_segments(&mut self) {
        if !self.view.refresh(&self.table) {
            return;
        }
        for seg in self.view.shared().iter() {
            let i = seg.id as usize;
            if self.segs.len() <= i {
                self.segs.resize_with(i + 1, || None);
            }
            if self.segs[i].is_none() {
                self.segs[i] = Some(ShardSegment::new(seg.clone(), self.shard));
            }
        }
    }

    fn hash_key(&self, key: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(key)
    }

    fn hash_chunk(&self, chunk: u64) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(chunk)
    }

    fn find(&self, key: &[u8]) -> Option<u32> {
        let h = self.hash_key(key);
        self.index
            .find(h, |&id| &*self.objects[id as usize].key == key)
            .copied()
    }

    fn new_tag(&mut self) -> u64 {
        self.next_tag += 1;
        self.next_tag
    }

    fn seg(&self, id: SegmentId) -> &ShardSegment {
        self.segs[id as usize]
            .as_ref()
            .expect("blob on an unknown segment")
    }

    fn view(&self, blob: u32, len: u64) -> BlobView {
        let b = &self.blobs[blob as usize];
        BlobView {
            seg: self.seg(b.seg).seg.clone(),
            offset: b.offset,
            len,
            handle: BlobHandle {
                id: blob,
                tag: b.tag,
            },
        }
    }

    fn blob_by_handle(&self, h: BlobHandle) -> Option<&BlobRec> {
        self.blobs.get(h.id as usize).filter(|b| b.tag == h.tag)
    }

    fn object_readable(&self, obj: u32) -> bool {
        self.objects[obj as usize]
            .blobs
            .iter()
            .any(|&b| self.blobs[b as usize].state == BlobState::Readable)
    }

    fn has_readable_on(&self, obj: u32, medium: Medium) -> bool {
        self.objects[obj as usize].blobs.iter().any(|&b| {
            self.blobs[b as usize].state == BlobState::Readable
                && self.blobs[b as usize].medium == medium
        })
    }

    // ----- capacity and allocation -----

    /// (capacity, used) of a medium over all mounted segments.
    pub fn medium_totals(&self, medium: Medium) -> (u64, u64) {
        self.view
            .segments()
            .iter()
            .filter(|s| s.medium == medium)
            .fold((0, 0), |(c, u), s| (c + s.capacity, u + s.used_bytes()))
    }

    fn my_used(&self, medium: Medium) -> u64 {
        self.segs
            .iter()
            .flatten()
            .filter(|s| s.seg.medium == medium)
            .map(|s| s.used())
            .sum()
    }

    /// Allocates one blob of `len` bytes on `medium`, avoiding the ranks in `avoid`,
    /// preferring `prefer_rank` and then the segment with the most room.
    fn alloc_blob(
        &mut self,
        medium: Medium,
        len: u64,
        avoid: &[u32],
        prefer_rank: Option<u32>,
    ) -> Option<(SegmentId, u64, u64)> {
        self.refresh_segments();
        let mut candidates: Vec<(bool, u64, SegmentId)> = self
            .segs
            .iter()
            .flatten()
            .filter(|s| {
                s.seg.medium == medium && s.seg.is_allocatable() && !avoid.contains(&s.seg.rank)
            })
            .map(|s| {
                (
                    Some(s.seg.rank) != prefer_rank,
                    u64::MAX - s.free_bytes_hint(),
                    s.seg.id,
                )
            })
            .collect();
        candidates.sort_unstable();
        for (_, _, id) in candidates {
            let ss = self.segs[id as usize].as_mut().expect("candidate exists");
            if let Some((offset, rounded)) = ss.alloc(len) {
                return Some((id, offset, rounded));
            }
        }
        None
    }

    fn insert_blob(
        &mut self,
        obj: u32,
        seg: SegmentId,
        offset: u64,
        len: u64,
        state: BlobState,
        now: u64,
    ) -> u32 {
        let tag = self.new_tag();
        let s = &self.seg(seg).seg;
        let (medium, rank) = (s.medium, s.rank);
        let id = self.blobs.insert(BlobRec {
            obj,
            seg,
            medium,
            rank,
            offset,
            len,
            state,
            lease_until_ms: 0,
            pins: 0,
            lru: NIL,
            tag,
            since_ms: now,
            flushing: false,
            rewarmed_bytes: 0,
            writing: false,
            sum: 0,
        }) as u32;
        self.objects[obj as usize].blobs.push(id);
        id
    }

    /// Frees a blob's range and slot. The blob must be detached or about to be.
    fn free_blob(&mut self, id: u32) {
        let b = self.blobs.remove(id as usize);
        debug_assert!(b.lru == NIL && b.pins == 0 && !b.writing);
        if b.rewarmed_bytes > 0 {
            let bytes = b.rewarmed_bytes as i64;
            self.stats
                .tier(b.rank, |t| t.rewarm_bytes_current.add(-bytes));
        }
        if let Some(Some(ss)) = self.segs.get_mut(b.seg as usize) {
            ss.free(b.offset, b.len);
        }
    }

    /// Takes a blob out of its object (and the LRU): freed now if nobody holds it, else kept
    /// as a zombie until its lease and pins end.
    fn detach_blob(&mut self, id: u32, now: u64) {
        let (obj, lru, medium) = {
            let b = &self.blobs[id as usize];
            (b.obj, b.lru, b.medium)
        };
        // What the object looked like before this blob left it.
        let (was_on_medium, was_readable) = if obj != NIL {
            (self.has_readable_on(obj, medium), self.object_readable(obj))
        } else {
            (false, false)
        };
        {
            let b = &mut self.blobs[id as usize];
            b.obj = NIL;
            b.lru = NIL;
            b.state = BlobState::Removing;
        }
        if lru != NIL {
            self.lru.remove(medium as usize, lru);
        }
        if obj != NIL {
            self.objects[obj as usize].blobs.retain(|&mut x| x != id);
            if was_on_medium && !self.has_readable_on(obj, medium) {
                let o = &self.objects[obj as usize];
                self.events.push(Event::Removed {
                    chunk: o.chunk,
                    medium,
                    size: o.size,
                });
            }
            if was_readable && !self.object_readable(obj) {
                self.stats.stored_keys.add(-1);
            }
        }
        let b = &self.blobs[id as usize];
        if b.pins == 0 && b.lease_until_ms <= now && !b.flushing {
            self.free_blob(id);
        } else {
            self.zombies.push(id);
        }
    }

    /// Removes an object and all its blobs. A writer still at work is revoked; the blobs it
    /// holds stay allocated (orphaned) until its grant ends.
    fn remove_object(&mut self, obj: u32, now: u64) {
        let blobs: SmallVec<[u32; 2]> = self.objects[obj as usize].blobs.clone();
        if let Some(w) = self.uncommitted.remove(&obj) {
            w.link.revoke();
            let held: SmallVec<[u32; 2]> = blobs
                .iter()
                .copied()
                .filter(|&b| self.blobs[b as usize].writing)
                .collect();
            if !held.is_empty() {
                let generation = self.objects[obj as usize].generation;
                self.orphaned.insert(generation, held);
            }
        }
        // Detaching the blobs keeps `stored_keys` and the removal events right.
        for b in blobs {
            self.detach_blob(b, now);
        }
        let o = self.objects.remove(obj as usize);
        let h = self.hash_key(&o.key);
        if let Ok(e) = self.index.find_entry(h, |&id| id == obj) {
            e.remove();
        }
        if let Some(c) = o.chunk {
            let h = self.hash_chunk(c);
            if let Ok(e) = self.chunks.find_entry(h, |&id| id == obj) {
                e.remove();
            }
        }
    }

    /// Makes a blob readable and eligible for eviction.
    fn make_readable(&mut self, id: u32, now: u64) {
        let obj = self.blobs[id as usize].obj;
        let medium = self.blobs[id as usize].medium;
        let was_readable = self.object_readable(obj);
        let was_on_medium = self.has_readable_on(obj, medium);
        let lru = self.lru.push_front(medium as usize, id);
        let b = &mut self.blobs[id as usize];
        b.state = BlobState::Readable;
        b.lru = lru;
        b.since_ms = now;
        if !was_readable {
            self.stats.stored_keys.add(1);
        }
        if !was_on_medium {
            let o = &self.objects[obj as usize];
            self.events.push(Event::Stored {
                chunk: o.chunk,
                medium,
                size: o.size,
            });
        }
    }

    // ----- put: alloc → write → update_state -----

    /// Allocates `replicas` blobs for a new object (state ALLOCATED) after evicting if the
    /// medium is above its high watermark.
    pub fn alloc(
        &mut self,
        key: Box<[u8]>,
        size: u64,
        medium: Option<Medium>,
        replicas: usize,
        prot: u16,
    ) -> AllocStep {
        let tracer = self.tracer.clone();
        let span = tracer.begin(Tp::Alloc);
        let step = self.alloc_inner(key, size, medium, replicas, prot);
        span.end(!matches!(step, AllocStep::Refused(_)));
        step
    }

    fn alloc_inner(
        &mut self,
        key: Box<[u8]>,
        size: u64,
        medium: Option<Medium>,
        replicas: usize,
        prot: u16,
    ) -> AllocStep {
        let now = self.now_ms();
        self.refresh_segments();
        if self.find(&key).is_some() {
            self.stats.record(Op::Alloc, Outcome::Failure, None);
            return AllocStep::Refused(Cow::Borrowed("Duplicated object: key already exists"));
        }
        let medium = match medium.or_else(|| self.default_medium()) {
            Some(m) => m,
            None => {
                self.stats.record(Op::Alloc, Outcome::Failure, None);
                return AllocStep::Refused(Cow::Borrowed("No memory segment is mounted"));
            }
        };
        let ranks = self.ranks_of(medium);
        if ranks < replicas {
            self.stats.record(Op::Alloc, Outcome::Failure, None);
            return AllocStep::Refused(Cow::Owned(if ranks == 0 {
                let key = match medium {
                    Medium::Hbm => "set ock.mmc.local_service.hbm.size",
                    Medium::Dram => "set ock.mmc.local_service.dram.size",
                    Medium::Ssd => "set ock.mmc.ssd.enable and ock.mmc.ssd.path",
                };
                format!("No {medium} segment is mounted: mount one, or {key}")
            } else {
                format!("Not enough ranks for {replicas} replicas on {medium} ({ranks} available)")
            }));
        }
        let (capacity, _) = self.medium_totals(medium);
        if size > capacity {
            self.stats.record(Op::Alloc, Outcome::Failure, None);
            return AllocStep::Refused(Cow::Owned(format!(
                "Object of {size} bytes is larger than {medium} capacity ({capacity} bytes)"
            )));
        }
        self.evict_for(medium, size * replicas as u64, now);

        let mut placed: SmallVec<[(SegmentId, u64, u64); 2]> = SmallVec::new();
        let mut ranks_used: SmallVec<[u32; 2]> = SmallVec::new();
        while placed.len() < replicas {
            match self.alloc_blob(medium, size, &ranks_used, None) {
                Some(p) => {
                    ranks_used.push(self.seg(p.0).seg.rank);
                    placed.push(p);
                }
                None => {
                    // No room even above the watermark: make room now, or wait for flushes.
                    if self.evict_forced(medium, size, now) {
                        continue;
                    }
                    for (seg, off, len) in placed {
                        self.segs[seg as usize].as_mut().unwrap().free(off, len);
                    }
                    if self.flushes_in_flight > 0 {
                        return AllocStep::WaitForFlush;
                    }
                    self.stats.record(Op::Alloc, Outcome::Failure, None);
                    return AllocStep::Refused(Cow::Owned(format!(
                        "No space on {medium} for {size} bytes, even after eviction"
                    )));
                }
            }
        }

        let generation = self.new_tag();
        let chunk = keys::chunk_hash(&key);
        let obj = self.objects.insert(Object {
            key,
            size,
            prot,
            blobs: SmallVec::new(),
            generation,
            created_ms: now,
            rewarming: false,
            chunk,
        }) as u32;
        let link = Arc::new(WriterLink::default());
        self.uncommitted.insert(
            obj,
            Uncommitted {
                link: link.clone(),
                seen_bytes: 0,
                progress_ms: now,
            },
        );
        let h = self.hash_key(&self.objects[obj as usize].key);
        let objects = &self.objects;
        let hasher = &self.hasher;
        self.index.insert_unique(h, obj, |&id| {
            use std::hash::BuildHasher;
            hasher.hash_one(&*objects[id as usize].key)
        });
        if let Some(c) = chunk {
            let h = self.hash_chunk(c);
            self.chunks.insert_unique(h, obj, |&id| {
                use std::hash::BuildHasher;
                let c = objects[id as usize].chunk.expect("indexed by its chunk");
                hasher.hash_one(c)
            });
        }
        let mut views = SmallVec::new();
        for (seg, offset, len) in placed {
            let id = self.insert_blob(obj, seg, offset, len, BlobState::Allocated, now);
            let b = &mut self.blobs[id as usize];
            b.pins = 1; // the writer's pin, released when its grant ends
            b.writing = true;
            views.push(self.view(id, size));
        }
        let rank = views.first().map(|v: &BlobView| v.seg.rank);
        self.stats.record(Op::Alloc, Outcome::Success, rank);
        AllocStep::Granted {
            obj: ObjHandle {
                id: obj,
                generation,
            },
            blobs: views,
            link,
        }
    }

    /// The medium a put goes to when the client names none: the fastest one mounted.
    fn default_medium(&self) -> Option<Medium> {
        [Medium::Hbm, Medium::Dram].into_iter().find(|&m| {
            self.view
                .segments()
                .iter()
                .any(|s| s.medium == m && s.is_allocatable())
        })
    }

    fn ranks_of(&self, medium: Medium) -> usize {
        let mut ranks: Vec<u32> = self
            .view
            .segments()
            .iter()
            .filter(|s| s.medium == medium && s.is_allocatable())
            .map(|s| s.rank)
            .collect();
        ranks.sort_unstable();
        ranks.dedup();
        ranks.len()
    }

    /// update_state after the write: every blob becomes READABLE (`ok`) or the object is
    /// dropped (a failed write). Also the end of the writer's grant (an abort is `!ok`): its
    /// pins are released, and blobs orphaned by a removal meanwhile are freed. NotFound when
    /// the object was removed meanwhile.
    pub fn commit(&mut self, obj: ObjHandle, ok: bool) -> crate::shards::Reply {
        let tracer = self.tracer.clone();
        let span = tracer.begin(Tp::UpdateState);
        let reply = self.commit_inner(obj, ok);
        span.end(matches!(reply, crate::shards::Reply::Done));
        reply
    }

    fn commit_inner(&mut self, obj: ObjHandle, ok: bool) -> crate::shards::Reply {
        use crate::shards::Reply;
        let now = self.now_ms();
        let live = self
            .objects
            .get(obj.id as usize)
            .is_some_and(|o| o.generation == obj.generation);
        if !live {
            if let Some(held) = self.orphaned.remove(&obj.generation) {
                for b in held {
                    self.release_writer(b, now);
                }
            }
            self.stats.record(Op::UpdateState, Outcome::NotFound, None);
            return Reply::NotFound;
        }
        let blobs: SmallVec<[u32; 2]> = self.objects[obj.id as usize].blobs.clone();
        let rank = blobs.first().map(|&b| self.blobs[b as usize].rank);
        for &b in &blobs {
            self.release_writer(b, now);
        }
        if ok {
            self.uncommitted.remove(&obj.id);
            for &b in &blobs {
                if self.blobs[b as usize].state == BlobState::Allocated {
                    self.make_readable(b, now);
                }
            }
            self.stats.record(Op::UpdateState, Outcome::Success, rank);
            Reply::Done
        } else {
            self.remove_object(obj.id, now);
            self.stats.record(Op::UpdateState, Outcome::Success, rank);
            Reply::Done
        }
    }

    // ----- get -----

    /// A leased, pinned read of the fastest readable copy. An object held only on SSD is
    /// rewarmed into DRAM first.
    pub fn get(&mut self, key: &[u8]) -> GetStep {
        self.get_inner(key, ReadMode::First)
    }

    /// The read that follows this reader's own rewarm: served from the rewarmed copy, so it
    /// counts as an SSD hit (`get_hits_ssd`), not a memory hit.
    pub fn get_after_rewarm(&mut self, key: &[u8]) -> GetStep {
        self.get_inner(key, ReadMode::AfterRewarm)
    }

    /// The last resort of a reader that kept waiting (for rewarms or flushes): a memory
    /// copy, else the SSD copy read directly, never another wait.
    pub fn get_direct(&mut self, key: &[u8]) -> GetStep {
        self.get_inner(key, ReadMode::Direct)
    }

    fn get_inner(&mut self, key: &[u8], mode: ReadMode) -> GetStep {
        let rewarmed = mode == ReadMode::AfterRewarm;
        let now = self.now_ms();
        let Some(obj) = self.find(key) else {
            self.stats.record(Op::Get, Outcome::NotFound, None);
            return GetStep::NotFound;
        };
        let best = self.objects[obj as usize]
            .blobs
            .iter()
            .copied()
            .filter(|&b| self.blobs[b as usize].state == BlobState::Readable)
            .min_by_key(|&b| self.blobs[b as usize].medium);
        let Some(blob) = best else {
            self.stats.record(Op::Get, Outcome::NotFound, None);
            return GetStep::NotFound;
        };
        let (medium, rank, lru) = {
            let b = &self.blobs[blob as usize];
            (b.medium, b.rank, b.lru)
        };
        if medium.is_memory() {
            let lease = now + self.cfg.lease_ms;
            let b = &mut self.blobs[blob as usize];
            b.lease_until_ms = b.lease_until_ms.max(lease);
            b.pins += 1;
            self.lru.touch(medium as usize, lru);
            self.stats.record(Op::Get, Outcome::Success, Some(rank));
            if rewarmed {
                self.stats.tier(rank, |t| t.get_hits_ssd.inc());
            } else {
                self.stats.tier(rank, |t| t.get_hits_dram.inc());
            }
            self.events.push(Event::Read {
                medium,
                bytes: self.objects[obj as usize].size,
            });
            let size = self.objects[obj as usize].size;
            return GetStep::Ready(self.view(blob, size));
        }
        // Only on SSD.
        if mode == ReadMode::Direct {
            return self.direct_read(obj, blob, now);
        }
        if self.objects[obj as usize].rewarming {
            return GetStep::Wait;
        }
        // A faulted SSD tier takes no flushes, so waiting for one to make room in DRAM is
        // pointless: read the SSD copy directly instead.
        let faulted = self.ssd_faulted(blob);
        match self.start_rewarm(obj, blob, now, false) {
            Some(job) => GetStep::Rewarm(job),
            None if self.flushes_in_flight > 0 && !faulted => GetStep::WaitForFlush,
            None => {
                // No DRAM to rewarm into: serve this read from the SSD copy itself.
                self.stats.tier(rank, |t| t.rewarm_failed.inc());
                self.direct_read(obj, blob, now)
            }
        }
    }

    /// A read of an SSD blob straight into the reader's buffer (pinned and leased for it).
    fn direct_read(&mut self, obj: u32, blob: u32, now: u64) -> GetStep {
        let size = self.objects[obj as usize].size;
        let b = &mut self.blobs[blob as usize];
        b.pins += 1;
        b.lease_until_ms = b.lease_until_ms.max(now + self.cfg.lease_ms);
        let (tag, sum) = (b.tag, b.sum);
        GetStep::ReadDirect(IoJob::ReadSsd {
            src: BlobHandle { id: blob, tag },
            src_view: self.view(blob, size),
            sum,
        })
    }

    /// Whether a blob is on an SSD file that its writes faulted.
    fn ssd_faulted(&self, blob: u32) -> bool {
        let b = &self.blobs[blob as usize];
        self.seg(b.seg)
            .seg
            .backend
            .file()
            .is_some_and(|f| f.faulted())
    }

    /// Whether some SSD segment takes flushes (mounted, not faulted).
    fn ssd_takes_flushes(&self) -> bool {
        self.segs
            .iter()
            .flatten()
            .any(|s| s.seg.medium == Medium::Ssd && s.seg.is_allocatable())
    }

    /// Finishes a direct SSD read: the read counts as a get (success or failure); a damaged
    /// copy is dropped.
    pub fn finish_direct_read(&mut self, job: &IoJob, outcome: IoOutcome) {
        let IoJob::ReadSsd { src, src_view, .. } = job else {
            return;
        };
        self.unpin(*src);
        if outcome == IoOutcome::Damaged {
            self.drop_damaged(*src);
        }
        let outcome = if outcome == IoOutcome::Done {
            Outcome::Success
        } else {
            Outcome::Failure
        };
        self.stats.record(Op::Get, outcome, Some(src_view.seg.rank));
    }

    /// Drops an SSD copy whose bytes came back damaged (short, or not matching their
    /// checksum), and its object when that was the last readable copy. Removal events are
    /// published as for any removal (a KV `BlockRemoved` for the SSD tier).
    fn drop_damaged(&mut self, src: BlobHandle) {
        let now = self.now_ms();
        let Some(b) = self.blob_by_handle(src) else {
            return;
        };
        let (obj, seg) = (b.obj, b.seg);
        if obj == NIL {
            return;
        }
        if let Some(f) = self.seg(seg).seg.backend.file() {
            f.record_damaged("checksum mismatch or short read");
        }
        let others = self.objects[obj as usize]
            .blobs
            .iter()
            .any(|&o| o != src.id && self.blobs[o as usize].state == BlobState::Readable);
        if others {
            self.detach_blob(src.id, now);
        } else {
            self.remove_object(obj, now);
        }
    }

    /// Allocates a DRAM blob for an SSD blob and returns the job that copies it.
    fn start_rewarm(&mut self, obj: u32, ssd_blob: u32, now: u64, prefetch: bool) -> Option<IoJob> {
        let size = self.objects[obj as usize].size;
        let rank = self.blobs[ssd_blob as usize].rank;
        // With the SSD tier faulted, evicting from DRAM deletes: a rewarm then takes only
        // the room DRAM has (the SSD copy can be read directly), never another object's.
        let faulted = self.ssd_faulted(ssd_blob);
        if !faulted {
            self.evict_for(Medium::Dram, size, now);
        }
        let placed = match self.alloc_blob(Medium::Dram, size, &[], Some(rank)) {
            Some(p) => p,
            None if faulted => return None,
            None => {
                self.evict_forced(Medium::Dram, size, now);
                self.alloc_blob(Medium::Dram, size, &[], Some(rank))?
            }
        };
        let (seg, offset, len) = placed;
        let dst = self.insert_blob(obj, seg, offset, len, BlobState::Allocated, now);
        self.blobs[dst as usize].pins = 1;
        self.blobs[ssd_blob as usize].pins += 1;
        self.objects[obj as usize].rewarming = true;
        let generation = self.objects[obj as usize].generation;
        self.events.push(Event::RewarmStarted {
            bytes: size,
            prefetch,
        });
        Some(IoJob::Rewarm {
            prefetch,
            obj: ObjHandle {
                id: obj,
                generation,
            },
            src: BlobHandle {
                id: ssd_blob,
                tag: self.blobs[ssd_blob as usize].tag,
            },
            dst: BlobHandle {
                id: dst,
                tag: self.blobs[dst as usize].tag,
            },
            src_view: self.view(ssd_blob, size),
            dst_view: self.view(dst, size),
            sum: self.blobs[ssd_blob as usize].sum,
        })
    }

    /// Finishes a rewarm (its I/O took `micros`): the DRAM copy becomes readable, or is
    /// dropped on failure; a damaged SSD copy is dropped too.
    pub fn finish_rewarm(&mut self, job: &IoJob, outcome: IoOutcome, micros: u64) {
        let IoJob::Rewarm {
            obj,
            src,
            dst,
            prefetch,
            src_view,
            ..
        } = job
        else {
            return;
        };
        let ok = outcome == IoOutcome::Done;
        let now = self.now_ms();
        self.events.push(Event::Rewarmed {
            bytes: src_view.len,
            ok,
            micros,
            prefetch: *prefetch,
        });
        self.unpin(*src);
        let live = self
            .objects
            .get(obj.id as usize)
            .is_some_and(|o| o.generation == obj.generation);
        if live {
            self.objects[obj.id as usize].rewarming = false;
        }
        let Some(d) = self.blob_by_handle(*dst) else {
            return;
        };
        let (rank, state) = (d.rank, d.state);
        self.blobs[dst.id as usize].pins -= 1;
        if ok && live && state == BlobState::Allocated {
            let size = self.objects[obj.id as usize].size;
            self.blobs[dst.id as usize].rewarmed_bytes = size;
            self.stats.tier(rank, |t| {
                t.rewarm.inc();
                t.rewarm_bytes.add(size);
                t.rewarm_bytes_current.add(size as i64);
            });
            self.make_readable(dst.id, now);
        } else {
            if !ok {
                self.stats.tier(rank, |t| t.rewarm_failed.inc());
            }
            if self.blobs[dst.id as usize].obj != NIL {
                self.detach_blob(dst.id, now);
            } else if self.blobs[dst.id as usize].pins == 0 {
                self.reap_zombies(now);
            }
            if outcome == IoOutcome::Damaged {
                self.drop_damaged(*src);
            }
        }
    }

    /// Ends a writer's hold on one of its blobs; a detached blob nobody else holds is freed.
    fn release_writer(&mut self, id: u32, now: u64) {
        let b = &mut self.blobs[id as usize];
        if !b.writing {
            return;
        }
        b.writing = false;
        b.pins -= 1;
        if b.obj == NIL && b.pins == 0 && b.lease_until_ms <= now && !b.flushing {
            self.zombies.retain(|&z| z != id);
            self.free_blob(id);
        }
    }

    /// Releases a pin taken by `get` (or by a job).
    pub fn unpin(&mut self, h: BlobHandle) {
        let now = self.now_ms();
        if let Some(b) = self.blobs.get_mut(h.id as usize).filter(|b| b.tag == h.tag) {
            b.pins = b.pins.saturating_sub(1);
            if b.obj == NIL && b.pins == 0 && b.lease_until_ms <= now && !b.flushing {
                self.zombies.retain(|&z| z != h.id);
                self.free_blob(h.id);
            }
        }
    }

    // ----- exist, query, remove, list -----

    /// Whether the object is readable: the rank of its first readable copy.
    pub fn exists(&mut self, key: &[u8]) -> Option<u32> {
        let rank = self.find(key).and_then(|o| {
            self.objects[o as usize]
                .blobs
                .iter()
                .map(|&b| &self.blobs[b as usize])
                .find(|b| b.state == BlobState::Readable)
                .map(|b| b.rank)
        });
        let outcome = if rank.is_some() {
            Outcome::Success
        } else {
            Outcome::NotFound
        };
        self.stats.record(Op::ExistKey, outcome, rank);
        rank
    }

    /// The object as `/query_key` shows it (counted as a query).
    pub fn query(&mut self, key: &[u8]) -> Option<QueryInfo> {
        let now = self.now_ms();
        let Some(obj) = self.find(key) else {
            self.stats.record(Op::Query, Outcome::NotFound, None);
            return None;
        };
        let o = &self.objects[obj as usize];
        let blobs: Vec<BlobInfo> = o
            .blobs
            .iter()
            .map(|&b| {
                let b = &self.blobs[b as usize];
                BlobInfo {
                    rank: b.rank,
                    medium: b.medium,
                    gva: self.seg(b.seg).seg.gva(b.offset),
                    state: b.state as u8,
                    lease_ttl_ms: b.lease_until_ms.saturating_sub(now),
                }
            })
            .collect();
        let rank = blobs.first().map(|b| b.rank);
        self.stats.record(Op::Query, Outcome::Success, rank);
        Some(QueryInfo {
            size: o.size,
            prot: o.prot,
            valid: self.object_readable(obj),
            blobs,
        })
    }

    /// Removes an object. A leased or pinned copy stays allocated until its lease and pins
    /// end; the key is gone at once.
    pub fn remove(&mut self, key: &[u8]) -> bool {
        let now = self.now_ms();
        match self.find(key) {
            Some(obj) => {
                let rank = self.objects[obj as usize]
                    .blobs
                    .first()
                    .map(|&b| self.blobs[b as usize].rank);
                self.remove_object(obj, now);
                self.stats.record(Op::Remove, Outcome::Success, rank);
                true
            }
            None => {
                self.stats.record(Op::Remove, Outcome::NotFound, None);
                false
            }
        }
    }

    /// Removes every object of this shard; returns how many. The per-object removal events
    /// are suppressed: the caller publishes one `Cleared` for the whole remove_all.
    pub fn remove_all(&mut self) -> u64 {
        let now = self.now_ms();
        let ids: Vec<u32> = self.objects.iter().map(|(i, _)| i as u32).collect();
        let n = ids.len() as u64;
        let before = self.events.len();
        for id in ids {
            self.remove_object(id, now);
        }
        let mut i = before;
        while i < self.events.len() {
            if matches!(self.events[i], Event::Removed { .. }) {
                self.events.remove(i);
            } else {
                i += 1;
            }
        }
        n
    }

    /// Appends readable keys (one per line) from slot `cursor` on, until about `max_bytes`
    /// are written or `limit` keys; returns the slot to continue from.
    pub fn list_keys(
        &self,
        cursor: u32,
        max_bytes: usize,
        prefix: &[u8],
        limit: &mut u64,
        out: &mut Vec<u8>,
    ) -> Option<u32> {
        let cap = self.objects.capacity() as u32;
        let mut i = cursor;
        while i < cap {
            if out.len() >= max_bytes || *limit == 0 {
                return Some(i);
            }
            if let Some(o) = self.objects.get(i as usize) {
                if o.key.starts_with(prefix) && self.object_readable(i) {
                    out.extend_from_slice(&o.key);
                    out.push(b'\n');
                    *limit -= 1;
                }
            }
            i += 1;
        }
        None
    }

    // ----- eviction -----

    fn is_evictable(&self, b: &BlobRec, now: u64) -> bool {
        b.state == BlobState::Readable
            && b.pins == 0
            && b.lease_until_ms <= now
            && !b.flushing
            && !self.objects[b.obj as usize].rewarming
    }

    /// Watermark eviction before an allocation of `need` bytes on `medium`. Going above the
    /// high threshold starts a drain: until this shard's share of the excess over the low
    /// threshold is gone, each allocation on the medium (and each housekeeping tick) evicts
    /// one slice of least recently used blobs, so the drain is spread over the requests
    /// instead of stalling one of them.
    fn evict_for(&mut self, medium: Medium, need: u64, now: u64) {
        let (cap, used) = self.medium_totals(medium);
        let m = medium as usize;
        if cap == 0 {
            // Unmounted while draining: nothing left to drain.
            self.set_draining(medium, false);
            return;
        }
        if (used + need) * 100 > cap * self.cfg.high_percent {
            self.draining[m] = true;
        }
        if !self.draining[m] {
            return;
        }
        let low = cap * self.cfg.low_percent / 100;
        let excess = (used + need).saturating_sub(low);
        let mine = self.my_used(medium);
        let target = if used == 0 {
            excess
        } else {
            (excess as u128 * mine as u128 / used as u128) as u64
        };
        if target == 0 {
            self.set_draining(medium, false);
            return;
        }
        let tracer = self.tracer.clone();
        let span = tracer.begin(Tp::Evict);
        let (freed, evicted) = self.evict_lru(medium, now, |freed, n| {
            freed >= target
                || (freed >= 2 * need && (n >= EVICT_SLICE_BLOBS || freed >= EVICT_SLICE_BYTES))
        });
        // Done, or stuck behind leased and pinned blobs (the next allocation above the high
        // threshold starts again).
        self.set_draining(medium, freed < target && evicted > 0);
        span.end(freed >= target || evicted > 0);
    }

    fn set_draining(&mut self, medium: Medium, on: bool) {
        self.draining[medium as usize] = on;
        self.stats
            .evict_running
            .set(self.draining.iter().any(|&d| d) as i64);
    }

    /// Continues the drains under way by one slice each (from the housekeeping tick, so that a
    /// drain ends even when allocations stop).
    fn continue_drains(&mut self, now: u64) {
        for medium in Medium::ALL {
            if self.draining[medium as usize] {
                self.evict_for(medium, 0, now);
            }
        }
    }

    /// Eviction when an allocation found no room: evicts least recently used blobs of the
    /// medium one by one until `need` bytes could fit. True when something was evicted.
    fn evict_forced(&mut self, medium: Medium, need: u64, now: u64) -> bool {
        self.evict_lru(medium, now, |freed, _| freed >= need.max(1))
            .1
            > 0
    }

    /// Evicts the medium's least recently used evictable blobs until `done(freed bytes,
    /// blobs evicted)`, looking at no more than [`EVICT_SCAN_LIMIT`] blobs it must skip.
    /// Returns the bytes freed and the blobs evicted.
    fn evict_lru(
        &mut self,
        medium: Medium,
        now: u64,
        done: impl Fn(u64, usize) -> bool,
    ) -> (u64, usize) {
        let mut freed = 0;
        let mut evicted = 0;
        let mut skipped = 0;
        while !done(freed, evicted) && skipped < EVICT_SCAN_LIMIT {
            // Skipped blobs stay at the head of the list (evicting others does not move
            // them), so each pass starts after them.
            let victims: SmallVec<[u32; EVICT_CANDIDATES]> = self
                .lru
                .iter_lru(medium as usize)
                .skip(skipped)
                .take(EVICT_CANDIDATES)
                .collect();
            if victims.is_empty() {
                break;
            }
            for v in victims {
                if done(freed, evicted) {
                    break;
                }
                let evictable = self.blobs.get(v as usize).is_some_and(|b| {
                    b.lru != NIL && b.medium == medium && self.is_evictable(b, now)
                });
                if !evictable {
                    skipped += 1;
                    continue;
                }
                freed += self.evict_blob(v, now);
                evicted += 1;
            }
        }
        (freed, evicted)
    }

    /// Moves one blob down a tier (or drops it where nothing lower has room). Returns the
    /// bytes this frees on its medium now or when its flush lands.
    fn evict_blob(&mut self, id: u32, now: u64) -> u64 {
        let (obj, medium, rank, len, since) = {
            let b = &self.blobs[id as usize];
            (b.obj, b.medium, b.rank, b.len, b.since_ms)
        };
        let size = self.objects[obj as usize].size;
        let lifetime = now.saturating_sub(self.objects[obj as usize].created_ms);
        self.stats.tier(rank, |t| t.evict.inc());
        self.events.push(Event::Evicted {
            medium,
            bytes: size,
            lifetime_ms: lifetime,
            idle_ms: now.saturating_sub(since.max(self.blobs[id as usize].lease_until_ms.min(now))),
        });
        // Down the tiers: the first one below with room takes the blob (a copy that already
        // exists lower down, as after a rewarm, makes the move free).
        let mut tier = medium.lower_tier();
        while let Some(t) = tier {
            if self.has_readable_on(obj, t) {
                self.detach_blob(id, now);
                return len;
            }
            if let Some((seg, off, alen)) = self.alloc_demoted(t, size, rank, now) {
                if t.is_memory() {
                    if self.copy_memory(id, seg, off, size) {
                        let dst = self.insert_blob(obj, seg, off, alen, BlobState::Allocated, now);
                        self.make_readable(dst, now);
                        self.stats.demoted_blobs.inc();
                        self.detach_blob(id, now);
                        return len;
                    }
                    self.segs[seg as usize].as_mut().unwrap().free(off, alen);
                } else {
                    let dst = self.insert_blob(obj, seg, off, alen, BlobState::Allocated, now);
                    self.blobs[dst as usize].pins = 1;
                    self.blobs[id as usize].flushing = true;
                    self.flushes_in_flight += 1;
                    self.stats.flush_in_flight_bytes.add(size as i64);
                    self.events.push(Event::FlushStarted { bytes: size });
                    self.jobs.push(IoJob::Flush {
                        src: BlobHandle {
                            id,
                            tag: self.blobs[id as usize].tag,
                        },
                        dst: BlobHandle {
                            id: dst,
                            tag: self.blobs[dst as usize].tag,
                        },
                        src_view: self.view(id, size),
                        dst_view: self.view(dst, size),
                    });
                    return len;
                }
            }
            tier = t.lower_tier();
        }
        // Nothing lower has room: the copy is dropped, and the object with it if it was the
        // last one.
        if self.objects[obj as usize].blobs.len() <= 1 {
            self.stats.evicted_objects_deleted.inc();
            self.remove_object(obj, now);
        } else {
            self.detach_blob(id, now);
        }
        len
    }

    /// Room on the tier below for a demoted blob: watermark eviction there first (SSD
    /// eviction deletes), then the allocation, then forced eviction there.
    fn alloc_demoted(
        &mut self,
        medium: Medium,
        size: u64,
        rank: u32,
        now: u64,
    ) -> Option<(SegmentId, u64, u64)> {
        if medium == Medium::Ssd && !self.ssd_takes_flushes() {
            // Faulted (or being unmounted): nothing goes there, and nothing there need go.
            return None;
        }
        self.evict_for(medium, size, now);
        if let Some(p) = self.alloc_blob(medium, size, &[], Some(rank)) {
            return Some(p);
        }
        if medium == Medium::Ssd && self.evict_forced(medium, size, now) {
            return self.alloc_blob(medium, size, &[], Some(rank));
        }
        None
    }

    /// Copies a memory blob's bytes into another memory segment (HBM → DRAM).
    fn copy_memory(&self, src: u32, dst_seg: SegmentId, dst_off: u64, size: u64) -> bool {
        let b = &self.blobs[src as usize];
        let from = &self.seg(b.seg).seg.backend;
        let to = &self.seg(dst_seg).seg.backend;
        // Straight into the destination when it is host memory, else through a buffer.
        let res = match to.host_region() {
            Some(region) if region.check(dst_off, size as usize).is_ok() => {
                // SAFETY: the destination range was just allocated for this copy; the source
                // blob is readable and nobody writes it.
                let dst =
                    unsafe { std::slice::from_raw_parts_mut(region.ptr(dst_off), size as usize) };
                // SAFETY: see above.
                unsafe { from.read(b.offset, dst) }
            }
            _ => {
                let mut buf = vec![0u8; size as usize];
                // SAFETY: see above.
                unsafe {
                    from.read(b.offset, &mut buf)
                        .and_then(|()| to.write(dst_off, &buf))
                }
            }
        };
        if let Err(e) = &res {
            log::error!(
                "moving a blob from {} down a tier failed: {e}",
                self.seg(b.seg).seg.name
            );
        }
        res.is_ok()
    }

    /// Finishes a flush: on success the SSD copy (with `sum`, the checksum of the bytes
    /// written) replaces the memory copy; on failure the SSD allocation is released and the
    /// memory copy stays (nothing acknowledged is lost).
    pub fn finish_flush(&mut self, job: &IoJob, ok: bool, sum: u64, micros: u64) {
        let IoJob::Flush { src, dst, .. } = job else {
            return;
        };
        let now = self.now_ms();
        self.flushes_in_flight -= 1;
        let src_live = self.blob_by_handle(*src).is_some();
        let size = job_size(job);
        self.events.push(Event::Flushed {
            bytes: size,
            ok,
            micros,
        });
        self.stats.flush_in_flight_bytes.add(-(size as i64));
        if src_live {
            self.blobs[src.id as usize].flushing = false;
        }
        let Some(d) = self.blob_by_handle(*dst) else {
            return;
        };
        let rank = d.rank;
        self.blobs[dst.id as usize].pins -= 1;
        let dst_attached = self.blobs[dst.id as usize].obj != NIL;
        if ok && dst_attached && self.blobs[dst.id as usize].state == BlobState::Allocated {
            self.stats.tier(rank, |t| {
                t.flush_blobs.inc();
                t.flush_bytes.add(size);
            });
            self.blobs[dst.id as usize].sum = sum;
            self.make_readable(dst.id, now);
            if src_live && self.blobs[src.id as usize].obj != NIL {
                self.detach_blob(src.id, now);
            }
        } else {
            if !ok {
                self.stats.flush_failed.inc();
            }
            if dst_attached {
                self.detach_blob(dst.id, now);
            }
        }
        self.reap_zombies(now);
    }

    /// Frees zombies whose leases and pins have ended; reclaims allocations whose writer
    /// neither committed nor made progress for `alloc_timeout_ms`. Run on the shard's tick.
    pub fn tick(&mut self) {
        let now = self.now_ms();
        // Pick up mounts and unmounts even on a shard that stores nothing meanwhile.
        self.refresh_segments();
        self.reap_zombies(now);
        self.continue_drains(now);
        // Only objects whose writer has not committed yet: a tick never walks all objects.
        let timeout = self.cfg.alloc_timeout_ms;
        let mut stale: Vec<u32> = Vec::new();
        for (&obj, w) in self.uncommitted.iter_mut() {
            let written = w.link.written_bytes.load(Ordering::Relaxed);
            if written != w.seen_bytes {
                w.seen_bytes = written;
                w.progress_ms = now;
            } else if now.saturating_sub(w.progress_ms) > timeout {
                stale.push(obj);
            }
        }
        for obj in stale {
            // Reclaiming revokes the writer's grant and detaches the blobs; they are freed
            // when the writer's commit or abort releases them, never under a live writer.
            log::warn!(
                "reclaiming {:?}: its writer neither committed nor wrote for {timeout} ms; grant revoked",
                String::from_utf8_lossy(&self.objects[obj as usize].key),
            );
            self.remove_object(obj, now);
        }
    }

    fn reap_zombies(&mut self, now: u64) {
        let mut i = 0;
        while i < self.zombies.len() {
            let id = self.zombies[i];
            let b = &self.blobs[id as usize];
            if b.pins == 0 && b.lease_until_ms <= now && !b.flushing {
                self.zombies.swap_remove(i);
                self.free_blob(id);
            } else {
                i += 1;
            }
        }
    }
}

impl Store {
    // ----- /memory/evict, /memory/prefetch -----

    /// Objects named by a chunk hash: every key that parses to that hash, and the key equal
    /// to the string itself.
    pub fn objects_named(&self, name: &[u8]) -> SmallVec<[u32; 4]> {
        let mut out: SmallVec<[u32; 4]> = SmallVec::new();
        if let Some(c) = keys::parse_hex_hash(name) {
            out.extend(
                self.chunks
                    .iter_hash(self.hash_chunk(c))
                    .copied()
                    .filter(|&id| self.objects[id as usize].chunk == Some(c)),
            );
        }
        if let Some(o) = self.find(name) {
            if !out.contains(&o) {
                out.push(o);
            }
        }
        out
    }

    /// Evicts the named objects: everywhere (`locations` None) or one tier down from each
    /// named medium. Returns the tier removals (an object leaving one medium counts one).
    /// Leased or pinned copies are left alone.
    pub fn evict_named(&mut self, name: &[u8], locations: Option<&[Medium]>) -> u64 {
        let now = self.now_ms();
        let mut removals = 0;
        for obj in self.objects_named(name) {
            if !self.objects.contains(obj as usize) {
                continue;
            }
            match locations {
                None => {
                    let media: SmallVec<[Medium; 3]> = Medium::ALL
                        .into_iter()
                        .filter(|&m| self.has_readable_on(obj, m))
                        .collect();
                    removals += media.len() as u64;
                    // One eviction per tier the object leaves, as `num_evicted` counts them,
                    // on the rank of that tier's first readable copy.
                    for &m in &media {
                        let rank = self.objects[obj as usize]
                            .blobs
                            .iter()
                            .map(|&b| &self.blobs[b as usize])
                            .find(|b| b.medium == m && b.state == BlobState::Readable)
                            .map_or(0, |b| b.rank);
                        self.stats.tier(rank, |t| t.evict.inc());
                    }
                    self.remove_object(obj, now);
                }
                Some(media) => {
                    for &m in media {
                        let blob = self.objects[obj as usize].blobs.iter().copied().find(|&b| {
                            let rec = &self.blobs[b as usize];
                            rec.medium == m && self.is_evictable(rec, now)
                        });
                        if let Some(b) = blob {
                            self.evict_blob(b, now);
                            removals += 1;
                            if !self.objects.contains(obj as usize) {
                                break;
                            }
                        }
                    }
                }
            }
        }
        removals
    }

    /// Starts rewarms (SSD → DRAM) for the named objects held only on SSD. Returns the jobs,
    /// which the shard runs in the background.
    pub fn prefetch_named(&mut self, name: &[u8]) -> Vec<IoJob> {
        let now = self.now_ms();
        let mut jobs = Vec::new();
        for obj in self.objects_named(name) {
            let o = &self.objects[obj as usize];
            if o.rewarming
                || Medium::ALL
                    .iter()
                    .any(|&m| m.is_memory() && self.has_readable_on(obj, m))
            {
                continue;
            }
            let ssd = o.blobs.iter().copied().find(|&b| {
                let r = &self.blobs[b as usize];
                r.state == BlobState::Readable && r.medium == Medium::Ssd
            });
            if let Some(b) = ssd {
                if let Some(job) = self.start_rewarm(obj, b, now, true) {
                    jobs.push(job);
                }
            }
        }
        jobs
    }

    // ----- unmount -----

    /// Moves this shard's blobs off a segment being unmounted: to another segment of the same
    /// medium, else to the memory tier below, else they are dropped (with their object when
    /// it has no other copy). Returns false while some blob there is still pinned (a transfer
    /// in flight); call again later. When it returns true, the shard holds nothing there.
    pub fn evacuate(&mut self, seg: SegmentId) -> bool {
        let now = self.now_ms();
        let ids: Vec<u32> = self
            .blobs
            .iter()
            .filter(|(_, b)| b.seg == seg)
            .map(|(i, _)| i as u32)
            .collect();
        let mut busy = false;
        for id in ids {
            let b = &self.blobs[id as usize];
            if b.obj == NIL || b.pins > 0 || b.flushing || b.state != BlobState::Readable {
                busy = true;
                continue;
            }
            let (obj, medium, rank) = (b.obj, b.medium, b.rank);
            let size = self.objects[obj as usize].size;
            let others: SmallVec<[(u32, Medium); 2]> = self.objects[obj as usize]
                .blobs
                .iter()
                .filter(|&&o| o != id && self.blobs[o as usize].state == BlobState::Readable)
                .map(|&o| (self.blobs[o as usize].rank, self.blobs[o as usize].medium))
                .collect();
            let mut moved = false;
            if medium.is_memory() {
                // Same medium on a rank without a copy yet; else (when this is the only copy)
                // the memory tier below.
                let mut targets: SmallVec<[Medium; 2]> = SmallVec::new();
                targets.push(medium);
                if others.is_empty() {
                    targets.extend(medium.lower_tier().filter(|m| m.is_memory()));
                }
                for target in targets {
                    let avoid: SmallVec<[u32; 2]> = others
                        .iter()
                        .filter(|(_, m)| *m == target)
                        .map(|(r, _)| *r)
                        .collect();
                    if let Some((nseg, off, alen)) =
                        self.alloc_blob(target, size, &avoid, Some(rank))
                    {
                        if self.copy_memory(id, nseg, off, size) {
                            let dst =
                                self.insert_blob(obj, nseg, off, alen, BlobState::Allocated, now);
                            self.make_readable(dst, now);
                            moved = true;
                            break;
                        }
                        self.segs[nseg as usize].as_mut().unwrap().free(off, alen);
                    }
                }
            }
            if !moved && self.objects[obj as usize].blobs.len() <= 1 {
                self.remove_object(obj, now);
                continue;
            }
            self.blobs[id as usize].lease_until_ms = 0;
            self.detach_blob(id, now);
        }
        self.reap_zombies(now);
        if busy || self.blobs.iter().any(|(_, b)| b.seg == seg) {
            return false;
        }
        if let Some(ss) = self.segs.get_mut(seg as usize).and_then(|s| s.as_mut()) {
            ss.release_all();
        }
        true
    }

    /// Forgets an unmounted segment (after every shard evacuated it).
    pub fn forget_segment(&mut self, seg: SegmentId) {
        if let Some(slot) = self.segs.get_mut(seg as usize) {
            *slot = None;
        }
    }

    /// Checks internal consistency (tests).
    pub fn check(&self) {
        let mut readable = 0;
        for (i, o) in self.objects.iter() {
            for &b in &o.blobs {
                assert_eq!(self.blobs[b as usize].obj, i as u32);
            }
            if self.object_readable(i as u32) {
                readable += 1;
            }
            assert_eq!(self.find(&o.key), Some(i as u32));
            if let Some(c) = o.chunk {
                let h = self.hash_chunk(c);
                assert!(self.chunks.iter_hash(h).any(|&id| id == i as u32));
            }
        }
        assert_eq!(self.index.len(), self.objects.len());
        let chunked = self
            .objects
            .iter()
            .filter(|(_, o)| o.chunk.is_some())
            .count();
        assert_eq!(self.chunks.len(), chunked, "chunk index out of step");
        let _ = readable;
        for &o in self.uncommitted.keys() {
            assert!(
                self.objects.contains(o as usize),
                "uncommitted object {o} is gone"
            );
        }
        // A writer's pin is on exactly the blobs of its grant: those of an object still being
        // written, or orphaned ones (detached) waiting for the writer to let go.
        let mut orphans = 0;
        for held in self.orphaned.values() {
            for &b in held {
                let b = &self.blobs[b as usize];
                assert!(
                    b.writing && b.obj == NIL,
                    "orphaned blob not held or attached"
                );
                orphans += 1;
            }
        }
        let mut writing = 0;
        for (i, b) in self.blobs.iter() {
            if b.writing {
                assert!(b.pins >= 1, "blob {i} written without the writer's pin");
                assert!(
                    b.obj == NIL || self.uncommitted.contains_key(&b.obj),
                    "blob {i} held by a writer of a committed object"
                );
                writing += 1;
            }
        }
        let attached_writing = self
            .uncommitted
            .keys()
            .flat_map(|&o| self.objects[o as usize].blobs.iter())
            .filter(|&&b| self.blobs[b as usize].writing)
            .count();
        assert_eq!(
            writing,
            orphans + attached_writing,
            "writer pins out of step"
        );
        // Capacity accounting: a segment's used bytes are exactly its blobs' (live or zombie).
        let mut used = vec![0u64; self.segs.len()];
        for (_, b) in self.blobs.iter() {
            used[b.seg as usize] += b.len;
        }
        for (id, ss) in self.segs.iter().enumerate() {
            match ss {
                Some(ss) => {
                    assert_eq!(ss.used(), used[id], "used bytes of {}", ss.seg.name);
                    ss.check();
                }
                None => assert_eq!(used[id], 0, "blobs on a forgotten segment {id}"),
            }
        }
        for (i, b) in self.blobs.iter() {
            if b.obj == NIL {
                assert!(
                    self.zombies.contains(&(i as u32)),
                    "detached blob {i} is not a zombie"
                );
            }
            assert_eq!(
                b.lru != NIL,
                b.state == BlobState::Readable,
                "blob {i} lru/state mismatch"
            );
        }
    }
}

fn job_size(job: &IoJob) -> u64 {
    match job {
        IoJob::Flush { src_view, .. }
        | IoJob::Rewarm { src_view, .. }
        | IoJob::ReadSsd { src_view, .. } => src_view.len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shards::Reply;
    use segment::SegmentTable;

    fn dram_store(capacity: u64) -> Store {
        let table = Arc::new(SegmentTable::default());
        let seg = mount::build_segment(&table, 0, Medium::Dram, capacity, None, 1, 1 << 20)
            .expect("a DRAM segment");
        table.insert(seg).expect("the only segment");
        let cfg = StoreConfig {
            lease_ms: 2000,
            high_percent: 90,
            low_percent: 80,
            alloc_timeout_ms: 30_000,
        };
        let stats = Arc::new(StoreStats::default());
        Store::new(0, cfg, table, stats, Arc::default(), Instant::now())
    }

    fn put(store: &mut Store, key: &str) {
        let step = store.alloc(key.as_bytes().into(), 100, Some(Medium::Dram), 1, 0);
        let AllocStep::Granted { obj, .. } = step else {
            panic!("alloc refused: {step:?}");
        };
        assert!(matches!(store.commit(obj, true), Reply::Done));
    }

    fn named(store: &Store, name: &str) -> Vec<Vec<u8>> {
        let mut keys: Vec<Vec<u8>> = store
            .objects_named(name.as_bytes())
            .iter()
            .map(|&o| store.objects[o as usize].key.to_vec())
            .collect();
        keys.sort();
        keys
    }

    fn dram_used(s: &Store) -> u64 {
        s.medium_totals(Medium::Dram).1
    }

    /// Puts `k<i>` from `*i` on until the next put (of 100 bytes) goes over the high threshold.
    fn fill_to_high(s: &mut Store, cap: u64, i: &mut usize) {
        while (dram_used(s) + 100) * 100 <= cap * 90 {
            put(s, &format!("k{i}"));
            *i += 1;
        }
    }

    #[test]
    fn watermark_eviction_drains_in_slices() {
        let cap: u64 = 4 << 20;
        let mut s = dram_store(cap);
        let mut i = 0;
        fill_to_high(&mut s, cap, &mut i);
        assert_eq!(
            s.objects.len(),
            i,
            "nothing evicted under the high threshold"
        );
        assert_eq!(s.stats.evict_running.get(), 0);
        // The put that crosses it starts a drain and evicts one slice, the oldest first.
        put(&mut s, &format!("k{i}"));
        i += 1;
        assert_eq!(s.objects.len(), i - EVICT_SLICE_BLOBS);
        assert!(s.find(b"k0").is_none());
        assert!(
            s.find(format!("k{}", EVICT_SLICE_BLOBS).as_bytes())
                .is_some()
        );
        assert!(s.draining[Medium::Dram as usize]);
        assert_eq!(s.stats.evict_running.get(), 1);
        assert!(dram_used(&s) * 100 > cap * 80);
        s.check();
        // Housekeeping ticks finish the drain without any further allocation.
        let mut ticks = 0;
        while s.draining[Medium::Dram as usize] {
            assert!(ticks < 10, "the drain did not end");
            s.tick();
            ticks += 1;
        }
        assert!(ticks >= 2, "one slice per tick, {ticks} ticks");
        assert!(dram_used(&s) * 100 <= cap * 80);
        assert!(
            dram_used(&s) * 100 > cap * 79,
            "evicted past the low threshold"
        );
        assert_eq!(s.stats.evict_running.get(), 0);
        s.check();

        // Allocations during a drain carry it on too, each by one slice.
        fill_to_high(&mut s, cap, &mut i);
        let mut puts = 0;
        loop {
            put(&mut s, &format!("k{i}"));
            i += 1;
            puts += 1;
            if !s.draining[Medium::Dram as usize] {
                break;
            }
            assert!(puts < 10, "the drain did not end");
        }
        assert!(puts >= 2, "{puts} puts");
        assert!(dram_used(&s) * 100 <= cap * 80 + 4096 * 100);
        assert_eq!(s.stats.evict_running.get(), 0);
        assert!(s.find(format!("k{}", i - 1).as_bytes()).is_some());
        s.check();
    }

    fn grant(s: &mut Store, key: &str, size: u64) -> (ObjHandle, Arc<WriterLink>) {
        match s.alloc(key.as_bytes().into(), size, Some(Medium::Dram), 1, 0) {
            AllocStep::Granted { obj, link, .. } => (obj, link),
            step => panic!("alloc refused: {step:?}"),
        }
    }

    #[test]
    fn a_removed_put_keeps_its_blob_until_the_writer_lets_go_then_frees_it() {
        let mut s = dram_store(16 << 20);
        for remove_all in [false, true] {
            let (obj, link) = grant(&mut s, "w", 1 << 20);
            assert_eq!(dram_used(&s), 1 << 20);
            if remove_all {
                assert_eq!(s.remove_all(), 1);
            } else {
                assert!(s.remove(b"w"));
            }
            s.check();
            assert!(link.is_revoked(), "the writer is told to stop");
            // The writer may still be writing: its blob is neither freed nor reusable.
            assert_eq!(dram_used(&s), 1 << 20);
            s.tick();
            assert_eq!(dram_used(&s), 1 << 20);
            let (other, _) = grant(&mut s, "other", 1 << 20);
            assert_eq!(dram_used(&s), 2 << 20, "the new object got other memory");
            assert!(matches!(s.commit(other, true), Reply::Done));
            assert!(s.remove(b"other"));
            // The writer's commit (or abort) ends its grant: now the blob goes.
            assert!(matches!(s.commit(obj, true), Reply::NotFound));
            s.check();
            assert_eq!(dram_used(&s), 0, "remove_all={remove_all}");
            assert!(s.orphaned.is_empty());
        }
    }

    #[test]
    fn reclaim_revokes_an_idle_writer_and_spares_one_making_progress() {
        let mut s = dram_store(16 << 20);
        s.cfg.alloc_timeout_ms = 20;
        let (busy, busy_link) = grant(&mut s, "busy", 8192);
        let (idle, idle_link) = grant(&mut s, "idle", 8192);
        for _ in 0..6 {
            std::thread::sleep(std::time::Duration::from_millis(10));
            busy_link.wrote(100);
            s.tick();
        }
        s.check();
        assert!(!busy_link.is_revoked());
        assert!(idle_link.is_revoked(), "no progress for the timeout");
        assert!(s.find(b"idle").is_none());
        assert_eq!(
            dram_used(&s),
            2 * 8192,
            "the idle writer's blob waits for it"
        );
        // Its abort releases the blob; the busy writer commits as usual.
        assert!(matches!(s.commit(idle, false), Reply::NotFound));
        assert_eq!(dram_used(&s), 8192);
        assert!(matches!(s.commit(busy, true), Reply::Done));
        assert!(s.exists(b"busy").is_some());
        s.check();
    }

    #[test]
    fn chunk_index_finds_every_object_of_a_chunk() {
        let mut s = dram_store(16 << 20);
        for k in ["m@2@0@a1@bf16", "m@2@1@a1@bf16", "m@2@0@b2@bf16", "a1"] {
            put(&mut s, k);
        }
        s.check();
        let a1: Vec<Vec<u8>> = ["a1", "m@2@0@a1@bf16", "m@2@1@a1@bf16"]
            .iter()
            .map(|k| k.as_bytes().to_vec())
            .collect();
        assert_eq!(named(&s, "0xa1"), a1[1..]);
        assert_eq!(
            named(&s, "a1"),
            a1,
            "the chunk's objects and the key itself"
        );
        assert_eq!(named(&s, "b2"), [b"m@2@0@b2@bf16".to_vec()]);
        assert!(s.remove(b"m@2@0@a1@bf16"));
        s.check();
        assert_eq!(named(&s, "0xa1"), [b"m@2@1@a1@bf16".to_vec()]);
        assert!(s.remove(b"m@2@1@a1@bf16"));
        assert!(named(&s, "0xa1").is_empty());
        s.check();
    }
}
