//! A segment's pool of runs, cut by NUMA node (`ock.mmc.numa.enable`): with placement, each
//! node has a contiguous part of the segment (its own pool allocator, its memory bound to the
//! node by `mount::place_on_nodes`) and a shard takes its runs from its node's part first,
//! from the other parts only when its own has no room. Without placement there is one part,
//! the whole segment. Used bytes are counted per shard and part, so `/metrics` shows each
//! node's share.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use super::{PAGE_BYTES, RangeAlloc, Segment, SegmentTable};
use crate::numa::{NodePart, NumaLayout};

impl Segment {
    /// Takes a run from the pool: from the shard's node part first, then from the others.
    pub(super) fn take_run(&self, shard: usize, len: u64) -> Option<u64> {
        let mut pools = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        let own = self.shard_part.get(shard).copied().unwrap_or(0);
        let n = pools.len();
        let start = (0..n).find_map(|i| pools[(own + i) % n].alloc(len))?;
        self.pool_free
            .store(pools.iter().map(RangeAlloc::free_bytes).sum(), Relaxed);
        Some(start)
    }

    /// Takes exactly `[start, start + len)` from the pool (adopting a blob at its range);
    /// false when it is not all free there.
    pub(super) fn take_run_at(&self, start: u64, len: u64) -> bool {
        let mut pools = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        let part = self.part_of(start);
        if !pools[part].covers(start, len) || !pools[part].alloc_at(start, len) {
            return false;
        }
        self.pool_free
            .store(pools.iter().map(RangeAlloc::free_bytes).sum(), Relaxed);
        true
    }

    /// Puts a run back in the pool; `discard`: its pages go back to the kernel (else they stay
    /// committed for whoever takes the run next), unless the segment keeps its pages
    /// ([`Segment::keep_pages`]).
    pub(super) fn give_run(&self, start: u64, len: u64, discard: bool) {
        if discard && !self.keeps_pages() {
            // SAFETY: a whole free run is no blob's range any more.
            unsafe { self.backend.discard(start, len) };
        }
        let mut pools = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        pools[self.part_of(start)].release(start, len);
        self.pool_free
            .store(pools.iter().map(RangeAlloc::free_bytes).sum(), Relaxed);
    }

    /// Cuts the segment into one part per NUMA node ([`NumaLayout::split`], on run
    /// boundaries) and gives each shard its node's part to take runs from. Called once, before
    /// any allocation; binding each part's memory to its node is the caller's
    /// (`mount::place_on_nodes`).
    pub fn place_on_nodes(mut self, layout: &NumaLayout) -> Segment {
        let parts = layout.split(self.capacity, self.run_bytes);
        let shards = self.used_by_shard.len();
        self.shard_part = layout.shard_parts(&parts).into();
        let pools = parts
            .iter()
            .map(|p| RangeAlloc::new(p.start, p.len, PAGE_BYTES))
            .collect();
        self.pool = Mutex::new(pools); // LOCK-OK: the pool's own lock, see `Segment::pool`
        self.used_by_shard = (0..shards * parts.len().max(1))
            .map(|_| crossbeam_utils::CachePadded::new(AtomicU64::new(0)))
            .collect();
        self.parts = parts.into();
        self
    }

    /// The NUMA node parts, by offset (empty without placement).
    pub fn node_parts(&self) -> &[NodePart] {
        &self.parts
    }

    /// The node part `offset` lies in; `None` without placement.
    pub fn node_part_at(&self, offset: u64) -> Option<&NodePart> {
        if self.parts.is_empty() {
            return None;
        }
        self.parts.get(self.part_of(offset))
    }

    /// Bytes allocated to blobs in node part `part`.
    pub fn used_in_part(&self, part: usize) -> u64 {
        let n = self.part_count();
        (0..self.used_by_shard.len() / n)
            .map(|s| self.used_by_shard[s * n + part].load(Relaxed))
            .sum()
    }

    pub(super) fn part_count(&self) -> usize {
        self.parts.len().max(1)
    }

    /// The node part `offset` lies in (0 without placement).
    pub(super) fn part_of(&self, offset: u64) -> usize {
        if self.parts.len() < 2 {
            return 0;
        }
        self.parts
            .iter()
            .rposition(|p| p.start <= offset)
            .unwrap_or(0)
    }
}

impl SegmentTable {
    /// An empty table whose DRAM segments are placed on NUMA nodes per `numa`.
    pub fn with_numa(numa: Option<Arc<NumaLayout>>) -> SegmentTable {
        SegmentTable {
            numa,
            ..SegmentTable::default()
        }
    }

    /// The NUMA placement of this table's DRAM segments, when active.
    pub fn numa(&self) -> Option<&NumaLayout> {
        self.numa.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Backend, Medium, ShardSegment};
    use super::*;
    use crate::common::memory::MappedRegion;
    use crate::config::{MemPolicy, NumaMode};
    use crate::numa::{Topology, plan};

    /// Two nodes (CPUs 0-1, 2-3); shards pinned to `cpus`.
    fn layout(cpus: &[usize]) -> NumaLayout {
        let t = Topology::two_nodes();
        NumaLayout::new(plan(NumaMode::On, &t, cpus), &t, MemPolicy::Preferred).unwrap()
    }

    fn placed(capacity: u64, cpus: &[usize], run: u64) -> Arc<Segment> {
        let seg = Segment::new(
            0,
            0,
            Medium::Dram,
            capacity,
            Backend::Host(MappedRegion::new(capacity).unwrap()),
            cpus.len(),
            run,
        );
        Arc::new(seg.place_on_nodes(&layout(cpus)))
    }

    #[test]
    fn each_shard_takes_runs_from_its_node_s_part() {
        let mb = 1u64 << 20;
        // Shards 0 and 2 on node 0, shard 1 on node 1: node 0 gets 2/3 on run boundaries.
        let seg = placed(24 * mb, &[0, 2, 1], mb);
        let parts: Vec<(u32, u64, u64)> = seg
            .node_parts()
            .iter()
            .map(|p| (p.node, p.start, p.len))
            .collect();
        assert_eq!(parts, vec![(0, 0, 16 * mb), (1, 16 * mb, 8 * mb)]);
        let mut s0 = ShardSegment::new(seg.clone(), 0);
        let mut s1 = ShardSegment::new(seg.clone(), 1);
        let mut s2 = ShardSegment::new(seg.clone(), 2);
        let a = s0.alloc(100_000).unwrap();
        let b = s1.alloc(200_000).unwrap();
        let c = s2.alloc(mb).unwrap();
        assert!(
            a.0 < 16 * mb && c.0 < 16 * mb,
            "node 0's shards: {a:?} {c:?}"
        );
        assert!(b.0 >= 16 * mb, "node 1's shard: {b:?}");
        assert_eq!(seg.used_in_part(0), a.1 + c.1);
        assert_eq!(seg.used_in_part(1), b.1);
        assert_eq!(seg.used_bytes(), a.1 + b.1 + c.1);
        assert_eq!((seg.used_by(0), seg.used_by(1)), (a.1, b.1));
        // Shard 1 fills node 1's part, then borrows runs from node 0's.
        let mut more = Vec::new();
        while seg.pool_free_bytes() > 0 {
            more.push(s1.alloc(mb).unwrap());
        }
        assert!(
            more.iter().any(|&(o, _)| o < 16 * mb),
            "borrowed from node 0"
        );
        assert_eq!(seg.used_bytes(), seg.used_in_part(0) + seg.used_in_part(1));
        assert!(seg.pool_largest_free() == 0 && seg.pool_free_bytes() == 0);
        // Everything goes back to the pool of the part it came from.
        for (o, l) in more {
            s1.free(o, l);
        }
        s0.free(a.0, a.1);
        s1.free(b.0, b.1);
        s2.free(c.0, c.1);
        for s in [&mut s0, &mut s1, &mut s2] {
            s.check();
            s.release_all();
        }
        assert_eq!((seg.used_in_part(0), seg.used_in_part(1)), (0, 0));
        assert_eq!(seg.pool_free_bytes(), 24 * mb);
        assert_eq!(seg.pool_largest_free(), 16 * mb, "the parts do not merge");
        // Node 1's part is whole again: a blob of its size fits there.
        assert_eq!(s1.alloc(8 * mb).unwrap().0, 16 * mb);
    }

    #[test]
    fn without_placement_there_is_one_part() {
        let seg = Segment::new(
            0,
            0,
            Medium::Dram,
            4 << 20,
            Backend::Host(MappedRegion::new(4 << 20).unwrap()),
            2,
            1 << 20,
        );
        assert!(seg.node_parts().is_empty());
        assert_eq!((seg.part_count(), seg.part_of(3 << 20)), (1, 0));
        let table = SegmentTable::default();
        assert!(table.numa().is_none());
        let table = SegmentTable::with_numa(Some(Arc::new(layout(&[0, 2]))));
        assert_eq!(table.numa().unwrap().placement.groups.len(), 2);
    }
}
