//! `/memory/evict` and `/memory/prefetch`: tier moves named by chunk hashes (LMCache's
//! internal API as the contract adapts it). Bodies are parsed by [`crate::http::bodies`].

use crate::common::error_kind::ErrorKind;
use std::sync::Arc;

use super::{Ctx, Request};
use crate::http::bodies::{self, BodyError};
use crate::http::response::{Response, Status};
use crate::shards::{Command, Reply};

fn refuse(ctx: &mut Ctx<'_>, e: BodyError) -> Response {
    match e {
        BodyError::MediaType => ctx.protocol_error(
            Status::UNSUPPORTED_MEDIA_TYPE,
            "Unsupported media type: expected Content-Type: application/json",
        ),
        BodyError::Invalid(m) => ctx.business_error(ErrorKind::InvalidParam, &m),
    }
}

fn names_of(hashes: &[String]) -> Arc<[Box<[u8]>]> {
    hashes.iter().map(|h| h.as_bytes().into()).collect()
}

pub async fn evict(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let body = match bodies::parse_evict(req.head.content_type, req.body) {
        Ok(b) => b,
        Err(e) => return refuse(ctx, e),
    };
    let names = names_of(&body.chunk_hashes);
    let locations = body.locations;
    let mut evicted = 0;
    let replies = ctx
        .shard
        .broadcast(|| Command::EvictNamed {
            names: names.clone(),
            locations: locations.clone(),
        })
        .await;
    for r in replies {
        match r {
            Reply::Count(n) => evicted += n,
            other => return ctx.reply_error(other, super::KEY_NOT_FOUND),
        }
    }
    ctx.json_object(|w| {
        w.field_str("status", b"success");
        w.field_u64("num_evicted", evicted);
    })
}

pub async fn prefetch(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let body = match bodies::parse_prefetch(req.head.content_type, req.body) {
        Ok(b) => b,
        Err(e) => return refuse(ctx, e),
    };
    // The rewarms start on the owners and run in the background; the answer does not wait.
    let names = names_of(&body.chunk_hashes);
    let replies = ctx
        .shard
        .broadcast(|| Command::PrefetchNamed {
            names: names.clone(),
        })
        .await;
    if let Some(bad) = replies.into_iter().find(|r| !matches!(r, Reply::Count(_))) {
        return ctx.reply_error(bad, super::KEY_NOT_FOUND);
    }
    ctx.json_object(|w| {
        w.field_str("status", b"prefetch_started");
        w.field_str("lookup_id", body.lookup_id.as_bytes());
        w.field_u64("num_chunks", body.chunk_hashes.len() as u64);
    })
}
