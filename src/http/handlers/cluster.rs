//! The routes between a meta service and its local services: join, heartbeat, leave (the
//! commit is with the grants, `remote.rs`). Guarded by the cluster token when one is set;
//! a meta listening off loopback without one admits nobody (fail-closed).

use crate::metrics::otlp::{Attr, Kind, SpanRecord};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Ctx, Request, copies};
use crate::cluster::catalog::{Adopted, Entry, LogAnswer};
use crate::cluster::drain::{self, Drain, Step};
use crate::cluster::members::{Beat, CatalogFate, JoinRequest, MAX_RANK, Membership};
use crate::config::Role;
use crate::http::catalog_wire;
use crate::http::response::{Response, Status};
use crate::shards::ranks::RankReport;
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
    let config = &ctx.shard.shared.config;
    if config.cluster.role != Role::Meta {
        return Err(ctx.protocol_error(
            Status::FORBIDDEN,
            "This is a local service: local services join a meta service",
        ));
    }
    let loopback = ctx
        .shard
        .shared
        .membership
        .ranks
        .listens_on_loopback(&config.listen);
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
/// "heartbeat_interval_ms"}`. The rank's segments are mounted as remote ones, UNDEFINED until
/// its first heartbeat after this answer (`heartbeat`).
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
            "Invalid 'url': expected http://host:port or https://host:port",
        );
    }
    if url.starts_with("https://") && !crate::http::client::tls_ready() {
        return ctx.protocol_error(
            Status::BAD_REQUEST,
            "Invalid 'url': https:// but this meta service has no CA to verify it (ock.mmc.cluster.tls.ca.path)",
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
            (Some(m), Some(size)) if !segments.iter().any(|&(x, _)| x == m) => {
                segments.push((m, size))
            }
            _ => {
                return ctx.protocol_error(
                    Status::BAD_REQUEST,
                    "Invalid 'segments': expected [{\"medium\": \"DRAM\"|\"HBM\"|\"SSD\", \"size\": bytes}], one per medium",
                );
            }
        }
    }
    if !segments.iter().any(|&(m, _)| m.is_memory()) {
        return ctx.protocol_error(
            Status::BAD_REQUEST,
            "Invalid 'segments': a local service lends at least one memory segment",
        );
    }
    // The service holds blobs it will list in its first heartbeat (after it has this meta's
    // grant key, so no adopted object is served before the service can check its grants).
    let catalog_follows = v.get("catalog_follows").and_then(Value::as_bool) == Some(true);
    // The rank asked for is the service's configured one, not one it was given before (absent:
    // given); the configured one keeps a rank two services ask for (`members::takes_over`).
    let configured = v.get("rank_configured").and_then(Value::as_bool) == Some(true);
    // The leadership the catalog was last in step with (absent: none known, so with HA a
    // catalog is adopted only if no leadership served before this one).
    let in_step = v.get("in_step").and_then(Value::as_u64).unwrap_or(0);
    // The membership whose admission last made the service drop its catalog (absent: none,
    // so a loss recorded of any of its memberships voids the catalog).
    let since = |i: usize| {
        v.pointer(&format!("/catalog_since/{i}"))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let catalog_since = Membership {
        view: since(0),
        epoch: since(1),
    };
    // The catalog came from an earlier process's SSD journal and this process was not heard
    // yet (absent: a live catalog).
    let recovered = v.get("recovered").and_then(Value::as_bool) == Some(true);
    let heard_by = v.get("heard_by").and_then(Value::as_u64).unwrap_or(0);
    let shared = ctx.shard.shared.clone();
    let first_free = shared.config.store.ranks as u32;
    let view = shared.ha.fence().max(0) as u64;
    // This meta's lineage under that view: the join is decided and answered under the same one.
    let lineage = shared.stamp_view_at(view);
    let joined = shared.membership.ranks.lock().join(JoinRequest {
        view,
        wanted,
        configured,
        url,
        incarnation,
        segments: segments.clone(),
        catalog_follows,
        in_step,
        catalog_since,
        recovered,
        heard_by,
        lineage,
        first_free,
        now_ms: shared.clock.now_ms(),
    });
    let joined = match joined {
        Ok(j) => j,
        Err(e) => {
            // A holder asked to give its rank up for this service takes no new put from now
            // on (its next heartbeat is refused, and it drops its grant key to join again).
            let yielding =
                wanted.and_then(|r| Some((r, shared.membership.ranks.lock().yielding(r)?)));
            if let Some((rank, epoch)) = yielding {
                shared.undefine_member_segments(rank, epoch);
            }
            log::warn!("refused a join from {url}: {e}");
            let mut r = ctx.protocol_error(Status::CONFLICT, &format!("Join refused: {e}"));
            r.failed = true;
            return r;
        }
    };
    let (rank, epoch) = (joined.rank, joined.epoch);
    if joined.fresh {
        // The membership it replaces (an earlier process on the rank, or this one before it
        // was lost or before this leadership) leaves the segment table at once, so this one
        // mounts its own now; its blobs are dropped in the background (pinned ones are freed
        // as their pins end, which may take a hop's timeout).
        if let Some(old) = joined.retire {
            let me = ctx.shard.clone();
            let segs = shared.unmount_member(rank, old);
            monoio::spawn(async move { me.drop_member_segments(rank, old, segs).await });
        }
        // Its catalog says what it holds now: the freed log starts over.
        shared.membership.freed_logs.begin(rank, epoch);
        // UNDEFINED until the rank's first heartbeat: this answer may reach the service a
        // moment after a put was placed, and it holds no grant key before it reads it.
        if let Err(e) = ctx
            .shard
            .mount_remote(rank, url, incarnation, epoch, &segments)
        {
            log::error!("could not mount rank {rank}'s segments: {e}");
            shared.membership.ranks.lock().left(rank, epoch);
            for seg in shared.member_segments(rank, epoch) {
                shared.segments.remove_id(&seg.name, seg.id);
            }
            return ctx.protocol_error(Status::CONFLICT, &format!("Join refused: {e}"));
        }
    } else {
        // The same membership joining again (its answer was lost, or it gave up on our
        // answers): it dropped its grant key when it began to, so it takes no new put until
        // the heartbeat after this answer.
        shared.undefine_member_segments(rank, epoch);
    }
    let discard = joined.catalog == CatalogFate::Discard;
    if let Some(missed) = joined.missed {
        log::warn!(
            "rank {rank} joined from {url} with a catalog last in step with leadership {in_step}: it missed leadership {missed}, which served (it may have put newer versions of those keys or deleted them), so its catalog is void"
        );
    } else if joined.stale_recovery {
        log::warn!(
            "rank {rank} joined from {url} with a catalog recovered from its SSD file, last heard by meta lineage {heard_by}: only that one knows what it removed since, so the catalog is void here"
        );
    } else if discard {
        log::warn!(
            "rank {rank} joined again from {url} after it was declared lost: its catalog is void (its objects were dropped here)"
        );
    }
    log::info!("rank {rank} joined from {url} (incarnation {incarnation}, epoch {epoch})");
    // This membership's own key: grants given to an earlier process on this rank, or to an
    // earlier membership of this one, do not verify.
    let key = shared
        .membership
        .grant_key
        .get()
        .map(|k| k.for_member(rank, incarnation, epoch).to_hex())
        .unwrap_or_default();
    json_answer(
        ctx,
        json!({
            "rank": rank,
            "epoch": epoch,
            "grant_key": key,
            "heartbeat_interval_ms": shared.config.cluster.heartbeat_interval_ms,
            "heartbeat_timeout_ms": shared.config.cluster.heartbeat_timeout_ms,
            "ha": shared.config.ha.enable,
            "discard_catalog": discard,
            // What the local service reports as the view of the meta it follows.
            "view_version": view,
            // This meta's lineage: a catalog recovered after a restart of the service is
            // adopted only by the lineage that heard it last (`JoinRequest::heard_by`).
            "lineage": lineage,
            // False only when the meta continued the membership the service reported under
            // (`Joined::continued`): a service silent past the heartbeat timeout keeps its
            // catalog only then.
            "fresh": !joined.continued,
        }),
    )
}

/// Adopts a rank's catalog on the owner shards of its keys; returns how many entries
/// were refused (logged as freed for the rank, so its local service drops them).
async fn adopt(ctx: &mut Ctx<'_>, rank: u32, epoch: u64, catalog: Vec<Entry>) -> usize {
    let n = ctx.shard.shared.shard_count();
    let mut groups: Vec<Vec<Adopted>> = (0..n).map(|_| Vec::new()).collect();
    for entry in catalog {
        groups[ctx.shard.owner_of(&entry.key)].push(Adopted { rank, entry });
    }
    let mut refused: Vec<Adopted> = Vec::new();
    for (owner, entries) in groups.into_iter().enumerate() {
        if entries.is_empty() {
            continue;
        }
        // A batch per owner, so no shard holds its thread long for one big catalog.
        let mut rest = entries;
        while !rest.is_empty() {
            let tail = rest.split_off(rest.len().min(ADOPT_BATCH));
            let batch = std::mem::replace(&mut rest, tail);
            let kept = batch.clone();
            match ctx
                .shard
                .submit(owner, Command::Adopt { entries: batch })
                .wait()
                .await
            {
                Reply::Adopted(r) => refused.extend(r),
                _ => refused.extend(kept),
            }
        }
    }
    let count = refused.len();
    ctx.shard
        .shared
        .membership
        .freed_logs
        .push(refused.iter().map(|a| a.refused(epoch)));
    count
}

/// Catalog entries one adoption command carries.
const ADOPT_BATCH: usize = 1024;

/// Who sent a membership message: the rank, the process and the membership.
struct Sender {
    rank: u32,
    incarnation: u64,
    epoch: u64,
}

/// An admitted message from a member: its JSON body and who sent it.
fn member_message(
    req: &Request<'_>,
    ctx: &mut Ctx<'_>,
    what: &str,
) -> Result<(Value, Sender), Response> {
    admits(ctx)?;
    let v = body_json(req, ctx)?;
    match (
        field_u64(&v, "rank"),
        field_u64(&v, "incarnation"),
        field_u64(&v, "epoch"),
    ) {
        (Some(rank), Some(incarnation), Some(epoch)) => Ok((
            v,
            Sender {
                rank: rank.min(u32::MAX as u64) as u32,
                incarnation,
                epoch,
            },
        )),
        _ => Err(ctx.protocol_error(
            Status::BAD_REQUEST,
            &format!("Invalid {what}: expected rank, incarnation and epoch"),
        )),
    }
}

/// `POST /cluster/v1/heartbeat`: `{"rank", "incarnation", "client"[, "ssd_path",
/// "ssd_status", "ssd_read_bps", "ssd_write_bps"]}` (`client`: the bytes the service moved,
/// `report_wire`); 409 when the meta does not know this incarnation (join again).
pub async fn heartbeat(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let (v, from) = match member_message(req, ctx, "heartbeat") {
        Ok(m) => m,
        Err(r) => return r,
    };
    let rank = from.rank;
    let report = RankReport {
        client: crate::http::report_wire::parse_client(v.get("client"), rank),
        ssd_path: v
            .get("ssd_path")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        ssd_status: field_u64(&v, "ssd_status").unwrap_or(0).min(255) as u8,
        ssd_read_bps: field_u64(&v, "ssd_read_bps").unwrap_or(0),
        ssd_write_bps: field_u64(&v, "ssd_write_bps").unwrap_or(0),
    };
    let status = report.ssd_status;
    let shared = ctx.shard.shared.clone();
    let view = shared.ha.fence().max(0) as u64;
    let now = shared.clock.now_ms();
    let beat = shared.membership.ranks.lock().heartbeat(
        view,
        rank,
        from.incarnation,
        from.epoch,
        report,
        now,
    );
    if beat == Beat::Refused {
        return ctx.protocol_error(
            Status::CONFLICT,
            "Unknown rank, incarnation or epoch: join again",
        );
    }
    let segs = shared.member_segments(rank, from.epoch);
    // A faulted remote SSD takes no flushes until its file takes writes again (its local
    // service probes it, as a meta service probes its own).
    for seg in &segs {
        if seg.medium == Medium::Ssd
            && let Some(r) = seg.backend.remote()
        {
            r.set_disk_status(status);
        }
    }
    if let Beat::First { catalog } = beat {
        if catalog {
            // The first heartbeat after a fresh join with a catalog: take its blobs over.
            let catalog = catalog_wire::parse_entries(v.get("catalog")).unwrap_or_else(|| {
                log::error!("rank {rank}: its catalog is malformed; nothing taken over");
                Vec::new()
            });
            let offered = catalog.len();
            let refused = adopt(ctx, rank, from.epoch, catalog).await;
            log::info!(
                "rank {rank}: adopted {} of the {offered} blobs in its catalog",
                offered - refused
            );
        }
        // The memberships this join replaced settle once the service acknowledges what the
        // adoption refused (`FreedLogs::adopted`).
        shared.membership.freed_logs.adopted(rank, from.epoch);
        // The first heartbeat after a join: the service read the answer and holds the grant
        // key, so its segments take puts and redirects from now on (one being unmounted or
        // drained meanwhile keeps that status).
        for seg in &segs {
            if seg.status() == SegmentStatus::Undefined {
                seg.set_status(SegmentStatus::Ok);
            }
        }
        log::info!("rank {rank}: first heartbeat since its join; its segments are OK");
    }
    // The blobs freed on this rank since the acknowledged sequence (catalog hand-over).
    let ack = field_u64(&v, "catalog_ack").unwrap_or(0);
    match shared.membership.freed_logs.answer(rank, ack) {
        LogAnswer::Records { seq, freed } => {
            let mut v = catalog_wire::news_json(seq, &freed);
            v["success"] = json!(true);
            json_answer(ctx, v)
        }
        LogAnswer::Resync { seq } => {
            let replies = ctx.shard.broadcast(|| Command::RankBlobs { rank }).await;
            let list: Vec<Value> = replies
                .iter()
                .flat_map(|r| match r {
                    Reply::Entries(e) => e.as_slice(),
                    _ => &[],
                })
                .map(catalog_wire::entry_json)
                .collect();
            log::warn!(
                "rank {rank}: its freed log overflowed; resyncing its catalog ({} blobs)",
                list.len()
            );
            json_answer(
                ctx,
                json!({"success": true, "catalog_seq": seq, "resync": true, "catalog": list}),
            )
        }
    }
}

/// `POST /cluster/v1/leave`: `{"rank", "incarnation", "epoch"}`. The rank's segments are
/// drained (its objects moved to other ranks while room lasts) and unmounted; the service keeps
/// reporting meanwhile. A leave of another membership than the rank's current one (a process
/// that was replaced, a message delayed past a new join) changes nothing: 409.
pub async fn leave(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let (_, from) = match member_message(req, ctx, "leave") {
        Ok(m) => m,
        Err(r) => return r,
    };
    let (rank, epoch) = (from.rank, from.epoch);
    let shared = ctx.shard.shared.clone();
    let view = shared.ha.fence().max(0) as u64;
    if !shared
        .membership
        .ranks
        .lock()
        .leave(view, rank, from.incarnation, epoch)
    {
        return ctx.protocol_error(
            Status::CONFLICT,
            "Unknown rank, incarnation or epoch, or already leaving",
        );
    }
    let segs = shared.member_segments(rank, epoch);
    let moved = drain(ctx, &segs).await;
    ctx.shard.drop_rank(rank, epoch).await;
    shared.membership.ranks.lock().left(rank, epoch);
    log::info!("rank {rank} left; {moved} objects moved to other ranks");
    json_answer(ctx, json!({"success": true, "rank": rank, "moved": moved}))
}

/// Moves every object whose only copy is on these remote segments to other ranks while room
/// lasts, so a graceful leave or an unmount loses nothing that fits elsewhere. The bytes come
/// from the leaving local service under read grants and go to the new blobs (in this
/// process's memory directly, on another local service under a write grant): a drain is the
/// one time a remote rank's bytes pass through the meta service. Returns the objects moved.
pub(super) async fn drain(ctx: &mut Ctx<'_>, segs: &[Arc<Segment>]) -> u64 {
    // Its span (whenever tracing is on), under the request's when that one is sampled.
    let t = ctx.shard.shared.exports.telemetry.clone();
    let span = t.start_always(ctx.trace.as_ref()).map(|(c, parent)| {
        let mut s = SpanRecord::begin(c, parent, "mmc.drain", Kind::Internal);
        let names = segs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>();
        s.attr("mmc.segments", Attr::Text(names.join(",")));
        (s, Instant::now())
    });
    let moved = drain_segments(ctx, segs).await;
    if let Some((mut s, start)) = span {
        s.attr("mmc.moved_objects", Attr::Int(moved as i64));
        s.end(start.elapsed());
        t.record(s);
    }
    moved
}

async fn drain_segments(ctx: &mut Ctx<'_>, segs: &[Arc<Segment>]) -> u64 {
    for seg in segs {
        seg.set_status(SegmentStatus::GracefullyUnmounting);
    }
    // The drain's decisions (`cluster::drain`): which segment next, how much room to make,
    // when to ask again, when it is over.
    let clock = ctx.shard.shared.clock;
    let shards = ctx.shard.shared.shard_count();
    let mut d = Drain::new(segs.iter().map(|s| s.id), shards, clock.now_ms());
    loop {
        let (id, room) = match d.next(clock.now_ms()) {
            Step::Done { moved } => return moved,
            Step::Wait { until_ms } => {
                let ms = until_ms.saturating_sub(clock.now_ms());
                monoio::time::sleep(Duration::from_millis(ms.max(1))).await;
                continue;
            }
            Step::Ask { seg, room } => (seg, room),
        };
        // Before the moves' blobs are allocated (`remote::copy_floor`).
        let floors = ctx.shard.shared.membership.freed_logs.floors();
        let replies = ctx
            .shard
            .broadcast(|| Command::BeginMoves {
                seg: id,
                max: drain::MOVES_PER_ASK as u32,
                room,
            })
            .await;
        let mut answer = drain::Answer::default();
        let mut moves: Vec<Move> = Vec::new();
        for r in replies {
            if let Reply::Moves(step) = r {
                answer.coming |= step.coming;
                answer.possible |= step.room_possible;
                for (n, s) in answer.need.iter_mut().zip(step.need) {
                    *n += s;
                }
                moves.extend(step.moves);
            }
        }
        answer.moves = moves.len();
        d.answered(answer, clock.now_ms());
        for m in moves {
            let ok = copies::copy(ctx.shard, &m.key, &m.from, &m.to, m.stamp, &floors).await;
            d.copied(ok);
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
