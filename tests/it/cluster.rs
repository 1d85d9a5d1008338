//! A cluster on loopback: a pure meta service (`ock.mmc.embedded.ranks=0`) and local services
//! (`--role local`) as separate processes. Bytes go between the client and the rank that holds
//! them (307 with a grant); loss, rejoin, leave and forged grants.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::harness::{Client, Driver, Response, Server, ServerBuilder};

pub(super) fn meta(extra: &[(&str, &str)]) -> Server {
    let mut b = ServerBuilder::new(Driver::Uring).set("ock.mmc.embedded.ranks", "0");
    for (k, v) in extra {
        b = b.set(k, v);
    }
    b.start()
}

pub(super) fn local_builder(meta: &Server, extra: &[(&str, &str)]) -> ServerBuilder {
    local_of_url(&format!("http://{}", meta.addr), extra)
}

/// A local service (one shard, 64 MB of DRAM) of the meta service at `url`, which need not
/// be up yet.
pub(super) fn local_of_url(url: &str, extra: &[(&str, &str)]) -> ServerBuilder {
    let mut b = ServerBuilder::new(Driver::Uring)
        .shards(1)
        .arg("--role")
        .arg("local")
        .set("ock.mmc.meta_service_url", url)
        .set("ock.mmc.local_service.dram.size", "64MB")
        .set("ock.mmc.local_service.hbm.size", "0");
    for (k, v) in extra {
        b = b.set(k, v);
    }
    b
}

/// Segment names listed by the meta.
pub(super) fn segments(meta: &Server) -> Vec<String> {
    let r = meta.client().get("/get_all_segments");
    assert_eq!(r.status, 200);
    listed(&r.text())
}

fn listed(text: &str) -> Vec<String> {
    text.lines()
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .collect()
}

/// The segments a meta lists once every one is OK (`/api/v1/segments/status`); `None` while
/// one is not: a joining rank's segments are UNDEFINED, taking no put, until its first
/// heartbeat. `get` answers the body of a GET of a path on the meta.
pub(super) fn ready_segments(get: &impl Fn(&str) -> String) -> Option<Vec<String>> {
    let names = listed(&get("/get_all_segments"));
    let ok = |name: &String| {
        let st = get(&format!("/api/v1/segments/status?segment={name}"));
        serde_json::from_str::<serde_json::Value>(&st)
            .is_ok_and(|v| v["status_name"] == "OK" && v["status"] == 1)
    };
    names.iter().all(ok).then_some(names)
}

/// Waits (bounded by `limit`) until the meta's segments are all OK and `done` holds of them;
/// returns them, or `None` at the limit. The one wait of every cluster test before it puts.
pub(super) fn wait_ready(
    limit: Duration,
    get: impl Fn(&str) -> String,
    done: impl Fn(&[String]) -> bool,
) -> Option<Vec<String>> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = ready_segments(&get).filter(|s| done(s)) {
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (bounded) until the meta lists `n` segments, all OK.
#[track_caller]
pub(super) fn wait_segments(meta: &Server, n: usize, limit: Duration) -> Vec<String> {
    wait_ready(limit, |p| meta.client().get(p).text(), |s| s.len() == n)
        .unwrap_or_else(|| panic!("expected {n} segments, all OK; have {:?}", segments(meta)))
}

/// Starts a local service and waits until the meta lists one more segment; returns it and
/// its rank.
pub(super) fn join(meta: &Server, extra: &[(&str, &str)]) -> (Server, u32) {
    let before = segments(meta);
    let local = local_builder(meta, extra).start();
    let after = wait_segments(meta, before.len() + 1, Duration::from_secs(10));
    let new = after.iter().find(|s| !before.contains(s)).unwrap();
    let rank = new
        .strip_prefix("rank-")
        .and_then(|r| r.split('-').next())
        .unwrap()
        .parse()
        .unwrap();
    (local, rank)
}

/// `http://host:port/path?query` → (address, target).
pub(super) fn split_location(loc: &str) -> (SocketAddr, String) {
    let rest = loc.strip_prefix("http://").expect("an http URL");
    let i = rest.find('/').unwrap();
    (rest[..i].parse().unwrap(), rest[i..].to_string())
}

/// A request to the meta that follows one 307 to the local service, as `curl -L` does.
pub(super) fn follow(meta: &Server, method: &str, target: &str, body: Option<&[u8]>) -> Response {
    let r = meta.client().request(method, target, body);
    if r.status != 307 {
        return r;
    }
    let (addr, target) = split_location(r.header("location").expect("a 307 has a Location"));
    Client::connect(addr).request(method, &target, body)
}

/// A batch_get body: each key's bytes, `None` for a missing one (length `u64::MAX`).
fn batch_values(body: &[u8]) -> Vec<Option<Vec<u8>>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let len = u64::from_be_bytes(body[at..at + 8].try_into().unwrap());
        at += 8;
        if len == u64::MAX {
            out.push(None);
        } else {
            out.push(Some(body[at..at + len as usize].to_vec()));
            at += len as usize;
        }
    }
    out
}

pub(super) fn object(i: usize) -> Vec<u8> {
    let len = 1024 + (i * 70_001) % (2 << 20);
    (0..len).map(|j| (j * 31 + i * 7) as u8).collect()
}

#[test]
fn pure_meta_and_two_local_services_place_redirect_and_read_back() {
    let meta = meta(&[]);
    assert!(
        segments(&meta).is_empty(),
        "a pure meta has no segment of its own"
    );
    let (_a, ra) = join(&meta, &[]);
    let (_b, rb) = join(&meta, &[]);
    assert_ne!(ra, rb);
    let segs = segments(&meta);
    assert!(segs.contains(&format!("rank-{ra}-dram")) && segs.contains(&format!("rank-{rb}-dram")));

    // Capacity is the sum of the ranks' segments.
    let usage = meta.client().get("/api/v1/capacity/usage").json();
    assert_eq!(usage["cpu"]["total_bytes"], 2 * 64 * 1024 * 1024);

    // 30 objects of 1 KiB to 2 MiB: by prefer_rank, and with two replicas.
    for i in 0..30 {
        let data = object(i);
        let target = match i % 3 {
            0 => format!("/api/v1/objects?key=obj-{i}&prefer_rank={ra}"),
            1 => format!("/api/v1/objects?key=obj-{i}&prefer_rank={rb}"),
            _ => format!("/api/v1/objects?key=obj-{i}&replicas=2"),
        };
        let r = meta.client().request("PUT", &target, Some(&data));
        assert_eq!(
            r.status,
            307,
            "a put to a remote rank is redirected: {}",
            r.text()
        );
        let (addr, hop) = split_location(r.header("location").unwrap());
        let done = Client::connect(addr).request("PUT", &hop, Some(&data));
        assert_eq!(done.status, 200, "{}", done.text());
        assert_eq!(done.json()["success"], true, "{}", done.text());
        let q = meta.client().get(&format!("/query_key?key=obj-{i}")).json();
        let ranks: Vec<u64> = q["blobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["rank"].as_u64().unwrap())
            .collect();
        match i % 3 {
            0 => assert_eq!(ranks, [ra as u64]),
            1 => assert_eq!(ranks, [rb as u64]),
            _ => {
                assert_eq!(ranks.len(), 2);
                assert_ne!(ranks[0], ranks[1], "replicas on distinct ranks");
            }
        }
    }
    // Read back through the meta, following the redirect; the bytes never pass the meta.
    for i in 0..30 {
        let r = follow(&meta, "GET", &format!("/api/v1/objects?key=obj-{i}"), None);
        assert_eq!(r.status, 200);
        assert!(r.body == object(i), "object {i} read back intact");
    }
    // A HEAD through the meta answers the length without a redirect.
    let h = meta
        .client()
        .request("HEAD", "/api/v1/objects?key=obj-3", None);
    assert_eq!(h.status, 200);
    assert_eq!(
        h.header("content-length").unwrap(),
        object(3).len().to_string()
    );

    // Batches across ranks.
    let keys = "obj-0,obj-1,obj-2,missing";
    let r = meta
        .client()
        .get(&format!("/api/v1/objects/batch_get?keys={keys}"));
    assert_eq!(r.status, 200);
    let want = [Some(object(0)), Some(object(1)), Some(object(2)), None];
    assert!(batch_values(&r.body) == want, "batch_get across ranks");
    let e = meta
        .client()
        .get(&format!("/api/v1/objects/batch_exist?keys={keys}"));
    assert_eq!(e.status, 200, "{}", e.text());
    assert_eq!(
        e.json()["exists"],
        serde_json::json!([true, true, true, false]),
        "{}",
        e.text()
    );

    // curl -L puts and gets through the meta, the way a user would.
    let dir = std::env::temp_dir().join(format!("mmc-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("obj");
    let data = object(7);
    std::fs::write(&file, &data).unwrap();
    let put = std::process::Command::new("curl")
        .args(["-s", "-L", "-T"])
        .arg(&file)
        .arg(format!("http://{}/api/v1/objects?key=curl-obj", meta.addr))
        .output()
        .expect("curl");
    assert!(
        String::from_utf8_lossy(&put.stdout).contains("\"success\":true"),
        "{}",
        String::from_utf8_lossy(&put.stdout)
    );
    let get = std::process::Command::new("curl")
        .args(["-s", "-L"])
        .arg(format!("http://{}/api/v1/objects?key=curl-obj", meta.addr))
        .output()
        .expect("curl");
    assert!(get.stdout == data, "curl -L reads back what it put");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn grants_cannot_be_forged_altered_or_skipped() {
    let meta = meta(&[("ock.mmc.lease_ms", "300")]);
    let (local, _) = join(&meta, &[]);
    let data = object(1);
    let r = follow(&meta, "PUT", "/api/v1/objects?key=secret-obj", Some(&data));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = meta.client().get("/api/v1/objects?key=secret-obj");
    assert_eq!(r.status, 307);
    let (addr, target) = split_location(r.header("location").unwrap());
    assert_eq!(addr, local.addr);

    // The same URL with another key, or one digit of the grant changed, is refused.
    let other_key = target.replace("key=secret-obj", "key=other-obj");
    Client::connect(addr)
        .get(&other_key)
        .assert_error(403, "Invalid grant: signature does not match");
    let grant_at = target.find("grant=").unwrap() + "grant=".len();
    let mut altered = target.clone().into_bytes();
    altered[grant_at + 2] = if altered[grant_at + 2] == b'9' {
        b'8'
    } else {
        b'9'
    };
    let altered = String::from_utf8(altered).unwrap();
    let r = Client::connect(addr).get(&altered);
    assert_eq!(r.status, 403, "{}", r.text());
    // A read grant does not permit a write.
    let r = Client::connect(addr).request("PUT", &target, Some(&data));
    assert_eq!(r.status, 403, "{}", r.text());
    // Straight to the local service, without a grant: nothing is served or stored.
    Client::connect(addr)
        .get("/api/v1/objects?key=secret-obj")
        .assert_error(
            401,
            "A local service serves objects only under a grant from its meta service: send the request to the meta service",
        );
    let r = Client::connect(addr).request("PUT", "/api/v1/objects?key=sneak", Some(b"x"));
    assert_eq!(r.status, 401);
    let r = Client::connect(addr).get("/get_all_keys");
    assert_eq!(r.status, 403, "a local service serves no index routes");
    // The genuine grant works, then expires with the read's lease.
    let ok = Client::connect(addr).get(&target);
    assert_eq!(ok.status, 200);
    assert!(ok.body == data);
    std::thread::sleep(Duration::from_millis(500));
    Client::connect(addr)
        .get(&target)
        .assert_error(403, "Invalid grant: expired");
    assert_eq!(
        meta.client().get("/api/v1/objects/exist?key=sneak").json()["exists"],
        false
    );
}

fn stale(meta: &Server, rank: u32) -> Option<String> {
    let m = meta.client().get("/metrics").text();
    let series = format!("memcache_metric_stale{{rank=\"{rank}\"}} ");
    m.lines()
        .find_map(|l| l.strip_prefix(&series).map(str::to_string))
}

/// How many `memcache_bandwidth_*` series the meta has for `rank`.
fn bandwidth_series(meta: &Server, rank: u32) -> usize {
    let label = format!("{{rank=\"{rank}\",");
    meta.client()
        .get("/metrics")
        .text()
        .lines()
        .filter(|l| l.starts_with("memcache_bandwidth_") && l.contains(&label))
        .count()
}

#[test]
fn a_killed_rank_is_dropped_and_rejoins_with_empty_memory() {
    let meta = meta(&[]);
    let (mut a, ra) = join(&meta, &[]);
    let (_b, rb) = join(&meta, &[]);
    for i in 0..6 {
        let target = if i % 2 == 0 {
            format!("/api/v1/objects?key=k-{i}&prefer_rank={ra}")
        } else {
            format!("/api/v1/objects?key=k-{i}&replicas=2")
        };
        let r = follow(&meta, "PUT", &target, Some(&object(i)));
        assert_eq!(r.json()["success"], true, "{}", r.text());
    }
    // Readers keep reading while the rank dies: every answer is the right bytes, a
    // "Key not found", or a refused connection to the dead rank; never other bytes.
    let addr = meta.addr;
    let reader = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut wrong = 0;
        while Instant::now() < deadline {
            for i in 0..6 {
                let r = Client::connect(addr).get(&format!("/api/v1/objects?key=k-{i}"));
                if r.status != 307 {
                    continue;
                }
                let (to, target) = split_location(r.header("location").unwrap());
                if let Some(mut c) = Client::try_connect(to) {
                    let r =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.get(&target)));
                    if let Ok(r) = r
                        && r.status == 200
                        && r.body != object(i)
                    {
                        wrong += 1;
                    }
                }
            }
        }
        wrong
    });
    let addr_a = a.addr;
    a.kill9();
    let killed = Instant::now();
    let segs = wait_segments(&meta, 1, Duration::from_secs(6));
    assert!(killed.elapsed() < Duration::from_secs(6));
    assert_eq!(segs, [format!("rank-{rb}-dram")]);
    for i in 0..6 {
        let r = follow(&meta, "GET", &format!("/api/v1/objects?key=k-{i}"), None);
        if i % 2 == 0 {
            r.assert_error(200, "Key not found");
        } else {
            assert_eq!(r.status, 200);
            assert!(r.body == object(i), "a replica elsewhere stays readable");
        }
    }
    assert_eq!(stale(&meta, ra).as_deref(), Some("1"));
    let removals = meta.client().get("/metrics").text();
    assert!(
        removals.contains("memcache_remove_successes_total 3"),
        "the dropped single-copy objects count as removals"
    );
    assert_eq!(reader.join().unwrap(), 0, "no wrong bytes were served");

    // Restarted on the same address it rejoins under its rank, memory empty.
    let _a2 = local_builder(&meta, &[])
        .listen(&addr_a.to_string())
        .start();
    let segs = wait_segments(&meta, 2, Duration::from_secs(10));
    assert!(segs.contains(&format!("rank-{ra}-dram")), "{segs:?}");
    let r = follow(
        &meta,
        "PUT",
        &format!("/api/v1/objects?key=again&prefer_rank={ra}"),
        Some(b"back"),
    );
    assert_eq!(r.json()["success"], true, "{}", r.text());
    assert_eq!(
        follow(&meta, "GET", "/api/v1/objects?key=again", None).body,
        b"back"
    );
    assert_ne!(stale(&meta, ra).as_deref(), None);
}

#[test]
fn sigterm_on_a_local_service_moves_its_objects_and_exits_zero() {
    let meta = meta(&[]);
    let (mut a, ra) = join(&meta, &[]);
    let (_b, rb) = join(&meta, &[]);
    let r = follow(
        &meta,
        "PUT",
        "/api/v1/objects?key=twice&replicas=2",
        Some(b"both"),
    );
    assert_eq!(r.json()["success"], true, "{}", r.text());
    // Single copies on the rank that leaves: they have room on the other one.
    for i in 0..8 {
        let target = format!("/api/v1/objects?key=only-a-{i}&prefer_rank={ra}");
        let r = follow(&meta, "PUT", &target, Some(&object(i)));
        assert_eq!(r.json()["success"], true, "{}", r.text());
    }
    let t = Instant::now();
    let status = a.stop();
    assert!(status.success(), "{status}");
    assert!(t.elapsed() < Duration::from_secs(20));
    let segs = segments(&meta);
    assert_eq!(segs, [format!("rank-{rb}-dram")]);
    assert_eq!(
        follow(&meta, "GET", "/api/v1/objects?key=twice", None).body,
        b"both"
    );
    for i in 0..8 {
        let r = follow(
            &meta,
            "GET",
            &format!("/api/v1/objects?key=only-a-{i}"),
            None,
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.body == object(i), "object {i} moved intact");
        let q = meta
            .client()
            .get(&format!("/query_key?key=only-a-{i}"))
            .json();
        assert_eq!(q["blobs"][0]["rank"], rb);
    }
    // It said goodbye: no stale series for it.
    assert_eq!(stale(&meta, ra), None);
}

#[test]
fn unmounting_a_remote_segment_moves_its_objects() {
    let meta = meta(&[]);
    let (_a, ra) = join(&meta, &[]);
    let (_b, rb) = join(&meta, &[]);
    for i in 0..5 {
        let target = format!("/api/v1/objects?key=u-{i}&prefer_rank={ra}");
        let r = follow(&meta, "PUT", &target, Some(&object(i)));
        assert_eq!(r.json()["success"], true, "{}", r.text());
    }
    let r = meta.client().request(
        "POST",
        &format!("/api/v1/segments/unmount?segment=rank-{ra}-dram"),
        None,
    );
    assert_eq!(r.json()["success"], true, "{}", r.text());
    assert_eq!(segments(&meta), [format!("rank-{rb}-dram")]);
    for i in 0..5 {
        let r = follow(&meta, "GET", &format!("/api/v1/objects?key=u-{i}"), None);
        assert!(r.body == object(i), "object {i} moved intact");
    }
}

#[test]
fn a_local_service_with_the_wrong_cluster_secret_never_joins() {
    let meta = meta(&[("ock.mmc.cluster.token", "right-secret")]);
    let (_good, _) = join(&meta, &[("ock.mmc.cluster.token", "right-secret")]);
    let mut bad = local_builder(&meta, &[("ock.mmc.cluster.token", "wrong-secret")]).start();
    let status = bad
        .wait_exit(Duration::from_secs(10))
        .expect("refused, it stops");
    assert!(!status.success());
    // Its last lines may still be on their way through the log pipe.
    let deadline = Instant::now() + Duration::from_secs(3);
    while !bad
        .log()
        .contains("refused this local service's cluster token")
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        bad.log()
            .contains("refused this local service's cluster token"),
        "{}",
        bad.log()
    );
    assert_eq!(segments(&meta).len(), 1);
    assert!(meta.log().contains("wrong or missing cluster token"));
    // The cluster routes need the secret; clients' routes do not take it.
    let r = meta.client().request(
        "POST",
        "/cluster/v1/join",
        Some(br#"{"url":"http://127.0.0.1:1","incarnation":1,"segments":[{"medium":"DRAM","size":4096}]}"#),
    );
    assert_eq!(r.status, 401);
    assert_eq!(segments(&meta).len(), 1);
}

#[test]
fn a_put_that_waits_for_100_continue_gets_the_redirect_instead() {
    let meta = meta(&[]);
    let (local, _) = join(&meta, &[]);
    // A small body (the meta buffers bodies under 256 KiB otherwise): the 307 comes before
    // any go-ahead, so the client never sends its body to the meta.
    let mut c = meta.client();
    c.send(
        b"PUT /api/v1/objects?key=small HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    );
    let r = c.read_response(false);
    assert_eq!(r.status, 307, "{}", r.text());
    // The body was never asked for, so the meta ends the connection with its answer (which
    // carries the FIN): the client sees the whole 307, then the end.
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.closed_within(Duration::from_secs(5)));
    let (addr, target) = split_location(r.header("location").unwrap());
    assert_eq!(addr, local.addr);
    // The local service streams the body in after its own go-ahead.
    let mut l = Client::connect(addr);
    l.send(
        format!(
            "PUT {target} HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
        )
        .as_bytes(),
    );
    let go = l.read_response(false);
    assert_eq!(go.status, 100);
    l.send(b"small");
    let done = l.read_response(false);
    assert_eq!(done.json()["success"], true, "{}", done.text());
    assert_eq!(
        follow(&meta, "GET", "/api/v1/objects?key=small", None).body,
        b"small"
    );
}

/// A replicated put is a chain: the first rank writes its copy and sends the bytes on to the
/// second (from its segment, without a copy). With the first rank killed, the object is read
/// from the copy the chain forwarded, byte for byte.
#[test]
fn a_replicated_put_forwards_its_bytes_to_the_second_rank() {
    let meta = meta(&[]);
    let (a, _) = join(&meta, &[]);
    let (b, _) = join(&meta, &[]);
    let mut locals = [a, b];
    // Large enough to go on a connection of its own (not the pooled small-body path).
    let data: Vec<u8> = (0..(1 << 20) + 3).map(|j| (j * 13 + 5) as u8).collect();
    let r = meta
        .client()
        .request("PUT", "/api/v1/objects?key=chained&replicas=2", Some(&data));
    assert_eq!(r.status, 307, "{}", r.text());
    let (first, hop) = split_location(r.header("location").unwrap());
    assert!(
        hop.contains("&next="),
        "the first hop names the next: {hop}"
    );
    let done = Client::connect(first).request("PUT", &hop, Some(&data));
    assert_eq!(done.status, 200, "{}", done.text());
    assert_eq!(done.json()["success"], true, "{}", done.text());
    let i = locals.iter().position(|l| l.addr == first).unwrap();
    locals[i].kill9();
    wait_segments(&meta, 1, Duration::from_secs(6));
    let r = follow(&meta, "GET", "/api/v1/objects?key=chained", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.body == data, "the forwarded copy is the bytes put");
}

/// A client that sends its body anyway after the meta's early 307 (it did not wait for the
/// go-ahead) is read off, not reset: its writes complete, then the connection ends.
#[test]
fn a_body_sent_after_the_early_redirect_is_read_off_not_reset() {
    let meta = meta(&[]);
    let (_local, _) = join(&meta, &[]);
    let mut c = meta.client();
    let body = vec![7u8; 1 << 20];
    c.send(
        format!(
            "PUT /api/v1/objects?key=eager HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    let r = c.read_response(false);
    assert_eq!(r.status, 307, "{}", r.text());
    let started = Instant::now();
    c.send(&body);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the body was read off"
    );
    assert!(c.closed_within(Duration::from_secs(5)));
}

/// The status name `/api/v1/segments/status` gives a segment.
pub(super) fn status_of(meta: &Server, segment: &str) -> String {
    let r = meta
        .client()
        .get(&format!("/api/v1/segments/status?segment={segment}"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["status_name"].as_str().unwrap().to_string()
}

/// A rank's segments take puts only from the heartbeat after its join's answer: before it,
/// the local service may not have read the answer and holds no grant key, so a client sent
/// there would be refused. The test plays the local service itself (the join and heartbeats
/// by hand; nothing listens at its URL: only the redirect's Location is looked at).
#[test]
fn a_joining_rank_takes_puts_only_from_its_first_heartbeat() {
    let meta = meta(&[]);
    let url = "http://127.0.0.1:9";
    // (`rank`: the configured one, `null` for any.)
    let join = |rank: &str, incarnation: u64| {
        let body = format!(
            r#"{{"rank":{rank},"url":"{url}","incarnation":{incarnation},"segments":[{{"medium":"DRAM","size":16777216}}]}}"#
        );
        let r = meta
            .client()
            .request("POST", "/cluster/v1/join", Some(body.as_bytes()));
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        (v["rank"].as_u64().unwrap(), v["epoch"].as_u64().unwrap())
    };
    let send_beat = |rank: u64, incarnation: u64, epoch: u64| {
        let body = format!(r#"{{"rank":{rank},"incarnation":{incarnation},"epoch":{epoch}}}"#);
        meta.client()
            .request("POST", "/cluster/v1/heartbeat", Some(body.as_bytes()))
    };
    let beat = |rank: u64, incarnation: u64, epoch: u64| {
        let r = send_beat(rank, incarnation, epoch);
        assert_eq!(r.status, 200, "{}", r.text());
    };
    let put = |key: &str| {
        meta.client()
            .request("PUT", &format!("/api/v1/objects?key={key}"), Some(b"x"))
    };
    let (rank, epoch) = join("null", 1);
    let seg = format!("rank-{rank}-dram");
    // Listed at once, UNDEFINED: the only segment takes no put, the meta sends nobody there.
    assert_eq!(segments(&meta), std::slice::from_ref(&seg));
    assert_eq!(status_of(&meta, &seg), "UNDEFINED");
    put("early").assert_error(200, "No memory segment is mounted");
    assert_eq!(ready_segments(&|p| meta.client().get(p).text()), None);
    // Not reported yet: its client figures are stale, and it has no bandwidth series.
    assert_eq!(stale(&meta, rank as u32).as_deref(), Some("1"));
    assert_eq!(bandwidth_series(&meta, rank as u32), 0);
    // The first heartbeat: OK, and a put goes to the rank's local service.
    beat(rank, 1, epoch);
    assert_eq!(status_of(&meta, &seg), "OK");
    assert_eq!(stale(&meta, rank as u32).as_deref(), Some("0"));
    assert!(bandwidth_series(&meta, rank as u32) > 0);
    let r = put("after-beat");
    assert_eq!(r.status, 307, "{}", r.text());
    assert!(r.header("location").unwrap().starts_with(url));
    // Later heartbeats change nothing.
    beat(rank, 1, epoch);
    assert_eq!(status_of(&meta, &seg), "OK");

    // The same service joining again (it gave up on the meta's answers and dropped its grant
    // key): the same membership, UNDEFINED again until the heartbeat after this answer.
    assert_eq!(join("null", 1), (rank, epoch));
    assert_eq!(status_of(&meta, &seg), "UNDEFINED");
    put("rejoining").assert_error(200, "No memory segment is mounted");
    beat(rank, 1, epoch);
    assert_eq!(status_of(&meta, &seg), "OK");

    // A restart (a new incarnation) under its configured rank: a new membership, its fresh
    // segments too.
    let (again, epoch2) = join(&rank.to_string(), 2);
    assert_eq!(again, rank);
    assert_ne!(epoch2, epoch);
    assert_eq!(status_of(&meta, &seg), "UNDEFINED");
    put("restarted").assert_error(200, "No memory segment is mounted");
    beat(rank, 2, epoch2);
    assert_eq!(status_of(&meta, &seg), "OK");
    assert_eq!(put("restarted").status, 307);
    // Fenced: the old process's messages (its incarnation, or its epoch) change nothing.
    for (incarnation, e) in [(1, epoch), (2, epoch), (1, epoch2)] {
        send_beat(rank, incarnation, e)
            .assert_error(409, "Unknown rank, incarnation or epoch: join again");
        let body = format!(r#"{{"rank":{rank},"incarnation":{incarnation},"epoch":{e}}}"#);
        meta.client()
            .request("POST", "/cluster/v1/leave", Some(body.as_bytes()))
            .assert_error(
                409,
                "Unknown rank, incarnation or epoch, or already leaving",
            );
    }
    assert_eq!(status_of(&meta, &seg), "OK");
    assert_eq!(put("still-there").status, 307);
}

/// A local service reports at once after its join's answer, not a heartbeat interval later:
/// with a 5 s interval its segment is OK well within a second of its join.
#[test]
fn a_local_service_reports_at_once_after_joining() {
    let meta = meta(&[
        ("ock.mmc.cluster.heartbeat_interval_ms", "5000"),
        ("ock.mmc.cluster.heartbeat_timeout_ms", "20000"),
    ]);
    let _local = local_builder(&meta, &[]).start();
    let listed_at = {
        let deadline = Instant::now() + Duration::from_secs(10);
        while segments(&meta).is_empty() {
            assert!(Instant::now() < deadline, "the local service never joined");
            std::thread::sleep(Duration::from_millis(5));
        }
        Instant::now()
    };
    let segs = wait_segments(&meta, 1, Duration::from_secs(10));
    let took = listed_at.elapsed();
    assert!(
        took < Duration::from_millis(1500),
        "{segs:?} OK {took:?} after being listed"
    );
    let r = follow(&meta, "PUT", "/api/v1/objects?key=soon", Some(b"soon"));
    assert_eq!(r.json()["success"], true, "{}", r.text());
}

#[test]
fn a_read_grant_given_before_a_local_service_restarted_is_refused_by_the_new_one() {
    // Long leases: the read grant outlives the restart.
    let meta = meta(&[("ock.mmc.lease_ms", "60000")]);
    let (mut a, ra) = join(&meta, &[("ock.mmc.local_service.rank", "0")]);
    let old = object(3);
    let target = format!("/api/v1/objects?key=old&prefer_rank={ra}");
    let r = follow(&meta, "PUT", &target, Some(&old));
    assert_eq!(r.json()["success"], true, "{}", r.text());
    // A client takes the read's redirect and is slow to follow it.
    let r = meta.client().get("/api/v1/objects?key=old");
    assert_eq!(r.status, 307);
    let (to, stale_read) = split_location(r.header("location").unwrap());
    // The local service dies and comes back on the same address and rank before the meta
    // notices; the fresh memory takes another object of the same size at the same place.
    let addr_a = a.addr;
    a.kill9();
    let _a2 = local_builder(&meta, &[("ock.mmc.local_service.rank", "0")])
        .listen(&addr_a.to_string())
        .start();
    let new: Vec<u8> = old.iter().map(|b| !b).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = follow(
            &meta,
            "PUT",
            "/api/v1/objects?key=new&prefer_rank=0",
            Some(&new),
        );
        if r.status == 200 && r.json()["success"] == true {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no put on the restarted rank: {}",
            r.text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let q = meta.client().get("/query_key?key=new").json();
    assert_eq!(q["blobs"][0]["rank"], ra, "{q}");
    // The grant was for the killed process: the new one refuses it instead of serving the
    // bytes now at that place.
    let r = Client::connect(to).get(&stale_read);
    assert!(r.body != new, "the stale grant read another object's bytes");
    r.assert_error(403, "Invalid grant: signature does not match");
    follow(&meta, "GET", "/api/v1/objects?key=old", None).assert_error(200, "Key not found");
    assert!(follow(&meta, "GET", "/api/v1/objects?key=new", None).body == new);
}

#[test]
fn a_batch_get_reads_the_other_replica_when_a_rank_just_died() {
    // Long heartbeat timeout: the dead rank stays mounted throughout, as in the seconds
    // before its loss is declared.
    let meta = meta(&[("ock.mmc.cluster.heartbeat_timeout_ms", "30000")]);
    let (mut a, ra) = join(&meta, &[]);
    let (_b, _rb) = join(&meta, &[]);
    let keys: Vec<String> = (0..6).map(|i| format!("r-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let target = format!("/api/v1/objects?key={key}&replicas=2&prefer_rank={ra}");
        let r = follow(&meta, "PUT", &target, Some(&object(i)));
        assert_eq!(r.json()["success"], true, "{}", r.text());
    }
    // A single-copy object on the dying rank has nowhere else to be read from.
    let target = format!("/api/v1/objects?key=only-a&prefer_rank={ra}");
    let r = follow(&meta, "PUT", &target, Some(b"gone"));
    assert_eq!(r.json()["success"], true, "{}", r.text());
    // The reads are sent to rank a first (its copy is the first of each object).
    let r = meta.client().get("/api/v1/objects?key=r-0");
    assert_eq!(r.status, 307);
    let (to, _) = split_location(r.header("location").unwrap());
    assert_eq!(to, a.addr, "the first copy is on the preferred rank");
    a.kill9();
    let list = format!("{},only-a", keys.join(","));
    let r = meta
        .client()
        .get(&format!("/api/v1/objects/batch_get?keys={list}"));
    assert_eq!(r.status, 200);
    let mut want: Vec<Option<Vec<u8>>> = (0..6).map(|i| Some(object(i))).collect();
    want.push(None);
    assert!(
        batch_values(&r.body) == want,
        "each replicated object read from the live rank; the single copy missing"
    );
}

/// `series` on `addr`'s `/metrics` once it equals `want`, within 10 s (a local service's
/// figures reach its meta with its next heartbeat); its last value otherwise.
pub(super) fn wait_series(addr: SocketAddr, series: &str, want: f64) -> Option<f64> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = crate::observability::scrape(&mut Client::connect(addr))
            .get(series)
            .copied();
        if got == Some(want) || Instant::now() >= deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `memcache_bandwidth_bytes_cum_total` series of `rank` and `op`.
pub(super) fn cum(rank: u32, op: &str) -> String {
    format!("memcache_bandwidth_bytes_cum_total{{rank=\"{rank}\",operation=\"{op}\"}}")
}

/// Client bandwidth per rank is what each rank moved (issue 27 D1, D2): a remote rank's bytes
/// go between the client and its local service, which reports them with its heartbeats, and
/// the meta shows them for that rank (before, it showed 0); a batch_get across ranks books
/// each rank's bytes to it (before, all to the first item's rank). A rank whose local service
/// reports is fresh (stale 0) with or without traffic; a lost one is stale (1).
#[test]
fn client_bandwidth_of_a_remote_rank_is_what_its_local_service_moved() {
    let quick = [
        ("ock.mmc.cluster.heartbeat_interval_ms", "100"),
        ("ock.mmc.cluster.heartbeat_timeout_ms", "1500"),
        ("ock.mmc.metrics.window_secs", "1"),
    ];
    let meta = meta(&quick);
    let (a, ra) = join(&meta, &quick);
    let (mut b, rb) = join(&meta, &quick);
    for (key, rank, len) in [("on-a", ra, 100), ("on-b", rb, 300)] {
        let target = format!("/api/v1/objects?key={key}&prefer_rank={rank}");
        let r = follow(&meta, "PUT", &target, Some(&vec![7u8; len]));
        assert_eq!(r.json()["success"], true, "{}", r.text());
        let r = follow(&meta, "GET", &format!("/api/v1/objects?key={key}"), None);
        assert_eq!(r.body.len(), len);
    }
    for (rank, len) in [(ra, 100.0), (rb, 300.0)] {
        for op in ["batch_put", "batch_get"] {
            assert_eq!(
                wait_series(meta.addr, &cum(rank, op), len),
                Some(len),
                "{op}"
            );
        }
    }
    // The local service's own /metrics says the same.
    let own = crate::observability::scrape(&mut a.client());
    assert_eq!(own.get(&cum(ra, "batch_get")), Some(&100.0));
    // One batch_get over both ranks: each rank's bytes to that rank.
    let r = meta
        .client()
        .get("/api/v1/objects/batch_get?keys=on-a,on-b");
    assert_eq!(batch_values(&r.body).len(), 2);
    assert_eq!(
        wait_series(meta.addr, &cum(ra, "batch_get"), 200.0),
        Some(200.0)
    );
    assert_eq!(
        wait_series(meta.addr, &cum(rb, "batch_get"), 600.0),
        Some(600.0)
    );
    // Two windows without traffic: reporting ranks stay fresh.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(stale(&meta, ra).as_deref(), Some("0"));
    assert_eq!(stale(&meta, rb).as_deref(), Some("0"));
    let window = format!("memcache_bandwidth_bytes{{rank=\"{ra}\",operation=\"batch_get\"}}");
    assert_eq!(
        wait_series(meta.addr, &window, 0.0),
        Some(0.0),
        "the window moved on"
    );
    // Lost: stale, and no bandwidth series any more.
    b.kill9();
    wait_segments(&meta, 1, Duration::from_secs(6));
    assert_eq!(stale(&meta, rb).as_deref(), Some("1"));
    assert_eq!(bandwidth_series(&meta, rb), 0);
    assert_eq!(stale(&meta, ra).as_deref(), Some("0"));
}

/// A local service is never the leader (issue 27 D3). Started before its meta service can be
/// reached, it says so at WARN with the meta's address at once and then at a bounded rate,
/// reports `unknown`/`starting` and is not ready; once joined it is ready and reports the meta
/// it follows (`standby`, its address, view_version 0 without HA). One that never joined
/// says, on SIGTERM, that it has nothing to leave.
#[test]
fn a_local_service_says_what_it_is_and_whom_it_follows() {
    let port = crate::ha::free_port();
    let meta_url = format!("http://127.0.0.1:{port}");
    let local = local_of_url(&meta_url, &[]).start();
    let warned = format!("the meta service at {meta_url} cannot be reached");
    let deadline = Instant::now() + Duration::from_secs(3);
    while !local.log().contains(&warned) {
        assert!(
            Instant::now() < deadline,
            "no warning within 3 s:\n{}",
            local.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        local
            .log()
            .lines()
            .any(|l| l.contains(" WARN ") && l.contains(&warned)),
        "{}",
        local.log()
    );
    let mut c = local.client();
    assert_eq!(
        c.get("/health").text(),
        r#"{"status":"ok","role":"unknown","ha_state":"starting","service_ready":false,"leader_address":"unknown","view_version":0}"#
    );
    assert_eq!(c.get("/role").text(), "unknown");
    assert_eq!(c.get("/ha_status").text(), "starting");
    assert_eq!(
        c.get("/leader").text(),
        r#"{"present":false,"leader_address":"unknown","view_version":0}"#
    );
    c.get("/ready").assert_error(503, "Service not ready");
    let m = c.get("/metrics").text();
    assert!(m.contains("memcache_ha_role{role=\"leader\"} 0\n"), "{m}");
    assert!(m.contains("\nmemcache_ha_serving 0\n"), "{m}");
    // It keeps trying (every few hundred milliseconds) without a warning each time.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(local.log().matches(&warned).count(), 1, "{}", local.log());

    // The meta comes up on that port: joined, ready, following it.
    let meta = ServerBuilder::new(Driver::Uring)
        .listen(&format!("127.0.0.1:{port}"))
        .set("ock.mmc.embedded.ranks", "0")
        .start();
    wait_segments(&meta, 1, Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.get("/ready").status != 200 {
        assert!(Instant::now() < deadline, "not ready once joined");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        c.get("/health").text(),
        format!(
            r#"{{"status":"ok","role":"standby","ha_state":"standby","service_ready":true,"leader_address":"{meta_url}","view_version":0}}"#
        )
    );
    assert_eq!(c.get("/role").text(), "standby");
    assert_eq!(c.get("/ha_status").text(), "standby");
    assert_eq!(
        c.get("/leader").text(),
        format!(r#"{{"present":true,"leader_address":"{meta_url}","view_version":0}}"#)
    );
    assert!(
        c.get("/metrics")
            .text()
            .contains("memcache_ha_role{role=\"standby\"} 1\n")
    );
    assert!(
        local
            .log()
            .contains(&format!("the meta service at {meta_url} answered"))
    );

    // Another that never reaches its meta: SIGTERM says there is nothing to leave.
    let nowhere = format!("http://127.0.0.1:{}", crate::ha::free_port());
    let mut lonely = local_of_url(&nowhere, &[]).start();
    assert!(lonely.stop().success());
    let log = lonely.log();
    assert!(
        log.contains("SIGTERM: not joined to a meta service: nothing to leave"),
        "{log}"
    );
    assert!(!log.contains("leaving the meta service"), "{log}");
    drop(local);
    drop(meta);
}
