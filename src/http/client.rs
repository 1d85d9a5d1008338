//! A small HTTP/1.1 client for the cluster's own messages (join, heartbeat, commit, a
//! replicated put's next hop): one request per connection, `Content-Length` bodies, bounded
//! in time. Runs on any monoio runtime (a shard, or a local service's agent thread).
//! `https://` peers are reached over rustls ([`install_tls`]: the CA they must chain to, the
//! client certificate presented); a peer that is not trusted, or does not trust us, fails
//! the call with [`UNTRUSTED`] in its error.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use monoio::BufResult;
use monoio::buf::IoBuf;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;
use monoio_rustls::{ClientTlsStream, TlsConnector};
use rustls_pki_types::ServerName;

/// An answer: status and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
    /// The `Location` header (a redirect).
    pub location: Option<String>,
    /// The body is object bytes (`Content-Type: application/octet-stream`), not an error
    /// envelope (a business error is a 200 too).
    pub octet_stream: bool,
}

/// The largest answer read (cluster answers are small JSON documents; a batch read fetches
/// an object).
const MAX_ANSWER_BYTES: usize = 256 << 20;

/// `http://…` or `https://…` → (whether TLS, the rest).
fn split_scheme(url: &str) -> Result<(bool, &str), String> {
    if let Some(rest) = url.strip_prefix("http://") {
        Ok((false, rest))
    } else if let Some(rest) = url.strip_prefix("https://") {
        Ok((true, rest))
    } else {
        Err(format!("{url}: not an http:// or https:// URL"))
    }
}

/// `http[s]://host:port[/...]` → (host:port, socket address). A literal address is parsed; a
/// host name is looked up (a blocking call) at most once per [`RESOLVED_TTL`] per thread.
pub fn authority(url: &str) -> Result<(String, SocketAddr), String> {
    let (_, rest) = split_scheme(url)?;
    let hostport = rest.split('/').next().unwrap_or_default();
    Ok((hostport.to_string(), resolve(hostport)?))
}

/// How long a host name's address is used before it is looked up again.
const RESOLVED_TTL: Duration = Duration::from_secs(30);

/// Host names whose addresses a thread keeps.
const RESOLVED_MAX: usize = 32;

thread_local! {
    /// This thread's resolved host names: (host:port, address, when looked up).
    static RESOLVED: std::cell::RefCell<Vec<(String, SocketAddr, Instant)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

fn resolve(hostport: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = hostport.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let now = Instant::now();
    let cached = RESOLVED.with(|r| {
        r.borrow()
            .iter()
            .find(|(h, _, at)| h == hostport && now.duration_since(*at) < RESOLVED_TTL)
            .map(|&(_, addr, _)| addr)
    });
    if let Some(addr) = cached {
        return Ok(addr);
    }
    let addr = hostport
        .to_socket_addrs()
        .map_err(|e| format!("{hostport}: {e}"))?
        .next()
        .ok_or_else(|| format!("{hostport}: no address"))?;
    RESOLVED.with(|r| {
        let mut r = r.borrow_mut();
        r.retain(|(h, _, at)| h != hostport && now.duration_since(*at) < RESOLVED_TTL);
        if r.len() >= RESOLVED_MAX {
            r.remove(0);
        }
        r.push((hostport.to_string(), addr, now));
    });
    Ok(addr)
}

/// Sends one request to `base` (`http://host:port`) for `target` (path and query) and reads
/// the answer, all within `timeout`.
pub async fn request<B: IoBuf>(
    base: &str,
    method: &str,
    target: &str,
    bearer: Option<&str>,
    body: B,
    timeout: Duration,
) -> Result<Answer, String> {
    request_with(base, method, target, bearer, &[], body, timeout).await
}

/// [`request`] with more header fields (`name`, `value`), sent as given: a `traceparent`,
/// an OTLP export's content type and configured headers.
pub async fn request_with<B: IoBuf>(
    base: &str,
    method: &str,
    target: &str,
    bearer: Option<&str>,
    headers: &[(&str, &str)],
    body: B,
    timeout: Duration,
) -> Result<Answer, String> {
    let call = exchange(base, method, target, bearer, headers, body);
    match monoio::time::timeout(timeout, call).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "{method} {base}{target}: no answer within {} ms",
            timeout.as_millis()
        )),
    }
}

/// [`request`] to a full URL (`http://host:port/path?query`).
pub async fn request_url<B: IoBuf>(
    url: &str,
    method: &str,
    body: B,
    timeout: Duration,
) -> Result<Answer, String> {
    request_url_with(url, method, &[], body, timeout).await
}

/// [`request_url`] with more header fields (see [`request_with`]).
pub async fn request_url_with<B: IoBuf>(
    url: &str,
    method: &str,
    headers: &[(&str, &str)],
    body: B,
    timeout: Duration,
) -> Result<Answer, String> {
    let (_, rest) = split_scheme(url)?;
    let split = rest.find('/').unwrap_or(rest.len());
    let base = &url[..url.len() - rest.len() + split];
    let target = if split == rest.len() {
        "/"
    } else {
        &rest[split..]
    };
    request_with(base, method, target, None, headers, body, timeout).await
}

/// Bodies up to this size go on pooled keep-alive connections (the cluster's small JSON
/// messages: commits, heartbeats); larger ones (a chain's next hop, a drain's copy) on a
/// connection of their own, so a stale pooled connection never forces a large body twice.
const POOLED_BODY_MAX: usize = 64 << 10;

/// Idle connections kept per thread (all peers together).
const MAX_IDLE: usize = 16;

thread_local! {
    /// This thread's idle keep-alive connections, by peer: a commit or heartbeat reuses one
    /// instead of paying a connect and an accept on both sides.
    static IDLE: std::cell::RefCell<Vec<(SocketAddr, Conn)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

fn take_idle(addr: SocketAddr) -> Option<Conn> {
    IDLE.with(|idle| {
        let mut idle = idle.borrow_mut();
        let i = idle.iter().rposition(|(a, _)| *a == addr)?;
        Some(idle.swap_remove(i).1)
    })
}

fn give_idle(addr: SocketAddr, stream: Conn) {
    IDLE.with(|idle| {
        let mut idle = idle.borrow_mut();
        if idle.len() >= MAX_IDLE {
            idle.remove(0);
        }
        idle.push((addr, stream));
    });
}

/// How one exchange on a connection ended.
enum Outcome {
    /// An answer; the connection may be reused when `keep` is set.
    Answered(Answer, Conn, bool),
    /// The connection was closed before any byte of an answer (an idle pooled connection
    /// the peer had closed): safe to send again on a fresh one.
    Stale,
    Failed(String),
}

async fn exchange<B: IoBuf>(
    base: &str,
    method: &str,
    target: &str,
    bearer: Option<&str>,
    headers: &[(&str, &str)],
    body: B,
) -> Result<Answer, String> {
    let (host, addr) = authority(base)?;
    let len = body.bytes_init();
    let pooled = len <= POOLED_BODY_MAX;
    let mut head =
        format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len}\r\n");
    if !pooled {
        head.push_str("Connection: close\r\n");
    }
    if let Some(t) = bearer.filter(|t| !t.is_empty()) {
        head.push_str("Authorization: Bearer ");
        head.push_str(t);
        head.push_str("\r\n");
    }
    for (name, value) in headers {
        head.push_str(name);
        head.push_str(": ");
        head.push_str(value);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let what = format!("{method} {base}{target}");
    // A small body goes in the head's write; a large one is written from where it is.
    let mut request = head.into_bytes();
    let large = if pooled {
        // SAFETY: an `IoBuf` is readable for `bytes_init()` bytes from `read_ptr()`.
        request.extend_from_slice(unsafe { std::slice::from_raw_parts(body.read_ptr(), len) });
        None
    } else {
        Some(body)
    };
    if pooled && let Some(stream) = take_idle(addr) {
        match once(stream, request.clone(), None::<B>, &what).await {
            Outcome::Answered(a, stream, keep) => {
                if keep {
                    give_idle(addr, stream);
                }
                return Ok(a);
            }
            Outcome::Failed(e) => return Err(e),
            Outcome::Stale => {}
        }
    }
    let stream = connect(base, &host, addr, &what).await?;
    match once(stream, request, large, &what).await {
        Outcome::Answered(a, stream, keep) => {
            if keep && pooled {
                give_idle(addr, stream);
            }
            Ok(a)
        }
        Outcome::Stale => Err(format!("{what}: connection closed early")),
        Outcome::Failed(e) => Err(e),
    }
}

/// The CA and client certificate of calls to `https://` peers, installed once at start.
static TLS: OnceLock<TlsConnector> = OnceLock::new();

/// Installs the TLS client configuration (`http::tls::client_config`); the first one stays.
pub fn install_tls(config: Arc<rustls::ClientConfig>) {
    let _ = TLS.set(TlsConnector::from(config));
}

/// Whether calls to `https://` peers can be made (a CA was configured).
pub fn tls_ready() -> bool {
    TLS.get().is_some()
}

/// In the error of a call whose TLS peer was not trusted (its certificate does not chain to
/// our CA or does not name its host) or did not trust us (it refused our certificate): a
/// refusal that retrying does not fix.
pub const UNTRUSTED: &str = "TLS peer not trusted or refused us";

/// A connection to a peer: plain, or TLS for an `https://` URL.
enum Conn {
    Plain(TcpStream),
    Tls(Box<ClientTlsStream<TcpStream>>),
}

impl Conn {
    async fn write_all<B: IoBuf>(&mut self, buf: B) -> BufResult<usize, B> {
        match self {
            Conn::Plain(s) => s.write_all(buf).await,
            Conn::Tls(s) => s.write_all(buf).await,
        }
    }

    async fn read(&mut self, buf: Vec<u8>) -> BufResult<usize, Vec<u8>> {
        match self {
            Conn::Plain(s) => s.read(buf).await,
            Conn::Tls(s) => s.read(buf).await,
        }
    }
}

/// A rustls error under an I/O error: the TLS peer's verdict (a certificate refused on
/// either side), not a network failure.
fn tls_refusal(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

/// Connects to `addr` (`base`'s `host`), over TLS when `base` is `https://`.
async fn connect(base: &str, host: &str, addr: SocketAddr, what: &str) -> Result<Conn, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("{what}: {e}"))?;
    let _ = stream.set_nodelay(true);
    if !split_scheme(base)?.0 {
        return Ok(Conn::Plain(stream));
    }
    let connector = TLS.get().ok_or_else(|| {
        format!("{what}: an https:// peer but no CA to verify it (set ock.mmc.cluster.tls.ca.path)")
    })?;
    let name = host.rsplit_once(':').map_or(host, |(h, _)| h);
    let name = name.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(name.to_string())
        .map_err(|e| format!("{what}: {name:?} is no TLS server name: {e}"))?;
    match connector.connect(name, stream).await {
        Ok(s) => Ok(Conn::Tls(Box::new(s))),
        Err(monoio_rustls::TlsError::Rustls(e)) => Err(format!("{what}: {UNTRUSTED}: {e}")),
        Err(monoio_rustls::TlsError::Io(e)) => match tls_refusal(&e) {
            Some(r) => Err(format!("{what}: {UNTRUSTED}: {r}")),
            None => Err(format!("{what}: TLS handshake: {e}")),
        },
    }
}

/// Sends one request on `stream` (its head with any small body, then a `large` body) and
/// reads its answer.
async fn once<B: IoBuf>(
    mut stream: Conn,
    request: Vec<u8>,
    large: Option<B>,
    what: &str,
) -> Outcome {
    if stream.write_all(request).await.0.is_err() {
        return Outcome::Stale;
    }
    if let Some(body) = large
        && let Err(e) = stream.write_all(body).await.0
    {
        return Outcome::Failed(format!("{what}: {e}"));
    }
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    loop {
        match parse(&buf) {
            Err(e) => return Outcome::Failed(format!("{what}: {e}")),
            Ok(Some((answer, keep))) => return Outcome::Answered(answer, stream, keep),
            Ok(None) => {}
        }
        if buf.len() >= MAX_ANSWER_BYTES {
            return Outcome::Failed(format!("{what}: answer too large"));
        }
        let spare = Vec::with_capacity(64 << 10);
        let (res, chunk) = stream.read(spare).await;
        match res {
            // A TLS peer that refused our certificate says so in the first read.
            Err(ref e) if let Some(r) = tls_refusal(e) => {
                return Outcome::Failed(format!("{what}: {UNTRUSTED}: {r}"));
            }
            Ok(0) | Err(_) if buf.is_empty() => return Outcome::Stale,
            Ok(0) => {
                return match parse_at_eof(&buf) {
                    Some(a) => Outcome::Answered(a, stream, false),
                    None => Outcome::Failed(format!("{what}: connection closed early")),
                };
            }
            Err(e) => return Outcome::Failed(format!("{what}: {e}")),
            Ok(_) => buf.extend_from_slice(&chunk),
        }
    }
}

/// A complete answer at the start of `buf` (a `Content-Length` body, or none for 204/304),
/// and whether the connection stays open after it.
fn parse(buf: &[u8]) -> Result<Option<(Answer, bool)>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("malformed answer: {e}")),
    };
    let status = resp.code.unwrap_or(0);
    let header = |name: &str| {
        resp.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    };
    let length = header("content-length")
        .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<usize>().ok());
    let location = header("location").map(|v| String::from_utf8_lossy(v).into_owned());
    let octet_stream =
        header("content-type").is_some_and(|v| v.eq_ignore_ascii_case(b"application/octet-stream"));
    let keep = resp.version == Some(1)
        && !header("connection").is_some_and(|v| v.eq_ignore_ascii_case(b"close"));
    match length {
        Some(n) if buf.len() >= head_len + n => Ok(Some((
            Answer {
                status,
                body: buf[head_len..head_len + n].to_vec(),
                location,
                octet_stream,
            },
            keep && buf.len() == head_len + n,
        ))),
        Some(_) => Ok(None),
        None if status == 204 || status == 304 => Ok(Some((
            Answer {
                status,
                body: Vec::new(),
                location,
                octet_stream,
            },
            keep,
        ))),
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
            location: None,
            octet_stream: false,
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
        let (a, keep) = parse(full).unwrap().unwrap();
        assert_eq!((a.status, a.body.as_slice(), keep), (200, &b"ok"[..], true));
        let closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
        assert!(!parse(closing).unwrap().unwrap().1);
        assert!(parse(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap().is_some());
        assert!(parse(b"garbage\r\n\r\n").is_err());
        assert_eq!(encode_query(b"a b/c~"), "a%20b%2Fc~");
    }

    #[test]
    fn host_names_are_resolved_once_and_literals_parsed() {
        let (host, addr) = authority("http://127.0.0.1:9/x").unwrap();
        assert_eq!((host.as_str(), addr.port()), ("127.0.0.1:9", 9));
        let (host, _) = authority("https://127.0.0.1:9").unwrap();
        assert_eq!(host, "127.0.0.1:9");
        assert!(authority("ftp://127.0.0.1:9").is_err());
        let (_, a) = authority("http://localhost:7").unwrap();
        assert!(a.ip().is_loopback() && a.port() == 7);
        let cached = RESOLVED.with(|r| {
            r.borrow()
                .iter()
                .filter(|(h, ..)| h == "localhost:7")
                .count()
        });
        assert_eq!(cached, 1);
        let (_, b) = authority("http://localhost:7/y").unwrap();
        assert_eq!(a, b);
        let cached = RESOLVED.with(|r| {
            r.borrow()
                .iter()
                .filter(|(h, ..)| h == "localhost:7")
                .count()
        });
        assert_eq!(cached, 1, "a second call uses the cached address");
        assert!(RESOLVED.with(|r| r.borrow().iter().all(|(h, ..)| h != "127.0.0.1:9")));
    }
}
