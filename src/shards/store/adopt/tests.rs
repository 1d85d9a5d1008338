use super::*;
use crate::cluster::catalog::Catalog;
use crate::shards::store::testing::TestStore;

const MB: u64 = 1 << 20;

fn put(s: &mut Store, key: &str, size: u64, replicas: u8) {
    let step = s.alloc(
        key.as_bytes().into(),
        size,
        Placement::on(Some(Medium::Dram), replicas),
    );
    let AllocStep::Granted { obj, .. } = step else {
        panic!("alloc refused: {step:?}");
    };
    assert!(s.commit(obj, true));
}

fn remote_store(ranks: &[u32]) -> Store {
    let mut t = TestStore::new();
    for &r in ranks {
        t = t.remote_segment(r, Medium::Dram, 16 * MB);
    }
    t.build()
}

/// One heartbeat answer of the meta's log for rank 4, applied to `catalog` unless it is
/// lost on the way.
fn beat_answer(logs: &crate::cluster::catalog::FreedLogs, catalog: &mut Catalog, delivered: bool) {
    use crate::cluster::catalog::{BeatNews, LogAnswer};
    let mark = catalog.mark();
    let LogAnswer::Records { seq, freed } = logs.answer(4, catalog.acked()) else {
        panic!("the log does not overflow here");
    };
    if delivered {
        let news = BeatNews {
            seq,
            freed,
            resync: None,
        };
        catalog.apply(news, mark);
    }
}

fn offered(rank: u32, entries: Vec<Entry>) -> Vec<Adopted> {
    entries
        .into_iter()
        .map(|entry| Adopted { rank, entry })
        .collect()
}

fn stored_events(s: &mut Store) -> usize {
    let mut ev = Vec::new();
    s.swap_events(&mut ev);
    ev.iter()
        .filter(|e| matches!(e, Event::Stored { .. }))
        .count()
}

/// A key this meta removed (a delete answered, an eviction) is not brought back by a
/// catalog handed over later that still lists it; a newer version replacing an older one
/// in the same hand-over leaves no tombstone; after a `remove_all` every catalog is refused.
#[test]
fn a_catalog_does_not_bring_back_what_this_meta_removed() {
    let mut old = remote_store(&[4]);
    old.set_view(7);
    for i in 0..4 {
        put(&mut old, &format!("t{i}"), 1000, 1);
    }
    let entries = old.rank_blobs(4);
    let mut new = remote_store(&[4]);
    new.set_view(9);
    // The new meta adopts t0 from another rank's catalog first, then the client deletes it.
    assert!(new.adopt(offered(4, entries[..1].to_vec())).is_empty());
    assert!(new.remove(b"t0"));
    // This rank's catalog comes late and still lists t0: refused, the rest adopted.
    let refused = new.adopt(offered(4, entries[1..3].to_vec()));
    assert!(refused.is_empty());
    let refused = new.adopt(offered(4, entries[..1].to_vec()));
    assert_eq!(refused.len(), 1, "t0 was deleted here");
    assert!(new.find(b"t0").is_none());
    // A delete of a key this meta does not know (its copy on a rank that is down) keeps
    // that copy away when the rank comes back with it.
    assert!(!new.remove(b"t3"));
    assert_eq!(new.adopt(offered(4, entries[3..].to_vec())).len(), 1);
    // A newer version of t1 replaces the adopted one without a tombstone: the same newer
    // version from a second rank's catalog still merges.
    let mut newer = entries[1].clone();
    newer.stamp.seq += 1000;
    newer.offset += 64 << 10;
    assert!(new.adopt(offered(4, vec![newer.clone()])).is_empty());
    assert_eq!(new.stamp_of(b"t1"), Some(newer.stamp));
    new.check();
    // A remove_all: every catalog handed over later is refused.
    new.remove_all();
    let mut late = entries[2].clone();
    late.key = b"never-seen".as_slice().into();
    assert_eq!(new.adopt(offered(4, vec![late])).len(), 1);
    new.reset_tombstones();
    new.check();
}

/// A put the meta took before a catalog listing the key came, still uncommitted, does not
/// shadow the committed older copy: the copy is adopted and the put's commit fails (the
/// key existed; found by the cluster simulation, seed 7548 with three metas: the put was
/// never written, and the acknowledged older value was lost when its allocation ended).
/// A committed newer version still wins.
#[test]
fn an_uncommitted_put_does_not_shadow_an_adopted_copy() {
    let mut old = remote_store(&[4]);
    old.set_view(7);
    // (Past the ranges the new meta gives its puts: an older copy at the range a newer
    // put was given is refused.)
    put(&mut old, "pad", 4 * MB, 1);
    put(&mut old, "k", 1000, 1);
    put(&mut old, "c", 1000, 1);
    let entries: Vec<Entry> = old
        .rank_blobs(4)
        .into_iter()
        .filter(|e| e.key.as_ref() != b"pad")
        .collect();
    let mut new = remote_store(&[4]);
    new.set_view(9);
    let mut taken = |key: &str| {
        let step = new.alloc(
            key.as_bytes().into(),
            1000,
            Placement::on(Some(Medium::Dram), 1),
        );
        let AllocStep::Granted { obj, .. } = step else {
            panic!("alloc refused: {step:?}");
        };
        obj
    };
    let k = taken("k");
    let c = taken("c");
    assert!(
        new.commit(c, true),
        "c's newer put commits before the catalog"
    );
    let refused = new.adopt(offered(4, entries));
    assert_eq!(refused.len(), 1, "c's older copy is refused");
    assert_eq!(refused[0].entry.key.as_ref(), b"c");
    assert_eq!(new.stamp_of(b"k").unwrap().view, 7, "k's committed copy");
    assert_eq!(new.stamp_of(b"c").unwrap().view, 9);
    assert!(
        !new.commit(k, true),
        "the put that did not know k existed fails"
    );
    let GetStep::Ready(v) = new.get(b"k") else {
        panic!("k not readable");
    };
    new.unpin(v.handle);
    new.check();
}

/// The objects a local service holds after puts and a removal under one leader are the
/// objects a new leader serves once it adopts that service's catalog: same ranges, same
/// used bytes, a `Stored` event each, new puts placed around them.
#[test]
fn a_new_leader_adopts_a_catalog_at_its_ranges() {
    let mut old = remote_store(&[4]);
    old.set_view(7);
    for i in 0..20 {
        put(&mut old, &format!("k{i}"), 1000 + i * 5000, 1);
    }
    old.take_freed_remote();
    assert!(old.remove(b"k3"));
    // The removal is noted for rank 4's freed log, with the object's stamp.
    let freed = old.take_freed_remote();
    assert_eq!(freed.len(), 1);
    assert_eq!(freed[0].0, 4);
    assert_eq!(freed[0].2.stamp.view, 7);
    // The local service's catalog: what it wrote, minus what the log freed.
    let mut catalog = Catalog::default();
    let mut all = old.rank_blobs(4);
    all.push(Entry {
        key: b"k3".as_slice().into(),
        medium: freed[0].2.medium,
        offset: freed[0].2.offset,
        len: 4096,
        size: 1015,
        stamp: freed[0].2.stamp,
        sum: 0,
    });
    for e in all {
        catalog.add(e);
    }
    assert!(catalog.free(&freed[0].2));
    assert_eq!(catalog.len(), 19);
    let used_before = old.medium_totals(Medium::Dram).1;

    let mut new = remote_store(&[4]);
    new.set_view(9);
    stored_events(&mut new);
    let refused = new.adopt(offered(4, catalog.entries()));
    assert!(refused.is_empty(), "{refused:?}");
    new.check();
    assert_eq!(new.medium_totals(Medium::Dram).1, used_before);
    assert_eq!(new.stats.stored_keys.get(), 19);
    assert_eq!(stored_events(&mut new), 19);
    assert!(new.find(b"k3").is_none(), "a removal stays removed");
    for i in (0..20).filter(|&i| i != 3) {
        let key = format!("k{i}");
        let GetStep::Ready(v) = new.get(key.as_bytes()) else {
            panic!("{key} not readable");
        };
        let before = old.find(key.as_bytes()).unwrap();
        let b = old.objects[before as usize].blobs[0];
        assert_eq!(v.offset, old.blobs[b as usize].offset, "{key} at its range");
        assert_eq!(v.len, 1000 + i * 5000);
        new.unpin(v.handle);
        assert_eq!(new.stamp_of(key.as_bytes()).unwrap().view, 7);
    }
    // Adopted blobs carry a fresh lease (reads granted by the old leader).
    let q = new.query(b"k0").unwrap();
    assert!(q.blobs[0].lease_ttl_ms > 0);
    // The same catalog again (a repeated hand-over) changes nothing.
    assert!(new.adopt(offered(4, catalog.entries())).is_empty());
    assert_eq!(new.medium_totals(Medium::Dram).1, used_before);
    // New puts go around the adopted ranges.
    for i in 0..20 {
        put(&mut new, &format!("n{i}"), 30_000, 1);
    }
    new.check();
    assert_eq!(new.stamp_of(b"n0").unwrap().view, 9);
    // Removing an adopted object frees its range and notes it with its old stamp.
    new.take_freed_remote();
    new.lease_expire_all();
    assert!(new.remove(b"k0"));
    let f = new.take_freed_remote();
    assert_eq!(f[0].2.stamp, old.stamp_of(b"k0").unwrap());
    new.check();
}

#[test]
fn conflicts_resolve_to_the_newer_stamp_and_replicas_merge() {
    let e = |key: &str, offset: u64, view: u64, seq: u64| Entry {
        key: key.as_bytes().into(),
        medium: Medium::Dram,
        offset,
        len: 4096,
        size: 10,
        stamp: Stamp { view, seq },
        sum: 0,
    };
    // An overwrite whose old blob's freed record never arrived: both are in the catalog.
    for order in [[0, 1], [1, 0]] {
        let mut s = remote_store(&[4]);
        let versions = [e("k", 0, 5, 10), e("k", 8192, 5, 20)];
        let refused = s.adopt(offered(
            4,
            order.iter().map(|&i| versions[i].clone()).collect(),
        ));
        // The older version is refused, or replaced and noted as freed: either way its
        // local service is told to drop it.
        let dropped: Vec<u64> = refused
            .iter()
            .map(|a| a.entry.stamp.seq)
            .chain(s.take_freed_remote().iter().map(|(_, _, f, _)| f.stamp.seq))
            .collect();
        assert_eq!(dropped, [10]);
        assert_eq!(s.stamp_of(b"k").unwrap().seq, 20);
        // The replaced copy is freed once its fresh lease ends.
        s.lease_expire_all();
        s.tick();
        assert_eq!(
            s.medium_totals(Medium::Dram).1,
            4096,
            "the older range is free"
        );
        s.check();
    }
    // A later leadership wins over a larger generation of an earlier one.
    let mut s = remote_store(&[4, 5]);
    s.adopt(offered(4, vec![e("k", 0, 5, 900)]));
    assert!(s.adopt(offered(5, vec![e("k", 0, 6, 1)])).is_empty());
    assert_eq!(s.stamp_of(b"k").unwrap(), Stamp { view: 6, seq: 1 });
    assert_eq!(s.query(b"k").unwrap().blobs.len(), 1);
    // The same stamp on two ranks: one object with both copies.
    let mut s = remote_store(&[4, 5]);
    assert!(s.adopt(offered(4, vec![e("r", 4096, 5, 3)])).is_empty());
    assert!(s.adopt(offered(5, vec![e("r", 12288, 5, 3)])).is_empty());
    let q = s.query(b"r").unwrap();
    assert_eq!(q.blobs.len(), 2);
    assert_eq!(s.stats.stored_keys.get(), 1);
    // It wants both copies (a lost one is re-replicated); one copy wants one.
    let r = s.find(b"r").unwrap();
    assert_eq!(s.objects[r as usize].replicas, 2);
    s.check();
    // A range already taken, a rank not mounted, a range past the segment: refused.
    let mut s = remote_store(&[4]);
    assert!(s.adopt(offered(4, vec![e("a", 0, 1, 1)])).is_empty());
    assert_eq!(s.adopt(offered(4, vec![e("b", 0, 1, 2)])).len(), 1);
    assert_eq!(s.adopt(offered(6, vec![e("c", 0, 1, 3)])).len(), 1);
    assert_eq!(s.adopt(offered(4, vec![e("d", 16 * MB, 1, 4)])).len(), 1);
    s.check();
}

/// A remote rank's tier moves are handed over too. The catalog names each move's copy by
/// its source entry and hands it over once the meta's log says it landed: a new leader
/// then serves an object demoted to the rank's SSD at its range with its checksum (a read
/// rewarms it checked against it; a damaged copy is still refused), and an object
/// rewarmed into the rank's DRAM as one object with both copies. An SSD copy the meta
/// frees is logged with its medium, and its entry dropped.
#[test]
fn tier_moves_are_handed_over_with_their_checksums() {
    use crate::cluster::catalog::FreedLogs;
    use std::collections::HashMap;
    let build = || {
        TestStore::new()
            .remote_segment(4, Medium::Dram, 4 * MB)
            .remote_segment(4, Medium::Ssd, 16 * MB)
            .config(|c| c.lease_ms = 0)
            .build()
    };
    let mut old = build();
    old.set_view(5);
    let logs = FreedLogs::default();
    // The test stores' remote segments are membership 1's.
    logs.begin(4, 1);
    let mut catalog = Catalog::default();
    // What the local service sees of the meta's log, one heartbeat.
    let beat = |old: &mut Store, catalog: &mut Catalog| {
        logs.push(old.take_freed_remote());
        beat_answer(&logs, catalog, true);
    };
    // The flushes to the rank's own SSD, which its local service makes (and catalogs)
    // before the meta lands them with their checksums.
    fn run_flushes(old: &mut Store, catalog: &mut Catalog, sums: &mut HashMap<u64, u64>) {
        for job in old.take_jobs() {
            let IoJob::Flush {
                src_view, dst_view, ..
            } = &job
            else {
                panic!("{job:?}");
            };
            let sum = 0xC0FFEE + sums.len() as u64;
            assert!(catalog.add_moved(
                src_view.seg.medium,
                src_view.offset,
                src_view.len,
                dst_view.seg.medium,
                dst_view.offset,
                sum
            ));
            // Not handed over before the meta switched its index to it.
            let mut handed_over = catalog.entries().into_iter();
            assert!(handed_over.all(|e| e.offset != dst_view.offset || e.medium != Medium::Ssd));
            old.finish_flush(&job, true, sum, 10);
            sums.insert(dst_view.offset, sum);
        }
    }
    // Puts past the DRAM's watermark.
    let mut sums = HashMap::new();
    for i in 0..8 {
        let key = format!("r{i}");
        put(&mut old, &key, MB - 100 * i, 1);
        let written = old
            .rank_blobs(4)
            .into_iter()
            .find(|e| *e.key == *key.as_bytes());
        catalog.add(written.unwrap());
        run_flushes(&mut old, &mut catalog, &mut sums);
    }
    assert!(sums.len() >= 3, "{} flushes", sums.len());
    beat(&mut old, &mut catalog);
    let on_ssd: Vec<Entry> = catalog
        .entries()
        .into_iter()
        .filter(|e| e.medium == Medium::Ssd)
        .collect();
    assert_eq!(on_ssd.len(), sums.len());
    assert!(on_ssd.iter().all(|e| e.sum == sums[&e.offset]));
    // A read of the first one rewarms it into the rank's DRAM (DRAM and SSD copies).
    let first = String::from_utf8(on_ssd[0].key.to_vec()).unwrap();
    let GetStep::Rewarm(job) = old.get(first.as_bytes()) else {
        panic!("an SSD-only object is rewarmed");
    };
    let IoJob::Rewarm {
        src_view, dst_view, ..
    } = &job
    else {
        panic!("{job:?}");
    };
    assert!(catalog.add_moved(
        Medium::Ssd,
        src_view.offset,
        src_view.len,
        Medium::Dram,
        dst_view.offset,
        0
    ));
    old.finish_rewarm(&job, IoOutcome::Done, 10);
    // (Room for it was made by flushing others.)
    run_flushes(&mut old, &mut catalog, &mut sums);
    // The SSD copy of another object is freed (removed): logged with its medium.
    let removed = on_ssd[1].clone();
    logs.push(old.take_freed_remote());
    assert!(old.remove(&removed.key));
    let f = old.take_freed_remote();
    assert_eq!(f.len(), 1);
    assert_eq!(
        (f[0].0, f[0].2.medium, f[0].2.offset, f[0].2.landed),
        (4, Medium::Ssd, removed.offset, false)
    );
    logs.push(f);
    beat(&mut old, &mut catalog);
    old.check();
    let on_rank: usize = old
        .rank_blobs(4)
        .iter()
        .filter(|e| e.medium != Medium::Hbm)
        .count();
    assert_eq!(
        catalog.entries().len(),
        on_rank,
        "the catalog follows the meta"
    );

    let mut new = build();
    new.set_view(9);
    let refused = new.adopt(offered(4, catalog.entries()));
    assert!(refused.is_empty(), "{refused:?}");
    new.check();
    for m in [Medium::Dram, Medium::Ssd] {
        assert_eq!(new.medium_totals(m).1, old.medium_totals(m).1, "{m:?}");
    }
    assert_eq!(new.object_count(), old.object_count());
    assert!(
        new.find(&removed.key).is_none(),
        "a freed SSD copy stays freed"
    );
    // The rewarmed object: one object, its DRAM and SSD copies on rank 4.
    let q = new.query(first.as_bytes()).unwrap();
    let mut media: Vec<Medium> = q.blobs.iter().map(|b| b.medium).collect();
    media.sort();
    assert_eq!(media, [Medium::Dram, Medium::Ssd]);
    assert_eq!(new.stats.stored_keys.get(), old.stats.stored_keys.get());
    // An SSD-only object: a read rewarms it, checked against the adopted checksum; a
    // damaged copy is refused (dropped with its object).
    for e in &on_ssd[2..] {
        new.lease_expire_all();
        let GetStep::Rewarm(job) = new.get(&e.key) else {
            panic!("an adopted SSD-only object is rewarmed");
        };
        let IoJob::Rewarm { sum, src_view, .. } = &job else {
            panic!("{job:?}");
        };
        assert_eq!((*sum, src_view.offset), (e.sum, e.offset));
        new.finish_rewarm(&job, IoOutcome::Damaged, 10);
        assert!(new.find(&e.key).is_none());
        new.check();
    }
}

/// A seeded run of what a local service sees: puts, deletes and overwrites on the old
/// leader, the catalog kept by the grants' stamps and the freed log's beats (some lost,
/// some late), then a hand-over to a new leader at a random moment. Every object live on
/// the old leader is live on the new one at the same range with the same stamp; only
/// removals not yet delivered can come back; once they are, the hand-over is exact.
#[test]
fn seeded_hand_overs_keep_every_live_object() {
    use crate::cluster::catalog::FreedLogs;
    for seed in 1..=12u64 {
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut old = remote_store(&[4]);
        old.set_view(3);
        let logs = FreedLogs::default();
        logs.begin(4, 1);
        let mut catalog = Catalog::default();
        let steps = 300 + next(300);
        for _ in 0..steps {
            let key = format!("k{}", next(40));
            match next(10) {
                0..=4 => {
                    if old.find(key.as_bytes()).is_some() {
                        // An overwrite: delete, then put again.
                        old.remove(key.as_bytes());
                    }
                    let size = 1 + next(100_000);
                    let step = old.alloc(
                        key.as_bytes().into(),
                        size,
                        Placement::on(Some(Medium::Dram), 1),
                    );
                    let AllocStep::Granted { obj, blobs, .. } = step else {
                        continue;
                    };
                    let stamp = old.stamp_of(key.as_bytes()).unwrap();
                    let e = Entry {
                        key: key.as_bytes().into(),
                        medium: Medium::Dram,
                        offset: blobs[0].offset,
                        len: size.div_ceil(segment::PAGE_BYTES) * segment::PAGE_BYTES,
                        size,
                        stamp,
                        sum: 0,
                    };
                    catalog.add_pending(e);
                    let ok = next(10) != 0;
                    assert!(old.commit(obj, ok));
                    let f = Freed {
                        medium: Medium::Dram,
                        offset: blobs[0].offset,
                        stamp,
                        landed: false,
                    };
                    if ok {
                        catalog.confirm(&f);
                    } else {
                        catalog.free(&f);
                    }
                }
                5..=7 => {
                    old.remove(key.as_bytes());
                }
                _ => {
                    // A heartbeat; one in four answers is lost.
                    beat_answer(&logs, &mut catalog, next(4) != 0);
                }
            }
            logs.push(old.take_freed_remote());
        }
        old.check();
        let live: Vec<(String, Stamp, u64)> = (0..40)
            .map(|i| format!("k{i}"))
            .filter_map(|k| {
                let o = old.find(k.as_bytes())?;
                let b = old.objects[o as usize].blobs[0];
                Some((
                    k,
                    old.objects[o as usize].stamp,
                    old.blobs[b as usize].offset,
                ))
            })
            .collect();
        let hand_over = |catalog: &Catalog| {
            let mut new = remote_store(&[4]);
            new.set_view(8);
            new.adopt(offered(4, catalog.entries()));
            new.check();
            for (k, stamp, offset) in &live {
                let o = new
                    .find(k.as_bytes())
                    .unwrap_or_else(|| panic!("seed {seed}: {k} lost"));
                assert_eq!(new.objects[o as usize].stamp, *stamp, "seed {seed}: {k}");
                let b = new.objects[o as usize].blobs[0];
                assert_eq!(new.blobs[b as usize].offset, *offset, "seed {seed}: {k}");
            }
            new
        };
        hand_over(&catalog);
        // Every removal delivered: the new leader holds exactly the live objects.
        beat_answer(&logs, &mut catalog, true);
        let new = hand_over(&catalog);
        assert_eq!(new.object_count(), live.len(), "seed {seed}");
        assert_eq!(
            new.medium_totals(Medium::Dram).1,
            old.medium_totals(Medium::Dram).1,
            "seed {seed}"
        );
    }
}
