//! Start-up, command line, configuration, io driver fallback and graceful shutdown.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::both_drivers;
use crate::harness::{Client, Driver, SERVER_BIN, ServerBuilder};

both_drivers!(
    graceful_shutdown_finishes_requests_in_flight,
    shutdown_is_bounded_by_its_timeout,
    restart_after_kill_under_load_is_ready_at_once
);

fn graceful_shutdown_finishes_requests_in_flight(driver: Driver) {
    let mut srv = ServerBuilder::new(driver).shards(2).start();
    let mut idle = srv.client();
    assert_eq!(idle.get("/healthz").status, 200);
    // A request in flight: head and half of the body sent. The go-ahead its `Expect` asks
    // for shows the server has read the head before the signal (a sleep did not, on a loaded
    // machine: the connection was still idle to the server and closed at once).
    let mut inflight = srv.client();
    inflight.send(
        b"PUT /metadata?key=during HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n",
    );
    let go = inflight.read_response(true);
    assert_eq!(go.status, 100, "{}", go.text());
    inflight.send(b"01234");
    let t0 = Instant::now();
    srv.signal(libc::SIGTERM);
    // The idle connection is closed promptly.
    assert!(
        idle.closed_within(Duration::from_secs(3)),
        "idle connection kept open while draining"
    );
    // The request in flight completes, answered with Connection: close.
    inflight.send(b"56789");
    let r = inflight.read_response(false);
    assert_eq!(r.text(), "metadata updated");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(inflight.closed_within(Duration::from_secs(3)));
    let status = srv
        .wait_exit(Duration::from_secs(10))
        .expect("server did not exit");
    assert!(status.success(), "exit status {status}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        t0.elapsed()
    );
    // Nothing listens any more.
    assert!(std::net::TcpStream::connect(srv.addr).is_err());
    let log = srv.log();
    assert!(log.contains("SIGTERM: stopping accepting"), "{log}");
    assert!(log.contains("mmc-server stopped"), "{log}");
}

fn shutdown_is_bounded_by_its_timeout(driver: Driver) {
    let mut srv = ServerBuilder::new(driver)
        .set("ock.mmc.http.shutdown_timeout_ms", "300")
        .set("ock.mmc.http.header_timeout_ms", "60000")
        .start();
    // A request that never completes.
    let mut stuck = srv.client();
    stuck.send(b"PUT /metadata?key=x HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\nabc");
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    srv.signal(libc::SIGINT);
    let status = srv
        .wait_exit(Duration::from_secs(10))
        .expect("server did not exit");
    assert!(status.success(), "exit status {status}");
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "shutdown took {:?}",
        t0.elapsed()
    );
    assert!(stuck.closed_within(Duration::from_secs(2)));
}

/// A port nothing listens on right now.
fn free_port() -> u16 {
    super::ha::free_port()
}

/// Issue 10: a restart right after a SIGKILL under load failed with "Address already in use"
/// (the killed process's listeners outlive it for a moment). A supervisor's immediate restart
/// on the same port must be ready within 2 s. Three rounds, since the race is not won every
/// time.
fn restart_after_kill_under_load_is_ready_at_once(driver: Driver) {
    use std::io::Write;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let listen = format!("127.0.0.1:{}", free_port());
    let mut srv = ServerBuilder::new(driver).listen(&listen).start();
    for round in 0..3 {
        assert_eq!(srv.client().get("/ready").status, 200);
        // A few clients with requests in flight: large puts partly sent, then dropped, new
        // connections arriving all the time. Bounded in iterations and by the stop flag.
        let stop = Arc::new(AtomicBool::new(false));
        let addr = srv.addr;
        let load: Vec<_> = (0..4)
            .map(|t| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    for i in 0..1000 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let Ok(mut s) = std::net::TcpStream::connect(addr) else {
                            std::thread::sleep(Duration::from_millis(2));
                            continue;
                        };
                        let head = format!(
                            "PUT /api/v1/objects?key=r{round}-{t}-{i} HTTP/1.1\r\nHost: t\r\nContent-Length: 400000\r\n\r\n"
                        );
                        let _ = s.write_all(head.as_bytes());
                        let _ = s.write_all(&[7u8; 100_000]);
                        // The connection is dropped mid-body a moment later.
                        std::thread::sleep(Duration::from_millis(10));
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(1000));
        srv.kill9();
        let killed = Instant::now();
        // The supervisor restarts at once, while the clients still hammer the port.
        srv = ServerBuilder::new(driver).listen(&listen).start();
        let ready = loop {
            if let Some(mut c) = Client::try_connect(srv.addr) {
                c.stream
                    .set_read_timeout(Some(Duration::from_secs(1)))
                    .unwrap();
                if c.get("/ready").status == 200 {
                    break killed.elapsed();
                }
            }
            assert!(
                killed.elapsed() < Duration::from_secs(2),
                "round {round}: not ready 2 s after the kill"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        stop.store(true, Ordering::Relaxed);
        for h in load {
            h.join().unwrap();
        }
        assert!(
            ready < Duration::from_secs(2),
            "round {round}: ready only after {ready:?}"
        );
    }
}

fn run(args: &[&str]) -> (i32, String, String) {
    run_env(args, &[])
}

fn run_env(args: &[&str], envs: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(SERVER_BIN);
    cmd.args(args).env_remove("RUST_LOG");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run mmc-server");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn help_and_version() {
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, 0);
    for opt in [
        "--config",
        "--set",
        "--listen",
        "--cores",
        "--io-driver",
        "--help",
        "--version",
    ] {
        assert!(out.contains(opt), "--help does not mention {opt}:\n{out}");
    }
    let (code, out, _) = run(&["--version"]);
    assert_eq!(code, 0);
    assert_eq!(
        out.trim(),
        format!("mmc-server {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn invalid_values_stop_the_start_with_one_line() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--set", "ock.mmc.http.max_body_bytes=12XB"],
            "invalid value \"12XB\" for ock.mmc.http.max_body_bytes",
        ),
        (
            &["--set", "ock.mmc.evict_threshold_high=150"],
            "ock.mmc.evict_threshold_high: expected an integer from 1 to 100",
        ),
        (
            &["--set", "ock.mmc.evict_threshold_low=95"],
            "must be below ock.mmc.evict_threshold_high",
        ),
        (
            &["--io-driver", "kqueue"],
            "--io-driver: expected one of auto, uring, epoll",
        ),
        (&["--listen", "not-an-address"], "--listen"),
        (
            &["--set", "ock.mmc.meta_service.metrics_url=ftp://x:1"],
            "ock.mmc.meta_service.metrics_url",
        ),
        (&["--cores", "4095"], "is not available to this process"),
        (
            &["--cores", "99999"],
            "--cores: expected CPUs numbered 0 to 4095: CPU 99999 is out of range",
        ),
        (
            &["--config", "/nonexistent/mmc-meta.conf"],
            "config file /nonexistent/mmc-meta.conf",
        ),
    ];
    for (args, needle) in cases {
        let (code, out, err) = run(args);
        assert_eq!(code, 2, "{args:?} exited {code}; stderr: {err}");
        assert!(out.is_empty());
        assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err}");
        assert!(err.starts_with("mmc-server: "), "{err}");
        assert!(err.contains(needle), "{args:?}: {err:?} lacks {needle:?}");
    }
}

#[test]
fn config_file_and_overrides() {
    let dir = std::env::temp_dir().join(format!("mmc-conf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mmc-meta.conf");
    std::fs::write(
        &path,
        "# test config\nock.mmc.http.idle_timeout_ms = 1234\n\nock.mmc.metadata.max_value_bytes=2048KB\nock.mmc.not.a.key = 5\n",
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let (code, out, err) = run(&[
        "--config",
        p,
        "--set",
        "ock.mmc.http.idle_timeout_ms=999",
        "--set",
        "ock.mmc.local_service.dram_sise=2GB",
        "--print-config",
    ]);
    assert_eq!(code, 0);
    // --print-config is how a config is checked: it warns about typos too (on stderr).
    assert!(
        err.contains("config file ") && err.contains("line 5: unknown key ock.mmc.not.a.key"),
        "{err}"
    );
    assert!(
        err.contains("--set: unknown key ock.mmc.local_service.dram_sise"),
        "{err}"
    );
    assert!(!out.contains("dram_sise"), "{out}");
    assert!(
        out.contains("ock.mmc.http.idle_timeout_ms = 999\n"),
        "{out}"
    );
    assert!(
        out.contains("ock.mmc.metadata.max_value_bytes = 2048KB\n"),
        "{out}"
    );
    // Unknown keys are warned about and do not stop the server.
    let srv = ServerBuilder::new(Driver::Epoll)
        .arg("--config")
        .arg(p)
        .start();
    assert!(
        srv.log().contains("unknown key ock.mmc.not.a.key"),
        "{}",
        srv.log()
    );
    drop(srv);
    let bad = dir.join("bad.conf");
    std::fs::write(&bad, "ock.mmc.http.idle_timeout_ms = 1\n").unwrap();
    let (code, _, err) = run(&["--config", bad.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("ock.mmc.http.idle_timeout_ms: expected an integer from 100"),
        "{err}"
    );
    assert!(err.contains("bad.conf line 1: invalid value"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_documented_config_file_is_the_default() {
    let (code, out, _) = run(&["--print-default-config"]);
    assert_eq!(code, 0);
    let file =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/mmc-meta.conf"))
            .expect("config/mmc-meta.conf");
    assert_eq!(
        file, out,
        "config/mmc-meta.conf is stale: regenerate with --print-default-config"
    );
    // The local service's file too.
    let (code, out, _) = run(&["--role", "local", "--print-default-config"]);
    assert_eq!(code, 0);
    let file = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/mmc-local.conf"
    ))
    .expect("config/mmc-local.conf");
    assert_eq!(
        file, out,
        "config/mmc-local.conf is stale: regenerate with --role local --print-default-config"
    );
    assert!(out.contains("\nock.mmc.meta_service_url = \n"));
    assert!(
        !out.contains("ock.mmc.kv_events"),
        "a local service publishes no KV events"
    );
    // And the server starts from it unchanged.
    let srv = ServerBuilder::new(Driver::Epoll)
        .arg("--config")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/config/mmc-meta.conf"))
        .start();
    assert_eq!(srv.client().get("/health").status, 200);
}

#[test]
fn a_busy_port_stops_the_start() {
    let srv = ServerBuilder::new(Driver::Epoll).start();
    let addr = srv.addr.to_string();
    let (code, _, err) = run(&["--listen", &addr, "--io-driver", "epoll"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
    // The running server is untouched.
    assert_eq!(srv.client().get("/healthz").status, 200);
}

#[test]
fn io_driver_fallback_chain() {
    // Setup flags refused (an old kernel): plain io_uring.
    let srv = ServerBuilder::new(Driver::Uring)
        .env("MMC_FAULT_URING", "flags")
        .start();
    assert!(
        srv.log().contains("io_uring setup flags refused"),
        "{}",
        srv.log()
    );
    assert!(
        srv.log().contains("io driver io_uring (plain"),
        "{}",
        srv.log()
    );
    assert_eq!(srv.client().get("/health").status, 200);
    drop(srv);
    // io_uring blocked (a seccomp profile): auto falls back to epoll, logged once per shard.
    let srv = ServerBuilder::new(Driver::Epoll)
        .io_driver("auto")
        .env("MMC_FAULT_URING", "all")
        .start();
    let log = srv.log();
    assert_eq!(log.matches("falling back to epoll").count(), 2, "{log}");
    assert_eq!(srv.client().get("/health").status, 200);
    drop(srv);
    // Forced io_uring that is unavailable refuses to start.
    let (code, _, err) = run_env(
        &["--listen", "127.0.0.1:0", "--io-driver", "uring"],
        &[("MMC_FAULT_URING", "all")],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--io-driver uring: io_uring is unavailable"),
        "{err}"
    );
}

#[test]
fn front_ring_driver_and_its_fallback() {
    // This kernel has multishot receive and buffer rings: the front ring serves.
    let srv = ServerBuilder::new(Driver::Epoll).io_driver("ring").start();
    assert_eq!(
        srv.log().matches("+ front ring").count(),
        1,
        "{}",
        srv.log()
    );
    assert_eq!(srv.client().get("/health").status, 200);
    drop(srv);
    // A kernel without them (injected): logged per shard, connections on monoio's io_uring.
    let srv = ServerBuilder::new(Driver::Epoll)
        .io_driver("ring")
        .env("MMC_FAULT_URING", "front")
        .start();
    let log = srv.log();
    assert_eq!(log.matches("front ring unavailable").count(), 2, "{log}");
    assert!(!log.contains("+ front ring"), "{log}");
    assert_eq!(srv.client().get("/health").status, 200);
}

#[test]
fn auto_driver_uses_tuned_io_uring_and_the_front_ring_here() {
    // On this kernel io_uring with the setup flags, multishot receive and buffer rings work:
    // auto (the default) must pick them, the front ring on every shard.
    let srv = ServerBuilder::new(Driver::Epoll).io_driver("auto").start();
    let log = srv.log();
    assert_eq!(log.matches(": front ring (").count(), 2, "{log}");
    assert_eq!(log.matches("+ front ring").count(), 1, "{log}");
    assert_eq!(
        log.matches(": io driver io_uring (coop_taskrun+single_issuer+defer_taskrun")
            .count(),
        2,
        "{log}"
    );
    let mut c = Client::connect(srv.addr);
    assert_eq!(c.get("/healthz").status, 200);
    drop(srv);
    // No front ring on this kernel (injected): auto serves on monoio's io_uring, logged per
    // shard; `uring` never builds a front ring.
    let srv = ServerBuilder::new(Driver::Epoll)
        .io_driver("auto")
        .env("MMC_FAULT_URING", "front")
        .start();
    let log = srv.log();
    assert_eq!(log.matches("front ring unavailable").count(), 2, "{log}");
    assert!(!log.contains("+ front ring"), "{log}");
    assert_eq!(
        log.matches(": io driver io_uring (coop_taskrun+single_issuer+defer_taskrun")
            .count(),
        2,
        "{log}"
    );
    assert_eq!(srv.client().get("/health").status, 200);
    drop(srv);
    let srv = ServerBuilder::new(Driver::Epoll).io_driver("uring").start();
    let log = srv.log();
    assert!(!log.contains("front ring"), "{log}");
    assert_eq!(srv.client().get("/health").status, 200);
}

#[test]
fn the_front_ring_answers_keep_alive_requests_without_waiting_for_a_timer() {
    // The pump parks on the eventfd its ring signals; a setup whose signal comes late (a
    // `DEFER_TASKRUN` ring on 6.18.44-fc-v1252: 12-24 ms, an RCU callback) made every request
    // on a kept-alive connection wait for it. The setup is probed at start and such a one
    // left for the next (`front_ring/probe.rs`); injected here so that a kernel whose signal
    // is prompt tests the fallback too. Either way a request takes well under a millisecond
    // when the machine is quiet: the median of 21 must be under 5 ms (late: 12 or more).
    for fault in [None, Some("front-signal")] {
        let mut b = ServerBuilder::new(Driver::Epoll).io_driver("ring");
        if let Some(f) = fault {
            b = b.env("MMC_FAULT_URING", f);
        }
        let srv = b.start();
        let log = srv.log();
        assert_eq!(log.matches(": front ring (").count(), 2, "{log}");
        if fault.is_some() {
            assert_eq!(
                log.matches(": front ring (single_issuer+coop_taskrun; ")
                    .count(),
                2,
                "{log}"
            );
        }
        let mut c = Client::connect(srv.addr);
        assert_eq!(c.get("/health").status, 200);
        let mut took: Vec<f64> = (0..21)
            .map(|_| {
                let t = std::time::Instant::now();
                assert_eq!(c.get("/health").status, 200);
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        took.sort_by(f64::total_cmp);
        assert!(
            took[10] < 5.0,
            "{fault:?}: median {:.2} ms: {took:?}",
            took[10]
        );
    }
}

/// Sockets of `port` in CLOSE-WAIT, from `/proc/net/tcp`: the client closed, the server did
/// not (a socket left in the ring's registered file table stays there).
fn server_sockets(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let local = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1].ends_with(&local) && f[3] == "08"
        })
        .count()
}

#[test]
fn front_ring_moves_large_bodies_in_place_and_closes_what_hangs_up() {
    use std::io::{Read, Write};
    // Large answers on the front ring leave from the caller's buffer in one send each, large
    // bodies are received into the reader's buffer (`DIRECT_BYTES`); its sockets are in the
    // ring's registered file table besides.
    let srv = ServerBuilder::new(Driver::Epoll)
        .io_driver("ring")
        .shards(1)
        .start();
    assert!(srv.log().contains("registered files"), "{}", srv.log());
    let body: Vec<u8> = (0..(5 << 20) + 7)
        .map(|i: usize| (i * 7 + i / 4099) as u8)
        .collect();
    let put = srv
        .client()
        .request("PUT", "/api/v1/objects?key=big", Some(&body));
    assert_eq!(put.status, 200, "{}", put.text());
    let addr = srv.addr;
    let get = b"GET /api/v1/objects?key=big HTTP/1.1\r\nHost: t\r\n\r\n";
    // Readers at once, one of them slow (its sends come back short), each on one connection
    // for three answers: every byte is the object's.
    let readers: Vec<_> = (0..4)
        .map(|r| {
            let body = body.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                for _ in 0..3 {
                    if r == 0 {
                        // 16 KiB a millisecond: the server's sends come back short.
                        c.send(get);
                        let mut got = Vec::new();
                        let mut chunk = [0u8; 16 * 1024];
                        let total = loop {
                            if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                                if got.len() >= i + 4 + body.len() {
                                    break i + 4 + body.len();
                                }
                            }
                            let n = c.stream.read(&mut chunk).expect("read");
                            assert!(n > 0, "closed early");
                            got.extend_from_slice(&chunk[..n]);
                            std::thread::sleep(Duration::from_millis(1));
                        };
                        assert_eq!(got.len(), total, "more than one answer");
                        assert!(
                            got[total - body.len()..] == body[..],
                            "slow reader: bytes differ"
                        );
                        continue;
                    }
                    let resp = c.get("/api/v1/objects?key=big");
                    assert_eq!(resp.status, 200);
                    assert!(resp.body == body, "reader {r}: the bytes differ");
                }
            })
        })
        .collect();
    // Large bodies are received in place too: one sent slowly, in pieces, reads back whole;
    // clients that hang up in the middle of theirs leave nothing behind.
    let mut up = std::net::TcpStream::connect(addr).unwrap();
    up.write_all(
        format!(
            "PUT /api/v1/objects?key=slow HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .unwrap();
    for piece in body.chunks(300 * 1024) {
        up.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut answer = [0u8; 512];
    let n = up.read(&mut answer).unwrap();
    assert!(
        answer[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer[..n])
    );
    for i in 0..10 {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        let head = format!(
            "PUT /api/v1/objects?key=cut{i} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(&body[..(1 << 20) + i * 4099]).unwrap();
        drop(s);
    }
    // Clients that hang up in the middle of an answer.
    for _ in 0..20 {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(get).unwrap();
        let mut chunk = [0u8; 64 * 1024];
        let _ = s.read(&mut chunk);
        drop(s);
    }
    for r in readers {
        r.join().expect("reader");
    }
    // Every connection is closed on the server's side too (a socket left in the file table
    // would stay in CLOSE-WAIT), and the server answers whole.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server_sockets(addr.port()) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(server_sockets(addr.port()), 0, "server sockets left open");
    let resp = srv.client().get("/api/v1/objects?key=big");
    assert!(resp.body == body);
    let resp = srv.client().get("/api/v1/objects?key=slow");
    assert!(resp.body == body, "the slowly sent body differs");
    for i in 0..10 {
        let resp = srv.client().get(&format!("/api/v1/objects?key=cut{i}"));
        assert_eq!(
            resp.header("X-MMC-Error-Code"),
            Some("key_not_found"),
            "a body cut short is not an object"
        );
    }
}

#[test]
fn front_ring_connection_switches_between_large_bodies_and_small_requests() {
    use std::io::Write;
    // One connection: large PUTs (its small reads then become one-shot receives into the
    // reader's buffer), a pipelined burst of small requests (two small reads in a row: back to
    // the multishot receive), a large body sent slowly in pieces, then small requests again.
    // Every answer in order, every byte where it belongs.
    let srv = ServerBuilder::new(Driver::Epoll)
        .io_driver("ring")
        .shards(1)
        .start();
    let mut c = Client::connect(srv.addr);
    let bodies: Vec<Vec<u8>> = (0..6usize)
        .map(|k| {
            (0..(300 << 10) + k * 4099)
                .map(|i: usize| (i * 13 + k * 7 + i / 511) as u8)
                .collect()
        })
        .collect();
    for (k, b) in bodies.iter().enumerate() {
        let put = c.request("PUT", &format!("/api/v1/objects?key=sw{k}"), Some(b));
        assert_eq!(put.status, 200, "{}", put.text());
    }
    let burst: Vec<u8> = (0..40)
        .flat_map(|i| {
            format!(
                "GET /api/v1/objects?key=sw{} HTTP/1.1\r\nHost: t\r\n\r\n",
                i % 6
            )
            .into_bytes()
        })
        .collect();
    c.send(&burst);
    for i in 0..40 {
        let r = c.read_response(false);
        assert_eq!(r.status, 200);
        assert!(
            r.body == bodies[i % 6],
            "burst answer {i}: the bytes differ"
        );
    }
    let slow: Vec<u8> = (0..(3 << 20) + 5).map(|i: usize| (i / 3) as u8).collect();
    c.stream
        .write_all(
            format!(
                "PUT /api/v1/objects?key=sw-slow HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
                slow.len()
            )
            .as_bytes(),
        )
        .unwrap();
    for piece in slow.chunks(200 * 1024 + 17) {
        c.stream.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_millis(3));
    }
    let put = c.read_response(false);
    assert_eq!(put.status, 200, "{}", put.text());
    for _ in 0..3 {
        assert_eq!(c.get("/health").status, 200);
        let r = c.get("/api/v1/objects?key=sw-slow");
        assert_eq!(r.status, 200);
        assert!(r.body == slow, "the slow body's bytes differ");
    }
}
