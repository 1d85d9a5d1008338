//! The meta service's membership machine: which local service holds each remote rank, under
//! which *membership* (a join's [`epoch`](Member::epoch)), and whether it is live, leaving or
//! lost.
//!
//! Pure: every input carries the time (`now_ms`, the process clock), nothing here reads a
//! clock, locks or does I/O. `shards::ranks::RankRegistry` holds one behind a mutex for the
//! HTTP handlers and shard 0's loss check; the cluster simulation drives it directly.
//!
//! Fencing. Every message a local service sends names its rank, its incarnation (a random
//! number per process) and the epoch its join was answered with. A message whose three do not
//! name the rank's current membership changes nothing: a heartbeat, a leave, a catalog of an
//! earlier process, or of an earlier membership of the same process (one declared lost, then
//! joined again), is refused. Epochs come from one counter per meta process, so two
//! memberships of a rank never share one, and a rank's segments are mounted under their
//! membership's epoch: dropping a membership's segments never touches its successor's.

use std::collections::BTreeMap;

use crate::common::medium::Medium;

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
    /// The configured rank, `None` for the lowest free one at or above `first_free`.
    pub wanted: Option<u32>,
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
                let mine = self
                    .ranks
                    .iter()
                    .find(|(_, e)| e.url == j.url && e.incarnation == j.incarnation)
                    .or_else(|| {
                        self.ranks
                            .iter()
                            .find(|(_, e)| e.url == j.url && e.state == MemberState::Lost)
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
            Some(e) if e.incarnation == j.incarnation && e.view == j.view => match e.state {
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
        let Some(e) = self.current(view, rank, incarnation, epoch) else {
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

    /// Whether membership `epoch` of `rank` is current and not lost.
    pub fn is_current(&self, rank: u32, epoch: u64) -> bool {
        self.ranks
            .get(&rank)
            .is_some_and(|e| e.epoch == epoch && e.state != MemberState::Lost)
    }
}

#[cfg(test)]
mod tests {
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
}
