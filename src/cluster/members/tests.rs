use super::*;

type M = Members<()>;

fn segs() -> Vec<(Medium, u64)> {
    vec![(Medium::Dram, 1 << 20)]
}

fn req(
    wanted: Option<u32>,
    url: &str,
    incarnation: u64,
    view: u64,
    now_ms: u64,
) -> JoinRequest<'_> {
    JoinRequest {
        view,
        wanted,
        configured: wanted.is_some(),
        url,
        incarnation,
        segments: segs(),
        catalog_follows: true,
        in_step: 0,
        catalog_since: Membership::default(),
        recovered: false,
        heard_by: 0,
        lineage: crate::cluster::catalog::HA_STAMP_BASE + view,
        first_free: 1,
        now_ms,
    }
}

#[test]
fn ranks_are_assigned_lowest_first_and_kept_by_incarnation() {
    let mut m = M::default();
    let a = m.join(req(None, "http://a", 1, 0, 0)).unwrap();
    let b = m.join(req(None, "http://b", 2, 0, 0)).unwrap();
    assert_eq!((a.rank, b.rank), (1, 2));
    assert_ne!(a.epoch, b.epoch);
    // The same membership again: the same answer, nothing replaced.
    let again = m.join(req(None, "http://a", 1, 0, 0)).unwrap();
    assert_eq!(
        again,
        Joined {
            rank: 1,
            epoch: a.epoch,
            fresh: false,
            continued: false,
            retire: None,
            catalog: CatalogFate::Follows,
            missed: None,
            stale_recovery: false,
        }
    );
    assert!(
        m.join(req(Some(0), "http://c", 3, 0, 0)).is_err(),
        "an embedded rank"
    );
    // A restart of rank 2 (a new incarnation, the same configured rank) replaces it in
    // one step: the old membership's segments are to go.
    let b2 = m.join(req(Some(2), "http://b", 4, 0, 0)).unwrap();
    assert_eq!((b2.rank, b2.fresh, b2.retire), (2, true, Some(b.epoch)));
    assert_eq!(m.heartbeat(0, 2, 2, b.epoch, (), 1), Beat::Refused);
    assert_eq!(
        m.heartbeat(0, 2, 4, b2.epoch, (), 1),
        Beat::First { catalog: true }
    );
    assert_eq!(m.heartbeat(0, 2, 4, b2.epoch, (), 2), Beat::Plain);
}

/// A message of an earlier incarnation or membership changes nothing: not a heartbeat,
/// not a leave (the defect where a SIGTERMed process's late leave drained its restarted
/// successor).
#[test]
fn messages_of_an_old_membership_change_nothing() {
    let mut m = M::default();
    let old = m.join(req(Some(3), "http://a", 10, 0, 0)).unwrap();
    let new = m.join(req(Some(3), "http://a", 11, 0, 5)).unwrap();
    assert!(!m.leave(0, 3, 10, old.epoch), "the old process's leave");
    assert!(
        !m.leave(0, 3, 11, old.epoch),
        "the right process, an old epoch"
    );
    assert!(
        !m.left(3, old.epoch),
        "the old membership's leave finishing late"
    );
    assert!(m.is_current(3, new.epoch));
    assert_eq!(m.heartbeat(0, 3, 10, old.epoch, (), 6), Beat::Refused);
    assert_eq!(m.get(3).unwrap().last_seen_ms, 5);
    assert!(m.leave(0, 3, 11, new.epoch));
    // Leaving: still reporting, so not lost while it drains; a second leave is refused.
    assert_eq!(
        m.heartbeat(0, 3, 11, new.epoch, (), 3000),
        Beat::First { catalog: true }
    );
    assert!(m.expire(3500, 3000).is_empty());
    assert!(!m.leave(0, 3, 11, new.epoch));
    assert!(m.left(3, new.epoch));
    assert!(m.get(3).is_none());
}

/// A meta restarted on the same address hands out epochs above the earlier process's: a
/// heartbeat of the earlier process's membership that reaches the new one (its connection
/// attempt retried past the restart) is refused, not taken as the first heartbeat of the
/// membership the same service was just given there, without its catalog (found by the
/// cluster simulation, seed 28161 with two metas; with both processes' epochs starting at 1
/// it was `Beat::First { catalog: true }` with no catalog in it).
#[test]
fn a_heartbeat_of_an_earlier_meta_process_is_refused_by_the_restarted_one() {
    let t0 = 1_700_000_000_000;
    let mut before = M::with_first_epoch(first_epoch(t0));
    let old = before.join(req(Some(3), "http://a", 10, 0, 0)).unwrap();
    // The meta restarts 2 s later; the same service joins it first.
    let mut after = M::with_first_epoch(first_epoch(t0 + 2000));
    let new = after.join(req(Some(3), "http://a", 10, 0, 0)).unwrap();
    assert!(new.epoch > old.epoch);
    assert_eq!(after.heartbeat(0, 3, 10, old.epoch, (), 10), Beat::Refused);
    assert!(!after.leave(0, 3, 10, old.epoch), "nor its leave");
    assert_eq!(
        after.heartbeat(0, 3, 10, new.epoch, (), 20),
        Beat::First { catalog: true },
        "the catalog still follows, with the membership's own first heartbeat"
    );
    // Epochs keep 53 bits (JSON numbers carry them exactly) until 2090.
    assert!(first_epoch(3_800_000_000_000) < 1 << 53);
}

#[test]
fn a_lost_membership_s_catalog_is_void_when_it_comes_back() {
    let mut m = M::default();
    let a = m.join(req(None, "http://a", 1, 0, 0)).unwrap();
    let b = m.join(req(None, "http://b", 2, 0, 0)).unwrap();
    assert_eq!(
        m.heartbeat(0, b.rank, 2, b.epoch, (), 3500),
        Beat::First { catalog: true }
    );
    assert_eq!(m.expire(3500, 3000), vec![(a.rank, a.epoch)]);
    assert_eq!(m.lost(), vec![a.rank]);
    // Lost once: not reported again; its heartbeats are refused (it must join again).
    assert!(m.expire(3600, 3000).is_empty());
    assert_eq!(m.heartbeat(0, a.rank, 1, a.epoch, (), 3600), Beat::Refused);
    // The same process back (a freeze ended): its old rank, a new membership, and its
    // catalog is to be dropped, not adopted.
    let back = m.join(req(None, "http://a", 1, 0, 3700)).unwrap();
    assert_eq!(
        (back.rank, back.fresh, back.retire, back.catalog),
        (a.rank, true, Some(a.epoch), CatalogFate::Discard)
    );
    assert_eq!(
        m.heartbeat(0, a.rank, 1, back.epoch, (), 3701),
        Beat::First { catalog: false }
    );
    assert!(m.lost().is_empty());
    // A restarted process (another incarnation) after a loss: its catalog follows (what it
    // recovered is judged by the adoption rules).
    m.expire(99_999, 3000);
    let restarted = m.join(req(None, "http://a", 7, 0, 100_000)).unwrap();
    assert_eq!(restarted.catalog, CatalogFate::Follows);
}

/// A loss this meta declared under an earlier leadership of its own voids the catalog
/// when the same process joins it again only through its record in etcd: a leader
/// resuming from a freeze declares every rank lost before it finds its leadership gone,
/// its records refused, and the services hand their catalogs to the next leader, which
/// takes new puts on them (the cluster soak: this meta, winning again, voided them).
#[test]
fn a_loss_of_an_earlier_leadership_voids_a_catalog_only_through_its_record() {
    let mut m = M::default();
    let a = m.join(req(Some(4), "http://a", 41, 3, 0)).unwrap();
    assert_eq!(m.expire(5000, 3000), vec![(4, a.epoch)]);
    // Leadership 9 of this meta: no record loaded, the catalog follows.
    let back = m.join(req(Some(4), "http://a", 41, 9, 6000)).unwrap();
    assert_eq!(back.catalog, CatalogFate::Follows);
    // Recorded (loaded at the election), it is void.
    let mut m = M::default();
    let a = m.join(req(Some(4), "http://a", 41, 3, 0)).unwrap();
    m.expire(5000, 3000);
    m.note_lost([LostMembership {
        rank: 4,
        incarnation: 41,
        membership: Membership {
            view: 3,
            epoch: a.epoch,
        },
    }]);
    let back = m.join(req(Some(4), "http://a", 41, 9, 6000)).unwrap();
    assert_eq!(back.catalog, CatalogFate::Discard);
}

/// A membership an earlier leader declared lost (recorded in etcd) is void on this
/// leader too: the same process is told to drop its catalog; another incarnation is not.
#[test]
fn a_loss_recorded_by_an_earlier_leader_voids_that_process_s_catalog() {
    let mut m = M::default();
    let lost = |rank, incarnation, view, epoch| LostMembership {
        rank,
        incarnation,
        membership: Membership { view, epoch },
    };
    m.note_lost([lost(5, 41, 3, 4), lost(7, 43, 3, 4)]);
    let j = m.join(req(Some(5), "http://a", 41, 9, 0)).unwrap();
    assert_eq!(j.catalog, CatalogFate::Discard);
    let j = m.join(req(Some(6), "http://b", 42, 9, 0)).unwrap();
    assert_eq!(j.catalog, CatalogFate::Follows);
    // The same process, told to drop its catalog when it joined again after the loss
    // (membership 3.12), began a new one: the loss voids none of it (found by the cluster
    // simulation, seed 1988 with two metas: a put acknowledged on the new membership was
    // lost at the next failover). A catalog begun in the lost membership itself is void.
    let since = |view, epoch| JoinRequest {
        catalog_since: Membership { view, epoch },
        ..req(Some(7), "http://c", 43, 9, 0)
    };
    assert_eq!(m.join(since(3, 12)).unwrap().catalog, CatalogFate::Follows);
    let mut m = M::default();
    m.note_lost([lost(7, 43, 3, 4)]);
    assert_eq!(m.join(since(3, 4)).unwrap().catalog, CatalogFate::Discard);
    // A record that names no membership (an older version's) voids every catalog.
    let mut m = M::default();
    m.note_lost([LostMembership {
        membership: Membership::UNKNOWN,
        ..lost(7, 43, 0, 0)
    }]);
    assert_eq!(m.join(since(3, 12)).unwrap().catalog, CatalogFate::Discard);
}

/// A join asked again before any heartbeat followed the first answer (it was lost) gets
/// the first answer's verdict on the catalog again: told "none", the service would keep
/// a void catalog this meta knows nothing of and hand it to the next leader (found by the
/// cluster simulation, seed 1988 with two metas). Once a heartbeat followed, the verdict
/// was carried out and is not repeated.
#[test]
fn a_repeated_join_gets_the_same_verdict_on_its_catalog_until_a_heartbeat() {
    let mut m = M::default();
    m.note_lost([LostMembership {
        rank: 5,
        incarnation: 41,
        membership: Membership { view: 3, epoch: 1 },
    }]);
    let first = m.join(req(Some(5), "http://a", 41, 9, 0)).unwrap();
    assert_eq!(first.catalog, CatalogFate::Discard);
    let again = m.join(req(Some(5), "http://a", 41, 9, 10)).unwrap();
    assert_eq!((again.epoch, again.fresh), (first.epoch, false));
    assert_eq!(again.catalog, CatalogFate::Discard);
    assert_eq!(
        m.heartbeat(9, 5, 41, first.epoch, (), 20),
        Beat::First { catalog: false }
    );
    let after = m.join(req(Some(5), "http://a", 41, 9, 30)).unwrap();
    assert!(after.continued);
    assert_eq!(after.catalog, CatalogFate::None);
}

/// A catalog last in step with a leadership before one that served missed it: that leader
/// may have put a newer version of one of its keys, or deleted it, and is gone with its
/// tombstones, so the catalog is void (found by the cluster simulation: seeds 61 and 136
/// at 1500 steps with two and three metas, 211 at 3000 with three). One in step with the
/// last leadership before this one, or asking this one again, is adopted.
#[test]
fn a_catalog_that_missed_a_leadership_which_served_is_void() {
    let mut m = M::default();
    m.note_served([3, 7, 12]);
    let at = |in_step: u64, rank: u32| JoinRequest {
        in_step,
        ..req(Some(rank), "http://a", u64::from(rank), 12, 0)
    };
    let j = m.join(at(3, 2)).unwrap();
    assert_eq!((j.catalog, j.missed), (CatalogFate::Discard, Some(7)));
    let j = m.join(at(0, 3)).unwrap();
    assert_eq!((j.catalog, j.missed), (CatalogFate::Discard, Some(7)));
    for (in_step, rank) in [(7, 4), (9, 5), (12, 6)] {
        let j = m.join(at(in_step, rank)).unwrap();
        assert_eq!(
            (j.catalog, j.missed),
            (CatalogFate::Follows, None),
            "{in_step}"
        );
    }
    // No catalog, nothing to void.
    let j = m
        .join(JoinRequest {
            catalog_follows: false,
            ..at(0, 8)
        })
        .unwrap();
    assert_eq!((j.catalog, j.missed), (CatalogFate::None, None));
}

/// A catalog recovered from an SSD journal (its process died, this one has not been
/// heard yet) is in step only up to that process's end: the meta lineage that heard it
/// last adopts it (its tombstones refuse what it removed since, deletes it confirmed
/// through the end of the dead membership included), another one, which has none of
/// them, does not: a later leadership, or without HA a restarted meta (found by the
/// cluster simulation with catalogs kept across kills, seeds 13 and 117: a delete the
/// first leader, or the meta's previous process, acknowledged came back from the
/// recovered catalog).
#[test]
fn a_recovered_catalog_is_adopted_only_by_the_lineage_that_heard_it_last() {
    let mut m = M::default();
    let at = |heard_by: u64, lineage: u64, rank: u32| JoinRequest {
        in_step: 12,
        recovered: true,
        heard_by,
        lineage,
        ..req(Some(rank), "http://a", u64::from(rank), 12, 0)
    };
    let j = m.join(at(5, 5, 2)).unwrap();
    assert_eq!((j.catalog, j.stale_recovery), (CatalogFate::Follows, false));
    let j = m.join(at(5, 6, 3)).unwrap();
    assert_eq!((j.catalog, j.stale_recovery), (CatalogFate::Discard, true));
    let j = m.join(at(0, 6, 4)).unwrap();
    assert_eq!(j.catalog, CatalogFate::Discard, "heard by none known");
    // Once heard (a live catalog), the other rules alone apply.
    let j = m
        .join(JoinRequest {
            recovered: false,
            ..at(5, 6, 6)
        })
        .unwrap();
    assert_eq!(j.catalog, CatalogFate::Follows);
}

/// A join repeated before any heartbeat named its membership (the first answer lost, or
/// the request duplicated) is new to the service: the answer does not say the meta
/// continued the service's membership (a service silent past the heartbeat timeout
/// without HA keeps its catalog only on such an answer; found by the cluster simulation,
/// seed 139). Once a heartbeat named it, a repeated join continues it.
#[test]
fn a_repeated_join_continues_a_membership_only_once_a_heartbeat_named_it() {
    let mut m = M::default();
    let a = m.join(req(Some(2), "http://a", 1, 0, 0)).unwrap();
    assert!(a.fresh && !a.continued);
    let again = m.join(req(Some(2), "http://a", 1, 0, 1)).unwrap();
    assert_eq!(
        (again.epoch, again.fresh, again.continued),
        (a.epoch, false, false)
    );
    assert_eq!(
        m.heartbeat(0, 2, 1, a.epoch, (), 2),
        Beat::First { catalog: true }
    );
    let later = m.join(req(Some(2), "http://a", 1, 0, 3)).unwrap();
    assert_eq!(
        (later.epoch, later.fresh, later.continued),
        (a.epoch, false, true)
    );
}

/// A service that joined with its catalog following, heard nothing for the heartbeat timeout
/// and joins again saying it no longer follows (it drops the catalog unless a membership it
/// knew continues) gets a new membership, and the first heartbeat of the old one, with the
/// catalog, adopts nothing when it comes after (cluster simulation, seed 455359). Once a
/// heartbeat named the membership, the same join continues it. And one begun by a join without
/// the catalog, asked again with it, awaits it in a new membership (seed 1072231).
#[test]
fn a_repeated_join_that_changes_whether_the_catalog_follows_begins_a_new_membership() {
    let mut m = M::default();
    let a = m.join(req(Some(1), "http://a", 7, 0, 0)).unwrap();
    assert_eq!(a.catalog, CatalogFate::Follows);
    let mut gave_up = req(Some(1), "http://a", 7, 0, 2000);
    gave_up.catalog_follows = false;
    let b = m.join(gave_up.clone()).unwrap();
    assert!(b.fresh && !b.continued && b.epoch != a.epoch);
    assert_eq!((b.retire, b.catalog), (Some(a.epoch), CatalogFate::None));
    assert_eq!(m.heartbeat(0, 1, 7, a.epoch, (), 2001), Beat::Refused);
    assert_eq!(
        m.heartbeat(0, 1, 7, b.epoch, (), 2002),
        Beat::First { catalog: false }
    );
    // Heard, and its catalog adopted: the same join continues it.
    let mut m = M::default();
    let a = m.join(req(Some(1), "http://a", 7, 0, 0)).unwrap();
    assert_eq!(
        m.heartbeat(0, 1, 7, a.epoch, (), 1),
        Beat::First { catalog: true }
    );
    let later = m.join(gave_up.clone()).unwrap();
    assert_eq!(
        (later.epoch, later.fresh, later.continued),
        (a.epoch, false, true)
    );
    // The other way round (seed 1072231): begun by a join without the catalog, asked again
    // with it before any heartbeat, a new membership awaits it; answered with the first
    // verdict, the catalog would be handed to a meta that ignores it.
    let mut m = M::default();
    let a = m.join(gave_up.clone()).unwrap();
    assert_eq!(a.catalog, CatalogFate::None);
    let b = m.join(req(Some(1), "http://a", 7, 0, 2000)).unwrap();
    assert!(b.fresh && !b.continued && b.epoch != a.epoch);
    assert_eq!((b.retire, b.catalog), (Some(a.epoch), CatalogFate::Follows));
    assert_eq!(m.heartbeat(0, 1, 7, a.epoch, (), 2001), Beat::Refused);
    assert_eq!(
        m.heartbeat(0, 1, 7, b.epoch, (), 2002),
        Beat::First { catalog: true }
    );
    // Asked again without it, unheard: the first verdict again, nothing new begins.
    let mut m = M::default();
    let a = m.join(gave_up.clone()).unwrap();
    let again = m.join(gave_up).unwrap();
    assert_eq!(
        (again.epoch, again.fresh, again.catalog),
        (a.epoch, false, CatalogFate::None)
    );
}

#[test]
fn a_new_leadership_makes_every_membership_stale() {
    let mut m = M::default();
    let a = m.join(req(None, "http://a", 1, 4, 0)).unwrap();
    assert_eq!(m.heartbeat(8, a.rank, 1, a.epoch, (), 1), Beat::Refused);
    let again = m.join(req(None, "http://a", 1, 8, 2)).unwrap();
    assert!(again.fresh && again.retire == Some(a.epoch));
    assert_eq!(again.catalog, CatalogFate::Follows);
    assert_eq!(
        m.heartbeat(8, a.rank, 1, again.epoch, (), 3),
        Beat::First { catalog: true }
    );
}

#[test]
fn a_taken_rank_is_not_reassigned_and_a_leaving_one_cannot_rejoin() {
    let mut m = M::default();
    let a = m.join(req(Some(5), "http://a", 1, 0, 0)).unwrap();
    // Another URL asking for rank 5 by configuration replaces it (a move of the service);
    // the automatic assignment never hands out a taken rank.
    let other = m.join(req(None, "http://z", 9, 0, 0)).unwrap();
    assert_ne!(other.rank, 5);
    assert!(m.leave(0, 5, 1, a.epoch));
    assert!(m.join(req(Some(5), "http://a", 1, 0, 1)).is_err());
}

/// Incarnations are ordered by their process's start time: a join of a run that started
/// before the rank's live one (its message came late, the run was killed since) is refused and
/// changes nothing; a later run replaces the live one in one step; once the live one is lost,
/// any run joins (a wall clock set back between two runs only waits for the loss). Seed 23586
/// of the cluster simulation found the late join replacing the live run.
#[test]
fn a_late_join_of_an_earlier_run_does_not_replace_the_live_one() {
    let t0 = 1_790_000_000_000;
    let (early, live, later) = (
        incarnation(t0, 0xfff),
        incarnation(t0 + 2_000, 1),
        incarnation(t0 + 9_000, 7),
    );
    assert!(started_before(early, live) && !started_before(live, early));
    assert!(
        !started_before(live, incarnation(t0 + 2_000, 2)),
        "the same millisecond"
    );
    assert!(early < (1 << 53) && later < (1 << 53));
    let mut m = M::default();
    let a = m.join(req(Some(3), "http://a", live, 0, 0)).unwrap();
    let err = m.join(req(Some(3), "http://a", early, 0, 10)).unwrap_err();
    assert!(err.contains("later run"), "{err}");
    assert_eq!(
        m.heartbeat(0, 3, live, a.epoch, (), 20),
        Beat::First { catalog: true }
    );
    let b = m.join(req(Some(3), "http://a", later, 0, 30)).unwrap();
    assert_eq!((b.fresh, b.retire), (true, Some(a.epoch)));
    // Lost: an earlier run may take the rank again.
    assert_eq!(m.expire(30 + 10_000, 1_000), vec![(3, b.epoch)]);
    let c = m.join(req(Some(3), "http://a", early, 0, 20_000)).unwrap();
    assert_eq!(c.retire, Some(b.epoch));
}

/// A join for a rank another local service (another URL) holds, that service having started
/// later, is refused saying so (`TAKEN_BY_ANOTHER`: the agent of a service that asked for the
/// rank it was given then asks for any free one); the same service's earlier run is refused as
/// a replaced run; neither changes the holder's membership.
#[test]
fn a_join_for_a_rank_another_later_service_holds_says_it_is_taken() {
    let t0 = 1_790_000_000_000;
    let (early, later) = (incarnation(t0, 1), incarnation(t0 + 5_000, 2));
    let mut m = M::default();
    let b = m.join(req(Some(3), "http://b", later, 0, 0)).unwrap();
    let err = m.join(req(Some(3), "http://a", early, 0, 10)).unwrap_err();
    assert!(err.contains(TAKEN_BY_ANOTHER), "{err}");
    let err = m.join(req(Some(3), "http://b", early, 0, 10)).unwrap_err();
    assert!(
        err.contains("later run") && !err.contains(TAKEN_BY_ANOTHER),
        "{err}"
    );
    assert_eq!(
        m.heartbeat(0, 3, later, b.epoch, (), 20),
        Beat::First { catalog: true }
    );
    // Asking for any rank instead, the first service gets a free one.
    let a = m.join(req(None, "http://a", early, 0, 30)).unwrap();
    assert_ne!(a.rank, 3);
}

/// Between a service configured with a rank and one that was given it (the lowest free while
/// the configured one was away), the configured one holds it whatever their start times. Its
/// join does not end the holder's membership (whose catalog would then be adopted by a later
/// leader over what was put since: the cluster simulation, seed 74485): the holder is asked to
/// give the rank up, its heartbeats are refused, its join for the rank is told it is taken
/// (and for any rank gets another), and once it is declared lost by the heartbeat timeout the
/// configured one takes the rank. One given a rank never takes it from a configured one, so
/// the two do not displace each other in turn, and the configured one is not refused for as
/// long as the other lives (seed 21). A holder that is leaving keeps the rank until its drain
/// is over; two given (or two configured) go by their incarnations.
#[test]
fn a_configured_rank_is_taken_from_a_service_that_was_given_it() {
    let t0 = 1_790_000_000_000;
    let (early, later) = (incarnation(t0, 1), incarnation(t0 + 5_000, 2));
    let given = |url, inc, now| JoinRequest {
        configured: false,
        ..req(Some(3), url, inc, 0, now)
    };
    let any = |url, inc, now| JoinRequest {
        configured: false,
        ..req(None, url, inc, 0, now)
    };
    // B (no rank configured) was given 3 while A (configured with 3, started earlier) was away.
    let mut m = M::default();
    let b = m.join(given("http://b", later, 0)).unwrap();
    assert_eq!(
        m.heartbeat(0, 3, later, b.epoch, (), 5),
        Beat::First { catalog: true }
    );
    let err = m.join(req(Some(3), "http://a", early, 0, 10)).unwrap_err();
    assert!(err.contains("asked to give it up"), "{err}");
    // B's membership goes on (its blobs are not dropped here), but its heartbeats are refused
    // and its join for the rank is told the rank is taken; for any rank it gets another.
    assert_eq!(m.heartbeat(0, 3, later, b.epoch, (), 20), Beat::Refused);
    let err = m.join(given("http://b", later, 30)).unwrap_err();
    assert!(err.contains(TAKEN_BY_ANOTHER), "{err}");
    let b2 = m.join(any("http://b", later, 40)).unwrap();
    assert_ne!(b2.rank, 3);
    assert_eq!(b2.retire, None);
    // A waits until B's membership of rank 3 ends, declared lost (its loss recorded as any).
    assert!(m.join(req(Some(3), "http://a", early, 0, 50)).is_err());
    let lost = m.expire(5 + 2_001, 2_000);
    assert_eq!(lost, vec![(3, b.epoch)]);
    let a = m.join(req(Some(3), "http://a", early, 0, 2_100)).unwrap();
    assert_eq!((a.rank, a.fresh, a.retire), (3, true, Some(b.epoch)));
    // A service given the rank, started before A or after it, never takes it from A.
    for (url, inc) in [
        ("http://c", incarnation(t0 - 5_000, 3)),
        ("http://d", later),
    ] {
        let err = m.join(given(url, inc, 2_200)).unwrap_err();
        assert!(err.contains(TAKEN_BY_ANOTHER), "{err}");
    }
    // Two given the rank that started in the same millisecond: the one whose incarnation is
    // higher takes precedence, and the other does not take it back (before, each took it from
    // the other at every heartbeat: the cluster simulation with automatic ranks, seed 37759).
    let (x, y) = (incarnation(t0, 5), incarnation(t0, 9));
    let mut m = M::default();
    m.join(given("http://x", x, 0)).unwrap();
    let err = m.join(given("http://y", y, 10)).unwrap_err();
    assert!(err.contains("asked to give it up"), "{err}");
    let err = m.join(given("http://x", x, 20)).unwrap_err();
    assert!(err.contains(TAKEN_BY_ANOTHER), "{err}");
    // A holder that was given the rank and is leaving keeps it until its drain is over.
    let mut m = M::default();
    let b = m.join(given("http://b", later, 0)).unwrap();
    assert!(m.leave(0, 3, later, b.epoch));
    let err = m.join(req(Some(3), "http://a", early, 0, 10)).unwrap_err();
    assert!(err.contains("leaving"), "{err}");
    assert!(m.left(3, b.epoch));
    assert!(m.join(req(Some(3), "http://a", early, 0, 20)).is_ok());
}

/// Two services (two URLs) with the same incarnation (started in the same millisecond, the same
/// random bits): the second one's join is not the first one asking again; it does not get the
/// first one's membership (the cluster simulation, seed 46188).
#[test]
fn a_join_of_another_url_with_the_same_incarnation_is_another_process() {
    let inc = incarnation(1_790_000_000_000, 7);
    let mut m = M::default();
    let a = m.join(req(None, "http://a", inc, 0, 0)).unwrap();
    let b = m.join(req(None, "http://b", inc, 0, 10)).unwrap();
    assert_ne!((b.rank, b.epoch), (a.rank, a.epoch));
    assert!(b.fresh);
    // Asking for the first one's rank, it is refused (neither takes precedence).
    let err = m
        .join(JoinRequest {
            configured: false,
            ..req(Some(a.rank), "http://b", inc, 0, 20)
        })
        .unwrap_err();
    assert!(err.contains(TAKEN_BY_ANOTHER), "{err}");
    assert_eq!(
        m.heartbeat(0, a.rank, inc, a.epoch, (), 30),
        Beat::First { catalog: true }
    );
}

/// A join of a service's earlier run is refused while its later run holds a live membership on
/// any rank, not only on the rank asked for: a dead run's join delayed past its successor's
/// (given another rank) made a membership nobody would report under (the cluster simulation,
/// seed 196032).
#[test]
fn a_late_join_of_a_replaced_run_is_refused_whatever_rank_its_successor_holds() {
    let t0 = 1_790_000_000_000;
    let (early, later) = (incarnation(t0, 1), incarnation(t0 + 5_000, 2));
    let given = |inc, rank, now| JoinRequest {
        configured: false,
        ..req(rank, "http://a", inc, 0, now)
    };
    let mut m = M::default();
    let first = m.join(given(early, None, 0)).unwrap();
    // The later run, finding the rank still held, is given another.
    let second = m.join(given(later, None, 10)).unwrap();
    assert_ne!(second.rank, first.rank);
    let err = m.join(given(early, Some(first.rank), 20)).unwrap_err();
    assert!(err.contains("later run"), "{err}");
    let err = m.join(given(early, None, 30)).unwrap_err();
    assert!(err.contains("later run"), "{err}");
}
