//! Tests of the head parser (`parse.rs`): limits, framing, the headers it reads and refuses.

use super::*;

fn complete(buf: &[u8]) -> Head<'_> {
    match parse_head(buf) {
        Parsed::Complete(h) => h,
        other => panic!("expected a complete head, got {other:?}"),
    }
}

fn error(buf: &[u8]) -> ProtocolError {
    match parse_head(buf) {
        Parsed::Error(e) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn simple_get() {
    let h = complete(b"GET /metadata?key=a%2Fb HTTP/1.1\r\nHost: x\r\n\r\nrest");
    assert_eq!(h.method, Method::Get);
    assert_eq!(h.path, b"/metadata");
    assert_eq!(h.query, b"key=a%2Fb");
    assert_eq!(h.len, 45);
    assert_eq!(h.framing, Framing::None);
    assert!(h.keep_alive);
}

#[test]
fn framing_and_connection_rules() {
    let h =
        complete(b"PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nConnection: close\r\n\r\n");
    assert_eq!(h.framing, Framing::Length(5));
    assert!(!h.keep_alive);
    let h = complete(b"PUT / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\n\r\n");
    assert_eq!(h.framing, Framing::Chunked);
    let h = complete(b"GET / HTTP/1.0\r\n\r\n");
    assert!(!h.keep_alive);
    let h = complete(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
    assert!(h.keep_alive);
    let h =
        complete(b"GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n");
    assert_eq!(h.framing, Framing::Length(3));
}

/// One case per smuggling-relevant rule of RFC 9112 (§3.2 Host, §5 field syntax, §6 body
/// framing): the head, the status and the message it is refused with.
#[test]
fn smuggling_shapes_are_refused() {
    let bad = Status::BAD_REQUEST;
    let cases: &[(&[u8], Status, &str)] = &[
        // §6.1/§6.3: Content-Length with Transfer-Encoding, in either order.
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            bad,
            "Both Transfer-Encoding and Content-Length present",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            bad,
            "Both Transfer-Encoding and Content-Length present",
        ),
        // §6.3: duplicate Content-Length with differing values, or a list of them.
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            bad,
            "Conflicting Content-Length headers",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3, 4\r\n\r\n",
            bad,
            "Invalid Content-Length",
        ),
        // §6.3: invalid Content-Length values.
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +3\r\n\r\n",
            bad,
            "Invalid Content-Length",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n",
            bad,
            "Invalid Content-Length",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0x10\r\n\r\n",
            bad,
            "Invalid Content-Length",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1 0\r\n\r\n",
            bad,
            "Invalid Content-Length",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: \r\n\r\n",
            bad,
            "Invalid Content-Length",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999\r\n\r\n",
            bad,
            "Invalid Content-Length",
        ),
        // §6.1: the final coding must be chunked; chunked only once; others unsupported.
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n",
            bad,
            "Transfer-Encoding must end with chunked",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            bad,
            "Transfer-Encoding must end with chunked",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n",
            bad,
            "Transfer-Encoding must end with chunked",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked;q=1\r\n\r\n",
            bad,
            "Transfer-Encoding must end with chunked",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: \r\n\r\n",
            bad,
            "Transfer-Encoding must end with chunked",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            bad,
            "Transfer-Encoding applies chunked more than once",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            bad,
            "Transfer-Encoding applies chunked more than once",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            Status::NOT_IMPLEMENTED,
            "Unsupported Transfer-Encoding (only chunked is accepted)",
        ),
        (
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            bad,
            "Transfer-Encoding is not defined for HTTP/1.0",
        ),
        // §3.2: Host.
        (
            b"GET / HTTP/1.1\r\n\r\n",
            bad,
            "Missing Host header (required in HTTP/1.1)",
        ),
        (
            b"GET http://a/ HTTP/1.1\r\n\r\n",
            bad,
            "Missing Host header (required in HTTP/1.1)",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            bad,
            "More than one Host header",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n",
            bad,
            "More than one Host header",
        ),
        (
            b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n",
            bad,
            "More than one Host header",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
            bad,
            "Invalid Host header",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: evil.example/x\r\n\r\n",
            bad,
            "Invalid Host header",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: user@a\r\n\r\n",
            bad,
            "Invalid Host header",
        ),
        // §5.1: whitespace between a field name and its colon.
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length : 3\r\n\r\nabc",
            bad,
            "Malformed request line or headers",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding\t: chunked\r\n\r\n",
            bad,
            "Malformed request line or headers",
        ),
        // §5.2: obsolete line folding (a field value continued on the next line).
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip,\r\n chunked\r\n\r\n",
            bad,
            "Malformed request line or headers",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n\tX-B: 2\r\n\r\n",
            bad,
            "Malformed request line or headers",
        ),
        // §2.2: whitespace before the first field, bare CR, a split request line.
        (
            b"GET / HTTP/1.1\r\n Host: h\r\n\r\n",
            bad,
            "Malformed request line or headers",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: h\rX-A: 1\r\n\r\n",
            bad,
            "Malformed request line or headers",
        ),
        (
            b"GET  / HTTP/1.1\r\nHost: h\r\n\r\n",
            bad,
            "Malformed request line or headers",
        ),
        (
            b"GET / HTTP/1.1 \r\nHost: h\r\n\r\n",
            bad,
            "Malformed request line or headers",
        ),
        (
            b"GET / HTTP/1.1\r\n: empty-name\r\nHost: h\r\n\r\n",
            bad,
            "Malformed request line or headers",
        ),
    ];
    for (head, status, message) in cases {
        let e = error(head);
        assert_eq!(
            (e.status, e.message),
            (*status, *message),
            "{}",
            String::from_utf8_lossy(head)
        );
    }
}

#[test]
fn host_rules() {
    // HTTP/1.0 without Host stays accepted; HTTP/1.1 with one Host (any valid form).
    assert_eq!(complete(b"GET / HTTP/1.0\r\n\r\n").minor_version, 0);
    for host in [
        &b"a"[..],
        b"127.0.0.1:8000",
        b"[::1]:8000",
        b"my-host.example.com",
        b"",
        b"xn--bcher-kva.example",
    ] {
        let mut req = b"GET / HTTP/1.1\r\nHost: ".to_vec();
        req.extend_from_slice(host);
        req.extend_from_slice(b"\r\n\r\n");
        let h = complete(&req);
        assert_eq!(h.minor_version, 1, "{host:?}");
    }
    // The absolute form still needs its Host (RFC 9112 §3.2).
    let h = complete(b"GET http://a/health HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(h.path, b"/health");
}

#[test]
fn transfer_encoding_lists() {
    // Codings spread over fields and empty list elements: what counts is the final one.
    let h = complete(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: ,chunked,\r\n\r\n");
    assert_eq!(h.framing, Framing::Chunked);
    let h = complete(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: CHUNKED\r\n\r\n");
    assert_eq!(h.framing, Framing::Chunked);
    // A repeated identical Content-Length is one length (RFC 9112 §6.3).
    let h =
        complete(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 007\r\nContent-Length: 7\r\n\r\n");
    assert_eq!(h.framing, Framing::Length(7));
}

#[test]
fn limits() {
    let long_uri = format!(
        "GET /{} HTTP/1.1\r\nHost: h\r\n\r\n",
        "a".repeat(MAX_URI_BYTES)
    );
    assert_eq!(error(long_uri.as_bytes()).status, Status::URI_TOO_LONG);
    // An unfinished request line longer than the limit is refused before it ends.
    let endless = format!("GET /{}", "a".repeat(MAX_URI_BYTES + 64));
    assert_eq!(error(endless.as_bytes()).status, Status::URI_TOO_LONG);
    // A head over the limit, complete or still arriving.
    for end in ["\r\n\r\n", ""] {
        let big = format!(
            "GET / HTTP/1.1\r\nHost: h\r\nX-Big: {}{end}",
            "b".repeat(MAX_HEAD_BYTES)
        );
        assert_eq!(error(big.as_bytes()).status, Status::HEADERS_TOO_LARGE);
    }
    let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
    let many = format!("GET / HTTP/1.1\r\nHost: h\r\n{many}\r\n");
    assert_eq!(error(many.as_bytes()).status, Status::HEADERS_TOO_LARGE);
    assert!(matches!(
        parse_head(b"GET / HTTP/1.1\r\nHost: a"),
        Parsed::Partial
    ));
}

#[test]
fn malformed_heads() {
    for bad in [
        &b"GARBAGE\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: h\r\nBad Header\r\n\r\n",
        b"GET / HTTP/3.0\r\n\r\n",
        b"GET foo HTTP/1.1\r\nHost: h\r\n\r\n",
        b"\x00\x01\x02\r\n\r\n",
    ] {
        assert_eq!(error(bad).status, Status::BAD_REQUEST, "{bad:?}");
    }
    assert_eq!(
        error(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").status,
        Status::HTTP_VERSION_NOT_SUPPORTED
    );
    assert_eq!(
        error(b"PUT / HTTP/1.1\r\nHost: h\r\nExpect: magic\r\n\r\n").status,
        Status::EXPECTATION_FAILED
    );
}

#[test]
fn target_forms() {
    let h = complete(b"GET http://example.com/health?x=1 HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_eq!((h.path, h.query), (&b"/health"[..], &b"x=1"[..]));
    let h = complete(b"GET http://example.com HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_eq!(h.path, b"/");
    let h = complete(b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_eq!(h.path, b"*");
    let h = complete(b"GET /a#frag HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_eq!(h.path, b"/a");
}

#[test]
fn json_media_types() {
    assert!(is_json_media_type(b"application/json"));
    assert!(is_json_media_type(b"Application/JSON; charset=utf-8"));
    assert!(!is_json_media_type(b"text/plain"));
    assert!(!is_json_media_type(b"application/jsonx"));
}

#[test]
fn the_host_table_admits_exactly_the_host_bytes() {
    for b in 0..=255u8 {
        let admitted = b.is_ascii_alphanumeric() || b"-._~%!$&'()*+,;=:[]".contains(&b);
        assert_eq!(valid_host(&[b]), admitted, "byte {b:#04x}");
    }
}
