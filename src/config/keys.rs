//! The table of every configuration key ([`KEYS`]): name, default as text, how its value is
//! read ([`Set`]), one line of documentation. `config/mmc-meta.conf` is generated from it.

use super::*;

/// One configuration key.
pub struct KeySpec {
    pub name: &'static str,
    pub default: &'static str,
    pub doc: &'static str,
    /// A credential: never printed (errors and `--print-config` show `<redacted>`).
    pub secret: bool,
    set: Set,
}

/// How a key's text becomes its field: each syntax is read in one place, a row names the
/// field and the bounds.
enum Set {
    /// A whole number from .1 to .2.
    U64(fn(&mut Config) -> &mut u64, u64, u64),
    /// A size (bytes, or KB/MB/GB/TB) from .1 to .2 bytes.
    Size(fn(&mut Config) -> &mut u64, u64, u64),
    Bool(fn(&mut Config) -> &mut bool),
    /// Text, checked and normalised by the function.
    Text(
        fn(&mut Config) -> &mut String,
        fn(&str) -> Result<String, String>,
    ),
    /// Text that may be empty (trimmed; empty: unset), else checked by the function.
    Optional(
        fn(&mut Config) -> &mut String,
        fn(&str) -> Result<String, String>,
    ),
    /// Any other syntax, or more than one field.
    With(fn(&mut Config, &str) -> Result<(), String>),
}

use Set::{Bool, Optional, Size, Text, U64, With};

const fn key(name: &'static str, default: &'static str, set: Set, doc: &'static str) -> KeySpec {
    KeySpec {
        name,
        default,
        doc,
        secret: false,
        set,
    }
}

/// A secret token (see [`token`]).
const fn secret(
    name: &'static str,
    default: &'static str,
    field: fn(&mut Config) -> &mut String,
    doc: &'static str,
) -> KeySpec {
    KeySpec {
        name,
        default,
        doc,
        secret: true,
        set: Text(field, token),
    }
}

impl KeySpec {
    /// Sets the key's field from `v`; the error says what the key accepts.
    pub(super) fn apply(&self, c: &mut Config, v: &str) -> Result<(), String> {
        match self.set {
            U64(field, min, max) => *field(c) = parse_u64_in(v, min, max)?,
            Size(field, min, max) => *field(c) = size_in(v, min, max)?,
            Bool(field) => *field(c) = parse_bool(v)?,
            Text(field, read) => *field(c) = read(v)?,
            Optional(field, read) => {
                let v = v.trim();
                *field(c) = if v.is_empty() {
                    String::new()
                } else {
                    read(v)?
                };
            }
            With(set) => set(c, v)?,
        }
        Ok(())
    }
}

/// Shown instead of a secret's value.
pub const REDACTED: &str = "<redacted>";

fn trimmed(v: &str) -> Result<String, String> {
    Ok(v.trim().to_string())
}

fn token(v: &str) -> Result<String, String> {
    let v = v.trim();
    if v.len() > 1024 || !v.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return Err("a token of at most 1024 visible ASCII characters (no spaces)".to_string());
    }
    Ok(v.to_string())
}

/// The non-empty items of a comma list, trimmed.
fn comma_list(v: &str) -> impl Iterator<Item = &str> {
    v.split(',').map(str::trim).filter(|i| !i.is_empty())
}

/// `auto`, `off`, or an absolute path for the same-host Unix socket.
fn same_host_socket(v: &str) -> Result<String, String> {
    let v = v.trim();
    let path_ok = v.starts_with('/') && v.len() < 100 && !v.chars().any(char::is_control);
    if v == "auto" || v == "off" || path_ok {
        Ok(v.to_string())
    } else {
        Err(format!(
            "{v:?}: expected auto, off or an absolute path (under 100 bytes, no control characters)"
        ))
    }
}

fn host_port(v: &str) -> Result<String, String> {
    values::HostPort::parse(v).map_err(str::to_string)?;
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

/// A meta's HA URL, without a trailing `/`.
fn advertise_url(v: &str) -> Result<String, String> {
    parse_url(v).map_err(str::to_string)?;
    Ok(v.trim_end_matches('/').to_string())
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
    for item in comma_list(v) {
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

fn etcd_prefix(v: &str) -> Result<String, String> {
    let v = v.trim();
    if !v.starts_with('/')
        || !v.ends_with('/')
        || v.len() > 256
        || v.bytes().any(|b| b.is_ascii_control())
    {
        return Err("a key prefix that starts and ends with / (at most 256 bytes)".to_string());
    }
    Ok(v.to_string())
}

fn size_in(v: &str, min: u64, max: u64) -> Result<u64, String> {
    let n = parse_size(v).map_err(str::to_string)?;
    if n < min || n > max {
        return Err(format!("a size from {min} to {max} bytes"));
    }
    Ok(n)
}

fn set_listen(c: &mut Config, v: &str) -> Result<(), String> {
    let (tls, hp) = parse_url(v).map_err(str::to_string)?;
    c.url_is_https = tls;
    c.listen = hp;
    Ok(())
}

fn set_body_timeout(c: &mut Config, v: &str) -> Result<(), String> {
    c.http.body_timeout_ms = match v.trim() {
        "auto" => None,
        v => Some(parse_u64_in(v, 100, 3_600_000).map_err(|e| format!("auto or {e}"))?),
    };
    Ok(())
}

fn set_local_rank(c: &mut Config, v: &str) -> Result<(), String> {
    c.cluster.local_rank = match v.trim() {
        "" => None,
        r => Some(parse_u64_in(r, 0, 1 << 20)? as u32),
    };
    Ok(())
}

fn set_kv_encoding(c: &mut Config, v: &str) -> Result<(), String> {
    c.kv_events.encoding =
        super::KvEncoding::parse(v).ok_or_else(|| super::KvEncoding::ALLOWED.to_string())?;
    Ok(())
}

/// A collector's base URL: `http[s]://host:port` and an optional path, without a trailing `/`.
fn otlp_endpoint(v: &str) -> Result<String, String> {
    const ALLOWED: &str = "an http://HOST:PORT or https://HOST:PORT URL, optionally with a path";
    let v = v.trim().trim_end_matches('/');
    let (scheme, rest) = v.split_once("://").ok_or(ALLOWED)?;
    let (authority, _path) = rest.split_once('/').unwrap_or((rest, ""));
    let ok = matches!(scheme, "http" | "https")
        && !v.bytes().any(|b| {
            b.is_ascii_whitespace() || b.is_ascii_control() || b == b'?' || b == b'#' || b == b'@'
        })
        && authority
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
    if ok {
        Ok(v.to_string())
    } else {
        Err(ALLOWED.to_string())
    }
}

fn set_sample_ratio(c: &mut Config, v: &str) -> Result<(), String> {
    const ALLOWED: &str = "a number from 0 to 1";
    let r: f64 = v.trim().parse().map_err(|_| ALLOWED.to_string())?;
    if !(0.0..=1.0).contains(&r) {
        return Err(ALLOWED.to_string());
    }
    c.otlp.trace_sample_ratio = r;
    Ok(())
}

/// `name=value,name=value`: header names are tokens, values visible ASCII and spaces.
fn set_otlp_headers(c: &mut Config, v: &str) -> Result<(), String> {
    const ALLOWED: &str = "NAME=VALUE pairs separated by commas (names: letters, digits and -; values: visible ASCII and spaces)";
    let mut out = Vec::new();
    for item in comma_list(v) {
        let (name, value) = item.split_once('=').ok_or(ALLOWED)?;
        let (name, value) = (name.trim(), value.trim());
        let name_ok = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        let value_ok = value.len() <= 4096 && value.bytes().all(|b| (0x20..0x7f).contains(&b));
        let reserved = [
            "host",
            "content-length",
            "content-type",
            "connection",
            "transfer-encoding",
        ]
        .iter()
        .any(|r| name.eq_ignore_ascii_case(r));
        if !name_ok || !value_ok || reserved {
            return Err(ALLOWED.to_string());
        }
        out.push((name.to_string(), value.to_string()));
    }
    c.otlp.headers = out;
    Ok(())
}

fn instance_id(v: &str) -> Result<String, String> {
    if v.len() > 256 || !v.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return Err("at most 256 visible ASCII characters (no spaces)".to_string());
    }
    Ok(v.to_string())
}

fn set_log_level(c: &mut Config, v: &str) -> Result<(), String> {
    c.log_level = v
        .trim()
        .parse()
        .map_err(|_| "one of off, error, warn, info, debug, trace".to_string())?;
    Ok(())
}

/// How far `ock.mmc.http.body_timeout_ms` stays below `ock.mmc.store.alloc_timeout_ms`: the
/// sweep that cuts a stalled body and the store tick that sees a writer's progress each run
/// once a tick, so a stalled writer is cut at most a tick late and seen at most a tick late.
pub(super) const BODY_TIMEOUT_MARGIN_MS: u64 = 2 * crate::limits::TICK_MS;

/// Every key, in the order `config/mmc-meta.conf` documents them: one row each, name,
/// default, how it is read, doc line.
#[rustfmt::skip]
pub static KEYS: &[KeySpec] = &[
    key("ock.mmc.meta_service.metrics_url", "http://127.0.0.1:8000", With(set_listen),
        "Address of the HTTP service (REST API, metrics, data plane). `--listen HOST:PORT` overrides it."),
    key("ock.mmc.meta_service.advertise_address", "", Optional(|c| &mut c.advertise_address, host_port),
        "HOST:PORT under which clients reach this node; reported as leader_address. Empty: unknown."),
    key("ock.mmc.meta.ha.enable", "false", Bool(|c| &mut c.ha.enable),
        "High availability on etcd: metas campaign for leadership with an etcd lease; one leads, the others are standbys that redirect (307) to it. Needs etcd_endpoints and advertise_url."),
    key("ock.mmc.meta.ha.etcd_endpoints", "", With(|c, v| { c.ha.etcd_endpoints = etcd_endpoints(v)?; Ok(()) }),
        "etcd client endpoints, comma-separated (http://HOST:PORT or HOST:PORT; plain HTTP, etcd's v3 JSON gateway), tried in turn."),
    key("ock.mmc.meta.ha.advertise_url", "", Optional(|c| &mut c.ha.advertise_url, advertise_url),
        "The URL clients and local services use to reach this meta (http://HOST:PORT): the leader_address while it leads, and where standbys redirect to."),
    key("ock.mmc.meta.ha.lease_ttl_ms", "5000", U64(|c| &mut c.ha.lease_ttl_ms, 2000, 600_000),
        "The leader's etcd lease TTL (whole seconds, rounded up; at least 2000). A leader that cannot renew it steps down before it expires; a standby takes over within about this long after the leader dies."),
    key("ock.mmc.meta.ha.prefix", "/mmc/", Text(|c| &mut c.ha.prefix, etcd_prefix),
        "etcd key prefix: the election key is PREFIX + leader, /metadata entries live under PREFIX + metadata/."),
    key("ock.mmc.http.max_body_bytes", "64MB", Size(|c| &mut c.http.max_body_bytes, 1, 1 << 40),
        "Largest request body; a larger one is answered 413 without reading it."),
    key("ock.mmc.http.idle_timeout_ms", "60000", U64(|c| &mut c.http.idle_timeout_ms, 100, 86_400_000),
        "An idle keep-alive connection is closed after this many milliseconds."),
    key("ock.mmc.http.header_timeout_ms", "10000", U64(|c| &mut c.http.header_timeout_ms, 100, 3_600_000),
        "A request head (or body) must arrive completely within this many milliseconds of its first byte."),
    key("ock.mmc.http.body_timeout_ms", "auto", With(set_body_timeout),
        "A streamed object body (PUT of 256 KiB or more, read straight into its blob) is answered 408 and closed when no bytes arrive for this many milliseconds (nginx's client_body_timeout). Must stay at least 500 ms below ock.mmc.store.alloc_timeout_ms; auto: 10000, or alloc_timeout_ms - 500 when that is less."),
    key("ock.mmc.http.body_min_rate_bytes_per_sec", "65536", U64(|c| &mut c.http.body_min_rate_bytes_per_sec, 0, 1 << 40),
        "After the first ock.mmc.http.body_timeout_ms a streamed object body must keep an average of at least this many bytes per second, or it is answered 408 and closed (0: no minimum rate)."),
    key("ock.mmc.http.shutdown_timeout_ms", "10000", U64(|c| &mut c.http.shutdown_timeout_ms, 0, 600_000),
        "On SIGTERM/SIGINT, requests in flight get this long to finish before connections are closed."),
    key("ock.mmc.http.max_connections_per_shard", "16384", U64(|c| &mut c.http.max_connections_per_shard, 1, 1_000_000),
        "Open connections one shard accepts; past it new connections are answered 429 and closed."),
    secret("ock.mmc.http.auth_token", "", |c| &mut c.http.auth_token,
        "Bearer token every route but /healthz and /ready requires (env MMC_API_TOKEN). Required off loopback."),
    secret("ock.mmc.http.metrics_token", "", |c| &mut c.http.metrics_token,
        "Separate bearer token for /metrics* (env MMC_METRICS_TOKEN), so scrapers never hold the data token. Required off loopback."),
    key("ock.mmc.http.max_inflight_per_shard", "1024", U64(|c| &mut c.http.max_inflight_per_shard, 1, 1_000_000),
        "Requests one shard may be working on at once (waiting for other shards or the SSD); past it: 429."),
    key("ock.mmc.http.max_buffered_bytes_per_shard", "512MB", Size(|c| &mut c.http.max_buffered_bytes_per_shard, 1 << 20, 1 << 40),
        "Read-buffer memory one shard's connections may hold for requests still arriving (bodies are buffered, except large object puts, which stream); past it: 429. At least max_body_bytes."),
    key("ock.mmc.http.same_host_socket", "auto", Text(|c| &mut c.http.same_host_socket, same_host_socket),
        "The Unix socket of the same-host data path (docs/same-host.md): clients of this host running as the server's user send requests there and the server copies object bytes straight between their memory and the segments. auto: $XDG_RUNTIME_DIR/mmc-server/PORT.sock, else /tmp/mmc-server-UID/PORT.sock (a directory of mode 0700); off: none; or an absolute path."),
    key("ock.mmc.http.same_host_spin_us", "300", U64(|c| &mut c.http.same_host_spin_us, 0, 100_000),
        "Microseconds a same-host connection polls for its client's next request before it sleeps (one connection per shard at a time): a client sending requests one after another then finds the shard awake. 0: sleep at once."),
    key("ock.mmc.metadata.max_value_bytes", "1MB", Size(|c| &mut c.metadata.max_value_bytes, 1, 1 << 32),
        "Largest value PUT /metadata accepts (413 beyond)."),
    key("ock.mmc.metadata.max_total_bytes", "256MB", Size(|c| &mut c.metadata.max_total_bytes, 1024, 1 << 44),
        "Memory all /metadata keys and values may use together; a PUT past it fails with `Metadata store full`."),
    key("ock.mmc.shard.inbox_capacity", "4096", U64(|c| &mut c.shard.inbox_capacity, 16, 1 << 20),
        "Requests from other shards one shard queues; past it the sender answers 429."),
    key("ock.mmc.shard.max_outstanding", "4096", U64(|c| &mut c.shard.max_outstanding, 16, 1 << 20),
        "Requests one shard may have waiting on other shards at once; past it it answers 429."),
    key("ock.mmc.shard.idle_spin_us", "0", U64(|c| &mut c.shard.idle_spin_us, 0, 1000),
        "Microseconds a shard waiting for another shard's reply polls before it parks (0: park at once)."),
    key("ock.mmc.io.ring_entries", "1024", U64(|c| &mut c.shard.ring_entries, 256, 32768),
        "io_uring submission queue entries per shard (rounded up to a power of two; halved down to 256 when memlock is short)."),
    key("ock.mmc.embedded.ranks", "1", U64(|c| &mut c.store.ranks, 0, 1024),
        "Ranks this process provides segments for (each rank gets its own DRAM, HBM and SSD segments); 0: a pure meta service whose memory is all on local services (mmc-server --role local)."),
    key("ock.mmc.meta_service_url", "", With(|c, v| { c.cluster.meta_urls = comma_list(v).map(meta_url).collect::<Result<_, _>>()?; Ok(()) }),
        "Local service (--role local): the meta service to join, http://host:port (https:// for one listening with TLS: see ock.mmc.cluster.tls.*); a comma-separated list is tried in order."),
    key("ock.mmc.local_service.rank", "", With(set_local_rank),
        "Local service: the rank to join as; empty: the meta service assigns the lowest free one (a restarted service with the same rank or URL gets its rank back)."),
    key("ock.mmc.local_service.advertise_url", "", Optional(|c| &mut c.cluster.local_advertise_url, meta_url),
        "Local service: the URL clients are redirected to for its bytes, http://host:port; empty: the listen address, https:// when it listens with TLS."),
    key("ock.mmc.cluster.heartbeat_interval_ms", "500", U64(|c| &mut c.cluster.heartbeat_interval_ms, 10, 60_000),
        "How often a local service reports to its meta service."),
    key("ock.mmc.cluster.heartbeat_timeout_ms", "3000", U64(|c| &mut c.cluster.heartbeat_timeout_ms, 20, 600_000),
        "A rank with no report for this long is lost: its segments are dropped, objects with no copy elsewhere removed."),
    secret("ock.mmc.cluster.token", "", |c| &mut c.cluster.token,
        "Shared secret of a meta service and its local services (env MMC_CLUSTER_TOKEN); required when either listens off loopback. A join with another secret is refused."),
    key("ock.mmc.cluster.grant_ttl_ms", "10000", U64(|c| &mut c.cluster.grant_ttl_ms, 100, 3_600_000),
        "How long a grant in a redirect to a local service stays valid (a read's also ends with its lease; a write's at most ock.mmc.store.alloc_timeout_ms - 500, so the allocation outlives it)."),
    key("ock.mmc.cluster.rereplicate.concurrency", "4", U64(|c| &mut c.cluster.rereplicate_concurrency, 0, 1024),
        "Meta service, re-replication: an object left on fewer ranks than its put's replicas (a rank lost, left or restarted, a damaged copy dropped, an unmount) gets a new copy on a rank holding none, in the background; this many copies in flight per shard at most. 0: no re-replication."),
    key("ock.mmc.cluster.rereplicate.bytes_per_sec", "128MB", Size(|c| &mut c.cluster.rereplicate_bytes_per_sec, 0, 1 << 40),
        "Meta service, re-replication: bytes copied per second at most, for the whole process (each shard an equal share; a copy's bytes pass through the meta service); 0: no cap."),
    key("ock.mmc.cluster.rereplicate.queue", "65536", U64(|c| &mut c.cluster.rereplicate_queue, 1, 1 << 24),
        "Meta service, re-replication: objects one shard queues for a new copy; one more is counted (memcache_rereplicate_overflow_total) and stays below its replicas until rewritten or queued again by another lost copy."),
    key("ock.mmc.cluster.tls.ca.path", "", Text(|c| &mut c.cluster.tls.ca_path, trimmed),
        "PEM CA certificate(s) an https:// peer's server certificate must chain to (the meta service a local service joins; a local service the meta calls); empty: ock.mmc.metrics.tls.ca.path."),
    key("ock.mmc.cluster.tls.cert.path", "", Text(|c| &mut c.cluster.tls.cert_path, trimmed),
        "PEM client certificate chain presented to https:// peers (they require one); empty: ock.mmc.metrics.tls.cert.path, this service's own server certificate."),
    key("ock.mmc.cluster.tls.key.path", "", Text(|c| &mut c.cluster.tls.key_path, trimmed),
        "PEM private key of ock.mmc.cluster.tls.cert.path; empty: ock.mmc.metrics.tls.key.path."),
    key("ock.mmc.local_service.dram.size", "1GB", Size(|c| &mut c.store.dram_bytes, 0, MAX_SEGMENT_BYTES),
        "DRAM segment size per rank (host memory, committed only as it is used); 0: no DRAM segment."),
    key("ock.mmc.local_service.hbm.size", "1GB", Size(|c| &mut c.store.hbm_bytes, 0, MAX_SEGMENT_BYTES),
        "HBM segment size per rank (accelerator memory; emulated in host memory by default); 0: no HBM segment."),
    key("ock.mmc.ssd.enable", "false", Bool(|c| &mut c.store.ssd_enable),
        "Enable the SSD tier: evicted DRAM blobs are flushed to files and rewarmed on read."),
    key("ock.mmc.ssd.path", "", With(|c, v| { c.store.ssd_dirs = comma_list(v).map(str::to_string).collect(); Ok(()) }),
        "Directories for SSD segment files, comma-separated (rank r uses directory r mod count). Required with the SSD tier."),
    key("ock.mmc.ssd.size", "4GB", Size(|c| &mut c.store.ssd_bytes, PAGE_BYTES, MAX_SEGMENT_BYTES),
        "SSD segment size per rank (a sparse file)."),
    key("ock.mmc.ssd.recover", "true", Bool(|c| &mut c.store.ssd_recover),
        "Keep each SSD file's index in a journal beside it (mmc-rank-<r>.ssd.journal: one small append per flush and per removal of a flushed blob, written by a thread of its own) and, at start, take back every blob it lists whose bytes are in the file: listed, counted, readable at once, announced as KV BlockStored (SSD), each read back in the background and dropped if its checksum fails. A local service does so only with ock.mmc.local_service.rank set, and hands what it recovered to its meta. false: the SSD files start empty and keep no journal."),
    key("ock.mmc.lease_ms", "2000", U64(|c| &mut c.store.lease_ms, 0, 3_600_000),
        "Read lease: a read blob cannot be evicted or freed for this long."),
    key("ock.mmc.store.alloc_timeout_ms", "30000", U64(|c| &mut c.store.alloc_timeout_ms, 100, 86_400_000),
        "An allocation whose writer neither commits nor writes for this long is reclaimed: the writer's grant is revoked, and its blobs are freed once the writer lets go of them."),
    key("ock.mmc.segment.run_bytes", "16MB", Size(|c| &mut c.store.run_bytes, PAGE_BYTES, 1 << 32),
        "Size of the runs shards take from a segment to place small blobs in (capped at a quarter of a shard's share)."),
    key("ock.mmc.numa.enable", "false", With(|c, v| { c.shard.numa = super::NumaMode::parse(v)?; Ok(()) }),
        "Group shards by the NUMA node of their CPU (true, false, or auto: only with two or more nodes); the start-up log shows the grouping. Each DRAM segment is then cut into one part per node (in proportion to the node's shards), each part bound to its node with mbind; a shard takes its runs from its node's part, prefault commits each part from its node's CPUs, HBM blobs demoted into a part are copied by that node's mover threads, and /metrics shows bytes per node. On a one-node machine a no-op (logged)."),
    key("ock.mmc.numa.policy", "preferred", With(|c, v| { c.shard.numa_policy = super::MemPolicy::parse(v)?; Ok(()) }),
        "How a node's part of a DRAM segment is bound to its node under NUMA placement: preferred (MPOL_PREFERRED: the node's memory while it has some, another node's after that) or bind (MPOL_BIND: that node only; a node out of memory then brings the kernel's OOM handling onto this process)."),
    key("ock.mmc.segment.prefault", "false", Bool(|c| &mut c.store.prefault),
        "Commit the pages of DRAM and (emulated) HBM segments when they are mounted, on a background thread, instead of at their first write: RSS grows to the segments' size at start, and no request pays for first-touch page faults; such a segment keeps its pages for as long as it is mounted (runs emptied by removals are not handed back to the kernel)."),
    key("ock.mmc.evict_threshold_high", "90", U64(|c| &mut c.evict.high_percent, 1, 100),
        "Percent of a medium's capacity above which an allocation first evicts."),
    key("ock.mmc.evict_threshold_low", "80", U64(|c| &mut c.evict.low_percent, 0, 99),
        "Percent of a medium's capacity eviction brings usage down to (below the high threshold)."),
    key("ock.mmc.metrics.per_rank", "false", Bool(|c| &mut c.metrics.per_rank),
        "Also export per-rank series ({rank=...}) and per-rank /metrics/summary fields."),
    key("ock.mmc.metrics.window_secs", "10", U64(|c| &mut c.metrics.window_secs, 1, 60),
        "Sliding window of the bandwidth metrics; a rank with no traffic in it is stale."),
    key("ock.mmc.event_bus.queue_capacity", "65536", U64(|c| &mut c.metrics.bus_capacity, 16, 1 << 24),
        "Lifecycle events one shard's event bus queues before it drops (and counts) new ones."),
    key("ock.mmc.metrics.tls.enable", "false", Bool(|c| &mut c.tls.enable),
        "Serve HTTPS with required client certificates (mTLS) on the HTTP service."),
    key("ock.mmc.metrics.tls.ca.path", "", Text(|c| &mut c.tls.ca_path, trimmed),
        "PEM CA certificate(s) client certificates must chain to."),
    key("ock.mmc.metrics.tls.cert.path", "", Text(|c| &mut c.tls.cert_path, trimmed),
        "PEM server certificate chain."),
    key("ock.mmc.metrics.tls.key.path", "", Text(|c| &mut c.tls.key_path, trimmed),
        "PEM private key of the server certificate."),
    key("ock.mmc.metrics.tls.crl.path", "", Text(|c| &mut c.tls.crl_path, trimmed),
        "Optional PEM certificate revocation list(s) for client certificates."),
    key("ock.mmc.kv_events.enable", "false", Bool(|c| &mut c.kv_events.enable),
        "Publish KV cache events (vLLM's ZMQ format) for KV-aware routers."),
    key("ock.mmc.kv_events.encoding", "array", With(set_kv_encoding),
        "Wire shape of each msgpack EventBatch, by consumer generation: vllm-0.9 (vLLM 0.9.0-0.10.1: positional, no medium), array or vllm-0.10 (vLLM 0.10.2-0.13, llm-d, Dynamo: positional, tag-first event arrays), vllm-0.14 (vLLM 0.14-0.23: positional, with lora_name), vllm-0.24 (vLLM 0.24-0.33: a positional batch of events tagged by \"type\", by name), sglang (as vllm-0.24 with SGLang's medium names), map or vllm-main (vLLM main: by name throughout)."),
    key("ock.mmc.kv_events.endpoint", "tcp://127.0.0.1:5557", Text(|c| &mut c.kv_events.endpoint, endpoint),
        "ZMQ PUB endpoint the events are published on (tcp://HOST:PORT, ipc://PATH)."),
    key("ock.mmc.kv_events.replay_endpoint", "", Optional(|c| &mut c.kv_events.replay_endpoint, endpoint),
        "ZMQ ROUTER endpoint where late subscribers ask for missed batches; empty: no replay."),
    key("ock.mmc.kv_events.topic", "", Text(|c| &mut c.kv_events.topic, trimmed),
        "Topic frame of every published message (may be empty)."),
    key("ock.mmc.kv_events.queue_capacity", "65536", U64(|c| &mut c.kv_events.queue_capacity, 1, 1 << 26),
        "Soft queue limit: past it new stored events are dropped (counted)."),
    key("ock.mmc.kv_events.hard_capacity", "131072", U64(|c| &mut c.kv_events.hard_capacity, 1, 1 << 27),
        "Hard queue limit: past it removed and cleared events are dropped too (counted)."),
    key("ock.mmc.kv_events.batch_max_events", "256", U64(|c| &mut c.kv_events.batch_max_events, 1, 65536),
        "Most events in one published batch."),
    key("ock.mmc.kv_events.batch_max_delay_ms", "5", U64(|c| &mut c.kv_events.batch_max_delay_ms, 0, 10_000),
        "Longest an event waits for its batch to fill before the batch is sent."),
    key("ock.mmc.kv_events.data_parallel_rank", "0", With(|c, v| { c.kv_events.data_parallel_rank = parse_u64_in(v, 0, 1 << 20)? as i64; Ok(()) }),
        "The data_parallel_rank element of every EventBatch."),
    key("ock.mmc.kv_events.replay_batches", "10000", U64(|c| &mut c.kv_events.replay_batches, 0, 1 << 24),
        "Batches kept for the replay socket."),
    key("ock.mmc.kv_events.key_format", "auto", With(|c, v| { c.kv_events.key_format = std::sync::Arc::new(crate::common::chunk_keys::KeyFormat::parse(v)?); Ok(()) }),
        "How a block's hash is read from an object key: auto (LMCache's CacheEngineKey model@ws@wid@hash@dtype, its legacy fmt@model@ws@wid@hash and multiprocess model@rank@group@hash[@salt] keys, vllm-ascend's pool and layer-wise keys), lmcache, lmcache_legacy, lmcache_mp, vllm_ascend, or a regular expression with a named group hash (hex). A key without a hash publishes no event (counted, the first one logged)."),
    key("ock.mmc.kv_events.block_size", "256", U64(|c| &mut c.kv_events.block_size, 1, 1 << 20),
        "block_size reported in BlockStored events (tokens per chunk; LMCache's default chunk is 256)."),
    key("ock.mmc.otlp.endpoint", "", Optional(|c| &mut c.otlp.endpoint, otlp_endpoint),
        "OpenTelemetry collector to push to over OTLP/HTTP (protobuf): http://HOST:PORT or https://HOST:PORT, optionally with a base path; metrics go to ENDPOINT/v1/metrics, spans to ENDPOINT/v1/traces. https:// verifies the collector with ock.mmc.cluster.tls.ca.path (and presents ock.mmc.cluster.tls.cert.path when set). Empty: no push (off)."),
    key("ock.mmc.otlp.interval_ms", "10000", U64(|c| &mut c.otlp.interval_ms, 100, 3_600_000),
        "How often every /metrics family is pushed (cumulative counters, gauges, histograms with their buckets)."),
    key("ock.mmc.otlp.trace_sample_ratio", "0", With(set_sample_ratio),
        "Spans: the share of requests without a sampled traceparent that get a span, from 0 to 1 (a request whose traceparent is sampled always gets one, an unsampled one never); background work (flush, rewarm) sampled alike, drains and failovers always. 0: no spans at all."),
    KeySpec { name: "ock.mmc.otlp.headers", default: "", secret: true, set: With(set_otlp_headers),
        doc: "Headers sent with every push, NAME=VALUE pairs separated by commas (e.g. authorization=Bearer TOKEN; env MMC_OTLP_HEADERS). A secret: never printed or logged." },
    key("ock.mmc.otlp.service_instance_id", "", Optional(|c| &mut c.otlp.service_instance_id, instance_id),
        "The service.instance.id resource attribute of everything pushed; empty: a random UUID chosen at start (stable for the process)."),
    key("ock.mmc.otlp.timeout_ms", "5000", U64(|c| &mut c.otlp.timeout_ms, 100, 60_000),
        "How long one push may take (connect, send, answer) before it counts as failed and is retried; also the whole last export at a graceful stop (the metrics and the spans still queued), so a collector that is down or hung never holds the stop longer."),
    key("ock.mmc.otlp.queue_spans", "2048", U64(|c| &mut c.otlp.queue_spans, 16, 1 << 20),
        "Finished spans queued for the exporter thread; past it new spans are dropped and counted (memcache_otlp_spans_dropped_total), never waited for."),
    key("ock.mmc.log.level", "info", With(set_log_level),
        "Log level: error, warn, info, debug or trace (RUST_LOG overrides it)."),
];
