//! One connection: read, frame requests, dispatch, write answers in order.
//!
//! Requests are answered strictly in arrival order (pipelining), with all complete requests
//! in a read processed before one write of their answers. Bodies are framed by
//! `Content-Length` or decoded from chunked encoding in place, in the read buffer. A body over
//! its limit is answered 413 as soon as the head shows it, without reading the body.

use std::os::fd::RawFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};

use super::chunked::{ChunkedDecoder, Progress, TOO_LARGE};
use super::handlers::keys_stream::KeyCursor;
use super::handlers::{self, Ctx, Request};
use super::parse::{Framing, Head, Method, Parsed, ProtocolError, parse_head};
use super::response::{self, Body, KeyListing, Part, Response, Status, Tail};
use super::router::{self, Route};
use super::{ConnGuard, ConnState, Front, auth};
use crate::limits::{
    LINGER_DISCARD_BYTES, LINGER_MS, READ_BUF_INITIAL_BYTES, READ_BUF_KEEP_BYTES, STAGING_BYTES,
    STAGING_POOL_BUFFERS, WRITE_BUF_FLUSH_BYTES,
};

/// Body framing in progress for the request at the start of the read buffer.
enum Pending {
    None,
    /// Waiting until the buffer holds `total` bytes (head plus body).
    Length {
        head_len: usize,
        total: usize,
    },
    /// Decoding chunks in place: decoded body bytes end at `write`, undecoded input starts at
    /// `read` (both offsets from the request start; `head_len <= write <= read`).
    Chunked {
        dec: ChunkedDecoder,
        head_len: usize,
        write: usize,
        read: usize,
    },
}

/// What the framing step found at the start of the unprocessed bytes.
enum Framed {
    NeedMore,
    /// No usable head: answer with this error and close.
    Malformed(ProtocolError),
    /// A head (and its body, unless `early` says otherwise). The next request starts at
    /// `next` (offsets from the request start).
    Request {
        head_len: usize,
        body_end: usize,
        next: usize,
        early: Option<Early>,
    },
    /// A complete head whose large body is still arriving and goes straight to its
    /// destination ([`handlers::streams_body`]): everything after the head in the buffer is
    /// the start of that body.
    Stream {
        head_len: usize,
        body_len: usize,
    },
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Early {
    /// The body is over its limit: answer 413 and close without reading it.
    TooLarge,
    /// The answer does not need the body (404, 405, ...), which has not fully arrived:
    /// answer now and close.
    BodyNotRead,
}

/// How a head is dispatched before any handler runs.
enum Verdict {
    Dispatch(Route),
    NotFound,
    MethodNotAllowed(Route),
    Options(Option<Route>),
    Unauthorized,
}

/// The most body bytes a request may carry: its route's limit, or the general one when it
/// will not be dispatched.
fn body_limit_for(front: &Front, head: &Head<'_>, verdict: &Verdict) -> u64 {
    match verdict {
        Verdict::Dispatch(route) => handlers::body_limit(*route, head.method, front.config()),
        _ => front.config().http.max_body_bytes,
    }
}

fn verdict(front: &Front, head: &Head<'_>) -> Verdict {
    if !front.auth().allows(head) {
        return Verdict::Unauthorized;
    }
    if head.path == b"*" {
        return Verdict::Options(None);
    }
    match router::lookup(head.path) {
        None => Verdict::NotFound,
        Some(route) if !route.allows(head.method) => Verdict::MethodNotAllowed(route),
        Some(route) if head.method == Method::Options => Verdict::Options(Some(route)),
        Some(route) => Verdict::Dispatch(route),
    }
}

/// A connection's byte stream: plain TCP or TLS over it.
pub trait Io: AsyncReadRent + AsyncWriteRent {}

impl<T: AsyncReadRent + AsyncWriteRent> Io for T {}

/// Serves one connection. `fd` is the socket under `stream` (the housekeeping tick shuts it
/// down to end idle or stalled connections).
pub async fn run<S: Io>(front: Rc<Front>, mut stream: S, fd: RawFd) {
    let conn = front.register(fd);
    let mut rbuf: Vec<u8> = Vec::with_capacity(READ_BUF_INITIAL_BYTES);
    let mut wbuf: Vec<u8> = Vec::with_capacity(4096);
    let mut scratch: Vec<u8> = Vec::new();
    let mut pending = Pending::None;
    // When the body of the request being framed started to arrive over several reads (its
    // receiving counts in a put's transfer time).
    let mut body_since: Option<Instant> = None;
    let mut continue_sent = false;
    let mut charge = BufferCharge {
        front: &front,
        bytes: 0,
    };

    loop {
        // Answer every complete request in the buffer.
        let mut start = 0;
        let mut close = false;
        loop {
            // The common case, a whole request already in the buffer, is parsed once here;
            // everything else (partial heads, chunked or large bodies, early answers) goes
            // through `frame`, which keeps the framing state.
            let complete = match pending {
                Pending::None => complete_request(&front, &rbuf[start..]),
                _ => None,
            };
            if let Some((head, total, verdict)) = complete {
                conn.set(ConnState::Busy);
                let req_bytes = &rbuf[start..start + total];
                let (tail, must_close, sending) = dispatch(
                    &front,
                    &head,
                    verdict,
                    req_bytes,
                    None,
                    None,
                    &mut scratch,
                    &mut wbuf,
                )
                .await;
                close |= must_close;
                if let Some(tail) = tail
                    && (!flush(&mut stream, &mut wbuf).await
                        || !write_tail(&front, &mut stream, tail, head.minor_version == 0).await)
                {
                    return;
                }
                record_transfer(&front, sending);
                continue_sent = false;
                start += total;
                if close {
                    break;
                }
                if wbuf.len() >= WRITE_BUF_FLUSH_BYTES && !flush(&mut stream, &mut wbuf).await {
                    return;
                }
                continue;
            }
            let framed = frame(&front, &mut rbuf, start, &mut pending);
            let (head_len, body_end, next, early) = match framed {
                Framed::NeedMore => {
                    if !matches!(pending, Pending::None) && body_since.is_none() {
                        body_since = Some(Instant::now());
                    }
                    break;
                }
                Framed::Stream { head_len, body_len } => {
                    body_since = None;
                    // The answers before this one go out first (they are complete).
                    if !wbuf.is_empty() && !flush(&mut stream, &mut wbuf).await {
                        return;
                    }
                    let streamed = stream_put(
                        &conn,
                        &mut stream,
                        &rbuf[start..],
                        head_len,
                        body_len,
                        &mut scratch,
                        &mut wbuf,
                    )
                    .await;
                    // The rest of the buffer was this request's body.
                    rbuf.truncate(start);
                    continue_sent = false;
                    match streamed {
                        None => return,
                        Some(true) => {
                            close = true;
                            break;
                        }
                        Some(false) => continue,
                    }
                }
                Framed::Malformed(e) => {
                    body_since = None;
                    conn.set(ConnState::Busy);
                    let mut resp =
                        Response::error(e.status, e.message, front.unix_secs(), &mut scratch);
                    resp.close = true;
                    front.encode(resp, None, &scratch, &mut wbuf);
                    close = true;
                    break;
                }
                Framed::Request {
                    head_len,
                    body_end,
                    next,
                    early,
                } => (head_len, body_end, next, early),
            };
            conn.set(ConnState::Busy);
            let req_bytes = &rbuf[start..start + body_end];
            let Parsed::Complete(head) = parse_head(&req_bytes[..head_len]) else {
                unreachable!("a framed head parses again");
            };
            let verdict = verdict(&front, &head);
            let (tail, must_close, sending) = dispatch(
                &front,
                &head,
                verdict,
                req_bytes,
                early,
                body_since.take(),
                &mut scratch,
                &mut wbuf,
            )
            .await;
            close |= must_close;
            if let Some(tail) = tail {
                // Head first, then the body from where it is.
                if !flush(&mut stream, &mut wbuf).await
                    || !write_tail(&front, &mut stream, tail, head.minor_version == 0).await
                {
                    return;
                }
            }
            record_transfer(&front, sending);
            continue_sent = false;
            start += next;
            if close {
                break;
            }
            if wbuf.len() >= WRITE_BUF_FLUSH_BYTES && !flush(&mut stream, &mut wbuf).await {
                return;
            }
        }
        if start > 0 {
            rbuf.drain(..start);
        }
        if !wbuf.is_empty() && !flush(&mut stream, &mut wbuf).await {
            return;
        }
        if close {
            linger(&mut stream, fd, rbuf).await;
            return;
        }
        if front.is_draining() && rbuf.is_empty() {
            return;
        }
        // The client waits for our go-ahead before sending a body it announced.
        if !continue_sent && wants_continue(&rbuf, &pending) {
            wbuf.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            if !flush(&mut stream, &mut wbuf).await {
                return;
            }
            continue_sent = true;
        }
        if rbuf.is_empty() {
            conn.set(ConnState::Idle);
            if rbuf.capacity() > READ_BUF_KEEP_BYTES {
                rbuf = Vec::with_capacity(READ_BUF_INITIAL_BYTES);
                charge.settle(rbuf.capacity());
            }
        } else {
            conn.set(ConnState::Reading);
        }
        // Read more, at least a few KiB of room; a known body gets room for all of it.
        let want = match &pending {
            Pending::Length { total, .. } => total.saturating_sub(rbuf.len()),
            _ => 0,
        };
        let needed = want.max(4096);
        if rbuf.capacity() - rbuf.len() < needed {
            // The capacity `reserve` will pick (it doubles, or takes exactly what is needed).
            let grown = (rbuf.capacity() * 2).max(rbuf.len() + needed);
            if !charge.fits(grown) {
                // The shard's connections already hold their budget of buffered requests:
                // shed this one rather than grow memory without bound.
                let resp = {
                    let mut ctx = Ctx {
                        shard: front.shard(),
                        scratch: &mut scratch,
                    };
                    let mut r = ctx.overloaded();
                    r.close = true;
                    r
                };
                front.encode(resp, None, &scratch, &mut wbuf);
                if flush(&mut stream, &mut wbuf).await {
                    linger(&mut stream, fd, rbuf).await;
                }
                return;
            }
            rbuf.reserve(needed);
            charge.settle(rbuf.capacity());
        }
        let len = rbuf.len();
        let (res, slice) = stream.read(rbuf.slice_mut(len..)).await;
        rbuf = slice.into_inner();
        match res {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// The part of a connection's read buffer charged to its shard's budget
/// (`ock.mmc.http.max_buffered_bytes_per_shard`): its capacity beyond the initial size.
struct BufferCharge<'a> {
    front: &'a Front,
    bytes: usize,
}

impl BufferCharge<'_> {
    /// Whether the buffer may grow to `capacity` within the shard's budget.
    fn fits(&self, capacity: usize) -> bool {
        let extra = capacity.saturating_sub(READ_BUF_INITIAL_BYTES);
        let held = self.front.shard().stats().buffered_bytes.get() as u64;
        let limit = self.front.config().http.max_buffered_bytes_per_shard;
        held - self.bytes as u64 + extra as u64 <= limit
    }

    /// Charges the buffer's capacity now.
    fn settle(&mut self, capacity: usize) {
        let extra = capacity.saturating_sub(READ_BUF_INITIAL_BYTES);
        let stats = self.front.shard().stats();
        stats.buffered_bytes.add(extra as i64 - self.bytes as i64);
        self.bytes = extra;
    }
}

impl Drop for BufferCharge<'_> {
    fn drop(&mut self) {
        self.settle(0);
    }
}

/// A request whose head and whole body are in `buf`, needing no early answer: its head, total
/// length and verdict (computed once, for the body limit and for [`dispatch`]). `None` leaves
/// the decision to [`frame`].
fn complete_request<'b>(front: &Front, buf: &'b [u8]) -> Option<(Head<'b>, usize, Verdict)> {
    let Parsed::Complete(head) = parse_head(buf) else {
        return None;
    };
    let total = match head.framing {
        Framing::None => head.len,
        Framing::Length(n) => {
            let total = head.len.checked_add(usize::try_from(n).ok()?)?;
            if total > buf.len() {
                return None;
            }
            total
        }
        Framing::Chunked => return None,
    };
    let verdict = verdict(front, &head);
    if let Framing::Length(n) = head.framing
        && n > body_limit_for(front, &head, &verdict)
    {
        return None;
    }
    Some((head, total, verdict))
}

/// Decides whether a complete request sits at `rbuf[start..]`, advancing body framing.
fn frame(front: &Front, rbuf: &mut Vec<u8>, start: usize, pending: &mut Pending) -> Framed {
    loop {
        let avail = rbuf.len() - start;
        match pending {
            Pending::Length { head_len, total } => {
                let (head_len, total) = (*head_len, *total);
                if avail < total {
                    return Framed::NeedMore;
                }
                *pending = Pending::None;
                return Framed::Request {
                    head_len,
                    body_end: total,
                    next: total,
                    early: None,
                };
            }
            Pending::Chunked {
                dec,
                head_len,
                write,
                read,
            } => {
                let region = &mut rbuf[start..];
                let mut w = *write;
                let mut r = *read;
                let progress = dec.decode_in_place(region, &mut w, &mut r);
                // Drop the consumed chunk framing so the buffer holds head, decoded body,
                // then undecoded input.
                rbuf.drain(start + w..start + r);
                *write = w;
                *read = w;
                match progress {
                    Err(e) if e.status == Status::PAYLOAD_TOO_LARGE => {
                        let head_len = *head_len;
                        *pending = Pending::None;
                        return Framed::Request {
                            head_len,
                            body_end: head_len,
                            next: head_len,
                            early: Some(Early::TooLarge),
                        };
                    }
                    Err(e) => {
                        *pending = Pending::None;
                        return Framed::Malformed(e);
                    }
                    Ok(Progress::NeedMore) => return Framed::NeedMore,
                    Ok(Progress::Done) => {
                        let head_len = *head_len;
                        *pending = Pending::None;
                        return Framed::Request {
                            head_len,
                            body_end: w,
                            next: w,
                            early: None,
                        };
                    }
                }
            }
            Pending::None => {
                if avail == 0 {
                    return Framed::NeedMore;
                }
                let head = match parse_head(&rbuf[start..]) {
                    Parsed::Complete(h) => h,
                    Parsed::Partial => return Framed::NeedMore,
                    Parsed::Error(e) => return Framed::Malformed(e),
                };
                let head_len = head.len;
                let verdict = verdict(front, &head);
                let limit = body_limit_for(front, &head, &verdict);
                let route = match verdict {
                    Verdict::Dispatch(route) => Some(route),
                    _ => None,
                };
                let dispatchable = route.is_some();
                match head.framing {
                    Framing::None => {
                        return Framed::Request {
                            head_len,
                            body_end: head_len,
                            next: head_len,
                            early: None,
                        };
                    }
                    Framing::Length(n) if n > limit => {
                        return Framed::Request {
                            head_len,
                            body_end: head_len,
                            next: head_len,
                            early: Some(Early::TooLarge),
                        };
                    }
                    Framing::Length(n) => {
                        let total = head_len + n as usize;
                        if avail >= total {
                            return Framed::Request {
                                head_len,
                                body_end: total,
                                next: total,
                                early: None,
                            };
                        }
                        if !dispatchable {
                            return Framed::Request {
                                head_len,
                                body_end: head_len,
                                next: head_len,
                                early: Some(Early::BodyNotRead),
                            };
                        }
                        if route.is_some_and(|r| handlers::streams_body(r, head.method, n)) {
                            return Framed::Stream {
                                head_len,
                                body_len: n as usize,
                            };
                        }
                        *pending = Pending::Length { head_len, total };
                        return Framed::NeedMore;
                    }
                    Framing::Chunked => {
                        *pending = Pending::Chunked {
                            dec: ChunkedDecoder::new(limit),
                            head_len,
                            write: head_len,
                            read: head_len,
                        };
                        // Loop once more to decode whatever already arrived.
                    }
                }
            }
        }
    }
}

/// Whether the request at the start of the buffer announced `Expect: 100-continue` and is
/// waiting for its body.
fn wants_continue(rbuf: &[u8], pending: &Pending) -> bool {
    if matches!(pending, Pending::None) {
        return false;
    }
    matches!(parse_head(rbuf), Parsed::Complete(h) if h.expect_continue)
}

/// A data-plane body being sent, and when its sending (the copy out of its blobs) began.
type Sending = Option<(response::Transfer, Instant)>;

/// Records a data-plane body in the client bandwidth metrics once it has been handed to the
/// socket: its transfer took from the start of its encoding (the copy out of the blob, into
/// the write buffer or straight to the socket) until now.
fn record_transfer(front: &Front, sending: Sending) {
    if let Some((t, from)) = sending {
        let transfer_ns = from.elapsed().as_nanos() as u64;
        let latency_us = t.started.elapsed().as_micros() as u64;
        front
            .shard()
            .remote()
            .client
            .record(t.rank, t.op, t.bytes, transfer_ns, latency_us);
    }
}

/// Answers one request into `wbuf`; `verdict` is [`verdict`] of `head`; `body_since` is when
/// its body started to arrive, if over several reads. Returns what to write after the head,
/// whether the connection closes after this answer, and the data-plane body to record once
/// sent.
#[allow(clippy::too_many_arguments)]
async fn dispatch(
    front: &Front,
    head: &Head<'_>,
    verdict: Verdict,
    req_bytes: &[u8],
    early: Option<Early>,
    body_since: Option<Instant>,
    scratch: &mut Vec<u8>,
    wbuf: &mut Vec<u8>,
) -> (Option<Tail>, bool, Sending) {
    // The head is parsed (a body over several reads began to arrive after it).
    let started = body_since.map_or_else(Instant::now, |t| t.min(Instant::now()));
    let shard = front.shard();
    let stats = shard.stats();
    stats.http_requests.inc();
    let mut ctx = Ctx { shard, scratch };
    let routed = match &verdict {
        Verdict::Dispatch(route) => Some(*route),
        _ => None,
    };
    let mut resp = match (early, verdict) {
        (_, Verdict::Unauthorized) => {
            let mut r = ctx.protocol_error(
                Status::UNAUTHORIZED,
                "Unauthorized: missing or invalid bearer token",
            );
            r.www_authenticate = Some(auth::CHALLENGE);
            r
        }
        (Some(Early::TooLarge), _) => {
            let message = handlers::body_limit_message(routed, head.method, front.config());
            let mut r = ctx.protocol_error(TOO_LARGE.status, &message);
            r.close = true;
            r
        }
        (_, Verdict::NotFound) => ctx.protocol_error(Status::NOT_FOUND, "Not found"),
        (_, Verdict::MethodNotAllowed(route)) => {
            let mut r = ctx.protocol_error(Status::METHOD_NOT_ALLOWED, "Method not allowed");
            r.allow = Some(route.spec().allow);
            r
        }
        (_, Verdict::Options(route)) => {
            let mut r = Response::new(
                Status::NO_CONTENT,
                response::ContentType::Text,
                response::Body::Empty,
            );
            r.content_type = None;
            r.allow =
                Some(route.map_or("GET, HEAD, PUT, POST, DELETE, OPTIONS", |r| r.spec().allow));
            r
        }
        (Some(Early::BodyNotRead), Verdict::Dispatch(_)) => {
            unreachable!("dispatchable requests wait for their body")
        }
        (None, Verdict::Dispatch(route)) => {
            let req = Request {
                head,
                route,
                body: &req_bytes[head.len..],
                body_since,
            };
            match shard.load.enter() {
                // Too much work already waits on this shard: shed at once.
                None => ctx.overloaded(),
                Some(_working) => handlers::handle(&req, &mut ctx).await,
            }
        }
    };
    if early.is_some() || !head.keep_alive || front.is_draining() {
        resp.close = true;
    }
    // HTTP/1.0 has no chunked encoding: a streamed body ends with the connection.
    if head.minor_version == 0 && matches!(resp.body, Body::KeyStream(_)) {
        resp.close = true;
    }
    let close = resp.close;
    let transfer = resp.transfer.take();
    let from = Instant::now();
    let tail = front.encode(resp, Some(head), scratch, wbuf);
    let op = handlers::request_op(routed, head.method);
    front
        .shard()
        .stats()
        .request_durations
        .observe(op, started.elapsed());
    (tail, close, transfer.map(|t| (t, from)))
}

/// Serves a put whose body is still arriving ([`Framed::Stream`]): the owner allocates first,
/// then the body goes from the socket into the blobs (host memory directly; device memory
/// through a bounded staging buffer), then the commit. `req` is the head and the body bytes
/// that already arrived. The answer is encoded into `wbuf`. Returns whether the connection
/// closes after it, or `None` when it broke (an allocation is then aborted).
async fn stream_put<S: Io>(
    conn: &ConnGuard,
    stream: &mut S,
    req: &[u8],
    head_len: usize,
    body_len: usize,
    scratch: &mut Vec<u8>,
    wbuf: &mut Vec<u8>,
) -> Option<bool> {
    let Parsed::Complete(head) = parse_head(&req[..head_len]) else {
        unreachable!("a framed head parses again");
    };
    let front: &Front = &conn.front;
    let received = &req[head_len..];
    debug_assert!(received.len() < body_len);
    // Allocating is the server's time; the body's deadlines start with its first read.
    conn.set(ConnState::Busy);
    let started = Instant::now();
    let shard = front.shard();
    shard.stats().http_requests.inc();
    let mut ctx = Ctx { shard, scratch };
    let request = Request {
        head: &head,
        route: Route::Objects,
        body: &[],
        body_since: None,
    };
    // With `Expect: 100-continue` the client sends the body only after our go-ahead, so a put
    // refused before allocation is answered at once and the connection closed.
    let mut refused_unread = false;
    let mut resp = match shard.load.enter() {
        None => {
            let mut r = ctx.overloaded();
            r.close = true;
            r
        }
        Some(_working) => {
            let fill = async |grant: Option<&crate::shards::WriteGrant>| match grant {
                None if head.expect_continue => {
                    refused_unread = true;
                    handlers::Filled::Ok
                }
                None => {
                    let mut clock = BodyClock::start(front, conn, received.len());
                    discard_body(stream, body_len - received.len(), &mut clock).await
                }
                Some(grant) => {
                    if head.expect_continue
                        && stream
                            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n".to_vec())
                            .await
                            .0
                            .is_err()
                    {
                        return handlers::Filled::Broken;
                    }
                    let mut clock = BodyClock::start(front, conn, received.len());
                    fill_blobs(stream, grant, received, body_len, &mut clock).await
                }
            };
            let resp = handlers::put_streamed(&request, &mut ctx, body_len as u64, fill).await?;
            // The body is in: its deadlines no longer apply to the answer.
            conn.set(ConnState::Busy);
            resp
        }
    };
    if refused_unread || !head.keep_alive || front.is_draining() {
        resp.close = true;
    }
    let close = resp.close;
    let tail = front.encode(resp, Some(&head), scratch, wbuf);
    debug_assert!(tail.is_none(), "a put's answer is JSON");
    let durations = &front.shard().stats().request_durations;
    durations.observe(crate::metrics::requests::ReqOp::Put, started.elapsed());
    Some(close)
}

/// The deadlines of a streamed body, kept in the connection's registry entry for the sweep
/// (which ends the reads of a body past its deadline). The next bytes are due within
/// `ock.mmc.http.body_timeout_ms` of the last read (nginx's `client_body_timeout`), and the
/// body as a whole must keep up with `ock.mmc.http.body_min_rate_bytes_per_sec` after a first
/// `body_timeout_ms` of grace: a client trickling a byte a second is cut as surely as a silent one.
struct BodyClock<'a> {
    conn: &'a ConnGuard,
    start_ms: u64,
    timeout_ms: u64,
    min_rate: u64,
    received: u64,
}

impl<'a> BodyClock<'a> {
    /// A body of which `received` bytes already arrived with the head.
    fn start(front: &Front, conn: &'a ConnGuard, received: usize) -> BodyClock<'a> {
        let config = front.config();
        let mut clock = BodyClock {
            conn,
            start_ms: conn.now_ms(),
            timeout_ms: config.body_timeout_ms(),
            min_rate: config.http.body_min_rate_bytes_per_sec,
            received: 0,
        };
        clock.advance(received);
        clock
    }

    /// `n` more bytes arrived: move the deadline.
    fn advance(&mut self, n: usize) {
        self.received += n as u64;
        let idle = self.conn.now_ms().saturating_add(self.timeout_ms);
        let paced = match self.min_rate {
            0 => u64::MAX,
            rate => self
                .start_ms
                .saturating_add(self.timeout_ms)
                .saturating_add(self.received.saturating_mul(1000) / rate),
        };
        self.conn.body_deadline(idle.min(paced));
    }

    /// A read ended without bytes: the sweep's doing (408) or the client's (nobody to answer).
    fn ended(&self) -> handlers::Filled {
        if self.conn.body_timed_out() {
            handlers::Filled::TimedOut
        } else {
            handlers::Filled::Broken
        }
    }
}

/// Moves a body into every blob of `grant`: `received` (already read), then the rest from the
/// socket. One host-memory blob is read into directly; otherwise the bytes pass through a
/// staging buffer of at most [`STAGING_BYTES`]. The grant is checked between reads: once the
/// owner revoked it (the key was removed, the allocation reclaimed) nothing more is written
/// into the blobs and the rest of the body is read and dropped.
async fn fill_blobs<S: Io>(
    stream: &mut S,
    grant: &crate::shards::WriteGrant,
    received: &[u8],
    body_len: usize,
    clock: &mut BodyClock<'_>,
) -> handlers::Filled {
    use crate::shards::store::ssd::IoBuffer;
    use handlers::Filled;
    let blobs = &grant.blobs[..];
    let write_all = |offset: usize, data: &[u8]| -> std::io::Result<()> {
        for b in blobs {
            // SAFETY: the blobs are the grant's until it ends (commit or abort), even when it
            // is revoked; it is checked before every write.
            unsafe { b.seg.backend.write(b.offset + offset as u64, data)? };
        }
        Ok(())
    };
    if grant.is_revoked() {
        return discard_body(stream, body_len - received.len(), clock).await;
    }
    if let Err(e) = write_all(0, received) {
        return Filled::SegmentError(e);
    }
    grant.wrote(received.len() as u64);
    let mut filled = received.len();
    if let [b] = blobs
        && b.seg.backend.host_region().is_some()
    {
        while filled < body_len {
            if grant.is_revoked() {
                return discard_body(stream, body_len - filled, clock).await;
            }
            // SAFETY: the blob is this grant's until it ends, and the grant (held by our
            // caller) outlives the read; a revoked grant is not read into again.
            let view = unsafe {
                IoBuffer::segment_view(
                    b.seg.clone(),
                    b.offset + filled as u64,
                    body_len - filled,
                    false,
                )
            };
            let view = match view {
                Ok(v) => v,
                Err(e) => return Filled::SegmentError(e),
            };
            match stream.read(view).await.0 {
                Ok(0) | Err(_) => return clock.ended(),
                Ok(n) => {
                    filled += n;
                    grant.wrote(n as u64);
                    clock.advance(n);
                }
            }
        }
        return Filled::Ok;
    }
    let mut staging = staging::take();
    let mut failed = None;
    while filled < body_len {
        let want = staging.capacity().min(body_len - filled);
        staging.clear();
        let (res, slice) = stream.read(staging.slice_mut(0..want)).await;
        staging = slice.into_inner();
        match res {
            Ok(0) | Err(_) => return clock.ended(),
            Ok(n) => {
                // After a failed copy (or once the grant is revoked) the rest of the body is
                // still read, and dropped.
                if failed.is_none()
                    && !grant.is_revoked()
                    && let Err(e) = write_all(filled, &staging[..n])
                {
                    failed = Some(e);
                }
                filled += n;
                grant.wrote(n as u64);
                clock.advance(n);
            }
        }
    }
    staging::give(staging);
    failed.map_or(Filled::Ok, Filled::SegmentError)
}

/// Reads and drops `len` body bytes, under the body's deadlines.
async fn discard_body<S: Io>(
    stream: &mut S,
    mut len: usize,
    clock: &mut BodyClock<'_>,
) -> handlers::Filled {
    let mut buf = staging::take();
    while len > 0 {
        let want = buf.capacity().min(len);
        buf.clear();
        let (res, slice) = stream.read(buf.slice_mut(0..want)).await;
        buf = slice.into_inner();
        match res {
            Ok(0) | Err(_) => return clock.ended(),
            Ok(n) => {
                len -= n;
                clock.advance(n);
            }
        }
    }
    staging::give(buf);
    handlers::Filled::Ok
}

/// Staging buffers ([`STAGING_BYTES`] each) reused by this thread's (this shard's)
/// connections: bytes on their way to or from device memory, and bodies read only to be
/// dropped. A buffer allocated per request is a fresh mapping each time (the allocator
/// returns a megabyte to the kernel on free): every page faulted in and zeroed again, which
/// made a 1 MiB get from HBM cost 3.6 times the CPU of one from DRAM.
mod staging {
    use std::cell::RefCell;

    use super::{STAGING_BYTES, STAGING_POOL_BUFFERS};

    thread_local! {
        static POOL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    }

    /// A buffer of [`STAGING_BYTES`] capacity (its length is whatever its last use left).
    pub fn take() -> Vec<u8> {
        POOL.with(|p| p.borrow_mut().pop())
            .unwrap_or_else(|| Vec::with_capacity(STAGING_BYTES))
    }

    /// Gives a buffer back; past [`STAGING_POOL_BUFFERS`] kept (or a smaller one), it is freed.
    pub fn give(buf: Vec<u8>) {
        if buf.capacity() < STAGING_BYTES {
            return;
        }
        POOL.with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < STAGING_POOL_BUFFERS {
                p.push(buf);
            }
        });
    }

    #[cfg(test)]
    pub fn pooled() -> usize {
        POOL.with(|p| p.borrow().len())
    }
}

/// Writes the body parts that follow a head: shared bytes and pinned blobs (host memory
/// straight from the segment; device memory through a bounded buffer), or a key stream.
async fn write_tail<S: Io>(front: &Front, stream: &mut S, tail: Tail, http10: bool) -> bool {
    match tail {
        Tail::Parts(parts) => {
            for part in parts {
                let ok = match part {
                    Part::Bytes(b) => stream.write_all(b).await.0.is_ok(),
                    Part::Blob(p) => write_blob(stream, &p).await,
                };
                if !ok {
                    return false;
                }
            }
            true
        }
        Tail::KeyStream(listing) => stream_keys(front, stream, listing, !http10).await,
    }
}

async fn write_blob<S: Io>(stream: &mut S, p: &crate::shards::PinnedBlob) -> bool {
    use crate::shards::store::ssd::IoBuffer;
    let v = &p.view;
    let len = v.len as usize;
    if v.seg.backend.host_region().is_some() {
        // SAFETY: the blob is pinned (readable, never written) until `p` is dropped, after
        // this write completes.
        return match unsafe { IoBuffer::segment_view(v.seg.clone(), v.offset, len, true) } {
            Ok(buf) => stream.write_all(buf).await.0.is_ok(),
            Err(_) => false,
        };
    }
    // Device memory is not addressable here: copy out a staging buffer at a time.
    let mut buf = staging::take();
    let mut done = 0;
    while done < len {
        let n = STAGING_BYTES.min(len - done);
        // Only a buffer shorter than `n` is zero-filled (up to `n`), once; then it is
        // overwritten by the device's bytes.
        buf.resize(n, 0);
        // SAFETY: as above.
        if unsafe { v.seg.backend.read(v.offset + done as u64, &mut buf) }.is_err() {
            return false;
        }
        let (res, b) = stream.write_all(buf).await;
        buf = b;
        if res.is_err() {
            return false;
        }
        done += n;
    }
    staging::give(buf);
    true
}

/// Streams `/get_all_keys` shard by shard, one page per chunk.
async fn stream_keys<S: Io>(
    front: &Front,
    stream: &mut S,
    listing: KeyListing,
    chunked: bool,
) -> bool {
    let mut cursor = KeyCursor::new(listing.limit);
    while let Some(page) = cursor.next_page(front.shard(), &listing.prefix).await {
        let Ok(text) = page else {
            log::warn!(
                "shard {}: a key listing failed midway; closing the stream",
                front.shard().id
            );
            return false;
        };
        let out = if chunked {
            let mut framed = Vec::with_capacity(text.len() + 20);
            framed.extend_from_slice(format!("{:x}\r\n", text.len()).as_bytes());
            framed.extend_from_slice(&text);
            framed.extend_from_slice(b"\r\n");
            framed
        } else {
            text
        };
        if stream.write_all(out).await.0.is_err() {
            return false;
        }
    }
    !chunked || stream.write_all(&b"0\r\n\r\n"[..]).await.0.is_ok()
}

async fn flush<S: Io>(stream: &mut S, wbuf: &mut Vec<u8>) -> bool {
    let buf = std::mem::take(wbuf);
    let (res, mut buf) = stream.write_all(buf).await;
    buf.clear();
    *wbuf = buf;
    res.is_ok()
}

/// Closes gracefully after an error answer: stop sending, then read and discard what the
/// client still sends (bounded in bytes and time), so the kernel does not reset the connection
/// and destroy the answer before the client read it.
async fn linger<S: Io>(stream: &mut S, fd: RawFd, mut buf: Vec<u8>) {
    // SAFETY: the fd is open for the lifetime of `stream`.
    unsafe { libc::shutdown(fd, libc::SHUT_WR) };
    let deadline = std::time::Instant::now() + Duration::from_millis(LINGER_MS);
    let mut discarded = 0;
    buf.clear();
    buf.reserve(16 * 1024);
    while discarded < LINGER_DISCARD_BYTES {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break;
        }
        buf.clear();
        let read = monoio::time::timeout(left, stream.read(buf)).await;
        match read {
            Ok((Ok(n), b)) if n > 0 => {
                discarded += n;
                buf = b;
            }
            _ => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_buffers_are_reused_up_to_the_pool_size() {
        let a = staging::take();
        assert_eq!(a.capacity(), STAGING_BYTES);
        let ptr = a.as_ptr();
        staging::give(a);
        let b = staging::take();
        assert_eq!(b.as_ptr(), ptr, "the same buffer comes back");
        staging::give(b);
        // More buffers out at once than the pool keeps: the extra ones are freed.
        let many: Vec<Vec<u8>> = (0..STAGING_POOL_BUFFERS + 3)
            .map(|_| staging::take())
            .collect();
        assert_eq!(staging::pooled(), 0);
        for b in many {
            staging::give(b);
        }
        assert_eq!(staging::pooled(), STAGING_POOL_BUFFERS);
        // A buffer of another size is not kept.
        let mut c = staging::take();
        c.shrink_to(0);
        staging::give(c);
        assert_eq!(staging::pooled(), STAGING_POOL_BUFFERS - 1);
    }
}
