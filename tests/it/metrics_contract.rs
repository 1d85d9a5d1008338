//! The contract's metric details an audit checked (issue 18): bandwidth durations are the
//! transfer's time, placeholders stay in the body, series go with their rank,
//! `rewarm_bytes_current` counts object bytes, ratios carry the contract's digits, eviction
//! counts what `num_evicted` counts, and a HEAD request is no business operation.

use std::collections::HashMap;

use serde_json::Value;

use crate::both_drivers;
use crate::harness::{Client, Driver, ServerBuilder};
use crate::observability::scrape;
use crate::store::{data, eventually, get_bytes, media, put_ok, query, temp_dir};

both_drivers!(
    bandwidth_durations_are_the_transfer_time,
    placeholders_stay_and_client_series_go_with_their_rank,
    rewarm_bytes_current_counts_object_bytes,
    query_segment_reproduces_the_seed_example,
    head_requests_are_no_business_operation,
);

fn summary(c: &mut Client) -> HashMap<String, String> {
    c.get("/metrics/summary")
        .text()
        .split(' ')
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("key=value");
            (k.to_string(), v.to_string())
        })
        .collect()
}

#[track_caller]
fn value(m: &HashMap<String, f64>, series: &str) -> f64 {
    *m.get(series)
        .unwrap_or_else(|| panic!("{series} is missing"))
}

/// `bytes_per_sec` of a window is its bytes over its duration, to the nanosecond the
/// duration is shown with.
#[track_caller]
fn assert_rate_consistent(m: &HashMap<String, f64>, op: &str, bytes: f64) {
    let labels = format!("{{rank=\"0\",operation=\"{op}\"}}");
    assert_eq!(
        value(m, &format!("memcache_bandwidth_bytes{labels}")),
        bytes
    );
    assert_eq!(
        value(m, &format!("memcache_bandwidth_bytes_cum_total{labels}")),
        bytes
    );
    let ms = value(m, &format!("memcache_bandwidth_duration_ms{labels}"));
    let cum_ms = value(
        m,
        &format!("memcache_bandwidth_duration_ms_cum_total{labels}"),
    );
    let bps = value(m, &format!("memcache_bandwidth_bytes_per_sec{labels}"));
    assert!(ms > 0.0, "{op}: duration {ms} ms");
    assert_eq!(ms, cum_ms, "{op}: one window so far");
    assert!(bps > 0.0, "{op}: rate {bps}");
    let expected = bytes / (ms / 1000.0);
    assert!(
        (bps - expected).abs() <= expected * 1e-6 + 1.0,
        "{op}: {bps} B/s is not {bytes} B over {ms} ms"
    );
    // Loopback is fast, but not faster than a terabyte a second.
    assert!(bps < 1e12, "{op}: {bps} B/s");
}

fn bandwidth_durations_are_the_transfer_time(driver: Driver) {
    const OBJ: usize = 32 << 20;
    let srv = ServerBuilder::new(driver)
        .set("ock.mmc.local_service.hbm.size", "0")
        .set("ock.mmc.local_service.dram.size", "256MB")
        .set("ock.mmc.metrics.window_secs", "60")
        .start();
    let mut c = srv.client();
    // Nothing moved yet: the series are there, as 0.
    let m = scrape(&mut c);
    assert_eq!(
        value(
            &m,
            "memcache_bandwidth_duration_ms{rank=\"0\",operation=\"batch_get\"}"
        ),
        0.0
    );
    assert_eq!(
        value(
            &m,
            "memcache_bandwidth_bytes_per_sec{rank=\"0\",operation=\"batch_get\"}"
        ),
        0.0
    );
    let objects: Vec<Vec<u8>> = (0..4).map(|i| data(OBJ, i)).collect();
    for (i, o) in objects.iter().enumerate() {
        put_ok(&mut c, &format!("big{i}"), o, "");
    }
    // Four batch_gets of 32 MiB each: 4 × 32 MiB in all.
    for (i, o) in objects.iter().enumerate() {
        let r = c.get(&format!("/api/v1/objects/batch_get?keys=big{i}"));
        assert_eq!(r.status, 200);
        assert_eq!(&r.body[..8], &(OBJ as u64).to_be_bytes());
        assert!(r.body[8..] == o[..], "big{i} comes back whole");
    }
    let m = scrape(&mut c);
    assert_rate_consistent(&m, "batch_get", (4 * OBJ) as f64);
    assert_rate_consistent(&m, "batch_put", (4 * OBJ) as f64);
    // Sub-millisecond transfers keep their time too: a small buffered put and a small get.
    let srv2 = ServerBuilder::new(driver)
        .set("ock.mmc.local_service.hbm.size", "0")
        .set("ock.mmc.metrics.window_secs", "60")
        .start();
    let mut c2 = srv2.client();
    put_ok(&mut c2, "small", &data(4096, 9), "");
    assert_eq!(get_bytes(&mut c2, "small"), data(4096, 9));
    let m = scrape(&mut c2);
    assert_rate_consistent(&m, "batch_put", 4096.0);
    assert_rate_consistent(&m, "batch_get", 4096.0);
}

/// The ten `memcache_ubs_io_*` families of the contract, in its order.
const UBS_IO: [&str; 10] = [
    "memcache_ubs_io_disk_capacity_bytes",
    "memcache_ubs_io_disk_used_bytes",
    "memcache_ubs_io_mem_capacity_bytes",
    "memcache_ubs_io_mem_used_bytes",
    "memcache_ubs_io_disk_num",
    "memcache_ubs_io_fault_disk_num",
    "memcache_ubs_io_disk_status",
    "memcache_ubs_io_disk_read_bandwidth_bytes_per_sec",
    "memcache_ubs_io_disk_write_bandwidth_bytes_per_sec",
    "memcache_ubs_io_disk_total_bandwidth_bytes_per_sec",
];

/// The client families of the contract.
const CLIENT: [&str; 7] = [
    "memcache_metric_stale",
    "memcache_bandwidth_bytes",
    "memcache_bandwidth_duration_ms",
    "memcache_bandwidth_bytes_cum_total",
    "memcache_bandwidth_duration_ms_cum_total",
    "memcache_bandwidth_latency_seconds",
    "memcache_bandwidth_bytes_per_sec",
];

fn placeholders_stay_and_client_series_go_with_their_rank(driver: Driver) {
    let srv = ServerBuilder::new(driver)
        .set("ock.mmc.embedded.ranks", "2")
        .set("ock.mmc.local_service.hbm.size", "0")
        .set("ock.mmc.local_service.dram.size", "64MB")
        .start();
    let mut c = srv.client();
    let text = c.get("/metrics").text();
    // Every family in the contract's order, each with its HELP and TYPE.
    let mut at = 0;
    for f in CLIENT.iter().chain(UBS_IO.iter()) {
        let i = text[at..]
            .find(&format!("# HELP {f} "))
            .unwrap_or_else(|| panic!("{f} is missing or out of order"));
        at += i;
        assert!(text.contains(&format!("# TYPE {f} ")), "{f}");
    }
    let m = scrape(&mut c);
    for r in ["0", "1"] {
        let rank = format!("{{rank=\"{r}\"}}");
        for f in &UBS_IO[..6] {
            assert!(m.contains_key(&format!("{f}{rank}")), "{f}{rank}");
        }
        assert_eq!(
            value(&m, &format!("memcache_ubs_io_disk_capacity_bytes{rank}")),
            0.0
        );
        assert_eq!(value(&m, &format!("memcache_ubs_io_disk_num{rank}")), 0.0);
        // The memory figures it can give: the rank's DRAM.
        assert_eq!(
            value(&m, &format!("memcache_ubs_io_mem_capacity_bytes{rank}")),
            (64u64 << 20) as f64
        );
        let disk = format!("{{rank=\"{r}\",disk_path=\"\"}}");
        for f in &UBS_IO[6..] {
            assert_eq!(value(&m, &format!("{f}{disk}")), 0.0, "{f}{disk}");
        }
        for op in ["batch_put", "batch_get"] {
            let l = format!("{{rank=\"{r}\",operation=\"{op}\"}}");
            assert_eq!(value(&m, &format!("memcache_bandwidth_bytes{l}")), 0.0);
        }
        let l = format!("{{rank=\"{r}\",operation=\"batch_exist\"}}");
        assert_eq!(
            value(&m, &format!("memcache_bandwidth_duration_ms{l}")),
            0.0
        );
        assert!(!m.contains_key(&format!("memcache_bandwidth_bytes{l}")));
        // The server's own ranks: it records their figures itself, so they are fresh with
        // or without traffic (stale is for a remote rank whose reports stopped or never
        // came, issue 27 D2).
        assert_eq!(value(&m, &format!("memcache_metric_stale{rank}")), 0.0);
    }

    // Traffic on both ranks (two replicas), then rank 1 loses its only segment.
    put_ok(&mut c, "r", &data(5000, 1), "&replicas=2");
    assert_eq!(get_bytes(&mut c, "r"), data(5000, 1));
    let m = scrape(&mut c);
    for r in ["0", "1"] {
        let l = format!("{{rank=\"{r}\",operation=\"batch_put\"}}");
        assert_eq!(
            value(&m, &format!("memcache_bandwidth_bytes_cum_total{l}")),
            5000.0,
            "each replica's rank wrote the bytes"
        );
        assert_eq!(
            value(&m, &format!("memcache_metric_stale{{rank=\"{r}\"}}")),
            0.0
        );
    }
    let r = c.request("POST", "/api/v1/segments/unmount?segment=rank-1-dram", None);
    assert_eq!(r.status, 200, "{}", r.text());
    let m = scrape(&mut c);
    let left: Vec<&String> = m
        .keys()
        .filter(|k| k.contains("rank=\"1\""))
        .filter(|k| CLIENT.iter().chain(UBS_IO.iter()).any(|f| k.starts_with(f)))
        .collect();
    assert!(left.is_empty(), "rank 1's series stay: {left:?}");
    assert!(m.contains_key("memcache_metric_stale{rank=\"0\"}"));
    assert!(m.contains_key("memcache_ubs_io_mem_used_bytes{rank=\"0\"}"));
    // Mounted again, the rank starts from zero.
    let r = c.request(
        "POST",
        "/api/v1/segments/mount?rank=1&medium=dram&size=64MB",
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let m = scrape(&mut c);
    assert_eq!(
        value(
            &m,
            "memcache_bandwidth_bytes_cum_total{rank=\"1\",operation=\"batch_put\"}"
        ),
        0.0
    );
}

fn rewarm_bytes_current_counts_object_bytes(driver: Driver) {
    let dir = temp_dir("metrics-rewarm");
    let srv = ServerBuilder::new(driver)
        .set("ock.mmc.local_service.hbm.size", "0")
        .set("ock.mmc.local_service.dram.size", "64MB")
        .set("ock.mmc.ssd.enable", "true")
        .set("ock.mmc.ssd.path", dir.to_str().unwrap())
        .set("ock.mmc.ssd.size", "64MB")
        .set("ock.mmc.lease_ms", "50")
        .start();
    let mut c = srv.client();
    let j = [("Content-Type", "application/json")];
    put_ok(&mut c, "plain", &data(1000, 3), "");
    // Down one tier: one eviction, as num_evicted says.
    let r = c.request_with(
        "POST",
        "/memory/evict",
        &j,
        Some(br#"{"chunk_hashes":["plain"],"locations":["DRAM"]}"#),
    );
    assert_eq!(r.text(), r#"{"status":"success","num_evicted":1}"#);
    eventually("the object reaches SSD only", || {
        media(&query(&mut c, "plain")) == ["SSD"]
    });
    assert_eq!(
        value(&scrape(&mut c), "memcache_evict_operations_total"),
        1.0
    );
    // A get rewarms it: 1000 object bytes, however many pages they take.
    assert_eq!(get_bytes(&mut c, "plain"), data(1000, 3));
    let m = scrape(&mut c);
    assert_eq!(value(&m, "memcache_rewarm_total"), 1.0);
    assert_eq!(value(&m, "memcache_rewarm_bytes_total"), 1000.0);
    assert_eq!(value(&m, "memcache_rewarm_bytes_current"), 1000.0);
    let s = summary(&mut c);
    assert_eq!(
        (&*s["rewarm_bytes_total"], &*s["rewarm_bytes_current"]),
        ("1000", "1000")
    );
    // Deleted everywhere once the read's lease (50 ms) ended (a leased copy is never
    // evicted): one eviction per tier it leaves (DRAM and SSD), as num_evicted counts them;
    // the rewarmed copy's bytes leave the gauge.
    std::thread::sleep(std::time::Duration::from_millis(150));
    let r = c.request_with(
        "POST",
        "/memory/evict",
        &j,
        Some(br#"{"chunk_hashes":["plain"]}"#),
    );
    assert_eq!(r.text(), r#"{"status":"success","num_evicted":2}"#);
    assert_eq!(
        value(&scrape(&mut c), "memcache_evict_operations_total"),
        3.0
    );
    eventually("the rewarmed copy is freed", || {
        value(&scrape(&mut c), "memcache_rewarm_bytes_current") == 0.0
    });
    assert_eq!(
        value(&scrape(&mut c), "memcache_rewarm_bytes_total"),
        1000.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Removes the whitespace between JSON tokens (the seed's examples are indented).
fn compact(pretty: &str) -> String {
    let mut out = String::new();
    let mut in_string = false;
    let mut escaped = false;
    for ch in pretty.chars() {
        if in_string {
            out.push(ch);
            match (escaped, ch) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
        } else if ch == '"' {
            in_string = true;
            out.push(ch);
        } else if !ch.is_whitespace() {
            out.push(ch);
        }
    }
    out
}

/// The seed's `/query_segment` example, as the contract prints it.
const SEED_QUERY_SEGMENT: &str = r#"{
  "segment": "rank-0-hbm",
  "medium": "HBM",
  "total_bytes": 5368709120,
  "used_bytes": 368640,
  "remaining_bytes": 5368340480,
  "remaining_ratio": 0.9999313354
}"#;

fn query_segment_reproduces_the_seed_example(driver: Driver) {
    // The seed's state: 5 GiB HBM and DRAM segments on rank 0, two keys in 368640 bytes of
    // HBM (`hbm_used=368640/5368709120` in its summary example).
    let srv = ServerBuilder::new(driver)
        .set("ock.mmc.local_service.hbm.size", "5GB")
        .set("ock.mmc.local_service.dram.size", "5GB")
        .start();
    let mut c = srv.client();
    put_ok(&mut c, "key_a", &data(184_320, 1), "&medium=hbm");
    put_ok(&mut c, "key_b", &data(184_000, 2), "&medium=hbm");
    let r = c.get("/query_segment?segment=rank-0-hbm");
    assert_eq!(r.content_type(), "application/json; charset=utf-8");
    assert_eq!(r.text(), compact(SEED_QUERY_SEGMENT));
    // The other ratio fields carry the same digits.
    let r = c.get("/api/v1/capacity/segment_remaining");
    assert!(
        r.text()
            .contains(r#""remaining_bytes":5368340480,"remaining_ratio":0.9999313354}"#),
        "{}",
        r.text()
    );
    assert!(
        r.text()
            .contains(r#""remaining_bytes":5368709120,"remaining_ratio":1}"#),
        "{}",
        r.text()
    );
    let u = c.get("/api/v1/capacity/usage").text();
    assert!(
        u.contains(r#""npu":{"total_bytes":5368709120,"used_bytes":368640,"free_bytes":5368340480,"usage_ratio":0.0000686646}"#),
        "{u}"
    );
    assert!(u.contains(r#""usage_ratio":0}"#), "{u}");
    let s = summary(&mut c);
    assert_eq!(s["hbm_used"], "368640/5368709120");
    assert_eq!(s["dram_used"], "0/5368709120");
}

fn head_requests_are_no_business_operation(driver: Driver) {
    let srv = ServerBuilder::new(driver)
        .set("ock.mmc.local_service.hbm.size", "0")
        .set("ock.mmc.lease_ms", "60000")
        .start();
    let mut c = srv.client();
    let body = data(300 << 10, 4);
    put_ok(&mut c, "h", &body, "");
    put_ok(&mut c, "s", &data(10, 5), "");
    let before = summary(&mut c);
    let metrics_before = scrape(&mut c);
    let heads: [(&str, Option<usize>); 8] = [
        ("/api/v1/objects?key=h", Some(body.len())),
        (
            "/api/v1/objects/batch_get?keys=h,nope,s",
            Some(8 + body.len() + 8 + 8 + 10),
        ),
        ("/api/v1/objects/exist?key=h", None),
        ("/api/v1/objects/batch_exist?keys=h,nope", None),
        ("/query_key?key=h", None),
        ("/batch_query_keys?keys=h,nope", None),
        ("/get_all_keys", None),
        ("/api/v1/objects?key=nope", None),
    ];
    for (target, len) in heads {
        let head = c.request("HEAD", target, None);
        assert_eq!(head.status, 200, "HEAD {target}");
        assert!(head.body.is_empty(), "HEAD {target} has no body");
        if let Some(len) = len {
            assert_eq!(
                head.header("content-length"),
                Some(&*len.to_string()),
                "HEAD {target}"
            );
            assert_eq!(head.content_type(), "application/octet-stream");
        }
    }
    let missing = c.request("HEAD", "/api/v1/objects?key=nope", None);
    assert_eq!(missing.content_type(), "application/json; charset=utf-8");
    // Nothing counted, traced or measured.
    assert_eq!(summary(&mut c), before, "a HEAD counted");
    let metrics_after = scrape(&mut c);
    for (series, v) in &metrics_before {
        if series.starts_with("memcache_bandwidth_") && !series.contains("latency") {
            assert_eq!(metrics_after.get(series), Some(v), "{series}");
        }
    }
    let ptracer = c.get("/metrics/ptracer").text();
    for tp in [
        "TP_MMC_META_GET ",
        "TP_MMC_META_QUERY ",
        "TP_MMC_META_EXIST",
    ] {
        assert!(!ptracer.contains(tp), "{tp} traced: {ptracer}");
    }
    // The same headers as the GET (its JSON body has the same length), and no lease taken.
    let head = c.request("HEAD", "/query_key?key=h", None);
    let h: Value = query(&mut c, "h");
    assert_eq!(
        head.header("content-length").unwrap(),
        h.to_string().len().to_string()
    );
    assert_eq!(h["blobs"][0]["leaseTimeoutTtlMs"], 0, "a HEAD took a lease");
    let after = summary(&mut c);
    let mut changed: Vec<&str> = before
        .keys()
        .filter(|k| after[*k] != before[*k])
        .map(|k| k.as_str())
        .collect();
    changed.sort();
    assert_eq!(
        changed,
        ["query_req", "query_success"],
        "only the GET counted"
    );
}
