//! The table of every configuration key ([`KEYS`]): name, default as text, one line of
//! documentation, setter. `config/mmc-meta.conf` is generated from it.

use super::*;

/// One configuration key.
pub struct KeySpec {
    pub name: &'static str,
    pub default: &'static str,
    pub doc: &'static str,
    /// A credential: never printed (errors and `--print-config` show `<redacted>`).
    pub secret: bool,
    pub(super) set: fn(&mut Config, &str) -> Result<(), String>,
}

macro_rules! key {
    ($name:literal, $default:literal, $doc:literal, |$c:ident, $v:ident| $body:expr) => {
        KeySpec {
            name: $name,
            default: $default,
            doc: $doc,
            secret: false,
            set: |$c: &mut Config, $v: &str| -> Result<(), String> {
                $body;
                Ok(())
            },
        }
    };
    (secret $name:literal, $default:literal, $doc:literal, |$c:ident, $v:ident| $body:expr) => {
        KeySpec {
            name: $name,
            default: $default,
            doc: $doc,
            secret: true,
            set: |$c: &mut Config, $v: &str| -> Result<(), String> {
                $body;
                Ok(())
            },
        }
    };
}

/// Shown instead of a secret's value.
pub const REDACTED: &str = "<redacted>";

fn token(v: &str) -> Result<String, String> {
    let v = v.trim();
    if v.len() > 1024 || !v.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return Err("a token of at most 1024 visible ASCII characters (no spaces)".to_string());
    }
    Ok(v.to_string())
}

/// An `http://host:port` or `https://host:port` URL (no path), as meta and local services
/// address each other.
fn meta_url(v: &str) -> Result<String, String> {
    let (scheme, rest) = v
        .split_once("://")
        .filter(|(s, _)| *s == "http" || *s == "https")
        .ok_or_else(|| format!("{v:?}: expected http://host:port or https://host:port"))?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let ok = !rest.is_empty()
        && !rest.contains('/')
        && rest
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
    if ok {
        Ok(format!("{scheme}://{rest}"))
    } else {
        Err(format!(
            "{v:?}: expected http://host:port or https://host:port"
        ))
    }
}

fn endpoint(v: &str) -> Result<String, String> {
    let v = v.trim();
    if super::values::valid_endpoint(v) {
        Ok(v.to_string())
    } else {
        Err("a ZMQ endpoint such as tcp://127.0.0.1:5557 or ipc:///path".to_string())
    }
}

/// A comma list of etcd endpoints: `http://HOST:PORT` or `HOST:PORT`.
fn etcd_endpoints(v: &str) -> Result<Vec<HostPort>, String> {
    const ALLOWED: &str =
        "a comma list of etcd endpoints http://HOST:PORT (https is not supported)";
    let mut out = Vec::new();
    for item in v.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let hp = if item.contains("://") {
            match parse_url(item) {
                Ok((false, hp)) => hp,
                _ => return Err(ALLOWED.to_string()),
            }
        } else {
            values::HostPort::parse(item).map_err(|_| ALLOWED.to_string())?
        };
        out.push(hp);
    }
    Ok(out)
}

fn size(v: &str) -> Result<u64, String> {
    parse_size(v).map_err(str::to_string)
}

fn size_in(v: &str, min: u64, max: u64) -> Result<u64, String> {
    let n = size(v)?;
    if n < min || n > max {
        return Err(format!("a size from {min} to {max} bytes"));
    }
    Ok(n)
}

/// How far `ock.mmc.http.body_timeout_ms` stays below `ock.mmc.store.alloc_timeout_ms`: the
/// sweep that cuts a stalled body and the store tick that sees a writer's progress each run
/// once a tick, so a stalled writer is cut at most a tick late and seen at most a tick late.
pub(super) const BODY_TIMEOUT_MARGIN_MS: u64 = 2 * crate::limits::TICK_MS;

/// Every key, in the order `config/mmc-meta.conf` documents them.
pub static KEYS: &[KeySpec] = &[
    key!(
        "ock.mmc.meta_service.metrics_url",
        "http://127.0.0.1:8000",
        "Address of the HTTP service (REST API, metrics, data plane). `--listen HOST:PORT` overrides it.",
        |c, v| {
            let (tls, hp) = parse_url(v).map_err(str::to_string)?;
            c.url_is_https = tls;
            c.listen = hp;
        }
    ),
    key!(
        "ock.mmc.meta_service.advertise_address",
        "",
        "HOST:PORT under which clients reach this node; reported as leader_address. Empty: unknown.",
        |c, v| {
            let v = v.trim();
            if !v.is_empty() {
                values::HostPort::parse(v).map_err(str::to_string)?;
            }
            c.advertise_address = v.to_string();
        }
    ),
    key!(
        "ock.mmc.meta.ha.enable",
        "false",
        "High availability on etcd: metas campaign for leadership with an etcd lease; one leads, the others are standbys that redirect (307) to it. Needs etcd_endpoints and advertise_url.",
        |c, v| c.ha.enable = parse_bool(v)?
    ),
    key!(
        "ock.mmc.meta.ha.etcd_endpoints",
        "",
        "etcd client endpoints, comma-separated (http://HOST:PORT or HOST:PORT; plain HTTP, etcd's v3 JSON gateway), tried in turn.",
        |c, v| c.ha.etcd_endpoints = etcd_endpoints(v)?
    ),
    key!(
        "ock.mmc.meta.ha.advertise_url",
        "",
        "The URL clients and local services use to reach this meta (http://HOST:PORT): the leader_address while it leads, and where standbys redirect to.",
        |c, v| {
            let v = v.trim();
            if !v.is_empty() {
                parse_url(v).map_err(str::to_string)?;
            }
            c.ha.advertise_url = v.trim_end_matches('/').to_string();
        }
    ),
    key!(
        "ock.mmc.meta.ha.lease_ttl_ms",
        "5000",
        "The leader's etcd lease TTL (whole seconds, rounded up; at least 2000). A leader that cannot renew it steps down before it expires; a standby takes over within about this long after the leader dies.",
        |c, v| c.ha.lease_ttl_ms = parse_u64_in(v, 2000, 600_000)?
    ),
    key!(
        "ock.mmc.meta.ha.prefix",
        "/mmc/",
        "etcd key prefix: the election key is PREFIX + leader, /metadata entries live under PREFIX + metadata/.",
        |c, v| {
            let v = v.trim();
            if !v.starts_with('/')
                || !v.ends_with('/')
                || v.len() > 256
                || v.bytes().any(|b| b.is_ascii_control())
            {
                return Err(
                    "a key prefix that starts and ends with / (at most 256 bytes)".to_string(),
                );
            }
            c.ha.prefix = v.to_string();
        }
    ),
    key!(
        "ock.mmc.http.max_body_bytes",
        "64MB",
        "Largest request body; a larger one is answered 413 without reading it.",
        |c, v| c.http.max_body_bytes = size_in(v, 1, 1 << 40)?
    ),
    key!(
        "ock.mmc.http.idle_timeout_ms",
        "60000",
        "An idle keep-alive connection is closed after this many milliseconds.",
        |c, v| c.http.idle_timeout_ms = parse_u64_in(v, 100, 86_400_000)?
    ),
    key!(
        "ock.mmc.http.header_timeout_ms",
        "10000",
        "A request head (or body) must arrive completely within this many milliseconds of its first byte.",
        |c, v| c.http.header_timeout_ms = parse_u64_in(v, 100, 3_600_000)?
    ),
    key!(
        "ock.mmc.http.body_timeout_ms",
        "auto",
        "A streamed object body (PUT of 256 KiB or more, read straight into its blob) is answered 408 and closed when no bytes arrive for this many milliseconds (nginx's client_body_timeout). Must stay at least 500 ms below ock.mmc.store.alloc_timeout_ms; auto: 10000, or alloc_timeout_ms - 500 when that is less.",
        |c, v| {
            c.http.body_timeout_ms = match v.trim() {
                "auto" => None,
                v => Some(parse_u64_in(v, 100, 3_600_000).map_err(|e| format!("auto or {e}"))?),
            }
        }
    ),
    key!(
        "ock.mmc.http.body_min_rate_bytes_per_sec",
        "65536",
        "After the first ock.mmc.http.body_timeout_ms a streamed object body must keep an average of at least this many bytes per second, or it is answered 408 and closed (0: no minimum rate).",
        |c, v| c.http.body_min_rate_bytes_per_sec = parse_u64_in(v, 0, 1 << 40)?
    ),
    key!(
        "ock.mmc.http.shutdown_timeout_ms",
        "10000",
        "On SIGTERM/SIGINT, requests in flight get this long to finish before connections are closed.",
        |c, v| c.http.shutdown_timeout_ms = parse_u64_in(v, 0, 600_000)?
    ),
    key!(
        "ock.mmc.http.max_connections_per_shard",
        "16384",
        "Open connections one shard accepts; past it new connections are answered 429 and closed.",
        |c, v| c.http.max_connections_per_shard = parse_u64_in(v, 1, 1_000_000)?
    ),
    key!(
        secret "ock.mmc.http.auth_token",
        "",
        "Bearer token every route but /healthz and /ready requires (env MMC_API_TOKEN). Required off loopback.",
        |c, v| c.http.auth_token = token(v)?
    ),
    key!(
        secret "ock.mmc.http.metrics_token",
        "",
        "Separate bearer token for /metrics* (env MMC_METRICS_TOKEN), so scrapers never hold the data token. Required off loopback.",
        |c, v| c.http.metrics_token = token(v)?
    ),
    key!(
        "ock.mmc.http.max_inflight_per_shard",
        "1024",
        "Requests one shard may be working on at once (waiting for other shards or the SSD); past it: 429.",
        |c, v| c.http.max_inflight_per_shard = parse_u64_in(v, 1, 1_000_000)?
    ),
    key!(
        "ock.mmc.http.max_buffered_bytes_per_shard",
        "512MB",
        "Read-buffer memory one shard's connections may hold for requests still arriving (bodies are buffered, except large object puts, which stream); past it: 429. At least max_body_bytes.",
        |c, v| c.http.max_buffered_bytes_per_shard = size_in(v, 1 << 20, 1 << 40)?
    ),
    key!(
        "ock.mmc.metadata.max_value_bytes",
        "1MB",
        "Largest value PUT /metadata accepts (413 beyond).",
        |c, v| c.metadata.max_value_bytes = size_in(v, 1, 1 << 32)?
    ),
    key!(
        "ock.mmc.metadata.max_total_bytes",
        "256MB",
        "Memory all /metadata keys and values may use together; a PUT past it fails with `Metadata store full`.",
        |c, v| c.metadata.max_total_bytes = size_in(v, 1024, 1 << 44)?
    ),
    key!(
        "ock.mmc.shard.inbox_capacity",
        "4096",
        "Requests from other shards one shard queues; past it the sender answers 429.",
        |c, v| c.shard.inbox_capacity = parse_u64_in(v, 16, 1 << 20)?
    ),
    key!(
        "ock.mmc.shard.max_outstanding",
        "4096",
        "Requests one shard may have waiting on other shards at once; past it it answers 429.",
        |c, v| c.shard.max_outstanding = parse_u64_in(v, 16, 1 << 20)?
    ),
    key!(
        "ock.mmc.shard.idle_spin_us",
        "0",
        "Microseconds a shard waiting for another shard's reply polls before it parks (0: park at once).",
        |c, v| c.shard.idle_spin_us = parse_u64_in(v, 0, 1000)?
    ),
    key!(
        "ock.mmc.io.ring_entries",
        "1024",
        "io_uring submission queue entries per shard (rounded up to a power of two; halved down to 256 when memlock is short).",
        |c, v| c.shard.ring_entries = parse_u64_in(v, 256, 32768)?
    ),
    key!(
        "ock.mmc.embedded.ranks",
        "1",
        "Ranks this process provides segments for (each rank gets its own DRAM, HBM and SSD segments); 0: a pure meta service whose memory is all on local services (mmc-server --role local).",
        |c, v| c.store.ranks = parse_u64_in(v, 0, 1024)?
    ),
    key!(
        "ock.mmc.meta_service_url",
        "",
        "Local service (--role local): the meta service to join, http://host:port (https:// for one listening with TLS: see ock.mmc.cluster.tls.*); a comma-separated list is tried in order.",
        |c, v| {
            c.cluster.meta_urls = v
                .split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(meta_url)
                .collect::<Result<_, _>>()?
        }
    ),
    key!(
        "ock.mmc.local_service.rank",
        "",
        "Local service: the rank to join as; empty: the meta service assigns the lowest free one (a restarted service with the same rank or URL gets its rank back).",
        |c, v| {
            c.cluster.local_rank = match v.trim() {
                "" => None,
                r => Some(parse_u64_in(r, 0, 1 << 20)? as u32),
            }
        }
    ),
    key!(
        "ock.mmc.local_service.advertise_url",
        "",
        "Local service: the URL clients are redirected to for its bytes, http://host:port; empty: the listen address, https:// when it listens with TLS.",
        |c, v| {
            c.cluster.local_advertise_url = match v.trim() {
                "" => String::new(),
                u => meta_url(u)?,
            }
        }
    ),
    key!(
        "ock.mmc.cluster.heartbeat_interval_ms",
        "500",
        "How often a local service reports to its meta service.",
        |c, v| c.cluster.heartbeat_interval_ms = parse_u64_in(v, 10, 60_000)?
    ),
    key!(
        "ock.mmc.cluster.heartbeat_timeout_ms",
        "3000",
        "A rank with no report for this long is lost: its segments are dropped, objects with no copy elsewhere removed.",
        |c, v| c.cluster.heartbeat_timeout_ms = parse_u64_in(v, 20, 600_000)?
    ),
    key!(
        secret "ock.mmc.cluster.token",
        "",
        "Shared secret of a meta service and its local services (env MMC_CLUSTER_TOKEN); required when either listens off loopback. A join with another secret is refused.",
        |c, v| c.cluster.token = token(v)?
    ),
    key!(
        "ock.mmc.cluster.grant_ttl_ms",
        "10000",
        "How long a grant in a redirect to a local service stays valid (a read's also ends with its lease; a write's at most ock.mmc.store.alloc_timeout_ms - 500, so the allocation outlives it).",
        |c, v| c.cluster.grant_ttl_ms = parse_u64_in(v, 100, 3_600_000)?
    ),
    key!(
        "ock.mmc.cluster.tls.ca.path",
        "",
        "PEM CA certificate(s) an https:// peer's server certificate must chain to (the meta service a local service joins; a local service the meta calls); empty: ock.mmc.metrics.tls.ca.path.",
        |c, v| c.cluster.tls.ca_path = v.trim().to_string()
    ),
    key!(
        "ock.mmc.cluster.tls.cert.path",
        "",
        "PEM client certificate chain presented to https:// peers (they require one); empty: ock.mmc.metrics.tls.cert.path, this service's own server certificate.",
        |c, v| c.cluster.tls.cert_path = v.trim().to_string()
    ),
    key!(
        "ock.mmc.cluster.tls.key.path",
        "",
        "PEM private key of ock.mmc.cluster.tls.cert.path; empty: ock.mmc.metrics.tls.key.path.",
        |c, v| c.cluster.tls.key_path = v.trim().to_string()
    ),
    key!(
        "ock.mmc.local_service.dram.size",
        "1GB",
        "DRAM segment size per rank (host memory, committed only as it is used); 0: no DRAM segment.",
        |c, v| c.store.dram_bytes = size_in(v, 0, MAX_SEGMENT_BYTES)?
    ),
    key!(
        "ock.mmc.local_service.hbm.size",
        "1GB",
        "HBM segment size per rank (accelerator memory; emulated in host memory by default); 0: no HBM segment.",
        |c, v| c.store.hbm_bytes = size_in(v, 0, MAX_SEGMENT_BYTES)?
    ),
    key!(
        "ock.mmc.ssd.enable",
        "false",
        "Enable the SSD tier: evicted DRAM blobs are flushed to files and rewarmed on read.",
        |c, v| c.store.ssd_enable = parse_bool(v)?
    ),
    key!(
        "ock.mmc.ssd.path",
        "",
        "Directories for SSD segment files, comma-separated (rank r uses directory r mod count). Required with the SSD tier.",
        |c, v| {
            c.store.ssd_dirs = v
                .split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(str::to_string)
                .collect()
        }
    ),
    key!(
        "ock.mmc.ssd.size",
        "4GB",
        "SSD segment size per rank (a sparse file).",
        |c, v| c.store.ssd_bytes = size_in(v, PAGE_BYTES, MAX_SEGMENT_BYTES)?
    ),
    key!(
        "ock.mmc.lease_ms",
        "2000",
        "Read lease: a read blob cannot be evicted or freed for this long.",
        |c, v| c.store.lease_ms = parse_u64_in(v, 0, 3_600_000)?
    ),
    key!(
        "ock.mmc.store.alloc_timeout_ms",
        "30000",
        "An allocation whose writer neither commits nor writes for this long is reclaimed: the writer's grant is revoked, and its blobs are freed once the writer lets go of them.",
        |c, v| c.store.alloc_timeout_ms = parse_u64_in(v, 100, 86_400_000)?
    ),
    key!(
        "ock.mmc.segment.run_bytes",
        "16MB",
        "Size of the runs shards take from a segment to place small blobs in (capped at a quarter of a shard's share).",
        |c, v| c.store.run_bytes = size_in(v, PAGE_BYTES, 1 << 32)?
    ),
    key!(
        "ock.mmc.numa.enable",
        "false",
        "Group shards by the NUMA node of their CPU (true, false, or auto: only with two or more nodes); the start-up log shows the grouping. Each DRAM segment is then cut into one part per node (in proportion to the node's shards), each part bound to its node with mbind; a shard takes its runs from its node's part, prefault commits each part from its node's CPUs, and /metrics shows bytes per node. On a one-node machine a no-op (logged).",
        |c, v| c.shard.numa = crate::numa::NumaMode::parse(v)?
    ),
    key!(
        "ock.mmc.numa.policy",
        "preferred",
        "How a node's part of a DRAM segment is bound to its node under NUMA placement: preferred (MPOL_PREFERRED: the node's memory while it has some, another node's after that) or bind (MPOL_BIND: that node only; a node out of memory then brings the kernel's OOM handling onto this process).",
        |c, v| c.shard.numa_policy = crate::numa::MemPolicy::parse(v)?
    ),
    key!(
        "ock.mmc.segment.prefault",
        "false",
        "Commit the pages of DRAM and (emulated) HBM segments when they are mounted, on a background thread, instead of at their first write: RSS grows to the segments' size at start, and no request pays for first-touch page faults.",
        |c, v| c.store.prefault = parse_bool(v)?
    ),
    key!(
        "ock.mmc.evict_threshold_high",
        "90",
        "Percent of a medium's capacity above which an allocation first evicts.",
        |c, v| c.evict.high_percent = parse_u64_in(v, 1, 100)?
    ),
    key!(
        "ock.mmc.evict_threshold_low",
        "80",
        "Percent of a medium's capacity eviction brings usage down to (below the high threshold).",
        |c, v| c.evict.low_percent = parse_u64_in(v, 0, 99)?
    ),
    key!(
        "ock.mmc.metrics.per_rank",
        "false",
        "Also export per-rank series ({rank=...}) and per-rank /metrics/summary fields.",
        |c, v| c.metrics.per_rank = parse_bool(v)?
    ),
    key!(
        "ock.mmc.metrics.window_secs",
        "10",
        "Sliding window of the bandwidth metrics; a rank with no traffic in it is stale.",
        |c, v| c.metrics.window_secs = parse_u64_in(v, 1, 60)?
    ),
    key!(
        "ock.mmc.event_bus.queue_capacity",
        "65536",
        "Lifecycle events one shard's event bus queues before it drops (and counts) new ones.",
        |c, v| c.metrics.bus_capacity = parse_u64_in(v, 16, 1 << 24)?
    ),
    key!(
        "ock.mmc.metrics.tls.enable",
        "false",
        "Serve HTTPS with required client certificates (mTLS) on the HTTP service.",
        |c, v| c.tls.enable = parse_bool(v)?
    ),
    key!(
        "ock.mmc.metrics.tls.ca.path",
        "",
        "PEM CA certificate(s) client certificates must chain to.",
        |c, v| c.tls.ca_path = v.trim().to_string()
    ),
    key!(
        "ock.mmc.metrics.tls.cert.path",
        "",
        "PEM server certificate chain.",
        |c, v| c.tls.cert_path = v.trim().to_string()
    ),
    key!(
        "ock.mmc.metrics.tls.key.path",
        "",
        "PEM private key of the server certificate.",
        |c, v| c.tls.key_path = v.trim().to_string()
    ),
    key!(
        "ock.mmc.metrics.tls.crl.path",
        "",
        "Optional PEM certificate revocation list(s) for client certificates.",
        |c, v| c.tls.crl_path = v.trim().to_string()
    ),
    key!(
        "ock.mmc.kv_events.enable",
        "false",
        "Publish KV cache events (vLLM's ZMQ format) for KV-aware routers.",
        |c, v| c.kv_events.enable = parse_bool(v)?
    ),
    key!(
        "ock.mmc.kv_events.encoding",
        "array",
        "Wire form of each msgpack EventBatch: array (positional, tag-first event arrays: vLLM up to 0.11, llm-d, Dynamo) or map (by field name, events tagged by \"type\": current vLLM).",
        |c, v| {
            c.kv_events.encoding =
                super::KvEncoding::parse(v).ok_or_else(|| super::KvEncoding::ALLOWED.to_string())?
        }
    ),
    key!(
        "ock.mmc.kv_events.endpoint",
        "tcp://127.0.0.1:5557",
        "ZMQ PUB endpoint the events are published on (tcp://HOST:PORT, ipc://PATH).",
        |c, v| c.kv_events.endpoint = endpoint(v)?
    ),
    key!(
        "ock.mmc.kv_events.replay_endpoint",
        "",
        "ZMQ ROUTER endpoint where late subscribers ask for missed batches; empty: no replay.",
        |c, v| {
            let v = v.trim();
            c.kv_events.replay_endpoint = if v.is_empty() {
                String::new()
            } else {
                endpoint(v)?
            }
        }
    ),
    key!(
        "ock.mmc.kv_events.topic",
        "",
        "Topic frame of every published message (may be empty).",
        |c, v| c.kv_events.topic = v.trim().to_string()
    ),
    key!(
        "ock.mmc.kv_events.queue_capacity",
        "65536",
        "Soft queue limit: past it new stored events are dropped (counted).",
        |c, v| c.kv_events.queue_capacity = parse_u64_in(v, 1, 1 << 26)?
    ),
    key!(
        "ock.mmc.kv_events.hard_capacity",
        "131072",
        "Hard queue limit: past it removed and cleared events are dropped too (counted).",
        |c, v| c.kv_events.hard_capacity = parse_u64_in(v, 1, 1 << 27)?
    ),
    key!(
        "ock.mmc.kv_events.batch_max_events",
        "256",
        "Most events in one published batch.",
        |c, v| c.kv_events.batch_max_events = parse_u64_in(v, 1, 65536)?
    ),
    key!(
        "ock.mmc.kv_events.batch_max_delay_ms",
        "5",
        "Longest an event waits for its batch to fill before the batch is sent.",
        |c, v| c.kv_events.batch_max_delay_ms = parse_u64_in(v, 0, 10_000)?
    ),
    key!(
        "ock.mmc.kv_events.data_parallel_rank",
        "0",
        "The data_parallel_rank element of every EventBatch.",
        |c, v| c.kv_events.data_parallel_rank = parse_u64_in(v, 0, 1 << 20)? as i64
    ),
    key!(
        "ock.mmc.kv_events.replay_batches",
        "10000",
        "Batches kept for the replay socket.",
        |c, v| c.kv_events.replay_batches = parse_u64_in(v, 0, 1 << 24)?
    ),
    key!(
        "ock.mmc.kv_events.block_size",
        "256",
        "block_size reported in BlockStored events (tokens per chunk; LMCache's default chunk is 256).",
        |c, v| c.kv_events.block_size = parse_u64_in(v, 1, 1 << 20)?
    ),
    key!(
        "ock.mmc.log.level",
        "info",
        "Log level: error, warn, info, debug or trace (RUST_LOG overrides it).",
        |c, v| {
            c.log_level = v
                .trim()
                .parse()
                .map_err(|_| "one of off, error, warn, info, debug, trace".to_string())?
        }
    ),
];
