//! Two measurements of one shard's store that criterion cannot make, printed as tables:
//!
//! 1. **Metadata bytes per key** at 1,000,000 LMCache-style keys (62-86 bytes) of small
//!    objects, counted by a `#[global_allocator]` wrapper around the system allocator that
//!    lives only in this binary. "Beyond the key" subtracts the key bytes themselves. Two
//!    figures: bytes requested from the allocator, and bytes of malloc chunks (glibc's usable
//!    size plus its 8-byte chunk header), which is what the process really pays. The large
//!    live allocations at the end (the store's tables) are listed, so the total can be
//!    attributed. Also timed: the store's housekeeping `tick` at that many keys.
//!
//! 2. **External fragmentation** of the allocator under churn: a 1 GiB DRAM segment cut into
//!    16 MiB runs for one or two shards, filled to 90 % with objects of a size distribution,
//!    then random removes each followed by allocations back up to 90 %. Reported over time:
//!    `1 - largest free range / free bytes` as one shard sees them (its runs plus the segment
//!    pool) and for the whole segment, the free bytes stranded in other shards' runs, and
//!    allocation failures while the free bytes would have covered the request (the store
//!    answers those by evicting more, so they cost capacity, not refused puts). Last, the
//!    two-shard churn again for run sizes of 1 to 64 MiB (`ock.mmc.segment.run_bytes`).
//!
//! What bounds the fragmentation (from `src/shards/store/alloc.rs` and `segment.rs`):
//! - every range is a multiple of the 4 KiB page, so no hole is smaller than a page and the
//!   waste inside a blob is under one page (reported as "rounding");
//! - best fit (the smallest free range that fits, lowest address among equals) leaves large
//!   ranges whole for large requests;
//! - a free merges at once with both free neighbours (`RangeAlloc::check` asserts that no two
//!   free ranges touch), so there are never more free ranges than live blobs plus one per run,
//!   and removing all blobs gives back one range;
//! - a blob of a run or more gets a run of its own, so large blobs never cut small runs, and
//!   a run that becomes entirely free goes back to the segment pool (one spare is kept per
//!   shard), where it merges with its free neighbours;
//! - what is not bounded: free space inside a run is usable only by the shard that holds the
//!   run ("stranded" for the others), and a run with one small live blob stays held; blobs are
//!   never moved to compact. The printed figures say what that costs on these workloads;
//!   `perf/results/store.md` records them.
//!
//! Run: `taskset -c 1 cargo bench --bench store_footprint` (under 10 s here; `-- --test`
//! runs a quick smoke version with 20,000 keys and fewer churn steps).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::time::Instant;

use mmc::shards::store::mount::build_segment;
use mmc::shards::store::segment::{Medium, PAGE_BYTES, Segment, SegmentTable, ShardSegment};

use common::{RUN_BYTES, Rng, drain_events, dram_store, lmcache_key, put};

// ----- the counting allocator -----

/// Counts live heap bytes (requested and malloc chunk bytes) and remembers the live
/// allocations of at least [`BIG_BYTES`], to attribute the store's tables.
struct Counting;

static LIVE_REQUESTED: AtomicI64 = AtomicI64::new(0);
static LIVE_CHUNK: AtomicI64 = AtomicI64::new(0);
static LIVE_BLOCKS: AtomicI64 = AtomicI64::new(0);

const BIG_BYTES: usize = 64 << 10;
const BIG_SLOTS: usize = 64;
/// Live big allocations: (address, requested size); address 0 marks a free slot. Guarded by
/// `BIG_LOCK` (a spin lock: the allocator must not allocate).
static BIG: [(AtomicUsize, AtomicUsize); BIG_SLOTS] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; BIG_SLOTS];
static BIG_LOCK: AtomicBool = AtomicBool::new(false);

fn with_big<R>(f: impl FnOnce() -> R) -> R {
    while BIG_LOCK
        .compare_exchange_weak(false, true, SeqCst, Relaxed)
        .is_err()
    {
        std::hint::spin_loop();
    }
    let r = f();
    BIG_LOCK.store(false, SeqCst);
    r
}

fn big_insert(p: usize, size: usize) {
    with_big(|| {
        if let Some((a, s)) = BIG.iter().find(|(a, _)| a.load(Relaxed) == 0) {
            a.store(p, Relaxed);
            s.store(size, Relaxed);
        }
    });
}

fn big_remove(p: usize) {
    with_big(|| {
        if let Some((a, _)) = BIG.iter().find(|(a, _)| a.load(Relaxed) == p) {
            a.store(0, Relaxed);
        }
    });
}

/// glibc's cost of a chunk: its usable size plus the 8-byte size header.
fn chunk_bytes(p: *mut u8) -> i64 {
    // SAFETY: `p` is a live allocation of the system allocator (glibc malloc).
    unsafe { libc::malloc_usable_size(p.cast()) as i64 + 8 }
}

fn count_alloc(p: *mut u8, size: usize) {
    if p.is_null() {
        return;
    }
    LIVE_REQUESTED.fetch_add(size as i64, Relaxed);
    LIVE_CHUNK.fetch_add(chunk_bytes(p), Relaxed);
    LIVE_BLOCKS.fetch_add(1, Relaxed);
    if size >= BIG_BYTES {
        big_insert(p as usize, size);
    }
}

fn count_free(p: *mut u8, size: usize) {
    LIVE_REQUESTED.fetch_sub(size as i64, Relaxed);
    LIVE_CHUNK.fetch_sub(chunk_bytes(p), Relaxed);
    LIVE_BLOCKS.fetch_sub(1, Relaxed);
    if size >= BIG_BYTES {
        big_remove(p as usize);
    }
}

// SAFETY: forwards to the system allocator; the bookkeeping does not allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded.
        let p = unsafe { System.alloc(layout) };
        count_alloc(p, layout.size());
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded.
        let p = unsafe { System.alloc_zeroed(layout) };
        count_alloc(p, layout.size());
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        count_free(p, layout.size());
        // SAFETY: forwarded.
        unsafe { System.dealloc(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old_chunk = chunk_bytes(p);
        // SAFETY: forwarded.
        let q = unsafe { System.realloc(p, layout, new_size) };
        if !q.is_null() {
            LIVE_REQUESTED.fetch_add(new_size as i64 - layout.size() as i64, Relaxed);
            LIVE_CHUNK.fetch_add(chunk_bytes(q) - old_chunk, Relaxed);
            if layout.size() >= BIG_BYTES {
                big_remove(p as usize);
            }
            if new_size >= BIG_BYTES {
                big_insert(q as usize, new_size);
            }
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[derive(Clone, Copy)]
struct Heap {
    requested: i64,
    chunk: i64,
    blocks: i64,
}

fn heap() -> Heap {
    Heap {
        requested: LIVE_REQUESTED.load(Relaxed),
        chunk: LIVE_CHUNK.load(Relaxed),
        blocks: LIVE_BLOCKS.load(Relaxed),
    }
}

/// The live big allocations, (address, size), largest first.
fn big_allocations() -> Vec<(usize, usize)> {
    let mut v: Vec<(usize, usize)> = with_big(|| {
        BIG.iter()
            .filter(|(a, _)| a.load(Relaxed) != 0)
            .map(|(a, s)| (a.load(Relaxed), s.load(Relaxed)))
            .collect()
    });
    v.sort_unstable_by_key(|b| std::cmp::Reverse(b.1));
    v
}

// ----- 1. bytes per key -----

/// Big enough for a million page-rounded small objects below the 90 % watermark; mapped
/// lazily and never written here, so it costs no memory.
const FOOTPRINT_SEGMENT_BYTES: u64 = 8 << 30;
/// The objects' size: small (one page once rounded). The bytes are not written.
const OBJECT_BYTES: u64 = 1000;

fn footprint(keys: u64, tp: u64) {
    println!("\n### {keys} keys, tensor parallelism {tp} (keys sharing a chunk hash: {tp})\n");
    let mut store = dram_store(FOOTPRINT_SEGMENT_BYTES);
    // Everything this function allocates for itself is allocated before the baseline.
    let mut events = Vec::with_capacity(64);
    let mut key = Vec::with_capacity(128);
    let mut alive = vec![true; (keys + keys / 10) as usize];
    let mut rng = Rng::new(7);
    // Quarters, and the worst point below 1 M: one key past 2^19, where the slabs have just
    // doubled their capacity.
    let mut checkpoints = vec![keys / 4, keys / 2, keys * 3 / 4, keys, (1 << 19) + 1];
    checkpoints.retain(|&c| c <= keys);
    checkpoints.sort_unstable();
    let base = heap();
    // Big allocations that exist before the keys (statistics, histograms) are not the
    // store's per-key tables.
    let big_before = big_allocations();
    let mut key_bytes = 0u64;

    println!(
        "| keys | requested B/key beyond key | malloc chunk B/key beyond key | heap blocks/key | mean key B |"
    );
    println!("|---:|---:|---:|---:|---:|");
    let row = |n: u64, key_bytes: u64| {
        let h = heap();
        let req = (h.requested - base.requested) as f64 - key_bytes as f64;
        let chunk = (h.chunk - base.chunk) as f64 - key_bytes as f64;
        println!(
            "| {n} | {:.1} | {:.1} | {:.2} | {:.1} |",
            req / n as f64,
            chunk / n as f64,
            (h.blocks - base.blocks) as f64 / n as f64,
            key_bytes as f64 / n as f64
        );
    };
    let started = Instant::now();
    for i in 0..keys {
        lmcache_key(i, tp, &mut key);
        key_bytes += key.len() as u64;
        put(&mut store, &key, OBJECT_BYTES, None);
        drain_events(&mut store, &mut events);
        if checkpoints.contains(&(i + 1)) {
            row(i + 1, key_bytes);
        }
    }
    let insert_s = started.elapsed().as_secs_f64();
    assert_eq!(store.object_count() as u64, keys);

    println!(
        "\nLive allocations of {} KiB or more made since the store was empty (its tables):\n",
        BIG_BYTES >> 10
    );
    for (_, size) in big_allocations()
        .into_iter()
        .filter(|b| !big_before.contains(b))
    {
        println!("- {size} bytes = {:.1} B/key", size as f64 / keys as f64);
    }

    let mut ticks: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            store.tick();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ticks.sort_by(f64::total_cmp);
    println!(
        "\nInserting took {insert_s:.2} s ({:.2} µs per alloc+commit); one housekeeping tick over {keys} keys: {:.2} ms (median of 5)",
        insert_s * 1e6 / keys as f64,
        ticks[2]
    );

    // Churn: remove a random tenth, put as many new keys; the key count stays the same.
    let mut removed = 0;
    while removed < keys / 10 {
        let i = rng.below(keys);
        if alive[i as usize] {
            lmcache_key(i, tp, &mut key);
            assert!(store.remove(&key));
            drain_events(&mut store, &mut events);
            key_bytes -= key.len() as u64;
            alive[i as usize] = false;
            removed += 1;
        }
    }
    for i in keys..keys + removed {
        lmcache_key(i, tp, &mut key);
        key_bytes += key.len() as u64;
        put(&mut store, &key, OBJECT_BYTES, None);
        drain_events(&mut store, &mut events);
    }
    drain_events(&mut store, &mut events);
    print!("\nAfter removing a random tenth and putting as many new keys:\n\n");
    println!(
        "| keys | requested B/key beyond key | malloc chunk B/key beyond key | heap blocks/key | mean key B |"
    );
    println!("|---:|---:|---:|---:|---:|");
    row(keys, key_bytes);
    let big: Vec<String> = big_allocations()
        .into_iter()
        .filter(|b| !big_before.contains(b))
        .map(|(_, size)| size.to_string())
        .collect();
    println!("\nTables then (bytes): {}", big.join(", "));
    store.check();
    drop(store);
    drop(alive);
}

// ----- 2. fragmentation under churn -----

/// `1 - largest free range / free bytes`: 0 when all free space is one range.
fn frag(free: u64, largest: u64) -> f64 {
    if free == 0 {
        0.0
    } else {
        1.0 - largest as f64 / free as f64
    }
}

const CHURN_SEGMENT_BYTES: u64 = 1 << 30;
const FILL_PERCENT: u64 = 90;

/// Object size distributions, in bytes (not page multiples: rounding is part of the cost).
#[derive(Clone, Copy)]
enum Dist {
    /// KV blocks of LLM inference: 16-token blocks of a Llama-3.1-8B (2 MiB, bf16) and a
    /// Qwen2.5-7B (896 KiB), partial blocks at the end of prompts (uniform up to 2 MiB), and
    /// small pieces (1-64 KiB).
    KvBlocks,
    /// Log-uniform from 4 KiB to 4 MiB: many sizes over three decades, hard on any allocator.
    LogUniform,
    /// Uniform from 1 to 64 KiB: small objects only.
    Small,
}

impl Dist {
    fn name(self) -> &'static str {
        match self {
            Dist::KvBlocks => "kv-blocks",
            Dist::LogUniform => "log-uniform 4K-4M",
            Dist::Small => "small 1K-64K",
        }
    }

    fn sample(self, rng: &mut Rng) -> u64 {
        match self {
            Dist::KvBlocks => match rng.below(100) {
                0..45 => 2 << 20,
                45..70 => 896 << 10,
                70..90 => 1 + rng.below(2 << 20),
                _ => (1 << 10) + rng.below(63 << 10),
            },
            Dist::LogUniform => {
                let u = rng.next_u64() as f64 / u64::MAX as f64;
                (4096.0 * 1024f64.powf(u)) as u64
            }
            Dist::Small => (1 << 10) + rng.below(63 << 10),
        }
    }
}

struct Live {
    shard: usize,
    offset: u64,
    len: u64,
    requested: u64,
}

struct Churn {
    seg: std::sync::Arc<Segment>,
    shards: Vec<ShardSegment>,
    live: Vec<Live>,
    rng: Rng,
    dist: Dist,
    attempts: u64,
    /// Failed allocations while the segment's free bytes (pool and every shard's runs)
    /// covered the request (at a 90 % fill, all of them).
    failures: u64,
    /// Bytes requested by those failures.
    failed_bytes: u64,
    requested_live: u64,
}

impl Churn {
    fn new(dist: Dist, shards: usize, run_bytes: u64, seed: u64) -> Churn {
        let seg = build_segment(
            &SegmentTable::default(),
            0,
            Medium::Dram,
            CHURN_SEGMENT_BYTES,
            None,
            shards,
            run_bytes,
        )
        .expect("a DRAM segment");
        Churn {
            shards: (0..shards)
                .map(|s| ShardSegment::new(seg.clone(), s))
                .collect(),
            seg,
            live: Vec::new(),
            rng: Rng::new(seed),
            dist,
            attempts: 0,
            failures: 0,
            failed_bytes: 0,
            requested_live: 0,
        }
    }

    fn target(&self) -> u64 {
        self.seg.capacity * FILL_PERCENT / 100
    }

    /// Free bytes shard `s` can allocate from, and the largest range among them.
    fn visible(&self, s: usize) -> (u64, u64) {
        let ss = &self.shards[s];
        (
            ss.free_in_runs() + self.seg.pool_free_bytes(),
            ss.largest_free_in_runs().max(self.seg.pool_largest_free()),
        )
    }

    /// External fragmentation as shard `s` sees it (its runs and the pool).
    fn frag(&self, s: usize) -> f64 {
        let (free, largest) = self.visible(s);
        frag(free, largest)
    }

    /// External fragmentation of the whole segment, as if any shard could use any free range.
    fn frag_segment(&self) -> f64 {
        let largest = self
            .shards
            .iter()
            .map(|s| s.largest_free_in_runs())
            .max()
            .unwrap_or(0)
            .max(self.seg.pool_largest_free());
        frag(self.seg.remaining_bytes(), largest)
    }

    /// Allocates until the segment is at the fill target; a failure ends the fill (the caller
    /// removes something, as eviction would).
    fn fill(&mut self) {
        while self.seg.used_bytes() < self.target() {
            let requested = self.dist.sample(&mut self.rng);
            let shard = self.rng.below(self.shards.len() as u64) as usize;
            self.attempts += 1;
            match self.shards[shard].alloc(requested) {
                Some((offset, len)) => {
                    self.requested_live += requested;
                    self.live.push(Live {
                        shard,
                        offset,
                        len,
                        requested,
                    });
                }
                None => {
                    let rounded = requested.div_ceil(PAGE_BYTES) * PAGE_BYTES;
                    if self.seg.remaining_bytes() >= rounded {
                        self.failures += 1;
                        self.failed_bytes += requested;
                    }
                    return;
                }
            }
        }
    }

    fn remove_random(&mut self) {
        let i = self.rng.below(self.live.len() as u64) as usize;
        let b = self.live.swap_remove(i);
        self.requested_live -= b.requested;
        self.shards[b.shard].free(b.offset, b.len);
    }

    /// Free bytes inside the runs of shards other than `s`: unusable by `s`.
    fn stranded_for(&self, s: usize) -> u64 {
        (0..self.shards.len())
            .filter(|&o| o != s)
            .map(|o| self.shards[o].free_in_runs())
            .sum()
    }
}

fn churn(dist: Dist, shards: usize, steps: u64) {
    let mut c = Churn::new(dist, shards, RUN_BYTES, 0x5eed + shards as u64);
    c.fill();
    println!(
        "\n### {}, {shards} shard(s): {} live objects at the {FILL_PERCENT} % fill, {steps} remove+refill steps\n",
        dist.name(),
        c.live.len()
    );
    println!(
        "| step | used % | frag, shard 0's view: mean / max | frag, whole segment: mean / max | largest free range MiB | free ranges in runs | runs held | free in other shards' runs MiB | allocs | failed while free ≥ request | mean failed request KiB | rounding waste % |"
    );
    println!("|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let windows = 10;
    let per_window = steps / windows;
    for w in 0..windows {
        let (a0, f0, b0) = (c.attempts, c.failures, c.failed_bytes);
        let mut shard_view = (0.0, 0.0f64);
        let mut segment = (0.0, 0.0f64);
        let mut samples = 0;
        for step in 0..per_window {
            c.remove_random();
            c.fill();
            if step % 64 == 0 {
                let (f, g) = (c.frag(0), c.frag_segment());
                shard_view = (shard_view.0 + f, shard_view.1.max(f));
                segment = (segment.0 + g, segment.1.max(g));
                samples += 1;
            }
        }
        let used = c.seg.used_bytes();
        let (_, largest) = c.visible(0);
        let attempts = c.attempts - a0;
        let failures = c.failures - f0;
        let mean_failed = if failures == 0 {
            "-".to_string()
        } else {
            format!(
                "{:.0}",
                (c.failed_bytes - b0) as f64 / failures as f64 / 1024.0
            )
        };
        println!(
            "| {} | {:.1} | {:.3} / {:.3} | {:.3} / {:.3} | {:.1} | {} | {} | {:.1} | {attempts} | {failures} ({:.2} %) | {mean_failed} | {:.2} |",
            (w + 1) * per_window,
            used as f64 * 100.0 / c.seg.capacity as f64,
            shard_view.0 / samples as f64,
            shard_view.1,
            segment.0 / samples as f64,
            segment.1,
            largest as f64 / (1 << 20) as f64,
            c.shards
                .iter()
                .map(|s| s.free_ranges_in_runs())
                .sum::<usize>(),
            c.shards.iter().map(|s| s.runs_held()).sum::<usize>(),
            c.stranded_for(0) as f64 / (1 << 20) as f64,
            failures as f64 * 100.0 / attempts as f64,
            (used - c.requested_live) as f64 * 100.0 / used as f64,
        );
    }
    c.empty();
}

impl Churn {
    /// Removes everything: every byte must come back to the pool as one range (the
    /// coalescing check).
    fn empty(mut self) {
        while !self.live.is_empty() {
            self.remove_random();
        }
        for s in &mut self.shards {
            s.release_all();
        }
        assert_eq!(self.seg.pool_free_bytes(), self.seg.capacity);
        assert_eq!(self.seg.pool_largest_free(), self.seg.capacity);
    }
}

/// One line per run size: the same churn with `ock.mmc.segment.run_bytes` changed, averaged
/// over the steps after the first tenth (the warm-up).
fn run_size_sweep(dist: Dist, shards: usize, steps: u64) {
    for run_mib in [1u64, 4, 16, 64] {
        let mut c = Churn::new(dist, shards, run_mib << 20, 0x5eed + shards as u64);
        c.fill();
        for _ in 0..steps / 10 {
            c.remove_random();
            c.fill();
        }
        let (a0, f0) = (c.attempts, c.failures);
        let (mut frag_sum, mut stranded_sum, mut samples) = (0.0, 0.0, 0);
        for step in 0..steps - steps / 10 {
            c.remove_random();
            c.fill();
            if step % 64 == 0 {
                frag_sum += c.frag_segment();
                stranded_sum += c.stranded_for(0) as f64;
                samples += 1;
            }
        }
        let attempts = c.attempts - a0;
        println!(
            "| {} | {shards} | {} MiB | {:.3} | {:.1} | {:.2} % |",
            dist.name(),
            c.seg.run_bytes >> 20,
            frag_sum / samples as f64,
            stranded_sum / samples as f64 / (1 << 20) as f64,
            (c.failures - f0) as f64 * 100.0 / attempts as f64,
        );
        c.empty();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo bench` passes `--bench`; anything else (`cargo test --benches`, `-- --test`) is
    // a smoke run.
    let full = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test");
    let (keys, steps) = if full {
        (1_000_000, 100_000)
    } else {
        (20_000, 2_000)
    };
    let started = Instant::now();
    println!("## Store metadata bytes per key\n");
    println!(
        "Objects of {OBJECT_BYTES} bytes (one page each) on a {} GiB DRAM segment; one store, as one shard owns it.",
        FOOTPRINT_SEGMENT_BYTES >> 30
    );
    footprint(keys, 1);
    footprint(keys, 8);

    println!("\n## Allocator fragmentation under churn\n");
    println!(
        "A {} GiB DRAM segment, {} MiB runs, filled to {FILL_PERCENT} %; each step removes a random object and allocates back to the fill (a failed allocation ends the refill, as if it evicted). frag = 1 - largest free range / free bytes, as shard 0 sees them (its runs and the pool).",
        CHURN_SEGMENT_BYTES >> 30,
        RUN_BYTES >> 20
    );
    for dist in [Dist::KvBlocks, Dist::LogUniform, Dist::Small] {
        for shards in [1, 2] {
            churn(dist, shards, steps);
        }
    }
    println!(
        "\n### Run size (`ock.mmc.segment.run_bytes`) against fragmentation, after a tenth of warm-up\n"
    );
    println!(
        "| distribution | shards | run | frag, whole segment (mean) | free in shard 1's runs MiB (mean) | failed while free ≥ request |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for dist in [Dist::KvBlocks, Dist::LogUniform] {
        run_size_sweep(dist, 2, steps);
    }
    println!("\n(total {:.1} s)", started.elapsed().as_secs_f64());
}
