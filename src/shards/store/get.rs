//! A read: a leased, pinned copy in memory, a rewarm from SSD, or a direct SSD read.

use super::*;

impl Store {
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

    /// A batch read's second try when the copy it was given, on remote rank `rank`, did not
    /// come from its local service (the rank died and is not yet declared lost): a readable
    /// memory copy on another rank, leased and pinned like any read, or `None`. Counted by
    /// the read that chose the first copy, so not again here.
    pub fn get_elsewhere(&mut self, key: &[u8], rank: u32) -> Option<BlobView> {
        let now = self.now_ms();
        let obj = self.find(key)?;
        let blob = self.fastest_copy_where(obj, |b| b.medium.is_memory() && b.rank != rank)?;
        self.lease_and_pin(blob, now);
        let size = self.objects[obj as usize].size;
        Some(self.view(blob, size))
    }

    /// When a read's lease on `blob`, taken at `now`, ends. A remote rank's local service
    /// checks the read grant's expiry (the lease) by its own clock, which may lag this one's
    /// by up to the clock skew: the range stays this blob's that much longer, or a late read
    /// could find another object's bytes there.
    fn lease_end(&self, blob: u32, now: u64) -> u64 {
        let b = &self.blobs[blob as usize];
        let remote = matches!(
            self.segs.get(b.seg as usize),
            Some(Some(ss)) if ss.seg.backend.remote().is_some()
        );
        now + self.cfg.lease_ms
            + if remote {
                crate::limits::CLOCK_SKEW_MS
            } else {
                0
            }
    }

    /// A reader's hold on a memory blob: its lease extended, a pin, a touch in the LRU.
    fn lease_and_pin(&mut self, blob: u32, now: u64) {
        let lease = self.lease_end(blob, now);
        let b = &mut self.blobs[blob as usize];
        let (medium, lru) = (b.medium, b.lru);
        b.lease_until_ms = b.lease_until_ms.max(lease);
        b.pins += 1;
        self.lru.touch(medium as usize, lru);
    }

    pub(super) fn get_inner(&mut self, key: &[u8], mode: ReadMode) -> GetStep {
        let now = self.now_ms();
        let Some((obj, blob)) = self
            .find(key)
            .and_then(|o| Some((o, self.fastest_copy(o)?)))
        else {
            self.stats.record(Op::Get, Outcome::NotFound, None);
            return GetStep::NotFound;
        };
        if self.blobs[blob as usize].medium.is_memory() {
            self.lease_memory_copy(obj, blob, now, mode == ReadMode::AfterRewarm)
        } else {
            self.read_ssd_copy(obj, blob, now, mode)
        }
    }

    /// The object's readable blob on the fastest medium.
    fn fastest_copy(&self, obj: u32) -> Option<u32> {
        self.fastest_copy_where(obj, |_| true)
    }

    /// The object's readable blob on the fastest medium among those `keep` accepts.
    fn fastest_copy_where(&self, obj: u32, keep: impl Fn(&BlobRec) -> bool) -> Option<u32> {
        self.objects[obj as usize]
            .blobs
            .iter()
            .copied()
            .filter(|&b| {
                let b = &self.blobs[b as usize];
                b.state == BlobState::Readable && keep(b)
            })
            .min_by_key(|&b| self.blobs[b as usize].medium)
    }

    /// Serves a read from a memory blob: leased and pinned for the reader, touched in the LRU,
    /// counted as a hit (an SSD hit when it follows the reader's own rewarm).
    fn lease_memory_copy(&mut self, obj: u32, blob: u32, now: u64, rewarmed: bool) -> GetStep {
        self.lease_and_pin(blob, now);
        let (medium, rank) = (
            self.blobs[blob as usize].medium,
            self.blobs[blob as usize].rank,
        );
        self.stats.record(Op::Get, Outcome::Success, Some(rank));
        if rewarmed {
            self.stats.tier(rank, |t| t.get_hits_ssd.inc());
        } else {
            self.stats.tier(rank, |t| t.get_hits_dram.inc());
        }
        let size = self.objects[obj as usize].size;
        self.events.push(Event::Read {
            medium,
            bytes: size,
        });
        GetStep::Ready(self.view(blob, size))
    }

    /// A read of an object held only on SSD: wait for a rewarm in flight, start one, wait for
    /// a flush to make room for one, or read the SSD copy directly (`ReadMode::Direct`, or
    /// no room to rewarm into).
    fn read_ssd_copy(&mut self, obj: u32, blob: u32, now: u64, mode: ReadMode) -> GetStep {
        if mode == ReadMode::Direct {
            return self.direct_read(obj, blob, now);
        }
        if self.objects[obj as usize].rewarming {
            return GetStep::Wait;
        }
        // A faulted SSD tier takes no flushes, so waiting for one to make room in DRAM is
        // pointless: read the SSD copy directly instead.
        let faulted = self.ssd_faulted(blob);
        let rank = self.blobs[blob as usize].rank;
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
    pub(super) fn direct_read(&mut self, obj: u32, blob: u32, now: u64) -> GetStep {
        let size = self.objects[obj as usize].size;
        let lease = self.lease_end(blob, now);
        let b = &mut self.blobs[blob as usize];
        b.pins += 1;
        b.lease_until_ms = b.lease_until_ms.max(lease);
        let sum = b.sum;
        GetStep::ReadDirect(IoJob::ReadSsd {
            src: self.handle(blob),
            src_view: self.view(blob, size),
            sum,
        })
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

    /// A direct read of a remote rank's SSD copy was handed to its local service (the reader
    /// follows a read grant there): counted as a get; its pin goes with the reader's reply.
    pub fn count_remote_direct_read(&mut self, rank: u32) {
        self.stats.record(Op::Get, Outcome::Success, Some(rank));
    }

    /// A remote rank's local service read the SSD copy of `key` at `offset` of its `rank`'s
    /// `medium` segment and found it damaged: the copy is dropped as a damaged read here
    /// drops it. False when no such copy is listed (dropped already, or replaced).
    pub fn drop_damaged_at(&mut self, key: &[u8], rank: u32, medium: Medium, offset: u64) -> bool {
        let Some(obj) = self.find(key) else {
            return false;
        };
        let blob = self.objects[obj as usize].blobs.iter().copied().find(|&b| {
            let r = &self.blobs[b as usize];
            r.rank == rank && r.medium == medium && r.offset == offset && medium == Medium::Ssd
        });
        let Some(b) = blob else {
            return false;
        };
        self.drop_damaged(self.handle(b));
        true
    }

    /// Drops an SSD copy whose bytes came back damaged (short, or not matching their
    /// checksum), and its object when that was the last readable copy. Removal events are
    /// published as for any removal (a KV `BlockRemoved` for the SSD tier).
    pub(super) fn drop_damaged(&mut self, src: BlobHandle) {
        let now = self.now_ms();
        let Some(b) = self.blob_by_handle(src) else {
            return;
        };
        let (obj, seg, unverified) = (b.obj, b.seg, b.unverified);
        if obj == NIL {
            return;
        }
        if let Some(f) = self.seg(seg).seg.backend.file() {
            f.record_damaged(self.shard, "checksum mismatch or short read");
            if unverified {
                // Recovered at the start and never read back intact: a loss of the recovery.
                f.shard_stats()[self.shard].verify_damaged.inc();
            }
        }
        let others = self.objects[obj as usize]
            .blobs
            .iter()
            .any(|&o| o != src.id && self.blobs[o as usize].state == BlobState::Readable);
        if others {
            self.detach_blob(src.id, now);
            self.want_copies(obj);
        } else {
            self.remove_object(obj, now);
        }
    }
}
