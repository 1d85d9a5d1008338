//! The blob lifecycle (see the state machine in `mod.rs`): creating, attaching,
//! making readable, detaching, freeing; zombies, writer pins, and the housekeeping tick.

use super::*;

impl Store {
    pub(super) fn new_tag(&mut self) -> u64 {
        self.next_tag += 1;
        self.next_tag
    }

    pub(super) fn seg(&self, id: SegmentId) -> &ShardSegment {
        self.segs[id as usize]
            .as_ref()
            .expect("blob on an unknown segment")
    }

    pub(super) fn view(&self, blob: u32, len: u64) -> BlobView {
        let b = &self.blobs[blob as usize];
        BlobView {
            seg: self.seg(b.seg).local.clone(),
            offset: b.offset,
            len,
            handle: self.handle(blob),
            sum: b.sum,
        }
    }

    /// The stable handle of the blob in slot `blob` now.
    pub(super) fn handle(&self, blob: u32) -> BlobHandle {
        BlobHandle {
            id: blob,
            tag: self.blobs[blob as usize].tag,
        }
    }

    pub(super) fn blob_by_handle(&self, h: BlobHandle) -> Option<&BlobRec> {
        self.blobs.get(h.id as usize).filter(|b| b.tag == h.tag)
    }

    pub(super) fn object_readable(&self, obj: u32) -> bool {
        self.objects[obj as usize]
            .blobs
            .iter()
            .any(|&b| self.blobs[b as usize].state == BlobState::Readable)
    }

    pub(super) fn has_readable_on(&self, obj: u32, medium: Medium) -> bool {
        self.objects[obj as usize].blobs.iter().any(|&b| {
            self.blobs[b as usize].state == BlobState::Readable
                && self.blobs[b as usize].medium == medium
        })
    }

    /// Whether the object has a readable copy on `medium` that stays: one on a segment being
    /// drained does not count (the drain is moving the object off it), so eviction moves a
    /// copy down instead of dropping it in favour of a copy that is leaving.
    pub(super) fn has_lasting_copy_on(&self, obj: u32, medium: Medium) -> bool {
        self.objects[obj as usize].blobs.iter().any(|&b| {
            let b = &self.blobs[b as usize];
            b.state == BlobState::Readable && b.medium == medium && !self.leaving(b.seg)
        })
    }

    /// Whether a segment is being drained (its rank leaves gracefully).
    pub(super) fn leaving(&self, seg: SegmentId) -> bool {
        self.segs
            .get(seg as usize)
            .and_then(|s| s.as_ref())
            .is_some_and(|s| s.seg.status() == segment::SegmentStatus::GracefullyUnmounting)
    }

    pub(super) fn insert_blob(
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
            unverified: false,
        }) as u32;
        self.objects[obj as usize].blobs.push(id);
        id
    }

    /// Frees a blob's range and slot. The blob must be detached or about to be.
    pub(super) fn free_blob(&mut self, id: u32) {
        let b = self.blobs.remove(id as usize);
        debug_assert!(b.lru == NIL && b.pins == 0 && !b.writing);
        if let Some(n) = self.renote.remove(&id) {
            self.freed_remote.push(n);
        }
        if b.rewarmed_bytes > 0 {
            let bytes = b.rewarmed_bytes as i64;
            self.stats
                .tier(b.rank, |t| t.rewarm_bytes_current.add(-bytes));
        }
        // Eviction keeps a full segment between the watermarks, each drain taking it down to
        // the low one (and a drain's demotions freeing their sources when they land, a little
        // later): what is freed down to one drain's width below the low watermark is allocated
        // again soon, so emptied runs keep their pages there (at steady state, 1 MiB puts into
        // a full default configuration 15 % faster, their p90 halved: perf/RESULTS.md
        // session 15). Below that they go back to the kernel.
        let (low, high) = (self.cfg.low_percent, self.cfg.high_percent);
        let keep_from = low.saturating_sub(high.saturating_sub(low));
        if let Some(Some(ss)) = self.segs.get_mut(b.seg as usize) {
            let keep = ss.seg.used_bytes() as u128 * 100
                >= ss.seg.capacity as u128 * u128::from(keep_from);
            ss.free_keeping(b.offset, b.len, keep);
        }
    }

    /// Takes a blob out of its object (and the LRU): freed now if nobody holds it, else kept
    /// as a zombie until its lease and pins end.
    pub(super) fn detach_blob(&mut self, id: u32, now: u64) {
        let (obj, lru, medium) = {
            let b = &self.blobs[id as usize];
            (b.obj, b.lru, b.medium)
        };
        if obj != NIL {
            self.note_freed_remote(id, obj);
            self.journal_remove(id, obj);
        }
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
        }
        // A doomed object left the statistics with its `remove_all`, which publishes one
        // `Cleared` for all of them.
        if obj != NIL && !self.doomed(obj) {
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
                self.readable_objects -= 1;
            }
        }
        let b = &self.blobs[id as usize];
        if b.pins == 0 && b.lease_until_ms <= now && !b.flushing {
            self.free_blob(id);
        } else {
            self.count_zombie(id, true);
            self.zombies.push(id);
        }
    }

    /// Counts blob `id` into (`held`) or out of its segment's zombie bytes.
    fn count_zombie(&mut self, id: u32, held: bool) {
        let b = &self.blobs[id as usize];
        let (seg, len) = (b.seg, b.len);
        if let Some(Some(ss)) = self.segs.get_mut(seg as usize) {
            ss.count_zombie(len, held);
        }
    }

    /// Frees zombie `id`, whose last hold just ended.
    fn free_zombie(&mut self, id: u32) {
        if let Some(i) = self.zombies.iter().position(|&z| z == id) {
            self.zombies.swap_remove(i);
            self.count_zombie(id, false);
        }
        self.free_blob(id);
    }

    /// Removes an object and all its blobs. A writer still at work is revoked; the blobs it
    /// holds stay allocated (orphaned) until its grant ends: for a writer here, when its
    /// commit or abort comes; for remote writers (local services, which no revocation
    /// reaches), at the latest when their grants can no longer write
    /// (`Uncommitted::remote_until_ms`), so a range is never given to another object while a
    /// write grant for it may still be used, and never leaks when no commit comes.
    pub(super) fn remove_object(&mut self, obj: u32, now: u64) {
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
                let freed = held
                    .iter()
                    .filter_map(|&b| self.remote_record(b, obj, false))
                    .collect();
                let orphan = Orphan {
                    blobs: held,
                    until_ms: w.remote_until_ms,
                    freed,
                };
                self.orphaned.insert(generation, orphan);
            }
        }
        // A destination still being copied into (a move's, a copy's: pinned, not a put's
        // writer) may be written after its freed record reached its service: the record goes
        // again when the blob is freed. Only for an object removed whole: a failed copy of a
        // live object is tried again with the same stamp, maybe at the same range, which a
        // late record would drop.
        for &b in &blobs {
            let blob = &self.blobs[b as usize];
            if blob.pins > 0
                && blob.state == BlobState::Allocated
                && !blob.writing
                && let Some(n) = self.remote_record(b, obj, false)
            {
                self.renote.insert(b, n);
            }
        }
        // Detaching the blobs keeps `stored_keys` and the removal events right.
        for b in blobs {
            self.detach_blob(b, now);
        }
        if self.doomed(obj) {
            // Out of the index already (the `remove_all` dropped it whole).
            self.objects.remove(obj as usize);
            if let Some(p) = &mut self.purge {
                p.left -= 1;
            }
            return;
        }
        let o = self.objects.remove(obj as usize);
        if !self.quiet_removal {
            self.tombstones
                .note(crate::cluster::catalog::key_hash(&o.key));
        }
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
    pub(super) fn make_readable(&mut self, id: u32, now: u64) {
        let obj = self.blobs[id as usize].obj;
        debug_assert!(!self.doomed(obj), "a doomed object made readable");
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
            self.readable_objects += 1;
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

    /// Ends a writer's hold on one of its blobs; a detached blob nobody else holds is freed.
    pub(super) fn release_writer(&mut self, id: u32, now: u64) {
        let b = &mut self.blobs[id as usize];
        if !b.writing {
            return;
        }
        b.writing = false;
        b.pins -= 1;
        if b.obj == NIL && b.pins == 0 && b.lease_until_ms <= now && !b.flushing {
            self.free_zombie(id);
        }
    }

    /// Releases a pin taken by `get` (or by a job).
    pub fn unpin(&mut self, h: BlobHandle) {
        let now = self.now_ms();
        if let Some(b) = self.blobs.get_mut(h.id as usize).filter(|b| b.tag == h.tag) {
            b.pins = b.pins.saturating_sub(1);
            if b.obj == NIL && b.pins == 0 && b.lease_until_ms <= now && !b.flushing {
                self.free_zombie(h.id);
            }
        }
    }

    /// Ends a writer's hold on the blobs orphaned from the object of `generation` (its grant
    /// ended, or its memory is gone); they are freed unless something else holds them.
    pub(super) fn release_orphans(&mut self, generation: u64, now: u64) {
        let Some(o) = self.orphaned.remove(&generation) else {
            return;
        };
        // No write under its grants lands after this: their records again, so a catalog that
        // took a write after the first ones drops it (`Orphan::freed`).
        self.freed_remote.extend(o.freed);
        for b in o.blobs {
            self.release_writer(b, now);
        }
    }

    /// Releases the orphaned blobs of remote writers whose time to write is over.
    fn release_expired_orphans(&mut self, now: u64) {
        let due: SmallVec<[u64; 4]> = self
            .orphaned
            .iter()
            .filter(|(_, o)| o.until_ms.is_some_and(|t| t <= now))
            .map(|(&g, _)| g)
            .collect();
        for generation in due {
            self.release_orphans(generation, now);
        }
    }

    /// Frees zombies whose leases and pins have ended; reclaims allocations whose writer
    /// neither committed nor made progress for `alloc_timeout_ms`; frees the blobs orphaned
    /// from remote writers once their time to write is over. Run on the shard's tick.
    pub fn tick(&mut self) {
        let now = self.now_ms();
        // Pick up mounts and unmounts even on a shard that stores nothing meanwhile.
        self.refresh_segments();
        self.continue_purge();
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
            // when the writer's commit or abort releases them, never under a live writer (a
            // remote writer's at its deadline, below: with the defaults already past, as
            // `remote_writer_ms` is below `alloc_timeout_ms`).
            log::warn!(
                "reclaiming {:?}: its writer neither committed nor wrote for {timeout} ms; grant revoked",
                String::from_utf8_lossy(&self.objects[obj as usize].key),
            );
            self.remove_object(obj, now);
        }
        if !self.orphaned.is_empty() {
            self.release_expired_orphans(now);
        }
    }

    pub(super) fn reap_zombies(&mut self, now: u64) {
        let mut i = 0;
        while i < self.zombies.len() {
            let id = self.zombies[i];
            let b = &self.blobs[id as usize];
            if b.pins == 0 && b.lease_until_ms <= now && !b.flushing {
                self.zombies.swap_remove(i);
                self.count_zombie(id, false);
                self.free_blob(id);
            } else {
                i += 1;
            }
        }
    }
}
