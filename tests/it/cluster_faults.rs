//! The cluster under faults (issue 25): a grant writes once. A write or move grant is
//! single-use on the process that serves it, so a replayed or retried request under one is
//! refused before any of its bytes land, whether its object still lives or its range was
//! given to another object since; a put whose body broke off is aborted at once, so the
//! client's retry can put the key again.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cluster::{follow, join, local_builder, meta, split_location, wait_segments};
use crate::harness::{Client, Driver, Response, Server, ServerBuilder};

const USED: &str = "Invalid grant: already used";

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|j| (j as u8).wrapping_mul(31).wrapping_add(seed) ^ (j >> 12) as u8)
        .collect()
}

/// `PUT key` of `len` bytes on the meta with `Expect: 100-continue`: its answer, before any
/// body is sent (a 307 to the first hop, or a refusal).
fn put_head(meta: &Server, key: &str, len: usize) -> Response {
    let mut c = meta.client();
    c.send(
        format!(
            "PUT /api/v1/objects?key={key} HTTP/1.1\r\nHost: t\r\nContent-Length: {len}\r\nExpect: 100-continue\r\n\r\n"
        )
        .as_bytes(),
    );
    c.read_response(false)
}

/// The `Location` of a put's 307 (the body never sent to the meta).
#[track_caller]
fn put_redirect(meta: &Server, key: &str, len: usize) -> String {
    let r = put_head(meta, key, len);
    assert_eq!(r.status, 307, "{}", r.text());
    r.header("location").unwrap().to_string()
}

/// A PUT of `body` to a grant's URL (straight to the process that serves it).
fn put_to(location: &str, body: &[u8]) -> Response {
    let (addr, target) = split_location(location);
    Client::connect(addr).request("PUT", &target, Some(body))
}

/// The gva of each blob of `key`.
fn gvas(meta: &Server, key: &str) -> Vec<u64> {
    let q = meta.client().get(&format!("/query_key?key={key}")).json();
    q["blobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["gva"].as_u64().unwrap())
        .collect()
}

#[track_caller]
fn assert_reads(meta: &Server, key: &str, want: &[u8]) {
    let r = follow(meta, "GET", &format!("/api/v1/objects?key={key}"), None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.body == want, "{key} reads back the bytes put for it");
}

/// A pure meta and one local service with 16 MB of DRAM (the set-up).
fn small_cluster() -> (Server, Server) {
    let meta = meta(&[]);
    let (local, _) = join(&meta, &[("ock.mmc.local_service.dram.size", "16MB")]);
    (meta, local)
}

#[test]
fn a_used_put_grant_is_refused_while_its_object_lives() {
    let (meta, local) = small_cluster();
    let a = bytes(1 << 20, 1);
    let l = put_redirect(&meta, "A", a.len());
    let r = put_to(&l, &a);
    assert_eq!(r.json()["success"], true, "{}", r.text());
    // The same URL again within grant_ttl_ms, with other bytes: refused, A unchanged.
    put_to(&l, &bytes(1 << 20, 2)).assert_error(403, USED);
    assert_reads(&meta, "A", &a);
    // A client waiting for the go-ahead is refused before it sends anything.
    let r = put_head_to(&l, a.len());
    r.assert_error(403, USED);
    assert_reads(&meta, "A", &a);
    let m = local.client().get("/metrics").text();
    assert!(
        m.contains("memcache_grants_refused_total{reason=\"used\"} 2\n"),
        "both replays counted: {}",
        m.lines()
            .filter(|l| l.contains("grants"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// `PUT` of a grant's URL with `Expect: 100-continue`: the answer before any body.
fn put_head_to(location: &str, len: usize) -> Response {
    let (addr, target) = split_location(location);
    let mut c = Client::connect(addr);
    c.send(
        format!(
            "PUT {target} HTTP/1.1\r\nHost: t\r\nContent-Length: {len}\r\nExpect: 100-continue\r\n\r\n"
        )
        .as_bytes(),
    );
    c.read_response(false)
}

#[test]
fn a_used_put_grant_is_refused_after_its_range_went_to_another_key() {
    let (meta, _local) = small_cluster();
    let a = bytes(1 << 20, 1);
    let l = put_redirect(&meta, "A", a.len());
    assert_eq!(put_to(&l, &a).json()["success"], true);
    let at = gvas(&meta, "A");
    let r = meta
        .client()
        .request("DELETE", "/api/v1/objects?key=A", None);
    assert_eq!(r.status, 200, "{}", r.text());
    // Other keys until one is given A's range (the first one is).
    let mut reused = None;
    for i in 0..12 {
        let key = format!("B{i}");
        let b = bytes(1 << 20, 10 + i as u8);
        let r = put_to(&put_redirect(&meta, &key, b.len()), &b);
        assert_eq!(r.json()["success"], true, "{}", r.text());
        if gvas(&meta, &key) == at {
            reused = Some((key, b));
            break;
        }
    }
    let (key, b) = reused.expect("a later put was given A's range");
    // A's URL replayed within grant_ttl_ms: refused, and the key now there is unchanged.
    put_to(&l, &bytes(1 << 20, 99)).assert_error(403, USED);
    assert_reads(&meta, &key, &b);
    follow(&meta, "GET", "/api/v1/objects?key=A", None).assert_error(200, "Key not found");
}

/// `name=` in a query, percent-decoded.
fn query_param(target: &str, name: &str) -> String {
    let q = target.split_once('?').unwrap().1;
    let v = q
        .split('&')
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {target}"));
    let mut out = Vec::new();
    let mut it = v.bytes();
    while let Some(c) = it.next() {
        if c == b'%' {
            let hex: String = [it.next().unwrap(), it.next().unwrap()]
                .iter()
                .map(|&b| b as char)
                .collect();
            out.push(u8::from_str_radix(&hex, 16).unwrap());
        } else {
            out.push(c);
        }
    }
    String::from_utf8(out).unwrap()
}

/// A replicated put's chain: the local service's hop first, the meta's own rank's last. Each
/// hop's grant is single-use where it is served: a replayed hop, the meta's included, is
/// refused, and the copy it would have overwritten reads back what was put.
#[test]
fn a_replayed_chain_hop_is_refused_on_either_process() {
    // The meta names itself in the chain by its listen address: a real port, not 0.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let meta = ServerBuilder::new(Driver::Uring)
        .listen(&format!("127.0.0.1:{port}"))
        .set("ock.mmc.local_service.dram.size", "64MB")
        .set("ock.mmc.local_service.hbm.size", "0")
        .start();
    wait_segments(&meta, 1, Duration::from_secs(10));
    let (mut local, _) = join(&meta, &[]);
    let c2 = bytes((1 << 20) + 3, 7);
    let r = meta
        .client()
        .request("PUT", "/api/v1/objects?key=C2&replicas=2", Some(&c2));
    assert_eq!(r.status, 307, "{}", r.text());
    let chain = r.header("location").unwrap().to_string();
    let (first_addr, first_target) = split_location(&chain);
    assert_eq!(first_addr, local.addr, "the remote hop comes first");
    let next = query_param(&first_target, "next");
    assert_eq!(
        split_location(&next).0,
        meta.addr,
        "the meta's own hop last"
    );
    let r = put_to(&chain, &c2);
    assert_eq!(r.json()["success"], true, "{}", r.text());
    // Both hops replayed with other bytes: refused where each is served.
    put_to(&next, &bytes(c2.len(), 8)).assert_error(403, USED);
    put_to(&chain, &bytes(c2.len(), 9)).assert_error(403, USED);
    assert_reads(&meta, "C2", &c2);
    // Without the local service, the meta's own copy is read: unchanged too.
    local.kill9();
    wait_segments(&meta, 1, Duration::from_secs(10));
    let r = meta.client().get("/api/v1/objects?key=C2");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.body == c2, "the meta's copy is the bytes put");
}

/// A client whose body breaks off mid-way on the local service: the put is aborted with the
/// meta at once, so the client's retry (a new put to the meta) proceeds instead of being
/// refused as a duplicate until the allocation is reclaimed (`alloc_timeout_ms`, 30 s).
#[test]
fn a_put_whose_body_broke_off_is_aborted_and_its_retry_proceeds() {
    let (meta, local) = small_cluster();
    let data = bytes(1 << 20, 3);
    let l = put_redirect(&meta, "D", data.len());
    let (addr, target) = split_location(&l);
    assert_eq!(addr, local.addr);
    let mut c = Client::connect(addr);
    c.send(
        format!(
            "PUT {target} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
            data.len()
        )
        .as_bytes(),
    );
    c.send(&data[..data.len() / 2]);
    // While that allocation is uncommitted, a put of the key is a duplicate.
    put_head(&meta, "D", data.len()).assert_error(200, "Duplicated object: key already exists");
    // The client goes away mid-body.
    c.stream.shutdown(std::net::Shutdown::Both).unwrap();
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(5);
    let retry = loop {
        let r = put_head(&meta, "D", data.len());
        if r.status == 307 {
            break r.header("location").unwrap().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "the broken put was not aborted: {}",
            r.text()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(put_to(&retry, &data).json()["success"], true);
    assert_reads(&meta, "D", &data);
    // The broken put's grant is used up: it cannot be finished later either.
    put_to(&l, &data).assert_error(403, USED);
}

/// A TCP proxy in front of `target` (set once known) that notes every request line starting
/// with `prefix` sent through it and holds that request back until `release` is set.
struct Proxy {
    addr: SocketAddr,
    target: Arc<Mutex<Option<SocketAddr>>>,
    held: Arc<Mutex<Vec<String>>>,
    release: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    fn start(prefix: &'static str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let p = Proxy {
            addr: listener.local_addr().unwrap(),
            target: Arc::default(),
            held: Arc::default(),
            release: Arc::default(),
            stop: Arc::default(),
        };
        let (target, stop) = (p.target.clone(), p.stop.clone());
        let hold = Hold {
            prefix,
            held: p.held.clone(),
            release: p.release.clone(),
        };
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let Some(to) = *target.lock().unwrap() else {
                    continue;
                };
                let Ok(server) = TcpStream::connect(to) else {
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let hold = hold.clone();
                std::thread::spawn(move || pipe(client, server, Some(hold)));
                std::thread::spawn(move || pipe(s2, c2, None));
            }
        });
        p
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.release.store(true, Ordering::Relaxed);
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[derive(Clone)]
struct Hold {
    prefix: &'static str,
    held: Arc<Mutex<Vec<String>>>,
    release: Arc<AtomicBool>,
}

/// Copies `from` into `to` until either ends; bytes with a request line `hold` names wait
/// (at most 30 s) until it is released.
fn pipe(mut from: TcpStream, mut to: TcpStream, hold: Option<Hold>) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(h) = &hold {
            let text = String::from_utf8_lossy(&buf[..n]);
            let lines: Vec<String> = text
                .split("\r\n")
                .filter(|l| l.starts_with(h.prefix))
                .map(str::to_string)
                .collect();
            if !lines.is_empty() {
                h.held.lock().unwrap().extend(lines);
                let deadline = Instant::now() + Duration::from_secs(30);
                while !h.release.load(Ordering::Relaxed) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// A remote rank's tier move (`POST /cluster/v1/move`, the meta's two grants) replayed on its
/// local service: the first request under the grants copies, a second is refused. (The
/// meta's own request is held back by a proxy meanwhile, then refused in turn: the move
/// fails and the DRAM copy stays, so every object still reads back.)
#[test]
fn a_replayed_move_is_refused() {
    let dir = crate::store::temp_dir("mmc-faults-move");
    let meta = meta(&[]);
    let proxy = Proxy::start("POST /cluster/v1/move?");
    // The meta reaches the local service through the proxy (its advertised URL).
    let local = local_builder(&meta, &[("ock.mmc.local_service.dram.size", "16MB")])
        .set("ock.mmc.ssd.enable", "true")
        .set("ock.mmc.ssd.path", dir.to_str().unwrap())
        .set("ock.mmc.ssd.size", "64MB")
        .set(
            "ock.mmc.local_service.advertise_url",
            &format!("http://{}", proxy.addr),
        )
        .start();
    *proxy.target.lock().unwrap() = Some(local.addr);
    wait_segments(&meta, 2, Duration::from_secs(10));
    // DRAM past its high watermark: the meta moves blobs down to the rank's SSD.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut puts = 0;
    let moved = loop {
        if let Some(line) = proxy.held.lock().unwrap().first() {
            break line.clone();
        }
        assert!(Instant::now() < deadline, "no tier move was sent");
        let data = bytes(1 << 20, puts as u8);
        let r = follow(
            &meta,
            "PUT",
            &format!("/api/v1/objects?key=m{puts}"),
            Some(&data),
        );
        assert_eq!(r.json()["success"], true, "{}", r.text());
        puts += 1;
    };
    let target = moved
        .strip_prefix("POST ")
        .and_then(|l| l.strip_suffix(" HTTP/1.1"))
        .unwrap();
    let r = Client::connect(local.addr).request("POST", target, None);
    assert_eq!(
        r.json()["success"],
        true,
        "the first use copies: {}",
        r.text()
    );
    Client::connect(local.addr)
        .request("POST", target, None)
        .assert_error(403, USED);
    proxy.release.store(true, Ordering::Relaxed);
    for j in 0..puts {
        assert_reads(&meta, &format!("m{j}"), &bytes(1 << 20, j as u8));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// libfaketime's preload library (Debian's `faketime`, installed by `scripts/test.sh`).
const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// A local service's wall clock set back after it used and forgot a write grant does not make
/// that grant valid again: replayed, it is refused as expired and its object keeps its bytes
/// (found by the cluster simulation, seed 731, with the ledger forgetting by the clock alone;
/// `grant::tests::a_clock_set_back_does_not_revive_a_forgotten_grant` is its unit test). The
/// local service runs under libfaketime, its wall clock (not its monotonic one) read from a
/// file the test rewrites.
#[test]
fn a_grant_forgotten_before_the_clock_was_set_back_is_not_valid_again() {
    assert!(
        std::path::Path::new(FAKETIME_LIB).exists(),
        "{FAKETIME_LIB} is missing: apt-get install faketime (scripts/test.sh does)"
    );
    let offset = crate::store::temp_dir("faketime").join("offset");
    std::fs::write(&offset, "+0\n").unwrap();
    let meta = meta(&[("ock.mmc.cluster.grant_ttl_ms", "300")]);
    let before = crate::cluster::segments(&meta).len();
    let local = local_builder(&meta, &[("ock.mmc.local_service.dram.size", "16MB")])
        .env("LD_PRELOAD", FAKETIME_LIB)
        .env("FAKETIME_TIMESTAMP_FILE", offset.to_str().unwrap())
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .start();
    wait_segments(&meta, before + 1, Duration::from_secs(10));
    let a = bytes(1 << 20, 1);
    let l = put_redirect(&meta, "A", a.len());
    assert_eq!(put_to(&l, &a).json()["success"], true);
    // Past its expiry, the next write's admission forgets A's grant.
    std::thread::sleep(Duration::from_millis(700));
    let b = bytes(1 << 20, 2);
    assert_eq!(
        put_to(&put_redirect(&meta, "B", b.len()), &b).json()["success"],
        true
    );
    // The local service's clock goes back 3 s: A's grant is not expired by it any more.
    std::fs::write(&offset, "-3s\n").unwrap();
    let shown = local.client().get("/health");
    assert_eq!(shown.status, 200);
    put_to(&l, &bytes(1 << 20, 3)).assert_error(403, "Invalid grant: expired");
    assert_reads(&meta, "A", &a);
    assert_reads(&meta, "B", &b);
    // The service works on under its clock set back: a new put and its read.
    let c = bytes(1 << 20, 4);
    assert_eq!(
        put_to(&put_redirect(&meta, "C", c.len()), &c).json()["success"],
        true
    );
    assert_reads(&meta, "C", &c);
}
