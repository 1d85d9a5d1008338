//! The cluster's promises under membership faults (the rules of `docs/cluster-protocol.md`):
//! a frozen rank that resumes brings no deleted object back, a removal is applied on the local
//! service before it is answered (so a restarted meta that takes the catalogs over does not
//! bring it back either), a restarted rank serves again within the heartbeat timeout and a
//! second, and a leaving rank keeps reporting while its objects drain.

use std::time::{Duration, Instant};

use super::cluster::{
    follow, join, local_builder, meta, object, segments, status_of, wait_segments,
};
use super::ha::{free_port, wait_gone};
use crate::harness::{Driver, Server, ServerBuilder};

/// Heartbeats every 100 ms, a rank lost after 2 s of silence: the freeze tests' settings.
const FAST: [(&str, &str); 2] = [
    ("ock.mmc.cluster.heartbeat_interval_ms", "100"),
    ("ock.mmc.cluster.heartbeat_timeout_ms", "2000"),
];

fn put(meta: &Server, target: &str, body: &[u8]) {
    let r = follow(meta, "PUT", target, Some(body));
    assert_eq!(r.json()["success"], true, "{target}: {}", r.text());
}

fn get(meta: &Server, key: &str) -> crate::harness::Response {
    follow(meta, "GET", &format!("/api/v1/objects?key={key}"), None)
}

/// Defect 2 of the cluster-faults issue: a rank frozen (SIGSTOP) past the heartbeat timeout is
/// declared lost and its objects dropped; a delete answered meanwhile stays a delete when it
/// resumes, and its catalog (which still lists the deleted object) is not adopted.
#[test]
fn a_frozen_rank_that_resumes_brings_no_deleted_object_back() {
    let meta = meta(&FAST);
    let (_a, _ra) = join(&meta, &FAST);
    let (b, rb) = join(&meta, &FAST);
    put(&meta, "/api/v1/objects?key=A&replicas=2", &object(1));
    put(
        &meta,
        &format!("/api/v1/objects?key=B&prefer_rank={rb}"),
        &object(2),
    );
    b.signal(libc::SIGSTOP);
    wait_segments(&meta, 1, Duration::from_secs(5));
    let r = meta
        .client()
        .request("DELETE", "/api/v1/objects?key=A", None);
    assert_eq!(r.json()["success"], true, "{}", r.text());
    b.signal(libc::SIGCONT);
    let resumed = Instant::now();
    wait_segments(&meta, 2, Duration::from_secs(10));
    // It serves again within the heartbeat timeout and a second of resuming.
    let mut n = 0;
    loop {
        n += 1;
        let r = follow(
            &meta,
            "PUT",
            &format!("/api/v1/objects?key=after-{n}&prefer_rank={rb}"),
            Some(b"x"),
        );
        let q = meta
            .client()
            .get(&format!("/query_key?key=after-{n}"))
            .json();
        if r.status == 200 && r.json()["success"] == true && q["blobs"][0]["rank"] == rb {
            break;
        }
        assert!(resumed.elapsed() < Duration::from_secs(10), "{}", r.text());
        std::thread::sleep(Duration::from_millis(20));
    }
    let served = resumed.elapsed();
    assert!(
        served < Duration::from_millis(2000 + 1000),
        "rank {rb} served again {served:?} after it resumed"
    );
    // Whatever it still holds, the meta answers from what it acknowledged: A deleted, B lost
    // with its rank (the documented rule), never their old bytes.
    for key in ["A", "B"] {
        get(&meta, key).assert_error(200, "Key not found");
    }
    assert!(
        meta.log().contains("its catalog is void"),
        "the meta told the resumed service to drop its catalog:\n{}",
        meta.log()
    );
    // A re-put of the deleted key is a new object, not a "Duplicated object".
    put(&meta, "/api/v1/objects?key=A&replicas=2", &object(3));
    assert!(get(&meta, "A").body == object(3));
}

/// Defect 4's root: a delete is answered only once the local service holding the copy has
/// dropped it from its catalog, so a meta restarted right after the delete (which takes the
/// catalogs over) does not bring the object back. The heartbeat interval is long: the freed
/// record would otherwise reach the service only with its next heartbeat.
#[test]
fn a_delete_is_applied_on_the_local_service_before_it_is_answered() {
    let port = free_port();
    let slow = [
        ("ock.mmc.cluster.heartbeat_interval_ms", "3000"),
        ("ock.mmc.cluster.heartbeat_timeout_ms", "15000"),
    ];
    let start_meta = || {
        let mut b = ServerBuilder::new(Driver::Uring)
            .listen(&format!("127.0.0.1:{port}"))
            .set("ock.mmc.embedded.ranks", "0");
        for (k, v) in slow {
            b = b.set(k, v);
        }
        b.start()
    };
    let mut m = start_meta();
    let local = local_builder(&m, &slow).start();
    wait_segments(&m, 1, Duration::from_secs(10));
    for i in 0..6 {
        put(&m, &format!("/api/v1/objects?key=d-{i}"), &object(i));
    }
    for i in [1, 4] {
        let r = m
            .client()
            .request("DELETE", &format!("/api/v1/objects?key=d-{i}"), None);
        assert_eq!(r.json()["success"], true, "{}", r.text());
    }
    let addr = m.addr;
    m.kill9();
    wait_gone(addr);
    let m = start_meta();
    // The service's next heartbeat finds a meta that does not know it: it joins again and
    // hands its catalog over.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(get(&m, "d-0").status == 200 && get(&m, "d-0").body == object(0)) {
        assert!(
            Instant::now() < deadline,
            "d-0 not back; the local's log:\n{}",
            local.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for i in 0..6 {
        let r = get(&m, &format!("d-{i}"));
        if i == 1 || i == 4 {
            r.assert_error(200, "Key not found");
        } else {
            assert!(
                r.status == 200 && r.body == object(i),
                "d-{i}: {}",
                r.text()
            );
        }
    }
}

/// A join of an earlier run of a rank's local service (its message came late, after a restart
/// replaced it) is refused and changes nothing: the live run keeps its membership and its
/// objects (cluster simulation seed 23586: taken as a restart, such a join dropped the live
/// run's objects, and a later leader adopted its catalog over newer puts). Incarnations are
/// ordered by start time; 1 is one of a run started in 2020.
#[test]
fn a_late_join_of_an_earlier_run_changes_nothing() {
    let meta = meta(&[]);
    let (local, rank) = join(&meta, &[("ock.mmc.local_service.rank", "5")]);
    assert_eq!(rank, 5);
    put(&meta, "/api/v1/objects?key=kept&prefer_rank=5", &object(3));
    let before = segments(&meta);
    let body = format!(
        r#"{{"rank":5,"url":"http://{}","incarnation":1,"segments":[{{"medium":"DRAM","size":67108864}}],"catalog_follows":true,"in_step":0,"catalog_since":[0,0],"recovered":false,"heard_by":0}}"#,
        local.addr
    );
    let r = meta
        .client()
        .request("POST", "/cluster/v1/join", Some(body.as_bytes()));
    assert!(r.status >= 400, "{} {}", r.status, r.text());
    assert!(r.text().contains("later run"), "{}", r.text());
    // Nothing changed: the same segments, the object still read, the rank still reporting.
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(segments(&meta), before);
    let g = get(&meta, "kept");
    assert_eq!((g.status, g.body.clone()), (200, object(3)));
    let log = meta.log();
    assert_eq!(log.matches("rank 5 joined").count(), 1, "{log}");
}

/// A heartbeat sent to a meta that died, delivered to its successor on the same address (a
/// connection attempt retried past the restart), names no membership of the new process: the
/// new meta's epochs start above the old one's. Before, both began at 1, the heartbeat named
/// the membership the same service had just been given by the new meta and was taken as its
/// first heartbeat, without the catalog it was to bring: the segments served, and a put
/// could take the range of an object that catalog listed (cluster simulation, seed 28161).
/// The test plays the local service (its joins and heartbeats by hand).
#[test]
fn a_heartbeat_meant_for_a_meta_s_previous_process_changes_nothing() {
    let addr = format!("127.0.0.1:{}", free_port());
    let start = || {
        ServerBuilder::new(Driver::Uring)
            .listen(&addr)
            .set("ock.mmc.embedded.ranks", "0")
            .start()
    };
    let join = |meta: &Server| {
        let body = r#"{"rank":3,"url":"http://127.0.0.1:9","incarnation":1,"segments":[{"medium":"DRAM","size":16777216}]}"#;
        let r = meta
            .client()
            .request("POST", "/cluster/v1/join", Some(body.as_bytes()));
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["epoch"].as_u64().unwrap()
    };
    let beat = |meta: &Server, epoch: u64| {
        let body = format!(r#"{{"rank":3,"incarnation":1,"epoch":{epoch}}}"#);
        meta.client()
            .request("POST", "/cluster/v1/heartbeat", Some(body.as_bytes()))
    };
    let mut first = start();
    let old = join(&first);
    assert_eq!(beat(&first, old).status, 200);
    first.kill9();
    std::thread::sleep(Duration::from_millis(20));
    let meta = start();
    let new = join(&meta);
    assert_ne!(new, old, "a new process hands out epochs of its own");
    assert_eq!(status_of(&meta, "rank-3-dram"), "UNDEFINED");
    beat(&meta, old).assert_error(409, "Unknown rank, incarnation or epoch: join again");
    assert_eq!(
        status_of(&meta, "rank-3-dram"),
        "UNDEFINED",
        "the late heartbeat is not the membership's first"
    );
    assert_eq!(beat(&meta, new).status, 200);
    assert_eq!(status_of(&meta, "rank-3-dram"), "OK");
}

/// Defect 5: a local service killed and restarted at once, under load, serves again within
/// the heartbeat timeout and a second (its join replaces the old membership in one step).
#[test]
fn a_restarted_rank_serves_within_the_heartbeat_timeout_and_a_second() {
    let meta = meta(&[]);
    let (mut a, ra) = join(&meta, &[("ock.mmc.local_service.rank", "7")]);
    let (_b, _rb) = join(&meta, &[]);
    assert_eq!(ra, 7);
    for i in 0..20 {
        put(
            &meta,
            &format!("/api/v1/objects?key=l-{i}&replicas=2"),
            &object(i),
        );
    }
    // Load while the rank restarts: readers of replicated objects.
    let addr = meta.addr;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut wrong = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for i in 0..20 {
                    let mut c = crate::harness::Client::connect(addr);
                    let r = c.get(&format!("/api/v1/objects?key=l-{i}"));
                    if r.status != 307 {
                        continue;
                    }
                    let (to, target) =
                        super::cluster::split_location(r.header("location").unwrap());
                    if let Some(mut c) = crate::harness::Client::try_connect(to) {
                        let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            c.get(&target)
                        }));
                        if let Ok(r) = got
                            && r.status == 200
                            && r.body != object(i)
                        {
                            wrong += 1;
                        }
                    }
                }
            }
            wrong
        })
    };
    let addr_a = a.addr;
    a.kill9();
    let restarted = Instant::now();
    let _a2 = local_builder(&meta, &[("ock.mmc.local_service.rank", "7")])
        .listen(&addr_a.to_string())
        .start();
    let limit = Duration::from_millis(3000 + 1000);
    let mut n = 0;
    let served = loop {
        n += 1;
        let r = follow(
            &meta,
            "PUT",
            &format!("/api/v1/objects?key=back-{n}&prefer_rank=7"),
            Some(b"back"),
        );
        if r.status == 200 && r.json()["success"] == true {
            let q = meta
                .client()
                .get(&format!("/query_key?key=back-{n}"))
                .json();
            if q["blobs"][0]["rank"] == 7 {
                break restarted.elapsed();
            }
        }
        assert!(
            restarted.elapsed() < limit * 3,
            "rank 7 never served again: {}; segments {:?}",
            r.text(),
            segments(&meta)
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(load.join().unwrap(), 0, "no wrong bytes were served");
    assert!(
        served < limit,
        "rank 7 served again {served:?} after its restart"
    );
    assert!(get(&meta, &format!("back-{n}")).body == b"back");
}

/// Defect 5, the drain: a leaving local service keeps reporting while its leave is carried
/// out, so a drain longer than the heartbeat timeout does not get the rank declared lost (and
/// its objects dropped) half way.
#[test]
fn a_leaving_rank_keeps_reporting_while_it_drains() {
    let fast = [
        ("ock.mmc.cluster.heartbeat_interval_ms", "50"),
        ("ock.mmc.cluster.heartbeat_timeout_ms", "300"),
    ];
    let meta = meta(&fast);
    let (mut a, ra) = join(&meta, &fast);
    let (_b, _rb) = join(&meta, &fast);
    // Small objects, many of them: the drain moves them one by one through the meta, for
    // longer than the heartbeat timeout (1500 drained in 0.2 s on a quiet EPYC core: too few).
    let n = 4000;
    let small = |i: usize| -> Vec<u8> { (0..8_000).map(|j| (i * 13 + j * 7) as u8).collect() };
    for i in 0..n {
        put(
            &meta,
            &format!("/api/v1/objects?key=g-{i}&prefer_rank={ra}"),
            &small(i),
        );
    }
    let t = Instant::now();
    // A debug build on a busy two-CPU machine has drained these in up to ~15 s: the bound is
    // for a drain that never ends, not for a slow one.
    let status = a.stop_within(Duration::from_secs(90));
    let took = t.elapsed();
    assert!(status.success(), "{status}");
    assert!(
        took > Duration::from_millis(300),
        "the drain took {took:?}: not longer than the heartbeat timeout, the test shows nothing"
    );
    let log = meta.log();
    assert!(
        !log.contains(&format!("rank {ra} lost")),
        "declared lost while leaving:\n{log}"
    );
    for i in 0..n {
        let r = get(&meta, &format!("g-{i}"));
        assert!(
            r.status == 200 && r.body == small(i),
            "g-{i} lost in a leave of {took:?}: {}; the leaving service's log:\n{}",
            r.text(),
            a.log()
        );
    }
}

/// A local service given its rank (none configured) and holding an object, frozen past the
/// heartbeat timeout while a service configured with that rank joins: resumed, it is refused
/// the rank ("held by another local service") and joins for any free one, its catalog not
/// following, instead of asking for the taken rank at every try for as long as the other
/// lives (found by the cluster simulation with automatic ranks, seed 19).
#[test]
fn a_service_whose_given_rank_was_taken_while_it_was_frozen_joins_under_another() {
    let meta = meta(&FAST);
    let (a, ra) = join(&meta, &FAST);
    put(
        &meta,
        &format!("/api/v1/objects?key=held&prefer_rank={ra}"),
        &object(1),
    );
    a.signal(libc::SIGSTOP);
    wait_segments(&meta, 0, Duration::from_secs(5));
    let rank = ra.to_string();
    let mut configured = FAST.to_vec();
    configured.push(("ock.mmc.local_service.rank", &rank));
    let (_b, rb) = join(&meta, &configured);
    assert_eq!(rb, ra);
    a.signal(libc::SIGCONT);
    let segs = wait_segments(&meta, 2, Duration::from_secs(10));
    let other = format!("rank-{ra}-");
    assert!(
        segs.iter().any(|s| !s.starts_with(&other)),
        "the resumed service joined under another rank: {segs:?}"
    );
    assert!(meta.log().contains("is held by another local service"));
    assert!(a.log().contains("to another local service"), "{}", a.log());
    // Its object went with the rank (the documented rule), never served from the wrong place.
    get(&meta, "held").assert_error(200, "Key not found");
}

/// A local service configured with rank 0, frozen while its meta was restarted (no HA) and a
/// service without a configured rank was given rank 0 by the new meta (the lowest free one):
/// resumed, it takes its rank back, whichever started first. The other is asked to give the
/// rank up (its heartbeats refused, its join for rank 0 told the rank is taken), joins for
/// another, and its membership of rank 0 ends as a lost one does; its object went with the
/// rank, never read from the wrong memory. Before, the configured service was refused ("held
/// by another local service") for as long as the other lived (found by the cluster
/// simulation with automatic ranks, seed 21).
#[test]
fn a_configured_rank_given_to_another_service_while_its_own_was_frozen_comes_back_to_it() {
    let addr = format!("127.0.0.1:{}", free_port());
    let start = || {
        let mut b = ServerBuilder::new(Driver::Uring)
            .listen(&addr)
            .set("ock.mmc.embedded.ranks", "0");
        for (k, v) in FAST {
            b = b.set(k, v);
        }
        b.start()
    };
    let mut first = start();
    let mut configured = FAST.to_vec();
    configured.push(("ock.mmc.local_service.rank", "0"));
    let (a, ra) = join(&first, &configured);
    assert_eq!(ra, 0);
    a.signal(libc::SIGSTOP);
    first.kill9();
    std::thread::sleep(Duration::from_millis(20));
    let meta = start();
    let (b, rb) = join(&meta, &FAST);
    assert_eq!(rb, 0, "the new meta gives the lowest free rank");
    put(&meta, "/api/v1/objects?key=on-b&prefer_rank=0", &object(2));
    a.signal(libc::SIGCONT);
    // B is asked to give rank 0 up: it joins for another, and once its membership of rank 0
    // has ended (declared lost by the heartbeat timeout, 2 s here) the configured service
    // takes rank 0 back: a put there is sent to it.
    let to_a = format!("http://{}/", a.addr);
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut n = 0;
    loop {
        n += 1;
        let r = meta.client().request(
            "PUT",
            &format!("/api/v1/objects?key=on-a-{n}&prefer_rank=0"),
            Some(b"x"),
        );
        if r.status == 307 && r.header("location").is_some_and(|l| l.starts_with(&to_a)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rank 0 never came back to its configured service: {} {:?}, segments {:?}",
            r.status,
            r.header("location"),
            segments(&meta)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let segs = wait_segments(&meta, 2, Duration::from_secs(5));
    assert!(
        segs.iter().any(|n| n.starts_with("rank-0-"))
            && segs.iter().any(|n| n.starts_with("rank-1-")),
        "{segs:?}"
    );
    assert!(meta.log().contains("is held by another local service"));
    assert!(b.log().contains("to another local service"), "{}", b.log());
    // B's object went with the rank (the documented rule), never served from A's memory.
    get(&meta, "on-b").assert_error(200, "Key not found");
}
