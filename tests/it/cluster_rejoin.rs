//! A rank restarted under load keeps what it is given (issue 25, defect 6), and a busy meta
//! still hears its ranks. A pure meta service and local services as separate processes, as in
//! `cluster.rs`, whose helpers these tests use.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::cluster::{follow, join, local_builder, meta, split_location, wait_segments};
use crate::cluster_ssd::metric;
use crate::harness::{Client, Response, ServerBuilder};

const EVICTED: &str = "memcache_evict_deleted_objects_total";

/// One request on a fresh connection; `None` when the peer is not there or the connection
/// broke (a rank being killed).
fn try_request(
    to: SocketAddr,
    method: &str,
    target: &str,
    body: Option<&[u8]>,
) -> Option<Response> {
    let mut c = Client::try_connect(to)?;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        c.request(method, target, body)
    }))
    .ok()
}

/// A small churn, as a client of a cache does: put an object of 200 KB, read it, delete it.
/// The read takes a lease, so each deleted object's blob stays held until the lease ends.
/// Counts the cycles whose put was acknowledged; errors (a rank being killed) are skipped.
fn churn(meta: SocketAddr, stop: &AtomicBool, cycles: &AtomicUsize) {
    let body = vec![7u8; 200_000];
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let key = format!("churn-{i}");
        let target = format!("/api/v1/objects?key={key}");
        let Some(r) = try_request(meta, "PUT", &target, Some(&body)) else {
            continue;
        };
        let done = if r.status == 307 {
            let (to, hop) = split_location(r.header("location").unwrap());
            try_request(to, "PUT", &hop, Some(&body))
        } else {
            Some(r)
        };
        if !done.is_some_and(|d| d.status == 200 && d.json()["success"] == true) {
            continue;
        }
        // The meta's answer (a redirect) is the read: it takes the lease.
        let _ = try_request(meta, "GET", &target, None);
        let _ = try_request(meta, "DELETE", &target, None);
        cycles.fetch_add(1, Ordering::Relaxed);
    }
}

fn dram_usage(meta: &crate::harness::Server) -> (u64, u64) {
    let u = meta.client().get("/api/v1/capacity/usage").json();
    (
        u["cpu"]["used_bytes"].as_u64().unwrap(),
        u["cpu"]["total_bytes"].as_u64().unwrap(),
    )
}

fn evicted(meta: &crate::harness::Server) -> u64 {
    metric(meta, EVICTED).map_or(0, |v| v.parse().unwrap())
}

fn pref_object(i: usize) -> Vec<u8> {
    (0..200_000).map(|j| (j * 13 + i * 101) as u8).collect()
}

/// Rank 1 is killed (-9) and restarted while a client churns; then 120 objects are put
/// preferring it. They are all readable afterwards, and nothing was evicted: the objects
/// the cluster holds stay far below its high watermark. What the churn leaves is the
/// bytes of deleted objects whose reads' leases still run: counted as used until the leases
/// end, they are no room eviction can make (the long lease here makes a small load leave
/// as much as a fast one does with the default; the watermarks are lowered so that those
/// bytes and the new objects cross the high one with room to spare). Before the fix the
/// watermark counted them, and the drain evicted the new objects.
#[test]
fn a_restarted_rank_keeps_the_objects_it_is_given_under_a_churn_of_leased_deletes() {
    let meta = meta(&[
        ("ock.mmc.lease_ms", "30000"),
        ("ock.mmc.evict_threshold_high", "60"),
        ("ock.mmc.evict_threshold_low", "50"),
    ]);
    let rank = |r: &'static str| [("ock.mmc.local_service.rank", r)];
    let (_a, ra) = join(&meta, &rank("0"));
    let (mut b, rb) = join(&meta, &rank("1"));
    assert_eq!((ra, rb), (0, 1));

    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicUsize::new(0));
    let load = {
        let (addr, stop, cycles) = (meta.addr, stop.clone(), cycles.clone());
        std::thread::spawn(move || churn(addr, &stop, &cycles))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while cycles.load(Ordering::Relaxed) < 30 {
        assert!(Instant::now() < deadline, "the churn made no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Killed and restarted at once (before the meta notices the loss), under the churn.
    let addr_b = b.addr;
    b.kill9();
    let b2 = local_builder(&meta, &rank("1"))
        .listen(&addr_b.to_string())
        .start();
    while !b2.log().contains("joined the meta service") {
        assert!(Instant::now() < deadline, "rank 1 did not join again");
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_segments(&meta, 2, Duration::from_secs(10));
    // The churn goes on until the deleted objects' held bytes fill 55 % of the DRAM.
    let (_, total) = dram_usage(&meta);
    let deadline = Instant::now() + Duration::from_secs(60);
    while dram_usage(&meta).0 * 100 < total * 55 {
        assert!(
            Instant::now() < deadline,
            "the churn did not fill the DRAM: {:?}",
            dram_usage(&meta)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    let evicted_before = evicted(&meta);

    // 120 objects of 200 KB preferring the restarted rank: 24 MB, under a fifth of the DRAM.
    for i in 0..120 {
        let target = format!("/api/v1/objects?key=pref-{i}&prefer_rank=1");
        let r = follow(&meta, "PUT", &target, Some(&pref_object(i)));
        assert_eq!(r.json()["success"], true, "pref-{i}: {}", r.text());
    }
    let placed_on_1 = (0..120)
        .filter(|i| {
            let q = meta
                .client()
                .get(&format!("/query_key?key=pref-{i}"))
                .json();
            q["blobs"][0]["rank"] == 1
        })
        .count();
    assert!(placed_on_1 > 0, "nothing went to the restarted rank");
    // A few housekeeping ticks: a drain, had one started, continues on them.
    std::thread::sleep(Duration::from_secs(1));
    let (used, total) = dram_usage(&meta);
    let missing: Vec<usize> = (0..120)
        .filter(|i| {
            let r = follow(&meta, "GET", &format!("/api/v1/objects?key=pref-{i}"), None);
            r.status != 200 || r.body != pref_object(*i)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "{} of 120 acknowledged objects lost ({placed_on_1} placed on rank 1; DRAM {used} of \
         {total} bytes used, {} evicted): {missing:?}",
        missing.len(),
        evicted(&meta) - evicted_before
    );
    assert_eq!(
        evicted(&meta),
        evicted_before,
        "evictions while the objects held (24 MB of {total} bytes) are far below the high \
         watermark (DRAM {used} bytes used, leased deletes included)"
    );

    // End light: the local services' drains on SIGTERM have nothing to move.
    assert_eq!(
        meta.client().request("DELETE", "/all_keys", None).status,
        200
    );
}

/// A meta service busy to its in-flight bound (one request per shard here, held by a put whose
/// body is slow to come) still takes its ranks' heartbeats: a heartbeat answered 429 would be
/// no heartbeat, and the live rank would be declared lost and its objects dropped.
#[test]
fn a_busy_meta_service_still_hears_its_ranks_heartbeats() {
    let meta = ServerBuilder::new(crate::harness::Driver::Uring)
        .shards(1)
        .set("ock.mmc.http.max_inflight_per_shard", "1")
        .set("ock.mmc.cluster.heartbeat_interval_ms", "100")
        .set("ock.mmc.cluster.heartbeat_timeout_ms", "1000")
        .set("ock.mmc.local_service.dram.size", "64MB")
        .start();
    let (_local, rank) = join(&meta, &[]);
    // A streamed put to the meta's own rank (0): the request is in flight while its body
    // arrives, and half of it waits 2.5 s (well past the heartbeat timeout).
    let len = 1 << 20;
    let body = vec![5u8; len];
    let mut slow = meta.client();
    slow.send(
        format!(
            "PUT /api/v1/objects?key=slow&prefer_rank=0 HTTP/1.1\r\nHost: test\r\nContent-Length: {len}\r\n\r\n"
        )
        .as_bytes(),
    );
    slow.send(&body[..len / 2]);
    std::thread::sleep(Duration::from_millis(2500));
    slow.send(&body[len / 2..]);
    let r = slow.read_response(false);
    assert_eq!(r.json()["success"], true, "{}", r.text());
    let log = meta.log();
    assert!(
        !log.contains(&format!("rank {rank} lost")),
        "a live rank was declared lost while the meta was busy:\n{log}"
    );
}
