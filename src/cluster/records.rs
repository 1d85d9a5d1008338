//! The records a meta and its local services exchange about blobs, made the one way the HTTP
//! handlers (`http::handlers::{remote, cluster, freed}`) and the cluster simulation share: the
//! catalog entry of a blob written under a grant ([`Entry::written`]), the freed record of a
//! refused adoption ([`Adopted::refused`]), and a removal's wait until the records of what it
//! removed were applied ([`Removal`]).
//!
//! A removal of objects with copies on remote ranks is answered only once the local service
//! of each such rank applied the freed records of those copies ([`Removal`]): its barriers in
//! the ranks' logs ([`FreedLogs::barrier`]) are passed when acknowledged, or when their
//! membership ended. Until then the caller pushes the waiting ranks' records; past the
//! heartbeat timeout and a second the removal is answered unconfirmed. With HA only the
//! acknowledgements count ([`Removal::acknowledged_only`]): a membership declared lost keeps
//! its catalog, and another leader, which never heard of the loss, may be handed it.

use super::catalog::{Adopted, Barrier, Entry, Freed, FreedLogs, Noted, Stamp, key_hash};
use crate::common::medium::Medium;
use crate::common::segment::PAGE_BYTES;

/// How long past the heartbeat timeout a removal waits for its local services.
pub const SETTLE_GRACE_MS: u64 = 1000;

/// A removal waiting for the local services that held copies of what it removed.
#[derive(Debug)]
pub struct Removal {
    barriers: Vec<Barrier>,
    deadline_ms: u64,
    acknowledged_only: bool,
}

/// Where a removal stands ([`Removal::poll`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Settled {
    /// Every local service that held a copy dropped it (or its membership ended).
    Confirmed,
    /// Waiting for these ranks: push them their records.
    Waiting(Vec<u32>),
    /// Past the deadline, these ranks did not confirm: the removal is unconfirmed.
    Unconfirmed(Vec<u32>),
}

impl Removal {
    /// The removal of the objects whose keys hash to `keys` (`catalog::key_hash`), just
    /// applied at `now_ms`.
    pub fn new(logs: &FreedLogs, keys: &[u64], now_ms: u64, heartbeat_timeout_ms: u64) -> Removal {
        Removal {
            barriers: keys.iter().flat_map(|&k| logs.barrier(Some(k))).collect(),
            deadline_ms: now_ms + heartbeat_timeout_ms + SETTLE_GRACE_MS,
            acknowledged_only: false,
        }
    }

    /// Only the local services' acknowledgements confirm the removal (with HA): a barrier
    /// whose membership ended (the rank declared lost, or replaced by the same process under a
    /// new leadership) confirms nothing, since that service may still hand the catalog that
    /// lists the removed copy to a leader that never heard of the loss. Such a removal is
    /// answered unconfirmed (may come back) rather than confirmed.
    pub fn acknowledged_only(mut self) -> Removal {
        self.acknowledged_only = true;
        self
    }

    /// Nothing to wait for (no copy on a remote rank, or every record acknowledged already).
    pub fn is_settled(&self) -> bool {
        self.barriers.is_empty()
    }

    /// One look at the barriers at `now_ms`.
    pub fn poll(&mut self, logs: &FreedLogs, now_ms: u64) -> Settled {
        let only = self.acknowledged_only;
        self.barriers.retain(|b| {
            if only {
                !logs.acknowledged(b)
            } else {
                !logs.passed(b)
            }
        });
        if self.barriers.is_empty() {
            return Settled::Confirmed;
        }
        let mut ranks: Vec<u32> = self.barriers.iter().map(|b| b.rank).collect();
        ranks.sort_unstable();
        ranks.dedup();
        // A membership that ended will never acknowledge: nothing more to wait for.
        let hopeless = only && self.barriers.iter().all(|b| logs.passed(b));
        if now_ms > self.deadline_ms || hopeless {
            Settled::Unconfirmed(ranks)
        } else {
            Settled::Waiting(ranks)
        }
    }
}

impl Entry {
    /// The entry of a blob written at `offset` of `medium` for the object `key` of `size`
    /// bytes with `stamp`: its length is what the meta allocated for it, the size in whole
    /// pages (an empty object takes one).
    pub fn written(key: &[u8], medium: Medium, offset: u64, size: u64, stamp: Stamp) -> Entry {
        Entry {
            key: key.into(),
            medium,
            offset,
            len: size.max(1).div_ceil(PAGE_BYTES) * PAGE_BYTES,
            size,
            stamp,
            sum: 0,
        }
    }
}

impl Adopted {
    /// The freed record of an entry membership `epoch` handed over and whose adoption was
    /// refused: its blob is not this meta's, so its local service drops it.
    pub fn refused(&self, epoch: u64) -> Noted {
        let e = &self.entry;
        let f = Freed {
            medium: e.medium,
            offset: e.offset,
            stamp: e.stamp,
            landed: false,
        };
        (self.rank, epoch, f, key_hash(&e.key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn freed(offset: u64) -> Freed {
        Freed {
            medium: Medium::Dram,
            offset,
            stamp: Stamp { view: 1, seq: 1 },
            landed: false,
        }
    }

    /// A put of a key waits while a record of an older copy of it is unapplied on some rank
    /// (sim seed 3310: a newer version acknowledged while the older copy's removal was
    /// unconfirmed was shadowed by it after a failover).
    #[test]
    fn a_key_is_unconfirmed_while_a_record_of_it_is_unacknowledged() {
        let logs = FreedLogs::default();
        assert!(
            !logs.unconfirmed(key_hash(b"a")),
            "no service joined: no lookup"
        );
        logs.begin(3, 7);
        logs.push([
            (3, 7, freed(0), key_hash(b"a")),
            (3, 7, freed(4096), key_hash(b"a")),
            (3, 7, freed(8192), key_hash(b"b")),
        ]);
        assert!(logs.unconfirmed(key_hash(b"a")));
        assert!(!logs.unconfirmed(key_hash(b"c")));
        logs.pushed(3, 7, Some(1));
        assert!(
            logs.unconfirmed(key_hash(b"a")),
            "one of its two records is left"
        );
        logs.pushed(3, 7, Some(2));
        assert!(!logs.unconfirmed(key_hash(b"a")));
        assert!(logs.unconfirmed(key_hash(b"b")));
        // A membership that ended takes its records with it.
        logs.retire(3, 7);
        assert!(!logs.unconfirmed(key_hash(b"b")));
    }

    #[test]
    fn a_removal_waits_for_its_ranks_then_for_nothing_past_its_deadline() {
        let logs = FreedLogs::default();
        logs.begin(3, 7);
        logs.push([
            (3, 7, freed(0), key_hash(b"a")),
            (3, 7, freed(4096), key_hash(b"b")),
        ]);
        // Nothing of "c" on any rank: settled at once.
        assert!(Removal::new(&logs, &[key_hash(b"c")], 0, 1500).is_settled());
        let mut r = Removal::new(&logs, &[key_hash(b"a")], 0, 1500);
        assert_eq!(r.poll(&logs, 10), Settled::Waiting(vec![3]));
        // Acknowledged (a push's answer): confirmed.
        logs.pushed(3, 7, Some(1));
        assert_eq!(r.poll(&logs, 20), Settled::Confirmed);
        // Never acknowledged: unconfirmed past the heartbeat timeout and a second.
        let mut r = Removal::new(&logs, &[key_hash(b"b")], 100, 1500);
        assert_eq!(r.poll(&logs, 2600), Settled::Waiting(vec![3]));
        assert_eq!(r.poll(&logs, 2601), Settled::Unconfirmed(vec![3]));
        // A membership that ended passes its barriers.
        logs.retire(3, 7);
        assert_eq!(r.poll(&logs, 2602), Settled::Confirmed);
    }

    /// With HA a membership that ended confirms nothing: its service keeps its catalog and may
    /// hand it to the next leader, which never heard of the loss (the cluster simulation,
    /// seed 5: a deposed leader declared the holder lost, answered the delete 200, and the next
    /// leader adopted the deleted object from the holder's catalog).
    #[test]
    fn with_ha_only_acknowledgements_confirm_a_removal() {
        let logs = FreedLogs::default();
        logs.begin(3, 7);
        logs.push([(3, 7, freed(0), key_hash(b"a"))]);
        let mut r = Removal::new(&logs, &[key_hash(b"a")], 0, 1500).acknowledged_only();
        assert_eq!(r.poll(&logs, 10), Settled::Waiting(vec![3]));
        logs.retire(3, 7);
        assert_eq!(r.poll(&logs, 20), Settled::Unconfirmed(vec![3]));
        // Acknowledged while the membership runs: confirmed.
        logs.begin(3, 8);
        logs.push([(3, 8, freed(0), key_hash(b"a"))]);
        let mut r = Removal::new(&logs, &[key_hash(b"a")], 0, 1500).acknowledged_only();
        assert_eq!(r.poll(&logs, 10), Settled::Waiting(vec![3]));
        logs.pushed(3, 8, Some(1));
        assert_eq!(r.poll(&logs, 30), Settled::Confirmed);
    }

    #[test]
    fn a_written_blob_s_entry_covers_its_pages() {
        let s = Stamp { view: 1, seq: 2 };
        for (size, len) in [(0, 4096), (1, 4096), (4096, 4096), (4097, 8192)] {
            let e = Entry::written(b"k", Medium::Dram, 8192, size, s);
            assert_eq!(
                (e.len, e.size, e.offset, e.sum),
                (len, size, 8192, 0),
                "{size}"
            );
        }
    }

    #[test]
    fn a_refused_adoption_frees_the_entry_on_its_rank() {
        let a = Adopted {
            rank: 4,
            entry: Entry {
                key: b"k".as_slice().into(),
                medium: Medium::Dram,
                offset: 8192,
                len: 4096,
                size: 10,
                stamp: Stamp { view: 2, seq: 5 },
                sum: 0,
            },
        };
        let (rank, epoch, f, key) = a.refused(9);
        assert_eq!((rank, epoch, key), (4, 9, key_hash(b"k")));
        assert_eq!((f.offset, f.stamp, f.landed), (8192, a.entry.stamp, false));
    }
}
