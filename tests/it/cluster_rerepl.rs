//! Re-replication with real processes: a pure meta service and three local services; a
//! `replicas=2` object that lost a copy with a killed rank gets a new one on the third, so a
//! second loss loses nothing.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cluster::{follow, join, meta, object, wait_segments};
use crate::harness::Server;
use crate::observability::scrape;

const OBJECTS: usize = 24;

/// The ranks of `key`'s readable copies (state 1), ascending.
fn readable_ranks(meta: &Server, key: &str) -> Vec<u64> {
    let q: Value = meta.client().get(&format!("/query_key?key={key}")).json();
    let mut ranks: Vec<u64> = q["blobs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["state"] == 1)
        .filter_map(|b| b["rank"].as_u64())
        .collect();
    ranks.sort_unstable();
    ranks
}

fn metric(meta: &Server, name: &str) -> f64 {
    scrape(&mut meta.client())
        .get(name)
        .copied()
        .unwrap_or(-1.0)
}

#[test]
fn a_lost_ranks_replicas_are_copied_to_the_third_rank_and_survive_a_second_loss() {
    let meta = meta(&[
        ("ock.mmc.cluster.heartbeat_interval_ms", "200"),
        ("ock.mmc.cluster.heartbeat_timeout_ms", "1000"),
    ]);
    let mut locals: Vec<(Server, u32)> = (0..3).map(|_| join(&meta, &[])).collect();
    let key = |i: usize| format!("rr-{i}");
    for i in 0..OBJECTS {
        let target = format!("/api/v1/objects?key={}&replicas=2", key(i));
        let r = follow(&meta, "PUT", &target, Some(&object(i)));
        assert_eq!(r.json()["success"], true, "{}", r.text());
    }
    assert_eq!(metric(&meta, "memcache_rereplicated_objects_total"), 0.0);
    assert_eq!(metric(&meta, "memcache_rereplicate_pending"), 0.0);

    // The rank with the most copies dies.
    let copies_on = |rank: u32| {
        (0..OBJECTS)
            .filter(|&i| readable_ranks(&meta, &key(i)).contains(&(rank as u64)))
            .count()
    };
    let counts: Vec<usize> = locals.iter().map(|(_, r)| copies_on(*r)).collect();
    let victim = (0..3).max_by_key(|&i| counts[i]).unwrap();
    let lost = counts[victim];
    assert!(lost > 0, "{counts:?}");
    let (mut dead, dead_rank) = locals.remove(victim);
    dead.kill9();
    wait_segments(&meta, 2, Duration::from_secs(10));
    let live: Vec<u64> = locals.iter().map(|(_, r)| *r as u64).collect();

    // Every object is back to two readable copies, both on live ranks.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let short: Vec<(usize, Vec<u64>)> = (0..OBJECTS)
            .map(|i| (i, readable_ranks(&meta, &key(i))))
            .filter(|(_, r)| *r != live)
            .collect();
        if short.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rank {dead_rank} lost {lost} copies; objects still short of two on {live:?}: {short:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        metric(&meta, "memcache_rereplicated_objects_total"),
        lost as f64
    );
    assert_eq!(metric(&meta, "memcache_rereplicate_failed_total"), 0.0);
    assert_eq!(metric(&meta, "memcache_rereplicate_pending"), 0.0);

    // A second holder dies: every object still has its copy on the last rank, byte for byte.
    let (mut second, _) = locals.remove(0);
    second.kill9();
    wait_segments(&meta, 1, Duration::from_secs(10));
    for i in 0..OBJECTS {
        let r = follow(
            &meta,
            "GET",
            &format!("/api/v1/objects?key={}", key(i)),
            None,
        );
        assert_eq!(r.status, 200, "{}: {}", key(i), r.text());
        assert!(r.body == object(i), "{} read back intact", key(i));
    }
}
