//! A simulated meta service: the real membership machine ([`Members`]), freed logs
//! ([`FreedLogs`]) and [`Store`] (one shard, the local services' segments mounted per
//! membership), and the glue the HTTP handlers are (`http/handlers/cluster.rs` join,
//! heartbeat, leave; `freed.rs` removals that wait for their barriers; `remote.rs` grants and
//! commits; `shards/ranks.rs` the drop of a membership's segments), kept as close to them as a
//! page allows. Each `fn` says which handler it mirrors.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::ha::Elector;
use super::net::{JoinAsk, Rep, Req, Verdict};
use super::timing::*;
use super::world::Cx;
use super::{Key, Node, key_bytes};
use crate::cluster::agent::Admission;
use crate::cluster::catalog::{Adopted, BeatNews, Entry, FreedLogs, LogAnswer, Stamp};
use crate::cluster::members::{
    Beat, CatalogFate, JoinRequest, LostMembership, Members, Membership, TAKEN_BY_ANOTHER,
};
use crate::cluster::records::Removal;
use crate::common::clock::Clock;
use crate::grant::{Grant, GrantKey, GrantOp};
use crate::metrics::store::StoreStats;
use crate::shards::store::relocate::Move;
use crate::shards::store::remote::RemoteRank;
use crate::shards::store::segment::{Backend, Medium, Segment, SegmentStatus, SegmentTable};
use crate::shards::store::{ObjHandle, RereplicateLimits, Store, StoreConfig, mount};

/// The run size of the simulated segments.
const RUN_BYTES: u64 = 64 << 10;

/// A removal waiting for its barriers, and who to answer; or a put waiting for an older
/// copy's records to be applied (`freed.rs` `older_copies_unconfirmed`), then tried again.
struct Waiting {
    to: Node,
    call: u64,
    removal: Removal,
    results: Vec<Verdict>,
    /// A put's (key, pages, replicas).
    put: Option<(Key, u64, u8)>,
}

/// A membership whose segments are being dropped (`Shard::drop_member_segments`).
struct Dropping {
    rank: u32,
    epoch: u64,
    segs: Vec<Arc<Segment>>,
    /// Whether the objects it takes are lost by a documented rule (a lost, left or replaced
    /// process's), or expected back (the same process joined again with its catalog).
    documented: bool,
    retired: bool,
    /// The membership's freed log stays (`Shard::drop_segments_keeping_log`): its loss could
    /// not be recorded in etcd, so removals waiting on it must not take it as ended.
    keep_log: bool,
}

/// A loss being recorded in etcd (`shards/ranks.rs` `check_lost_ranks`, `ha/losses.rs`
/// `record_loss`): the rank's segments are unmounted; they are dropped once etcd answers.
pub(super) struct Recording {
    pub rank: u32,
    epoch: u64,
    pub incarnation: u64,
    /// The lost membership (its leadership and epoch), as the record names it.
    pub membership: Membership,
    segs: Vec<Arc<Segment>>,
    /// `record_loss` gives up then (the lease TTL).
    pub deadline: u64,
    /// The leadership that declared the loss: the record is fenced by it.
    pub fence: u64,
}

/// How an attempt to record a loss in etcd ended (`ha/losses.rs` `record_loss`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LossRecord {
    Recorded,
    /// The leadership that declared it is over: it will never be recorded.
    Over,
    /// etcd did not answer in time: tried again.
    Failed,
}

impl Recording {
    /// The same record, to try again (its segments stay with the first attempt's drop).
    fn again(&self) -> Recording {
        Recording {
            rank: self.rank,
            epoch: self.epoch,
            incarnation: self.incarnation,
            membership: self.membership,
            segs: Vec::new(),
            deadline: self.deadline,
            fence: self.fence,
        }
    }
}

/// A graceful leave being carried out: the drain (`cluster.rs` `leave`, `drain`).
struct Drain {
    rank: u32,
    epoch: u64,
    to: Node,
    call: u64,
    segs: Vec<Arc<Segment>>,
    /// The drain's decisions (`cluster::drain`), as the handler's.
    machine: crate::cluster::drain::Drain<u32>,
    moves: Vec<Move>,
    copying: Option<Move>,
    /// The freed logs' sequences when the last ask began, before its moves' blobs were
    /// allocated (`cluster.rs` `drain_segments`).
    floors: crate::cluster::catalog::Floors,
    /// The copy's write grant's floor (`copies.rs` `copy_floor`), from `floors`.
    floor: u64,
}

enum Call {
    Push {
        rank: u32,
        epoch: u64,
    },
    Fetch,
    Copy,
    /// A re-replication's fetch (false) or write (true).
    Rerepl(rerepl::Copy, bool),
}

pub(super) struct Meta {
    pub incarnation: u64,
    master: GrantKey,
    members: Members<()>,
    logs: FreedLogs,
    pub store: Store,
    table: Arc<SegmentTable>,
    pub ha: Option<Elector>,
    waiting: Vec<Waiting>,
    drops: Vec<Dropping>,
    /// Losses on their way to etcd (HA).
    pub recording: Vec<Recording>,
    drains: Vec<Drain>,
    calls: BTreeMap<u64, (u64, Call)>,
    keys: u16,
    /// When this process started: its stamps' view without HA (`Shared::lineage_ms`).
    lineage_ms: u64,
}

mod drain;
mod losses;
mod objects;
mod rerepl;

impl Meta {
    pub fn new(incarnation: u64, master: [u8; 32], ha: bool, keys: u16, now: u64) -> Meta {
        let table = Arc::new(SegmentTable::default());
        let cfg = StoreConfig {
            keep_tombstones: true,
            key_format: Default::default(),
            lease_ms: LEASE_MS,
            high_percent: 90,
            low_percent: 80,
            alloc_timeout_ms: ALLOC_TIMEOUT_MS,
            remote_writer_ms: REMOTE_WRITER_MS,
            rereplicate: RereplicateLimits {
                concurrency: 2,
                bytes_per_sec: 0,
                queue: 64,
            },
        };
        let stats = Arc::new(StoreStats::default());
        let mut store = Store::new(0, cfg, table.clone(), stats, Arc::default(), Clock::start());
        store.set_manual_clock(now);
        Meta {
            incarnation,
            master: GrantKey::from_bytes(master),
            // `RankRegistry::new`: epochs above every earlier process's on this address.
            members: Members::with_first_epoch(crate::cluster::members::first_epoch(
                super::world::UNIX_BASE_MS + now,
            )),
            logs: FreedLogs::default(),
            store,
            table,
            ha: ha.then(|| Elector::new(now)),
            waiting: Vec::new(),
            drops: Vec::new(),
            recording: Vec::new(),
            drains: Vec::new(),
            calls: BTreeMap::new(),
            keys,
            lineage_ms: now,
        }
    }

    /// `Shared::stamp_view`: the view new objects are stamped with.
    fn stamp_view(&self) -> u64 {
        crate::cluster::catalog::stamp_view(self.ha.as_ref().map(|h| h.view()), self.lineage_ms)
    }

    /// Whether this meta serves (HA: the leader, before its step-down deadline).
    pub fn serving(&self, now: u64) -> bool {
        self.ha.as_ref().is_none_or(|h| h.serving(now))
    }

    /// The leadership's `view_version` (0 without HA): `HaView::fence`.
    fn view(&self) -> u64 {
        self.ha.as_ref().map_or(0, |h| h.view())
    }

    /// `verdict()`'s gate: refused with 307 to the leader (or 503) unless serving.
    fn gate(&self, cx: &mut Cx, from: Node, call: u64) -> bool {
        if self.serving(cx.now) {
            return true;
        }
        let leader = self.ha.as_ref().and_then(|h| h.leader);
        cx.reply(from, call, Rep::NotLeader(leader));
        false
    }

    /// The stamps of every key of the workload (what a step dropped shows in their diff).
    fn stamps(&self) -> Vec<Option<Stamp>> {
        (0..self.keys)
            .map(|k| self.store.stamp_of(&key_bytes(k)))
            .collect()
    }

    /// Excuses the keys whose object a step dropped by a documented rule.
    fn excuse_gone(&self, cx: &mut Cx, before: &[Option<Stamp>], why: &str) {
        for (k, (b, a)) in before.iter().zip(self.stamps()).enumerate() {
            if b.is_some() && *b != a {
                cx.log(format!("k{k} dropped ({why})"));
                cx.ledger.excuse(k as Key, cx.now);
            }
        }
    }

    /// `Shard::after_store`: the remote blobs the store detached go to their ranks' logs.
    fn after_store(&mut self) {
        if self.store.has_freed_remote() {
            self.logs.push(self.store.take_freed_remote());
        }
    }

    pub fn handle(&mut self, cx: &mut Cx, from: Node, call: u64, req: Req) {
        self.store.set_manual_clock(cx.now);
        match req {
            Req::Join(ask) => self.join(cx, from, call, ask),
            Req::Beat {
                rank,
                incarnation,
                epoch,
                ack,
                catalog,
            } => self.heartbeat(cx, from, call, (rank, incarnation, epoch), ack, catalog),
            Req::Leave {
                rank,
                incarnation,
                epoch,
            } => self.leave(cx, from, call, (rank, incarnation, epoch)),
            Req::Commit {
                key,
                grant,
                next,
                ok,
            } => self.commit(cx, from, call, key, &grant, &next, ok),
            Req::Put {
                key,
                pages,
                replicas,
            } => self.put(cx, from, call, key, pages, replicas),
            Req::Get { key } => self.get(cx, from, call, key),
            Req::Delete { keys } => self.delete(cx, from, call, keys),
            Req::Push { .. } | Req::Write { .. } | Req::Read { .. } => {
                cx.reply(from, call, Rep::Done(Verdict::Failed))
            }
        }
        self.after_store();
        self.store.check();
    }

    /// `cluster.rs` `join`.
    fn join(&mut self, cx: &mut Cx, from: Node, call: u64, ask: JoinAsk) {
        let (incarnation, wanted, bytes) = (ask.incarnation, ask.rank, ask.bytes);
        if !self.gate(cx, from, call) {
            return;
        }
        let url = from.url();
        let before = self.members.entries();
        let joined = self.members.join(JoinRequest {
            view: self.view(),
            wanted,
            configured: ask.rank_configured,
            url: &url,
            incarnation,
            segments: vec![(Medium::Dram, bytes)],
            catalog_follows: ask.catalog_follows,
            in_step: if cx.mutations.adopt_missed_catalog {
                self.view()
            } else {
                ask.in_step
            },
            catalog_since: ask.catalog_since,
            recovered: ask.recovered,
            heard_by: ask.heard_by,
            lineage: self.stamp_view(),
            first_free: 1,
            now_ms: cx.now,
        });
        let joined = match joined {
            Ok(j) => j,
            Err(e) => {
                // `cluster.rs` `join`: a holder asked to give its rank up takes no new put.
                if let Some(rank) = wanted
                    && let Some(epoch) = self.members.yielding(rank)
                {
                    self.undefine_member_segments(rank, epoch);
                }
                cx.log(format!("refused a join from {url}: {e}"));
                cx.reply(from, call, Rep::JoinRefused(e.contains(TAKEN_BY_ANOTHER)));
                return;
            }
        };
        let (rank, epoch) = (joined.rank, joined.epoch);
        if joined.fresh {
            if let Some(old) = joined.retire {
                // The old membership's segments leave the table now and are dropped in the
                // background (after this answer).
                let same = before
                    .iter()
                    .any(|(r, m)| *r == rank && m.incarnation == incarnation);
                let segs = self.unmount_member(rank, old);
                self.drops.push(Dropping {
                    rank,
                    epoch: old,
                    segs,
                    documented: !same || joined.catalog != CatalogFate::Follows,
                    retired: true,
                    keep_log: false,
                });
            }
            self.logs.begin(rank, epoch);
            if cx.mutations.settle_replaced_at_join {
                // What `begin` did before: a replaced live membership's records go at once.
                self.logs.adopted(rank, epoch);
            }
            if let Err(e) = self.mount(rank, &url, incarnation, epoch, bytes) {
                cx.log(format!("could not mount rank {rank}'s segments: {e}"));
                self.members.left(rank, epoch);
                for seg in self.member_segments(rank, epoch) {
                    self.table.remove_id(&seg.name, seg.id);
                }
                cx.reply(from, call, Rep::JoinRefused(false));
                return;
            }
        } else {
            self.undefine_member_segments(rank, epoch);
        }
        let discard = joined.catalog == CatalogFate::Discard && !cx.mutations.adopt_lost_catalog;
        if joined.catalog == CatalogFate::Discard && !discard {
            cx.log(format!(
                "MUTATION adopt_lost_catalog: rank {rank} was declared lost; its catalog is not discarded"
            ));
        }
        cx.log(format!(
            "rank {rank} joined from {url} (incarnation {incarnation}, epoch {epoch}, {:?}{})",
            joined.catalog,
            joined
                .retire
                .map_or(String::new(), |r| format!(", retiring epoch {r}"))
        ));
        let key = self.master.for_member(rank, incarnation, epoch).to_hex();
        cx.reply(
            from,
            call,
            Rep::Admitted {
                admission: Admission {
                    rank,
                    epoch,
                    heartbeat_interval_ms: HB_INTERVAL_MS,
                    heartbeat_timeout_ms: HB_TIMEOUT_MS,
                    ha: self.ha.is_some(),
                    view: self.view(),
                    lineage: self.stamp_view(),
                    discard_catalog: discard,
                    fresh: !joined.continued,
                },
                key,
            },
        );
    }

    /// `Shard::mount_remote`.
    fn mount(
        &mut self,
        rank: u32,
        url: &str,
        incarnation: u64,
        epoch: u64,
        bytes: u64,
    ) -> Result<(), String> {
        let backend = Backend::Remote(RemoteRank::new(
            url.to_string(),
            self.master.for_member(rank, incarnation, epoch),
            epoch,
        ));
        let seg = mount::build_remote_segment(
            &self.table,
            rank,
            Medium::Dram,
            bytes,
            backend,
            1,
            RUN_BYTES,
        )?;
        seg.set_status(SegmentStatus::Undefined);
        self.table.insert(seg)
    }

    /// `Shared::member_segments`.
    fn member_segments(&self, rank: u32, epoch: u64) -> Vec<Arc<Segment>> {
        self.table
            .snapshot()
            .iter()
            .filter(|s| s.rank == rank && s.backend.remote().is_some_and(|r| r.epoch == epoch))
            .cloned()
            .collect()
    }

    /// `Shared::undefine_member_segments`.
    fn undefine_member_segments(&self, rank: u32, epoch: u64) {
        for seg in self.member_segments(rank, epoch) {
            if seg.status() == SegmentStatus::Ok {
                seg.set_status(SegmentStatus::Undefined);
            }
        }
    }

    /// `Shared::unmount_member`.
    fn unmount_member(&self, rank: u32, epoch: u64) -> Vec<Arc<Segment>> {
        let segs = self.member_segments(rank, epoch);
        for seg in &segs {
            seg.set_status(SegmentStatus::Unmounting);
            self.table.remove_id(&seg.name, seg.id);
        }
        segs
    }

    /// `Shared::remote_segments_of(rank).first()`'s grant key: what a commit is checked with.
    fn signing_key(&self, rank: u32) -> Option<Arc<GrantKey>> {
        self.table
            .snapshot()
            .iter()
            .find(|s| s.rank == rank)
            .and_then(|s| s.backend.remote())
            .map(|r| r.grant_key.clone())
    }

    /// The sender of a membership message as the handler takes it, with the view it is
    /// taken under: with fencing switched off, whatever it names is taken for the rank's
    /// current membership, of whatever leadership.
    fn sender(&self, cx: &mut Cx, who: (u32, u64, u64)) -> (u64, u32, u64, u64) {
        let (rank, incarnation, epoch) = who;
        if self
            .members
            .get(rank)
            .is_some_and(|m| (m.incarnation, m.epoch, m.view) != (incarnation, epoch, self.view()))
        {
            cx.counts.stale_messages += 1;
        }
        match self.members.get(rank) {
            Some(m) if cx.mutations.no_epoch_fencing => {
                let current = (m.view, rank, m.incarnation, m.epoch);
                if current != (self.view(), rank, incarnation, epoch) {
                    cx.log(format!(
                        "MUTATION no_epoch_fencing: a message of incarnation {incarnation}, epoch {epoch} taken for rank {rank}'s current membership (epoch {})",
                        m.epoch
                    ));
                }
                current
            }
            _ => (self.view(), rank, incarnation, epoch),
        }
    }

    /// `cluster.rs` `heartbeat`.
    fn heartbeat(
        &mut self,
        cx: &mut Cx,
        from: Node,
        call: u64,
        who: (u32, u64, u64),
        ack: u64,
        catalog: Option<Vec<Entry>>,
    ) {
        if !self.gate(cx, from, call) {
            return;
        }
        let (view, rank, incarnation, epoch) = self.sender(cx, who);
        let beat = self
            .members
            .heartbeat(view, rank, incarnation, epoch, (), cx.now);
        if beat == Beat::Refused {
            cx.reply(from, call, Rep::Forgotten);
            return;
        }
        let segs = self.member_segments(rank, epoch);
        if let Beat::First { catalog: adopt } = beat {
            if !adopt && cx.mutations.adopt_lost_catalog && catalog.is_some() {
                cx.log(format!(
                    "MUTATION adopt_lost_catalog: rank {rank}'s catalog is adopted though its membership was lost"
                ));
            }
            let adopt = adopt || (cx.mutations.adopt_lost_catalog && catalog.is_some());
            if adopt {
                let entries = catalog.unwrap_or_default();
                let offered = entries.len();
                let refused = self.adopt(rank, epoch, entries);
                cx.log(format!(
                    "rank {rank}: adopted {} of the {offered} blobs in its catalog",
                    offered - refused
                ));
            }
            self.logs.adopted(rank, epoch);
            for seg in &segs {
                if seg.status() == SegmentStatus::Undefined {
                    seg.set_status(SegmentStatus::Ok);
                }
            }
        }
        let news = match self.logs.answer(rank, ack) {
            LogAnswer::Records { seq, freed } => BeatNews {
                seq,
                freed,
                resync: None,
            },
            LogAnswer::Resync { seq } => {
                let list = self.store.rank_blobs(rank);
                BeatNews {
                    seq,
                    freed: Vec::new(),
                    resync: Some(list),
                }
            }
        };
        cx.reply(from, call, Rep::Heard(news));
        self.poll_removals(cx);
    }

    /// `cluster.rs` `adopt`: returns how many entries were refused (logged as freed).
    fn adopt(&mut self, rank: u32, epoch: u64, catalog: Vec<Entry>) -> usize {
        let offered = catalog
            .into_iter()
            .map(|entry| Adopted { rank, entry })
            .collect();
        let refused = self.store.adopt(offered);
        self.after_store();
        let n = refused.len();
        self.logs.push(refused.iter().map(|a| a.refused(epoch)));
        n
    }

    /// `cluster.rs` `leave`: the drain runs from the tick.
    fn leave(&mut self, cx: &mut Cx, from: Node, call: u64, who: (u32, u64, u64)) {
        if !self.gate(cx, from, call) {
            return;
        }
        let (view, rank, incarnation, epoch) = self.sender(cx, who);
        if !self.members.leave(view, rank, incarnation, epoch) {
            cx.reply(from, call, Rep::Left(false));
            return;
        }
        let segs = self.member_segments(rank, epoch);
        for seg in &segs {
            seg.set_status(SegmentStatus::GracefullyUnmounting);
        }
        cx.log(format!("rank {rank} (epoch {epoch}) leaves: draining"));
        let machine = crate::cluster::drain::Drain::new(segs.iter().map(|s| s.id), 1, cx.now);
        self.drains.push(Drain {
            rank,
            epoch,
            to: from,
            call,
            segs,
            machine,
            moves: Vec::new(),
            copying: None,
            floors: Default::default(),
            floor: 0,
        });
    }

    /// `remote.rs` `cluster_commit` and `commit_here`.
    #[allow(clippy::too_many_arguments)]
    fn commit(
        &mut self,
        cx: &mut Cx,
        from: Node,
        call: u64,
        key: Key,
        text: &str,
        next: &str,
        ok: bool,
    ) {
        if !self.gate(cx, from, call) {
            return;
        }
        let verdict = match Grant::rank_in(text).and_then(|r| self.signing_key(r)) {
            None => Verdict::Failed,
            Some(gk) => match Grant::verify(&gk, text, &key_bytes(key), next.as_bytes(), 0) {
                Ok(g) if g.op == GrantOp::WriteCommit => {
                    let obj = ObjHandle {
                        id: g.obj_id,
                        generation: g.obj_generation,
                    };
                    let found = self.store.commit(obj, ok);
                    self.after_store();
                    cx.log(format!(
                        "commit k{key} ({}.{}, ok {ok}): found {found}",
                        g.view, g.obj_generation
                    ));
                    match (found, ok) {
                        (true, true) => {
                            cx.ledger.committed(text, cx.now);
                            Verdict::Ok
                        }
                        (true, false) => Verdict::Failed,
                        (false, _) => Verdict::NotFound,
                    }
                }
                _ => Verdict::Failed,
            },
        };
        cx.reply(from, call, Rep::Done(verdict));
    }

    /// An answer to one of this meta's calls (a push, a drain's copy).
    pub fn on_reply(&mut self, cx: &mut Cx, call: u64, rep: Rep) {
        self.store.set_manual_clock(cx.now);
        let Some((_, c)) = self.calls.remove(&call) else {
            return;
        };
        match c {
            Call::Push { rank, epoch } => {
                let ack = match rep {
                    Rep::Pushed(a) => a,
                    _ => None,
                };
                self.logs.pushed(rank, epoch, ack);
                self.poll_removals(cx);
            }
            Call::Fetch | Call::Copy => self.copy_step(cx, Some(rep)),
            Call::Rerepl(c, written) => self.rerepl_answer(cx, c, written, rep),
        }
        self.after_store();
        self.store.check();
    }

    /// Housekeeping: the store's tick, losses (shard 0's `check_lost_ranks`), drops,
    /// removals, drains, calls past their deadline.
    pub fn tick(&mut self, cx: &mut Cx) {
        self.store.set_manual_clock(cx.now);
        self.store.tick();
        self.after_store();
        for (rank, epoch) in self.members.expire(cx.now, HB_TIMEOUT_MS) {
            cx.log(format!(
                "rank {rank} (epoch {epoch}) lost: no heartbeat for {HB_TIMEOUT_MS} ms"
            ));
            let (incarnation, view) = self
                .members
                .get(rank)
                .map_or((0, 0), |m| (m.incarnation, m.view));
            let segs = self.unmount_member(rank, epoch);
            if self.ha.is_some() {
                // The objects whose only copies were there are lost from now on (reads find
                // no copy, and the service, joining again, is told to drop its catalog),
                // whether or not the loss reaches etcd.
                let ids: Vec<_> = segs.iter().map(|s| s.id).collect();
                for k in 0..self.keys {
                    if self.store.readable_only_on(&key_bytes(k), &ids) {
                        cx.log(format!("k{k} lost with rank {rank} (its only copy)"));
                        cx.ledger.excuse(k as Key, cx.now);
                    }
                }
                // Recorded in etcd first (the world carries the call out): a later leader
                // then refuses this process's catalog too. Its removals wait for that.
                self.logs.hold(rank, epoch);
                let fence = self.view();
                self.recording.push(Recording {
                    rank,
                    epoch,
                    incarnation,
                    membership: Membership { view, epoch },
                    segs,
                    deadline: cx.now + HA_TTL_MS,
                    fence,
                });
                continue;
            }
            self.drops.push(Dropping {
                rank,
                epoch,
                segs,
                documented: true,
                retired: false,
                keep_log: false,
            });
        }
        self.run_drops(cx);
        for call in super::past_deadline(&self.calls, cx.now) {
            self.on_reply(cx, call, Rep::Unreachable);
        }
        self.poll_removals(cx);
        self.drain_step(cx);
        self.rereplicate_step(cx);
        self.after_store();
        self.store.check();
    }

    /// The memberships earlier leaders declared lost, loaded from etcd before a new
    /// leadership serves (`server.rs`'s recovery step, `Members::note_lost`).
    pub fn note_lost(&mut self, lost: impl IntoIterator<Item = LostMembership>) {
        self.members.note_lost(lost);
    }

    /// The leaderships that served, from etcd, before this one serves.
    pub fn note_served(&mut self, views: impl IntoIterator<Item = u64>) {
        self.members.note_served(views);
    }

    /// A new leader's purge of the objects it held (another leader served since it last
    /// led): `Command::RemoveAll` on every shard.
    pub fn purge(&mut self, cx: &mut Cx) {
        self.store.set_manual_clock(cx.now);
        let before = self.stamps();
        self.store.remove_all();
        while self.store.continue_purge() {}
        // `replica.rs` `ShardMsg::Purge`: catalogs handed over now come from the other
        // leader's lineage, which this node's removals do not concern.
        self.store.reset_tombstones();
        self.after_store();
        self.excuse_gone(cx, &before, "purged by a new leadership");
        self.store.check();
    }

    /// Whether membership `epoch` of `rank` is live here with its segments OK (the end of a
    /// run compares its catalog with what this meta holds there).
    pub fn holds(&self, rank: u32, epoch: u64) -> bool {
        self.members.is_current(rank, epoch)
            && self
                .member_segments(rank, epoch)
                .iter()
                .all(|s| s.status() == SegmentStatus::Ok)
    }

    /// Every removal answered, every log acknowledged, nothing dropping or draining.
    pub fn quiet(&self) -> bool {
        self.waiting.is_empty()
            && self.drops.is_empty()
            && self.recording.is_empty()
            && self.drains.is_empty()
            && self.logs.barrier(None).is_empty()
            && self.copies_in_flight() == 0
    }

    /// Re-replications begun and not finished: their destinations are allocated (the leader
    /// holds them) and not written yet, so no catalog lists them (seed 113168 with automatic
    /// ranks was taken for at rest while one had just begun).
    fn copies_in_flight(&self) -> usize {
        self.calls
            .values()
            .filter(|(_, c)| matches!(c, Call::Rerepl(..)))
            .count()
    }

    /// What keeps this meta from [`Meta::quiet`], for a report.
    pub fn busy(&self) -> String {
        format!(
            "{} removals waiting, {} drops, {} losses recording, {} drains, {} copies, barriers {:?}",
            self.waiting.len(),
            self.drops.len(),
            self.recording.len(),
            self.drains.len(),
            self.copies_in_flight(),
            self.logs.barrier(None)
        )
    }

    pub fn rank_blobs(&self, rank: u32) -> Vec<Entry> {
        self.store.rank_blobs(rank)
    }
}
