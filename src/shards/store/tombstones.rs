//! Tombstones: the keys a meta removed from its index, kept so that a catalog handed over
//! later (a local service joining a new HA leader or a restarted meta) cannot bring one back.
//!
//! A catalog describes what its local service held when it last heard from its previous
//! meta; whatever this meta removed since (a delete it answered, an eviction, a loss) the
//! catalog may still list. So adoption refuses an entry whose key has a tombstone (whatever its
//! stamp: without HA a restarted meta's stamps are not ordered with its predecessor's). A
//! tombstone is noted when an object leaves the index (a delete, an eviction, a reclaim), and
//! when a delete finds no object (a copy may be on a rank that is down), but not when adoption
//! replaces an older version of a key by a newer one (the key is still there) nor when a lost
//! rank's copies are dropped (nobody removed them: a restarted service that recovered them from
//! its SSD may hand them over again, and a delete meanwhile keeps them away). A lost rank's
//! last copy of a readable object leaves a *floor* instead: that version's stamp, below which
//! entries of the key are refused (an older version on another service, whose catalog comes
//! late, must not come back in place of a newer put lost with its rank). A client's `remove_all`
//! cuts the log (every later catalog is refused whole); so does a log that grows past its
//! bound. A new HA leadership after another leader's (whose objects were purged) starts a new
//! log: its catalogs come from that other leader's lineage.

use std::collections::{HashMap, VecDeque};

use crate::cluster::catalog::Stamp;

/// Tombstones one shard keeps at most; past it the log is cut.
pub const TOMBSTONES_PER_SHARD: usize = 1 << 18;

#[derive(Debug)]
pub struct Tombstones {
    /// Kept at all (a meta service; a server without local services hands no catalog over).
    on: bool,
    cap: usize,
    order: VecDeque<u64>,
    /// Per removed key hash, the version this meta put since (`None`: none): the one entry
    /// of the key a catalog may still hand over.
    set: HashMap<u64, Option<Stamp>, foldhash::fast::RandomState>,
    /// Per key hash, the newest version lost with its rank: older entries are refused.
    floors: HashMap<u64, Stamp, foldhash::fast::RandomState>,
    /// Every catalog is refused: a `remove_all`, or more tombstones than the bound.
    cut: bool,
}

impl Tombstones {
    pub fn new(on: bool, cap: usize) -> Tombstones {
        Tombstones {
            on,
            cap,
            order: VecDeque::new(),
            set: HashMap::default(),
            floors: HashMap::default(),
            cut: false,
        }
    }

    /// The key with hash `key` left the index.
    pub fn note(&mut self, key: u64) {
        if !self.on || self.cut || self.set.insert(key, None).is_some() {
            return;
        }
        self.order.push_back(key);
        if self.order.len() > self.cap {
            log::warn!(
                "more than {} keys removed since this meta began: catalogs handed over from now on are refused whole",
                self.cap
            );
            self.cut_all();
        }
    }

    /// This meta created version `stamp` of the key with hash `key` (a put): if the key has a
    /// tombstone, entries of that version are handed over again from now on (a leadership
    /// re-elected without another in between adopts the catalogs again), older ones still not.
    pub fn allow(&mut self, key: u64, stamp: Stamp) {
        if let Some(allowed) = self.set.get_mut(&key) {
            *allowed = Some(stamp);
        }
    }

    /// The last copy of the version `stamp` of the key with hash `key` was lost with its rank:
    /// entries of an older version are refused from now on (that one may come back).
    pub fn note_floor(&mut self, key: u64, stamp: Stamp) {
        if !self.on || self.cut {
            return;
        }
        let f = self.floors.entry(key).or_default();
        *f = (*f).max(stamp);
        if self.floors.len() > self.cap {
            log::warn!(
                "more than {} keys lost with their ranks since this meta began: catalogs handed over from now on are refused whole",
                self.cap
            );
            self.cut_all();
        }
    }

    /// Every catalog handed over from now on is refused (a `remove_all`).
    pub fn cut_all(&mut self) {
        self.cut = self.on;
        self.order = VecDeque::new();
        self.set = HashMap::default();
        self.floors = HashMap::default();
    }

    /// A new lineage (a leadership after another leader's, whose objects were purged).
    pub fn reset(&mut self) {
        self.cut = false;
        self.order = VecDeque::new();
        self.set = HashMap::default();
        self.floors = HashMap::default();
    }

    /// Whether a catalog entry of version `stamp` of the key with hash `key` must be refused.
    pub fn refuses(&self, key: u64, stamp: Stamp) -> bool {
        self.on
            && (self.cut
                || self.set.get(&key).is_some_and(|&a| a != Some(stamp))
                || self.floors.get(&key).is_some_and(|&f| stamp < f))
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S0: Stamp = Stamp { view: 0, seq: 0 };

    /// A version lost with its rank refuses older entries of its key, not itself (a restarted
    /// service may recover it) nor newer ones; a new lineage forgets it (found by the cluster
    /// simulation, seed 174).
    #[test]
    fn a_version_lost_with_its_rank_keeps_older_ones_away() {
        let s = |view, seq| Stamp { view, seq };
        let mut t = Tombstones::new(true, 4);
        t.note_floor(7, s(2, 2));
        t.note_floor(7, s(1, 9));
        assert!(t.refuses(7, s(1, 78)), "an older version");
        assert!(!t.refuses(7, s(2, 2)), "the lost version itself");
        assert!(!t.refuses(7, s(3, 1)));
        assert!(!t.refuses(8, s(0, 1)), "another key");
        t.reset();
        assert!(!t.refuses(7, s(1, 78)));
        let mut off = Tombstones::new(false, 4);
        off.note_floor(7, s(2, 2));
        assert!(!off.refuses(7, s(1, 1)));
    }

    #[test]
    fn a_removed_key_is_refused_until_a_new_lineage() {
        let mut t = Tombstones::new(true, 3);
        t.note(1);
        t.note(1);
        t.note(2);
        assert_eq!(t.len(), 2);
        assert!(t.refuses(1, S0) && t.refuses(2, S0) && !t.refuses(3, S0));
        t.reset();
        assert!(!t.refuses(1, S0));
    }

    /// A key removed, then put again by this meta: its new version's entries are adopted (a
    /// re-elected leadership taking its catalogs again), older ones are not; a second removal
    /// refuses the new version too (found by the cluster simulation, seed 28).
    #[test]
    fn a_key_put_again_after_its_removal_hands_its_new_version_over() {
        let s = |view, seq| Stamp { view, seq };
        let mut t = Tombstones::new(true, 4);
        t.allow(1, s(5, 1));
        assert!(!t.refuses(1, s(5, 1)), "no tombstone: nothing refused");
        t.note(1);
        t.allow(1, s(5, 12));
        assert!(!t.refuses(1, s(5, 12)));
        assert!(t.refuses(1, s(5, 3)) && t.refuses(1, s(9, 1)));
        t.note(1);
        assert!(t.refuses(1, s(5, 12)));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn past_its_bound_or_after_a_remove_all_every_catalog_is_refused() {
        let mut t = Tombstones::new(true, 2);
        for k in 0..3 {
            t.note(k);
        }
        assert!(t.refuses(99, S0), "cut: more removals than the bound");
        assert!(t.is_empty());
        t.reset();
        t.note(5);
        t.cut_all();
        assert!(t.refuses(6, S0));
        // Off (no local services can hand a catalog over): nothing kept, nothing refused.
        let mut off = Tombstones::new(false, 2);
        off.note(1);
        off.cut_all();
        assert!(!off.refuses(1, S0) && off.is_empty());
    }
}
