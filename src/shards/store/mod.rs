//! The tiered object store of one shard: objects, their blobs on HBM, DRAM and SSD segments,
//! leases, LRU eviction down the tiers, SSD flush and rewarm.
//!
//! Objects live in a slab indexed by a hash table of their keys; blobs live in a second slab
//! so that pins, leases and asynchronous operations can refer to a blob by a stable handle
//! even after its object is gone. Everything here runs on the owner shard's thread; bytes
//! are touched only through segment [`Backend`](segment::Backend)s. The store never awaits: work that needs I/O
//! (a flush to SSD, a rewarm from SSD, a remote rank's HBM → DRAM demotion) is handed to the
//! shard as a job and finished by `finish_flush` / `finish_rewarm` / `finish_demote`.
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
//!
//! # A blob's life (`lifecycle.rs`)
//!
//! ```text
//!  alloc / start_rewarm / evict_blob (to SSD, or to a remote rank's DRAM)
//!        │  ALLOCATED, attached, pinned by its writer or job
//!        ├── commit(ok) / finish_rewarm(Done) / finish_flush(ok) ──▶ READABLE, in the LRU
//!        │   / finish_demote(ok)
//!        │                                                             │
//!        └── abort / I/O failure / object removed ──┐                  │ remove, evict,
//!                                                   ▼                  │ evacuate, damage
//!                            REMOVING, detached (obj = NIL) ◀──────────┘
//!                                 │ no pins, lease over, no flush in flight
//!                                 ▼
//!                            freed (free_blob): range back to its segment
//! ```
//!
//! A detached blob still held (pins, lease, a flush reading it, a writer's grant) is a
//! *zombie*, freed by `reap_zombies` (the tick) or by the release that ends the last hold.
//! Nothing forces a pin or lease away: eviction (`is_evictable`), `evict_named` and unmount's
//! evacuation skip or wait for held blobs.
//!
//! An object is live (in the key index) until removed; a `remove_all` drops the index whole
//! and leaves its objects *doomed* (invisible, out of every statistic but capacity) until
//! `continue_purge` frees them in slices (`index.rs`).
//!
//! # Files
//!
//! `index.rs` keys and lookups, listing, remove and remove_all; `lifecycle.rs` the blob states
//! above, zombies, writer pins, the tick; `put.rs` alloc and commit; `get.rs` reads;
//! `evict.rs` watermark and forced eviction, `/memory/evict`; `tiering.rs` SSD flush, rewarm,
//! prefetch; `recover.rs` the SSD journal's records and the blobs a start recovered; `evacuate.rs` unmount; `rereplicate.rs` new copies for objects below their
//! replica count; `check.rs` the invariants; `sim.rs` the seeded simulation; `testing.rs`
//! the store builder of the tests and the simulation.

mod adopt;
pub mod alloc;
mod announce;
pub use crate::cluster::catalog;
mod check;
mod evacuate;
mod evict;
mod get;
mod index;
pub mod keys;
mod lifecycle;
pub mod lru;
pub mod mount;
mod put;
pub use put::Placement;
mod recover;
pub use recover::{Indexed, ToVerify};
pub mod relocate;
pub mod remote;
mod rereplicate;
pub mod tombstones;
pub use keys::KeyFormat;
pub use rereplicate::RereplicateLimits;
pub mod segment;
#[cfg(test)]
pub(crate) mod sim;
pub mod ssd;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_leases;
#[cfg(test)]
mod tests_mover;
#[cfg(test)]
mod tests_placement;
mod tiering;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use hashbrown::HashTable;
use slab::Slab;
use smallvec::SmallVec;

use crate::common::clock::Clock;
use crate::common::error_kind::{ErrorKind, Refusal};
use crate::common::event::Event;
use crate::metrics::store::{Op, Outcome, StoreStats};
use crate::metrics::trace::{Tp, Tracer};
use lru::{Lru, NIL};
use segment::{Medium, SegmentId, SegmentTable, SegmentView, ShardSegment};

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
    pub seg: Arc<segment::SegRef>,
    pub offset: u64,
    /// The object's size (the blob may be larger: allocations are page-rounded).
    pub len: u64,
    pub handle: BlobHandle,
    /// An SSD blob's checksum (0 for memory blobs and blobs still being written): what a
    /// remote rank's local service checks the bytes it reads against.
    pub sum: u64,
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
    /// The object's version across leaders (the catalog hand-over's conflict order): the
    /// leadership that created it and its generation there. For an object created here,
    /// `(view, generation)`; for an adopted one, what its local service's catalog said.
    stamp: crate::cluster::catalog::Stamp,
    /// The copies on distinct ranks the object should have (its put's `replicas`): one left
    /// below it by a lost copy is re-replicated (`rereplicate.rs`).
    replicas: u8,
    /// An entry of the re-replication queue names this object (no second one is added).
    queued: bool,
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
    /// A tier move out of this blob is in flight: a flush to SSD, or (a remote rank's HBM
    /// blob) its demotion to the rank's DRAM. It stays readable, is not evicted again, and is
    /// not freed before the move ends.
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
    /// Recovered at the start from a journaled SSD file and not read back yet (`recover.rs`):
    /// a damaged copy found now is a loss of the recovery.
    unverified: bool,
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

    pub fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
    }
}

/// An object whose writer has not committed yet.
struct Uncommitted {
    link: Arc<WriterLink>,
    /// `written_bytes` when the tick last looked, and when it last changed (`now_ms`).
    seen_bytes: u64,
    progress_ms: u64,
    /// When the writers are local services (a blob is on a remote rank): the time until which
    /// they may still write (`StoreConfig::remote_writer_ms` after the allocation). They write
    /// under grants that no revocation here reaches and whose end may never be reported (a
    /// client that never sends its body, a local service that dies), so blobs orphaned by a
    /// removal or reclaim are freed at this time, by the tick, unless a commit or abort
    /// releases them first. `None`: a writer in this process.
    remote_until_ms: Option<u64>,
}

/// Blobs of an object removed (or reclaimed) while its writer was still at work.
struct Orphan {
    blobs: SmallVec<[u32; 2]>,
    /// A remote writer's `Uncommitted::remote_until_ms`: the tick frees them then.
    until_ms: Option<u64>,
    /// The freed records of its blobs on remote ranks, noted when it was removed and noted
    /// again when the writers let go: a write under its grant that reached a local service
    /// after the first record (the removal raced the chain) would otherwise stay in that
    /// service's catalog.
    freed: SmallVec<[crate::cluster::catalog::Noted; 2]>,
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
    /// Copy a remote rank's HBM blob into a DRAM blob (ALLOCATED) of the same rank, by that
    /// rank's local service, and swap them (an eviction's demotion). `drop_on_failure`: the
    /// eviction was for an allocation that needs the room, so a failed copy drops the HBM
    /// blob (as eviction with nowhere to go does) instead of keeping it.
    Demote {
        src: BlobHandle,
        dst: BlobHandle,
        src_view: BlobView,
        dst_view: BlobView,
        drop_on_failure: bool,
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
    Refused(Refusal),
    /// No room now, but flushes in flight will free some: wait for one and try again.
    WaitForFlush,
    /// No room now, but this shard's zombies on the medium hold at least as much and give it
    /// back by themselves: try again in `in_ms` (when the first of their leases ends) rather
    /// than evicting readable objects for it. Only [`Store::alloc`] answers it; a caller that
    /// waited long enough (a lease) asks [`Store::alloc_now`], which evicts.
    WaitForRoom {
        in_ms: u64,
    },
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
    Failed(Refusal),
}

#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Keep tombstones of removed keys for catalog hand-overs (a meta service: `tombstones.rs`).
    pub keep_tombstones: bool,
    pub lease_ms: u64,
    pub high_percent: u64,
    pub low_percent: u64,
    /// An allocation whose writer neither committed nor made progress for this long is
    /// reclaimed: the grant is revoked, the blobs freed once the writer lets go.
    pub alloc_timeout_ms: u64,
    /// How long after its allocation a remote put's writers may still write its blobs
    /// (`Config::remote_writer_ms`): its blobs, removed or reclaimed before the commit, are
    /// freed no sooner.
    pub remote_writer_ms: u64,
    /// What bounds re-replication on this shard (the default: none is done).
    pub rereplicate: RereplicateLimits,
    /// How an object key's chunk hash is read (`ock.mmc.kv_events.key_format`).
    pub key_format: Arc<KeyFormat>,
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

/// Objects a `remove_all` frees in one slice (in the call itself, then per `continue_purge`).
/// About 0.1-0.3 ms of work in a release build, so no request waits long behind a slice.
pub const PURGE_SLICE_OBJECTS: usize = 1024;

/// Vacant or newer slots a purge slice may step over, besides the objects it frees.
const PURGE_SLICE_SKIPS: usize = 16 * PURGE_SLICE_OBJECTS;

/// A `remove_all` under way. Every object whose generation is at most `cut` left the key
/// index at once (the index was dropped whole); such a *doomed* object is invisible to every
/// lookup, its blobs count in no statistic but capacity, and it is freed in slices that walk
/// the object slab from `cursor` on. `left` counts the doomed objects still held.
struct Purge {
    cut: u64,
    cursor: u32,
    left: usize,
}

pub struct Store {
    shard: usize,
    cfg: StoreConfig,
    table: Arc<SegmentTable>,
    /// This shard's cached copy of the segment table (refreshed on a mount/unmount epoch).
    view: SegmentView,
    segs: Vec<Option<ShardSegment>>,
    objects: Slab<Object>,
    /// Live objects by key (doomed ones, those of a `remove_all` still being freed, are not).
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
    /// are freed then (a remote writer's also at its deadline). Bounded by the grants
    /// outstanding.
    orphaned: HashMap<u64, Orphan, foldhash::fast::RandomState>,
    lru: Lru,
    next_tag: u64,
    zombies: Vec<u32>,
    jobs: Vec<IoJob>,
    events: Vec<Event>,
    flushes_in_flight: usize,
    /// HBM → DRAM demotions in flight ([`IoJob::Demote`]): a remote rank's, copied by its
    /// local service, or a drain's here, copied by the mover thread (`shards/mover.rs`).
    demotes_in_flight: usize,
    /// Whether a drain's demotion between host memories goes to the mover thread as a job
    /// (the shards, and the simulation) or is copied at once (`false`: tests that look at
    /// where a blob is as soon as it was evicted).
    move_off_shard: bool,
    /// Live objects with a readable copy: this shard's share of `stored_keys`.
    readable_objects: u64,
    /// A `remove_all` whose objects are still being freed.
    purge: Option<Purge>,
    /// Media whose watermark eviction is under way: set when an allocation takes the medium
    /// above the high threshold, cleared when this shard's share is back under the low one.
    draining: [bool; Medium::ALL.len()],
    /// Per medium, for the watermark check: (the millisecond it was read, capacity, live bytes
    /// the *other* shards use: used less their zombies'). Re-read at most once per
    /// millisecond: reading the other shards' counters on every put would pull their cache
    /// lines (written on each of their puts) across cores each time. This shard's own use is
    /// always exact.
    others_used: [Option<(u64, u64, u64)>; Medium::ALL.len()],
    stats: Arc<StoreStats>,
    tracer: Arc<Tracer>,
    clock: StoreClock,
    /// The `view_version` of the leadership new objects are stamped with (0 without HA).
    stamp_view: u64,
    /// Blobs on remote ranks detached since the shard last collected them (for the ranks'
    /// freed logs: their local services drop them from their catalogs).
    freed_remote: Vec<crate::cluster::catalog::Noted>,
    /// The freed records of detached remote blobs that a write may still reach (allocated and
    /// pinned: a move's, a copy's destination), noted again when the blob is freed: a write
    /// that reached its local service after the first record would otherwise stay listed in
    /// that service's catalog (as `Orphan::freed` does for a put's writers).
    renote: std::collections::HashMap<u32, crate::cluster::catalog::Noted>,
    /// Keys removed from the index, refused when a catalog hands them over (`tombstones.rs`).
    tombstones: tombstones::Tombstones,
    /// A removal that is no client's or eviction's (adoption replacing an older version of a
    /// key by a newer one, a lost rank's copies dropped): no tombstone.
    quiet_removal: bool,
    /// Objects below their replica count waiting for a new copy, and the copies being made.
    rerepl: rereplicate::Rereplication,
    /// Journal records emitted and not yet handed to the journals' queue, in order
    /// (`recover.rs`), and this shard's number of the last one emitted.
    journal_out: std::collections::VecDeque<ssd::journaling::Item>,
    journal_seq: u64,
    /// The process's journals, once this shard emitted a record.
    journals: Option<Arc<ssd::journaling::Journals>>,
    /// Recovered blobs still to read back once (`recover.rs`).
    verify: std::collections::VecDeque<BlobHandle>,
}

/// The store's time in ms: the process [`Clock`], or one a simulation sets (the seam that
/// lets a seeded test jump time and replay a run exactly).
#[derive(Clone, Copy, Debug)]
enum StoreClock {
    Real(Clock),
    Manual(u64),
}

impl Store {
    pub fn new(
        shard: usize,
        cfg: StoreConfig,
        table: Arc<SegmentTable>,
        stats: Arc<StoreStats>,
        tracer: Arc<Tracer>,
        clock: Clock,
    ) -> Store {
        let keep_tombstones = cfg.keep_tombstones;
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
            // Generations unique in the process (the catalog tells objects apart by them).
            next_tag: 1 + ((shard as u64) << 48),
            zombies: Vec::new(),
            jobs: Vec::new(),
            events: Vec::new(),
            flushes_in_flight: 0,
            demotes_in_flight: 0,
            move_off_shard: false,
            readable_objects: 0,
            purge: None,
            draining: [false; Medium::ALL.len()],
            others_used: [None; Medium::ALL.len()],
            stats,
            tracer,
            clock: StoreClock::Real(clock),
            stamp_view: 0,
            freed_remote: Vec::new(),
            renote: Default::default(),
            tombstones: tombstones::Tombstones::new(
                keep_tombstones,
                tombstones::TOMBSTONES_PER_SHARD,
            ),
            quiet_removal: false,
            rerepl: Default::default(),
            journal_out: Default::default(),
            journal_seq: 0,
            journals: None,
            verify: Default::default(),
        };
        s.refresh_segments();
        s
    }

    pub fn now_ms(&self) -> u64 {
        match self.clock {
            StoreClock::Real(clock) => clock.now_ms(),
            StoreClock::Manual(ms) => ms,
        }
    }

    /// Stops the store's clock at `ms`; from now on only [`Store::advance_clock`] moves it
    /// (deterministic simulation and tests).
    pub fn set_manual_clock(&mut self, ms: u64) {
        self.clock = StoreClock::Manual(ms);
    }

    /// Moves a manual clock forward by `ms` (no effect on the real one).
    pub fn advance_clock(&mut self, ms: u64) {
        if let StoreClock::Manual(t) = &mut self.clock {
            *t += ms;
        }
    }

    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    /// Hands a drain's demotions between host memories to the mover thread as jobs
    /// ([`IoJob::Demote`], finished by `finish_demote`) instead of copying them at once.
    pub fn set_move_off_shard(&mut self, on: bool) {
        self.move_off_shard = on;
    }

    /// Objects this shard holds (readable or being written; not those of a `remove_all`
    /// still being freed).
    pub fn object_count(&self) -> usize {
        self.objects.len() - self.purge.as_ref().map_or(0, |p| p.left)
    }

    /// Whether operations left anything for the shard to hand on (I/O jobs, journal records,
    /// freed records of remote blobs, events): most reads leave nothing, and the shard then
    /// skips its hand-over after them.
    pub fn has_output(&self) -> bool {
        !self.jobs.is_empty()
            || !self.events.is_empty()
            || self.has_journal_out()
            || self.has_freed_remote()
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
    /// The mounted segment of `rank` and `medium`, from the cached view (refreshed first).
    pub fn mounted(&mut self, rank: u32, medium: Medium) -> Option<Arc<segment::SegRef>> {
        self.refresh_segments();
        let id = self
            .view
            .segments()
            .iter()
            .find(|s| s.rank == rank && s.medium == medium)?
            .id;
        self.segs
            .get(id as usize)?
            .as_ref()
            .map(|s| s.local.clone())
    }

    fn refresh_segments(&mut self) {
        if !self.view.refresh(&self.table) {
            return;
        }
        self.others_used = [None; Medium::ALL.len()];
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
}
