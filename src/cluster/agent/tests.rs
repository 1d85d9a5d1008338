//! Tests of the local service's membership machine (`agent.rs`).

use super::*;
use crate::cluster::members::Membership;

fn config() -> AgentConfig {
    AgentConfig {
        meta_urls: vec!["http://m1".into(), "http://m2".into()],
        rank: None,
        heartbeat_interval_ms: 500,
        heartbeat_timeout_ms: 3000,
    }
}

fn admitted(rank: u32, epoch: u64, ha: bool) -> JoinAnswer {
    JoinAnswer::Admitted(Admission {
        rank,
        epoch,
        heartbeat_interval_ms: 100,
        heartbeat_timeout_ms: 1000,
        ha,
        view: 0,
        lineage: 0,
        discard_catalog: false,
        fresh: true,
    })
}

fn tick(a: &mut Agent, now: u64) -> Vec<Action> {
    a.step(Input::Tick { moved_at_ms: 0 }, now, false)
}

fn joined(ha: bool) -> Agent {
    let mut a = Agent::new(config(), 0);
    assert_eq!(
        tick(&mut a, 0),
        [Action::Join {
            meta: "http://m1".into(),
            rank: None,
            rank_configured: false,
            catalog_follows: false,
            in_step: 0,
            catalog_since: Membership::default(),
            recovered: false,
            heard_by: 0,
        }]
    );
    let acts = a.step(
        Input::JoinAnswered {
            meta: "http://m1".into(),
            answer: admitted(3, 7, ha),
        },
        1,
        false,
    );
    assert!(acts.contains(&Action::Become {
        meta: "http://m1".into(),
        rank: 3,
        epoch: 7
    }));
    assert!(acts.contains(&Action::ResetAcks));
    a
}

fn beat(rank: u32, epoch: u64, hand_over: bool) -> Action {
    Action::Beat {
        meta: "http://m1".into(),
        rank,
        epoch,
        hand_over,
    }
}

#[test]
fn joins_each_meta_in_turn_follows_a_standby_and_warns_at_a_bounded_rate() {
    let mut a = Agent::new(config(), 0);
    let mut warnings = 0;
    let mut joins = Vec::new();
    let mut now = 0;
    while now < 40_000 {
        for act in tick(&mut a, now) {
            match act {
                Action::Join { meta, .. } => {
                    joins.push(meta.clone());
                    let answer = if meta == "http://m2" && joins.len() == 2 {
                        JoinAnswer::Redirect("http://leader".into())
                    } else {
                        JoinAnswer::Failed
                    };
                    a.step(Input::JoinAnswered { meta, answer }, now, false);
                }
                Action::Warn(w) => {
                    assert!(w.contains("http://m1, http://m2"), "{w}");
                    warnings += 1;
                }
                other => panic!("{other:?}"),
            }
        }
        now += 20;
    }
    assert_eq!(
        &joins[..4],
        ["http://m1", "http://m2", "http://leader", "http://m1"]
    );
    // Within a few seconds, then once per WARN_EVERY_MS.
    assert_eq!(warnings, 2);
}

#[test]
fn reports_at_once_after_the_join_then_every_interval_one_at_a_time() {
    let mut a = joined(false);
    assert_eq!(tick(&mut a, 2), [beat(3, 7, false)]);
    assert!(
        tick(&mut a, 500).is_empty(),
        "one heartbeat on its way at a time"
    );
    a.step(
        Input::BeatAnswered {
            sent_ms: 2,
            answer: BeatAnswer::Heard,
        },
        3,
        false,
    );
    assert!(tick(&mut a, 50).is_empty());
    assert_eq!(tick(&mut a, 102), [beat(3, 7, false)]);
}

/// A draining service keeps reporting while its leave is on its way, so its meta does not
/// declare it lost mid-drain; the answer ends the process.
#[test]
fn a_leaving_service_keeps_reporting_until_its_leave_is_answered() {
    let mut a = joined(false);
    tick(&mut a, 2);
    a.step(
        Input::BeatAnswered {
            sent_ms: 2,
            answer: BeatAnswer::Heard,
        },
        3,
        false,
    );
    assert_eq!(
        a.step(Input::Stop, 10, false),
        [Action::Leave {
            meta: "http://m1".into(),
            rank: 3,
            epoch: 7
        }]
    );
    assert_eq!(tick(&mut a, 110), [beat(3, 7, false)]);
    a.step(
        Input::BeatAnswered {
            sent_ms: 110,
            answer: BeatAnswer::Heard,
        },
        111,
        false,
    );
    assert_eq!(tick(&mut a, 220), [beat(3, 7, false)]);
    let end = a.step(Input::LeaveAnswered { ok: true }, 5000, false);
    assert_eq!(end.last(), Some(&Action::Exit(None)));
    assert!(a.has_left());
    assert!(tick(&mut a, 6000).is_empty());
}

#[test]
fn a_stop_before_any_join_says_so_and_exits() {
    let mut a = Agent::new(config(), 0);
    let acts = a.step(Input::Stop, 0, false);
    assert!(matches!(&acts[0], Action::Info(m) if m.contains("nothing to leave")));
    assert_eq!(acts[1], Action::Exit(None));
}

/// Without HA, a catalog is handed to no meta after a silence of the heartbeat timeout (the
/// meta may have declared this service lost and removed its objects), and dropped unless
/// the admitting meta continued the same membership (it was slow, not restarted: it holds
/// the objects and goes on reporting their removals, so the catalog is right); a short
/// silence (a quickly restarted meta) keeps it. The cluster simulation found the catalog
/// dropped at once while the meta, merely paused, kept the membership and committed a put
/// into it (seed 17, seed 86 with one meta): the next meta restart lost those objects.
#[test]
fn a_catalog_survives_a_short_silence_or_a_continued_membership() {
    // The last column: how long after the join was sent its answer came. A silence that
    // passed the heartbeat timeout before the answer (the join's first answers lost) counts as
    // one at the give-up (found by the cluster simulation, seed 1941).
    for (ha, forgotten_at, follows, fresh, kept, answered_after) in [
        (false, 500, true, true, true, 1),
        (false, 1100, false, true, false, 1),
        (false, 1100, false, false, true, 1),
        (true, 1100, true, true, true, 1),
        (false, 500, true, true, false, 600),
        (false, 500, true, false, true, 600),
        (true, 500, true, true, true, 600),
    ] {
        let mut a = joined(ha);
        tick(&mut a, 5);
        a.step(
            Input::BeatAnswered {
                sent_ms: 5,
                answer: BeatAnswer::Heard,
            },
            5,
            true,
        );
        let mut acts = a.step(Input::Tick { moved_at_ms: 0 }, forgotten_at, true);
        acts.extend(a.step(
            Input::BeatAnswered {
                sent_ms: forgotten_at,
                answer: BeatAnswer::Forgotten,
            },
            forgotten_at,
            true,
        ));
        acts.extend(a.step(Input::Tick { moved_at_ms: 0 }, forgotten_at + 1, true));
        assert!(
            !acts.contains(&Action::DiscardCatalog),
            "not before an answer"
        );
        // It joins again, asking for its rank, with the catalog if it may hand it over.
        let join: Vec<Action> = acts
            .into_iter()
            .filter(|a| matches!(a, Action::Join { .. }))
            .collect();
        assert_eq!(
            join,
            [Action::Join {
                meta: "http://m1".into(),
                rank: Some(3),
                rank_configured: false,
                catalog_follows: follows,
                in_step: 0,
                // The first join took no catalog: the one it holds began then.
                catalog_since: Membership { view: 0, epoch: 7 },
                recovered: false,
                heard_by: 0,
            }]
        );
        let mut answer = admitted(3, 7 + fresh as u64, ha);
        if let JoinAnswer::Admitted(x) = &mut answer {
            x.fresh = fresh;
        }
        let meta = "http://m1".to_string();
        let at = forgotten_at + 1 + answered_after;
        let acts = a.step(Input::JoinAnswered { meta, answer }, at, true);
        assert_eq!(
            !acts.contains(&Action::DiscardCatalog),
            kept,
            "ha {ha}, at {forgotten_at}, fresh {fresh}, answered at {at}"
        );
        // A continued membership keeps the catalog's acknowledgements and the records it
        // applied (its freed log goes on); only a new one starts them over.
        assert_eq!(acts.contains(&Action::ResetAcks), fresh, "{acts:?}");
    }
}

#[test]
fn a_silent_meta_is_given_up_after_the_heartbeat_timeout() {
    let mut a = joined(true);
    tick(&mut a, 2);
    // Never answered: the heartbeat stays on its way until the timeout gives up.
    let acts = tick(&mut a, 1001);
    assert!(acts.is_empty());
    let acts = tick(&mut a, 1002);
    assert!(matches!(&acts[0], Action::Warn(w) if w.contains("has not answered")));
    assert!(matches!(acts.last(), Some(Action::Join { .. })));
    // The late answer of the old membership changes nothing.
    assert!(
        a.step(
            Input::BeatAnswered {
                sent_ms: 2,
                answer: BeatAnswer::Heard
            },
            1004,
            false
        )
        .is_empty()
    );
    assert_eq!(a.membership(), None);
}

#[test]
fn a_meta_that_declared_the_service_lost_has_it_drop_its_catalog() {
    let mut a = Agent::new(config(), 0);
    tick(&mut a, 0);
    let mut answer = admitted(4, 9, true);
    if let JoinAnswer::Admitted(x) = &mut answer {
        x.discard_catalog = true;
        x.view = 6;
    }
    let acts = a.step(
        Input::JoinAnswered {
            meta: "http://m1".into(),
            answer,
        },
        1,
        true,
    );
    assert!(acts.contains(&Action::DiscardCatalog));
    assert_eq!(a.membership(), Some((4, 9)));
    // Every later join says the catalog began in that membership: a loss an earlier leader
    // recorded of a membership before it does not void it (`members::JoinRequest`).
    a.step(
        Input::BeatAnswered {
            sent_ms: 1,
            answer: BeatAnswer::NotLeader,
        },
        2,
        true,
    );
    let since = a
        .step(Input::Tick { moved_at_ms: 0 }, 3, true)
        .into_iter()
        .find_map(|x| match x {
            Action::Join { catalog_since, .. } => Some(catalog_since),
            _ => None,
        });
    assert_eq!(since, Some(Membership { view: 6, epoch: 9 }));
}

/// The catalog is in step with a leadership once a heartbeat of a membership under it is
/// answered (not at the join: the leader adopts the catalog from that heartbeat), and every
/// later join says so; a restarted service says what its journal recovered.
#[test]
fn a_join_says_which_leadership_the_catalog_was_last_in_step_with() {
    let mut a = Agent::new(config(), 0);
    a.recovered_in_step(4, 0);
    let join = |acts: Vec<Action>| {
        acts.into_iter()
            .find_map(|x| match x {
                Action::Join {
                    in_step, recovered, ..
                } => Some((in_step, recovered)),
                _ => None,
            })
            .expect("a join")
    };
    // Recovered from the journal: said so until a heartbeat is answered.
    assert_eq!(
        join(a.step(Input::Tick { moved_at_ms: 0 }, 0, true)),
        (4, true)
    );
    let mut answer = admitted(3, 7, true);
    if let JoinAnswer::Admitted(x) = &mut answer {
        x.view = 9;
    }
    let meta = "http://m1".to_string();
    a.step(Input::JoinAnswered { meta, answer }, 1, true);
    assert_eq!(a.in_step(), 4, "not before a heartbeat is answered");
    let acts = tick(&mut a, 2);
    assert!(acts.iter().any(|x| matches!(x, Action::Beat { .. })));
    let acts = a.step(
        Input::BeatAnswered {
            sent_ms: 2,
            answer: BeatAnswer::Heard,
        },
        3,
        true,
    );
    assert!(
        acts.contains(&Action::InStep {
            view: 9,
            lineage: 0
        }),
        "{acts:?}"
    );
    assert_eq!(a.in_step(), 9);
    // Forgotten by the meta: the next join says 9.
    let acts = a.step(
        Input::BeatAnswered {
            sent_ms: 3,
            answer: BeatAnswer::Forgotten,
        },
        4,
        true,
    );
    let acts = if acts.iter().any(|x| matches!(x, Action::Join { .. })) {
        acts
    } else {
        a.step(Input::Tick { moved_at_ms: 0 }, 400, true)
    };
    assert_eq!(join(acts), (9, false));
}

/// A new membership confirms nothing of the previous one: admitted afresh with the catalog,
/// the entries not handed over yet go; admitted afresh without it, everything goes (a commit
/// answered after the join was sent may have listed a blob the meta dropped); a continued
/// membership keeps all.
#[test]
fn a_fresh_membership_drops_what_the_previous_one_left_unconfirmed() {
    for (held, fresh, want) in [
        (true, true, Some(Action::DropUnconfirmed)),
        (false, true, Some(Action::DiscardCatalog)),
        (true, false, None),
        (false, false, None),
    ] {
        let mut a = Agent::new(config(), 0);
        a.step(Input::Tick { moved_at_ms: 0 }, 0, held);
        let mut answer = admitted(3, 7, true);
        if let JoinAnswer::Admitted(x) = &mut answer {
            x.fresh = fresh;
        }
        let meta = "http://m1".to_string();
        let acts = a.step(Input::JoinAnswered { meta, answer }, 1, held);
        let got = acts
            .into_iter()
            .find(|x| matches!(x, Action::DropUnconfirmed | Action::DiscardCatalog));
        assert_eq!(got, want, "held {held}, fresh {fresh}");
    }
}

/// A join waits for the commits of writes on their way to a meta (their answers confirm or
/// drop catalog entries the join would hand over), at most `COMMITS_WAIT_MS`: it goes as
/// soon as they are answered, or when the wait is over (found by the cluster simulation,
/// seeds 3491 and 1067).
#[test]
fn a_join_waits_a_bounded_time_for_commits_on_their_way() {
    let joins = |acts: Vec<Action>| {
        acts.iter()
            .filter(|x| matches!(x, Action::Join { .. }))
            .count()
    };
    // Answered meanwhile: the join goes at the next tick.
    let mut a = Agent::new(config(), 0);
    a.set_commits_in_flight(true);
    assert_eq!(joins(tick(&mut a, 0)), 0);
    assert_eq!(joins(tick(&mut a, 500)), 0);
    a.set_commits_in_flight(false);
    assert_eq!(joins(tick(&mut a, 510)), 1);
    // Never answered: the join goes once the wait is over.
    let mut a = Agent::new(config(), 0);
    a.set_commits_in_flight(true);
    assert_eq!(joins(tick(&mut a, 10)), 0);
    assert_eq!(joins(tick(&mut a, 10 + COMMITS_WAIT_MS - 1)), 0);
    assert_eq!(joins(tick(&mut a, 10 + COMMITS_WAIT_MS)), 1);
}

/// The next `Action::Join` of `acts`, or of a tick at `now` when they hold none, with the
/// catalog `held`: (rank asked for, whether the catalog follows).
/// The next join's rank, whether it says the rank is configured, and whether its catalog
/// follows.
fn next_join(a: &mut Agent, acts: Vec<Action>, now: u64, held: bool) -> (Option<u32>, bool, bool) {
    let acts = if acts.iter().any(|x| matches!(x, Action::Join { .. })) {
        acts
    } else {
        a.step(Input::Tick { moved_at_ms: 0 }, now, held)
    };
    acts.into_iter()
        .find_map(|x| match x {
            Action::Join {
                rank,
                rank_configured,
                catalog_follows,
                ..
            } => Some((rank, rank_configured, catalog_follows)),
            _ => None,
        })
        .expect("a join")
}

/// A service given rank 3 asks for it again with its catalog; told another service holds it
/// now (`JoinAnswer::Taken`), it asks for any free rank, its catalog not following, and the
/// admission drops the catalog; a service configured with the rank asks for it again. Without
/// it, the cluster simulation with automatic ranks (seed 19) left a service refused at every
/// try for as long as the other lived.
#[test]
fn a_service_whose_given_rank_another_took_joins_for_any_rank() {
    for configured in [None, Some(3)] {
        let mut a = Agent::new(
            AgentConfig {
                rank: configured,
                ..config()
            },
            0,
        );
        tick(&mut a, 0);
        let meta = || "http://m1".to_string();
        a.step(
            Input::JoinAnswered {
                meta: meta(),
                answer: admitted(3, 7, false),
            },
            1,
            true,
        );
        // Forgotten (a restarted meta): the next join asks for rank 3, the catalog following.
        let acts = a.step(
            Input::BeatAnswered {
                sent_ms: 1,
                answer: BeatAnswer::Forgotten,
            },
            2,
            true,
        );
        // (It says whether rank 3 is its configured rank or the one it was given.)
        assert_eq!(
            next_join(&mut a, acts, 400, true),
            (Some(3), configured.is_some(), true)
        );
        let acts = a.step(
            Input::JoinAnswered {
                meta: meta(),
                answer: JoinAnswer::Taken,
            },
            401,
            true,
        );
        let want = match configured {
            None => (None, false, false),
            Some(r) => (Some(r), true, true),
        };
        let got = next_join(&mut a, acts, 5_000, true);
        assert_eq!(got, want, "configured {configured:?}");
        if configured.is_some() {
            continue;
        }
        // Admitted afresh elsewhere, without the catalog: it is dropped, and the next time the
        // service asks for its new rank again (its catalog not following here: the join comes
        // past the heartbeat timeout of silence, without HA).
        let acts = a.step(
            Input::JoinAnswered {
                meta: meta(),
                answer: admitted(4, 9, false),
            },
            5_001,
            true,
        );
        assert!(acts.contains(&Action::DiscardCatalog), "{acts:?}");
        let acts = a.step(
            Input::BeatAnswered {
                sent_ms: 5_001,
                answer: BeatAnswer::Forgotten,
            },
            5_002,
            true,
        );
        assert_eq!(next_join(&mut a, acts, 5_400, true).0, Some(4));
    }
}

/// A heartbeat's answer counts for the current membership only if it names it at the meta it
/// was sent to: another meta's membership of the same epoch (two metas started in the same
/// millisecond hand out the same epochs) is not it (the cluster simulation, seed 42305).
#[test]
fn a_membership_is_its_meta_and_its_epoch() {
    let a = joined(false);
    assert_eq!(a.membership(), Some((3, 7)));
    assert!(a.is_membership("http://m1", 7));
    assert!(!a.is_membership("http://m2", 7));
    assert!(!a.is_membership("http://m1", 6));
}

/// A service none of whose heartbeats was ever answered, given up past the timeout without HA
/// and admitted afresh, drops its catalog and says so without a figure from its clock's zero.
#[test]
fn a_catalog_dropped_after_no_heartbeat_was_ever_answered_says_so() {
    let mut a = joined(false);
    a.step(Input::Tick { moved_at_ms: 0 }, 2, true);
    let acts = a.step(Input::Tick { moved_at_ms: 0 }, 1500, true);
    assert!(matches!(acts.last(), Some(Action::Join { .. })), "{acts:?}");
    let acts = a.step(
        Input::JoinAnswered {
            meta: "http://m1".into(),
            answer: admitted(3, 8, false),
        },
        1501,
        true,
    );
    assert!(acts.contains(&Action::DiscardCatalog), "{acts:?}");
    assert!(
        acts.iter().any(|x| matches!(x, Action::Warn(w)
            if w.contains("no heartbeat of this process was ever answered")
                && !w.contains(" ms,"))),
        "{acts:?}"
    );
}
