//! The OTLP exporter's own families (`memcache_otlp_*`), after the others on `/metrics` (in
//! both formats) and pushed with them: what the exporter delivered, failed and dropped, and its
//! span queue (`metrics::otlp::Telemetry`).

use super::writer::{Family, Out, family};
use crate::metrics::otlp::{Cause, Signal, Telemetry};

static ENABLED: Family = family!(
    "memcache_otlp_enabled",
    "1 when OTLP export is on (ock.mmc.otlp.endpoint set)",
    gauge
);
static EXPORTS: Family = family!(
    "memcache_otlp_exports_total",
    "OTLP export requests the collector accepted",
    counter
);
static FAILURES: Family = family!(
    "memcache_otlp_export_failures_total",
    "OTLP export attempts that failed, by cause (each retry counts)",
    counter
);
static SPANS_EXPORTED: Family = family!(
    "memcache_otlp_spans_exported_total",
    "Spans the collector accepted",
    counter
);
static POINTS_EXPORTED: Family = family!(
    "memcache_otlp_metric_points_exported_total",
    "Metric data points the collector accepted",
    counter
);
static SPANS_DROPPED: Family = family!(
    "memcache_otlp_spans_dropped_total",
    "Spans not exported: the queue was full (queue_full) or their batch failed for good (export_failed)",
    counter
);
static PUSHES_DROPPED: Family = family!(
    "memcache_otlp_metric_pushes_dropped_total",
    "Metric pushes not delivered (failed for good, or replaced by the next one while retried)",
    counter
);
static QUEUE_LENGTH: Family = family!(
    "memcache_otlp_span_queue_length",
    "Finished spans waiting for the exporter",
    gauge
);
static QUEUE_CAPACITY: Family = family!(
    "memcache_otlp_span_queue_capacity",
    "Spans the exporter's queue holds (ock.mmc.otlp.queue_spans)",
    gauge
);

pub(super) fn render_otlp(t: &Telemetry, o: &mut Out<'_>) {
    let s = &t.stats;
    let gather = |figures: &mut Vec<u64>| {
        figures.push(u64::from(t.enabled));
        figures.extend(Signal::ALL.map(|sig| s.exports[sig as usize].get()));
        for sig in Signal::ALL {
            figures.extend(Cause::ALL.map(|c| s.failures[sig as usize][c as usize].get()));
        }
        figures.extend([s.spans_exported.get(), s.points_exported.get()]);
        figures.extend([s.spans_dropped_full.get(), s.spans_dropped_failed.get()]);
        figures.extend([
            s.pushes_dropped.get(),
            t.queued() as u64,
            t.capacity() as u64,
        ]);
    };
    let write = |o: &mut Out<'_>, figures: &[u64]| {
        let mut v = figures.iter().copied();
        let mut next = || v.next().expect("a figure");
        o.single(&ENABLED, next());
        o.family(&EXPORTS);
        for sig in Signal::ALL {
            o.int(&[("signal", sig.name())], next());
        }
        o.family(&FAILURES);
        for sig in Signal::ALL {
            for c in Cause::ALL {
                o.int(&[("signal", sig.name()), ("cause", c.name())], next());
            }
        }
        o.single(&SPANS_EXPORTED, next());
        o.single(&POINTS_EXPORTED, next());
        o.family(&SPANS_DROPPED);
        o.int(&[("reason", "queue_full")], next());
        o.int(&[("reason", "export_failed")], next());
        o.single(&PUSHES_DROPPED, next());
        o.single(&QUEUE_LENGTH, next());
        o.single(&QUEUE_CAPACITY, next());
    };
    super::families::block(o, &ENABLED, gather, write);
}
