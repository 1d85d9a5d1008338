//! Moving objects off a remote rank that leaves gracefully: the store picks the objects whose
//! only copy is on the leaving segment and allocates each a new blob on another rank; the
//! caller (the HTTP layer, which can reach the leaving local service) copies the bytes and
//! reports back. Like a flush, the new blob is ALLOCATED and pinned while it is written, so
//! nothing reads or frees it; the old copy stays readable until the segment is dropped.

use super::*;
use segment::SegmentStatus;

/// Bytes per medium (indexed by `Medium as usize`): what a drain's skipped objects need, or
/// the room a shard is asked to make.
pub type MediumBytes = [u64; Medium::ALL.len()];

/// What one shard's [`Store::begin_moves`] gives the drain.
#[derive(Debug, Default)]
pub struct MovesStep {
    pub moves: Vec<Move>,
    /// Room for skipped objects is coming (moves down started or in flight): ask again a
    /// moment later.
    pub coming: bool,
    /// The bytes of the objects skipped for want of room, per target medium.
    pub need: MediumBytes,
    /// A tier below can take what eviction would move to make that room (other ranks have
    /// SSD), so waiting for leases and moves to end may still make room.
    pub room_possible: bool,
}

/// One object to move: its key, where its bytes are now and where they go.
#[derive(Debug)]
pub struct Move {
    pub key: Box<[u8]>,
    pub from: BlobView,
    pub to: BlobView,
    /// The object's stamp (its new blob's catalog entry on a local service).
    pub stamp: crate::cluster::catalog::Stamp,
}

impl Store {
    /// Up to `max` objects of this shard whose only readable copy is on `seg`, each with a
    /// new blob allocated on another rank (same medium, else the memory tier below; DRAM for
    /// an SSD copy; remote ranks allowed). Objects with a move in flight or with no room
    /// anywhere are skipped, their bytes counted in `need`. Room for them is made where a
    /// tier below can take it: this shard's least recently used blobs of the medium on other
    /// ranks are evicted (moved down to their SSD, or dropped where nothing lower has room, as
    /// for a put), for this shard's own need or the `room` the drain asks of it (another
    /// shard's objects may need the room this shard's blobs hold), unless moves down are
    /// under way already. `coming`: room is on its way; call again a moment later.
    pub fn begin_moves(&mut self, seg: SegmentId, max: usize, room: MediumBytes) -> MovesStep {
        let now = self.now_ms();
        let candidates: Vec<(u32, u32)> = self
            .blobs
            .iter()
            .filter(|(_, b)| b.seg == seg && b.obj != NIL && b.state == BlobState::Readable)
            .map(|(i, b)| (i as u32, b.obj))
            .collect();
        let mut out = Vec::new();
        let mut need = MediumBytes::default();
        for (id, obj) in candidates {
            if out.len() >= max {
                break;
            }
            if self.doomed(obj) {
                continue;
            }
            // Another copy (readable, or one being written by a move) makes this one free,
            // unless it is on a segment leaving too (a rank's DRAM and SSD copies of one
            // object leave together).
            let elsewhere = self.objects[obj as usize].blobs.iter().any(|&o| {
                o != id
                    && self.seg(self.blobs[o as usize].seg).seg.status()
                        != SegmentStatus::GracefullyUnmounting
            });
            if elsewhere {
                continue;
            }
            let (medium, rank) = (self.blobs[id as usize].medium, self.blobs[id as usize].rank);
            let size = self.objects[obj as usize].size;
            // An SSD copy moves into memory (DRAM) elsewhere: the drain writes the bytes it
            // fetched straight into memory or to a local service, never into a file.
            let targets = match medium {
                Medium::Ssd => [Some(Medium::Dram), None],
                m => [Some(m), m.lower_tier().filter(|m| m.is_memory())],
            };
            let placed = targets
                .into_iter()
                .flatten()
                .find_map(|t| self.alloc_blob_in(t, size, &[rank], None, true));
            let Some((nseg, off, alen)) = placed else {
                if let Some(t) = targets[0] {
                    need[t as usize] += size;
                }
                continue;
            };
            let dst = self.insert_blob(obj, nseg, off, alen, BlobState::Allocated, now);
            self.blobs[dst as usize].pins = 1;
            out.push(Move {
                key: self.objects[obj as usize].key.clone(),
                from: self.view(id, size),
                to: self.view(dst, size),
                stamp: self.objects[obj as usize].stamp,
            });
        }
        let mut step = MovesStep {
            moves: out,
            coming: false,
            need,
            room_possible: false,
        };
        let wanted: MediumBytes = std::array::from_fn(|m| need[m].max(room[m]));
        if wanted.iter().all(|&n| n == 0) {
            return step;
        }
        // Room for the skipped ones: once the moves down started earlier have landed.
        step.coming = self.flushes_in_flight + self.demotes_in_flight > 0;
        self.refresh_segments();
        let leaving = self.segs.get(seg as usize).and_then(|s| s.as_ref());
        if let Some(leaving) = leaving.map(|s| s.seg.rank) {
            for medium in Medium::ALL {
                let n = wanted[medium as usize];
                if n > 0 && self.tier_below_elsewhere(medium, leaving) {
                    step.room_possible = true;
                    if !step.coming {
                        step.coming = self.evict_forced(medium, n, now);
                    }
                }
            }
        }
        step
    }

    /// Whether a rank other than `leaving` has a segment of the tier below `medium` to take
    /// evicted blobs (else eviction would only delete them).
    fn tier_below_elsewhere(&self, medium: Medium, leaving: u32) -> bool {
        let Some(lower) = medium.lower_tier() else {
            return false;
        };
        self.segs
            .iter()
            .flatten()
            .any(|s| s.seg.medium == lower && s.seg.rank != leaving && s.seg.is_allocatable())
    }

    /// The copy into a move's new blob ended: `ok` makes it readable (the object now lives
    /// there too); otherwise, or when the object went meanwhile, the blob is let go.
    pub fn finish_move(&mut self, dst: BlobHandle, ok: bool) {
        let now = self.now_ms();
        let Some(b) = self.blobs.get(dst.id as usize).filter(|b| b.tag == dst.tag) else {
            return;
        };
        let obj = b.obj;
        if ok && obj != NIL && b.state == BlobState::Allocated {
            self.blobs[dst.id as usize].pins -= 1;
            self.make_readable(dst.id, now);
            return;
        }
        if obj != NIL {
            self.detach_blob(dst.id, now);
        }
        self.unpin(dst);
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{put_at, remote_hbm_store, seg_of, used_on};
    use super::*;

    /// A leaving rank lost while its drain copies an object away: the move's destination was
    /// never written, so the object's last copy is gone with the rank: it is lost (counted,
    /// its floor noted), not kept unreadable until the move fails (found by the cluster
    /// simulation, seed 1410 with two metas).
    #[test]
    fn an_object_whose_move_was_in_flight_is_lost_with_its_rank() {
        let mut s = remote_hbm_store(8 << 20, |_| {});
        put_at(&mut s, "m", 1 << 20, Medium::Dram, 1);
        let seg = seg_of(&s, 1, Medium::Dram);
        let step = s.begin_moves(seg, 8, MediumBytes::default());
        assert_eq!(step.moves.len(), 1, "{step:?}");
        let dst = step.moves[0].to.handle;
        assert_ne!(step.moves[0].to.seg.rank, 1);
        assert!(s.drop_segment(seg), "nothing left on the lost segment");
        assert!(s.find(b"m").is_none(), "no readable copy is left");
        s.check();
        // The copy's end (it failed: its source is gone) changes nothing more.
        s.finish_move(dst, false);
        assert!(s.find(b"m").is_none());
        assert_eq!(used_on(&s, 1, Medium::Dram), 0);
        s.check();
    }
}
