//! A put (alloc → write → commit) and the room it takes on a medium.

use super::*;

/// Where a new object goes: what a put asks of [`Store::alloc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// `None`: the default medium.
    pub medium: Option<Medium>,
    pub replicas: u8,
    pub prot: u16,
    /// Place the first copy on this rank when it has room (upstream's
    /// `preferredLocalServiceIDs`); replicas still go to distinct ranks.
    pub prefer_rank: Option<u32>,
}

impl Placement {
    /// `replicas` copies on `medium`, no protection, no preferred rank.
    pub fn on(medium: Option<Medium>, replicas: u8) -> Placement {
        Placement {
            medium,
            replicas,
            prot: 0,
            prefer_rank: None,
        }
    }
}

/// How soon an allocation waiting for zombies held by pins or flushes (no lease end to wait
/// for) tries again.
const ROOM_RETRY_MS: u64 = 10;

/// Blobs placed for a put: segment, offset, allocated length.
type Placed = SmallVec<[(SegmentId, u64, u64); 2]>;

impl Store {
    /// (capacity, used) of a medium over all mounted segments.
    pub fn medium_totals(&self, medium: Medium) -> (u64, u64) {
        self.view
            .segments()
            .iter()
            .filter(|s| s.medium == medium)
            .fold((0, 0), |(c, u), s| (c + s.capacity, u + s.used_bytes()))
    }

    /// The capacity of `medium`'s mounted segments (reads nothing another shard writes).
    pub fn medium_capacity(&self, medium: Medium) -> u64 {
        self.view
            .segments()
            .iter()
            .filter(|s| s.medium == medium)
            .map(|s| s.capacity)
            .sum()
    }

    /// (capacity, live bytes) of a medium for the watermark check at `now`: the bytes used
    /// less those of zombies (removed blobs waiting for their leases, pins, flushes or writers
    /// to end, which come back by themselves and which no eviction can free sooner); this
    /// shard's exact, the other shards' as read at most once per millisecond
    /// (`Store::others_used`).
    pub(super) fn watermark_totals(&mut self, medium: Medium, now: u64) -> (u64, u64) {
        let mine = self.my_live(medium);
        let m = medium as usize;
        match self.others_used[m] {
            Some((at, cap, others)) if at == now => (cap, mine + others),
            _ => {
                let (cap, live) = self
                    .view
                    .segments()
                    .iter()
                    .filter(|s| s.medium == medium)
                    .fold((0, 0), |(c, l), s| (c + s.capacity, l + s.live_bytes()));
                let others = live.saturating_sub(mine);
                self.others_used[m] = Some((now, cap, others));
                (cap, mine + others)
            }
        }
    }

    /// This shard's used bytes on the medium's mounted segments (those of the cached view:
    /// the segments the totals count, not one being forgotten).
    #[cfg(test)]
    pub(super) fn my_used(&self, medium: Medium) -> u64 {
        self.my_segments(medium).map(|s| s.used()).sum()
    }

    /// [`Store::my_used`] less this shard's zombies there.
    pub(super) fn my_live(&self, medium: Medium) -> u64 {
        self.my_segments(medium).map(|s| s.live()).sum()
    }

    fn my_segments(&self, medium: Medium) -> impl Iterator<Item = &ShardSegment> {
        self.view
            .segments()
            .iter()
            .filter(move |s| s.medium == medium)
            .filter_map(|s| self.segs.get(s.id as usize)?.as_ref())
    }

    /// Allocates one blob of `len` bytes on `medium`, avoiding the ranks in `avoid`,
    /// preferring `prefer_rank` and then the segment with the most room.
    pub(super) fn alloc_blob(
        &mut self,
        medium: Medium,
        len: u64,
        avoid: &[u32],
        prefer_rank: Option<u32>,
    ) -> Option<(SegmentId, u64, u64)> {
        self.alloc_blob_in(medium, len, avoid, prefer_rank, false)
    }

    /// [`Store::alloc_blob`] where `remote_ok` says whether a remote rank's segment may take
    /// it: only a client's put may (its bytes go to that rank's local service under a grant);
    /// the store's own moves (demotion, rewarm, evacuation) copy bytes here and cannot.
    pub(super) fn alloc_blob_in(
        &mut self,
        medium: Medium,
        len: u64,
        avoid: &[u32],
        prefer_rank: Option<u32>,
        remote_ok: bool,
    ) -> Option<(SegmentId, u64, u64)> {
        self.refresh_segments();
        let mut candidates: SmallVec<[(bool, u64, SegmentId); 8]> = self
            .segs
            .iter()
            .flatten()
            .filter(|s| {
                s.seg.medium == medium
                    && s.seg.is_allocatable()
                    && !avoid.contains(&s.seg.rank)
                    && (remote_ok || s.seg.backend.remote().is_none())
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

    /// Allocates the placement's replicas for a new object (state ALLOCATED) after evicting
    /// if the medium is above its high watermark. Where no segment has room, it answers
    /// [`AllocStep::WaitForRoom`] when this shard's zombies will give enough back, and
    /// evicts otherwise.
    pub fn alloc(&mut self, key: Box<[u8]>, size: u64, placement: Placement) -> AllocStep {
        self.traced_alloc(|s| s.place_new(key, size, placement, true))
    }

    /// [`Store::alloc`] that never waits: where no segment has room it evicts least recently
    /// used blobs until one has (forced eviction), or waits only for flushes in flight.
    pub fn alloc_now(&mut self, key: Box<[u8]>, size: u64, placement: Placement) -> AllocStep {
        self.traced_alloc(|s| s.place_new(key, size, placement, false))
    }

    fn traced_alloc(&mut self, place: impl FnOnce(&mut Store) -> AllocStep) -> AllocStep {
        let tracer = self.tracer.clone();
        let span = tracer.begin(Tp::Alloc);
        let step = place(self);
        span.end(!matches!(step, AllocStep::Refused(_)));
        step
    }

    fn place_new(
        &mut self,
        key: Box<[u8]>,
        size: u64,
        placement: Placement,
        patient: bool,
    ) -> AllocStep {
        let Placement {
            medium,
            replicas,
            prot,
            prefer_rank,
        } = placement;
        let replicas = replicas as usize;
        let now = self.now_ms();
        self.refresh_segments();
        if self.purge.is_some() {
            self.continue_purge();
        }
        let medium = match self.alloc_target(&key, size, medium, replicas, prefer_rank) {
            Ok(m) => m,
            Err(why) => {
                self.stats.record(Op::Alloc, Outcome::Failure, None);
                return AllocStep::Refused(why);
            }
        };
        self.evict_for(medium, size * replicas as u64, now);
        let placed = match self.place_replicas(medium, size, replicas, prefer_rank, patient, now) {
            Ok(p) => p,
            Err(step) => return *step,
        };
        let remote = placed
            .iter()
            .any(|&(seg, _, _)| self.seg(seg).seg.backend.remote().is_some());
        let remote_until_ms = remote.then(|| now + self.cfg.remote_writer_ms);
        let (obj, generation, link) =
            self.insert_object(key, size, prot, replicas as u8, now, remote_until_ms);
        // A key removed here and put again: catalogs may list this version (tombstones.rs).
        let o = &self.objects[obj as usize];
        let key_hash = crate::cluster::catalog::key_hash(&o.key);
        self.tombstones.allow(key_hash, o.stamp);
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

    /// The medium a put goes to, or why it is refused (a duplicated key, no such medium
    /// mounted, too few ranks for the replicas, larger than the medium).
    fn alloc_target(
        &self,
        key: &[u8],
        size: u64,
        medium: Option<Medium>,
        replicas: usize,
        prefer_rank: Option<u32>,
    ) -> Result<Medium, Refusal> {
        if self.find(key).is_some() {
            return Err(Refusal::of(ErrorKind::DuplicatedObject));
        }
        // With no medium asked for, a preferred rank without HBM takes the put in its DRAM
        // (rather than the default HBM of another rank, which would ignore the preference).
        let preferred = prefer_rank.and_then(|r| self.default_medium_of(Some(r)));
        let Some(medium) = medium.or(preferred).or_else(|| self.default_medium()) else {
            return Err(Refusal::new(
                ErrorKind::Failed,
                "No memory segment is mounted",
            ));
        };
        let ranks = self.ranks_of(medium);
        if ranks < replicas {
            return Err(Refusal::new(
                ErrorKind::Failed,
                if ranks == 0 {
                    let key = match medium {
                        Medium::Hbm => "set ock.mmc.local_service.hbm.size",
                        Medium::Dram => "set ock.mmc.local_service.dram.size",
                        Medium::Ssd => "set ock.mmc.ssd.enable and ock.mmc.ssd.path",
                    };
                    format!("No {medium} segment is mounted: mount one, or {key}")
                } else {
                    format!(
                        "Not enough ranks for {replicas} replicas on {medium} ({ranks} available)"
                    )
                },
            ));
        }
        // Capacity only: summing used bytes would read every shard's counters on each put.
        let capacity = self.medium_capacity(medium);
        if size > capacity {
            return Err(Refusal::new(
                ErrorKind::Failed,
                format!(
                    "Object of {size} bytes is larger than {medium} capacity ({capacity} bytes)"
                ),
            ));
        }
        Ok(medium)
    }

    /// Places `replicas` blobs of `size` bytes on distinct ranks of `medium`, evicting when
    /// there is no room (`patient`: unless zombies give enough back soon, then the caller is
    /// told to wait); on failure nothing stays allocated and the step says why.
    fn place_replicas(
        &mut self,
        medium: Medium,
        size: u64,
        replicas: usize,
        prefer_rank: Option<u32>,
        patient: bool,
        now: u64,
    ) -> Result<Placed, Box<AllocStep>> {
        let mut placed: Placed = SmallVec::new();
        let mut ranks_used: SmallVec<[u32; 2]> = SmallVec::new();
        let mut reaped = false;
        while placed.len() < replicas {
            if let Some(p) = self.alloc_blob_in(medium, size, &ranks_used, prefer_rank, true) {
                ranks_used.push(self.seg(p.0).seg.rank);
                placed.push(p);
                continue;
            }
            // Zombies whose holds ended since the last tick: free, then try again.
            if !reaped {
                reaped = true;
                let before = self.zombies.len();
                self.reap_zombies(now);
                if self.zombies.len() < before {
                    continue;
                }
            }
            // Room that zombies give back by themselves is waited for, not made by evicting
            // readable objects (the medium may be far below its watermarks: only the bytes
            // held by removed objects' leases fill it).
            let coming = if patient {
                self.room_coming(medium, size, now)
            } else {
                None
            };
            // No room even above the watermark: make room now, or wait for flushes.
            if coming.is_none() && self.evict_forced(medium, size, now) {
                continue;
            }
            for (seg, off, len) in placed {
                self.segs[seg as usize].as_mut().unwrap().free(off, len);
            }
            if let Some(in_ms) = coming {
                return Err(Box::new(AllocStep::WaitForRoom { in_ms }));
            }
            if self.flushes_in_flight + self.demotes_in_flight > 0 {
                // Their landing frees the sources' room.
                return Err(Box::new(AllocStep::WaitForFlush));
            }
            self.stats.record(Op::Alloc, Outcome::Failure, None);
            return Err(Box::new(AllocStep::Refused(Refusal::new(
                ErrorKind::NoSpace,
                format!("No space on {medium} for {size} bytes, even after eviction"),
            ))));
        }
        Ok(placed)
    }

    /// When this shard's zombies on `medium` hold at least `size` bytes, the time until the
    /// first of those held by a lease alone ends (the tick reaps it then);
    /// [`ROOM_RETRY_MS`] when pins or flushes hold them all. `None`: no such room is coming.
    fn room_coming(&self, medium: Medium, size: u64, now: u64) -> Option<u64> {
        let mut held = 0;
        let mut first: Option<u64> = None;
        for &z in &self.zombies {
            let b = &self.blobs[z as usize];
            if b.medium != medium {
                continue;
            }
            held += b.len;
            if b.pins == 0 && !b.flushing {
                first = Some(first.map_or(b.lease_until_ms, |f| f.min(b.lease_until_ms)));
            }
        }
        (held >= size).then(|| {
            first
                .map_or(ROOM_RETRY_MS, |t| t.saturating_sub(now))
                .clamp(1, self.cfg.lease_ms.max(ROOM_RETRY_MS))
        })
    }

    /// Inserts a new object (no blobs yet) into the slab and the indexes, with its writer's
    /// link; `replicas`: the copies on distinct ranks it should have. Returns its id and
    /// generation.
    pub(super) fn insert_object(
        &mut self,
        key: Box<[u8]>,
        size: u64,
        prot: u16,
        replicas: u8,
        now: u64,
        remote_until_ms: Option<u64>,
    ) -> (u32, u64, Arc<WriterLink>) {
        let generation = self.new_tag();
        let chunk = keys::chunk_hash_logged(&self.cfg.key_format, &key);
        let obj = self.objects.insert(Object {
            key,
            size,
            prot,
            blobs: SmallVec::new(),
            generation,
            created_ms: now,
            rewarming: false,
            chunk,
            stamp: crate::cluster::catalog::Stamp {
                view: self.stamp_view,
                seq: generation,
            },
            replicas: replicas.max(1),
            queued: false,
        }) as u32;
        let link = Arc::new(WriterLink::default());
        self.uncommitted.insert(
            obj,
            Uncommitted {
                link: link.clone(),
                seen_bytes: 0,
                progress_ms: now,
                remote_until_ms,
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
        (obj, generation, link)
    }

    /// The medium a put goes to when the client names none: the fastest one mounted.
    pub(super) fn default_medium(&self) -> Option<Medium> {
        self.default_medium_of(None)
    }

    /// The default medium (HBM when mounted, else DRAM) among the segments of `rank` (`None`:
    /// of every rank).
    fn default_medium_of(&self, rank: Option<u32>) -> Option<Medium> {
        [Medium::Hbm, Medium::Dram].into_iter().find(|&m| {
            self.view
                .segments()
                .iter()
                .any(|s| s.medium == m && s.is_allocatable() && rank.is_none_or(|r| s.rank == r))
        })
    }

    pub(super) fn ranks_of(&self, medium: Medium) -> usize {
        let mut ranks: SmallVec<[u32; 8]> = self
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
    /// pins are released, and blobs orphaned by a removal meanwhile are freed. False (not
    /// found) when the object was removed meanwhile; a commit or abort of an object committed
    /// already changes nothing.
    pub fn commit(&mut self, obj: ObjHandle, ok: bool) -> bool {
        let tracer = self.tracer.clone();
        let span = tracer.begin(Tp::UpdateState);
        let found = self.commit_inner(obj, ok);
        span.end(found);
        found
    }

    pub(super) fn commit_inner(&mut self, obj: ObjHandle, ok: bool) -> bool {
        let now = self.now_ms();
        let live = self
            .objects
            .get(obj.id as usize)
            .is_some_and(|o| o.generation == obj.generation);
        if !live {
            self.release_orphans(obj.generation, now);
            self.stats.record(Op::UpdateState, Outcome::NotFound, None);
            return false;
        }
        if !self.uncommitted.contains_key(&obj.id) {
            // Committed already: a second commit or an abort (a message repeated) changes
            // nothing; an acknowledged object is never dropped by one.
            return true;
        }
        let blobs: SmallVec<[u32; 2]> = self.objects[obj.id as usize].blobs.clone();
        let rank = blobs.first().map(|&b| self.blobs[b as usize].rank);
        // A remote put's abort comes from its first hop, whose write is over; a later hop of
        // a chain may still be written by a request that reached it directly (its URL is in
        // the first hop's): its blobs stay the writers' until their deadline (orphaned by
        // the removal below). A commit comes only after every hop answered.
        let remote = self.uncommitted[&obj.id].remote_until_ms.is_some();
        if ok || !remote || blobs.len() == 1 {
            for &b in &blobs {
                self.release_writer(b, now);
            }
        }
        if ok {
            self.uncommitted.remove(&obj.id);
            for &b in &blobs {
                if self.blobs[b as usize].state == BlobState::Allocated {
                    self.make_readable(b, now);
                }
            }
            // A copy lost while it was written (its rank dropped) leaves it below its count.
            self.want_copies(obj.id);
            self.stats.record(Op::UpdateState, Outcome::Success, rank);
            true
        } else {
            self.remove_object(obj.id, now);
            self.stats.record(Op::UpdateState, Outcome::Success, rank);
            true
        }
    }
}
