//! Removals that stay removed: a removal (a `DELETE`, a batch remove) of an object with copies
//! on remote ranks is answered only once the local service of each such rank has dropped the
//! copies from its catalog, so no later hand-over of that catalog (a new HA leader, a restarted
//! meta) can bring the object back.
//!
//! Meta side ([`settle`]): the shard that removed the object logged a freed record per remote
//! copy in the rank's log (`cluster::catalog::FreedLogs`). The removal asks the logs for its
//! barriers (per rank, the last unacknowledged record of the removed key), pushes the rank's
//! records to its local service at once (`POST /cluster/v1/freed`: one push per rank at a time,
//! carrying every record not yet acknowledged, so concurrent removals share it), and waits
//! until each barrier is passed: acknowledged by the service (by the push's answer or a
//! heartbeat's), or its membership over (lost or left: a lost membership's catalog is refused
//! if it comes back; with HA the loss is recorded in etcd before the membership ends, so
//! every later leader refuses that catalog too, `ha/losses.rs`). A rank that neither answers
//! nor is declared lost within the heartbeat timeout and a second leaves the removal unconfirmed:
//! answered 503.
//!
//! Local side ([`receive`]): the push is signed with the service's grant key over its body and
//! names the membership's epoch; the records are applied to the catalog as a heartbeat's would
//! be, and the answer says the sequence applied.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::{Ctx, Request, required};
use crate::cluster::catalog::key_hash;
use crate::cluster::records::{Removal, Settled};
use crate::config::Role;
use crate::http::catalog_wire;
use crate::http::client;
use crate::http::response::{Response, Status};
use crate::shards::Shared;

/// How long one push waits for its local service.
const PUSH_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a waiting removal looks at its barriers.
const POLL: Duration = Duration::from_micros(500);

/// The key hashes a removal of `keys` waits on ([`settle`]), or none when no local service
/// ever joined this meta (no removal has a barrier then: nothing is hashed or locked).
pub(super) fn removal_of<'k>(ctx: &Ctx<'_>, keys: impl IntoIterator<Item = &'k [u8]>) -> Vec<u64> {
    if !ctx.shard.shared.membership.freed_logs.has_members() {
        return Vec::new();
    }
    keys.into_iter().map(key_hash).collect()
}

/// Waits until the removal of the keys with these hashes ([`removal_of`]) is applied on every
/// local service that held a copy; false when that was not confirmed in time.
pub(super) async fn settle(ctx: &mut Ctx<'_>, keys: &[u64]) -> bool {
    if keys.is_empty() {
        return true;
    }
    let shared = ctx.shard.shared.clone();
    let logs = &shared.membership.freed_logs;
    let timeout = shared.config.cluster.heartbeat_timeout_ms;
    let mut removal = Removal::new(logs, keys, shared.clock.now_ms(), timeout);
    loop {
        match removal.poll(logs, shared.clock.now_ms()) {
            Settled::Confirmed => return true,
            Settled::Unconfirmed(ranks) => {
                log::warn!(
                    "a removal was not confirmed by the local services of ranks {ranks:?} within the heartbeat timeout"
                );
                return false;
            }
            Settled::Waiting(ranks) => {
                // Pushes this removal starts are awaited (no polling while one is on its
                // way); one another removal started is looked at again after a short pause.
                let mine: Vec<_> = ranks
                    .into_iter()
                    .filter_map(|rank| push(&shared, rank))
                    .collect();
                if mine.is_empty() {
                    monoio::time::sleep(POLL).await;
                }
                for p in mine {
                    p.await;
                }
            }
        }
    }
}

/// Before a put takes new versions of `keys`: the indices of those whose older copies a local
/// service may still hold (a detached blob's record not applied yet: a removal, an eviction,
/// a loss etcd did not take) and did not confirm dropping within the heartbeat timeout and a
/// second. Their records are pushed and awaited as a removal's are; most puts find none and
/// take one lookup. A newer version acknowledged while an older copy lives could be shadowed
/// by it after a failover, once the newer one is deleted or lost.
pub(super) async fn older_copies_unconfirmed(ctx: &mut Ctx<'_>, keys: &[&[u8]]) -> Vec<usize> {
    let logs = &ctx.shard.shared.membership.freed_logs;
    if !logs.has_members() {
        return Vec::new();
    }
    let (idx, hashes): (Vec<usize>, Vec<u64>) = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (i, key_hash(k)))
        .filter(|&(_, h)| logs.unconfirmed(h))
        .unzip();
    if idx.is_empty() || settle(ctx, &hashes).await {
        return Vec::new();
    }
    idx
}

/// The replies of a batch's allocations, with the refusal of each key
/// [`older_copies_unconfirmed`] named (no allocation was asked for them) in its place.
pub(super) fn with_refused(
    allocated: Vec<crate::shards::Reply>,
    unsure: &[usize],
    n: usize,
) -> Vec<crate::shards::Reply> {
    let mut allocated = allocated.into_iter();
    (0..n)
        .map(|i| {
            if unsure.contains(&i) {
                crate::shards::Reply::Refused(older_copy_refusal())
            } else {
                allocated.next().unwrap_or(crate::shards::Reply::Refused(
                    crate::common::error_kind::Refusal::of(
                        crate::common::error_kind::ErrorKind::Failed,
                    ),
                ))
            }
        })
        .collect()
}

/// Why a put was refused by [`older_copies_unconfirmed`].
pub(super) fn older_copy_refusal() -> crate::common::error_kind::Refusal {
    crate::common::error_kind::Refusal::new(
        crate::common::error_kind::ErrorKind::Unavailable,
        "An older copy of this key on a local service has not confirmed its removal: retry later",
    )
}

/// The answer of a removal that was applied here but not confirmed by every local service.
pub(super) fn unconfirmed(ctx: &mut Ctx<'_>) -> Response {
    let mut r = ctx.protocol_error(
        Status::SERVICE_UNAVAILABLE,
        "The removal was applied but a local service holding a copy did not confirm it: it may come back after a failover; retry",
    );
    r.retry_after_secs = Some(1);
    r
}

/// Starts a push of `rank`'s unacknowledged records to its local service, unless one is on
/// its way or nothing waits: the task, done once the push was answered (or failed).
fn push(shared: &Arc<Shared>, rank: u32) -> Option<monoio::task::JoinHandle<()>> {
    let logs = &shared.membership.freed_logs;
    let p = logs.take_push(rank)?;
    let target = shared.member_segments(rank, p.epoch).first().and_then(|s| {
        s.backend
            .remote()
            .map(|r| (r.url.clone(), r.grant_key.clone()))
    });
    let Some((url, key)) = target else {
        // Its segments are gone: the membership is over (its log goes with it).
        logs.pushed(rank, p.epoch, None);
        return None;
    };
    let mut v = catalog_wire::news_json(p.seq, &p.freed);
    v["rank"] = json!(rank);
    v["epoch"] = json!(p.epoch);
    let body = v.to_string().into_bytes();
    let target = format!("/cluster/v1/freed?mac={}", key.body_mac(&body));
    let shared = shared.clone();
    Some(monoio::spawn(async move {
        let token = shared.config.cluster.token.as_str();
        let ack =
            match client::request(&url, "POST", &target, Some(token), body, PUSH_TIMEOUT).await {
                Ok(a) if a.status == 200 => serde_json::from_slice::<Value>(&a.body)
                    .ok()
                    .and_then(|v| v.get("ack").and_then(Value::as_u64)),
                Ok(a) => {
                    log::debug!("rank {rank}: a push of freed records answered {}", a.status);
                    None
                }
                Err(e) => {
                    log::debug!("rank {rank}: a push of freed records failed: {e}");
                    None
                }
            };
        shared.membership.freed_logs.pushed(rank, p.epoch, ack);
    }))
}

/// `POST /cluster/v1/freed?mac=M`: `{"rank", "epoch", "catalog_seq", "freed", "landed"}` from
/// this local service's meta: the records are applied to the catalog; the answer is the
/// sequence applied.
pub async fn receive(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let shared = ctx.shard.shared.clone();
    if shared.config.cluster.role != Role::Local {
        return ctx.protocol_error(
            Status::FORBIDDEN,
            "This is not a local service: freed records go to the local service of their rank",
        );
    }
    let mac = match required(req, ctx, "mac") {
        Ok(m) => m.into_owned(),
        Err(r) => return r,
    };
    let Some(key) = shared.membership.grant_key.get() else {
        return ctx.protocol_error(
            Status::FORBIDDEN,
            "This local service has not joined a meta service",
        );
    };
    if !key.verify_body(req.body, &mac) {
        return ctx.protocol_error(
            Status::FORBIDDEN,
            "Invalid MAC: the body was not signed by this service's meta",
        );
    }
    let v = serde_json::from_slice::<Value>(req.body).unwrap_or(Value::Null);
    let epoch = v.get("epoch").and_then(Value::as_u64);
    let Some(news) = catalog_wire::parse_news(&v).filter(|n| n.resync.is_none()) else {
        return ctx.protocol_error(
            Status::BAD_REQUEST,
            "Malformed body: expected epoch, catalog_seq and freed records",
        );
    };
    if epoch != Some(shared.membership.local.epoch()) || !shared.membership.local.joined() {
        return ctx.protocol_error(
            Status::CONFLICT,
            "Not this local service's current membership",
        );
    }
    // The SSD copies the records free are journaled, and on file before the answer
    // acknowledges them (a restart of this service does not bring them back).
    let journaled = ctx.shard.journal_mark();
    let ack = {
        let mut catalog = shared.membership.local.catalog();
        let mark = catalog.mark();
        shared.journal_catalog(catalog.apply_tracked(news, mark));
        catalog.acked()
    };
    ctx.shard.journal_settle(journaled).await;
    ctx.scratch.clear();
    serde_json::to_writer(&mut *ctx.scratch, &json!({"success": true, "ack": ack}))
        .expect("JSON into a Vec");
    Response::json_scratch(Status::OK)
}
