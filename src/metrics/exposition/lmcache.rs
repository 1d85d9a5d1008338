//! LMCache-compatible tier and event-bus families (memory media = L1, SSD = L2).

use super::writer::Out;
use super::{medium_usage, sum, sum_i};
use crate::common::medium::Medium;
use crate::metrics::bus::{BusStats, SUBSCRIBERS, TierStats};
use crate::metrics::hist::BucketHistogram;
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
pub(super) fn render_tiers_and_bus(cluster: &dyn Source, o: &mut Out<'_>) {
    render_usage(cluster, o);
    render_tasks(cluster, o);
    render_histograms(cluster, o);
    render_bus(cluster, o);
}

/// L1 and L2 usage.
fn render_usage(cluster: &dyn Source, o: &mut Out<'_>) {
    let (hbm_c, hbm_u) = medium_usage(cluster, Medium::Hbm);
    let (dram_c, dram_u) = medium_usage(cluster, Medium::Dram);
    let (ssd_c, ssd_u) = medium_usage(cluster, Medium::Ssd);
    let (l1_cap, l1_used) = (hbm_c + dram_c, hbm_u + dram_u);
    o.single(
        "lmcache_mp_l1_memory_usage_bytes",
        "Bytes currently held in L1 (HBM and DRAM)",
        "gauge",
        l1_used,
    );
    let ratio = "lmcache_mp_l1_usage_ratio";
    o.family(ratio, "L1 used bytes over L1 capacity", "gauge");
    let r = if l1_cap == 0 {
        0.0
    } else {
        l1_used as f64 / l1_cap as f64
    };
    o.float(ratio, &[], r);
    if ssd_c > 0 || ssd_u > 0 {
        let l2 = "lmcache_mp_l2_usage_bytes";
        o.family(l2, "Bytes currently held in L2 (SSD)", "gauge");
        o.int(l2, SSD, ssd_u);
    }
}

/// The chunk and L2 task families, in output order: (metric, HELP, type, labels, value).
type Task = (
    &'static str,
    &'static str,
    &'static str,
    Labels,
    fn(&dyn Source) -> u64,
);

const TASKS: &[Task] = &[
    (
        "lmcache_mp_l1_read_chunks_total",
        "Chunks read from L1",
        "counter",
        &[],
        |c| t(c, |s| s.l1_read_chunks.get()),
    ),
    (
        "lmcache_mp_l1_write_chunks_total",
        "Chunks written to L1",
        "counter",
        &[],
        |c| t(c, |s| s.l1_write_chunks.get()),
    ),
    (
        "lmcache_mp_l1_evicted_chunks_total",
        "Chunks evicted from L1",
        "counter",
        &[],
        |c| t(c, |s| s.l1_evicted_chunks.get()),
    ),
    (
        "lmcache_mp_l2_evicted_chunks_total",
        "Chunks evicted from L2",
        "counter",
        &[],
        |c| t(c, |s| s.l2_evicted_chunks.get()),
    ),
    (
        "lmcache_mp_l2_store_submitted_requests_total",
        "L1 to L2 store tasks submitted",
        "counter",
        &[],
        |c| t(c, |s| s.l2_store_submitted.get()),
    ),
    (
        "lmcache_mp_l2_store_completed_requests_total",
        "L1 to L2 store tasks completed",
        "counter",
        SSD,
        |c| t(c, |s| s.l2_store_completed.get()),
    ),
    (
        "lmcache_mp_l2_store_failed_requests_total",
        "L1 to L2 store tasks that failed (the L1 copy was kept)",
        "counter",
        SSD,
        |c| t(c, |s| s.l2_store_failed.get()),
    ),
    (
        "lmcache_mp_l2_load_completed_requests_total",
        "L2 to L1 load tasks completed",
        "counter",
        SSD,
        |c| t(c, |s| s.l2_load_completed.get()),
    ),
    (
        "lmcache_mp_l2_load_failed_requests_total",
        "L2 to L1 load tasks that failed",
        "counter",
        SSD,
        |c| t(c, |s| s.l2_load_failed.get()),
    ),
    (
        "lmcache_mp_num_inflight_l2_stores",
        "In-flight L2 store tasks",
        "gauge",
        SSD_IDX,
        |c| ti(c, |s| s.inflight_l2_stores.get()),
    ),
    (
        "lmcache_mp_num_inflight_l2_loads",
        "In-flight L2 load tasks",
        "gauge",
        SSD_IDX,
        |c| ti(c, |s| s.inflight_l2_loads.get()),
    ),
    (
        "lmcache_mp_inflight_load_memory_usage_bytes",
        "L1 bytes reserved by in-flight L2 loads",
        "gauge",
        SSD_IDX,
        |c| ti(c, |s| s.inflight_load_bytes.get()),
    ),
    (
        "lmcache_mp_active_prefetch_jobs",
        "Prefetch rewarms in flight",
        "gauge",
        &[],
        |c| ti(c, |s| s.active_prefetch_jobs.get()),
    ),
];

fn render_tasks(cluster: &dyn Source, o: &mut Out<'_>) {
    for &(name, help, kind, labels, f) in TASKS {
        o.family(name, help, kind);
        o.int(name, labels, f(cluster));
    }
}

type H = fn(&TierStats) -> &BucketHistogram;

/// The histogram families: (metric, HELP, labels, histogram).
const HISTOGRAMS: &[(&str, &str, Labels, H)] = &[
    (
        "lmcache_mp_l1_chunk_lifetime_seconds",
        "Time from store to eviction of L1 chunks",
        &[],
        |s| &s.l1_chunk_lifetime,
    ),
    (
        "lmcache_mp_l1_chunk_idle_before_evict_seconds",
        "Time from last access to eviction of L1 chunks",
        &[],
        |s| &s.l1_chunk_idle_before_evict,
    ),
    (
        "lmcache_mp_l2_store_throughput_GBs",
        "Throughput of L1 to L2 stores in GB/s",
        SSD,
        |s| &s.l2_store_throughput,
    ),
    (
        "lmcache_mp_l2_load_throughput_GBs",
        "Throughput of L2 to L1 loads in GB/s",
        SSD,
        |s| &s.l2_load_throughput,
    ),
];

fn render_histograms(cluster: &dyn Source, o: &mut Out<'_>) {
    for &(name, help, labels, h) in HISTOGRAMS {
        let bounds = h(cluster.shard(0).tier_stats).bounds;
        let mut counts = vec![0u64; bounds.len() + 1];
        let mut total = 0.0;
        for s in cluster.shards() {
            h(s.tier_stats).add_to(&mut counts, &mut total);
        }
        let les: Vec<String> = bounds.iter().map(|b| format!("{b}")).collect();
        let les: Vec<&str> = les.iter().map(String::as_str).collect();
        o.family(name, help, "histogram");
        o.histogram(name, labels, &les, &counts, total);
    }
}

/// The event bus watching itself.
fn render_bus(cluster: &dyn Source, o: &mut Out<'_>) {
    let b = |f: fn(&BusStats) -> u64| sum(cluster, |s| f(s.bus_stats));
    o.single(
        "lmcache_mp_event_bus_queue_depth",
        "Events waiting in the event bus queues",
        "gauge",
        sum_i(cluster, |s| s.bus_stats.queue_depth.get()),
    );
    let now_ms = cluster.clock().now_ms() as i64;
    let oldest = cluster
        .shards()
        .map(|s| s.bus_stats.oldest_ms.get())
        .filter(|&t| t > 0)
        .min();
    let lag = "lmcache_mp_event_bus_drain_lag_seconds";
    o.family(
        lag,
        "Age of the oldest queued event, 0 when the queues are empty",
        "gauge",
    );
    o.float(
        lag,
        &[],
        oldest.map_or(0.0, |t| (now_ms - t).max(0) as f64 / 1000.0),
    );
    o.single(
        "lmcache_mp_event_bus_dropped_events_total",
        "Events dropped because a bus queue was full",
        "counter",
        b(|s| s.dropped.get()),
    );
    o.single(
        "lmcache_mp_event_bus_published_events_total",
        "Events published to the event bus",
        "counter",
        b(|s| s.published.get()),
    );
    let panics = "lmcache_mp_event_bus_subscriber_exceptions_total";
    o.family(
        panics,
        "Subscriber callbacks that panicked, by subscriber",
        "counter",
    );
    for (i, name) in SUBSCRIBERS.iter().enumerate() {
        // Only subscribers that are installed have series (the test subscriber is not, in
        // production).
        if !cluster.shards().any(|s| s.bus_stats.is_installed(i)) {
            continue;
        }
        let n = sum(cluster, |s| s.bus_stats.subscriber_panics[i].get());
        o.int(panics, &[("subscriber_name", name)], n);
    }
}
