//! The exposition formats: `/metrics` (Prometheus text 0.0.4), `/metrics/summary` (one line
//! of `key=value`), and the ptracer table. Only this module knows these formats.
//!
//! Every figure comes from running counters and gauges summed over the shards, and from the
//! segment table: nothing here walks keys, so a scrape costs the same at 0 and 1 M keys.

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::sync::atomic::Ordering::Relaxed;

use super::bus::SUBSCRIBERS;
use super::client::{self, ClientOp};
use super::store::{MAX_RANKS, Op, TierCounters};
use super::trace;
use crate::kv_events::stats::{EventType, MEDIUM_LABELS};
use crate::shards::Cluster;
use crate::shards::store::segment::Medium;

/// Writes families into a buffer; every value is an integer or a plain float.
struct Out<'a> {
    buf: &'a mut Vec<u8>,
}

impl Out<'_> {
    fn family(&mut self, name: &str, help: &str, kind: &str) {
        let _ = write!(self.buf, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
    }

    fn labels(&mut self, labels: &[(&str, &str)]) {
        if labels.is_empty() {
            return;
        }
        self.buf.push(b'{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                self.buf.push(b',');
            }
            let _ = write!(self.buf, "{k}=\"");
            for c in v.chars() {
                match c {
                    '\\' => self.buf.extend_from_slice(b"\\\\"),
                    '"' => self.buf.extend_from_slice(b"\\\""),
                    '\n' => self.buf.extend_from_slice(b"\\n"),
                    c => {
                        let mut b = [0u8; 4];
                        self.buf.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
                    }
                }
            }
            self.buf.push(b'"');
        }
        self.buf.push(b'}');
    }

    fn int(&mut self, name: &str, labels: &[(&str, &str)], v: u64) {
        self.buf.extend_from_slice(name.as_bytes());
        self.labels(labels);
        self.buf.push(b' ');
        self.buf
            .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
        self.buf.push(b'\n');
    }

    fn float(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.buf.extend_from_slice(name.as_bytes());
        self.labels(labels);
        self.buf.push(b' ');
        crate::http::json::write_f64(self.buf, v);
        self.buf.push(b'\n');
    }

    /// A one-sample family.
    fn single(&mut self, name: &str, help: &str, kind: &str, v: u64) {
        self.family(name, help, kind);
        self.int(name, &[], v);
    }
}

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

/// Sums over shards.
fn sum(cluster: &Cluster, f: impl Fn(&crate::shards::RemoteShard) -> u64) -> u64 {
    cluster.shards.iter().map(f).sum()
}

fn sum_i(cluster: &Cluster, f: impl Fn(&crate::shards::RemoteShard) -> i64) -> u64 {
    cluster.shards.iter().map(f).sum::<i64>().max(0) as u64
}

/// Ranks with mounted segments, ascending.
fn ranks(cluster: &Cluster) -> Vec<u32> {
    let set: BTreeSet<u32> = cluster.segments.snapshot().iter().map(|s| s.rank).collect();
    set.into_iter().collect()
}

/// Per-rank series are kept for ranks below [`MAX_RANKS`].
fn per_rank_ranks(cluster: &Cluster) -> Vec<u32> {
    if !cluster.config.metrics.per_rank {
        return Vec::new();
    }
    ranks(cluster)
        .into_iter()
        .filter(|&r| (r as usize) < MAX_RANKS)
        .collect()
}

/// (capacity, used) of a medium.
pub fn medium_usage(cluster: &Cluster, m: Medium) -> (u64, u64) {
    cluster
        .segments
        .snapshot()
        .iter()
        .filter(|s| s.medium == m)
        .fold((0, 0), |(c, u), s| (c + s.capacity, u + s.used_bytes()))
}

type TierField = fn(&TierCounters) -> i64;
type Labels = &'static [(&'static str, &'static str)];
type OpField = fn(&super::store::OpCounters) -> u64;
type ViewField = fn(&client::OpView) -> Sample;

/// The tier families of the eviction / flush / rewarm / hit group, in output order:
/// (metric, summary field, HELP, type, value).
const TIER_FAMILIES: &[(&str, &str, &str, &str, TierField)] = &[
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

fn tier_total(cluster: &Cluster, f: TierField) -> u64 {
    sum_i(cluster, |s| f(&s.store_stats.tier))
}

fn tier_rank(cluster: &Cluster, rank: u32, f: TierField) -> u64 {
    sum_i(cluster, |s| f(&s.store_stats.tier_by_rank[rank as usize]))
}

/// Whether eviction work is in progress anywhere: a pass running, or flushes it started.
fn evict_running(cluster: &Cluster) -> u64 {
    let running = cluster.shards.iter().any(|s| {
        s.store_stats.evict_running.get() > 0 || s.store_stats.flush_in_flight_bytes.get() > 0
    });
    running as u64
}

/// Renders `/metrics`.
pub fn render_metrics(cluster: &Cluster, buf: &mut Vec<u8>) {
    let mut o = Out { buf };
    let segs = cluster.segments.snapshot();
    let per_rank = per_rank_ranks(cluster);

    // Capacity.
    o.family(
        "memcache_segment_capacity_bytes",
        "Segment total capacity in bytes",
        "gauge",
    );
    for s in segs.iter() {
        o.int(
            "memcache_segment_capacity_bytes",
            &[("segment", &s.name)],
            s.capacity,
        );
    }
    o.family(
        "memcache_segment_allocated_bytes",
        "Segment allocated bytes",
        "gauge",
    );
    for s in segs.iter() {
        o.int(
            "memcache_segment_allocated_bytes",
            &[("segment", &s.name)],
            s.used_bytes(),
        );
    }
    let usage: Vec<(Medium, (u64, u64))> = Medium::ALL
        .iter()
        .map(|&m| (m, medium_usage(cluster, m)))
        .collect();
    let shown = |m: Medium, (c, u): (u64, u64)| m != Medium::Ssd || c > 0 || u > 0;
    o.family(
        "memcache_total_capacity_bytes",
        "Total capacity by medium in bytes",
        "gauge",
    );
    for &(m, cu) in &usage {
        if shown(m, cu) {
            o.int(
                "memcache_total_capacity_bytes",
                &[("medium", m.lower())],
                cu.0,
            );
        }
    }
    o.family(
        "memcache_allocated_bytes",
        "Allocated bytes by medium",
        "gauge",
    );
    for &(m, cu) in &usage {
        if shown(m, cu) {
            o.int("memcache_allocated_bytes", &[("medium", m.lower())], cu.1);
        }
    }

    // Business calls.
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
            for &r in &per_rank {
                let rank = r.to_string();
                o.int(
                    &metric,
                    &[("rank", &rank)],
                    sum(cluster, |s| f(&s.store_stats.ops_by_rank[r as usize][i])),
                );
            }
        }
    }

    // Eviction, flush, rewarm, hits.
    for (idx, &(metric, _, help, kind, f)) in TIER_FAMILIES.iter().enumerate() {
        o.family(metric, help, kind);
        o.int(metric, &[], tier_total(cluster, f));
        for &r in &per_rank {
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

    // KV events.
    let kv = &cluster.kv_stats;
    let g = |c: &std::sync::atomic::AtomicU64| c.load(Relaxed);
    o.single(
        "memcache_kv_events_published_total",
        "Total KV cache events published",
        "counter",
        g(&kv.published_events),
    );
    o.family(
        "memcache_kv_events_published_by_type_total",
        "Total KV cache events published by event type",
        "counter",
    );
    for t in EventType::ALL {
        o.int(
            "memcache_kv_events_published_by_type_total",
            &[("type", t.name())],
            g(&kv.published_by_type[t as usize]),
        );
    }
    o.family(
        "memcache_kv_events_published_by_medium_total",
        "Total KV cache events published by storage medium",
        "counter",
    );
    for (i, m) in MEDIUM_LABELS.iter().enumerate() {
        o.int(
            "memcache_kv_events_published_by_medium_total",
            &[("medium", m)],
            g(&kv.published_by_medium[i]),
        );
    }
    o.single(
        "memcache_kv_events_dropped_total",
        "Total KV cache events dropped on queue pressure",
        "counter",
        g(&kv.dropped_events),
    );
    o.single(
        "memcache_kv_events_dropped_stored_total",
        "Total KV cache stored events dropped on full queue",
        "counter",
        g(&kv.dropped_stored),
    );
    o.single(
        "memcache_kv_events_dropped_high_priority_total",
        "Total KV cache removed or cleared events dropped after hard queue limit",
        "counter",
        g(&kv.dropped_high_priority),
    );
    o.single(
        "memcache_kv_events_skipped_unparsed_total",
        "Total KV cache events that could not derive block_hashes from object key",
        "counter",
        g(&kv.skipped_unparsed_keys),
    );
    o.single(
        "memcache_kv_events_queue_size",
        "Current KV cache event queue size",
        "gauge",
        g(&kv.queue_size),
    );
    o.single(
        "memcache_kv_events_queue_capacity",
        "Configured KV cache event soft queue capacity",
        "gauge",
        cluster.config.kv_events.queue_capacity,
    );
    o.single(
        "memcache_kv_events_publisher_active",
        "Whether KV event publishing is active",
        "gauge",
        kv.publisher_active.load(Relaxed) as u64,
    );
    o.single(
        "memcache_kv_events_last_sequence",
        "Last published KV event ZMQ sequence",
        "gauge",
        g(&kv.last_sequence),
    );

    render_client(cluster, &mut o);
    render_ubs_io(cluster, &mut o);
    render_tiers_and_bus(cluster, &mut o);
    render_server(cluster, &mut o);
}

/// A client series value: an integer, or a duration kept in nanoseconds and shown in
/// (fractional) milliseconds.
enum Sample {
    Int(u64),
    MsOfNs(u64),
}

/// The client metric families (the data plane's own traffic): one view per rank with a
/// mounted segment and per operation, 0 where nothing was recorded (the contract keeps
/// metrics without a value as 0 placeholders). A rank with no mounted segment has no series:
/// they go with its last segment. `memcache_metric_stale` is 1 for a rank with no traffic in
/// the window (`ock.mmc.metrics.window_secs`): its window figures are not fresh data.
fn render_client(cluster: &Cluster, o: &mut Out<'_>) {
    let mounted = ranks(cluster);
    if mounted.is_empty() {
        return;
    }
    let mut acc = HashMap::new();
    for s in cluster.shards.iter() {
        s.client.merge_into(&mut acc);
    }
    let mut recorded: HashMap<(u32, ClientOp), client::OpView> = client::finish(acc)
        .into_iter()
        .map(|v| ((v.rank, v.op), v))
        .collect();
    let views: Vec<client::OpView> = mounted
        .iter()
        .flat_map(|&r| ClientOp::ALL.map(|op| (r, op)))
        .map(|(r, op)| {
            recorded
                .remove(&(r, op))
                .unwrap_or_else(|| client::OpView::empty(r, op))
        })
        .collect();
    o.family(
        "memcache_metric_stale",
        "Client metric stale status (1 = stale, 0 = fresh)",
        "gauge",
    );
    for &r in &mounted {
        let fresh = views.iter().any(|v| v.rank == r && v.ops > 0);
        o.int(
            "memcache_metric_stale",
            &[("rank", &r.to_string())],
            (!fresh) as u64,
        );
    }
    let families: &[(&str, &str, &str, bool, ViewField)] = &[
        (
            "memcache_bandwidth_bytes",
            "Client bandwidth window bytes transferred",
            "gauge",
            true,
            |v| Sample::Int(v.bytes),
        ),
        (
            "memcache_bandwidth_duration_ms",
            "Client bandwidth window duration in milliseconds",
            "gauge",
            false,
            |v| Sample::MsOfNs(v.duration_ns),
        ),
        (
            "memcache_bandwidth_bytes_cum_total",
            "Client bandwidth cumulative bytes transferred",
            "counter",
            true,
            |v| Sample::Int(v.cum_bytes),
        ),
        (
            "memcache_bandwidth_duration_ms_cum_total",
            "Client bandwidth cumulative duration in milliseconds",
            "counter",
            false,
            |v| Sample::MsOfNs(v.cum_duration_ns),
        ),
    ];
    for &(name, help, kind, bytes_only, f) in families {
        o.family(name, help, kind);
        for v in &views {
            if bytes_only && !v.op.moves_bytes() {
                continue;
            }
            let labels = [("rank", &*v.rank.to_string()), ("operation", v.op.name())];
            match f(v) {
                Sample::Int(n) => o.int(name, &labels, n),
                Sample::MsOfNs(ns) => o.float(name, &labels, ns as f64 / 1e6),
            }
        }
    }
    o.family(
        "memcache_bandwidth_latency_seconds",
        "Client bandwidth operation latency in seconds",
        "gauge",
    );
    for v in &views {
        let rank = v.rank.to_string();
        for (q, val) in ["P50", "P90", "P99", "Avg"].iter().zip(v.latency) {
            o.float(
                "memcache_bandwidth_latency_seconds",
                &[("rank", &rank), ("operation", v.op.name()), ("quantile", q)],
                val,
            );
        }
    }
    o.family(
        "memcache_bandwidth_bytes_per_sec",
        "Client bandwidth instantaneous bytes per second",
        "gauge",
    );
    for v in views.iter().filter(|v| v.op.moves_bytes()) {
        o.int(
            "memcache_bandwidth_bytes_per_sec",
            &[("rank", &v.rank.to_string()), ("operation", v.op.name())],
            v.bytes_per_sec(),
        );
    }
}

/// One rank's UBS IO figures.
struct RankIo {
    rank: String,
    disk_capacity: u64,
    disk_used: u64,
    mem_capacity: u64,
    mem_used: u64,
    disks: u64,
    faulty: u64,
}

/// One SSD directory's figures.
struct DiskIo {
    rank: String,
    path: String,
    status: u64,
    read_bps: u64,
    write_bps: u64,
}

type RankIoField = fn(&RankIo) -> u64;
type DiskIoField = fn(&DiskIo) -> u64;

/// The UBS IO families, from the SSD tier: per rank with mounted segments, and per disk. A
/// rank without SSD keeps its series as placeholders (the contract keeps metrics without a
/// value as 0): no disk capacity, use or count, its memory (DRAM) figures, and one per-disk
/// series with an empty `disk_path` and value 0.
fn render_ubs_io(cluster: &Cluster, o: &mut Out<'_>) {
    let segs = cluster.segments.snapshot();
    let mounted = ranks(cluster);
    let window = cluster.config.metrics.window_secs.max(1);
    let of_rank = |r: u32, m: Medium| segs.iter().filter(move |s| s.rank == r && s.medium == m);
    let ranks: Vec<RankIo> = mounted
        .iter()
        .map(|&r| RankIo {
            rank: r.to_string(),
            disk_capacity: of_rank(r, Medium::Ssd).map(|s| s.capacity).sum(),
            disk_used: of_rank(r, Medium::Ssd).map(|s| s.used_bytes()).sum(),
            mem_capacity: of_rank(r, Medium::Dram).map(|s| s.capacity).sum(),
            mem_used: of_rank(r, Medium::Dram).map(|s| s.used_bytes()).sum(),
            disks: of_rank(r, Medium::Ssd).count() as u64,
            faulty: of_rank(r, Medium::Ssd)
                .filter(|s| s.backend.file().is_some_and(|f| f.status() != 0))
                .count() as u64,
        })
        .collect();
    let per_rank: &[(&str, &str, RankIoField)] = &[
        (
            "memcache_ubs_io_disk_capacity_bytes",
            "Client UBS IO SSD total capacity in bytes",
            |r| r.disk_capacity,
        ),
        (
            "memcache_ubs_io_disk_used_bytes",
            "Client UBS IO SSD used bytes",
            |r| r.disk_used,
        ),
        (
            "memcache_ubs_io_mem_capacity_bytes",
            "Client UBS IO memory total capacity in bytes",
            |r| r.mem_capacity,
        ),
        (
            "memcache_ubs_io_mem_used_bytes",
            "Client UBS IO memory used bytes",
            |r| r.mem_used,
        ),
        (
            "memcache_ubs_io_disk_num",
            "Client UBS IO total disk count",
            |r| r.disks,
        ),
        (
            "memcache_ubs_io_fault_disk_num",
            "Client UBS IO fault disk count",
            |r| r.faulty,
        ),
    ];
    for &(name, help, f) in per_rank {
        o.family(name, help, "gauge");
        for r in &ranks {
            o.int(name, &[("rank", &r.rank)], f(r));
        }
    }
    let mut disks: Vec<DiskIo> = segs
        .iter()
        .filter_map(|s| {
            let f = s.backend.file()?;
            Some(DiskIo {
                rank: s.rank.to_string(),
                path: f.dir.clone(),
                status: f.status() as u64,
                read_bps: f.read_window.sum(window) / window,
                write_bps: f.write_window.sum(window) / window,
            })
        })
        .collect();
    for r in ranks.iter().filter(|r| r.disks == 0) {
        disks.push(DiskIo {
            rank: r.rank.clone(),
            path: String::new(),
            status: 0,
            read_bps: 0,
            write_bps: 0,
        });
    }
    disks.sort_by_key(|d| (d.rank.parse::<u32>().unwrap_or(u32::MAX), d.path.is_empty()));
    let per_disk: &[(&str, &str, DiskIoField)] = &[
        (
            "memcache_ubs_io_disk_status",
            "Client UBS IO per-disk status (0=normal, non-zero=fault)",
            |d| d.status,
        ),
        (
            "memcache_ubs_io_disk_read_bandwidth_bytes_per_sec",
            "Client UBS IO per-disk read bandwidth",
            |d| d.read_bps,
        ),
        (
            "memcache_ubs_io_disk_write_bandwidth_bytes_per_sec",
            "Client UBS IO per-disk write bandwidth",
            |d| d.write_bps,
        ),
        (
            "memcache_ubs_io_disk_total_bandwidth_bytes_per_sec",
            "Client UBS IO per-disk total bandwidth",
            |d| d.read_bps + d.write_bps,
        ),
    ];
    for &(name, help, f) in per_disk {
        o.family(name, help, "gauge");
        for d in &disks {
            o.int(name, &[("rank", &d.rank), ("disk_path", &d.path)], f(d));
        }
    }
}

/// LMCache-compatible tier and event-bus families (memory media = L1, SSD = L2).
fn render_tiers_and_bus(cluster: &Cluster, o: &mut Out<'_>) {
    let (hbm_c, hbm_u) = medium_usage(cluster, Medium::Hbm);
    let (dram_c, dram_u) = medium_usage(cluster, Medium::Dram);
    let (ssd_c, ssd_u) = medium_usage(cluster, Medium::Ssd);
    let l1_cap = hbm_c + dram_c;
    o.single(
        "lmcache_mp_l1_memory_usage_bytes",
        "Bytes currently held in L1 (HBM and DRAM)",
        "gauge",
        hbm_u + dram_u,
    );
    o.family(
        "lmcache_mp_l1_usage_ratio",
        "L1 used bytes over L1 capacity",
        "gauge",
    );
    o.float(
        "lmcache_mp_l1_usage_ratio",
        &[],
        if l1_cap == 0 {
            0.0
        } else {
            (hbm_u + dram_u) as f64 / l1_cap as f64
        },
    );
    if ssd_c > 0 || ssd_u > 0 {
        o.family(
            "lmcache_mp_l2_usage_bytes",
            "Bytes currently held in L2 (SSD)",
            "gauge",
        );
        o.int("lmcache_mp_l2_usage_bytes", &[("l2_name", "ssd")], ssd_u);
    }
    type T = super::bus::TierStats;
    let t = |f: fn(&T) -> u64| sum(cluster, |s| f(&s.tier_stats));
    let ti = |f: fn(&T) -> i64| sum_i(cluster, |s| f(&s.tier_stats));
    o.single(
        "lmcache_mp_l1_read_chunks_total",
        "Chunks read from L1",
        "counter",
        t(|s| s.l1_read_chunks.get()),
    );
    o.single(
        "lmcache_mp_l1_write_chunks_total",
        "Chunks written to L1",
        "counter",
        t(|s| s.l1_write_chunks.get()),
    );
    o.single(
        "lmcache_mp_l1_evicted_chunks_total",
        "Chunks evicted from L1",
        "counter",
        t(|s| s.l1_evicted_chunks.get()),
    );
    o.single(
        "lmcache_mp_l2_evicted_chunks_total",
        "Chunks evicted from L2",
        "counter",
        t(|s| s.l2_evicted_chunks.get()),
    );
    let ssd = [("l2_name", "ssd")];
    let ssd_idx = [("l2_name", "ssd"), ("adapter_index", "0")];
    o.family(
        "lmcache_mp_l2_store_submitted_requests_total",
        "L1 to L2 store tasks submitted",
        "counter",
    );
    o.int(
        "lmcache_mp_l2_store_submitted_requests_total",
        &[],
        t(|s| s.l2_store_submitted.get()),
    );
    o.family(
        "lmcache_mp_l2_store_completed_requests_total",
        "L1 to L2 store tasks completed",
        "counter",
    );
    o.int(
        "lmcache_mp_l2_store_completed_requests_total",
        &ssd,
        t(|s| s.l2_store_completed.get()),
    );
    o.family(
        "lmcache_mp_l2_store_failed_requests_total",
        "L1 to L2 store tasks that failed (the L1 copy was kept)",
        "counter",
    );
    o.int(
        "lmcache_mp_l2_store_failed_requests_total",
        &ssd,
        t(|s| s.l2_store_failed.get()),
    );
    o.family(
        "lmcache_mp_l2_load_completed_requests_total",
        "L2 to L1 load tasks completed",
        "counter",
    );
    o.int(
        "lmcache_mp_l2_load_completed_requests_total",
        &ssd,
        t(|s| s.l2_load_completed.get()),
    );
    o.family(
        "lmcache_mp_l2_load_failed_requests_total",
        "L2 to L1 load tasks that failed",
        "counter",
    );
    o.int(
        "lmcache_mp_l2_load_failed_requests_total",
        &ssd,
        t(|s| s.l2_load_failed.get()),
    );
    o.family(
        "lmcache_mp_num_inflight_l2_stores",
        "In-flight L2 store tasks",
        "gauge",
    );
    o.int(
        "lmcache_mp_num_inflight_l2_stores",
        &ssd_idx,
        ti(|s| s.inflight_l2_stores.get()),
    );
    o.family(
        "lmcache_mp_num_inflight_l2_loads",
        "In-flight L2 load tasks",
        "gauge",
    );
    o.int(
        "lmcache_mp_num_inflight_l2_loads",
        &ssd_idx,
        ti(|s| s.inflight_l2_loads.get()),
    );
    o.family(
        "lmcache_mp_inflight_load_memory_usage_bytes",
        "L1 bytes reserved by in-flight L2 loads",
        "gauge",
    );
    o.int(
        "lmcache_mp_inflight_load_memory_usage_bytes",
        &ssd_idx,
        ti(|s| s.inflight_load_bytes.get()),
    );
    o.single(
        "lmcache_mp_active_prefetch_jobs",
        "Prefetch rewarms in flight",
        "gauge",
        ti(|s| s.active_prefetch_jobs.get()),
    );

    type H = fn(&T) -> &super::hist::BucketHistogram;
    let hists: &[(&str, &str, Labels, H)] = &[
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
            &[("l2_name", "ssd")],
            |s| &s.l2_store_throughput,
        ),
        (
            "lmcache_mp_l2_load_throughput_GBs",
            "Throughput of L2 to L1 loads in GB/s",
            &[("l2_name", "ssd")],
            |s| &s.l2_load_throughput,
        ),
    ];
    for &(name, help, labels, h) in hists {
        let bounds = h(&cluster.shards[0].tier_stats).bounds;
        let mut counts = vec![0u64; bounds.len() + 1];
        let mut total = 0.0;
        for s in cluster.shards.iter() {
            h(&s.tier_stats).add_to(&mut counts, &mut total);
        }
        o.family(name, help, "histogram");
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0;
        for (i, c) in counts.iter().enumerate() {
            cumulative += c;
            let le = if i < bounds.len() {
                format!("{}", bounds[i])
            } else {
                "+Inf".to_string()
            };
            let mut l: Vec<(&str, &str)> = labels.to_vec();
            l.push(("le", &le));
            o.int(&bucket, &l, cumulative);
        }
        o.float(&format!("{name}_sum"), labels, total);
        o.int(&format!("{name}_count"), labels, cumulative);
    }

    // The event bus watching itself.
    let b = |f: fn(&super::bus::BusStats) -> u64| sum(cluster, |s| f(&s.bus_stats));
    o.single(
        "lmcache_mp_event_bus_queue_depth",
        "Events waiting in the event bus queues",
        "gauge",
        sum_i(cluster, |s| s.bus_stats.queue_depth.get()),
    );
    let now_ms = cluster.started.elapsed().as_millis() as i64;
    let oldest = cluster
        .shards
        .iter()
        .map(|s| s.bus_stats.oldest_ms.get())
        .filter(|&t| t > 0)
        .min();
    o.family(
        "lmcache_mp_event_bus_drain_lag_seconds",
        "Age of the oldest queued event, 0 when the queues are empty",
        "gauge",
    );
    o.float(
        "lmcache_mp_event_bus_drain_lag_seconds",
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
    o.family(
        "lmcache_mp_event_bus_subscriber_exceptions_total",
        "Subscriber callbacks that panicked, by subscriber",
        "counter",
    );
    for (i, name) in SUBSCRIBERS.iter().enumerate() {
        // Only subscribers that are installed have series (the test subscriber is not, in
        // production).
        if !cluster.shards.iter().any(|s| s.bus_stats.is_installed(i)) {
            continue;
        }
        o.int(
            "lmcache_mp_event_bus_subscriber_exceptions_total",
            &[("subscriber_name", name)],
            sum(cluster, |s| s.bus_stats.subscriber_panics[i].get()),
        );
    }
}

/// The HTTP front end and shard messaging.
fn render_server(cluster: &Cluster, o: &mut Out<'_>) {
    let st = |f: fn(&super::ShardStats) -> u64| sum(cluster, |s| f(&s.stats));
    o.single(
        "memcache_http_requests_total",
        "HTTP requests answered",
        "counter",
        st(|s| s.http_requests.get()),
    );
    o.family(
        "memcache_http_responses_total",
        "HTTP responses by status class",
        "counter",
    );
    for (i, class) in ["1xx", "2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
        o.int(
            "memcache_http_responses_total",
            &[("code", class)],
            sum(cluster, |s| s.stats.http_responses[i].get()),
        );
    }
    o.single(
        "memcache_http_connections_open",
        "Open HTTP connections",
        "gauge",
        sum_i(cluster, |s| s.stats.connections_open.get()),
    );
    o.single(
        "memcache_http_connections_accepted_total",
        "HTTP connections accepted",
        "counter",
        st(|s| s.connections_accepted.get()),
    );
    o.single(
        "memcache_http_connections_rejected_total",
        "HTTP connections refused at the per-shard limit",
        "counter",
        st(|s| s.connections_rejected.get()),
    );
    o.single(
        "memcache_http_connections_timed_out_total",
        "HTTP connections closed for idleness or a stalled request",
        "counter",
        st(|s| s.connections_timed_out.get()),
    );
    o.single(
        "memcache_shard_cross_requests_total",
        "Requests a shard sent to the key's owner shard",
        "counter",
        st(|s| s.cross_shard_requests.get()),
    );
    o.single(
        "memcache_overload_rejections_total",
        "Requests answered 429 because a shard queue was full",
        "counter",
        st(|s| s.overload_rejections.get()),
    );
    o.single(
        "memcache_http_buffered_bytes",
        "Read-buffer bytes held for requests still arriving (bounded per shard by ock.mmc.http.max_buffered_bytes_per_shard)",
        "gauge",
        sum_i(cluster, |s| s.stats.buffered_bytes.get()),
    );
    o.single(
        "memcache_tls_handshake_failures_total",
        "TLS handshakes refused or timed out (missing or invalid client certificates)",
        "counter",
        st(|s| s.tls_handshake_failures.get()),
    );
    o.single(
        "memcache_metadata_keys",
        "Keys stored through /metadata",
        "gauge",
        sum_i(cluster, |s| s.stats.metadata_keys.get()),
    );
    o.single(
        "memcache_metadata_bytes",
        "Bytes used by /metadata keys and values",
        "gauge",
        sum_i(cluster, |s| s.stats.metadata_bytes.get()),
    );
    o.single(
        "memcache_shards",
        "Shards (cores) serving",
        "gauge",
        cluster.shard_count() as u64,
    );
    o.single(
        "memcache_uptime_seconds",
        "Seconds since the server started",
        "gauge",
        cluster.started.elapsed().as_secs(),
    );
}

/// Renders `/metrics/summary`: the seed's 71 fields in order, then the per-rank fields.
pub fn render_summary(cluster: &Cluster, buf: &mut Vec<u8>) {
    let mut fields: Vec<(String, String)> = Vec::with_capacity(96);
    let mut put = |k: &str, v: String| fields.push((k.to_string(), v));
    put(
        "keys",
        sum_i(cluster, |s| s.store_stats.stored_keys.get()).to_string(),
    );
    let tier = |name: &str| {
        TIER_FAMILIES
            .iter()
            .find(|t| t.1 == name)
            .map(|t| t.4)
            .expect("known tier field")
    };
    for (field, name) in [
        ("evict", "evict"),
        ("rewarm", "rewarm"),
        ("rewarm_fail", "rewarm_fail"),
        ("rewarm_bytes_total", "rewarm_bytes"),
        ("rewarm_bytes_current", "rewarm_bytes_current"),
        ("flush_blobs", "flush_blobs"),
        ("flush_bytes", "flush_bytes"),
        ("get_hit_dram", "get_hit_dram"),
        ("get_hit_ssd", "get_hit_ssd"),
    ] {
        put(field, tier_total(cluster, tier(name)).to_string());
    }
    for (field, m) in [
        ("hbm_used", Medium::Hbm),
        ("dram_used", Medium::Dram),
        ("ssd_used", Medium::Ssd),
    ] {
        let (c, u) = medium_usage(cluster, m);
        put(field, format!("{u}/{c}"));
    }
    for op in Op::ALL {
        let i = op as usize;
        let n = op.name();
        put(
            &format!("{n}_req"),
            sum(cluster, |s| s.store_stats.ops[i].requests.get()).to_string(),
        );
        put(
            &format!("{n}_success"),
            sum(cluster, |s| s.store_stats.ops[i].successes.get()).to_string(),
        );
        put(
            &format!("{n}_fail"),
            sum(cluster, |s| s.store_stats.ops[i].failures.get()).to_string(),
        );
        if op.has_not_found() {
            put(
                &format!("{n}_not_found"),
                sum(cluster, |s| s.store_stats.ops[i].not_found.get()).to_string(),
            );
        }
    }
    let per_rank = per_rank_ranks(cluster);
    for base in [
        "evict",
        "get_hit_dram",
        "get_hit_ssd",
        "rewarm",
        "rewarm_fail",
        "rewarm_bytes",
        "rewarm_bytes_current",
        "flush_blobs",
        "flush_bytes",
    ] {
        for &r in &per_rank {
            put(
                &format!("{base}_by_rank_{r}"),
                tier_rank(cluster, r, tier(base)).to_string(),
            );
        }
    }
    for (i, (k, v)) in fields.iter().enumerate() {
        if i > 0 {
            buf.push(b' ');
        }
        let _ = write!(buf, "{k}={v}");
    }
}

/// Renders the ptracer table (`filter` picks rows).
pub fn render_ptracer(
    cluster: &Cluster,
    unix_secs: u64,
    filter: impl Fn(trace::Tp) -> bool,
) -> String {
    let points = trace::snapshot(cluster.shards.iter().map(|s| &*s.tracer));
    trace::render(&points, &trace::format_time(unix_secs), filter)
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

    #[test]
    fn summary_has_the_seed_fields_in_order() {
        let cluster = Cluster::new(crate::config::Config::defaults(), 2).unwrap();
        let mut buf = Vec::new();
        render_summary(&cluster, &mut buf);
        let line = String::from_utf8(buf).unwrap();
        assert!(!line.contains('\n'));
        let keys: Vec<&str> = line
            .split(' ')
            .map(|kv| kv.split('=').next().unwrap())
            .collect();
        let expected = "keys evict rewarm rewarm_fail rewarm_bytes_total rewarm_bytes_current flush_blobs flush_bytes get_hit_dram get_hit_ssd hbm_used dram_used ssd_used alloc_req alloc_success alloc_fail batch_alloc_req batch_alloc_success batch_alloc_fail get_req get_success get_fail get_not_found batch_get_req batch_get_success batch_get_fail batch_get_not_found remove_req remove_success remove_fail remove_not_found batch_remove_req batch_remove_success batch_remove_fail batch_remove_not_found remove_all_req remove_all_success remove_all_fail update_state_req update_state_success update_state_fail update_state_not_found batch_update_state_req batch_update_state_success batch_update_state_fail batch_update_state_not_found query_req query_success query_fail query_not_found batch_query_req batch_query_success batch_query_fail batch_query_not_found get_all_keys_req get_all_keys_success get_all_keys_fail exist_key_req exist_key_success exist_key_fail exist_key_not_found batch_exist_key_req batch_exist_key_success batch_exist_key_fail batch_exist_key_not_found mount_req mount_success mount_fail unmount_req unmount_success unmount_fail";
        assert_eq!(keys.join(" "), expected);
        assert_eq!(keys.len(), 71);
        assert!(
            line.contains(" hbm_used=0/1073741824 dram_used=0/1073741824 ssd_used=0/0 "),
            "{line}"
        );
    }
}
