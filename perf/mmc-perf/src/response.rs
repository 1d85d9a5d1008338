//! Framing responses read from a keep-alive connection: status line, `Content-Length`,
//! `Connection: close`, HEAD and body-less statuses.

/// What the bytes at the start of a buffer hold.
#[derive(Debug, PartialEq, Eq)]
pub enum Framed {
    /// A whole response of `len` bytes (head plus body).
    Complete {
        status: u16,
        len: usize,
        /// Where the body starts (the head's length).
        head_len: usize,
        /// The server will close the connection after this response.
        close: bool,
        /// A 1xx interim response (e.g. `100 Continue`): not the answer to the request.
        interim: bool,
    },
    /// More bytes are needed; `total` is the full length once the head is known.
    Partial { total: Option<usize> },
    /// Not a response we can frame.
    Invalid(&'static str),
}

const MAX_HEADERS: usize = 48;

/// Frames the response at the start of `buf`, for a request that was a HEAD when `head_request`.
pub fn frame(buf: &[u8], head_request: bool) -> Framed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            // A head is never this large from a sane server; refuse instead of buffering on.
            if buf.len() > 64 * 1024 {
                return Framed::Invalid("response head larger than 64 KiB");
            }
            return Framed::Partial { total: None };
        }
        Err(httparse::Error::TooManyHeaders) => return Framed::Invalid("too many headers"),
        Err(_) => return Framed::Invalid("malformed status line or headers"),
    };
    let status = resp.code.unwrap_or(0);
    let minor = resp.version.unwrap_or(1);
    let mut content_length: Option<usize> = None;
    let mut close = minor == 0;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let v = trim(h.value);
            if v.is_empty() || v.len() > 15 || !v.iter().all(u8::is_ascii_digit) {
                return Framed::Invalid("invalid Content-Length");
            }
            let n = v.iter().fold(0usize, |n, &d| n * 10 + (d - b'0') as usize);
            if content_length.is_some_and(|old| old != n) {
                return Framed::Invalid("conflicting Content-Length headers");
            }
            content_length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Framed::Invalid("Transfer-Encoding responses are not supported");
        } else if h.name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|&b| b == b',') {
                let token = trim(token);
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && minor == 0 {
                    close = false;
                }
            }
        }
    }
    let interim = (100..200).contains(&status);
    let body_len = if head_request || interim || status == 204 || status == 304 {
        0
    } else {
        match content_length {
            Some(n) => n,
            None => return Framed::Invalid("response without Content-Length"),
        }
    };
    let len = head_len + body_len;
    if buf.len() < len {
        return Framed::Partial { total: Some(len) };
    }
    Framed::Complete {
        status,
        len,
        head_len,
        close,
        interim,
    }
}

/// The start of the body of a failed business answer of mmc-server (HTTP 200 with
/// `{"success":false,...}`).
pub const BUSINESS_FAILURE: &[u8] = b"{\"success\":false";

/// Whether a response body is a business failure of mmc-server: it starts with
/// [`BUSINESS_FAILURE`], or (a batch answer) holds it for one of its items.
pub fn business_failure(body: &[u8]) -> bool {
    body.starts_with(BUSINESS_FAILURE)
        || (body.starts_with(b"{\"success\":true,\"results\":")
            && memchr::memmem::find(body, b"\"success\":false").is_some())
}

fn trim(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &[u8] =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nX-Request-ID: a\r\n\r\nhello";

    #[test]
    fn complete_partial_and_pipelined() {
        assert_eq!(
            frame(OK, false),
            Framed::Complete {
                status: 200,
                len: OK.len(),
                head_len: OK.len() - 5,
                close: false,
                interim: false
            }
        );
        // Every strict prefix is partial; once the head is in, the total is known.
        for cut in 0..OK.len() {
            match frame(&OK[..cut], false) {
                Framed::Partial { total } => {
                    if cut >= OK.len() - 5 {
                        assert_eq!(total, Some(OK.len()), "cut {cut}");
                    }
                }
                other => panic!("cut {cut}: {other:?}"),
            }
        }
        // Two pipelined responses: the first is framed alone.
        let two = [OK, OK].concat();
        assert!(matches!(frame(&two, false), Framed::Complete { len, .. } if len == OK.len()));
    }

    #[test]
    fn head_and_bodyless_statuses() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n";
        assert!(matches!(
            frame(head, true),
            Framed::Complete { status: 200, len, .. } if len == head.len()
        ));
        assert!(matches!(
            frame(head, false),
            Framed::Partial { total: Some(_) }
        ));
        let no_content = b"HTTP/1.1 204 No Content\r\nAllow: GET\r\n\r\n";
        assert!(matches!(
            frame(no_content, false),
            Framed::Complete { status: 204, .. }
        ));
        let cont = b"HTTP/1.1 100 Continue\r\n\r\n";
        assert!(matches!(
            frame(cont, false),
            Framed::Complete {
                status: 100,
                interim: true,
                ..
            }
        ));
    }

    #[test]
    fn business_failures() {
        assert!(business_failure(
            br#"{"success":false,"error_message":"Duplicated object: key already exists","timestamp":1}"#
        ));
        assert!(!business_failure(br#"{"success":true,"key":"k","size":3}"#));
        assert!(business_failure(
            br#"{"success":true,"results":[{"key":"A","success":true,"size":3},{"key":"B","success":false,"error_message":"x"}]}"#
        ));
        assert!(!business_failure(
            br#"{"success":true,"results":[{"key":"A","success":true,"size":3}]}"#
        ));
        assert!(!business_failure(b"raw object bytes {\"success\":false"));
        assert!(!business_failure(b""));
    }

    #[test]
    fn close_rules() {
        let r =
            b"HTTP/1.1 413 Payload Too Large\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}";
        assert!(matches!(
            frame(r, false),
            Framed::Complete {
                status: 413,
                close: true,
                ..
            }
        ));
        let r10 = b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n";
        assert!(matches!(
            frame(r10, false),
            Framed::Complete { close: true, .. }
        ));
        let r10ka = b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n";
        assert!(matches!(
            frame(r10ka, false),
            Framed::Complete { close: false, .. }
        ));
    }

    #[test]
    fn refuses_what_it_cannot_frame() {
        for bad in [
            &b"HTTP/1.1 200 OK\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"SSH-2.0-OpenSSH\r\n\r\n",
        ] {
            assert!(
                matches!(frame(bad, false), Framed::Invalid(_)),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let endless = [&b"HTTP/1.1 200 OK\r\nX-Big: "[..], &[b'a'; 70 * 1024]].concat();
        assert!(matches!(frame(&endless, false), Framed::Invalid(_)));
        assert!(matches!(
            frame(&endless[..1024], false),
            Framed::Partial { total: None }
        ));
    }
}
