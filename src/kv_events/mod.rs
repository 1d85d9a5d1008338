//! KV cache events in vLLM's wire format (ZMQ PUB, msgpack batches), so KV-aware routers can
//! subscribe to this server unchanged.

pub mod stats;

pub use stats::KvEventStats;
