//! The server foundation: HA and health endpoints, /metadata, HTTP framing, limits, malformed
//! input, keep-alive and timeouts. Every test runs under both io drivers with several shards.

use std::time::Duration;

use crate::both_drivers;
use crate::harness::{Client, Driver, Server, ServerBuilder, pct};

both_drivers!(
    health_endpoints_answer_the_contract_bytes,
    metadata_round_trips_binary_values_across_shards,
    metadata_errors_use_the_envelope,
    pipelined_requests_are_answered_in_order,
    chunked_bodies_are_decoded,
    expect_continue_gets_a_go_ahead,
    limits_answer_with_their_status,
    body_over_the_limit_is_refused_before_it_is_sent,
    malformed_input_gets_400_and_the_server_keeps_serving,
    unknown_paths_and_methods,
    head_and_options,
    root_leads_to_the_status_page,
    request_ids_are_echoed_or_generated,
    connection_management,
    idle_and_stalled_connections_are_closed,
    connection_limit_answers_429,
);

fn health_endpoints_answer_the_contract_bytes(driver: Driver) {
    let srv = Server::start(driver);
    let mut c = srv.client();

    let r = c.get("/health");
    assert_eq!(r.status, 200);
    assert_eq!(r.content_type(), "application/json; charset=utf-8");
    assert_eq!(
        r.text(),
        r#"{"status":"ok","role":"leader","ha_state":"serving","service_ready":true,"leader_address":"unknown","view_version":0}"#
    );
    assert_eq!(r.header("cache-control"), Some("no-store"));

    let r = c.get("/role");
    assert_eq!(
        (r.status, r.content_type(), r.text().as_str()),
        (200, "text/plain; charset=utf-8", "leader")
    );
    let r = c.get("/ha_status");
    assert_eq!(
        (r.status, r.content_type(), r.text().as_str()),
        (200, "text/plain; charset=utf-8", "serving")
    );
    let r = c.get("/leader");
    assert_eq!(r.content_type(), "application/json; charset=utf-8");
    assert_eq!(
        r.text(),
        r#"{"present":true,"leader_address":"unknown","view_version":0}"#
    );
    let r = c.get("/healthz");
    assert_eq!((r.status, r.text().as_str()), (200, "ok"));
    let r = c.get("/ready");
    assert_eq!((r.status, r.text().as_str()), (200, "ready"));

    let r = c.get("/openapi.json");
    assert_eq!(r.status, 200);
    assert_eq!(r.content_type(), "application/json; charset=utf-8");
    assert_eq!(r.json()["openapi"], "3.0.3");
    assert!(r.header("date").is_some_and(|d| d.ends_with(" GMT")));
}

fn metadata_round_trips_binary_values_across_shards(driver: Driver) {
    let srv = ServerBuilder::new(driver).shards(4).start();
    let mut writer = srv.client();
    // Every byte value, in keys and values, and enough keys that every shard owns some.
    let all_bytes: Vec<u8> = (0..=255u8).collect();
    let mut expected = Vec::new();
    for i in 0..64u32 {
        let key = [
            b"k".as_slice(),
            &i.to_le_bytes(),
            &all_bytes[..(i as usize * 4) % 256],
        ]
        .concat();
        let mut value = all_bytes.clone();
        value.rotate_left(i as usize);
        value.truncate(1 + (i as usize * 37) % 256);
        let r = writer.request("PUT", &format!("/metadata?key={}", pct(&key)), Some(&value));
        assert_eq!((r.status, r.text().as_str()), (200, "metadata updated"));
        assert_eq!(r.content_type(), "text/plain; charset=utf-8");
        expected.push((key, value));
    }
    // Read back over several connections (each lands on some shard; most keys live elsewhere).
    for conn in 0..4 {
        let mut c = srv.client();
        for (key, value) in expected.iter().skip(conn).step_by(2) {
            let r = c.get(&format!("/metadata?key={}", pct(key)));
            assert_eq!(r.status, 200);
            assert_eq!(r.content_type(), "text/plain; charset=utf-8");
            assert_eq!(&r.body, value);
        }
    }
    // Overwrite, then delete.
    let (key, _) = &expected[7];
    let r = writer.request("PUT", &format!("/metadata?key={}", pct(key)), Some(b""));
    assert_eq!(r.text(), "metadata updated");
    assert_eq!(writer.get(&format!("/metadata?key={}", pct(key))).body, b"");
    let r = writer.request("DELETE", &format!("/metadata?key={}", pct(key)), None);
    assert_eq!((r.status, r.text().as_str()), (200, "metadata deleted"));
    writer
        .get(&format!("/metadata?key={}", pct(key)))
        .assert_error(200, "Metadata key not found");

    // `+` is a space and `%2F` a slash in the query string.
    let r = writer.request("PUT", "/metadata?key=a+b%2Fc", Some(b"decoded"));
    assert_eq!(r.text(), "metadata updated");
    assert_eq!(writer.get("/metadata?key=a%20b/c").body, b"decoded");
}

fn metadata_errors_use_the_envelope(driver: Driver) {
    let srv = ServerBuilder::new(driver)
        .set("ock.mmc.metadata.max_value_bytes", "1KB")
        .start();
    let mut c = srv.client();
    c.get("/metadata")
        .assert_error(200, "Missing 'key' parameter");
    c.get("/metadata?key=")
        .assert_error(200, "Missing 'key' parameter");
    c.get("/metadata?other=1")
        .assert_error(200, "Missing 'key' parameter");
    c.request("PUT", "/metadata", Some(b"x"))
        .assert_error(200, "Missing 'key' parameter");
    c.get("/metadata?key=absent")
        .assert_error(200, "Metadata key not found");
    c.request("DELETE", "/metadata?key=absent", None)
        .assert_error(200, "Metadata key not found");
    let long_key = "k".repeat(4097);
    c.get(&format!("/metadata?key={long_key}"))
        .assert_error(200, "Key too long (max 4096 bytes)");
    c.get("/metadata?key=%zz")
        .assert_error(400, "Malformed query string: invalid percent-encoding");
    // Over the value limit: 413 with the envelope, and nothing stored.
    let r = c.request("PUT", "/metadata?key=big", Some(&[7u8; 1025]));
    r.assert_error(
        413,
        "Request body too large: the limit is 1024 bytes (set by ock.mmc.metadata.max_value_bytes)",
    );
    let mut c = srv.client();
    c.get("/metadata?key=big")
        .assert_error(200, "Metadata key not found");
    let r = c.request("PUT", "/metadata?key=big", Some(&[7u8; 1024]));
    assert_eq!(r.text(), "metadata updated");
}

fn pipelined_requests_are_answered_in_order(driver: Driver) {
    let srv = ServerBuilder::new(driver).shards(3).start();
    let mut c = srv.client();
    let mut batch = Vec::new();
    for i in 0..200 {
        let req = match i % 4 {
            0 => format!(
                "PUT /metadata?key=p{i} HTTP/1.1\r\nHost: t\r\nX-Request-ID: r{i}\r\nContent-Length: {}\r\n\r\nv{i}",
                format!("v{i}").len()
            ),
            1 => format!(
                "GET /metadata?key=p{} HTTP/1.1\r\nHost: t\r\nX-Request-ID: r{i}\r\n\r\n",
                i - 1
            ),
            2 => format!("GET /role HTTP/1.1\r\nHost: t\r\nX-Request-ID: r{i}\r\n\r\n"),
            _ => format!(
                "GET /metadata?key=nope{i} HTTP/1.1\r\nHost: t\r\nX-Request-ID: r{i}\r\n\r\n"
            ),
        };
        batch.extend_from_slice(req.as_bytes());
    }
    c.send(&batch);
    for i in 0..200 {
        let r = c.read_response(false);
        assert_eq!(
            r.header("x-request-id"),
            Some(format!("r{i}").as_str()),
            "answer {i} out of order"
        );
        match i % 4 {
            0 => assert_eq!(r.text(), "metadata updated"),
            1 => assert_eq!(r.text(), format!("v{}", i - 1)),
            2 => assert_eq!(r.text(), "leader"),
            _ => r.assert_error(200, "Metadata key not found"),
        }
    }
}

fn chunked_bodies_are_decoded(driver: Driver) {
    let srv = ServerBuilder::new(driver)
        .set("ock.mmc.metadata.max_value_bytes", "64KB")
        .start();
    let mut c = srv.client();
    let head = "PUT /metadata?key=ch HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
    let body = "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n";
    c.send(format!("{head}{body}GET /metadata?key=ch HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
    assert_eq!(c.read_response(false).text(), "metadata updated");
    assert_eq!(c.read_response(false).text(), "hello world");

    // A large body in many small chunks, written in pieces that split chunk headers.
    let value: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
    let mut wire =
        b"PUT /metadata?key=big HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for piece in value.chunks(777) {
        wire.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        wire.extend_from_slice(piece);
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    for part in wire.chunks(1000) {
        c.send(part);
    }
    assert_eq!(c.read_response(false).text(), "metadata updated");
    assert_eq!(c.get("/metadata?key=big").body, value);

    // Over the route's limit: 413, connection closed, nothing stored.
    let mut c2 = srv.client();
    let mut wire =
        b"PUT /metadata?key=huge HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
    wire.extend_from_slice(format!("{:x}\r\n", 65 * 1024).as_bytes());
    c2.send(&wire);
    c2.read_response(false)
        .assert_error(413, "Request body too large: the limit is 65536 bytes (set by ock.mmc.metadata.max_value_bytes)");
    assert!(c2.closed_within(Duration::from_secs(5)));
    c.get("/metadata?key=huge")
        .assert_error(200, "Metadata key not found");

    // Malformed chunk framing: 400 and close.
    let mut c3 = srv.client();
    c3.send(
        b"PUT /metadata?key=bad HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    );
    c3.read_response(false)
        .assert_error(400, "Malformed chunked body");
    assert!(c3.closed_within(Duration::from_secs(5)));
}

fn expect_continue_gets_a_go_ahead(driver: Driver) {
    let srv = Server::start(driver);
    let mut c = srv.client();
    c.send(b"PUT /metadata?key=e HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
    let r = c.read_response(false);
    assert_eq!(r.status, 100);
    assert_eq!(r.raw, b"HTTP/1.1 100 Continue\r\n\r\n");
    c.send(b"hello");
    assert_eq!(c.read_response(false).text(), "metadata updated");
    // Without a body to wait for, no 100 is sent.
    let r = c.request_with(
        "GET",
        "/metadata?key=e",
        &[("Expect", "100-continue")],
        None,
    );
    assert_eq!(r.text(), "hello");
    // An unknown expectation is refused.
    let mut c = srv.client();
    let r = c.request_with("GET", "/health", &[("Expect", "something")], None);
    r.assert_error(
        417,
        "Unsupported Expect value (only 100-continue is accepted)",
    );
}

fn limits_answer_with_their_status(driver: Driver) {
    let srv = Server::start(driver);
    // URI over 8 KiB → 414 (and the connection closes).
    let mut c = srv.client();
    c.send(
        format!(
            "GET /metadata?key={} HTTP/1.1\r\nHost: t\r\n\r\n",
            "a".repeat(8 * 1024)
        )
        .as_bytes(),
    );
    c.read_response(false)
        .assert_error(414, "Request URI too long");
    assert!(c.closed_within(Duration::from_secs(5)));
    // A request line that never ends is refused once it passes the limit.
    let mut c = srv.client();
    c.send(format!("GET /{}", "a".repeat(9000)).as_bytes());
    c.read_response(false)
        .assert_error(414, "Request URI too long");
    // Header section over 16 KiB → 431.
    let mut c = srv.client();
    c.send(
        format!(
            "GET /health HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n",
            "b".repeat(16 * 1024)
        )
        .as_bytes(),
    );
    c.read_response(false)
        .assert_error(431, "Request header section too large");
    // Too many header fields → 431.
    let mut c = srv.client();
    let many: String = (0..100).map(|i| format!("X-H{i}: v\r\n")).collect();
    c.send(format!("GET /health HTTP/1.1\r\nHost: t\r\n{many}\r\n").as_bytes());
    c.read_response(false)
        .assert_error(431, "Request header section too large");
    // Just under the limits is fine.
    let mut c = srv.client();
    let r = c.request_with("GET", "/health", &[("X-Big", &"b".repeat(15 * 1024))], None);
    assert_eq!(r.status, 200);
    let r = c.get(&format!("/metadata?key={}", "k".repeat(4096)));
    r.assert_error(200, "Metadata key not found");
}

fn body_over_the_limit_is_refused_before_it_is_sent(driver: Driver) {
    let srv = ServerBuilder::new(driver)
        .set("ock.mmc.http.max_body_bytes", "1MB")
        .start();
    let mut c = srv.client();
    // Only the head is sent: the 413 must come without the body.
    c.send(b"PUT /metadata?key=x HTTP/1.1\r\nHost: t\r\nContent-Length: 1073741824\r\n\r\n");
    let r = c.read_response(false);
    r.assert_error(413, "Request body too large: the limit is 1048576 bytes (set by ock.mmc.metadata.max_value_bytes)");
    assert_eq!(r.reason, "Content Too Large");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.closed_within(Duration::from_secs(5)));
    // A client that keeps sending still gets its answer (the server reads and discards).
    let mut c = srv.client();
    c.send(b"PUT /nope HTTP/1.1\r\nHost: t\r\nContent-Length: 2000000\r\n\r\n");
    c.send(&vec![b'z'; 256 * 1024]);
    c.read_response(false).assert_error(
        413,
        "Request body too large: the limit is 1048576 bytes (set by ock.mmc.http.max_body_bytes)",
    );
    srv.client().get("/health");
}

fn malformed_input_gets_400_and_the_server_keeps_serving(driver: Driver) {
    let srv = ServerBuilder::new(driver).shards(3).start();
    let garbage: &[&[u8]] = &[
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: t\r\nNo-Colon\r\n\r\n",
        b"GET /health HTTP/9.9\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: t\r\nContent-Length: -5\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        b"POST /health HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET /health HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET relative HTTP/1.1\r\nHost: t\r\n\r\n",
        b"G\x00T / HTTP/1.1\r\nHost: t\r\n\r\n",
    ];
    for g in garbage {
        let mut c = srv.client();
        c.send(g);
        let r = c.read_response(false);
        assert_eq!(
            r.status,
            400,
            "{:?} → {}",
            String::from_utf8_lossy(g),
            r.text()
        );
        assert_eq!(r.content_type(), "application/json; charset=utf-8");
        assert_eq!(r.json()["success"], false);
        assert!(c.closed_within(Duration::from_secs(5)), "{g:?}");
    }
    let mut c = srv.client();
    c.send(b"POST /health HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
    c.read_response(false).assert_error(
        501,
        "Unsupported Transfer-Encoding (only chunked is accepted)",
    );
    let mut c = srv.client();
    c.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    c.read_response(false)
        .assert_error(505, "HTTP/2 is not supported; use HTTP/1.1");
    // Random bytes on many connections; then the server still answers.
    let mut seed = 0x1234_5678_9abc_def0u64;
    for _ in 0..50 {
        let mut c = srv.client();
        let len = 1 + (seed % 3000) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        c.send(&bytes);
        drop(c);
    }
    let mut c = srv.client();
    assert_eq!(c.get("/health").status, 200);
    // A client that sends half a request and disappears does not disturb others.
    let mut half = srv.client();
    half.send(b"PUT /metadata?key=h HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nabc");
    drop(half);
    assert_eq!(c.get("/role").text(), "leader");
}

fn unknown_paths_and_methods(driver: Driver) {
    let srv = Server::start(driver);
    let mut c = srv.client();
    c.get("/nope").assert_error(404, "Not found");
    c.get("/metadata/extra").assert_error(404, "Not found");
    let r = c.request("POST", "/health", Some(b"{}"));
    r.assert_error(405, "Method not allowed");
    assert_eq!(r.header("allow"), Some("GET, HEAD, OPTIONS"));
    let r = c.request("PATCH", "/metadata?key=a", None);
    r.assert_error(405, "Method not allowed");
    assert_eq!(r.header("allow"), Some("GET, HEAD, PUT, DELETE, OPTIONS"));
    // The connection survives these (the request was fully framed).
    assert_eq!(c.get("/healthz").text(), "ok");
    // A 404 for a request whose body has not arrived is answered at once, then closed.
    let mut c = srv.client();
    c.send(b"PUT /nope HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\npartial");
    c.read_response(false).assert_error(404, "Not found");
    assert!(c.closed_within(Duration::from_secs(5)));
}

fn head_and_options(driver: Driver) {
    let srv = Server::start(driver);
    let mut c = srv.client();
    c.request("PUT", "/metadata?key=h", Some(b"twelve bytes"));
    let get = c.get("/metadata?key=h");
    let head = c.request("HEAD", "/metadata?key=h", None);
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    assert_eq!(head.header("content-length"), Some("12"));
    assert_eq!(head.content_type(), get.content_type());
    let head = c.request("HEAD", "/health", None);
    assert_eq!(
        head.header("content-length"),
        c.get("/health").header("content-length")
    );
    // The connection is still in step after HEAD answers.
    assert_eq!(c.get("/role").text(), "leader");
    let r = c.request("OPTIONS", "/metadata", None);
    assert_eq!(r.status, 204);
    assert_eq!(r.header("allow"), Some("GET, HEAD, PUT, DELETE, OPTIONS"));
    let r = c.request("OPTIONS", "*", None);
    assert_eq!(r.status, 204);
    assert_eq!(c.get("/role").text(), "leader");
}

/// `/` is no contract route: a browser pointed at the server is sent to the status page.
fn root_leads_to_the_status_page(driver: Driver) {
    let srv = Server::start(driver);
    let mut c = srv.client();
    let r = c.get("/");
    assert_eq!(r.status, 302, "{}", r.text());
    assert_eq!(r.header("location"), Some("/ui"));
    assert_eq!(c.get("/ui").status, 200);
    // The query is not carried over: the page takes its tokens from the fragment.
    assert_eq!(c.get("/?x=1").header("location"), Some("/ui"));
    let head = c.request("HEAD", "/", None);
    assert_eq!(head.status, 302);
    assert!(head.body.is_empty());
    assert_eq!(head.header("location"), Some("/ui"));
    let r = c.request("POST", "/", Some(b"{}"));
    r.assert_error(405, "Method not allowed");
    assert_eq!(r.header("allow"), Some("GET, HEAD, OPTIONS"));
    assert_eq!(c.request("OPTIONS", "/", None).status, 204);
    // Still the data token's, like the page it leads to.
    let srv = ServerBuilder::new(driver)
        .set("ock.mmc.http.auth_token", "t0k")
        .start();
    assert_eq!(srv.client().get("/").status, 401);
}

fn request_ids_are_echoed_or_generated(driver: Driver) {
    let srv = Server::start(driver);
    let mut c = srv.client();
    let r = c.request_with("GET", "/health", &[("X-Request-ID", "client-id-42")], None);
    assert_eq!(r.header("x-request-id"), Some("client-id-42"));
    let a = c.get("/health");
    let b = c.get("/health");
    let (a, b) = (
        a.header("x-request-id").unwrap(),
        b.header("x-request-id").unwrap(),
    );
    assert_ne!(a, b);
    assert!(
        a.len() >= 16 && a.bytes().all(|x| x.is_ascii_hexdigit()),
        "{a}"
    );
    // An id we cannot echo safely is replaced.
    let r = c.request_with(
        "GET",
        "/health",
        &[("X-Request-ID", &"x".repeat(200))],
        None,
    );
    assert_ne!(r.header("x-request-id"), Some("x".repeat(200).as_str()));
    // Errors carry request ids too.
    let r = c.request_with("GET", "/nope", &[("X-Request-ID", "err-1")], None);
    assert_eq!(r.header("x-request-id"), Some("err-1"));
}

fn connection_management(driver: Driver) {
    let srv = Server::start(driver);
    // HTTP/1.1 keeps the connection open by default.
    let mut c = srv.client();
    for _ in 0..20 {
        assert_eq!(c.get("/healthz").status, 200);
    }
    // Connection: close is honoured.
    let r = c.request_with("GET", "/healthz", &[("Connection", "close")], None);
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.closed_within(Duration::from_secs(5)));
    // HTTP/1.0 closes unless asked to keep alive.
    let mut c = srv.client();
    c.send(b"GET /healthz HTTP/1.0\r\n\r\n");
    assert_eq!(c.read_response(false).text(), "ok");
    assert!(c.closed_within(Duration::from_secs(5)));
    let mut c = srv.client();
    c.send(b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    let r = c.read_response(false);
    assert_eq!(r.header("connection"), Some("keep-alive"));
    c.send(b"GET /role HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    assert_eq!(c.read_response(false).text(), "leader");
    // Absolute-form targets are accepted.
    let mut c = srv.client();
    assert_eq!(c.get("http://127.0.0.1/role").text(), "leader");
}

fn idle_and_stalled_connections_are_closed(driver: Driver) {
    let srv = ServerBuilder::new(driver)
        .set("ock.mmc.http.idle_timeout_ms", "300")
        .set("ock.mmc.http.header_timeout_ms", "300")
        .start();
    let mut idle = srv.client();
    assert_eq!(idle.get("/healthz").status, 200);
    let mut stalled = srv.client();
    stalled.send(b"GET /healthz HTTP/1.1\r\nHost:");
    let mut silent = srv.client();
    // Closed after the timeout (plus the tick), well before the 5 s bound.
    assert!(
        idle.closed_within(Duration::from_secs(5)),
        "idle keep-alive connection stays open"
    );
    assert!(
        stalled.closed_within(Duration::from_secs(5)),
        "stalled request stays open"
    );
    assert!(
        silent.closed_within(Duration::from_secs(5)),
        "silent connection stays open"
    );
    // An active connection is not closed while it keeps talking.
    let mut busy = srv.client();
    for _ in 0..8 {
        assert_eq!(busy.get("/healthz").status, 200);
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn connection_limit_answers_429(driver: Driver) {
    let srv = ServerBuilder::new(driver)
        .shards(1)
        .set("ock.mmc.http.max_connections_per_shard", "2")
        .start();
    let mut a = srv.client();
    let mut b = srv.client();
    assert_eq!(a.get("/healthz").status, 200);
    assert_eq!(b.get("/healthz").status, 200);
    let mut c = Client::connect(srv.addr);
    let r = c.read_response(false);
    r.assert_error(429, "Too many connections");
    assert_eq!(r.header("retry-after"), Some("1"));
    drop(a);
    // Once a slot frees up, new connections are served again.
    let mut ok = false;
    for _ in 0..100 {
        let mut d = Client::connect(srv.addr);
        d.send(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
        if d.read_response(false).status == 200 {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(ok, "a freed connection slot is never reused");
    assert_eq!(b.get("/healthz").status, 200);
}
