//! A remote rank's tiers: the meta service has the rank's local service move blobs between its
//! own segments (a flush of DRAM to SSD and a demotion of HBM to DRAM under eviction, a rewarm
//! of SSD to DRAM for a read) with `POST /cluster/v1/move`,
//! and a local service that finds an SSD copy damaged while serving it has the meta drop it
//! with `POST /cluster/v1/damaged`. Both carry the cluster token; the move's two grants and
//! the damaged copy's read grant are the meta's signed word for the blobs they name.

use super::remote::{HOP_TIMEOUT, admit, blob_grant, forbidden, grant_key, granted_segment, view};
use super::{Ctx, Request};
use crate::cluster::catalog::Stamp;
use crate::grant::{Grant, GrantError, GrantOp, unix_ms};
use crate::http::client::{self, encode_query};
use crate::http::json::JsonWriter;
use crate::http::response::{Response, Status};
use crate::shards::store::segment::Medium;
use crate::shards::store::{BlobView, IoOutcome};
use crate::shards::{Command, DAMAGED_ON_SSD, Reply, Shared};

/// The two grants of a tier move on a remote rank: `from` signed alone, `to` signed with
/// `from`'s text as its next hop, so neither can be paired with another blob's.
fn move_grants(
    gk: &crate::grant::GrantKey,
    from: &BlobView,
    to: &BlobView,
    ttl_ms: u64,
) -> (String, String) {
    let expires_ms = unix_ms() + ttl_ms;
    // The local service names the copy in its catalog by the source's entry (key and stamp),
    // not by the grant.
    let grant =
        |v: &BlobView, sum: u64| blob_grant(GrantOp::Move, v, Stamp::default(), expires_ms, sum);
    let from_text = grant(from, from.sum).sign(gk, b"", b"");
    let to_text = grant(to, 0).sign(gk, b"", from_text.as_bytes());
    (from_text, to_text)
}

/// The meta service's side of a remote rank's tier moves: `POST /cluster/v1/move` on the
/// rank's local service, with the cluster token, and its answer read back.
pub struct HttpRemoteTier;

impl crate::shards::RemoteTier for HttpRemoteTier {
    fn copy<'a>(
        &'a self,
        shared: &'a Shared,
        from: &'a BlobView,
        to: &'a BlobView,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = (IoOutcome, u64)> + 'a>> {
        Box::pin(async move {
            let Some(remote) = from.seg.backend.remote() else {
                return (IoOutcome::Failed, 0);
            };
            let ttl = shared.config.grant_ttl_ms();
            let (f, t) = move_grants(&remote.grant_key, from, to, ttl);
            // The local service starts no copy past the grants' expiry; one started just
            // before it gets another HOP_TIMEOUT to end before the destination is let go.
            let wait = std::time::Duration::from_millis(ttl) + HOP_TIMEOUT;
            let target = format!("/cluster/v1/move?from={f}&to={t}");
            let token = shared.config.cluster.token.as_str();
            let answer =
                client::request(&remote.url, "POST", &target, Some(token), Vec::new(), wait).await;
            let a = match answer {
                Ok(a) if a.status == 200 => a,
                Ok(a) => {
                    log::warn!(
                        "rank {}: a tier move was refused ({}): {}",
                        from.seg.rank,
                        a.status,
                        String::from_utf8_lossy(&a.body)
                    );
                    return (IoOutcome::Failed, 0);
                }
                Err(e) => {
                    log::warn!("rank {}: a tier move failed: {e}", from.seg.rank);
                    return (IoOutcome::Failed, 0);
                }
            };
            let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap_or_default();
            if v.get("success").and_then(|s| s.as_bool()) == Some(true) {
                let sum = v.get("checksum").and_then(|s| s.as_u64()).unwrap_or(0);
                (IoOutcome::Done, sum)
            } else if v.get("damaged").and_then(|d| d.as_bool()) == Some(true) {
                (IoOutcome::Damaged, 0)
            } else {
                let status = v.get("disk_status").and_then(|s| s.as_u64()).unwrap_or(0);
                if status != 0 {
                    for seg in [&from.seg, &to.seg] {
                        if seg.medium == Medium::Ssd
                            && let Some(r) = seg.backend.remote()
                        {
                            r.set_disk_status(status.min(255) as u8);
                        }
                    }
                }
                (IoOutcome::Failed, 0)
            }
        })
    }
}

/// `POST /cluster/v1/move?from=G1&to=G2` on a local service: copies the `from` blob into the
/// `to` blob, both its own (a DRAM blob into its SSD file, answering the checksum of the
/// bytes written; an SSD blob into DRAM, checked against the checksum `from` carries; an HBM
/// blob into DRAM).
/// The meta service allocated `to` and holds both blobs while the copy runs.
pub(super) async fn cluster_move(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    if ctx.shard.shared.config.cluster.role != crate::config::Role::Local {
        return forbidden(
            ctx,
            "Only a local service moves blobs between its own tiers",
        );
    }
    let from_text = match super::required(req, ctx, "from") {
        Ok(t) => String::from_utf8_lossy(&t).into_owned(),
        Err(r) => return r,
    };
    let to_text = match super::required(req, ctx, "to") {
        Ok(t) => String::from_utf8_lossy(&t).into_owned(),
        Err(r) => return r,
    };
    let Some(gk) = grant_key(ctx) else {
        return forbidden(ctx, GrantError::NoKey.message());
    };
    let now = unix_ms();
    let from = Grant::verify(&gk, &from_text, b"", b"", now);
    let to = Grant::verify(&gk, &to_text, b"", from_text.as_bytes(), now);
    let (from, to) = match (from, to) {
        (Ok(f), Ok(t)) if f.op == GrantOp::Move && t.op == GrantOp::Move => (f, t),
        (Err(e), _) | (_, Err(e)) => return forbidden(ctx, e.message()),
        _ => return forbidden(ctx, "Invalid grant: not for this operation"),
    };
    if from.rank != to.rank || from.size != to.size {
        return forbidden(ctx, "Invalid grant: the two blobs do not match");
    }
    let src = match granted_segment(ctx, &from, true) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let dst = match granted_segment(ctx, &to, true) {
        Ok(s) => s,
        Err(r) => return r,
    };
    // One copy per pair of grants: `to`'s MAC covers `from`'s text, so it names the move. A
    // replay would copy into a destination the meta may have given to another object since.
    if let Err(r) = admit(ctx, &to_text, &to) {
        return r;
    }
    let (src_file, dst_file) = (src.backend.file().is_some(), dst.backend.file().is_some());
    let (src_view, dst_view) = (view(src, &from), view(dst, &to));
    let (outcome, sum) = match (src_file, dst_file) {
        (false, true) => ctx.shard.flush_io(&src_view, &dst_view).await,
        (true, false) if dst_view.seg.backend.host_region().is_some() => {
            (ctx.shard.rewarm_io(&src_view, &dst_view, from.sum).await, 0)
        }
        (false, false)
            if src_view.seg.medium == Medium::Hbm && dst_view.seg.medium == Medium::Dram =>
        {
            (demote_io(&src_view, &dst_view), 0)
        }
        _ => {
            return ctx.protocol_error(
                Status::BAD_REQUEST,
                "A move copies between a memory segment and an SSD segment, or from HBM to DRAM",
            );
        }
    };
    match outcome {
        IoOutcome::Done => {
            // In the catalog as a copy of the source's entry; handed over once the meta's log
            // says the move landed (it switched its index to the copy).
            let shared = &ctx.shard.shared;
            let mut catalog = shared.membership.local.catalog();
            let (named, replaced) = catalog.add_moved_tracked(
                Medium::ALL[from.medium as usize],
                from.offset,
                from.size,
                Medium::ALL[to.medium as usize],
                to.offset,
                sum,
            );
            // SSD entries whose range the copy took are journaled as gone.
            shared.journal_catalog(replaced);
            drop(catalog);
            if named {
                ctx.shard.shared.membership.local.moved_at_ms.store(
                    ctx.shard.shared.clock.now_ms(),
                    std::sync::atomic::Ordering::Relaxed,
                );
            } else {
                log::debug!(
                    "rank {}: a tier move's source is not in the catalog; its copy is not handed over",
                    from.rank
                );
            }
            ctx.scratch.clear();
            let mut w = JsonWriter::new(ctx.scratch);
            w.begin_object();
            w.field_bool("success", true);
            w.field_u64("checksum", sum);
            w.end_object();
            Response::json_scratch(Status::OK)
        }
        IoOutcome::Damaged => {
            if let Some(f) = src_view.seg.backend.file() {
                f.record_damaged(ctx.shard.id, "checksum mismatch or short read");
            }
            ctx.scratch.clear();
            let mut w = JsonWriter::new(ctx.scratch);
            w.begin_object();
            w.field_bool("success", false);
            w.field_bool("damaged", true);
            w.field_str("error_message", DAMAGED_ON_SSD.as_bytes());
            w.end_object();
            let mut r = Response::json_scratch(Status::OK);
            r.failed = true;
            r
        }
        IoOutcome::Failed => {
            // The SSD file's status goes with the failure, so the meta stops flushing to a
            // faulted file at once instead of at the next heartbeat.
            let status = [&src_view, &dst_view]
                .iter()
                .find_map(|v| v.seg.backend.file().map(|f| f.status()))
                .unwrap_or(0);
            ctx.scratch.clear();
            let mut w = JsonWriter::new(ctx.scratch);
            w.begin_object();
            w.field_bool("success", false);
            w.field_u64("disk_status", status as u64);
            w.field_str(
                "error_message",
                b"I/O error while moving the blob between tiers",
            );
            w.end_object();
            let mut r = Response::json_scratch(Status::OK);
            r.failed = true;
            r
        }
    }
}

/// A local service's half of a demotion: copies its HBM blob into its DRAM blob.
fn demote_io(src: &BlobView, dst: &BlobView) -> IoOutcome {
    // SAFETY: the meta service keeps the HBM blob readable and unwritten, and the DRAM blob
    // allocated for this copy alone, until the move's answer (the grants name both).
    let res = unsafe {
        src.seg
            .backend
            .copy_to(src.offset, &dst.seg.backend, dst.offset, src.len as usize)
    };
    match res {
        Ok(()) => IoOutcome::Done,
        Err(e) => {
            log::error!(
                "moving a blob from {} to {} failed: {e}",
                src.seg.name,
                dst.seg.name
            );
            IoOutcome::Failed
        }
    }
}

/// Tells the meta service that the SSD copy a read grant named is damaged
/// (`POST /cluster/v1/damaged`, with the cluster token and the grant as proof).
pub(super) async fn report_damaged(ctx: &mut Ctx<'_>, key: &[u8], grant: &[u8]) {
    let shared = ctx.shard.shared.clone();
    let Some(meta) = shared.membership.local.meta_url() else {
        return;
    };
    let target = format!(
        "/cluster/v1/damaged?key={}&grant={}",
        encode_query(key),
        String::from_utf8_lossy(grant)
    );
    let token = shared.config.cluster.token.as_str();
    // Short: the reader waits for it (an unreachable meta only delays the error it gets).
    let timeout = std::time::Duration::from_secs(2);
    match client::request(&meta, "POST", &target, Some(token), Vec::new(), timeout).await {
        Ok(a) if a.status == 200 => {}
        Ok(a) => log::warn!(
            "the meta service refused a damaged-copy report: {}",
            a.status
        ),
        Err(e) => log::warn!("reporting a damaged SSD copy to the meta service failed: {e}"),
    }
}

/// `POST /cluster/v1/damaged?key=K&grant=G` on the meta service: a local service found the
/// SSD copy it was serving under this read grant damaged; the copy is dropped (the object
/// with it when it was the last one), as a damaged read here drops it.
pub(super) async fn cluster_damaged(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    if ctx.shard.shared.config.cluster.role != crate::config::Role::Meta {
        return forbidden(ctx, "Only a meta service drops copies");
    }
    let (key, text) = match super::remote::key_and_grant(req, ctx) {
        Ok(kg) => kg,
        Err(r) => return r,
    };
    let Some(gk) = super::remote::signing_key(ctx, &text) else {
        return forbidden(ctx, "Invalid grant: its rank is not mounted");
    };
    // The report may come just after the read's grant expired: its MAC is the proof.
    let grant = match Grant::verify(&gk, std::str::from_utf8(&text).unwrap_or(""), &key, b"", 0) {
        Ok(g) if g.op == GrantOp::Read && g.medium == Medium::Ssd as u8 => g,
        Ok(_) => return forbidden(ctx, "Invalid grant: not a read of an SSD copy"),
        Err(e) => return forbidden(ctx, e.message()),
    };
    let cmd = Command::DropDamaged {
        key,
        rank: grant.rank,
        medium: Medium::Ssd,
        offset: grant.offset,
    };
    match ctx.shard.execute(cmd).await {
        Reply::Done => {
            log::warn!(
                "rank {}: an SSD copy was found damaged by its local service and dropped",
                grant.rank
            );
            ctx.scratch.clear();
            let mut w = JsonWriter::new(ctx.scratch);
            w.begin_object();
            w.field_bool("success", true);
            w.end_object();
            Response::json_scratch(Status::OK)
        }
        other => ctx.reply_error(other, super::KEY_NOT_FOUND),
    }
}
