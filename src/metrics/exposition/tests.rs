//! The exposition against a fixed set of figures: a fake [`Source`] with every kind of series
//! (per-rank counters, segments on three media, an SSD file with its journal, NUMA parts, a
//! remote rank that reports, one that does not, a lost one, label values that need escaping,
//! histograms with observations, floats of every size). The text of `/metrics` (but for the
//! `process_*` families, read from `/proc` now), `/metrics/summary` and the ptracer table is
//! compared byte for byte with `golden/`, written by the renderer as it was before the scrape
//! was made fast (issue 34): the output must not change for the same figures.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::*;
use crate::common::clock::Clock;
use crate::config::Config;
use crate::metrics::bus::{BusStats, TierStats};
use crate::metrics::client::{ClientOp, ClientStats, OpView};
use crate::metrics::kv_events::KvEventStats;
use crate::metrics::requests::ReqOp;
use crate::metrics::store::StoreStats;
use crate::metrics::trace::{Tp, Tracer};
use crate::metrics::view::{
    DiskFigures, HaFigures, RankClient, RecoveryFigures, RemoteDiskFigures, SegmentFigures,
    SegmentList, ShardFigures,
};
use crate::metrics::{ShardStats, process};
use crate::numa::NodePart;

struct Shard {
    stats: ShardStats,
    store: StoreStats,
    tracer: Tracer,
    client: ClientStats,
    bus: BusStats,
    tier: TierStats,
}

pub(super) struct Fake {
    config: Config,
    clock: Clock,
    shards: Vec<Shard>,
    segments: Arc<Vec<Arc<Seg>>>,
    kv: KvEventStats,
}

struct Disk {
    dir: String,
    recovery: Option<RecoveryFigures>,
}

impl DiskFigures for Disk {
    fn dir(&self) -> &str {
        &self.dir
    }
    fn status(&self) -> u64 {
        5
    }
    fn window_bytes(&self, _now_secs: u64, secs: u64) -> (u64, u64) {
        (1_000_003 * secs, 77 * secs)
    }
    fn recovery(&self) -> Option<RecoveryFigures> {
        self.recovery
    }
}

struct Seg {
    name: String,
    rank: u32,
    medium: Medium,
    capacity: u64,
    used: u64,
    parts: Vec<NodePart>,
    disk: Option<Disk>,
    remote_status: Option<u64>,
}

impl SegmentFigures for Seg {
    fn name(&self) -> &str {
        &self.name
    }
    fn rank(&self) -> u32 {
        self.rank
    }
    fn medium(&self) -> Medium {
        self.medium
    }
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn used_bytes(&self) -> u64 {
        self.used
    }
    fn node_parts(&self) -> &[NodePart] {
        &self.parts
    }
    fn used_in_part(&self, part: usize) -> u64 {
        self.used / 3 + part as u64
    }
    fn disk(&self) -> Option<&dyn DiskFigures> {
        self.disk.as_ref().map(|d| d as &dyn DiskFigures)
    }
    fn remote_disk_status(&self) -> Option<u64> {
        self.remote_status
    }
}

impl Source for Fake {
    fn config(&self) -> &Config {
        &self.config
    }
    fn clock(&self) -> &Clock {
        &self.clock
    }
    fn shard_count(&self) -> usize {
        self.shards.len()
    }
    fn shard(&self, i: usize) -> ShardFigures<'_> {
        let s = &self.shards[i];
        ShardFigures {
            stats: &s.stats,
            store_stats: &s.store,
            tracer: &s.tracer,
            client: &s.client,
            bus_stats: &s.bus,
            tier_stats: &s.tier,
        }
    }
    fn segments(&self) -> Arc<dyn SegmentList> {
        Arc::new((*self.segments).clone())
    }
    fn lost_ranks(&self) -> Vec<u32> {
        vec![2, 9]
    }
    fn kv_stats(&self) -> &KvEventStats {
        &self.kv
    }
    fn ha(&self) -> HaFigures {
        HaFigures {
            roles: [("leader", false), ("standby", true), ("unknown", false)],
            serving: false,
            view_version: 4_242,
        }
    }
    fn remote_disk(&self, rank: u32) -> RemoteDiskFigures {
        RemoteDiskFigures {
            path: format!("/remote/{rank}/ssd \"x\""),
            status: 0,
            read_bps: 123_456,
            write_bps: 654_321,
        }
    }
    fn rank_client(&self, rank: u32) -> RankClient {
        match rank {
            3 => {
                let mut v = OpView::sample(3, ClientOp::BatchGet);
                v.latency = [0.000_123_4, 0.5, 1.25e-7, 3.0];
                RankClient::Reported(vec![v, OpView::sample(3, ClientOp::BatchPut)])
            }
            4 => RankClient::Silent,
            _ => RankClient::Own,
        }
    }
}

fn seg(name: &str, rank: u32, medium: Medium, capacity: u64, used: u64) -> Seg {
    Seg {
        name: name.to_string(),
        rank,
        medium,
        capacity,
        used,
        parts: Vec::new(),
        disk: None,
        remote_status: None,
    }
}

/// Two shards with figures in every family; the clock 100.5 s after its origin.
pub(super) fn fake() -> Fake {
    let mut config = Config::defaults();
    config.metrics.per_rank = true;
    config.metrics.window_secs = 10;
    let clock = Clock::since(Instant::now() - Duration::from_millis(100_500));
    let shards = (0..2u64)
        .map(|i| {
            let s = Shard {
                stats: ShardStats::default(),
                store: StoreStats::default(),
                tracer: Tracer::default(),
                client: ClientStats::new(clock, 10),
                bus: BusStats::default(),
                tier: TierStats::default(),
            };
            figures(&s, i);
            s
        })
        .collect();
    let mut ssd = seg("rank-1-ssd", 1, Medium::Ssd, 1 << 34, 12_345_678);
    ssd.disk = Some(Disk {
        dir: "/mnt/n\"v\\me\n0".to_string(),
        recovery: Some(RecoveryFigures {
            blobs: 10,
            bytes: 10_240,
            dropped_length: 1,
            dropped_invalid: 2,
            dropped_conflict: 3,
            dropped_checksum: 4,
            verified: 5,
            verify_pending: 6,
            micros: 1_234_567,
            journal_bytes: 770,
            journal_records: 11,
            journal_compactions: 1,
            journal_dropped_records: 0,
        }),
    });
    let mut dram = seg("rank-0-dram", 0, Medium::Dram, 1 << 30, 333_333_333);
    dram.parts = vec![
        NodePart {
            node: 0,
            cpus: vec![0],
            start: 0,
            len: 1 << 29,
        },
        NodePart {
            node: 1,
            cpus: vec![1],
            start: 1 << 29,
            len: 1 << 29,
        },
    ];
    let mut remote_ssd = seg("rank-3-ssd", 3, Medium::Ssd, 1 << 33, 4096);
    remote_ssd.remote_status = Some(28);
    let segments = vec![
        Arc::new(seg("rank-0-hbm", 0, Medium::Hbm, 1 << 30, 0)),
        Arc::new(dram),
        Arc::new(seg("rank-1-dram", 1, Medium::Dram, 1 << 31, 1 << 20)),
        Arc::new(ssd),
        Arc::new(seg("rank-3-dram", 3, Medium::Dram, 3 << 30, 7)),
        Arc::new(remote_ssd),
        Arc::new(seg("rank-4-dram", 4, Medium::Dram, 1 << 30, 0)),
    ];
    let kv = KvEventStats::new(2);
    kv.published_events.add(1_234);
    kv.published_by_type[1].add(34);
    kv.published_by_medium[2].add(12);
    kv.queue_size.store(17, Relaxed);
    kv.last_sequence.store(99, Relaxed);
    kv.publisher_active.store(true, Relaxed);
    Fake {
        config,
        clock,
        shards,
        segments: Arc::new(segments),
        kv,
    }
}

/// Shard `i`'s figures: distinct per shard, so the sums show.
fn figures(s: &Shard, i: u64) {
    let n = i + 1;
    s.stats.http_requests.add(1_000 * n);
    s.stats.http_responses[1].add(900 * n);
    s.stats.http_responses[3].add(7);
    s.stats.connections_open.add(3);
    s.stats.connections_accepted.add(40 + n);
    s.stats.buffered_bytes.add(-5);
    s.stats.metadata_keys.add(12);
    s.stats.grants_refused_used.add(n);
    for (k, op) in ReqOp::ALL.iter().enumerate() {
        for j in 0..(k as u64 % 5) * n {
            let ns = 3_000 + (j * 7_919 + k as u64 * 104_729) * 10u64.pow((j % 7) as u32);
            s.stats
                .request_durations
                .observe(*op, Duration::from_nanos(ns));
        }
    }
    for (k, c) in s.store.ops.iter().enumerate() {
        c.requests.add(10 * n + k as u64);
        c.successes.add(8 * n);
        c.failures.add(k as u64 % 2);
        c.not_found.add(n);
    }
    for r in [0usize, 1, 3] {
        s.store.ops_by_rank[r][2].requests.add(r as u64 + n);
        s.store.tier_by_rank[r].evict.add(r as u64 * 3 + n);
        s.store.tier_by_rank[r].rewarm_bytes_current.add(5);
    }
    s.store.tier.evict.add(5 * n);
    s.store.tier.flush_bytes.add(1 << 40);
    s.store.tier.rewarm_bytes_current.add(-3);
    s.store.stored_keys.add(1_000_000 * n as i64);
    s.store.evict_running.add(i as i64);
    s.store.rereplicate_pending.add(2);
    for (k, &tp) in Tp::ALL.iter().enumerate().step_by(3) {
        for j in 0..k as u64 {
            let span = s.tracer.begin(tp);
            span.end(j % 3 != 0);
        }
    }
    for (rank, op, bytes) in [
        (0, ClientOp::BatchGet, 4096),
        (0, ClientOp::BatchPut, 65_536),
        (1, ClientOp::BatchExist, 0),
        (3, ClientOp::BatchGet, 100),
    ] {
        for j in 1..=5 * n {
            s.client
                .record(rank, op, bytes * j, 1_000 * j + 17, 37 * j * j);
        }
    }
    s.bus.published.add(500 * n);
    s.bus.dropped.add(n);
    s.bus.queue_depth.add(2);
    s.bus.installed[0].store(true, Relaxed);
    s.bus.installed[1].store(i == 1, Relaxed);
    s.bus.subscriber_panics[1].add(n);
    s.tier.l1_read_chunks.add(77 * n);
    s.tier.inflight_l2_loads.add(1);
    for v in [0.005, 0.05, 0.7, 2.0, 45.0, 1e5] {
        s.tier.l1_chunk_lifetime.observe(v * n as f64);
    }
    s.tier.l2_store_throughput.observe(0.3 / n as f64);
    s.tier.l2_load_throughput.observe(17.5);
}

/// The exposition up to the `process_*` families (their figures are this process's, now).
fn without_process(text: &[u8]) -> &[u8] {
    let text = std::str::from_utf8(text).unwrap();
    let at = text
        .find("# HELP process_cpu_seconds_total")
        .expect("the process families close the exposition");
    &text.as_bytes()[..at]
}

/// Compares `got` with `golden/<name>`; `MMC_WRITE_GOLDEN=1` writes it instead.
fn check_golden(name: &str, got: &[u8]) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/metrics/exposition/golden")
        .join(name);
    if std::env::var_os("MMC_WRITE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if got != want {
        let (g, w) = (String::from_utf8_lossy(got), String::from_utf8_lossy(&want));
        let line = g
            .lines()
            .zip(w.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(g.lines().count().min(w.lines().count()));
        panic!(
            "{name} differs from its golden text at line {}:\n got: {:?}\nwant: {:?}",
            line + 1,
            g.lines().nth(line),
            w.lines().nth(line)
        );
    }
}

#[test]
fn metrics_text_is_the_golden_text() {
    let f = fake();
    let mut buf = Vec::new();
    render_metrics(&f, &mut buf);
    check_golden("metrics.txt", without_process(&buf));
    // A second scrape into the same buffer writes the same bytes (nothing is left over from
    // the first: prepared text is reused, never appended twice).
    let mut again = Vec::new();
    render_metrics(&f, &mut again);
    assert_eq!(without_process(&buf), without_process(&again));
}

/// What a scrape copies from the last one (histograms, blocks of families whose figures did
/// not move) is written again as soon as a figure moves.
#[test]
fn a_moved_figure_is_written_again() {
    let f = fake();
    let mut first = Vec::new();
    render_metrics(&f, &mut first);
    let s = &f.shards[1];
    s.store.ops[0].requests.add(1_000);
    s.store.tier.evict.add(1_000);
    s.stats.grants_refused_used.add(1_000);
    f.kv.published_by_medium[0].add(1_000);
    s.tier.l1_read_chunks.add(1_000);
    s.stats
        .request_durations
        .observe(ReqOp::Other, Duration::from_secs(20));
    s.tier.l1_chunk_lifetime.observe(7.0);
    let mut second = Vec::new();
    render_metrics(&f, &mut second);
    let (first, second) = (
        String::from_utf8(first).unwrap(),
        String::from_utf8(second).unwrap(),
    );
    for (series, before, after) in [
        ("memcache_alloc_requests_total ", "30", "1030"),
        ("memcache_evict_operations_total ", "15", "1015"),
        (
            "memcache_grants_refused_total{reason=\"used\"} ",
            "3",
            "1003",
        ),
        (
            "memcache_kv_events_published_by_medium_total{medium=\"hbm\"} ",
            "0",
            "1000",
        ),
        ("lmcache_mp_l1_read_chunks_total ", "231", "1231"),
        (
            "memcache_http_request_duration_seconds_bucket{operation=\"other\",le=\"+Inf\"} ",
            "6",
            "7",
        ),
        ("lmcache_mp_l1_chunk_lifetime_seconds_count ", "12", "13"),
    ] {
        assert!(
            first.contains(&format!("\n{series}{before}\n")),
            "{series}{before}"
        );
        assert!(
            second.contains(&format!("\n{series}{after}\n")),
            "{series}{after}"
        );
    }
}

/// The same for the blocks whose labels come from the segment table (names, disk paths) or
/// whose figures are floats and client views: a moved segment, a renamed disk, a new client
/// operation, a published event and an OTLP export show in the next scrape.
#[test]
fn a_moved_segment_or_view_is_written_again() {
    let mut f = fake();
    let mut first = Vec::new();
    render_metrics(&f, &mut first);
    let mut segments = (*f.segments).clone();
    segments[2] = Arc::new(seg("rank-1-dram", 1, Medium::Dram, 1 << 31, 1 << 21));
    let mut ssd = seg("rank-1-ssd", 1, Medium::Ssd, 1 << 34, 12_345_678);
    let recovery = segments[3].disk.as_ref().and_then(|d| d.recovery);
    ssd.disk = Some(Disk {
        dir: "/mnt/other".to_string(),
        recovery: recovery.map(|r| RecoveryFigures {
            micros: 2_000_000,
            ..r
        }),
    });
    segments[3] = Arc::new(ssd);
    f.segments = Arc::new(segments);
    let s = &f.shards[1];
    s.client.record(0, ClientOp::BatchGet, 1 << 20, 1_000, 10);
    s.bus.published.add(1_000);
    let mut second = Vec::new();
    render_metrics(&f, &mut second);
    let (first, second) = (
        String::from_utf8(first).unwrap(),
        String::from_utf8(second).unwrap(),
    );
    for (before, after) in [
        (
            "memcache_segment_allocated_bytes{segment=\"rank-1-dram\"} 1048576",
            "memcache_segment_allocated_bytes{segment=\"rank-1-dram\"} 2097152",
        ),
        (
            "memcache_ubs_io_mem_used_bytes{rank=\"1\"} 1048576",
            "memcache_ubs_io_mem_used_bytes{rank=\"1\"} 2097152",
        ),
        (
            "memcache_ubs_io_disk_status{rank=\"1\",disk_path=\"/mnt/n\\\"v\\\\me\\n0\"} 5",
            "memcache_ubs_io_disk_status{rank=\"1\",disk_path=\"/mnt/other\"} 5",
        ),
        (
            "memcache_ssd_recovery_duration_seconds{rank=\"1\",disk_path=\"/mnt/n\\\"v\\\\me\\n0\"} 1.234567",
            "memcache_ssd_recovery_duration_seconds{rank=\"1\",disk_path=\"/mnt/other\"} 2",
        ),
        (
            "memcache_bandwidth_bytes_cum_total{rank=\"0\",operation=\"batch_get\"} 286720",
            "memcache_bandwidth_bytes_cum_total{rank=\"0\",operation=\"batch_get\"} 1335296",
        ),
        (
            "lmcache_mp_l1_usage_ratio 0.038927178364247084",
            "lmcache_mp_l1_usage_ratio 0.039049248676747084",
        ),
        (
            "lmcache_mp_event_bus_published_events_total 1500",
            "lmcache_mp_event_bus_published_events_total 2500",
        ),
    ] {
        assert!(first.contains(&format!("\n{before}\n")), "{before}");
        assert!(second.contains(&format!("\n{after}\n")), "{after}");
    }
    // The OTLP exporter's families.
    let t = crate::metrics::otlp::Telemetry::new(&Config::defaults());
    let mut first = Vec::new();
    render_otlp(&t, Format::Text, &mut first);
    t.stats.spans_exported.add(42);
    let mut second = Vec::new();
    render_otlp(&t, Format::Text, &mut second);
    let series = "\nmemcache_otlp_spans_exported_total ";
    assert!(
        String::from_utf8(first)
            .unwrap()
            .contains(&format!("{series}0\n"))
    );
    assert!(
        String::from_utf8(second)
            .unwrap()
            .contains(&format!("{series}42\n"))
    );
}

#[test]
fn summary_is_the_golden_text() {
    let f = fake();
    let mut buf = Vec::new();
    render_summary(&f, &mut buf);
    check_golden("summary.txt", &buf);
}

#[test]
fn ptracer_table_has_the_golden_shape() {
    let f = fake();
    let mut text = Vec::new();
    render_ptracer(&f, 1_767_625_023, |_| true, &mut text);
    let text = String::from_utf8(text).unwrap();
    // Latencies are measured (spans end as they begin): only the columns that are figures of the fake are
    // compared, i.e. everything before P50.
    let fixed: String = text.lines().map(|l| format!("{}\n", &l[..123])).collect();
    check_golden("ptracer.txt", fixed.as_bytes());
}

#[test]
fn process_families_close_the_exposition() {
    let f = fake();
    let mut buf = Vec::new();
    render_metrics(&f, &mut buf);
    let text = String::from_utf8(buf).unwrap();
    let tail = &text[text.find("# HELP process_cpu_seconds_total").unwrap()..];
    let names: Vec<&str> = tail
        .lines()
        .filter(|l| l.starts_with("# TYPE"))
        .map(|l| l.split(' ').nth(2).unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds"
        ]
    );
    let p = process::read();
    assert!(
        tail.contains(&format!("process_max_fds {}\n", p.max_fds)),
        "{tail}"
    );
}
