//! Eviction: watermark drains in slices, forced eviction for an allocation, moving a
//! blob down a tier, and `/memory/evict`.

use super::*;

impl Store {
    /// A blob eviction may take: readable, not held by a reader, a move or a rewarm, and not
    /// on a segment being drained (a leaving rank's blobs are the drain's to move; evicting
    /// them would move them down into the same leaving rank, or delete them).
    pub(super) fn is_evictable(&self, b: &BlobRec, now: u64) -> bool {
        b.state == BlobState::Readable
            && b.pins == 0
            && b.lease_until_ms <= now
            && !b.flushing
            && !self.objects[b.obj as usize].rewarming
            && !self.leaving(b.seg)
    }

    /// Watermark eviction before an allocation of `need` bytes on `medium`. Going above the
    /// high threshold starts a drain: until this shard's share of the excess over the low
    /// threshold is gone, each allocation on the medium (and each housekeeping tick) evicts
    /// one slice of least recently used blobs, so the drain is spread over the requests
    /// instead of stalling one of them. The thresholds apply to the *live* bytes: zombies
    /// (removed blobs whose leases, pins, flushes or writers have not ended) give their room
    /// back by themselves within a lease, and evicting readable objects cannot free them
    /// sooner. Counted, a churning workload's leased deletes kept the medium over the low
    /// threshold whatever was evicted, and every readable object went.
    pub(super) fn evict_for(&mut self, medium: Medium, need: u64, now: u64) {
        let (cap, used) = self.watermark_totals(medium, now);
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
        let mine = self.my_live(medium);
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
        let (freed, evicted) = self.evict_lru(medium, now, false, |freed, n| {
            freed >= target
                || (freed >= 2 * need && (n >= EVICT_SLICE_BLOBS || freed >= EVICT_SLICE_BYTES))
        });
        // Done, or stuck behind leased and pinned blobs (the next allocation above the high
        // threshold starts again).
        self.set_draining(medium, freed < target && evicted > 0);
        span.end(freed >= target || evicted > 0);
    }

    pub(super) fn set_draining(&mut self, medium: Medium, on: bool) {
        self.draining[medium as usize] = on;
        self.stats
            .evict_running
            .set(self.draining.iter().any(|&d| d) as i64);
    }

    /// Continues the drains under way by one slice each (from the housekeeping tick, so that a
    /// drain ends even when allocations stop).
    pub(super) fn continue_drains(&mut self, now: u64) {
        for medium in Medium::ALL {
            if self.draining[medium as usize] {
                self.evict_for(medium, 0, now);
            }
        }
    }

    /// Eviction when an allocation found no room: evicts least recently used blobs of the
    /// medium one by one until `need` bytes could fit. True when something was evicted.
    pub(super) fn evict_forced(&mut self, medium: Medium, need: u64, now: u64) -> bool {
        self.evict_lru(medium, now, true, |freed, _| freed >= need.max(1))
            .1
            > 0
    }

    /// Evicts the medium's least recently used evictable blobs until `done(freed bytes,
    /// blobs evicted)`, looking at no more than [`EVICT_SCAN_LIMIT`] blobs it must skip.
    /// `forced`: an allocation needs the room (see [`Store::evict_blob`]). Returns the bytes
    /// freed and the blobs evicted.
    pub(super) fn evict_lru(
        &mut self,
        medium: Medium,
        now: u64,
        forced: bool,
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
                freed += self.evict_blob(v, now, forced);
                evicted += 1;
            }
        }
        (freed, evicted)
    }

    /// Moves one blob down a tier (or drops it where nothing lower has room). Returns the
    /// bytes this frees on its medium now or when its flush (or remote demotion) lands.
    /// `forced`: an allocation needs the room, so a remote demotion that fails drops the
    /// copy instead of keeping it.
    pub(super) fn evict_blob(&mut self, id: u32, now: u64, forced: bool) -> u64 {
        let (obj, len) = {
            let b = &self.blobs[id as usize];
            (b.obj, b.len)
        };
        if self.doomed(obj) {
            // Removed already by a `remove_all`: freeing it is all that is left to do.
            self.remove_object(obj, now);
            return len;
        }
        self.record_eviction(id, now);
        if !self.demote(id, now, forced, false) {
            self.drop_evicted(id, now);
        }
        len
    }

    /// `/memory/evict` with `locations`: moves one blob exactly one tier down (on a remote
    /// rank, to the same rank's tier below), counted as an eviction; an object with no tier
    /// below, or none with room, stays where it is (false). Never deletes: only an evict
    /// without `locations` does.
    fn move_down_named(&mut self, id: u32, now: u64) -> bool {
        if self.doomed(self.blobs[id as usize].obj) {
            // A `remove_all` purge frees it: nothing to move.
            return false;
        }
        let (rank, evicted) = self.eviction_of(id, now);
        if !self.demote(id, now, false, true) {
            return false;
        }
        self.stats.tier(rank, |t| t.evict.inc());
        self.events.push(evicted);
        true
    }

    /// Drops an evicted copy nothing lower had room for, and its object with it if it was
    /// the last copy.
    pub(super) fn drop_evicted(&mut self, id: u32, now: u64) {
        let obj = self.blobs[id as usize].obj;
        if self.objects[obj as usize].blobs.len() <= 1 {
            self.stats.evicted_objects_deleted.inc();
            self.remove_object(obj, now);
        } else {
            self.detach_blob(id, now);
        }
    }

    /// Counts an eviction and publishes it (with the object's lifetime and the blob's idle
    /// time).
    fn record_eviction(&mut self, id: u32, now: u64) {
        let (rank, evicted) = self.eviction_of(id, now);
        self.stats.tier(rank, |t| t.evict.inc());
        self.events.push(evicted);
    }

    /// The rank an eviction of blob `id` counts on, and its event.
    fn eviction_of(&self, id: u32, now: u64) -> (u32, Event) {
        let b = &self.blobs[id as usize];
        let idle_ms = now.saturating_sub(b.since_ms.max(b.lease_until_ms.min(now)));
        let o = &self.objects[b.obj as usize];
        let evicted = Event::Evicted {
            medium: b.medium,
            bytes: o.size,
            lifetime_ms: now.saturating_sub(o.created_ms),
            idle_ms,
        };
        (b.rank, evicted)
    }

    /// Moves an evicted blob down the tiers: the first one below with room takes it (a copy
    /// that already exists lower down, as after a rewarm, makes the move free). A memory
    /// tier takes a copy now when the eviction is forced or named, else (a drain's) through
    /// a demotion job the mover thread copies; SSD takes it through a flush job; the blob
    /// leaves when the job lands. `one_tier`: only the tier just below is tried. False when
    /// no tier below (tried) has room.
    fn demote(&mut self, id: u32, now: u64, forced: bool, one_tier: bool) -> bool {
        if self.is_remote_blob(id) {
            return self.demote_remote(id, now, forced);
        }
        let (obj, medium, rank) = {
            let b = &self.blobs[id as usize];
            (b.obj, b.medium, b.rank)
        };
        let size = self.objects[obj as usize].size;
        let mut tier = medium.lower_tier();
        while let Some(t) = tier {
            if self.has_lasting_copy_on(obj, t) {
                self.detach_blob(id, now);
                return true;
            }
            if let Some((seg, off, alen)) = self.alloc_demoted(t, size, rank, now) {
                if !t.is_memory() {
                    self.start_move(id, seg, off, alen, false, now);
                    return true;
                }
                // A drain's move between host memories is copied by the mover thread (the
                // blob leaves when it lands); a forced one (an allocation needs the room now)
                // or a named one (`/memory/evict` says where it is after) copies here.
                if !forced && !one_tier && self.moves_off_shard(id, seg) {
                    self.start_move(id, seg, off, alen, false, now);
                    return true;
                }
                if self.copy_memory(id, seg, off, size) {
                    let dst = self.insert_blob(obj, seg, off, alen, BlobState::Allocated, now);
                    self.make_readable(dst, now);
                    self.stats.demoted_blobs.inc();
                    self.detach_blob(id, now);
                    return true;
                }
                self.segs[seg as usize].as_mut().unwrap().free(off, alen);
            }
            tier = if one_tier { None } else { t.lower_tier() };
        }
        false
    }

    /// Moves a remote rank's evicted blob one tier down on the same rank, its local service
    /// copying between its own segments (the bytes cannot be copied here): a DRAM blob to the
    /// rank's SSD through a flush job, an HBM blob to the rank's DRAM through a demotion job.
    /// The blob stays readable where it is until its copy lands. False when that tier of the
    /// rank has no room (after eviction there).
    fn demote_remote(&mut self, id: u32, now: u64, forced: bool) -> bool {
        let (obj, medium, rank) = {
            let b = &self.blobs[id as usize];
            (b.obj, b.medium, b.rank)
        };
        let Some(t) = medium.lower_tier() else {
            return false;
        };
        if self.has_lasting_copy_on(obj, t) {
            self.detach_blob(id, now);
            return true;
        }
        let size = self.objects[obj as usize].size;
        let Some((seg, off, alen)) = self.alloc_demoted_remote(t, size, rank, now) else {
            return false;
        };
        self.start_move(id, seg, off, alen, forced, now);
        true
    }

    /// Starts the move of blob `id` into the range just allocated for it a tier down: the new
    /// blob is pinned by the job and the source marked `flushing` (kept, readable) until the
    /// job ends. Into SSD it is a flush (`finish_flush`, counted in the flush figures); into
    /// DRAM (a remote rank's HBM blob) a demotion (`finish_demote`), which none of the SSD
    /// tier's counters or events count, as an HBM → DRAM copy here counts none. `forced`: see
    /// [`IoJob::Demote`].
    fn start_move(&mut self, id: u32, seg: SegmentId, off: u64, alen: u64, forced: bool, now: u64) {
        let obj = self.blobs[id as usize].obj;
        let size = self.objects[obj as usize].size;
        let dst = self.insert_blob(obj, seg, off, alen, BlobState::Allocated, now);
        self.blobs[dst as usize].pins = 1;
        self.blobs[id as usize].flushing = true;
        let (src, src_view) = (self.handle(id), self.view(id, size));
        let (dst, dst_view) = (self.handle(dst), self.view(dst, size));
        if dst_view.seg.medium == Medium::Ssd {
            self.flushes_in_flight += 1;
            self.stats.flush_in_flight_bytes.add(size as i64);
            self.events.push(Event::FlushStarted { bytes: size });
            self.jobs.push(IoJob::Flush {
                src,
                dst,
                src_view,
                dst_view,
            });
        } else {
            self.demotes_in_flight += 1;
            self.jobs.push(IoJob::Demote {
                src,
                dst,
                src_view,
                dst_view,
                drop_on_failure: forced,
            });
        }
    }

    /// Room on the tier below for a demoted blob: watermark eviction there first (SSD
    /// eviction deletes), then the allocation, then forced eviction there.
    pub(super) fn alloc_demoted(
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

    /// Room on a remote rank's own tier `medium` for its demoted blob: watermark eviction of
    /// that tier, the allocation, then (SSD only: SSD eviction deletes) forced eviction.
    fn alloc_demoted_remote(
        &mut self,
        medium: Medium,
        size: u64,
        rank: u32,
        now: u64,
    ) -> Option<(SegmentId, u64, u64)> {
        let on_rank = self
            .segs
            .iter()
            .flatten()
            .any(|s| s.seg.medium == medium && s.seg.rank == rank && s.seg.is_allocatable());
        if !on_rank {
            return None;
        }
        self.evict_for(medium, size, now);
        if let Some(p) = self.alloc_on_rank(medium, size, rank) {
            return Some(p);
        }
        if medium == Medium::Ssd && self.evict_forced(medium, size, now) {
            return self.alloc_on_rank(medium, size, rank);
        }
        None
    }

    /// Whether moving blob `id` into segment `dst` can be left to the mover thread: the store
    /// hands such moves off ([`Store::set_move_off_shard`]; off in tests that expect a
    /// demotion done when the eviction returns), and both are memory this process addresses
    /// (host memory, or an emulated device's host mapping), which the mover copies between.
    fn moves_off_shard(&self, id: u32, dst: SegmentId) -> bool {
        self.move_off_shard
            && self
                .seg(self.blobs[id as usize].seg)
                .seg
                .backend
                .addressable()
                .is_some()
            && self.seg(dst).seg.backend.addressable().is_some()
    }

    /// Copies a memory blob's bytes into another memory segment (HBM → DRAM).
    pub(super) fn copy_memory(
        &self,
        src: u32,
        dst_seg: SegmentId,
        dst_off: u64,
        size: u64,
    ) -> bool {
        let b = &self.blobs[src as usize];
        let from = &self.seg(b.seg).seg.backend;
        let to = &self.seg(dst_seg).seg.backend;
        // SAFETY: the destination range was just allocated for this copy; the source blob is
        // readable and nobody writes it.
        let res = unsafe { from.copy_to(b.offset, to, dst_off, size as usize) };
        if let Err(e) = &res {
            log::error!(
                "moving a blob from {} down a tier failed: {e}",
                self.seg(b.seg).seg.name
            );
        }
        res.is_ok()
    }

    /// Evicts the named objects: everywhere (`locations` None) or one tier down from each
    /// named medium (never deleted: a copy with no tier below, or no room there, stays).
    /// Returns the tier removals (an object leaving one medium counts one). Leased or pinned
    /// copies are left alone.
    pub fn evict_named(&mut self, name: &[u8], locations: Option<&[Medium]>) -> u64 {
        let now = self.now_ms();
        let mut removals = 0;
        for obj in self.objects_named(name) {
            if !self.objects.contains(obj as usize) {
                continue;
            }
            match locations {
                None => removals += self.evict_everywhere(obj, now),
                Some(media) => {
                    for &m in media {
                        let blob = self.objects[obj as usize].blobs.iter().copied().find(|&b| {
                            let rec = &self.blobs[b as usize];
                            rec.medium == m && self.is_evictable(rec, now)
                        });
                        if let Some(b) = blob
                            && self.move_down_named(b, now)
                        {
                            removals += 1;
                        }
                    }
                }
            }
        }
        removals
    }

    /// Evicts an object from every tier where no copy is leased or pinned (a tier with a
    /// leased or pinned copy keeps the object there); the object goes when no readable copy
    /// is left. One eviction counted per tier left, on the rank of that tier's first copy.
    /// An object still being written is left alone (its writer holds its blobs).
    pub(super) fn evict_everywhere(&mut self, obj: u32, now: u64) -> u64 {
        if self.uncommitted.contains_key(&obj) {
            return 0;
        }
        let mut removals = 0;
        for m in Medium::ALL {
            let copies: SmallVec<[u32; 2]> = self.objects[obj as usize]
                .blobs
                .iter()
                .copied()
                .filter(|&b| {
                    let r = &self.blobs[b as usize];
                    r.medium == m && r.state == BlobState::Readable
                })
                .collect();
            let held = copies
                .iter()
                .any(|&b| !self.is_evictable(&self.blobs[b as usize], now));
            if copies.is_empty() || held {
                continue;
            }
            let rank = self.blobs[copies[0] as usize].rank;
            self.stats.tier(rank, |t| t.evict.inc());
            removals += 1;
            for b in copies {
                self.detach_blob(b, now);
            }
        }
        if removals > 0 && !self.object_readable(obj) {
            self.remove_object(obj, now);
        }
        removals
    }
}
