//! The data plane's own families: client bandwidth per rank and operation
//! (`memcache_bandwidth_*`, `memcache_metric_stale`) and the SSD tier's UBS IO figures.

use std::collections::HashMap;

use super::ranks;
use super::writer::Out;
use crate::common::medium::Medium;
use crate::metrics::client::{self, ClientOp};
use crate::metrics::view::{RankClient, RecoveryFigures, Source};

type ViewField = fn(&client::OpView) -> Sample;

/// A client series value: an integer, or a duration kept in nanoseconds and shown in
/// (fractional) milliseconds.
enum Sample {
    Int(u64),
    MsOfNs(u64),
}

/// The client metric families (the data plane's own traffic, `RankMetricView` upstream):
/// `memcache_metric_stale` for every rank with a mounted segment and every lost remote rank,
/// and the bandwidth families for the ranks whose figures are known (online), one view per
/// operation, 0 where nothing was recorded (the contract keeps metrics without a value as 0
/// placeholders). A rank's figures are online when this process records them itself (its own
/// ranks) or its local service reports them with its heartbeats (merged with what this
/// process recorded for the rank). Stale is 0 for those; 1 for a remote rank whose local
/// service has not reported since it joined, and for a lost one (no report past the
/// heartbeat timeout, until it joins again): neither has bandwidth series. A rank with no
/// mounted segment (unmounted, or left) has no series at all.
pub(super) fn render_client(cluster: &dyn Source, o: &mut Out<'_>) {
    let mounted = ranks(cluster);
    let lost: Vec<u32> = cluster
        .lost_ranks()
        .into_iter()
        .filter(|r| !mounted.contains(r))
        .collect();
    if mounted.is_empty() && lost.is_empty() {
        return;
    }
    let sources: Vec<(u32, RankClient)> = mounted
        .iter()
        .map(|&r| (r, cluster.rank_client(r)))
        .collect();
    let views = client_views(cluster, &sources);
    o.family(
        "memcache_metric_stale",
        "Client metric stale status (1 = stale, 0 = fresh)",
        "gauge",
    );
    for (r, source) in &sources {
        let stale = *source == RankClient::Silent;
        o.int(
            "memcache_metric_stale",
            &[("rank", &r.to_string())],
            stale as u64,
        );
    }
    for &r in &lost {
        o.int("memcache_metric_stale", &[("rank", &r.to_string())], 1);
    }
    render_bandwidth(o, &views);
    render_latency_and_rate(o, &views);
}

/// The merged views of every online rank's operations, empty ones included, by rank: what
/// this process recorded, plus what a remote rank's local service reported.
fn client_views(cluster: &dyn Source, sources: &[(u32, RankClient)]) -> Vec<client::OpView> {
    let mut recorded: HashMap<(u32, ClientOp), client::OpView> = cluster
        .recorded_client_views()
        .into_iter()
        .map(|v| ((v.rank, v.op), v))
        .collect();
    let mut out = Vec::new();
    for (r, source) in sources {
        let reported: &[client::OpView] = match source {
            RankClient::Own => &[],
            RankClient::Reported(v) => v,
            RankClient::Silent => continue,
        };
        for op in ClientOp::ALL {
            let mut v = recorded
                .remove(&(*r, op))
                .unwrap_or_else(|| client::OpView::empty(*r, op));
            for other in reported.iter().filter(|x| x.op == op) {
                v.absorb(other);
            }
            out.push(v);
        }
    }
    out
}

/// The window and cumulative byte and duration families: (metric, HELP, type, only for
/// operations that move bytes, value).
const BANDWIDTH: &[(&str, &str, &str, bool, ViewField)] = &[
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

fn render_bandwidth(o: &mut Out<'_>, views: &[client::OpView]) {
    for &(name, help, kind, bytes_only, f) in BANDWIDTH {
        o.family(name, help, kind);
        for v in views {
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
}

/// Latency quantiles and the window's transfer rate.
fn render_latency_and_rate(o: &mut Out<'_>, views: &[client::OpView]) {
    o.family(
        "memcache_bandwidth_latency_seconds",
        "Client bandwidth operation latency in seconds",
        "gauge",
    );
    for v in views {
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
pub(super) fn render_ubs_io(cluster: &dyn Source, o: &mut Out<'_>) {
    let ranks = rank_io(cluster);
    for &(name, help, f) in PER_RANK {
        o.family(name, help, "gauge");
        for r in &ranks {
            o.int(name, &[("rank", &r.rank)], f(r));
        }
    }
    let disks = disk_io(cluster, &ranks);
    for &(name, help, f) in PER_DISK {
        o.family(name, help, "gauge");
        for d in &disks {
            o.int(name, &[("rank", &d.rank), ("disk_path", &d.path)], f(d));
        }
    }
}

/// The figures of every rank with mounted segments, ascending.
fn rank_io(cluster: &dyn Source) -> Vec<RankIo> {
    let segs = cluster.segments();
    let of_rank = |r: u32, m: Medium| {
        segs.iter()
            .filter(move |s| s.rank() == r && s.medium() == m)
    };
    ranks(cluster)
        .iter()
        .map(|&r| RankIo {
            rank: r.to_string(),
            disk_capacity: of_rank(r, Medium::Ssd).map(|s| s.capacity()).sum(),
            disk_used: of_rank(r, Medium::Ssd).map(|s| s.used_bytes()).sum(),
            mem_capacity: of_rank(r, Medium::Dram).map(|s| s.capacity()).sum(),
            mem_used: of_rank(r, Medium::Dram).map(|s| s.used_bytes()).sum(),
            disks: of_rank(r, Medium::Ssd).count() as u64,
            faulty: of_rank(r, Medium::Ssd)
                .filter(|s| {
                    s.disk().is_some_and(|f| f.status() != 0)
                        || s.remote_disk_status().is_some_and(|st| st != 0)
                })
                .count() as u64,
        })
        .collect()
}

/// Every SSD directory's figures, and a placeholder for each rank without one, by rank.
fn disk_io(cluster: &dyn Source, ranks: &[RankIo]) -> Vec<DiskIo> {
    let window = cluster.config().metrics.window_secs.max(1);
    let now_secs = cluster.clock().now_secs();
    let mut disks: Vec<DiskIo> = cluster
        .segments()
        .iter()
        .filter_map(|s| {
            if let Some(status) = s.remote_disk_status() {
                // A remote rank's disk: the figures its local service last reported, and the
                // status it last gave (a heartbeat's, or a failed tier move's since then, as
                // the fault count reads it).
                let r = cluster.remote_disk(s.rank());
                return Some(DiskIo {
                    rank: s.rank().to_string(),
                    path: r.path,
                    status,
                    read_bps: r.read_bps,
                    write_bps: r.write_bps,
                });
            }
            let f = s.disk()?;
            let (read, written) = f.window_bytes(now_secs, window);
            Some(DiskIo {
                rank: s.rank().to_string(),
                path: f.dir().to_string(),
                status: f.status(),
                read_bps: read / window,
                write_bps: written / window,
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
    disks
}

const PER_RANK: &[(&str, &str, RankIoField)] = &[
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

const PER_DISK: &[(&str, &str, DiskIoField)] = &[
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

/// The SSD tier's recovery at the start and its journals since, per journaled file.
pub(super) fn render_ssd_recovery(cluster: &dyn Source, o: &mut Out<'_>) {
    let segs = cluster.segments();
    let files: Vec<(String, String, RecoveryFigures)> = segs
        .iter()
        .filter_map(|s| {
            let d = s.disk()?;
            Some((s.rank().to_string(), d.dir().to_string(), d.recovery()?))
        })
        .collect();
    // Each family's series, one per file (or per file and reason).
    let mut family = |name: &str, help: &str, kind: &str, each: &SeriesOf| {
        o.family(name, help, kind);
        for (rank, path, r) in &files {
            each(o, &[("rank", rank), ("disk_path", path)], r);
        }
    };
    for &(name, help, kind, f) in RECOVERY {
        family(name, help, kind, &move |o, labels, r| {
            o.int(name, labels, f(r))
        });
    }
    let name = "memcache_ssd_recovery_dropped_blobs_total";
    family(
        name,
        "Blobs an SSD file's journal listed at the start that were not taken back, or were dropped since: past the end of the file or outside the segment (length), malformed (invalid), refused by the index (conflict), bytes not matching their checksum when read back (checksum)",
        "counter",
        &move |o, labels, r| {
            for (reason, v) in [
                ("length", r.dropped_length),
                ("invalid", r.dropped_invalid),
                ("conflict", r.dropped_conflict),
                ("checksum", r.dropped_checksum),
            ] {
                o.int(name, &[labels[0], labels[1], ("reason", reason)], v);
            }
        },
    );
    let name = "memcache_ssd_recovery_duration_seconds";
    family(
        name,
        "How long the start spent recovering an SSD file: reading and rewriting its journal, then indexing its blobs (the server is ready after it; the blobs are read back in the background)",
        "gauge",
        &move |o, labels, r| o.float(name, labels, r.micros as f64 / 1e6),
    );
}

type RecoveryField = fn(&RecoveryFigures) -> u64;

/// Writes one file's series of a family (given the file's labels).
type SeriesOf = dyn Fn(&mut Out<'_>, &[(&str, &str)], &RecoveryFigures);

const RECOVERY: &[(&str, &str, &str, RecoveryField)] = &[
    (
        "memcache_ssd_recovered_blobs_total",
        "Blobs taken back from an SSD file at the start (listed by its journal, their bytes in the file)",
        "counter",
        |r| r.blobs,
    ),
    (
        "memcache_ssd_recovered_bytes_total",
        "Object bytes taken back from an SSD file at the start",
        "counter",
        |r| r.bytes,
    ),
    (
        "memcache_ssd_recovery_verified_blobs_total",
        "Recovered blobs read back and found intact (their checksum matched)",
        "counter",
        |r| r.verified,
    ),
    (
        "memcache_ssd_recovery_verify_pending_blobs",
        "Recovered blobs not read back yet (every read of one is checked all the same)",
        "gauge",
        |r| r.verify_pending,
    ),
    (
        "memcache_ssd_journal_bytes",
        "Size of an SSD file's journal (rewritten whole past twice its last rewrite)",
        "gauge",
        |r| r.journal_bytes,
    ),
    (
        "memcache_ssd_journal_records_total",
        "Records appended to an SSD file's journal (a flush that landed, a flushed blob that left, a remove_all per shard)",
        "counter",
        |r| r.journal_records,
    ),
    (
        "memcache_ssd_journal_compactions_total",
        "Rewrites of an SSD file's journal as a snapshot of its live entries",
        "counter",
        |r| r.journal_compactions,
    ),
    (
        "memcache_ssd_journal_dropped_records_total",
        "Records an SSD file's journal could not take: a write failed, the journal was removed, and nothing will be recovered from the file at the next start",
        "counter",
        |r| r.journal_dropped_records,
    ),
];
