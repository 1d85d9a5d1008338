//! The exposition formats: `/metrics` (Prometheus text 0.0.4, or the protobuf exposition
//! with native histograms when the scraper asks for it), `/metrics/summary` (one line of
//! `key=value`), and the ptracer table. Only this module knows these formats.
//!
//! Every figure comes from running counters and gauges summed over the shards, and from the
//! segment table: nothing here walks keys, so a scrape costs the same at 0 and 1 M keys. What
//! never changes between scrapes (HELP and TYPE lines, names with their labels, bucket
//! bounds) is prepared once; a scrape copies it and writes the numbers after it, merges the
//! shards' figures in place (fixed arrays, histograms read where they are) and writes
//! straight into the answer's buffer.
//!
//! - `writer.rs`: the writer of both formats ([`writer::Out`]), families and prepared lines.
//! - `proto.rs`: the protobuf wire format (`metrics.proto` beside it: the messages).
//! - `families.rs`: the contract's families (capacity, business calls, tiers, KV events),
//!   mostly tables.
//! - `server.rs`: the server's own (HTTP front end, HA, request latency histograms, process).
//! - `data_plane.rs`: the client bandwidth and UBS IO families.
//! - `lmcache.rs`: the LMCache-compatible tier and event-bus families.
//! - `numa.rs`: bytes per NUMA node of placed segments.
//! - `otlp.rs`: the OTLP exporter's own families (`memcache_otlp_*`), last.
//! - `summary.rs`: `/metrics/summary`.

mod data_plane;
mod families;
mod lmcache;
mod numa;
mod otlp;
mod proto;
mod server;
mod summary;
#[cfg(test)]
mod tests;
mod writer;

use super::store::MAX_RANKS;
use super::{process, trace};
use crate::common::medium::Medium;
use crate::metrics::otlp::Telemetry;
use crate::metrics::view::{ShardFigures, Source};
pub use summary::render_summary;
use writer::Out;

/// What a scraper is answered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text 0.0.4.
    Text,
    /// Delimited `io.prometheus.client.MetricFamily` messages, with native histograms.
    Protobuf,
}

/// The format a scraper's `Accept` header asks for: the protobuf exposition when it lists
/// `application/vnd.google.protobuf` with `proto=io.prometheus.client.MetricFamily` and
/// `encoding=delimited`, at a quality above 0 and no lower than that of any text it takes
/// (`text/plain`, `text/*`, `*/*`); text otherwise, and without the header.
pub fn negotiate(accept: Option<&[u8]>) -> Format {
    let Some(accept) = accept.and_then(|a| std::str::from_utf8(a).ok()) else {
        return Format::Text;
    };
    let (mut protobuf, mut text) = (0.0f64, 0.0f64);
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let (mut q, mut proto, mut delimited) = (1.0, false, false);
        for p in parts {
            let Some((k, v)) = p.split_once('=') else {
                continue;
            };
            let v = v.trim().trim_matches('"');
            match k.trim().to_ascii_lowercase().as_str() {
                "q" => q = v.parse().unwrap_or(0.0),
                "proto" => proto = v == "io.prometheus.client.MetricFamily",
                "encoding" => delimited = v == "delimited",
                _ => {}
            }
        }
        match media.as_str() {
            "application/vnd.google.protobuf" if proto && delimited => protobuf = protobuf.max(q),
            "text/plain" | "text/*" | "*/*" => text = text.max(q),
            _ => {}
        }
    }
    if protobuf > 0.0 && protobuf >= text {
        Format::Protobuf
    } else {
        Format::Text
    }
}

/// Renders `/metrics` in `format`, appended to `buf`; with `telemetry`, the OTLP exporter's
/// families (`memcache_otlp_*`) after the others.
pub fn render_metrics_as(
    shared: &dyn Source,
    telemetry: Option<&Telemetry>,
    format: Format,
    buf: &mut Vec<u8>,
) {
    let mut o = match format {
        Format::Text => Out::text(buf),
        Format::Protobuf => Out::protobuf(buf),
    };
    render(shared, &process::read(), &mut o);
    if let Some(t) = telemetry {
        otlp::render_otlp(t, &mut o);
    }
    o.finish();
}

/// Renders `/metrics` as text (without the OTLP exporter's families).
pub fn render_metrics(shared: &dyn Source, buf: &mut Vec<u8>) {
    render_metrics_as(shared, None, Format::Text, buf);
}

/// Renders the OTLP exporter's families alone in `format`, appended to `buf`.
pub fn render_otlp(telemetry: &Telemetry, format: Format, buf: &mut Vec<u8>) {
    let mut o = match format {
        Format::Text => Out::text(buf),
        Format::Protobuf => Out::protobuf(buf),
    };
    otlp::render_otlp(telemetry, &mut o);
    o.finish();
}

/// The families in output order.
fn render(shared: &dyn Source, process: &process::Process, o: &mut Out<'_>) {
    let per_rank = per_rank_ranks(shared);
    families::render_capacity(shared, o);
    families::render_business(shared, o, &per_rank);
    families::render_tiers(shared, o, &per_rank);
    families::render_kv_events(shared, o);
    data_plane::render_client(shared, o);
    data_plane::render_ubs_io(shared, o);
    data_plane::render_ssd_recovery(shared, o);
    lmcache::render_tiers_and_bus(shared, o);
    numa::render_numa(shared, o);
    server::render_server(shared, o);
    server::render_request_durations(shared, o);
    server::render_process(process, o);
}

/// Renders the ptracer table (`filter` picks rows), appended to `buf`.
pub fn render_ptracer(
    shared: &dyn Source,
    unix_secs: u64,
    filter: impl Fn(trace::Tp) -> bool,
    buf: &mut Vec<u8>,
) {
    let points = trace::snapshot(shared.shards().map(|s| s.tracer));
    trace::render(&points, &trace::format_time(unix_secs), filter, buf);
}

/// Sums over shards.
fn sum(shared: &dyn Source, f: impl Fn(ShardFigures<'_>) -> u64) -> u64 {
    shared.shards().map(f).sum()
}

/// Sums a gauge over shards (never below 0).
fn sum_i(shared: &dyn Source, f: impl Fn(ShardFigures<'_>) -> i64) -> u64 {
    shared.shards().map(f).sum::<i64>().max(0) as u64
}

/// Ranks with mounted segments, ascending.
fn ranks(shared: &dyn Source) -> Vec<u32> {
    let mut ranks: Vec<u32> = shared.segments().iter().map(|s| s.rank()).collect();
    ranks.sort_unstable();
    ranks.dedup();
    ranks
}

/// Per-rank series are kept for ranks below [`MAX_RANKS`].
fn per_rank_ranks(shared: &dyn Source) -> Vec<u32> {
    if !shared.config().metrics.per_rank {
        return Vec::new();
    }
    ranks(shared)
        .into_iter()
        .filter(|&r| (r as usize) < MAX_RANKS)
        .collect()
}

/// (capacity, used) of a medium.
pub fn medium_usage(shared: &dyn Source, m: Medium) -> (u64, u64) {
    shared
        .segments()
        .iter()
        .filter(|s| s.medium() == m)
        .fold((0, 0), |(c, u), s| (c + s.capacity(), u + s.used_bytes()))
}
