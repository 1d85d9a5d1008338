//! `/memory/evict` and `/memory/prefetch`: tier moves named by chunk hashes (LMCache's
//! internal API as the contract adapts it).

use std::sync::Arc;

use serde_json::Value;
use smallvec::SmallVec;

use super::{Ctx, Request};
use crate::http::json::JsonWriter;
use crate::http::parse::is_json_media_type;
use crate::http::response::{Response, Status};
use crate::shards::store::segment::Medium;
use crate::shards::{Command, Reply};

/// Most chunk hashes one request may name.
const MAX_CHUNK_HASHES: usize = 65_536;

/// The JSON body, or the response that refuses it (415 for another media type; the
/// contract's business errors for bad JSON).
fn json_body(
    req: &Request<'_>,
    ctx: &mut Ctx<'_>,
) -> Result<serde_json::Map<String, Value>, Response> {
    if !req.head.content_type.is_some_and(is_json_media_type) {
        return Err(ctx.protocol_error(
            Status::UNSUPPORTED_MEDIA_TYPE,
            "Unsupported media type: expected Content-Type: application/json",
        ));
    }
    match serde_json::from_slice::<Value>(req.body) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(ctx.business_error("Invalid JSON body")),
    }
}

fn chunk_hashes(
    body: &serde_json::Map<String, Value>,
    ctx: &mut Ctx<'_>,
) -> Result<Vec<String>, Response> {
    let Some(v) = body.get("chunk_hashes").filter(|v| !v.is_null()) else {
        return Err(ctx.business_error("Missing 'chunk_hashes' in request body"));
    };
    let Some(items) = v.as_array() else {
        return Err(ctx.business_error("Invalid 'chunk_hashes': expected an array of strings"));
    };
    if items.len() > MAX_CHUNK_HASHES {
        return Err(ctx.business_error(&format!("Too many chunk hashes (max {MAX_CHUNK_HASHES})")));
    }
    items
        .iter()
        .map(|h| h.as_str().map(str::to_string))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| ctx.business_error("Invalid 'chunk_hashes': expected an array of strings"))
}

fn names_of(hashes: &[String]) -> Arc<[Box<[u8]>]> {
    hashes.iter().map(|h| h.as_bytes().into()).collect()
}

/// LMCache backend names and medium names → media.
fn location(name: &str) -> Option<Medium> {
    match name {
        "LocalCPUBackend" => Some(Medium::Dram),
        "LocalDiskBackend" => Some(Medium::Ssd),
        "GPU" | "LocalGPUBackend" => Some(Medium::Hbm),
        other => Medium::parse(other),
    }
}

pub async fn evict(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let body = match json_body(req, ctx) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let hashes = match chunk_hashes(&body, ctx) {
        Ok(h) => h,
        Err(r) => return r,
    };
    let locations: Option<SmallVec<[Medium; 3]>> = match body.get("locations") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => {
            let mut media = SmallVec::new();
            for it in items {
                match it.as_str().and_then(location) {
                    Some(m) => {
                        if !media.contains(&m) {
                            media.push(m)
                        }
                    }
                    None => {
                        return ctx.business_error(&format!(
                            "Unknown location {it}: expected LocalCPUBackend, LocalDiskBackend, HBM, DRAM or SSD"
                        ));
                    }
                }
            }
            Some(media)
        }
        Some(_) => {
            return ctx.business_error("Invalid 'locations': expected an array of strings or null");
        }
    };
    let names = names_of(&hashes);
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
            other => return ctx.reply_error(other, "Key not found"),
        }
    }
    ctx.scratch.clear();
    let mut w = JsonWriter::new(ctx.scratch);
    w.begin_object();
    w.field_str("status", b"success");
    w.field_u64("num_evicted", evicted);
    w.end_object();
    Response::json_scratch(Status::OK)
}

pub async fn prefetch(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let body = match json_body(req, ctx) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let hashes = match chunk_hashes(&body, ctx) {
        Ok(h) => h,
        Err(r) => return r,
    };
    let lookup_id = match body.get("lookup_id") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return ctx.business_error("Invalid 'lookup_id': expected a string"),
    };
    // The rewarms start on the owners and run in the background; the answer does not wait.
    let names = names_of(&hashes);
    let replies = ctx
        .shard
        .broadcast(|| Command::PrefetchNamed {
            names: names.clone(),
        })
        .await;
    if let Some(bad) = replies.into_iter().find(|r| !matches!(r, Reply::Count(_))) {
        return ctx.reply_error(bad, "Key not found");
    }
    ctx.scratch.clear();
    let mut w = JsonWriter::new(ctx.scratch);
    w.begin_object();
    w.field_str("status", b"prefetch_started");
    w.field_str("lookup_id", lookup_id.as_bytes());
    w.field_u64("num_chunks", hashes.len() as u64);
    w.end_object();
    Response::json_scratch(Status::OK)
}
