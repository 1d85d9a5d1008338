//! OTLP: the push of every `/metrics` family and of spans to an OpenTelemetry collector
//! (`ock.mmc.otlp.*`), as protobuf over HTTP. This module knows the formats and keeps the
//! state the request path touches; the exporter thread that sends (`http::otlp`) knows HTTP.
//!
//! - `proto.rs`: the OTLP messages (prost), written from the public definitions.
//! - `prom.rs`: the `/metrics` text read back as families: the push carries what a scrape
//!   shows, rendered by the same code from the same per-shard figures, on the exporter thread.
//! - `encode.rs`: families and spans as OTLP requests, the resource, the LMCache names.
//! - `span.rs`: `traceparent`, ids, the sampler, [`SpanRecord`].
//!
//! [`Telemetry`] is what the shards and the exporter share: the sampler, a bounded queue of
//! finished spans (a shard pushes and never waits: a full queue drops the span and counts
//! it), and the exporter's statistics, shown on `/metrics` as `memcache_otlp_*`
//! (`metrics::exposition::otlp` writes them).

pub mod encode;
pub mod prom;
pub mod proto;
pub mod span;

use std::time::Duration;

use crossbeam_queue::ArrayQueue;

use super::Counter;
use crate::config::Config;
pub use span::{Attr, Kind, Sampler, SpanRecord, TraceContext};

/// What is pushed: metrics (`/v1/metrics`) or spans (`/v1/traces`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Metrics = 0,
    Traces = 1,
}

impl Signal {
    pub const ALL: [Signal; 2] = [Signal::Metrics, Signal::Traces];

    pub fn name(self) -> &'static str {
        match self {
            Signal::Metrics => "metrics",
            Signal::Traces => "traces",
        }
    }

    /// The path under the collector's base URL (the OTLP/HTTP default).
    pub fn path(self) -> &'static str {
        match self {
            Signal::Metrics => "/v1/metrics",
            Signal::Traces => "/v1/traces",
        }
    }
}

/// Why an export attempt failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// No connection (refused, reset, no route, name not resolved).
    Unreachable = 0,
    /// No complete answer within `ock.mmc.otlp.timeout_ms`.
    Timeout = 1,
    /// The TLS handshake failed (the collector's certificate is not trusted, or it refused ours).
    Tls = 2,
    /// The collector answered with an error status.
    Status = 3,
    /// The collector accepted the request but rejected part of it (OTLP partial success).
    Rejected = 4,
}

impl Cause {
    pub const ALL: [Cause; 5] = [
        Cause::Unreachable,
        Cause::Timeout,
        Cause::Tls,
        Cause::Status,
        Cause::Rejected,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Cause::Unreachable => "unreachable",
            Cause::Timeout => "timeout",
            Cause::Tls => "tls",
            Cause::Status => "status",
            Cause::Rejected => "rejected",
        }
    }
}

/// The exporter's statistics. The exporter thread writes all of them but
/// `spans_dropped_full`, which whoever finds the queue full adds to (`add_shared`).
#[derive(Default, Debug)]
pub struct OtlpStats {
    /// Export requests the collector accepted, per [`Signal`].
    pub exports: [Counter; 2],
    /// Failed export attempts, per [`Signal`] and [`Cause`].
    pub failures: [[Counter; 5]; 2],
    pub spans_exported: Counter,
    pub points_exported: Counter,
    /// Spans dropped because the queue was full (the collector is slow or down).
    pub spans_dropped_full: Counter,
    /// Spans dropped with a batch whose export failed for good.
    pub spans_dropped_failed: Counter,
    /// Metric pushes given up (failed for good, or replaced by a newer one while retried).
    pub pushes_dropped: Counter,
}

/// What the shards, the background jobs and the exporter share.
pub struct Telemetry {
    /// Pushing at all (`ock.mmc.otlp.endpoint` set).
    pub enabled: bool,
    pub sampler: Sampler,
    queue: ArrayQueue<SpanRecord>,
    pub stats: OtlpStats,
    /// `service.instance.id`: configured, else a random UUID (v4) per process.
    pub instance_id: String,
    /// When the process started (Unix ns): the start of every cumulative series.
    pub start_unix_ns: u64,
}

impl Telemetry {
    pub fn new(config: &Config) -> Telemetry {
        let o = &config.otlp;
        let enabled = !o.endpoint.is_empty();
        Telemetry {
            enabled,
            sampler: if enabled {
                Sampler::new(o.trace_sample_ratio)
            } else {
                Sampler::off()
            },
            queue: ArrayQueue::new(if enabled { o.queue_spans as usize } else { 1 }),
            stats: OtlpStats::default(),
            instance_id: if o.service_instance_id.is_empty() {
                uuid_v4()
            } else {
                o.service_instance_id.clone()
            },
            start_unix_ns: span::unix_nanos(),
        }
    }

    /// Whether any span may be recorded (one load: the request path's check).
    #[inline]
    pub fn tracing(&self) -> bool {
        self.sampler.on()
    }

    /// The context of a new span under `parent`, when it is sampled.
    pub fn start(&self, parent: Option<&TraceContext>) -> Option<(TraceContext, Option<[u8; 8]>)> {
        self.sampler.start(parent)
    }

    /// The context of a span recorded whenever tracing is on ([`Sampler::start_always`]).
    pub fn start_always(
        &self,
        parent: Option<&TraceContext>,
    ) -> Option<(TraceContext, Option<[u8; 8]>)> {
        self.sampler.start_always(parent)
    }

    /// Hands a finished span to the exporter; never waits (a full queue drops it, counted).
    pub fn record(&self, span: SpanRecord) {
        if self.queue.push(span).is_err() {
            self.stats.spans_dropped_full.add_shared(1);
        }
    }

    /// Moves up to `max` queued spans into `into`.
    pub fn take(&self, max: usize, into: &mut Vec<SpanRecord>) {
        while into.len() < max {
            match self.queue.pop() {
                Some(s) => into.push(s),
                None => break,
            }
        }
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Spans the queue holds (0 when export is off).
    pub fn capacity(&self) -> usize {
        if self.enabled {
            self.queue.capacity()
        } else {
            0
        }
    }
}

/// A random UUID (version 4, RFC 9562 layout).
fn uuid_v4() -> String {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&span::random_u64().to_be_bytes());
    b[8..].copy_from_slice(&span::random_u64().to_be_bytes());
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = span::hex(&b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Retries with exponential backoff: 250 ms, doubled per failed attempt up to 8 s, each
/// delay jittered by ±25% so exporters that failed together do not retry together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backoff {
    pub failures: u32,
}

impl Backoff {
    pub const BASE: Duration = Duration::from_millis(250);
    pub const MAX: Duration = Duration::from_secs(8);

    /// The delay before the next attempt, after `failures` failed ones (≥ 1).
    pub fn delay(&self) -> Duration {
        let exp = self.failures.saturating_sub(1).min(16);
        let d = Self::BASE.saturating_mul(1 << exp).min(Self::MAX);
        let jitter = (span::random_u64() % 501) as i64 - 250; // per mille of ±25%
        let ms = d.as_millis() as i64;
        Duration::from_millis((ms + ms * jitter / 1000).max(1) as u64)
    }
}

/// Logs each cause of failure once: the first failure of a cause per signal is logged, later
/// ones only counted, until an export of that signal succeeds again (logged once too), after
/// which a new failure is logged again.
#[derive(Clone, Copy, Debug, Default)]
pub struct LogOnce {
    /// Bit `signal * 8 + cause`: logged since the last success.
    logged: u16,
}

impl LogOnce {
    /// Whether this failure is the first of its cause since the signal last succeeded.
    pub fn first(&mut self, signal: Signal, cause: Cause) -> bool {
        let bit = 1u16 << (signal as u16 * 8 + cause as u16);
        let first = self.logged & bit == 0;
        self.logged |= bit;
        first
    }

    /// An export of `signal` succeeded: whether failures had been logged (say it recovered).
    pub fn recovered(&mut self, signal: Signal) -> bool {
        let mask = 0xffu16 << (signal as u16 * 8);
        let had = self.logged & mask != 0;
        self.logged &= !mask;
        had
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(ratio: &str, queue: &str) -> Telemetry {
        let mut c = Config::defaults();
        c.set("ock.mmc.otlp.endpoint", "http://127.0.0.1:4318")
            .unwrap();
        c.set("ock.mmc.otlp.trace_sample_ratio", ratio).unwrap();
        c.set("ock.mmc.otlp.queue_spans", queue).unwrap();
        Telemetry::new(&c)
    }

    fn span(t: &Telemetry) -> SpanRecord {
        let (ctx, parent) = t.start(None).expect("sampled");
        SpanRecord::begin(ctx, parent, "x", Kind::Internal)
    }

    #[test]
    fn the_queue_is_bounded_and_counts_what_it_drops() {
        let t = on("1", "16");
        for _ in 0..20 {
            t.record(span(&t));
        }
        assert_eq!(t.queued(), 16);
        assert_eq!(t.stats.spans_dropped_full.get(), 4);
        let mut got = Vec::new();
        t.take(10, &mut got);
        assert_eq!((got.len(), t.queued()), (10, 6));
        t.take(100, &mut got);
        assert_eq!((got.len(), t.queued()), (16, 0));
        let mut text = Vec::new();
        crate::metrics::exposition::render_otlp(
            &t,
            crate::metrics::exposition::Format::Text,
            &mut text,
        );
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains("memcache_otlp_spans_dropped_total{reason=\"queue_full\"} 4\n"),
            "{text}"
        );
        assert!(
            text.contains("memcache_otlp_span_queue_capacity 16\n"),
            "{text}"
        );
        // The families parse back as the push reads them.
        let families = prom::parse(&text);
        assert!(
            families
                .iter()
                .all(|f| f.name.starts_with("memcache_otlp_") && !f.samples.is_empty())
        );
    }

    #[test]
    fn off_without_an_endpoint() {
        let t = Telemetry::new(&Config::defaults());
        assert!(!t.enabled && !t.tracing());
        assert!(t.start(None).is_none());
        let mut c = Config::defaults();
        c.set("ock.mmc.otlp.endpoint", "http://127.0.0.1:4318")
            .unwrap();
        let t = Telemetry::new(&c);
        assert!(
            t.enabled && !t.tracing(),
            "metrics only: the ratio defaults to 0"
        );
    }

    #[test]
    fn instance_ids_are_uuids_or_the_configured_one() {
        let t = on("0", "16");
        let id = &t.instance_id;
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert_ne!(*id, on("0", "16").instance_id);
        let mut c = Config::defaults();
        c.set("ock.mmc.otlp.service_instance_id", "meta-a").unwrap();
        assert_eq!(Telemetry::new(&c).instance_id, "meta-a");
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_with_jitter() {
        let ms = |f| Backoff { failures: f }.delay().as_millis();
        for _ in 0..100 {
            assert!((187..=313).contains(&ms(1)));
            assert!((375..=625).contains(&ms(2)));
            assert!((6000..=10_000).contains(&ms(10)));
            assert!((6000..=10_000).contains(&ms(u32::MAX)));
        }
    }

    #[test]
    fn each_cause_is_logged_once_until_recovery() {
        let mut l = LogOnce::default();
        assert!(l.first(Signal::Metrics, Cause::Unreachable));
        assert!(!l.first(Signal::Metrics, Cause::Unreachable));
        assert!(l.first(Signal::Metrics, Cause::Timeout));
        assert!(l.first(Signal::Traces, Cause::Unreachable));
        assert!(l.recovered(Signal::Traces));
        assert!(l.recovered(Signal::Metrics));
        assert!(!l.recovered(Signal::Metrics));
        assert!(l.first(Signal::Metrics, Cause::Unreachable));
    }
}
