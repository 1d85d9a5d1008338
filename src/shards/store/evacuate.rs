//! Unmount: moving this shard's blobs off a segment, then forgetting it.

use super::*;

impl Store {
    /// Moves this shard's blobs off a segment being unmounted: to another segment of the same
    /// medium, else to the memory tier below, else they are dropped (with their object when
    /// it has no other copy). A leased, pinned, flushing or still-written blob is left where it
    /// is until its lease and pins end: returns false while some blob is still there; call
    /// again later. When it returns true, the shard holds nothing there.
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
            // An earlier removal in this loop may have freed the blob.
            let Some(b) = self.blobs.get(id as usize).filter(|b| b.seg == seg) else {
                continue;
            };
            // A leased or pinned blob is never moved: a reader may be reading it where it
            // is. Wait for its lease and pins to end (the caller calls again).
            if b.obj == NIL
                || b.pins > 0
                || b.lease_until_ms > now
                || b.flushing
                || b.state != BlobState::Readable
            {
                busy = true;
                continue;
            }
            let obj = b.obj;
            if self.doomed(obj) {
                self.remove_object(obj, now);
                continue;
            }
            let moved = self.copy_elsewhere(id, now);
            if !moved && self.objects[obj as usize].blobs.len() <= 1 {
                self.remove_object(obj, now);
                continue;
            }
            self.detach_blob(id, now);
            self.want_copies(obj);
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

    /// Drops this shard's blobs on a segment whose bytes are gone (a lost remote rank): an
    /// object with another copy keeps it and stays readable, one without is removed (counted
    /// as a removal, `BlockRemoved` published). Leases and pins do not hold the bytes back
    /// (there are none left to read); a pinned blob is freed when its pin ends. True when this
    /// shard holds nothing there any more; else call again.
    pub fn drop_segment(&mut self, seg: SegmentId) -> bool {
        let now = self.now_ms();
        // A lease keeps a range from being handed out again while a reader may still read it;
        // this segment's ranges never are, so its blobs (zombies too) are freed once unpinned.
        for (_, b) in self.blobs.iter_mut().filter(|(_, b)| b.seg == seg) {
            b.lease_until_ms = 0;
        }
        // Nor do the pins of re-replications copying from or into it (their copy fails).
        self.release_copies_on(seg);
        let ids: Vec<u32> = self
            .blobs
            .iter()
            .filter(|(_, b)| b.seg == seg && b.obj != NIL)
            .map(|(i, _)| i as u32)
            .collect();
        for id in ids {
            let Some(b) = self.blobs.get(id as usize).filter(|b| b.seg == seg) else {
                continue;
            };
            let obj = b.obj;
            if obj == NIL {
                continue;
            }
            // A copy elsewhere keeps the object: any, for a put still being written (its other
            // replicas are being written too); only a readable one for a committed object (a
            // move's, a rewarm's or a re-replication's destination still being copied from
            // this segment will never be written: the object's last copy is here).
            let writing = self.uncommitted.contains_key(&obj);
            let elsewhere = self.objects[obj as usize].blobs.iter().any(|&o| {
                let other = &self.blobs[o as usize];
                o != id && other.seg != seg && (writing || other.state == BlobState::Readable)
            });
            if elsewhere && !self.doomed(obj) {
                // A put still being written: its writer's hold on this copy ends here (the
                // memory is gone). Its commit or abort only releases the copies still
                // attached, so a detached copy it held would never be freed.
                self.release_writer(id, now);
                self.detach_blob(id, now);
                self.want_copies(obj);
            } else {
                let rank = self.blobs[id as usize].rank;
                let doomed = self.doomed(obj);
                let remote_writer = self
                    .uncommitted
                    .get(&obj)
                    .is_some_and(|w| w.remote_until_ms.is_some());
                let generation = self.objects[obj as usize].generation;
                // Lost with its rank, not removed by anyone: a restarted service that
                // recovered it (its SSD) may hand it over again, but no older version may
                // take its place (tombstones.rs).
                if !doomed && !self.uncommitted.contains_key(&obj) {
                    let o = &self.objects[obj as usize];
                    let key = crate::cluster::catalog::key_hash(&o.key);
                    self.tombstones.note_floor(key, o.stamp);
                }
                self.quiet_removal = true;
                self.remove_object(obj, now);
                self.quiet_removal = false;
                if remote_writer {
                    // Its writer wrote into memory that is gone: nothing to wait for.
                    self.release_orphans(generation, now);
                }
                if !doomed {
                    self.stats.record(Op::Remove, Outcome::Success, Some(rank));
                }
            }
        }
        // Blobs of puts removed (or reclaimed) while their writers were at work wait for the
        // writer's commit or abort, which a rank whose memory is gone never sends (and its
        // grants do not verify on a new incarnation): their hold ends here too. The writer's
        // other blobs stay orphaned until it lets go.
        let generations: SmallVec<[u64; 4]> = self
            .orphaned
            .iter()
            .filter(|(_, held)| {
                held.blobs
                    .iter()
                    .any(|&b| self.blobs[b as usize].seg == seg)
            })
            .map(|(&g, _)| g)
            .collect();
        for g in generations {
            let Some(held) = self.orphaned.remove(&g) else {
                continue;
            };
            let (here, rest): (SmallVec<[u32; 2]>, SmallVec<[u32; 2]>) = held
                .blobs
                .into_iter()
                .partition(|&b| self.blobs[b as usize].seg == seg);
            if !rest.is_empty() {
                self.orphaned.insert(
                    g,
                    Orphan {
                        blobs: rest,
                        until_ms: held.until_ms,
                        freed: held.freed,
                    },
                );
            }
            for b in here {
                self.release_writer(b, now);
            }
        }
        self.reap_zombies(now);
        if self.blobs.iter().any(|(_, b)| b.seg == seg) {
            return false;
        }
        if let Some(ss) = self.segs.get_mut(seg as usize).and_then(|s| s.as_mut()) {
            ss.release_all();
        }
        true
    }

    /// Copies a memory blob to another segment of its medium on a rank without a copy yet,
    /// else (when it is the object's only copy) to the memory tier below. True when copied
    /// (the new copy readable); the blob itself stays attached.
    fn copy_elsewhere(&mut self, id: u32, now: u64) -> bool {
        let (obj, medium, rank) = {
            let b = &self.blobs[id as usize];
            (b.obj, b.medium, b.rank)
        };
        if !medium.is_memory() {
            return false;
        }
        let size = self.objects[obj as usize].size;
        let others: SmallVec<[(u32, Medium); 2]> = self.objects[obj as usize]
            .blobs
            .iter()
            .filter(|&&o| o != id && self.blobs[o as usize].state == BlobState::Readable)
            .map(|&o| (self.blobs[o as usize].rank, self.blobs[o as usize].medium))
            .collect();
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
            let Some((nseg, off, alen)) = self.alloc_blob(target, size, &avoid, Some(rank)) else {
                continue;
            };
            if self.copy_memory(id, nseg, off, size) {
                let dst = self.insert_blob(obj, nseg, off, alen, BlobState::Allocated, now);
                self.make_readable(dst, now);
                return true;
            }
            self.segs[nseg as usize].as_mut().unwrap().free(off, alen);
        }
        false
    }

    /// Forgets a segment removed from the table (after every shard evacuated it): drops this
    /// shard's share and its reference, so the mapping or file goes with the last one.
    pub fn forget_segment(&mut self, seg: SegmentId) {
        debug_assert!(
            !self.blobs.iter().any(|(_, b)| b.seg == seg),
            "forgetting a segment that holds blobs"
        );
        if let Some(slot) = self.segs.get_mut(seg as usize) {
            *slot = None;
        }
        // The cached copy of the table holds the segment too: take the table as it is now
        // (the segment is out of it before a shard is told to forget it).
        self.refresh_segments();
    }
}
