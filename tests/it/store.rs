//! The tiered object store through its HTTP routes: the data plane, the contract's key,
//! segment and capacity endpoints, eviction down the tiers, SSD flush and rewarm, leases,
//! injected I/O errors, /memory/*, mount and unmount.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::both_drivers;
use crate::harness::{Client, Driver, ServerBuilder, pct, rss_kib};

both_drivers!(
    objects_round_trip_every_size_medium_and_replica,
    key_endpoints_answer_the_contract,
    segments_and_capacity_equal_what_is_allocated,
    eviction_moves_blobs_down_and_loses_nothing,
    rewarm_serves_ssd_objects_from_dram,
    leases_block_eviction_and_delay_frees,
    ssd_write_errors_keep_the_memory_copy,
    ssd_read_errors_are_reported_and_lose_nothing,
    memory_evict_and_prefetch,
    evict_with_locations_never_deletes,
    mount_and_unmount_segments,
    batch_routes,
    large_puts_stream_into_their_blobs,
    prefault_commits_memory_segments_at_mount,
    unmount_gives_back_the_mapping_the_memory_and_the_file,
);

/// Deterministic pseudo-random bytes.
pub fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn put(c: &mut Client, key: &str, body: &[u8], extra: &str) -> Response {
    c.request(
        "PUT",
        &format!("/api/v1/objects?key={}{extra}", pct(key.as_bytes())),
        Some(body),
    )
}

use crate::harness::Response;

#[track_caller]
pub fn put_ok(c: &mut Client, key: &str, body: &[u8], extra: &str) {
    let r = put(c, key, body, extra);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.text(),
        json!({"success": true, "key": key, "size": body.len()}).to_string(),
        "put {key}"
    );
}

#[track_caller]
pub fn get_bytes(c: &mut Client, key: &str) -> Vec<u8> {
    let r = c.get(&format!("/api/v1/objects?key={}", pct(key.as_bytes())));
    assert_eq!(r.status, 200);
    assert_eq!(
        r.content_type(),
        "application/octet-stream",
        "{key}: {}",
        r.text()
    );
    r.body
}

pub fn query(c: &mut Client, key: &str) -> Value {
    c.get(&format!("/query_key?key={}", pct(key.as_bytes())))
        .json()
}

pub fn media(q: &Value) -> Vec<String> {
    let mut m: Vec<String> = q["blobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["medium"].as_str().unwrap().to_string())
        .collect();
    m.sort();
    m
}

/// Polls `cond` until it holds (bounded); the server works asynchronously (flushes).
#[track_caller]
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn segment_used(c: &mut Client, name: &str) -> u64 {
    let q = c.get(&format!("/query_segment?segment={name}")).json();
    q["used_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("{name}: {q}"))
}

fn page_round(n: u64) -> u64 {
    n.max(1).div_ceil(4096) * 4096
}

fn tiered(driver: Driver, hbm: &str, dram: &str, ssd_dir: &std::path::Path) -> ServerBuilder {
    ServerBuilder::new(driver)
        .set("ock.mmc.local_service.hbm.size", hbm)
        .set("ock.mmc.local_service.dram.size", dram)
        .set("ock.mmc.ssd.enable", "true")
        .set("ock.mmc.ssd.path", ssd_dir.to_str().unwrap())
        .set("ock.mmc.ssd.size", "256MB")
        .set("ock.mmc.segment.run_bytes", "1MB")
}

pub fn temp_dir(tag: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "mmc-it-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Puts of 256 KiB and more go from the socket straight into their blobs as the body arrives.
/// The framing around them must hold: expect-continue, pipelining, refusals that still
/// consume the body, and clients that vanish mid-body (their allocation is given back).
fn large_puts_stream_into_their_blobs(driver: Driver) {
    let srv = ServerBuilder::new(driver)
        .shards(2)
        .set("ock.mmc.local_service.hbm.size", "64MB")
        .set("ock.mmc.local_service.dram.size", "64MB")
        .start();
    let mut c = srv.client();
    let big = data(3 << 20, 7);
    let head = |key: &str, extra: &str, len: usize| {
        format!(
            "PUT /api/v1/objects?key={key}{extra} HTTP/1.1\r\nHost: t\r\nContent-Length: {len}\r\n\r\n"
        )
    };
    // Head, a piece of the body, a pause, the rest: on both media, and with replicas.
    for (key, extra) in [("s-hbm", "&medium=hbm"), ("s-dram", "&medium=dram")] {
        c.send(head(key, extra, big.len()).as_bytes());
        c.send(&big[..1000]);
        std::thread::sleep(Duration::from_millis(50));
        c.send(&big[1000..]);
        let r = c.read_response(false);
        assert_eq!(r.json()["size"], big.len() as u64, "{key}: {}", r.text());
        assert_eq!(get_bytes(&mut c, key), big, "{key}");
    }
    // Pipelined: a small request before, a streamed put, and a GET after, in one write.
    let mut burst = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n".to_vec();
    burst.extend_from_slice(head("s-pipe", "", big.len()).as_bytes());
    burst.extend_from_slice(&big);
    burst.extend_from_slice(b"GET /api/v1/objects/exist?key=s-pipe HTTP/1.1\r\nHost: t\r\n\r\n");
    c.send(&burst);
    assert_eq!(c.read_response(false).text(), "ok");
    assert_eq!(c.read_response(false).json()["success"], true);
    assert_eq!(c.read_response(false).json()["exists"], true);
    assert_eq!(get_bytes(&mut c, "s-pipe"), big);
    // A refused put (duplicate key) still consumes its body: the connection stays usable.
    c.send(head("s-dram", "", big.len()).as_bytes());
    c.send(&big);
    c.read_response(false)
        .assert_error(200, "Duplicated object: key already exists");
    assert_eq!(c.get("/healthz").text(), "ok");
    // With Expect: 100-continue the go-ahead comes only once the blobs are allocated.
    let mut e = srv.client();
    e.send(
        format!(
            "PUT /api/v1/objects?key=s-cont HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            big.len()
        )
        .as_bytes(),
    );
    let interim = e.read_response(true);
    assert_eq!(interim.status, 100);
    e.send(&big);
    assert_eq!(e.read_response(false).json()["size"], big.len() as u64);
    assert_eq!(get_bytes(&mut e, "s-cont"), big);
    // ...and a refusal is answered at once, without the body, and the connection closed.
    e.send(
        format!(
            "PUT /api/v1/objects?key=s-cont HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            big.len()
        )
        .as_bytes(),
    );
    let r = e.read_response(false);
    r.assert_error(200, "Duplicated object: key already exists");
    assert_eq!(r.header("connection"), Some("close"));
    // A client that goes away mid-body: nothing is stored, the bytes are given back.
    let used = segment_used(&mut c, "rank-0-dram");
    for i in 0..4 {
        let mut gone = srv.client();
        gone.send(head(&format!("s-gone-{i}"), "&medium=dram", big.len()).as_bytes());
        gone.send(&big[..big.len() / 2]);
        drop(gone);
    }
    eventually("aborted puts release their blobs", || {
        segment_used(&mut c, "rank-0-dram") == used
    });
    for i in 0..4 {
        c.get(&format!("/api/v1/objects?key=s-gone-{i}"))
            .assert_error(200, "Key not found");
    }
    // The server is fine: a last round trip on a fresh connection.
    let mut f = srv.client();
    put_ok(&mut f, "s-last", &big[..300_000], "");
    assert_eq!(get_bytes(&mut f, "s-last"), &big[..300_000]);
}

fn objects_round_trip_every_size_medium_and_replica(driver: Driver) {
    let srv = ServerBuilder::new(driver)
        .shards(3)
        .set("ock.mmc.embedded.ranks", "2")
        .set("ock.mmc.local_service.hbm.size", "200MB")
        .set("ock.mmc.local_service.dram.size", "200MB")
        .start();
    let mut c = srv.client();
    let sizes = [
        0usize,
        1,
        4095,
        4096,
        4097,
        65_536,
        (1 << 20) + 3,
        16 << 20,
        64 << 20,
    ];
    for (i, &size) in sizes.iter().enumerate() {
        let body = data(size, i as u64);
        let key = format!("obj-{size}");
        put_ok(&mut c, &key, &body, "");
        assert_eq!(get_bytes(&mut c, &key), body, "{size} bytes via HBM");
        let key_d = format!("obj-{size}-dram");
        put_ok(&mut c, &key_d, &body, "&medium=dram");
        assert_eq!(media(&query(&mut c, &key_d)), ["DRAM"]);
        // Read back on another connection (likely another shard).
        let mut other = srv.client();
        assert_eq!(get_bytes(&mut other, &key_d), body, "{size} bytes via DRAM");
    }
    // Device reads reuse their staging buffers: smaller objects read after larger ones come
    // back exact, with nothing left over from the earlier transfers.
    for (i, &size) in sizes.iter().enumerate().rev() {
        assert_eq!(
            get_bytes(&mut c, &format!("obj-{size}")),
            data(size, i as u64),
            "{size} bytes via HBM, again"
        );
    }
    assert_eq!(
        media(&query(&mut c, "obj-1")),
        ["HBM"],
        "HBM is the default medium"
    );
    // Replicas land on distinct ranks.
    let body = data(10_000, 99);
    put_ok(&mut c, "replicated", &body, "&replicas=2&medium=dram");
    let q = query(&mut c, "replicated");
    assert_eq!(q["numBlobs"], 2);
    let mut ranks: Vec<u64> = q["blobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["rank"].as_u64().unwrap())
        .collect();
    ranks.sort();
    assert_eq!(ranks, [0, 1]);
    assert_eq!(get_bytes(&mut c, "replicated"), body);
    put(&mut c, "three", b"x", "&replicas=3")
        .assert_error(200, "Not enough ranks for 3 replicas on HBM (2 available)");
    // A second put of a key is a duplicated object, and changes nothing.
    put(&mut c, "replicated", b"other", "")
        .assert_error(200, "Duplicated object: key already exists");
    assert_eq!(get_bytes(&mut c, "replicated"), body);
    // Parameter errors.
    put(&mut c, "bad", b"x", "&medium=ssd")
        .assert_error(200, "Invalid 'medium' parameter: expected hbm or dram");
    put(&mut c, "bad", b"x", "&replicas=0")
        .assert_error(200, "Invalid 'replicas' parameter: expected 1 to 8");
    c.request("PUT", "/api/v1/objects", Some(b"x"))
        .assert_error(200, "Missing 'key' parameter");
    c.request("PUT", "/api/v1/objects?key=a%0Ab", Some(b"x"))
        .assert_error(200, "Invalid key: control characters are not allowed");
    c.get("/api/v1/objects?key=nope")
        .assert_error(200, "Key not found");
    // Exist and delete.
    let r = c.get("/api/v1/objects/exist?key=replicated");
    assert_eq!(r.text(), r#"{"success":true,"exists":true}"#);
    let r = c.request("DELETE", "/api/v1/objects?key=replicated", None);
    assert_eq!(r.text(), r#"{"success":true,"message":"key deleted"}"#);
    let r = c.get("/api/v1/objects/exist?key=replicated");
    assert_eq!(r.text(), r#"{"success":true,"exists":false}"#);
    // HEAD gives the length without the bytes.
    let r = c.request("HEAD", "/api/v1/objects?key=obj-65536", None);
    assert_eq!(r.header("content-length"), Some("65536"));
    assert!(r.body.is_empty());
    assert_eq!(get_bytes(&mut c, "obj-4097"), data(4097, 4));
}

fn key_endpoints_answer_the_contract(driver: Driver) {
    let srv = ServerBuilder::new(driver)
        .shards(2)
        .set("ock.mmc.local_service.hbm.size", "0")
        .start();
    let mut c = srv.client();
    put_ok(&mut c, "key_a", &[7u8; 100], "");
    put_ok(&mut c, "key_b", &[8u8; 5000], "");

    let r = c.get("/query_key?key=key_a");
    assert_eq!(r.content_type(), "application/json; charset=utf-8");
    let q = r.json();
    let keys: Vec<&str> = q.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    assert_eq!(keys, ["key", "size", "prot", "numBlobs", "valid", "blobs"]);
    assert_eq!(
        (
            q["key"].clone(),
            q["size"].clone(),
            q["prot"].clone(),
            q["numBlobs"].clone(),
            q["valid"].clone()
        ),
        (json!("key_a"), json!(100), json!(0), json!(1), json!(true))
    );
    let blob = &q["blobs"][0];
    let bkeys: Vec<&str> = blob
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(
        bkeys,
        ["rank", "medium", "gva", "state", "leaseTimeoutTtlMs"]
    );
    assert_eq!(
        (
            blob["rank"].clone(),
            blob["medium"].clone(),
            blob["state"].clone()
        ),
        (json!(0), json!("DRAM"), json!(1))
    );
    assert_eq!(blob["leaseTimeoutTtlMs"], 0, "no read yet, no lease");
    assert!(
        blob["gva"].as_u64().unwrap() >= 1 << 40,
        "DRAM gvas live in the DRAM window"
    );
    // A read takes the 2000 ms lease.
    get_bytes(&mut c, "key_a");
    let ttl = query(&mut c, "key_a")["blobs"][0]["leaseTimeoutTtlMs"]
        .as_u64()
        .unwrap();
    assert!(ttl > 0 && ttl <= 2000, "lease ttl {ttl}");
    c.get("/query_key?key=missing")
        .assert_error(200, "Key not found");
    c.get("/query_key")
        .assert_error(200, "Missing 'key' parameter");

    // batch_query_keys: request order, missing keys as valid:false, empty items skipped.
    let r = c.get("/batch_query_keys?keys=key_b,missing,,key_a,");
    let v = r.json();
    assert_eq!(v["success"], true);
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    assert_eq!(data[0]["key"], "key_b");
    assert_eq!(data[0]["size"], 5000);
    assert_eq!(
        data[1].to_string(),
        r#"{"key":"missing","size":0,"prot":0,"numBlobs":0,"valid":false,"blobs":[]}"#
    );
    assert_eq!(data[2]["key"], "key_a");
    c.get("/batch_query_keys")
        .assert_error(200, "Missing 'keys' parameter");

    // get_all_keys: one per line, each ending in \n, streamed.
    for i in 0..50 {
        put_ok(&mut c, &format!("list/{i:02}"), b"v", "");
    }
    let r = c.get("/get_all_keys");
    assert_eq!(r.content_type(), "text/plain; charset=utf-8");
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    let text = r.text();
    assert!(text.ends_with('\n'));
    let mut listed: Vec<&str> = text.lines().collect();
    listed.sort();
    let mut expected: Vec<String> = (0..50).map(|i| format!("list/{i:02}")).collect();
    expected.push("key_a".into());
    expected.push("key_b".into());
    expected.sort();
    assert_eq!(listed, expected);
    let r = c.get("/get_all_keys?prefix=list%2F1");
    let mut listed: Vec<String> = r.text().lines().map(String::from).collect();
    listed.sort();
    assert_eq!(
        listed,
        (10..20).map(|i| format!("list/{i}")).collect::<Vec<_>>()
    );
    assert_eq!(c.get("/get_all_keys?limit=7").text().lines().count(), 7);
    c.get("/get_all_keys?limit=x").assert_error(
        200,
        "Invalid 'limit' parameter: expected a non-negative integer",
    );
    // HTTP/1.0 gets a close-delimited body.
    let mut old = srv.client();
    old.send(b"GET /get_all_keys?prefix=key_ HTTP/1.0\r\n\r\n");
    let raw = String::from_utf8(old.read_to_close()).unwrap();
    let body = raw.split("\r\n\r\n").nth(1).unwrap();
    let mut ks: Vec<&str> = body.lines().collect();
    ks.sort();
    assert_eq!(ks, ["key_a", "key_b"]);

    // DELETE /key and DELETE /all_keys.
    let r = c.request("DELETE", "/key?key=key_b", None);
    assert_eq!(r.text(), r#"{"success":true,"message":"key deleted"}"#);
    c.request("DELETE", "/key?key=key_b", None)
        .assert_error(200, "Key not found");
    let r = c.request("DELETE", "/all_keys", None);
    assert_eq!(r.text(), r#"{"success":true,"message":"all keys deleted"}"#);
    let r = c.get("/get_all_keys");
    assert_eq!((r.status, r.body.len()), (200, 0), "empty listing");
    c.get("/query_key?key=key_a")
        .assert_error(200, "Key not found");
    assert_eq!(c.request("GET", "/key?key=x", None).status, 405);
}

fn segments_and_capacity_equal_what_is_allocated(driver: Driver) {
    let dir = temp_dir("segs");
    let srv = ServerBuilder::new(driver)
        .shards(2)
        .set("ock.mmc.embedded.ranks", "2")
        .set("ock.mmc.local_service.hbm.size", "64MB")
        .set("ock.mmc.local_service.dram.size", "32MB")
        .set("ock.mmc.ssd.enable", "true")
        .set("ock.mmc.ssd.path", dir.to_str().unwrap())
        .set("ock.mmc.ssd.size", "128MB")
        .start();
    let mut c = srv.client();
    let r = c.get("/get_all_segments");
    assert_eq!(r.content_type(), "text/plain; charset=utf-8");
    assert_eq!(
        r.text(),
        "rank-0-hbm\nrank-1-hbm\nrank-0-dram\nrank-1-dram\nrank-0-ssd\nrank-1-ssd\n",
        "grouped by medium, then rank"
    );
    assert!(dir.join("mmc-rank-0.ssd").exists());
    // Sizes chosen to exercise page rounding.
    let sizes = [1u64, 4096, 5000, 100_000, 1 << 20];
    let mut expected_hbm = 0;
    for (i, &s) in sizes.iter().enumerate() {
        put_ok(
            &mut c,
            &format!("s{i}"),
            &data(s as usize, i as u64),
            "&replicas=2",
        );
        expected_hbm += page_round(s);
    }
    let used0 = segment_used(&mut c, "rank-0-hbm");
    let used1 = segment_used(&mut c, "rank-1-hbm");
    assert_eq!(
        (used0, used1),
        (expected_hbm, expected_hbm),
        "each rank holds one replica of each"
    );
    let r = c.get("/query_segment?segment=rank-0-hbm");
    let q = r.json();
    let keys: Vec<&str> = q.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "segment",
            "medium",
            "total_bytes",
            "used_bytes",
            "remaining_bytes",
            "remaining_ratio"
        ]
    );
    assert_eq!(q["medium"], "HBM");
    assert_eq!(q["total_bytes"], 64 << 20);
    assert_eq!(q["remaining_bytes"], (64u64 << 20) - expected_hbm);
    let ratio = q["remaining_ratio"].as_f64().unwrap();
    // Ratios carry the contract's ten digits after the point.
    assert!((ratio - ((64u64 << 20) - expected_hbm) as f64 / (64u64 << 20) as f64).abs() <= 5e-11);
    c.get("/query_segment?segment=rank-9-hbm")
        .assert_error(200, "Segment not found");
    c.get("/query_segment")
        .assert_error(200, "Missing 'segment' parameter");

    let r = c.get("/api/v1/segments/status?segment=rank-1-dram");
    assert_eq!(
        r.text(),
        r#"{"success":true,"segment":"rank-1-dram","status":1,"status_name":"OK"}"#
    );
    c.get("/api/v1/segments/status?segment=nope")
        .assert_error(200, "Segment not found");

    let u = c.get("/api/v1/capacity/usage").json();
    let keys: Vec<&str> = u.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    assert_eq!(
        keys,
        ["timestamp", "data_source_ready", "degraded", "npu", "cpu"]
    );
    assert_eq!(u["data_source_ready"], true);
    assert_eq!(u["degraded"], false);
    assert!(u["timestamp"].as_u64().unwrap() > 1_700_000_000);
    assert_eq!(u["npu"]["total_bytes"], 128 << 20);
    assert_eq!(u["npu"]["used_bytes"], 2 * expected_hbm);
    assert_eq!(u["npu"]["free_bytes"], (128u64 << 20) - 2 * expected_hbm);
    assert_eq!(
        u["cpu"],
        json!({"total_bytes": 64 << 20, "used_bytes": 0, "free_bytes": 64 << 20, "usage_ratio": 0})
    );

    let rem = c.get("/api/v1/capacity/segment_remaining").json();
    let segs = rem["segments"].as_array().unwrap();
    assert_eq!(segs.len(), 6);
    assert_eq!(segs[0]["segment_name"], "rank-0-hbm");
    assert_eq!(segs[0]["used_bytes"], expected_hbm);
    let keys: Vec<&str> = segs[0]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(
        keys,
        [
            "segment_name",
            "medium",
            "total_bytes",
            "used_bytes",
            "remaining_bytes",
            "remaining_ratio"
        ]
    );
    assert_eq!(segs[5]["medium"], "SSD");

    for (m, p) in [
        ("POST", "/api/v1/drain_jobs"),
        ("GET", "/api/v1/drain_jobs/query?job_id=j"),
        ("POST", "/api/v1/drain_jobs/cancel?job_id=j"),
    ] {
        c.request(m, p, None).assert_error(200, "Not supported");
    }
    // Deleting everything returns the bytes.
    c.request("DELETE", "/all_keys", None);
    assert_eq!(segment_used(&mut c, "rank-0-hbm"), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

fn eviction_moves_blobs_down_and_loses_nothing(driver: Driver) {
    let dir = temp_dir("evict");
    let srv = tiered(driver, "2MB", "4MB", &dir).start();
    let mut c = srv.client();
    let n = 48;
    for i in 0..n {
        put_ok(
            &mut c,
            &format!("m@1@0@{i:x}@fp16"),
            &data(256 << 10, i),
            "",
        );
    }
    // HBM and DRAM stay near their watermarks; the rest went down to SSD.
    eventually("flushes land", || segment_used(&mut c, "rank-0-ssd") > 0);
    assert!(segment_used(&mut c, "rank-0-hbm") <= 2 << 20);
    let mut seen = std::collections::BTreeMap::new();
    for i in 0..n {
        let key = format!("m@1@0@{i:x}@fp16");
        for m in media(&query(&mut c, &key)) {
            *seen.entry(m).or_insert(0) += 1;
        }
    }
    assert!(
        seen.contains_key("HBM") && seen.contains_key("DRAM") && seen.contains_key("SSD"),
        "{seen:?}"
    );
    // Nothing was read yet, so every DRAM copy came down from HBM; nothing was dropped.
    let m = crate::observability::scrape(&mut c);
    assert!(
        m["memcache_demoted_blobs_total"] >= seen["DRAM"] as f64,
        "{} demoted, {seen:?}",
        m["memcache_demoted_blobs_total"]
    );
    assert_eq!(m["memcache_evict_deleted_objects_total"], 0.0);
    assert_eq!(m["memcache_flush_failed_total"], 0.0);
    // Every acknowledged object reads back intact, whatever tier it is on.
    for i in 0..n {
        assert_eq!(
            get_bytes(&mut c, &format!("m@1@0@{i:x}@fp16")),
            data(256 << 10, i),
            "object {i}"
        );
    }
    // A put larger than the medium fails clearly and evicts nothing.
    let before = c.get("/get_all_keys").text().lines().count();
    put(&mut c, "huge", &vec![0u8; 3 << 20], "").assert_error(
        200,
        "Object of 3145728 bytes is larger than HBM capacity (2097152 bytes)",
    );
    assert_eq!(c.get("/get_all_keys").text().lines().count(), before);
    let _ = std::fs::remove_dir_all(&dir);
}

fn rewarm_serves_ssd_objects_from_dram(driver: Driver) {
    let dir = temp_dir("rewarm");
    let srv = tiered(driver, "0", "2MB", &dir)
        .set("ock.mmc.lease_ms", "100")
        .start();
    let mut c = srv.client();
    for i in 0..16u64 {
        put_ok(&mut c, &format!("r{i}"), &data(200 << 10, i), "");
    }
    eventually("r0 reaches SSD only", || {
        media(&query(&mut c, "r0")) == ["SSD"]
    });
    // The read rewarms into DRAM and serves from there; the SSD copy stays.
    assert_eq!(get_bytes(&mut c, "r0"), data(200 << 10, 0));
    assert_eq!(media(&query(&mut c, "r0")), ["DRAM", "SSD"]);
    assert_eq!(get_bytes(&mut c, "r0"), data(200 << 10, 0));
    // Everything still reads back.
    for i in 0..16u64 {
        assert_eq!(
            get_bytes(&mut c, &format!("r{i}")),
            data(200 << 10, i),
            "object {i}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn leases_block_eviction_and_delay_frees(driver: Driver) {
    let srv = ServerBuilder::new(driver)
        .shards(1)
        .set("ock.mmc.local_service.hbm.size", "0")
        .set("ock.mmc.local_service.dram.size", "1MB")
        .set("ock.mmc.lease_ms", "3000")
        .start();
    let mut c = srv.client();
    put_ok(&mut c, "leased", &data(300 << 10, 1), "");
    get_bytes(&mut c, "leased"); // takes the lease
    put_ok(&mut c, "other", &data(300 << 10, 2), "");
    // No room for this one: the unleased least recently used object is evicted (there is
    // no lower tier, so it is deleted); the leased one is not. Afterwards the medium is below
    // its low watermark (800 KiB of 1 MiB < 80 %), so the drain that the put started stops
    // there and the housekeeping tick evicts nothing more.
    put_ok(&mut c, "third", &data(500 << 10, 3), "");
    c.get("/query_key?key=other")
        .assert_error(200, "Key not found");
    assert_eq!(get_bytes(&mut c, "leased"), data(300 << 10, 1));
    assert_eq!(get_bytes(&mut c, "third"), data(500 << 10, 3));
    // Now both are leased: nothing can be evicted for another put.
    put(&mut c, "fourth", &data(300 << 10, 4), "").assert_error(
        200,
        "No space on DRAM for 307200 bytes, even after eviction",
    );
    // A remove of a leased key succeeds at once; its bytes are freed when the lease ends.
    let r = c.request("DELETE", "/key?key=leased", None);
    assert_eq!(r.text(), r#"{"success":true,"message":"key deleted"}"#);
    c.get("/query_key?key=leased")
        .assert_error(200, "Key not found");
    let third = page_round(500 << 10);
    assert_eq!(
        segment_used(&mut c, "rank-0-dram"),
        page_round(300 << 10) + third
    );
    eventually("the lease ends and frees the blob", || {
        segment_used(&mut c, "rank-0-dram") == third
    });
}

fn ssd_write_errors_keep_the_memory_copy(driver: Driver) {
    let dir = temp_dir("enospc");
    let srv = tiered(driver, "0", "2MB", &dir)
        .env("MMC_FAULT_SSD_WRITE", "enospc")
        .start();
    let mut c = srv.client();
    let mut stored = Vec::new();
    for i in 0..12u64 {
        let r = put(&mut c, &format!("w{i}"), &data(200 << 10, i), "");
        if r.json()["success"] == true {
            stored.push(i);
        }
        // Let the failed flushes land before the next put.
        std::thread::sleep(Duration::from_millis(20));
    }
    // The first failed flush faults the SSD tier (its memory copy stays); from then on DRAM
    // evicts by deleting, so puts keep succeeding.
    assert_eq!(stored.len(), 12, "puts kept succeeding: {stored:?}");
    // What memory still holds reads back identical; the rest was evicted by deleting.
    let mut kept = 0;
    for &i in &stored {
        let key = format!("w{i}");
        let r = c.get(&format!("/api/v1/objects?key={key}"));
        if r.content_type() == "application/octet-stream" {
            assert_eq!(r.body, data(200 << 10, i), "object {i}");
            assert_eq!(media(&query(&mut c, &key)), ["DRAM"]);
            kept += 1;
        } else {
            r.assert_error(200, "Key not found");
        }
    }
    assert!(kept >= 6, "{kept} objects kept");
    assert_eq!(segment_used(&mut c, "rank-0-ssd"), 0);
    eventually("the write error is logged", || {
        srv.log().contains("SSD write of")
    });
    let log = srv.log();
    assert_eq!(
        log.matches("SSD write of").count(),
        1,
        "logged once per cause:\n{log}"
    );
    assert!(log.contains("No space left on device"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn ssd_read_errors_are_reported_and_lose_nothing(driver: Driver) {
    let dir = temp_dir("eio");
    let srv = tiered(driver, "0", "2MB", &dir)
        .env("MMC_FAULT_SSD_READ", "eio")
        .start();
    let mut c = srv.client();
    for i in 0..16u64 {
        put_ok(&mut c, &format!("e{i}"), &data(200 << 10, i), "");
    }
    eventually("e0 reaches SSD only", || {
        media(&query(&mut c, "e0")) == ["SSD"]
    });
    c.get("/api/v1/objects?key=e0")
        .assert_error(200, "I/O error while rewarming the object from SSD");
    // The object is still there (its SSD copy is intact as far as we know).
    assert_eq!(query(&mut c, "e0")["valid"], true);
    assert_eq!(media(&query(&mut c, "e0")), ["SSD"]);
    // The log line is read from the server's stderr by another thread.
    eventually("the read error is logged", || {
        srv.log().contains("SSD read of")
    });
    let _ = std::fs::remove_dir_all(&dir);
}

fn memory_evict_and_prefetch(driver: Driver) {
    let dir = temp_dir("memory");
    let srv = tiered(driver, "0", "64MB", &dir).start();
    let mut c = srv.client();
    let j = [("Content-Type", "application/json")];
    // Body validation.
    let r = c.request_with(
        "POST",
        "/memory/evict",
        &[("Content-Type", "text/plain")],
        Some(b"{}"),
    );
    r.assert_error(
        415,
        "Unsupported media type: expected Content-Type: application/json",
    );
    c.request_with("POST", "/memory/evict", &j, Some(b"{not json"))
        .assert_error(200, "Invalid JSON body");
    c.request_with("POST", "/memory/evict", &j, Some(b"[1]"))
        .assert_error(200, "Invalid JSON body");
    c.request_with("POST", "/memory/evict", &j, Some(b"{}"))
        .assert_error(200, "Missing 'chunk_hashes' in request body");
    c.request_with(
        "POST",
        "/memory/prefetch",
        &j,
        Some(b"{\"lookup_id\":\"x\"}"),
    )
    .assert_error(200, "Missing 'chunk_hashes' in request body");
    c.request_with(
        "POST",
        "/memory/evict",
        &j,
        Some(br#"{"chunk_hashes":[1]}"#),
    )
    .assert_error(200, "Invalid 'chunk_hashes': expected an array of strings");

    // Two workers' keys share chunk hash a1; another key has b2.
    for k in [
        "llama@2@0@a1@bf16",
        "llama@2@1@a1@bf16",
        "llama@2@0@b2@bf16",
        "plain",
    ] {
        put_ok(&mut c, k, &data(8192, k.len() as u64), "");
    }
    // Down one tier: DRAM → SSD for every object the hash names.
    let r = c.request_with(
        "POST",
        "/memory/evict",
        &[("Content-Type", "application/json; charset=utf-8")],
        Some(br#"{"chunk_hashes":["0xa1"],"locations":["LocalCPUBackend"]}"#),
    );
    assert_eq!(r.text(), r#"{"status":"success","num_evicted":2}"#);
    eventually("a1 objects reach SSD", || {
        media(&query(&mut c, "llama@2@0@a1@bf16")) == ["SSD"]
            && media(&query(&mut c, "llama@2@1@a1@bf16")) == ["SSD"]
    });
    assert_eq!(media(&query(&mut c, "llama@2@0@b2@bf16")), ["DRAM"]);
    // Prefetch brings them back up.
    let r = c.request_with(
        "POST",
        "/memory/prefetch",
        &j,
        Some(br#"{"chunk_hashes":["a1","ffff"],"lookup_id":"req_001"}"#),
    );
    assert_eq!(
        r.text(),
        r#"{"status":"prefetch_started","lookup_id":"req_001","num_chunks":2}"#
    );
    eventually("a1 objects rewarmed", || {
        media(&query(&mut c, "llama@2@0@a1@bf16")) == ["DRAM", "SSD"]
            && media(&query(&mut c, "llama@2@1@a1@bf16")) == ["DRAM", "SSD"]
    });
    let r = c.request_with(
        "POST",
        "/memory/prefetch",
        &j,
        Some(br#"{"chunk_hashes":[]}"#),
    );
    assert_eq!(
        r.text(),
        r#"{"status":"prefetch_started","lookup_id":"","num_chunks":0}"#
    );
    // Without locations: deleted everywhere. A hash also names the key equal to it.
    let r = c.request_with(
        "POST",
        "/memory/evict",
        &j,
        Some(br#"{"chunk_hashes":["a1","plain"],"locations":null}"#),
    );
    assert_eq!(
        r.text(),
        r#"{"status":"success","num_evicted":5}"#,
        "2 objects on DRAM+SSD, 1 on DRAM"
    );
    for k in ["llama@2@0@a1@bf16", "llama@2@1@a1@bf16", "plain"] {
        c.get(&format!("/query_key?key={}", pct(k.as_bytes())))
            .assert_error(200, "Key not found");
    }
    assert_eq!(get_bytes(&mut c, "llama@2@0@b2@bf16"), data(8192, 17));
    let r = c.request_with(
        "POST",
        "/memory/evict",
        &j,
        Some(br#"{"chunk_hashes":["b2"],"locations":["Nowhere"]}"#),
    );
    r.assert_error(200, "Unknown location \"Nowhere\": expected LocalCPUBackend, LocalDiskBackend, HBM, DRAM or SSD");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `POST /memory/evict` with `locations` moves a copy one tier down or leaves it: without a
/// tier below (no SSD here) the object stays readable (issue 27 D5: it was deleted); an HBM
/// copy goes to DRAM, not further.
fn evict_with_locations_never_deletes(driver: Driver) {
    let srv = ServerBuilder::new(driver)
        .set("ock.mmc.local_service.hbm.size", "16MB")
        .set("ock.mmc.local_service.dram.size", "16MB")
        .start();
    let mut c = srv.client();
    let j = [("Content-Type", "application/json")];
    put_ok(&mut c, "llama@2@0@c3@bf16", &data(5000, 1), "&medium=dram");
    put_ok(&mut c, "llama@2@0@d4@bf16", &data(6000, 2), "&medium=hbm");
    for loc in ["LocalCPUBackend", "DRAM"] {
        let body = format!(r#"{{"chunk_hashes":["c3"],"locations":["{loc}"]}}"#);
        let r = c.request_with("POST", "/memory/evict", &j, Some(body.as_bytes()));
        assert_eq!(r.text(), r#"{"status":"success","num_evicted":0}"#, "{loc}");
        assert_eq!(
            get_bytes(&mut c, "llama@2@0@c3@bf16"),
            data(5000, 1),
            "{loc}"
        );
    }
    let r = c.request_with(
        "POST",
        "/memory/evict",
        &j,
        Some(br#"{"chunk_hashes":["d4"],"locations":["HBM"]}"#),
    );
    assert_eq!(r.text(), r#"{"status":"success","num_evicted":1}"#);
    assert_eq!(media(&query(&mut c, "llama@2@0@d4@bf16")), ["DRAM"]);
    assert_eq!(get_bytes(&mut c, "llama@2@0@d4@bf16"), data(6000, 2));
    let m = c.get("/metrics").text();
    assert!(m.contains("\nmemcache_evict_operations_total 1\n"), "{m}");
    assert!(m.contains("\nmemcache_stored_keys 2\n"), "{m}");
}

fn prefault_commits_memory_segments_at_mount(driver: Driver) {
    let lazy = ServerBuilder::new(driver)
        .set("ock.mmc.local_service.dram.size", "96MB")
        .set("ock.mmc.local_service.hbm.size", "64MB")
        .start();
    let eager = ServerBuilder::new(driver)
        .set("ock.mmc.local_service.dram.size", "96MB")
        .set("ock.mmc.local_service.hbm.size", "64MB")
        .set("ock.mmc.segment.prefault", "true")
        .start();
    // 160 MB of segments: committed in the background by the eager server only.
    eventually("the segments are committed", || {
        rss_kib(eager.pid()) > rss_kib(lazy.pid()) + 150_000
    });
    assert!(
        rss_kib(lazy.pid()) < 100_000,
        "a lazy server commits nothing up front"
    );
    // Committing changes no byte: objects put meanwhile and after read back intact, and a
    // segment mounted at run time is committed too.
    let mut c = eager.client();
    put_ok(&mut c, "k", &data(1 << 20, 7), "");
    assert_eq!(get_bytes(&mut c, "k"), data(1 << 20, 7));
    let before = rss_kib(eager.pid());
    let r = c.request(
        "POST",
        "/api/v1/segments/mount?rank=1&medium=dram&size=64MB",
        None,
    );
    assert_eq!(r.text(), r#"{"success":true,"segment":"rank-1-dram"}"#);
    eventually("the mounted segment is committed", || {
        rss_kib(eager.pid()) > before + 60_000
    });
    assert_eq!(get_bytes(&mut c, "k"), data(1 << 20, 7));
}

fn mount_and_unmount_segments(driver: Driver) {
    let srv = ServerBuilder::new(driver)
        .shards(2)
        .set("ock.mmc.local_service.hbm.size", "0")
        .start();
    let mut c = srv.client();
    put(&mut c, "two", b"x", "&replicas=2")
        .assert_error(200, "Not enough ranks for 2 replicas on DRAM (1 available)");
    // A medium with no segment says so, and what to change.
    put(&mut c, "on-hbm", b"x", "&medium=hbm").assert_error(
        200,
        "No HBM segment is mounted: mount one, or set ock.mmc.local_service.hbm.size",
    );
    // An SSD mount without a path when no SSD directory is configured names the key.
    c.request("POST", "/api/v1/segments/mount?rank=1&medium=ssd&size=1MB", None)
        .assert_error(
            200,
            "Missing 'path' parameter: no SSD directory is configured (ock.mmc.ssd.path), so an SSD mount must name its path",
        );
    let r = c.request(
        "POST",
        "/api/v1/segments/mount?rank=1&medium=dram&size=64MB",
        None,
    );
    assert_eq!(r.text(), r#"{"success":true,"segment":"rank-1-dram"}"#);
    c.request(
        "POST",
        "/api/v1/segments/mount?rank=1&medium=dram&size=64MB",
        None,
    )
    .assert_error(200, "Segment rank-1-dram is already mounted");
    c.request(
        "POST",
        "/api/v1/segments/mount?rank=1&medium=tape&size=1MB",
        None,
    )
    .assert_error(200, "Invalid 'medium' parameter: expected hbm, dram or ssd");
    c.request("POST", "/api/v1/segments/mount?medium=dram&size=1MB", None)
        .assert_error(200, "Missing 'rank' parameter");
    assert_eq!(
        c.get("/get_all_segments").text(),
        "rank-0-dram\nrank-1-dram\n"
    );
    let body = data(100_000, 5);
    put_ok(&mut c, "two", &body, "&replicas=2");
    for i in 0..20u64 {
        put_ok(&mut c, &format!("u{i}"), &data(50_000, i), "");
    }
    // Unmount: blobs move to the other DRAM segment or are dropped when a copy exists.
    let r = c.request("POST", "/api/v1/segments/unmount?segment=rank-1-dram", None);
    assert_eq!(r.text(), r#"{"success":true,"segment":"rank-1-dram"}"#);
    assert_eq!(c.get("/get_all_segments").text(), "rank-0-dram\n");
    c.get("/query_segment?segment=rank-1-dram")
        .assert_error(200, "Segment not found");
    assert_eq!(get_bytes(&mut c, "two"), body);
    let q = query(&mut c, "two");
    assert_eq!(
        (q["numBlobs"].clone(), q["blobs"][0]["rank"].clone()),
        (json!(1), json!(0))
    );
    for i in 0..20u64 {
        assert_eq!(get_bytes(&mut c, &format!("u{i}")), data(50_000, i));
    }
    c.request("POST", "/api/v1/segments/unmount?segment=rank-1-dram", None)
        .assert_error(200, "Segment not found");
    // The last DRAM segment can go too: its objects are dropped (nothing else can hold them).
    let r = c.request("POST", "/api/v1/segments/unmount?segment=rank-0-dram", None);
    assert_eq!(r.json()["success"], true);
    c.get("/api/v1/objects?key=u1")
        .assert_error(200, "Key not found");
    put(&mut c, "after", b"x", "").assert_error(200, "No memory segment is mounted");
}

fn batch_routes(driver: Driver) {
    let srv = ServerBuilder::new(driver).shards(3).start();
    let mut c = srv.client();
    put_ok(&mut c, "exists", b"old", "");
    let objs: Vec<Vec<u8>> = (0..5).map(|i| data(1000 * i + 7, i as u64)).collect();
    let body: Vec<u8> = objs.concat();
    let sizes: Vec<String> = objs.iter().map(|o| o.len().to_string()).collect();
    let r = c.request(
        "POST",
        &format!(
            "/api/v1/objects/batch_put?keys=b0,b1,exists,b3,b4&sizes={}",
            sizes.join(",")
        ),
        Some(&body),
    );
    let v = r.json();
    assert_eq!(v["success"], true);
    let results = v["results"].as_array().unwrap();
    assert_eq!(results[0], json!({"key":"b0","success":true,"size":7}));
    assert_eq!(
        results[2],
        json!({"key":"exists","success":false,"error_message":"Duplicated object: key already exists","error_code":"duplicated_object"})
    );
    assert_eq!(results[4]["success"], true);
    c.request(
        "POST",
        "/api/v1/objects/batch_put?keys=x,y&sizes=1",
        Some(b"a"),
    )
    .assert_error(200, "'keys' names 2 objects but 'sizes' gives 1 sizes");
    c.request(
        "POST",
        "/api/v1/objects/batch_put?keys=x,y&sizes=1,1",
        Some(b"abc"),
    )
    .assert_error(200, "Body length 3 does not match the sum of sizes 2");

    // batch_get: per key an 8-byte big-endian length and the bytes; u64::MAX for missing.
    let r = c.get("/api/v1/objects/batch_get?keys=b1,missing,exists,b4");
    assert_eq!(r.content_type(), "application/octet-stream");
    let mut expect = Vec::new();
    for part in [
        Some(objs[1].clone()),
        None,
        Some(b"old".to_vec()),
        Some(objs[4].clone()),
    ] {
        match part {
            Some(p) => {
                expect.extend_from_slice(&(p.len() as u64).to_be_bytes());
                expect.extend_from_slice(&p);
            }
            None => expect.extend_from_slice(&u64::MAX.to_be_bytes()),
        }
    }
    assert_eq!(r.body, expect);

    let r = c.get("/api/v1/objects/batch_exist?keys=b0,nope,b3");
    assert_eq!(r.text(), r#"{"success":true,"exists":[true,false,true]}"#);
    let r = c.request("POST", "/api/v1/objects/batch_remove?keys=b0,nope,b3", None);
    assert_eq!(
        r.text(),
        r#"{"success":true,"results":[{"key":"b0","success":true},{"key":"nope","success":false,"error_message":"Key not found","error_code":"key_not_found"},{"key":"b3","success":true}]}"#
    );
    let r = c.get("/api/v1/objects/batch_exist?keys=b0,b3,b4");
    assert_eq!(r.text(), r#"{"success":true,"exists":[false,false,true]}"#);
    c.get("/api/v1/objects/batch_get")
        .assert_error(200, "Missing 'keys' parameter");
}

/// `DELETE /all_keys` of many keys answers at once and holds no shard: the keys leave the
/// index in O(1), their objects are freed in slices behind it (issue 12: it was quadratic,
/// 85 s at 1 M keys with its shard answering nothing).
#[test]
fn remove_all_of_many_keys_holds_no_shard() {
    const KEYS: usize = 200_000;
    const PER_REQUEST: usize = 600;
    let srv = ServerBuilder::new(Driver::Epoll)
        .shards(2)
        .set("ock.mmc.local_service.hbm.size", "0")
        .set("ock.mmc.local_service.dram.size", "2GB")
        // The debug server's per-tick store check walks every object: off for a load this big.
        .env("MMC_DEBUG_CHECK", "0")
        .start();
    let mut c = srv.client();
    // Empty objects: each takes a page of the segment's address space, no memory.
    let started = Instant::now();
    for first in (0..KEYS).step_by(PER_REQUEST) {
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "loading took too long"
        );
        let keys: Vec<String> = (first..KEYS.min(first + PER_REQUEST))
            .map(|i| format!("k{i}"))
            .collect();
        let sizes = vec!["0"; keys.len()].join(",");
        let r = c.request(
            "POST",
            &format!(
                "/api/v1/objects/batch_put?keys={}&sizes={sizes}",
                keys.join(",")
            ),
            Some(b""),
        );
        let results = r.json()["results"].as_array().unwrap().clone();
        assert_eq!(results.len(), keys.len());
        assert!(results.iter().all(|x| x["success"] == true), "{results:?}");
    }
    let used = |c: &mut Client| {
        c.get("/api/v1/capacity/usage").json()["cpu"]["used_bytes"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(used(&mut c), (KEYS as u64) * 4096);

    // /health on other connections (one per shard, most likely) the whole time.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pingers: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            let mut h = srv.client();
            std::thread::spawn(move || {
                let mut worst = Duration::ZERO;
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let t = Instant::now();
                    assert_eq!(h.get("/health").status, 200);
                    worst = worst.max(t.elapsed());
                    n += 1;
                    std::thread::sleep(Duration::from_millis(2));
                }
                (worst, n)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    let r = c.request("DELETE", "/all_keys", None);
    let took = t.elapsed();
    assert_eq!(r.text(), r#"{"success":true,"message":"all keys deleted"}"#);
    assert!(
        took < Duration::from_secs(2),
        "DELETE /all_keys took {took:?}"
    );
    // The keys are gone when it answers.
    let t = Instant::now();
    let r = c.get("/get_all_keys?prefix=nothing-has-this");
    assert_eq!((r.status, r.body.len()), (200, 0));
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(c.get("/get_all_keys").body.len(), 0);
    c.get("/query_key?key=k7")
        .assert_error(200, "Key not found");
    // The bytes follow in slices; meanwhile the shards keep answering.
    let deadline = Instant::now() + Duration::from_secs(60);
    while used(&mut c) != 0 {
        assert!(
            Instant::now() < deadline,
            "bytes still used: {}",
            used(&mut c)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for p in pingers {
        let (worst, n) = p.join().unwrap();
        assert!(n > 10, "{n} health checks");
        assert!(
            worst < Duration::from_millis(500),
            "a /health waited {worst:?}"
        );
    }
    // The store works as before.
    put_ok(&mut c, "after", b"abc", "");
    assert_eq!(c.get("/get_all_keys").text(), "after\n");
    let m = c.get("/metrics").text();
    let stored = m
        .lines()
        .find_map(|l| l.strip_prefix("memcache_stored_keys "))
        .map(|v| v.trim().parse::<f64>().unwrap());
    assert_eq!(
        stored,
        Some(1.0),
        "stored keys after the remove_all and one put"
    );
}

/// A process's mapped address space in KiB (`VmSize`): a segment's mapping counts whole,
/// touched or not (adjacent anonymous mappings merge, so they are not told apart in maps).
fn vm_size_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Files `pid` holds open under `dir`.
fn open_files_under(pid: u32, dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// Unmount gives back what the mount took: the memory, the mapping itself (every shard drops
/// its share of the segment), an SSD segment's open file; mounting again works.
fn unmount_gives_back_the_mapping_the_memory_and_the_file(driver: Driver) {
    const GIB: u64 = 1 << 30;
    let dir = temp_dir("unmount");
    let srv = ServerBuilder::new(driver)
        .shards(2)
        .set("ock.mmc.local_service.hbm.size", "0")
        .set("ock.mmc.local_service.dram.size", "16MB")
        .start();
    let pid = srv.pid();
    let mut c = srv.client();
    let vm_before = vm_size_kib(pid);
    let rss_before = rss_kib(pid);
    for round in 0..2 {
        let r = c.request(
            "POST",
            "/api/v1/segments/mount?rank=1&medium=dram&size=1GB",
            None,
        );
        assert_eq!(
            r.text(),
            r#"{"success":true,"segment":"rank-1-dram"}"#,
            "round {round}"
        );
        assert!(vm_size_kib(pid) >= vm_before + GIB / 1024, "mapped");
        // 400 MiB, all on the new segment (the one with room).
        let body = data(4 << 20, round);
        for i in 0..100 {
            put_ok(&mut c, &format!("big{i}"), &body, "");
        }
        assert_eq!(query(&mut c, "big99")["blobs"][0]["rank"], 1);
        let rss_full = rss_kib(pid);
        assert!(
            rss_full >= rss_before + 380 * 1024,
            "filled: {rss_full} KiB, before {rss_before} KiB"
        );
        let r = c.request("POST", "/api/v1/segments/unmount?segment=rank-1-dram", None);
        assert_eq!(r.text(), r#"{"success":true,"segment":"rank-1-dram"}"#);
        let vm = vm_size_kib(pid);
        assert!(
            vm < vm_before + GIB / 2048,
            "the mapping stayed: {vm} KiB mapped, {vm_before} KiB before the mount"
        );
        let rss_after = rss_kib(pid);
        assert!(
            rss_after <= rss_before + 96 * 1024,
            "after unmount: {rss_after} KiB, before the mount {rss_before} KiB"
        );
        c.request("DELETE", "/all_keys", None);
    }
    // An SSD segment's file is closed once unmounted.
    let r = c.request(
        "POST",
        &format!(
            "/api/v1/segments/mount?rank=1&medium=ssd&size=8MB&path={}",
            pct(dir.to_str().unwrap().as_bytes())
        ),
        None,
    );
    assert_eq!(r.text(), r#"{"success":true,"segment":"rank-1-ssd"}"#);
    assert_eq!(open_files_under(pid, &dir).len(), 1);
    let r = c.request("POST", "/api/v1/segments/unmount?segment=rank-1-ssd", None);
    assert_eq!(r.text(), r#"{"success":true,"segment":"rank-1-ssd"}"#);
    assert_eq!(
        open_files_under(pid, &dir),
        Vec::<std::path::PathBuf>::new()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A 2 MB HBM tier over 32 MB of DRAM in 1 MB runs, no leases: a few puts into HBM make its
/// watermark drains demote to DRAM.
pub fn with_a_small_hbm(b: ServerBuilder) -> ServerBuilder {
    b.set("ock.mmc.local_service.hbm.size", "2MB")
        .set("ock.mmc.local_service.dram.size", "32MB")
        .set("ock.mmc.segment.run_bytes", "1MB")
        .set("ock.mmc.lease_ms", "0")
}

/// Puts `mv/0` .. `mv/{n-1}`, 256 KiB each (`data(256 << 10, i)`), into HBM.
pub fn put_into_hbm(c: &mut Client, n: u64) {
    for i in 0..n {
        put_ok(c, &format!("mv/{i}"), &data(256 << 10, i), "&medium=hbm");
    }
}

#[test]
fn a_drain_s_demotions_are_copied_by_the_mover_off_the_shards_cpu() {
    // HBM fills: each put's drain moves older blobs to DRAM as jobs the mover thread copies
    // (`shards/mover.rs`), with the bytes intact, and the mover may run on every CPU of the
    // process (it inherits a shard's pinning when it starts; left there it could copy only
    // while that shard waits).
    let srv = with_a_small_hbm(ServerBuilder::new(Driver::Epoll).shards(2)).start();
    let mut c = srv.client();
    let n = 24;
    put_into_hbm(&mut c, n);
    let m = crate::observability::scrape(&mut c);
    assert!(m["memcache_demoted_blobs_total"] > 0.0, "nothing demoted");
    assert_eq!(m["memcache_evict_deleted_objects_total"], 0.0);
    for i in 0..n {
        let key = format!("mv/{i}");
        assert_eq!(get_bytes(&mut c, &key), data(256 << 10, i), "{key}");
    }
    let in_dram = (0..n)
        .filter(|i| media(&query(&mut c, &format!("mv/{i}"))).contains(&"DRAM".to_string()))
        .count();
    assert!(in_dram > 0, "no object in DRAM");
    let process = crate::same_host::thread_cpus(srv.pid(), "mmc-server").expect("main thread");
    let mover = crate::same_host::thread_cpus(srv.pid(), "mmc-mover").expect("the mover");
    assert_eq!(
        mover, process,
        "the mover may run on every CPU of the process"
    );
}
