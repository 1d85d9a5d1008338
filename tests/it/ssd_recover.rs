//! A restart keeps the SSD tier (issue 28): objects flushed to SSD are back after a `kill -9`
//! and a start on the same path (listed, counted, readable byte for byte, announced as KV
//! `BlockStored` on the disk medium after `AllBlocksCleared`); a damaged region of the file
//! loses only its objects; `ock.mmc.ssd.recover=false` starts empty; `kill -9` at random
//! moments during flushes never yields a wrong byte, and a removal answered before the kill
//! stays removed.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read as _, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::both_drivers;
use crate::harness::{Client, Driver, Server, ServerBuilder, pct};
use crate::observability::scrape;
use crate::ssd::Read;
use crate::store::{data, eventually, media, put, query, temp_dir};

both_drivers!(
    flushed_objects_come_back_after_kill_9,
    a_damaged_region_loses_only_its_objects,
    recover_false_starts_empty,
    what_the_ssd_tier_creates_is_logged,
    kill_9_during_flushes_never_yields_a_wrong_byte,
);

/// Two shards, no HBM, 2 MB of DRAM (puts of a few hundred KB go down to SSD at once).
fn server(driver: Driver, dir: &Path) -> ServerBuilder {
    ServerBuilder::new(driver)
        .set("ock.mmc.local_service.hbm.size", "0")
        .set("ock.mmc.local_service.dram.size", "2MB")
        .set("ock.mmc.ssd.enable", "true")
        .set("ock.mmc.ssd.path", dir.to_str().unwrap())
        .set("ock.mmc.ssd.size", "256MB")
        .set("ock.mmc.segment.run_bytes", "1MB")
        .set("ock.mmc.lease_ms", "100")
}

/// The size and seed of an object named by [`name`].
fn spec(key: &str) -> (usize, u64) {
    let (_, rest) = key.split_once("-s").unwrap();
    let (size, seed) = rest.split_once("-x").unwrap();
    (size.parse().unwrap(), seed.parse().unwrap())
}

/// An object name that says its size and seed, so its bytes are known from the name alone.
fn name(prefix: &str, size: usize, seed: u64) -> String {
    format!("{prefix}-s{size}-x{seed}")
}

fn put_named(c: &mut Client, key: &str) {
    let (size, seed) = spec(key);
    let r = put(c, key, &data(size, seed), "");
    assert_eq!(r.json()["success"], true, "put {key}: {}", r.text());
}

fn listed(c: &mut Client) -> BTreeSet<String> {
    let r = c.get("/get_all_keys");
    assert_eq!(r.status, 200);
    r.text().lines().map(str::to_string).collect()
}

fn summary(c: &mut Client, field: &str) -> u64 {
    c.get("/metrics/summary")
        .text()
        .split(' ')
        .find_map(|kv| kv.strip_prefix(&format!("{field}=")).map(str::to_string))
        .unwrap_or_else(|| panic!("no {field} in the summary"))
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// GETs `key` and classifies the answer (`ssd::read_back`: 200 with other bytes than the
/// put's, the name says which, fails the test).
#[track_caller]
fn read_back(c: &mut Client, key: &str) -> Read {
    let (size, seed) = spec(key);
    crate::ssd::read_back(c, key, &data(size, seed))
}

/// A server on `dir` with objects `{prefix}{i}` put, `i` below `n`, of `size(i)` bytes.
fn filled(
    driver: Driver,
    dir: &Path,
    prefix: &str,
    n: u64,
    size: impl Fn(u64) -> usize,
) -> (Server, Client, Vec<String>) {
    let srv = server(driver, dir).start();
    let mut c = srv.client();
    let keys: Vec<String> = (0..n)
        .map(|i| {
            name(
                &format!("{prefix}{i}"),
                size(i),
                i + prefix.len() as u64 * 1000,
            )
        })
        .collect();
    for k in &keys {
        put_named(&mut c, k);
    }
    (srv, c, keys)
}

/// Waits until no flush is under way (the flushed count stays put), then gives each key's
/// media.
fn settled_media(c: &mut Client, keys: &[String]) -> BTreeMap<String, Vec<String>> {
    let flushed = |c: &mut Client| scrape(c)["memcache_flush_blobs_total"];
    let mut last = flushed(c);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = flushed(c);
        if now == last {
            break;
        }
        assert!(Instant::now() < deadline, "flushes never settled");
        last = now;
    }
    keys.iter()
        .map(|k| {
            let q = query(c, k);
            let m = if q["success"] == false {
                Vec::new()
            } else {
                media(&q)
            };
            (k.clone(), m)
        })
        .collect()
}

fn disk(dir: &Path) -> String {
    format!("rank=\"0\",disk_path=\"{}\"", dir.display())
}

#[track_caller]
fn metric(c: &mut Client, name: &str, dir: &Path, extra: &str) -> f64 {
    let series = format!("{name}{{{}{extra}}}", disk(dir));
    *scrape(c)
        .get(&series)
        .unwrap_or_else(|| panic!("no {series} in the scrape"))
}

/// Removes `key` (the answer says it was), then kills the server with SIGKILL.
fn remove_then_kill(mut srv: Server, mut c: Client, key: &str) {
    c.request("DELETE", &format!("/key?key={}", pct(key.as_bytes())), None)
        .assert_error_free();
    drop(c);
    srv.kill9();
}

/// Objects on SSD when the server is killed are back after a start on the same path: the
/// same set listed (the ones only in memory are gone, and so is one removed before the kill),
/// counted in `keys` and the SSD's used bytes, each read back byte for byte, read back once
/// in the background; twice over (a recovered object survives the next restart too).
fn flushed_objects_come_back_after_kill_9(driver: Driver) {
    let dir = temp_dir("recover");
    let (srv, mut c, keys) = filled(driver, &dir, "k", 40, |i| 100_000 + i as usize * 3001);
    let m = settled_media(&mut c, &keys);
    let mut on_ssd: BTreeSet<String> = m
        .iter()
        .filter(|(_, m)| m.iter().any(|x| x == "SSD"))
        .map(|(k, _)| k.clone())
        .collect();
    assert!(on_ssd.len() >= 20, "{m:?}");
    assert!(on_ssd.len() < keys.len(), "some stay in DRAM: {m:?}");
    // A removal answered before the kill stays removed.
    remove_then_kill(srv, c, &on_ssd.pop_first().unwrap());

    for round in 0..2 {
        let srv = server(driver, &dir).start();
        let mut c = srv.client();
        assert_eq!(listed(&mut c), on_ssd, "round {round}");
        assert_eq!(summary(&mut c, "keys"), on_ssd.len() as u64);
        let used: u64 = on_ssd
            .iter()
            .map(|k| (spec(k).0 as u64).div_ceil(4096) * 4096)
            .sum();
        let q = c.get("/query_segment?segment=rank-0-ssd").json();
        assert_eq!(q["used_bytes"], used, "the SSD's use: {q}");
        let n = on_ssd.len() as f64;
        if round == 0 {
            assert_eq!(
                metric(&mut c, "memcache_ssd_recovered_blobs_total", &dir, ""),
                n
            );
            for reason in ["length", "invalid", "conflict", "checksum"] {
                let r = format!(",reason=\"{reason}\"");
                assert_eq!(
                    metric(
                        &mut c,
                        "memcache_ssd_recovery_dropped_blobs_total",
                        &dir,
                        &r
                    ),
                    0.0
                );
            }
            eventually("every recovered blob is read back", || {
                metric(
                    &mut c,
                    "memcache_ssd_recovery_verify_pending_blobs",
                    &dir,
                    "",
                ) == 0.0
            });
            assert_eq!(
                metric(
                    &mut c,
                    "memcache_ssd_recovery_verified_blobs_total",
                    &dir,
                    ""
                ),
                n
            );
            assert!(metric(&mut c, "memcache_ssd_recovery_duration_seconds", &dir, "") > 0.0);
        }
        for k in &on_ssd {
            assert_eq!(read_back(&mut c, k), Read::Identical, "round {round}");
        }
        assert!(
            srv.log().contains("recovered from the SSD file in"),
            "{}",
            srv.log()
        );
        // The next round: one more removal, then a kill again.
        remove_then_kill(srv, c, &on_ssd.pop_last().unwrap());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The SSD file is damaged while the server is down: one object's bytes overwritten, and
/// the file cut short inside the last object. Those two are lost (the cut one at once, the
/// overwritten one when it is read back or read), every other one reads back identical, and
/// no GET ever answers wrong bytes.
fn a_damaged_region_loses_only_its_objects(driver: Driver) {
    let dir = temp_dir("recover-damaged");
    let (mut srv, mut c, keys) = filled(driver, &dir, "d", 30, |_| 200_000);
    let m = settled_media(&mut c, &keys);
    let mut at: Vec<(u64, String)> = m
        .iter()
        .filter(|(_, m)| **m == ["SSD"])
        .map(|(k, _)| {
            let gva = query(&mut c, k)["blobs"][0]["gva"].as_u64().unwrap();
            (gva & ((1 << 40) - 1), k.clone())
        })
        .collect();
    at.sort();
    assert!(at.len() >= 10, "{m:?}");
    drop(c);
    srv.kill9();
    let file = dir.join("mmc-rank-0.ssd");
    let (victim_at, victim) = at[at.len() / 2].clone();
    let (last_at, last) = at.last().unwrap().clone();
    {
        let mut f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        use std::io::Seek;
        f.seek(std::io::SeekFrom::Start(victim_at + 8192)).unwrap();
        f.write_all(&[0x5a; 4096]).unwrap();
        f.set_len(last_at + 4096).unwrap();
    }
    let srv = server(driver, &dir).start();
    let mut c = srv.client();
    let keys_now = listed(&mut c);
    assert!(
        !keys_now.contains(&last),
        "the object cut short is not listed"
    );
    assert_eq!(
        metric(
            &mut c,
            "memcache_ssd_recovery_dropped_blobs_total",
            &dir,
            ",reason=\"length\""
        ),
        1.0
    );
    for (_, k) in &at {
        let r = read_back(&mut c, k);
        if *k == victim {
            assert_ne!(r, Read::Identical, "{k} was overwritten");
        } else if *k == last {
            assert_eq!(r, Read::NotFound);
        } else {
            assert_eq!(r, Read::Identical, "{k}");
        }
    }
    eventually("the damaged object is dropped and counted", || {
        metric(
            &mut c,
            "memcache_ssd_recovery_dropped_blobs_total",
            &dir,
            ",reason=\"checksum\"",
        ) == 1.0
    });
    assert_eq!(read_back(&mut c, &victim), Read::NotFound);
    assert!(!listed(&mut c).contains(&victim));
    assert_eq!(summary(&mut c, "keys"), at.len() as u64 - 2);
    drop(c);
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ock.mmc.ssd.recover=false`: the SSD file starts empty and keeps no journal, so a later
/// start with recovery on has nothing to take back either.
/// The directory and the file the SSD tier creates are logged with their paths and the file's
/// size (issue 31: `/mnt/nvme/mmc` and a 4 GiB file appeared without a word); a start on them
/// again says it opened the file, one without recovery that it emptied it.
fn what_the_ssd_tier_creates_is_logged(driver: Driver) {
    let top = temp_dir("ssd-logged");
    let dir = top.join("nvme/mmc");
    let file = dir.join("mmc-rank-0.ssd");
    let waits_for = |srv: &Server, line: &str| {
        eventually(line, || srv.log().contains(line));
    };
    let mut srv = server(driver, &dir).start();
    waits_for(&srv, &format!("SSD directory {} created", dir.display()));
    waits_for(
        &srv,
        &format!(
            "SSD file {} created for rank 0's SSD segment: 256 MiB (268435456 bytes)",
            file.display()
        ),
    );
    srv.stop();
    let mut srv = server(driver, &dir).start();
    waits_for(&srv, &format!("SSD file {} opened", file.display()));
    assert!(!srv.log().contains("SSD directory"), "{}", srv.log());
    srv.stop();
    let srv = server(driver, &dir)
        .set("ock.mmc.ssd.recover", "false")
        .start();
    waits_for(&srv, &format!("SSD file {} emptied", file.display()));
    drop(srv);
    let _ = std::fs::remove_dir_all(&top);
}

fn recover_false_starts_empty(driver: Driver) {
    let dir = temp_dir("recover-off");
    let (mut srv, mut c, keys) = filled(driver, &dir, "o", 20, |_| 200_000);
    let m = settled_media(&mut c, &keys);
    assert!(m.values().any(|m| m.iter().any(|x| x == "SSD")), "{m:?}");
    drop(c);
    srv.kill9();
    let journal = dir.join("mmc-rank-0.ssd.journal");
    assert!(journal.exists());
    let srv = server(driver, &dir)
        .set("ock.mmc.ssd.recover", "false")
        .start();
    let mut c = srv.client();
    assert!(listed(&mut c).is_empty());
    assert_eq!(summary(&mut c, "keys"), 0);
    assert_eq!(summary(&mut c, "ssd_used"), 0);
    assert!(!journal.exists(), "no journal without recovery");
    assert!(
        !scrape(&mut c)
            .keys()
            .any(|k| k.starts_with("memcache_ssd_recovered_blobs_total{")),
        "no recovery series without recovery"
    );
    assert_eq!(read_back(&mut c, &keys[0]), Read::NotFound);
    drop(c);
    drop(srv);
    let srv = server(driver, &dir).start();
    let mut c = srv.client();
    assert!(
        listed(&mut c).is_empty(),
        "nothing to recover after a start without"
    );
    drop(c);
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A request that may meet a killed server: the status and body, or `None` when the
/// connection broke.
fn try_request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    body: &[u8],
) -> Option<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).ok()?;
    let text = String::from_utf8_lossy(&out);
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let at = out.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    Some((status, out[at..].to_vec()))
}

/// Ten rounds: a server puts objects (flushed to SSD as they come) and removes some, old and
/// new, while another thread kills it with SIGKILL at a random moment; the next start on the
/// same path serves every listed object with its own bytes (or not at all: never other
/// bytes), and no object whose removal was answered comes back.
fn kill_9_during_flushes_never_yields_a_wrong_byte(driver: Driver) {
    let dir = temp_dir("recover-kill");
    let mut rng = 0x2545_f491_4f6c_dd1d_u64 ^ (driver == Driver::Epoll) as u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut removed: BTreeSet<String> = BTreeSet::new();
    let mut recovered_total = 0;
    for round in 0..10u64 {
        let mut srv = server(driver, &dir).start();
        let mut c = srv.client();
        // What came back: never a removed object, never wrong bytes.
        let back = listed(&mut c);
        assert!(
            back.is_disjoint(&removed),
            "round {round}: removed objects came back: {:?}",
            back.intersection(&removed).collect::<Vec<_>>()
        );
        for k in &back {
            let r = read_back(&mut c, k);
            assert_ne!(
                r,
                Read::Damaged,
                "round {round}: {k} (the journal is written after the bytes)"
            );
        }
        recovered_total += back.len();
        drop(c);
        let addr = srv.addr;
        let pid = srv.pid() as i32;
        let delay = Duration::from_millis(100 + next(700));
        let killer = std::thread::spawn(move || {
            std::thread::sleep(delay);
            // SAFETY: a signal to the test's own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        });
        let mut old: Vec<String> = back.into_iter().collect();
        let mut mine: Vec<String> = Vec::new();
        for i in 0.. {
            let key = name(
                &format!("r{round}-{i}"),
                50_000 + next(300_000) as usize,
                next(1 << 40),
            );
            let (size, seed) = spec(&key);
            let target = format!("/api/v1/objects?key={}", pct(key.as_bytes()));
            if try_request(addr, "PUT", &target, &data(size, seed)).is_none() {
                break;
            }
            mine.push(key);
            if next(4) == 0 {
                let pool = if next(2) == 0 && !old.is_empty() {
                    &mut old
                } else {
                    &mut mine
                };
                let victim = pool.swap_remove(next(pool.len() as u64) as usize);
                let target = format!("/key?key={}", pct(victim.as_bytes()));
                match try_request(addr, "DELETE", &target, b"") {
                    Some((200, body)) if String::from_utf8_lossy(&body).contains("key deleted") => {
                        removed.insert(victim);
                    }
                    Some(_) => {}
                    None => break,
                }
            }
        }
        killer.join().unwrap();
        assert!(
            srv.wait_exit(Duration::from_secs(5)).is_some(),
            "the server did not die"
        );
    }
    assert!(recovered_total > 0, "nothing ever came back");
    let _ = std::fs::remove_dir_all(&dir);
}

trait ErrorFree {
    fn assert_error_free(&self);
}

impl ErrorFree for crate::harness::Response {
    #[track_caller]
    fn assert_error_free(&self) {
        assert_eq!(self.json()["success"], true, "{}", self.text());
    }
}

/// The KV stream of a restarted server opens with `AllBlocksCleared` at sequence 0, then
/// announces a `BlockStored` on the disk medium for each object it took back from SSD.
#[test]
fn the_kv_stream_opens_with_cleared_then_announces_what_came_back() {
    let dir = temp_dir("recover-kv");
    let start = |dir: &Path, replay: u16| -> Server {
        server(Driver::Uring, dir)
            .set("ock.mmc.kv_events.enable", "true")
            .set(
                "ock.mmc.kv_events.endpoint",
                &format!("tcp://127.0.0.1:{}", crate::ha::free_port()),
            )
            .set(
                "ock.mmc.kv_events.replay_endpoint",
                &format!("tcp://127.0.0.1:{replay}"),
            )
            .set("ock.mmc.kv_events.replay_batches", "1000")
            .set("ock.mmc.kv_events.batch_max_delay_ms", "2")
            .start()
    };
    let mut srv = start(&dir, crate::ha::free_port());
    let mut c = srv.client();
    let keys: Vec<String> = (0..20)
        .map(|i| format!("m@1@0@{:x}@bf16", 0xabc00 + i))
        .collect();
    for (i, k) in keys.iter().enumerate() {
        let r = put(&mut c, k, &data(200_000, i as u64), "");
        assert_eq!(r.json()["success"], true);
    }
    let m = settled_media(&mut c, &keys);
    let on_ssd: BTreeSet<u64> = m
        .iter()
        .filter(|(_, m)| m.iter().any(|x| x == "SSD"))
        .map(|(k, _)| u64::from_str_radix(k.split('@').nth(3).unwrap(), 16).unwrap())
        .collect();
    assert!(!on_ssd.is_empty());
    drop(c);
    srv.kill9();
    let replay = crate::ha::free_port();
    let srv = start(&dir, replay);
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while events.iter().filter(|(t, _, _)| t == "BlockStored").count() < on_ssd.len() {
        assert!(Instant::now() < deadline, "events so far: {events:?}");
        std::thread::sleep(Duration::from_millis(50));
        events = replay_from_zero(replay);
    }
    assert_eq!(
        events[0],
        ("AllBlocksCleared".to_string(), 0, String::new())
    );
    let stored: BTreeSet<u64> = events[1..]
        .iter()
        .map(|(tag, hash, medium)| {
            assert_eq!((tag.as_str(), medium.as_str()), ("BlockStored", "DISK"));
            *hash
        })
        .collect();
    assert_eq!(stored, on_ssd);
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every event the publisher kept, from sequence 0, through vLLM's replay protocol on a REQ
/// socket (one batch per request, then the end marker).
fn replay_from_zero(port: u16) -> Vec<(String, u64, String)> {
    let ctx = zmq::Context::new();
    let req = ctx.socket(zmq::REQ).unwrap();
    req.set_rcvtimeo(5000).unwrap();
    req.connect(&format!("tcp://127.0.0.1:{port}")).unwrap();
    let mut next = 0u64;
    let mut events = Vec::new();
    loop {
        req.send(&next.to_be_bytes()[..], 0).unwrap();
        let f = req.recv_multipart(0).expect("a replay answer within 5 s");
        let seq = u64::from_be_bytes(f[0].as_slice().try_into().unwrap());
        if seq == u64::MAX {
            return events;
        }
        assert_eq!(seq, next, "sequences are contiguous from 0");
        events.extend(crate::ha_kv::batch_events(&f[1]));
        next = seq + 1;
    }
}
