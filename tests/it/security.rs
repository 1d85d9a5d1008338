//! Security and hostile input: bearer tokens, fail-closed binding, mTLS, overload shedding,
//! and thousands of idle, trickling and garbage connections with bounded memory.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{
    CertificateRevocationListParams, Issuer, KeyIdMethod, KeyPair, RevokedCertParams, SerialNumber,
    date_time_ymd,
};

use crate::both_drivers;
use crate::harness::{Client, Driver, SERVER_BIN, ServerBuilder, rss_kib, test_ca, test_leaf};
use crate::store::temp_dir;

both_drivers!(
    tokens_guard_every_route_but_the_probes,
    with_only_the_data_token_the_scrapes_need_it_too,
    overload_sheds_with_429,
    mtls_requires_a_valid_client_certificate,
    buffered_request_bytes_are_bounded_per_shard,
    out_of_descriptors_the_server_backs_off_and_serves_again,
);

const DATA: &str = "data-token-0123456789";
const SCRAPE: &str = "scrape-token-9876543210";

fn with(c: &mut Client, method: &str, path: &str, token: Option<&str>) -> crate::harness::Response {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    c.request_with(
        method,
        path,
        &headers,
        if method == "PUT" { Some(b"v") } else { None },
    )
}

fn tokens_guard_every_route_but_the_probes(driver: Driver) {
    let srv = ServerBuilder::new(driver)
        .set("ock.mmc.http.auth_token", DATA)
        .set("ock.mmc.http.metrics_token", SCRAPE)
        .start();
    let mut c = srv.client();
    // The probes and the API's description are public (the gateway convention).
    for (m, p) in [
        ("GET", "/healthz"),
        ("GET", "/ready"),
        ("GET", "/openapi.json"),
    ] {
        assert_eq!(with(&mut c, m, p, None).status, 200, "{p} is open");
    }
    // Every route and method the router knows (from its own table, so a new route cannot
    // slip past), plus an unknown path, which must not reveal that it is unknown.
    let mut cases: Vec<(&str, String, bool)> = vec![("GET", "/no/such/path".into(), false)];
    for spec in mmc::http::router::ROUTES {
        if matches!(spec.path, "/healthz" | "/ready" | "/openapi.json") {
            continue;
        }
        if spec.route.is_cluster() {
            // Guarded by the cluster token (tests/it/cluster.rs), not the data token.
            continue;
        }
        for m in spec.methods {
            let path = if matches!(spec.path, "/metadata" | "/api/v1/objects") {
                format!("{}?key=k", spec.path)
            } else {
                spec.path.to_string()
            };
            cases.push((m.as_str(), path, spec.route.is_metrics()));
        }
    }
    assert!(cases.len() >= 39, "{}", cases.len());
    for (m, p, metrics) in &cases {
        let (right, other) = if *metrics {
            (SCRAPE, DATA)
        } else {
            (DATA, SCRAPE)
        };
        for token in [
            None,
            Some("wrong-token"),
            Some(other),
            Some(&right[..right.len() - 1]),
        ] {
            let r = with(&mut c, m, p, token);
            r.assert_error(401, "Unauthorized: missing or invalid bearer token");
            assert_eq!(
                r.header("www-authenticate"),
                Some("Bearer realm=\"memcache\""),
                "{p}"
            );
        }
        let r = with(&mut c, m, p, Some(right));
        assert_ne!(r.status, 401, "{m} {p} with the right token");
        if *metrics {
            assert_eq!(r.status, 200, "{p} with the metrics token");
        }
    }
    // The scheme is case-insensitive (RFC 7235); a token in another scheme is not accepted.
    let lower = format!("bearer {DATA}");
    assert_eq!(
        c.request_with("GET", "/health", &[("Authorization", &lower)], None)
            .status,
        200
    );
    let basic = format!("Basic {DATA}");
    assert_eq!(
        c.request_with("GET", "/health", &[("Authorization", &basic)], None)
            .status,
        401
    );
    assert_eq!(
        with(&mut c, "PUT", "/metadata?key=k", Some(DATA)).status,
        200
    );
    assert_eq!(
        with(&mut c, "GET", "/metadata?key=k", Some(DATA)).text(),
        "v"
    );
    // An unauthenticated upload is refused without reading its body.
    let mut u = srv.client();
    u.send(b"PUT /metadata?key=x HTTP/1.1\r\nHost: t\r\nContent-Length: 100000000\r\n\r\n");
    u.read_response(false)
        .assert_error(401, "Unauthorized: missing or invalid bearer token");
    // Tokens never appear in the log or in --print-config.
    assert!(!srv.log().contains(DATA) && !srv.log().contains(SCRAPE));
}

/// With `auth_token` set and no metrics token, the scrape routes need a bearer too, the data
/// token (the gateway convention: with `auth_token` configured `/metrics` is not open; issue
/// 27: they were open), while the probes and `/openapi.json` stay public.
fn with_only_the_data_token_the_scrapes_need_it_too(driver: Driver) {
    let srv = ServerBuilder::new(driver)
        .set("ock.mmc.http.auth_token", DATA)
        .start();
    let mut c = srv.client();
    for p in [
        "/metrics",
        "/metrics/summary",
        "/metrics/ptracer",
        "/api/v1/analysis/alloc_free_latency",
    ] {
        with(&mut c, "GET", p, None)
            .assert_error(401, "Unauthorized: missing or invalid bearer token");
        with(&mut c, "GET", p, Some(SCRAPE))
            .assert_error(401, "Unauthorized: missing or invalid bearer token");
        assert_eq!(with(&mut c, "GET", p, Some(DATA)).status, 200, "{p}");
    }
    for p in ["/healthz", "/ready", "/openapi.json"] {
        assert_eq!(with(&mut c, "GET", p, None).status, 200, "{p}");
    }
}

#[test]
fn tokens_from_the_environment_and_never_printed() {
    let out = std::process::Command::new(SERVER_BIN)
        .args(["--print-config"])
        .env("MMC_API_TOKEN", DATA)
        .env("MMC_METRICS_TOKEN", SCRAPE)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("ock.mmc.http.auth_token = <redacted>\n"),
        "{text}"
    );
    assert!(
        text.contains("ock.mmc.http.metrics_token = <redacted>\n"),
        "{text}"
    );
    assert!(!text.contains(DATA));
    let out = std::process::Command::new(SERVER_BIN)
        .args(["--set", "ock.mmc.http.auth_token=has space secret"])
        .output()
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("invalid value \"<redacted>\" for ock.mmc.http.auth_token"),
        "{err}"
    );
    assert!(!err.contains("secret"), "{err}");
    // The environment variable works for the server itself.
    let srv = ServerBuilder::new(Driver::Epoll)
        .env("MMC_API_TOKEN", DATA)
        .start();
    let mut c = srv.client();
    with(&mut c, "GET", "/health", None)
        .assert_error(401, "Unauthorized: missing or invalid bearer token");
    assert_eq!(with(&mut c, "GET", "/health", Some(DATA)).status, 200);
}

#[test]
fn fail_closed_binding_refuses_unsafe_exposure() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(SERVER_BIN)
            .args(["--listen", "0.0.0.0:0", "--io-driver", "epoll"])
            .args(args)
            .env_remove("MMC_API_TOKEN")
            .env_remove("MMC_METRICS_TOKEN")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let cases: &[(&[&str], &str)] = &[
        (
            &[],
            "set ock.mmc.http.auth_token (or MMC_API_TOKEN) and a different ock.mmc.http.metrics_token",
        ),
        (
            &["--set", "ock.mmc.http.auth_token=a-data-token"],
            "without a separate metrics token: set ock.mmc.http.metrics_token",
        ),
        (
            &[
                "--set",
                "ock.mmc.http.auth_token=same-token",
                "--set",
                "ock.mmc.http.metrics_token=same-token",
            ],
            "must differ from ock.mmc.http.auth_token",
        ),
    ];
    for (args, needle) in cases {
        let (code, err) = run(args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("refusing to listen on 0.0.0.0:"), "{err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    // With both tokens it starts (traffic still goes to 127.0.0.1).
    let srv = ServerBuilder::new(Driver::Epoll)
        .listen("0.0.0.0:0")
        .set("ock.mmc.http.auth_token", DATA)
        .set("ock.mmc.http.metrics_token", SCRAPE)
        .start();
    let port = srv.addr.port();
    let mut c = Client::connect(format!("127.0.0.1:{port}").parse().unwrap());
    assert_eq!(with(&mut c, "GET", "/health", Some(DATA)).status, 200);
}

fn overload_sheds_with_429(driver: Driver) {
    // One in-flight request per shard and tiny cross-shard queues: a burst of pipelined
    // requests for keys owned by the other shard overflows at once.
    let srv = ServerBuilder::new(driver)
        .shards(2)
        .set("ock.mmc.shard.max_outstanding", "16")
        .set("ock.mmc.shard.inbox_capacity", "16")
        .set("ock.mmc.http.max_inflight_per_shard", "8")
        .start();
    let mut conns: Vec<Client> = (0..32).map(|_| srv.client()).collect();
    let burst: Vec<u8> = (0..40)
        .flat_map(|i| {
            format!("GET /metadata?key=flood-{i} HTTP/1.1\r\nHost: t\r\n\r\n").into_bytes()
        })
        .collect();
    for c in conns.iter_mut() {
        c.send(&burst);
    }
    let (mut shed, mut served) = (0, 0);
    for c in conns.iter_mut() {
        for _ in 0..40 {
            let r = c.read_response(false);
            match r.status {
                429 => {
                    shed += 1;
                    let retry: u32 = r
                        .header("retry-after")
                        .expect("Retry-After")
                        .parse()
                        .unwrap();
                    assert!((1..=60).contains(&retry), "{retry}");
                    assert_eq!(
                        r.json()["error_message"],
                        "Server overloaded: too much work waiting, retry later"
                    );
                }
                200 => {
                    served += 1;
                    assert_eq!(r.json()["error_message"], "Metadata key not found");
                }
                s => panic!("unexpected status {s}: {}", r.text()),
            }
        }
    }
    assert!(shed > 0, "nothing was shed");
    assert!(served > 0, "nothing was served");
    // Afterwards everything is served again.
    let mut c = srv.client();
    assert_eq!(c.get("/health").status, 200);
    let m = c.get("/metrics").text();
    let rejected = m
        .lines()
        .find(|l| l.starts_with("memcache_overload_rejections_total "))
        .unwrap();
    assert_eq!(
        rejected,
        format!("memcache_overload_rejections_total {shed}")
    );
}

fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

#[test]
fn hostile_connections_do_not_starve_health_or_grow_memory() {
    raise_fd_limit();
    let srv = ServerBuilder::new(Driver::Uring)
        .shards(2)
        .set("ock.mmc.http.header_timeout_ms", "60000")
        .set("ock.mmc.http.idle_timeout_ms", "60000")
        .start();
    let pid = srv.pid();
    let rss_before = rss_kib(pid);
    let mut idle: Vec<TcpStream> = Vec::new();
    for _ in 0..3000 {
        idle.push(TcpStream::connect(srv.addr).unwrap());
    }
    let mut trickling: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(srv.addr).unwrap())
        .collect();
    let mut seed = 7u64;
    let mut garbage = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut worst = Duration::ZERO;
    let request = b"GET /health HTTP/1.1\r\nHost: t\r\nX-Slow: ";
    for round in 0..10 {
        for t in trickling.iter_mut() {
            let _ = t.write_all(&request[round % request.len()..round % request.len() + 1]);
        }
        for _ in 0..50 {
            if let Ok(mut g) = TcpStream::connect(srv.addr) {
                let junk: Vec<u8> = (0..(garbage() % 4096) as usize)
                    .map(|_| garbage() as u8)
                    .collect();
                let _ = g.write_all(&junk);
            }
        }
        let t0 = Instant::now();
        let mut c = srv.client();
        assert_eq!(c.get("/health").status, 200);
        worst = worst.max(t0.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    let rss_after = rss_kib(pid);
    eprintln!(
        "3000 idle + 300 trickling + 500 garbage connections: worst /health {worst:?}, RSS {rss_before} KiB -> {rss_after} KiB"
    );
    assert!(
        worst < Duration::from_secs(1),
        "health answered in {worst:?}"
    );
    // RSS may also shrink (pages given back): only growth is bounded.
    let grew = rss_after.saturating_sub(rss_before);
    assert!(
        grew < 96 * 1024,
        "RSS grew by {grew} KiB ({rss_before} KiB -> {rss_after} KiB)"
    );
    let m = srv.client().get("/metrics").text();
    let open: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("memcache_http_connections_open "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(open >= 3000, "{open} open connections");
    drop(idle);
    drop(trickling);
}

/// A CA, the server's certificate, client certificates (one revoked), all on disk.
struct Pki {
    dir: std::path::PathBuf,
}

/// A certificate for `names` from `issuer`, for client or server use.
fn leaf(
    issuer: &Issuer<'_, &KeyPair>,
    names: &[&str],
    serial: u64,
    client: bool,
) -> (String, String) {
    let usage = if client {
        rcgen::ExtendedKeyUsagePurpose::ClientAuth
    } else {
        rcgen::ExtendedKeyUsagePurpose::ServerAuth
    };
    test_leaf(issuer, names, serial, vec![usage])
}

impl Pki {
    fn new() -> Pki {
        let dir = temp_dir("pki");
        let (ca_params, ca_key) = test_ca("mmc test CA");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::from_params(&ca_params, &ca_key);
        let (other_params, other_key) = test_ca("another CA");
        let other_issuer = Issuer::from_params(&other_params, &other_key);
        let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
        write("ca.pem", &ca_cert.pem());
        let (c, k) = leaf(&issuer, &["localhost", "127.0.0.1"], 1, false);
        write("server.pem", &c);
        write("server.key", &k);
        let (c, k) = leaf(&issuer, &["good-client"], 2, true);
        write("client.pem", &c);
        write("client.key", &k);
        let (c, k) = leaf(&issuer, &["revoked-client"], 3, true);
        write("revoked.pem", &c);
        write("revoked.key", &k);
        let (c, k) = leaf(&other_issuer, &["stranger"], 4, true);
        write("stranger.pem", &c);
        write("stranger.key", &k);
        let crl = CertificateRevocationListParams {
            this_update: date_time_ymd(2025, 1, 1),
            next_update: date_time_ymd(2035, 1, 1),
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: vec![RevokedCertParams {
                serial_number: SerialNumber::from(3u64),
                revocation_time: date_time_ymd(2025, 6, 1),
                reason_code: None,
                invalidity_date: None,
            }],
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(&issuer)
        .unwrap();
        write("crl.pem", &crl.pem().unwrap());
        write(
            "garbage.pem",
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        );
        Pki { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_string()
    }

    fn server(&self, driver: Driver) -> ServerBuilder {
        ServerBuilder::new(driver)
            .set("ock.mmc.metrics.tls.enable", "true")
            .set("ock.mmc.metrics.tls.ca.path", &self.path("ca.pem"))
            .set("ock.mmc.metrics.tls.cert.path", &self.path("server.pem"))
            .set("ock.mmc.metrics.tls.key.path", &self.path("server.key"))
            .set("ock.mmc.metrics.tls.crl.path", &self.path("crl.pem"))
    }

    /// A TLS client trusting our CA, presenting `identity` (cert, key) if given. Returns the
    /// response text of GET /health, or the error.
    fn get_health(
        &self,
        addr: std::net::SocketAddr,
        identity: Option<(&str, &str)>,
    ) -> Result<String, String> {
        let out = self.exchange(
            addr,
            identity,
            b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        )?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Sends `request` (which asks for `Connection: close`) over TLS and reads to the end.
    fn exchange(
        &self,
        addr: std::net::SocketAddr,
        identity: Option<(&str, &str)>,
        request: &[u8],
    ) -> Result<Vec<u8>, String> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(self.path("ca.pem")).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = match identity {
            Some((cert, key)) => {
                let chain: Vec<_> = CertificateDer::pem_file_iter(self.path(cert))
                    .unwrap()
                    .map(|c| c.unwrap())
                    .collect();
                let key = PrivateKeyDer::from_pem_file(self.path(key)).unwrap();
                builder.with_client_auth_cert(chain, key).unwrap()
            }
            None => builder.with_no_client_auth(),
        };
        let conn = rustls::ClientConnection::new(
            Arc::new(config),
            ServerName::try_from("localhost").unwrap(),
        )
        .map_err(|e| e.to_string())?;
        let tcp = TcpStream::connect(addr).map_err(|e| e.to_string())?;
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        tls.write_all(request).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        match tls.read_to_end(&mut out) {
            Ok(_) => Ok(out),
            Err(e) if !out.is_empty() && e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(out),
            Err(e) => Err(e.to_string()),
        }
    }
}

fn mtls_requires_a_valid_client_certificate(driver: Driver) {
    let pki = Pki::new();
    let srv = pki.server(driver).start();
    assert!(srv.log().contains("listening on https://"), "{}", srv.log());
    let ok = pki
        .get_health(srv.addr, Some(("client.pem", "client.key")))
        .expect("a good client certificate is accepted");
    assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    assert!(ok.contains("\"status\":\"ok\""), "{ok}");
    for (who, identity) in [
        ("no certificate", None),
        (
            "a certificate from another CA",
            Some(("stranger.pem", "stranger.key")),
        ),
        (
            "a revoked certificate",
            Some(("revoked.pem", "revoked.key")),
        ),
    ] {
        let r = pki.get_health(srv.addr, identity);
        assert!(r.is_err(), "{who} was let in: {r:?}");
    }
    // Plain HTTP on the TLS port gets nothing useful.
    let mut plain = TcpStream::connect(srv.addr).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    plain
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 64];
    let n = plain.read(&mut buf).unwrap_or(0);
    assert!(
        !buf[..n].starts_with(b"HTTP/1.1 200"),
        "plain HTTP was served"
    );
    let m = {
        // Count the refusals through the TLS front door.
        let text = pki
            .get_health(srv.addr, Some(("client.pem", "client.key")))
            .unwrap();
        assert!(text.contains("200 OK"));
        text
    };
    drop(m);
    // Objects come back whole over TLS: the answer's head and the blob are one vectored write,
    // which the TLS stream takes a piece at a time.
    let client = Some(("client.pem", "client.key"));
    for (key, len) in [("tls-small", 70_000usize), ("tls-big", 3 << 20)] {
        let body: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let mut put = format!(
            "PUT /api/v1/objects?key={key}&medium=dram HTTP/1.1\r\nHost: localhost\r\n\
             Content-Length: {len}\r\nConnection: close\r\n\r\n"
        )
        .into_bytes();
        put.extend_from_slice(&body);
        let answer = pki.exchange(srv.addr, client, &put).unwrap();
        assert!(answer.starts_with(b"HTTP/1.1 200"), "{key}: put refused");
        let get = format!(
            "GET /api/v1/objects?key={key} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        );
        let answer = pki.exchange(srv.addr, client, get.as_bytes()).unwrap();
        let end = answer
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a head")
            + 4;
        assert!(answer.starts_with(b"HTTP/1.1 200"), "{key}");
        assert!(answer[end..] == body[..], "{key} comes back whole over TLS");
    }
}

#[test]
fn bad_tls_files_stop_the_start() {
    let pki = Pki::new();
    let run = |key: &str, value: &str| {
        let mut cmd = std::process::Command::new(SERVER_BIN);
        cmd.args(["--listen", "127.0.0.1:0", "--io-driver", "epoll"]);
        for (k, v) in [
            ("ock.mmc.metrics.tls.enable", "true".to_string()),
            ("ock.mmc.metrics.tls.ca.path", pki.path("ca.pem")),
            ("ock.mmc.metrics.tls.cert.path", pki.path("server.pem")),
            ("ock.mmc.metrics.tls.key.path", pki.path("server.key")),
        ] {
            let v = if k == key { value.to_string() } else { v };
            cmd.args(["--set", &format!("{k}={v}")]);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let cases = [
        (
            "ock.mmc.metrics.tls.cert.path",
            "/nonexistent/server.pem".to_string(),
            "cannot load ock.mmc.metrics.tls.cert.path",
        ),
        (
            "ock.mmc.metrics.tls.key.path",
            "/nonexistent/server.key".to_string(),
            "cannot load ock.mmc.metrics.tls.key.path",
        ),
        (
            "ock.mmc.metrics.tls.ca.path",
            pki.path("garbage.pem"),
            "ock.mmc.metrics.tls.ca.path",
        ),
        (
            "ock.mmc.metrics.tls.key.path",
            pki.path("client.key"),
            "do not form a usable pair",
        ),
        (
            "ock.mmc.metrics.tls.cert.path",
            String::new(),
            "ock.mmc.metrics.tls.cert.path is empty",
        ),
    ];
    for (key, value, needle) in cases {
        let (code, err) = run(key, &value);
        assert!(
            code == Some(1) || code == Some(2),
            "{key}={value}: {code:?} {err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{key}={value}: {err}");
    }
}

/// Bodies that are buffered until complete (here batch puts) share a per-shard budget: a
/// request that would take the shard past it is shed with 429, the others complete, and the
/// memory is given back when they are done.
fn buffered_request_bytes_are_bounded_per_shard(driver: Driver) {
    let srv = ServerBuilder::new(driver)
        .shards(1)
        .set("ock.mmc.http.max_body_bytes", "2MB")
        .set("ock.mmc.http.max_buffered_bytes_per_shard", "4MB")
        .start();
    let len = 1_500_000;
    let body = crate::store::data(len, 3);
    let head = |i: usize| {
        format!(
            "POST /api/v1/objects/batch_put?keys=buf-{i}&sizes={len} HTTP/1.1\r\nHost: t\r\nContent-Length: {len}\r\n\r\n"
        )
    };
    let buffered = |c: &mut Client| {
        crate::observability::scrape(c)
            .get("memcache_http_buffered_bytes")
            .copied()
            .unwrap()
    };
    let mut m = srv.client();
    assert_eq!(buffered(&mut m), 0.0);
    // Two requests half sent: about 3 MB of the 4 MB budget is held for them.
    let mut held: Vec<Client> = (0..2).map(|_| srv.client()).collect();
    for (i, c) in held.iter_mut().enumerate() {
        c.send(head(i).as_bytes());
        c.send(&body[..len / 2]);
    }
    crate::store::eventually("both bodies are being buffered", || {
        buffered(&mut m) >= 2.0 * (len as f64) * 0.99
    });
    // A third does not fit: shed at once, with Retry-After, and closed.
    let mut third = srv.client();
    third.send(head(2).as_bytes());
    let r = third.read_response(false);
    r.assert_error(429, "Server overloaded: too much work waiting, retry later");
    assert!(r.header("retry-after").is_some());
    assert_eq!(r.header("connection"), Some("close"));
    // The first two complete normally, and their memory is released.
    for c in held.iter_mut() {
        c.send(&body[len / 2..]);
        let r = c.read_response(false);
        assert_eq!(r.json()["results"][0]["success"], true, "{}", r.text());
    }
    drop(held);
    crate::store::eventually("the buffers are released", || buffered(&mut m) == 0.0);
    assert_eq!(
        crate::store::get_bytes(&mut m, "buf-1"),
        body,
        "a buffered put stored its bytes"
    );
    // The budget must hold at least one largest body.
    let out = std::process::Command::new(SERVER_BIN)
        .args(["--set", "ock.mmc.http.max_buffered_bytes_per_shard=8MB"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ock.mmc.http.max_buffered_bytes_per_shard (8388608) must not be below ock.mmc.http.max_body_bytes (67108864)"),
        "{err}"
    );
}

/// CPU time (user + system) the process `pid` used so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Out of descriptors, with connections waiting in the listen backlog: every accept fails
/// with `EMFILE`. The server backs off (the accept loop sleeps; the front ring re-arms its
/// accept after a timer, not at once) instead of spinning on the failure, logs it at most
/// once a second, and accepts again once descriptors are free. The same for connections
/// waiting on the same-host socket (whose failures were logged at every retry, 50 a second).
fn out_of_descriptors_the_server_backs_off_and_serves_again(driver: Driver) {
    // A limit set before the server starts (io_uring's accept does not see one lowered later).
    let srv = ServerBuilder::new(driver).shards(1).nofile(48).start();
    let pid = srv.pid();
    let health = srv.client().get("/health");
    let same_host = health
        .header("x-mmc-same-host")
        .and_then(|v| v.split_once(' '))
        .map(|(_, path)| path.to_string())
        .expect("X-Mmc-Same-Host on /health");
    // More connections than descriptors left: the last ones wait in the backlog.
    let conns: Vec<TcpStream> = (0..64)
        .map(|_| TcpStream::connect(srv.addr).unwrap())
        .collect();
    // The same-host connections once the descriptors are gone: sooner, its accept loop may take
    // them while some are left, and then has nothing to fail on.
    let out = Instant::now() + Duration::from_secs(5);
    while !srv.log().contains("accept failed") {
        assert!(Instant::now() < out, "no accept failed:\n{}", srv.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let local: Vec<std::os::unix::net::UnixStream> = (0..4)
        .map(|_| std::os::unix::net::UnixStream::connect(&same_host).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let t0 = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(2));
    let spent = cpu_ticks(pid) - t0;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    assert!(
        spent * 10 < hz * 2 * 3,
        "{spent} ticks of CPU in 2 s ({hz} a second) while accepts fail: spinning"
    );
    let log = srv.log();
    let failures = log.matches("accept failed").count();
    let local_failures = log.matches("same-host accept failed").count();
    assert!(
        (1..=4).contains(&(failures - local_failures)) && (1..=4).contains(&local_failures),
        "{failures} accept failures logged in about 2 s, {local_failures} on the same-host socket:\n{log}"
    );
    drop(conns);
    drop(local);
    // Descriptors free again: served.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(mut c) = TcpStream::connect(srv.addr) {
            c.set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            let _ = c.write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
            let mut buf = [0u8; 64];
            if let Ok(n) = c.read(&mut buf)
                && buf[..n].starts_with(b"HTTP/1.1 200")
            {
                break;
            }
        }
        assert!(Instant::now() < deadline, "not served again within 5 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}
