//! Settings of the services around the store, kept here as plain data so the configuration
//! imports none of the layers that use them: mTLS for the HTTP service (the rustls server
//! configuration is built from them in `http::tls`), the KV-event publisher, HA (the election
//! in `ha`) and NUMA placement (`numa`).

use super::{Config, ConfigError, HostPort, Role};

/// `ock.mmc.metrics.tls.*`.
#[derive(Clone, Debug, Default)]
pub struct TlsConfig {
    pub enable: bool,
    pub ca_path: String,
    pub cert_path: String,
    pub key_path: String,
    pub crl_path: String,
}

/// TLS between the cluster's roles (`ock.mmc.cluster.tls.*`): the files this process's
/// cluster client uses for `https://` peers (a meta service, a local service listening with
/// TLS): the CA a peer's server certificate must chain to, and the client certificate and
/// key it presents (a peer listening with TLS requires one). Each, unset, is the
/// `ock.mmc.metrics.tls.*` file of the same role ([`Config::cluster_tls`]): one CA and one
/// certificate per host serve both directions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterTls {
    pub ca_path: String,
    pub cert_path: String,
    pub key_path: String,
}

/// `ock.mmc.otlp.*`: the push of metrics and spans to an OpenTelemetry collector (OTLP
/// protobuf over HTTP); the exporter in `http::otlp`, the formats in `metrics::otlp`.
#[derive(Clone, Debug, Default)]
pub struct OtlpConfig {
    /// The collector's base URL (`http[s]://host:port[/path]`, no trailing `/`); empty: off.
    pub endpoint: String,
    pub interval_ms: u64,
    /// Root request spans sampled (0: no spans at all; 1: every request).
    pub trace_sample_ratio: f64,
    /// Headers sent with every export (an authorization header): a secret.
    pub headers: Vec<(String, String)>,
    /// `service.instance.id`; empty: a random UUID per process.
    pub service_instance_id: String,
    pub timeout_ms: u64,
    pub queue_spans: u64,
}

/// `ock.mmc.meta.ha.*`.
#[derive(Clone, Debug)]
pub struct HaConfig {
    pub enable: bool,
    pub etcd_endpoints: Vec<HostPort>,
    /// The URL clients and local services use to reach this meta (`http://host:port`, no
    /// trailing slash): the value of the election key while this node leads, and what a
    /// standby redirects to.
    pub advertise_url: String,
    pub lease_ttl_ms: u64,
    /// The etcd key prefix (ends with `/`).
    pub prefix: String,
}

impl HaConfig {
    /// The election key: its value is the leader's advertise URL, its create revision the
    /// `view_version`.
    pub fn election_key(&self) -> Vec<u8> {
        format!("{}leader", self.prefix).into_bytes()
    }

    /// Written by each new leader with its incarnation: a node elected again sees whether
    /// another leader served since its own last leadership.
    pub fn last_leader_key(&self) -> Vec<u8> {
        format!("{}last_leader", self.prefix).into_bytes()
    }

    /// Beside the election key, while KV events are on: the leader's KV-event publisher
    /// (`kv_events::leadership`), written in the same transaction and under the same lease as
    /// the election key, so the two appear and vanish together and share their create
    /// revision (the `view_version`).
    pub fn kv_events_key(&self) -> Vec<u8> {
        format!("{}kv_events", self.prefix).into_bytes()
    }

    /// Where the `/metadata` entry `key` lives in etcd.
    pub fn metadata_key(&self, key: &[u8]) -> Vec<u8> {
        let mut k = self.metadata_prefix();
        k.extend_from_slice(key);
        k
    }

    /// Where a leader records a local service's membership it declared lost:
    /// `<prefix>lost/<rank>/<incarnation>` = `<incarnation> <view> <epoch>`, so a later leader
    /// refuses that service's catalog too. One key per process: a rank's later loss (another
    /// service given the rank since) does not overwrite an earlier process's record
    /// (`ha/losses.rs`).
    pub fn lost_key(&self, rank: u32, incarnation: u64) -> Vec<u8> {
        let mut k = self.lost_prefix();
        k.extend_from_slice(format!("{rank}/{incarnation}").as_bytes());
        k
    }

    pub fn lost_prefix(&self) -> Vec<u8> {
        format!("{}lost/", self.prefix).into_bytes()
    }

    /// Where each leadership records itself before it serves: `<prefix>served/<view_version>`,
    /// so a later leader knows which leaderships a local service's catalog may have missed.
    pub fn served_key(&self, view: u64) -> Vec<u8> {
        let mut k = self.served_prefix();
        k.extend_from_slice(view.to_string().as_bytes());
        k
    }

    pub fn served_prefix(&self) -> Vec<u8> {
        format!("{}served/", self.prefix).into_bytes()
    }

    pub fn metadata_prefix(&self) -> Vec<u8> {
        format!("{}metadata/", self.prefix).into_bytes()
    }

    /// The lease TTL asked of etcd: whole seconds (etcd's unit), rounded up.
    pub fn lease_ttl_secs(&self) -> u64 {
        self.lease_ttl_ms.div_ceil(1000)
    }
}

impl Config {
    /// The files the cluster client uses for `https://` peers, each key falling back to its
    /// `ock.mmc.metrics.tls.*` counterpart; `None` without a CA (no `https://` peer then).
    pub fn cluster_tls(&self) -> Option<ClusterTls> {
        let pick = |own: &str, server: &str| if own.is_empty() { server } else { own }.to_string();
        let own = &self.cluster.tls;
        let tls = ClusterTls {
            ca_path: pick(&own.ca_path, &self.tls.ca_path),
            cert_path: pick(&own.cert_path, &self.tls.cert_path),
            key_path: pick(&own.key_path, &self.tls.key_path),
        };
        (!tls.ca_path.is_empty()).then_some(tls)
    }

    /// An `https://` meta service needs a CA to verify it; a certificate goes with its key;
    /// a local service listening with TLS advertises an `https://` URL.
    pub(super) fn validate_cluster_tls(&self) -> Result<(), ConfigError> {
        let conflict = |m: String| Err(ConfigError::Conflict(m));
        let https_meta = self
            .cluster
            .meta_urls
            .iter()
            .find(|u| u.starts_with("https://"));
        if self.cluster.role == Role::Local
            && let Some(u) = https_meta
            && self.cluster_tls().is_none()
        {
            return conflict(format!(
                "ock.mmc.meta_service_url {u} is https:// but no CA is set to verify it: set ock.mmc.cluster.tls.ca.path (or ock.mmc.metrics.tls.ca.path)"
            ));
        }
        if let Some(t) = self.cluster_tls()
            && t.cert_path.is_empty() != t.key_path.is_empty()
        {
            return conflict(
                "ock.mmc.cluster.tls.cert.path and ock.mmc.cluster.tls.key.path go together: set both or neither".to_string(),
            );
        }
        let advertised = &self.cluster.local_advertise_url;
        if self.tls.enable && advertised.starts_with("http://") {
            return conflict(format!(
                "ock.mmc.local_service.advertise_url {advertised} is http:// but this service listens with TLS (ock.mmc.metrics.tls.enable): advertise https://"
            ));
        }
        Ok(())
    }

    /// An `https://` collector needs a CA to verify it (the cluster client's).
    pub(super) fn validate_otlp(&self) -> Result<(), ConfigError> {
        if self.otlp.endpoint.starts_with("https://") && self.cluster_tls().is_none() {
            return Err(ConfigError::Conflict(format!(
                "ock.mmc.otlp.endpoint {} is https:// but no CA is set to verify it: set ock.mmc.cluster.tls.ca.path (or ock.mmc.metrics.tls.ca.path)",
                self.otlp.endpoint
            )));
        }
        Ok(())
    }
}

/// `ock.mmc.kv_events.encoding`: the wire shape of each supported consumer generation (read off
/// each vLLM release's `vllm/distributed/kv_events.py` and SGLang's
/// `sglang/srt/disaggregation/kv_events.py`). A typed decoder of one generation rejects most of
/// the others, so the setting names the consumers' generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvEncoding {
    /// vLLM 0.9.0 – 0.10.1: the batch and every event positional (msgspec `array_like`, the
    /// tag first); `BlockStored` has no `medium` (6 slots), `BlockRemoved` only its hashes.
    Vllm09,
    /// vLLM 0.10.2 – 0.13 (and llm-d's indexer, Dynamo's positional reader): positional, with
    /// `medium` (`BlockStored` 7 slots, `BlockRemoved` 3).
    #[default]
    Array,
    /// vLLM 0.14 – 0.23: positional, `BlockStored` with a required `lora_name` (8 slots).
    Vllm014,
    /// vLLM 0.24 – 0.33: the batch positional, every event a map tagged by `"type"` (its fields
    /// by name, `lora_name` included).
    Vllm024,
    /// SGLang: vLLM 0.24's shape, with SGLang's medium names (`CPU_PINNED` for DRAM).
    Sglang,
    /// vLLM's main branch (after 0.33): the batch and every event maps, by name.
    Map,
}

impl KvEncoding {
    /// Every value with its aliases, as `ock.mmc.kv_events.encoding` accepts them.
    const VALUES: [(KvEncoding, &'static [&'static str]); 6] = [
        (KvEncoding::Vllm09, &["vllm-0.9"]),
        (KvEncoding::Array, &["array", "vllm-0.10"]),
        (KvEncoding::Vllm014, &["vllm-0.14"]),
        (KvEncoding::Vllm024, &["vllm-0.24"]),
        (KvEncoding::Sglang, &["sglang"]),
        (KvEncoding::Map, &["map", "vllm-main"]),
    ];

    /// The values `ock.mmc.kv_events.encoding` accepts, as its error names them.
    pub const ALLOWED: &'static str =
        "one of vllm-0.9, array (vllm-0.10), vllm-0.14, vllm-0.24, sglang, map (vllm-main)";

    pub fn parse(v: &str) -> Option<KvEncoding> {
        let v = v.trim();
        Self::VALUES
            .iter()
            .find(|(_, names)| names.contains(&v))
            .map(|(e, _)| *e)
    }

    /// The canonical name (the first of its names).
    pub fn name(self) -> &'static str {
        Self::VALUES
            .iter()
            .find(|(e, _)| *e == self)
            .map_or("array", |(_, names)| names[0])
    }
}

/// `ock.mmc.kv_events.*`.
#[derive(Clone, Debug)]
pub struct KvEventsConfig {
    pub enable: bool,
    pub encoding: KvEncoding,
    pub endpoint: String,
    pub replay_endpoint: String,
    pub topic: String,
    pub queue_capacity: u64,
    pub hard_capacity: u64,
    pub batch_max_events: u64,
    pub batch_max_delay_ms: u64,
    pub data_parallel_rank: i64,
    pub replay_batches: u64,
    pub block_size: u64,
    /// `ock.mmc.kv_events.key_format`: how an object key's chunk hash is read.
    pub key_format: std::sync::Arc<crate::common::chunk_keys::KeyFormat>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_tls_falls_back_to_the_server_files_and_is_checked() {
        let mut c = Config::defaults();
        assert_eq!(c.cluster_tls(), None, "no CA: no https:// peer");
        c.set("ock.mmc.metrics.tls.ca.path", "/pki/ca.pem").unwrap();
        c.set("ock.mmc.metrics.tls.cert.path", "/pki/node.pem")
            .unwrap();
        c.set("ock.mmc.metrics.tls.key.path", "/pki/node.key")
            .unwrap();
        c.set("ock.mmc.cluster.tls.ca.path", "/pki/cluster-ca.pem")
            .unwrap();
        let t = c.cluster_tls().unwrap();
        assert_eq!(
            (
                t.ca_path.as_str(),
                t.cert_path.as_str(),
                t.key_path.as_str()
            ),
            ("/pki/cluster-ca.pem", "/pki/node.pem", "/pki/node.key")
        );
        c.validate().unwrap();
        c.set("ock.mmc.cluster.tls.cert.path", "/pki/client.pem")
            .unwrap();
        c.set("ock.mmc.metrics.tls.key.path", "").unwrap();
        assert!(c.validate().is_err(), "a certificate without its key");

        let mut local = Config::defaults();
        local.cluster.role = Role::Local;
        local
            .set("ock.mmc.meta_service_url", "https://10.0.0.1:8000/")
            .unwrap();
        assert_eq!(local.cluster.meta_urls, ["https://10.0.0.1:8000"]);
        let e = local.validate().unwrap_err().to_string();
        assert!(e.contains("ock.mmc.cluster.tls.ca.path"), "{e}");
        local
            .set("ock.mmc.cluster.tls.ca.path", "/pki/ca.pem")
            .unwrap();
        local.validate().unwrap();
        assert!(local.set("ock.mmc.meta_service_url", "ftp://a:1").is_err());

        let mut tls = Config::defaults();
        for (k, v) in [
            ("ock.mmc.metrics.tls.enable", "true"),
            ("ock.mmc.metrics.tls.ca.path", "/pki/ca.pem"),
            ("ock.mmc.metrics.tls.cert.path", "/pki/node.pem"),
            ("ock.mmc.metrics.tls.key.path", "/pki/node.key"),
            (
                "ock.mmc.local_service.advertise_url",
                "http://10.0.0.2:9000",
            ),
        ] {
            tls.set(k, v).unwrap();
        }
        assert!(
            tls.validate().is_err(),
            "TLS listener advertised as http://"
        );
        tls.set(
            "ock.mmc.local_service.advertise_url",
            "https://10.0.0.2:9000",
        )
        .unwrap();
        tls.validate().unwrap();
    }
}

/// `ock.mmc.numa.enable`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumaMode {
    /// Never place by node.
    Off,
    /// Place by node; on a one-node machine a no-op (logged).
    On,
    /// Place by node when the machine has more than one node with CPUs.
    Auto,
}

impl NumaMode {
    pub fn parse(s: &str) -> Result<NumaMode, &'static str> {
        match s.trim().to_ascii_lowercase().as_str() {
            "false" | "0" | "no" | "off" => Ok(NumaMode::Off),
            "true" | "1" | "yes" | "on" => Ok(NumaMode::On),
            "auto" => Ok(NumaMode::Auto),
            _ => Err("true, false or auto"),
        }
    }
}

/// `ock.mmc.numa.policy`: the memory policy a node's part of a segment gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemPolicy {
    /// `MPOL_PREFERRED`: pages come from the node while it has free memory, from another node
    /// after that. The default: a cache that runs one node short is slower, not killed.
    Preferred,
    /// `MPOL_BIND`: pages come from the node only; when it has none left the kernel's OOM
    /// handling applies to this process.
    Bind,
}

impl MemPolicy {
    pub fn parse(s: &str) -> Result<MemPolicy, &'static str> {
        match s.trim().to_ascii_lowercase().as_str() {
            "preferred" | "prefer" => Ok(MemPolicy::Preferred),
            "bind" => Ok(MemPolicy::Bind),
            _ => Err("preferred or bind"),
        }
    }

    /// The kernel's mode number (`MPOL_PREFERRED` = 1, `MPOL_BIND` = 2).
    pub fn mode(self) -> libc::c_long {
        match self {
            MemPolicy::Preferred => 1,
            MemPolicy::Bind => 2,
        }
    }

    /// As `/proc/<pid>/numa_maps` writes it (`prefer:0`, `bind:0`).
    pub fn numa_maps_word(self) -> &'static str {
        match self {
            MemPolicy::Preferred => "prefer",
            MemPolicy::Bind => "bind",
        }
    }
}

#[cfg(test)]
mod otlp_tests {
    use super::super::{Config, KEYS, REDACTED};

    #[test]
    fn otlp_keys_read_validate_and_redact() {
        let mut c = Config::defaults();
        assert!(c.otlp.endpoint.is_empty(), "off by default");
        assert_eq!(
            (c.otlp.interval_ms, c.otlp.trace_sample_ratio),
            (10_000, 0.0)
        );
        c.set("ock.mmc.otlp.endpoint", " http://collector:4318/ ")
            .unwrap();
        assert_eq!(c.otlp.endpoint, "http://collector:4318");
        c.set("ock.mmc.otlp.endpoint", "http://127.0.0.1:4318/otlp")
            .unwrap();
        assert_eq!(c.otlp.endpoint, "http://127.0.0.1:4318/otlp");
        for bad in [
            "collector:4318",
            "ftp://c:1",
            "http://c",
            "http://u:p@c:1",
            "http://c:1/?q",
        ] {
            assert!(c.set("ock.mmc.otlp.endpoint", bad).is_err(), "{bad}");
        }
        c.set("ock.mmc.otlp.trace_sample_ratio", "0.25").unwrap();
        assert_eq!(c.otlp.trace_sample_ratio, 0.25);
        for bad in ["-0.1", "1.5", "half", "NaN"] {
            assert!(
                c.set("ock.mmc.otlp.trace_sample_ratio", bad).is_err(),
                "{bad}"
            );
        }
        c.set(
            "ock.mmc.otlp.headers",
            "authorization=Bearer abc def, x-tenant = t1",
        )
        .unwrap();
        assert_eq!(
            c.otlp.headers,
            [
                ("authorization".to_string(), "Bearer abc def".to_string()),
                ("x-tenant".to_string(), "t1".to_string())
            ]
        );
        // A secret: its value is in no error and no printed configuration.
        let e = c
            .set("ock.mmc.otlp.headers", "authorization: Bearer leaked")
            .unwrap_err();
        assert!(!e.to_string().contains("leaked"), "{e}");
        assert!(c.set("ock.mmc.otlp.headers", "host=x").is_err());
        assert!(
            KEYS.iter()
                .any(|k| k.name == "ock.mmc.otlp.headers" && k.secret)
        );
        let text = c.render();
        assert!(
            text.contains(&format!("ock.mmc.otlp.headers = {REDACTED}\n")),
            "{text}"
        );
        assert!(!text.contains("abc def"));
        c.validate().unwrap();
        // https needs a CA to verify the collector with.
        c.set("ock.mmc.otlp.endpoint", "https://collector:4318")
            .unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("ock.mmc.cluster.tls.ca.path"), "{e}");
        c.set("ock.mmc.cluster.tls.ca.path", "/etc/mmc/ca.pem")
            .unwrap();
        c.validate().unwrap();
        assert!(c.set("ock.mmc.otlp.service_instance_id", "a b").is_err());
        c.set("ock.mmc.otlp.service_instance_id", "meta-1").unwrap();
        assert_eq!(c.otlp.service_instance_id, "meta-1");
    }
}
