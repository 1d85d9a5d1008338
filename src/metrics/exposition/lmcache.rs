//! LMCache-compatible tier and event-bus families (memory media = L1, SSD = L2).

use std::sync::OnceLock;

use super::writer::{Family, HistogramLines, Out, family};
use super::{medium_usage, sum, sum_i};
use crate::common::medium::Medium;
use crate::metrics::bus::{BusStats, SUBSCRIBERS, TierStats};
use crate::metrics::hist::{BucketHistogram, GBS_BUCKETS, SECONDS_BUCKETS};
use crate::metrics::view::Source;

type Labels = &'static [(&'static str, &'static str)];

/// The one L2 adapter: the SSD tier, named by its medium.
const SSD: Labels = &[("l2_name", Medium::Ssd.lower())];
const SSD_IDX: Labels = &[("l2_name", Medium::Ssd.lower()), ("adapter_index", "0")];

fn t(c: &dyn Source, f: fn(&TierStats) -> u64) -> u64 {
    sum(c, |s| f(s.tier_stats))
}

fn ti(c: &dyn Source, f: fn(&TierStats) -> i64) -> u64 {
    sum_i(c, |s| f(s.tier_stats))
}

/// Renders the LMCache families.
pub(super) fn render_tiers_and_bus(shared: &dyn Source, o: &mut Out<'_>) {
    render_usage(shared, o);
    render_tasks(shared, o);
    render_histograms(shared, o);
    render_bus(shared, o);
}

static L1_USAGE: Family = family!(
    "lmcache_mp_l1_memory_usage_bytes",
    "Bytes currently held in L1 (HBM and DRAM)",
    gauge
);

static L1_RATIO: Family = family!(
    "lmcache_mp_l1_usage_ratio",
    "L1 used bytes over L1 capacity",
    gauge
);

static L2_USAGE: Family = family!(
    "lmcache_mp_l2_usage_bytes",
    "Bytes currently held in L2 (SSD)",
    gauge
);

/// L1 and L2 usage.
fn render_usage(shared: &dyn Source, o: &mut Out<'_>) {
    let gather = |figures: &mut Vec<u64>| {
        let (hbm_c, hbm_u) = medium_usage(shared, Medium::Hbm);
        let (dram_c, dram_u) = medium_usage(shared, Medium::Dram);
        let (ssd_c, ssd_u) = medium_usage(shared, Medium::Ssd);
        figures.extend([hbm_c + dram_c, hbm_u + dram_u, ssd_c, ssd_u]);
    };
    let write = |o: &mut Out<'_>, figures: &[u64]| {
        let &[l1_cap, l1_used, ssd_c, ssd_u] = figures else {
            unreachable!("four figures")
        };
        o.single(&L1_USAGE, l1_used);
        o.family(&L1_RATIO);
        let r = if l1_cap == 0 {
            0.0
        } else {
            l1_used as f64 / l1_cap as f64
        };
        o.float(&[], r);
        if ssd_c > 0 || ssd_u > 0 {
            o.family(&L2_USAGE);
            o.int(SSD, ssd_u);
        }
    };
    super::families::block(o, &L1_USAGE, gather, write);
}

/// The chunk and L2 task families, in output order: (family, labels, value).
type Task = (Family, Labels, fn(&dyn Source) -> u64);

static TASKS: &[Task] = &[
    (
        family!(
            "lmcache_mp_l1_read_chunks_total",
            "Chunks read from L1",
            counter
        ),
        &[],
        |c| t(c, |s| s.l1_read_chunks.get()),
    ),
    (
        family!(
            "lmcache_mp_l1_write_chunks_total",
            "Chunks written to L1",
            counter
        ),
        &[],
        |c| t(c, |s| s.l1_write_chunks.get()),
    ),
    (
        family!(
            "lmcache_mp_l1_evicted_chunks_total",
            "Chunks evicted from L1",
            counter
        ),
        &[],
        |c| t(c, |s| s.l1_evicted_chunks.get()),
    ),
    (
        family!(
            "lmcache_mp_l2_evicted_chunks_total",
            "Chunks evicted from L2",
            counter
        ),
        &[],
        |c| t(c, |s| s.l2_evicted_chunks.get()),
    ),
    (
        family!(
            "lmcache_mp_l2_store_submitted_requests_total",
            "L1 to L2 store tasks submitted",
            counter
        ),
        &[],
        |c| t(c, |s| s.l2_store_submitted.get()),
    ),
    (
        family!(
            "lmcache_mp_l2_store_completed_requests_total",
            "L1 to L2 store tasks completed",
            counter
        ),
        SSD,
        |c| t(c, |s| s.l2_store_completed.get()),
    ),
    (
        family!(
            "lmcache_mp_l2_store_failed_requests_total",
            "L1 to L2 store tasks that failed (the L1 copy was kept)",
            counter
        ),
        SSD,
        |c| t(c, |s| s.l2_store_failed.get()),
    ),
    (
        family!(
            "lmcache_mp_l2_load_completed_requests_total",
            "L2 to L1 load tasks completed",
            counter
        ),
        SSD,
        |c| t(c, |s| s.l2_load_completed.get()),
    ),
    (
        family!(
            "lmcache_mp_l2_load_failed_requests_total",
            "L2 to L1 load tasks that failed",
            counter
        ),
        SSD,
        |c| t(c, |s| s.l2_load_failed.get()),
    ),
    (
        family!(
            "lmcache_mp_num_inflight_l2_stores",
            "In-flight L2 store tasks",
            gauge
        ),
        SSD_IDX,
        |c| ti(c, |s| s.inflight_l2_stores.get()),
    ),
    (
        family!(
            "lmcache_mp_num_inflight_l2_loads",
            "In-flight L2 load tasks",
            gauge
        ),
        SSD_IDX,
        |c| ti(c, |s| s.inflight_l2_loads.get()),
    ),
    (
        family!(
            "lmcache_mp_inflight_load_memory_usage_bytes",
            "L1 bytes reserved by in-flight L2 loads",
            gauge
        ),
        SSD_IDX,
        |c| ti(c, |s| s.inflight_load_bytes.get()),
    ),
    (
        family!(
            "lmcache_mp_active_prefetch_jobs",
            "Prefetch rewarms in flight",
            gauge
        ),
        &[],
        |c| ti(c, |s| s.active_prefetch_jobs.get()),
    ),
];

fn render_tasks(shared: &dyn Source, o: &mut Out<'_>) {
    let gather = |figures: &mut Vec<u64>| figures.extend(TASKS.iter().map(|t| t.2(shared)));
    let write = |o: &mut Out<'_>, figures: &[u64]| {
        for ((family, labels, _), v) in TASKS.iter().zip(figures) {
            o.family(family);
            o.int(labels, *v);
        }
    };
    super::families::block(o, &TASKS[0].0, gather, write);
}

type H = fn(&TierStats) -> &BucketHistogram;

/// The histogram families: (family, labels, bounds, histogram).
static HISTOGRAMS: [(Family, Labels, &[f64], H); 4] = [
    (
        family!(
            "lmcache_mp_l1_chunk_lifetime_seconds",
            "Time from store to eviction of L1 chunks",
            histogram
        ),
        &[],
        SECONDS_BUCKETS,
        |s| &s.l1_chunk_lifetime,
    ),
    (
        family!(
            "lmcache_mp_l1_chunk_idle_before_evict_seconds",
            "Time from last access to eviction of L1 chunks",
            histogram
        ),
        &[],
        SECONDS_BUCKETS,
        |s| &s.l1_chunk_idle_before_evict,
    ),
    (
        family!(
            "lmcache_mp_l2_store_throughput_GBs",
            "Throughput of L1 to L2 stores in GB/s",
            histogram
        ),
        SSD,
        GBS_BUCKETS,
        |s| &s.l2_store_throughput,
    ),
    (
        family!(
            "lmcache_mp_l2_load_throughput_GBs",
            "Throughput of L2 to L1 loads in GB/s",
            histogram
        ),
        SSD,
        GBS_BUCKETS,
        |s| &s.l2_load_throughput,
    ),
];

/// Buckets a histogram of these families has at most (`+Inf` included).
const MAX_BUCKETS: usize = 16;

/// Each histogram family's lines, made once from its bounds (written as `Display` writes
/// them: `0.01`, `1`, `3600`).
fn histogram_lines() -> &'static [HistogramLines] {
    static LINES: OnceLock<Vec<HistogramLines>> = OnceLock::new();
    LINES.get_or_init(|| {
        HISTOGRAMS
            .iter()
            .map(|(family, labels, bounds, _)| {
                let les: Vec<String> = bounds.iter().map(|b| format!("{b}")).collect();
                let les: Vec<&str> = les.iter().map(String::as_str).collect();
                HistogramLines::new(family.name, labels, &les)
            })
            .collect()
    })
}

fn render_histograms(shared: &dyn Source, o: &mut Out<'_>) {
    for ((family, labels, bounds, h), lines) in HISTOGRAMS.iter().zip(histogram_lines()) {
        let buckets = bounds.len() + 1;
        let mut counts = [0u64; MAX_BUCKETS];
        let counts = &mut counts[..buckets];
        let mut total = 0.0;
        for s in shared.shards() {
            let hist = h(s.tier_stats);
            debug_assert_eq!(hist.bounds, *bounds);
            hist.add_to(counts, &mut total);
        }
        o.family(family);
        o.histogram(lines, labels, counts, total, None);
    }
}

static BUS_DEPTH: Family = family!(
    "lmcache_mp_event_bus_queue_depth",
    "Events waiting in the event bus queues",
    gauge
);

static BUS_LAG: Family = family!(
    "lmcache_mp_event_bus_drain_lag_seconds",
    "Age of the oldest queued event, 0 when the queues are empty",
    gauge
);

static BUS_DROPPED: Family = family!(
    "lmcache_mp_event_bus_dropped_events_total",
    "Events dropped because a bus queue was full",
    counter
);

static BUS_PUBLISHED: Family = family!(
    "lmcache_mp_event_bus_published_events_total",
    "Events published to the event bus",
    counter
);

static BUS_PANICS: Family = family!(
    "lmcache_mp_event_bus_subscriber_exceptions_total",
    "Subscriber callbacks that panicked, by subscriber",
    counter
);

/// The event bus watching itself.
fn render_bus(shared: &dyn Source, o: &mut Out<'_>) {
    let b = |f: fn(&BusStats) -> u64| sum(shared, |s| f(s.bus_stats));
    let gather = |figures: &mut Vec<u64>| {
        figures.push(sum_i(shared, |s| s.bus_stats.queue_depth.get()));
        let now_ms = shared.clock().now_ms() as i64;
        let oldest = shared
            .shards()
            .map(|s| s.bus_stats.oldest_ms.get())
            .filter(|&t| t > 0)
            .min();
        let lag = oldest.map_or(0.0, |t| (now_ms - t).max(0) as f64 / 1000.0);
        figures.extend([
            lag.to_bits(),
            b(|s| s.dropped.get()),
            b(|s| s.published.get()),
        ]);
        for i in 0..SUBSCRIBERS.len() {
            // Only subscribers that are installed have series (the test subscriber is not,
            // in production): `u64::MAX` for one that is not.
            figures.push(if shared.shards().any(|s| s.bus_stats.is_installed(i)) {
                sum(shared, |s| s.bus_stats.subscriber_panics[i].get())
            } else {
                u64::MAX
            });
        }
    };
    let write = |o: &mut Out<'_>, figures: &[u64]| {
        let [depth, lag, dropped, published] = [0, 1, 2, 3].map(|i| figures[i]);
        o.single(&BUS_DEPTH, depth);
        o.family(&BUS_LAG);
        o.float(&[], f64::from_bits(lag));
        o.single(&BUS_DROPPED, dropped);
        o.single(&BUS_PUBLISHED, published);
        o.family(&BUS_PANICS);
        for (name, &n) in SUBSCRIBERS.iter().zip(&figures[4..]) {
            if n != u64::MAX {
                o.int(&[("subscriber_name", name)], n);
            }
        }
    };
    super::families::block(o, &BUS_DEPTH, gather, write);
}
