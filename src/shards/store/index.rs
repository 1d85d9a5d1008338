//! The key index and what reads it: lookups, `/query_key`, listing, removal, and
//! `remove_all` (the index dropped whole, the objects freed in slices).

use super::*;

impl Store {
    /// Whether an object belongs to a `remove_all` and only waits to be freed.
    pub(super) fn doomed(&self, obj: u32) -> bool {
        self.purge
            .as_ref()
            .is_some_and(|p| self.objects[obj as usize].generation <= p.cut)
    }

    pub(super) fn hash_key(&self, key: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(key)
    }

    pub(super) fn hash_chunk(&self, chunk: u64) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(chunk)
    }

    pub(super) fn find(&self, key: &[u8]) -> Option<u32> {
        let h = self.hash_key(key);
        self.index
            .find(h, |&id| &*self.objects[id as usize].key == key)
            .copied()
    }

    /// Objects named by a chunk hash: every key that parses to that hash, and the key equal
    /// to the string itself.
    pub fn objects_named(&self, name: &[u8]) -> SmallVec<[u32; 4]> {
        let mut out: SmallVec<[u32; 4]> = SmallVec::new();
        if let Some(c) = keys::parse_hex_hash(name) {
            out.extend(
                self.chunks
                    .iter_hash(self.hash_chunk(c))
                    .copied()
                    .filter(|&id| self.objects[id as usize].chunk == Some(c)),
            );
        }
        if let Some(o) = self.find(name) {
            if !out.contains(&o) {
                out.push(o);
            }
        }
        out
    }

    /// Whether the object is readable: the rank of its first readable copy.
    pub fn exists(&mut self, key: &[u8]) -> Option<u32> {
        let rank = self.find(key).and_then(|o| {
            self.objects[o as usize]
                .blobs
                .iter()
                .map(|&b| &self.blobs[b as usize])
                .find(|b| b.state == BlobState::Readable)
                .map(|b| b.rank)
        });
        let outcome = if rank.is_some() {
            Outcome::Success
        } else {
            Outcome::NotFound
        };
        self.stats.record(Op::ExistKey, outcome, rank);
        rank
    }

    /// The object as `/query_key` shows it (counted as a query).
    pub fn query(&mut self, key: &[u8]) -> Option<QueryInfo> {
        let now = self.now_ms();
        let Some(obj) = self.find(key) else {
            self.stats.record(Op::Query, Outcome::NotFound, None);
            return None;
        };
        let o = &self.objects[obj as usize];
        let blobs: Vec<BlobInfo> = o
            .blobs
            .iter()
            .map(|&b| {
                let b = &self.blobs[b as usize];
                BlobInfo {
                    rank: b.rank,
                    medium: b.medium,
                    gva: self.seg(b.seg).seg.gva(b.offset),
                    state: b.state as u8,
                    lease_ttl_ms: b.lease_until_ms.saturating_sub(now),
                }
            })
            .collect();
        let rank = blobs.first().map(|b| b.rank);
        self.stats.record(Op::Query, Outcome::Success, rank);
        Some(QueryInfo {
            size: o.size,
            prot: o.prot,
            valid: self.object_readable(obj),
            blobs,
        })
    }

    /// Removes an object. A leased or pinned copy stays allocated until its lease and pins
    /// end; the key is gone at once.
    pub fn remove(&mut self, key: &[u8]) -> bool {
        let now = self.now_ms();
        match self.find(key) {
            Some(obj) => {
                let rank = self.objects[obj as usize]
                    .blobs
                    .first()
                    .map(|&b| self.blobs[b as usize].rank);
                self.remove_object(obj, now);
                self.stats.record(Op::Remove, Outcome::Success, rank);
                true
            }
            None => {
                // A copy of it may still be on a rank that is down (lost with it): when that
                // rank comes back with its catalog, this delete keeps it away.
                self.tombstones.note(crate::cluster::catalog::key_hash(key));
                self.stats.record(Op::Remove, Outcome::NotFound, None);
                false
            }
        }
    }

    /// Removes every object of this shard; returns how many. The keys are gone from the
    /// index when it returns (the index is dropped whole, in O(1)); the objects and their
    /// bytes are freed in slices: one here, the rest by `continue_purge` (the shard's purge
    /// task, allocations, the housekeeping tick), so no request waits long behind a million
    /// keys. Capacity figures fall as the slices free the bytes. No per-object removal event
    /// is published: the caller publishes one `Cleared` for the whole remove_all.
    pub fn remove_all(&mut self) -> u64 {
        let now = self.now_ms();
        let n = self.object_count() as u64;
        // Every catalog handed over later predates this: refused whole (tombstones.rs).
        self.tombstones.cut_all();
        // Writers at work are revoked now (bounded by the grants outstanding): their objects
        // are not readable, so this publishes nothing.
        let writing: Vec<u32> = self.uncommitted.keys().copied().collect();
        for obj in writing {
            self.remove_object(obj, now);
        }
        self.stats.stored_keys.add(-(self.readable_objects as i64));
        self.readable_objects = 0;
        // Before the objects are doomed (they journal no removal then).
        self.journal_clear();
        // Entries are plain ids: dropping the tables frees two allocations, nothing per key.
        self.index = HashTable::new();
        self.chunks = HashTable::new();
        self.purge = Some(Purge {
            cut: self.next_tag,
            cursor: 0,
            left: self.objects.len(),
        });
        self.continue_purge();
        n
    }

    /// Frees one slice of the objects of a `remove_all`; true while more remain.
    pub fn continue_purge(&mut self) -> bool {
        let now = self.now_ms();
        let (mut freed, mut skipped) = (0, 0);
        while let Some(p) = &mut self.purge {
            if p.left == 0 {
                self.purge = None;
                break;
            }
            if freed >= PURGE_SLICE_OBJECTS || skipped >= PURGE_SLICE_SKIPS {
                return true;
            }
            let (i, cut) = (p.cursor, p.cut);
            debug_assert!((i as usize) < self.objects.capacity(), "purge lost objects");
            p.cursor += 1;
            match self.objects.get(i as usize) {
                Some(o) if o.generation <= cut => {
                    self.remove_object(i, now);
                    freed += 1;
                }
                _ => skipped += 1,
            }
        }
        false
    }

    /// Whether a `remove_all` still has objects to free.
    pub fn purging(&self) -> bool {
        self.purge.is_some()
    }

    /// Appends readable keys (one per line) from slot `cursor` on, until about `max_bytes`
    /// are written or `limit` keys; returns the slot to continue from.
    pub fn list_keys(
        &self,
        cursor: u32,
        max_bytes: usize,
        prefix: &[u8],
        limit: &mut u64,
        out: &mut Vec<u8>,
    ) -> Option<u32> {
        let cap = self.objects.capacity() as u32;
        // Generations start at 2: with no purge under way, every object is newer than 0.
        let cut = self.purge.as_ref().map_or(0, |p| p.cut);
        let mut i = cursor;
        while i < cap {
            if out.len() >= max_bytes || *limit == 0 {
                return Some(i);
            }
            if let Some(o) = self.objects.get(i as usize) {
                if o.generation > cut && o.key.starts_with(prefix) && self.object_readable(i) {
                    out.extend_from_slice(&o.key);
                    out.push(b'\n');
                    *limit -= 1;
                }
            }
            i += 1;
        }
        None
    }
}
