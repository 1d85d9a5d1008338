//! A small HTTP/1.1 client for the cluster's own messages (join, heartbeat, commit, a
//! replicated put's next hop): one request per connection, `Content-Length` bodies, bounded
//! in time. Runs on any monoio runtime (a shard, or a local service's agent thread).

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

/// An answer: status and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

/// The largest answer read (cluster answers are small JSON documents; a batch read fetches
/// an object).
const MAX_ANSWER_BYTES: usize = 256 << 20;

/// `http://host:port[/...]` → (host:port, socket address). Only literal addresses and names
/// the resolver answers from its files are expected here (configured URLs).
pub fn authority(url: &str) -> Result<(String, SocketAddr), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: not an http:// URL"))?;
    let hostport = rest.split('/').next().unwrap_or_default();
    let addr = hostport
        .to_socket_addrs()
        .map_err(|e| format!("{hostport}: {e}"))?
        .next()
        .ok_or_else(|| format!("{hostport}: no address"))?;
    Ok((hostport.to_string(), addr))
}

/// Sends one request to `base` (`http://host:port`) for `target` (path and query) and reads
/// the answer, all within `timeout`.
pub async fn request(
    base: &str,
    method: &str,
    target: &str,
    bearer: Option<&str>,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<Answer, String> {
    match monoio::time::timeout(timeout, exchange(base, method, target, bearer, body)).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "{method} {base}{target}: no answer within {} ms",
            timeout.as_millis()
        )),
    }
}

/// [`request`] to a full URL (`http://host:port/path?query`).
pub async fn request_url(
    url: &str,
    method: &str,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<Answer, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: not an http:// URL"))?;
    let split = rest.find('/').unwrap_or(rest.len());
    let base = &url[..7 + split];
    let target = if split == rest.len() {
        "/"
    } else {
        &rest[split..]
    };
    request(base, method, target, None, body, timeout).await
}

async fn exchange(
    base: &str,
    method: &str,
    target: &str,
    bearer: Option<&str>,
    body: Vec<u8>,
) -> Result<Answer, String> {
    let (host, addr) = authority(base)?;
    let err = |e: std::io::Error| format!("{method} {base}{target}: {e}");
    let mut stream = TcpStream::connect(addr).await.map_err(err)?;
    let _ = stream.set_nodelay(true);
    let mut head = format!(
        "{method} {target} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(t) = bearer.filter(|t| !t.is_empty()) {
        head.push_str("Authorization: Bearer ");
        head.push_str(t);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.into_bytes()).await.0.map_err(err)?;
    if !body.is_empty() {
        stream.write_all(body).await.0.map_err(err)?;
    }
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    loop {
        if let Some(answer) = parse(&buf)? {
            return Ok(answer);
        }
        if buf.len() >= MAX_ANSWER_BYTES {
            return Err(format!("{method} {base}{target}: answer too large"));
        }
        let spare = Vec::with_capacity(16 << 10);
        let (res, chunk) = stream.read(spare).await;
        match res.map_err(err)? {
            0 => {
                return parse_at_eof(&buf)
                    .ok_or_else(|| format!("{method} {base}{target}: connection closed early"));
            }
            _ => buf.extend_from_slice(&chunk),
        }
    }
}

/// A complete answer at the start of `buf` (a `Content-Length` body, or none for 204/304).
fn parse(buf: &[u8]) -> Result<Option<Answer>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("malformed answer: {e}")),
    };
    let status = resp.code.unwrap_or(0);
    let length = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| {
            std::str::from_utf8(h.value)
                .ok()?
                .trim()
                .parse::<usize>()
                .ok()
        });
    match length {
        Some(n) if buf.len() >= head_len + n => Ok(Some(Answer {
            status,
            body: buf[head_len..head_len + n].to_vec(),
        })),
        Some(_) => Ok(None),
        None if status == 204 || status == 304 || (100..200).contains(&status) => {
            Ok(Some(Answer {
                status,
                body: Vec::new(),
            }))
        }
        None => Ok(None),
    }
}

/// An answer without `Content-Length` ends with the connection.
fn parse_at_eof(buf: &[u8]) -> Option<Answer> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => Some(Answer {
            status: resp.code.unwrap_or(0),
            body: buf[n..].to_vec(),
        }),
        _ => None,
    }
}

/// Percent-encodes a query value (everything but unreserved characters).
pub fn encode_query(v: &[u8]) -> String {
    let mut out = String::with_capacity(v.len());
    for &b in v {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_complete_only_with_their_body() {
        let full = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        assert!(parse(&full[..full.len() - 1]).unwrap().is_none());
        let a = parse(full).unwrap().unwrap();
        assert_eq!((a.status, a.body.as_slice()), (200, &b"ok"[..]));
        assert!(parse(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap().is_some());
        assert!(parse(b"garbage\r\n\r\n").is_err());
        assert_eq!(encode_query(b"a b/c~"), "a%20b%2Fc~");
    }
}
