//! Scrape endpoints: `/metrics`, `/metrics/summary`, `/metrics/ptracer`,
//! `/api/v1/analysis/alloc_free_latency`. They read running figures and never count as
//! business operations.

use super::Ctx;
use crate::http::response::{Body, ContentType, Response, Status};
use crate::metrics::exposition;
use crate::metrics::trace::Tp;

pub fn metrics(ctx: &mut Ctx<'_>) -> Response {
    ctx.scratch.clear();
    exposition::render_metrics(&ctx.shard.cluster, ctx.scratch);
    Response::new(Status::OK, ContentType::Prometheus, Body::Scratch)
}

pub fn summary(ctx: &mut Ctx<'_>) -> Response {
    ctx.scratch.clear();
    exposition::render_summary(&ctx.shard.cluster, ctx.scratch);
    Response::new(Status::OK, ContentType::Text, Body::Scratch)
}

/// The ptracer table; `alloc_free_only`: just the alloc and remove rows.
pub fn ptracer(ctx: &mut Ctx<'_>, alloc_free_only: bool) -> Response {
    let now = ctx.shard.clock.unix_secs();
    let text = exposition::render_ptracer(&ctx.shard.cluster, now, |tp| {
        !alloc_free_only || matches!(tp, Tp::Alloc | Tp::Remove)
    });
    Response::new(Status::OK, ContentType::Text, Body::Bytes(text.into()))
}
