//! Configuration: the upstream `key = value` file format, `--set` overrides, validation.
//!
//! Every key the server reads is one row of [`KEYS`]: its name, its default (as text, read
//! the same way as user input, so a default can never be invalid), how its value is read
//! (`keys::Set`: a bounded number or size, a bool, text, or its own function), and one line
//! of documentation. `config/mmc-meta.conf` is generated from this table
//! (`mmc-server --print-default-config`) and a test keeps the two identical.

mod keys;
mod services;
pub mod values;

use std::fmt;
use std::path::Path;

use keys::BODY_TIMEOUT_MARGIN_MS;
pub use keys::{KEYS, KeySpec, REDACTED};
pub use services::{
    ClusterTls, HaConfig, KvEncoding, KvEventsConfig, MemPolicy, NumaMode, OtlpConfig, TlsConfig,
};
pub use values::HostPort;

use crate::common::segment::{MAX_SEGMENT_BYTES, PAGE_BYTES};
use values::{parse_bool, parse_size, parse_u64_in, parse_url};

/// The validated configuration of one server process. Immutable once the server starts.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where the HTTP service listens (from `ock.mmc.meta_service.metrics_url` or `--listen`).
    pub listen: HostPort,
    /// The `metrics_url` scheme was `https`.
    pub url_is_https: bool,
    /// This node's address as other nodes and clients should reach it; reported as
    /// `leader_address` while this node leads. Empty: `unknown`.
    pub advertise_address: String,
    /// `ock.mmc.meta.ha.*`: the election on etcd.
    pub ha: HaConfig,
    pub http: HttpConfig,
    pub metadata: MetadataConfig,
    pub shard: ShardConfig,
    pub evict: EvictConfig,
    pub store: StoreKeys,
    pub metrics: MetricsConfig,
    pub kv_events: KvEventsConfig,
    pub otlp: OtlpConfig,
    pub tls: TlsConfig,
    pub log_level: log::LevelFilter,
    pub cluster: ClusterConfig,
    /// The text each key of [`KEYS`] was last set to, in table order (for `--print-config`).
    raw: Vec<String>,
}

/// Which side of a cluster this process is (`mmc-server --role`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The meta service: the index, placement, leases; with `ock.mmc.embedded.ranks` ranks of
    /// its own (0: a pure meta).
    Meta,
    /// A local service: lends this host's memory to a meta service as one rank and serves
    /// its bytes under the meta's grants.
    Local,
}

/// The `ock.mmc.cluster.*` keys and the local service's.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub role: Role,
    /// Meta service URLs a local service tries in order (`ock.mmc.meta_service_url`).
    pub meta_urls: Vec<String>,
    /// The rank a local service asks for; `None`: the meta assigns the lowest free one.
    pub local_rank: Option<u32>,
    /// The URL the meta hands to clients for this local service's bytes; empty: from the
    /// listen address.
    pub local_advertise_url: String,
    pub heartbeat_interval_ms: u64,
    pub heartbeat_timeout_ms: u64,
    /// Shared secret between the meta and its local services (`MMC_CLUSTER_TOKEN`).
    pub token: String,
    /// How long a grant in a redirect stays valid.
    pub grant_ttl_ms: u64,
    /// Re-replication (`ock.mmc.cluster.rereplicate.*`): copies in flight per shard (0: off),
    /// bytes copied per second by the whole process (0: no cap), objects queued per shard.
    pub rereplicate_concurrency: u64,
    pub rereplicate_bytes_per_sec: u64,
    pub rereplicate_queue: u64,
    /// TLS between the roles (`ock.mmc.cluster.tls.*`, as set; empty: the
    /// `ock.mmc.metrics.tls.*` file). [`Config::cluster_tls`] resolves them.
    pub tls: ClusterTls,
}

#[derive(Clone, Debug)]
pub struct HttpConfig {
    pub max_body_bytes: u64,
    pub idle_timeout_ms: u64,
    pub header_timeout_ms: u64,
    /// A streamed body's next bytes are due within this long of the last read; `None`
    /// (`auto`) follows the allocation timeout ([`Config::body_timeout_ms`]).
    pub body_timeout_ms: Option<u64>,
    /// After `body_timeout_ms` of grace a streamed body must average at least this rate
    /// (0: no minimum).
    pub body_min_rate_bytes_per_sec: u64,
    pub shutdown_timeout_ms: u64,
    pub max_connections_per_shard: u64,
    pub auth_token: String,
    pub metrics_token: String,
    pub max_inflight_per_shard: u64,
    pub max_buffered_bytes_per_shard: u64,
    /// `ock.mmc.http.same_host_socket`: `auto`, `off` or the Unix socket's absolute path
    /// (the same-host data path, `http::same_host`).
    pub same_host_socket: String,
    /// `ock.mmc.http.same_host_spin_us`: how long a same-host connection polls for its
    /// client's next request before it sleeps (`http::conn`).
    pub same_host_spin_us: u64,
}

#[derive(Clone, Debug)]
pub struct MetadataConfig {
    pub max_value_bytes: u64,
    pub max_total_bytes: u64,
}

#[derive(Clone, Debug)]
pub struct ShardConfig {
    pub inbox_capacity: u64,
    pub max_outstanding: u64,
    pub idle_spin_us: u64,
    pub ring_entries: u64,
    /// `ock.mmc.numa.enable`: place shards by NUMA node ([`crate::numa`]).
    pub numa: NumaMode,
    /// `ock.mmc.numa.policy`: how a node's part of a DRAM segment is bound to the node.
    pub numa_policy: MemPolicy,
}

/// Observability.
#[derive(Clone, Debug)]
pub struct MetricsConfig {
    pub per_rank: bool,
    pub window_secs: u64,
    pub bus_capacity: u64,
}

/// Segments, ranks, leases and the SSD tier.
#[derive(Clone, Debug)]
pub struct StoreKeys {
    pub ranks: u64,
    pub dram_bytes: u64,
    pub hbm_bytes: u64,
    pub ssd_enable: bool,
    /// SSD directories (rank r uses `ssd_dirs[r % len]`).
    pub ssd_dirs: Vec<String>,
    pub ssd_bytes: u64,
    /// Keep each SSD file's index in a journal beside it and recover its blobs at start.
    pub ssd_recover: bool,
    pub lease_ms: u64,
    pub alloc_timeout_ms: u64,
    pub run_bytes: u64,
    /// Commit memory segments' pages at mount, in the background, instead of at first write.
    pub prefault: bool,
}

#[derive(Clone, Debug)]
pub struct EvictConfig {
    pub high_percent: u64,
    pub low_percent: u64,
}

/// A configuration problem that stops the start. `Display` is the one line the operator sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    Invalid {
        key: String,
        value: String,
        allowed: String,
    },
    Conflict(String),
    File {
        path: String,
        line: usize,
        reason: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Invalid {
                key,
                value,
                allowed,
            } => {
                write!(f, "invalid value {value:?} for {key}: expected {allowed}")
            }
            ConfigError::Conflict(s) => f.write_str(s),
            ConfigError::File { path, line, reason } => {
                if *line == 0 {
                    write!(f, "config file {path}: {reason}")
                } else {
                    write!(f, "config file {path} line {line}: {reason}")
                }
            }
        }
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// The embedded default: every key at its default.
    pub fn defaults() -> Config {
        let mut c = Config {
            listen: HostPort {
                host: String::new(),
                port: 0,
            },
            url_is_https: false,
            advertise_address: String::new(),
            ha: HaConfig {
                enable: false,
                etcd_endpoints: Vec::new(),
                advertise_url: String::new(),
                lease_ttl_ms: 0,
                prefix: String::new(),
            },
            http: HttpConfig {
                max_body_bytes: 0,
                idle_timeout_ms: 0,
                header_timeout_ms: 0,
                body_timeout_ms: None,
                body_min_rate_bytes_per_sec: 0,
                shutdown_timeout_ms: 0,
                max_connections_per_shard: 0,
                auth_token: String::new(),
                metrics_token: String::new(),
                max_inflight_per_shard: 0,
                max_buffered_bytes_per_shard: 0,
                same_host_socket: String::new(),
                same_host_spin_us: 0,
            },
            metadata: MetadataConfig {
                max_value_bytes: 0,
                max_total_bytes: 0,
            },
            shard: ShardConfig {
                inbox_capacity: 0,
                max_outstanding: 0,
                idle_spin_us: 0,
                ring_entries: 0,
                numa: NumaMode::Off,
                numa_policy: MemPolicy::Preferred,
            },
            evict: EvictConfig {
                high_percent: 0,
                low_percent: 0,
            },
            store: StoreKeys {
                ranks: 0,
                dram_bytes: 0,
                hbm_bytes: 0,
                ssd_enable: false,
                ssd_dirs: Vec::new(),
                ssd_bytes: 0,
                ssd_recover: false,
                lease_ms: 0,
                alloc_timeout_ms: 0,
                run_bytes: 0,
                prefault: false,
            },
            cluster: ClusterConfig {
                role: Role::Meta,
                meta_urls: Vec::new(),
                local_rank: None,
                local_advertise_url: String::new(),
                heartbeat_interval_ms: 0,
                heartbeat_timeout_ms: 0,
                token: String::new(),
                grant_ttl_ms: 0,
                rereplicate_concurrency: 0,
                rereplicate_bytes_per_sec: 0,
                rereplicate_queue: 0,
                tls: ClusterTls::default(),
            },
            metrics: MetricsConfig {
                per_rank: false,
                window_secs: 0,
                bus_capacity: 0,
            },
            kv_events: KvEventsConfig {
                enable: false,
                encoding: KvEncoding::Array,
                endpoint: String::new(),
                replay_endpoint: String::new(),
                topic: String::new(),
                queue_capacity: 0,
                hard_capacity: 0,
                batch_max_events: 0,
                batch_max_delay_ms: 0,
                data_parallel_rank: 0,
                replay_batches: 0,
                block_size: 0,
                key_format: Default::default(),
            },
            otlp: OtlpConfig::default(),
            tls: TlsConfig::default(),
            log_level: log::LevelFilter::Info,
            raw: KEYS.iter().map(|k| k.default.to_string()).collect(),
        };
        for k in KEYS {
            k.apply(&mut c, k.default)
                .unwrap_or_else(|e| panic!("default of {} is invalid: {e}", k.name));
        }
        c
    }

    /// Applies one `key = value`. Unknown keys are returned as `Ok(false)` so the caller can
    /// warn about them; they are never fatal (newer config files may carry keys of newer
    /// servers, and upstream files carry keys of other processes).
    pub fn set(&mut self, key: &str, value: &str) -> Result<bool, ConfigError> {
        let Some(i) = KEYS.iter().position(|k| k.name == key) else {
            return Ok(false);
        };
        KEYS[i]
            .apply(self, value)
            .map_err(|allowed| ConfigError::Invalid {
                key: key.to_string(),
                value: if KEYS[i].secret {
                    REDACTED.to_string()
                } else {
                    value.to_string()
                },
                allowed,
            })?;
        self.raw[i] = value.trim().to_string();
        Ok(true)
    }

    /// Checks rules that involve more than one key. Run after all sources are applied.
    /// The streamed-body idle timeout in force: the configured one, or with `auto` 10 s, or
    /// less when the allocation timeout asks for it.
    pub fn body_timeout_ms(&self) -> u64 {
        self.http.body_timeout_ms.unwrap_or_else(|| {
            self.store
                .alloc_timeout_ms
                .saturating_sub(BODY_TIMEOUT_MARGIN_MS)
                .clamp(100, 10_000)
        })
    }

    /// How long a grant stays valid: `ock.mmc.cluster.grant_ttl_ms`, kept below the
    /// allocation timeout so a remote put's allocation always outlives its write grant.
    pub fn grant_ttl_ms(&self) -> u64 {
        self.cluster
            .grant_ttl_ms
            .min(
                self.store
                    .alloc_timeout_ms
                    .saturating_sub(BODY_TIMEOUT_MARGIN_MS),
            )
            .max(1)
    }

    /// How long after a remote put's allocation its writers may still write into its blobs
    /// (on the meta, for a range of an allocation removed or reclaimed before its commit):
    /// the grant's TTL; plus the hosts' clock difference, as a local service checks the
    /// meta's expiry against its own clock; plus the longest a write admitted before the
    /// expiry can still land (a read into the blob posted just before it ends within the
    /// body's idle timeout, a chain's hop within the hop timeout); plus a tick. Only then
    /// does the meta free such a range for another object.
    pub fn remote_writer_ms(&self) -> u64 {
        self.grant_ttl_ms()
            + crate::limits::CLOCK_SKEW_MS
            + self.body_timeout_ms().max(crate::limits::HOP_TIMEOUT_MS)
            + crate::limits::TICK_MS
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.evict.low_percent >= self.evict.high_percent {
            return Err(ConfigError::Conflict(format!(
                "ock.mmc.evict_threshold_low ({}) must be below ock.mmc.evict_threshold_high ({})",
                self.evict.low_percent, self.evict.high_percent
            )));
        }
        if self.http.max_buffered_bytes_per_shard < self.http.max_body_bytes {
            return Err(ConfigError::Conflict(format!(
                "ock.mmc.http.max_buffered_bytes_per_shard ({}) must not be below ock.mmc.http.max_body_bytes ({}): a largest body could never be read",
                self.http.max_buffered_bytes_per_shard, self.http.max_body_bytes
            )));
        }
        if self.tls.enable {
            for (key, v) in [
                ("ock.mmc.metrics.tls.ca.path", &self.tls.ca_path),
                ("ock.mmc.metrics.tls.cert.path", &self.tls.cert_path),
                ("ock.mmc.metrics.tls.key.path", &self.tls.key_path),
            ] {
                if v.is_empty() {
                    return Err(ConfigError::Conflict(format!(
                        "ock.mmc.metrics.tls.enable is true but {key} is empty: set it"
                    )));
                }
            }
        }
        self.validate_cluster_tls()?;
        self.validate_otlp()?;
        let cl = &self.cluster;
        if cl.heartbeat_timeout_ms < 2 * cl.heartbeat_interval_ms {
            return Err(ConfigError::Conflict(format!(
                "ock.mmc.cluster.heartbeat_timeout_ms ({}) must be at least twice ock.mmc.cluster.heartbeat_interval_ms ({}): one late report would declare a rank lost",
                cl.heartbeat_timeout_ms, cl.heartbeat_interval_ms
            )));
        }
        if cl.role == Role::Local {
            if cl.meta_urls.is_empty() {
                return Err(ConfigError::Conflict(
                    "a local service (--role local) needs ock.mmc.meta_service_url: the meta service to join".to_string(),
                ));
            }
            if self.store.dram_bytes == 0 && self.store.hbm_bytes == 0 {
                return Err(ConfigError::Conflict(
                    "a local service lends memory: set ock.mmc.local_service.dram.size or hbm.size above 0".to_string(),
                ));
            }
        }
        if self.kv_events.hard_capacity < self.kv_events.queue_capacity {
            return Err(ConfigError::Conflict(format!(
                "ock.mmc.kv_events.hard_capacity ({}) must not be below ock.mmc.kv_events.queue_capacity ({})",
                self.kv_events.hard_capacity, self.kv_events.queue_capacity
            )));
        }
        if self.store.ssd_enable && self.store.ssd_dirs.is_empty() {
            return Err(ConfigError::Conflict(
                "ock.mmc.ssd.enable is true but ock.mmc.ssd.path is empty: set the SSD directory"
                    .to_string(),
            ));
        }
        // A streamed body's writer that stops is cut by its own body timeout (seen by the sweep
        // within a tick) before the store's tick, which reclaims allocations whose writer made
        // no progress for alloc_timeout_ms (seen within a tick too), would revoke it.
        if self.body_timeout_ms() + BODY_TIMEOUT_MARGIN_MS > self.store.alloc_timeout_ms {
            return Err(ConfigError::Conflict(format!(
                "ock.mmc.http.body_timeout_ms ({}) must be at least {BODY_TIMEOUT_MARGIN_MS} ms below ock.mmc.store.alloc_timeout_ms ({}): an allocation would be reclaimed under a body still being received",
                self.body_timeout_ms(),
                self.store.alloc_timeout_ms
            )));
        }
        if self.ha.enable {
            if self.ha.etcd_endpoints.is_empty() {
                return Err(ConfigError::Conflict(
                    "ock.mmc.meta.ha.enable is true but ock.mmc.meta.ha.etcd_endpoints is empty: set the etcd endpoints".to_string(),
                ));
            }
            if self.ha.advertise_url.is_empty() {
                return Err(ConfigError::Conflict(
                    "ock.mmc.meta.ha.enable is true but ock.mmc.meta.ha.advertise_url is empty: set the URL clients reach this meta at".to_string(),
                ));
            }
        }
        if self.metadata.max_value_bytes > self.http.max_body_bytes {
            return Err(ConfigError::Conflict(format!(
                "ock.mmc.metadata.max_value_bytes ({}) must not exceed ock.mmc.http.max_body_bytes ({})",
                self.metadata.max_value_bytes, self.http.max_body_bytes
            )));
        }
        Ok(())
    }

    /// Applies the lines of a config file. Returns the unknown keys (with line numbers) for the
    /// caller to warn about.
    pub fn apply_file_text(
        &mut self,
        path: &str,
        text: &str,
    ) -> Result<Vec<(usize, String)>, ConfigError> {
        let mut unknown = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line_no = i + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                return Err(ConfigError::File {
                    path: path.to_string(),
                    line: line_no,
                    reason: format!("expected `key = value`, found {line:?}"),
                });
            };
            let k = k.trim();
            if k.is_empty() {
                return Err(ConfigError::File {
                    path: path.to_string(),
                    line: line_no,
                    reason: "empty key".to_string(),
                });
            }
            let known = self
                .set(k, without_comment(v))
                .map_err(|e| ConfigError::File {
                    path: path.to_string(),
                    line: line_no,
                    reason: e.to_string(),
                })?;
            if !known {
                unknown.push((line_no, k.to_string()));
            }
        }
        Ok(unknown)
    }

    pub fn apply_file(&mut self, path: &Path) -> Result<Vec<(usize, String)>, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
            path: shown.clone(),
            line: 0,
            reason: e.to_string(),
        })?;
        self.apply_file_text(&shown, &text)
    }

    /// The effective configuration as a config file (every key with its current value).
    /// The effective configuration as a config file; secrets that are set show as
    /// `<redacted>`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for k in KEYS {
            let v = self.value_of(k.name).unwrap_or("");
            let v = if k.secret && !v.is_empty() {
                REDACTED
            } else {
                v
            };
            out.push_str(&format!("{} = {}\n", k.name, v));
        }
        out
    }

    /// The current value of a key, as it was last set (the default's text when never set).
    pub fn value_of(&self, key: &str) -> Option<&str> {
        let i = KEYS.iter().position(|k| k.name == key)?;
        Some(self.raw[i].as_str())
    }
}

/// A config file line's value without its comment: a `#` after whitespace starts one (so
/// `ock.mmc.numa.enable = true   # or auto` pastes), a `#` inside a word does not (`a#b` is
/// kept whole). Trimmed.
fn without_comment(value: &str) -> &str {
    let b = value.as_bytes();
    let end = (0..b.len())
        .find(|&i| b[i] == b'#' && (i == 0 || b[i - 1].is_ascii_whitespace()))
        .unwrap_or(b.len());
    value[..end].trim()
}

/// The documented default configuration file, `config/mmc-meta.conf`.
pub fn default_config_file() -> String {
    let mut out = String::from(
        "# mmc-meta.conf: every key mmc-server reads, set to its default.\n\
         # Generated by `mmc-server --print-default-config`; a test keeps it in step with the code.\n\
         #\n\
         # Format (upstream mmc-meta.conf style): one `key = value` per line; lines starting with\n\
         # `#` are comments, and so is the rest of a line from a `#` after whitespace\n\
         # (`key = value   # why`; a value keeps a `#` inside a word, as in `a#b`).\n\
         # Sizes take bytes or KB/MB/GB/TB (binary units: 1KB = 1024 bytes).\n\
         # Unknown keys are warned about and ignored. `--set KEY=VALUE` overrides any key.\n",
    );
    for k in KEYS {
        out.push_str(&format!("\n# {}\n{} = {}\n", k.doc, k.name, k.default));
    }
    out
}

/// The keys a local service (`--role local`) reads: its listener and HTTP limits, the meta
/// to join, the memory it lends, the cluster's timing and secret, its shards and logging.
const LOCAL_SERVICE_KEYS: &[&str] = &[
    "ock.mmc.meta_service.metrics_url",
    "ock.mmc.http.",
    "ock.mmc.shard.",
    "ock.mmc.io.",
    "ock.mmc.meta_service_url",
    "ock.mmc.local_service.",
    "ock.mmc.ssd.",
    "ock.mmc.cluster.",
    "ock.mmc.segment.",
    "ock.mmc.numa.",
    "ock.mmc.metrics.window_secs",
    "ock.mmc.metrics.tls.",
    "ock.mmc.otlp.",
    "ock.mmc.log.",
];

/// Keys under [`LOCAL_SERVICE_KEYS`]' prefixes that only a meta service reads.
const META_ONLY_KEYS: &[&str] = &["ock.mmc.cluster.rereplicate."];

/// The documented default configuration of a local service, `config/mmc-local.conf`.
pub fn default_local_config_file() -> String {
    let mut out = String::from(
        "# mmc-local.conf: the keys a local service (mmc-server --role local) reads, set to\n\
         # their defaults. Generated by `mmc-server --role local --print-default-config`; a test\n\
         # keeps it in step with the code. Same format as mmc-meta.conf. Set at least\n\
         # ock.mmc.meta_service_url (and ock.mmc.cluster.token off loopback).\n",
    );
    for k in KEYS
        .iter()
        .filter(|k| LOCAL_SERVICE_KEYS.iter().any(|p| k.name.starts_with(p)))
        .filter(|k| !META_ONLY_KEYS.iter().any(|p| k.name.starts_with(p)))
    {
        out.push_str(&format!("\n# {}\n{} = {}\n", k.doc, k.name, k.default));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_upstream_ones() {
        let c = Config::defaults();
        c.validate().unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:8000");
        assert_eq!(c.http.max_body_bytes, 64 << 20);
        assert_eq!((c.evict.high_percent, c.evict.low_percent), (90, 80));
        assert_eq!(c.kv_events.encoding, KvEncoding::Array);
        let mut c = Config::defaults();
        c.set("ock.mmc.kv_events.encoding", " map ").unwrap();
        assert_eq!(c.kv_events.encoding, KvEncoding::Map);
        for (v, e) in [
            ("vllm-0.9", KvEncoding::Vllm09),
            ("vllm-0.10", KvEncoding::Array),
            ("vllm-0.14", KvEncoding::Vllm014),
            ("vllm-0.24", KvEncoding::Vllm024),
            ("sglang", KvEncoding::Sglang),
            ("vllm-main", KvEncoding::Map),
        ] {
            c.set("ock.mmc.kv_events.encoding", v).unwrap();
            assert_eq!(c.kv_events.encoding, e, "{v}");
            assert_eq!(KvEncoding::parse(e.name()), Some(e));
        }
    }

    #[test]
    fn the_same_host_socket_is_auto_off_or_an_absolute_path_a_header_can_carry() {
        let mut c = Config::defaults();
        for ok in ["auto", "off", " /run/mmc/s.sock "] {
            c.set("ock.mmc.http.same_host_socket", ok).unwrap();
            assert_eq!(c.http.same_host_socket, ok.trim());
        }
        let long = format!("/{}", "a".repeat(100));
        for bad in [
            "s.sock",
            "/run/a\r\nX-Evil: 1",
            "/run/a\u{7f}",
            "/run/\0",
            &long,
        ] {
            assert!(
                c.set("ock.mmc.http.same_host_socket", bad).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn render_shows_what_was_set() {
        let mut c = Config::defaults();
        c.set("ock.mmc.http.idle_timeout_ms", " 5000 ").unwrap();
        let text = c.render();
        assert!(
            text.contains("ock.mmc.http.idle_timeout_ms = 5000\n"),
            "{text}"
        );
        assert!(text.contains("ock.mmc.meta_service.metrics_url = http://127.0.0.1:8000\n"));
        assert_eq!(text.lines().count(), KEYS.len());
    }

    #[test]
    fn file_lines_comments_and_unknown_keys() {
        let mut c = Config::defaults();
        let unknown = c
            .apply_file_text(
                "t.conf",
                "# comment\n\n  ock.mmc.http.max_body_bytes = 2MB  \nock.mmc.other.key = 1\n",
            )
            .unwrap();
        assert_eq!(c.http.max_body_bytes, 2 << 20);
        assert_eq!(unknown, vec![(4, "ock.mmc.other.key".to_string())]);
    }

    /// deploy/README's snippets carry comments after their values: they paste as written.
    #[test]
    fn a_comment_after_a_value_is_a_comment() {
        let mut c = Config::defaults();
        c.apply_file_text(
            "t.conf",
            "ock.mmc.numa.enable = true # or auto\n\
             ock.mmc.http.max_body_bytes = 2MB\t# tab before it\n\
             ock.mmc.http.auth_token = a#b  # the token is a#b\n\
             ock.mmc.meta_service.advertise_address = # nothing\n",
        )
        .unwrap();
        assert_eq!(c.value_of("ock.mmc.numa.enable"), Some("true"));
        assert_eq!(c.http.max_body_bytes, 2 << 20);
        assert_eq!(c.http.auth_token, "a#b");
        assert_eq!(
            c.value_of("ock.mmc.meta_service.advertise_address"),
            Some("")
        );
        // --set takes its value as given: no comment there.
        assert!(c.set("ock.mmc.numa.enable", "true # or auto").is_err());
    }

    #[test]
    fn errors_name_key_value_and_what_is_allowed() {
        let mut c = Config::defaults();
        let e = c.set("ock.mmc.evict_threshold_high", "150").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid value \"150\" for ock.mmc.evict_threshold_high: expected an integer from 1 to 100"
        );
        let e = c.set("ock.mmc.http.max_body_bytes", "lots").unwrap_err();
        assert!(e.to_string().contains("ock.mmc.http.max_body_bytes"), "{e}");
        let e = c.apply_file_text("x.conf", "just words\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "config file x.conf line 1: expected `key = value`, found \"just words\""
        );
        // A bad value in a file names the file and the line, as a syntax error does.
        let e = c
            .apply_file_text("x.conf", "# c\nock.mmc.evict_threshold_high = 150\n")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "config file x.conf line 2: invalid value \"150\" for ock.mmc.evict_threshold_high: expected an integer from 1 to 100"
        );
        let e = c.set("ock.mmc.kv_events.encoding", "json").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid value \"json\" for ock.mmc.kv_events.encoding: expected one of vllm-0.9, \
             array (vllm-0.10), vllm-0.14, vllm-0.24, sglang, map (vllm-main)"
        );
        c.set("ock.mmc.evict_threshold_low", "95").unwrap();
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("must be below")
        );
    }

    #[test]
    fn body_timeout_must_end_a_writer_before_its_allocation_is_reclaimed() {
        let mut c = Config::defaults();
        c.validate().unwrap();
        assert_eq!(c.body_timeout_ms(), 10_000);
        // `auto` follows a short allocation timeout.
        c.set("ock.mmc.store.alloc_timeout_ms", "3000").unwrap();
        c.validate().unwrap();
        assert_eq!(c.body_timeout_ms(), 2500);
        c.set("ock.mmc.store.alloc_timeout_ms", "500").unwrap();
        assert!(c.validate().is_err(), "no body timeout fits under 500 ms");
        c.set("ock.mmc.store.alloc_timeout_ms", "3000").unwrap();
        c.set("ock.mmc.http.body_timeout_ms", "2800").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("ock.mmc.http.body_timeout_ms (2800) must be at least 500 ms below ock.mmc.store.alloc_timeout_ms (3000)"),
            "{e}"
        );
        c.set("ock.mmc.http.body_timeout_ms", "2500").unwrap();
        c.validate().unwrap();
        let e = c.set("ock.mmc.http.body_timeout_ms", "soon").unwrap_err();
        assert!(
            e.to_string()
                .ends_with("expected auto or an integer from 100 to 3600000"),
            "{e}"
        );
    }
}
