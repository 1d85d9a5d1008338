//! Segments and capacity: `/get_all_segments`, `/query_segment`, `/api/v1/segments/status`,
//! `/api/v1/capacity/*`, and the admin routes that mount and unmount segments.

use crate::common::error_kind::{ErrorKind, Refusal};
use std::sync::Arc;

use super::{Ctx, Request, optional, parse_uint, required};
use crate::http::json::JsonWriter;
use crate::http::response::{Body, ContentType, Response, Status};
use crate::metrics::store::{Op, Outcome};
use crate::shards::store::mount::build_segment_off_shard;
use crate::shards::store::segment::{MAX_SEGMENT_BYTES, Medium, Segment, SegmentStatus};
use crate::shards::{Command, Reply};

fn ratio(part: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        part as f64 / total as f64
    }
}

pub fn get_all_segments(ctx: &mut Ctx<'_>) -> Response {
    let mut out = Vec::new();
    for s in ctx.shard.shared.segments.snapshot().iter() {
        out.extend_from_slice(s.name.as_bytes());
        out.push(b'\n');
    }
    Response::new(Status::OK, ContentType::Text, Body::Bytes(out.into()))
}

fn find_segment(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Result<Arc<Segment>, Response> {
    let name = required(req, ctx, "segment")?;
    let name = String::from_utf8_lossy(&name);
    ctx.shard
        .shared
        .segments
        .find(&name)
        .ok_or_else(|| ctx.business_error(ErrorKind::NotFound, "Segment not found"))
}

pub fn query_segment(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let seg = match find_segment(req, ctx) {
        Ok(s) => s,
        Err(r) => return r,
    };
    ctx.json_object(|w| {
        w.field_str("segment", seg.name.as_bytes());
        remaining_fields(w, &seg);
    })
}

/// A segment's medium, total, used and remaining bytes and remaining ratio.
fn remaining_fields(w: &mut JsonWriter<'_>, seg: &Segment) {
    let used = seg.used_bytes();
    let remaining = seg.capacity - used;
    w.field_str("medium", seg.medium.upper().as_bytes());
    w.field_u64("total_bytes", seg.capacity);
    w.field_u64("used_bytes", used);
    w.field_u64("remaining_bytes", remaining);
    w.field_ratio("remaining_ratio", ratio(remaining, seg.capacity));
}

pub fn segment_status(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let seg = match find_segment(req, ctx) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let status = seg.status();
    ctx.json_object(|w| {
        w.field_bool("success", true);
        w.field_str("segment", seg.name.as_bytes());
        w.field_u64("status", status as u64);
        w.field_str("status_name", status.name().as_bytes());
    })
}

/// Whether the figures come from a healthy data source: every shard serving, every segment
/// OK and no SSD reporting an I/O fault.
fn degraded(ctx: &Ctx<'_>) -> bool {
    ctx.shard.shared.segments.snapshot().iter().any(|s| {
        s.status() != SegmentStatus::Ok || s.backend.file().is_some_and(|f| f.status() != 0)
    })
}

pub fn capacity_usage(ctx: &mut Ctx<'_>) -> Response {
    let segs = ctx.shard.shared.segments.snapshot();
    let totals = |m: Medium| {
        segs.iter()
            .filter(|s| s.medium == m)
            .fold((0u64, 0u64), |(t, u), s| {
                (t + s.capacity, u + s.used_bytes())
            })
    };
    capacity_report(ctx, |w| {
        for medium in Medium::ALL {
            let Some(name) = medium.names().device else {
                continue;
            };
            let (total, used) = totals(medium);
            w.begin_object_field(name);
            w.field_u64("total_bytes", total);
            w.field_u64("used_bytes", used);
            w.field_u64("free_bytes", total.saturating_sub(used));
            w.field_ratio("usage_ratio", ratio(used, total));
            w.end_object();
        }
    })
}

/// A capacity answer: its timestamp and data-source facts, then the fields of `fill`.
fn capacity_report(ctx: &mut Ctx<'_>, fill: impl FnOnce(&mut JsonWriter<'_>)) -> Response {
    let ready = ctx.shard.shared.is_ready();
    let degraded = degraded(ctx);
    let now = ctx.shard.clock.unix_secs();
    ctx.json_object(|w| {
        w.field_u64("timestamp", now);
        w.field_bool("data_source_ready", ready);
        w.field_bool("degraded", degraded);
        fill(w);
    })
}

pub fn segment_remaining(ctx: &mut Ctx<'_>) -> Response {
    let segs = ctx.shard.shared.segments.snapshot();
    capacity_report(ctx, |w| {
        w.begin_array_field("segments");
        for s in segs.iter() {
            w.begin_object();
            w.field_str("segment_name", s.name.as_bytes());
            remaining_fields(w, s);
            w.end_object();
        }
        w.end_array();
    })
}

fn segment_reply(ctx: &mut Ctx<'_>, name: &str) -> Response {
    ctx.json_object(|w| {
        w.field_bool("success", true);
        w.field_str("segment", name.as_bytes());
    })
}

/// `POST /api/v1/segments/mount?rank=R&medium=hbm|dram|ssd&size=SIZE[&path=DIR]`.
pub async fn mount(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let stats = ctx.shard.store_stats();
    let parsed = (|| -> Result<(u32, Medium, u64, Option<String>), Response> {
        let rank = required(req, ctx, "rank")?;
        let rank = parse_uint(&rank, 0, 1 << 20).ok_or_else(|| {
            ctx.business_error(
                ErrorKind::InvalidParam,
                "Invalid 'rank' parameter: expected an integer",
            )
        })? as u32;
        let medium = required(req, ctx, "medium")?;
        let medium = std::str::from_utf8(&medium)
            .ok()
            .and_then(Medium::parse)
            .ok_or_else(|| {
                ctx.business_error(
                    ErrorKind::InvalidParam,
                    "Invalid 'medium' parameter: expected hbm, dram or ssd",
                )
            })?;
        let size = required(req, ctx, "size")?;
        let size = std::str::from_utf8(&size)
            .ok()
            .and_then(|s| crate::config::values::parse_size(s).ok())
            .filter(|&n| n > 0 && n <= MAX_SEGMENT_BYTES)
            .ok_or_else(|| {
                ctx.business_error(
                    ErrorKind::InvalidParam,
                    "Invalid 'size' parameter: expected a size such as 1GB (at most 1TB)",
                )
            })?;
        let path = optional(req, ctx, "path")?.map(|p| String::from_utf8_lossy(&p).into_owned());
        Ok((rank, medium, size, path))
    })();
    let (rank, medium, size, path) = match parsed {
        Ok(p) => p,
        Err(r) => {
            stats.record(Op::Mount, Outcome::Failure, None);
            return r;
        }
    };
    let shared = &ctx.shard.shared;
    let dir = match (medium, path) {
        (Medium::Ssd, Some(p)) => Some(p),
        (Medium::Ssd, None) => {
            let dirs = &shared.config.store.ssd_dirs;
            if dirs.is_empty() {
                stats.record(Op::Mount, Outcome::Failure, Some(rank));
                return ctx.business_error(ErrorKind::InvalidParam,
                    "Missing 'path' parameter: no SSD directory is configured (ock.mmc.ssd.path), so an SSD mount must name its path",
                );
            }
            Some(dirs[rank as usize % dirs.len()].clone())
        }
        _ => None,
    };
    let name = crate::common::segment::segment_name(rank, medium);
    if shared.segments.find(&name).is_some() {
        stats.record(Op::Mount, Outcome::Failure, Some(rank));
        return ctx.business_error(
            ErrorKind::Failed,
            &format!("Segment {name} is already mounted"),
        );
    }
    let built = build_segment_off_shard(
        &shared.segments,
        rank,
        medium,
        size,
        dir,
        shared.shard_count(),
        shared.config.store.run_bytes,
    )
    .await
    .and_then(|seg| {
        if shared.config.store.prefault {
            crate::shards::store::mount::prefault_in_background(&seg);
        }
        shared.segments.insert(seg)
    });
    match built {
        Ok(()) => {
            log::info!("mounted segment {name} ({size} bytes)");
            stats.record(Op::Mount, Outcome::Success, Some(rank));
            segment_reply(ctx, &name)
        }
        Err(e) => {
            stats.record(Op::Mount, Outcome::Failure, Some(rank));
            ctx.business_error(ErrorKind::Failed, &e)
        }
    }
}

/// `POST /api/v1/segments/unmount?segment=NAME`: stops allocations there, moves every blob
/// off it (another segment of the medium, else the memory tier below, else dropped), then
/// removes it and its metric series.
pub async fn unmount(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let stats = ctx.shard.store_stats();
    let seg = match find_segment(req, ctx) {
        Ok(s) => s,
        Err(r) => {
            stats.record(Op::Unmount, Outcome::Failure, None);
            return r;
        }
    };
    // (UNDEFINED: a remote rank's segment before its first heartbeat, unmountable as well.)
    if !matches!(seg.status(), SegmentStatus::Ok | SegmentStatus::Undefined) {
        stats.record(Op::Unmount, Outcome::Failure, Some(seg.rank));
        return ctx.business_error(
            ErrorKind::Failed,
            &format!("Segment {} is already being unmounted", seg.name),
        );
    }
    if seg.backend.remote().is_some() {
        // A remote rank's segment: its objects move to other ranks (their bytes fetched from
        // its local service), then it is dropped.
        let moved = super::cluster::drain(ctx, std::slice::from_ref(&seg)).await;
        ctx.shard.drop_remote_segment(&seg).await;
        log::info!(
            "unmounted remote segment {} ({moved} objects moved)",
            seg.name
        );
        stats.record(Op::Unmount, Outcome::Success, Some(seg.rank));
        return segment_reply(ctx, &seg.name);
    }
    seg.set_status(SegmentStatus::Unmounting);
    let id = seg.id;
    let replies = ctx.shard.broadcast(|| Command::Evacuate { seg: id }).await;
    if let Some(bad) = replies.into_iter().find(|r| !matches!(r, Reply::Done)) {
        seg.set_status(SegmentStatus::Ok);
        stats.record(Op::Unmount, Outcome::Failure, Some(seg.rank));
        return ctx.reply_error(bad, Refusal::new(ErrorKind::NotFound, "Segment not found"));
    }
    ctx.shard.shared.segments.remove(&seg.name);
    // Out of the table, no shard adopts it again: each drops its share, so the mapping (or
    // the SSD file) goes with the last reference, this handler's `seg`.
    let _ = ctx.shard.broadcast(|| Command::Forget { seg: id }).await;
    log::info!("unmounted segment {}", seg.name);
    // The rank's last segment is gone: its client bandwidth figures go with it.
    let shared = &ctx.shard.shared;
    if !shared
        .segments
        .snapshot()
        .iter()
        .any(|s| s.rank == seg.rank)
    {
        for s in shared.shards.iter() {
            s.client.forget_rank(seg.rank);
        }
    }
    stats.record(Op::Unmount, Outcome::Success, Some(seg.rank));
    segment_reply(ctx, &seg.name)
}
