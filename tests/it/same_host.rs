//! The same-host data path (docs/same-host.md): requests on the Unix socket whose `X-Mmc-Iov`
//! names this test process's memory; the server copies the bytes itself.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::both_drivers;
use crate::harness::{Driver, Server, ServerBuilder};

/// The socket `/health` advertises over TCP.
fn socket_of(srv: &Server) -> String {
    let r = srv.client().get("/health");
    assert_eq!(r.status, 200);
    advert_path(
        r.header("x-mmc-same-host")
            .expect("X-Mmc-Same-Host on /health"),
    )
}

/// The socket's path in `X-Mmc-Same-Host: ID PATH`.
fn advert_path(advert: &str) -> String {
    let (_, path) = advert.split_once(' ').expect("ID PATH");
    path.to_string()
}

struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.split("\r\n").find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// One request on the same-host socket (no body: the bytes are where `iov` says).
fn request(s: &mut UnixStream, method: &str, target: &str, iov: Option<&str>) -> Answer {
    let mut req = format!("{method} {target} HTTP/1.1\r\nHost: test\r\n");
    if let Some(iov) = iov {
        req.push_str(&format!("X-Mmc-Iov: {iov}\r\n"));
    }
    if method == "PUT" {
        req.push_str("Content-Length: 0\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk).unwrap();
        assert!(
            n > 0,
            "closed before an answer: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
    let status = head[9..12].parse().unwrap();
    let mut a = Answer {
        status,
        head,
        body: Vec::new(),
    };
    let len: usize = a.header("content-length").unwrap().parse().unwrap();
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0);
        body.extend_from_slice(&chunk[..n]);
    }
    a.body = body;
    a
}

fn iov_of(parts: &[&[u8]]) -> String {
    parts
        .iter()
        .map(|p| format!("{:x}:{}", p.as_ptr() as usize, p.len()))
        .collect::<Vec<_>>()
        .join(",")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[1] ^ seed)
        .collect()
}

/// Puts `data` under `key` from this process's memory, gets it back into `out` (zeroed after).
fn put_then_get(s: &mut UnixStream, key: &str, data: &[u8], out: &mut [u8]) {
    let target = format!("/api/v1/objects?key={key}");
    assert_eq!(
        request(s, "PUT", &target, Some(&iov_of(&[data]))).status,
        200
    );
    let g = request(s, "GET", &target, Some(&iov_of(&[out])));
    let len = data.len().to_string();
    assert_eq!(g.header("x-mmc-delivered"), Some(len.as_str()));
    assert!(out == data);
    out.fill(0);
}

fn connect(path: &str) -> UnixStream {
    let s = UnixStream::connect(path).expect("connect to the same-host socket");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

both_drivers!(
    puts_and_gets_copy_between_the_clients_memory_and_the_segment,
    what_is_not_the_clients_memory_fails_the_request_and_stores_nothing,
);

fn puts_and_gets_copy_between_the_clients_memory_and_the_segment(driver: Driver) {
    let srv = Server::start(driver);
    let path = socket_of(&srv);
    let mut s = connect(&path);
    // Over the socket, /health says the same: the same process.
    let h = request(&mut s, "GET", "/health", None);
    assert_eq!(h.status, 200);
    assert_eq!(
        h.header("x-mmc-same-host"),
        srv.client().get("/health").header("x-mmc-same-host")
    );
    for (key, medium, len) in [
        ("sh/hbm", "", 1 << 20),
        ("sh/dram", "&medium=dram", 3 << 20),
        ("sh/small", "", 1000),
    ] {
        let data = pattern(len, len as u8);
        // The object in two pieces of the client's memory (layers).
        let (a, b) = data.split_at(len / 3);
        let put = request(
            &mut s,
            "PUT",
            &format!("/api/v1/objects?key={key}{medium}"),
            Some(&iov_of(&[a, b])),
        );
        assert_eq!(put.status, 200, "{}", String::from_utf8_lossy(&put.body));
        let v: serde_json::Value = serde_json::from_slice(&put.body).unwrap();
        assert_eq!(v["success"], true, "{v}");
        assert_eq!(v["size"], len);
        // A TCP client reads what the same-host put stored.
        let got = srv.client().get(&format!("/api/v1/objects?key={key}"));
        assert_eq!(got.status, 200);
        assert!(got.body == data, "{key}: TCP read back other bytes");
        // A same-host get writes it into this process's memory: no byte on the socket.
        let mut out = vec![0u8; len];
        let (x, y) = out.split_at_mut(len / 2);
        let iov = iov_of(&[x, y]);
        let g = request(
            &mut s,
            "GET",
            &format!("/api/v1/objects?key={key}"),
            Some(&iov),
        );
        assert_eq!(g.status, 200);
        assert_eq!(g.header("content-length"), Some("0"));
        let delivered = len.to_string();
        assert_eq!(g.header("x-mmc-delivered"), Some(delivered.as_str()));
        assert!(out == data, "{key}: the delivered bytes differ");
    }
    // Buffers of another size than the object: the bytes come on the socket as over TCP
    // (nothing is written into them).
    let mut small = [7u8; 100];
    let g = request(
        &mut s,
        "GET",
        "/api/v1/objects?key=sh/small",
        Some(&iov_of(&[&small[..]])),
    );
    assert_eq!((g.status, g.body.len()), (200, 1000));
    assert!(g.header("x-mmc-delivered").is_none());
    assert!(small.iter_mut().all(|b| *b == 7));
    // A missing key is the usual envelope.
    let g = request(
        &mut s,
        "GET",
        "/api/v1/objects?key=sh/none",
        Some(&iov_of(&[&small[..]])),
    );
    assert!(String::from_utf8_lossy(&g.body).contains("Key not found"));
    // A put copies once, at the put: changing the buffer afterwards changes nothing stored.
    let mut buf = pattern(4096, 1);
    let put = request(
        &mut s,
        "PUT",
        "/api/v1/objects?key=sh/once",
        Some(&iov_of(&[&buf])),
    );
    assert_eq!(put.status, 200);
    let before = buf.clone();
    buf.fill(0xee);
    assert!(srv.client().get("/api/v1/objects?key=sh/once").body == before);
    // On TCP the header means nothing: a put with it and no body stores an empty object.
    let r = srv.client().request_with(
        "PUT",
        "/api/v1/objects?key=sh/tcp",
        &[("X-Mmc-Iov", &iov_of(&[&before]))],
        Some(b""),
    );
    assert_eq!(r.json()["size"], 0);
    // The shard statistics count what went through the socket, and only that: four puts, the
    // three gets written into this process's memory (not the one of another length, nor the
    // missing key), no failure; the 1 and 3 MiB copies were split, each first half made by
    // the helper or taken back.
    let m = crate::observability::scrape(&mut srv.client());
    let v = |name: &str| m.get(name).copied().unwrap_or(-1.0) as i64;
    let (one, three) = (1i64 << 20, 3i64 << 20);
    assert_eq!(v("memcache_same_host_puts_total"), 4);
    assert_eq!(
        v("memcache_same_host_put_bytes_total"),
        one + three + 1000 + 4096
    );
    assert_eq!(v("memcache_same_host_gets_total"), 3);
    assert_eq!(v("memcache_same_host_get_bytes_total"), one + three + 1000);
    assert_eq!(v("memcache_same_host_copy_failures_total"), 0);
    let split = v("memcache_same_host_split_copies_total");
    assert!((2..=4).contains(&split), "{split} split copies");
    let back = v("memcache_same_host_halves_taken_back_total");
    assert!(
        (0..=split).contains(&back),
        "{back} of {split} halves taken back"
    );
}

fn what_is_not_the_clients_memory_fails_the_request_and_stores_nothing(driver: Driver) {
    let srv = ServerBuilder::new(driver).start();
    let path = socket_of(&srv);
    // A range whose second half is not mapped in this process: the copy fails whole, the
    // allocation is aborted, nothing of the key is readable.
    // SAFETY: an anonymous mapping of two pages, of which the second is unmapped again.
    let base = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        libc::memset(p, 0x5a, 4096);
        libc::munmap(p.cast::<u8>().add(4096).cast(), 4096);
        p as usize
    };
    let mut s = connect(&path);
    let put = request(
        &mut s,
        "PUT",
        "/api/v1/objects?key=sh/torn",
        Some(&format!("{base:x}:8192")),
    );
    assert_eq!(put.status, 400);
    assert!(String::from_utf8_lossy(&put.body).contains("same-host copy failed"));
    assert_eq!(put.header("connection"), Some("close"));
    let r = srv.client().get("/api/v1/objects/exist?key=sh/torn");
    assert_eq!(r.json()["exists"], false);
    // The key's allocation was given back: the same key can be put afterwards.
    let mut s = connect(&path);
    let good = pattern(4096, 9);
    let put = request(
        &mut s,
        "PUT",
        "/api/v1/objects?key=sh/torn",
        Some(&iov_of(&[&good])),
    );
    assert_eq!(put.status, 200);
    // A get into memory that is not this process's: the answer is the failure, the object
    // stays (and readable by others).
    let g = request(
        &mut s,
        "GET",
        "/api/v1/objects?key=sh/torn",
        Some(&format!("{:x}:4096", base + 4096)),
    );
    assert_eq!(g.status, 400);
    assert!(srv.client().get("/api/v1/objects?key=sh/torn").body == good);
    // A header that does not parse, a body with it, an object over the body limit.
    let mut s = connect(&path);
    let r = request(&mut s, "GET", "/api/v1/objects?key=sh/torn", Some("zz:1"));
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("malformed X-Mmc-Iov"));
    let big = format!("{base:x}:{}", 1u64 << 40);
    let r = request(&mut s, "PUT", "/api/v1/objects?key=sh/big", Some(&big));
    assert_eq!(r.status, 413);
    s.write_all(
        format!(
            "PUT /api/v1/objects?key=sh/body HTTP/1.1\r\nHost: t\r\nX-Mmc-Iov: {base:x}:4\r\nContent-Length: 4\r\n\r\nabcd"
        )
        .as_bytes(),
    )
    .unwrap();
    let mut text = vec![0u8; 4096];
    let n = s.read(&mut text).unwrap();
    assert!(String::from_utf8_lossy(&text[..n]).starts_with("HTTP/1.1 400"));
    // SAFETY: the first page is still mapped.
    unsafe { libc::munmap(base as *mut libc::c_void, 4096) };
    // Two copies failed (the torn put, the get into memory not ours); one put was stored.
    let m = crate::observability::scrape(&mut srv.client());
    assert_eq!(m.get("memcache_same_host_copy_failures_total"), Some(&2.0));
    assert_eq!(m.get("memcache_same_host_puts_total"), Some(&1.0));
    assert_eq!(m.get("memcache_same_host_gets_total"), Some(&0.0));
}

#[test]
fn the_socket_can_be_turned_off_or_put_elsewhere() {
    let srv = ServerBuilder::new(Driver::Epoll)
        .set("ock.mmc.http.same_host_socket", "off")
        .start();
    let r = srv.client().get("/health");
    assert!(r.header("x-mmc-same-host").is_none());
    let dir = std::env::temp_dir().join(format!("mmc-sh-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.sock");
    let mut srv = ServerBuilder::new(Driver::Epoll)
        .set("ock.mmc.http.same_host_socket", path.to_str().unwrap())
        .start();
    assert_eq!(socket_of(&srv), path.to_str().unwrap());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "only the server's user may connect");
    srv.stop();
    assert!(!path.exists(), "the socket is removed at the end");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_socket_checks_tokens_as_tcp_does() {
    let srv = ServerBuilder::new(Driver::Epoll)
        .set("ock.mmc.http.auth_token", "sekret-token-123")
        .start();
    let r = srv.client().request_with(
        "GET",
        "/health",
        &[("Authorization", "Bearer sekret-token-123")],
        None,
    );
    let path = advert_path(r.header("x-mmc-same-host").unwrap());
    let data = pattern(5000, 3);
    let mut s = connect(&path);
    let put = request(
        &mut s,
        "PUT",
        "/api/v1/objects?key=sh/tok",
        Some(&iov_of(&[&data])),
    );
    assert_eq!(put.status, 401);
    let req = format!(
        "PUT /api/v1/objects?key=sh/tok HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nAuthorization: Bearer sekret-token-123\r\nX-Mmc-Iov: {}\r\n\r\n",
        iov_of(&[&data])
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut text = vec![0u8; 4096];
    let n = s.read(&mut text).unwrap();
    assert!(String::from_utf8_lossy(&text[..n]).starts_with("HTTP/1.1 200"));
    let got = srv.client().request_with(
        "GET",
        "/api/v1/objects?key=sh/tok",
        &[("Authorization", "Bearer sekret-token-123")],
        None,
    );
    assert!(got.body == data);
}

/// The CPUs a thread of `pid` named `comm` may run on (its `Cpus_allowed_list`).
pub fn thread_cpus(pid: u32, comm: &str) -> Option<Vec<usize>> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let dir = task.ok()?.path();
        if std::fs::read_to_string(dir.join("comm")).ok()?.trim() != comm {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).ok()?;
        let list = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?
            .trim()
            .to_string();
        let mut cpus = Vec::new();
        for part in list.split(',') {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            cpus.extend(a.parse::<usize>().ok()?..=b.parse::<usize>().ok()?);
        }
        return Some(cpus);
    }
    None
}

#[test]
fn a_large_copy_s_helper_runs_beside_its_shard_not_on_its_cpu() {
    // Two shards, each pinned to a CPU of this process's mask (round-robin when it has one).
    let srv = ServerBuilder::new(Driver::Epoll).shards(2).start();
    let path = socket_of(&srv);
    let mut s = connect(&path);
    let data = pattern(4 << 20, 9);
    let mut out = vec![0u8; data.len()];
    // A put and a get of a few large objects: whichever shard the connection is on copies
    // them in two halves, starting its helper.
    for i in 0..4 {
        put_then_get(&mut s, &format!("sh/helper/{i}"), &data, &mut out);
    }
    let process = thread_cpus(srv.pid(), "mmc-server").expect("the main thread");
    let mut helpers = 0;
    for n in 0..2 {
        let shard = thread_cpus(srv.pid(), &format!("mmc-shard-{n}")).expect("shard thread");
        let Some(helper) = thread_cpus(srv.pid(), &format!("mmc-copy-{n}")) else {
            continue;
        };
        helpers += 1;
        if process.iter().any(|c| !shard.contains(c)) {
            assert!(
                helper
                    .iter()
                    .all(|c| !shard.contains(c) && process.contains(c)),
                "shard {n} on {shard:?}: its copy helper may run on {helper:?} (process: {process:?})"
            );
        } else {
            assert_eq!(helper, shard, "one CPU: the helper stays where it is");
        }
    }
    assert!(helpers > 0, "no copy helper started");
}

/// `memcache_shard_cross_requests_total`: requests a shard sent to another shard.
fn cross_requests(srv: &Server) -> f64 {
    crate::observability::scrape(&mut srv.client())["memcache_shard_cross_requests_total"]
}

#[test]
fn every_shard_has_a_socket_of_its_own_and_a_key_s_owner_serves_it_alone() {
    let mut srv = ServerBuilder::new(Driver::Epoll).shards(2).start();
    let health = srv.client().get("/health");
    assert_eq!(health.header("x-mmc-same-host-shards"), Some("2"));
    let path = advert_path(health.header("x-mmc-same-host").unwrap());
    assert!(!path.contains(['\r', '\n', ' ']), "{path:?}");
    let own: Vec<String> = (0..2).map(|n| format!("{path}.{n}")).collect();
    use std::os::unix::fs::PermissionsExt;
    for p in &own {
        let mode = std::fs::metadata(p).unwrap().permissions().mode();
        assert_eq!(
            mode & 0o777,
            0o600,
            "{p}: only the server's user may connect"
        );
    }
    let data = pattern(600 << 10, 3);
    let mut out = vec![0u8; data.len()];
    // Keys of each shard, put and read on their owner's socket: no other shard takes part.
    let mut keys = [Vec::new(), Vec::new()];
    for i in 0.. {
        let key = format!("sh/own/{i}");
        let owner = mmc::shards::shard_for(key.as_bytes(), 2);
        if keys[owner].len() < 3 {
            keys[owner].push(key);
        }
        if keys.iter().all(|k| k.len() == 3) {
            break;
        }
    }
    let before = cross_requests(&srv);
    for (shard, keys) in keys.iter().enumerate() {
        let mut s = connect(&own[shard]);
        for key in keys {
            put_then_get(&mut s, key, &data, &mut out);
        }
    }
    assert_eq!(
        cross_requests(&srv),
        before,
        "a request went to another shard"
    );
    // The same keys on the other shard's socket: that shard asks the owner, as on the shared
    // socket or over TCP (the test above fails if the sockets were not each shard's own).
    let mut s = connect(&own[1]);
    let target = format!("/api/v1/objects?key={}", keys[0][0]);
    let g = request(&mut s, "GET", &target, Some(&iov_of(&[&out])));
    assert_eq!(g.header("x-mmc-delivered"), Some("614400"));
    assert!(out == data);
    assert!(
        cross_requests(&srv) > before,
        "shard 1 read shard 0's key without asking it"
    );
    // Every socket goes with the server.
    srv.stop();
    for p in std::iter::once(&path).chain(&own) {
        assert!(!std::path::Path::new(p).exists(), "{p} left behind");
    }
}

#[test]
fn one_shard_has_the_shared_socket_only() {
    let srv = ServerBuilder::new(Driver::Epoll).shards(1).start();
    let health = srv.client().get("/health");
    assert!(health.header("x-mmc-same-host-shards").is_none());
    let path = socket_of(&srv);
    assert!(!std::path::Path::new(&format!("{path}.0")).exists());
}

#[test]
fn a_server_killed_leaves_per_shard_sockets_the_next_one_of_its_port_removes() {
    let port = crate::ha::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut first = ServerBuilder::new(Driver::Epoll)
        .shards(2)
        .listen(&listen)
        .start();
    let path = socket_of(&first);
    first.kill9();
    let shard = |n: usize| std::path::PathBuf::from(format!("{path}.{n}"));
    assert!(
        shard(0).exists() && shard(1).exists(),
        "kill -9 removes nothing"
    );
    // The next server of the port, with one shard: no socket of its own, none left lying.
    let mut second = ServerBuilder::new(Driver::Epoll)
        .shards(1)
        .listen(&listen)
        .start();
    assert_eq!(socket_of(&second), path);
    assert!(
        !shard(0).exists() && !shard(1).exists(),
        "stale per-shard sockets left"
    );
    second.stop();
    assert!(!std::path::Path::new(&path).exists());
}
