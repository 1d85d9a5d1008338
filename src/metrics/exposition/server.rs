//! The server's own families: the HTTP front end, what the tiers let go, re-replication, the
//! HA view, request latency histograms, and the process's figures.

use std::sync::OnceLock;

use super::families::Single;
use super::writer::{Family, HistogramLines, Native, Out, family};
use super::{sum, sum_i};
use crate::metrics::ShardStats;
use crate::metrics::process::Process;
use crate::metrics::requests::{self, ReqOp};
use crate::metrics::store::StoreStats;
use crate::metrics::view::Source;

fn st(c: &dyn Source, f: fn(&ShardStats) -> u64) -> u64 {
    sum(c, |s| f(s.stats))
}

fn st_i(c: &dyn Source, f: fn(&ShardStats) -> i64) -> u64 {
    sum_i(c, |s| f(s.stats))
}

/// The HTTP front end's families after `memcache_http_responses_total`, in output order.
static SERVER_SINGLES: &[Single] = &[
    (
        family!(
            "memcache_http_connections_open",
            "Open HTTP connections",
            gauge
        ),
        |c| st_i(c, |s| s.connections_open.get()),
    ),
    (
        family!(
            "memcache_http_connections_accepted_total",
            "HTTP connections accepted",
            counter
        ),
        |c| st(c, |s| s.connections_accepted.get()),
    ),
    (
        family!(
            "memcache_http_connections_rejected_total",
            "HTTP connections refused at the per-shard limit",
            counter
        ),
        |c| st(c, |s| s.connections_rejected.get()),
    ),
    (
        family!(
            "memcache_http_connections_timed_out_total",
            "HTTP connections closed for idleness or a stalled request",
            counter
        ),
        |c| st(c, |s| s.connections_timed_out.get()),
    ),
    (
        family!(
            "memcache_shard_cross_requests_total",
            "Requests a shard sent to the key's owner shard",
            counter
        ),
        |c| st(c, |s| s.cross_shard_requests.get()),
    ),
    (
        family!(
            "memcache_overload_rejections_total",
            "Requests answered 429 because a shard queue was full",
            counter
        ),
        |c| st(c, |s| s.overload_rejections.get()),
    ),
    (
        family!(
            "memcache_http_buffered_bytes",
            "Read-buffer bytes held for requests still arriving (bounded per shard by ock.mmc.http.max_buffered_bytes_per_shard)",
            gauge
        ),
        |c| st_i(c, |s| s.buffered_bytes.get()),
    ),
    (
        family!(
            "memcache_tls_handshake_failures_total",
            "TLS handshakes refused or timed out (missing or invalid client certificates)",
            counter
        ),
        |c| st(c, |s| s.tls_handshake_failures.get()),
    ),
    (
        family!(
            "memcache_same_host_puts_total",
            "Puts whose bytes the server read from a same-host client's memory",
            counter
        ),
        |c| st(c, |s| s.same_host.puts.get()),
    ),
    (
        family!(
            "memcache_same_host_put_bytes_total",
            "Bytes of puts read from same-host clients' memory",
            counter
        ),
        |c| st(c, |s| s.same_host.put_bytes.get()),
    ),
    (
        family!(
            "memcache_same_host_gets_total",
            "Gets whose bytes the server wrote into a same-host client's memory",
            counter
        ),
        |c| st(c, |s| s.same_host.gets.get()),
    ),
    (
        family!(
            "memcache_same_host_get_bytes_total",
            "Bytes of gets written into same-host clients' memory",
            counter
        ),
        |c| st(c, |s| s.same_host.get_bytes.get()),
    ),
    (
        family!(
            "memcache_same_host_copy_failures_total",
            "Same-host copies that failed (the client exited, or an address was not its memory)",
            counter
        ),
        |c| st(c, |s| s.same_host.copy_failures.get()),
    ),
    (
        family!(
            "memcache_same_host_split_copies_total",
            "Large same-host copies made in two halves, the first handed to the shard's copy helper",
            counter
        ),
        |c| st(c, |s| s.same_host.split_copies.get()),
    ),
    (
        family!(
            "memcache_same_host_halves_taken_back_total",
            "First halves of split same-host copies the shard made itself, its copy helper not having started them",
            counter
        ),
        |c| st(c, |s| s.same_host.halves_taken_back.get()),
    ),
    (
        family!(
            "memcache_same_host_shared_copies_total",
            "Same-host copies made with memcpy through a buffer the client shares with the server",
            counter
        ),
        |c| st(c, |s| s.same_host.shared_copies.get()),
    ),
    (
        family!(
            "memcache_same_host_shared_refusals_total",
            "Buffers same-host clients offered to share that the server refused",
            counter
        ),
        |c| st(c, |s| s.same_host.shared_refusals.get()),
    ),
    (
        family!(
            "memcache_same_host_mapped_gets_total",
            "Same-host gets the client copied itself from its read-only mapping of the segment, the blobs pinned meanwhile",
            counter
        ),
        |c| st(c, |s| s.same_host.mapped_gets.get()),
    ),
    (
        family!(
            "memcache_same_host_held_answers",
            "Mapped same-host answers whose blobs' pins connections hold now (their clients copying, or not done yet)",
            gauge
        ),
        |c| st_i(c, |s| s.same_host.held_answers.get()),
    ),
    (
        family!(
            "memcache_same_host_held_bytes",
            "Bytes of the blobs mapped same-host answers hold pinned now (not freed or evicted meanwhile)",
            gauge
        ),
        |c| st_i(c, |s| s.same_host.held_bytes.get()),
    ),
    (
        family!(
            "memcache_metadata_keys",
            "Keys stored through /metadata",
            gauge
        ),
        |c| st_i(c, |s| s.metadata_keys.get()),
    ),
    (
        family!(
            "memcache_metadata_bytes",
            "Bytes used by /metadata keys and values",
            gauge
        ),
        |c| st_i(c, |s| s.metadata_bytes.get()),
    ),
    (
        family!("memcache_shards", "Shards (cores) serving", gauge),
        |c| c.shard_count() as u64,
    ),
    (
        family!(
            "memcache_uptime_seconds",
            "Seconds since the server started",
            gauge
        ),
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
static TIER_OUTCOMES: &[Single] = &[
    (
        family!(
            "memcache_demoted_blobs_total",
            "Blobs moved down between memory tiers (HBM to DRAM) by eviction",
            counter
        ),
        |c| store(c, |s| s.demoted_blobs.get()),
    ),
    (
        family!(
            "memcache_flush_failed_total",
            "Flushes to SSD that failed (the memory copy was kept)",
            counter
        ),
        |c| store(c, |s| s.flush_failed.get()),
    ),
    (
        family!(
            "memcache_evict_deleted_objects_total",
            "Objects deleted by eviction because no lower tier had room for their last copy",
            counter
        ),
        |c| store(c, |s| s.evicted_objects_deleted.get()),
    ),
];

/// Re-replication: objects left below their replica count by a lost copy, given a new one on
/// another rank in the background (`ock.mmc.cluster.rereplicate.*`).
static REREPLICATION: &[Single] = &[
    (
        family!(
            "memcache_rereplicated_objects_total",
            "Objects below their replica count given a new copy on another rank",
            counter
        ),
        |c| store(c, |s| s.rereplicated.get()),
    ),
    (
        family!(
            "memcache_rereplicate_failed_total",
            "Re-replication copies that failed (the new blob was freed; an object is tried 3 times)",
            counter
        ),
        |c| store(c, |s| s.rereplicate_failed.get()),
    ),
    (
        family!(
            "memcache_rereplicate_overflow_total",
            "Objects below their replica count not queued for re-replication: the shard's queue was full",
            counter
        ),
        |c| store(c, |s| s.rereplicate_overflow.get()),
    ),
    (
        family!(
            "memcache_rereplicate_pending",
            "Objects below their replica count queued for a new copy or being copied",
            gauge
        ),
        |c| store_i(c, |s| s.rereplicate_pending.get()),
    ),
];

static HTTP_REQUESTS: Family = family!(
    "memcache_http_requests_total",
    "HTTP requests answered",
    counter
);

static HTTP_RESPONSES: Family = family!(
    "memcache_http_responses_total",
    "HTTP responses by status class",
    counter
);

static GRANTS_REFUSED: Family = family!(
    "memcache_grants_refused_total",
    "Write and move grants refused on this process: used already (a replay), or the ledger of used grants full",
    counter
);

/// The figures of the grants' family, by reason.
type StatField = fn(&ShardStats) -> u64;

static GRANT_REASONS: [(&str, StatField); 2] = [
    ("used", |s| s.grants_refused_used.get()),
    ("ledger_full", |s| s.grants_refused_ledger_full.get()),
];

pub(super) fn render_server(shared: &dyn Source, o: &mut Out<'_>) {
    o.single(&HTTP_REQUESTS, st(shared, |s| s.http_requests.get()));
    o.family(&HTTP_RESPONSES);
    for (i, class) in ["1xx", "2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
        let n = sum(shared, |s| s.stats.http_responses[i].get());
        o.int(&[("code", class)], n);
    }
    // The rest moves less often than the requests counted above: one block.
    let ha = shared.ha();
    let tables = [SERVER_SINGLES, TIER_OUTCOMES, REREPLICATION];
    let gather = |figures: &mut Vec<u64>| {
        figures.extend(SERVER_SINGLES.iter().map(|(_, f)| f(shared)));
        figures.extend(GRANT_REASONS.iter().map(|(_, f)| st(shared, *f)));
        figures.extend(TIER_OUTCOMES.iter().map(|(_, f)| f(shared)));
        figures.extend(REREPLICATION.iter().map(|(_, f)| f(shared)));
        figures.extend(ha.roles.iter().map(|&(_, now)| u64::from(now)));
        figures.push(u64::from(ha.serving));
        figures.push(ha.view_version);
    };
    let write = |o: &mut Out<'_>, figures: &[u64]| {
        let mut v = figures.iter().copied();
        let mut next = || v.next().expect("a figure");
        for (i, table) in tables.iter().enumerate() {
            for (family, _) in table.iter() {
                o.single(family, next());
            }
            if i == 0 {
                o.family(&GRANTS_REFUSED);
                for (reason, _) in &GRANT_REASONS {
                    o.int(&[("reason", reason)], next());
                }
            }
        }
        o.family(&HA_ROLE);
        for (role, _) in ha.roles {
            o.int(&[("role", role)], next());
        }
        o.single(&HA_SERVING, next());
        o.single(&HA_VIEW_VERSION, next());
    };
    super::families::block(o, &SERVER_SINGLES[0].0, gather, write);
}

static HA_ROLE: Family = family!(
    "memcache_ha_role",
    "This meta's HA role: 1 for the current one (leader, standby or unknown)",
    gauge
);

static HA_SERVING: Family = family!(
    "memcache_ha_serving",
    "1 when this meta is the leader and serving (HA off: always 1)",
    gauge
);

static HA_VIEW_VERSION: Family = family!(
    "memcache_ha_view_version",
    "The HA view version: the etcd revision of the current leadership (0 without HA)",
    gauge
);

static REQUEST_DURATIONS: Family = family!(
    "memcache_http_request_duration_seconds",
    "HTTP request latency from the parsed head to the queued answer, by operation",
    histogram
);

/// Each operation's histogram lines, in [`ReqOp::ALL`] order, made once.
fn request_duration_lines() -> &'static [HistogramLines] {
    static LINES: OnceLock<Vec<HistogramLines>> = OnceLock::new();
    LINES.get_or_init(|| {
        let les: Vec<&str> = requests::BOUNDS.iter().map(|&(_, le)| le).collect();
        ReqOp::ALL
            .iter()
            .map(|op| {
                HistogramLines::new(REQUEST_DURATIONS.name, &[("operation", op.name())], &les)
            })
            .collect()
    })
}

/// `memcache_http_request_duration_seconds`: every operation's histogram, summed over shards,
/// zeros included (the series exist from the start). The protobuf form adds each
/// operation's native histogram (schema [`requests::NATIVE_SCHEMA`]).
pub(super) fn render_request_durations(shared: &dyn Source, o: &mut Out<'_>) {
    o.family(&REQUEST_DURATIONS);
    let mut native = requests::NativeMerged::default();
    let mut merged = false;
    for (op, lines) in ReqOp::ALL.iter().zip(request_duration_lines()) {
        let mut m = requests::Merged::default();
        for s in shared.shards() {
            s.stats.request_durations.add_to(*op, &mut m);
        }
        let sum = m.sum_ns as f64 / 1e9;
        let labels = [("operation", op.name())];
        if !o.is_protobuf() {
            o.histogram(lines, &labels, &m.counts, sum, None);
            continue;
        }
        // An operation nothing was recorded for has empty native buckets: nothing to add.
        if merged {
            native.clear();
            merged = false;
        }
        if m.counts.iter().any(|&c| c != 0) {
            for s in shared.shards() {
                s.stats.request_durations.add_native_to(*op, &mut native);
            }
            merged = true;
        }
        let n = Native {
            schema: requests::NATIVE_SCHEMA,
            zero_threshold: requests::NATIVE_ZERO_THRESHOLD,
            zero_count: native.zero,
            first_key: requests::NATIVE_MIN_KEY,
            counts: if merged { &native.counts } else { &[] },
        };
        o.histogram(lines, &labels, &m.counts, sum, Some(&n));
    }
}

static PROCESS_CPU: Family = family!(
    "process_cpu_seconds_total",
    "Total user and system CPU time spent in seconds.",
    counter
);

static PROCESS_START: Family = family!(
    "process_start_time_seconds",
    "Start time of the process since unix epoch in seconds.",
    gauge
);

type ProcessField = fn(&Process) -> u64;

static PROCESS_GAUGES: [(Family, ProcessField); 4] = [
    (
        family!(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            gauge
        ),
        |p| p.resident_bytes,
    ),
    (
        family!(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            gauge
        ),
        |p| p.virtual_bytes,
    ),
    (
        family!(
            "process_open_fds",
            "Number of open file descriptors.",
            gauge
        ),
        |p| p.open_fds,
    ),
    (
        family!(
            "process_max_fds",
            "Maximum number of open file descriptors.",
            gauge
        ),
        |p| p.max_fds,
    ),
];

/// The standard `process_*` families, of figures read now.
pub(super) fn render_process(p: &Process, o: &mut Out<'_>) {
    o.family(&PROCESS_CPU);
    o.float(&[], p.cpu_seconds);
    for (family, f) in &PROCESS_GAUGES {
        o.single(family, f(p));
    }
    o.family(&PROCESS_START);
    o.float(&[], p.start_time_seconds);
}
