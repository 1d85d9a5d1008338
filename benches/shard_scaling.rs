//! Shard scaling: how many times one shard's rate two shards doing alloc + commit on two cores
//! reach (issue 12 aims at 1.8 or more). A benchmark, not a test: it prints the ratio and
//! asserts nothing, since the figure depends on the machine being quiet; the figures measured
//! on the reference machine are in perf/RESULTS.md.
//!
//! Each shard is a thread pinned to its own core with its own `Store` over one shared DRAM
//! segment table, as in the server: the only things the shards share are the segment (its
//! run pool, taken only to take or return a run; its per-shard used counters) and the
//! table's mount epoch. A shard puts 4 KiB objects (alloc → commit, bytes not written: this
//! measures the store's metadata path) in batches and removes each batch untimed, so the
//! segment never fills. Its rate is objects per second of timed alloc + commit; the figure
//! for N shards is the sum of their rates.
//!
//! Run: `cargo bench --bench shard_scaling` (`MMC_BENCH_SECS`, default 5, per configuration).
//! The ratio only means something on an otherwise idle machine with at least two free cores:
//! on a shared or busy machine the second shard competes for CPU with everything else.
//!
//! `MMC_BENCH_ROUNDS` (default 10) one- and two-shard slices alternate; the ratio is the median
//! of the rounds' ratios. Figures: perf/RESULTS.md ("Issue 12: two shards against one").

#[allow(dead_code)]
mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use mmc::common::event::Event;
use mmc::metrics::store::StoreStats;
use mmc::metrics::trace::Tracer;
use mmc::shards::store::mount::build_segment;
use mmc::shards::store::segment::{Medium, SegmentTable};
use mmc::shards::store::{Store, StoreConfig};

use common::{RUN_BYTES, drain_events, lmcache_key, put};

const SEGMENT_BYTES: u64 = 1 << 30;
const OBJECT_BYTES: u64 = 4 << 10;
/// Objects put per timed batch (then removed untimed): 4 MiB per shard, far below eviction.
const BATCH: u64 = 1024;

fn pin_to(core: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the call only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn store_of(table: &Arc<SegmentTable>, shard: usize) -> Store {
    Store::new(
        shard,
        StoreConfig {
            keep_tombstones: false,
            lease_ms: 2000,
            high_percent: 90,
            low_percent: 80,
            alloc_timeout_ms: 30_000,
            remote_writer_ms: 22_250,
            rereplicate: Default::default(),
            key_format: Default::default(),
        },
        table.clone(),
        Arc::new(StoreStats::default()),
        Arc::new(Tracer::default()),
        mmc::common::clock::Clock::start(),
    )
}

/// One shard's alloc + commit rate (objects per second of timed work) over `secs`.
fn run_shard(
    table: Arc<SegmentTable>,
    shard: usize,
    core: usize,
    start: Arc<Barrier>,
    secs: f64,
) -> f64 {
    pin_to(core);
    let mut store = store_of(&table, shard);
    let mut events: Vec<Event> = Vec::new();
    let keys: Vec<Vec<u8>> = (0..BATCH)
        .map(|i| {
            let mut k = Vec::new();
            lmcache_key(shard as u64 * 1_000_000_000 + i, 1, &mut k);
            k
        })
        .collect();
    start.wait();
    let wall = Instant::now();
    let (mut timed, mut ops) = (Duration::ZERO, 0u64);
    while wall.elapsed().as_secs_f64() < secs {
        let t0 = Instant::now();
        for k in &keys {
            put(&mut store, k, OBJECT_BYTES, None);
        }
        timed += t0.elapsed();
        ops += BATCH;
        for k in &keys {
            assert!(store.remove(k));
        }
        drain_events(&mut store, &mut events);
    }
    ops as f64 / timed.as_secs_f64()
}

/// The summed rate of `shards` shards on cores `first..first + shards`.
fn measure(shards: usize, first: usize, secs: f64) -> f64 {
    let table = Arc::new(SegmentTable::default());
    let seg = build_segment(
        &table,
        0,
        Medium::Dram,
        SEGMENT_BYTES,
        None,
        shards,
        RUN_BYTES,
    )
    .expect("a DRAM segment");
    table.insert(seg).expect("the only segment");
    let start = Arc::new(Barrier::new(shards));
    let threads: Vec<_> = (0..shards)
        .map(|s| {
            let (table, start) = (table.clone(), start.clone());
            std::thread::spawn(move || run_shard(table, s, first + s, start, secs))
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).sum()
}

fn main() {
    // `cargo bench` passes `--bench`; a smoke run (`cargo test --benches`) passes nothing.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let secs: f64 = std::env::var("MMC_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 0.05 } else { 5.0 });
    let rounds: usize = std::env::var("MMC_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&r| r > 0)
        .unwrap_or(if smoke { 1 } else { 10 });
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 2 {
        let one = measure(1, 0, secs);
        println!("shard_scaling: 1 shard : {one:>12.0} alloc+commit/s");
        println!("shard_scaling: one core available: no two-shard figure");
        return;
    }
    // The machine's speed drifts (a VM's more than most): one- and two-shard slices alternate,
    // each round's ratio compares two neighbours in time, and the figure is their median. The
    // one-shard slice runs on core 0 and core 1 in turn (one core may serve more interrupts).
    let slice = secs / rounds as f64;
    let (mut ones, mut twos, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let core = (round / 2) % 2;
        let (one, two) = if round % 2 == 0 {
            let one = measure(1, core, slice);
            (one, measure(2, 0, slice))
        } else {
            let two = measure(2, 0, slice);
            (measure(1, core, slice), two)
        };
        ones.push(one);
        twos.push(two);
        ratios.push(two / one);
    }
    println!(
        "shard_scaling: 1 shard : {:>12.0} alloc+commit/s (median of {rounds} slices of {slice:.2} s)",
        median(&mut ones)
    );
    println!(
        "shard_scaling: 2 shards: {:>12.0} alloc+commit/s (median)",
        median(&mut twos)
    );
    let spread = format!(
        "{:.2}-{:.2}",
        ratios.iter().cloned().fold(f64::INFINITY, f64::min),
        ratios.iter().cloned().fold(0.0, f64::max)
    );
    println!(
        "shard_scaling: ratio {:.2} (median of the rounds' ratios, {spread}; target >= 1.80; meaningful on a quiet machine only)",
        median(&mut ratios)
    );
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
