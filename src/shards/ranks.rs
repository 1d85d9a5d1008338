//! Remote ranks: the local services on other hosts that lend this meta service their memory.
//!
//! The meta keeps one membership per rank that joined ([`crate::cluster::members`]: its
//! data-plane URL, its incarnation, the epoch its join was given, when it last reported, and
//! whether it is live, leaving or lost). Its segments are ordinary entries of the segment
//! table with a [`Backend::Remote`]: the store allocates their ranges and keeps their index like
//! any other segment's; only the bytes are elsewhere. A rank that stops reporting for
//! `ock.mmc.cluster.heartbeat_timeout_ms` is lost: shard 0's tick notices it and
//! [`Shard::drop_rank`] drops that membership's segments (objects with a copy elsewhere stay
//! readable). Segments are tagged with their membership's epoch, so dropping one membership's
//! never touches a later one's (a restarted service joined meanwhile).
//!
//! On a local service the same [`Shared`] holds [`LocalIdentity`]: the rank the meta gave it
//! and the meta's URL.

use arc_swap::ArcSwapOption;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// How soon a loss etcd did not take is recorded again.
const LOSS_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

use super::store::remote::RemoteRank;
use super::store::segment::{Backend, Medium, SegRef, Segment, SegmentStatus, segment_name};
use super::{Command, Reply, Shard};
pub use crate::cluster::members::MAX_RANK;
use crate::cluster::members::Members;

/// What a local service reports with each heartbeat: the client bandwidth figures of the
/// bytes it moved (its rank's window and cumulative figures per operation), and its SSD
/// file's figures when it lends one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankReport {
    pub client: Vec<crate::metrics::client::OpView>,
    /// The SSD directory (`disk_path`), empty without an SSD segment.
    pub ssd_path: String,
    /// The SSD file's status: 0 normal, else an errno (a faulted file).
    pub ssd_status: u8,
    /// Bytes read from and written to the SSD file per second over the metrics window.
    pub ssd_read_bps: u64,
    pub ssd_write_bps: u64,
}

/// The meta's table of remote ranks: the membership machine ([`Members`]) behind a mutex,
/// for the HTTP handlers of the membership messages and shard 0's loss check.
pub struct RankRegistry {
    /// Taken by joins, heartbeats (one per rank per interval) and shard 0's loss check;
    /// never by a data-plane request.
    // LOCK-OK: membership changes and reports only, never per request
    inner: Mutex<Members<RankReport>>,
    /// Whether this meta's listen address is a loopback one (resolved once: a host name is
    /// not looked up again on a shard for every join and heartbeat).
    loopback: std::sync::OnceLock<bool>,
}

impl RankRegistry {
    /// The registry of a meta process that started at `start_unix_ms`: its epochs begin
    /// above every earlier process's (`members::first_epoch`).
    pub fn new(start_unix_ms: u64) -> RankRegistry {
        let first = crate::cluster::members::first_epoch(start_unix_ms);
        RankRegistry {
            inner: Mutex::new(Members::with_first_epoch(first)), // LOCK-OK: see the field
            loopback: Default::default(),
        }
    }

    /// Whether `listen` (this meta's listen address) is a loopback address, resolved on the
    /// first call only.
    pub fn listens_on_loopback(&self, listen: &crate::config::HostPort) -> bool {
        *self.loopback.get_or_init(|| {
            listen
                .resolve()
                .map(|a| a.ip().is_loopback())
                .unwrap_or(false)
        })
    }

    /// The membership machine, for one step.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Members<RankReport>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ranks lost and not back yet.
    pub fn lost(&self) -> Vec<u32> {
        self.lock().lost()
    }

    /// The last report of a reporting rank.
    pub fn report(&self, rank: u32) -> Option<RankReport> {
        self.lock().report(rank)
    }
}

/// A local service's own view of its membership: set when it joins.
#[derive(Default)]
pub struct LocalIdentity {
    /// The rank the meta gave this local service (`u32::MAX` before it joined).
    rank: AtomicU32,
    /// The URL of the meta service it joined.
    meta_url: ArcSwapOption<String>,
    /// A graceful stop began: the agent leaves the meta service, then sets `left`.
    pub leaving: AtomicBool,
    pub left: AtomicBool,
    /// The epoch of the current membership (`set_epoch`).
    epoch: std::sync::atomic::AtomicU64,
    /// Admitted by a meta and not joining again (`set_joined`).
    joined: AtomicBool,
    /// The blobs this local service holds, handed to a meta that does not know them when it
    /// joins (`shards/store/catalog.rs`).
    // LOCK-OK: one short hold per blob written under a grant and per heartbeat, never per read
    pub catalog: Mutex<crate::cluster::catalog::Catalog>,
    /// When (process clock, ms) this service last answered a tier move whose copy awaits its `landed`
    /// record (0: none): the agent reports soon after, so the catalog learns it within tens of
    /// milliseconds rather than a heartbeat interval.
    pub moved_at_ms: std::sync::atomic::AtomicU64,
    /// Shared by every write under a grant of the current membership: revoked when the
    /// service joins again, so a body still arriving under the previous meta's grant stops
    /// writing into a range the next meta may have given to another object (an allocation the
    /// previous meta never committed is in no catalog, hence free there).
    writers: arc_swap::ArcSwap<super::store::WriterLink>,
    /// Same-host connections holding mapped answers read under the current membership's
    /// grants: shut down when the service joins again (`super::grant_reads`).
    pub grant_reads: super::grant_reads::GrantReads,
    /// The leadership (`view_version`) the catalog was last in step with: recovered with the
    /// SSD file at start, then kept by the agent (`cluster::agent::Action::InStep`).
    pub in_step: std::sync::atomic::AtomicU64,
    /// The lineage of the meta that last answered a heartbeat (`cluster::agent::Admission::lineage`),
    /// recorded and recovered with `in_step`.
    pub heard_by: std::sync::atomic::AtomicU64,
    /// Commits of writes under grants on their way to the meta (`remote.rs`): a join waits
    /// for their answers (`cluster::agent::COMMITS_WAIT_MS`).
    pub commits_in_flight: std::sync::atomic::AtomicUsize,
}

/// One commit on its way to the meta, counted while it lives ([`LocalIdentity::commit_in_flight`]).
pub struct CommitInFlight<'a> {
    commits_in_flight: &'a std::sync::atomic::AtomicUsize,
}

impl Drop for CommitInFlight<'_> {
    fn drop(&mut self) {
        self.commits_in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl LocalIdentity {
    /// Counts a commit on its way until the guard drops (a join waits for them).
    pub fn commit_in_flight(&self) -> CommitInFlight<'_> {
        self.commits_in_flight.fetch_add(1, Ordering::AcqRel);
        CommitInFlight {
            commits_in_flight: &self.commits_in_flight,
        }
    }

    pub fn new() -> LocalIdentity {
        LocalIdentity {
            rank: AtomicU32::new(u32::MAX),
            meta_url: ArcSwapOption::empty(),
            leaving: AtomicBool::new(false),
            left: AtomicBool::new(false),
            epoch: Default::default(),
            joined: AtomicBool::new(false),
            catalog: Mutex::new(Default::default()), // LOCK-OK: see `catalog`
            moved_at_ms: Default::default(),
            writers: Default::default(),
            grant_reads: Default::default(),
            in_step: Default::default(),
            heard_by: Default::default(),
            commits_in_flight: Default::default(),
        }
    }

    /// The epoch of the membership the meta admitted this service under (0 before).
    pub fn set_epoch(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::Release);
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Whether this service is a member of a meta service now (admitted, not joining again):
    /// `/ready` answers 200 only then.
    pub fn set_joined(&self, joined: bool) {
        self.joined.store(joined, Ordering::Release);
    }

    pub fn joined(&self) -> bool {
        self.joined.load(Ordering::Acquire)
    }

    pub fn set(&self, rank: u32, meta_url: String) {
        self.meta_url.store(Some(Arc::new(meta_url)));
        self.rank.store(rank, Ordering::Release);
    }

    pub fn rank(&self) -> Option<u32> {
        match self.rank.load(Ordering::Acquire) {
            u32::MAX => None,
            r => Some(r),
        }
    }

    pub fn meta_url(&self) -> Option<Arc<String>> {
        self.meta_url.load_full()
    }

    pub fn writer_link(&self) -> Arc<super::store::WriterLink> {
        self.writers.load_full()
    }

    /// Stops every write under a grant given so far (a new join begins).
    pub fn revoke_writers(&self) {
        self.writers.swap(Arc::default()).revoke();
    }

    pub fn catalog(&self) -> std::sync::MutexGuard<'_, crate::cluster::catalog::Catalog> {
        self.catalog.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl super::Shared {
    /// The mounted segments of remote rank `rank` (whatever membership mounted them).
    pub fn remote_segments_of(&self, rank: u32) -> Vec<Arc<Segment>> {
        self.segments
            .snapshot()
            .iter()
            .filter(|s| s.rank == rank && s.backend.remote().is_some())
            .cloned()
            .collect()
    }

    /// Takes membership `epoch` of `rank`'s segments out of the segment table at once and
    /// returns them: nothing is placed or read there from now on, and the rank's next
    /// membership can mount its own under the same names while these are dropped
    /// ([`Shard::drop_member_segments`]).
    pub fn unmount_member(&self, rank: u32, epoch: u64) -> Vec<Arc<Segment>> {
        let segs = self.member_segments(rank, epoch);
        for seg in &segs {
            seg.set_status(SegmentStatus::Unmounting);
            self.segments.remove_id(&seg.name, seg.id);
        }
        segs
    }

    /// The mounted segments of membership `epoch` of remote rank `rank`.
    pub fn member_segments(&self, rank: u32, epoch: u64) -> Vec<Arc<Segment>> {
        self.segments
            .snapshot()
            .iter()
            .filter(|s| s.rank == rank && s.backend.remote().is_some_and(|r| r.epoch == epoch))
            .cloned()
            .collect()
    }

    /// Membership `epoch` of `rank` takes no new put or redirect (its OK segments go
    /// UNDEFINED) until a heartbeat of it is a first one again: it is joining again, or was
    /// asked to give the rank up.
    pub fn undefine_member_segments(&self, rank: u32, epoch: u64) {
        for seg in self.member_segments(rank, epoch) {
            if seg.status() == SegmentStatus::Ok {
                seg.set_status(SegmentStatus::Undefined);
            }
        }
    }
}

/// Rounds of 10 s a dropped segment waits for blobs pinned by transfers on their way (each
/// bounded by a hop timeout) before it is left to the shards unforgotten.
const DROP_ROUNDS: u32 = 5;

impl Shard {
    /// The mounted segment of `rank` and `medium`, from this shard's cached view of the
    /// segment table: one atomic load while nothing was mounted or unmounted, no lock (a
    /// local service looks it up for every grant-carrying request).
    pub fn mounted_segment(&self, rank: u32, medium: Medium) -> Option<Arc<SegRef>> {
        self.store.borrow_mut().mounted(rank, medium)
    }

    /// Mounts a remote rank's segments (their bytes on the local service at `url`), UNDEFINED:
    /// nothing is placed on them until the rank's first heartbeat (`cluster.rs`) says its
    /// local service read the join's answer and holds the grant key (and, after a hand-over,
    /// until its catalog is adopted).
    pub fn mount_remote(
        &self,
        rank: u32,
        url: &str,
        incarnation: u64,
        epoch: u64,
        segments: &[(Medium, u64)],
    ) -> Result<(), String> {
        let shared = &self.shared;
        let master = shared
            .membership
            .grant_key
            .get()
            .ok_or("this meta service has no grant key")?;
        for &(medium, size) in segments {
            let seg = super::store::mount::build_remote_segment(
                &shared.segments,
                rank,
                medium,
                size,
                Backend::Remote(RemoteRank::new(
                    url.to_string(),
                    master.for_member(rank, incarnation, epoch),
                    epoch,
                )),
                shared.shard_count(),
                shared.config.store.run_bytes,
            )?;
            seg.set_status(SegmentStatus::Undefined);
            shared.segments.insert(seg)?;
            log::info!(
                "mounted remote segment {} ({size} bytes) at {url}",
                segment_name(rank, medium)
            );
        }
        Ok(())
    }

    /// Drops the segments of membership `epoch` of `rank`, whose bytes are gone or no longer
    /// this meta's (lost, restarted, left, or replaced by a join under a new leadership).
    pub async fn drop_rank(self: &Rc<Self>, rank: u32, epoch: u64) {
        let segs = self.shared.unmount_member(rank, epoch);
        self.drop_member_segments(rank, epoch, segs).await;
    }

    /// Drops the segments [`super::Shared::unmount_member`] took out of the table: their
    /// blobs on every shard (objects with no copy elsewhere removed), then every shard forgets
    /// them. The membership's freed log goes too: what its service held is no longer this
    /// meta's to describe.
    pub async fn drop_member_segments(
        self: &Rc<Self>,
        rank: u32,
        epoch: u64,
        segs: Vec<Arc<Segment>>,
    ) {
        self.shared.membership.freed_logs.retire(rank, epoch);
        self.drop_segments_keeping_log(rank, segs).await;
    }

    /// [`Shard::drop_member_segments`] without retiring the membership's freed log.
    async fn drop_segments_keeping_log(self: &Rc<Self>, rank: u32, segs: Vec<Arc<Segment>>) {
        for seg in &segs {
            self.drop_remote_segment(seg).await;
        }
        for s in self.shared.shards.iter() {
            s.client.forget_rank(rank);
        }
    }

    /// Drops one remote segment: its blobs on every shard (objects with no copy elsewhere
    /// removed), then the table entry, then every shard's share.
    pub async fn drop_remote_segment(self: &Rc<Self>, seg: &Arc<Segment>) {
        seg.set_status(SegmentStatus::Unmounting);
        let id = seg.id;
        // By id: a rank that joined again meanwhile has a new segment under the same name.
        self.shared.segments.remove_id(&seg.name, id);
        // A blob pinned by a transfer still on its way (a drain's move into this segment, a
        // tier move) is freed when that transfer ends, bounded by its hop timeout: the
        // segment is forgotten only once no shard holds a blob there (forgetting it earlier
        // would leave blobs on a segment no shard knows).
        for round in 0.. {
            let replies = self.broadcast(|| Command::DropSegment { seg: id }).await;
            if replies.iter().all(|r| matches!(r, Reply::Done)) {
                break;
            }
            if round == DROP_ROUNDS {
                log::error!(
                    "{}: blobs stayed pinned for {} s after it was dropped; its shards keep it until they end",
                    seg.name,
                    (DROP_ROUNDS + 1) * 10
                );
                return;
            }
            log::warn!(
                "{}: some blobs stayed pinned while it was dropped; waiting for them",
                seg.name
            );
        }
        let _ = self.broadcast(|| Command::Forget { seg: id }).await;
        log::warn!("dropped segment {}", seg.name);
    }

    /// Shard 0's part of the tick on a meta service: ranks silent past the heartbeat timeout
    /// are declared lost and dropped. With HA the loss is recorded in etcd first (a later
    /// leader then refuses that process's catalog too, `ha::losses`); until it is, removals
    /// waiting on the rank keep waiting (its freed log stays), since they must not rely on a
    /// loss a later leader would not know.
    pub(super) fn check_lost_ranks(self: &Rc<Self>) {
        let timeout = self.shared.config.cluster.heartbeat_timeout_ms;
        let now = self.shared.clock.now_ms();
        let lost: Vec<(u32, u64, u64, u64)> = {
            let mut members = self.shared.membership.ranks.lock();
            let expired = members.expire(now, timeout);
            expired
                .into_iter()
                .map(|(r, e)| {
                    let m = members.get(r);
                    (
                        r,
                        e,
                        m.map_or(0, |m| m.incarnation),
                        m.map_or(0, |m| m.view),
                    )
                })
                .collect()
        };
        // The leadership that declares these losses: their records are fenced by it, now and
        // when tried again.
        let fence = self.shared.ha.fence();
        for (rank, epoch, incarnation, view) in lost {
            log::error!("rank {rank} lost: no heartbeat for {timeout} ms; dropping its segments");
            // Its removals wait for the loss to be recorded, even if a join replaces it first.
            self.shared.membership.freed_logs.hold(rank, epoch);
            let me = self.clone();
            let membership = crate::cluster::members::Membership { view, epoch };
            let recorded = self
                .shared
                .ha
                .record_loss(rank, incarnation, membership, fence);
            monoio::spawn(async move {
                let segs = me.shared.unmount_member(rank, epoch);
                let mut outcome = recorded.recv_async().await;
                if let Ok(Ok(true)) = outcome {
                    me.shared.membership.freed_logs.settle(rank, epoch);
                    me.drop_segments_keeping_log(rank, segs).await;
                    return;
                }
                me.drop_segments_keeping_log(rank, segs).await;
                // Tried again until it lands or its leadership is over: until then the removals
                // of what the rank held stay unconfirmed and its keys' puts wait.
                let mut first = true;
                loop {
                    match outcome {
                        Ok(Ok(true)) => {
                            log::warn!("rank {rank}: its loss is recorded in etcd now");
                            me.shared.membership.freed_logs.settle(rank, epoch);
                            return;
                        }
                        Ok(Ok(false)) => {
                            log::error!(
                                "rank {rank}: its loss cannot be recorded: the leadership that declared it (view {fence}) is over; removals waiting on it stay unconfirmed"
                            );
                            me.shared.membership.freed_logs.abandon(rank, epoch);
                            return;
                        }
                        ref other if first => log::error!(
                            "rank {rank}: its loss could not be recorded in etcd ({other:?}); removals waiting on it are not confirmed until it is"
                        ),
                        _ => {}
                    }
                    first = false;
                    if me.shared.is_shutting_down() {
                        return;
                    }
                    monoio::time::sleep(LOSS_RETRY).await;
                    outcome = me
                        .shared
                        .ha
                        .record_loss(rank, incarnation, membership, fence)
                        .recv_async()
                        .await;
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_join_revokes_the_writes_under_earlier_grants() {
        let me = LocalIdentity::new();
        let before = me.writer_link();
        assert!(!before.is_revoked());
        me.revoke_writers();
        assert!(
            before.is_revoked(),
            "a body under the old meta's grant stops"
        );
        let after = me.writer_link();
        assert!(!after.is_revoked(), "grants of the new membership write");
        assert!(!Arc::ptr_eq(&before, &after));
    }
}
