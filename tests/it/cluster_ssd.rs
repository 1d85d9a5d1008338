//! SSD segments on local services: a pure meta service and local services lending DRAM and
//! SSD (`--role local` with `ock.mmc.ssd.*`). The meta lists and counts the remote SSD, demotes
//! the rank's DRAM blobs to it under pressure and rewarms them on read (the local service copies
//! between its own segments), redirects reads of SSD copies with a grant carrying the checksum,
//! never serves bytes of a damaged SSD file, and drains, loses and unmounts SSD segments as it
//! does DRAM ones.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cluster::{split_location, wait_ready};
use crate::harness::{Client, Driver, Server, ServerBuilder};
use crate::store::{media, temp_dir};

/// `cluster::follow`, asking the meta again when a read's grant expired before the redirected
/// request reached the local service, as a client does: these tests run with 100 ms leases
/// (a read grant lasts its lease), which a loaded machine may outlast between the two hops.
fn follow(
    meta: &Server,
    method: &str,
    target: &str,
    body: Option<&[u8]>,
) -> crate::harness::Response {
    let mut r = crate::cluster::follow(meta, method, target, body);
    for _ in 0..4 {
        if method != "GET" || !r.text().contains("Invalid grant: expired") {
            break;
        }
        r = crate::cluster::follow(meta, method, target, body);
    }
    r
}

const DAMAGED: &str =
    "The object's copy on SSD is damaged (checksum mismatch or short read) and was dropped";

pub(super) fn meta(extra: &[(&str, &str)]) -> Server {
    meta_with(ServerBuilder::new(Driver::Uring), extra)
}

fn meta_with(b: ServerBuilder, extra: &[(&str, &str)]) -> Server {
    let mut b = b.set("ock.mmc.embedded.ranks", "0");
    for (k, v) in extra {
        b = b.set(k, v);
    }
    b.start()
}

/// A local service lending `dram` of DRAM and, with `ssd` a directory, 64 MB of SSD there.
pub(super) fn local(
    meta: &Server,
    dram: &str,
    ssd: Option<&Path>,
    driver: Driver,
) -> ServerBuilder {
    let mut b = ServerBuilder::new(driver)
        .shards(1)
        .arg("--role")
        .arg("local")
        .set("ock.mmc.meta_service_url", &format!("http://{}", meta.addr))
        .set("ock.mmc.local_service.dram.size", dram)
        .set("ock.mmc.local_service.hbm.size", "0");
    if let Some(dir) = ssd {
        b = b
            .set("ock.mmc.ssd.enable", "true")
            .set("ock.mmc.ssd.path", dir.to_str().unwrap())
            .set("ock.mmc.ssd.size", "64MB");
    }
    b
}

fn segments(meta: &Server) -> Vec<String> {
    let r = meta.client().get("/get_all_segments");
    assert_eq!(r.status, 200);
    r.text()
        .lines()
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .collect()
}

/// Waits (bounded) until the meta lists exactly `want` (in any order), all OK.
#[track_caller]
fn wait_segments(meta: &Server, want: &[String], limit: Duration) {
    let mut want = want.to_vec();
    want.sort();
    let same = |s: &[String]| {
        let mut s = s.to_vec();
        s.sort();
        s == want
    };
    if wait_ready(limit, |p| meta.client().get(p).text(), same).is_none() {
        panic!("expected {want:?}, all OK; have {:?}", segments(meta));
    }
}

/// Starts a local service and waits until the meta lists its segments, all OK; returns it
/// and its rank.
#[track_caller]
pub(super) fn join(meta: &Server, b: ServerBuilder, media: &[&str]) -> (Server, u32) {
    let before = segments(meta);
    let local = b.start();
    let grown = |s: &[String]| s.len() == before.len() + media.len();
    let Some(after) = wait_ready(
        Duration::from_secs(10),
        |p| meta.client().get(p).text(),
        grown,
    ) else {
        panic!("the local service did not join: {:?}", segments(meta));
    };
    let new = after.iter().find(|s| !before.contains(s)).unwrap();
    let rank: u32 = new
        .strip_prefix("rank-")
        .and_then(|r| r.split('-').next())
        .unwrap()
        .parse()
        .unwrap();
    for m in media {
        let name = format!("rank-{rank}-{m}");
        assert!(after.contains(&name), "{name} in {after:?}");
    }
    (local, rank)
}

pub(super) fn object(i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (j * 31 + i * 7 + j / 4096) as u8)
        .collect()
}

pub(super) fn put(meta: &Server, key: &str, data: &[u8]) {
    let r = follow(
        meta,
        "PUT",
        &format!("/api/v1/objects?key={key}"),
        Some(data),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["success"], true, "{key}: {}", r.text());
}

fn media_of(meta: &Server, key: &str) -> Vec<String> {
    let q = meta.client().get(&format!("/query_key?key={key}")).json();
    if q["success"] == false {
        return Vec::new();
    }
    media(&q)
}

/// Waits (bounded) until `key` is held on SSD only.
#[track_caller]
fn wait_on_ssd_only(meta: &Server, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = media_of(meta, key);
        if m == ["SSD"] {
            return;
        }
        assert!(Instant::now() < deadline, "{key} is on {m:?}, not SSD only");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(super) fn metric(meta: &Server, series: &str) -> Option<String> {
    let m = meta.client().get("/metrics").text();
    m.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')
            .map(str::to_string)
    })
}

fn ssd_file(dir: &Path, rank: u32) -> PathBuf {
    dir.join(format!("mmc-rank-{rank}.ssd"))
}

/// Overwrites every byte of an SSD file behind the servers' back.
fn damage(path: &Path) {
    use std::io::Write;
    let len = std::fs::metadata(path).unwrap().len() as usize;
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let junk = vec![0xA5u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(junk.len());
        f.write_all(&junk[..n]).unwrap();
        left -= n;
    }
    f.sync_all().unwrap();
}

fn segment_capacity(meta: &Server, name: &str) -> u64 {
    let q = meta
        .client()
        .get(&format!("/query_segment?segment={name}"))
        .json();
    q["total_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("{name}: {q}"))
}

#[test]
fn a_local_services_ssd_is_listed_counted_and_takes_its_demoted_blobs() {
    for driver in [Driver::Uring, Driver::Epoll] {
        let dir = temp_dir("cluster-ssd");
        let meta = meta(&[("ock.mmc.lease_ms", "100")]);
        let (local, rank) = join(
            &meta,
            local(&meta, "8MB", Some(&dir), driver),
            &["dram", "ssd"],
        );
        // The local service makes its file once the meta answered its join.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !ssd_file(&dir, rank).exists() {
            assert!(
                Instant::now() < deadline,
                "the local service made no SSD file"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // Listed and counted with the rank's other segments.
        assert_eq!(
            segment_capacity(&meta, &format!("rank-{rank}-ssd")),
            64 << 20
        );
        assert_eq!(
            metric(
                &meta,
                &format!("memcache_ubs_io_disk_capacity_bytes{{rank=\"{rank}\"}}")
            )
            .as_deref(),
            Some("67108864")
        );
        assert_eq!(
            metric(
                &meta,
                &format!("memcache_ubs_io_disk_num{{rank=\"{rank}\"}}")
            )
            .as_deref(),
            Some("1")
        );

        // 24 objects of 1 MiB through an 8 MB DRAM segment: the first ones go down to the
        // rank's SSD (the local service copies them), none is dropped.
        let n = 24;
        for i in 0..n {
            put(&meta, &format!("o-{i}"), &object(i, 1 << 20));
        }
        wait_on_ssd_only(&meta, "o-0");
        let used = meta
            .client()
            .get(&format!("/query_segment?segment=rank-{rank}-ssd"))
            .json();
        assert!(used["used_bytes"].as_u64().unwrap() >= 1 << 20, "{used}");
        assert!(
            std::fs::metadata(ssd_file(&dir, rank)).unwrap().len() >= 1 << 20,
            "the bytes are in the local service's file"
        );
        // The per-disk series carry the local service's directory and figures (reported with
        // its heartbeats).
        let disk = format!(
            "memcache_ubs_io_disk_write_bandwidth_bytes_per_sec{{rank=\"{rank}\",disk_path=\"{}\"}}",
            dir.display()
        );
        crate::store::eventually("the rank's disk figures are reported", || {
            metric(&meta, &disk).is_some_and(|v| v.parse::<f64>().unwrap_or(0.0) > 0.0)
        });
        let status = format!(
            "memcache_ubs_io_disk_status{{rank=\"{rank}\",disk_path=\"{}\"}}",
            dir.display()
        );
        assert_eq!(metric(&meta, &status).as_deref(), Some("0"));
        // Every object reads back intact through the meta: one held on SSD only is rewarmed
        // into the rank's DRAM first, then served by the local service.
        for i in 0..n {
            let key = format!("o-{i}");
            let r = follow(&meta, "GET", &format!("/api/v1/objects?key={key}"), None);
            assert_eq!(r.status, 200, "{key}: {}", r.text());
            assert!(r.body == object(i, 1 << 20), "{key} read back intact");
        }
        let m = meta.client().get("/metrics").text();
        let rewarms = m
            .lines()
            .find_map(|l| l.strip_prefix("memcache_rewarm_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        assert!(
            rewarms >= 1.0,
            "reads of SSD copies were rewarms:\n{rewarms}"
        );
        // A batch read spanning DRAM and SSD copies gets the bytes too.
        let r = meta.client().get("/api/v1/objects/batch_get?keys=o-1,o-23");
        assert_eq!(r.status, 200);
        let len = u64::from_be_bytes(r.body[..8].try_into().unwrap()) as usize;
        assert_eq!(len, 1 << 20);
        assert!(r.body[8..8 + len] == object(1, 1 << 20)[..]);
        drop(local);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_faulted_remote_ssd_takes_no_flushes_and_memory_evicts_by_deleting() {
    let dir = temp_dir("cluster-ssd-fault");
    let meta = meta(&[("ock.mmc.lease_ms", "100")]);
    // Every write to the local service's SSD file fails (probes too).
    let b = local(&meta, "8MB", Some(&dir), Driver::Uring).env("MMC_FAULT_SSD_WRITE", "eio");
    let (_local, rank) = join(&meta, b, &["dram", "ssd"]);
    let n = 24;
    for i in 0..n {
        put(&meta, &format!("f-{i}"), &object(i, 1 << 20));
    }
    let faults = format!("memcache_ubs_io_fault_disk_num{{rank=\"{rank}\"}}");
    crate::store::eventually("the remote disk is counted faulty", || {
        metric(&meta, &faults).as_deref() == Some("1")
    });
    let status = format!(
        "memcache_ubs_io_disk_status{{rank=\"{rank}\",disk_path=\"{}\"}}",
        dir.display()
    );
    assert_eq!(metric(&meta, &status).as_deref(), Some("5"), "EIO");
    // Nothing went to the faulted SSD: older objects were evicted by deleting, the newest
    // read back intact, no wrong bytes anywhere.
    let ssd = meta
        .client()
        .get(&format!("/query_segment?segment=rank-{rank}-ssd"))
        .json();
    assert_eq!(ssd["used_bytes"], 0, "{ssd}");
    let mut found = 0;
    for i in 0..n {
        let r = follow(&meta, "GET", &format!("/api/v1/objects?key=f-{i}"), None);
        if r.status == 200 && r.content_type() == "application/octet-stream" {
            assert!(r.body == object(i, 1 << 20), "f-{i} intact");
            found += 1;
        } else {
            r.assert_error(200, "Key not found");
        }
    }
    assert!(found >= 4, "the newest objects stayed in DRAM ({found})");
    // The meta counts the remote flush that failed and every object eviction deleted.
    let count = |name: &str| -> u64 { metric(&meta, name).unwrap().parse().unwrap() };
    assert!(count("memcache_flush_failed_total") >= 1);
    assert_eq!(
        count("memcache_evict_deleted_objects_total"),
        (n - found) as u64
    );
    let r = follow(
        &meta,
        "GET",
        &format!("/api/v1/objects?key=f-{}", n - 1),
        None,
    );
    assert!(r.body == object(n - 1, 1 << 20));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_damaged_remote_ssd_file_is_never_served() {
    let dir = temp_dir("cluster-ssd-damage");
    // Long leases: copies read once stay in DRAM, so a read of an SSD copy finds no room to
    // rewarm into and is sent to the local service's file.
    // One shard: the four objects' evictions are that shard's.
    let meta = meta_with(
        ServerBuilder::new(Driver::Uring).shards(1),
        &[("ock.mmc.lease_ms", "4000")],
    );
    let (_local, rank) = join(
        &meta,
        local(&meta, "2MB", Some(&dir), Driver::Uring),
        &["dram", "ssd"],
    );
    let len = 900 << 10;
    for i in 0..4 {
        put(&meta, &format!("d-{i}"), &object(i, len));
    }
    wait_on_ssd_only(&meta, "d-0");
    wait_on_ssd_only(&meta, "d-1");
    // d-2 and d-3 fill the rank's DRAM; read them, so they are leased there.
    for i in [2, 3] {
        let r = follow(&meta, "GET", &format!("/api/v1/objects?key=d-{i}"), None);
        assert!(r.body == object(i, len));
    }
    // d-0 is read straight from the local service's SSD file, under a grant carrying its
    // checksum.
    let r = meta.client().get("/api/v1/objects?key=d-0");
    assert_eq!(r.status, 307, "{}", r.text());
    let (addr, target) = split_location(r.header("location").unwrap());
    let direct = Client::connect(addr).get(&target);
    assert_eq!(direct.status, 200, "{}", direct.text());
    assert!(
        direct.body == object(0, len),
        "read from the remote SSD intact"
    );

    // The file is overwritten behind the servers' back: its bytes are never served.
    damage(&ssd_file(&dir, rank));
    // Read directly from the file (DRAM is still full of leased copies): the local service
    // refuses the bytes and has the meta drop the copy, the object with it.
    Client::connect(addr)
        .get(&target)
        .assert_error(200, DAMAGED);
    follow(&meta, "GET", "/api/v1/objects?key=d-0", None).assert_error(200, "Key not found");
    let r = follow(&meta, "GET", "/api/v1/objects?key=d-1", None);
    r.assert_error(200, DAMAGED);
    follow(&meta, "GET", "/api/v1/objects?key=d-1", None).assert_error(200, "Key not found");
    // The memory copies were never on the file: intact.
    let r = follow(&meta, "GET", "/api/v1/objects?key=d-3", None);
    assert!(r.body == object(3, len));
    // d-2 goes down to SSD and the file is damaged again: once the leases are over (a remote
    // blob's lasts the clock skew, 2 s, longer: its local service checks the read grant by its
    // own clock), a read rewarms it; the local service finds the bytes damaged and the meta
    // drops the copy.
    std::thread::sleep(Duration::from_millis(4000 + 2000 + 200));
    for i in 4..6 {
        put(&meta, &format!("d-{i}"), &object(i, len));
    }
    wait_on_ssd_only(&meta, "d-2");
    damage(&ssd_file(&dir, rank));
    follow(&meta, "GET", "/api/v1/objects?key=d-2", None).assert_error(200, DAMAGED);
    follow(&meta, "GET", "/api/v1/objects?key=d-2", None).assert_error(200, "Key not found");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_rank_with_ssd_leaves_unmounts_and_is_lost_like_dram() {
    let dir = temp_dir("cluster-ssd-leave");
    let len = 1 << 20;
    // Puts fill one rank's DRAM and go down to its SSD while it is the only rank (with
    // another rank present, a put finds room there instead of evicting).
    let fill = |meta: &Server, rank: u32, prefix: &str, n: usize| {
        for i in 0..n {
            let target = format!("/api/v1/objects?key={prefix}-{i}&prefer_rank={rank}");
            let r = follow(meta, "PUT", &target, Some(&object(i, len)));
            assert_eq!(r.json()["success"], true, "{}", r.text());
        }
        wait_on_ssd_only(meta, &format!("{prefix}-0"));
    };

    // A rank with DRAM and SSD leaves on SIGTERM: every object it held, in DRAM or on SSD,
    // is readable from the other rank.
    let meta1 = meta(&[("ock.mmc.lease_ms", "100")]);
    let (mut a, ra) = join(
        &meta1,
        local(&meta1, "8MB", Some(&dir), Driver::Uring),
        &["dram", "ssd"],
    );
    fill(&meta1, ra, "l", 12);
    let (_b, rb) = join(
        &meta1,
        local(&meta1, "64MB", None, Driver::Uring),
        &["dram"],
    );
    let t = Instant::now();
    let status = a.stop();
    assert!(status.success(), "{status}");
    assert!(t.elapsed() < Duration::from_secs(20));
    wait_segments(&meta1, &[format!("rank-{rb}-dram")], Duration::from_secs(5));
    for i in 0..12 {
        let key = format!("l-{i}");
        let r = follow(&meta1, "GET", &format!("/api/v1/objects?key={key}"), None);
        assert_eq!(r.status, 200, "{key}: {}", r.text());
        assert!(r.body == object(i, len), "{key} moved intact");
        let q = meta1.client().get(&format!("/query_key?key={key}")).json();
        assert_eq!(q["blobs"][0]["rank"], rb);
    }
    drop(meta1);

    // Unmounting a remote SSD segment moves its SSD-only objects into DRAM elsewhere; then a
    // kill -9 of the rank drops its DRAM segment and the objects only it held.
    let meta2 = meta(&[("ock.mmc.lease_ms", "100")]);
    let (mut c, rc) = join(
        &meta2,
        local(&meta2, "8MB", Some(&dir), Driver::Uring),
        &["dram", "ssd"],
    );
    fill(&meta2, rc, "c", 12);
    let on_ssd: Vec<usize> = (0..12)
        .filter(|i| media_of(&meta2, &format!("c-{i}")) == ["SSD"])
        .collect();
    let in_dram: Vec<usize> = (0..12).filter(|i| !on_ssd.contains(i)).collect();
    assert!(!in_dram.is_empty());
    let (_d, rd) = join(
        &meta2,
        local(&meta2, "64MB", None, Driver::Uring),
        &["dram"],
    );
    let r = meta2.client().request(
        "POST",
        &format!("/api/v1/segments/unmount?segment=rank-{rc}-ssd"),
        None,
    );
    assert_eq!(r.json()["success"], true, "{}", r.text());
    wait_segments(
        &meta2,
        &[format!("rank-{rc}-dram"), format!("rank-{rd}-dram")],
        Duration::from_secs(5),
    );
    for &i in &on_ssd {
        let key = format!("c-{i}");
        let q = meta2.client().get(&format!("/query_key?key={key}")).json();
        assert_eq!(q["blobs"][0]["rank"], rd, "{key}: {q}");
        let r = follow(&meta2, "GET", &format!("/api/v1/objects?key={key}"), None);
        assert!(
            r.body == object(i, len),
            "{key} moved from the remote SSD intact: {} {}",
            r.status,
            if r.body.len() < 300 {
                r.text()
            } else {
                format!("{} bytes", r.body.len())
            }
        );
    }
    c.kill9();
    let killed = Instant::now();
    wait_segments(&meta2, &[format!("rank-{rd}-dram")], Duration::from_secs(6));
    assert!(killed.elapsed() < Duration::from_secs(6));
    for &i in &in_dram {
        follow(&meta2, "GET", &format!("/api/v1/objects?key=c-{i}"), None)
            .assert_error(200, "Key not found");
    }
    for &i in &on_ssd {
        let r = follow(&meta2, "GET", &format!("/api/v1/objects?key=c-{i}"), None);
        assert!(r.body == object(i, len));
    }
    assert_eq!(
        metric(&meta2, &format!("memcache_metric_stale{{rank=\"{rc}\"}}")).as_deref(),
        Some("1")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_leaving_rank_s_objects_go_down_to_the_other_rank_s_ssd_when_its_dram_is_full() {
    let dir_a = temp_dir("cluster-ssd-drain-a");
    let dir_b = temp_dir("cluster-ssd-drain-b");
    let len = 1 << 20;
    let n = 14;
    let meta = meta(&[("ock.mmc.lease_ms", "100")]);
    let (mut a, ra) = join(
        &meta,
        local(&meta, "8MB", Some(&dir_a), Driver::Uring),
        &["dram", "ssd"],
    );
    for i in 0..n {
        put(&meta, &format!("g-{i}"), &object(i, len));
    }
    wait_on_ssd_only(&meta, "g-0");
    // The other rank's DRAM holds fewer than the leaving rank's objects; its SSD has room.
    let (_b, rb) = join(
        &meta,
        local(&meta, "8MB", Some(&dir_b), Driver::Uring),
        &["dram", "ssd"],
    );
    let t = Instant::now();
    let status = a.stop();
    assert!(status.success(), "{status}");
    assert!(t.elapsed() < Duration::from_secs(20));
    wait_segments(
        &meta,
        &[format!("rank-{rb}-dram"), format!("rank-{rb}-ssd")],
        Duration::from_secs(5),
    );
    for i in 0..n {
        let key = format!("g-{i}");
        let r = follow(&meta, "GET", &format!("/api/v1/objects?key={key}"), None);
        assert_eq!(
            r.content_type(),
            "application/octet-stream",
            "{key} was lost: {}",
            r.text()
        );
        assert!(r.body == object(i, len), "{key} moved intact");
    }
    let on_b_ssd = (0..n)
        .filter(|i| media_of(&meta, &format!("g-{i}")).contains(&"SSD".to_string()))
        .count();
    assert!(on_b_ssd > 0, "room was made on rank {rb}'s SSD");
    let _ = ra;
    let _ = std::fs::remove_dir_all(&dir_a);
    let _ = std::fs::remove_dir_all(&dir_b);
}
