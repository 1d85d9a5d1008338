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

use super::members::Membership;

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
/// How long a join waits for the commits this service has on their way to a meta: their
/// answers say which pending entries of the catalog are objects (confirmed, so handed over
/// with it) and which are not (dropped). A live meta answers in milliseconds; one that does
/// not within this is left behind, and what it may have committed is lost.
pub const COMMITS_WAIT_MS: u64 = 1_000;

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
    /// Refused: the rank asked for is held by another local service that started later
    /// (`members::TAKEN_BY_ANOTHER`). A service with no configured rank then asks for any free
    /// one, its catalog not following (it lists blobs of a membership the meta dropped when
    /// the other took the rank); one with a configured rank asks for it again.
    Taken,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admission {
    pub rank: u32,
    pub epoch: u64,
    pub heartbeat_interval_ms: u64,
    pub heartbeat_timeout_ms: u64,
    /// The meta runs with HA (a failover's new leader knows which memberships were lost).
    pub ha: bool,
    /// The meta's `view_version` (0 without HA): once a heartbeat of this membership is
    /// answered, the catalog is in step with this leadership.
    pub view: u64,
    /// The meta's lineage (`catalog::stamp_view`: its leadership under HA, its process
    /// without): once a heartbeat is answered, the one a catalog recovered from this
    /// service's SSD journal after a restart may be adopted by (`members::JoinRequest::heard_by`).
    pub lineage: u64,
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
        /// `rank` is the configured one (`members::JoinRequest::configured`), not the one the
        /// service was given before.
        rank_configured: bool,
        catalog_follows: bool,
        /// The leadership the catalog was last in step with (`members::JoinRequest::in_step`).
        in_step: u64,
        /// The membership the catalog began afresh in (`members::JoinRequest::catalog_since`).
        catalog_since: Membership,
        /// The catalog was recovered from an earlier process's SSD journal and no heartbeat of
        /// this process was answered yet (`members::JoinRequest::recovered`).
        recovered: bool,
        /// The lineage of the meta that last answered a heartbeat (`Admission::lineage`).
        heard_by: u64,
    },
    /// Forget the catalog's acknowledgements and the freed records it applied: a new
    /// membership's freed log starts at 0 (comes before its `Become`). A continued one keeps
    /// them: the meta's log goes on numbering where it was, and a copy's late write must still
    /// meet the record that freed its blob (found by the cluster simulation, seed 937533: reset
    /// at every admission, the record was forgotten, the write listed, and a restarted meta
    /// adopted the deleted key's old value).
    ResetAcks,
    /// The join was admitted: mount this host's segments as `rank`, take the grant key from
    /// the answer.
    Become {
        meta: String,
        rank: u32,
        epoch: u64,
    },
    /// Drop every catalog entry without handing it over.
    DiscardCatalog,
    /// Drop the entries not handed over yet (a new membership confirms none of them: a commit
    /// answer still on its way under the previous one must not list its blob).
    DropUnconfirmed,
    /// The catalog is in step with this leadership from now on (a heartbeat of a membership
    /// under it was answered): a service that keeps its catalog across restarts (its SSD
    /// journal) records it, and says it when it joins; `lineage` is that meta's
    /// (`Admission::lineage`).
    InStep {
        view: u64,
        lineage: u64,
    },
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
    /// The leadership that admitted this membership.
    view: u64,
    /// The admitting meta's lineage (`Admission::lineage`).
    lineage: u64,
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
    /// A meta said another local service holds the rank this one was given
    /// (`JoinAnswer::Taken`): until admitted, it asks for any free rank and its catalog does
    /// not follow.
    rank_taken: bool,
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
    /// The leadership the catalog was last in step with (0: none known).
    in_step: u64,
    /// `in_step` came with a catalog recovered from an earlier process's SSD journal, and no
    /// heartbeat of this process was answered since.
    recovered: bool,
    /// The lineage of the meta that last answered a heartbeat (0: none known).
    heard_by: u64,
    /// The membership whose admission (or heartbeat answer) last made this service drop its
    /// catalog: what it lists began then.
    catalog_since: Membership,
    /// Commits of writes under grants are on their way to a meta (the adapter says so before
    /// each step), and since when a join waits for them.
    commits_in_flight: bool,
    commits_wait_since: Option<u64>,
    /// The epoch of the last membership admitted (`None` before any).
    last_epoch: Option<u64>,
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
            rank_taken: false,
            stopping: false,
            held: false,
            suspect_ms: None,
            last_move_report_ms: 0,
            in_step: 0,
            recovered: false,
            heard_by: 0,
            catalog_since: Membership::default(),
            commits_in_flight: false,
            commits_wait_since: None,
            last_epoch: None,
        }
    }

    /// Whether commits are on their way to a meta now (the adapter says so before a step):
    /// a join waits for them, at most [`COMMITS_WAIT_MS`].
    pub fn set_commits_in_flight(&mut self, yes: bool) {
        self.commits_in_flight = yes;
        if !yes {
            self.commits_wait_since = None;
        }
    }

    /// A catalog kept across a restart (the SSD journal) was last in step with `view`.
    /// Its joins say the catalog is recovered until a heartbeat is answered, and which meta
    /// lineage heard its predecessor last.
    pub fn recovered_in_step(&mut self, view: u64, lineage: u64) {
        self.in_step = view;
        self.heard_by = lineage;
        self.recovered = true;
    }

    /// The leadership the catalog was last in step with.
    pub fn in_step(&self) -> u64 {
        self.in_step
    }

    /// The lineage of the meta that last answered a heartbeat.
    pub fn heard_by(&self) -> u64 {
        self.heard_by
    }

    /// The rank and epoch of the current membership.
    pub fn membership(&self) -> Option<(u32, u64)> {
        match &self.phase {
            Phase::Member(m) => Some((m.rank, m.epoch)),
            _ => None,
        }
    }

    /// Whether the membership `epoch` at the meta `meta` is the current one: what an answer to
    /// a heartbeat sent under it must be, to be taken as news of the current log. The epoch
    /// alone does not say it: two meta processes started in the same millisecond hand out the
    /// same epochs (`members::first_epoch`), and a late answer of the previous leader, naming
    /// the service's earlier membership there, set the catalog's acknowledgement to its own
    /// log's sequence; the current log's first record (a removal) was then skipped as already
    /// applied, acknowledged, and the removed object came back with the catalog at the next
    /// leader (the cluster simulation with automatic ranks, calm, seed 42305 with three metas).
    pub fn is_membership(&self, meta: &str, epoch: u64) -> bool {
        matches!(&self.phase, Phase::Member(m) if m.meta == meta && m.epoch == epoch)
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

    /// Drops the catalog, which begins afresh in membership `at` (every later join says so).
    fn discard_catalog(&mut self, at: Membership, out: &mut Vec<Action>) {
        out.push(Action::DiscardCatalog);
        self.catalog_since = at;
        self.recovered = false;
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
                // A commit answered after the join would confirm an entry the join's catalog
                // did not carry (listed, not held) or find it dropped (an object lost).
                if self.commits_in_flight {
                    let since = *self.commits_wait_since.get_or_insert(now_ms);
                    if now_ms.saturating_sub(since) < COMMITS_WAIT_MS {
                        return;
                    }
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
                let follows = self.held && self.suspect_ms.is_none() && !self.rank_taken;
                *catalog_follows = follows;
                out.push(Action::Join {
                    meta,
                    // It asks for the rank its memory is mounted under, so the blobs keep their
                    // places (unless another service holds it now).
                    rank: rank.or(if self.held && !self.rank_taken {
                        self.mounted_rank
                    } else {
                        None
                    }),
                    rank_configured: rank.is_some(),
                    catalog_follows: follows,
                    in_step: self.in_step,
                    catalog_since: self.catalog_since,
                    recovered: self.recovered,
                    heard_by: self.heard_by,
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
                // The silence counts until a join is answered: a join of this round that was
                // admitted while its answer was lost may have been declared lost since, by a
                // meta that then answered deletes relying on it and died, keeping no record
                // (found by the cluster simulation, seed 1941: a restarted meta adopted a
                // catalog 6 s silent, and a deleted value came back).
                let silent = now_ms.saturating_sub(self.last_acked_send_ms);
                let suspect = self.suspect_ms.take().or_else(|| {
                    (self.last_acked_send_ms > 0
                        && self.held
                        && !a.ha
                        && silent >= a.heartbeat_timeout_ms)
                        .then_some(silent)
                });
                let admitted = Membership {
                    view: a.view,
                    epoch: a.epoch,
                };
                if a.discard_catalog {
                    out.push(Action::Warn(format!(
                        "the meta service at {meta} said this service's catalog is void (it declared this service lost before, or the catalog missed a leadership that served since leadership {}): it is dropped",
                        self.in_step
                    )));
                    self.discard_catalog(admitted, out);
                } else if let Some(silent) = suspect.filter(|_| a.fresh) {
                    // Silent since the process started when none was ever answered: its clock's
                    // figure would say nothing then.
                    let silence = if self.last_acked_send_ms == 0 {
                        "no heartbeat of this process was ever answered".to_string()
                    } else {
                        format!(
                            "no heartbeat was answered for {silent} ms, past the heartbeat timeout"
                        )
                    };
                    out.push(Action::Warn(format!(
                        "rank {}: {silence}, and the meta service at {meta} admitted this service afresh: it may have declared it lost and removed its objects (or restarted), so its catalog is dropped, not handed over",
                        a.rank
                    )));
                    self.discard_catalog(admitted, out);
                } else if a.fresh && !hand_over {
                    // A new membership that took no catalog: what the catalog lists now (a
                    // commit answered since the join was sent) is of a membership the meta
                    // dropped with its blobs.
                    self.discard_catalog(admitted, out);
                } else if a.fresh {
                    out.push(Action::DropUnconfirmed);
                }
                // Continued: the membership this service reported under (the same epoch).
                if a.fresh || self.last_epoch != Some(a.epoch) {
                    out.push(Action::ResetAcks);
                }
                self.last_epoch = Some(a.epoch);
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
                self.rank_taken = false;
                self.phase = Phase::Member(Member {
                    meta,
                    rank: a.rank,
                    epoch: a.epoch,
                    interval_ms: a.heartbeat_interval_ms.max(10),
                    timeout_ms: a.heartbeat_timeout_ms.max(20),
                    ha: a.ha,
                    view: a.view,
                    lineage: a.lineage,
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
            JoinAnswer::Taken => {
                if let (None, Some(r), false) =
                    (self.config.rank, self.mounted_rank, self.rank_taken)
                {
                    out.push(Action::Warn(format!(
                        "the meta service at {meta} gave rank {r} to another local service: joining for any free rank, this service's catalog not handed over (its objects went with the rank)"
                    )));
                    self.rank_taken = true;
                }
            }
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
            BeatAnswer::Heard | BeatAnswer::CatalogTooLarge => {
                m.hand_over = false;
                m.last_heard_ms = now_ms;
                self.last_acked_send_ms = self.last_acked_send_ms.max(sent_ms);
                self.recovered = false;
                if (self.in_step, self.heard_by) != (m.view, m.lineage) {
                    (self.in_step, self.heard_by) = (m.view, m.lineage);
                    out.push(Action::InStep {
                        view: m.view,
                        lineage: m.lineage,
                    });
                }
                if !matches!(answer, BeatAnswer::CatalogTooLarge) {
                    return;
                }
                out.push(Action::Warn(format!(
                    "the meta service at {} refused this service's catalog as too large (ock.mmc.http.max_body_bytes): its objects are not handed over",
                    m.meta
                )));
                let at = Membership {
                    view: m.view,
                    epoch: m.epoch,
                };
                self.discard_catalog(at, out);
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
mod tests;
