//! Tiering between memory and SSD: flushes (started by eviction) and rewarms (by reads
//! and `/memory/prefetch`), finished when the shard's I/O ends.

use super::*;

impl Store {
    /// Whether a blob is on an SSD file that its writes faulted.
    pub(super) fn ssd_faulted(&self, blob: u32) -> bool {
        let b = &self.blobs[blob as usize];
        self.seg(b.seg)
            .seg
            .backend
            .file()
            .is_some_and(|f| f.faulted())
    }

    /// Whether some SSD segment of this process takes flushes (mounted, not faulted). A
    /// remote rank's SSD takes only that rank's own blobs ([`Store::alloc_on_rank`]).
    pub(super) fn ssd_takes_flushes(&self) -> bool {
        self.segs.iter().flatten().any(|s| {
            s.seg.medium == Medium::Ssd
                && s.seg.is_allocatable()
                && s.seg.backend.remote().is_none()
        })
    }

    /// Whether blob `id` is on a remote rank (its bytes on that rank's local service).
    pub(super) fn is_remote_blob(&self, id: u32) -> bool {
        self.seg(self.blobs[id as usize].seg)
            .seg
            .backend
            .remote()
            .is_some()
    }

    /// Allocates `len` bytes on `rank`'s segment of `medium` (a remote rank's tier moves stay
    /// on that rank: its local service copies between its own segments).
    pub(super) fn alloc_on_rank(
        &mut self,
        medium: Medium,
        len: u64,
        rank: u32,
    ) -> Option<(SegmentId, u64, u64)> {
        self.refresh_segments();
        let id = self.segs.iter().flatten().find_map(|s| {
            (s.seg.medium == medium && s.seg.rank == rank && s.seg.is_allocatable())
                .then_some(s.seg.id)
        })?;
        let ss = self.segs[id as usize].as_mut()?;
        let (offset, rounded) = ss.alloc(len)?;
        Some((id, offset, rounded))
    }

    /// Room for a rewarm into DRAM: on this process's DRAM for a local SSD copy, on the same
    /// rank's DRAM for a remote rank's (its local service copies file to memory itself).
    fn alloc_rewarm(
        &mut self,
        size: u64,
        rank: u32,
        remote: bool,
    ) -> Option<(SegmentId, u64, u64)> {
        if remote {
            self.alloc_on_rank(Medium::Dram, size, rank)
        } else {
            self.alloc_blob(Medium::Dram, size, &[], Some(rank))
        }
    }

    /// Allocates a DRAM blob for an SSD blob and returns the job that copies it.
    pub(super) fn start_rewarm(
        &mut self,
        obj: u32,
        ssd_blob: u32,
        now: u64,
        prefetch: bool,
    ) -> Option<IoJob> {
        let size = self.objects[obj as usize].size;
        let rank = self.blobs[ssd_blob as usize].rank;
        // With the SSD tier faulted, evicting from DRAM deletes: a rewarm then takes only
        // the room DRAM has (the SSD copy can be read directly), never another object's.
        let faulted = self.ssd_faulted(ssd_blob);
        let remote = self.is_remote_blob(ssd_blob);
        if !faulted {
            self.evict_for(Medium::Dram, size, now);
        }
        let placed = match self.alloc_rewarm(size, rank, remote) {
            Some(p) => p,
            None if faulted => return None,
            None => {
                self.evict_forced(Medium::Dram, size, now);
                self.alloc_rewarm(size, rank, remote)?
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
            src: self.handle(ssd_blob),
            dst: self.handle(dst),
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
        let live = self.end_rewarming(*obj);
        let Some(d) = self.blob_by_handle(*dst) else {
            return;
        };
        let (rank, state) = (d.rank, d.state);
        self.blobs[dst.id as usize].pins -= 1;
        if ok && live && state == BlobState::Allocated {
            self.land_rewarm(obj.id, dst.id, rank, now);
        } else {
            self.abandon_rewarm(*src, dst.id, rank, outcome, now);
        }
    }

    /// The object of a finished rewarm is no longer rewarming; whether it is still live
    /// (not removed, replaced or doomed by a `remove_all` meanwhile).
    fn end_rewarming(&mut self, obj: ObjHandle) -> bool {
        let live = self
            .objects
            .get(obj.id as usize)
            .is_some_and(|o| o.generation == obj.generation)
            && !self.doomed(obj.id);
        if live {
            self.objects[obj.id as usize].rewarming = false;
        }
        live
    }

    /// A rewarm succeeded: its DRAM copy is counted and becomes readable.
    fn land_rewarm(&mut self, obj: u32, dst: u32, rank: u32, now: u64) {
        let size = self.objects[obj as usize].size;
        self.blobs[dst as usize].rewarmed_bytes = size;
        self.stats.tier(rank, |t| {
            t.rewarm.inc();
            t.rewarm_bytes.add(size);
            t.rewarm_bytes_current.add(size as i64);
        });
        self.make_readable(dst, now);
        // A remote rank's local service hands the copy over once told (catalog hand-over).
        self.note_landed_remote(dst);
    }

    /// A rewarm failed, or its object went away meanwhile: the DRAM copy is dropped (freed
    /// now if nothing holds it), and a damaged SSD copy too.
    fn abandon_rewarm(
        &mut self,
        src: BlobHandle,
        dst: u32,
        rank: u32,
        outcome: IoOutcome,
        now: u64,
    ) {
        if outcome != IoOutcome::Done {
            self.stats.tier(rank, |t| t.rewarm_failed.inc());
        }
        if self.blobs[dst as usize].obj != NIL {
            self.detach_blob(dst, now);
        } else if self.blobs[dst as usize].pins == 0 {
            self.reap_zombies(now);
        }
        if outcome == IoOutcome::Damaged {
            self.drop_damaged(src);
        }
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
        let dst_obj = self.blobs[dst.id as usize].obj;
        let dst_attached = dst_obj != NIL;
        if ok
            && dst_attached
            && !self.doomed(dst_obj)
            && self.blobs[dst.id as usize].state == BlobState::Allocated
        {
            self.stats.tier(rank, |t| {
                t.flush_blobs.inc();
                t.flush_bytes.add(size);
            });
            self.blobs[dst.id as usize].sum = sum;
            self.make_readable(dst.id, now);
            // Its bytes are written: a journaled file's index learns it now.
            self.journal_add(dst.id);
            // Before the source's removal: a remote rank's local service hands the SSD copy
            // over from then on (catalog hand-over).
            self.note_landed_remote(dst.id);
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

    /// Finishes a remote rank's HBM → DRAM demotion (its local service's copy ended `ok`):
    /// the DRAM copy becomes readable and the HBM copy goes, counted as a demotion here is
    /// (`demoted_blobs`; the object's `Stored` on DRAM and `Removed` from HBM). On failure
    /// the DRAM blob is let go and the HBM copy stays as it was, or is dropped when the
    /// eviction was for an allocation that needs the room (and nothing holds it now).
    pub fn finish_demote(&mut self, job: &IoJob, ok: bool) {
        let IoJob::Demote {
            src,
            dst,
            drop_on_failure,
            ..
        } = job
        else {
            return;
        };
        let now = self.now_ms();
        self.demotes_in_flight -= 1;
        let src_live = self.blob_by_handle(*src).is_some_and(|b| b.obj != NIL);
        if let Some(b) = self
            .blobs
            .get_mut(src.id as usize)
            .filter(|b| b.tag == src.tag)
        {
            b.flushing = false;
        }
        if let Some(d) = self.blob_by_handle(*dst) {
            let (obj, state) = (d.obj, d.state);
            self.blobs[dst.id as usize].pins -= 1;
            if ok && obj != NIL && !self.doomed(obj) && state == BlobState::Allocated {
                self.make_readable(dst.id, now);
                // Before the source's removal: the rank's local service hands the DRAM copy
                // over from then on (catalog hand-over).
                self.note_landed_remote(dst.id);
                self.stats.demoted_blobs.inc();
                if src_live {
                    self.detach_blob(src.id, now);
                }
            } else {
                if obj != NIL {
                    self.detach_blob(dst.id, now);
                }
                if !ok
                    && *drop_on_failure
                    && src_live
                    && !self.doomed(self.blobs[src.id as usize].obj)
                    && self.is_evictable(&self.blobs[src.id as usize], now)
                {
                    self.drop_evicted(src.id, now);
                }
            }
        }
        self.reap_zombies(now);
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
}

pub(super) fn job_size(job: &IoJob) -> u64 {
    match job {
        IoJob::Flush { src_view, .. }
        | IoJob::Rewarm { src_view, .. }
        | IoJob::Demote { src_view, .. }
        | IoJob::ReadSsd { src_view, .. } => src_view.len,
    }
}
