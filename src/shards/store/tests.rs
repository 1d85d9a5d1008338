//! Unit tests of the store.

use super::tests_mover::{moving_down_and_read_from_hbm, the_one_demotion};
use super::*;
use testing::TestStore;

pub(super) fn dram_store(capacity: u64) -> Store {
    TestStore::new().segment(0, Medium::Dram, capacity).build()
}

pub(super) fn put(store: &mut Store, key: &str) {
    let step = store.alloc(
        key.as_bytes().into(),
        100,
        Placement::on(Some(Medium::Dram), 1),
    );
    let AllocStep::Granted { obj, .. } = step else {
        panic!("alloc refused: {step:?}");
    };
    assert!(store.commit(obj, true));
}

fn named(store: &Store, name: &str) -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = store
        .objects_named(name.as_bytes())
        .iter()
        .map(|&o| store.objects[o as usize].key.to_vec())
        .collect();
    keys.sort();
    keys
}

pub(super) fn dram_used(s: &Store) -> u64 {
    s.medium_totals(Medium::Dram).1
}

/// Puts `k<i>` from `*i` on until the next put (of 100 bytes) goes over the high threshold.
fn fill_to_high(s: &mut Store, cap: u64, i: &mut usize) {
    while (dram_used(s) + 100) * 100 <= cap * 90 {
        put(s, &format!("k{i}"));
        *i += 1;
    }
}

#[test]
fn watermark_eviction_drains_in_slices() {
    let cap: u64 = 4 << 20;
    let mut s = dram_store(cap);
    let mut i = 0;
    fill_to_high(&mut s, cap, &mut i);
    assert_eq!(
        s.objects.len(),
        i,
        "nothing evicted under the high threshold"
    );
    assert_eq!(s.stats.evict_running.get(), 0);
    // The put that crosses it starts a drain and evicts one slice, the oldest first.
    put(&mut s, &format!("k{i}"));
    i += 1;
    assert_eq!(s.objects.len(), i - EVICT_SLICE_BLOBS);
    assert!(s.find(b"k0").is_none());
    assert!(
        s.find(format!("k{}", EVICT_SLICE_BLOBS).as_bytes())
            .is_some()
    );
    assert!(s.draining[Medium::Dram as usize]);
    assert_eq!(s.stats.evict_running.get(), 1);
    assert!(dram_used(&s) * 100 > cap * 80);
    s.check();
    // Housekeeping ticks finish the drain without any further allocation.
    let mut ticks = 0;
    while s.draining[Medium::Dram as usize] {
        assert!(ticks < 10, "the drain did not end");
        s.tick();
        ticks += 1;
    }
    assert!(ticks >= 2, "one slice per tick, {ticks} ticks");
    assert!(dram_used(&s) * 100 <= cap * 80);
    assert!(
        dram_used(&s) * 100 > cap * 79,
        "evicted past the low threshold"
    );
    assert_eq!(s.stats.evict_running.get(), 0);
    s.check();

    // Allocations during a drain carry it on too, each by one slice.
    fill_to_high(&mut s, cap, &mut i);
    let mut puts = 0;
    loop {
        put(&mut s, &format!("k{i}"));
        i += 1;
        puts += 1;
        if !s.draining[Medium::Dram as usize] {
            break;
        }
        assert!(puts < 10, "the drain did not end");
    }
    assert!(puts >= 2, "{puts} puts");
    assert!(dram_used(&s) * 100 <= cap * 80 + 4096 * 100);
    assert_eq!(s.stats.evict_running.get(), 0);
    assert!(s.find(format!("k{}", i - 1).as_bytes()).is_some());
    s.check();
}

fn grant(s: &mut Store, key: &str, size: u64) -> (ObjHandle, Arc<WriterLink>) {
    match s.alloc(
        key.as_bytes().into(),
        size,
        Placement::on(Some(Medium::Dram), 1),
    ) {
        AllocStep::Granted { obj, link, .. } => (obj, link),
        step => panic!("alloc refused: {step:?}"),
    }
}

#[test]
fn a_removed_put_keeps_its_blob_until_the_writer_lets_go_then_frees_it() {
    let mut s = dram_store(16 << 20);
    for remove_all in [false, true] {
        let (obj, link) = grant(&mut s, "w", 1 << 20);
        assert_eq!(dram_used(&s), 1 << 20);
        if remove_all {
            assert_eq!(s.remove_all(), 1);
        } else {
            assert!(s.remove(b"w"));
        }
        s.check();
        assert!(link.is_revoked(), "the writer is told to stop");
        // The writer may still be writing: its blob is neither freed nor reusable.
        assert_eq!(dram_used(&s), 1 << 20);
        s.tick();
        assert_eq!(dram_used(&s), 1 << 20);
        let (other, _) = grant(&mut s, "other", 1 << 20);
        assert_eq!(dram_used(&s), 2 << 20, "the new object got other memory");
        assert!(s.commit(other, true));
        assert!(s.remove(b"other"));
        // The writer's commit (or abort) ends its grant: now the blob goes.
        assert!(!s.commit(obj, true));
        s.check();
        assert_eq!(dram_used(&s), 0, "remove_all={remove_all}");
        assert!(s.orphaned.is_empty());
    }
}

#[test]
fn remove_all_drops_the_keys_at_once_and_frees_in_slices() {
    let n = 3 * PURGE_SLICE_OBJECTS + 7;
    let mut s = dram_store(64 << 20);
    for i in 0..n {
        put(&mut s, &format!("k{i}"));
    }
    let GetStep::Ready(leased) = s.get(b"k5") else {
        panic!("k5 readable");
    };
    let (writer, link) = grant(&mut s, "w", 100);
    assert_eq!(s.stats.stored_keys.get(), n as i64);
    assert_eq!(s.remove_all(), n as u64 + 1);
    s.check();
    assert!(link.is_revoked());
    // Gone from every lookup at once; one slice freed.
    assert_eq!(s.object_count(), 0);
    assert_eq!(s.stats.stored_keys.get(), 0);
    assert!(s.find(b"k1").is_none() && s.exists(b"k2").is_none());
    let mut out = Vec::new();
    assert_eq!(
        s.list_keys(0, 1 << 20, b"", &mut u64::MAX.clone(), &mut out),
        None
    );
    assert!(out.is_empty());
    assert!(s.purging());
    assert!(s.objects.len() < n && s.objects.len() > n - 2 * PURGE_SLICE_OBJECTS);
    // New puts meanwhile are live, and carry the purge on.
    put(&mut s, "k1");
    s.check();
    let mut slices = 0;
    while s.continue_purge() {
        s.check();
        slices += 1;
        assert!(slices < 10);
    }
    s.check();
    assert_eq!(s.object_count(), 1);
    assert_eq!(s.stats.stored_keys.get(), 1);
    assert!(s.find(b"k1").is_some());
    // The leased read and the writer still hold their blobs; then let go.
    assert_eq!(dram_used(&s), 3 * 4096);
    s.unpin(leased.handle);
    assert!(!s.commit(writer, true));
    s.check();
    assert!(s.remove(b"k1"));
    s.lease_expire_all();
    s.tick();
    s.check();
    assert_eq!(dram_used(&s), 0);
    assert!(!s.purging());
}

#[test]
fn a_leased_copy_is_neither_evicted_by_name_nor_moved_by_unmount() {
    let mut s = dram_store(16 << 20);
    let seg1 = mount::build_segment(&s.table, 1, Medium::Dram, 32 << 20, None, 1, 1 << 20)
        .expect("a second DRAM segment");
    s.table.insert(seg1.clone()).expect("mounted");
    put(&mut s, "k");
    put(&mut s, "named");
    let GetStep::Ready(v) = s.get(b"k") else {
        panic!("k readable")
    };
    assert_eq!(v.seg.id, seg1.id, "on the segment with the most room");
    s.unpin(v.handle);
    let GetStep::Ready(n) = s.get(b"named") else {
        panic!("named readable")
    };
    s.unpin(n.handle);
    // Leased: evict_named everywhere leaves it.
    assert_eq!(s.evict_named(b"named", None), 0);
    assert!(s.exists(b"named").is_some());
    s.check();
    // Unmount waits for the lease, which it leaves as it was.
    seg1.set_status(segment::SegmentStatus::Unmounting);
    let lease = s.blobs[v.handle.id as usize].lease_until_ms;
    assert!(!s.evacuate(seg1.id), "a leased blob stays where it is");
    assert!(s.blob_by_handle(v.handle).is_some());
    assert_eq!(s.blobs[v.handle.id as usize].lease_until_ms, lease);
    s.check();
    s.lease_expire_all();
    assert!(s.evacuate(seg1.id));
    assert_eq!(s.exists(b"k"), Some(0), "moved to rank 0");
    assert_eq!(s.evict_named(b"named", None), 1);
    assert!(s.exists(b"named").is_none());
    s.table.remove(&seg1.name);
    s.forget_segment(seg1.id);
    drop((v, n));
    s.check();
    assert_eq!(
        Arc::strong_count(&seg1),
        1,
        "the store let go of the segment"
    );
}

#[test]
fn reclaim_revokes_an_idle_writer_and_spares_one_making_progress() {
    let mut s = dram_store(16 << 20);
    s.cfg.alloc_timeout_ms = 20;
    let (busy, busy_link) = grant(&mut s, "busy", 8192);
    let (idle, idle_link) = grant(&mut s, "idle", 8192);
    for _ in 0..6 {
        std::thread::sleep(std::time::Duration::from_millis(10));
        busy_link.wrote(100);
        s.tick();
    }
    s.check();
    assert!(!busy_link.is_revoked());
    assert!(idle_link.is_revoked(), "no progress for the timeout");
    assert!(s.find(b"idle").is_none());
    assert_eq!(
        dram_used(&s),
        2 * 8192,
        "the idle writer's blob waits for it"
    );
    // Its abort releases the blob; the busy writer commits as usual.
    assert!(!s.commit(idle, false));
    assert_eq!(dram_used(&s), 8192);
    assert!(s.commit(busy, true));
    assert!(s.exists(b"busy").is_some());
    s.check();
}

#[test]
fn chunk_index_finds_every_object_of_a_chunk() {
    let mut s = dram_store(16 << 20);
    for k in ["m@2@0@a1@bf16", "m@2@1@a1@bf16", "m@2@0@b2@bf16", "a1"] {
        put(&mut s, k);
    }
    s.check();
    let a1: Vec<Vec<u8>> = ["a1", "m@2@0@a1@bf16", "m@2@1@a1@bf16"]
        .iter()
        .map(|k| k.as_bytes().to_vec())
        .collect();
    assert_eq!(named(&s, "0xa1"), a1[1..]);
    assert_eq!(
        named(&s, "a1"),
        a1,
        "the chunk's objects and the key itself"
    );
    assert_eq!(named(&s, "b2"), [b"m@2@0@b2@bf16".to_vec()]);
    assert!(s.remove(b"m@2@0@a1@bf16"));
    s.check();
    assert_eq!(named(&s, "0xa1"), [b"m@2@1@a1@bf16".to_vec()]);
    assert!(s.remove(b"m@2@1@a1@bf16"));
    assert!(named(&s, "0xa1").is_empty());
    s.check();
}

/// A committed put of `size` bytes on DRAM, preferring `rank`; the rank it landed on.
pub(super) fn put_on(s: &mut Store, key: &str, size: u64, rank: u32) -> u32 {
    put_at(s, key, size, Medium::Dram, rank)
}

/// A committed put of `size` bytes on `medium`, preferring `rank`; the rank it landed on.
pub(super) fn put_at(s: &mut Store, key: &str, size: u64, medium: Medium, rank: u32) -> u32 {
    let placement = Placement {
        prefer_rank: Some(rank),
        ..Placement::on(Some(medium), 1)
    };
    let step = s.alloc(key.as_bytes().into(), size, placement);
    let AllocStep::Granted { obj, blobs, .. } = step else {
        panic!("alloc refused: {step:?}");
    };
    let landed = blobs[0].seg.rank;
    assert!(s.commit(obj, true));
    landed
}

#[test]
fn a_remote_ranks_dram_goes_down_to_its_own_ssd_and_is_rewarmed_there() {
    let dir = std::env::temp_dir().join(format!("mmc-store-remote-ssd-{}", std::process::id()));
    let mut s = TestStore::new()
        .ssd_dir(dir.to_str().unwrap())
        .segment(0, Medium::Ssd, 16 << 20)
        .remote_segment(1, Medium::Dram, 4 << 20)
        .remote_segment(1, Medium::Ssd, 16 << 20)
        .remote_segment(2, Medium::Ssd, 16 << 20)
        .config(|c| c.lease_ms = 0)
        .build();
    for i in 0..4 {
        assert_eq!(put_on(&mut s, &format!("r{i}"), 1 << 20, 1), 1);
    }
    // The fourth put crossed the high watermark: the oldest blob is flushed, and only to
    // rank 1's own SSD (its local service copies it), never to this process's or rank 2's.
    let jobs = s.take_jobs();
    assert!(!jobs.is_empty(), "a flush was started");
    for job in &jobs {
        let IoJob::Flush {
            src_view, dst_view, ..
        } = job
        else {
            panic!("{job:?}");
        };
        assert_eq!((src_view.seg.rank, src_view.seg.medium), (1, Medium::Dram));
        assert_eq!((dst_view.seg.rank, dst_view.seg.medium), (1, Medium::Ssd));
        assert!(dst_view.seg.backend.remote().is_some());
    }
    // The flush lands with the checksum the local service answered: the SSD copy replaces
    // the DRAM one and carries it.
    let IoJob::Flush {
        dst_view: flushed, ..
    } = &jobs[0]
    else {
        unreachable!()
    };
    let flushed_offset = flushed.offset;
    for job in &jobs {
        s.finish_flush(job, true, 0xC0FFEE, 10);
    }
    let obj = s.find(b"r0").unwrap();
    let media: Vec<Medium> = s.objects[obj as usize]
        .blobs
        .iter()
        .map(|&b| s.blobs[b as usize].medium)
        .collect();
    assert_eq!(media, [Medium::Ssd]);
    // A read rewarms it into rank 1's DRAM, checked against that checksum there.
    let GetStep::Rewarm(job) = s.get(b"r0") else {
        panic!("a read of an SSD-only object rewarms it");
    };
    let IoJob::Rewarm {
        src_view,
        dst_view,
        sum,
        ..
    } = &job
    else {
        panic!("{job:?}");
    };
    assert_eq!(*sum, 0xC0FFEE);
    assert_eq!(src_view.offset, flushed_offset);
    assert_eq!((dst_view.seg.rank, dst_view.seg.medium), (1, Medium::Dram));
    // Damaged on the remote SSD: the copy and the object are dropped.
    s.finish_rewarm(&job, IoOutcome::Damaged, 10);
    assert!(s.find(b"r0").is_none());
    s.check();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn this_processs_dram_never_goes_down_to_a_remote_ssd() {
    let mut s = TestStore::new()
        .segment(0, Medium::Dram, 4 << 20)
        .remote_segment(1, Medium::Ssd, 16 << 20)
        .config(|c| c.lease_ms = 0)
        .build();
    for i in 0..6 {
        assert_eq!(put_on(&mut s, &format!("l{i}"), 1 << 20, 0), 0);
    }
    // No SSD of its own: eviction deletes, no flush goes to another host's file.
    assert!(s.take_jobs().is_empty());
    assert!(s.find(b"l0").is_none());
    assert!(s.find(b"l5").is_some());
    s.check();
}

/// The media of `key`'s copies (readable or being written), in blob order.
pub(super) fn media_of(s: &Store, key: &str) -> Vec<(Medium, BlobState)> {
    let Some(obj) = s.find(key.as_bytes()) else {
        return Vec::new();
    };
    s.objects[obj as usize]
        .blobs
        .iter()
        .map(|&b| (s.blobs[b as usize].medium, s.blobs[b as usize].state))
        .collect()
}

/// The id of `rank`'s segment of `medium`.
pub(super) fn seg_of(s: &Store, rank: u32, medium: Medium) -> SegmentId {
    s.segs
        .iter()
        .flatten()
        .find(|ss| ss.seg.rank == rank && ss.seg.medium == medium)
        .map(|ss| ss.seg.id)
        .expect("a segment of that rank and medium")
}

pub(super) fn used_on(s: &Store, rank: u32, medium: Medium) -> u64 {
    s.segs
        .iter()
        .flatten()
        .find(|ss| ss.seg.rank == rank && ss.seg.medium == medium)
        .map(|ss| ss.used())
        .unwrap()
}

/// A remote rank's HBM, rank 1's DRAM and rank 2's DRAM, and this process's DRAM.
pub(super) fn remote_hbm_store(rank1_dram: u64, f: impl FnOnce(&mut StoreConfig)) -> Store {
    TestStore::new()
        .segment(0, Medium::Dram, 16 << 20)
        .remote_segment(1, Medium::Hbm, 4 << 20)
        .remote_segment(1, Medium::Dram, rank1_dram)
        .remote_segment(2, Medium::Dram, 16 << 20)
        .config(f)
        .build()
}

#[test]
fn a_remote_ranks_hbm_goes_down_to_its_own_dram_through_a_demotion_job() {
    let mut s = remote_hbm_store(8 << 20, |c| c.lease_ms = 60_000);
    for i in 0..3 {
        assert_eq!(put_at(&mut s, &format!("h{i}"), 1 << 20, Medium::Hbm, 1), 1);
    }
    // h0 is read (leased): eviction must not move it.
    let GetStep::Ready(v) = s.get(b"h0") else {
        panic!("h0 readable");
    };
    s.unpin(v.handle);
    let mut events = Vec::new();
    s.swap_events(&mut events);
    events.clear();
    assert_eq!(put_at(&mut s, "h3", 1 << 20, Medium::Hbm, 1), 1);
    // The fourth put crossed the high watermark: the least recently used unleased blob (h1)
    // is demoted, and only to rank 1's own DRAM (its local service copies it), never to this
    // process's DRAM or rank 2's.
    let jobs = s.take_jobs();
    let (src_view, dst_view, drop_on_failure) = the_one_demotion(&jobs);
    assert_eq!((src_view.seg.rank, src_view.seg.medium), (1, Medium::Hbm));
    assert_eq!((dst_view.seg.rank, dst_view.seg.medium), (1, Medium::Dram));
    assert!(dst_view.seg.backend.remote().is_some());
    assert_eq!(dst_view.len, 1 << 20);
    assert!(
        !drop_on_failure,
        "a watermark eviction keeps the copy on failure"
    );
    assert_eq!(media_of(&s, "h0"), [(Medium::Hbm, BlobState::Readable)]);
    // Until the copy lands the object is read from HBM; no flush is counted for it.
    moving_down_and_read_from_hbm(&mut s, "h1");
    assert_eq!(s.stats.flush_in_flight_bytes.get(), 0);
    s.check();
    // The copy landed: the DRAM copy replaces the HBM one, counted as a demotion here is.
    s.finish_demote(&jobs[0], true);
    assert_eq!(media_of(&s, "h1"), [(Medium::Dram, BlobState::Readable)]);
    assert_eq!(s.stats.demoted_blobs.get(), 1);
    assert_eq!(s.stats.tier_by_rank[1].evict.get(), 1);
    assert_eq!(s.stats.tier.flush_blobs.get(), 0);
    assert_eq!(used_on(&s, 0, Medium::Dram), 0);
    assert_eq!(used_on(&s, 2, Medium::Dram), 0);
    assert_eq!(used_on(&s, 1, Medium::Dram), 1 << 20);
    s.swap_events(&mut events);
    let moved: Vec<&Event> = events
        .iter()
        .filter(|e| {
            !matches!(
                e,
                Event::Read { .. }
                    | Event::Stored {
                        medium: Medium::Hbm,
                        ..
                    }
            )
        })
        .collect();
    assert!(
        matches!(
            moved[..],
            [
                Event::Evicted {
                    medium: Medium::Hbm,
                    ..
                },
                Event::Stored {
                    medium: Medium::Dram,
                    ..
                },
                Event::Removed {
                    medium: Medium::Hbm,
                    ..
                }
            ]
        ),
        "{moved:?}"
    );
    // The rank's local service learns that its DRAM copy landed before the HBM one went.
    let freed = s.take_freed_remote();
    let f: Vec<(u32, Medium, bool)> = freed
        .iter()
        .map(|(r, _, f, _)| (*r, f.medium, f.landed))
        .collect();
    assert_eq!(f, [(1, Medium::Dram, true), (1, Medium::Hbm, false)]);
    s.check();
}

#[test]
fn a_failed_remote_demotion_keeps_the_hbm_copy_unless_the_room_was_needed() {
    // Watermark eviction: the copy stays where it was.
    let mut s = remote_hbm_store(8 << 20, |c| c.lease_ms = 0);
    for i in 0..4 {
        put_at(&mut s, &format!("h{i}"), 1 << 20, Medium::Hbm, 1);
    }
    let jobs = s.take_jobs();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    s.finish_demote(&jobs[0], false);
    assert_eq!(media_of(&s, "h0"), [(Medium::Hbm, BlobState::Readable)]);
    assert_eq!(used_on(&s, 1, Medium::Dram), 0);
    assert_eq!(s.stats.demoted_blobs.get(), 0);
    s.check();

    // Full: the allocation that found no room forces the eviction (after the watermark's,
    // which moved some first) and waits for the demotions; a failed forced one drops its
    // copy (the object with it), as eviction with nowhere to go does.
    let mut s = remote_hbm_store(8 << 20, |c| {
        c.lease_ms = 0;
        c.high_percent = 100;
        c.low_percent = 99;
    });
    for i in 0..4 {
        put_at(&mut s, &format!("h{i}"), 1 << 20, Medium::Hbm, 1);
    }
    assert!(s.take_jobs().is_empty());
    let placement = Placement {
        prefer_rank: Some(1),
        ..Placement::on(Some(Medium::Hbm), 1)
    };
    let step = s.alloc(b"h4"[..].into(), 1 << 20, placement);
    assert!(matches!(step, AllocStep::WaitForFlush), "{step:?}");
    let jobs = s.take_jobs();
    let forced = jobs
        .iter()
        .filter(|j| {
            matches!(
                j,
                IoJob::Demote {
                    drop_on_failure: true,
                    ..
                }
            )
        })
        .count();
    assert!(forced >= 1, "{jobs:?}");
    for job in &jobs {
        s.finish_demote(job, false);
    }
    let left = (0..4).filter(|i| s.find(format!("h{i}").as_bytes()).is_some());
    assert_eq!(left.count(), 4 - forced, "the forced ones were dropped");
    assert_eq!(s.stats.evicted_objects_deleted.get(), forced as u64);
    assert_eq!(s.stats.demoted_blobs.get(), 0);
    assert_eq!(put_at(&mut s, "h4", 1 << 20, Medium::Hbm, 1), 1);
    s.check();
}

#[test]
fn a_remote_hbm_blob_is_dropped_when_its_ranks_dram_has_no_room() {
    // Rank 1's DRAM holds one blob, read (leased) so its eviction cannot make room.
    let mut s = remote_hbm_store(1 << 20, |c| c.lease_ms = 60_000);
    put_at(&mut s, "d", 1 << 20, Medium::Dram, 1);
    let GetStep::Ready(v) = s.get(b"d") else {
        panic!("d readable");
    };
    s.unpin(v.handle);
    for i in 0..4 {
        put_at(&mut s, &format!("h{i}"), 1 << 20, Medium::Hbm, 1);
    }
    // Nothing moves to another rank's DRAM or this process's: the copy is dropped.
    assert!(s.take_jobs().is_empty());
    assert!(s.find(b"h0").is_none());
    assert!(s.find(b"h3").is_some());
    assert!(s.find(b"d").is_some());
    assert_eq!(s.stats.demoted_blobs.get(), 0);
    assert!(s.stats.evicted_objects_deleted.get() >= 1);
    assert_eq!(used_on(&s, 0, Medium::Dram), 0);
    assert_eq!(used_on(&s, 2, Medium::Dram), 0);
    s.check();
}

#[test]
fn a_lost_ranks_leased_blobs_do_not_hold_its_segment_back() {
    let mut s = remote_hbm_store(8 << 20, |c| c.lease_ms = 60_000);
    put_at(&mut s, "kept", 1 << 20, Medium::Dram, 1);
    put_at(&mut s, "removed", 1 << 20, Medium::Dram, 1);
    for key in [&b"kept"[..], b"removed"] {
        let GetStep::Ready(v) = s.get(key) else {
            panic!("readable");
        };
        s.unpin(v.handle);
    }
    // A leased zombie (removed while read) and a leased live blob.
    assert!(s.remove(b"removed"));
    let seg = seg_of(&s, 1, Medium::Dram);
    assert!(s.drop_segment(seg), "nothing left on the lost segment");
    assert!(s.find(b"kept").is_none());
    assert_eq!(used_on(&s, 1, Medium::Dram), 0);
    s.check();
}

#[test]
fn a_lost_ranks_copy_of_a_put_still_being_written_does_not_hold_its_segment_back() {
    // A replicated put whose writer has not committed yet: one copy on rank 1, one elsewhere.
    let mut s = remote_hbm_store(8 << 20, |_| {});
    let placement = Placement {
        prefer_rank: Some(1),
        ..Placement::on(Some(Medium::Dram), 2)
    };
    let AllocStep::Granted { obj, blobs, .. } = s.alloc(b"w".as_slice().into(), 1 << 20, placement)
    else {
        panic!("alloc refused");
    };
    let ranks: Vec<u32> = blobs.iter().map(|b| b.seg.rank).collect();
    assert!(
        ranks.len() == 2 && ranks[0] == 1 && ranks[1] != 1,
        "{ranks:?}"
    );
    let seg = blobs.iter().find(|b| b.seg.rank == 1).unwrap().seg.id;
    // Rank 1 is lost: its copy's bytes are gone, so the writer's hold on it ends there (its
    // commit, if it comes, only concerns the copies still attached).
    assert!(s.drop_segment(seg), "nothing left on the lost segment");
    assert_eq!(used_on(&s, 1, Medium::Dram), 0);
    s.check();
    assert!(s.commit(obj, true));
    assert!(s.find(b"w").is_some());
    s.check();
}

/// 4 MiB of DRAM on each remote rank of `ranks`, remote writers writing for 5 s after their
/// allocation; the clock at 1 s.
fn remote_dram_store(ranks: &[u32], f: impl FnOnce(&mut StoreConfig)) -> Store {
    let mut b = TestStore::new();
    for &r in ranks {
        b = b.remote_segment(r, Medium::Dram, 4 << 20);
    }
    let mut s = b
        .config(|c| {
            c.remote_writer_ms = 5_000;
            f(c)
        })
        .build();
    s.set_manual_clock(1_000);
    s
}

/// Allocates `key` (256 KiB, `replicas` copies on remote ranks): its handle and its first
/// blob's offset.
fn remote_grant(s: &mut Store, key: &str, replicas: u8) -> (ObjHandle, u64) {
    let step = s.alloc(
        key.as_bytes().into(),
        256 << 10,
        Placement::on(None, replicas),
    );
    let AllocStep::Granted { obj, blobs, .. } = step else {
        panic!("alloc refused: {step:?}");
    };
    assert!(blobs.iter().all(|b| b.seg.backend.remote().is_some()));
    (obj, blobs[0].offset)
}

/// `ms` pass, then a tick.
fn tick_after(s: &mut Store, ms: u64) {
    s.advance_clock(ms);
    s.tick();
    s.check();
}

#[test]
fn a_remote_put_removed_before_its_commit_keeps_its_range_until_its_grants_are_over() {
    let mut s = remote_dram_store(&[1], |_| {});
    let (obj, offset) = remote_grant(&mut s, "a", 1);
    s.advance_clock(1_000);
    assert!(s.remove(b"a"));
    s.check();
    // Its local service may still write there (the grant, the clocks' skew, a body in
    // flight): no other object gets the range, and a tick does not free it.
    for _ in 0..3 {
        let (other, at) = remote_grant(&mut s, "other", 1);
        assert_ne!(at, offset, "the removed put's range went to another object");
        assert!(s.commit(other, true));
        assert!(s.remove(b"other"));
        tick_after(&mut s, 1_000);
        assert_eq!(used_on(&s, 1, Medium::Dram), 256 << 10);
    }
    // 5 s after the allocation, no commit having come, the tick frees it: nothing leaks.
    for (ms, left) in [(999, 256 << 10), (1, 0)] {
        tick_after(&mut s, ms);
        assert_eq!(used_on(&s, 1, Medium::Dram), left);
    }
    assert!(s.orphaned.is_empty());
    // A commit arriving after all: the object is gone, nothing is freed twice.
    assert!(!s.commit(obj, true));
    s.check();
    // An abort before the deadline ends the hold at once.
    let (obj, _) = remote_grant(&mut s, "b", 1);
    assert!(s.remove(b"b"));
    assert!(!s.commit(obj, false));
    assert_eq!(used_on(&s, 1, Medium::Dram), 0);
    s.check();
}

#[test]
fn a_reclaimed_remote_put_keeps_its_range_until_its_grants_are_over() {
    // Reclaimed after 1 s without a commit, well before its writers' time is over.
    let mut s = remote_dram_store(&[1], |c| c.alloc_timeout_ms = 1_000);
    let (obj, offset) = remote_grant(&mut s, "idle", 1);
    tick_after(&mut s, 1_001);
    assert!(s.find(b"idle").is_none(), "reclaimed");
    let (other, at) = remote_grant(&mut s, "other", 1);
    assert_ne!(at, offset);
    assert!(s.commit(other, true));
    for (ms, left) in [(3_998, 2 * (256 << 10)), (1, 256 << 10)] {
        tick_after(&mut s, ms);
        assert_eq!(used_on(&s, 1, Medium::Dram), left);
    }
    assert!(!s.commit(obj, false));
    s.check();
}

#[test]
fn an_abort_or_commit_repeated_after_the_commit_changes_nothing() {
    let mut s = dram_store(16 << 20);
    let (obj, _) = grant(&mut s, "acked", 8192);
    assert!(s.commit(obj, true));
    for ok in [false, true, false] {
        assert!(s.commit(obj, ok));
        assert!(s.exists(b"acked").is_some(), "an acknowledged put stays");
        s.check();
    }
}

#[test]
fn an_aborted_remote_chain_keeps_its_blobs_until_the_writers_deadline() {
    let mut s = remote_dram_store(&[1, 2], |_| {});
    let (obj, _) = remote_grant(&mut s, "c", 2);
    // The first hop aborts: the key goes at once (a retry may put it again), the blobs when
    // no hop can write any more.
    assert!(s.commit(obj, false));
    assert!(s.find(b"c").is_none());
    s.check();
    let used = |s: &Store| used_on(s, 1, Medium::Dram) + used_on(s, 2, Medium::Dram);
    for (ms, left) in [(4_999, 2 * (256 << 10)), (1, 0)] {
        tick_after(&mut s, ms);
        assert_eq!(used(&s), left);
    }
}
