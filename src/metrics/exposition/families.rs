//! The contract's `memcache_*` families (capacity, business calls, tiers, KV events) and the
//! server's own (HTTP front end, request latency histograms, process figures).

use super::writer::Out;
use super::{medium_usage, sum, sum_i};
use crate::common::medium::Medium;
use crate::metrics::ShardStats;
use crate::metrics::kv_events::{EventType, KvEventStats, MEDIUM_LABELS};
use crate::metrics::requests::{self, ReqOp};
use crate::metrics::store::{Op, OpCounters, StoreStats, TierCounters};
use crate::metrics::view::{SegmentFigures, Source};

/// The `CamelCase` name of an operation in HELP texts (`BatchGet`).
fn camel(op: Op) -> String {
    op.name()
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

type TierField = fn(&TierCounters) -> i64;
type OpField = fn(&OpCounters) -> u64;

/// The tier families of the eviction / flush / rewarm / hit group, in output order:
/// (metric, summary field, HELP, type, value).
pub(super) const TIER_FAMILIES: &[(&str, &str, &str, &str, TierField)] = &[
    (
        "memcache_evict_operations_total",
        "evict",
        "Total number of eviction operations",
        "counter",
        |t| t.evict.get() as i64,
    ),
    (
        "memcache_flush_blobs_total",
        "flush_blobs",
        "Total number of blobs flushed to SSD asynchronously",
        "counter",
        |t| t.flush_blobs.get() as i64,
    ),
    (
        "memcache_flush_bytes_total",
        "flush_bytes",
        "Total bytes flushed to SSD asynchronously",
        "counter",
        |t| t.flush_bytes.get() as i64,
    ),
    (
        "memcache_get_hits_dram_total",
        "get_hit_dram",
        "Total number of Get hits served from DRAM",
        "counter",
        |t| t.get_hits_dram.get() as i64,
    ),
    (
        "memcache_get_hits_ssd_total",
        "get_hit_ssd",
        "Total number of Get hits served from SSD (rewarm)",
        "counter",
        |t| t.get_hits_ssd.get() as i64,
    ),
    (
        "memcache_rewarm_total",
        "rewarm",
        "Total number of SSD->DRAM rewarm operations",
        "counter",
        |t| t.rewarm.get() as i64,
    ),
    (
        "memcache_rewarm_failed_total",
        "rewarm_fail",
        "Total number of failed SSD->DRAM rewarm operations",
        "counter",
        |t| t.rewarm_failed.get() as i64,
    ),
    (
        "memcache_rewarm_bytes_total",
        "rewarm_bytes",
        "Total bytes rewarmed from SSD to DRAM",
        "counter",
        |t| t.rewarm_bytes.get() as i64,
    ),
    (
        "memcache_rewarm_bytes_current",
        "rewarm_bytes_current",
        "Current bytes occupied by rewarmed data",
        "gauge",
        |t| t.rewarm_bytes_current.get(),
    ),
];

pub(super) fn tier_total(cluster: &dyn Source, f: TierField) -> u64 {
    sum_i(cluster, |s| f(&s.store_stats.tier))
}

pub(super) fn tier_rank(cluster: &dyn Source, rank: u32, f: TierField) -> u64 {
    sum_i(cluster, |s| f(&s.store_stats.tier_by_rank[rank as usize]))
}

/// Whether eviction work is in progress anywhere: a pass running, or flushes it started.
fn evict_running(cluster: &dyn Source) -> u64 {
    let running = cluster.shards().any(|s| {
        s.store_stats.evict_running.get() > 0 || s.store_stats.flush_in_flight_bytes.get() > 0
    });
    running as u64
}

/// Segment and medium capacity and use.
pub(super) fn render_capacity(cluster: &dyn Source, o: &mut Out<'_>) {
    let segs = cluster.segments();
    let per_segment: [(&str, &str, SegmentField); 2] = [
        (
            "memcache_segment_capacity_bytes",
            "Segment total capacity in bytes",
            |s| s.capacity(),
        ),
        (
            "memcache_segment_allocated_bytes",
            "Segment allocated bytes",
            |s| s.used_bytes(),
        ),
    ];
    for (name, help, f) in per_segment {
        o.family(name, help, "gauge");
        for s in segs.iter() {
            o.int(name, &[("segment", s.name())], f(s));
        }
    }
    // SSD is shown only when it has capacity or use.
    let usage: Vec<(Medium, (u64, u64))> = Medium::ALL
        .iter()
        .map(|&m| (m, medium_usage(cluster, m)))
        .filter(|&(m, (c, u))| m != Medium::Ssd || c > 0 || u > 0)
        .collect();
    let per_medium: [(&str, &str, MediumField); 2] = [
        (
            "memcache_total_capacity_bytes",
            "Total capacity by medium in bytes",
            |cu| cu.0,
        ),
        (
            "memcache_allocated_bytes",
            "Allocated bytes by medium",
            |cu| cu.1,
        ),
    ];
    for (name, help, f) in per_medium {
        o.family(name, help, "gauge");
        for &(m, cu) in &usage {
            o.int(name, &[("medium", m.lower())], f(cu));
        }
    }
}

type SegmentField = fn(&dyn SegmentFigures) -> u64;

/// A (capacity, used) pair to one of its figures.
type MediumField = fn((u64, u64)) -> u64;

/// The business-call counters: requests, successes, failures (and not-found results) per
/// operation, in total and per rank.
pub(super) fn render_business(cluster: &dyn Source, o: &mut Out<'_>, per_rank: &[u32]) {
    for op in Op::ALL {
        let i = op as usize;
        let name = camel(op);
        let mut parts: Vec<(&str, String, OpField)> = vec![
            (
                "requests",
                format!("Total number of {name} requests"),
                |c| c.requests.get(),
            ),
            (
                "successes",
                format!("Total number of {name} successes"),
                |c| c.successes.get(),
            ),
            (
                "failures",
                format!("Total number of {name} failures"),
                |c| c.failures.get(),
            ),
        ];
        if op.has_not_found() {
            parts.push((
                "not_found",
                format!("Total number of {name} not found results"),
                |c| c.not_found.get(),
            ));
        }
        for (suffix, help, f) in parts {
            let metric = format!("memcache_{}_{suffix}_total", op.name());
            o.family(&metric, &help, "counter");
            o.int(&metric, &[], sum(cluster, |s| f(&s.store_stats.ops[i])));
            for &r in per_rank {
                let rank = r.to_string();
                o.int(
                    &metric,
                    &[("rank", &rank)],
                    sum(cluster, |s| f(&s.store_stats.ops_by_rank[r as usize][i])),
                );
            }
        }
    }
}

/// Eviction, flush, rewarm and hit counters, in total and per rank; stored keys.
pub(super) fn render_tiers(cluster: &dyn Source, o: &mut Out<'_>, per_rank: &[u32]) {
    for (idx, &(metric, _, help, kind, f)) in TIER_FAMILIES.iter().enumerate() {
        o.family(metric, help, kind);
        o.int(metric, &[], tier_total(cluster, f));
        for &r in per_rank {
            o.int(
                metric,
                &[("rank", &r.to_string())],
                tier_rank(cluster, r, f),
            );
        }
        if idx == 0 {
            o.single(
                "memcache_evict_running",
                "Whether eviction (GC) is currently running (1=yes, 0=no)",
                "gauge",
                evict_running(cluster),
            );
        }
    }
    o.single(
        "memcache_stored_keys",
        "Current number of stored keys",
        "gauge",
        sum_i(cluster, |s| s.store_stats.stored_keys.get()),
    );
}

type ClusterField = fn(&dyn Source) -> u64;

/// One-sample families: (metric, HELP, type, value).
type Single = (&'static str, &'static str, &'static str, ClusterField);

fn kv(c: &dyn Source) -> &KvEventStats {
    c.kv_stats()
}

/// The KV-event families after the by-type and by-medium ones, in output order.
const KV_SINGLES: &[Single] = &[
    (
        "memcache_kv_events_dropped_total",
        "Total KV cache events dropped on queue pressure",
        "counter",
        |c| kv(c).dropped_events(),
    ),
    (
        "memcache_kv_events_dropped_stored_total",
        "Total KV cache stored events dropped on full queue",
        "counter",
        |c| kv(c).dropped_stored(),
    ),
    (
        "memcache_kv_events_dropped_high_priority_total",
        "Total KV cache removed or cleared events dropped after hard queue limit",
        "counter",
        |c| kv(c).dropped_high_priority(),
    ),
    (
        "memcache_kv_events_skipped_unparsed_total",
        "Total KV cache events that could not derive block_hashes from object key",
        "counter",
        |c| kv(c).skipped_unparsed_keys(),
    ),
    (
        "memcache_kv_events_queue_size",
        "Current KV cache event queue size",
        "gauge",
        |c| KvEventStats::get(&kv(c).queue_size),
    ),
    (
        "memcache_kv_events_queue_capacity",
        "Configured KV cache event soft queue capacity",
        "gauge",
        |c| c.config().kv_events.queue_capacity,
    ),
    (
        "memcache_kv_events_publisher_active",
        "Whether KV event publishing is active",
        "gauge",
        |c| {
            kv(c)
                .publisher_active
                .load(std::sync::atomic::Ordering::Relaxed) as u64
        },
    ),
    (
        "memcache_kv_events_last_sequence",
        "Last published KV event ZMQ sequence",
        "gauge",
        |c| KvEventStats::get(&kv(c).last_sequence),
    ),
];

fn singles(cluster: &dyn Source, o: &mut Out<'_>, table: &[Single]) {
    for &(name, help, kind, f) in table {
        o.single(name, help, kind, f(cluster));
    }
}

/// The KV-event publisher's families.
pub(super) fn render_kv_events(cluster: &dyn Source, o: &mut Out<'_>) {
    let kv = cluster.kv_stats();
    o.single(
        "memcache_kv_events_published_total",
        "Total KV cache events published",
        "counter",
        kv.published_events.get(),
    );
    let by_type = "memcache_kv_events_published_by_type_total";
    o.family(
        by_type,
        "Total KV cache events published by event type",
        "counter",
    );
    for t in EventType::ALL {
        let n = kv.published_by_type[t as usize].get();
        o.int(by_type, &[("type", t.name())], n);
    }
    let by_medium = "memcache_kv_events_published_by_medium_total";
    o.family(
        by_medium,
        "Total KV cache events published by storage medium",
        "counter",
    );
    for (i, m) in MEDIUM_LABELS.iter().enumerate() {
        o.int(by_medium, &[("medium", m)], kv.published_by_medium[i].get());
    }
    singles(cluster, o, KV_SINGLES);
}

fn st(c: &dyn Source, f: fn(&ShardStats) -> u64) -> u64 {
    sum(c, |s| f(s.stats))
}

fn st_i(c: &dyn Source, f: fn(&ShardStats) -> i64) -> u64 {
    sum_i(c, |s| f(s.stats))
}

/// The HTTP front end's families after `memcache_http_responses_total`, in output order.
const SERVER_SINGLES: &[Single] = &[
    (
        "memcache_http_connections_open",
        "Open HTTP connections",
        "gauge",
        |c| st_i(c, |s| s.connections_open.get()),
    ),
    (
        "memcache_http_connections_accepted_total",
        "HTTP connections accepted",
        "counter",
        |c| st(c, |s| s.connections_accepted.get()),
    ),
    (
        "memcache_http_connections_rejected_total",
        "HTTP connections refused at the per-shard limit",
        "counter",
        |c| st(c, |s| s.connections_rejected.get()),
    ),
    (
        "memcache_http_connections_timed_out_total",
        "HTTP connections closed for idleness or a stalled request",
        "counter",
        |c| st(c, |s| s.connections_timed_out.get()),
    ),
    (
        "memcache_shard_cross_requests_total",
        "Requests a shard sent to the key's owner shard",
        "counter",
        |c| st(c, |s| s.cross_shard_requests.get()),
    ),
    (
        "memcache_overload_rejections_total",
        "Requests answered 429 because a shard queue was full",
        "counter",
        |c| st(c, |s| s.overload_rejections.get()),
    ),
    (
        "memcache_http_buffered_bytes",
        "Read-buffer bytes held for requests still arriving (bounded per shard by ock.mmc.http.max_buffered_bytes_per_shard)",
        "gauge",
        |c| st_i(c, |s| s.buffered_bytes.get()),
    ),
    (
        "memcache_tls_handshake_failures_total",
        "TLS handshakes refused or timed out (missing or invalid client certificates)",
        "counter",
        |c| st(c, |s| s.tls_handshake_failures.get()),
    ),
    (
        "memcache_metadata_keys",
        "Keys stored through /metadata",
        "gauge",
        |c| st_i(c, |s| s.metadata_keys.get()),
    ),
    (
        "memcache_metadata_bytes",
        "Bytes used by /metadata keys and values",
        "gauge",
        |c| st_i(c, |s| s.metadata_bytes.get()),
    ),
    ("memcache_shards", "Shards (cores) serving", "gauge", |c| {
        c.shard_count() as u64
    }),
    (
        "memcache_uptime_seconds",
        "Seconds since the server started",
        "gauge",
        |c| c.clock().now_secs(),
    ),
];

/// The HTTP front end and shard messaging.
fn store(c: &dyn Source, f: fn(&StoreStats) -> u64) -> u64 {
    sum(c, |s| f(s.store_stats))
}

/// A gauge of [`StoreStats`], summed over shards.
fn store_i(c: &dyn Source, f: fn(&StoreStats) -> i64) -> u64 {
    sum_i(c, |s| f(s.store_stats))
}

/// What became of the blobs the tiers let go, beyond the contract's tier counters: the
/// outcomes an operator alerts on (objects the cache dropped, an SSD that takes no flushes).
const TIER_OUTCOMES: &[Single] = &[
    (
        "memcache_demoted_blobs_total",
        "Blobs moved down between memory tiers (HBM to DRAM) by eviction",
        "counter",
        |c| store(c, |s| s.demoted_blobs.get()),
    ),
    (
        "memcache_flush_failed_total",
        "Flushes to SSD that failed (the memory copy was kept)",
        "counter",
        |c| store(c, |s| s.flush_failed.get()),
    ),
    (
        "memcache_evict_deleted_objects_total",
        "Objects deleted by eviction because no lower tier had room for their last copy",
        "counter",
        |c| store(c, |s| s.evicted_objects_deleted.get()),
    ),
];

/// Re-replication: objects left below their replica count by a lost copy, given a new one on
/// another rank in the background (`ock.mmc.cluster.rereplicate.*`).
const REREPLICATION: &[Single] = &[
    (
        "memcache_rereplicated_objects_total",
        "Objects below their replica count given a new copy on another rank",
        "counter",
        |c| store(c, |s| s.rereplicated.get()),
    ),
    (
        "memcache_rereplicate_failed_total",
        "Re-replication copies that failed (the new blob was freed; an object is tried 3 times)",
        "counter",
        |c| store(c, |s| s.rereplicate_failed.get()),
    ),
    (
        "memcache_rereplicate_overflow_total",
        "Objects below their replica count not queued for re-replication: the shard's queue was full",
        "counter",
        |c| store(c, |s| s.rereplicate_overflow.get()),
    ),
    (
        "memcache_rereplicate_pending",
        "Objects below their replica count queued for a new copy or being copied",
        "gauge",
        |c| store_i(c, |s| s.rereplicate_pending.get()),
    ),
];

pub(super) fn render_server(cluster: &dyn Source, o: &mut Out<'_>) {
    o.single(
        "memcache_http_requests_total",
        "HTTP requests answered",
        "counter",
        st(cluster, |s| s.http_requests.get()),
    );
    let name = "memcache_http_responses_total";
    o.family(name, "HTTP responses by status class", "counter");
    for (i, class) in ["1xx", "2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
        let n = sum(cluster, |s| s.stats.http_responses[i].get());
        o.int(name, &[("code", class)], n);
    }
    singles(cluster, o, SERVER_SINGLES);
    let name = "memcache_grants_refused_total";
    o.family(
        name,
        "Write and move grants refused on this process: used already (a replay), or the ledger of used grants full",
        "counter",
    );
    for (reason, f) in [
        (
            "used",
            (|s| s.grants_refused_used.get()) as fn(&ShardStats) -> u64,
        ),
        ("ledger_full", |s| s.grants_refused_ledger_full.get()),
    ] {
        o.int(name, &[("reason", reason)], st(cluster, f));
    }
    singles(cluster, o, TIER_OUTCOMES);
    singles(cluster, o, REREPLICATION);
    render_ha(cluster, o);
}

/// The HA view: which role this node has now (one series per role, 1 for the current one)
/// and the view_version. Standalone nodes report `leader` and 0.
fn render_ha(cluster: &dyn Source, o: &mut Out<'_>) {
    let ha = cluster.ha();
    let name = "memcache_ha_role";
    o.family(
        name,
        "This meta's HA role: 1 for the current one (leader, standby or unknown)",
        "gauge",
    );
    for (role, now) in ha.roles {
        o.int(name, &[("role", role)], u64::from(now));
    }
    o.single(
        "memcache_ha_serving",
        "1 when this meta is the leader and serving (HA off: always 1)",
        "gauge",
        u64::from(ha.serving),
    );
    o.single(
        "memcache_ha_view_version",
        "The HA view version: the etcd revision of the current leadership (0 without HA)",
        "gauge",
        ha.view_version,
    );
}

/// `memcache_http_request_duration_seconds`: every operation's histogram, summed over shards,
/// zeros included (the series exist from the start).
pub(super) fn render_request_durations(cluster: &dyn Source, o: &mut Out<'_>) {
    let name = "memcache_http_request_duration_seconds";
    o.family(
        name,
        "HTTP request latency from the parsed head to the queued answer, by operation",
        "histogram",
    );
    let les: Vec<&str> = requests::BOUNDS.iter().map(|&(_, le)| le).collect();
    for op in ReqOp::ALL {
        let mut m = requests::Merged::default();
        for s in cluster.shards() {
            s.stats.request_durations.add_to(op, &mut m);
        }
        let sum = m.sum_ns as f64 / 1e9;
        o.histogram(name, &[("operation", op.name())], &les, &m.counts, sum);
    }
}

/// The standard `process_*` families, read from `/proc/self` now.
pub(super) fn render_process(o: &mut Out<'_>) {
    let p = crate::metrics::process::read();
    o.family(
        "process_cpu_seconds_total",
        "Total user and system CPU time spent in seconds.",
        "counter",
    );
    o.float("process_cpu_seconds_total", &[], p.cpu_seconds);
    let gauges: [(&str, &str, u64); 4] = [
        (
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            p.resident_bytes,
        ),
        (
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            p.virtual_bytes,
        ),
        (
            "process_open_fds",
            "Number of open file descriptors.",
            p.open_fds,
        ),
        (
            "process_max_fds",
            "Maximum number of open file descriptors.",
            p.max_fds,
        ),
    ];
    for (name, help, v) in gauges {
        o.single(name, help, "gauge", v);
    }
    o.family(
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
        "gauge",
    );
    o.float("process_start_time_seconds", &[], p.start_time_seconds);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn camel_names() {
        assert_eq!(camel(Op::BatchUpdateState), "BatchUpdateState");
        assert_eq!(camel(Op::Get), "Get");
        assert_eq!(camel(Op::GetAllKeys), "GetAllKeys");
    }
}
