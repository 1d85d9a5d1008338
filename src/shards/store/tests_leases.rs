//! Store tests of what eviction may take: leased zombies and the watermarks (the rejoined-rank
//! defect: deleted objects still under read leases made eviction drop live ones), a lost
//! rank's blobs of puts removed while they were written, and `/memory/evict` with `locations`
//! (one tier down, never a deletion).

use super::testing::TestStore;
use super::tests::{
    dram_store, dram_used, media_of, put, put_at, put_on, remote_hbm_store, used_on,
};
use super::*;

/// A put of `w` (1 MiB of DRAM, `replicas` copies, the first on rank 1) allocated, its writer
/// still at work.
fn writing_on_rank_1(s: &mut Store, replicas: u8) -> (ObjHandle, SmallVec<[BlobView; 2]>) {
    let placement = Placement {
        prefer_rank: Some(1),
        ..Placement::on(Some(Medium::Dram), replicas)
    };
    let AllocStep::Granted { obj, blobs, .. } = s.alloc(b"w".as_slice().into(), 1 << 20, placement)
    else {
        panic!("alloc refused");
    };
    (obj, blobs)
}

#[test]
fn a_lost_ranks_blob_of_a_put_removed_while_written_does_not_hold_its_segment_back() {
    let mut s = remote_hbm_store(8 << 20, |_| {});
    let (obj, blobs) = writing_on_rank_1(&mut s, 1);
    assert_eq!(blobs[0].seg.rank, 1);
    let seg = blobs[0].seg.id;
    // Removed while its writer is at work: the blob waits for the writer's commit or abort,
    // which the lost rank's local service will never send.
    assert!(s.remove(b"w"));
    assert!(s.drop_segment(seg), "nothing left on the lost segment");
    assert_eq!(used_on(&s, 1, Medium::Dram), 0);
    s.check();
    // A commit that still comes finds nothing to release.
    assert!(!s.commit(obj, true));
    s.check();
}

/// Puts `n` objects of `size` bytes (`<prefix><i>`) on rank 0's DRAM, reads each (a lease)
/// and removes it: their blobs stay held by the reads' leases, zombies, until those end.
fn leave_leased_zombies(s: &mut Store, prefix: &str, n: usize, size: u64) {
    for i in 0..n {
        let key = format!("{prefix}{i}");
        put_on(s, &key, size, 0);
        let GetStep::Ready(v) = s.get(key.as_bytes()) else {
            panic!("{key} readable");
        };
        s.unpin(v.handle);
        assert!(s.remove(key.as_bytes()));
    }
}

#[test]
fn bytes_held_by_leases_of_removed_objects_do_not_make_eviction_drop_live_ones() {
    let cap: u64 = 8 << 20;
    let size: u64 = 200 << 10;
    let mut s = dram_store(cap);
    s.set_manual_clock(1_000);
    // 5.5 MiB of removed objects whose reads' leases still run (a churning workload).
    leave_leased_zombies(&mut s, "gone-", 28, size);
    s.check();
    // Live objects take the medium past its high threshold counting those blobs (7.4 of
    // 8 MiB) but hold 2 MiB: the cluster is far below its watermarks by what eviction could
    // drop, and the held bytes come back by themselves within a lease.
    for i in 0..10 {
        put_on(&mut s, &format!("live-{i}"), size, 0);
    }
    for i in 0..10 {
        assert!(
            s.find(format!("live-{i}").as_bytes()).is_some(),
            "live-{i} was evicted"
        );
    }
    assert_eq!(s.stats.evicted_objects_deleted.get(), 0);
    assert!(
        !s.draining[Medium::Dram as usize],
        "no drain below the watermark"
    );
    assert!(dram_used(&s) * 100 > cap * 90, "{} used", dram_used(&s));
    s.check();
    // The segment is full: an allocation waits for those leases to end instead of evicting...
    let step = s.alloc(
        b"big".as_slice().into(),
        1 << 20,
        Placement::on(Some(Medium::Dram), 1),
    );
    let AllocStep::WaitForRoom { in_ms } = step else {
        panic!("expected a wait for room: {step:?}");
    };
    assert_eq!(in_ms, 2_000, "until the first lease ends");
    assert_eq!(s.stats.evicted_objects_deleted.get(), 0);
    assert!(
        s.find(b"big").is_none(),
        "nothing stays allocated meanwhile"
    );
    s.check();
    // ... and takes it once they ended.
    s.advance_clock(in_ms);
    put_on(&mut s, "big", 1 << 20, 0);
    assert_eq!(s.stats.evicted_objects_deleted.get(), 0);
    assert_eq!(s.objects.len(), 11);
    s.check();
    // A caller that cannot wait (or waited long enough) evicts what it needs, as before.
    leave_leased_zombies(&mut s, "again-", 20, size);
    let step = s.alloc_now(
        b"now".as_slice().into(),
        1 << 20,
        Placement::on(Some(Medium::Dram), 1),
    );
    assert!(matches!(step, AllocStep::Granted { .. }), "{step:?}");
    assert!(s.stats.evicted_objects_deleted.get() > 0);
    s.check();
}
/// `/memory/evict` with `locations` moves a copy exactly one tier down, and never deletes: a
/// DRAM object without a tier below stays (issue 27: it was deleted), an HBM object goes to
/// DRAM (not further), and one larger than DRAM stays in HBM.
#[test]
fn evict_with_locations_moves_one_tier_down_and_never_deletes() {
    let mut s = TestStore::new()
        .segment(0, Medium::Hbm, 4 << 20)
        .segment(0, Medium::Dram, 1 << 20)
        .build();
    put(&mut s, "in-dram");
    assert_eq!(s.evict_named(b"in-dram", Some(&[Medium::Dram])), 0);
    assert_eq!(
        media_of(&s, "in-dram"),
        [(Medium::Dram, BlobState::Readable)]
    );
    assert_eq!(s.stats.stored_keys.get(), 1);
    put_at(&mut s, "in-hbm", 4096, Medium::Hbm, 0);
    assert_eq!(s.evict_named(b"in-hbm", Some(&[Medium::Hbm])), 1);
    assert_eq!(
        media_of(&s, "in-hbm"),
        [(Medium::Dram, BlobState::Readable)]
    );
    // Again from HBM: no copy there any more, nothing moves.
    assert_eq!(s.evict_named(b"in-hbm", Some(&[Medium::Hbm])), 0);
    // Without locations: deleted everywhere, as before.
    assert_eq!(s.evict_named(b"in-dram", None), 1);
    assert!(s.find(b"in-dram").is_none());
    s.check();
    // Larger than DRAM: no room one tier down, it stays in HBM.
    put_at(&mut s, "big", 2 << 20, Medium::Hbm, 0);
    assert_eq!(s.evict_named(b"big", Some(&[Medium::Hbm])), 0);
    assert_eq!(media_of(&s, "big"), [(Medium::Hbm, BlobState::Readable)]);
    s.check();
}
