//! Request framing on the wire (issue 10): the RFC 9112 rules a proxy in front of the server
//! relies on to agree with it on where a request ends and whom it is for. Every refused
//! request is answered once, the connection is closed, and nothing it carried (nor a request
//! smuggled behind it) is executed.

use std::time::Duration;

use crate::both_drivers;
use crate::harness::{Driver, Server};

both_drivers!(
    host_is_required_once_in_http_1_1,
    smuggling_shapes_are_refused_and_nothing_behind_them_runs,
);

fn host_is_required_once_in_http_1_1(driver: Driver) {
    let srv = Server::start(driver);
    // HTTP/1.1 without Host: 400, closed, the pipelined request behind it is not answered.
    let mut c = srv.client();
    c.send(b"GET /health HTTP/1.1\r\n\r\nGET /health HTTP/1.1\r\nHost: t\r\n\r\n");
    let r = c.read_response(false);
    r.assert_error(400, "Missing Host header (required in HTTP/1.1)");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.closed_within(Duration::from_secs(5)));
    // Two Host headers, equal or not: 400.
    for hosts in ["Host: a\r\nHost: b\r\n", "Host: a\r\nhost: a\r\n"] {
        let mut c = srv.client();
        c.send(format!("GET /health HTTP/1.1\r\n{hosts}\r\n").as_bytes());
        c.read_response(false)
            .assert_error(400, "More than one Host header");
        assert!(c.closed_within(Duration::from_secs(5)));
    }
    // A Host that is not host[:port].
    let mut c = srv.client();
    c.send(b"GET /health HTTP/1.1\r\nHost: a/b\r\n\r\n");
    c.read_response(false)
        .assert_error(400, "Invalid Host header");
    // HTTP/1.0 without Host stays accepted; HTTP/1.1 with one Host (an absolute-form target
    // too) is served.
    let mut c = srv.client();
    c.send(b"GET /health HTTP/1.0\r\n\r\n");
    assert_eq!(c.read_response(false).status, 200);
    let mut c = srv.client();
    c.send(b"GET http://t/role HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(c.read_response(false).text(), "leader");
    c.send(b"GET /role HTTP/1.1\r\nHost: [::1]:8000\r\n\r\n");
    assert_eq!(c.read_response(false).text(), "leader");
}

/// One case per smuggling-relevant rule of RFC 9112 §6 (and §3.2, §5, §7.1 that feed it).
/// Each request is a metadata put (`carrier-N`) with a second put (`smuggled-N`) in or behind
/// its body, where a lenient reading of the framing would find a request.
fn smuggling_shapes_are_refused_and_nothing_behind_them_runs(driver: Driver) {
    let srv = Server::start(driver);
    let bad = "Malformed request line or headers";
    let chunked = "Malformed chunked body";
    let cases: &[(&str, u16, &str)] = &[
        // §6.1, §6.3: Content-Length with Transfer-Encoding, either order.
        (
            "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{S}",
            400,
            "Both Transfer-Encoding and Content-Length present",
        ),
        (
            "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n{S}",
            400,
            "Both Transfer-Encoding and Content-Length present",
        ),
        // §6.3: differing duplicate Content-Length; invalid values.
        (
            "Content-Length: 1\r\nContent-Length: 2\r\n\r\nx{S}",
            400,
            "Conflicting Content-Length headers",
        ),
        (
            "Content-Length: 1, 2\r\n\r\nx{S}",
            400,
            "Invalid Content-Length",
        ),
        (
            "Content-Length: +1\r\n\r\nx{S}",
            400,
            "Invalid Content-Length",
        ),
        (
            "Content-Length: 0x1\r\n\r\nx{S}",
            400,
            "Invalid Content-Length",
        ),
        // §6.1: the final coding must be chunked, chunked only once, HTTP/1.0 has none.
        (
            "Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n{S}",
            400,
            "Transfer-Encoding must end with chunked",
        ),
        (
            "Transfer-Encoding: gzip\r\n\r\n0\r\n\r\n{S}",
            400,
            "Transfer-Encoding must end with chunked",
        ),
        (
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{S}",
            400,
            "Transfer-Encoding applies chunked more than once",
        ),
        (
            "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n{S}",
            501,
            "Unsupported Transfer-Encoding (only chunked is accepted)",
        ),
        // §5.1, §5.2: whitespace before the colon, obsolete line folding.
        (
            "Content-Length: 1\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n{S}",
            400,
            bad,
        ),
        (
            "Transfer-Encoding: identity,\r\n chunked\r\n\r\n0\r\n\r\n{S}",
            400,
            bad,
        ),
        // §7.1: chunk sizes and chunk lines a lenient parser would read differently.
        (
            "Transfer-Encoding: chunked\r\n\r\n0x1\r\nx\r\n0\r\n\r\n{S}",
            400,
            chunked,
        ),
        (
            "Transfer-Encoding: chunked\r\n\r\n-1\r\nx\r\n0\r\n\r\n{S}",
            400,
            chunked,
        ),
        (
            "Transfer-Encoding: chunked\r\n\r\n1;a\rb\r\nx\r\n0\r\n\r\n{S}",
            400,
            chunked,
        ),
        (
            "Transfer-Encoding: chunked\r\n\r\n1\nx\n0\n\n{S}",
            400,
            chunked,
        ),
        (
            "Transfer-Encoding: chunked\r\n\r\n1\r\nxy\r\n0\r\n\r\n{S}",
            400,
            chunked,
        ),
        (
            "Transfer-Encoding: chunked\r\n\r\n10000000000000000\r\n{S}",
            400,
            chunked,
        ),
    ];
    for (i, (rest, status, message)) in cases.iter().enumerate() {
        let smuggled = format!(
            "PUT /metadata?key=smuggled-{i} HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nS"
        );
        let wire = format!(
            "PUT /metadata?key=carrier-{i} HTTP/1.1\r\nHost: t\r\n{}",
            rest.replace("{S}", &smuggled)
        );
        let mut c = srv.client();
        c.send(wire.as_bytes());
        let r = c.read_response(false);
        r.assert_error(*status, message);
        assert_eq!(r.header("connection"), Some("close"), "case {i}");
        assert!(
            c.closed_within(Duration::from_secs(5)),
            "case {i}: the connection stays open"
        );
    }
    // Missing and doubled Host, with a request behind them.
    for (i, hosts) in ["", "Host: a\r\nHost: b\r\n"].iter().enumerate() {
        let i = cases.len() + i;
        let mut c = srv.client();
        c.send(
            format!(
                "PUT /metadata?key=carrier-{i} HTTP/1.1\r\n{hosts}Content-Length: 1\r\n\r\nx\
                 PUT /metadata?key=smuggled-{i} HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nS"
            )
            .as_bytes(),
        );
        assert_eq!(c.read_response(false).status, 400, "case {i}");
        assert!(c.closed_within(Duration::from_secs(5)), "case {i}");
    }
    // Nothing was stored, by the refused requests or behind them.
    let mut c = srv.client();
    for i in 0..cases.len() + 2 {
        for key in [format!("carrier-{i}"), format!("smuggled-{i}")] {
            c.get(&format!("/metadata?key={key}"))
                .assert_error(200, "Metadata key not found");
        }
    }
    // A well-framed chunked put on the same server works (the cases above are not refused
    // for some other reason).
    c.send(b"PUT /metadata?key=ok HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n2;e=\"a b\"\r\nok\r\n0\r\n\r\n");
    assert_eq!(c.read_response(false).text(), "metadata updated");
    assert_eq!(c.get("/metadata?key=ok").text(), "ok");
}
