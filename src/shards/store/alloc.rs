//! A best-fit range allocator with immediate coalescing, over byte offsets.
//!
//! Used at two levels: a segment's shared pool hands out runs to shards, and each shard
//! sub-allocates blobs inside the runs it holds. Allocator metadata lives on the host (two
//! ordered indexes of the free ranges), never in the managed memory, so the same allocator
//! manages emulated HBM, DRAM, SSD files and, later, memory on other hosts.
//!
//! Best fit with coalescing keeps fragmentation low in practice (it is among the best
//! policies measured by Johnstone & Wilson, "The memory fragmentation problem: solved?",
//! 1998); `benches/store_footprint.rs` measures it on mixed-size churns.

use std::collections::{BTreeMap, BTreeSet};

/// Free ranges of one address range `[base, base + len)`, all multiples of `granule`.
#[derive(Debug, Clone)]
pub struct RangeAlloc {
    granule: u64,
    /// Free ranges by start: start → length.
    by_start: BTreeMap<u64, u64>,
    /// Free ranges by (length, start), for best fit.
    by_size: BTreeSet<(u64, u64)>,
    free_bytes: u64,
}

impl RangeAlloc {
    /// An allocator with nothing free; add ranges with [`RangeAlloc::release`].
    pub fn empty(granule: u64) -> RangeAlloc {
        assert!(granule.is_power_of_two());
        RangeAlloc {
            granule,
            by_start: BTreeMap::new(),
            by_size: BTreeSet::new(),
            free_bytes: 0,
        }
    }

    /// An allocator with `[base, base + len)` free.
    pub fn new(base: u64, len: u64, granule: u64) -> RangeAlloc {
        let mut a = RangeAlloc::empty(granule);
        let len = len / granule * granule;
        if len > 0 {
            a.insert(base, len);
        }
        a
    }

    pub fn granule(&self) -> u64 {
        self.granule
    }

    pub fn round_up(&self, n: u64) -> u64 {
        n.div_ceil(self.granule) * self.granule
    }

    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// The largest free range.
    pub fn largest_free(&self) -> u64 {
        self.by_size.last().map_or(0, |&(len, _)| len)
    }

    pub fn free_ranges(&self) -> usize {
        self.by_start.len()
    }

    fn insert(&mut self, start: u64, len: u64) {
        self.by_start.insert(start, len);
        self.by_size.insert((len, start));
        self.free_bytes += len;
    }

    fn remove(&mut self, start: u64, len: u64) {
        self.by_start.remove(&start);
        self.by_size.remove(&(len, start));
        self.free_bytes -= len;
    }

    /// Allocates `len` bytes (rounded up to the granule): the smallest free range that fits,
    /// lowest address among equals. Returns the start, or `None` when nothing fits.
    pub fn alloc(&mut self, len: u64) -> Option<u64> {
        let len = self.round_up(len.max(1));
        let &(found_len, start) = self.by_size.range((len, 0)..).next()?;
        self.remove(start, found_len);
        if found_len > len {
            self.insert(start + len, found_len - len);
        }
        Some(start)
    }

    /// Allocates exactly `[start, start + len)` if it is free (used to claim a specific run).
    pub fn alloc_at(&mut self, start: u64, len: u64) -> bool {
        let len = self.round_up(len.max(1));
        let Some((&fs, &fl)) = self.by_start.range(..=start).next_back() else {
            return false;
        };
        if fs + fl < start + len {
            return false;
        }
        self.remove(fs, fl);
        if start > fs {
            self.insert(fs, start - fs);
        }
        if fs + fl > start + len {
            self.insert(start + len, fs + fl - start - len);
        }
        true
    }

    /// Returns `[start, start + len)` (rounded up to the granule), merging it with free
    /// neighbours. Returns the start and length of the free range that now contains it.
    ///
    /// Panics if the range overlaps a free range: a double free is a bug in the caller.
    pub fn release(&mut self, start: u64, len: u64) -> (u64, u64) {
        let len = self.round_up(len.max(1));
        let mut new_start = start;
        let mut new_len = len;
        if let Some((&ps, &pl)) = self.by_start.range(..start).next_back() {
            assert!(
                ps + pl <= start,
                "double free: [{start}, +{len}) overlaps a free range"
            );
            if ps + pl == start {
                self.remove(ps, pl);
                new_start = ps;
                new_len += pl;
            }
        }
        if let Some((&ns, &nl)) = self.by_start.range(start..).next() {
            assert!(
                ns >= start + len,
                "double free: [{start}, +{len}) overlaps a free range"
            );
            if ns == start + len {
                self.remove(ns, nl);
                new_len += nl;
            }
        }
        self.insert(new_start, new_len);
        (new_start, new_len)
    }

    /// Whether `[start, start + len)` is entirely free.
    pub fn covers(&self, start: u64, len: u64) -> bool {
        self.by_start
            .range(..=start)
            .next_back()
            .is_some_and(|(&fs, &fl)| fs + fl >= start + len)
    }

    /// Removes a free range that exactly matches `[start, start + len)` (used to give a fully
    /// free run back to its pool). Returns false when it is not a single free range.
    pub fn take_exact(&mut self, start: u64, len: u64) -> bool {
        match self.by_start.get(&start) {
            Some(&l) if l == len => {
                self.remove(start, len);
                true
            }
            _ => false,
        }
    }

    /// Checks the internal invariants (tests and debug assertions).
    pub fn check(&self) {
        let mut total = 0;
        let mut prev_end = None;
        for (&s, &l) in &self.by_start {
            assert!(l > 0 && l % self.granule == 0 && s % self.granule == 0);
            assert!(self.by_size.contains(&(l, s)));
            if let Some(e) = prev_end {
                assert!(s > e, "adjacent free ranges were not merged");
            }
            prev_end = Some(s + l);
            total += l;
        }
        assert_eq!(self.by_size.len(), self.by_start.len());
        assert_eq!(total, self.free_bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_and_coalescing() {
        let mut a = RangeAlloc::new(0, 1 << 20, 4096);
        let x = a.alloc(10_000).unwrap(); // 3 pages
        let y = a.alloc(4096).unwrap();
        let z = a.alloc(8192).unwrap();
        assert_eq!((x, y, z), (0, 12288, 16384));
        a.release(y, 4096);
        // Best fit: the one-page hole, not the big tail.
        assert_eq!(a.alloc(1), Some(12288));
        a.release(12288, 1);
        a.release(x, 10_000);
        a.release(z, 8192);
        a.check();
        assert_eq!(a.free_ranges(), 1, "everything merged back");
        assert_eq!(a.free_bytes(), 1 << 20);
    }

    #[test]
    fn alloc_at_and_take_exact() {
        let mut a = RangeAlloc::new(4096, 40960, 4096);
        assert!(a.alloc_at(8192, 8192));
        assert!(!a.alloc_at(8192, 4096), "already taken");
        a.check();
        assert_eq!(a.free_bytes(), 32768);
        a.release(8192, 8192);
        assert!(a.take_exact(4096, 40960));
        assert_eq!(a.free_bytes(), 0);
        assert_eq!(a.alloc(1), None);
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_is_caught() {
        let mut a = RangeAlloc::new(0, 65536, 4096);
        let p = a.alloc(4096).unwrap();
        a.release(p, 4096);
        a.release(p, 4096);
    }

    #[test]
    fn random_churn_keeps_invariants() {
        let mut a = RangeAlloc::new(0, 64 << 20, 4096);
        let mut live: Vec<(u64, u64)> = Vec::new();
        let mut seed = 42u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            if next() % 3 != 0 || live.is_empty() {
                let len = 1 + next() % (256 << 10);
                if let Some(p) = a.alloc(len) {
                    live.push((p, len));
                }
            } else {
                let i = (next() as usize) % live.len();
                let (p, l) = live.swap_remove(i);
                a.release(p, l);
            }
        }
        a.check();
        // No two live ranges overlap.
        live.sort();
        for w in live.windows(2) {
            assert!(w[0].0 + a.round_up(w[0].1) <= w[1].0);
        }
        for (p, l) in live.drain(..) {
            a.release(p, l);
        }
        a.check();
        assert_eq!(a.free_ranges(), 1);
    }
}
