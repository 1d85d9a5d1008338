//! The SSD tier across restarts, on the store's side: the records this shard journals for its
//! journaled SSD files (`ssd/journal.rs`), indexing the blobs a start recovered from them, and
//! reading those blobs back once to check their bytes.
//!
//! What is journaled, and when:
//! - `Add` when a flush lands (`finish_flush` makes its SSD blob readable), with the checksum
//!   of the bytes the flush wrote. The bytes are written before the record is emitted, so a
//!   record never names a range whose write had not returned.
//! - `Remove` when a readable blob of such a file leaves its object (`detach_blob`: a removal,
//!   an eviction, a damaged copy dropped, an unmount's evacuation), before its range can be
//!   freed and given to another blob: the record is emitted first, the range reused only
//!   later (and the replay drops an entry that a later `Add` overlaps anyway).
//! - `Clear` when the shard runs a `remove_all` (its doomed objects then emit nothing).
//!
//! Records wait in `journal_out` (in order) until [`Store::push_journal`] moves them into the
//! journals' bounded queue; a full queue leaves them there for the next pass. A removal is
//! answered once its record is on file (`Journals::settled`, awaited by the HTTP handler).

use super::ssd::journal::Record;
use super::ssd::journaling::{Item, Journals};
use super::*;
use crate::cluster::catalog::Entry;

/// What a shard did with its share of a file's recovered blobs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Indexed {
    pub blobs: u64,
    pub bytes: u64,
    /// Entries refused (their range taken, their key known already).
    pub refused: u64,
}

/// A recovered blob to read back: its handle, where its bytes are, their checksum.
pub struct ToVerify {
    pub handle: BlobHandle,
    pub view: BlobView,
    pub sum: u64,
}

impl Store {
    /// The journal of the file blob `blob` is on, if that file keeps one.
    fn journal_of(&self, blob: u32) -> Option<(Arc<Journals>, u32)> {
        let b = &self.blobs[blob as usize];
        if b.medium != Medium::Ssd {
            return None;
        }
        let link = self.seg(b.seg).seg.backend.file()?.journal()?;
        Some((link.journals.clone(), link.file))
    }

    fn emit(&mut self, journals: Arc<Journals>, file: u32, rec: Record) {
        self.journal_seq += 1;
        let slot = self.shard as u16;
        journals.note_emitted(slot, self.journal_seq);
        self.journal_out.push_back(Item {
            file,
            slot,
            seq: self.journal_seq,
            rec,
        });
        if self.journals.is_none() {
            self.journals = Some(journals);
        }
    }

    /// A flush landed: blob `blob` (readable now, its checksum set) is journaled.
    pub(super) fn journal_add(&mut self, blob: u32) {
        let Some((journals, file)) = self.journal_of(blob) else {
            return;
        };
        let b = &self.blobs[blob as usize];
        let o = &self.objects[b.obj as usize];
        let entry = Entry {
            key: o.key.clone(),
            medium: Medium::Ssd,
            offset: b.offset,
            len: b.len,
            size: o.size,
            stamp: o.stamp,
            sum: b.sum,
        };
        let shard = self.shard as u16;
        self.emit(journals, file, Record::Add { shard, entry });
    }

    /// Readable blob `blob` leaves object `obj` (called before it is detached): its removal
    /// is journaled, unless its object is doomed by a `remove_all` (whose `Clear` covers it).
    pub(super) fn journal_remove(&mut self, blob: u32, obj: u32) {
        if self.blobs[blob as usize].state != BlobState::Readable || self.doomed(obj) {
            return;
        }
        let Some((journals, file)) = self.journal_of(blob) else {
            return;
        };
        let rec = Record::Remove {
            shard: self.shard as u16,
            offset: self.blobs[blob as usize].offset,
            stamp: self.objects[obj as usize].stamp,
        };
        self.emit(journals, file, rec);
    }

    /// A `remove_all`: every journaled file learns that this shard's entries are gone.
    pub(super) fn journal_clear(&mut self) {
        let files: SmallVec<[(Arc<Journals>, u32); 2]> = self
            .segs
            .iter()
            .flatten()
            .filter_map(|s| s.seg.backend.file()?.journal())
            .map(|l| (l.journals.clone(), l.file))
            .collect();
        for (journals, file) in files {
            let shard = self.shard as u16;
            self.emit(journals, file, Record::Clear { shard });
        }
    }

    /// Whether records wait to be handed to the journals (one length check).
    pub fn has_journal_out(&self) -> bool {
        !self.journal_out.is_empty()
    }

    /// Hands the waiting records to the journals' queue, in order, as far as it has room,
    /// and wakes their thread.
    pub fn push_journal(&mut self) {
        let Some(journals) = self.journals.clone() else {
            return;
        };
        let mut pushed = false;
        while let Some(item) = self.journal_out.pop_front() {
            match journals.try_push(item) {
                Ok(()) => pushed = true,
                Err(item) => {
                    self.journal_out.push_front(item);
                    break;
                }
            }
        }
        if pushed || !self.journal_out.is_empty() {
            journals.wake();
        }
    }

    /// Indexes blobs a start recovered from SSD segment `seg`'s journal (this shard's share):
    /// each becomes a committed object whose one copy is that readable SSD blob, at exactly
    /// its range (claimed from the segment's pool as a run of this shard), with its checksum
    /// and stamp, and its `Stored` event (a KV `BlockStored` on the SSD medium). Each is
    /// queued to be read back once ([`Store::next_verify`]). An entry whose range is not free
    /// or whose key is known already is refused (counted).
    pub fn recover(&mut self, seg: SegmentId, entries: Vec<Entry>) -> Indexed {
        let now = self.now_ms();
        self.refresh_segments();
        let mut done = Indexed::default();
        for e in entries {
            if self.recover_one(seg, &e, now) {
                done.blobs += 1;
                done.bytes += e.size;
            } else {
                done.refused += 1;
            }
        }
        if let Some(Some(ss)) = self.segs.get(seg as usize)
            && let Some(f) = ss.seg.backend.file()
        {
            let s = &f.shard_stats()[self.shard];
            s.recovered.add(done.blobs);
            s.recovered_bytes.add(done.bytes);
            s.recover_refused.add(done.refused);
            s.verify_pending.add(done.blobs as i64);
        }
        done
    }

    fn recover_one(&mut self, seg: SegmentId, e: &Entry, now: u64) -> bool {
        if self.find(&e.key).is_some() {
            return false;
        }
        let Some(Some(ss)) = self.segs.get_mut(seg as usize) else {
            return false;
        };
        if ss.seg.medium != Medium::Ssd || !ss.adopt(e.offset, e.len) {
            return false;
        }
        let (obj, _, _) = self.insert_object(e.key.clone(), e.size, 0, 1, now, None);
        self.uncommitted.remove(&obj);
        self.objects[obj as usize].stamp = e.stamp;
        let id = self.insert_blob(obj, seg, e.offset, e.len, BlobState::Allocated, now);
        let b = &mut self.blobs[id as usize];
        b.sum = e.sum;
        b.unverified = true;
        self.make_readable(id, now);
        let h = self.handle(id);
        self.verify.push_back(h);
        true
    }

    /// Whether recovered blobs wait to be read back.
    pub fn verify_pending(&self) -> bool {
        !self.verify.is_empty()
    }

    /// The next recovered blob to read back, pinned for the read (release it with
    /// [`Store::finish_verify`]); blobs gone meanwhile are skipped.
    pub fn next_verify(&mut self) -> Option<ToVerify> {
        while let Some(h) = self.verify.pop_front() {
            let Some(b) = self.blob_by_handle(h) else {
                continue;
            };
            let (obj, seg) = (b.obj, b.seg);
            if obj == NIL || b.state != BlobState::Readable || !b.unverified {
                self.verify_done(seg);
                continue;
            }
            let size = self.objects[obj as usize].size;
            self.blobs[h.id as usize].pins += 1;
            return Some(ToVerify {
                handle: h,
                view: self.view(h.id, size),
                sum: self.blobs[h.id as usize].sum,
            });
        }
        None
    }

    /// One pending verification ended (read, or its blob gone).
    fn verify_done(&mut self, seg: SegmentId) {
        if let Some(f) = self.seg(seg).seg.backend.file() {
            f.shard_stats()[self.shard].verify_pending.add(-1);
        }
    }

    /// A recovered blob was read back: its bytes matched (`Done`: it is verified), did not
    /// (`Damaged`: dropped, counted as a recovery loss), or could not be read (`Failed`: kept,
    /// unverified; every read of it is checked all the same).
    pub fn finish_verify(&mut self, h: BlobHandle, outcome: IoOutcome) {
        let Some(b) = self.blob_by_handle(h) else {
            return;
        };
        let seg = b.seg;
        self.verify_done(seg);
        match outcome {
            IoOutcome::Done => {
                self.blobs[h.id as usize].unverified = false;
                if let Some(f) = self.seg(seg).seg.backend.file() {
                    f.shard_stats()[self.shard].verified.inc();
                }
            }
            IoOutcome::Damaged => self.drop_damaged(h),
            IoOutcome::Failed => {}
        }
        self.unpin(h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::catalog::Stamp;
    use crate::shards::store::ssd::journal;
    use crate::shards::store::testing::TestStore;

    const MB: u64 = 1 << 20;

    fn entry(key: &str, offset: u64, size: u64) -> Entry {
        Entry {
            key: key.as_bytes().into(),
            medium: Medium::Ssd,
            offset,
            len: size.div_ceil(segment::PAGE_BYTES) * segment::PAGE_BYTES,
            size,
            stamp: Stamp { view: 0, seq: 3 },
            sum: 11,
        }
    }

    /// Recovered entries become readable SSD objects at their ranges, counted as stored keys,
    /// each with its `Stored` event; a taken range or a known key is refused; reads rewarm
    /// them; verification drops a damaged one.
    #[test]
    fn recovered_blobs_are_indexed_at_their_ranges_and_verified() {
        let dir = std::env::temp_dir().join(format!("mmc-store-recover-{}", std::process::id()));
        let mut s = TestStore::new()
            .ssd_dir(dir.to_str().unwrap())
            .segment(0, Medium::Ssd, 64 * MB)
            .dram(16 * MB)
            .build();
        let seg = s.mounted(0, Medium::Ssd).unwrap().id;
        let mut ev = Vec::new();
        s.swap_events(&mut ev);
        let got = s.recover(
            seg,
            vec![
                entry("a", 0, 5000),
                entry("b", 8192, 100_000),
                entry("a", 1 << 20, 10),
                entry("overlaps-b", 12288, 10),
            ],
        );
        assert_eq!(
            got,
            Indexed {
                blobs: 2,
                bytes: 105_000,
                refused: 2
            }
        );
        s.check();
        assert_eq!(s.stats.stored_keys.get(), 2);
        assert_eq!(s.medium_totals(Medium::Ssd).1, 8192 + 102_400);
        let mut ev = Vec::new();
        s.swap_events(&mut ev);
        let stored: Vec<Medium> = ev
            .iter()
            .filter_map(|e| match e {
                Event::Stored { medium, .. } => Some(*medium),
                _ => None,
            })
            .collect();
        assert_eq!(stored, [Medium::Ssd, Medium::Ssd]);
        let q = s.query(b"b").unwrap();
        assert_eq!(q.blobs[0].medium, Medium::Ssd);
        assert_eq!(q.blobs[0].gva & ((1 << 40) - 1), 8192);
        // Recovery itself journals nothing (the snapshot lists the blobs already).
        assert!(!s.has_journal_out());
        // Verification: a reads back fine, b is damaged and dropped with its key.
        let a = s.next_verify().unwrap();
        assert_eq!((a.view.offset, a.view.len, a.sum), (0, 5000, 11));
        s.finish_verify(a.handle, IoOutcome::Done);
        let b = s.next_verify().unwrap();
        s.finish_verify(b.handle, IoOutcome::Damaged);
        assert!(s.next_verify().is_none());
        assert!(s.find(b"b").is_none());
        assert!(s.find(b"a").is_some());
        s.check();
        s.lease_expire_all();
        s.tick();
        assert_eq!(s.medium_totals(Medium::Ssd).1, 8192);
        // A read of a rewarms it into DRAM, checked against its checksum.
        match s.get(b"a") {
            GetStep::Rewarm(IoJob::Rewarm { sum, .. }) => assert_eq!(sum, 11),
            other => panic!("{other:?}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// With a journaled SSD file, flushes that land, removals, evictions and a `remove_all`
    /// emit the records that, replayed, give exactly the blobs the store holds on SSD.
    #[test]
    fn the_records_a_store_emits_replay_to_what_it_holds_on_ssd() {
        let dir = std::env::temp_dir().join(format!("mmc-store-journal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let journals = Journals::new(2);
        let mut s = TestStore::new()
            .dram(4 * MB)
            .journaled_ssd(&dir, 64 * MB, &journals)
            .build();
        let mut held = journal::Replayed::default();
        let replay_out = |s: &mut Store, held: &mut journal::Replayed| {
            for it in std::mem::take(&mut s.journal_out) {
                held.apply(it.rec);
            }
        };
        let ssd_keys = |s: &Store| {
            let mut k: Vec<(Vec<u8>, u64)> = s
                .blobs
                .iter()
                .filter(|(_, b)| {
                    b.medium == Medium::Ssd && b.state == BlobState::Readable && b.obj != NIL
                })
                .map(|(_, b)| (s.objects[b.obj as usize].key.to_vec(), b.offset))
                .collect();
            k.sort();
            k
        };
        for round in 0..3 {
            for i in 0..40 {
                let key = format!("r{round}-k{i}");
                let step = s.alloc(
                    key.into_bytes().into(),
                    300_000,
                    Placement::on(Some(Medium::Dram), 1),
                );
                let AllocStep::Granted { obj, .. } = step else {
                    // DRAM waits for a flush: land them all.
                    for job in s.take_jobs() {
                        s.finish_flush(&job, true, 5, 1);
                    }
                    continue;
                };
                assert!(s.commit(obj, true));
                for job in s.take_jobs() {
                    s.finish_flush(&job, true, 5, 1);
                }
                if i % 7 == 0 {
                    s.remove(format!("r{round}-k{}", i / 2).as_bytes());
                }
                replay_out(&mut s, &mut held);
                let mut want = ssd_keys(&s);
                let mut got: Vec<(Vec<u8>, u64)> = held
                    .entries
                    .values()
                    .map(|l| (l.entry.key.to_vec(), l.entry.offset))
                    .collect();
                got.sort();
                want.sort();
                assert_eq!(got, want, "round {round} step {i}");
            }
            s.check();
        }
        assert!(!held.entries.is_empty());
        s.remove_all();
        replay_out(&mut s, &mut held);
        assert!(
            held.entries.is_empty(),
            "a remove_all clears the shard's entries"
        );
        journals.stop();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
