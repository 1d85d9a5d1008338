//! The data plane's own families: client bandwidth per rank and operation
//! (`memcache_bandwidth_*`, `memcache_metric_stale`) and the SSD tier's UBS IO figures.

use super::families::{block, push_text};
use super::ranks;
use super::writer::{Family, Out, family};
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

static METRIC_STALE: Family = family!(
    "memcache_metric_stale",
    "Client metric stale status (1 = stale, 0 = fresh)",
    gauge
);

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
pub(super) fn render_client(shared: &dyn Source, o: &mut Out<'_>) {
    let mounted = ranks(shared);
    let lost: Vec<u32> = shared
        .lost_ranks()
        .into_iter()
        .filter(|r| !mounted.contains(r))
        .collect();
    if mounted.is_empty() && lost.is_empty() {
        return;
    }
    let sources: Vec<(u32, RankClient)> = mounted
        .iter()
        .map(|&r| (r, shared.rank_client(r)))
        .collect();
    let views = client_views(shared, &sources);
    // Written again only when a figure moved: the views' floats and labels cost more than
    // the rest of a scrape's unchanged families.
    let gather = |figures: &mut Vec<u64>| {
        figures.push(sources.len() as u64);
        for (r, source) in &sources {
            figures.extend([u64::from(*r), u64::from(*source == RankClient::Silent)]);
        }
        figures.push(lost.len() as u64);
        figures.extend(lost.iter().map(|&r| u64::from(r)));
        for v in &views {
            figures.extend([u64::from(v.rank), v.op as u64, v.bytes, v.duration_ns]);
            figures.extend([v.cum_bytes, v.cum_duration_ns, v.bytes_per_sec()]);
            figures.extend(v.latency.map(f64::to_bits));
        }
    };
    let write = |o: &mut Out<'_>, _: &[u64]| {
        let mut digits = itoa::Buffer::new();
        o.family(&METRIC_STALE);
        for (r, source) in &sources {
            let stale = *source == RankClient::Silent;
            o.int(&[("rank", digits.format(*r))], stale as u64);
        }
        for &r in &lost {
            o.int(&[("rank", digits.format(r))], 1);
        }
        render_bandwidth(o, &views);
        render_latency_and_rate(o, &views);
    };
    block(o, &METRIC_STALE, gather, write);
}

/// The merged views of every online rank's operations, empty ones included, by rank: what
/// this process recorded, plus what a remote rank's local service reported.
fn client_views(shared: &dyn Source, sources: &[(u32, RankClient)]) -> Vec<client::OpView> {
    // By rank and operation.
    let recorded = shared.recorded_client_views();
    let mut out = Vec::new();
    for (r, source) in sources {
        let reported: &[client::OpView] = match source {
            RankClient::Own => &[],
            RankClient::Reported(v) => v,
            RankClient::Silent => continue,
        };
        for op in ClientOp::ALL {
            let mut v = match recorded.binary_search_by_key(&(*r, op), |v| (v.rank, v.op)) {
                Ok(i) => recorded[i].clone(),
                Err(_) => client::OpView::empty(*r, op),
            };
            for other in reported.iter().filter(|x| x.op == op) {
                v.absorb(other);
            }
            out.push(v);
        }
    }
    out
}

/// The window and cumulative byte and duration families: (family, only for operations that
/// move bytes, value).
static BANDWIDTH: [(Family, bool, ViewField); 4] = [
    (
        family!(
            "memcache_bandwidth_bytes",
            "Client bandwidth window bytes transferred",
            gauge
        ),
        true,
        |v| Sample::Int(v.bytes),
    ),
    (
        family!(
            "memcache_bandwidth_duration_ms",
            "Client bandwidth window duration in milliseconds",
            gauge
        ),
        false,
        |v| Sample::MsOfNs(v.duration_ns),
    ),
    (
        family!(
            "memcache_bandwidth_bytes_cum_total",
            "Client bandwidth cumulative bytes transferred",
            counter
        ),
        true,
        |v| Sample::Int(v.cum_bytes),
    ),
    (
        family!(
            "memcache_bandwidth_duration_ms_cum_total",
            "Client bandwidth cumulative duration in milliseconds",
            counter
        ),
        false,
        |v| Sample::MsOfNs(v.cum_duration_ns),
    ),
];

fn render_bandwidth(o: &mut Out<'_>, views: &[client::OpView]) {
    let mut digits = itoa::Buffer::new();
    for (family, bytes_only, f) in &BANDWIDTH {
        o.family(family);
        for v in views {
            if *bytes_only && !v.op.moves_bytes() {
                continue;
            }
            let labels = [("rank", digits.format(v.rank)), ("operation", v.op.name())];
            match f(v) {
                Sample::Int(n) => o.int(&labels, n),
                Sample::MsOfNs(ns) => o.float(&labels, ns as f64 / 1e6),
            }
        }
    }
}

static LATENCY: Family = family!(
    "memcache_bandwidth_latency_seconds",
    "Client bandwidth operation latency in seconds",
    gauge
);

static BYTES_PER_SEC: Family = family!(
    "memcache_bandwidth_bytes_per_sec",
    "Client bandwidth instantaneous bytes per second",
    gauge
);

/// Latency quantiles and the window's transfer rate.
fn render_latency_and_rate(o: &mut Out<'_>, views: &[client::OpView]) {
    let mut digits = itoa::Buffer::new();
    o.family(&LATENCY);
    for v in views {
        let rank = digits.format(v.rank);
        for (q, val) in ["P50", "P90", "P99", "Avg"].iter().zip(v.latency) {
            o.float(
                &[("rank", rank), ("operation", v.op.name()), ("quantile", q)],
                val,
            );
        }
    }
    o.family(&BYTES_PER_SEC);
    for v in views.iter().filter(|v| v.op.moves_bytes()) {
        o.int(
            &[("rank", digits.format(v.rank)), ("operation", v.op.name())],
            v.bytes_per_sec(),
        );
    }
}

/// One rank's UBS IO figures.
struct RankIo {
    rank: u32,
    disk_capacity: u64,
    disk_used: u64,
    mem_capacity: u64,
    mem_used: u64,
    disks: u64,
    faulty: u64,
}

/// One SSD directory's figures.
struct DiskIo {
    rank: u32,
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
pub(super) fn render_ubs_io(shared: &dyn Source, o: &mut Out<'_>) {
    let ranks = rank_io(shared);
    let disks = disk_io(shared, &ranks);
    let gather = |figures: &mut Vec<u64>| {
        figures.push(ranks.len() as u64);
        for r in &ranks {
            figures.push(u64::from(r.rank));
            figures.extend(PER_RANK.iter().map(|(_, f)| f(r)));
        }
        for d in &disks {
            figures.push(u64::from(d.rank));
            push_text(figures, &d.path);
            figures.extend(PER_DISK.iter().map(|(_, f)| f(d)));
        }
    };
    let write = |o: &mut Out<'_>, _: &[u64]| {
        let mut digits = itoa::Buffer::new();
        for (family, f) in &PER_RANK {
            o.family(family);
            for r in &ranks {
                o.int(&[("rank", digits.format(r.rank))], f(r));
            }
        }
        for (family, f) in &PER_DISK {
            o.family(family);
            for d in &disks {
                o.int(
                    &[("rank", digits.format(d.rank)), ("disk_path", &d.path)],
                    f(d),
                );
            }
        }
    };
    block(o, &PER_RANK[0].0, gather, write);
}

/// The figures of every rank with mounted segments, ascending.
fn rank_io(shared: &dyn Source) -> Vec<RankIo> {
    let segs = shared.segments();
    let of_rank = |r: u32, m: Medium| {
        segs.iter()
            .filter(move |s| s.rank() == r && s.medium() == m)
    };
    ranks(shared)
        .iter()
        .map(|&r| RankIo {
            rank: r,
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
fn disk_io(shared: &dyn Source, ranks: &[RankIo]) -> Vec<DiskIo> {
    let window = shared.config().metrics.window_secs.max(1);
    let now_secs = shared.clock().now_secs();
    let mut disks: Vec<DiskIo> = shared
        .segments()
        .iter()
        .filter_map(|s| {
            if let Some(status) = s.remote_disk_status() {
                // A remote rank's disk: the figures its local service last reported, and the
                // status it last gave (a heartbeat's, or a failed tier move's since then, as
                // the fault count reads it).
                let r = shared.remote_disk(s.rank());
                return Some(DiskIo {
                    rank: s.rank(),
                    path: r.path,
                    status,
                    read_bps: r.read_bps,
                    write_bps: r.write_bps,
                });
            }
            let f = s.disk()?;
            let (read, written) = f.window_bytes(now_secs, window);
            Some(DiskIo {
                rank: s.rank(),
                path: f.dir().to_string(),
                status: f.status(),
                read_bps: read / window,
                write_bps: written / window,
            })
        })
        .collect();
    for r in ranks.iter().filter(|r| r.disks == 0) {
        disks.push(DiskIo {
            rank: r.rank,
            path: String::new(),
            status: 0,
            read_bps: 0,
            write_bps: 0,
        });
    }
    disks.sort_by_key(|d| (d.rank, d.path.is_empty()));
    disks
}

static PER_RANK: [(Family, RankIoField); 6] = [
    (
        family!(
            "memcache_ubs_io_disk_capacity_bytes",
            "Client UBS IO SSD total capacity in bytes",
            gauge
        ),
        |r| r.disk_capacity,
    ),
    (
        family!(
            "memcache_ubs_io_disk_used_bytes",
            "Client UBS IO SSD used bytes",
            gauge
        ),
        |r| r.disk_used,
    ),
    (
        family!(
            "memcache_ubs_io_mem_capacity_bytes",
            "Client UBS IO memory total capacity in bytes",
            gauge
        ),
        |r| r.mem_capacity,
    ),
    (
        family!(
            "memcache_ubs_io_mem_used_bytes",
            "Client UBS IO memory used bytes",
            gauge
        ),
        |r| r.mem_used,
    ),
    (
        family!(
            "memcache_ubs_io_disk_num",
            "Client UBS IO total disk count",
            gauge
        ),
        |r| r.disks,
    ),
    (
        family!(
            "memcache_ubs_io_fault_disk_num",
            "Client UBS IO fault disk count",
            gauge
        ),
        |r| r.faulty,
    ),
];

static PER_DISK: [(Family, DiskIoField); 4] = [
    (
        family!(
            "memcache_ubs_io_disk_status",
            "Client UBS IO per-disk status (0=normal, non-zero=fault)",
            gauge
        ),
        |d| d.status,
    ),
    (
        family!(
            "memcache_ubs_io_disk_read_bandwidth_bytes_per_sec",
            "Client UBS IO per-disk read bandwidth",
            gauge
        ),
        |d| d.read_bps,
    ),
    (
        family!(
            "memcache_ubs_io_disk_write_bandwidth_bytes_per_sec",
            "Client UBS IO per-disk write bandwidth",
            gauge
        ),
        |d| d.write_bps,
    ),
    (
        family!(
            "memcache_ubs_io_disk_total_bandwidth_bytes_per_sec",
            "Client UBS IO per-disk total bandwidth",
            gauge
        ),
        |d| d.read_bps + d.write_bps,
    ),
];

static RECOVERY_DROPPED: Family = family!(
    "memcache_ssd_recovery_dropped_blobs_total",
    "Blobs an SSD file's journal listed at the start that were not taken back, or were dropped since: past the end of the file or outside the segment (length), malformed (invalid), refused by the index (conflict), bytes not matching their checksum when read back (checksum)",
    counter
);

static RECOVERY_DURATION: Family = family!(
    "memcache_ssd_recovery_duration_seconds",
    "How long the start spent recovering an SSD file: reading and rewriting its journal, then indexing its blobs (the server is ready after it; the blobs are read back in the background)",
    gauge
);

/// The SSD tier's recovery at the start and its journals since, per journaled file.
pub(super) fn render_ssd_recovery(shared: &dyn Source, o: &mut Out<'_>) {
    let segs = shared.segments();
    let files: Vec<(u32, &str, RecoveryFigures)> = segs
        .iter()
        .filter_map(|s| {
            let d = s.disk()?;
            Some((s.rank(), d.dir(), d.recovery()?))
        })
        .collect();
    let gather = |figures: &mut Vec<u64>| {
        for (rank, path, r) in &files {
            figures.push(u64::from(*rank));
            push_text(figures, path);
            figures.extend(RECOVERY.iter().map(|(_, f)| f(r)));
            figures.extend([r.dropped_length, r.dropped_invalid]);
            figures.extend([r.dropped_conflict, r.dropped_checksum, r.micros]);
        }
    };
    let write = |o: &mut Out<'_>, _: &[u64]| write_recovery(o, &files);
    block(o, &RECOVERY[0].0, gather, write);
}

fn write_recovery(o: &mut Out<'_>, files: &[(u32, &str, RecoveryFigures)]) {
    let mut digits = itoa::Buffer::new();
    for (family, f) in &RECOVERY {
        o.family(family);
        for (rank, path, r) in files {
            o.int(&[("rank", digits.format(*rank)), ("disk_path", path)], f(r));
        }
    }
    o.family(&RECOVERY_DROPPED);
    for (rank, path, r) in files {
        for (reason, v) in [
            ("length", r.dropped_length),
            ("invalid", r.dropped_invalid),
            ("conflict", r.dropped_conflict),
            ("checksum", r.dropped_checksum),
        ] {
            let labels = [
                ("rank", digits.format(*rank)),
                ("disk_path", path),
                ("reason", reason),
            ];
            o.int(&labels, v);
        }
    }
    o.family(&RECOVERY_DURATION);
    for (rank, path, r) in files {
        o.float(
            &[("rank", digits.format(*rank)), ("disk_path", path)],
            r.micros as f64 / 1e6,
        );
    }
}

type RecoveryField = fn(&RecoveryFigures) -> u64;

static RECOVERY: [(Family, RecoveryField); 8] = [
    (
        family!(
            "memcache_ssd_recovered_blobs_total",
            "Blobs taken back from an SSD file at the start (listed by its journal, their bytes in the file)",
            counter
        ),
        |r| r.blobs,
    ),
    (
        family!(
            "memcache_ssd_recovered_bytes_total",
            "Object bytes taken back from an SSD file at the start",
            counter
        ),
        |r| r.bytes,
    ),
    (
        family!(
            "memcache_ssd_recovery_verified_blobs_total",
            "Recovered blobs read back and found intact (their checksum matched)",
            counter
        ),
        |r| r.verified,
    ),
    (
        family!(
            "memcache_ssd_recovery_verify_pending_blobs",
            "Recovered blobs not read back yet (every read of one is checked all the same)",
            gauge
        ),
        |r| r.verify_pending,
    ),
    (
        family!(
            "memcache_ssd_journal_bytes",
            "Size of an SSD file's journal (rewritten whole past twice its last rewrite)",
            gauge
        ),
        |r| r.journal_bytes,
    ),
    (
        family!(
            "memcache_ssd_journal_records_total",
            "Records appended to an SSD file's journal (a flush that landed, a flushed blob that left, a remove_all per shard)",
            counter
        ),
        |r| r.journal_records,
    ),
    (
        family!(
            "memcache_ssd_journal_compactions_total",
            "Rewrites of an SSD file's journal as a snapshot of its live entries",
            counter
        ),
        |r| r.journal_compactions,
    ),
    (
        family!(
            "memcache_ssd_journal_dropped_records_total",
            "Records an SSD file's journal could not take: a write failed, the journal was removed, and nothing will be recovered from the file at the next start",
            counter
        ),
        |r| r.journal_dropped_records,
    ),
];
