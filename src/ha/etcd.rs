//! A small blocking client of etcd's v3 JSON gateway (`POST /v3/<service>/<method>`, the
//! gRPC messages as JSON, bytes as base64, 64-bit integers as strings).
//!
//! It runs only on the HA threads, never on a shard. Every call has a deadline: the connect,
//! each write and each read are bounded by what is left of it, so a frozen etcd (a process
//! stopped with SIGSTOP: its sockets accept and never answer) costs at most the deadline and
//! is then reported as an error, exactly like a closed connection. Endpoints are tried in turn;
//! one kept-alive connection is reused while it works.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

use crate::config::HostPort;

/// The largest gateway response read (a page of `/metadata` entries is bounded by its
/// `limit`, each value by etcd's request size limit).
const MAX_RESPONSE_BYTES: usize = 256 << 20;

/// Why a call failed.
#[derive(Debug)]
pub enum EtcdError {
    /// No endpoint answered within the deadline (refused, reset, timed out, frozen).
    Unavailable(String),
    /// etcd answered with an error (a gRPC status in the JSON body).
    Refused(String),
}

impl std::fmt::Display for EtcdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EtcdError::Unavailable(s) => write!(f, "etcd unavailable: {s}"),
            EtcdError::Refused(s) => write!(f, "etcd refused the request: {s}"),
        }
    }
}

pub struct Etcd {
    endpoints: Vec<HostPort>,
    /// The endpoint tried first (the last one that worked).
    current: usize,
    conn: Option<TcpStream>,
}

pub fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

pub fn unb64(s: &str) -> Option<Vec<u8>> {
    B64.decode(s).ok()
}

/// A 64-bit integer field of a gateway message: a JSON string (or number); absent is 0, as
/// proto3 leaves out default values.
pub fn int(v: &Value, field: &str) -> i64 {
    match v.get(field) {
        Some(Value::String(s)) => s.parse().unwrap_or(0),
        Some(Value::Number(n)) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// A bytes field, decoded (absent: empty).
pub fn bytes(v: &Value, field: &str) -> Vec<u8> {
    v.get(field)
        .and_then(Value::as_str)
        .and_then(unb64)
        .unwrap_or_default()
}

/// The key just past every key that starts with `prefix` (etcd's `range_end` for a prefix).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.last_mut() {
        if *last < 0xff {
            *last += 1;
            return end;
        }
        end.pop();
    }
    vec![0]
}

impl Etcd {
    pub fn new(endpoints: Vec<HostPort>) -> Etcd {
        assert!(!endpoints.is_empty(), "at least one etcd endpoint");
        Etcd {
            endpoints,
            current: 0,
            conn: None,
        }
    }

    /// Calls `path` with `body` before `deadline`. Tries the current endpoint, then the others
    /// (each with what is left of the deadline).
    pub fn call(
        &mut self,
        path: &str,
        body: &Value,
        deadline: Instant,
    ) -> Result<Value, EtcdError> {
        let payload = body.to_string();
        let mut last = String::from("no endpoint tried");
        for attempt in 0..self.endpoints.len() {
            let i = (self.current + attempt) % self.endpoints.len();
            if attempt > 0 {
                self.conn = None;
            }
            if Instant::now() >= deadline {
                return Err(EtcdError::Unavailable(format!("deadline passed ({last})")));
            }
            match self.call_one(i, path, &payload, deadline) {
                Ok((status, v)) => {
                    self.current = i;
                    if status != 200 {
                        let msg = v
                            .get("error")
                            .or_else(|| v.get("message"))
                            .and_then(Value::as_str)
                            .unwrap_or("an error")
                            .to_string();
                        return Err(EtcdError::Refused(format!("HTTP {status}: {msg}")));
                    }
                    if let Some(err) = v.get("error") {
                        return Err(EtcdError::Refused(err.to_string()));
                    }
                    return Ok(v);
                }
                Err(e) => {
                    self.conn = None;
                    last = match e.kind() {
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                            format!("{}: no answer before the deadline", self.endpoints[i])
                        }
                        _ => format!("{}: {e}", self.endpoints[i]),
                    };
                }
            }
        }
        Err(EtcdError::Unavailable(last))
    }

    fn call_one(
        &mut self,
        i: usize,
        path: &str,
        payload: &str,
        deadline: Instant,
    ) -> std::io::Result<(u16, Value)> {
        // A kept connection may have been closed by etcd meanwhile: one retry on a fresh one.
        let reused = self.conn.is_some();
        match self.exchange(i, path, payload, deadline) {
            Err(e) if reused && Instant::now() < deadline => {
                log::debug!("etcd connection reset ({e}); reconnecting");
                self.conn = None;
                self.exchange(i, path, payload, deadline)
            }
            r => r,
        }
    }

    fn exchange(
        &mut self,
        i: usize,
        path: &str,
        payload: &str,
        deadline: Instant,
    ) -> std::io::Result<(u16, Value)> {
        if self.conn.is_none() {
            self.conn = Some(connect(&self.endpoints[i], deadline)?);
        }
        let conn = self.conn.as_mut().expect("connected above");
        let host = self.endpoints[i].to_string();
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{payload}",
            payload.len()
        );
        set_timeouts(conn, deadline)?;
        conn.write_all(request.as_bytes())?;
        let (status, body, keep) = read_response(conn, deadline)?;
        if !keep {
            self.conn = None;
        }
        let v: Value = serde_json::from_slice(&body).map_err(|e| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, format!("bad JSON: {e}"))
        })?;
        Ok((status, v))
    }

    // The calls the election and the `/metadata` writer make.

    /// Grants a lease of `ttl_secs`; returns its id and the TTL etcd granted (it may raise a
    /// TTL below its minimum).
    pub fn grant(&mut self, ttl_secs: u64, deadline: Instant) -> Result<(i64, u64), EtcdError> {
        let v = self.call("/v3/lease/grant", &json!({ "TTL": ttl_secs }), deadline)?;
        let id = int(&v, "ID");
        if id == 0 {
            return Err(EtcdError::Refused(format!(
                "lease grant without an id: {v}"
            )));
        }
        Ok((id, int(&v, "TTL").max(0) as u64))
    }

    /// Renews a lease once; returns its TTL (0: the lease no longer exists).
    pub fn keep_alive(&mut self, id: i64, deadline: Instant) -> Result<u64, EtcdError> {
        let v = self.call(
            "/v3/lease/keepalive",
            &json!({ "ID": id.to_string() }),
            deadline,
        )?;
        let result = v.get("result").unwrap_or(&v);
        Ok(int(result, "TTL").max(0) as u64)
    }

    pub fn revoke(&mut self, id: i64, deadline: Instant) -> Result<(), EtcdError> {
        self.call(
            "/v3/lease/revoke",
            &json!({ "ID": id.to_string() }),
            deadline,
        )
        .map(|_| ())
    }

    /// The key-value pairs of one key, or of `[key, range_end)` when `range_end` is given,
    /// at most `limit` (0: all).
    pub fn range(
        &mut self,
        key: &[u8],
        range_end: Option<&[u8]>,
        limit: u64,
        deadline: Instant,
    ) -> Result<Value, EtcdError> {
        let mut req = json!({ "key": b64(key) });
        if let Some(end) = range_end {
            req["range_end"] = json!(b64(end));
        }
        if limit > 0 {
            req["limit"] = json!(limit.to_string());
        }
        self.call("/v3/kv/range", &req, deadline)
    }

    pub fn txn(&mut self, txn: &Value, deadline: Instant) -> Result<Value, EtcdError> {
        self.call("/v3/kv/txn", txn, deadline)
    }
}

fn connect(hp: &HostPort, deadline: Instant) -> std::io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = (hp.host.as_str(), hp.port).to_socket_addrs()?.collect();
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    for a in addrs {
        let left = remaining(deadline)?;
        match TcpStream::connect_timeout(&a, left) {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn remaining(deadline: Instant) -> std::io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "deadline passed",
        ));
    }
    Ok(left)
}

fn set_timeouts(s: &TcpStream, deadline: Instant) -> std::io::Result<()> {
    let left = remaining(deadline)?;
    s.set_read_timeout(Some(left))?;
    s.set_write_timeout(Some(left))
}

/// Reads one response: status, body (de-chunked) and whether the connection stays open.
fn read_response(s: &mut TcpStream, deadline: Instant) -> std::io::Result<(u16, Vec<u8>, bool)> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 16 * 1024];
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    // The head.
    let (status, head_len, length, chunked, keep) = loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(&buf).map_err(|e| bad(&e.to_string()))? {
            httparse::Status::Complete(n) => {
                let mut length = None;
                let mut chunked = false;
                let mut keep = resp.version == Some(1);
                for h in resp.headers.iter() {
                    if h.name.eq_ignore_ascii_case("content-length") {
                        length = std::str::from_utf8(h.value)
                            .ok()
                            .and_then(|v| v.trim().parse::<usize>().ok());
                    } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                        chunked = h.value.eq_ignore_ascii_case(b"chunked");
                    } else if h.name.eq_ignore_ascii_case("connection") {
                        keep = !h.value.eq_ignore_ascii_case(b"close");
                    }
                }
                break (resp.code.unwrap_or(0), n, length, chunked, keep);
            }
            httparse::Status::Partial => {
                if buf.len() > 64 * 1024 {
                    return Err(bad("response head too large"));
                }
                read_more(s, &mut buf, &mut chunk, deadline)?;
            }
        }
    };
    buf.drain(..head_len);
    if chunked {
        let mut body = Vec::new();
        let mut pos = 0;
        loop {
            // One chunk-size line.
            let Some(eol) = memchr::memmem::find(&buf[pos..], b"\r\n") else {
                read_more(s, &mut buf, &mut chunk, deadline)?;
                continue;
            };
            let line = std::str::from_utf8(&buf[pos..pos + eol]).map_err(|_| bad("chunk size"))?;
            let size_text = line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size_text, 16).map_err(|_| bad("chunk size"))?;
            if body.len() + size > MAX_RESPONSE_BYTES {
                return Err(bad("response too large"));
            }
            let data_start = pos + eol + 2;
            if size == 0 {
                // The last chunk: trailers (none expected) end with an empty line.
                while memchr::memmem::find(&buf[data_start..], b"\r\n").is_none() {
                    read_more(s, &mut buf, &mut chunk, deadline)?;
                }
                return Ok((status, body, keep));
            }
            while buf.len() < data_start + size + 2 {
                read_more(s, &mut buf, &mut chunk, deadline)?;
            }
            body.extend_from_slice(&buf[data_start..data_start + size]);
            pos = data_start + size + 2;
        }
    }
    match length {
        Some(n) => {
            if n > MAX_RESPONSE_BYTES {
                return Err(bad("response too large"));
            }
            while buf.len() < n {
                read_more(s, &mut buf, &mut chunk, deadline)?;
            }
            buf.truncate(n);
            Ok((status, buf, keep))
        }
        None => {
            // Delimited by the close.
            loop {
                set_timeouts(s, deadline)?;
                let n = s.read(&mut chunk)?;
                if n == 0 {
                    return Ok((status, buf, false));
                }
                buf.extend_from_slice(&chunk[..n]);
                if buf.len() > MAX_RESPONSE_BYTES {
                    return Err(bad("response too large"));
                }
            }
        }
    }
}

fn read_more(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    chunk: &mut [u8],
    deadline: Instant,
) -> std::io::Result<()> {
    set_timeouts(s, deadline)?;
    let n = s.read(chunk)?;
    if n == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "etcd closed the connection",
        ));
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"/mmc/"), b"/mmc0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn integers_are_strings_or_absent() {
        let v = json!({"ID": "4111120345992074245", "TTL": 5});
        assert_eq!(int(&v, "ID"), 4111120345992074245);
        assert_eq!(int(&v, "TTL"), 5);
        assert_eq!(int(&v, "revision"), 0);
    }

    /// A frozen server (accepts, never answers) costs the deadline, not forever.
    #[test]
    fn a_silent_server_fails_within_the_deadline() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mut e = Etcd::new(vec![HostPort {
            host: "127.0.0.1".into(),
            port,
        }]);
        let t = Instant::now();
        let r = e.call("/v3/kv/range", &json!({}), t + Duration::from_millis(300));
        assert!(matches!(r, Err(EtcdError::Unavailable(_))), "{r:?}");
        let took = t.elapsed();
        assert!(took < Duration::from_secs(2), "took {took:?}");
        drop(l);
    }
}
