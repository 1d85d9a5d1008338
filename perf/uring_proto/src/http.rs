//! The request side shared by every variant: httparse over whatever the socket gave, one
//! fixed answer per complete request, appended to the connection's output buffer.

/// The body of the fixed `GET /metadata` answer: JSON of the size of a catalog entry.
pub const BODY: &[u8] = br#"{"key":"bench","size":16,"blobs":[{"rank":0,"medium":"dram","addr":140737488355328,"size":16}],"lease_ms":0,"ttl_ms":0,"version":1}"#;

/// `GET /metadata…` → 200 with [`BODY`]; anything else → 404.
pub struct Answers {
    ok: Vec<u8>,
    not_found: Vec<u8>,
}

impl Default for Answers {
    fn default() -> Self {
        Self::new()
    }
}

impl Answers {
    pub fn new() -> Self {
        let mut ok = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            BODY.len()
        )
        .into_bytes();
        ok.extend_from_slice(BODY);
        let not_found =
            b"HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\ncontent-length: 10\r\n\r\nnot found\n"
                .to_vec();
        Self { ok, not_found }
    }
}

/// The request framing failed: the connection is to be closed.
#[derive(Debug)]
pub struct Malformed;

/// Answers every complete request at the start of `buf` (pipelining: all of them), appending
/// the answers to `out`. Returns how many bytes the complete requests took; the rest is the
/// start of a request still arriving.
pub fn serve(answers: &Answers, buf: &[u8], out: &mut Vec<u8>) -> Result<usize, Malformed> {
    let mut at = 0;
    while at < buf.len() {
        let mut headers = [httparse::EMPTY_HEADER; 24];
        let mut req = httparse::Request::new(&mut headers);
        let head = match req.parse(&buf[at..]) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => break,
            Err(_) => return Err(Malformed),
        };
        let mut body = 0usize;
        for h in req.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                body = std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
                    .ok_or(Malformed)?;
            }
        }
        if buf.len() - at - head < body {
            break;
        }
        let hit = req.method == Some("GET")
            && req
                .path
                .is_some_and(|p| p == "/metadata" || p.starts_with("/metadata?"));
        out.extend_from_slice(if hit { &answers.ok } else { &answers.not_found });
        at += head + body;
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipelined_and_partial() {
        let a = Answers::new();
        let mut out = Vec::new();
        let reqs = b"GET /metadata?key=bench HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\n\r\nGET /meta";
        let n = serve(&a, reqs, &mut out).unwrap();
        assert_eq!(&reqs[n..], b"GET /meta");
        let mut want = a.ok.clone();
        want.extend_from_slice(&a.not_found);
        assert_eq!(out, want);
        assert!(serve(&a, b"\x01\x02 / HTTP/1.1\r\n\r\n", &mut out).is_err());
    }
}
