//! The exposition formats: `/metrics` (Prometheus text 0.0.4), `/metrics/summary` (one line
//! of `key=value`), and the ptracer table. Only this module knows these formats.
//!
//! Every figure comes from running counters and gauges summed over the shards, and from the
//! segment table: nothing here walks keys, so a scrape costs the same at 0 and 1 M keys.
//!
//! - `writer.rs`: the Prometheus text writer ([`writer::Out`]).
//! - `families.rs`: the contract's families (capacity, business calls, tiers, KV events) and
//!   the server's own (HTTP front end, request latency histograms, process), mostly tables.
//! - `data_plane.rs`: the client bandwidth and UBS IO families.
//! - `lmcache.rs`: the LMCache-compatible tier and event-bus families.
//! - `numa.rs`: bytes per NUMA node of placed segments.
//! - `summary.rs`: `/metrics/summary`.

mod data_plane;
mod families;
mod lmcache;
mod numa;
mod summary;
#[cfg(test)]
mod tests;
mod writer;

use std::collections::BTreeSet;

use super::store::MAX_RANKS;
use super::trace;
use crate::common::medium::Medium;
use crate::metrics::view::{ShardFigures, Source};
pub use summary::render_summary;
use writer::Out;

/// Renders `/metrics`.
pub fn render_metrics(cluster: &dyn Source, buf: &mut Vec<u8>) {
    let mut o = Out { buf };
    let per_rank = per_rank_ranks(cluster);
    families::render_capacity(cluster, &mut o);
    families::render_business(cluster, &mut o, &per_rank);
    families::render_tiers(cluster, &mut o, &per_rank);
    families::render_kv_events(cluster, &mut o);
    data_plane::render_client(cluster, &mut o);
    data_plane::render_ubs_io(cluster, &mut o);
    data_plane::render_ssd_recovery(cluster, &mut o);
    lmcache::render_tiers_and_bus(cluster, &mut o);
    numa::render_numa(cluster, &mut o);
    families::render_server(cluster, &mut o);
    families::render_request_durations(cluster, &mut o);
    families::render_process(&mut o);
}

/// Renders the ptracer table (`filter` picks rows).
pub fn render_ptracer(
    cluster: &dyn Source,
    unix_secs: u64,
    filter: impl Fn(trace::Tp) -> bool,
) -> String {
    let points = trace::snapshot(cluster.shards().map(|s| s.tracer));
    trace::render(&points, &trace::format_time(unix_secs), filter)
}

/// Sums over shards.
fn sum(cluster: &dyn Source, f: impl Fn(ShardFigures<'_>) -> u64) -> u64 {
    cluster.shards().map(f).sum()
}

/// Sums a gauge over shards (never below 0).
fn sum_i(cluster: &dyn Source, f: impl Fn(ShardFigures<'_>) -> i64) -> u64 {
    cluster.shards().map(f).sum::<i64>().max(0) as u64
}

/// Ranks with mounted segments, ascending.
fn ranks(cluster: &dyn Source) -> Vec<u32> {
    let set: BTreeSet<u32> = cluster.segments().iter().map(|s| s.rank()).collect();
    set.into_iter().collect()
}

/// Per-rank series are kept for ranks below [`MAX_RANKS`].
fn per_rank_ranks(cluster: &dyn Source) -> Vec<u32> {
    if !cluster.config().metrics.per_rank {
        return Vec::new();
    }
    ranks(cluster)
        .into_iter()
        .filter(|&r| (r as usize) < MAX_RANKS)
        .collect()
}

/// (capacity, used) of a medium.
pub fn medium_usage(cluster: &dyn Source, m: Medium) -> (u64, u64) {
    cluster
        .segments()
        .iter()
        .filter(|s| s.medium() == m)
        .fold((0, 0), |(c, u), s| (c + s.capacity(), u + s.used_bytes()))
}
