//! The HTTP/1.1 front end: every shard accepts on the shared port and serves its connections.
//!
//! Bytes become a [`parse::Head`] (httparse plus our limits), a head becomes a
//! [`router::Route`], a route's handler turns the request into a shard [`crate::shards::Command`]
//! and the reply into the contract's bytes ([`response`], [`json`]). Only this module knows
//! HTTP and JSON.
//!
//! Per shard, a [`Front`] keeps the connection registry that the housekeeping tick uses to
//! close idle and stalled connections (by shutting their socket down, which wakes the pending
//! read on either io driver at no cost to the hot path) and to drain on shutdown.

pub mod auth;
pub mod bodies;
pub mod catalog_wire;
pub mod chunked;
pub mod client;
pub mod conn;
pub mod front_ring;
pub mod handlers;
pub mod json;
pub mod openapi;
pub mod otlp;
pub mod parse;
pub mod query;
pub mod report_wire;
pub mod response;
pub mod router;
pub mod same_host;
pub mod spans;
pub mod tls;

use std::cell::{Cell, RefCell};
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::time::Duration;

use monoio::io::{AsyncWriteRentExt, Canceller};
use monoio::net::{TcpListener, TcpStream};
use slab::Slab;

use crate::config::Config;
use crate::limits::{MAX_REQUEST_ID_BYTES, TICK_MS};
use crate::shards::Shard;
use parse::Head;
use response::{Envelope, Response};

/// What the front end builds once from the configuration, before the shards start: the mTLS
/// server configuration (`tls.rs`; an unusable file stops the start) and the OpenAPI document
/// (`openapi.rs`). The cluster carries both to every shard. The cluster client's TLS towards
/// `https://` peers (`ock.mmc.cluster.tls.*`) is built here too and installed in `client.rs`.
pub fn front_assets(config: &Config) -> Result<crate::shards::FrontAssets, String> {
    let tls = if config.tls.enable {
        Some(tls::server_config(&config.tls)?)
    } else {
        None
    };
    if let Some(cluster_tls) = config.cluster_tls() {
        client::install_tls(tls::client_config(&cluster_tls)?);
    }
    Ok(crate::shards::FrontAssets {
        tls,
        openapi: openapi::document(config).into(),
        remote_tier: Some(std::sync::Arc::new(handlers::HttpRemoteTier)),
        copier: Some(std::sync::Arc::new(handlers::HttpCopier)),
    })
}

/// What a connection is doing, for the housekeeping tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnState {
    /// Waiting for the first byte of a request: closed after the idle timeout, and at once
    /// when the server drains.
    Idle,
    /// Part of a request has arrived: closed if the rest takes longer than the header timeout.
    Reading,
    /// Handling a request or writing its answer.
    Busy,
    /// Receiving a streamed body into its blobs: its read side is shut down once the body's
    /// deadline passes (`ock.mmc.http.body_timeout_ms`, `body_min_rate_bytes_per_sec`), which
    /// ends the read in flight without cancelling it, and the request is answered 408.
    Body,
}

struct ConnEntry {
    fd: RawFd,
    state: ConnState,
    /// `TickClock::now_ms` when the connection entered `state`.
    since_ms: u64,
    /// In `Body`: when the body's next bytes are due (`TickClock::now_ms`).
    deadline_ms: u64,
    /// In `Body`: the sweep shut the read side down because the deadline passed.
    body_timed_out: bool,
}

/// The per-shard HTTP state.
pub struct Front {
    shard: Rc<Shard>,
    conns: RefCell<Slab<ConnEntry>>,
    /// `Date` header value, refreshed every tick.
    date: RefCell<[u8; 29]>,
    /// The next generated request id: a per-process prefix (8 hex digits), the shard (4), a
    /// counter (12), kept as text and counted up in place (`next_hex`).
    next_id: Cell<[u8; 24]>,
    draining: Cell<bool>,
    accept_canceller: RefCell<Canceller>,
    auth: auth::Auth,
    /// mTLS acceptor when `ock.mmc.metrics.tls.enable` is on.
    tls: Option<monoio_rustls::TlsAcceptor>,
    /// Housekeeping ticks so far, and the tasks waiting for the next one (closed connections
    /// lingering without a wake-up of their own: `conn::linger_at_ticks`).
    ticks: Cell<u64>,
    tick_waiters: RefCell<Vec<std::task::Waker>>,
    /// The header lines `/health` says of the same-host sockets (`X-Mmc-Same-Host`), when on.
    same_host_advert: std::cell::OnceCell<Box<str>>,
}

/// A registered connection; leaving the registry when dropped.
pub struct ConnGuard {
    front: Rc<Front>,
    key: usize,
}

impl ConnGuard {
    pub fn set(&self, state: ConnState) {
        let mut conns = self.front.conns.borrow_mut();
        let e = &mut conns[self.key];
        if e.state != state {
            e.state = state;
            e.since_ms = self.front.shard.clock.now_ms();
        }
    }

    /// Enters (or stays in) `Body` with the body's next deadline.
    pub fn body_deadline(&self, deadline_ms: u64) {
        self.set(ConnState::Body);
        self.front.conns.borrow_mut()[self.key].deadline_ms = deadline_ms;
    }

    /// Whether the sweep ended the body's reads because it arrived too slowly.
    pub fn body_timed_out(&self) -> bool {
        self.front.conns.borrow()[self.key].body_timed_out
    }

    pub fn now_ms(&self) -> u64 {
        self.front.shard.clock.now_ms()
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.front.conns.borrow_mut().remove(self.key);
        self.front.shard.stats().connections_open.add(-1);
    }
}

impl Front {
    pub fn new(shard: Rc<Shard>, boot_id: u32) -> Rc<Front> {
        let auth = auth::Auth::new(&shard.shared.config);
        let tls = shard
            .shared
            .front
            .tls
            .clone()
            .map(monoio_rustls::TlsAcceptor::from);
        let mut next_id = [b'0'; 24];
        hex_into(&mut next_id[..8], boot_id as u64);
        hex_into(&mut next_id[8..12], shard.id as u64);
        let front = Front {
            shard,
            conns: RefCell::new(Slab::new()),
            date: RefCell::new([b' '; 29]),
            next_id: Cell::new(next_id),
            draining: Cell::new(false),
            accept_canceller: RefCell::new(Canceller::new()),
            auth,
            tls,
            ticks: Cell::new(0),
            tick_waiters: RefCell::new(Vec::new()),
            same_host_advert: std::cell::OnceCell::new(),
        };
        front.refresh_date();
        Rc::new(front)
    }

    pub fn shard(&self) -> &Rc<Shard> {
        &self.shard
    }

    pub fn auth(&self) -> &auth::Auth {
        &self.auth
    }

    pub fn ha(&self) -> &crate::ha::HaView {
        &self.shard.shared.ha
    }

    pub fn config(&self) -> &Config {
        &self.shard.shared.config
    }

    pub fn unix_secs(&self) -> u64 {
        self.shard.clock.unix_secs()
    }

    pub fn same_host_advert(&self) -> Option<&str> {
        self.same_host_advert.get().map(|s| &**s)
    }

    pub fn is_draining(&self) -> bool {
        self.draining.get()
    }

    pub fn connection_count(&self) -> usize {
        self.conns.borrow().len()
    }

    fn register(self: &Rc<Self>, fd: RawFd) -> ConnGuard {
        let key = self.conns.borrow_mut().insert(ConnEntry {
            fd,
            state: ConnState::Idle,
            since_ms: self.shard.clock.now_ms(),
            deadline_ms: u64::MAX,
            body_timed_out: false,
        });
        self.shard.stats().connections_open.add(1);
        ConnGuard {
            front: self.clone(),
            key,
        }
    }

    fn refresh_date(&self) {
        let now = httpdate::fmt_http_date(std::time::SystemTime::now());
        let mut d = self.date.borrow_mut();
        if now.len() == d.len() {
            d.copy_from_slice(now.as_bytes());
        }
    }

    /// Encodes `resp` for the request `head` (or for a request whose head could not be
    /// parsed). Returns a large body for the caller to write after the head.
    pub fn encode(
        &self,
        resp: Response,
        head: Option<&Head<'_>>,
        scratch: &[u8],
        out: &mut Vec<u8>,
    ) -> Option<response::Tail> {
        self.shard.stats().count_response(resp.status.0);
        let generated: [u8; 24];
        let request_id = match head.and_then(|h| h.request_id) {
            Some(id) if is_valid_request_id(id) => id,
            _ => {
                generated = self.next_id.get();
                let mut next = generated;
                next_hex(&mut next[12..]);
                self.next_id.set(next);
                &generated[..]
            }
        };
        let date = self.date.borrow();
        let env = Envelope {
            request_id,
            date: &date[..],
            head_only: head.is_some_and(|h| h.method == parse::Method::Head),
            http10_keep_alive: head.is_some_and(|h| h.minor_version == 0 && h.keep_alive),
            http10: head.is_some_and(|h| h.minor_version == 0),
            same_host_advert: self.same_host_advert(),
        };
        response::encode(resp, &env, scratch, out)
    }

    /// The housekeeping pass: close connections past their timeouts (or idle ones while
    /// draining; all of them when `force`).
    fn sweep(&self, force: bool) {
        let now = self.shard.clock.now_ms();
        let http = &self.config().http;
        let draining = self.draining.get();
        let mut closed = 0;
        for (_, e) in self.conns.borrow_mut().iter_mut() {
            let age = now.saturating_sub(e.since_ms);
            let expired = match e.state {
                ConnState::Idle => draining || age >= http.idle_timeout_ms,
                ConnState::Reading => age >= http.header_timeout_ms,
                ConnState::Busy => false,
                ConnState::Body => now >= e.deadline_ms && !e.body_timed_out,
            };
            if expired && !force && e.state == ConnState::Body {
                // Only the read side: the connection still answers 408 before it closes.
                // SAFETY: as below.
                unsafe { libc::shutdown(e.fd, libc::SHUT_RD) };
                e.body_timed_out = true;
                closed += 1;
                continue;
            }
            if expired || force {
                // Shutting the socket down completes the connection's pending read with
                // end-of-file on either driver; the connection task then closes it.
                // SAFETY: the fd belongs to a live connection (entries leave the registry
                // before their stream is dropped).
                unsafe { libc::shutdown(e.fd, libc::SHUT_RDWR) };
                if !draining {
                    closed += 1;
                }
            }
        }
        self.shard.stats().connections_timed_out.add(closed);
    }

    /// Stops accepting and closes idle connections; busy ones finish their request.
    pub fn begin_drain(&self) {
        self.draining.set(true);
        let c = std::mem::take(&mut *self.accept_canceller.borrow_mut());
        *self.accept_canceller.borrow_mut() = c.cancel();
        self.sweep(false);
        // Lingering connections close now.
        self.wake_tick_waiters();
    }

    /// Completes at the next housekeeping tick (or when the drain begins): a wait that
    /// costs no wake-up of its own.
    pub fn next_tick(&self) -> impl std::future::Future<Output = ()> + '_ {
        let start = self.ticks.get();
        std::future::poll_fn(move |cx| {
            if self.ticks.get() != start || self.draining.get() {
                return std::task::Poll::Ready(());
            }
            let mut waiters = self.tick_waiters.borrow_mut();
            if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
                waiters.push(cx.waker().clone());
            }
            std::task::Poll::Pending
        })
    }

    fn wake_tick_waiters(&self) {
        self.ticks.set(self.ticks.get() + 1);
        let waiters = std::mem::take(&mut *self.tick_waiters.borrow_mut());
        for w in waiters {
            w.wake();
        }
    }

    /// Waits until every connection has closed, or `deadline_ms` (clock time) passed; then
    /// closes whatever is left.
    pub async fn drain(&self, deadline_ms: u64) {
        loop {
            if self.connection_count() == 0 {
                return;
            }
            if self.shard.clock.now_ms() >= deadline_ms {
                log::warn!(
                    "shard {}: shutdown timeout with {} connections open; closing them",
                    self.shard.id,
                    self.connection_count()
                );
                self.sweep(true);
                // Give the connection tasks a moment to observe the shutdown.
                monoio::time::sleep(Duration::from_millis(50)).await;
                return;
            }
            monoio::time::sleep(Duration::from_millis(10)).await;
            self.shard.clock.refresh();
            self.sweep(false);
        }
    }

    /// The housekeeping task: clock, `Date`, timeouts.
    pub async fn tick(self: Rc<Self>) {
        loop {
            monoio::time::sleep(Duration::from_millis(TICK_MS)).await;
            self.shard.clock.refresh();
            self.refresh_date();
            self.sweep(false);
            self.shard.tick();
            self.wake_tick_waiters();
        }
    }

    /// Accepts connections until the drain begins.
    pub async fn serve(self: Rc<Self>, listener: TcpListener) {
        let handle = self.accept_canceller.borrow().handle();
        let max_conns = self.config().http.max_connections_per_shard as usize;
        let mut last_error_log_ms = None;
        loop {
            match listener.cancelable_accept(handle.clone()).await {
                Ok((stream, _peer)) => {
                    let stats = self.shard.stats();
                    stats.connections_accepted.inc();
                    if self.connection_count() >= max_conns {
                        stats.connections_rejected.inc();
                        // A TLS client cannot read a plain answer: it is just closed.
                        if self.tls.is_none() {
                            monoio::spawn(refuse(self.clone(), stream));
                        }
                        continue;
                    }
                    // TCP_NODELAY is inherited from the listener (`bind_listeners`).
                    let fd = stream.as_raw_fd();
                    match &self.tls {
                        None => {
                            monoio::spawn(conn::run(self.clone(), stream, fd, true, None));
                        }
                        Some(acceptor) => {
                            monoio::spawn(tls_handshake(
                                self.clone(),
                                acceptor.clone(),
                                stream,
                                fd,
                            ));
                        }
                    }
                }
                Err(_) if self.draining.get() => return,
                Err(e) => {
                    // Out of descriptors or memory: log at most once a second and back off
                    // briefly instead of spinning; the server keeps serving what it has.
                    let now = self.shard.clock.now_ms();
                    if last_error_log_ms.is_none_or(|t| now >= t + 1000) {
                        log::warn!("shard {}: accept failed: {e}", self.shard.id);
                        last_error_log_ms = Some(now);
                    }
                    monoio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }
}

/// Completes the TLS handshake (bounded by the header timeout) and serves the connection; a
/// client without a valid certificate is refused here.
async fn tls_handshake(
    front: Rc<Front>,
    acceptor: monoio_rustls::TlsAcceptor,
    stream: TcpStream,
    fd: RawFd,
) {
    let limit = Duration::from_millis(front.config().http.header_timeout_ms);
    match monoio::time::timeout(limit, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => conn::run(front, tls, fd, false, None).await,
        Ok(Err(e)) => {
            front.shard.stats().tls_handshake_failures.inc();
            log::debug!("shard {}: TLS handshake refused: {e}", front.shard.id);
        }
        Err(_) => {
            front.shard.stats().tls_handshake_failures.inc();
            log::debug!("shard {}: TLS handshake timed out", front.shard.id);
        }
    }
}

/// Answers a connection over the shard's limit with 429 and closes it (a monoio stream, or
/// the front ring's `RingStream`).
async fn refuse<S: monoio::io::AsyncWriteRent>(front: Rc<Front>, mut stream: S) {
    let mut scratch = Vec::new();
    let mut resp = Response::error(
        response::Status::TOO_MANY_REQUESTS,
        crate::common::error_kind::ErrorKind::Overloaded,
        "Too many connections",
        front.unix_secs(),
        &mut scratch,
    );
    resp.retry_after_secs = Some(1);
    resp.close = true;
    let mut out = Vec::with_capacity(256);
    front.encode(resp, None, &scratch, &mut out);
    let _ = stream.write_all(out).await;
}

/// Request ids we echo: 1 to 128 visible ASCII characters (no spaces, no control bytes), so an
/// echoed id can never break or extend our response head.
fn is_valid_request_id(id: &[u8]) -> bool {
    !id.is_empty()
        && id.len() <= MAX_REQUEST_ID_BYTES
        && id.iter().all(|&b| (0x21..0x7f).contains(&b))
}

/// Writes `v` as lower-case hex into `out`, most significant digit first, zero padded.
fn hex_into(out: &mut [u8], mut v: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in out.iter_mut().rev() {
        *b = HEX[(v & 0xf) as usize];
        v >>= 4;
    }
}

/// Counts the lower-case hex number `digits` up by one, in place (wrapping to zeros): most
/// calls change only the last digit.
fn next_hex(digits: &mut [u8]) {
    for d in digits.iter_mut().rev() {
        match *d {
            b'9' => {
                *d = b'a';
                return;
            }
            b'f' => *d = b'0',
            _ => {
                *d += 1;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_count_up_in_hex_as_the_counter_did() {
        let mut digits = [b'0'; 12];
        let mut expected = [0u8; 12];
        for v in (0..5000u64)
            .chain(0xfff_ff00..0x1000_0100)
            .chain(0xffff_ffff_ff00..0xffff_ffff_ffff)
        {
            hex_into(&mut expected, v);
            if v == 0 || v == 0xfff_ff00 || v == 0xffff_ffff_ff00 {
                digits = expected;
            }
            assert_eq!(digits, expected, "at {v:#x}");
            next_hex(&mut digits);
        }
        next_hex(&mut digits);
        assert_eq!(&digits, b"000000000000", "48 bits wrap to zero");
    }

    #[test]
    fn request_ids() {
        assert!(is_valid_request_id(b"abc-123_XYZ"));
        assert!(!is_valid_request_id(b""));
        assert!(!is_valid_request_id(b"a b"));
        assert!(!is_valid_request_id(b"a\r\nX-Evil: 1"));
        assert!(!is_valid_request_id(&[b'a'; MAX_REQUEST_ID_BYTES + 1]));
        let mut out = [0u8; 6];
        hex_into(&mut out, 0xabc);
        assert_eq!(&out, b"000abc");
    }
}
