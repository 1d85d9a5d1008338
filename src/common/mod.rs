//! The bottom layer: vocabulary and primitives every other layer may use. It imports no other
//! module of this crate (a tidy test checks), so nothing here can pull a layer's dependencies
//! into another.
//!
//! - [`medium`]: the storage media and the one table of their names.
//! - [`segment`]: segment ids (`rank-<r>-<medium>`) and the page and segment size bounds.
//! - [`event`]: the store's lifecycle events, which the event bus and the KV-event publisher
//!   read.
//! - [`clock`]: the process clock every layer reads time from, and a shard's cached reading.
//! - [`memory`]: anonymous memory mappings (DRAM segments, emulated device memory).
//! - [`local_event`]: a shard-local notification tasks wait on.
//! - [`fmt`]: number formatting shared by the JSON and Prometheus writers.
//! - [`error_kind`]: the kind of an error answer (`X-MMC-Error-Code`) and its upstream code.
//! - [`chunk_keys`]: the chunk hash inside LMCache's and vllm-ascend's object keys
//!   (`ock.mmc.kv_events.key_format`).
//! - [`affinity`]: the CPUs a thread runs on (`sched_setaffinity`).
//! - [`copy`]: `memcpy` with non-temporal stores for memory nobody reads soon, and clear of
//!   a slow `rep movsb` case.

pub mod affinity;
pub mod chunk_keys;
pub mod clock;
pub mod copy;
pub mod error_kind;
pub mod event;
pub mod fmt;
pub mod local_event;
pub mod medium;
pub mod memory;
pub mod segment;
