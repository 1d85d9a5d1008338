//! Freed records a local service applied while the blob they name was not in its catalog:
//! its write had not arrived yet (a drain's copy or a chain's later hop on a slow link). A
//! write of that blob arriving afterwards is refused ([`super::Catalog::freed_before`]):
//! listed, it would be handed to the next meta with an object whose removal was answered
//! once this service acknowledged the record (found by the cluster simulation, seed 76991:
//! a drain's copy reached its destination 1.7 s after the delete was answered; a later
//! leader adopted it and the deleted key came back).

use std::collections::{HashMap, VecDeque};

use super::{Freed, Stamp};
use crate::common::medium::Medium;

/// Ranges remembered at most (the oldest go first): such records come only from races, and a
/// write older than the oldest one kept is past its grant's expiry long before.
const GONE_KEPT: usize = 65_536;

#[derive(Default)]
pub(super) struct Gone {
    /// (medium, offset) → the stamp of the blob the record named, the record's sequence.
    by_range: HashMap<(Medium, u64), (Stamp, u64)>,
    /// Insertion order, for the bound.
    order: VecDeque<((Medium, u64), u64)>,
}

impl Gone {
    /// Record `seq` named blob `f`, which was not listed.
    pub(super) fn note(&mut self, f: &Freed, seq: u64) {
        let at = (f.medium, f.offset);
        self.by_range.insert(at, (f.stamp, seq));
        self.order.push_back((at, seq));
        while self.order.len() > GONE_KEPT {
            if let Some((old, s)) = self.order.pop_front()
                && self.by_range.get(&old).is_some_and(|&(_, x)| x == s)
            {
                self.by_range.remove(&old);
            }
        }
    }

    /// Whether a record numbered above `floor` (the write grant's; 0 for a chain's hop)
    /// already freed the blob of `stamp` at `(medium, offset)`.
    pub(super) fn freed_before(
        &self,
        medium: Medium,
        offset: u64,
        stamp: Stamp,
        floor: u64,
    ) -> bool {
        self.by_range
            .get(&(medium, offset))
            .is_some_and(|&(s, seq)| s == stamp && seq > floor)
    }

    /// The sequences were the previous membership's log's.
    pub(super) fn clear(&mut self) {
        self.by_range.clear();
        self.order.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::super::{BeatNews, Catalog, Entry, Freed, Stamp};
    use crate::common::medium::Medium;

    fn freed(offset: u64, seq: u64) -> Freed {
        Freed {
            medium: Medium::Dram,
            offset,
            stamp: Stamp { view: 1, seq },
            landed: false,
        }
    }

    fn news(seq: u64, f: Freed) -> BeatNews {
        BeatNews {
            seq,
            freed: vec![(seq, f)],
            resync: None,
        }
    }

    /// The record of a blob came before its (copy's) write: that write is refused, under a
    /// grant whose floor is below the record; one made after the record (a later copy at the
    /// same range, its floor at or above it) and other blobs are not.
    #[test]
    fn a_write_after_its_blob_s_freed_record_is_refused() {
        let mut c = Catalog::default();
        let mark = c.mark();
        c.apply(news(4, freed(4096, 21)), mark);
        let stamp = Stamp { view: 1, seq: 21 };
        assert!(c.freed_before(Medium::Dram, 4096, stamp, 3));
        assert!(
            c.freed_before(Medium::Dram, 4096, stamp, 0),
            "a chain's hop"
        );
        assert!(
            !c.freed_before(Medium::Dram, 4096, stamp, 4),
            "a copy begun after it"
        );
        let other = Stamp { view: 1, seq: 22 };
        assert!(
            !c.freed_before(Medium::Dram, 4096, other, 0),
            "another object there"
        );
        assert!(!c.freed_before(Medium::Dram, 8192, stamp, 0));
        // A record that freed a listed entry needs no memory: the write came first.
        let e = Entry::written(b"k", Medium::Dram, 8192, 100, stamp);
        c.add(e);
        let mark = c.mark();
        c.apply(news(5, freed(8192, 21)), mark);
        assert!(!c.freed_before(Medium::Dram, 8192, stamp, 0));
        // A new membership's log numbers afresh: what the old one freed is forgotten.
        c.reset_ack();
        assert!(!c.freed_before(Medium::Dram, 4096, stamp, 0));
    }
}
