//! Store tests of what a full store's eviction costs the shard: demotions left to the mover
//! thread (`shards/mover.rs`: a watermark drain's move between memories is a job, the blob
//! read where it was until it lands; a forced eviction's is copied at once), and the pages of
//! the runs it empties (kept at or above the low watermark).

use super::testing::TestStore;
use super::tests::{media_of, put_at};
use super::*;

/// `key` is moving from HBM to DRAM (its DRAM blob allocated for the copy) and is read from
/// HBM meanwhile.
pub(super) fn moving_down_and_read_from_hbm(s: &mut Store, key: &str) {
    assert_eq!(
        media_of(s, key),
        [
            (Medium::Hbm, BlobState::Readable),
            (Medium::Dram, BlobState::Allocated)
        ]
    );
    let GetStep::Ready(v) = s.get(key.as_bytes()) else {
        panic!("{key} readable while it moves");
    };
    assert_eq!(v.seg.medium, Medium::Hbm);
    s.unpin(v.handle);
}

/// The source, destination and `drop_on_failure` of the one job, a demotion.
pub(super) fn the_one_demotion(jobs: &[IoJob]) -> (&BlobView, &BlobView, bool) {
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let IoJob::Demote {
        src_view,
        dst_view,
        drop_on_failure,
        ..
    } = &jobs[0]
    else {
        panic!("{:?}", jobs[0]);
    };
    (src_view, dst_view, *drop_on_failure)
}

#[test]
fn a_drain_s_demotion_between_memories_is_a_job_and_a_forced_one_is_copied_at_once() {
    // The shards' setting: a watermark drain's HBM → DRAM move goes to the mover thread as
    // a job; the blob is read from HBM until it lands.
    let mut s = TestStore::new()
        .segment(0, Medium::Hbm, 4 << 20)
        .segment(0, Medium::Dram, 16 << 20)
        .config(|c| c.lease_ms = 0)
        .build();
    s.set_move_off_shard(true);
    for i in 0..4 {
        put_at(&mut s, &format!("h{i}"), 1 << 20, Medium::Hbm, 0);
    }
    let jobs = s.take_jobs();
    let (src_view, dst_view, drop_on_failure) = the_one_demotion(&jobs);
    assert_eq!(src_view.seg.medium, Medium::Hbm);
    assert_eq!(dst_view.seg.medium, Medium::Dram);
    assert!(!drop_on_failure);
    moving_down_and_read_from_hbm(&mut s, "h0");
    assert_eq!(s.stats.demoted_blobs.get(), 0);
    s.check();
    s.finish_demote(&jobs[0], true);
    assert_eq!(media_of(&s, "h0"), [(Medium::Dram, BlobState::Readable)]);
    assert_eq!(s.stats.demoted_blobs.get(), 1);
    s.check();

    // Thresholds at the top: the drain starts only when the allocation finds the tier full;
    // its moves do not free the room before they land, so the allocation forces the eviction
    // of the next blob, whose move is copied at once: the room is free when the put goes on.
    let mut s = TestStore::new()
        .segment(0, Medium::Hbm, 4 << 20)
        .segment(0, Medium::Dram, 16 << 20)
        .config(|c| {
            c.lease_ms = 0;
            c.high_percent = 100;
            c.low_percent = 99;
        })
        .build();
    s.set_move_off_shard(true);
    for i in 0..5 {
        put_at(&mut s, &format!("h{i}"), 1 << 20, Medium::Hbm, 0);
    }
    let jobs = s.take_jobs();
    assert!(!jobs.is_empty());
    let moving = [
        (Medium::Hbm, BlobState::Readable),
        (Medium::Dram, BlobState::Allocated),
    ];
    let copied_now = [(Medium::Dram, BlobState::Readable)];
    let states: Vec<_> = (0..5).map(|i| media_of(&s, &format!("h{i}"))).collect();
    assert_eq!(
        states.iter().filter(|m| m[..] == moving).count(),
        jobs.len(),
        "{states:?}"
    );
    assert_eq!(
        states.iter().filter(|m| m[..] == copied_now).count(),
        1,
        "{states:?}"
    );
    assert_eq!(s.stats.demoted_blobs.get(), 1);
    s.check();
    for job in &jobs {
        s.finish_demote(job, true);
    }
    let in_dram = (0..5).filter(|i| media_of(&s, &format!("h{i}"))[..] == copied_now);
    assert_eq!(in_dram.count(), jobs.len() + 1);
    s.check();
}

/// Bytes of DRAM segment pages resident now (`mincore`).
fn dram_resident(s: &Store) -> u64 {
    let seg = s
        .segs
        .iter()
        .flatten()
        .find(|ss| ss.seg.medium == Medium::Dram)
        .expect("a DRAM segment");
    let region = seg.seg.backend.host_region().expect("host memory");
    region.resident_bytes(0, seg.seg.capacity).expect("mincore")
}

/// 16 MiB of DRAM in 1 MiB runs, one shard: two empty runs stay with the shard (its spares),
/// the others go back to the pool. Watermarks 80 / 70 %: pages are kept down to one drain's
/// width below the low one, 60 %. Twelve objects of 1 MiB, written.
fn twelve_written_objects() -> Store {
    let mut s = TestStore::new()
        .dram(16 << 20)
        .config(|c| {
            c.lease_ms = 0;
            c.high_percent = 80;
            c.low_percent = 70;
        })
        .build();
    for i in 0..12 {
        let step = s.alloc(
            format!("k{i}").into_bytes().into(),
            1 << 20,
            Placement::on(Some(Medium::Dram), 1),
        );
        let AllocStep::Granted { obj, blobs, .. } = step else {
            panic!("{step:?}");
        };
        let region = blobs[0].seg.backend.host_region().expect("host memory");
        // SAFETY: the blob was just allocated for this write.
        unsafe { region.write(blobs[0].offset, &vec![i as u8 + 1; 1 << 20]) }.expect("write");
        assert!(s.commit(obj, true));
    }
    assert_eq!(dram_resident(&s), 12 << 20);
    s
}

#[test]
fn runs_emptied_near_the_low_watermark_keep_their_pages() {
    let mut s = twelve_written_objects();
    // Removed while the segment is that full (75, 69 and 62 %): the third emptied run goes
    // back to the pool with its pages (eviction keeps a full segment between the watermarks,
    // so the next blobs take the room again at once).
    for i in 0..3 {
        assert!(s.remove(format!("k{i}").as_bytes()));
    }
    assert_eq!(dram_resident(&s), 12 << 20, "no page handed back");
    // Below 60 %: the emptied runs' pages go back to the kernel (nine of them).
    for i in 3..12 {
        assert!(s.remove(format!("k{i}").as_bytes()));
    }
    assert_eq!(dram_resident(&s), 3 << 20);
    s.check();
}

#[test]
fn a_prefaulted_segment_keeps_its_pages_however_empty() {
    // `ock.mmc.segment.prefault` commits the segment and marks it so: removals down to an
    // empty segment hand no page back (without the mark the test above keeps 3 MiB).
    let mut s = twelve_written_objects();
    let seg = s
        .segs
        .iter()
        .flatten()
        .find(|ss| ss.seg.medium == Medium::Dram);
    seg.expect("a DRAM segment").seg.keep_pages();
    for i in 0..12 {
        assert!(s.remove(format!("k{i}").as_bytes()));
    }
    assert_eq!(dram_resident(&s), 12 << 20, "no page handed back");
    s.check();
}
