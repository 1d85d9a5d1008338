//! Bytes on remote ranks: the meta service's redirects, and the grant-carrying object requests
//! a local service (or the meta, for its own ranks in a replicated put's chain) serves.
//!
//! Meta side: a `GET /api/v1/objects` whose readable copy is on a remote rank answers `307`
//! with a `Location` on that rank's local service and a read grant (within the read's lease);
//! a `PUT` whose allocation landed on a remote rank answers `307` to the first remote hop with
//! a write grant, before the body is read when the client sent `Expect: 100-continue`. A
//! replicated put is a chain: each hop writes its blob and sends the bytes on to the next hop
//! (`next`, covered by the grant's MAC); the first hop commits with the meta once every hop
//! answered, then answers the client.
//!
//! Serving side: the grant is checked (MAC, expiry, key, operation, that the rank's segment
//! is in this process's memory and the range inside it), then the bytes go between the socket
//! and the segment as for any put or get here.

use crate::common::error_kind::{ErrorKind, Refusal};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

pub(super) use super::grant_urls::{blob_grant, copy_floor, read_grant_url, write_grant_url};
use super::objects::{Filled, body_timeout, consumed, put_success, sending};
use super::{Ctx, Request, optional};
use crate::cluster::catalog::{Entry, Freed, Stamp};
use crate::grant::{Grant, GrantError, GrantOp, unix_ms};
use crate::http::client::{self, encode_query};
use crate::http::json::JsonWriter;
use crate::http::parse::Method;
use crate::http::response::{Body, ContentType, Part, Response, Status};
use crate::http::spans::Outgoing;
use crate::metrics::client::ClientOp;
use crate::shards::store::segment::{Medium, SegRef, Segment};
use crate::shards::store::ssd::IoBuffer;
use crate::shards::store::{BlobHandle, BlobView, IoOutcome, ObjHandle};
use crate::shards::{Command, DAMAGED_ON_SSD, GrantedRead, PinnedBlob, Reply, Shared, WriteGrant};

/// How long a hop waits for the next hop or the meta service's commit.
pub(super) const HOP_TIMEOUT: Duration = Duration::from_millis(crate::limits::HOP_TIMEOUT_MS);

/// This process's own data-plane URL, as the meta puts it in a chain: the advertised
/// address, else the listen address.
pub(super) fn self_url(shared: &Shared) -> String {
    let a = shared.config.advertise_address.trim();
    let scheme = if shared.config.tls.enable {
        "https"
    } else {
        "http"
    };
    if a.starts_with("http://") || a.starts_with("https://") {
        a.trim_end_matches('/').to_string()
    } else if !a.is_empty() {
        format!("{scheme}://{a}")
    } else {
        format!("{scheme}://{}", shared.config.listen)
    }
}

pub(super) fn object_url(base: &str, key: &[u8], grant: &str, next: Option<&str>) -> String {
    let mut url = format!(
        "{base}/api/v1/objects?key={}&grant={grant}",
        encode_query(key)
    );
    if let Some(n) = next {
        url.push_str("&next=");
        url.push_str(&encode_query(n.as_bytes()));
    }
    url
}

fn redirect(ctx: &mut Ctx<'_>, mut location: String) -> Response {
    crate::http::spans::carry(&mut location, ctx.trace);
    ctx.scratch.clear();
    let mut w = JsonWriter::new(ctx.scratch);
    w.begin_object();
    w.field_bool("success", true);
    w.field_str("location", location.as_bytes());
    w.end_object();
    let mut r = Response::json_scratch(Status::TEMPORARY_REDIRECT);
    r.location = Some(location.into_boxed_str());
    r
}

pub(super) fn grant_key(ctx: &Ctx<'_>) -> Option<Arc<crate::grant::GrantKey>> {
    ctx.shard.shared.membership.grant_key.get()
}

/// On the meta service, the key a grant a local service sends back (a commit, a damaged
/// copy) was signed with: the current local service's of the rank it names, or this
/// process's own for its own ranks. `None` for a rank no longer mounted.
pub(super) fn signing_key(ctx: &Ctx<'_>, text: &[u8]) -> Option<Arc<crate::grant::GrantKey>> {
    let rank = Grant::rank_in(std::str::from_utf8(text).ok()?)?;
    if u64::from(rank) < ctx.shard.shared.config.store.ranks {
        return grant_key(ctx);
    }
    let segs = ctx.shard.shared.remote_segments_of(rank);
    let remote = segs.first()?.backend.remote()?;
    Some(remote.grant_key.clone())
}

/// How long a grant request waits for this local service's join to finish. A first join no
/// longer needs it: the meta keeps a joining rank's segments UNDEFINED (no put placed, nobody
/// sent to write) until the heartbeat that follows its answer. It serves the one case left: a
/// service that gave up on a meta's answers and joins the same meta again drops its grant key
/// meanwhile, while that meta still holds its blobs and has given grants on them (reads, and
/// writes allocated before the join) that stay valid once the same key comes back.
const JOIN_WAIT: Duration = Duration::from_secs(2);

/// Waits (at most [`JOIN_WAIT`]) until this process holds a grant key.
async fn joined(ctx: &Ctx<'_>) {
    let deadline = Instant::now() + JOIN_WAIT;
    while grant_key(ctx).is_none() && Instant::now() < deadline {
        monoio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Remote copies fetched at once by a batch_get, at most.
const FETCH_CONCURRENCY: usize = 8;

/// Where a remote copy's bytes are fetched from (a batch_get that spans ranks): its local
/// service's URL under a read grant, and its size; `None` without a grant key. The pin is
/// released here (the read's lease keeps the range).
pub(super) fn fetch_url(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    pinned: PinnedBlob,
) -> Option<(String, usize)> {
    let url = read_grant_url(&ctx.shard.shared, key, &pinned.view)?;
    Some((url, pinned.view.len as usize))
}

/// The bytes of remote copies ([`fetch_url`]), in order, fetched concurrently (at most
/// [`FETCH_CONCURRENCY`] at a time, so the ranks of a batch are read side by side); `None`
/// for a copy its local service did not deliver.
pub(super) async fn fetch_all(fetches: Vec<(String, usize)>) -> Vec<Option<bytes::Bytes>> {
    let mut out = Vec::with_capacity(fetches.len());
    let mut running = std::collections::VecDeque::with_capacity(FETCH_CONCURRENCY);
    let mut fetches = fetches.into_iter();
    loop {
        while running.len() < FETCH_CONCURRENCY
            && let Some((url, size)) = fetches.next()
        {
            running.push_back(monoio::spawn(fetch_one(url, size)));
        }
        match running.pop_front() {
            Some(task) => out.push(task.await),
            None => return out,
        }
    }
}

async fn fetch_one(url: String, size: usize) -> Option<bytes::Bytes> {
    match client::request_url(&url, "GET", Vec::new(), HOP_TIMEOUT).await {
        Ok(a) if a.status == 200 && a.octet_stream && a.body.len() == size => Some(a.body.into()),
        Ok(a) => {
            log::warn!("a local service answered {} to a batch read", a.status);
            None
        }
        Err(e) => {
            log::warn!("a batch read from a local service failed: {e}");
            None
        }
    }
}

/// `GET` of an object whose copy is on a remote rank: 307 to its local service with a read
/// grant that ends with the read's lease (taken by the get; the pin is released here).
pub(super) fn redirect_read(ctx: &mut Ctx<'_>, key: &[u8], pinned: PinnedBlob) -> Response {
    let Some(location) = read_grant_url(&ctx.shard.shared, key, &pinned.view) else {
        return ctx.protocol_error(Status::SERVICE_UNAVAILABLE, "No grant key");
    };
    drop(pinned);
    redirect(ctx, location)
}

/// A put allocated on a remote rank: the bytes go to a chain of hops (remote ranks first,
/// this process's own ranks last), the first of which commits. The allocation is the
/// remote writer's until it commits or the store reclaims it (`alloc_timeout_ms`, past every
/// grant's expiry).
pub(super) fn redirect_write(ctx: &mut Ctx<'_>, key: &[u8], mut grant: WriteGrant) -> Response {
    let Some(gk) = grant_key(ctx) else {
        return ctx.protocol_error(Status::SERVICE_UNAVAILABLE, "No grant key");
    };
    grant.disarm();
    let mut hops: Vec<&BlobView> = grant.blobs.iter().collect();
    // Remote hops first (stable: placement order), this process's last.
    hops.sort_by_key(|b| b.seg.backend.remote().is_none());
    let expires = unix_ms() + ctx.shard.shared.config.grant_ttl_ms();
    // The leadership the object was stamped with at its allocation, just now.
    let view = ctx.shard.shared.stamp_view();
    let mut next: Option<String> = None;
    for (i, b) in hops.iter().enumerate().rev() {
        let g = Grant {
            op: if i == 0 {
                GrantOp::WriteCommit
            } else {
                GrantOp::Write
            },
            rank: b.seg.rank,
            medium: b.seg.medium as u8,
            offset: b.offset,
            len: b.len,
            size: b.len,
            obj_id: grant.obj.id,
            obj_generation: grant.obj.generation,
            view,
            expires_ms: expires,
            sum: 0,
            floor: 0,
        };
        let n = next.as_deref().unwrap_or("");
        // A remote hop's grant under its local service's key, this process's under its own.
        let signer = b.seg.backend.remote().map_or(&*gk, |r| &*r.grant_key);
        let text = g.sign(signer, key, n.as_bytes());
        let url = match b.seg.backend.remote() {
            Some(r) => object_url(&r.url, key, &text, next.as_deref()),
            // A copy on this process's own rank: the chain's last hop is here.
            None => object_url(&self_url(&ctx.shard.shared), key, &text, next.as_deref()),
        };
        next = Some(url);
    }
    let location = next.expect("a grant has blobs");
    redirect(ctx, location)
}

/// The grant of a request, checked against this process's key, the object key and `next`;
/// then the segment it names, in this process's memory, with the range inside it.
fn check(
    req: &Request<'_>,
    ctx: &mut Ctx<'_>,
    key: &[u8],
    text: &[u8],
) -> Result<(Grant, Arc<SegRef>, Option<String>), Response> {
    let next = optional(req, ctx, "next")?.map(|n| String::from_utf8_lossy(&n).into_owned());
    let Some(gk) = grant_key(ctx) else {
        return Err(forbidden(ctx, GrantError::NoKey.message()));
    };
    let text = std::str::from_utf8(text).unwrap_or("");
    let grant = Grant::verify(
        &gk,
        text,
        key,
        next.as_deref().unwrap_or("").as_bytes(),
        unix_ms(),
    )
    .map_err(|e| forbidden(ctx, e.message()))?;
    let wants_write = req.head.method == Method::Put;
    if grant.op == GrantOp::Move || grant.op.is_write() != wants_write {
        return Err(forbidden(ctx, "Invalid grant: not for this operation"));
    }
    // Reads are served from memory or this process's SSD file; writes go to memory only
    // (the meta places puts and moves on memory; SSD is reached by flushes).
    let seg = granted_segment(ctx, &grant, !wants_write)?;
    Ok((grant, seg, next))
}

/// The segment a grant names, in this process (memory, or an SSD file when `file_ok`), with
/// the granted range inside it.
pub(super) fn granted_segment(
    ctx: &mut Ctx<'_>,
    grant: &Grant,
    file_ok: bool,
) -> Result<Arc<SegRef>, Response> {
    let medium = Medium::ALL[grant.medium as usize];
    let seg = ctx
        .shard
        .mounted_segment(grant.rank, medium)
        .filter(|s| s.backend.remote().is_none() && (file_ok || s.backend.file().is_none()));
    let Some(seg) = seg else {
        return Err(forbidden(
            ctx,
            "Invalid grant: its segment is not in this process's memory",
        ));
    };
    if grant
        .offset
        .checked_add(grant.len)
        .is_none_or(|end| end > seg.capacity)
    {
        return Err(forbidden(ctx, "Invalid grant: outside its segment"));
    }
    Ok(seg)
}

pub(super) fn forbidden(ctx: &mut Ctx<'_>, message: &str) -> Response {
    ctx.protocol_error(Status::FORBIDDEN, message)
}

/// Marks a verified write or move grant used (`Shared::used_grants`) as its request is
/// admitted, before any byte is written under it; else the refusal: 403 for a grant used
/// already (a replay, or a client's retry of a request that reached here), 503 with
/// `Retry-After` when the ledger is full of grants not yet expired.
pub(super) fn admit(ctx: &mut Ctx<'_>, text: &str, grant: &Grant) -> Result<(), Response> {
    let refused = match ctx
        .shard
        .shared
        .membership
        .used_grants
        .admit(text, grant, unix_ms())
    {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    let stats = ctx.shard.stats();
    if refused == GrantError::LedgerFull {
        stats.grants_refused_ledger_full.inc();
        log::warn!("refused a grant: the ledger of used grants is full");
        let mut r = ctx.protocol_error(Status::SERVICE_UNAVAILABLE, refused.message());
        r.retry_after_secs = Some(1);
        return Err(r);
    }
    if refused == GrantError::Used {
        stats.grants_refused_used.inc();
    }
    Err(forbidden(ctx, refused.message()))
}

pub(super) fn view(seg: Arc<SegRef>, grant: &Grant) -> BlobView {
    BlobView {
        seg,
        offset: grant.offset,
        len: grant.size,
        handle: BlobHandle {
            id: u32::MAX,
            tag: 0,
        },
        sum: grant.sum,
    }
}

/// `GET`/`HEAD /api/v1/objects?key=K&grant=G`: the bytes of a blob this process holds, under
/// the meta service's read grant (the meta's lease keeps the range from being reused). A blob
/// on this process's SSD is read through the shard's I/O path and served only when its bytes
/// match the checksum the grant carries.
pub(super) async fn grant_get(
    req: &Request<'_>,
    ctx: &mut Ctx<'_>,
    key: &[u8],
    text: &[u8],
    start: Instant,
) -> Response {
    joined(ctx).await;
    let epoch = ctx.shard.shared.membership.local.grant_reads.epoch(); // (See `GrantedRead`.)
    let (grant, seg, _) = match check(req, ctx, key, text) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if req.head.method == Method::Head {
        return Response::new(
            Status::OK,
            ContentType::OctetStream,
            Body::Omitted(grant.size),
        );
    }
    let rank = grant.rank;
    let size = grant.size;
    if seg.backend.file().is_some() {
        return match ctx
            .shard
            .read_ssd_checked(seg.arc(), grant.offset, size, grant.sum)
            .await
        {
            Ok(bytes) => sending(
                Response::new(
                    Status::OK,
                    ContentType::OctetStream,
                    Body::Bytes(bytes.into()),
                ),
                rank,
                size,
                start,
            ),
            Err(IoOutcome::Damaged) => {
                // The meta drops its listing of the copy before the reader hears of it, so
                // its next read of the key finds the object gone, not the same damage.
                super::tier::report_damaged(ctx, key, text).await;
                ctx.business_error(ErrorKind::Failed, DAMAGED_ON_SSD)
            }
            Err(_) => ctx.business_error(
                ErrorKind::Failed,
                "I/O error while reading the object from SSD",
            ),
        };
    }
    let read = GrantedRead {
        until_ms: grant.expires_ms,
        epoch,
    };
    let blob = PinnedBlob::unmanaged(view(seg, &grant), ctx.shard.shared.clone(), read);
    let resp = Response::new(
        Status::OK,
        ContentType::OctetStream,
        Body::Parts(vec![Part::Blob(blob)]),
    );
    sending(resp, rank, size, start)
}

/// A missing grant on a local service: nothing is served here without one.
pub(super) fn needs_grant(ctx: &mut Ctx<'_>) -> Response {
    let mut r = ctx.protocol_error(
        Status::UNAUTHORIZED,
        "A local service serves objects only under a grant from its meta service: send the request to the meta service",
    );
    r.www_authenticate = true;
    r
}

/// `PUT /api/v1/objects?key=K&grant=G[&next=URL]`: writes the body into the granted blob, sends
/// it on to the next hop, and (first hop) commits with the meta service before answering.
pub(super) async fn grant_put(
    req: &Request<'_>,
    ctx: &mut Ctx<'_>,
    key: &[u8],
    size: u64,
    text: &[u8],
    fill: impl AsyncFnOnce(Option<&WriteGrant>) -> Filled,
) -> Option<Response> {
    joined(ctx).await;
    let (grant, seg, next) = match check(req, ctx, key, text) {
        Ok(c) => c,
        Err(r) => return consumed(ctx, fill, r).await,
    };
    if size != grant.size {
        let r = forbidden(
            ctx,
            "Invalid grant: the body's length is not the granted size",
        );
        return consumed(ctx, fill, r).await;
    }
    // Used once: a second request under this grant is refused before its body is read, so
    // a replay never writes into a range the meta may have given to another object since.
    if let Err(r) = admit(ctx, std::str::from_utf8(text).unwrap_or(""), &grant) {
        return consumed(ctx, fill, r).await;
    }
    if freed_before(ctx, &grant) {
        let r = forbidden(ctx, FREED_BEFORE);
        return consumed(ctx, fill, r).await;
    }
    let mut blobs: SmallVec<[BlobView; 2]> = SmallVec::new();
    blobs.push(view(seg.clone(), &grant));
    let wg = WriteGrant::unmanaged(blobs, ctx.shard.shared.clone(), grant.expires_ms);
    let started = Instant::now();
    match fill(Some(&wg)).await {
        Filled::Broken => {
            // Nobody to answer, but the meta is told at once: the allocation is freed now
            // (not after alloc_timeout_ms) and the client's retry can put the key again.
            abort(ctx, key, &grant, text, next.as_deref()).await;
            return None;
        }
        Filled::TimedOut => {
            abort(ctx, key, &grant, text, next.as_deref()).await;
            return Some(body_timeout(ctx));
        }
        Filled::SegmentError(e) => {
            log::error!("writing {size} bytes under a grant failed: {e}");
            return Some(
                finish_failed(ctx, key, &grant, text, next.as_deref(), "Write failed").await,
            );
        }
        Filled::Ok => {}
    }
    if unix_ms() > grant.expires_ms {
        // Past its expiry the meta may have reclaimed the range: nothing is committed (and
        // nothing was written past it).
        abort(ctx, key, &grant, text, next.as_deref()).await;
        return Some(forbidden(
            ctx,
            "Invalid grant: expired while the body arrived",
        ));
    }
    if wg.is_revoked() {
        // This service joined a meta again while the body arrived: the grant's meta is left
        // behind, and the range may be another object's now. Nothing was written past that.
        return Some(forbidden(
            ctx,
            "Invalid grant: its meta service was left while the body arrived",
        ));
    }
    // In the catalog from now on (a new leader adopts it if the meta changes); dropped again
    // when the chain or the commit fails, or when the meta later frees the blob.
    let Some(cataloged) = catalog_add(ctx, key, &grant) else {
        // Its freed record arrived while the body did: not listed, not answered a success.
        return Some(forbidden(ctx, FREED_BEFORE));
    };
    if let Some(n) = &next
        && let Err(why) = forward(&seg, &grant, n, Outgoing::of(ctx.trace)).await
    {
        catalog_drop(ctx, &grant, cataloged);
        return Some(finish_failed(ctx, key, &grant, text, next.as_deref(), why).await);
    }
    let transfer_ns = started.elapsed().as_nanos() as u64;
    ctx.shard.remote().client.record(
        grant.rank,
        ClientOp::BatchPut,
        size,
        transfer_ns,
        started.elapsed().as_micros() as u64,
    );
    if grant.op != GrantOp::WriteCommit {
        return Some(put_success(ctx, key, size));
    }
    // Counted until the catalog knows the outcome: a join waits for it.
    let shared = ctx.shard.shared.clone();
    let _in_flight = shared.membership.local.commit_in_flight();
    let r = commit(ctx, key, &grant, text, next.as_deref(), true).await;
    if r.status != Status::OK || r.failed {
        catalog_drop(ctx, &grant, cataloged);
    } else if cataloged
        && !shared
            .membership
            .local
            .catalog()
            .confirm(&catalog_freed(&grant))
    {
        // Committed, but this service joined a meta again before the answer came (its new
        // membership dropped the unconfirmed entry, and the meta the blob): not kept.
        log::warn!("a put committed after this service's catalog dropped its entry: failed");
        return Some(ctx.business_error(ErrorKind::Failed, LOST_BEFORE_CONFIRMED));
    }
    Some(r)
}

/// A put whose commit's answer came after its catalog entry was dropped.
const LOST_BEFORE_CONFIRMED: &str =
    "Put not kept: this local service joined the meta service again before the commit was answered";

fn grant_stamp(grant: &Grant) -> Stamp {
    Stamp {
        view: grant.view,
        seq: grant.obj_generation,
    }
}

/// Whether a later hop's or a copy's write (`Write`) comes after the freed record of its
/// blob reached this local service (`Catalog::freed_before`): refused, nothing written or
/// listed, since the removal it raced may have been answered already.
fn freed_before(ctx: &Ctx<'_>, grant: &Grant) -> bool {
    let shared = &ctx.shard.shared;
    grant.op == GrantOp::Write
        && shared.config.cluster.role == crate::config::Role::Local
        && shared.membership.local.catalog().freed_before(
            Medium::ALL[grant.medium as usize],
            grant.offset,
            grant_stamp(grant),
            grant.floor,
        )
}

const FREED_BEFORE: &str = "Invalid grant: the blob was freed before this write arrived";

/// Adds a blob written under a grant to this local service's catalog; false on a meta (the
/// last hop of a chain on its own rank keeps no catalog); `None` when its freed record came
/// first (checked under the catalog's lock: see [`freed_before`]).
fn catalog_add(ctx: &mut Ctx<'_>, key: &[u8], grant: &Grant) -> Option<bool> {
    let shared = &ctx.shard.shared;
    if shared.config.cluster.role != crate::config::Role::Local {
        return Some(false);
    }
    // A grant's `len` is the object's size; the entry's is what the meta allocated.
    let medium = Medium::ALL[grant.medium as usize];
    let entry = Entry::written(key, medium, grant.offset, grant.size, grant_stamp(grant));
    let mut catalog = shared.membership.local.catalog();
    if grant.op == GrantOp::Write
        && catalog.freed_before(medium, grant.offset, grant_stamp(grant), grant.floor)
    {
        return None;
    }
    if grant.op == GrantOp::WriteCommit {
        // Handed over only once the meta answered its commit.
        catalog.add_pending(entry);
    } else if grant.floor > 0 {
        // A copy: the records its meta noted before the grant do not drop it.
        catalog.add_copy(entry, grant.floor);
    } else {
        catalog.add(entry);
    }
    Some(true)
}

fn catalog_freed(grant: &Grant) -> Freed {
    Freed {
        medium: Medium::ALL[grant.medium as usize],
        offset: grant.offset,
        stamp: grant_stamp(grant),
        landed: false,
    }
}

fn catalog_drop(ctx: &mut Ctx<'_>, grant: &Grant, cataloged: bool) {
    if cataloged {
        ctx.shard
            .shared
            .membership
            .local
            .catalog()
            .free(&catalog_freed(grant));
    }
}

/// Sends the bytes just written on to the chain's next hop; the error is the client's message.
/// From host memory they go to the socket from where they are; from device memory through a
/// copy.
async fn forward(
    seg: &Arc<SegRef>,
    grant: &Grant,
    next: &str,
    tp: Outgoing,
) -> Result<(), &'static str> {
    let read_failed = |e: std::io::Error| {
        log::error!(
            "reading back {} bytes for a replica failed: {e}",
            grant.size
        );
        "Write failed"
    };
    let sent = if seg.backend.host_region().is_some() {
        // SAFETY: the range is this hop's granted blob, written by it just now and not
        // written again: the meta keeps it allocated for the grant's writer until the commit,
        // which comes after this write. The view keeps the segment mapped while the kernel
        // reads it, even past an abandoned write.
        let view =
            unsafe { IoBuffer::segment_view(seg.clone(), grant.offset, grant.size as usize, true) }
                .map_err(read_failed)?;
        client::request_url_with(next, "PUT", &tp.fields(), view, HOP_TIMEOUT).await
    } else {
        let bytes = read_back(seg, grant.offset, grant.size).map_err(read_failed)?;
        client::request_url_with(next, "PUT", &tp.fields(), bytes, HOP_TIMEOUT).await
    };
    match sent {
        Ok(a) if a.status == 200 && !body_failed(&a.body) => Ok(()),
        Ok(a) => {
            log::warn!("replica hop {next} answered {}", a.status);
            Err("Replica write failed")
        }
        Err(e) => {
            log::warn!("replica hop failed: {e}");
            Err("Replica write failed")
        }
    }
}

fn body_failed(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("success").and_then(|s| s.as_bool()))
        == Some(false)
}

/// A copy of a blob's bytes this process holds (for the next hop of a chain).
fn read_back(seg: &Segment, offset: u64, size: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; size as usize];
    // SAFETY: the range is this hop's granted blob, written by it just now; the meta keeps
    // it allocated for the grant's writer until the commit.
    unsafe { seg.backend.read(offset, &mut buf)? };
    Ok(buf)
}

async fn finish_failed(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    grant: &Grant,
    text: &[u8],
    next: Option<&str>,
    message: &str,
) -> Response {
    abort(ctx, key, grant, text, next).await;
    ctx.business_error(ErrorKind::Failed, message)
}

/// A first hop that will not commit (its write or the chain failed, the body broke off or
/// came too late) aborts the put with the meta service (a commit with `ok=0`), so the key is
/// removed at once rather than reclaimed after `alloc_timeout_ms`. Sent only once this hop
/// writes no more (its body ended): the meta frees its blob at once, a chain's blobs at the
/// writers' deadline (a later hop may have been reached directly, not by this one's forward).
async fn abort(ctx: &mut Ctx<'_>, key: &[u8], grant: &Grant, text: &[u8], next: Option<&str>) {
    if grant.op == GrantOp::WriteCommit {
        let _ = commit(ctx, key, grant, text, next, false).await;
    }
}

/// update_state with the meta service for a put this first hop wrote: the meta's answer is
/// the client's.
async fn commit(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    grant: &Grant,
    text: &[u8],
    next: Option<&str>,
    ok: bool,
) -> Response {
    let shared = ctx.shard.shared.clone();
    if shared.config.cluster.role == crate::config::Role::Meta {
        // The meta itself was the first hop (its own rank): commit in place.
        return commit_here(ctx, key.into(), grant, ok).await;
    }
    let Some(meta) = shared.membership.local.meta_url() else {
        return ctx.protocol_error(Status::SERVICE_UNAVAILABLE, "Not joined to a meta service");
    };
    let mut target = format!(
        "/cluster/v1/commit?key={}&grant={}&ok={}",
        encode_query(key),
        String::from_utf8_lossy(text),
        ok as u8
    );
    if let Some(n) = next {
        target.push_str("&next=");
        target.push_str(&encode_query(n.as_bytes()));
    }
    let (t, tp) = (
        Some(shared.config.cluster.token.as_str()),
        Outgoing::of(ctx.trace),
    );
    let h = tp.fields();
    match client::request_with(&meta, "POST", &target, t, &h, vec![], HOP_TIMEOUT).await {
        Ok(a) if a.status == 200 => {
            ctx.scratch.clear();
            ctx.scratch.extend_from_slice(&a.body);
            let mut r = Response::json_scratch(Status::OK);
            r.failed = body_failed(&a.body);
            r
        }
        Ok(a) => {
            log::warn!("the meta service refused a commit: {}", a.status);
            ctx.protocol_error(Status::BAD_GATEWAY, "The meta service refused the commit")
        }
        Err(e) => {
            log::warn!("commit with the meta service failed: {e}");
            ctx.protocol_error(
                Status::BAD_GATEWAY,
                "The meta service did not answer the commit",
            )
        }
    }
}

async fn commit_here(ctx: &mut Ctx<'_>, key: Box<[u8]>, grant: &Grant, ok: bool) -> Response {
    let obj = ObjHandle {
        id: grant.obj_id,
        generation: grant.obj_generation,
    };
    let reply = ctx
        .shard
        .execute(Command::Commit {
            key: key.clone(),
            obj,
            ok,
        })
        .await;
    match reply {
        Reply::Done if ok => put_success(ctx, &key, grant.size),
        Reply::Done => ctx.business_error(ErrorKind::Failed, "Write failed"),
        Reply::NotFound => ctx.refuse(Refusal::of(ErrorKind::WriteRevoked)),
        other => ctx.reply_error(other, super::KEY_NOT_FOUND),
    }
}

/// The `key` and `grant` parameters of a message a local service sends the meta about one
/// object (a commit, a damaged copy).
pub(super) fn key_and_grant(
    req: &Request<'_>,
    ctx: &mut Ctx<'_>,
) -> Result<(Box<[u8]>, Vec<u8>), Response> {
    let key = super::object_key(req, ctx, "key")?;
    let text = super::required(req, ctx, "grant")?.into_owned();
    Ok((key, text))
}

/// `POST /cluster/v1/commit?key=K&grant=G[&next=URL]&ok=1`: a local service's update_state,
/// authorized by the put's own first-hop grant.
pub(super) async fn cluster_commit(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let (key, text) = match key_and_grant(req, ctx) {
        Ok(kg) => kg,
        Err(r) => return r,
    };
    let next = match optional(req, ctx, "next") {
        Ok(n) => n.map(|n| n.into_owned()).unwrap_or_default(),
        Err(r) => return r,
    };
    let ok = match optional(req, ctx, "ok") {
        Ok(v) => v.as_deref() != Some(b"0"),
        Err(r) => return r,
    };
    let Some(gk) = signing_key(ctx, &text) else {
        return forbidden(ctx, "Invalid grant: its rank is not mounted");
    };
    // A commit may arrive just after the grant expired (the body took its whole time): the
    // expiry bounds the writing, which is over; the allocation's reclaim bounds the commit.
    let grant = match Grant::verify(
        &gk,
        std::str::from_utf8(&text).unwrap_or(""),
        &key,
        &next,
        0,
    ) {
        Ok(g) if g.op == GrantOp::WriteCommit => g,
        Ok(_) => return forbidden(ctx, "Invalid grant: not a committing write grant"),
        Err(e) => return forbidden(ctx, e.message()),
    };
    commit_here(ctx, key, &grant, ok).await
}
