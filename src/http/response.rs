//! Responses: status, headers and body, encoded straight into the connection's write buffer.

use bytes::Bytes;

use super::json::JsonWriter;
use crate::common::error_kind::ErrorKind;
use crate::shards::PinnedBlob;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status(pub u16);

impl Status {
    pub const CONTINUE: Status = Status(100);
    pub const OK: Status = Status(200);
    pub const NO_CONTENT: Status = Status(204);
    pub const FOUND: Status = Status(302);
    pub const TEMPORARY_REDIRECT: Status = Status(307);
    pub const BAD_REQUEST: Status = Status(400);
    pub const UNAUTHORIZED: Status = Status(401);
    pub const FORBIDDEN: Status = Status(403);
    pub const NOT_FOUND: Status = Status(404);
    pub const CONFLICT: Status = Status(409);
    pub const METHOD_NOT_ALLOWED: Status = Status(405);
    pub const REQUEST_TIMEOUT: Status = Status(408);
    pub const PAYLOAD_TOO_LARGE: Status = Status(413);
    pub const URI_TOO_LONG: Status = Status(414);
    pub const UNSUPPORTED_MEDIA_TYPE: Status = Status(415);
    pub const EXPECTATION_FAILED: Status = Status(417);
    pub const TOO_MANY_REQUESTS: Status = Status(429);
    pub const HEADERS_TOO_LARGE: Status = Status(431);
    pub const INTERNAL: Status = Status(500);
    pub const NOT_IMPLEMENTED: Status = Status(501);
    pub const BAD_GATEWAY: Status = Status(502);
    pub const SERVICE_UNAVAILABLE: Status = Status(503);
    pub const HTTP_VERSION_NOT_SUPPORTED: Status = Status(505);

    /// The status line, ready to copy.
    pub fn line(self) -> &'static [u8] {
        match self.0 {
            100 => b"HTTP/1.1 100 Continue\r\n",
            200 => b"HTTP/1.1 200 OK\r\n",
            204 => b"HTTP/1.1 204 No Content\r\n",
            302 => b"HTTP/1.1 302 Found\r\n",
            307 => b"HTTP/1.1 307 Temporary Redirect\r\n",
            400 => b"HTTP/1.1 400 Bad Request\r\n",
            401 => b"HTTP/1.1 401 Unauthorized\r\n",
            403 => b"HTTP/1.1 403 Forbidden\r\n",
            404 => b"HTTP/1.1 404 Not Found\r\n",
            405 => b"HTTP/1.1 405 Method Not Allowed\r\n",
            409 => b"HTTP/1.1 409 Conflict\r\n",
            408 => b"HTTP/1.1 408 Request Timeout\r\n",
            413 => b"HTTP/1.1 413 Content Too Large\r\n",
            414 => b"HTTP/1.1 414 URI Too Long\r\n",
            415 => b"HTTP/1.1 415 Unsupported Media Type\r\n",
            417 => b"HTTP/1.1 417 Expectation Failed\r\n",
            429 => b"HTTP/1.1 429 Too Many Requests\r\n",
            431 => b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
            501 => b"HTTP/1.1 501 Not Implemented\r\n",
            502 => b"HTTP/1.1 502 Bad Gateway\r\n",
            503 => b"HTTP/1.1 503 Service Unavailable\r\n",
            505 => b"HTTP/1.1 505 HTTP Version Not Supported\r\n",
            _ => b"HTTP/1.1 500 Internal Server Error\r\n",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentType {
    Json,
    Text,
    Prometheus,
    /// The Prometheus protobuf exposition (delimited `MetricFamily` messages).
    PrometheusProtobuf,
    OctetStream,
    Html,
}

impl ContentType {
    pub fn header(self) -> &'static [u8] {
        match self {
            ContentType::Json => b"Content-Type: application/json; charset=utf-8\r\n",
            ContentType::Text => b"Content-Type: text/plain; charset=utf-8\r\n",
            ContentType::Prometheus => b"Content-Type: text/plain; version=0.0.4\r\n",
            ContentType::PrometheusProtobuf => {
                b"Content-Type: application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited\r\n"
            }
            ContentType::OctetStream => b"Content-Type: application/octet-stream\r\n",
            ContentType::Html => b"Content-Type: text/html; charset=utf-8\r\n",
        }
    }
}

#[derive(Debug)]
pub enum Body {
    Empty,
    Static(&'static [u8]),
    /// Shared bytes (a stored value), written without copying when large.
    Bytes(Bytes),
    /// The body was written into the connection's scratch buffer.
    Scratch,
    /// The same, written to the socket from there after the head (one vectored write of
    /// both, no copy): what the connection makes of a large [`Body::Scratch`] on a plain
    /// socket.
    ScratchInPlace,
    /// A sequence of parts (framing bytes and pinned blobs), written one after the other;
    /// blobs in host memory go to the socket without a copy.
    Parts(Vec<Part>),
    /// `/get_all_keys`: streamed page by page with chunked transfer encoding, because its
    /// length is not known until every shard has been listed.
    KeyStream(KeyListing),
    /// The answer to a HEAD request whose GET body would be this long: the length is sent,
    /// no body is (HEAD answers never carry one).
    Omitted(u64),
}

#[derive(Debug)]
pub enum Part {
    Bytes(Bytes),
    Blob(PinnedBlob),
}

impl Part {
    pub fn len(&self) -> usize {
        match self {
            Part::Bytes(b) => b.len(),
            Part::Blob(p) => p.view.len as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What `/get_all_keys` lists.
#[derive(Debug, Clone)]
pub struct KeyListing {
    pub prefix: Box<[u8]>,
    pub limit: u64,
}

/// What the connection writes after the head: nothing more, parts, a key stream, or the
/// scratch buffer.
#[derive(Debug)]
pub enum Tail {
    Parts(Vec<Part>),
    KeyStream(KeyListing),
    /// The body is in the scratch buffer ([`Body::ScratchInPlace`]).
    Scratch,
}

#[derive(Debug)]
pub struct Response {
    pub status: Status,
    pub content_type: Option<ContentType>,
    pub body: Body,
    /// `Allow` header (405 and OPTIONS).
    pub allow: Option<&'static str>,
    /// `Retry-After` seconds (429, 503).
    pub retry_after_secs: Option<u32>,
    /// `WWW-Authenticate: ` [`crate::http::auth::CHALLENGE`] (401).
    pub www_authenticate: bool,
    /// `Location` (a standby's 307 to the leader); with [`SameHost::Mapped`], the value of
    /// `X-Mmc-Mapped` instead (a same-host get's answer has no `Location`).
    pub location: Option<Box<str>>,
    /// `Cache-Control: no-store`: on every dynamic response.
    pub no_store: bool,
    /// Close the connection after this response.
    pub close: bool,
    /// The body is the error envelope (for tracepoints: a bad end).
    pub failed: bool,
    /// `X-MMC-Error-Code`: the kind of an error envelope (every one has it).
    pub error_kind: Option<ErrorKind>,
    /// The data-plane bytes of this body, recorded in the client bandwidth metrics once the
    /// connection has sent them (their transfer time is the sending).
    pub transfer: Option<Box<Transfer>>,
    /// What the same-host data path (`http::same_host`) adds to the answer.
    pub same_host: SameHost,
}

/// A same-host header (one byte: a `Response` travels by value and stays small).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SameHost {
    No,
    /// `X-Mmc-Same-Host: ID PATH` and, with a socket per shard, `X-Mmc-Same-Host-Shards`
    /// (`/health`, when the socket is on: [`Envelope`] has them).
    Advert,
    /// The body ([`Body::Omitted`], its length) was copied into the client's memory:
    /// `Content-Length: 0` and `X-Mmc-Delivered: LENGTH`.
    Delivered,
    /// The body ([`Body::Omitted`], its length) stays where it is, pinned, for the client to
    /// copy from its read-only mapping of the segment: `Content-Length: 0` and
    /// `X-Mmc-Mapped: LEASE FD:INO:OFFSET:LENGTH[,…]` (the text in `Response::location`).
    Mapped,
}

/// A data-plane body on its way out: recorded in the client bandwidth metrics when sent.
#[derive(Debug)]
pub struct Transfer {
    pub rank: u32,
    pub op: crate::metrics::client::ClientOp,
    /// The body's blobs may come from several ranks (a `batch_get`): each `Part::Blob`'s bytes
    /// are booked to its own rank, and `rank` and `bytes` are not used. Bytes in other parts
    /// (copies a meta fetched from remote ranks) are not booked here: the local services that
    /// served them book them.
    pub per_blob: bool,
    /// The object bytes in the body (framing bytes excluded).
    pub bytes: u64,
    /// When the handler started: the operation's latency ends when the body is sent.
    pub started: std::time::Instant,
}

impl Response {
    pub fn new(status: Status, content_type: ContentType, body: Body) -> Response {
        Response {
            status,
            content_type: Some(content_type),
            body,
            allow: None,
            retry_after_secs: None,
            www_authenticate: false,
            location: None,
            no_store: true,
            close: false,
            failed: false,
            error_kind: None,
            transfer: None,
            same_host: SameHost::No,
        }
    }

    pub fn text(body: &'static str) -> Response {
        Response::new(Status::OK, ContentType::Text, Body::Static(body.as_bytes()))
    }

    /// A JSON body already written into the scratch buffer.
    pub fn json_scratch(status: Status) -> Response {
        Response::new(status, ContentType::Json, Body::Scratch)
    }

    /// The contract's error envelope, `{"success":false,"error_message":…,"timestamp":…}`,
    /// written into `scratch`, with `kind` in `X-MMC-Error-Code`. Business errors use status
    /// 200; protocol errors their own.
    pub fn error(
        status: Status,
        kind: ErrorKind,
        message: &str,
        unix_secs: u64,
        scratch: &mut Vec<u8>,
    ) -> Response {
        scratch.clear();
        let mut w = JsonWriter::new(scratch);
        w.begin_object();
        w.field_bool("success", false);
        w.field_str("error_message", message.as_bytes());
        w.field_u64("timestamp", unix_secs);
        w.end_object();
        let mut r = Response::json_scratch(status);
        r.failed = true;
        r.error_kind = Some(kind);
        r
    }

    /// The body length, or `None` for a streamed body.
    pub fn body_len(&self, scratch: &[u8]) -> Option<usize> {
        Some(match &self.body {
            Body::Empty => 0,
            Body::Static(s) => s.len(),
            Body::Bytes(b) => b.len(),
            Body::Scratch | Body::ScratchInPlace => scratch.len(),
            Body::Parts(parts) => parts.iter().map(Part::len).sum(),
            Body::KeyStream(_) => return None,
            Body::Omitted(n) => *n as usize,
        })
    }
}

/// Per-response facts that come from the request and the connection, not the handler.
pub struct Envelope<'a> {
    pub request_id: &'a [u8],
    /// Date header value (IMF-fixdate), refreshed by the shard tick.
    pub date: &'a [u8],
    pub head_only: bool,
    /// The client spoke HTTP/1.0 and asked for keep-alive: say so explicitly.
    pub http10_keep_alive: bool,
    /// The client spoke HTTP/1.0 (no chunked responses).
    pub http10: bool,
    /// The same-host header lines, CRLF-ended ([`SameHost::Advert`]), when the socket is on.
    pub same_host_advert: Option<&'a str>,
}

/// Bodies at least this large are written from their own buffer instead of being copied into
/// the write buffer.
pub const SEPARATE_BODY_BYTES: usize = 64 * 1024;

/// A body in the scratch buffer at least this large (a scrape) goes to a plain socket from
/// there, in one vectored write with its head ([`Body::ScratchInPlace`]).
pub const SCRATCH_IN_PLACE_BYTES: usize = 16 * 1024;

/// Encodes the status line and headers, and the body when it is small; a large body, blobs
/// and streams are returned for the caller to write after the head.
pub fn encode(
    resp: Response,
    env: &Envelope<'_>,
    scratch: &[u8],
    out: &mut Vec<u8>,
) -> Option<Tail> {
    let mut body_len = resp.body_len(scratch);
    // A body copied into a same-host client's memory: no byte of it on the socket.
    let delivered = (resp.same_host == SameHost::Delivered).then(|| body_len.unwrap_or(0));
    let mapped = (resp.same_host == SameHost::Mapped)
        .then_some(resp.location.as_deref())
        .flatten();
    if mapped.is_some() {
        body_len = Some(0);
    }
    if delivered.is_some() {
        body_len = Some(0);
    }
    out.extend_from_slice(resp.status.line());
    if let Some(ct) = resp.content_type {
        out.extend_from_slice(ct.header());
    }
    match body_len {
        Some(n) => {
            out.extend_from_slice(b"Content-Length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        // HTTP/1.0 has no chunked encoding: the end of the body is the end of the connection
        // (the caller closes it).
        None if env.http10 => {}
        None => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"X-Request-ID: ");
    out.extend_from_slice(env.request_id);
    out.extend_from_slice(b"\r\n");
    if resp.no_store {
        out.extend_from_slice(b"Cache-Control: no-store\r\n");
    }
    out.extend_from_slice(b"Date: ");
    out.extend_from_slice(env.date);
    out.extend_from_slice(b"\r\n");
    if let Some(allow) = resp.allow {
        out.extend_from_slice(b"Allow: ");
        out.extend_from_slice(allow.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(secs) = resp.retry_after_secs {
        out.extend_from_slice(b"Retry-After: ");
        out.extend_from_slice(itoa::Buffer::new().format(secs).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(text) = mapped {
        out.extend_from_slice(b"X-Mmc-Mapped: ");
        out.extend_from_slice(text.as_bytes());
        out.extend_from_slice(b"\r\n");
    } else if let Some(location) = &resp.location {
        out.extend_from_slice(b"Location: ");
        out.extend_from_slice(location.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(kind) = resp.error_kind {
        out.extend_from_slice(b"X-MMC-Error-Code: ");
        out.extend_from_slice(kind.name().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let (SameHost::Advert, Some(advert)) = (resp.same_host, env.same_host_advert) {
        out.extend_from_slice(advert.as_bytes());
    }
    if let Some(n) = delivered {
        out.extend_from_slice(b"X-Mmc-Delivered: ");
        out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if resp.www_authenticate {
        out.extend_from_slice(b"WWW-Authenticate: ");
        out.extend_from_slice(crate::http::auth::CHALLENGE.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if resp.close {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if env.http10_keep_alive {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if env.head_only || delivered.is_some() || mapped.is_some() {
        return None;
    }
    match resp.body {
        Body::Empty => None,
        Body::Static(s) => {
            out.extend_from_slice(s);
            None
        }
        Body::Scratch => {
            out.extend_from_slice(scratch);
            None
        }
        Body::ScratchInPlace => Some(Tail::Scratch),
        Body::Bytes(b) if b.len() >= SEPARATE_BODY_BYTES => Some(Tail::Parts(vec![Part::Bytes(b)])),
        Body::Bytes(b) => {
            out.extend_from_slice(&b);
            None
        }
        Body::Parts(parts) => {
            // Small parts are copied into the head's buffer (one write); large ones are sent
            // from where they are.
            let mut rest = Vec::new();
            for part in parts {
                if !rest.is_empty() || part.len() >= SEPARATE_BODY_BYTES || !copy_part(&part, out) {
                    rest.push(part);
                }
            }
            (!rest.is_empty()).then_some(Tail::Parts(rest))
        }
        Body::KeyStream(k) => Some(Tail::KeyStream(k)),
        Body::Omitted(_) => {
            debug_assert!(false, "an omitted body answers only HEAD requests");
            None
        }
    }
}

/// Appends a small part to `out`; false when it cannot be read here (then it is written as
/// its own part).
fn copy_part(part: &Part, out: &mut Vec<u8>) -> bool {
    match part {
        Part::Bytes(b) => {
            out.extend_from_slice(b);
            true
        }
        Part::Blob(p) => {
            let len = p.view.len as usize;
            let start = out.len();
            out.resize(start + len, 0);
            // SAFETY: the blob is pinned (readable, nobody writes it) while `p` lives.
            let res = unsafe { p.view.seg.backend.read(p.view.offset, &mut out[start..]) };
            if res.is_err() {
                out.truncate(start);
                return false;
            }
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_envelope_bytes() {
        let mut scratch = Vec::new();
        let r = Response::error(
            Status::OK,
            ErrorKind::InvalidParam,
            "Missing 'key' parameter",
            1_700_000_000,
            &mut scratch,
        );
        let env = Envelope {
            request_id: b"abc",
            date: b"Sun, 29 Nov 2026 17:51:12 GMT",
            head_only: false,
            http10_keep_alive: false,
            http10: false,
            same_host_advert: None,
        };
        let mut out = Vec::new();
        assert!(encode(r, &env, &scratch, &mut out).is_none());
        let body =
            r#"{"success":false,"error_message":"Missing 'key' parameter","timestamp":1700000000}"#;
        let expected = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n\
             Content-Length: {}\r\nX-Request-ID: abc\r\nCache-Control: no-store\r\n\
             Date: Sun, 29 Nov 2026 17:51:12 GMT\r\nX-MMC-Error-Code: invalid_param\r\n\r\n{body}",
            body.len()
        );
        assert_eq!(String::from_utf8(out).unwrap(), expected);
    }

    #[test]
    fn head_requests_keep_the_length_and_drop_the_body() {
        let env = Envelope {
            request_id: b"r",
            date: b"d",
            head_only: true,
            http10_keep_alive: true,
            http10: true,
            same_host_advert: None,
        };
        let mut out = Vec::new();
        encode(Response::text("ok"), &env, &[], &mut out);
        let s = String::from_utf8(out).unwrap();
        assert!(s.contains("Content-Length: 2\r\n"), "{s}");
        assert!(s.contains("Connection: keep-alive\r\n"), "{s}");
        assert!(s.ends_with("\r\n\r\n"), "{s}");
    }

    #[test]
    fn same_host_answers_say_what_was_delivered_and_where_the_socket_is() {
        let env = Envelope {
            request_id: b"r",
            date: b"d",
            head_only: false,
            http10_keep_alive: false,
            http10: false,
            same_host_advert: Some("X-Mmc-Same-Host: 0000abcd-42 /run/x.sock\r\n"),
        };
        let mut r = Response::new(Status::OK, ContentType::OctetStream, Body::Omitted(1 << 20));
        r.same_host = SameHost::Delivered;
        let mut out = Vec::new();
        assert!(encode(r, &env, &[], &mut out).is_none(), "no body follows");
        let s = String::from_utf8(out).unwrap();
        assert!(s.contains("Content-Length: 0\r\n"), "{s}");
        assert!(s.contains("X-Mmc-Delivered: 1048576\r\n"), "{s}");
        assert!(!s.contains("X-Mmc-Same-Host"), "{s}");
        assert!(s.ends_with("\r\n\r\n"), "{s}");
        let mut r = Response::text("ok");
        r.same_host = SameHost::Advert;
        let mut out = Vec::new();
        encode(r, &env, &[], &mut out);
        let s = String::from_utf8(out).unwrap();
        assert!(
            s.contains("X-Mmc-Same-Host: 0000abcd-42 /run/x.sock\r\n"),
            "{s}"
        );
        assert!(s.ends_with("\r\n\r\nok"), "{s}");
        // Without the socket, /health says nothing of it.
        let mut r = Response::text("ok");
        r.same_host = SameHost::Advert;
        let mut out = Vec::new();
        let env = Envelope {
            same_host_advert: None,
            ..env
        };
        encode(r, &env, &[], &mut out);
        assert!(!String::from_utf8(out).unwrap().contains("X-Mmc"));
    }
}
