//! Observability: /metrics (checked by promtool and scraped by a real Prometheus),
//! /metrics/summary, ptracer, the seed's counting rules after a scripted workload, per-rank
//! series, tier and event-bus metrics.

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::both_drivers;
use crate::harness::{Client, Driver, Server, ServerBuilder};
use crate::store::{data, eventually, get_bytes, media, put, put_ok, query, temp_dir};

both_drivers!(
    counters_follow_the_seed_rules,
    tier_counters_and_event_bus_follow_the_tiers,
    per_rank_series_and_segment_lifecycle,
    production_metrics_have_no_test_subscriber,
);

/// Issue 10: the test-only `PanickingTestSubscriber` appeared in every production `/metrics`.
/// A server started without the test hook exports the real subscribers' series only.
fn production_metrics_have_no_test_subscriber(driver: Driver) {
    let srv = Server::start(driver);
    let mut c = srv.client();
    let text = c.get("/metrics").text();
    for name in ["TierMetricsSubscriber", "LoggingSubscriber"] {
        let series = format!(
            "lmcache_mp_event_bus_subscriber_exceptions_total{{subscriber_name=\"{name}\"}} 0"
        );
        assert!(text.contains(&series), "{series} missing:\n{text}");
    }
    assert!(
        !text.contains("PanickingTestSubscriber"),
        "a test subscriber in production metrics:\n{text}"
    );
}

/// Parses an exposition into `series → value` (series with their labels, as written).
pub fn scrape(c: &mut Client) -> HashMap<String, f64> {
    let r = c.get("/metrics");
    assert_eq!(r.status, 200);
    assert_eq!(r.content_type(), "text/plain; version=0.0.4");
    let mut out = HashMap::new();
    for line in r.text().lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap();
        out.insert(series.to_string(), value.parse::<f64>().unwrap());
    }
    out
}

#[track_caller]
fn expect(m: &HashMap<String, f64>, series: &str, value: f64) {
    assert_eq!(m.get(series).copied(), Some(value), "{series}");
}

fn summary(c: &mut Client) -> Vec<(String, String)> {
    let r = c.get("/metrics/summary");
    assert_eq!(r.content_type(), "text/plain; charset=utf-8");
    let text = r.text();
    assert!(!text.contains('\n'), "one line");
    text.split(' ')
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("key=value");
            (k.to_string(), v.to_string())
        })
        .collect()
}

const SUMMARY_FIELDS: &str = "keys evict rewarm rewarm_fail rewarm_bytes_total rewarm_bytes_current flush_blobs flush_bytes get_hit_dram get_hit_ssd hbm_used dram_used ssd_used alloc_req alloc_success alloc_fail batch_alloc_req batch_alloc_success batch_alloc_fail get_req get_success get_fail get_not_found batch_get_req batch_get_success batch_get_fail batch_get_not_found remove_req remove_success remove_fail remove_not_found batch_remove_req batch_remove_success batch_remove_fail batch_remove_not_found remove_all_req remove_all_success remove_all_fail update_state_req update_state_success update_state_fail update_state_not_found batch_update_state_req batch_update_state_success batch_update_state_fail batch_update_state_not_found query_req query_success query_fail query_not_found batch_query_req batch_query_success batch_query_fail batch_query_not_found get_all_keys_req get_all_keys_success get_all_keys_fail exist_key_req exist_key_success exist_key_fail exist_key_not_found batch_exist_key_req batch_exist_key_success batch_exist_key_fail batch_exist_key_not_found mount_req mount_success mount_fail unmount_req unmount_success unmount_fail";

fn counters_follow_the_seed_rules(driver: Driver) {
    // No read leases: removed objects free their bytes at once, so the capacity figures at
    // the end are exact.
    let srv = ServerBuilder::new(driver)
        .shards(3)
        .set("ock.mmc.local_service.hbm.size", "0")
        .set("ock.mmc.lease_ms", "0")
        .start();
    let mut c = srv.client();
    // Scrapes before and during the workload never count as operations.
    for _ in 0..3 {
        scrape(&mut c);
        summary(&mut c);
        c.get("/metrics/ptracer");
    }
    for k in ["a", "b", "c"] {
        put_ok(&mut c, k, b"value", "");
    }
    put(&mut c, "a", b"dup", "").assert_error(200, "Duplicated object: key already exists");
    get_bytes(&mut c, "a");
    c.get("/api/v1/objects?key=nope")
        .assert_error(200, "Key not found");
    c.get("/api/v1/objects/exist?key=a");
    c.get("/api/v1/objects/exist?key=nope");
    c.request(
        "POST",
        "/api/v1/objects/batch_put?keys=d,a&sizes=1,1",
        Some(b"xy"),
    );
    c.get("/api/v1/objects/batch_get?keys=a,nope");
    c.get("/api/v1/objects/batch_exist?keys=a,nope");
    c.request("POST", "/api/v1/objects/batch_remove?keys=b,nope", None);
    c.get("/query_key?key=a");
    c.get("/query_key?key=nope");
    c.get("/batch_query_keys?keys=a,nope");
    c.request("DELETE", "/key?key=c", None);
    c.request("DELETE", "/key?key=nope", None);
    let stored_before_clear = summary(&mut c);
    c.get("/get_all_keys");
    c.request("DELETE", "/all_keys", None);
    c.request(
        "POST",
        "/api/v1/segments/mount?rank=1&medium=dram&size=16MB",
        None,
    );
    c.request(
        "POST",
        "/api/v1/segments/mount?rank=1&medium=dram&size=16MB",
        None,
    );
    c.request("POST", "/api/v1/segments/unmount?segment=rank-1-dram", None);
    c.request("POST", "/api/v1/segments/unmount?segment=rank-9-dram", None);

    let expected: &[(&str, [u64; 4])] = &[
        // op: requests, successes, failures, not_found
        ("alloc", [6, 4, 2, 0]),
        ("batch_alloc", [1, 0, 1, 0]),
        ("get", [4, 2, 0, 2]),
        ("batch_get", [1, 0, 0, 1]),
        ("remove", [4, 2, 0, 2]),
        ("batch_remove", [1, 0, 0, 1]),
        ("remove_all", [1, 1, 0, 0]),
        ("update_state", [4, 4, 0, 0]),
        ("batch_update_state", [1, 1, 0, 0]),
        ("query", [4, 2, 0, 2]),
        ("batch_query", [1, 0, 0, 1]),
        ("get_all_keys", [1, 1, 0, 0]),
        ("exist_key", [4, 2, 0, 2]),
        ("batch_exist_key", [1, 0, 0, 1]),
        ("mount", [2, 1, 1, 0]),
        ("unmount", [2, 1, 1, 0]),
    ];
    let m = scrape(&mut c);
    let s: HashMap<String, String> = summary(&mut c).into_iter().collect();
    for (op, [req, ok, fail, nf]) in expected {
        expect(&m, &format!("memcache_{op}_requests_total"), *req as f64);
        expect(&m, &format!("memcache_{op}_successes_total"), *ok as f64);
        expect(&m, &format!("memcache_{op}_failures_total"), *fail as f64);
        assert_eq!(s[&format!("{op}_req")], req.to_string(), "{op}_req");
        assert_eq!(s[&format!("{op}_success")], ok.to_string(), "{op}_success");
        assert_eq!(s[&format!("{op}_fail")], fail.to_string(), "{op}_fail");
        match s.get(&format!("{op}_not_found")) {
            Some(v) => {
                assert_eq!(v, &nf.to_string(), "{op}_not_found");
                expect(&m, &format!("memcache_{op}_not_found_total"), *nf as f64);
            }
            None => assert!(
                !m.contains_key(&format!("memcache_{op}_not_found_total")),
                "{op} has no not_found"
            ),
        }
    }
    // stored_keys is a running count: a, d before the clear; 0 after.
    let before: HashMap<String, String> = stored_before_clear.into_iter().collect();
    assert_eq!(before["keys"], "2");
    expect(&m, "memcache_stored_keys", 0.0);
    assert_eq!(s["keys"], "0");
    // Summary field order and the capacity fields.
    let r = c.get("/metrics/summary").text();
    let keys: Vec<&str> = r
        .split(' ')
        .map(|kv| kv.split('=').next().unwrap())
        .collect();
    assert_eq!(keys.join(" "), SUMMARY_FIELDS);
    assert_eq!(s["hbm_used"], "0/0");
    assert_eq!(s["dram_used"], "0/1073741824");
    assert_eq!(s["ssd_used"], "0/0");
    assert!(
        !m.contains_key("memcache_total_capacity_bytes{medium=\"ssd\"}"),
        "no SSD series without SSD"
    );
    assert!(
        !m.contains_key("memcache_allocated_bytes{medium=\"ssd\"}"),
        "no SSD series without SSD"
    );

    // ptracer: the seed's columns; its counts agree with the counters above.
    let table = c.get("/metrics/ptracer").text();
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "TIME", "NAME", "BEGIN", "GOOD_END", "BAD_END", "ON_FLY", "P50(us)", "P99(us)",
            "P999(us)", "AVG(us)", "MAX(us)"
        ]
    );
    let rows: HashMap<String, Vec<f64>> = lines
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 12, "{l}");
            (
                f[2].to_string(),
                f[3..].iter().map(|v| v.parse().unwrap()).collect(),
            )
        })
        .collect();
    assert_eq!(
        rows["TP_MMC_META_ALLOC"][0], 6.0,
        "one alloc tracepoint per alloc"
    );
    assert_eq!(rows["TP_MMC_META_UPDATE_STATE"][0], 4.0);
    assert_eq!(
        rows["TP_MMC_META_PUT"][..3],
        [4.0, 3.0, 1.0],
        "4 puts: 3 good, the duplicate bad"
    );
    assert_eq!(rows["TP_MMC_META_GET"][..3], [2.0, 1.0, 1.0]);
    assert_eq!(rows["TP_MMC_META_MOUNT"][..3], [2.0, 1.0, 1.0]);
    for (name, r) in &rows {
        assert_eq!(
            r[3],
            r[0] - r[1] - r[2],
            "{name}: ON_FLY = BEGIN - GOOD_END - BAD_END"
        );
        assert!(
            r[4] <= r[5] && r[5] <= r[6] && r[6] <= r[8],
            "{name}: quantiles ordered {r:?}"
        );
    }
    let af = c.get("/api/v1/analysis/alloc_free_latency").text();
    let names: Vec<&str> = af
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().nth(2).unwrap())
        .collect();
    assert_eq!(names, ["TP_MMC_META_ALLOC", "TP_MMC_META_REMOVE"]);
    assert_eq!(af.lines().next(), table.lines().next());
}

fn tier_counters_and_event_bus_follow_the_tiers(driver: Driver) {
    let dir = temp_dir("obs-tiers");
    let srv = ServerBuilder::new(driver)
        .shards(2)
        .set("ock.mmc.local_service.hbm.size", "0")
        .set("ock.mmc.local_service.dram.size", "2MB")
        .set("ock.mmc.ssd.enable", "true")
        .set("ock.mmc.ssd.path", dir.to_str().unwrap())
        .set("ock.mmc.ssd.size", "64MB")
        .set("ock.mmc.segment.run_bytes", "1MB")
        .set("ock.mmc.lease_ms", "50")
        // A debug build only: a release build has no test subscriber.
        .env("MMC_TEST_PANICKING_SUBSCRIBER", "1")
        .start();
    let panicking = cfg!(debug_assertions);
    let mut c = srv.client();
    for i in 0..16u64 {
        put_ok(&mut c, &format!("t{i}"), &data(200 << 10, i), "");
    }
    eventually("t0 reaches SSD only", || {
        media(&query(&mut c, "t0")) == ["SSD"]
    });
    assert_eq!(get_bytes(&mut c, "t0"), data(200 << 10, 0));
    eventually("the event bus drained", || {
        scrape(&mut c)["lmcache_mp_event_bus_queue_depth"] == 0.0
    });
    let m = scrape(&mut c);
    let flushes = m["memcache_flush_blobs_total"];
    assert!(flushes >= 1.0, "flushes counted");
    assert_eq!(
        m["memcache_flush_bytes_total"],
        flushes * (200 << 10) as f64
    );
    assert!(m["memcache_evict_operations_total"] >= flushes);
    expect(&m, "memcache_rewarm_total", 1.0);
    expect(&m, "memcache_get_hits_ssd_total", 1.0);
    expect(&m, "memcache_rewarm_bytes_total", (200 << 10) as f64);
    expect(&m, "memcache_rewarm_bytes_current", 204_800.0);
    expect(&m, "memcache_rewarm_failed_total", 0.0);
    assert!(
        m.contains_key("memcache_total_capacity_bytes{medium=\"ssd\"}"),
        "SSD series once SSD is configured"
    );
    // The same figures under the LMCache names, from the event bus.
    expect(
        &m,
        "lmcache_mp_l2_store_completed_requests_total{l2_name=\"ssd\"}",
        flushes,
    );
    expect(
        &m,
        "lmcache_mp_l2_load_completed_requests_total{l2_name=\"ssd\"}",
        1.0,
    );
    assert_eq!(
        m["lmcache_mp_l1_chunk_lifetime_seconds_count"],
        m["lmcache_mp_l1_evicted_chunks_total"]
    );
    assert_eq!(
        m["lmcache_mp_l2_store_throughput_GBs_count{l2_name=\"ssd\"}"],
        flushes
    );
    assert!(m["lmcache_mp_l1_write_chunks_total"] >= 16.0);
    // The failing subscriber was contained and counted; delivery went on.
    let panics = "lmcache_mp_event_bus_subscriber_exceptions_total{subscriber_name=\"PanickingTestSubscriber\"}";
    if panicking {
        assert_eq!(
            m[panics],
            m["lmcache_mp_l1_evicted_chunks_total"] + m["lmcache_mp_l2_evicted_chunks_total"]
        );
    } else {
        assert!(
            !m.contains_key(panics),
            "a release build has no test subscriber"
        );
    }
    expect(
        &m,
        "lmcache_mp_event_bus_subscriber_exceptions_total{subscriber_name=\"TierMetricsSubscriber\"}",
        0.0,
    );
    expect(&m, "lmcache_mp_event_bus_dropped_events_total", 0.0);
    assert_eq!(
        srv.log()
            .contains("subscriber PanickingTestSubscriber panicked"),
        panicking,
        "{}",
        srv.log()
    );
    // The SSD disk's figures.
    let disk = format!("{{rank=\"0\",disk_path=\"{}\"}}", dir.to_str().unwrap());
    expect(&m, &format!("memcache_ubs_io_disk_status{disk}"), 0.0);
    assert!(m[&format!("memcache_ubs_io_disk_write_bandwidth_bytes_per_sec{disk}")] > 0.0);
    expect(&m, "memcache_ubs_io_disk_num{rank=\"0\"}", 1.0);
    let s: HashMap<String, String> = summary(&mut c).into_iter().collect();
    assert_eq!(s["flush_blobs"], flushes.to_string());
    assert_eq!(s["rewarm"], "1");
    assert_eq!(
        s["ssd_used"],
        format!(
            "{}/{}",
            m["memcache_allocated_bytes{medium=\"ssd\"}"],
            64 << 20
        )
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn per_rank_series_and_segment_lifecycle(driver: Driver) {
    let srv = ServerBuilder::new(driver)
        .set("ock.mmc.embedded.ranks", "2")
        .set("ock.mmc.local_service.hbm.size", "0")
        .set("ock.mmc.metrics.per_rank", "true")
        .start();
    let mut c = srv.client();
    put_ok(&mut c, "r", &data(5000, 1), "&replicas=2");
    get_bytes(&mut c, "r");
    let m = scrape(&mut c);
    expect(&m, "memcache_alloc_requests_total", 1.0);
    assert_eq!(
        m["memcache_alloc_requests_total{rank=\"0\"}"]
            + m["memcache_alloc_requests_total{rank=\"1\"}"],
        1.0
    );
    assert!(m.contains_key("memcache_get_hits_dram_total{rank=\"1\"}"));
    expect(
        &m,
        "memcache_segment_capacity_bytes{segment=\"rank-1-dram\"}",
        (1u64 << 30) as f64,
    );
    // Client metrics for the rank that served the traffic (every mounted rank has series).
    let served = (0..2)
        .find(|r| {
            m[&format!(
                "memcache_bandwidth_bytes_cum_total{{rank=\"{r}\",operation=\"batch_put\"}}"
            )] > 0.0
        })
        .expect("a rank with traffic");
    expect(
        &m,
        &format!("memcache_metric_stale{{rank=\"{served}\"}}"),
        0.0,
    );
    expect(
        &m,
        &format!("memcache_bandwidth_bytes_cum_total{{rank=\"{served}\",operation=\"batch_put\"}}"),
        5000.0,
    );
    let p50 = m[&format!(
        "memcache_bandwidth_latency_seconds{{rank=\"{served}\",operation=\"batch_get\",quantile=\"P50\"}}"
    )];
    assert!(p50 > 0.0 && p50 < 1.0, "{p50}");
    let s = summary(&mut c);
    let ranked: Vec<&str> = s.iter().skip(71).map(|(k, _)| k.as_str()).collect();
    assert_eq!(ranked.len(), 18, "9 bases × 2 ranks: {ranked:?}");
    assert_eq!(
        &ranked[..4],
        [
            "evict_by_rank_0",
            "evict_by_rank_1",
            "get_hit_dram_by_rank_0",
            "get_hit_dram_by_rank_1"
        ]
    );
    // Unmounting a segment removes its series.
    c.request("POST", "/api/v1/segments/unmount?segment=rank-1-dram", None);
    let m = scrape(&mut c);
    assert!(
        !m.keys().any(|k| k.contains("rank-1-dram")),
        "series of an unmounted segment stay"
    );
    expect(
        &m,
        "memcache_total_capacity_bytes{medium=\"dram\"}",
        (1u64 << 30) as f64,
    );
}

/// Lint complaints promtool raises against names and labels the contract fixes; anything
/// else fails the test.
const CONTRACT_LINT: &[&str] = &[
    "memcache_bandwidth_bytes_per_sec metric names should not contain abbreviated units",
    "memcache_bandwidth_duration_ms metric names should not contain abbreviated units",
    "memcache_bandwidth_duration_ms_cum_total metric names should not contain abbreviated units",
    "memcache_bandwidth_latency_seconds non-summary metrics should not have \"quantile\" label",
    "memcache_ubs_io_disk_read_bandwidth_bytes_per_sec metric names should not contain abbreviated units",
    "memcache_ubs_io_disk_write_bandwidth_bytes_per_sec metric names should not contain abbreviated units",
    "memcache_ubs_io_disk_total_bandwidth_bytes_per_sec metric names should not contain abbreviated units",
];

fn busy_server(tag: &str) -> (Server, std::path::PathBuf) {
    let dir = temp_dir(tag);
    let srv = ServerBuilder::new(Driver::Epoll)
        .set("ock.mmc.embedded.ranks", "2")
        .set("ock.mmc.local_service.dram.size", "2MB")
        .set("ock.mmc.local_service.hbm.size", "1MB")
        .set("ock.mmc.ssd.enable", "true")
        .set("ock.mmc.ssd.path", dir.to_str().unwrap())
        .set("ock.mmc.metrics.per_rank", "true")
        .start();
    let mut c = srv.client();
    for i in 0..20u64 {
        put_ok(
            &mut c,
            &format!("m@1@0@{i:x}@fp16"),
            &data(100 << 10, i),
            "",
        );
    }
    for i in 0..20u64 {
        get_bytes(&mut c, &format!("m@1@0@{i:x}@fp16"));
    }
    c.get("/api/v1/objects/batch_exist?keys=a,b");
    (srv, dir)
}

#[test]
fn promtool_accepts_the_exposition() {
    let (srv, dir) = busy_server("promtool");
    let text = srv.client().get("/metrics").body;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (installed by scripts/test.sh: apt-get install prometheus)");
    child.stdin.take().unwrap().write_all(&text).unwrap();
    let out = child.wait_with_output().unwrap();
    let report =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    // Exit 0: clean; 3: lint findings only. Anything else is a parse error.
    let code = out.status.code().unwrap();
    assert!(
        code == 0 || code == 3,
        "promtool failed ({code}):\n{report}"
    );
    for line in report.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            CONTRACT_LINT.contains(&line.trim()),
            "unexpected promtool finding: {line}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A real Prometheus (installed by scripts/test.sh) scraping `target` every second, on a free
/// loopback port, with `extra` flags; killed and its data removed on drop.
pub(crate) struct Prometheus {
    child: std::process::Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Prometheus {
    pub(crate) fn start(tag: &str, target: std::net::SocketAddr, extra: &[&str]) -> Prometheus {
        let dir = temp_dir(tag);
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: mmc\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (installed by scripts/test.sh)");
        Prometheus { child, port, dir }
    }

    /// The first series `target` (`/api/v1/query?query=…`) answers, asked every half second
    /// for at most `secs` seconds.
    pub(crate) fn first_result(&self, target: &str, secs: u64) -> Option<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(500));
            let addr = format!("127.0.0.1:{}", self.port).parse().unwrap();
            let Some(mut c) = Client::try_connect(addr) else {
                continue;
            };
            let r = c.get(target);
            if r.status != 200 {
                continue;
            }
            let v = r.json();
            if let Some(first) = v["data"]["result"].as_array().and_then(|a| a.first()) {
                return Some(first.clone());
            }
        }
        None
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn a_real_prometheus_scrapes_it() {
    let (srv, dir) = busy_server("prometheus");
    let prom = Prometheus::start("prometheus-data", srv.addr, &[]);
    let keys = prom
        .first_result("/api/v1/query?query=memcache_stored_keys", 30)
        .expect("Prometheus never ingested a scrape");
    assert_eq!(keys["value"][1], "20", "{keys}");
    let up = prom.first_result("/api/v1/query?query=up", 5).expect("up");
    assert_eq!(up["value"][1], "1", "{up}");
    drop(prom);
    let _ = std::fs::remove_dir_all(&dir);
}
