//! In-process benchmarks of one shard's store: put (alloc → write → update_state), leased get
//! (get → pinned blob → read the bytes → unpin), exist and remove, on a 1 GiB DRAM segment.
//!
//! No HTTP, no cross-shard messages: this is the store's share of a request's cost, on the
//! owner shard's thread. Each benchmark reports one operation per iteration, so criterion's
//! throughput line (`elem/s`) is operations per second of one shard.
//!
//! The store holds a resident population of written objects (256 MiB of them, a quarter of
//! the segment, below the 90 % eviction watermark) so that lookups go through a populated
//! index and reads touch memory that is not all in cache. Puts and removes work on keys
//! outside that population and are undone in batches outside the timed part.
//!
//! A second group, `dram_write`, splits a put's write into the copy and the page faults
//! that follow the store's discard of freed ranges.
//!
//! Run: `taskset -c 1 cargo bench --bench store` (smoke run: append `-- --test`).

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use mmc::common::event::Event;
use mmc::common::memory::MappedRegion;
use mmc::shards::store::{GetStep, Store};

use common::{Rng, drain_events, dram_store, lmcache_key, put};

const SEGMENT_BYTES: u64 = 1 << 30;
/// Bytes of resident objects the store holds while it is measured.
const RESIDENT_BYTES: u64 = 256 << 20;
/// Objects put (or removed) per timed batch before the batch is undone untimed. Small enough
/// that a batch of 64 KiB objects (64 MiB) keeps the segment far from the watermark.
const BATCH: u64 = 1024;
/// Object sizes measured: a small value and a small KV block.
const SIZES: [u64; 2] = [4 << 10, 64 << 10];

/// A store with its resident objects, and the keys and payload used to measure it.
struct Fixture {
    store: Store,
    events: Vec<Event>,
    size: u64,
    payload: Vec<u8>,
    resident: Vec<Vec<u8>>,
    /// Keys that are not resident: put and removed by the benchmarks.
    spare: Vec<Vec<u8>>,
    rng: Rng,
}

impl Fixture {
    fn new(size: u64) -> Fixture {
        let mut store = dram_store(SEGMENT_BYTES);
        let mut events = Vec::new();
        let payload: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
        let n = RESIDENT_BYTES / size;
        let key = |i: u64| {
            let mut k = Vec::new();
            lmcache_key(i, 1, &mut k);
            k
        };
        let resident: Vec<Vec<u8>> = (0..n).map(key).collect();
        for k in &resident {
            put(&mut store, k, size, Some(&payload));
            drain_events(&mut store, &mut events);
        }
        let spare = (n..n + BATCH).map(key).collect();
        Fixture {
            store,
            events,
            size,
            payload,
            resident,
            spare,
            rng: Rng::new(0x5eed ^ size),
        }
    }

    fn random_resident(&mut self) -> usize {
        self.rng.below(self.resident.len() as u64) as usize
    }

    /// Puts the first `n` spare keys; returns the time taken.
    fn put_spares(&mut self, n: usize) -> Duration {
        let start = Instant::now();
        for k in &self.spare[..n] {
            put(&mut self.store, k, self.size, Some(&self.payload));
            drain_events(&mut self.store, &mut self.events);
        }
        start.elapsed()
    }

    /// Removes the first `n` spare keys; returns the time taken.
    fn remove_spares(&mut self, n: usize) -> Duration {
        let start = Instant::now();
        for k in &self.spare[..n] {
            let removed = self.store.remove(k);
            debug_assert!(removed);
            drain_events(&mut self.store, &mut self.events);
        }
        start.elapsed()
    }
}

fn label(size: u64) -> String {
    format!("{}KiB", size >> 10)
}

/// Runs `iters` operations in batches of at most [`BATCH`]: each batch runs `timed` (whose
/// time counts) and `untimed` (which undoes or prepares it), in the order `timed_first` says.
fn batched(
    f: &mut Fixture,
    iters: u64,
    mut timed: impl FnMut(&mut Fixture, usize) -> Duration,
    mut untimed: impl FnMut(&mut Fixture, usize) -> Duration,
    timed_first: bool,
) -> Duration {
    let mut total = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let n = (iters - done).min(BATCH) as usize;
        if timed_first {
            total += timed(f, n);
            untimed(f, n);
        } else {
            untimed(f, n);
            total += timed(f, n);
        }
        done += n as u64;
    }
    total
}

fn bench_store(c: &mut Criterion) {
    let mut g = c.benchmark_group("store");
    g.throughput(Throughput::Elements(1));
    for size in SIZES {
        let mut f = Fixture::new(size);
        let l = label(size);

        // alloc → write the bytes → update_state of a new key (the key's copy into a
        // `Box<[u8]>` included: a put has to make it).
        g.bench_function(format!("put/{l}"), |b| {
            b.iter_custom(|iters| {
                batched(
                    &mut f,
                    iters,
                    Fixture::put_spares,
                    Fixture::remove_spares,
                    true,
                )
            })
        });

        // A leased read of a random resident object: get (lease + pin) → copy the bytes out
        // → unpin, as a response that copies the blob would.
        let mut out = vec![0u8; size as usize];
        g.bench_function(format!("get_leased/{l}"), |b| {
            b.iter(|| {
                let i = f.random_resident();
                let GetStep::Ready(v) = f.store.get(&f.resident[i]) else {
                    panic!("resident object not readable");
                };
                // SAFETY: the blob is pinned (readable, never written) until the unpin below.
                unsafe { v.seg.backend.read(v.offset, &mut out[..v.len as usize]) }
                    .expect("read from a DRAM blob");
                f.store.unpin(v.handle);
                drain_events(&mut f.store, &mut f.events);
                black_box(out[i % out.len()])
            })
        });

        if size == SIZES[0] {
            g.bench_function(format!("exist/{l}"), |b| {
                b.iter(|| {
                    let i = f.random_resident();
                    black_box(f.store.exists(&f.resident[i]))
                })
            });
        }

        // remove of an object nobody reads (freed at once: its range goes back to the
        // shard's free space and its pages to the kernel).
        g.bench_function(format!("remove/{l}"), |b| {
            b.iter_custom(|iters| {
                batched(
                    &mut f,
                    iters,
                    Fixture::remove_spares,
                    Fixture::put_spares,
                    false,
                )
            })
        });
        f.store.check();
    }
    g.finish();
}

/// What writing a blob's bytes costs with and without the pages mapped. The store discards
/// (`madvise(MADV_DONTNEED)`) a blob's pages when it frees the blob, so the next put into that
/// range faults every page in again (and the kernel zeroes it); `after_discard` measures
/// that cycle, `resident` the copy alone. Writes rotate over 64 MiB so that they miss the
/// cache as a store's writes do.
fn bench_dram_pages(c: &mut Criterion) {
    const REGION_BYTES: u64 = 64 << 20;
    let mut g = c.benchmark_group("dram_write");
    g.throughput(Throughput::Elements(1));
    for size in SIZES {
        let l = label(size);
        let region = MappedRegion::new(REGION_BYTES).expect("a host mapping");
        let payload = vec![0x5au8; size as usize];
        let slots = REGION_BYTES / size;
        let mut slot = 0;
        let mut next = move || {
            slot = (slot + 1) % slots;
            slot * size
        };
        for off in (0..REGION_BYTES).step_by(size as usize) {
            // SAFETY: this benchmark owns the whole region.
            unsafe { region.write(off, &payload) }.expect("in bounds");
        }
        g.bench_function(format!("resident/{l}"), |b| {
            b.iter(|| {
                // SAFETY: as above.
                unsafe { region.write(next(), &payload) }.expect("in bounds")
            })
        });
        g.bench_function(format!("after_discard/{l}"), |b| {
            b.iter(|| {
                let off = next();
                // SAFETY: as above.
                unsafe {
                    region.discard(off, size);
                    region.write(off, &payload)
                }
                .expect("in bounds")
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    // Short runs: the whole file finishes in well under a minute.
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = bench_store, bench_dram_pages
}
criterion_main!(benches);
