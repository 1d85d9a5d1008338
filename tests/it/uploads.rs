//! Streamed uploads (object PUTs of 256 KiB and more, read straight into their blobs) against
//! the store's reclaim and remove paths: a slow writer never writes into another object's
//! memory, a body that arrives too slowly is answered 408 and its allocation returned, and a
//! put that loses a race with a delete gives its bytes back.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::both_drivers;
use crate::harness::{Client, Driver, Server, ServerBuilder};
use crate::store::{data, eventually, get_bytes, put_ok};

both_drivers!(
    a_slow_upload_never_writes_into_another_object,
    a_slow_upload_under_a_short_alloc_timeout_is_cut_first,
    a_trickling_body_is_cut_and_its_allocation_returned,
    a_put_racing_a_delete_gives_its_bytes_back,
);

const MIB: usize = 1 << 20;

fn head(key: &str, len: usize) -> String {
    format!("PUT /api/v1/objects?key={key} HTTP/1.1\r\nHost: t\r\nContent-Length: {len}\r\n\r\n")
}

/// The used bytes of every segment, summed, from `/query_segment`.
fn used_total(c: &mut Client) -> u64 {
    let names = c.get("/get_all_segments").text();
    names
        .lines()
        .map(|name| {
            c.get(&format!("/query_segment?segment={name}")).json()["used_bytes"]
                .as_u64()
                .unwrap()
        })
        .sum()
}

/// Every segment's used bytes, as each capacity view reports them; all must agree (call it
/// once nothing is moving).
fn used_everywhere(c: &mut Client) -> Vec<(String, u64)> {
    let names = c.get("/get_all_segments").text();
    let mut out = Vec::new();
    let rem = c.get("/api/v1/capacity/segment_remaining").json();
    let metrics = c.get("/metrics").text();
    for name in names.lines() {
        let q = c.get(&format!("/query_segment?segment={name}")).json();
        let used = q["used_bytes"].as_u64().unwrap();
        let listed = rem["segments"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["segment_name"] == name)
            .unwrap_or_else(|| panic!("{name} in segment_remaining"))["used_bytes"]
            .as_u64()
            .unwrap();
        let series = format!("memcache_segment_allocated_bytes{{segment=\"{name}\"}} ");
        let exported: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .unwrap_or_else(|| panic!("{series} in /metrics"))
            .trim()
            .parse()
            .unwrap();
        assert_eq!((listed, exported), (used, used), "{name}: views disagree");
        out.push((name.to_string(), used));
    }
    let total: u64 = out.iter().map(|(_, u)| u).sum();
    let usage = c.get("/api/v1/capacity/usage").json();
    let by_usage =
        usage["npu"]["used_bytes"].as_u64().unwrap() + usage["cpu"]["used_bytes"].as_u64().unwrap();
    let summary = c.get("/metrics/summary").text();
    let hbm_used: u64 = summary
        .split(' ')
        .find_map(|kv| kv.strip_prefix("hbm_used="))
        .and_then(|v| v.split('/').next())
        .unwrap()
        .parse()
        .unwrap();
    let hbm: u64 = out
        .iter()
        .filter(|(n, _)| n.ends_with("-hbm"))
        .map(|(_, u)| u)
        .sum();
    assert_eq!(hbm_used, hbm, "summary hbm_used");
    assert_eq!(by_usage, total, "capacity/usage");
    out
}

/// Waits until `/query_segment` shows `total` used bytes, then checks that every view says so.
#[track_caller]
fn settles_at(c: &mut Client, what: &str, total: u64) {
    eventually(what, || used_total(c) == total);
    let views: u64 = used_everywhere(c).iter().map(|(_, u)| u).sum();
    assert_eq!(views, total, "{what}");
}

fn memory_server(driver: Driver) -> ServerBuilder {
    ServerBuilder::new(driver)
        .shards(2)
        .set("ock.mmc.local_service.hbm.size", "32MB")
        .set("ock.mmc.local_service.dram.size", "32MB")
}

/// A 1 MiB put trickling for 6 s (past `alloc_timeout_ms`), then eight 1 MiB puts of other
/// patterns while it still trickles: every one of them reads back byte for byte. (Reclaiming
/// the slow put's allocation under it used to hand its memory to one of the eight, which the
/// slow client then overwrote.) Here the slow put is alive throughout (it keeps the minimum
/// rate) and so is never reclaimed; it ends with a 408 once it stops sending.
fn a_slow_upload_never_writes_into_another_object(driver: Driver) {
    let srv = memory_server(driver)
        .set("ock.mmc.store.alloc_timeout_ms", "3000")
        .set("ock.mmc.http.header_timeout_ms", "1000")
        .set("ock.mmc.http.body_timeout_ms", "2000")
        .set("ock.mmc.http.body_min_rate_bytes_per_sec", "1024")
        .start();
    let sent = slow_upload_then_eight_puts(&srv, 1024, Duration::from_millis(200));
    assert!(
        sent > 20 * 1024,
        "the slow client kept sending ({sent} bytes)"
    );
}

/// The same with only the allocation and header timeouts shortened (the body timeout follows
/// the allocation timeout) and a client trickling 2 B/s: it is cut before its allocation could
/// be reclaimed, and the eight puts read back intact.
fn a_slow_upload_under_a_short_alloc_timeout_is_cut_first(driver: Driver) {
    let srv = memory_server(driver)
        .set("ock.mmc.store.alloc_timeout_ms", "3000")
        .set("ock.mmc.http.header_timeout_ms", "1000")
        .start();
    slow_upload_then_eight_puts(&srv, 1, Duration::from_millis(500));
}

/// Starts a 1 MiB put of 0xEE sending `chunk` bytes every `every` for 6 s, makes eight 1 MiB
/// puts after 3.6 s, and checks them byte for byte, the slow put's 408 and the used bytes.
/// Returns how many body bytes the slow client got to send.
fn slow_upload_then_eight_puts(srv: &Server, chunk: usize, every: Duration) -> usize {
    let mut slow = srv.client();
    slow.send(head("slow", MIB).as_bytes());
    let trickler = {
        let mut stream = slow.stream.try_clone().unwrap();
        std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(6);
            let mut sent = 0;
            while Instant::now() < end {
                if stream.write_all(&vec![0xEE; chunk]).is_err() {
                    break;
                }
                sent += chunk;
                std::thread::sleep(every);
            }
            sent
        })
    };
    // Past the allocation timeout (and a tick) while the slow client still sends.
    std::thread::sleep(Duration::from_millis(3600));
    let mut c = srv.client();
    let bodies: Vec<Vec<u8>> = (0..8).map(|i| data(MIB, 100 + i)).collect();
    for (i, b) in bodies.iter().enumerate() {
        put_ok(&mut c, &format!("victim-{i}"), b, "");
    }
    let sent = trickler.join().unwrap();
    for (i, b) in bodies.iter().enumerate() {
        let got = get_bytes(&mut c, &format!("victim-{i}"));
        let wrong = got.iter().zip(b).filter(|(a, b)| a != b).count();
        assert!(got == *b, "victim-{i}: {wrong} bytes differ");
    }
    // The slow put was (or, once the client went quiet, is) cut and answered 408.
    let r = slow.read_response(false);
    r.assert_error(408, "Request timeout: the body arrived too slowly");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(slow.closed_within(Duration::from_secs(5)));
    c.get("/api/v1/objects?key=slow")
        .assert_error(200, "Key not found");
    settles_at(&mut c, "only the eight victims hold memory", 8 * MIB as u64);
    check_log(srv);
    sent
}

/// A body trickling at 1 B/s keeps clear of the idle timeout but not of the minimum rate; a
/// body that stops is cut by the idle timeout. Both are answered 408 well within 20 s, and
/// their allocations are returned.
fn a_trickling_body_is_cut_and_its_allocation_returned(driver: Driver) {
    let srv = memory_server(driver)
        .set("ock.mmc.http.body_timeout_ms", "2000")
        .start();
    let start = Instant::now();
    let mut trickle = srv.client();
    trickle.send(head("trickle", MIB).as_bytes());
    let mut silent = srv.client();
    silent.send(head("silent", MIB).as_bytes());
    silent.send(&vec![0x55; MIB / 2]);
    let mut c = srv.client();
    settles_at(&mut c, "both puts allocated", 2 * MIB as u64);
    let trickler = {
        let mut stream = trickle.stream.try_clone().unwrap();
        std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(20);
            while Instant::now() < end {
                if stream.write_all(&[0xAB]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    for (name, conn) in [("trickle", &mut trickle), ("silent", &mut silent)] {
        let r = conn.read_response(false);
        r.assert_error(408, "Request timeout: the body arrived too slowly");
        assert!(conn.closed_within(Duration::from_secs(5)), "{name} closed");
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{name} cut after {:?}",
            start.elapsed()
        );
    }
    settles_at(&mut c, "the allocations are returned", 0);
    for key in ["trickle", "silent"] {
        c.get(&format!("/api/v1/objects?key={key}"))
            .assert_error(200, "Key not found");
    }
    trickler.join().unwrap();
    // The server still takes a streamed put at full speed.
    let big = data(MIB, 9);
    put_ok(&mut c, "fast", &big, "");
    assert_eq!(get_bytes(&mut c, "fast"), big);
}

/// A 1 MiB put, half sent, loses its key to `DELETE /key` (and, separately, to
/// `DELETE /all_keys`): once the put has failed, every segment's used bytes are back to 0 in
/// every view (they used to stay at 1 MiB, then 2 MiB, for good).
fn a_put_racing_a_delete_gives_its_bytes_back(driver: Driver) {
    let srv = memory_server(driver).start();
    let mut c = srv.client();
    let body = data(MIB, 3);
    for (i, delete) in ["/key?key=race-0", "/all_keys"].into_iter().enumerate() {
        let key = format!("race-{i}");
        let mut w = srv.client();
        w.send(head(&key, MIB).as_bytes());
        w.send(&body[..MIB / 2]);
        settles_at(&mut c, "the put is allocated", MIB as u64);
        let r = c.request("DELETE", delete, None);
        assert_eq!(r.status, 200, "{delete}: {}", r.text());
        assert_eq!(r.json()["success"], true, "{delete}: {}", r.text());
        w.send(&body[MIB / 2..]);
        w.read_response(false)
            .assert_error(200, "Key was removed while it was being written");
        settles_at(&mut c, "the put's bytes are given back", 0);
        c.get(&format!("/api/v1/objects?key={key}"))
            .assert_error(200, "Key not found");
        // The writer's connection is still usable.
        assert_eq!(w.get("/healthz").text(), "ok");
        check_log(&srv);
    }
    // And the key can be put again.
    put_ok(&mut c, "race-0", &body, "");
    assert_eq!(get_bytes(&mut c, "race-0"), body);
}

fn check_log(srv: &Server) {
    let log = srv.log();
    assert!(!log.contains("panicked"), "{log}");
}
