//! Dispatch: one framed request becomes one answer ([`answer`]), through the router, the
//! auth check and the handler, encoded into the write buffer.

use std::time::Instant;

use smallvec::SmallVec;

use std::os::fd::RawFd;

use super::body_io::write_tail;
use super::framing::{Early, Verdict};
use super::same_host;
use super::{Io, send_with_body};
use crate::http::Front;
use crate::http::chunked::TOO_LARGE;
use crate::http::handlers::{self, Ctx, Request};
use crate::http::parse::{Head, Method, ProtocolError};
use crate::http::response::{self, Body, Response, SCRATCH_IN_PLACE_BYTES, Status, Tail};
use crate::http::router::Route;
use crate::http::same_host::LocalPeer;
use crate::http::spans::RequestSpan;

/// Answers one framed request: dispatches it through auth, router and handler (`verdict` is
/// [`verdict`] of `head`; `body_since` is when its body started to arrive, if over several
/// reads), writes its answer (the head into `wbuf`, then a tail straight to the socket) and
/// records its transfer. `direct`: the plain socket under `stream`, to which a large body
/// built in `scratch` is written from there with its head. `None`: the connection broke;
/// else whether it closes after this answer.
#[allow(clippy::too_many_arguments)]
pub(super) async fn answer<S: Io>(
    front: &Front,
    stream: &mut S,
    direct: Option<RawFd>,
    peer: Option<&LocalPeer>,
    head: &Head<'_>,
    verdict: Verdict,
    req_bytes: &[u8],
    early: Option<Early>,
    body_since: Option<Instant>,
    scratch: &mut Vec<u8>,
    wbuf: &mut Vec<u8>,
) -> Option<bool> {
    // The head is parsed (a body over several reads began to arrive after it).
    let now = Instant::now();
    let started = body_since.map_or(now, |t| t.min(now));
    let shard = front.shard();
    let stats = shard.stats();
    stats.http_requests.inc();
    let routed = verdict.dispatched();
    let telemetry = &shard.shared.exports.telemetry;
    let span = RequestSpan::start(telemetry, head, started);
    let trace = span.as_ref().map(RequestSpan::context);
    let mut ctx = Ctx {
        shard,
        scratch,
        trace,
    };
    // The same-host path: a peer of the Unix socket naming its memory (`X-Mmc-Iov`).
    // A leading `~` (gets only): the object may be shorter than the memory named, and goes
    // into its first bytes.
    let mut up_to = false;
    let same_host = match (peer, head.same_host_iov, &verdict) {
        (Some(peer), Some(text), Verdict::Dispatch(Route::Objects)) => {
            let text = match text.strip_prefix(b"~") {
                Some(rest) if head.method == Method::Get => {
                    up_to = true;
                    rest
                }
                _ => text,
            };
            Some((peer, crate::http::same_host::parse_iov(text)))
        }
        _ => None,
    };
    // Buffers it shares, offered on the request that first names them (a refused one is
    // copied through the kernel as any other memory).
    if let (Some((peer, Some(_))), Some(text)) = (&same_host, head.same_host_shared) {
        let refused = peer.share(text);
        if refused > 0 {
            shard.stats().same_host.shared_refusals.add(refused);
        }
    }
    // `X-Mmc-Map: N`: the client is done copying from the mapped answers up to lease N.
    if let (Some(peer), Some(n)) = (peer, head.same_host_map) {
        if let Some(n) = std::str::from_utf8(n)
            .ok()
            .and_then(|t| t.parse::<u64>().ok())
        {
            peer.release(n);
        }
    }
    let mut resp = match (early, verdict) {
        (None, Verdict::Dispatch(_)) if matches!(same_host, Some((_, None))) => {
            ctx.protocol_error(Status::BAD_REQUEST, "Bad request: malformed X-Mmc-Iov")
        }
        (None, Verdict::Dispatch(route)) => {
            let req = Request {
                head,
                route,
                body: &req_bytes[head.len..],
                body_since,
                dispatched: now,
            };
            // Membership messages are counted but never shed (`Route::is_membership`).
            let working = if route.is_membership() {
                Some(shard.load.enter_always())
            } else {
                shard.load.enter()
            };
            match working {
                // Too much work already waits on this shard: shed at once.
                None => ctx.overloaded(),
                Some(_working) => match same_host {
                    Some((peer, Some(iov))) if head.method == Method::Put => {
                        same_host::put(peer, &req, &mut ctx, &iov).await
                    }
                    Some((peer, Some(iov))) if head.method == Method::Get => {
                        let mut resp = handlers::handle(&req, &mut ctx).await;
                        if !(head.same_host_map.is_some()
                            && same_host::map(peer, &iov, up_to, &mut ctx, &mut resp))
                        {
                            same_host::deliver(peer, &iov, up_to, &mut ctx, &mut resp);
                        }
                        resp
                    }
                    _ => handlers::handle(&req, &mut ctx).await,
                },
            }
        }
        (early, verdict) => refusal(front, head, early, verdict, &mut ctx),
    };
    if routed == Some(Route::Health) {
        resp.same_host = response::SameHost::Advert;
    }
    if early.is_some() || !head.keep_alive || front.is_draining() {
        resp.close = true;
    }
    // HTTP/1.0 has no chunked encoding: a streamed body ends with the connection.
    if head.minor_version == 0 && matches!(resp.body, Body::KeyStream(_)) {
        resp.close = true;
    }
    let close = resp.close;
    if let Some(span) = span {
        let shards = shard.shared.shard_count();
        let body = req_bytes.len().saturating_sub(head.len) as u64;
        let scratch_len = scratch.len();
        span.finish(
            telemetry,
            head,
            routed,
            shard.id,
            shards,
            body,
            &resp,
            scratch_len,
        );
    }
    // A large body built in scratch (a scrape) is not copied after its head: both go to the
    // socket in one vectored write (but for the last answer, which carries the FIN).
    let in_place = direct.filter(|_| {
        !close && matches!(resp.body, Body::Scratch) && scratch.len() >= SCRATCH_IN_PLACE_BYTES
    });
    if in_place.is_some() {
        resp.body = Body::ScratchInPlace;
    }
    // A data-plane body's transfer is timed from here (the clock is read only for one).
    let sending = resp
        .transfer
        .take()
        .map(|t| booked(*t, &resp.body))
        .map(|(t, ranks)| (t, ranks, Instant::now()));
    let tail = front.encode(resp, Some(head), scratch, wbuf);
    let op = handlers::request_op(routed, head.method);
    front
        .shard()
        .stats()
        .request_durations
        .observe(op, started.elapsed());
    match (tail, in_place) {
        (Some(Tail::Scratch), Some(fd)) => {
            if !send_with_body(fd, wbuf, scratch) {
                return None;
            }
        }
        // The head with the body from where it is.
        (Some(tail), _) => {
            if !write_tail(front, stream, wbuf, tail, head.minor_version == 0).await {
                return None;
            }
        }
        (None, _) => {}
    }
    record_transfer(front, sending);
    Some(close)
}

/// Answers bytes that are no request (the connection closes after it).
pub(super) fn answer_malformed(
    front: &Front,
    e: ProtocolError,
    scratch: &mut Vec<u8>,
    wbuf: &mut Vec<u8>,
) {
    let kind = crate::common::error_kind::ErrorKind::for_status(e.status.0);
    let mut resp = Response::error(e.status, kind, e.message, front.unix_secs(), scratch);
    resp.close = true;
    front.encode(resp, None, scratch, wbuf);
}

/// A data-plane body being sent, the bytes it books per rank, and when its sending (the copy
/// out of its blobs) began.
pub(super) type Sending = Option<(response::Transfer, Booked, Instant)>;

/// The (rank, bytes) a body books in the client bandwidth metrics.
pub(super) type Booked = SmallVec<[(u32, u64); 2]>;

/// A transfer and what it books: its own rank's bytes, or each blob's bytes to the blob's
/// rank (`Transfer::per_blob`).
fn booked(t: response::Transfer, body: &Body) -> (response::Transfer, Booked) {
    let mut ranks = Booked::new();
    match body {
        Body::Parts(parts) if t.per_blob => {
            for p in parts {
                if let response::Part::Blob(b) = p {
                    crate::metrics::client::tally(&mut ranks, b.view.seg.rank, b.view.len);
                }
            }
        }
        _ => ranks.push((t.rank, t.bytes)),
    }
    (t, ranks)
}

/// Records a data-plane body in the client bandwidth metrics once it has been handed to the
/// socket: its transfer took from the start of its encoding (the copy out of the blob, into
/// the write buffer or straight to the socket) until now.
pub(super) fn record_transfer(front: &Front, sending: Sending) {
    if let Some((t, ranks, from)) = sending {
        let now = Instant::now();
        let transfer_ns = now.saturating_duration_since(from).as_nanos() as u64;
        let latency_us = now.saturating_duration_since(t.started).as_micros() as u64;
        front
            .shard()
            .remote()
            .client
            .record_ranks(&ranks, t.op, transfer_ns, latency_us);
    }
}

/// The answer to a request that is not handed to its handler: unauthorized, too large, no
/// such route or method, `OPTIONS`.
fn refusal(
    front: &Front,
    head: &Head<'_>,
    early: Option<Early>,
    verdict: Verdict,
    ctx: &mut Ctx<'_>,
) -> Response {
    let routed = verdict.dispatched();
    match (early, verdict) {
        (_, Verdict::Unauthorized) => {
            if crate::http::router::lookup(head.path).is_some_and(|r| r.is_cluster()) {
                log::warn!(
                    "refused {}: wrong or missing cluster token (ock.mmc.cluster.token)",
                    String::from_utf8_lossy(head.path)
                );
            }
            let mut r = ctx.protocol_error(
                Status::UNAUTHORIZED,
                "Unauthorized: missing or invalid bearer token",
            );
            r.www_authenticate = true;
            r
        }
        (Some(Early::TooLarge), _) => {
            let message = handlers::body_limit_message(routed, head.method, front.config());
            let mut r = ctx.protocol_error(TOO_LARGE.status, &message);
            r.close = true;
            r
        }
        (_, Verdict::NotFound) => ctx.protocol_error(Status::NOT_FOUND, "Not found"),
        (_, Verdict::NotLeader) => not_leader(head, ctx),
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
        (None, Verdict::Dispatch(_)) => unreachable!("dispatched by the caller"),
    }
}

/// The answer of a node that is not the serving leader (HA on) to a route the leader serves:
/// 307 to the same path and query on the leader, or 503 with `Retry-After` when no leader is
/// known (or this node was just elected and is loading its state).
fn not_leader(head: &Head<'_>, ctx: &mut Ctx<'_>) -> Response {
    let ha = ctx.shard.shared.ha.snapshot();
    match (&ha.leader_address, ha.role) {
        (Some(leader), crate::ha::Role::Standby) => {
            let mut location =
                String::with_capacity(leader.len() + head.path.len() + head.query.len() + 1);
            location.push_str(leader);
            // The target is ASCII (the parser refuses anything else in it).
            location.push_str(&String::from_utf8_lossy(head.path));
            if !head.query.is_empty() {
                location.push('?');
                location.push_str(&String::from_utf8_lossy(head.query));
            }
            let mut r = ctx.protocol_error(
                Status::TEMPORARY_REDIRECT,
                "Not the leader: this meta is a standby; the request is redirected to the leader",
            );
            r.location = Some(location.into_boxed_str());
            r
        }
        (_, crate::ha::Role::Leader) if ha.state == crate::ha::HaState::Starting => {
            let mut r = ctx.protocol_error(
                Status::SERVICE_UNAVAILABLE,
                "Leader starting: this meta was just elected and is loading its state; retry shortly",
            );
            r.retry_after_secs = Some(1);
            r
        }
        _ => {
            let mut r = ctx.protocol_error(
                Status::SERVICE_UNAVAILABLE,
                "No leader: no meta service leader is known right now (HA election in progress or etcd unreachable); retry shortly",
            );
            r.retry_after_secs = Some(1);
            r
        }
    }
}
