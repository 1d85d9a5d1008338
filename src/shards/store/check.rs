//! The store's invariants, checked in full (tests, the simulation, and debug servers
//! under `MMC_DEBUG_CHECK=1`).

use super::*;

impl Store {
    /// Ends every lease now (tests).
    #[cfg(test)]
    pub(super) fn lease_expire_all(&mut self) {
        for (_, b) in self.blobs.iter_mut() {
            b.lease_until_ms = 0;
        }
    }

    /// Checks internal consistency (tests).
    pub fn check(&self) {
        self.check_objects();
        self.check_writers();
        self.check_blobs();
        self.check_rereplication();
    }

    /// Objects against the key and chunk indexes, the purge, and `readable_objects`.
    fn check_objects(&self) {
        let (mut readable, mut doomed, mut chunked) = (0, 0, 0);
        for (i, o) in self.objects.iter() {
            let i = i as u32;
            for &b in &o.blobs {
                assert_eq!(self.blobs[b as usize].obj, i);
            }
            if self.doomed(i) {
                doomed += 1;
                let p = self.purge.as_ref().expect("doomed only under a purge");
                assert!(i >= p.cursor, "doomed object {i} behind the purge cursor");
                assert!(!self.uncommitted.contains_key(&i), "doomed writer {i}");
                continue;
            }
            if self.object_readable(i) {
                readable += 1;
            }
            assert_eq!(self.find(&o.key), Some(i));
            if let Some(c) = o.chunk {
                chunked += 1;
                let h = self.hash_chunk(c);
                assert!(self.chunks.iter_hash(h).any(|&id| id == i));
            }
        }
        assert_eq!(
            doomed,
            self.purge.as_ref().map_or(0, |p| p.left),
            "purge count out of step"
        );
        assert_eq!(self.index.len(), self.objects.len() - doomed);
        assert_eq!(self.chunks.len(), chunked, "chunk index out of step");
        assert_eq!(
            readable, self.readable_objects,
            "readable objects out of step with stored_keys"
        );
        for &o in self.uncommitted.keys() {
            assert!(
                self.objects.contains(o as usize),
                "uncommitted object {o} is gone"
            );
        }
    }

    /// Writer pins against the grants outstanding.
    fn check_writers(&self) {
        // A writer's pin is on exactly the blobs of its grant: those of an object still being
        // written, or orphaned ones (detached) waiting for the writer to let go.
        let mut orphans = 0;
        for held in self.orphaned.values() {
            for &b in &held.blobs {
                let b = &self.blobs[b as usize];
                assert!(
                    b.writing && b.obj == NIL,
                    "orphaned blob not held or attached"
                );
                orphans += 1;
            }
        }
        let mut writing = 0;
        for (i, b) in self.blobs.iter() {
            if b.writing {
                assert!(b.pins >= 1, "blob {i} written without the writer's pin");
                assert!(
                    b.obj == NIL || self.uncommitted.contains_key(&b.obj),
                    "blob {i} held by a writer of a committed object"
                );
                writing += 1;
            }
        }
        let attached_writing = self
            .uncommitted
            .keys()
            .flat_map(|&o| self.objects[o as usize].blobs.iter())
            .filter(|&&b| self.blobs[b as usize].writing)
            .count();
        assert_eq!(
            writing,
            orphans + attached_writing,
            "writer pins out of step"
        );
    }

    /// Capacity, zombies, flushes in flight, blob and object links, LRU membership.
    fn check_blobs(&self) {
        // Capacity accounting: a segment's used bytes are exactly its blobs' (live or zombie),
        // and of them its zombie bytes exactly its zombies' (what the watermark leaves out).
        let mut used = vec![0u64; self.segs.len()];
        let mut zombie = vec![0u64; self.segs.len()];
        for (_, b) in self.blobs.iter() {
            used[b.seg as usize] += b.len;
        }
        for &z in &self.zombies {
            let b = self.blobs.get(z as usize).expect("a zombie was freed");
            zombie[b.seg as usize] += b.len;
        }
        for (id, ss) in self.segs.iter().enumerate() {
            match ss {
                Some(ss) => {
                    assert_eq!(ss.used(), used[id], "used bytes of {}", ss.seg.name);
                    assert_eq!(ss.zombie(), zombie[id], "zombie bytes of {}", ss.seg.name);
                    ss.check();
                }
                None => assert_eq!(used[id], 0, "blobs on a forgotten segment {id}"),
            }
        }
        let mut zombies = self.zombies.clone();
        zombies.sort_unstable();
        zombies.dedup();
        assert_eq!(zombies.len(), self.zombies.len(), "a zombie listed twice");
        for &z in &zombies {
            let b = self.blobs.get(z as usize).expect("a zombie was freed");
            assert_eq!(b.obj, NIL, "zombie {z} is attached");
        }
        let flushing = self.blobs.iter().filter(|(_, b)| b.flushing).count();
        assert_eq!(
            flushing,
            self.flushes_in_flight + self.demotes_in_flight,
            "flushes and demotions out of step"
        );
        for (i, b) in self.blobs.iter() {
            if b.obj == NIL {
                assert!(
                    zombies.binary_search(&(i as u32)).is_ok(),
                    "detached blob {i} is not a zombie"
                );
            } else {
                assert!(
                    self.objects[b.obj as usize].blobs.contains(&(i as u32)),
                    "blob {i} not listed by its object"
                );
            }
            assert_eq!(
                b.lru != NIL,
                b.state == BlobState::Readable,
                "blob {i} lru/state mismatch"
            );
        }
    }
}
