//! MemCache Hybrid meta service.
//!
//! A thread-per-core server (one monoio runtime per pinned core) that is the meta service of
//! a tiered KV cache for LLM inference. Components:
//!
//! - [`common`]: the bottom layer: shared vocabulary (media and their names, segment ids, the
//!   store's events) and primitives (memory mappings, the clock) every layer may use.
//! - [`config`]: the upstream `key = value` configuration, every key in one table.
//! - [`cli`]: the `mmc-server` command line → a validated start-up plan.
//! - [`server`]: binds the shared port and runs one shard thread per core.
//! - [`shards`]: key ownership, the state each shard owns, cross-shard messages, runtimes.
//! - [`http`]: the HTTP/1.1 front end on httparse: framing, limits, routes, encoding.
//! - [`metrics`]: per-shard counters summed when read.
//! - [`agent`]: a local service's membership (join, heartbeat, leave).
//! - [`accel`]: accelerator (HBM) memory behind a trait, emulated in host memory by default.
//! - [`grant`]: signed, short-lived permissions for one blob transfer on a local service.
//! - [`ha`]: the one place role, HA state, leader and view version are read from.
//! - [`limits`]: protocol limits with their reasons.

pub mod accel;
pub mod agent;
pub mod cli;
pub mod cluster;
pub mod common;
pub mod config;
pub mod grant;
pub mod ha;
pub mod http;
pub mod kv_events;
pub mod limits;
pub mod metrics;
pub mod numa;
pub mod server;
pub mod shards;
