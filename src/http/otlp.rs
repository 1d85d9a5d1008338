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
//!
//! At a graceful stop, once the shards are gone, [`Exporter::flush`] has the thread push the
//! metrics a last time and send the spans still queued, one attempt each, all within
//! `ock.mmc.otlp.timeout_ms`: a collector that is down or hung never holds the stop longer.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use prost::Message;

use crate::http::client;
use crate::metrics::exposition;
use crate::metrics::otlp::span::unix_nanos;
use crate::metrics::otlp::{
    Backoff, Cause, LogOnce, Signal, SpanRecord, Telemetry, encode, prom, proto,
};
use crate::shards::Shared;

/// Most spans in one export.
const MAX_BATCH: usize = 512;
/// Longest the first span of a batch waits for the batch to fill.
const BATCH_DELAY: Duration = Duration::from_millis(500);
/// Attempts of one export before it is given up.
const MAX_ATTEMPTS: u32 = 5;
/// How often the exporter looks at its queue and timers.
const TICK: Duration = Duration::from_millis(50);

/// The running exporter thread, told to flush and end at shutdown.
pub struct Exporter {
    /// The flush's deadline, sent once.
    flush: mpsc::Sender<Instant>,
    /// Told when the flush ended (the thread then ends).
    done: mpsc::Receiver<()>,
    thread: std::thread::JoinHandle<()>,
    timeout: Duration,
}

impl Exporter {
    /// At shutdown, after the shards are gone: a last metrics push (with every request they
    /// answered) and the spans still queued, within `ock.mmc.otlp.timeout_ms`. Returns by then
    /// whatever the collector does (an export under way when this is called ends within the
    /// same timeout; a quarter of a second more is allowed for the thread to see the call).
    pub fn flush(self) {
        let deadline = Instant::now() + self.timeout;
        if self.flush.send(deadline).is_err() {
            return;
        }
        match self
            .done
            .recv_timeout(self.timeout + Duration::from_millis(250))
        {
            Ok(()) => {
                let _ = self.thread.join();
            }
            Err(_) => log::warn!(
                "OTLP: the last export did not end within {} ms of the stop; not waited for",
                self.timeout.as_millis()
            ),
        }
    }
}

/// Starts the exporter thread when `ock.mmc.otlp.endpoint` is set.
pub fn start(shared: Arc<Shared>) -> std::io::Result<Option<Exporter>> {
    if !shared.exports.telemetry.enabled {
        return Ok(None);
    }
    log::info!(
        "OTLP: pushing metrics every {} ms{} to {}",
        shared.config.otlp.interval_ms,
        if shared.exports.telemetry.tracing() {
            format!(
                " and spans (sample ratio {})",
                shared.config.otlp.trace_sample_ratio
            )
        } else {
            String::new()
        },
        shared.config.otlp.endpoint
    );
    let timeout = Duration::from_millis(shared.config.otlp.timeout_ms);
    let (flush, flush_rx) = mpsc::channel();
    let (done_tx, done) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("mmc-otlp".into())
        .spawn(move || {
            let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
                .enable_timer()
                .build()
                .expect("the exporter's runtime starts");
            rt.block_on(run(shared, flush_rx));
            let _ = done_tx.send(());
        })?;
    Ok(Some(Exporter {
        flush,
        done,
        thread,
        timeout,
    }))
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
fn resource(shared: &Shared) -> encode::ResourceInfo {
    let local = shared.config.cluster.role == crate::config::Role::Local;
    encode::ResourceInfo {
        instance_id: shared.exports.telemetry.instance_id.clone(),
        role: if local { "local" } else { "meta" },
        rank: if local {
            shared.membership.local.rank()
        } else {
            (shared.config.store.ranks > 0).then_some(0)
        },
    }
}

/// Every `/metrics` family, read now, as an export body and its data points.
fn metrics_body(shared: &Shared) -> (Vec<u8>, u64) {
    let mut text = Vec::with_capacity(64 << 10);
    let format = exposition::Format::Text;
    exposition::render_metrics_as(shared, Some(&shared.exports.telemetry), format, &mut text);
    let families = prom::parse(&String::from_utf8_lossy(&text));
    let t = &shared.exports.telemetry;
    let req = encode::metrics_request(&resource(shared), &families, t.start_unix_ns, unix_nanos());
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

/// One attempt, given up after `timeout`; `Ok` with what the collector rejected of it
/// (partial success).
async fn send(
    shared: &Shared,
    signal: Signal,
    body: &[u8],
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Result<i64, Failure> {
    let o = &shared.config.otlp;
    let (base, prefix) = split_endpoint(&o.endpoint);
    let target = format!("{prefix}{}", signal.path());
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

/// Counts an attempt's outcome (exports, items delivered, failures by cause) and logs the
/// first failure of each cause and the recovery; returns the failure.
fn note(
    shared: &Shared,
    log: &mut LogOnce,
    signal: Signal,
    items: u64,
    outcome: Result<i64, Failure>,
) -> Option<Failure> {
    let t = &shared.exports.telemetry;
    let endpoint = &shared.config.otlp.endpoint;
    match outcome {
        Ok(rejected) => {
            t.stats.exports[signal as usize].inc();
            let accepted = items.saturating_sub(rejected.max(0) as u64);
            match signal {
                Signal::Metrics => t.stats.points_exported.add(accepted),
                Signal::Traces => t.stats.spans_exported.add(accepted),
            }
            if log.recovered(signal) {
                log::info!("OTLP: {} export to {endpoint} works again", signal.name());
            }
            if rejected > 0 {
                t.stats.failures[signal as usize][Cause::Rejected as usize].inc();
                if log.first(signal, Cause::Rejected) {
                    log::warn!(
                        "OTLP: the collector at {endpoint} rejected {rejected} of {items} {} (partial success); further rejections are only counted (memcache_otlp_export_failures_total)",
                        if signal == Signal::Metrics {
                            "data points"
                        } else {
                            "spans"
                        }
                    );
                }
            }
            None
        }
        Err(f) => {
            t.stats.failures[signal as usize][f.cause as usize].inc();
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
            Some(f)
        }
    }
}

/// The exporter's state between its passes.
struct State<'a> {
    /// Sent with every export: the content type and `ock.mmc.otlp.headers`.
    headers: Vec<(&'a str, &'a str)>,
    /// An export per [`Signal`] waiting to be sent (or sent again).
    pending: [Option<Pending>; 2],
    /// Spans taken from the queue, waiting for their batch to fill.
    batch: Vec<SpanRecord>,
    log: LogOnce,
}

async fn run(shared: Arc<Shared>, flush: mpsc::Receiver<Instant>) {
    let t: &Telemetry = &shared.exports.telemetry;
    let o = &shared.config.otlp;
    let interval = Duration::from_millis(o.interval_ms);
    let timeout = Duration::from_millis(o.timeout_ms);
    let mut headers: Vec<(&str, &str)> = vec![("Content-Type", "application/x-protobuf")];
    headers.extend(o.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())));
    let mut st = State {
        headers,
        pending: [None, None],
        batch: Vec::new(),
        log: LogOnce::default(),
    };
    // The first push comes soon after the start, then one per interval.
    let mut next_metrics = Instant::now() + interval.min(Duration::from_secs(1));
    let mut batch_since: Option<Instant> = None;
    loop {
        if let Ok(deadline) = flush.try_recv() {
            return last_flush(&shared, &mut st, deadline).await;
        }
        let now = Instant::now();
        if now >= next_metrics {
            if st.pending[Signal::Metrics as usize].take().is_some() {
                t.stats.pushes_dropped.inc();
            }
            let (body, items) = metrics_body(&shared);
            st.pending[Signal::Metrics as usize] = Some(Pending {
                body,
                items,
                failures: 0,
                due: now,
            });
            next_metrics = (next_metrics + interval).max(now + interval / 2);
        }
        if st.pending[Signal::Traces as usize].is_none() {
            t.take(MAX_BATCH, &mut st.batch);
            if !st.batch.is_empty() {
                let since = *batch_since.get_or_insert(now);
                if st.batch.len() >= MAX_BATCH || now.duration_since(since) >= BATCH_DELAY {
                    st.pending[Signal::Traces as usize] = Some(span_export(&shared, &st.batch));
                    st.batch.clear();
                    batch_since = None;
                }
            }
        }
        for signal in Signal::ALL {
            let Some(p) = st.pending[signal as usize]
                .as_ref()
                .filter(|p| p.due <= Instant::now())
            else {
                continue;
            };
            let outcome = send(&shared, signal, &p.body, &st.headers, timeout).await;
            let items = p.items;
            let slot = &mut st.pending[signal as usize];
            match note(&shared, &mut st.log, signal, items, outcome) {
                None => *slot = None,
                Some(f) => {
                    let p = slot.as_mut().expect("the export just sent");
                    p.failures += 1;
                    if !f.retry || p.failures >= MAX_ATTEMPTS {
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

/// A batch of spans as an export.
fn span_export(shared: &Shared, batch: &[SpanRecord]) -> Pending {
    let req = encode::trace_request(&resource(shared), batch);
    Pending {
        body: encode::bytes(&req),
        items: batch.len() as u64,
        failures: 0,
        due: Instant::now(),
    }
}

/// The flush at a graceful stop: the metrics as they are now (a push still retried is
/// replaced by it), then the spans of a retried batch, of the batch filling and the queue, in
/// batches; one attempt each, each given what is left until `deadline`. Spans not sent by then,
/// or after a failed attempt, are dropped (counted; the process is ending).
async fn last_flush(shared: &Shared, st: &mut State<'_>, deadline: Instant) {
    let t = &shared.exports.telemetry;
    let left = || deadline.saturating_duration_since(Instant::now());
    let headers = st.headers.clone();
    let (body, points) = metrics_body(shared);
    if st.pending[Signal::Metrics as usize].take().is_some() {
        t.stats.pushes_dropped.inc();
    }
    let metrics_ok = !left().is_zero() && {
        let outcome = send(shared, Signal::Metrics, &body, &headers, left()).await;
        note(shared, &mut st.log, Signal::Metrics, points, outcome).is_none()
    };
    if !metrics_ok {
        t.stats.pushes_dropped.inc();
    }
    let mut exports: Vec<Pending> = st.pending[Signal::Traces as usize]
        .take()
        .into_iter()
        .collect();
    t.take(usize::MAX, &mut st.batch);
    for chunk in st.batch.chunks(MAX_BATCH) {
        exports.push(span_export(shared, chunk));
    }
    st.batch.clear();
    let (mut sent, mut dropped) = (0, 0);
    for p in exports {
        // After a failure (or past the deadline) the rest is not tried: the collector is
        // down or slow, and the stop does not wait for it.
        if dropped == 0 && !left().is_zero() {
            let outcome = send(shared, Signal::Traces, &p.body, &headers, left()).await;
            if note(shared, &mut st.log, Signal::Traces, p.items, outcome).is_none() {
                sent += p.items;
                continue;
            }
        }
        dropped += p.items;
        t.stats.spans_dropped_failed.add(p.items);
    }
    if metrics_ok && dropped == 0 {
        log::info!("OTLP: last export at the stop: the metrics and {sent} spans");
    } else {
        log::warn!(
            "OTLP: last export at the stop: the metrics {}, {sent} spans sent, {dropped} dropped",
            if metrics_ok { "sent" } else { "not sent" }
        );
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
