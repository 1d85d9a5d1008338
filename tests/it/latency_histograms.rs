//! Issue 16: `memcache_http_request_duration_seconds`, a classic histogram per operation,
//! summed over the shards: every operation's series exist from the start, counts follow the
//! requests sent, buckets are cumulative and end with `+Inf` equal to `_count`.

use std::collections::HashMap;

use crate::both_drivers;
use crate::harness::{Client, Driver, ServerBuilder};
use crate::observability::scrape;
use crate::store::{data, put_ok};

both_drivers!(request_latency_histograms_count_every_operation);

const FAMILY: &str = "memcache_http_request_duration_seconds";

const OPERATIONS: [&str; 18] = [
    "put",
    "get",
    "exist",
    "query",
    "remove",
    "remove_all",
    "batch_put",
    "batch_get",
    "batch_exist",
    "batch_query",
    "batch_remove",
    "metadata",
    "get_all_keys",
    "segments",
    "memory",
    "scrape",
    "health",
    "other",
];

const LES: [&str; 20] = [
    "1e-05", "2.5e-05", "5e-05", "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01",
    "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf",
];

/// One operation's histogram from a scrape: cumulative bucket values in `LES` order, sum,
/// count. Panics if any series is missing.
fn histogram(m: &HashMap<String, f64>, op: &str) -> (Vec<f64>, f64, f64) {
    let get = |series: String| {
        *m.get(&series)
            .unwrap_or_else(|| panic!("{series} missing from /metrics"))
    };
    let buckets = LES
        .iter()
        .map(|le| get(format!("{FAMILY}_bucket{{operation=\"{op}\",le=\"{le}\"}}")))
        .collect();
    let sum = get(format!("{FAMILY}_sum{{operation=\"{op}\"}}"));
    let count = get(format!("{FAMILY}_count{{operation=\"{op}\"}}"));
    (buckets, sum, count)
}

/// A short mixed workload; returns the requests it sent per operation.
fn workload(c: &mut Client) -> HashMap<&'static str, f64> {
    let keys: Vec<String> = (0..5).map(|i| format!("lat-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        put_ok(c, k, &data(1000 + i, i as u64), "");
    }
    for k in &keys {
        assert_eq!(c.get(&format!("/api/v1/objects?key={k}")).status, 200);
    }
    c.get("/api/v1/objects?key=absent");
    c.get("/api/v1/objects/exist?key=lat-0");
    c.get("/query_key?key=lat-0");
    c.get("/query_key?key=lat-1");
    c.get("/api/v1/objects/batch_get?keys=lat-0,lat-1");
    c.get("/api/v1/objects/batch_exist?keys=lat-0,absent");
    c.get("/batch_query_keys?keys=lat-0,lat-2");
    c.request("DELETE", "/key?key=lat-4", None);
    c.request("DELETE", "/api/v1/objects?key=lat-3", None);
    c.request("PUT", "/metadata?key=m", Some(b"v"));
    c.get("/metadata?key=m");
    c.get("/get_all_keys?prefix=");
    c.get("/get_all_segments");
    c.get("/api/v1/capacity/usage");
    c.get("/health");
    c.get("/healthz");
    c.get("/role");
    c.get("/metrics/summary");
    c.get("/openapi.json");
    c.get("/no/such/route");
    c.request("DELETE", "/all_keys", None);
    HashMap::from([
        ("put", 5.0),
        ("get", 6.0),
        ("exist", 1.0),
        ("query", 2.0),
        ("batch_get", 1.0),
        ("batch_exist", 1.0),
        ("batch_query", 1.0),
        ("remove", 2.0),
        ("metadata", 2.0),
        ("get_all_keys", 1.0),
        ("segments", 2.0),
        ("health", 3.0),
        // The scrape before the workload, /metrics/summary, and the /metrics read for its
        // text before the last scrape (which is recorded after its own answer).
        ("scrape", 3.0),
        ("other", 2.0),
        ("remove_all", 1.0),
    ])
}

fn request_latency_histograms_count_every_operation(driver: Driver) {
    let srv = ServerBuilder::new(driver).shards(2).start();
    let mut c = srv.client();
    let before = scrape(&mut c);
    for op in OPERATIONS {
        histogram(&before, op); // present from the start
    }
    let sent = workload(&mut c);
    let text = c.get("/metrics").text();
    assert!(
        text.contains(&format!("# TYPE {FAMILY} histogram\n")),
        "{text}"
    );
    assert!(text.contains(&format!("# HELP {FAMILY} ")));
    let after = scrape(&mut c);
    for op in OPERATIONS {
        let (b0, s0, n0) = histogram(&before, op);
        let (b1, s1, n1) = histogram(&after, op);
        assert!(
            b1.windows(2).all(|w| w[0] <= w[1]),
            "{op}: buckets not cumulative: {b1:?}"
        );
        assert_eq!(b1[LES.len() - 1], n1, "{op}: +Inf bucket != _count");
        let expected = sent.get(op).copied().unwrap_or(0.0);
        assert_eq!(n1 - n0, expected, "{op}: requests counted");
        let bucket_delta: Vec<f64> = b1.iter().zip(&b0).map(|(a, b)| a - b).collect();
        assert!(
            bucket_delta.iter().all(|&d| d >= 0.0),
            "{op}: {bucket_delta:?}"
        );
        if expected > 0.0 {
            assert!(s1 > s0, "{op}: the sum grows with the requests");
            // Nothing here takes 10 s: every request is in a finite bucket.
            assert_eq!(bucket_delta[LES.len() - 2], expected, "{op}: le=10");
        } else {
            assert_eq!(s1, s0, "{op}");
        }
    }
}
