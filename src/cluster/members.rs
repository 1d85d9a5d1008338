//! The meta service's membership machine: which local service holds each remote rank, under
//! which *membership* (a join's [`epoch`](Member::epoch)), and whether it is live, leaving or
//! lost.
//!
//! Pure: every input carries the time (`now_ms`, the process clock), nothing here reads a
//! clock, locks or does I/O. `shards::ranks::RankRegistry` holds one behind a mutex for the
//! HTTP handlers and shard 0's loss check; the cluster simulation drives it directly.
//!
//! Fencing. Every message a local service sends names its rank, its incarnation (one number
//! per process: its start time and a random part, [`incarnation`]) and the epoch its join was
//! answered with. A message whose three do not
//! name the rank's current membership changes nothing: a heartbeat, a leave, a catalog of an
//! earlier process, or of an earlier membership of the same process (one declared lost, then
//! joined again), is refused. Epochs come from one counter per meta process, so two
//! memberships of a rank never share one, and a rank's segments are mounted under their
//! membership's epoch: dropping a membership's segments never touches its successor's.

use std::collections::BTreeMap;

use crate::common::medium::Medium;

/// Milliseconds of the Unix clock at which incarnations begin to count (2020-09-13): 41 bits
/// of milliseconds from there last until 2090.
const INCARNATION_EPOCH_MS: u64 = 1_600_000_000_000;

/// Bits of an incarnation below its start time (the random part).
const INCARNATION_RANDOM_BITS: u32 = 12;

/// A local service process's incarnation: its start time (milliseconds of the Unix clock) in
/// the high bits, `random` in the 12 low ones; 53 bits in all, so JSON numbers carry it
/// exactly. Two runs of a service on a rank are told apart by it, and ordered: a join of a
/// run that started before the rank's live membership's is of a process that was replaced
/// (its message came late) and is refused ([`Members::join`]).
pub fn incarnation(start_unix_ms: u64, random: u64) -> u64 {
    let ms = start_unix_ms.saturating_sub(INCARNATION_EPOCH_MS);
    ((ms << INCARNATION_RANDOM_BITS) | (random & ((1 << INCARNATION_RANDOM_BITS) - 1)))
        & ((1 << 53) - 1)
}

/// The epoch a meta process that started at `start_unix_ms` (Unix clock) hands out first,
/// less one ([`Members::with_first_epoch`]): its start time in the high bits, as for an
/// incarnation, so the epochs of a later process on the same address follow those of an
/// earlier one (4096 joins per millisecond of its life would be needed to reach them) and a
/// membership message of the earlier process never names one of the later. Such a message
/// does reach it: a heartbeat sent to a meta that had died, whose connection attempt a
/// crawling or cut link kept retrying until the restarted meta listened, was taken as the
/// first heartbeat of the membership the same service had just been given (epochs began at 1
/// in every process), without the catalog that heartbeat was to bring: its segments served,
/// a put took the range of an object the catalog listed, and that object was lost (found by
/// the cluster simulation, seed 28161 with two metas).
pub fn first_epoch(start_unix_ms: u64) -> u64 {
    incarnation(start_unix_ms, 0)
}

/// Whether the process of incarnation `a` started before that of `b` (by their start times;
/// the same millisecond is not before).
pub fn started_before(a: u64, b: u64) -> bool {
    (a >> INCARNATION_RANDOM_BITS) < (b >> INCARNATION_RANDOM_BITS)
}

/// Whether a join for a rank that another local service (another URL) holds, live or
/// leaving, takes precedence over it: then the holder is asked to give the rank up (it is
/// told `TAKEN_BY_ANOTHER` when it asks for the rank again, and its membership ends by the
/// heartbeat timeout), and the join takes the rank after; else the join is refused saying the
/// rank is taken. A service configured with the rank takes precedence over one that was given
/// it (lowest free while the configured one was away, say after a meta restart without HA),
/// whatever their start times; one that was given the rank never over a configured one. Else,
/// both configured or both given it, the one that started later does (a restart on another
/// host, or two services given one rank by two meta processes; the incarnations' random parts
/// order two that started in the same millisecond). So a rank ends with one holder: two
/// services asking for it do not displace each other in turn (found by the cluster
/// simulation with automatic ranks, seed 21: a configured service was refused for as long as
/// the service given its rank lived).
fn takes_over<R>(j: &JoinRequest<'_>, e: &Member<R>) -> bool {
    match (j.holds_configured(), e.configured) {
        (true, false) => true,
        (false, true) => false,
        // By the whole incarnation: two started in the same millisecond are ordered by their
        // random parts, so one of them keeps the rank (with `!started_before` both took it,
        // each from the other, at every heartbeat: the cluster simulation with automatic ranks,
        // seed 37759, two services given rank 1 started at once).
        _ => j.incarnation > e.incarnation,
    }
}

/// Whether a join comes from the process that holds membership `e`: the same incarnation at the
/// same URL. The incarnation alone does not say it: two services that started in the same
/// millisecond draw the same 12 random bits once in 4096 times, and the second one's join was
/// taken for the first one asking again, given its membership (the cluster simulation with
/// automatic ranks, calm, seed 46188: both then reported under it).
fn same_process<R>(j: &JoinRequest<'_>, e: &Member<R>) -> bool {
    e.incarnation == j.incarnation && e.url == j.url
}

/// In a join's refusal: the rank asked for is held by another local service (another URL)
/// that keeps it ([`takes_over`]). A service that asked for the rank it was given before
/// (none configured) asks for any free rank next, its catalog not following (`agent.rs`,
/// `JoinAnswer::Taken`): else it would ask for that rank, and be refused, for as long as the
/// other lives (found by the cluster simulation with automatic ranks, seed 19).
pub const TAKEN_BY_ANOTHER: &str = "is held by another local service";

/// The highest rank a local service may take (ranks are 42-bit-shifted in gvas; this keeps
/// them within a u32 and well clear of embedded ones).
pub const MAX_RANK: u32 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    /// Joined and reporting (its segments may still be UNDEFINED until its first heartbeat).
    Live,
    /// A graceful leave is being carried out (its objects are drained to other ranks). The
    /// service keeps reporting meanwhile, so it is not declared lost while it waits.
    Leaving,
    /// No report for the heartbeat timeout: its segments are (being) dropped; its
    /// `memcache_metric_stale` is 1 until it joins again. The membership stays recorded so
    /// that the same process coming back is told its catalog is void.
    Lost,
}

#[derive(Clone, Debug)]
pub struct Member<R> {
    pub url: String,
    pub incarnation: u64,
    /// This membership's number, unique in this meta process: what every later message of the
    /// service must name, and what the rank's mounted segments are tagged with.
    pub epoch: u64,
    /// The leadership (`view_version`, 0 without HA) the rank joined under: a membership from
    /// an earlier leadership of this meta is stale (the rank must join again, with its
    /// catalog, since another leader may have changed what it holds meanwhile).
    pub view: u64,
    pub state: MemberState,
    pub last_seen_ms: u64,
    pub segments: Vec<(Medium, u64)>,
    /// The service holds the rank because it is configured with it (`JoinRequest::configured`),
    /// not because it was given it: a configured service asking for it takes it over from one
    /// that was given it ([`takes_over`]).
    pub configured: bool,
    /// A service that takes precedence asked for the rank ([`takes_over`]): this membership's
    /// heartbeats are refused and its join is told the rank is taken, until it is declared
    /// lost by the heartbeat timeout and that service takes the rank.
    pub yielding: bool,
    /// The last report (`None`: none since this membership began).
    pub report: Option<R>,
    /// A join was answered and no heartbeat came since: the rank's segments stay UNDEFINED
    /// (no put is placed there, nobody is sent there to write) until one does, since only a
    /// heartbeat proves the local service read the answer and holds the grant key.
    awaiting_beat: bool,
    /// Joined fresh saying its catalog follows: its next heartbeat carries it.
    awaiting_catalog: bool,
    /// A heartbeat named this membership: the service read the join's answer.
    heard: bool,
    /// What the join that began this membership decided of the service's catalog (and the
    /// leadership it missed): a repeated join no heartbeat followed yet is answered the same,
    /// since the service may never have read the first answer.
    fate: (CatalogFate, Option<u64>),
}

/// What a join says.
#[derive(Clone, Debug)]
pub struct JoinRequest<'a> {
    pub view: u64,
    /// The rank asked for: the configured one, or the one the service was given before and
    /// holds blobs under; `None` for the lowest free one at or above `first_free`.
    pub wanted: Option<u32>,
    /// `wanted` is the service's configured rank (`"rank_configured": true`), not one it was
    /// given: between two services asking for a rank, the configured one keeps it
    /// ([`takes_over`]). Meaningless without `wanted` (then never counted).
    pub configured: bool,
    pub url: &'a str,
    pub incarnation: u64,
    pub segments: Vec<(Medium, u64)>,
    pub catalog_follows: bool,
    /// The leadership (`view_version`) the service's catalog was last in step with: the view
    /// of the last membership whose heartbeat it saw answered (0: none, or no HA). With HA, a
    /// catalog that missed a leadership which served (it never reported to it) is void: that
    /// leader may have put newer versions of its keys, or deleted them, and is gone with its
    /// tombstones.
    pub in_step: u64,
    /// The membership whose admission told the service to drop its catalog last (it began
    /// afresh then), `Membership::default()` when it never did in this incarnation: a loss an
    /// earlier leader recorded of a membership before it voids nothing the catalog lists.
    pub catalog_since: Membership,
    /// The catalog was recovered from an earlier process's SSD journal and no heartbeat of
    /// this process was answered yet: it is in step with `in_step` only up to that process's
    /// end. It is adopted only by the meta lineage that heard that process last (`heard_by`:
    /// the leadership under HA, the meta process without), which has the tombstones of what
    /// it removed since (deletes it confirmed through the end of that membership, while the
    /// journal still listed the blobs); any other would bring those back.
    pub recovered: bool,
    /// The lineage (`catalog::stamp_view`) of the meta that last answered a heartbeat of the
    /// service (or of the process whose journal it recovered); 0: none known.
    pub heard_by: u64,
    /// This meta's lineage.
    pub lineage: u64,
    /// The first rank above this meta's embedded ones.
    pub first_free: u32,
    pub now_ms: u64,
}

impl JoinRequest<'_> {
    /// The rank asked for is the service's configured one ([`JoinRequest::configured`], which
    /// counts only with a rank asked for: then the rank joined is that one).
    fn holds_configured(&self) -> bool {
        self.configured && self.wanted.is_some()
    }
}

/// A membership across leaderships: the leadership (`view_version`) that admitted it and its
/// epoch there (epochs start again with each leader), ordered as they were admitted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Membership {
    pub view: u64,
    pub epoch: u64,
}

impl Membership {
    /// What a loss record without a membership stands for (written before records named
    /// one): every catalog of that process is void.
    pub const UNKNOWN: Membership = Membership {
        view: u64::MAX,
        epoch: u64::MAX,
    };
}

/// A membership a leader declared lost, as recorded in etcd (`ha::losses`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LostMembership {
    pub rank: u32,
    pub incarnation: u64,
    pub membership: Membership,
}

/// What becomes of the catalog a joining service holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CatalogFate {
    /// Adopted from the first heartbeat after the join, which carries it.
    Follows,
    /// None comes (or a repeated join leaves an awaited one awaited).
    None,
    /// The service must drop it without handing it over: its membership was declared lost,
    /// and this meta removed its copies (and answered deletes) relying on that.
    Discard,
}

/// What a join decided.
#[derive(Debug, PartialEq, Eq)]
pub struct Joined {
    pub rank: u32,
    pub epoch: u64,
    /// A new membership (not the same one asking again): its segments are mounted anew.
    pub fresh: bool,
    /// The service knew this membership before this join: the same membership asking again
    /// after a heartbeat named it (the meta continued the one the service reported under).
    /// False for a fresh one, and for a repeated join of a membership no heartbeat named yet:
    /// the service may never have read the earlier answer (lost, or a duplicated request's
    /// first answer), so to it the membership is new. What the answer's `fresh` says.
    pub continued: bool,
    /// The epoch of the membership this join replaces, whose segments are dropped (a restart
    /// faster than the heartbeat timeout, a lost rank back, a membership of an earlier
    /// leadership).
    pub retire: Option<u64>,
    pub catalog: CatalogFate,
    /// The catalog is void because it missed this leadership, which served.
    pub missed: Option<u64>,
    /// The catalog is void because it was recovered from an SSD journal another meta lineage
    /// heard last (`JoinRequest::recovered`).
    pub stale_recovery: bool,
}

/// How a heartbeat was taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Beat {
    /// Not the rank's current membership: answered 409, nothing changed (join again).
    Refused,
    Plain,
    /// The first heartbeat after a join: the rank's UNDEFINED segments turn OK; with
    /// `catalog`, it carries the catalog to adopt first.
    First {
        catalog: bool,
    },
}

/// The meta's table of remote ranks.
#[derive(Debug)]
pub struct Members<R> {
    ranks: BTreeMap<u32, Member<R>>,
    /// The last epoch handed out.
    epoch: u64,
    /// Memberships an earlier leader declared lost, from etcd, by (rank, incarnation): the
    /// same process joining this leader with a catalog that began before or in the lost
    /// membership is told it is void, as if this meta had declared it lost.
    lost_elsewhere: BTreeMap<(u32, u64), Membership>,
    /// The leaderships (`view_version`s) that served, from etcd (each records itself before it
    /// serves): a catalog last in step with a view before one of them missed it.
    served: std::collections::BTreeSet<u64>,
}

impl<R> Default for Members<R> {
    fn default() -> Self {
        Members {
            ranks: BTreeMap::new(),
            epoch: 0,
            lost_elsewhere: Default::default(),
            served: Default::default(),
        }
    }
}

impl<R> Members<R> {
    /// No member yet; the first epoch handed out is `after + 1` ([`first_epoch`]).
    pub fn with_first_epoch(after: u64) -> Self {
        Members {
            epoch: after,
            ..Members::default()
        }
    }
}

impl<R: Clone> Members<R> {
    /// The memberships earlier leaders declared lost (a new leader loads them from etcd
    /// before it serves).
    pub fn note_lost(&mut self, lost: impl IntoIterator<Item = LostMembership>) {
        for l in lost {
            let at = self
                .lost_elsewhere
                .entry((l.rank, l.incarnation))
                .or_default();
            *at = (*at).max(l.membership);
        }
    }

    /// The leaderships that served (a new leader loads them from etcd, its own included,
    /// before it serves).
    pub fn note_served(&mut self, views: impl IntoIterator<Item = u64>) {
        self.served.extend(views);
    }

    /// A leadership that served after `in_step` and before `view`: what a catalog last in step
    /// with `in_step` missed.
    pub fn missed(&self, in_step: u64, view: u64) -> Option<u64> {
        if in_step.saturating_add(1) >= view {
            return None;
        }
        self.served.range(in_step + 1..view).next_back().copied()
    }

    /// Admits a local service.
    pub fn join(&mut self, j: JoinRequest<'_>) -> Result<Joined, String> {
        // A run of a service whose later run (same URL) holds a live membership, on whatever
        // rank: a late message of a replaced process. Checked on the asked rank alone, a dead
        // run's join delayed past its successor's (given another rank, having found its own
        // taken) was admitted, a membership nobody would ever report under (the cluster
        // simulation with automatic ranks, calm, seed 196032: its freed log, kept aside, never
        // settled).
        if let Some(e) = self.ranks.values().find(|e| {
            e.url == j.url
                && e.state != MemberState::Lost
                && started_before(j.incarnation, e.incarnation)
        }) {
            return Err(format!(
                "this local service's later run (incarnation {}) is live; this run (incarnation {}) was replaced",
                e.incarnation, j.incarnation
            ));
        }
        let rank = match j.wanted {
            Some(r) if r < j.first_free => {
                return Err(format!(
                    "rank {r} is one of this meta service's embedded ranks (0 to {})",
                    j.first_free - 1
                ));
            }
            Some(r) if r > MAX_RANK => return Err(format!("rank {r} is above {MAX_RANK}")),
            Some(r) => r,
            None => {
                // The same service asking again (its answer was lost) keeps its rank; one
                // coming back with the same URL gets its old number again.
                // Not a rank it was asked to give up for another service (`yielding`).
                let mine = self
                    .ranks
                    .iter()
                    .find(|(_, e)| e.url == j.url && e.incarnation == j.incarnation && !e.yielding)
                    .or_else(|| {
                        self.ranks.iter().find(|(_, e)| {
                            e.url == j.url && e.state == MemberState::Lost && !e.yielding
                        })
                    })
                    .map(|(&r, _)| r);
                match mine {
                    Some(r) => r,
                    None => (j.first_free..=MAX_RANK)
                        .find(|r| !self.ranks.contains_key(r))
                        .ok_or("no free rank")?,
                }
            }
        };
        let mut catalog = if j.catalog_follows {
            CatalogFate::Follows
        } else {
            CatalogFate::None
        };
        // A catalog the service began afresh after the lost membership (it was told to drop
        // the one it had, and joined again) lists none of that membership's blobs.
        if self
            .lost_elsewhere
            .get(&(rank, j.incarnation))
            .is_some_and(|&lost| lost >= j.catalog_since)
        {
            catalog = CatalogFate::Discard;
        }
        let missed = if j.catalog_follows {
            self.missed(j.in_step, j.view)
        } else {
            None
        };
        if missed.is_some() {
            catalog = CatalogFate::Discard;
        }
        let stale_recovery = j.catalog_follows && j.recovered && j.heard_by != j.lineage;
        if stale_recovery {
            catalog = CatalogFate::Discard;
        }
        let retire = match self.ranks.get_mut(&rank) {
            // The service was asked to give the rank up for another (`yielding`): it is told
            // the rank is taken (with none configured it asks for any free rank next, its
            // catalog not following), and the membership ends by the heartbeat timeout. Lost
            // since, it does not take the rank back either: the other one does.
            Some(e) if same_process(&j, e) && e.view == j.view && e.yielding => {
                return Err(format!(
                    "rank {rank} {TAKEN_BY_ANOTHER}: this service was asked to give it up for one that takes precedence (configured with it, or started later)"
                ));
            }
            Some(e) if same_process(&j, e) && e.view == j.view => match e.state {
                // The same membership asking again, saying now that its catalog does not
                // follow while this meta still waits for it (no heartbeat named the
                // membership yet): the service gave the membership up past the heartbeat
                // timeout, and drops its catalog unless the answer continues a membership it
                // knew. A new membership then, whose answer it drops the catalog on, and the
                // first heartbeat of this one, with the catalog and maybe still on its way, is
                // refused: continued, that heartbeat would have adopted the catalog's objects
                // at blobs the service's catalog no longer listed (found by the cluster
                // simulation, seed 455359: the join answered first, the late heartbeat
                // adopted, the service dropped its catalog, and a failover would have lost
                // them).
                MemberState::Live if !j.catalog_follows && e.awaiting_catalog && !e.heard => {
                    Some(e.epoch)
                }
                // The other way round: the join that began the membership said no catalog
                // follows and this one, no heartbeat having named the membership, says one
                // does (a commit answered since, the first join a late copy of an earlier
                // attempt). Answered with the first one's verdict, the service hands its
                // catalog over and this meta, awaiting none, ignores it: listed, not held,
                // and a failover brings it back (found by the cluster simulation, seed
                // 1072231 with three metas: a join sent while the meta was dead reached it
                // once it led, 2 s later, and began the membership). A new membership then,
                // decided on this join.
                MemberState::Live
                    if j.catalog_follows && e.fate.0 == CatalogFate::None && !e.heard =>
                {
                    Some(e.epoch)
                }
                MemberState::Live => {
                    // The same membership asking again (its answer was lost): nothing changes,
                    // but its next heartbeat is a first one again (it dropped its grant key
                    // when it began to join), and an awaited catalog stays awaited.
                    // Until a heartbeat shows the service read an answer, it gets the first
                    // one's verdict on its catalog again (a void catalog told "none" would be
                    // kept, unknown to this meta, and handed to the next leader); after, the
                    // verdict was carried out and is not repeated.
                    e.awaiting_beat = true;
                    let (catalog, missed) = if e.heard {
                        (CatalogFate::None, None)
                    } else {
                        e.fate
                    };
                    return Ok(Joined {
                        rank,
                        epoch: e.epoch,
                        fresh: false,
                        continued: e.heard,
                        retire: None,
                        catalog,
                        missed,
                        stale_recovery: false,
                    });
                }
                MemberState::Leaving => {
                    return Err(format!("rank {rank} is leaving; it cannot join again now"));
                }
                MemberState::Lost => {
                    // Back from a freeze or a partition: this meta dropped its copies and
                    // answered deletes relying on that, so what its catalog lists is void.
                    catalog = CatalogFate::Discard;
                    Some(e.epoch)
                }
            },
            // Another local service (another URL) holds the rank, live or leaving, and keeps
            // it: a service asking again for the rank it was given takes any free one instead
            // when told so (`TAKEN_BY_ANOTHER`).
            Some(e) if e.state != MemberState::Lost && e.url != j.url && !takes_over(&j, e) => {
                let why = if e.configured && !j.holds_configured() {
                    "configured with it, while this one was given it".to_string()
                } else {
                    format!(
                        "which started after this one (incarnation {})",
                        j.incarnation
                    )
                };
                return Err(format!(
                    "rank {rank} {TAKEN_BY_ANOTHER} ({}, incarnation {}), {why}",
                    e.url, e.incarnation
                ));
            }
            // Another local service holds the rank and this one takes precedence. Its membership
            // is not ended here: that service still holds blobs its catalog lists, and a drop
            // made here would be recorded nowhere, so a later leader (or this meta restarted)
            // would adopt that catalog over what was put or deleted since (found by the
            // cluster simulation with automatic ranks, seed 74485: an older value read after a
            // newer put). It is asked to give the rank up instead: its heartbeats are refused,
            // its join for the rank is told the rank is taken, and the membership ends as any
            // silent one does, declared lost after the heartbeat timeout (its loss recorded in
            // etcd under HA, so no leader adopts its catalog), after which this service's join
            // takes the rank. A leaving holder keeps it until its drain is over.
            Some(e) if e.state != MemberState::Lost && e.url != j.url => {
                if e.state == MemberState::Leaving {
                    return Err(format!(
                        "rank {rank} is held by another local service ({}), which is leaving it; join again once it has left",
                        e.url
                    ));
                }
                e.yielding = true;
                return Err(format!(
                    "rank {rank} is held by another local service ({}, incarnation {}), which is asked to give it up: this one takes it once that membership has ended (within the heartbeat timeout)",
                    e.url, e.incarnation
                ));
            }
            // A join of a process that started before the one holding the rank: it was
            // replaced by a restart, and its join came late (a crawling link). Taking it would
            // drop the live process's objects without its knowing why, and leave them in its
            // catalog for the next leader to adopt over newer puts (found by the cluster
            // simulation, seed 23586 with three metas). Once the live one is lost, any joins.
            Some(e)
                if e.state != MemberState::Lost
                    && e.url == j.url
                    && started_before(j.incarnation, e.incarnation) =>
            {
                return Err(format!(
                    "rank {rank} is held by a later run of its local service (incarnation {}); this run (incarnation {}) was replaced",
                    e.incarnation, j.incarnation
                ));
            }
            Some(e) if e.state != MemberState::Lost && e.view == j.view && j.wanted.is_none() => {
                return Err(format!("rank {rank} is taken by {}", e.url));
            }
            // A membership of an earlier leadership of this meta (or another process on the
            // rank). Lost there, it voids the catalog only through its loss record, loaded
            // from etcd with every election (`note_lost`): a loss whose record etcd did not
            // take was relied on by nothing (a leader resuming from a freeze declares every
            // rank lost before it finds its leadership gone), and the service has since handed
            // its catalog to the leaders that followed, with what they put (found by the
            // cluster soak: 361 puts acknowledged by the next leader lost when this one won
            // again).
            Some(e) => Some(e.epoch),
            None => None,
        };
        self.epoch += 1;
        let configured = j.holds_configured();
        self.ranks.insert(
            rank,
            Member {
                url: j.url.to_string(),
                incarnation: j.incarnation,
                epoch: self.epoch,
                view: j.view,
                state: MemberState::Live,
                last_seen_ms: j.now_ms,
                segments: j.segments,
                configured,
                yielding: false,
                report: None,
                awaiting_beat: true,
                awaiting_catalog: catalog == CatalogFate::Follows,
                heard: false,
                fate: (catalog, missed),
            },
        );
        Ok(Joined {
            rank,
            epoch: self.epoch,
            fresh: true,
            continued: false,
            retire,
            catalog,
            missed,
            stale_recovery,
        })
    }

    /// Whether `(rank, incarnation, epoch)` names the rank's current membership, reporting
    /// under `view` (live or leaving).
    fn current(
        &mut self,
        view: u64,
        rank: u32,
        incarnation: u64,
        epoch: u64,
    ) -> Option<&mut Member<R>> {
        self.ranks.get_mut(&rank).filter(|e| {
            e.incarnation == incarnation
                && e.epoch == epoch
                && e.view == view
                && e.state != MemberState::Lost
        })
    }

    /// A heartbeat.
    pub fn heartbeat(
        &mut self,
        view: u64,
        rank: u32,
        incarnation: u64,
        epoch: u64,
        report: R,
        now_ms: u64,
    ) -> Beat {
        let Some(e) = self
            .current(view, rank, incarnation, epoch)
            .filter(|e| !e.yielding)
        else {
            return Beat::Refused;
        };
        e.last_seen_ms = e.last_seen_ms.max(now_ms);
        e.report = Some(report);
        e.heard = true;
        if std::mem::take(&mut e.awaiting_beat) {
            Beat::First {
                catalog: std::mem::take(&mut e.awaiting_catalog),
            }
        } else {
            Beat::Plain
        }
    }

    /// A graceful leave begins: false when the message is not the current membership's. The
    /// member stays (leaving, still reporting) until [`Members::left`].
    pub fn leave(&mut self, view: u64, rank: u32, incarnation: u64, epoch: u64) -> bool {
        match self.current(view, rank, incarnation, epoch) {
            Some(e) if e.state == MemberState::Live => {
                e.state = MemberState::Leaving;
                true
            }
            _ => false,
        }
    }

    /// The leave of membership `epoch` was carried out (or its mount failed): the rank is
    /// forgotten (no stale series: it said goodbye). A later membership is left alone.
    pub fn left(&mut self, rank: u32, epoch: u64) -> bool {
        if self.ranks.get(&rank).is_some_and(|e| e.epoch == epoch) {
            self.ranks.remove(&rank);
            true
        } else {
            false
        }
    }

    /// Marks memberships silent for longer than `timeout_ms` as lost and returns them (rank,
    /// epoch): their segments are to be dropped.
    pub fn expire(&mut self, now_ms: u64, timeout_ms: u64) -> Vec<(u32, u64)> {
        let mut lost = Vec::new();
        for (&r, e) in self.ranks.iter_mut() {
            if e.state != MemberState::Lost && now_ms.saturating_sub(e.last_seen_ms) > timeout_ms {
                e.state = MemberState::Lost;
                lost.push((r, e.epoch));
            }
        }
        lost
    }

    /// Ranks lost and not back yet.
    pub fn lost(&self) -> Vec<u32> {
        self.ranks
            .iter()
            .filter(|(_, e)| e.state == MemberState::Lost)
            .map(|(&r, _)| r)
            .collect()
    }

    /// The last report of a reporting rank (live or leaving; `None`: lost, or no report since
    /// it joined).
    pub fn report(&self, rank: u32) -> Option<R> {
        self.ranks
            .get(&rank)
            .filter(|e| e.state != MemberState::Lost)
            .and_then(|e| e.report.clone())
    }

    pub fn entries(&self) -> Vec<(u32, Member<R>)> {
        self.ranks.iter().map(|(&r, e)| (r, e.clone())).collect()
    }

    /// The current membership of `rank`, whatever its state.
    pub fn get(&self, rank: u32) -> Option<&Member<R>> {
        self.ranks.get(&rank)
    }

    /// The epoch of `rank`'s membership when it was asked to give the rank up for another
    /// service ([`Member::yielding`]): a join refused for that reason leaves it taking no new
    /// put (its segments UNDEFINED) until its membership ends.
    pub fn yielding(&self, rank: u32) -> Option<u64> {
        self.ranks
            .get(&rank)
            .filter(|m| m.yielding)
            .map(|m| m.epoch)
    }

    /// Whether membership `epoch` of `rank` is current and not lost.
    pub fn is_current(&self, rank: u32, epoch: u64) -> bool {
        self.ranks
            .get(&rank)
            .is_some_and(|e| e.epoch == epoch && e.state != MemberState::Lost)
    }
}

#[cfg(test)]
mod tests;
