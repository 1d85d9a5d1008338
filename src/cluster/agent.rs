//! A local service's membership machine: join a meta service, report at once and then every
//! heartbeat interval, join again when the meta forgot this service (it restarted, lost its
//! leadership, or declared this service lost), and leave on a graceful stop while still
//! reporting.
//!
//! Pure: [`Agent::step`] takes what happened and the time (the process clock, ms) and returns
//! what to do; the `agent` module carries the actions out over HTTP on its own thread, and the
//! cluster simulation drives the same machine. At most one join, one heartbeat and one leave
//! are on their way at a time.
//!
//! The catalog a service hands to a meta that does not know its memory is only as good as the
//! promise that no meta removed those objects without telling it. A meta removes a silent
//! rank's objects once it declares the rank lost, `heartbeat_timeout_ms` after its last
//! report at the earliest. So after a silence that long, a service of a meta without HA (whose
//! restart is the only other reason for the silence, and which keeps no record of what it
//! declared) hands its catalog to no meta: it joins without it and drops it, unless the meta
//! answers that it continued this very membership (it was slow, not restarted, and did not
//! declare the service lost: it still holds those objects and will go on reporting their
//! removals, so the catalog stays right). With HA the catalog is kept and handed over.

/// Pause between two rounds of join attempts while no meta service admits this one.
pub const JOIN_RETRY_MS: u64 = 300;
/// How long after a tier move the agent reports (the meta has landed it by then, usually; the
/// second report is for a meta that was slower): its `landed` record is what lets the catalog
/// hand the copy over.
pub const AFTER_MOVE_MS: [u64; 2] = [50, 400];
/// While no meta admits this service, how often the failure is logged at WARN (the first
/// after [`FIRST_WARN_MS`]).
pub const WARN_EVERY_MS: u64 = 30_000;
pub const FIRST_WARN_MS: u64 = 1_000;

/// What the machine is configured with.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub meta_urls: Vec<String>,
    /// The configured rank (`ock.mmc.cluster.local_rank`).
    pub rank: Option<u32>,
    /// Used until a join's answer says the meta's.
    pub heartbeat_interval_ms: u64,
    pub heartbeat_timeout_ms: u64,
}

/// A join's answer, as the adapter read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinAnswer {
    Admitted(Admission),
    /// An HA standby: the leader is at this base URL.
    Redirect(String),
    /// Refused for good (a wrong token, untrusted certificates, segments that cannot be
    /// mounted): the process stops with this message.
    Fatal(String),
    /// No answer, or a refusal that may pass (a rank taken, a meta starting).
    Failed,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admission {
    pub rank: u32,
    pub epoch: u64,
    pub heartbeat_interval_ms: u64,
    pub heartbeat_timeout_ms: u64,
    /// The meta runs with HA (a failover's new leader knows which memberships were lost).
    pub ha: bool,
    /// The meta declared this service's previous membership lost: drop the catalog.
    pub discard_catalog: bool,
    /// A new membership: false when the meta continued this service's current one (the same
    /// service asking again, a heartbeat of it heard), which it holds with its objects and its
    /// freed log. A repeated join of a membership no heartbeat named yet is fresh to the
    /// service (`members::Joined::continued`).
    pub fresh: bool,
}

/// How a heartbeat went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BeatAnswer {
    Heard,
    /// The meta refused the catalog as too large: it is not handed over (dropped).
    CatalogTooLarge,
    /// 409: the meta does not know this membership (join again).
    Forgotten,
    /// 307/503: the meta is not the leader any more.
    NotLeader,
    /// No answer, or another status.
    Unheard,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// Time passed (the adapter ticks every few milliseconds); `moved_at_ms` is when this
    /// service last answered a tier move (0: never).
    Tick {
        moved_at_ms: u64,
    },
    JoinAnswered {
        meta: String,
        answer: JoinAnswer,
    },
    /// `sent_ms`: when that heartbeat was sent.
    BeatAnswered {
        sent_ms: u64,
        answer: BeatAnswer,
    },
    LeaveAnswered {
        ok: bool,
    },
    /// A graceful stop began (SIGTERM).
    Stop,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Forget the grant key, revoke every write under grants accepted so far, then send a join
    /// to `meta` (asking for `rank`, saying whether the catalog follows). Grants of the meta
    /// left behind are void from now on.
    Join {
        meta: String,
        rank: Option<u32>,
        catalog_follows: bool,
    },
    /// The join was admitted: mount this host's segments as `rank`, take the grant key from
    /// the answer, reset the catalog's acknowledgements (a new freed log starts at 0).
    Become {
        meta: String,
        rank: u32,
        epoch: u64,
    },
    /// Drop every catalog entry without handing it over.
    DiscardCatalog,
    /// Send a heartbeat (with the catalog when `hand_over`).
    Beat {
        meta: String,
        rank: u32,
        epoch: u64,
        hand_over: bool,
    },
    Leave {
        meta: String,
        rank: u32,
        epoch: u64,
    },
    /// The process stops: with `Some(message)`, because no meta will admit it.
    Exit(Option<String>),
    Warn(String),
    Info(String),
}

#[derive(Clone, Debug)]
struct Member {
    meta: String,
    rank: u32,
    epoch: u64,
    interval_ms: u64,
    timeout_ms: u64,
    ha: bool,
    /// The next heartbeat carries the catalog (until one is answered).
    hand_over: bool,
    /// No heartbeat sent since the join: the first goes at once, since the meta keeps this
    /// rank's segments UNDEFINED (no puts, no redirects) until it arrives.
    first_beat: bool,
    last_sent_ms: u64,
    beat_in_flight: bool,
    /// When the meta last answered anything.
    last_heard_ms: u64,
    leave_in_flight: bool,
}

#[derive(Clone, Debug)]
enum Phase {
    Joining {
        /// The metas to try in this round, and the next one's index.
        candidates: Vec<String>,
        next: usize,
        in_flight: bool,
        /// Whether the join on its way said the catalog follows.
        catalog_follows: bool,
        /// No attempt before this (a pause between rounds).
        not_before_ms: u64,
        since_ms: u64,
        warned_ms: u64,
    },
    Member(Member),
    Left,
}

#[derive(Clone, Debug)]
pub struct Agent {
    config: AgentConfig,
    phase: Phase,
    /// When the last heartbeat the meta answered was sent (0: none yet).
    last_acked_send_ms: u64,
    /// What the last admitting meta said of HA (a service that never joined assumes none).
    ha: bool,
    /// The rank this service's memory is mounted under (asked for again when the catalog
    /// follows, so the blobs keep their places).
    mounted_rank: Option<u32>,
    /// A graceful stop began.
    stopping: bool,
    /// Whether the catalog holds entries to hand over, as the adapter said with this step
    /// (false once this step discarded it).
    held: bool,
    /// After a silence of the heartbeat timeout without HA: the silence, in ms. The catalog is
    /// handed to no meta, and dropped unless the admitting meta continued the membership.
    suspect_ms: Option<u64>,
    /// Ticks when a tier move's report was sent last.
    last_move_report_ms: u64,
}

impl Agent {
    pub fn new(config: AgentConfig, now_ms: u64) -> Agent {
        let candidates = config.meta_urls.clone();
        Agent {
            config,
            phase: Phase::Joining {
                candidates,
                next: 0,
                in_flight: false,
                catalog_follows: false,
                not_before_ms: 0,
                since_ms: now_ms,
                warned_ms: 0,
            },
            last_acked_send_ms: 0,
            ha: false,
            mounted_rank: None,
            stopping: false,
            held: false,
            suspect_ms: None,
            last_move_report_ms: 0,
        }
    }

    /// The rank and epoch of the current membership.
    pub fn membership(&self) -> Option<(u32, u64)> {
        match &self.phase {
            Phase::Member(m) => Some((m.rank, m.epoch)),
            _ => None,
        }
    }

    pub fn has_left(&self) -> bool {
        matches!(self.phase, Phase::Left)
    }

    /// One step. `catalog_held` says whether the catalog has entries to hand over.
    pub fn step(&mut self, input: Input, now_ms: u64, catalog_held: bool) -> Vec<Action> {
        let mut out = Vec::new();
        self.held = catalog_held;
        match input {
            Input::Stop => self.stop(&mut out),
            Input::JoinAnswered { meta, answer } => {
                self.join_answered(meta, answer, now_ms, &mut out)
            }
            Input::BeatAnswered { sent_ms, answer } => {
                self.beat_answered(sent_ms, answer, now_ms, &mut out)
            }
            Input::LeaveAnswered { ok } => {
                if let Phase::Member(m) = &self.phase {
                    out.push(if ok {
                        Action::Info(format!("left the meta service at {} (rank {})", m.meta, m.rank))
                    } else {
                        Action::Warn(format!(
                            "the meta service at {} did not take this service's leave (rank {}); its objects there are dropped when it declares the rank lost",
                            m.meta, m.rank
                        ))
                    });
                }
                self.phase = Phase::Left;
                out.push(Action::Exit(None));
            }
            Input::Tick { moved_at_ms } => self.tick(now_ms, moved_at_ms, &mut out),
        }
        out
    }

    fn stop(&mut self, out: &mut Vec<Action>) {
        self.stopping = true;
        match &mut self.phase {
            Phase::Member(m) if !m.leave_in_flight => {
                m.leave_in_flight = true;
                out.push(Action::Leave {
                    meta: m.meta.clone(),
                    rank: m.rank,
                    epoch: m.epoch,
                });
            }
            Phase::Member(_) => {}
            Phase::Joining { .. } => {
                out.push(Action::Info(
                    "stopping before any meta service admitted this local service: nothing to leave".into(),
                ));
                self.phase = Phase::Left;
                out.push(Action::Exit(None));
            }
            Phase::Left => {}
        }
    }

    fn start_joining(&mut self, now_ms: u64, out: &mut Vec<Action>) {
        self.phase = Phase::Joining {
            candidates: self.config.meta_urls.clone(),
            next: 0,
            in_flight: false,
            catalog_follows: false,
            not_before_ms: now_ms,
            since_ms: now_ms,
            warned_ms: 0,
        };
        if self.stopping {
            self.phase = Phase::Left;
            out.push(Action::Exit(None));
        }
    }

    /// Gives the membership up (the meta forgot it, or went silent): join again, deciding
    /// first whether the catalog may still be handed over.
    fn give_up(&mut self, why: &str, now_ms: u64, out: &mut Vec<Action>) {
        if let Phase::Member(m) = &self.phase {
            out.push(Action::Warn(format!(
                "rank {}: the meta service at {} {why}: joining again",
                m.rank, m.meta
            )));
            let silent = now_ms.saturating_sub(self.last_acked_send_ms);
            if self.held && !m.ha && silent >= m.timeout_ms {
                // Handed to no meta from now on; dropped once a join's answer shows the meta
                // did not simply continue this membership.
                self.suspect_ms = Some(silent);
            }
        }
        self.start_joining(now_ms, out);
    }

    fn tick(&mut self, now_ms: u64, moved_at_ms: u64, out: &mut Vec<Action>) {
        let rank = self.config.rank;
        let member_timeout = match &self.phase {
            Phase::Member(m) => Some((m.last_heard_ms, m.timeout_ms)),
            _ => None,
        };
        if let Some((heard, timeout)) = member_timeout
            && now_ms.saturating_sub(heard) > timeout
        {
            // The meta is given up after as long without an answer as it waits for our
            // reports: it died or lost its leadership, and the list of meta URLs is tried
            // again (with HA, the new leader admits us).
            self.give_up("has not answered for the heartbeat timeout", now_ms, out);
        }
        match &mut self.phase {
            Phase::Joining {
                candidates,
                next,
                in_flight,
                catalog_follows,
                not_before_ms,
                since_ms,
                warned_ms,
            } => {
                if *in_flight || now_ms < *not_before_ms {
                    return;
                }
                if *next >= candidates.len() {
                    // A round failed: pause, then try the configured list again.
                    *candidates = self.config.meta_urls.clone();
                    *next = 0;
                    *not_before_ms = now_ms + JOIN_RETRY_MS;
                    let waited = now_ms.saturating_sub(*since_ms);
                    if waited >= FIRST_WARN_MS
                        && (*warned_ms == 0 || now_ms.saturating_sub(*warned_ms) >= WARN_EVERY_MS)
                    {
                        *warned_ms = now_ms;
                        out.push(Action::Warn(format!(
                            "no meta service admitted this local service for {} s (tried {}); retrying",
                            waited / 1000,
                            self.config.meta_urls.join(", ")
                        )));
                    }
                    return;
                }
                let meta = candidates[*next].clone();
                *next += 1;
                *in_flight = true;
                let follows = self.held && self.suspect_ms.is_none();
                *catalog_follows = follows;
                out.push(Action::Join {
                    meta,
                    // It asks for the rank its memory is mounted under, so the blobs keep their
                    // places.
                    rank: rank.or(if self.held { self.mounted_rank } else { None }),
                    catalog_follows: follows,
                });
            }
            Phase::Member(m) => {
                if m.beat_in_flight {
                    return;
                }
                // A catalog to hand over goes at once, so the objects are back soon; a tier
                // move's landing is fetched soon after the move.
                let after_move = moved_at_ms != 0
                    && AFTER_MOVE_MS.iter().any(|&d| {
                        now_ms >= moved_at_ms + d && self.last_move_report_ms < moved_at_ms + d
                    });
                let due = now_ms.saturating_sub(m.last_sent_ms) >= m.interval_ms;
                if due || m.first_beat || m.hand_over || after_move {
                    m.first_beat = false;
                    m.last_sent_ms = now_ms;
                    m.beat_in_flight = true;
                    if after_move {
                        self.last_move_report_ms = now_ms;
                    }
                    out.push(Action::Beat {
                        meta: m.meta.clone(),
                        rank: m.rank,
                        epoch: m.epoch,
                        hand_over: m.hand_over,
                    });
                }
            }
            Phase::Left => {}
        }
    }

    fn join_answered(
        &mut self,
        meta: String,
        answer: JoinAnswer,
        now_ms: u64,
        out: &mut Vec<Action>,
    ) {
        let Phase::Joining {
            candidates,
            next,
            in_flight,
            catalog_follows,
            since_ms,
            warned_ms,
            ..
        } = &mut self.phase
        else {
            return;
        };
        *in_flight = false;
        let hand_over = *catalog_follows;
        if *warned_ms != 0 && matches!(answer, JoinAnswer::Admitted(_)) {
            out.push(Action::Info(format!(
                "the meta service at {meta} answered after {} s without an admission",
                now_ms.saturating_sub(*since_ms) / 1000
            )));
        }
        match answer {
            JoinAnswer::Admitted(a) => {
                let suspect = self.suspect_ms.take();
                if a.discard_catalog {
                    out.push(Action::Warn(format!(
                        "the meta service at {meta} declared this service lost before: its catalog is dropped (its objects were removed there)"
                    )));
                    out.push(Action::DiscardCatalog);
                } else if let Some(silent) = suspect.filter(|_| a.fresh) {
                    out.push(Action::Warn(format!(
                        "rank {}: no heartbeat was answered for {silent} ms, past the heartbeat timeout, and the meta service at {meta} admitted this service afresh: it may have declared it lost and removed its objects (or restarted), so its catalog is dropped, not handed over",
                        a.rank
                    )));
                    out.push(Action::DiscardCatalog);
                }
                out.push(Action::Become {
                    meta: meta.clone(),
                    rank: a.rank,
                    epoch: a.epoch,
                });
                out.push(Action::Info(format!(
                    "joined the meta service at {meta} as rank {} (epoch {})",
                    a.rank, a.epoch
                )));
                self.ha = a.ha;
                self.mounted_rank = Some(a.rank);
                self.phase = Phase::Member(Member {
                    meta,
                    rank: a.rank,
                    epoch: a.epoch,
                    interval_ms: a.heartbeat_interval_ms.max(10),
                    timeout_ms: a.heartbeat_timeout_ms.max(20),
                    ha: a.ha,
                    hand_over: hand_over && !a.discard_catalog,
                    first_beat: true,
                    last_sent_ms: now_ms,
                    beat_in_flight: false,
                    last_heard_ms: now_ms,
                    leave_in_flight: false,
                });
                // A stop that came while joining still leaves.
                if self.stopping {
                    self.stop(out);
                }
            }
            JoinAnswer::Redirect(leader) => {
                // An HA standby: the leader is where it points (tried next, once).
                if !candidates.contains(&leader) {
                    candidates.insert(*next, leader);
                }
            }
            JoinAnswer::Fatal(why) => {
                self.phase = Phase::Left;
                out.push(Action::Exit(Some(why)));
            }
            JoinAnswer::Failed => {}
        }
    }

    fn beat_answered(
        &mut self,
        sent_ms: u64,
        answer: BeatAnswer,
        now_ms: u64,
        out: &mut Vec<Action>,
    ) {
        let Phase::Member(m) = &mut self.phase else {
            return;
        };
        m.beat_in_flight = false;
        match answer {
            BeatAnswer::Heard => {
                m.hand_over = false;
                m.last_heard_ms = now_ms;
                self.last_acked_send_ms = self.last_acked_send_ms.max(sent_ms);
            }
            BeatAnswer::CatalogTooLarge => {
                m.hand_over = false;
                m.last_heard_ms = now_ms;
                self.last_acked_send_ms = self.last_acked_send_ms.max(sent_ms);
                out.push(Action::Warn(format!(
                    "the meta service at {} refused this service's catalog as too large (ock.mmc.http.max_body_bytes): its objects are not handed over",
                    m.meta
                )));
                out.push(Action::DiscardCatalog);
                self.held = false;
            }
            BeatAnswer::Forgotten => {
                if !m.leave_in_flight {
                    self.give_up("no longer knows this membership", now_ms, out)
                }
            }
            BeatAnswer::NotLeader => {
                if !m.leave_in_flight {
                    self.give_up("is not the leader any more", now_ms, out)
                }
            }
            BeatAnswer::Unheard => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                catalog_follows: false
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
        for (ha, forgotten_at, follows, fresh, kept) in [
            (false, 500, true, true, true),
            (false, 1100, false, true, false),
            (false, 1100, false, false, true),
            (true, 1100, true, true, true),
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
                    catalog_follows: follows
                }]
            );
            let mut answer = admitted(3, 7 + fresh as u64, ha);
            if let JoinAnswer::Admitted(x) = &mut answer {
                x.fresh = fresh;
            }
            let meta = "http://m1".to_string();
            let acts = a.step(Input::JoinAnswered { meta, answer }, forgotten_at + 2, true);
            assert_eq!(
                !acts.contains(&Action::DiscardCatalog),
                kept,
                "ha {ha}, at {forgotten_at}, fresh {fresh}"
            );
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
    }
}
