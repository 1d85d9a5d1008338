//! The data plane: objects stored and fetched over HTTP.
//!
//! A put is alloc (the owner reserves blobs) → write (this shard copies the body straight into
//! the blobs' memory) → update_state (the owner makes them readable); a get is a leased,
//! pinned read whose bytes go from the blob to the socket. Batch forms group keys per owner
//! shard and run the owners in parallel.
//!
//! Batch formats (documented in `openapi.json` and docs/api.md):
//! - `POST /api/v1/objects/batch_put?keys=a,b&sizes=3,5`: the body is the objects' bytes
//!   concatenated in key order.
//! - `GET /api/v1/objects/batch_get?keys=a,b`: the body is, per key in order, an 8-byte
//!   big-endian length and that many bytes; a missing key has length `u64::MAX` and no bytes.

use crate::common::error_kind::{ErrorKind, Refusal};
use std::time::Instant;

use bytes::Bytes;
use smallvec::SmallVec;

use super::remote;
use super::{
    Ctx, Request, batch_key_list, check_object_key, list_param, object_key, optional, parse_uint,
};
use crate::http::parse::Method;
use crate::http::response::{Body, ContentType, Part, Response, Status, Transfer};
use crate::metrics::client::{ClientOp, tally};
use crate::metrics::store::{Op, Outcome};
use crate::shards::store::segment::Medium;
use crate::shards::store::{BlobView, MAX_REPLICAS, Placement};
use crate::shards::{Command, Reply, Submitted, WriteGrant};

fn is_local_service(ctx: &Ctx<'_>) -> bool {
    ctx.shard.shared.config.cluster.role == crate::config::Role::Local
}

/// Length marker of a missing key in a batch_get body.
pub const MISSING: u64 = u64::MAX;

/// A put's `medium`, `replicas` and `prefer_rank` parameters.
fn put_options(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Result<Placement, Response> {
    let medium = match optional(req, ctx, "medium")? {
        None => None,
        Some(m) => match std::str::from_utf8(&m).ok().and_then(Medium::parse) {
            Some(m) if m.is_memory() => Some(m),
            _ => {
                return Err(ctx.business_error(
                    ErrorKind::InvalidParam,
                    "Invalid 'medium' parameter: expected hbm or dram",
                ));
            }
        },
    };
    let replicas = match optional(req, ctx, "replicas")? {
        None => 1,
        Some(r) => match parse_uint(&r, 1, MAX_REPLICAS as u64) {
            Some(n) => n as u8,
            None => {
                return Err(ctx.business_error(
                    ErrorKind::InvalidParam,
                    &format!("Invalid 'replicas' parameter: expected 1 to {MAX_REPLICAS}"),
                ));
            }
        },
    };
    let prefer_rank = match optional(req, ctx, "prefer_rank")? {
        None => None,
        Some(r) => match parse_uint(&r, 0, crate::shards::ranks::MAX_RANK as u64) {
            Some(n) => Some(n as u32),
            None => {
                return Err(ctx.business_error(
                    ErrorKind::InvalidParam,
                    "Invalid 'prefer_rank' parameter: expected a rank number",
                ));
            }
        },
    };
    Ok(Placement {
        medium,
        replicas,
        prot: 0,
        prefer_rank,
    })
}

/// Copies `data` into every blob of a grant.
fn write_blobs(blobs: &[BlobView], data: &[u8]) -> std::io::Result<()> {
    for b in blobs {
        debug_assert_eq!(b.len as usize, data.len());
        if !data.is_empty() {
            // SAFETY: the blobs are ALLOCATED for this writer alone (the grant) until commit.
            unsafe { b.seg.backend.write(b.offset, data)? };
        }
    }
    Ok(())
}

/// Sends update_state for a written grant; the grant is disarmed once the owner has the
/// commit (else dropping it aborts the put).
async fn commit(ctx: &mut Ctx<'_>, key: Box<[u8]>, mut grant: WriteGrant, ok: bool) -> Reply {
    let owner = ctx.shard.owner_of(&key);
    let sub = ctx.shard.submit(
        owner,
        Command::Commit {
            key,
            obj: grant.obj,
            ok,
        },
    );
    if !matches!(sub, Submitted::Ready(Reply::Overloaded)) {
        grant.disarm();
    }
    sub.wait().await
}

pub(super) fn put_success(ctx: &mut Ctx<'_>, key: &[u8], size: u64) -> Response {
    ctx.json_object(|w| {
        w.field_bool("success", true);
        w.field_str("key", key);
        w.field_u64("size", size);
    })
}

/// Nanoseconds since `t`.
fn nanos_since(t: Instant) -> u64 {
    t.elapsed().as_nanos() as u64
}

/// Records a data-plane operation in the client bandwidth metrics: the bytes it moved per
/// rank (each rank's booked to it), which took `transfer_ns`; the whole operation ran from
/// `start` until now.
fn client(ctx: &Ctx<'_>, ranks: &[(u32, u64)], op: ClientOp, transfer_ns: u64, start: Instant) {
    let latency_us = start.elapsed().as_micros() as u64;
    ctx.shard
        .remote()
        .client
        .record_ranks(ranks, op, transfer_ns, latency_us);
}

/// An exist moves no bytes: its bandwidth record's transfer time is the operation's time.
fn exist_bandwidth(ctx: &Ctx<'_>, rank: u32, start: Instant) {
    client(
        ctx,
        &[(rank, 0)],
        ClientOp::BatchExist,
        nanos_since(start),
        start,
    );
}

/// The bytes of a put per rank: every copy's rank wrote them.
fn copies_of(grant: &WriteGrant, size: u64, ranks: &mut SmallVec<[(u32, u64); 1]>) {
    for b in &grant.blobs {
        tally(ranks, b.seg.rank, size);
    }
}

/// When a put's body began to arrive: `req.body_since` when it took several reads, else
/// `otherwise` (it came with its head, or is still to be read).
fn body_start(req: &Request<'_>, otherwise: Instant) -> Instant {
    req.body_since.map_or(otherwise, |t| t.min(otherwise))
}

/// An object's bytes as a get answers them: their sending is recorded in the client
/// bandwidth metrics once the connection has sent them.
pub(super) fn sending(mut resp: Response, rank: u32, bytes: u64, started: Instant) -> Response {
    resp.transfer = Some(Box::new(Transfer {
        rank,
        op: ClientOp::BatchGet,
        per_blob: false,
        bytes,
        started,
    }));
    resp
}

/// HEAD of an object: the headers of its GET (the length it would send), from a query that
/// counts nothing, leases nothing and never rewarms.
async fn head_object(req: &Request<'_>, ctx: &mut Ctx<'_>, key: Box<[u8]>) -> Response {
    match ctx
        .shard
        .execute(req.read_command(Command::Query { key }))
        .await
    {
        Reply::Query(q) if q.valid => {
            Response::new(Status::OK, ContentType::OctetStream, Body::Omitted(q.size))
        }
        Reply::Query(_) => ctx.refuse(super::KEY_NOT_FOUND),
        other => ctx.reply_error(other, super::KEY_NOT_FOUND),
    }
}

pub async fn object(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let start = req.dispatched;
    let key = match object_key(req, ctx, "key") {
        Ok(k) => k,
        Err(r) => return r,
    };
    if req.head.method != Method::Put {
        match optional(req, ctx, "grant") {
            Err(r) => return r,
            Ok(Some(text)) if req.head.method != Method::Delete => {
                // Boxed, as grant_put below.
                return Box::pin(remote::grant_get(req, ctx, &key, &text, start)).await;
            }
            Ok(_) if is_local_service(ctx) => return remote::needs_grant(ctx),
            Ok(_) => {}
        }
    }
    match req.head.method {
        Method::Head => head_object(req, ctx, key).await,
        Method::Get => match ctx.shard.execute(Command::Get { key }).await {
            Reply::Read(pinned) if pinned.view.seg.backend.remote().is_some() => {
                // The key again, from the query (it went with the command; a remote copy is
                // the rare case, so the common one copies nothing).
                match object_key(req, ctx, "key") {
                    Ok(key) => remote::redirect_read(ctx, &key, pinned),
                    Err(r) => r,
                }
            }
            Reply::Read(pinned) => {
                let (rank, len) = (pinned.view.seg.rank, pinned.view.len);
                let resp = Response::new(
                    Status::OK,
                    ContentType::OctetStream,
                    Body::Parts(vec![Part::Blob(pinned)]),
                );
                sending(resp, rank, len, start)
            }
            Reply::Value(bytes) => {
                Response::new(Status::OK, ContentType::OctetStream, Body::Bytes(bytes))
            }
            other => ctx.reply_error(other, super::KEY_NOT_FOUND),
        },
        Method::Put => {
            let body = req.body;
            let fill = async |grant: Option<&WriteGrant>| match grant {
                None => Filled::Ok,
                Some(g) => match write_blobs(&g.blobs, body) {
                    Ok(()) => Filled::Ok,
                    Err(e) => Filled::SegmentError(e),
                },
            };
            put(req, ctx, key, body.len() as u64, start, fill)
                .await
                .expect("a body already read cannot break the connection")
        }
        Method::Delete => {
            let removal = super::freed::removal_of(ctx, [&key[..]]);
            let journaled = ctx.shard.journal_mark();
            let reply = ctx.shard.execute(Command::Remove { key }).await;
            ctx.shard.journal_settle(journaled).await;
            match reply {
                Reply::Done if !super::freed::settle(ctx, &removal).await => {
                    super::freed::unconfirmed(ctx)
                }
                Reply::Done => ctx.success_message("key deleted"),
                other => ctx.reply_error(other, super::KEY_NOT_FOUND),
            }
        }
        _ => unreachable!("the router admits only GET, HEAD, PUT, DELETE here"),
    }
}

/// How a put's body reached its blobs.
pub enum Filled {
    /// Every byte is in every blob (or, when there were no blobs, the body was consumed).
    Ok,
    /// Copying into a blob failed; the body was consumed.
    SegmentError(std::io::Error),
    /// The connection broke before the whole body arrived: there is nobody to answer.
    Broken,
    /// The body arrived too slowly (`ock.mmc.http.body_timeout_ms`, `body_min_rate_bytes_per_sec`)
    /// and its reads were ended: answer 408 and close.
    TimedOut,
}

/// The answer to a body that arrived too slowly; the connection closes after it.
pub(super) fn body_timeout(ctx: &mut Ctx<'_>) -> Response {
    let mut r = ctx.protocol_error(
        Status::REQUEST_TIMEOUT,
        "Request timeout: the body arrived too slowly",
    );
    r.close = true;
    r
}

/// `PUT /api/v1/objects`: alloc on the owner → `fill` writes the `size` body bytes into the
/// granted blobs → update_state. `fill` is called exactly once: with the grant (whose blobs it
/// writes until the body ends or the grant is revoked), or with `None`
/// when the put fails before anything is allocated (the body must still be consumed). The
/// body may already be in memory or still arriving on the socket (large bodies are streamed
/// straight into the blobs). `None`: the connection broke; an allocation is aborted.
pub async fn put(
    req: &Request<'_>,
    ctx: &mut Ctx<'_>,
    key: Box<[u8]>,
    size: u64,
    start: Instant,
    fill: impl AsyncFnOnce(Option<&WriteGrant>) -> Filled,
) -> Option<Response> {
    match optional(req, ctx, "grant") {
        Err(r) => return consumed(ctx, fill, r).await,
        // Boxed: a task is sized for its largest state, this 4.6 KiB one (docs/io-uring.md).
        Ok(Some(text)) => {
            return Box::pin(remote::grant_put(req, ctx, &key, size, &text, fill)).await;
        }
        Ok(None) if is_local_service(ctx) => {
            let r = remote::needs_grant(ctx);
            return consumed(ctx, fill, r).await;
        }
        Ok(None) => {}
    }
    let opts = match put_options(req, ctx) {
        Ok(o) => o,
        Err(r) => return consumed(ctx, fill, r).await,
    };
    if !super::freed::older_copies_unconfirmed(ctx, &[&key])
        .await
        .is_empty()
    {
        let r = ctx.refuse(super::freed::older_copy_refusal());
        return consumed(ctx, fill, r).await;
    }
    let cmd = Command::Alloc {
        key: key.clone(),
        size,
        placement: opts,
    };
    let grant = match ctx.shard.execute(cmd).await {
        Reply::Granted(g) => *g,
        other => {
            let r = ctx.reply_error(other, super::KEY_NOT_FOUND);
            return consumed(ctx, fill, r).await;
        }
    };
    if grant.blobs.iter().any(|b| b.seg.backend.remote().is_some()) {
        // The bytes go to the rank's local service: 307 there, before the body when the
        // client waits for `100 Continue`.
        let r = remote::redirect_write(ctx, &key, grant);
        return consumed(ctx, fill, r).await;
    }
    let mut ranks = SmallVec::new();
    copies_of(&grant, size, &mut ranks);
    let fill_start = Instant::now();
    match fill(Some(&grant)).await {
        // Dropping the grant aborts the allocation on the owner.
        Filled::Broken => return None,
        Filled::TimedOut => {
            drop(grant);
            return Some(body_timeout(ctx));
        }
        Filled::SegmentError(e) => {
            log::error!("writing {size} bytes for a put failed: {e}");
            commit(ctx, key, grant, false).await;
            return Some(ctx.business_error(
                ErrorKind::Failed,
                "Write failed: could not copy the object into its segment",
            ));
        }
        Filled::Ok => {}
    }
    // The body's bytes took from their arrival (or from the start of the fill, which reads
    // a streamed body from the socket) until they were all in their blobs.
    let transfer_ns = nanos_since(body_start(req, fill_start));
    Some(match commit(ctx, key.clone(), grant, true).await {
        Reply::Done => {
            client(
                ctx,
                &ranks,
                ClientOp::BatchPut,
                transfer_ns,
                body_start(req, start),
            );
            put_success(ctx, &key, size)
        }
        Reply::NotFound => ctx.refuse(Refusal::of(ErrorKind::WriteRevoked)),
        other => ctx.reply_error(other, super::KEY_NOT_FOUND),
    })
}

/// The answer to a put that failed before allocating, once its body is consumed.
pub(super) async fn consumed(
    ctx: &mut Ctx<'_>,
    fill: impl AsyncFnOnce(Option<&WriteGrant>) -> Filled,
    resp: Response,
) -> Option<Response> {
    match fill(None).await {
        Filled::Broken => None,
        // The refusal in `ctx.scratch` is replaced by the 408.
        Filled::TimedOut => Some(body_timeout(ctx)),
        _ => Some(resp),
    }
}

pub async fn exist(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let start = req.dispatched;
    let key = match object_key(req, ctx, "key") {
        Ok(k) => k,
        Err(r) => return r,
    };
    match ctx
        .shard
        .execute(req.read_command(Command::Exist { key }))
        .await
    {
        Reply::Exists(found) => {
            if let Some(rank) = found.filter(|_| !req.is_head()) {
                exist_bandwidth(ctx, rank, start);
            }
            let found = found.is_some();
            ctx.json_object(|w| {
                w.field_bool("success", true);
                w.field_bool("exists", found);
            })
        }
        other => ctx.reply_error(other, super::KEY_NOT_FOUND),
    }
}

/// The validated keys of a batch request (query or, for the POST form, JSON body; `batch_put`
/// takes them from the query only).
fn batch_keys(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Result<Vec<Box<[u8]>>, Response> {
    let keys = batch_key_list(req, ctx)?;
    for k in &keys {
        check_object_key(k, ctx)?;
    }
    Ok(keys)
}

/// Counts a batch under `op`: its outcome from the replies (see [`Outcome::of_batch`]).
fn record_batch(ctx: &Ctx<'_>, op: Op, replies: &[Reply]) {
    let outcome = Outcome::of_batch(replies.iter().map(outcome_of));
    ctx.shard.store_stats().record(op, outcome, None);
}

fn outcome_of(r: &Reply) -> Outcome {
    match r {
        Reply::NotFound => Outcome::NotFound,
        Reply::Refused(_) | Reply::Overloaded => Outcome::Failure,
        Reply::Exists(None) => Outcome::NotFound,
        _ => Outcome::Success,
    }
}

/// Writes `{"success":true,"results":[...]}` with one entry per key.
fn batch_results(
    ctx: &mut Ctx<'_>,
    keys: &[Box<[u8]>],
    results: &[Result<Option<u64>, Refusal>],
) -> Response {
    ctx.json_object(|w| {
        w.field_bool("success", true);
        w.begin_array_field("results");
        for (k, r) in keys.iter().zip(results) {
            w.begin_object();
            w.field_str("key", k);
            match r {
                Ok(size) => {
                    w.field_bool("success", true);
                    if let Some(s) = size {
                        w.field_u64("size", *s);
                    }
                }
                Err(why) => {
                    w.field_bool("success", false);
                    w.field_str("error_message", why.message.as_bytes());
                    // The item's kind, as `X-MMC-Error-Code` gives a whole answer's.
                    w.field_str("error_code", why.kind.name().as_bytes());
                }
            }
            w.end_object();
        }
        w.end_array();
    })
}

fn reply_refusal(r: &Reply, not_found: Refusal) -> Refusal {
    match r {
        Reply::Refused(why) => why.clone(),
        Reply::NotFound => not_found,
        Reply::Overloaded => Refusal::new(
            ErrorKind::Overloaded,
            "Server overloaded: shard queue full, retry later",
        ),
        _ => Refusal::of(ErrorKind::Failed),
    }
}

pub async fn batch_put(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let start = req.dispatched;
    let keys = match batch_keys(req, ctx) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let sizes_raw = match list_param(req, ctx, "sizes") {
        Ok(s) => s,
        Err(r) => return r,
    };
    let mut sizes = Vec::with_capacity(sizes_raw.len());
    for s in &sizes_raw {
        match parse_uint(s, 0, u64::MAX) {
            Some(n) => sizes.push(n),
            None => {
                return ctx.business_error(
                    ErrorKind::InvalidParam,
                    "Invalid 'sizes' parameter: expected non-negative integers",
                );
            }
        }
    }
    if sizes.len() != keys.len() {
        return ctx.business_error(
            ErrorKind::InvalidParam,
            &format!(
                "'keys' names {} objects but 'sizes' gives {} sizes",
                keys.len(),
                sizes.len()
            ),
        );
    }
    let total: u128 = sizes.iter().map(|&s| s as u128).sum();
    if total != req.body.len() as u128 {
        return ctx.business_error(
            ErrorKind::InvalidParam,
            &format!(
                "Body length {} does not match the sum of sizes {total}",
                req.body.len()
            ),
        );
    }
    for (i, k) in keys.iter().enumerate() {
        if keys[..i].contains(k) {
            return ctx.business_error(ErrorKind::InvalidParam, "Duplicated key in batch");
        }
    }
    let opts = match put_options(req, ctx) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
    let unsure = super::freed::older_copies_unconfirmed(ctx, &refs).await;
    let allocs = keys
        .iter()
        .zip(&sizes)
        .enumerate()
        .filter(|(i, _)| !unsure.contains(i))
        .map(|(_, (k, &size))| Command::Alloc {
            key: k.clone(),
            size,
            placement: opts,
        })
        .collect();
    let allocated = ctx.shard.execute_many(allocs).await;
    let granted = super::freed::with_refused(allocated, &unsure, keys.len());
    record_batch(ctx, Op::BatchAlloc, &granted);

    // Write every granted object from its slice of the body.
    let write_start = Instant::now();
    let mut results: Vec<Result<Option<u64>, Refusal>> = Vec::with_capacity(keys.len());
    let mut grants: Vec<(usize, WriteGrant, bool)> = Vec::new();
    let mut offset = 0usize;
    for (i, (reply, &size)) in granted.into_iter().zip(&sizes).enumerate() {
        let data = &req.body[offset..offset + size as usize];
        offset += size as usize;
        match reply {
            Reply::Granted(g) => {
                let ok = write_blobs(&g.blobs, data).is_ok();
                results.push(if ok {
                    Ok(Some(size))
                } else {
                    Err(Refusal::new(ErrorKind::Failed, "Write failed"))
                });
                grants.push((i, *g, ok));
            }
            other => results.push(Err(reply_refusal(&other, super::KEY_NOT_FOUND))),
        }
    }
    let transfer_ns = nanos_since(body_start(req, write_start));
    if !grants.is_empty() {
        let commits = grants
            .iter()
            .map(|(i, g, ok)| Command::Commit {
                key: keys[*i].clone(),
                obj: g.obj,
                ok: *ok,
            })
            .collect();
        let replies = ctx.shard.execute_many(commits).await;
        record_batch(ctx, Op::BatchUpdateState, &replies);
        // Each copy's bytes are booked to its rank.
        let mut stored = SmallVec::new();
        for ((i, mut g, ok), r) in grants.into_iter().zip(replies) {
            if !matches!(r, Reply::Overloaded) {
                g.disarm();
            }
            if ok && matches!(r, Reply::Done) {
                copies_of(&g, sizes[i], &mut stored);
            }
            if ok && !matches!(r, Reply::Done) {
                results[i] = Err(reply_refusal(&r, Refusal::of(ErrorKind::WriteRevoked)));
            }
        }
        if !stored.is_empty() {
            client(
                ctx,
                &stored,
                ClientOp::BatchPut,
                transfer_ns,
                body_start(req, start),
            );
        }
    }
    batch_results(ctx, &keys, &results)
}

pub async fn batch_get(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let start = req.dispatched;
    let keys = match batch_keys(req, ctx) {
        Ok(k) => k,
        Err(r) => return r,
    };
    if req.is_head() {
        return head_batch_get(req, ctx, &keys).await;
    }
    let replies = ctx.execute_each(&keys, |key| Command::Get { key }).await;
    record_batch(ctx, Op::BatchGet, &replies);
    if replies.iter().any(|r| matches!(r, Reply::Overloaded)) {
        return ctx.overloaded();
    }
    let mut parts = Vec::with_capacity(keys.len() * 2);
    let replies = fetch_remote_copies(ctx, &keys, replies).await;
    let mut from_blobs = false;
    for r in replies {
        match r {
            Reply::Read(p) => {
                from_blobs = true;
                parts.push(Part::Bytes(Bytes::copy_from_slice(
                    &p.view.len.to_be_bytes(),
                )));
                parts.push(Part::Blob(p));
            }
            Reply::Value(b) => {
                parts.push(Part::Bytes(Bytes::copy_from_slice(
                    &(b.len() as u64).to_be_bytes(),
                )));
                parts.push(Part::Bytes(b));
            }
            _ => parts.push(Part::Bytes(Bytes::copy_from_slice(&MISSING.to_be_bytes()))),
        }
    }
    let mut resp = Response::new(Status::OK, ContentType::OctetStream, Body::Parts(parts));
    if from_blobs {
        // This process's blobs, each rank's bytes booked to it once the body is sent. A copy
        // fetched from a remote rank is booked by the local service that served it (and
        // reports it with its heartbeats): not here again.
        resp.transfer = Some(Box::new(Transfer {
            rank: 0,
            op: ClientOp::BatchGet,
            per_blob: true,
            bytes: 0,
            started: start,
        }));
    }
    resp
}

/// A batch spans ranks: its remote copies are fetched from their local services under read
/// grants (one redirect cannot name several hosts), concurrently, before the answer; each
/// becomes a `Reply::Value`. A copy its local service did not deliver (the rank died and is
/// not yet declared lost) is read once more from a memory copy on another rank, if the
/// object has one; a key with no copy delivered is answered missing.
async fn fetch_remote_copies(
    ctx: &mut Ctx<'_>,
    keys: &[Box<[u8]>],
    mut replies: Vec<Reply>,
) -> Vec<Reply> {
    let mut todo: Vec<usize> = (0..replies.len()).collect();
    for second_try in [false, true] {
        let mut fetches = Vec::new();
        let mut fetching = Vec::new();
        for i in todo {
            let rank = match &replies[i] {
                Reply::Read(p) if p.view.seg.backend.remote().is_some() => p.view.seg.rank,
                _ => continue,
            };
            let Reply::Read(p) = std::mem::replace(&mut replies[i], Reply::NotFound) else {
                continue;
            };
            if let Some(f) = remote::fetch_url(ctx, &keys[i], p) {
                fetches.push(f);
                fetching.push((i, rank));
            }
        }
        let fetched = remote::fetch_all(fetches).await;
        let mut failed = Vec::new();
        for ((i, rank), b) in fetching.into_iter().zip(fetched) {
            match b {
                Some(b) => replies[i] = Reply::Value(b),
                None => failed.push((i, rank)),
            }
        }
        if failed.is_empty() || second_try {
            break;
        }
        let again = failed
            .iter()
            .map(|&(i, rank)| Command::GetElsewhere {
                key: keys[i].clone(),
                rank,
            })
            .collect();
        let answers = ctx.shard.execute_many(again).await;
        todo = Vec::with_capacity(failed.len());
        for ((i, _), r) in failed.into_iter().zip(answers) {
            replies[i] = r;
            todo.push(i);
        }
    }
    replies
}

/// HEAD of a batch_get: the length its GET would send (an 8-byte length per key, and the
/// bytes of each readable one), from queries that count nothing and lease nothing.
async fn head_batch_get(req: &Request<'_>, ctx: &mut Ctx<'_>, keys: &[Box<[u8]>]) -> Response {
    let replies = ctx
        .execute_each(keys, |key| req.read_command(Command::Query { key }))
        .await;
    if replies.iter().any(|r| matches!(r, Reply::Overloaded)) {
        return ctx.overloaded();
    }
    let len: u64 = replies
        .iter()
        .map(|r| match r {
            Reply::Query(q) if q.valid => 8 + q.size,
            _ => 8,
        })
        .sum();
    Response::new(Status::OK, ContentType::OctetStream, Body::Omitted(len))
}

pub async fn batch_exist(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let start = req.dispatched;
    let keys = match batch_keys(req, ctx) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let replies = ctx
        .execute_each(&keys, |key| req.read_command(Command::Exist { key }))
        .await;
    let counted = !req.is_head();
    if counted {
        record_batch(ctx, Op::BatchExistKey, &replies);
    }
    if replies.iter().any(|r| matches!(r, Reply::Overloaded)) {
        return ctx.overloaded();
    }
    if let Some(rank) = replies.iter().find_map(|r| match r {
        Reply::Exists(r) => *r,
        _ => None,
    }) && counted
    {
        exist_bandwidth(ctx, rank, start);
    }
    ctx.json_object(|w| {
        w.field_bool("success", true);
        w.begin_array_field("exists");
        for r in &replies {
            w.value_bool(matches!(r, Reply::Exists(Some(_))));
        }
        w.end_array();
    })
}

pub async fn batch_remove(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let keys = match batch_keys(req, ctx) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let journaled = ctx.shard.journal_mark();
    let replies = ctx.execute_each(&keys, |key| Command::Remove { key }).await;
    ctx.shard.journal_settle(journaled).await;
    record_batch(ctx, Op::BatchRemove, &replies);
    let removed = keys
        .iter()
        .zip(&replies)
        .filter(|(_, r)| matches!(r, Reply::Done))
        .map(|(k, _)| &k[..]);
    let removal = super::freed::removal_of(ctx, removed);
    if !super::freed::settle(ctx, &removal).await {
        return super::freed::unconfirmed(ctx);
    }
    let results: Vec<Result<Option<u64>, Refusal>> = replies
        .iter()
        .map(|r| match r {
            Reply::Done => Ok(None),
            other => Err(reply_refusal(other, super::KEY_NOT_FOUND)),
        })
        .collect();
    batch_results(ctx, &keys, &results)
}
