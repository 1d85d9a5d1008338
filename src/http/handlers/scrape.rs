//! Scrape endpoints: `/metrics`, `/metrics/summary`, `/metrics/ptracer`,
//! `/api/v1/analysis/alloc_free_latency`. They read running figures and never count as
//! business operations.

use std::sync::atomic::Ordering::Relaxed;

use super::{Ctx, Request};
use crate::http::response::{Body, ContentType, Response, Status};
use crate::metrics::exposition::{self, Format};
use crate::metrics::kv_events::{EventType, MEDIUM_LABELS};
use crate::metrics::trace::Tp;

/// `/metrics`: the text format, or the protobuf exposition (with native histograms) when the
/// scraper's `Accept` header prefers it.
pub fn metrics(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    ctx.scratch.clear();
    let format = exposition::negotiate(req.head.accept);
    // The OTLP exporter's own families (`memcache_otlp_*`) come last, in either format.
    let shared = &*ctx.shard.shared;
    exposition::render_metrics_as(shared, Some(&shared.exports.telemetry), format, ctx.scratch);
    let content_type = match format {
        Format::Text => ContentType::Prometheus,
        Format::Protobuf => ContentType::PrometheusProtobuf,
    };
    Response::new(Status::OK, content_type, Body::Scratch)
}

pub fn summary(ctx: &mut Ctx<'_>) -> Response {
    ctx.scratch.clear();
    exposition::render_summary(&*ctx.shard.shared, ctx.scratch);
    Response::new(Status::OK, ContentType::Text, Body::Scratch)
}

/// `/kv_events/status`: the publisher's state, keys in the seed's (alphabetical) order.
pub fn kv_events_status(ctx: &mut Ctx<'_>) -> Response {
    let shared = &ctx.shard.shared;
    let s = &shared.exports.kv_stats;
    let g = |c: &std::sync::atomic::AtomicU64| c.load(Relaxed);
    ctx.json_object(|w| {
        w.field_u64("dropped_events", s.dropped_events());
        w.field_u64("dropped_high_priority_events", s.dropped_high_priority());
        w.field_u64("dropped_stored_events", s.dropped_stored());
        w.field_bool("enabled", s.enabled.load(Relaxed));
        w.field_u64("last_sequence", g(&s.last_sequence));
        w.field_u64("published_batches", s.published_batches.get());
        w.begin_object_field("published_by_medium");
        // Alphabetical, as the seed shows: dram, hbm, ssd, unknown.
        let mut by_name: [(&str, usize); MEDIUM_LABELS.len()] =
            std::array::from_fn(|i| (MEDIUM_LABELS[i], i));
        by_name.sort_unstable();
        for (name, i) in by_name {
            w.field_u64(name, s.published_by_medium[i].get());
        }
        w.end_object();
        w.begin_object_field("published_by_type");
        for t in [EventType::Cleared, EventType::Removed, EventType::Stored] {
            w.field_u64(t.name(), s.published_by_type[t as usize].get());
        }
        w.end_object();
        w.field_u64("published_events", s.published_events.get());
        w.field_bool("publisher_active", s.publisher_active.load(Relaxed));
        w.field_u64("queue_capacity", shared.config.kv_events.queue_capacity);
        w.field_u64("queue_size", g(&s.queue_size));
        w.field_u64("skipped_unparsed_keys", s.skipped_unparsed_keys());
    })
}

/// `/kv_events/publisher`: where routers subscribe to the current leader's KV events (the
/// same facts as the etcd key `<prefix>kv_events`). Answered by the serving leader; a standby
/// redirects here like any leader route.
pub fn kv_events_publisher(ctx: &mut Ctx<'_>) -> Response {
    let shared = &ctx.shard.shared;
    let kv = &shared.config.kv_events;
    let a = crate::kv_events::leadership::advertised(&shared.config);
    let ha = shared.ha.snapshot();
    ctx.json_object(|w| {
        w.field_bool("enabled", kv.enable);
        let on = |s: &str| {
            if kv.enable {
                s.to_string()
            } else {
                String::new()
            }
        };
        w.field_str("endpoint", on(&a.endpoint).as_bytes());
        w.field_str("replay_endpoint", on(&a.replay_endpoint).as_bytes());
        w.field_str("topic", kv.topic.as_bytes());
        w.field_str("encoding", kv.encoding.name().as_bytes());
        w.field_str("leader_address", ha.leader_address_str().as_bytes());
        w.field_u64("view_version", ha.view_version);
    })
}

/// The ptracer table; `alloc_free_only`: just the alloc and remove rows.
pub fn ptracer(ctx: &mut Ctx<'_>, alloc_free_only: bool) -> Response {
    let now = ctx.shard.clock.unix_secs();
    ctx.scratch.clear();
    exposition::render_ptracer(
        &*ctx.shard.shared,
        now,
        |tp| !alloc_free_only || matches!(tp, Tp::Alloc | Tp::Remove),
        ctx.scratch,
    );
    Response::new(Status::OK, ContentType::Text, Body::Scratch)
}
