//! Moving objects off a remote rank that leaves gracefully: the store picks the objects whose
//! only copy is on the leaving segment and allocates each a new blob on another rank; the
//! caller (the HTTP layer, which can reach the leaving local service) copies the bytes and
//! reports back. Like a flush, the new blob is ALLOCATED and pinned while it is written, so
//! nothing reads or frees it; the old copy stays readable until the segment is dropped.

use super::*;
use segment::SegmentStatus;

/// One object to move: its key, where its bytes are now and where they go.
#[derive(Debug)]
pub struct Move {
    pub key: Box<[u8]>,
    pub from: BlobView,
    pub to: BlobView,
    /// The object's stamp (its new blob's catalog entry on a local service).
    pub stamp: crate::shards::catalog::Stamp,
}

impl Store {
    /// Up to `max` objects of this shard whose only readable copy is on `seg`, each with a
    /// new blob allocated on another rank (same medium, else the memory tier below; DRAM for
    /// an SSD copy; remote ranks allowed). Objects with a move in flight or with no room anywhere are skipped,
    /// so calling again until it returns nothing terminates.
    pub fn begin_moves(&mut self, seg: SegmentId, max: usize) -> Vec<Move> {
        let now = self.now_ms();
        let candidates: Vec<(u32, u32)> = self
            .blobs
            .iter()
            .filter(|(_, b)| b.seg == seg && b.obj != NIL && b.state == BlobState::Readable)
            .map(|(i, b)| (i as u32, b.obj))
            .collect();
        let mut out = Vec::new();
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
        out
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
