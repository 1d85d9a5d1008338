//! Settings of the services around the store, kept here as plain data so the configuration
//! imports none of the layers that use them: mTLS for the HTTP service (the rustls server
//! configuration is built from them in `http::tls`) and the KV-event publisher.

/// `ock.mmc.metrics.tls.*`.
#[derive(Clone, Debug, Default)]
pub struct TlsConfig {
    pub enable: bool,
    pub ca_path: String,
    pub cert_path: String,
    pub key_path: String,
    pub crl_path: String,
}

/// `ock.mmc.kv_events.encoding`: which of vLLM's two wire generations batches are sent in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvEncoding {
    /// Positional (msgspec `array_like`): the batch and every event are arrays, each event
    /// tag first. vLLM up to 0.11, llm-d's indexer and Dynamo decode this form.
    #[default]
    Array,
    /// By name: the batch and every event are maps, each event tagged by `"type"`. Current
    /// vLLM decodes this form.
    Map,
}

impl KvEncoding {
    /// The values `ock.mmc.kv_events.encoding` accepts, as its error names them.
    pub const ALLOWED: &'static str = "one of array, map";

    pub fn parse(v: &str) -> Option<KvEncoding> {
        match v.trim() {
            "array" => Some(KvEncoding::Array),
            "map" => Some(KvEncoding::Map),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvEncoding::Array => "array",
            KvEncoding::Map => "map",
        }
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
}
