//! A seeded, deterministic simulation of the [`Store`] (in the style of TigerBeetle's VOPR).
//!
//! The store does no I/O of its own: the simulation drives its API directly, playing the
//! shard's part. It puts (alloc, then commit or abort, sometimes much later), reads (leases
//! and pins, released later), removes, clears everything, evicts by name, prefetches,
//! mounts and unmounts a DRAM segment, completes the SSD flushes and rewarms the store asks
//! for in any order, with injected failures and damaged reads, starts and ends the
//! re-replication copies of objects left below their replica count, and jumps time. After every
//! step `check()` verifies every invariant the store keeps. The same seed replays the same
//! run: a failure prints its seed and step.
//!
//! `cargo test --lib store::sim` runs a fixed set of seeds; `scripts/simulate.sh` runs many
//! more (`MMC_SIM_SEEDS`, `MMC_SIM_STEPS`, the ignored `long_run`).

use std::sync::Arc;

use super::*;
use segment::{Segment, SegmentStatus};
use testing::TestStore;

/// splitmix64: small, fast, and the same everywhere (the cluster simulation draws from it too).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// Removes and returns a random element.
    pub(crate) fn take<T>(&mut self, v: &mut Vec<T>) -> Option<T> {
        if v.is_empty() {
            return None;
        }
        let i = self.below(v.len() as u64) as usize;
        Some(v.swap_remove(i))
    }
}

const KEYS: u64 = 320;
const DRAM_BYTES: u64 = 4 << 20;

struct Sim {
    rng: Rng,
    store: Store,
    table: Arc<SegmentTable>,
    ssd_dir: std::path::PathBuf,
    /// Puts granted and not committed yet.
    writers: Vec<(ObjHandle, Arc<WriterLink>)>,
    /// Reads served and not released yet.
    pins: Vec<BlobHandle>,
    /// I/O the store asked for, not completed yet (with the key a reader waits on).
    jobs: Vec<(IoJob, Option<Box<[u8]>>)>,
    /// Re-replication copies started and not ended yet (their new blobs).
    copies: Vec<BlobHandle>,
    /// The rank-1 DRAM segment while it is mounted, and whether it is being unmounted.
    extra: Option<Arc<Segment>>,
    unmounting: bool,
    seen: Coverage,
}

/// What a run exercised, so a change that stops the simulation reaching a path fails.
#[derive(Debug, Default, Clone, Copy)]
struct Coverage {
    flushes: u64,
    /// Demotions HBM → DRAM that went as jobs (the mover's) and landed or failed.
    demotions: u64,
    rewarms: u64,
    direct_reads: u64,
    unmounts: u64,
    purges: u64,
    reclaimed: u64,
    rereplicated: u64,
}

impl std::ops::AddAssign for Coverage {
    fn add_assign(&mut self, o: Coverage) {
        self.flushes += o.flushes;
        self.demotions += o.demotions;
        self.rewarms += o.rewarms;
        self.direct_reads += o.direct_reads;
        self.unmounts += o.unmounts;
        self.purges += o.purges;
        self.reclaimed += o.reclaimed;
        self.rereplicated += o.rereplicated;
    }
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let ssd_dir = std::env::temp_dir().join(format!(
            "mmc-sim-{}-{seed}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let mut store = TestStore::new()
            .ssd_dir(ssd_dir.to_str().expect("a UTF-8 temp dir"))
            .segment(0, Medium::Hbm, 2 << 20)
            .segment(0, Medium::Dram, DRAM_BYTES)
            .segment(0, Medium::Ssd, 16 << 20)
            .config(|c| {
                c.low_percent = 70;
                c.alloc_timeout_ms = 5000;
            })
            .build();
        let table = store.table.clone();
        store.set_manual_clock(1_000);
        // As the shards run it: a drain's demotion HBM → DRAM is a job that lands (or fails)
        // whenever the simulation completes it, the blob readable in HBM until then.
        store.set_move_off_shard(true);
        Sim {
            rng: Rng(seed),
            store,
            table,
            ssd_dir,
            writers: Vec::new(),
            pins: Vec::new(),
            jobs: Vec::new(),
            copies: Vec::new(),
            extra: None,
            unmounting: false,
            seen: Coverage::default(),
        }
    }

    fn key(&mut self) -> Box<[u8]> {
        // A few keys carry a chunk hash, so evict/prefetch by name find several objects.
        let k = self.rng.below(KEYS);
        let key = if k % 4 == 0 {
            format!("m@1@{}@{:x}@bf16", k % 3, k / 8 + 1)
        } else {
            format!("k{k}")
        };
        key.into_bytes().into_boxed_slice()
    }

    fn step(&mut self) {
        match self.rng.below(100) {
            0..=24 => self.put(),
            25..=34 => self.commit(),
            35..=54 => self.read(),
            55..=61 => self.unpin(),
            62..=73 => self.complete_job(),
            74..=77 => {
                let key = self.key();
                self.store.remove(&key);
            }
            78..=81 => self.evict_named(),
            82..=83 => {
                let key = self.key();
                let jobs = self.store.prefetch_named(&key);
                self.jobs.extend(jobs.into_iter().map(|j| (j, None)));
            }
            84..=85 => self.mount_or_unmount(),
            86..=87 => {
                let moves = self.store.begin_rereplicate();
                self.copies.extend(moves.iter().map(|m| m.to.handle));
            }
            88..=89 => self.finish_copy(),
            90..=91 => {
                let ms = [1, 10, 100, 1000, 2500, 6000][self.rng.below(6) as usize];
                self.store.advance_clock(ms);
            }
            92..=96 => {
                let before = self.writers.iter().filter(|(_, l)| l.is_revoked()).count();
                self.store.tick();
                let after = self.writers.iter().filter(|(_, l)| l.is_revoked()).count();
                self.seen.reclaimed += (after - before) as u64;
            }
            97 => {
                if self.rng.chance(10) {
                    self.store.remove_all();
                    self.seen.purges += 1;
                }
            }
            _ => {
                self.store.continue_purge();
            }
        }
        if self.unmounting {
            self.try_unmount();
        }
        self.collect_jobs();
        self.store.check();
    }

    fn put(&mut self) {
        let key = self.key();
        let size = 1 + self.rng.below(128 << 10);
        let medium = [
            None,
            Some(Medium::Hbm),
            Some(Medium::Dram),
            Some(Medium::Dram),
        ][self.rng.below(4) as usize];
        let replicas = if self.rng.chance(15) { 2 } else { 1 };
        // Most puts may wait for zombies to give room back; the rest evict at once (a caller
        // that waited long enough).
        let placement = Placement::on(medium, replicas);
        let step = if self.rng.chance(70) {
            self.store.alloc(key, size, placement)
        } else {
            self.store.alloc_now(key, size, placement)
        };
        if let AllocStep::Granted { obj, link, .. } = step {
            if self.rng.chance(70) {
                let ok = self.rng.chance(90);
                self.store.commit(obj, ok);
            } else {
                link.wrote(size / 2);
                self.writers.push((obj, link));
            }
        }
    }

    fn commit(&mut self) {
        if let Some((obj, link)) = self.rng.take(&mut self.writers) {
            let ok = self.rng.chance(85);
            let revoked = link.is_revoked();
            let found = self.store.commit(obj, ok);
            // A revoked writer's commit finds its object gone.
            if revoked {
                assert!(!found);
            }
        }
    }

    fn read(&mut self) {
        let key = self.key();
        let step = if self.rng.chance(10) {
            self.store.get_direct(&key)
        } else {
            self.store.get(&key)
        };
        self.on_get(step, key);
    }

    fn on_get(&mut self, step: GetStep, key: Box<[u8]>) {
        match step {
            GetStep::Ready(v) => self.pins.push(v.handle),
            GetStep::Rewarm(job) => self.jobs.push((job, Some(key))),
            GetStep::ReadDirect(job) => self.jobs.push((job, None)),
            GetStep::NotFound | GetStep::Wait | GetStep::WaitForFlush | GetStep::Failed(_) => {}
        }
    }

    fn unpin(&mut self) {
        if let Some(h) = self.rng.take(&mut self.pins) {
            self.store.unpin(h);
        }
    }

    fn evict_named(&mut self) {
        let key = self.key();
        let locations: Option<SmallVec<[Medium; 3]>> = match self.rng.below(3) {
            0 => None,
            1 => Some([Medium::Hbm].into_iter().collect()),
            _ => Some([Medium::Dram, Medium::Hbm].into_iter().collect()),
        };
        self.store.evict_named(&key, locations.as_deref());
    }

    /// Takes the store's new jobs (flushes started by evictions).
    fn collect_jobs(&mut self) {
        for job in self.store.take_jobs() {
            self.jobs.push((job, None));
        }
    }

    /// Completes one job in flight, as the shard would when its I/O ends: success, an I/O
    /// error, or (reads) bytes that fail their checksum.
    fn complete_job(&mut self) {
        let Some((job, reader)) = self.rng.take(&mut self.jobs) else {
            return;
        };
        let outcome = match self.rng.below(10) {
            0 => IoOutcome::Failed,
            1 => IoOutcome::Damaged,
            _ => IoOutcome::Done,
        };
        match &job {
            IoJob::Flush { .. } => {
                let ok = outcome == IoOutcome::Done;
                let sum = self.rng.next();
                self.store.finish_flush(&job, ok, sum, 100);
                self.seen.flushes += 1;
            }
            IoJob::Rewarm { .. } => {
                self.store.finish_rewarm(&job, outcome, 100);
                self.seen.rewarms += 1;
                if let Some(key) = reader {
                    let step = self.store.get_after_rewarm(&key);
                    self.on_get(step, key);
                }
            }
            IoJob::Demote { .. } => {
                self.store.finish_demote(&job, outcome == IoOutcome::Done);
                self.seen.demotions += 1;
            }
            IoJob::ReadSsd { .. } => {
                self.store.finish_direct_read(&job, outcome);
                self.seen.direct_reads += 1;
            }
        }
    }

    /// Ends one re-replication copy: the bytes landed, or the copy failed.
    fn finish_copy(&mut self) {
        if let Some(dst) = self.rng.take(&mut self.copies) {
            let before = self.store.stats.rereplicated.get();
            self.store.finish_rereplicate(dst, self.rng.chance(85));
            self.seen.rereplicated += self.store.stats.rereplicated.get() - before;
        }
    }

    fn mount_or_unmount(&mut self) {
        match (&self.extra, self.unmounting) {
            (None, _) => {
                let seg = mount::build_segment(
                    &self.table,
                    1,
                    Medium::Dram,
                    DRAM_BYTES,
                    None,
                    1,
                    1 << 20,
                )
                .expect("a DRAM segment");
                self.table.insert(seg.clone()).expect("mounted");
                self.extra = Some(seg);
            }
            (Some(seg), false) => {
                seg.set_status(SegmentStatus::Unmounting);
                self.unmounting = true;
            }
            (Some(_), true) => {}
        }
    }

    /// One evacuation attempt of the segment being unmounted; once it holds nothing, it
    /// leaves the table and the store forgets it.
    fn try_unmount(&mut self) {
        let seg = self.extra.clone().expect("unmounting a mounted segment");
        if !self.store.evacuate(seg.id) {
            return;
        }
        self.table.remove(&seg.name);
        self.store.forget_segment(seg.id);
        self.extra = None;
        self.unmounting = false;
        self.seen.unmounts += 1;
    }

    /// Ends the run: every writer, pin and job let go, time past every lease; the store must
    /// then hold exactly what is readable.
    fn settle(&mut self) {
        for _ in 0..10_000 {
            if self.jobs.is_empty()
                && self.writers.is_empty()
                && self.pins.is_empty()
                && self.copies.is_empty()
            {
                break;
            }
            self.commit();
            self.unpin();
            self.complete_job();
            self.finish_copy();
            self.collect_jobs();
            self.store.check();
        }
        assert!(self.jobs.is_empty() && self.writers.is_empty() && self.pins.is_empty());
        assert!(self.copies.is_empty());
        while self.store.continue_purge() {}
        self.store.advance_clock(10_000);
        self.store.tick();
        self.store.check();
        assert!(
            self.store.zombies.is_empty(),
            "zombies outlived their leases"
        );
        assert!(
            self.store.orphaned.is_empty(),
            "orphans outlived their writers"
        );
        assert!(self.store.uncommitted.is_empty());
        // Clearing everything gives back every byte.
        self.store.remove_all();
        while self.store.continue_purge() {}
        self.store.check();
        for m in Medium::ALL {
            assert_eq!(self.store.my_used(m), 0, "{m} bytes left after remove_all");
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.ssd_dir);
    }
}

fn run(seed: u64, steps: u64) -> Coverage {
    let mut sim = Sim::new(seed);
    for step in 0..steps {
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.step()));
        if let Err(e) = res {
            eprintln!("simulation failed: seed {seed}, step {step}");
            std::panic::resume_unwind(e);
        }
    }
    sim.settle();
    sim.seen
}

#[test]
fn fixed_seeds() {
    let mut seen = Coverage::default();
    for seed in 1..=6 {
        seen += run(seed, 1500);
    }
    eprintln!("simulated: {seen:?}");
    let Coverage {
        flushes,
        demotions,
        rewarms,
        direct_reads,
        unmounts,
        purges,
        reclaimed,
        rereplicated,
    } = seen;
    for (what, n) in [
        ("flushes", flushes),
        ("demotions by the mover", demotions),
        ("rewarms", rewarms),
        ("direct reads", direct_reads),
        ("unmounts", unmounts),
        ("remove_alls", purges),
        ("reclaimed writers", reclaimed),
        ("re-replicated objects", rereplicated),
    ] {
        assert!(n > 0, "the fixed seeds reached no {what}: {seen:?}");
    }
}

/// Many seeds for soak runs, only when `MMC_SIM_SEEDS=FROM..TO` (or `N`) is set, with
/// `MMC_SIM_STEPS=N` steps each (scripts/simulate.sh); the fixed seeds above run always.
#[test]
fn long_run() {
    let Ok(seeds) = std::env::var("MMC_SIM_SEEDS") else {
        return;
    };
    let (from, to) = seeds
        .split_once("..")
        .map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap()))
        .unwrap_or_else(|| {
            let s: u64 = seeds.parse().expect("MMC_SIM_SEEDS: N or FROM..TO");
            (s, s + 1)
        });
    let steps = std::env::var("MMC_SIM_STEPS")
        .ok()
        .map_or(20_000, |s| s.parse().expect("MMC_SIM_STEPS: a number"));
    let mut seen = Coverage::default();
    for seed in from..to {
        seen += run(seed, steps);
    }
    eprintln!("simulated seeds {from}..{to}, {steps} steps each: {seen:?}");
}
