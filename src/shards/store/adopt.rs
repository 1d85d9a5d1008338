//! The catalog hand-over on the store's side (`catalog.rs`): adopting a local service's
//! blobs as committed objects at exactly their ranges, listing a rank's blobs for a resync, and
//! noting the remote blobs this shard detaches for their ranks' freed logs.

use super::*;
#[cfg(test)]
use crate::cluster::catalog::Stamp;
use crate::cluster::catalog::{Adopted, Entry, Freed};

impl Store {
    /// Sets the leadership new objects are stamped with (the shard sets it before an alloc).
    pub fn set_view(&mut self, view: u64) {
        self.stamp_view = view;
    }

    /// The remote blobs detached since the last call, by rank.
    /// A new lineage of objects (this node leads after another leader, whose objects were
    /// purged): the tombstones of earlier removals go.
    pub fn reset_tombstones(&mut self) {
        self.tombstones.reset();
    }

    pub fn take_freed_remote(&mut self) -> Vec<crate::cluster::catalog::Noted> {
        std::mem::take(&mut self.freed_remote)
    }

    /// Whether blobs of remote ranks were detached since the last [`Store::take_freed_remote`]
    /// (one length check per command).
    pub fn has_freed_remote(&self) -> bool {
        !self.freed_remote.is_empty()
    }

    pub(super) fn note_freed_remote(&mut self, blob: u32, obj: u32) {
        self.note_remote(blob, obj, false);
    }

    /// A tier move's destination on a remote rank just became a readable copy (a flush to
    /// the rank's SSD, a rewarm into its DRAM): its local service may hand it over from now
    /// on. Noted before the source's removal, so the log tells them in that order.
    pub(super) fn note_landed_remote(&mut self, blob: u32) {
        let obj = self.blobs[blob as usize].obj;
        if obj != NIL {
            self.note_remote(blob, obj, true);
        }
    }

    fn note_remote(&mut self, blob: u32, obj: u32, landed: bool) {
        if let Some(n) = self.remote_record(blob, obj, landed) {
            self.freed_remote.push(n);
        }
    }

    /// The freed (or landed) record of `blob` of `obj`, when it is on a remote rank.
    pub(super) fn remote_record(
        &self,
        blob: u32,
        obj: u32,
        landed: bool,
    ) -> Option<crate::cluster::catalog::Noted> {
        let b = &self.blobs[blob as usize];
        let Some(Some(ss)) = self.segs.get(b.seg as usize) else {
            return None;
        };
        let epoch = ss.seg.backend.remote().map(|r| r.epoch)?;
        let f = Freed {
            medium: b.medium,
            offset: b.offset,
            stamp: self.objects[obj as usize].stamp,
            landed,
        };
        let key = crate::cluster::catalog::key_hash(&self.objects[obj as usize].key);
        Some((b.rank, epoch, f, key))
    }

    /// Adopts blobs a local service holds as committed, readable objects at exactly their
    /// ranges (a new leader taking over the catalog). Each blob's range is claimed from its
    /// segment as a run of this shard, so used and free bytes are right; the blob gets a fresh
    /// lease (reads granted by the previous leader may still be under way) and the object its
    /// `Stored` event. A key already here with the same stamp gains the copy (an object with
    /// replicas on two ranks); with an older stamp it is replaced, with a newer one the entry
    /// is refused. An SSD entry's blob gets the entry's checksum (its reads are checked
    /// against it, as for a copy this meta flushed); a DRAM and an SSD copy of one object on
    /// one rank (a rewarm) are one object with both copies. Returns the entries refused (their
    /// blobs are not this meta's: the caller logs them as freed so their local services drop
    /// them).
    pub fn adopt(&mut self, mut entries: Vec<Adopted>) -> Vec<Adopted> {
        let now = self.now_ms();
        // Newest first: an older version of a key in the same batch is refused outright
        // instead of adopted and then replaced (which would leave it leased a while).
        entries.sort_by_key(|a| std::cmp::Reverse(a.entry.stamp));
        self.refresh_segments();
        if self.purge.is_some() {
            self.continue_purge();
        }
        let mut refused = Vec::new();
        for a in entries {
            if !self.adopt_one(&a, now) {
                refused.push(a);
            }
        }
        refused
    }

    fn adopt_one(&mut self, a: &Adopted, now: u64) -> bool {
        let e = &a.entry;
        let Some(seg) = self
            .view
            .segments()
            .iter()
            .find(|s| s.rank == a.rank && s.medium == e.medium && s.backend.remote().is_some())
            .map(|s| s.id)
        else {
            return false;
        };
        if e.len == 0 || e.len % segment::PAGE_BYTES != 0 || e.size > e.len {
            return false;
        }
        // Removed here since (its catalog may not know yet), or a newer version lost with its
        // rank (tombstones.rs).
        if self
            .tombstones
            .refuses(crate::cluster::catalog::key_hash(&e.key), e.stamp)
        {
            return false;
        }
        let obj = match self.find(&e.key) {
            Some(obj) => {
                let o = &self.objects[obj as usize];
                // A newer put taken before this catalog came and not committed yet loses to
                // the committed copy: the meta took it not knowing the key existed (a put of
                // an existing key is refused); its commit finds the object gone and fails.
                // (Unless it was given this very range: then the range is its.)
                let newer_uncommitted = e.stamp < o.stamp
                    && self.uncommitted.contains_key(&obj)
                    && !o.blobs.iter().any(|&b| {
                        let b = &self.blobs[b as usize];
                        b.seg == seg && b.offset < e.offset + e.len && e.offset < b.offset + b.len
                    });
                if e.stamp < o.stamp && !newer_uncommitted {
                    return false;
                }
                if e.stamp > o.stamp || newer_uncommitted {
                    self.quiet_removal = true;
                    self.remove_object(obj, now);
                    self.quiet_removal = false;
                    None
                } else {
                    // Copies on this very segment: one on a segment of the rank's previous
                    // membership (still being dropped) is not this one, and goes with that drop.
                    let on_rank = |off: Option<u64>| {
                        o.blobs.iter().any(|&b| {
                            let b = &self.blobs[b as usize];
                            b.seg == seg && off.is_none_or(|x| x == b.offset)
                        })
                    };
                    if on_rank(Some(e.offset)) {
                        // This very copy is known already (a repeated hand-over).
                        return true;
                    }
                    // The same object: one more copy, on another rank or another medium of
                    // this one, of the same size.
                    if on_rank(None) || o.size != e.size || self.uncommitted.contains_key(&obj) {
                        return false;
                    }
                    Some(obj)
                }
            }
            None => None,
        };
        let ss = self.segs[seg as usize]
            .as_mut()
            .expect("a refreshed segment");
        if !ss.adopt(e.offset, e.len) {
            return false;
        }
        let obj = match obj {
            Some(obj) => obj,
            None => {
                let (obj, _, _) = self.insert_object(e.key.clone(), e.size, 0, 1, now, None);
                self.uncommitted.remove(&obj);
                self.objects[obj as usize].stamp = e.stamp;
                // Its copies on other ranks are this version too (tombstones.rs).
                let key_hash = crate::cluster::catalog::key_hash(&e.key);
                self.tombstones.allow(key_hash, e.stamp);
                obj
            }
        };
        let id = self.insert_blob(obj, seg, e.offset, e.len, BlobState::Allocated, now);
        if e.medium == Medium::Ssd {
            self.blobs[id as usize].sum = e.sum;
        }
        self.make_readable(id, now);
        self.blobs[id as usize].lease_until_ms = now + self.cfg.lease_ms;
        // The catalogs do not carry the replica count: an object handed over by several
        // ranks wants as many copies as it has.
        let ranks = self.copy_ranks(obj).min(MAX_REPLICAS) as u8;
        let o = &mut self.objects[obj as usize];
        o.replicas = o.replicas.max(ranks);
        true
    }

    /// Every blob of this shard on `rank`'s remote segments (a resync of its catalog):
    /// readable ones and those being written (a failed commit frees them later, which the
    /// rank's log then says).
    pub fn rank_blobs(&self, rank: u32) -> Vec<Entry> {
        self.blobs
            .iter()
            .filter(|(_, b)| b.rank == rank && b.obj != NIL && !self.doomed(b.obj))
            .filter(|(_, b)| {
                self.segs
                    .get(b.seg as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|s| s.seg.backend.remote().is_some())
            })
            .map(|(_, b)| {
                let o = &self.objects[b.obj as usize];
                Entry {
                    key: o.key.clone(),
                    medium: b.medium,
                    offset: b.offset,
                    len: b.len,
                    size: o.size,
                    stamp: o.stamp,
                    sum: if b.medium == Medium::Ssd { b.sum } else { 0 },
                }
            })
            .collect()
    }

    /// An object's stamp (tests).
    #[cfg(test)]
    pub fn stamp_of(&self, key: &[u8]) -> Option<Stamp> {
        self.find(key).map(|o| self.objects[o as usize].stamp)
    }

    /// Whether `key`'s object has no readable copy but on `segs` (tests).
    #[cfg(test)]
    pub fn readable_only_on(&self, key: &[u8], segs: &[SegmentId]) -> bool {
        self.find(key).is_some_and(|o| {
            !self.objects[o as usize].blobs.iter().any(|&b| {
                let b = &self.blobs[b as usize];
                b.state == BlobState::Readable && !segs.contains(&b.seg)
            })
        })
    }
}

#[cfg(test)]
mod tests;
