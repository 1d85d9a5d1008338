//! The contract's key endpoints: `/query_key`, `/batch_query_keys`, `DELETE /key`,
//! `DELETE /all_keys`, `/get_all_keys`.

use super::{Ctx, Request, batch_key_list, object_key, optional, parse_uint};
use crate::common::error_kind::ErrorKind;
use crate::http::json::JsonWriter;
use crate::http::response::{Body, ContentType, KeyListing, Response, Status};
use crate::metrics::store::{Op, Outcome};
use crate::shards::store::QueryInfo;
use crate::shards::{Command, Reply};

/// Writes one `/query_key` object.
fn write_query(w: &mut JsonWriter<'_>, key: &[u8], q: Option<&QueryInfo>) {
    w.begin_object();
    w.field_str("key", key);
    match q {
        Some(q) => {
            w.field_u64("size", q.size);
            w.field_u64("prot", q.prot as u64);
            w.field_u64("numBlobs", q.blobs.len() as u64);
            w.field_bool("valid", q.valid);
            w.begin_array_field("blobs");
            for b in &q.blobs {
                w.begin_object();
                w.field_u64("rank", b.rank as u64);
                w.field_str("medium", b.medium.upper().as_bytes());
                w.field_u64("gva", b.gva);
                w.field_u64("state", b.state as u64);
                w.field_u64("leaseTimeoutTtlMs", b.lease_ttl_ms);
                w.end_object();
            }
            w.end_array();
        }
        None => {
            w.field_u64("size", 0);
            w.field_u64("prot", 0);
            w.field_u64("numBlobs", 0);
            w.field_bool("valid", false);
            w.begin_array_field("blobs");
            w.end_array();
        }
    }
    w.end_object();
}

pub async fn query_key(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let key = match object_key(req, ctx, "key") {
        Ok(k) => k,
        Err(r) => return r,
    };
    let cmd = req.read_command(Command::Query { key: key.clone() });
    match ctx.shard.execute(cmd).await {
        Reply::Query(q) => {
            ctx.scratch.clear();
            write_query(&mut JsonWriter::new(ctx.scratch), &key, Some(&q));
            Response::json_scratch(Status::OK)
        }
        other => ctx.reply_error(other, super::KEY_NOT_FOUND),
    }
}

pub async fn batch_query_keys(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let keys = match batch_key_list(req, ctx) {
        Ok(k) => k,
        Err(r) => return r,
    };
    for k in &keys {
        if let Err(r) = super::check_object_key(k, ctx) {
            return r;
        }
    }
    let replies = ctx
        .execute_each(&keys, |key| req.read_command(Command::Query { key }))
        .await;
    // A HEAD request is no business operation: it counts nowhere.
    let counted = !req.is_head();
    if replies.iter().any(|r| matches!(r, Reply::Overloaded)) {
        if counted {
            ctx.shard
                .store_stats()
                .record(Op::BatchQuery, Outcome::Failure, None);
        }
        return ctx.overloaded();
    }
    let outcome = Outcome::of_batch(replies.iter().map(|r| match r {
        Reply::Query(_) => Outcome::Success,
        Reply::NotFound => Outcome::NotFound,
        _ => Outcome::Failure,
    }));
    if counted {
        ctx.shard
            .store_stats()
            .record(Op::BatchQuery, outcome, None);
    }
    ctx.json_object(|w| {
        w.field_bool("success", true);
        w.begin_array_field("data");
        for (k, r) in keys.iter().zip(&replies) {
            let q = match r {
                Reply::Query(q) => Some(&**q),
                _ => None,
            };
            write_query(w, k, q);
        }
        w.end_array();
    })
}

pub async fn delete_key(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let key = match object_key(req, ctx, "key") {
        Ok(k) => k,
        Err(r) => return r,
    };
    let removal = super::freed::removal_of(ctx, [&key[..]]);
    let journaled = ctx.shard.journal_mark();
    let reply = ctx.shard.execute(Command::Remove { key }).await;
    ctx.shard.journal_settle(journaled).await;
    match reply {
        Reply::Done if !super::freed::settle(ctx, &removal).await => super::freed::unconfirmed(ctx),
        Reply::Done => ctx.success_message("key deleted"),
        other => ctx.reply_error(other, super::KEY_NOT_FOUND),
    }
}

pub async fn delete_all_keys(ctx: &mut Ctx<'_>) -> Response {
    let journaled = ctx.shard.journal_mark();
    let replies = ctx.shard.broadcast(|| Command::RemoveAll).await;
    ctx.shard.journal_settle(journaled).await;
    if replies.iter().any(|r| !matches!(r, Reply::Count(_))) {
        ctx.shard
            .store_stats()
            .record(Op::RemoveAll, Outcome::Failure, None);
        return ctx.overloaded();
    }
    ctx.shard.publish_cleared();
    ctx.shard
        .store_stats()
        .record(Op::RemoveAll, Outcome::Success, None);
    ctx.success_message("all keys deleted")
}

/// `/get_all_keys[?prefix=P][&limit=N]`: one key per line, streamed from each shard in turn
/// so that millions of keys never sit in one buffer.
pub fn get_all_keys(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let prefix = match optional(req, ctx, "prefix") {
        Ok(p) => p.map(|p| p.into_owned()).unwrap_or_default(),
        Err(r) => return r,
    };
    let limit = match optional(req, ctx, "limit") {
        Ok(None) => u64::MAX,
        Ok(Some(v)) => match parse_uint(&v, 0, u64::MAX) {
            Some(n) => n,
            None => {
                return ctx.business_error(
                    ErrorKind::InvalidParam,
                    "Invalid 'limit' parameter: expected a non-negative integer",
                );
            }
        },
        Err(r) => return r,
    };
    // A HEAD request is no business operation (and lists nothing: its answer has no body).
    if !req.is_head() {
        ctx.shard
            .store_stats()
            .record(Op::GetAllKeys, Outcome::Success, None);
    }
    Response::new(
        Status::OK,
        ContentType::Text,
        Body::KeyStream(KeyListing {
            prefix: prefix.into_boxed_slice(),
            limit,
        }),
    )
}

/// The page size of `/get_all_keys` streaming: each shard answers at most this many bytes
/// of keys per message.
pub const KEY_PAGE_BYTES: u32 = 64 * 1024;

/// The next page of a key listing: (text, whether the listing is finished).
pub struct KeyCursor {
    shard: usize,
    cursor: u32,
    limit: u64,
}

impl KeyCursor {
    pub fn new(limit: u64) -> KeyCursor {
        KeyCursor {
            shard: 0,
            cursor: 0,
            limit,
        }
    }

    /// Fetches the next non-empty page, or `None` when every shard is listed.
    pub async fn next_page(
        &mut self,
        shard: &std::rc::Rc<crate::shards::Shard>,
        prefix: &[u8],
    ) -> Option<Result<Vec<u8>, ()>> {
        while self.shard < shard.shared.shard_count() && self.limit > 0 {
            let cmd = Command::ListKeys {
                cursor: self.cursor,
                max_bytes: KEY_PAGE_BYTES,
                prefix: prefix.into(),
                limit: self.limit,
            };
            match shard.submit(self.shard, cmd).wait().await {
                Reply::Keys {
                    text,
                    next,
                    limit_left,
                } => {
                    self.limit = limit_left;
                    match next {
                        Some(c) => self.cursor = c,
                        None => {
                            self.shard += 1;
                            self.cursor = 0;
                        }
                    }
                    if !text.is_empty() {
                        return Some(Ok(text));
                    }
                }
                _ => return Some(Err(())),
            }
        }
        None
    }
}
