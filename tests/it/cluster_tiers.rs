//! HBM on local services: a pure meta service and a local service lending HBM and DRAM
//! (`--role local` with `ock.mmc.local_service.hbm.size`). Under pressure the meta demotes the
//! rank's HBM blobs to the same rank's DRAM, the local service copying between its own
//! segments (the bytes never pass the meta); with the rank's DRAM full they are dropped.

use std::time::{Duration, Instant};

use crate::cluster::{follow, split_location};
use crate::cluster_ssd::{join, local, meta, metric, object, put};
use crate::harness::{Driver, Server};

/// Object size of these tests.
const SIZE: usize = 512 << 10;

/// `key`'s copies as (medium, rank), sorted; empty when the key is not found.
fn copies(meta: &Server, key: &str) -> Vec<(String, u64)> {
    let q = meta.client().get(&format!("/query_key?key={key}")).json();
    if q["success"] == false {
        return Vec::new();
    }
    let mut c: Vec<(String, u64)> = q["blobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["medium"].as_str().unwrap().to_string(),
                b["rank"].as_u64().unwrap(),
            )
        })
        .collect();
    c.sort();
    c
}

fn number(server: &Server, series: &str) -> f64 {
    metric(server, series)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{series} is not in /metrics"))
}

#[test]
fn a_local_services_hbm_is_demoted_to_its_own_dram_by_the_local_service() {
    let meta = meta(&[
        ("ock.mmc.lease_ms", "100"),
        ("ock.mmc.metrics.per_rank", "true"),
    ]);
    let b = local(&meta, "32MB", None, Driver::Uring).set("ock.mmc.local_service.hbm.size", "8MB");
    let (local, rank) = join(&meta, b, &["hbm", "dram"]);

    // 32 distinct objects of 512 KiB into 8 MB of HBM: past its high watermark, the least
    // recently used go down to the rank's DRAM.
    let n = 32;
    for i in 0..n {
        put(&meta, &format!("t-{i}"), &object(i, SIZE));
    }
    let hbm = vec![("HBM".to_string(), rank as u64)];
    let dram = vec![("DRAM".to_string(), rank as u64)];
    // Each object ends on one copy: HBM, or (demoted, once the copy landed) the rank's DRAM.
    let deadline = Instant::now() + Duration::from_secs(10);
    let demoted = loop {
        let all: Vec<Vec<(String, u64)>> =
            (0..n).map(|i| copies(&meta, &format!("t-{i}"))).collect();
        if all.iter().all(|c| *c == hbm || *c == dram) {
            break all.iter().filter(|c| **c == dram).count();
        }
        assert!(Instant::now() < deadline, "not settled: {all:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(demoted >= n - 16, "{demoted} of {n} objects demoted");
    assert_eq!(copies(&meta, "t-0"), dram, "the oldest went down");
    assert_eq!(
        copies(&meta, &format!("t-{}", n - 1)),
        hbm,
        "the newest stayed"
    );

    // Every object reads back intact through the meta, which redirects to the local service.
    for i in 0..n {
        let key = format!("t-{i}");
        let r = meta.client().get(&format!("/api/v1/objects?key={key}"));
        assert_eq!(r.status, 307, "{key}: {}", r.text());
        let (addr, _) = split_location(r.header("location").unwrap());
        assert_eq!(addr, local.addr);
        let r = follow(&meta, "GET", &format!("/api/v1/objects?key={key}"), None);
        assert_eq!(r.status, 200, "{key}: {}", r.text());
        assert!(r.body == object(i, SIZE), "{key} read back intact");
    }

    // The tier metrics count the demotions as evictions of the rank, and none as a flush;
    // the rank's DRAM segment holds the demoted copies.
    let evicted = number(
        &meta,
        &format!("memcache_evict_operations_total{{rank=\"{rank}\"}}"),
    );
    assert!(evicted >= demoted as f64, "{evicted} evictions");
    assert_eq!(
        number(&meta, "memcache_demoted_blobs_total"),
        demoted as f64,
        "each object on the rank's DRAM came down once"
    );
    assert_eq!(number(&meta, "memcache_flush_blobs_total"), 0.0);
    assert_eq!(number(&meta, "memcache_flush_bytes_total"), 0.0);
    let allocated = number(
        &meta,
        &format!("memcache_segment_allocated_bytes{{segment=\"rank-{rank}-dram\"}}"),
    );
    assert!(allocated >= (demoted * SIZE) as f64, "{allocated}");

    // No bytes passed through the meta: the only bytes the local service's data plane
    // carried are the client's puts and reads (a demotion made through the meta would have
    // read and written each demoted object there once more).
    let moved = |op: &str| {
        number(
            &local,
            &format!("memcache_bandwidth_bytes_cum_total{{rank=\"{rank}\",operation=\"{op}\"}}"),
        )
    };
    assert_eq!(moved("batch_put"), (n * SIZE) as f64);
    assert_eq!(moved("batch_get"), (n * SIZE) as f64);
}

#[test]
fn a_remote_hbm_blob_is_dropped_when_its_ranks_dram_is_full() {
    // Long leases: the rank's DRAM is held by read objects that eviction cannot move.
    let meta = meta(&[("ock.mmc.lease_ms", "60000")]);
    let b = local(&meta, "2MB", None, Driver::Uring).set("ock.mmc.local_service.hbm.size", "4MB");
    let (_local, rank) = join(&meta, b, &["hbm", "dram"]);
    let big = 1 << 20;
    for i in 0..2 {
        let key = format!("d-{i}");
        let r = follow(
            &meta,
            "PUT",
            &format!("/api/v1/objects?key={key}&medium=dram"),
            Some(&object(100 + i, big)),
        );
        assert_eq!(r.json()["success"], true, "{key}: {}", r.text());
        let r = follow(&meta, "GET", &format!("/api/v1/objects?key={key}"), None);
        assert!(r.body == object(100 + i, big), "{key} read (leased)");
    }
    let dram = vec![("DRAM".to_string(), rank as u64)];
    // Past HBM's high watermark with nowhere to go: the oldest objects are dropped, as
    // before remote demotion.
    let n = 8;
    for i in 0..n {
        put(&meta, &format!("h-{i}"), &object(i, big));
    }
    assert!(copies(&meta, "h-0").is_empty(), "h-0 was dropped");
    let r = follow(&meta, "GET", "/api/v1/objects?key=h-0", None);
    r.assert_error(200, "Key not found");
    let last = format!("h-{}", n - 1);
    assert_eq!(copies(&meta, &last), [("HBM".to_string(), rank as u64)]);
    let r = follow(&meta, "GET", &format!("/api/v1/objects?key={last}"), None);
    assert!(r.body == object(n - 1, big), "{last} intact");
    for i in 0..n {
        assert!(
            !copies(&meta, &format!("h-{i}")).contains(&dram[0]),
            "h-{i} has no DRAM copy"
        );
    }
    for i in 0..2 {
        assert_eq!(copies(&meta, &format!("d-{i}")), dram);
    }
}
