//! Remote ranks: the local services on other hosts that lend this meta service their memory.
//!
//! The meta keeps one [`RankEntry`] per rank that joined: its data-plane URL, its incarnation
//! (a restarted local service is a new incarnation, its memory empty), when it last reported,
//! and whether it is live, lost or leaving. Its segments are ordinary entries of the segment
//! table with a [`Backend::Remote`]: the store allocates their ranges and keeps their index like
//! any other segment's; only the bytes are elsewhere. A rank that stops reporting for
//! `ock.mmc.cluster.heartbeat_timeout_ms` is lost: shard 0's tick notices it and
//! [`Shard::drop_rank`] drops its segments (objects with a copy elsewhere stay readable).
//!
//! On a local service the same [`Cluster`] holds [`LocalIdentity`]: the rank the meta gave it
//! and the meta's URL.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;

use super::store::remote::RemoteRank;
use super::store::segment::{Backend, Medium, SegRef, Segment, SegmentStatus, segment_name};
use super::{Command, Reply, Shard};

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankState {
    Live,
    /// No report for `heartbeat_timeout_ms`: its segments are (being) dropped; its
    /// `memcache_metric_stale` is 1 until it joins again.
    Lost,
}

#[derive(Clone, Debug)]
pub struct RankEntry {
    pub url: String,
    pub incarnation: u64,
    pub last_seen: Instant,
    pub state: RankState,
    pub segments: Vec<(Medium, u64)>,
    /// The last report (`None`: none since the rank joined).
    pub report: Option<RankReport>,
    /// The leadership (`view_version`, 0 without HA) the rank joined under: a membership from
    /// an earlier leadership of this meta is stale (the rank must join again, with its
    /// catalog, since another leader may have changed what it holds meanwhile).
    pub view: u64,
    /// Joined fresh saying its catalog follows: its next heartbeat carries it.
    pub awaiting_catalog: bool,
    /// A join was answered and no heartbeat came since: the rank's segments stay UNDEFINED
    /// (no put is placed there, nobody is sent there to write) until one does, since only a
    /// heartbeat proves the local service read the answer and holds the grant key.
    pub awaiting_beat: bool,
}

/// What a join decided.
#[derive(Debug, PartialEq, Eq)]
pub struct Joined {
    pub rank: u32,
    /// The rank was still live under another incarnation (a restart faster than the
    /// heartbeat timeout): its old segments must be dropped before the new ones are mounted.
    pub replaced: bool,
    /// A new membership (not the same incarnation asking again): anything still mounted for
    /// the rank is from an earlier one and is dropped before its segments are mounted.
    pub fresh: bool,
}

/// The meta's table of remote ranks.
#[derive(Default)]
pub struct RankRegistry {
    /// Taken by joins, heartbeats (one per rank per interval) and shard 0's loss check;
    /// never by a data-plane request.
    // LOCK-OK: membership changes and reports only, never per request
    inner: Mutex<BTreeMap<u32, RankEntry>>,
    /// Whether this meta's listen address is a loopback one (resolved once: a host name is
    /// not looked up again on a shard for every join and heartbeat).
    loopback: std::sync::OnceLock<bool>,
}

/// The highest rank a local service may take (ranks are 42-bit-shifted in gvas; this keeps
/// them within a u32 and well clear of embedded ones).
pub const MAX_RANK: u32 = 1 << 20;

impl RankRegistry {
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

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, RankEntry>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a local service: `wanted` is its configured rank, `None` for the lowest free
    /// one at or above `first_free` (the embedded ranks come first).
    #[allow(clippy::too_many_arguments)] // what a join says, plus the leadership and the time
    pub fn join(
        &self,
        view: u64,
        wanted: Option<u32>,
        url: &str,
        incarnation: u64,
        segments: Vec<(Medium, u64)>,
        first_free: u32,
        now: Instant,
    ) -> Result<Joined, String> {
        let mut ranks = self.lock();
        let rank = match wanted {
            Some(r) if r < first_free => {
                return Err(format!(
                    "rank {r} is one of this meta service's embedded ranks (0 to {})",
                    first_free - 1
                ));
            }
            Some(r) if r > MAX_RANK => return Err(format!("rank {r} is above {MAX_RANK}")),
            Some(r) => r,
            None => {
                // The same service asking again (its answer was lost) keeps its rank; one
                // coming back with the same URL gets its old number again.
                let mine = ranks
                    .iter()
                    .find(|(_, e)| e.url == url && e.incarnation == incarnation)
                    .or_else(|| {
                        ranks
                            .iter()
                            .find(|(_, e)| e.url == url && e.state == RankState::Lost)
                    })
                    .map(|(&r, _)| r);
                match mine {
                    Some(r) => r,
                    None => (first_free..=MAX_RANK)
                        .find(|r| !ranks.contains_key(r))
                        .ok_or("no free rank")?,
                }
            }
        };
        let replaced = match ranks.get(&rank) {
            Some(e)
                if e.state == RankState::Live && e.incarnation == incarnation && e.view == view =>
            {
                // The same service asking again (its answer was lost): nothing changes.
                return Ok(Joined {
                    rank,
                    replaced: false,
                    fresh: false,
                });
            }
            Some(e) if e.state == RankState::Live && e.view == view && wanted.is_none() => {
                return Err(format!("rank {rank} is taken by {}", e.url));
            }
            Some(e) => e.state == RankState::Live,
            None => false,
        };
        ranks.insert(
            rank,
            RankEntry {
                url: url.to_string(),
                incarnation,
                last_seen: now,
                state: RankState::Live,
                segments,
                report: None,
                view,
                awaiting_catalog: false,
                awaiting_beat: true,
            },
        );
        Ok(Joined {
            rank,
            replaced,
            fresh: true,
        })
    }

    /// A heartbeat: false when the rank is unknown, lost, another incarnation or joined under
    /// another leadership (the local service must join again).
    pub fn heartbeat(
        &self,
        view: u64,
        rank: u32,
        incarnation: u64,
        report: RankReport,
        now: Instant,
    ) -> bool {
        let mut ranks = self.lock();
        match ranks.get_mut(&rank) {
            Some(e)
                if e.incarnation == incarnation && e.state == RankState::Live && e.view == view =>
            {
                e.last_seen = now;
                e.report = Some(report);
                true
            }
            _ => false,
        }
    }

    /// A join was answered: the rank's next heartbeat is its first (its segments turn OK
    /// then). `catalog` says whether that heartbeat carries the rank's catalog (a fresh join;
    /// `None`, a repeated one, leaves an awaited catalog awaited).
    pub fn await_first_beat(&self, rank: u32, catalog: Option<bool>) {
        if let Some(e) = self.lock().get_mut(&rank) {
            e.awaiting_beat = true;
            if let Some(c) = catalog {
                e.awaiting_catalog = c;
            }
        }
    }

    /// True once per answered join: the heartbeat that follows it (the rank's segments turn
    /// OK), with whether the join awaited a catalog (this heartbeat carries it).
    pub fn take_first_beat(&self, rank: u32) -> Option<bool> {
        let mut ranks = self.lock();
        let e = ranks.get_mut(&rank)?;
        std::mem::take(&mut e.awaiting_beat).then(|| std::mem::take(&mut e.awaiting_catalog))
    }

    /// Marks ranks silent for longer than `timeout` as lost and returns them.
    pub fn expire(&self, now: Instant, timeout: Duration) -> Vec<u32> {
        let mut ranks = self.lock();
        let mut lost = Vec::new();
        for (&r, e) in ranks.iter_mut() {
            if e.state == RankState::Live && now.duration_since(e.last_seen) > timeout {
                e.state = RankState::Lost;
                lost.push(r);
            }
        }
        lost
    }

    /// A graceful leave: the rank is forgotten (no stale series: it said goodbye).
    pub fn leave(&self, rank: u32, incarnation: u64) -> bool {
        let mut ranks = self.lock();
        match ranks.get(&rank) {
            Some(e) if e.incarnation == incarnation => {
                ranks.remove(&rank);
                true
            }
            _ => false,
        }
    }

    /// Ranks lost and not back yet.
    pub fn lost(&self) -> Vec<u32> {
        self.lock()
            .iter()
            .filter(|(_, e)| e.state == RankState::Lost)
            .map(|(&r, _)| r)
            .collect()
    }

    /// The last report of a live rank (`None`: not live, or no report since it joined).
    pub fn report(&self, rank: u32) -> Option<RankReport> {
        self.lock()
            .get(&rank)
            .filter(|e| e.state == RankState::Live)
            .and_then(|e| e.report.clone())
    }

    pub fn entries(&self) -> Vec<(u32, RankEntry)> {
        self.lock().iter().map(|(&r, e)| (r, e.clone())).collect()
    }

    pub fn is_live(&self, rank: u32, incarnation: u64) -> bool {
        self.lock()
            .get(&rank)
            .is_some_and(|e| e.state == RankState::Live && e.incarnation == incarnation)
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
    /// The blobs this local service holds, handed to a meta that does not know them when it
    /// joins (`shards/catalog.rs`).
    // LOCK-OK: one short hold per blob written under a grant and per heartbeat, never per read
    pub catalog: Mutex<super::catalog::Catalog>,
    /// When (Unix ms) this service last answered a tier move whose copy awaits its `landed`
    /// record (0: none): the agent reports soon after, so the catalog learns it within tens of
    /// milliseconds rather than a heartbeat interval.
    pub moved_at_ms: std::sync::atomic::AtomicU64,
    /// Shared by every write under a grant of the current membership: revoked when the
    /// service joins again, so a body still arriving under the previous meta's grant stops
    /// writing into a range the next meta may have given to another object (an allocation the
    /// previous meta never committed is in no catalog, hence free there).
    writers: arc_swap::ArcSwap<super::store::WriterLink>,
}

impl LocalIdentity {
    pub fn new() -> LocalIdentity {
        LocalIdentity {
            rank: AtomicU32::new(u32::MAX),
            meta_url: ArcSwapOption::empty(),
            leaving: AtomicBool::new(false),
            left: AtomicBool::new(false),
            catalog: Mutex::new(Default::default()), // LOCK-OK: see `catalog`
            moved_at_ms: Default::default(),
            writers: Default::default(),
        }
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

    pub fn catalog(&self) -> std::sync::MutexGuard<'_, super::catalog::Catalog> {
        self.catalog.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl super::Cluster {
    /// The mounted segments of remote rank `rank`.
    pub fn remote_segments_of(&self, rank: u32) -> Vec<Arc<Segment>> {
        self.segments
            .snapshot()
            .iter()
            .filter(|s| s.rank == rank && s.backend.remote().is_some())
            .cloned()
            .collect()
    }
}

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
        segments: &[(Medium, u64)],
    ) -> Result<(), String> {
        let cluster = &self.cluster;
        let master = cluster
            .grant_key
            .get()
            .ok_or("this meta service has no grant key")?;
        for &(medium, size) in segments {
            let seg = super::store::mount::build_remote_segment(
                &cluster.segments,
                rank,
                medium,
                size,
                Backend::Remote(RemoteRank::new(
                    url.to_string(),
                    master.for_member(rank, incarnation),
                )),
                cluster.shard_count(),
                cluster.config.store.run_bytes,
            )?;
            seg.set_status(SegmentStatus::Undefined);
            cluster.segments.insert(seg)?;
            log::info!(
                "mounted remote segment {} ({size} bytes) at {url}",
                segment_name(rank, medium)
            );
        }
        Ok(())
    }

    /// Drops every segment of a rank whose bytes are gone (lost, restarted or left): its
    /// blobs are dropped on every shard (objects with no copy elsewhere removed), then the
    /// segments leave the table and every shard forgets them.
    pub async fn drop_rank(self: &Rc<Self>, rank: u32) {
        for seg in self.cluster.remote_segments_of(rank) {
            self.drop_remote_segment(&seg).await;
        }
        for s in self.cluster.shards.iter() {
            s.client.forget_rank(rank);
        }
    }

    /// Drops one remote segment: its blobs on every shard (objects with no copy elsewhere
    /// removed), then the table entry, then every shard's share.
    pub async fn drop_remote_segment(self: &Rc<Self>, seg: &Arc<Segment>) {
        seg.set_status(SegmentStatus::Unmounting);
        let id = seg.id;
        let replies = self.broadcast(|| Command::DropSegment { seg: id }).await;
        if replies.iter().any(|r| !matches!(r, Reply::Done)) {
            log::warn!(
                "{}: some blobs stayed pinned while it was dropped",
                seg.name
            );
        }
        // By id: a rank that joined again meanwhile has a new segment under the same name.
        self.cluster.segments.remove_id(&seg.name, id);
        let _ = self.broadcast(|| Command::Forget { seg: id }).await;
        log::warn!("dropped segment {}", seg.name);
    }

    /// Shard 0's part of the tick on a meta service: ranks silent past the heartbeat timeout
    /// are declared lost and dropped.
    pub(super) fn check_lost_ranks(self: &Rc<Self>) {
        let timeout = Duration::from_millis(self.cluster.config.cluster.heartbeat_timeout_ms);
        for rank in self.cluster.ranks.expire(Instant::now(), timeout) {
            log::error!(
                "rank {rank} lost: no heartbeat for {} ms; dropping its segments",
                timeout.as_millis()
            );
            let me = self.clone();
            monoio::spawn(async move { me.drop_rank(rank).await });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs() -> Vec<(Medium, u64)> {
        vec![(Medium::Dram, 1 << 20)]
    }

    #[test]
    fn ranks_are_assigned_lowest_first_and_kept_by_incarnation() {
        let reg = RankRegistry::default();
        let t = Instant::now();
        assert_eq!(
            reg.join(0, None, "http://a", 1, segs(), 1, t).unwrap().rank,
            1
        );
        assert_eq!(
            reg.join(0, None, "http://b", 2, segs(), 1, t).unwrap().rank,
            2
        );
        // The same incarnation again: the same answer, nothing replaced.
        assert_eq!(
            reg.join(0, None, "http://a", 1, segs(), 1, t),
            Ok(Joined {
                rank: 1,
                replaced: false,
                fresh: false
            })
        );
        // A configured rank below the embedded ones is refused; a taken one without a
        // configured rank is not reassigned.
        assert!(reg.join(0, Some(0), "http://c", 3, segs(), 1, t).is_err());
        // A restart of rank 2 (new incarnation, same configured rank) replaces it.
        assert_eq!(
            reg.join(0, Some(2), "http://b", 4, segs(), 1, t),
            Ok(Joined {
                rank: 2,
                replaced: true,
                fresh: true
            })
        );
        assert!(!reg.heartbeat(0, 2, 2, RankReport::default(), t));
        assert!(reg.heartbeat(0, 2, 4, RankReport::default(), t));
    }

    #[test]
    fn the_first_heartbeat_after_each_join_is_taken_once() {
        let reg = RankRegistry::default();
        let t = Instant::now();
        let r = reg.join(0, None, "http://a", 1, segs(), 0, t).unwrap().rank;
        reg.await_first_beat(r, Some(true));
        assert!(reg.heartbeat(0, r, 1, RankReport::default(), t));
        assert_eq!(
            reg.take_first_beat(r),
            Some(true),
            "with the awaited catalog"
        );
        assert!(reg.heartbeat(0, r, 1, RankReport::default(), t));
        assert_eq!(reg.take_first_beat(r), None, "later heartbeats are plain");
        // The same service joining again (its answer lost): the next heartbeat is a first one
        // again; a catalog awaited stays awaited.
        reg.await_first_beat(r, Some(true));
        reg.await_first_beat(r, None);
        assert_eq!(reg.take_first_beat(r), Some(true));
        reg.await_first_beat(r, Some(false));
        assert_eq!(reg.take_first_beat(r), Some(false));
        assert_eq!(reg.take_first_beat(99), None, "an unknown rank");
    }

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

    #[test]
    fn silent_ranks_are_lost_until_they_join_again() {
        let reg = RankRegistry::default();
        let t = Instant::now();
        reg.join(0, None, "http://a", 1, segs(), 0, t).unwrap();
        reg.join(0, None, "http://b", 2, segs(), 0, t).unwrap();
        let later = t + Duration::from_millis(3500);
        assert!(reg.heartbeat(0, 1, 2, RankReport::default(), later));
        assert_eq!(reg.expire(later, Duration::from_millis(3000)), vec![0]);
        assert_eq!(reg.lost(), vec![0]);
        // Lost once: not reported again; its heartbeats are refused (it must rejoin).
        assert!(reg.expire(later, Duration::from_millis(3000)).is_empty());
        assert!(!reg.heartbeat(0, 0, 1, RankReport::default(), later));
        // It comes back (a restart: a new incarnation) under its old number.
        let back = reg.join(0, None, "http://a", 3, segs(), 0, later).unwrap();
        assert_eq!(
            back,
            Joined {
                rank: 0,
                replaced: false,
                fresh: true
            }
        );
        assert!(reg.lost().is_empty());
        // Under a new leadership of this meta the membership is stale: heartbeats are refused
        // and the same incarnation's join is a fresh one (it brings its catalog).
        assert!(!reg.heartbeat(8, 0, 3, RankReport::default(), later));
        let again = reg.join(8, None, "http://a", 3, segs(), 0, later).unwrap();
        assert!(again.fresh && again.replaced && again.rank == 0);
        assert!(reg.heartbeat(8, 0, 3, RankReport::default(), later));
        assert!(reg.leave(0, 3));
        assert!(!reg.is_live(0, 3));
    }
}
