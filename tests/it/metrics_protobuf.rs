//! Issue 34: `/metrics` in the Prometheus protobuf exposition, chosen by the scraper's
//! `Accept` header. The answer is read back with this file's own message definitions
//! (prost, from the public `io.prometheus.client` definition) and compared with the text
//! exposition of the same server: the same families in the same order, the same series and
//! values; the request-duration histograms carry native histograms whose buckets add up to
//! their counts. And a real Prometheus with native histograms enabled ingests one.

use std::collections::HashMap;

use prost::Message;

use crate::harness::{Client, Driver, ServerBuilder};
use crate::observability::Prometheus;
use crate::store::{data, get_bytes, put_ok};

/// What Prometheus (2.x, native histograms enabled) sends.
const PROMETHEUS_ACCEPT: &str = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
const PROTOBUF_TYPE: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";

#[derive(Clone, PartialEq, Message)]
struct MetricFamily {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "2")]
    help: Option<String>,
    #[prost(enumeration = "MetricType", optional, tag = "3")]
    r#type: Option<i32>,
    #[prost(message, repeated, tag = "4")]
    metric: Vec<Metric>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
enum MetricType {
    Counter = 0,
    Gauge = 1,
    Summary = 2,
    Untyped = 3,
    Histogram = 4,
    GaugeHistogram = 5,
}

#[derive(Clone, PartialEq, Message)]
struct LabelPair {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "2")]
    value: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct Value {
    #[prost(double, optional, tag = "1")]
    value: Option<f64>,
}

#[derive(Clone, PartialEq, Message)]
struct Metric {
    #[prost(message, repeated, tag = "1")]
    label: Vec<LabelPair>,
    #[prost(message, optional, tag = "2")]
    gauge: Option<Value>,
    #[prost(message, optional, tag = "3")]
    counter: Option<Value>,
    #[prost(message, optional, tag = "7")]
    histogram: Option<Histogram>,
}

#[derive(Clone, PartialEq, Message)]
struct Histogram {
    #[prost(uint64, optional, tag = "1")]
    sample_count: Option<u64>,
    #[prost(double, optional, tag = "2")]
    sample_sum: Option<f64>,
    #[prost(message, repeated, tag = "3")]
    bucket: Vec<Bucket>,
    #[prost(sint32, optional, tag = "5")]
    schema: Option<i32>,
    #[prost(double, optional, tag = "6")]
    zero_threshold: Option<f64>,
    #[prost(uint64, optional, tag = "7")]
    zero_count: Option<u64>,
    #[prost(message, repeated, tag = "12")]
    positive_span: Vec<BucketSpan>,
    #[prost(sint64, repeated, packed = "false", tag = "13")]
    positive_delta: Vec<i64>,
}

#[derive(Clone, PartialEq, Message)]
struct Bucket {
    #[prost(uint64, optional, tag = "1")]
    cumulative_count: Option<u64>,
    #[prost(double, optional, tag = "2")]
    upper_bound: Option<f64>,
}

#[derive(Clone, PartialEq, Message)]
struct BucketSpan {
    #[prost(sint32, optional, tag = "1")]
    offset: Option<i32>,
    #[prost(uint32, optional, tag = "2")]
    length: Option<u32>,
}

/// The delimited messages of a protobuf answer.
fn decode(mut body: &[u8]) -> Vec<MetricFamily> {
    let mut out = Vec::new();
    while !body.is_empty() {
        out.push(MetricFamily::decode_length_delimited(&mut body).expect("a MetricFamily"));
    }
    out
}

/// `name{k="v",…}` as the text format writes a series (labels in their order).
fn series(name: &str, labels: &[LabelPair]) -> String {
    if labels.is_empty() {
        return name.to_string();
    }
    let l: Vec<String> = labels
        .iter()
        .map(|p| {
            let v = p.value().replace('\\', "\\\\").replace('"', "\\\"");
            format!("{}=\"{}\"", p.name(), v.replace('\n', "\\n"))
        })
        .collect();
    format!("{name}{{{}}}", l.join(","))
}

/// The text exposition's families (in order, with their type) and samples.
fn text_exposition(text: &str) -> (Vec<(String, String)>, HashMap<String, f64>) {
    let mut families = Vec::new();
    let mut samples = HashMap::new();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let (name, kind) = t.split_once(' ').unwrap();
            families.push((name.to_string(), kind.to_string()));
        } else if !line.starts_with('#') && !line.is_empty() {
            let (s, v) = line.rsplit_once(' ').unwrap();
            samples.insert(s.to_string(), v.parse::<f64>().unwrap());
        }
    }
    (families, samples)
}

/// A native histogram's bucket counts (from its deltas) by key.
fn native_buckets(h: &Histogram) -> Vec<(i32, u64)> {
    let mut out = Vec::new();
    let (mut key, mut count, mut d) = (0i32, 0i64, h.positive_delta.iter());
    for (i, span) in h.positive_span.iter().enumerate() {
        key = if i == 0 {
            span.offset()
        } else {
            key + span.offset()
        };
        for _ in 0..span.length() {
            count += d.next().expect("a delta per bucket");
            assert!(count >= 0, "a bucket count below 0");
            out.push((key, count as u64));
            key += 1;
        }
    }
    assert!(d.next().is_none(), "as many deltas as buckets");
    out
}

fn busy(c: &mut Client) {
    for i in 0..30u64 {
        put_ok(c, &format!("p{i}"), &data(1000 + i as usize, i), "");
        get_bytes(c, &format!("p{i}"));
    }
    c.get("/api/v1/objects/exist?key=p1");
    c.get("/health");
}

#[test]
fn metrics_protobuf_is_the_text_exposition_with_native_histograms() {
    let srv = ServerBuilder::new(Driver::Uring)
        .shards(2)
        .set("ock.mmc.metrics.per_rank", "true")
        .start();
    let mut c = srv.client();
    busy(&mut c);
    let r = c.request_with("GET", "/metrics", &[("Accept", PROMETHEUS_ACCEPT)], None);
    assert_eq!(r.status, 200);
    assert_eq!(r.content_type(), PROTOBUF_TYPE);
    let families = decode(&r.body);
    // The text right after: only what a scrape itself changes may differ.
    let text = c.get("/metrics");
    assert_eq!(text.content_type(), "text/plain; version=0.0.4");
    let (text_families, samples) = text_exposition(&text.text());
    let names: Vec<(String, String)> = families
        .iter()
        .map(|f| {
            let kind = match f.r#type() {
                MetricType::Counter => "counter",
                MetricType::Gauge => "gauge",
                MetricType::Histogram => "histogram",
                t => panic!("{} has type {t:?}", f.name()),
            };
            (f.name().to_string(), kind.to_string())
        })
        .collect();
    assert_eq!(names, text_families, "the same families in the same order");
    // The OTLP exporter's own families too, last (compared with the text's below).
    let otlp: Vec<&str> = names
        .iter()
        .map(|(n, _)| n.as_str())
        .skip_while(|n| !n.starts_with("memcache_otlp_"))
        .collect();
    assert_eq!(
        otlp,
        [
            "memcache_otlp_enabled",
            "memcache_otlp_exports_total",
            "memcache_otlp_export_failures_total",
            "memcache_otlp_spans_exported_total",
            "memcache_otlp_metric_points_exported_total",
            "memcache_otlp_spans_dropped_total",
            "memcache_otlp_metric_pushes_dropped_total",
            "memcache_otlp_span_queue_length",
            "memcache_otlp_span_queue_capacity",
        ]
    );
    let moving = |name: &str| {
        name.starts_with("process_")
            || name.starts_with("memcache_http_")
            || name == "memcache_uptime_seconds"
            || name.starts_with("lmcache_mp_event_bus_")
    };
    let mut histograms = 0;
    for f in &families {
        assert!(!f.help().is_empty(), "{} has its HELP", f.name());
        for m in &f.metric {
            if let Some(h) = &m.histogram {
                histograms += 1;
                let s = series(f.name(), &m.label);
                let count = h.sample_count();
                let cumulative: Vec<u64> = h.bucket.iter().map(|b| b.cumulative_count()).collect();
                assert!(cumulative.windows(2).all(|w| w[0] <= w[1]), "{s}");
                assert!(cumulative.last().copied().unwrap_or(0) <= count, "{s}");
                assert!(
                    h.bucket.iter().all(|b| b.upper_bound().is_finite()),
                    "{s}: +Inf is implied"
                );
                if f.name() == "memcache_http_request_duration_seconds" {
                    assert_eq!(h.bucket.len(), 19, "{s}: the classic buckets are kept");
                    assert_eq!(h.schema, Some(3), "{s}");
                    assert_eq!(h.zero_threshold(), 2f64.powi(-30), "{s}");
                    let native = native_buckets(h);
                    let total: u64 = native.iter().map(|b| b.1).sum::<u64>() + h.zero_count();
                    assert_eq!(total, count, "{s}: the native buckets hold every request");
                    if m.label[0].value() == "put" {
                        assert!(count >= 30 && !native.is_empty(), "{s}: {count}");
                        // 30 puts on loopback: between 1 µs and 1 s.
                        assert!(
                            native.iter().all(|&(k, _)| (-160..=0).contains(&k)),
                            "{native:?}"
                        );
                        assert!(h.sample_sum() > 0.0);
                    }
                    continue;
                }
                assert_eq!(h.schema, None, "{s}: no native histogram");
                if !moving(f.name()) {
                    let le = |b: &Bucket| {
                        let mut labels = m.label.clone();
                        labels.push(LabelPair {
                            name: Some("le".into()),
                            value: Some(format!("{}", b.upper_bound())),
                        });
                        series(&format!("{}_bucket", f.name()), &labels)
                    };
                    for b in &h.bucket {
                        assert_eq!(samples.get(&le(b)), Some(&(b.cumulative_count() as f64)));
                    }
                }
                continue;
            }
            let v = match (&m.counter, &m.gauge) {
                (Some(c), None) => c.value(),
                (None, Some(g)) => g.value(),
                _ => panic!("{}: one value per metric", f.name()),
            };
            let s = series(f.name(), &m.label);
            let text = *samples
                .get(&s)
                .unwrap_or_else(|| panic!("{s} is not in the text"));
            if !moving(f.name()) {
                assert_eq!(v, text, "{s}");
            }
        }
    }
    assert_eq!(
        histograms,
        18 + 4,
        "request durations per operation, and LMCache's"
    );
    // Every text series is in the protobuf answer (histograms as _bucket/_sum/_count).
    let proto_series: usize = families
        .iter()
        .flat_map(|f| &f.metric)
        .map(|m| m.histogram.as_ref().map_or(1, |h| h.bucket.len() + 3))
        .sum();
    assert_eq!(proto_series, samples.len());
    // No Accept header, or one that prefers text: text.
    for accept in [
        None,
        Some("text/plain;version=0.0.4"),
        Some(
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.2,text/plain;q=0.5",
        ),
        Some("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily"),
    ] {
        let headers: Vec<(&str, &str)> = accept.iter().map(|a| ("Accept", *a)).collect();
        let r = c.request_with("GET", "/metrics", &headers, None);
        assert_eq!(r.content_type(), "text/plain; version=0.0.4", "{accept:?}");
    }
}

/// A real Prometheus (Debian's `prometheus`, installed by scripts/test.sh) with native
/// histograms enabled scrapes the server and stores the request durations as native
/// histograms: its query API answers `histogram_count` of the series with the requests the
/// server answered, and the series itself as a `histogram` (not as `_bucket` series).
#[test]
fn metrics_protobuf_a_real_prometheus_ingests_native_histograms() {
    let srv = ServerBuilder::new(Driver::Epoll).start();
    let mut c = srv.client();
    busy(&mut c);
    let prom = Prometheus::start(
        "prometheus-native",
        srv.addr,
        &["--enable-feature=native-histograms"],
    );
    let query =
        "/api/v1/query?query=memcache_http_request_duration_seconds%7Boperation%3D%22put%22%7D";
    let found = prom.first_result(query, 60);
    drop(prom);
    let series = found.expect("Prometheus never ingested the request-duration histogram");
    // A native histogram is one series with a histogram value (classic ones would be
    // _bucket series and no value of the bare name).
    let h = &series["histogram"][1];
    assert!(h.is_object(), "not a native histogram: {series}");
    let count: f64 = h["count"].as_str().unwrap().parse().unwrap();
    assert!(count >= 30.0, "{series}");
    let buckets = h["buckets"].as_array().expect("native buckets");
    assert!(!buckets.is_empty(), "{series}");
    // Each bucket: [boundary rule, lower, upper, count]; schema 3 buckets are 2^(1/8) wide.
    for b in buckets {
        let lower: f64 = b[1].as_str().unwrap().parse().unwrap();
        let upper: f64 = b[2].as_str().unwrap().parse().unwrap();
        assert!((upper / lower - 2f64.powf(0.125)).abs() < 1e-9, "{b}");
    }
}
