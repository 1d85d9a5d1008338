//! The OTLP exporter (`ock.mmc.otlp.*`): one thread of its own with a small monoio runtime
//! (never a shard), pushing to the collector over the cluster's HTTP client (`client.rs`: plain
//! or TLS with the cluster's CA).
//!
//! - Metrics: every `ock.mmc.otlp.interval_ms`, the `/metrics` text is rendered here from the
//!   cluster's per-shard figures (as a scrape does) with the exporter's own families, read back
//!   and sent as one `ExportMetricsServiceRequest` to `<endpoint>/v1/metrics`.
//! - Spans: the shards' finished spans are taken from the bounded queue in batches of up to
//!   512, sent when full or half a second after the first span waited, to `<endpoint>/v1/traces`.
//!
//! A failed push (no connection, no answer within `ock.mmc.otlp.timeout_ms`, TLS refused, or
//! a retryable status: 429, 502, 503, 504) is retried with backoff ([`Backoff`]) up to five
//! attempts; meanwhile spans wait in the queue, and a full queue drops new ones (counted). A
//! metrics push still retried when the next is due is replaced by it (counted): every push is
//! cumulative, so the newer one carries everything. Nothing on a shard ever waits for any of
//! this. Each failure is counted per signal and cause; the first of each cause is logged
//! ([`LogOnce`]), and so is the recovery.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;

use crate::http::client;
use crate::metrics::exposition;
use crate::metrics::otlp::span::unix_nanos;
use crate::metrics::otlp::{
    Backoff, Cause, LogOnce, Signal, SpanRecord, Telemetry, encode, prom, proto,
};
use crate::shards::Cluster;

/// Most spans in one export.
const MAX_BATCH: usize = 512;
/// Longest the first span of a batch waits for the batch to fill.
const BATCH_DELAY: Duration = Duration::from_millis(500);
/// Attempts of one export before it is given up.
const MAX_ATTEMPTS: u32 = 5;
/// How often the exporter looks at its queue and timers.
const TICK: Duration = Duration::from_millis(50);

/// Starts the exporter thread when `ock.mmc.otlp.endpoint` is set.
pub fn start(cluster: Arc<Cluster>) -> std::io::Result<()> {
    if !cluster.telemetry.enabled {
        return Ok(());
    }
    log::info!(
        "OTLP: pushing metrics every {} ms{} to {}",
        cluster.config.otlp.interval_ms,
        if cluster.telemetry.tracing() {
            format!(
                " and spans (sample ratio {})",
                cluster.config.otlp.trace_sample_ratio
            )
        } else {
            String::new()
        },
        cluster.config.otlp.endpoint
    );
    std::thread::Builder::new()
        .name("mmc-otlp".into())
        .spawn(move || {
            let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
                .enable_timer()
                .build()
                .expect("the exporter's runtime starts");
            rt.block_on(run(cluster));
        })?;
    Ok(())
}

/// An export on its way: its body, what it carries (spans or data points), its failed
/// attempts and when the next is due.
struct Pending {
    body: Vec<u8>,
    items: u64,
    failures: u32,
    due: Instant,
}

/// The resource of this process now (a local service's rank comes with its join).
fn resource(cluster: &Cluster) -> encode::ResourceInfo {
    let local = cluster.config.cluster.role == crate::config::Role::Local;
    encode::ResourceInfo {
        instance_id: cluster.telemetry.instance_id.clone(),
        role: if local { "local" } else { "meta" },
        rank: if local {
            cluster.local.rank()
        } else {
            (cluster.config.store.ranks > 0).then_some(0)
        },
    }
}

/// Every `/metrics` family, read now, as an export body and its data points.
fn metrics_body(cluster: &Cluster) -> (Vec<u8>, u64) {
    let mut text = Vec::with_capacity(64 << 10);
    let format = exposition::Format::Text;
    exposition::render_metrics_as(cluster, Some(&cluster.telemetry), format, &mut text);
    let families = prom::parse(&String::from_utf8_lossy(&text));
    let t = &cluster.telemetry;
    let req = encode::metrics_request(&resource(cluster), &families, t.start_unix_ns, unix_nanos());
    (encode::bytes(&req), encode::points(&req))
}

/// The collector's base (`http[s]://host:port`) and the path before `/v1/...`.
fn split_endpoint(endpoint: &str) -> (&str, &str) {
    let after = endpoint.find("://").map_or(0, |i| i + 3);
    match endpoint[after..].find('/') {
        Some(i) => endpoint.split_at(after + i),
        None => (endpoint, ""),
    }
}

/// How an attempt failed: the cause, what to log, whether a retry may succeed.
struct Failure {
    cause: Cause,
    detail: String,
    retry: bool,
}

/// One attempt; `Ok` with what the collector rejected of it (partial success).
async fn send(
    cluster: &Cluster,
    signal: Signal,
    body: &[u8],
    headers: &[(&str, &str)],
) -> Result<i64, Failure> {
    let o = &cluster.config.otlp;
    let (base, prefix) = split_endpoint(&o.endpoint);
    let target = format!("{prefix}{}", signal.path());
    let timeout = Duration::from_millis(o.timeout_ms);
    let call = client::request_with(base, "POST", &target, None, headers, body.to_vec(), timeout);
    match call.await {
        Ok(a) if (200..300).contains(&a.status) => Ok(rejected(signal, &a.body)),
        Ok(a) => Err(Failure {
            cause: Cause::Status,
            detail: format!("POST {base}{target}: HTTP {}", a.status),
            // OTLP/HTTP: only these are worth a retry; another status would answer the same.
            retry: matches!(a.status, 429 | 502 | 503 | 504),
        }),
        Err(e) => Err(Failure {
            cause: if e.contains("no answer within") {
                Cause::Timeout
            } else if e.contains(client::UNTRUSTED) || e.contains("TLS") {
                Cause::Tls
            } else {
                Cause::Unreachable
            },
            detail: e,
            retry: true,
        }),
    }
}

/// What a successful answer says the collector rejected (0 when it says nothing).
fn rejected(signal: Signal, body: &[u8]) -> i64 {
    match signal {
        Signal::Metrics => proto::ExportMetricsServiceResponse::decode(body)
            .ok()
            .and_then(|r| r.partial_success)
            .map_or(0, |p| p.rejected_data_points),
        Signal::Traces => proto::ExportTraceServiceResponse::decode(body)
            .ok()
            .and_then(|r| r.partial_success)
            .map_or(0, |p| p.rejected_spans),
    }
}

async fn run(cluster: Arc<Cluster>) {
    let t: &Telemetry = &cluster.telemetry;
    let o = &cluster.config.otlp;
    let interval = Duration::from_millis(o.interval_ms);
    let mut headers: Vec<(&str, &str)> = vec![("Content-Type", "application/x-protobuf")];
    headers.extend(o.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())));
    // The first push comes soon after the start, then one per interval.
    let mut next_metrics = Instant::now() + interval.min(Duration::from_secs(1));
    let mut pending: [Option<Pending>; 2] = [None, None];
    let mut batch: Vec<SpanRecord> = Vec::new();
    let mut batch_since: Option<Instant> = None;
    let mut log = LogOnce::default();
    loop {
        let now = Instant::now();
        if now >= next_metrics {
            if pending[Signal::Metrics as usize].take().is_some() {
                t.stats.pushes_dropped.inc();
            }
            let (body, items) = metrics_body(&cluster);
            pending[Signal::Metrics as usize] = Some(Pending {
                body,
                items,
                failures: 0,
                due: now,
            });
            next_metrics = (next_metrics + interval).max(now + interval / 2);
        }
        if pending[Signal::Traces as usize].is_none() {
            t.take(MAX_BATCH, &mut batch);
            if !batch.is_empty() {
                let since = *batch_since.get_or_insert(now);
                if batch.len() >= MAX_BATCH || now.duration_since(since) >= BATCH_DELAY {
                    let req = encode::trace_request(&resource(&cluster), &batch);
                    pending[Signal::Traces as usize] = Some(Pending {
                        body: encode::bytes(&req),
                        items: batch.len() as u64,
                        failures: 0,
                        due: now,
                    });
                    batch.clear();
                    batch_since = None;
                }
            }
        }
        for signal in Signal::ALL {
            let slot = &mut pending[signal as usize];
            let Some(p) = slot.as_mut().filter(|p| p.due <= Instant::now()) else {
                continue;
            };
            match send(&cluster, signal, &p.body, &headers).await {
                Ok(rejected) => {
                    t.stats.exports[signal as usize].inc();
                    let accepted = p.items.saturating_sub(rejected.max(0) as u64);
                    match signal {
                        Signal::Metrics => t.stats.points_exported.add(accepted),
                        Signal::Traces => t.stats.spans_exported.add(accepted),
                    }
                    if log.recovered(signal) {
                        log::info!(
                            "OTLP: {} export to {} works again",
                            signal.name(),
                            o.endpoint
                        );
                    }
                    if rejected > 0 {
                        t.stats.failures[signal as usize][Cause::Rejected as usize].inc();
                        if log.first(signal, Cause::Rejected) {
                            log::warn!(
                                "OTLP: the collector at {} rejected {rejected} of {} {} (partial success); further rejections are only counted (memcache_otlp_export_failures_total)",
                                o.endpoint,
                                p.items,
                                if signal == Signal::Metrics {
                                    "data points"
                                } else {
                                    "spans"
                                }
                            );
                        }
                    }
                    *slot = None;
                }
                Err(f) => {
                    t.stats.failures[signal as usize][f.cause as usize].inc();
                    p.failures += 1;
                    let give_up = !f.retry || p.failures >= MAX_ATTEMPTS;
                    if log.first(signal, f.cause) {
                        log::warn!(
                            "OTLP: {} export failed ({}): {}; {}; further failures of this kind are only counted (memcache_otlp_export_failures_total)",
                            signal.name(),
                            f.cause.name(),
                            f.detail,
                            if f.retry {
                                "retrying with backoff"
                            } else {
                                "not retried"
                            }
                        );
                    }
                    if give_up {
                        match signal {
                            Signal::Metrics => t.stats.pushes_dropped.inc(),
                            Signal::Traces => t.stats.spans_dropped_failed.add(p.items),
                        }
                        *slot = None;
                    } else {
                        p.due = Instant::now()
                            + Backoff {
                                failures: p.failures,
                            }
                            .delay();
                    }
                }
            }
        }
        monoio::time::sleep(TICK).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_split_into_base_and_path() {
        assert_eq!(
            split_endpoint("http://127.0.0.1:4318"),
            ("http://127.0.0.1:4318", "")
        );
        assert_eq!(
            split_endpoint("https://otel.example:443/otlp"),
            ("https://otel.example:443", "/otlp")
        );
    }
}
