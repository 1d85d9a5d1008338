//! The routes between a meta service and its local services: join, heartbeat, leave (the
//! commit is with the grants, `remote.rs`). Guarded by the cluster token when one is set;
//! a meta listening off loopback without one admits nobody (fail-closed).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Ctx, Request, remote};
use crate::config::Role;
use crate::http::client;
use crate::http::response::{Response, Status};
use crate::shards::ranks::{MAX_RANK, RankReport};
use crate::shards::store::relocate::Move;
use crate::shards::store::segment::{Medium, Segment, SegmentStatus};
use crate::shards::{Command, Reply};

fn json_answer(ctx: &mut Ctx<'_>, v: Value) -> Response {
    ctx.scratch.clear();
    serde_json::to_writer(&mut *ctx.scratch, &v).expect("JSON into a Vec");
    Response::json_scratch(Status::OK)
}

/// Only a meta service admits local services, and off loopback only with a cluster token.
fn admits(ctx: &mut Ctx<'_>) -> Result<(), Response> {
    let config = &ctx.shard.cluster.config;
    if config.cluster.role != Role::Meta {
        return Err(ctx.protocol_error(
            Status::FORBIDDEN,
            "This is a local service: local services join a meta service",
        ));
    }
    let loopback = ctx.shard.cluster.ranks.listens_on_loopback(&config.listen);
    if !loopback && config.cluster.token.is_empty() {
        return Err(ctx.protocol_error(
            Status::FORBIDDEN,
            "Refused: this meta service listens off loopback without ock.mmc.cluster.token, so it admits no local service",
        ));
    }
    Ok(())
}

fn body_json(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Result<Value, Response> {
    serde_json::from_slice::<Value>(req.body)
        .ok()
        .filter(Value::is_object)
        .ok_or_else(|| {
            ctx.protocol_error(
                Status::BAD_REQUEST,
                "Malformed body: expected a JSON object",
            )
        })
}

fn field_u64(v: &Value, name: &str) -> Option<u64> {
    v.get(name).and_then(Value::as_u64)
}

/// `POST /cluster/v1/join`: `{"rank": R|null, "url": "http://h:p", "incarnation": N,
/// "segments": [{"medium": "DRAM", "size": BYTES}]}` → `{"rank", "grant_key",
/// "heartbeat_interval_ms"}`. The rank's segments are mounted as remote ones.
pub async fn join(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    if let Err(r) = admits(ctx) {
        return r;
    }
    let v = match body_json(req, ctx) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let wanted = match v.get("rank") {
        None | Some(Value::Null) => None,
        Some(r) => match r.as_u64().filter(|&r| r <= MAX_RANK as u64) {
            Some(r) => Some(r as u32),
            None => {
                return ctx.protocol_error(
                    Status::BAD_REQUEST,
                    "Invalid 'rank': expected a rank number or null",
                );
            }
        },
    };
    let url = v.get("url").and_then(Value::as_str).unwrap_or("");
    if crate::http::client::authority(url).is_err() {
        return ctx.protocol_error(
            Status::BAD_REQUEST,
            "Invalid 'url': expected http://host:port",
        );
    }
    let Some(incarnation) = field_u64(&v, "incarnation") else {
        return ctx.protocol_error(
            Status::BAD_REQUEST,
            "Invalid 'incarnation': expected a number",
        );
    };
    let mut segments = Vec::new();
    for s in v
        .get("segments")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let medium = s
            .get("medium")
            .and_then(Value::as_str)
            .and_then(Medium::parse);
        let size = field_u64(s, "size");
        match (medium, size) {
            (Some(m), Some(size)) if m.is_memory() && !segments.iter().any(|&(x, _)| x == m) => {
                segments.push((m, size))
            }
            _ => {
                return ctx.protocol_error(
                    Status::BAD_REQUEST,
                    "Invalid 'segments': expected [{\"medium\": \"DRAM\"|\"HBM\", \"size\": bytes}], one per medium",
                );
            }
        }
    }
    if segments.is_empty() {
        return ctx.protocol_error(
            Status::BAD_REQUEST,
            "Invalid 'segments': a local service lends at least one segment",
        );
    }
    let cluster = ctx.shard.cluster.clone();
    let first_free = cluster.config.store.ranks as u32;
    let joined = match cluster.ranks.join(
        wanted,
        url,
        incarnation,
        segments.clone(),
        first_free,
        Instant::now(),
    ) {
        Ok(j) => j,
        Err(e) => {
            log::warn!("refused a join from {url}: {e}");
            let mut r = ctx.protocol_error(Status::CONFLICT, &format!("Join refused: {e}"));
            r.failed = true;
            return r;
        }
    };
    let rank = joined.rank;
    if joined.fresh {
        // A new service, or a restarted one (its memory starts empty): whatever was mounted
        // for this rank before (its old copies) is dropped first.
        ctx.shard.drop_rank(rank).await;
    }
    let still = !cluster.remote_segments_of(rank).is_empty();
    if !still && let Err(e) = ctx.shard.mount_remote(rank, url, &segments) {
        log::error!("could not mount rank {rank}'s segments: {e}");
        cluster.ranks.leave(rank, incarnation);
        return ctx.protocol_error(Status::CONFLICT, &format!("Join refused: {e}"));
    }
    log::info!("rank {rank} joined from {url} (incarnation {incarnation})");
    let key = cluster
        .grant_key
        .get()
        .map(|k| k.to_hex())
        .unwrap_or_default();
    json_answer(
        ctx,
        json!({
            "rank": rank,
            "grant_key": key,
            "heartbeat_interval_ms": cluster.config.cluster.heartbeat_interval_ms,
        }),
    )
}

/// An admitted message from a member: its JSON body and its `rank` and `incarnation`.
fn member_message(
    req: &Request<'_>,
    ctx: &mut Ctx<'_>,
    what: &str,
) -> Result<(Value, u32, u64), Response> {
    admits(ctx)?;
    let v = body_json(req, ctx)?;
    match (field_u64(&v, "rank"), field_u64(&v, "incarnation")) {
        (Some(rank), Some(incarnation)) => Ok((v, rank.min(u32::MAX as u64) as u32, incarnation)),
        _ => Err(ctx.protocol_error(
            Status::BAD_REQUEST,
            &format!("Invalid {what}: expected rank and incarnation"),
        )),
    }
}

/// `POST /cluster/v1/heartbeat`: `{"rank", "incarnation", "gets", "get_bytes", "puts",
/// "put_bytes"}`; 409 when the meta does not know this incarnation (join again).
pub async fn heartbeat(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let (v, rank, incarnation) = match member_message(req, ctx, "heartbeat") {
        Ok(m) => m,
        Err(r) => return r,
    };
    let report = RankReport {
        gets: field_u64(&v, "gets").unwrap_or(0),
        get_bytes: field_u64(&v, "get_bytes").unwrap_or(0),
        puts: field_u64(&v, "puts").unwrap_or(0),
        put_bytes: field_u64(&v, "put_bytes").unwrap_or(0),
    };
    if ctx
        .shard
        .cluster
        .ranks
        .heartbeat(rank, incarnation, report, Instant::now())
    {
        json_answer(ctx, json!({"success": true}))
    } else {
        ctx.protocol_error(Status::CONFLICT, "Unknown rank or incarnation: join again")
    }
}

/// `POST /cluster/v1/leave`: `{"rank", "incarnation"}`. The rank's segments are unmounted:
/// its objects with a copy elsewhere stay readable.
pub async fn leave(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let (_, rank, incarnation) = match member_message(req, ctx, "leave") {
        Ok(m) => m,
        Err(r) => return r,
    };
    let cluster = ctx.shard.cluster.clone();
    if !cluster.ranks.is_live(rank, incarnation) {
        return ctx.protocol_error(Status::CONFLICT, "Unknown rank or incarnation");
    }
    let segs = cluster.remote_segments_of(rank);
    let moved = drain(ctx, &segs).await;
    ctx.shard.drop_rank(rank).await;
    cluster.ranks.leave(rank, incarnation);
    log::info!("rank {rank} left; {moved} objects moved to other ranks");
    json_answer(ctx, json!({"success": true, "rank": rank, "moved": moved}))
}

/// Moves every object whose only copy is on these remote segments to other ranks while room
/// lasts, so a graceful leave or an unmount loses nothing that fits elsewhere. The bytes come
/// from the leaving local service under read grants and go to the new blobs (in this
/// process's memory directly, on another local service under a write grant): a drain is the
/// one time a remote rank's bytes pass through the meta service. Returns the objects moved.
pub(super) async fn drain(ctx: &mut Ctx<'_>, segs: &[Arc<Segment>]) -> u64 {
    for seg in segs {
        seg.set_status(SegmentStatus::GracefullyUnmounting);
    }
    let mut moved = 0;
    for seg in segs {
        let id = seg.id;
        loop {
            let replies = ctx
                .shard
                .broadcast(|| Command::BeginMoves { seg: id, max: 64 })
                .await;
            let moves: Vec<Move> = replies
                .into_iter()
                .flat_map(|r| match r {
                    Reply::Moves(m) => m,
                    _ => Vec::new(),
                })
                .collect();
            if moves.is_empty() {
                break;
            }
            for m in moves {
                let ok = copy(ctx, &m).await;
                moved += ok as u64;
                let _ = ctx
                    .shard
                    .execute(Command::FinishMove {
                        key: m.key.clone(),
                        dst: m.to.handle,
                        ok,
                    })
                    .await;
            }
        }
    }
    moved
}

/// Copies one move's bytes from the leaving rank to the new blob.
async fn copy(ctx: &mut Ctx<'_>, m: &Move) -> bool {
    let Some(from) = remote::read_grant_url(ctx, &m.key, &m.from) else {
        return false;
    };
    let timeout = Duration::from_secs(10);
    let bytes = match client::request_url(&from, "GET", Vec::new(), timeout).await {
        Ok(a) if a.status == 200 && a.body.len() as u64 == m.from.len => a.body,
        Ok(a) => {
            log::warn!(
                "moving {:?}: its rank answered {}",
                String::from_utf8_lossy(&m.key),
                a.status
            );
            return false;
        }
        Err(e) => {
            log::warn!("moving {:?}: {e}", String::from_utf8_lossy(&m.key));
            return false;
        }
    };
    if m.to.seg.backend.remote().is_none() {
        // SAFETY: the new blob is ALLOCATED and pinned for this move alone until it ends.
        return unsafe { m.to.seg.backend.write(m.to.offset, &bytes) }.is_ok();
    }
    let Some(to) = remote::write_grant_url(ctx, &m.key, &m.to) else {
        return false;
    };
    matches!(
        client::request_url(&to, "PUT", bytes, timeout).await,
        Ok(a) if a.status == 200
    )
}
