//! Families and spans as OTLP requests: counters as monotonic cumulative sums, gauges (and
//! untyped families) as gauges, histograms as cumulative explicit-bucket histograms; each
//! series' labels become its data point's attributes; the process's resource on every request.

use std::collections::BTreeMap;

use prost::Message;

use super::prom::{Family, Kind, Sample, Value};
use super::proto::{self, kv_bool, kv_int, kv_str};
use super::span::{Attr, SpanRecord};

/// The resource every request carries (OpenTelemetry's resource semantic conventions, and
/// this server's role and rank).
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceInfo {
    /// `service.instance.id`: configured, or random per process.
    pub instance_id: String,
    /// `mmc.role`: `meta` or `local`.
    pub role: &'static str,
    /// `mmc.rank`: a local service's rank once it joined; a meta's first embedded rank.
    pub rank: Option<u32>,
}

pub const SERVICE_NAME: &str = "mmc-server";

impl ResourceInfo {
    pub fn resource(&self) -> proto::Resource {
        let mut attributes = vec![
            kv_str("service.name", SERVICE_NAME),
            kv_str("service.instance.id", self.instance_id.as_str()),
            kv_str("service.version", env!("CARGO_PKG_VERSION")),
            kv_str("mmc.role", self.role),
        ];
        if let Some(r) = self.rank {
            attributes.push(kv_int("mmc.rank", i64::from(r)));
        }
        proto::Resource { attributes }
    }
}

fn scope() -> proto::InstrumentationScope {
    proto::InstrumentationScope {
        name: SERVICE_NAME.to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
    }
}

/// The LMCache families under the names and units the observability text gives them
/// (`lmcache_mp.<name>`, unit), by their Prometheus name. The two the text does not name
/// (`*_failed_requests_total`, `event_bus_published_events_total`) follow its pattern.
const LMCACHE_NAMES: &[(&str, &str, &str)] = &[
    (
        "lmcache_mp_active_prefetch_jobs",
        "lmcache_mp.active_prefetch_jobs",
        "",
    ),
    (
        "lmcache_mp_event_bus_drain_lag_seconds",
        "lmcache_mp.event_bus.drain_lag_seconds",
        "",
    ),
    (
        "lmcache_mp_event_bus_dropped_events_total",
        "lmcache_mp.event_bus.dropped_events_total",
        "",
    ),
    (
        "lmcache_mp_event_bus_published_events_total",
        "lmcache_mp.event_bus.published_events_total",
        "",
    ),
    (
        "lmcache_mp_event_bus_queue_depth",
        "lmcache_mp.event_bus.queue_depth",
        "",
    ),
    (
        "lmcache_mp_event_bus_subscriber_exceptions_total",
        "lmcache_mp.event_bus.subscriber_exceptions",
        "",
    ),
    (
        "lmcache_mp_inflight_load_memory_usage_bytes",
        "lmcache_mp.inflight_load_memory_usage_bytes",
        "",
    ),
    (
        "lmcache_mp_l1_chunk_idle_before_evict_seconds",
        "lmcache_mp.l1_chunk_idle_before_evict",
        "s",
    ),
    (
        "lmcache_mp_l1_chunk_lifetime_seconds",
        "lmcache_mp.l1_chunk_lifetime",
        "s",
    ),
    (
        "lmcache_mp_l1_evicted_chunks_total",
        "lmcache_mp.l1_evicted",
        "chunks",
    ),
    (
        "lmcache_mp_l1_memory_usage_bytes",
        "lmcache_mp.l1_memory_usage_bytes",
        "",
    ),
    (
        "lmcache_mp_l1_read_chunks_total",
        "lmcache_mp.l1_read",
        "chunks",
    ),
    ("lmcache_mp_l1_usage_ratio", "lmcache_mp.l1_usage_ratio", ""),
    (
        "lmcache_mp_l1_write_chunks_total",
        "lmcache_mp.l1_write",
        "chunks",
    ),
    (
        "lmcache_mp_l2_evicted_chunks_total",
        "lmcache_mp.l2_evicted_objects",
        "chunks",
    ),
    (
        "lmcache_mp_l2_load_completed_requests_total",
        "lmcache_mp.l2_load_completed",
        "requests",
    ),
    (
        "lmcache_mp_l2_load_failed_requests_total",
        "lmcache_mp.l2_load_failed",
        "requests",
    ),
    (
        "lmcache_mp_l2_load_throughput_GBs",
        "lmcache_mp.l2_load_throughput",
        "GBs",
    ),
    (
        "lmcache_mp_l2_store_completed_requests_total",
        "lmcache_mp.l2_store_completed",
        "requests",
    ),
    (
        "lmcache_mp_l2_store_failed_requests_total",
        "lmcache_mp.l2_store_failed",
        "requests",
    ),
    (
        "lmcache_mp_l2_store_submitted_requests_total",
        "lmcache_mp.l2_store_submitted",
        "requests",
    ),
    (
        "lmcache_mp_l2_store_throughput_GBs",
        "lmcache_mp.l2_store_throughput",
        "GBs",
    ),
    ("lmcache_mp_l2_usage_bytes", "lmcache_mp.l2_usage_bytes", ""),
    (
        "lmcache_mp_num_inflight_l2_loads",
        "lmcache_mp.num_inflight_l2_loads",
        "",
    ),
    (
        "lmcache_mp_num_inflight_l2_stores",
        "lmcache_mp.num_inflight_l2_stores",
        "",
    ),
];

/// A family's OTLP name and unit: the observability text's for the LMCache families (an
/// LMCache family missing from the table: `lmcache_mp.` and the rest, a counter's `_total`
/// dropped), the `/metrics` name otherwise (the contract's `memcache_*` names).
pub fn otel_name(prom: &str, kind: Kind) -> (String, &'static str) {
    if let Some(&(_, name, unit)) = LMCACHE_NAMES.iter().find(|(p, ..)| *p == prom) {
        return (name.to_string(), unit);
    }
    if let Some(rest) = prom.strip_prefix("lmcache_mp_") {
        let rest = match kind {
            Kind::Counter => rest.strip_suffix("_total").unwrap_or(rest),
            _ => rest,
        };
        return (format!("lmcache_mp.{rest}"), "");
    }
    (prom.to_string(), "")
}

/// Whether a family has an entry in the table (tests: every LMCache family the server shows).
pub fn lmcache_named(prom: &str) -> bool {
    LMCACHE_NAMES.iter().any(|(p, ..)| *p == prom)
}

fn attrs(labels: &[(String, String)]) -> Vec<proto::KeyValue> {
    labels
        .iter()
        .filter(|(k, _)| k != "le")
        .map(|(k, v)| kv_str(k, v.as_str()))
        .collect()
}

fn number(s: &Sample, start: u64, now: u64) -> proto::NumberDataPoint {
    use proto::number_data_point::Value as V;
    proto::NumberDataPoint {
        attributes: attrs(&s.labels),
        start_time_unix_nano: start,
        time_unix_nano: now,
        value: Some(match s.value {
            Value::Int(i) => V::AsInt(i),
            Value::Float(f) => V::AsDouble(f),
        }),
    }
}

/// A histogram family's series: per label set (without `le`), its buckets' bounds and
/// cumulative counts, sum and count.
fn histogram_points(f: &Family, start: u64, now: u64) -> Vec<proto::HistogramDataPoint> {
    #[derive(Default)]
    struct Series {
        labels: Vec<(String, String)>,
        buckets: Vec<(f64, u64)>,
        sum: Option<f64>,
        count: Option<u64>,
    }
    let mut series: BTreeMap<Vec<(String, String)>, (usize, Series)> = BTreeMap::new();
    let suffix_of = |name: &str| name[f.name.len()..].to_string();
    for s in &f.samples {
        let key: Vec<(String, String)> = s
            .labels
            .iter()
            .filter(|(k, _)| k != "le")
            .cloned()
            .collect();
        let order = series.len();
        let (_, e) = series.entry(key.clone()).or_insert_with(|| {
            (
                order,
                Series {
                    labels: key,
                    ..Series::default()
                },
            )
        });
        match suffix_of(&s.name).as_str() {
            "_bucket" => {
                let le = s
                    .labels
                    .iter()
                    .find(|(k, _)| k == "le")
                    .map(|(_, v)| v.as_str());
                let bound = match le {
                    Some("+Inf") => f64::INFINITY,
                    Some(v) => match v.parse::<f64>() {
                        Ok(b) => b,
                        Err(_) => continue,
                    },
                    None => continue,
                };
                e.buckets.push((bound, s.value.as_f64().max(0.0) as u64));
            }
            "_sum" => e.sum = Some(s.value.as_f64()),
            "_count" => e.count = Some(s.value.as_f64().max(0.0) as u64),
            _ => {}
        }
    }
    let mut ordered: Vec<(usize, Series)> = series.into_values().collect();
    ordered.sort_by_key(|(i, _)| *i);
    ordered
        .into_iter()
        .map(|(_, mut s)| {
            s.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            if s.buckets.last().is_none_or(|b| b.0 != f64::INFINITY) {
                let total = s
                    .count
                    .unwrap_or_else(|| s.buckets.last().map_or(0, |b| b.1));
                s.buckets.push((f64::INFINITY, total));
            }
            let mut prev = 0;
            let bucket_counts = s
                .buckets
                .iter()
                .map(|&(_, c)| {
                    let n = c.saturating_sub(prev);
                    prev = prev.max(c);
                    n
                })
                .collect();
            let explicit_bounds = s.buckets[..s.buckets.len() - 1]
                .iter()
                .map(|b| b.0)
                .collect();
            proto::HistogramDataPoint {
                attributes: attrs(&s.labels),
                start_time_unix_nano: start,
                time_unix_nano: now,
                count: s.count.unwrap_or(prev),
                sum: s.sum,
                bucket_counts,
                explicit_bounds,
            }
        })
        .collect()
}

/// One family as an OTLP metric; `None` for a family without samples.
pub fn metric(f: &Family, start: u64, now: u64) -> Option<proto::Metric> {
    use proto::metric::Data;
    if f.samples.is_empty() {
        return None;
    }
    let (name, unit) = otel_name(&f.name, f.kind);
    let data = match f.kind {
        Kind::Counter => Data::Sum(proto::Sum {
            data_points: f.samples.iter().map(|s| number(s, start, now)).collect(),
            aggregation_temporality: proto::CUMULATIVE,
            is_monotonic: true,
        }),
        Kind::Gauge | Kind::Untyped => Data::Gauge(proto::Gauge {
            data_points: f.samples.iter().map(|s| number(s, start, now)).collect(),
        }),
        Kind::Histogram => Data::Histogram(proto::Histogram {
            data_points: histogram_points(f, start, now),
            aggregation_temporality: proto::CUMULATIVE,
        }),
    };
    Some(proto::Metric {
        name,
        description: f.help.clone(),
        unit: unit.to_string(),
        data: Some(data),
    })
}

/// The data points of a request (for the exported-points counter).
pub fn points(req: &proto::ExportMetricsServiceRequest) -> u64 {
    use proto::metric::Data;
    req.resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .map(|m| match &m.data {
            Some(Data::Gauge(g)) => g.data_points.len(),
            Some(Data::Sum(s)) => s.data_points.len(),
            Some(Data::Histogram(h)) => h.data_points.len(),
            None => 0,
        } as u64)
        .sum()
}

/// `families` as one `ExportMetricsServiceRequest` (cumulative since `start` ns, read at
/// `now` ns).
pub fn metrics_request(
    res: &ResourceInfo,
    families: &[Family],
    start: u64,
    now: u64,
) -> proto::ExportMetricsServiceRequest {
    proto::ExportMetricsServiceRequest {
        resource_metrics: vec![proto::ResourceMetrics {
            resource: Some(res.resource()),
            scope_metrics: vec![proto::ScopeMetrics {
                scope: Some(scope()),
                metrics: families
                    .iter()
                    .filter_map(|f| metric(f, start, now))
                    .collect(),
            }],
        }],
    }
}

fn span(r: &SpanRecord) -> proto::Span {
    let attributes = r
        .attrs
        .iter()
        .map(|(k, v)| match v {
            Attr::Int(i) => kv_int(k, *i),
            Attr::Bool(b) => kv_bool(k, *b),
            Attr::Static(s) => kv_str(k, *s),
            Attr::Text(s) => kv_str(k, s.as_str()),
        })
        .collect();
    proto::Span {
        trace_id: r.ctx.trace_id.to_vec(),
        span_id: r.ctx.span_id.to_vec(),
        parent_span_id: r.parent.map(|p| p.to_vec()).unwrap_or_default(),
        flags: u32::from(r.ctx.flags),
        name: r.name.to_string(),
        kind: match r.kind {
            super::span::Kind::Server => proto::SPAN_KIND_SERVER,
            super::span::Kind::Internal => proto::SPAN_KIND_INTERNAL,
        },
        start_time_unix_nano: r.start_ns,
        end_time_unix_nano: r.end_ns.max(r.start_ns),
        attributes,
        status: r.error.then(|| proto::Status {
            message: String::new(),
            code: proto::STATUS_CODE_ERROR,
        }),
    }
}

/// `spans` as one `ExportTraceServiceRequest`.
pub fn trace_request(res: &ResourceInfo, spans: &[SpanRecord]) -> proto::ExportTraceServiceRequest {
    proto::ExportTraceServiceRequest {
        resource_spans: vec![proto::ResourceSpans {
            resource: Some(res.resource()),
            scope_spans: vec![proto::ScopeSpans {
                scope: Some(scope()),
                spans: spans.iter().map(span).collect(),
            }],
        }],
    }
}

/// A message's protobuf bytes.
pub fn bytes(m: &impl Message) -> Vec<u8> {
    m.encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::super::prom;
    use super::super::span::{Kind as SpanKind, Sampler, TraceContext};
    use super::*;
    use proto::metric::Data;

    fn res() -> ResourceInfo {
        ResourceInfo {
            instance_id: "i-1".into(),
            role: "meta",
            rank: Some(0),
        }
    }

    const TEXT: &str = "# HELP memcache_a_total Things\n# TYPE memcache_a_total counter\n\
memcache_a_total{op=\"get\"} 12\n\
# HELP lmcache_mp_l1_read_chunks_total Chunks read from L1\n# TYPE lmcache_mp_l1_read_chunks_total counter\n\
lmcache_mp_l1_read_chunks_total 5\n\
# HELP memcache_used_ratio Ratio\n# TYPE memcache_used_ratio gauge\nmemcache_used_ratio 0.5\n\
# HELP memcache_lat_seconds Latency\n# TYPE memcache_lat_seconds histogram\n\
memcache_lat_seconds_bucket{op=\"get\",le=\"0.001\"} 1\n\
memcache_lat_seconds_bucket{op=\"get\",le=\"0.01\"} 3\n\
memcache_lat_seconds_bucket{op=\"get\",le=\"+Inf\"} 4\n\
memcache_lat_seconds_sum{op=\"get\"} 0.5\n\
memcache_lat_seconds_count{op=\"get\"} 4\n\
memcache_lat_seconds_bucket{op=\"put\",le=\"0.001\"} 0\n\
memcache_lat_seconds_bucket{op=\"put\",le=\"0.01\"} 0\n\
memcache_lat_seconds_bucket{op=\"put\",le=\"+Inf\"} 0\n\
memcache_lat_seconds_sum{op=\"put\"} 0\n\
memcache_lat_seconds_count{op=\"put\"} 0\n";

    #[test]
    fn kinds_names_and_points_round_trip() {
        let families = prom::parse(TEXT);
        let req = metrics_request(&res(), &families, 10, 20);
        let back = proto::ExportMetricsServiceRequest::decode(bytes(&req).as_slice()).unwrap();
        assert_eq!(back, req);
        let rm = &back.resource_metrics[0];
        let r = &rm.resource.as_ref().unwrap().attributes;
        assert!(r.contains(&kv_str("service.name", "mmc-server")));
        assert!(r.contains(&kv_str("service.instance.id", "i-1")));
        assert!(r.contains(&kv_int("mmc.rank", 0)));
        let m = &rm.scope_metrics[0].metrics;
        assert_eq!(m.len(), 4);
        let Some(Data::Sum(s)) = &m[0].data else {
            panic!("a sum")
        };
        assert!(s.is_monotonic && s.aggregation_temporality == proto::CUMULATIVE);
        assert_eq!(m[0].name, "memcache_a_total");
        assert_eq!(s.data_points[0].attributes, [kv_str("op", "get")]);
        assert_eq!(
            s.data_points[0].value,
            Some(proto::number_data_point::Value::AsInt(12))
        );
        assert_eq!(
            (
                s.data_points[0].start_time_unix_nano,
                s.data_points[0].time_unix_nano
            ),
            (10, 20)
        );
        assert_eq!(
            (m[1].name.as_str(), m[1].unit.as_str()),
            ("lmcache_mp.l1_read", "chunks")
        );
        assert!(matches!(m[2].data, Some(Data::Gauge(_))));
        let Some(Data::Histogram(h)) = &m[3].data else {
            panic!("a histogram")
        };
        assert_eq!(h.aggregation_temporality, proto::CUMULATIVE);
        assert_eq!(h.data_points.len(), 2);
        let get = &h.data_points[0];
        assert_eq!(get.attributes, [kv_str("op", "get")]);
        assert_eq!(get.explicit_bounds, [0.001, 0.01]);
        assert_eq!(get.bucket_counts, [1, 2, 1]);
        assert_eq!((get.count, get.sum), (4, Some(0.5)));
        assert_eq!(h.data_points[1].bucket_counts, [0, 0, 0]);
        assert_eq!(points(&back), 1 + 1 + 1 + 2);
    }

    #[test]
    fn lmcache_names_follow_the_text() {
        assert_eq!(
            otel_name("lmcache_mp_l2_evicted_chunks_total", Kind::Counter),
            ("lmcache_mp.l2_evicted_objects".to_string(), "chunks")
        );
        assert_eq!(
            otel_name("lmcache_mp_new_thing_total", Kind::Counter).0,
            "lmcache_mp.new_thing"
        );
        assert_eq!(
            otel_name("memcache_x_total", Kind::Counter).0,
            "memcache_x_total"
        );
    }

    #[test]
    fn spans_carry_ids_kind_attributes_and_status() {
        let parent =
            TraceContext::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
                .unwrap();
        let (ctx, p) = Sampler::new(1.0).start(Some(&parent)).unwrap();
        let mut s = SpanRecord::begin(ctx, p, "GET /api/v1/objects", SpanKind::Server);
        s.attr("http.response.status_code", Attr::Int(503));
        s.error = true;
        s.end(std::time::Duration::from_millis(2));
        let req = trace_request(&res(), &[s]);
        let back = proto::ExportTraceServiceRequest::decode(bytes(&req).as_slice()).unwrap();
        let sp = &back.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(sp.trace_id, parent.trace_id);
        assert_eq!(sp.parent_span_id, parent.span_id);
        assert_eq!(sp.kind, proto::SPAN_KIND_SERVER);
        assert_eq!(sp.end_time_unix_nano - sp.start_time_unix_nano, 2_000_000);
        assert_eq!(sp.status.as_ref().unwrap().code, proto::STATUS_CODE_ERROR);
        assert_eq!(sp.attributes, [kv_int("http.response.status_code", 503)]);
    }
}
