//! The meta's freed logs (`catalog.rs` describes the hand-over they serve): per remote rank,
//! the blobs the meta detached there and the tier moves it landed there, numbered, sent in the
//! heartbeat answers and pushes until the rank's local service acknowledges them; the barriers
//! a removal waits on; the resync of a log that overflowed.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use super::catalog::Freed;

/// Freed records one rank's log holds unacknowledged before it overflows (then: resync).
pub const LOG_CAPACITY: usize = 65_536;

/// Freed records sent in one heartbeat answer (the rest follow in the next ones).
pub const RECORDS_PER_BEAT: usize = 8192;

/// A freed (or landed) record as a shard notes it: the rank, the membership (epoch) whose
/// segment held the blob, the record, and a hash of the object's key ([`key_hash`]), by which
/// a removal finds the records it must see applied.
pub type Noted = (u32, u64, Freed, u64);

/// The hash of an object key that freed records carry on the meta (never sent).
pub fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

/// One rank's log of freed blobs on the meta.
#[derive(Default)]
struct FreedLog {
    /// The membership (`cluster::members` epoch) whose service the records are for; `None`
    /// for a log no membership began (it takes no record).
    epoch: Option<u64>,
    /// Records not acknowledged yet, oldest first, with their sequence numbers and key hashes.
    records: VecDeque<(u64, Freed, u64)>,
    /// The last sequence handed out.
    seq: u64,
    /// The highest sequence the service acknowledged (in a heartbeat or a push's answer).
    acked: u64,
    /// Records were dropped past [`LOG_CAPACITY`]: the next heartbeat resyncs.
    overflowed: bool,
    /// The sequence a resync was answered as of: until the service acknowledges it, every
    /// removal waits for it (its records were dropped from the log).
    floor: u64,
    /// A push of the records to the service is on its way ([`FreedLogs::take_push`]).
    pushing: bool,
    /// How many of `records` each key hash has ([`FreedLogs::unconfirmed`]).
    keys: HashMap<u64, u32>,
    /// Its membership was declared lost and the loss is not recorded yet ([`FreedLogs::hold`]).
    held: bool,
    /// Its loss will never be recorded ([`FreedLogs::abandon`]): it takes no record, and its
    /// barriers never pass.
    abandoned: bool,
    /// Held logs of earlier memberships of the rank that a join replaced before their loss was
    /// recorded, and live ones it replaced with records unacknowledged (at most
    /// [`UNSETTLED_KEPT`]): their removals stay unconfirmed until [`FreedLogs::settle`] (held)
    /// or until this membership acknowledges its catalog's adoption (`replaced`).
    unsettled: Vec<FreedLog>,
    /// On a log kept aside in `unsettled` because a join replaced its live membership: it
    /// settles once the current membership acknowledges this sequence of its own log (the
    /// records of its catalog's adoption); `u64::MAX` until that adoption ran
    /// ([`FreedLogs::adopted`]).
    replaced: Option<u64>,
}

/// Logs set aside with their records that a rank's current log keeps: past it, the oldest
/// drop their records and stay only as markers of their membership (see [`shed`]).
const UNSETTLED_KEPT: usize = 4;

/// Logs set aside (with records or as markers) a rank's current log keeps at most: a rank
/// that joined this many times while its losses went unrecorded (each removal waiting on
/// the oldest has ended past its deadline long before).
const MARKERS_KEPT: usize = 64;

/// Bounds the logs set aside: at most [`UNSETTLED_KEPT`] keep their records (the oldest
/// beyond drop them: new removals and puts of their keys no longer wait on them), and every
/// one stays as a marker of its membership, so a removal already waiting on it does not pass
/// by its absence (before, the oldest went altogether, and a removal waiting on an abandoned
/// loss's log, which never settles, was then confirmed). Markers past [`MARKERS_KEPT`] go.
fn shed(unsettled: &mut Vec<FreedLog>) {
    let mut with_records = unsettled.iter().filter(|u| u.pending()).count();
    for u in unsettled.iter_mut() {
        if with_records <= UNSETTLED_KEPT {
            break;
        }
        if u.pending() {
            u.clear_records();
            u.overflowed = false;
            u.floor = 0;
            u.pushing = false;
            with_records -= 1;
        }
    }
    if unsettled.len() > MARKERS_KEPT {
        let extra = unsettled.len() - MARKERS_KEPT;
        unsettled.drain(..extra);
    }
}

impl FreedLog {
    fn trim(&mut self, ack: u64) {
        self.acked = self.acked.max(ack.min(self.seq));
        let acked = self.acked;
        self.unsettled
            .retain(|u| u.replaced.is_none_or(|until| until > acked));
        while self
            .records
            .front()
            .is_some_and(|&(s, _, _)| s <= self.acked)
        {
            if let Some((_, _, k)) = self.records.pop_front() {
                self.forget_key(k);
            }
        }
    }

    fn forget_key(&mut self, k: u64) {
        if let Some(n) = self.keys.get_mut(&k) {
            *n -= 1;
            if *n == 0 {
                self.keys.remove(&k);
            }
        }
    }

    fn clear_records(&mut self) {
        self.records.clear();
        self.keys.clear();
    }

    /// A record of `key` may be unapplied on the service: one is unacknowledged, or the log
    /// overflowed or awaits its resync's acknowledgement (its records are unknown).
    fn unconfirmed(&self, key: u64) -> bool {
        self.overflowed || (self.floor > self.acked) || self.keys.contains_key(&key)
    }

    /// Some record may be unapplied on the service.
    fn pending(&self) -> bool {
        self.overflowed || (self.floor > self.acked) || !self.records.is_empty()
    }
}

/// The meta's freed logs, one per remote rank. Appended by the shards after a command that
/// detached remote blobs, read by heartbeats (one per rank per interval) and pushes; never
/// taken by a request for an object on a local rank.
#[derive(Default)]
pub struct FreedLogs {
    // LOCK-OK: removals of remote blobs and heartbeats only, held for a push or a copy
    inner: Mutex<HashMap<u32, FreedLog>>,
    /// Some membership ever began a log: until then (a server without local services) a
    /// removal has no barrier to look for and takes no lock.
    members: std::sync::atomic::AtomicBool,
}

/// The logs' sequences at one moment ([`FreedLogs::floors`]).
#[derive(Clone, Debug, Default)]
pub struct Floors(Vec<(u32, u64, u64)>);

impl Floors {
    /// The floor of a copy's write grant into membership `epoch` of `rank` (0 when that log
    /// began after the snapshot: all its records are above).
    pub fn of(&self, rank: u32, epoch: u64) -> u64 {
        self.0
            .iter()
            .find(|&&(r, e, _)| r == rank && e == epoch)
            .map_or(0, |&(_, _, seq)| seq)
    }
}

/// What a heartbeat gets from the log.
#[derive(Debug, PartialEq, Eq)]
pub enum LogAnswer {
    Records {
        seq: u64,
        freed: Vec<(u64, Freed)>,
    },
    /// The log overflowed: send the rank's full list, taken after this call, as of `seq`.
    Resync {
        seq: u64,
    },
}

/// What a removal waits for before it is answered: the record at `seq` of membership
/// `epoch`'s log of `rank` applied by its service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Barrier {
    pub rank: u32,
    pub epoch: u64,
    pub seq: u64,
}

/// Records to push to a rank's service now (`POST /cluster/v1/freed`).
#[derive(Debug, PartialEq, Eq)]
pub struct Push {
    pub epoch: u64,
    pub seq: u64,
    pub freed: Vec<(u64, Freed)>,
}

impl FreedLogs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, FreedLog>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends freed blobs of remote ranks, each to the log of the membership whose segment
    /// held it. A record of another membership goes nowhere: that membership's catalog is not
    /// the one this log keeps. (A process that joins again under a new leadership hands its
    /// catalog over again, and its objects are adopted afresh at the same ranges while the
    /// previous membership's segments are dropped: their records, same ranges and stamps,
    /// would drop those entries from the catalog, and a failover would lose the objects.)
    pub fn push(&self, freed: impl IntoIterator<Item = Noted>) {
        let mut logs = self.lock();
        for (rank, epoch, f, key) in freed {
            let Some(current) = logs.get_mut(&rank) else {
                continue;
            };
            // The membership's own log; or its held log, set aside by the join that replaced
            // it while its loss was not recorded: its records are never pushed (nobody
            // listens), but they hold their removals until the loss is recorded, as the
            // removals noted before the join are held. Dropped, a removal after the join was
            // confirmed at once, the service never read that join's answer (which voided its
            // catalog), the loss never reached etcd, and the next leader adopted the catalog
            // with the deleted key (found by the cluster simulation, calm seed 9941 with two
            // metas).
            let log = if current.epoch == Some(epoch) {
                Some(current)
            } else {
                current
                    .unsettled
                    .iter_mut()
                    .find(|u| u.epoch == Some(epoch) && u.held)
            };
            let Some(log) = log.filter(|l| !l.abandoned) else {
                continue;
            };
            log.seq += 1;
            if log.records.len() >= LOG_CAPACITY {
                log.clear_records();
                log.overflowed = true;
            }
            if !log.overflowed {
                let seq = log.seq;
                log.records.push_back((seq, f, key));
                *log.keys.entry(key).or_default() += 1;
            }
        }
    }

    /// Every log's last sequence now: the floors of copies whose blobs are allocated after
    /// this call (a drain's ask, a re-replication's turn). Taken before the allocation, it is
    /// below every record of the new blob (a removal of its object at any time after the
    /// allocation), so the local service holds such a record against the copy's late write;
    /// taken when the copy starts, a removal between the allocation and that moment would
    /// shield the write from its record.
    pub fn floors(&self) -> Floors {
        Floors(
            self.lock()
                .iter()
                .filter_map(|(&rank, l)| l.epoch.map(|e| (rank, e, l.seq)))
                .collect(),
        )
    }

    /// Membership `epoch` of `rank` begins (a fresh join): its log starts over, empty, at
    /// sequence 0. Records of an earlier membership go: its catalog is not this one's. A held
    /// earlier log (its loss not recorded yet) is kept aside, its removals unconfirmed until
    /// the loss is recorded (found by the cluster simulation, seed 12642 with three metas: the
    /// join that replaced a lost membership whose loss etcd had not taken confirmed a delete,
    /// the service never read that join's answer, and the next leader adopted its catalog).
    ///
    /// A live membership replaced with records its service has not acknowledged is kept aside
    /// too, until the new membership acknowledges its catalog's adoption
    /// ([`FreedLogs::adopted`]): the same process may hand the new membership the catalog
    /// those records were to trim, and until it has dropped what the adoption refused, a
    /// leader after a failover would take that catalog over, deleted objects included.
    pub fn begin(&self, rank: u32, epoch: u64) {
        self.members
            .store(true, std::sync::atomic::Ordering::Release);
        let mut logs = self.lock();
        let mut unsettled = Vec::new();
        if let Some(mut old) = logs.remove(&rank) {
            unsettled = std::mem::take(&mut old.unsettled);
            // Kept for an earlier adoption: now the new membership's counts.
            for u in &mut unsettled {
                if u.replaced.is_some() {
                    u.replaced = Some(u64::MAX);
                }
            }
            if old.epoch != Some(epoch) {
                if old.held {
                    unsettled.push(old);
                } else if old.pending() {
                    old.replaced = Some(u64::MAX);
                    unsettled.push(old);
                }
            }
            shed(&mut unsettled);
        }
        logs.insert(
            rank,
            FreedLog {
                epoch: Some(epoch),
                unsettled,
                ..Default::default()
            },
        );
    }

    /// The first heartbeat of membership `epoch` of `rank` took its catalog over (or there
    /// was none to take: the service dropped it): the logs of the live memberships its join
    /// replaced settle once the service acknowledges every record handed out so far, the
    /// adoption's refusals among them (so it has dropped what the adoption refused).
    pub fn adopted(&self, rank: u32, epoch: u64) {
        let mut logs = self.lock();
        let Some(log) = logs.get_mut(&rank).filter(|l| l.epoch == Some(epoch)) else {
            return;
        };
        let seq = log.seq;
        for u in &mut log.unsettled {
            if u.replaced == Some(u64::MAX) {
                u.replaced = Some(seq);
            }
        }
        let acked = log.acked;
        log.trim(acked);
    }

    /// Membership `epoch` of `rank` was declared lost; until [`FreedLogs::settle`] (its loss
    /// recorded) its removals are not confirmed by its end, even once a join replaced it.
    pub fn hold(&self, rank: u32, epoch: u64) {
        if let Some(l) = self
            .lock()
            .get_mut(&rank)
            .filter(|l| l.epoch == Some(epoch))
        {
            l.held = true;
        }
    }

    /// Membership `epoch` of `rank` ended (left, replaced): its log goes, unless a later
    /// membership's has replaced it or it is held. Removals waiting on it are answered (its
    /// catalog is void: a lost membership's is refused if it comes back, a left one's process
    /// is gone).
    pub fn retire(&self, rank: u32, epoch: u64) {
        let mut logs = self.lock();
        if logs
            .get(&rank)
            .is_some_and(|l| l.epoch == Some(epoch) && !l.held)
        {
            logs.remove(&rank);
        }
    }

    /// The loss of membership `epoch` of `rank` will never be recorded: the leadership that
    /// declared it is over. Removals waiting on its log stay unconfirmed (they end past their
    /// deadline: that leadership dropped the copies, but no later leader knows); its records
    /// go, so nothing new waits on them (a later leadership takes the service's catalog over
    /// afresh). The log stays held, kept aside by the rank's next join, so those waiting
    /// removals never pass.
    pub fn abandon(&self, rank: u32, epoch: u64) {
        let mut logs = self.lock();
        let Some(l) = logs.get_mut(&rank) else {
            return;
        };
        let log = if l.epoch == Some(epoch) {
            Some(l)
        } else {
            l.unsettled.iter_mut().find(|u| u.epoch == Some(epoch))
        };
        if let Some(log) = log.filter(|log| log.held) {
            log.abandoned = true;
            log.clear_records();
            log.overflowed = false;
            log.floor = 0;
            log.pushing = false;
        }
    }

    /// The loss of membership `epoch` of `rank` is recorded (or there is nothing to record:
    /// no HA): its log goes, held or not, current or kept aside, and removals waiting on it
    /// are answered.
    pub fn settle(&self, rank: u32, epoch: u64) {
        let mut logs = self.lock();
        let Some(l) = logs.get_mut(&rank) else {
            return;
        };
        if l.epoch == Some(epoch) {
            logs.remove(&rank);
        } else {
            l.unsettled.retain(|u| u.epoch != Some(epoch));
        }
    }

    /// A heartbeat that acknowledged `ack`: the records after it (at most
    /// [`RECORDS_PER_BEAT`]), or a resync when the log overflowed. Records up to `ack` are
    /// trimmed.
    pub fn answer(&self, rank: u32, ack: u64) -> LogAnswer {
        let mut logs = self.lock();
        let log = logs.entry(rank).or_default();
        if log.overflowed {
            log.overflowed = false;
            log.clear_records();
            log.floor = log.seq;
            return LogAnswer::Resync { seq: log.seq };
        }
        log.trim(ack);
        let freed = log
            .records
            .iter()
            .take(RECORDS_PER_BEAT)
            .map(|&(s, f, _)| (s, f))
            .collect::<Vec<_>>();
        // Nothing held past `ack`: everything up to the log's sequence was delivered.
        let seq = freed.last().map_or(log.seq, |r| r.0);
        LogAnswer::Records { seq, freed }
    }

    /// What a removal of the object with key hash `key` (every object: `None`) must see
    /// applied before it is answered: for each rank with such a record not yet acknowledged,
    /// the last one. Records of no membership's log are not waited for.
    pub fn barrier(&self, key: Option<u64>) -> Vec<Barrier> {
        let logs = self.lock();
        let mut out = Vec::new();
        let all = logs.iter().flat_map(|(&rank, l)| {
            std::iter::once((rank, l)).chain(l.unsettled.iter().map(move |u| (rank, u)))
        });
        for (rank, log) in all {
            let Some(epoch) = log.epoch else { continue };
            let last = if log.overflowed {
                Some(log.seq)
            } else {
                let record = log
                    .records
                    .iter()
                    .rev()
                    .find(|&&(_, _, k)| key.is_none_or(|h| h == k))
                    .map(|&(s, _, _)| s);
                record.max(Some(log.floor).filter(|&f| f > 0))
            };
            if let Some(seq) = last.filter(|&s| s > log.acked) {
                out.push(Barrier { rank, epoch, seq });
            }
        }
        out
    }

    /// Whether a blob of the object with key hash `key` was detached on some rank and its
    /// service may not have dropped it yet: a put of that key waits for those records to be
    /// applied (as a removal does, [`crate::cluster::records::Removal`]) before it takes a new
    /// version, so no newer version is acknowledged that an older copy, handed to a later
    /// leader, could shadow. A map lookup per log (no scan); no lock before a service joined.
    pub fn unconfirmed(&self, key: u64) -> bool {
        if !self.has_members() {
            return false;
        }
        self.lock().values().any(|l| {
            (l.epoch.is_some() && l.unconfirmed(key))
                || l.unsettled.iter().any(|u| u.unconfirmed(key))
        })
    }

    /// Whether a local service ever joined (else no removal has a barrier).
    pub fn has_members(&self) -> bool {
        self.members.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether a barrier is passed: its service acknowledged the record, or its membership
    /// ended.
    pub fn passed(&self, b: &Barrier) -> bool {
        self.lock().get(&b.rank).is_none_or(|l| {
            if l.epoch == Some(b.epoch) {
                l.acked >= b.seq
            } else {
                !l.unsettled.iter().any(|u| u.epoch == Some(b.epoch))
            }
        })
    }

    /// Whether the service of the barrier's membership acknowledged its record, that
    /// membership still running.
    pub fn acknowledged(&self, b: &Barrier) -> bool {
        self.lock()
            .get(&b.rank)
            .is_some_and(|l| l.epoch == Some(b.epoch) && l.acked >= b.seq)
    }

    /// The records to push to `rank`'s service now, unless a push is on its way already or
    /// nothing waits (the caller then sends them and reports with [`FreedLogs::pushed`]). An
    /// overflowed log is not pushed: the next heartbeat resyncs it.
    pub fn take_push(&self, rank: u32) -> Option<Push> {
        let mut logs = self.lock();
        let log = logs.get_mut(&rank)?;
        let epoch = log.epoch?;
        if log.pushing || log.overflowed || log.records.is_empty() {
            return None;
        }
        log.pushing = true;
        let freed: Vec<(u64, Freed)> = log
            .records
            .iter()
            .take(RECORDS_PER_BEAT)
            .map(|&(s, f, _)| (s, f))
            .collect();
        let seq = freed.last().map_or(log.seq, |r| r.0);
        Some(Push { epoch, seq, freed })
    }

    /// A push of membership `epoch`'s records ended: acknowledged up to `ack` (`None`: it
    /// failed; the heartbeats carry the records all the same).
    pub fn pushed(&self, rank: u32, epoch: u64, ack: Option<u64>) {
        let mut logs = self.lock();
        if let Some(log) = logs.get_mut(&rank).filter(|l| l.epoch == Some(epoch)) {
            log.pushing = false;
            if let Some(a) = ack {
                log.trim(a);
            }
        }
    }
}
