//! The catalog's SSD entries as a journal sees them: a local service that recovers its SSD
//! file at its next start journals the SSD entries it would hand over (the committed ones),
//! and the tracked forms of the catalog's changes here say what each did to them. Pure, like
//! the catalog; the local service writes the journal (`shards/local_ssd.rs`).

use super::{BeatNews, Catalog, Entry, Stamp};
use crate::common::medium::Medium;

/// What a change did to the committed SSD entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SsdChange {
    /// The entry is handed over from now on (its tier move landed, or a resync listed it).
    Added(Entry),
    /// The entry at this offset with this stamp is not (freed, or its range reused).
    Removed { offset: u64, stamp: Stamp },
    /// No entry is (the catalog was dropped or replaced whole).
    Cleared,
}

impl Catalog {
    /// The committed SSD entry at `offset`, if any.
    fn committed_ssd(&self, offset: u64) -> Option<&Entry> {
        match self.entries.get(&(Medium::Ssd, offset)) {
            Some((e, _, k)) if k.handed_over() => Some(e),
            _ => None,
        }
    }

    /// Every committed SSD entry.
    pub fn committed_ssd_entries(&self) -> Vec<Entry> {
        self.entries
            .range((Medium::Ssd, 0)..=(Medium::Ssd, u64::MAX))
            .filter(|(_, (_, _, k))| k.handed_over())
            .map(|(_, (e, _, _))| e.clone())
            .collect()
    }

    /// [`Catalog::apply`], and what it did to the committed SSD entries.
    pub fn apply_tracked(&mut self, news: BeatNews, mark: u64) -> Vec<SsdChange> {
        if news.resync.is_some() {
            self.apply(news, mark);
            let mut out = vec![SsdChange::Cleared];
            out.extend(
                self.committed_ssd_entries()
                    .into_iter()
                    .map(SsdChange::Added),
            );
            return out;
        }
        let offsets: Vec<u64> = news
            .freed
            .iter()
            .filter(|(_, f)| f.medium == Medium::Ssd)
            .map(|(_, f)| f.offset)
            .collect();
        let before: Vec<Option<Entry>> = offsets
            .iter()
            .map(|&o| self.committed_ssd(o).cloned())
            .collect();
        self.apply(news, mark);
        diff(&offsets, before, |o| self.committed_ssd(o).cloned())
    }

    /// [`Catalog::add_moved`], and what it did to the committed SSD entries (a copy into SSD
    /// replaces those whose ranges it overlaps; the copy itself is handed over, and so
    /// journaled, only once it landed).
    #[allow(clippy::too_many_arguments)]
    pub fn add_moved_tracked(
        &mut self,
        from_medium: Medium,
        from_offset: u64,
        size: u64,
        medium: Medium,
        offset: u64,
        sum: u64,
    ) -> (bool, Vec<SsdChange>) {
        if medium != Medium::Ssd {
            let named = self.add_moved(from_medium, from_offset, size, medium, offset, sum);
            return (named, Vec::new());
        }
        // The copy takes its source entry's length (as `add_moved` does).
        let len = self
            .entries
            .get(&(from_medium, from_offset))
            .map_or(size, |(e, _, _)| e.len);
        let end = offset.saturating_add(len.max(1));
        let offsets: Vec<u64> = self
            .entries
            .range((Medium::Ssd, 0)..(Medium::Ssd, end))
            .filter(|(_, (x, _, _))| x.offset.saturating_add(x.len.max(1)) > offset)
            .map(|(&(_, o), _)| o)
            .collect();
        let before: Vec<Option<Entry>> = offsets
            .iter()
            .map(|&o| self.committed_ssd(o).cloned())
            .collect();
        let named = self.add_moved(from_medium, from_offset, size, medium, offset, sum);
        let changes = diff(&offsets, before, |o| self.committed_ssd(o).cloned());
        (named, changes)
    }

    /// [`Catalog::clear`], and what it did to the committed SSD entries.
    pub fn clear_tracked(&mut self) -> Vec<SsdChange> {
        self.clear();
        vec![SsdChange::Cleared]
    }
}

/// The changes between the committed SSD entries at `offsets` before and after.
fn diff(
    offsets: &[u64],
    before: Vec<Option<Entry>>,
    after: impl Fn(u64) -> Option<Entry>,
) -> Vec<SsdChange> {
    let mut out = Vec::new();
    for (&o, b) in offsets.iter().zip(before) {
        let a = after(o);
        if a == b {
            continue;
        }
        if let Some(b) = b {
            out.push(SsdChange::Removed {
                offset: b.offset,
                stamp: b.stamp,
            });
        }
        if let Some(a) = a {
            out.push(SsdChange::Added(a));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::Freed;
    use super::*;

    fn mem(key: &str, offset: u64, seq: u64) -> Entry {
        Entry {
            key: key.as_bytes().into(),
            medium: Medium::Dram,
            offset,
            len: 8192,
            size: 5000,
            stamp: Stamp { view: 1, seq },
            sum: 0,
        }
    }

    /// Record `n` of the log: the blob at `offset` with stamp `seq` freed, or `landed`.
    fn landed(n: u64, offset: u64, seq: u64, landed: bool) -> (u64, Freed) {
        (
            n,
            Freed {
                medium: Medium::Ssd,
                offset,
                stamp: Stamp { view: 1, seq },
                landed,
            },
        )
    }

    fn news(freed: Vec<(u64, Freed)>) -> BeatNews {
        BeatNews {
            seq: freed.iter().map(|(s, _)| *s).max().unwrap_or(0),
            freed,
            resync: None,
        }
    }

    /// A move into SSD is journaled once it landed, removed when freed; a later move over its
    /// range removes it; a resync or a clear starts over.
    #[test]
    fn the_tracked_changes_follow_the_committed_ssd_entries() {
        let mut c = Catalog::default();
        c.add(mem("a", 0, 1));
        c.add(mem("b", 8192, 2));
        let (named, ch) = c.add_moved_tracked(Medium::Dram, 0, 5000, Medium::Ssd, 4096, 77);
        assert!(named);
        assert!(ch.is_empty(), "not handed over before it landed");
        let ch = c.apply_tracked(news(vec![landed(1, 4096, 1, true)]), c.mark());
        let SsdChange::Added(e) = &ch[0] else {
            panic!("{ch:?}")
        };
        assert_eq!((&*e.key, e.offset, e.sum), (&b"a"[..], 4096, 77));
        assert_eq!(c.committed_ssd_entries().len(), 1);
        // b moves to SSD over a's range (the meta reused it: a's freed record is late).
        let (_, ch) = c.add_moved_tracked(Medium::Dram, 8192, 5000, Medium::Ssd, 8192, 78);
        assert_eq!(
            ch,
            [SsdChange::Removed {
                offset: 4096,
                stamp: Stamp { view: 1, seq: 1 }
            }]
        );
        let ch = c.apply_tracked(
            news(vec![landed(2, 8192, 2, true), landed(3, 4096, 1, false)]),
            c.mark(),
        );
        assert!(
            matches!(&ch[..], [SsdChange::Added(e)] if e.offset == 8192),
            "{ch:?}"
        );
        let ch = c.apply_tracked(news(vec![landed(4, 8192, 2, false)]), c.mark());
        assert!(
            matches!(&ch[..], [SsdChange::Removed { offset: 8192, .. }]),
            "{ch:?}"
        );
        assert!(c.committed_ssd_entries().is_empty());
        let mut ssd = mem("c", 0, 9);
        ssd.medium = Medium::Ssd;
        let resync = BeatNews {
            seq: 5,
            freed: Vec::new(),
            resync: Some(vec![ssd.clone()]),
        };
        let ch = c.apply_tracked(resync, c.mark());
        assert_eq!(ch, [SsdChange::Cleared, SsdChange::Added(ssd)]);
        assert_eq!(c.clear_tracked(), [SsdChange::Cleared]);
    }
}
