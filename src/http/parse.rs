//! Request heads: bytes → [`Head`], with the protocol limits and their statuses.
//!
//! Parsing is sans-I/O: [`parse_head`] looks at the bytes received so far and says "complete",
//! "need more" or "this is an error with that status". The connection loop owns the socket.
//!
//! Framing follows RFC 9112 strictly where a lenient reading would let a proxy in front of us
//! and this server disagree on where a request ends or whom it is for (request smuggling):
//! every refusal below closes the connection after its answer.
//! - `Content-Length` and `Transfer-Encoding` together: 400 (§6.1, §6.3).
//! - `Content-Length` that is not one decimal number, or repeated with different values: 400
//!   (§6.3; a repeat of the same value is accepted, as §6.3 allows).
//! - `Transfer-Encoding` whose last coding is not `chunked`, or that applies `chunked` twice:
//!   400 (§6.1, §7); a coding before the final `chunked` (`gzip, chunked`): 501; any
//!   `Transfer-Encoding` in HTTP/1.0: 400 (§6.1).
//! - HTTP/1.1 without `Host`, more than one `Host`, or a `Host` that is not `host[:port]`: 400
//!   (§3.2). HTTP/1.0 without `Host` is accepted.
//! - Obsolete line folding, whitespace between a field name and its colon, whitespace before
//!   the first field, bare CR, a malformed request line: 400 (§5.1, §5.2, §2.2, httparse's
//!   strict request mode).
//! - Chunked bodies (`super::chunked`): a chunk size that is not 1-15 hex digits, a chunk
//!   line or data not ended by CRLF, control characters in chunk extensions: 400.

use super::response::Status;
use crate::limits::{MAX_HEAD_BYTES, MAX_HEADERS, MAX_URI_BYTES};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Put,
    Post,
    Delete,
    Options,
    /// Any other token (PATCH, TRACE, ...): answered 405 on known paths.
    Other,
}

impl Method {
    fn parse(s: &str) -> Method {
        match s {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "PUT" => Method::Put,
            "POST" => Method::Post,
            "DELETE" => Method::Delete,
            "OPTIONS" => Method::Options,
            _ => Method::Other,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Put => "PUT",
            Method::Post => "POST",
            Method::Delete => "DELETE",
            Method::Options => "OPTIONS",
            Method::Other => "OTHER",
        }
    }
}

/// How the body of a request is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    None,
    Length(u64),
    Chunked,
}

/// A parsed request head. Slices borrow the connection's read buffer.
#[derive(Debug)]
pub struct Head<'b> {
    pub method: Method,
    /// Path without the query, as sent (not percent-decoded: routes are fixed ASCII paths).
    pub path: &'b [u8],
    /// Query string without the `?` (empty when absent).
    pub query: &'b [u8],
    /// HTTP/1.`minor_version`.
    pub minor_version: u8,
    /// Bytes of the head, including the blank line.
    pub len: usize,
    pub framing: Framing,
    /// The connection stays open after this exchange (HTTP/1.1 default; HTTP/1.0 with
    /// `Connection: keep-alive`).
    pub keep_alive: bool,
    pub expect_continue: bool,
    pub request_id: Option<&'b [u8]>,
    pub content_type: Option<&'b [u8]>,
    pub authorization: Option<&'b [u8]>,
    /// The W3C trace context the request came with (read only when tracing is on).
    pub traceparent: Option<&'b [u8]>,
    /// The first `Accept` header (what `/metrics` answers with).
    pub accept: Option<&'b [u8]>,
    /// `X-Mmc-Iov`: where the object's bytes are in the client's memory (honoured on the
    /// same-host Unix socket only, `http::same_host`; ignored on TCP).
    pub same_host_iov: Option<&'b [u8]>,
    /// `X-Mmc-Shared`: buffers the client shares with the server (same-host socket only,
    /// `http::same_host::shared`).
    pub same_host_shared: Option<&'b [u8]>,
    /// `X-Mmc-Map: N`: the client maps segments read-only and is done with the mapped
    /// answers up to lease `N` (same-host socket only, `http::same_host`).
    pub same_host_map: Option<&'b [u8]>,
}

/// A request the server refuses at the protocol level. The connection is closed after the
/// answer unless the request was fully framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProtocolError {
    pub status: Status,
    pub message: &'static str,
}

impl ProtocolError {
    pub const fn new(status: Status, message: &'static str) -> ProtocolError {
        ProtocolError { status, message }
    }
}

const BAD_REQUEST_LINE: ProtocolError =
    ProtocolError::new(Status::BAD_REQUEST, "Malformed request line or headers");
const HEAD_TOO_LARGE: ProtocolError = ProtocolError::new(
    Status::HEADERS_TOO_LARGE,
    "Request header section too large",
);
const URI_TOO_LONG: ProtocolError =
    ProtocolError::new(Status::URI_TOO_LONG, "Request URI too long");

#[derive(Debug)]
pub enum Parsed<'b> {
    Complete(Head<'b>),
    /// More bytes are needed (and the bytes so far are within the limits).
    Partial,
    Error(ProtocolError),
}

/// Longest request line we wait for before deciding the URI is too long: the URI limit plus
/// room for the method and the version.
const REQUEST_LINE_SLACK: usize = 32;

pub fn parse_head(buf: &[u8]) -> Parsed<'_> {
    // Uninitialized slots: httparse fills only as many as the request has, so a small request
    // does not pay for zeroing all of them (2 KiB) on every parse.
    let mut headers =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut headers) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return partial_verdict(buf),
        Err(httparse::Error::TooManyHeaders) => return Parsed::Error(HEAD_TOO_LARGE),
        Err(httparse::Error::Version) if buf.starts_with(b"PRI * HTTP/2") => {
            return Parsed::Error(ProtocolError::new(
                Status::HTTP_VERSION_NOT_SUPPORTED,
                "HTTP/2 is not supported; use HTTP/1.1",
            ));
        }
        Err(_) => return Parsed::Error(BAD_REQUEST_LINE),
    };
    if len > MAX_HEAD_BYTES {
        return Parsed::Error(HEAD_TOO_LARGE);
    }
    let (Some(method), Some(target), Some(minor_version)) = (req.method, req.path, req.version)
    else {
        return Parsed::Error(BAD_REQUEST_LINE);
    };
    if target.len() > MAX_URI_BYTES {
        return Parsed::Error(URI_TOO_LONG);
    }
    let method = Method::parse(method);
    let Some((path, query)) = split_target(target.as_bytes(), method) else {
        return Parsed::Error(ProtocolError::new(
            Status::BAD_REQUEST,
            "Malformed request target",
        ));
    };

    let mut content_length: Option<u64> = None;
    let mut transfer_encoding = TransferCodings::default();
    let mut hosts = 0u32;
    let mut conn_close = false;
    let mut conn_keep_alive = false;
    let mut expect_continue = false;
    let mut request_id = None;
    let mut content_type = None;
    let mut authorization = None;
    let mut traceparent = None;
    let mut accept = None;
    let mut same_host_iov = None;
    let mut same_host_shared = None;
    let mut same_host_map = None;
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        let value = trim(h.value);
        // Header names are matched case-insensitively by their length first (cheap).
        match name.len() {
            14 if name.eq_ignore_ascii_case(b"content-length") => {
                let Some(n) = parse_decimal(value) else {
                    return Parsed::Error(ProtocolError::new(
                        Status::BAD_REQUEST,
                        "Invalid Content-Length",
                    ));
                };
                if content_length.is_some_and(|old| old != n) {
                    return Parsed::Error(ProtocolError::new(
                        Status::BAD_REQUEST,
                        "Conflicting Content-Length headers",
                    ));
                }
                content_length = Some(n);
            }
            17 if name.eq_ignore_ascii_case(b"transfer-encoding") => {
                transfer_encoding.add(value);
            }
            4 if name.eq_ignore_ascii_case(b"host") => {
                hosts += 1;
                if hosts > 1 {
                    return Parsed::Error(ProtocolError::new(
                        Status::BAD_REQUEST,
                        "More than one Host header",
                    ));
                }
                if !valid_host(value) {
                    return Parsed::Error(ProtocolError::new(
                        Status::BAD_REQUEST,
                        "Invalid Host header",
                    ));
                }
            }
            10 if name.eq_ignore_ascii_case(b"connection") => {
                for token in value.split(|&b| b == b',') {
                    let token = trim(token);
                    if token.eq_ignore_ascii_case(b"close") {
                        conn_close = true;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        conn_keep_alive = true;
                    }
                }
            }
            6 if name.eq_ignore_ascii_case(b"expect") => {
                if value.eq_ignore_ascii_case(b"100-continue") {
                    expect_continue = true;
                } else {
                    return Parsed::Error(ProtocolError::new(
                        Status::EXPECTATION_FAILED,
                        "Unsupported Expect value (only 100-continue is accepted)",
                    ));
                }
            }
            12 if name.eq_ignore_ascii_case(b"x-request-id") => request_id = Some(value),
            12 if name.eq_ignore_ascii_case(b"content-type") => content_type = Some(value),
            13 if name.eq_ignore_ascii_case(b"authorization") => authorization = Some(value),
            11 if name.eq_ignore_ascii_case(b"traceparent") => traceparent = Some(value),
            6 if accept.is_none() && name.eq_ignore_ascii_case(b"accept") => accept = Some(value),
            9 if name.eq_ignore_ascii_case(b"x-mmc-iov") => same_host_iov = Some(value),
            12 if name.eq_ignore_ascii_case(b"x-mmc-shared") => same_host_shared = Some(value),
            9 if name.eq_ignore_ascii_case(b"x-mmc-map") => same_host_map = Some(value),
            _ => {}
        }
    }
    if hosts == 0 && minor_version >= 1 {
        return Parsed::Error(ProtocolError::new(
            Status::BAD_REQUEST,
            "Missing Host header (required in HTTP/1.1)",
        ));
    }
    let framing = match (transfer_encoding.present, content_length) {
        // Both headers at once is how request smuggling starts: refuse.
        (true, Some(_)) => {
            return Parsed::Error(ProtocolError::new(
                Status::BAD_REQUEST,
                "Both Transfer-Encoding and Content-Length present",
            ));
        }
        (true, None) if minor_version == 0 => {
            return Parsed::Error(ProtocolError::new(
                Status::BAD_REQUEST,
                "Transfer-Encoding is not defined for HTTP/1.0",
            ));
        }
        (true, None) => match transfer_encoding.verdict() {
            Ok(()) => Framing::Chunked,
            Err(e) => return Parsed::Error(e),
        },
        (false, Some(0)) | (false, None) => Framing::None,
        (false, Some(n)) => Framing::Length(n),
    };
    let keep_alive = if minor_version == 0 {
        conn_keep_alive && !conn_close
    } else {
        !conn_close
    };
    Parsed::Complete(Head {
        method,
        path,
        query,
        minor_version,
        len,
        framing,
        keep_alive,
        expect_continue,
        request_id,
        content_type,
        authorization,
        traceparent,
        accept,
        same_host_iov,
        same_host_shared,
        same_host_map,
    })
}

/// The codings of every `Transfer-Encoding` field of a request, in order (the fields form one
/// comma-separated list, RFC 9110 §5.3).
#[derive(Default)]
struct TransferCodings {
    present: bool,
    /// `chunked` codings seen.
    chunked: u32,
    /// Codings other than `chunked` seen.
    others: u32,
    /// Whether the last coding seen is `chunked`.
    last_is_chunked: bool,
}

impl TransferCodings {
    fn add(&mut self, value: &[u8]) {
        self.present = true;
        // Empty list elements are ignored, as RFC 9110 §5.6.1 asks of recipients.
        for coding in value.split(|&b| b == b',').map(trim) {
            if coding.is_empty() {
                continue;
            }
            let chunked = coding.eq_ignore_ascii_case(b"chunked");
            if chunked {
                self.chunked += 1;
            } else {
                self.others += 1;
            }
            self.last_is_chunked = chunked;
        }
    }

    /// Whether the body can be framed: the codings end with one `chunked` and there is none
    /// other (RFC 9112 §6.1: the final coding must be chunked, else 400; chunked only once).
    fn verdict(&self) -> Result<(), ProtocolError> {
        if !self.last_is_chunked {
            return Err(ProtocolError::new(
                Status::BAD_REQUEST,
                "Transfer-Encoding must end with chunked",
            ));
        }
        if self.chunked > 1 {
            return Err(ProtocolError::new(
                Status::BAD_REQUEST,
                "Transfer-Encoding applies chunked more than once",
            ));
        }
        if self.others > 0 {
            return Err(ProtocolError::new(
                Status::NOT_IMPLEMENTED,
                "Unsupported Transfer-Encoding (only chunked is accepted)",
            ));
        }
        Ok(())
    }
}

/// A `Host` value is `uri-host [ ":" port ]` (RFC 9112 §3.2, RFC 3986 §3.2.2): reg-name,
/// IPv4 or a bracketed IP literal characters only (no whitespace, `/`, `@`, `?`, `#`). An
/// empty value is allowed (a target without an authority).
fn valid_host(v: &[u8]) -> bool {
    v.iter().all(|&b| HOST_BYTES[b as usize])
}

/// The bytes `valid_host` admits, as a table (every request has a `Host`, and its dots and
/// colon would each cost a search of the punctuation list).
const HOST_BYTES: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = (b as u8).is_ascii_alphanumeric();
        b += 1;
    }
    let punct = b"-._~%!$&'()*+,;=:[]";
    let mut i = 0;
    while i < punct.len() {
        t[punct[i] as usize] = true;
        i += 1;
    }
    t
};

/// What an incomplete head means: wait for more, or refuse it now because it is already over
/// a limit (so a client cannot make us buffer an endless request line or header section).
fn partial_verdict(buf: &[u8]) -> Parsed<'_> {
    let line_end = memchr::memchr(b'\n', buf);
    match line_end {
        None if buf.len() > MAX_URI_BYTES + REQUEST_LINE_SLACK => Parsed::Error(URI_TOO_LONG),
        Some(end) if end > MAX_URI_BYTES + REQUEST_LINE_SLACK => Parsed::Error(URI_TOO_LONG),
        _ if buf.len() > MAX_HEAD_BYTES => Parsed::Error(HEAD_TOO_LARGE),
        _ => Parsed::Partial,
    }
}

/// Splits a request target into path and query. Accepts origin form (`/p?q`), absolute form
/// (`http://host/p?q`, which RFC 9112 requires servers to accept) and `*` for OPTIONS.
fn split_target(target: &[u8], method: Method) -> Option<(&[u8], &[u8])> {
    let rest = if target.first() == Some(&b'/') {
        target
    } else if target == b"*" {
        return (method == Method::Options).then_some((target, &b""[..]));
    } else {
        let after_scheme = strip_prefix_ignore_case(target, b"http://")
            .or_else(|| strip_prefix_ignore_case(target, b"https://"))?;
        match memchr::memchr(b'/', after_scheme) {
            Some(i) => &after_scheme[i..],
            None => {
                // `http://host` or `http://host?q`: the path is `/`.
                return match memchr::memchr(b'?', after_scheme) {
                    Some(q) => Some((&b"/"[..], &after_scheme[q + 1..])),
                    None => Some((&b"/"[..], &b""[..])),
                };
            }
        }
    };
    let rest = match memchr::memchr(b'#', rest) {
        Some(i) => &rest[..i],
        None => rest,
    };
    Some(match memchr::memchr(b'?', rest) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &b""[..]),
    })
}

fn strip_prefix_ignore_case<'a>(s: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    (s.len() >= prefix.len() && s[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &s[prefix.len()..])
}

pub fn trim(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// A Content-Length value: 1 to 19 decimal digits, nothing else.
fn parse_decimal(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0u64, |n, &d| n * 10 + (d - b'0') as u64))
}

/// Whether a media type is JSON (`application/json` with any parameters).
pub fn is_json_media_type(ct: &[u8]) -> bool {
    let essence = ct.split(|&b| b == b';').next().unwrap_or(b"");
    trim(essence).eq_ignore_ascii_case(b"application/json")
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
