//! The `/metadata` writer thread: with HA on, every `/metadata` PUT and DELETE is written to
//! etcd (`<prefix>metadata/<key>`) before it is applied and answered, so a new leader finds
//! every acknowledged entry there.
//!
//! Owner shards queue their writes ([`WriteReq`]) in the order they apply them. The thread takes
//! what is queued (up to [`BATCH_OPS`] writes, [`BATCH_BYTES`], no key twice) and writes it as
//! one etcd transaction guarded by the leadership: `if create_revision(<prefix>leader) == fence
//! then writes`. A node that is not the leader any more (a deposed leader that has not noticed
//! yet included) therefore cannot write: etcd refuses the whole batch. Each write's outcome goes
//! back to its owner shard on that shard's one ordered channel, so each shard applies its
//! writes in etcd's order.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::HaHost;
use super::etcd::{Etcd, EtcdError, b64};
use super::{MetaOp, ShardMsg, WriteReq};
use crate::config::HaConfig;

/// Writes per transaction (etcd's default `--max-txn-ops` is 128).
const BATCH_OPS: usize = 64;
/// Key and value bytes per transaction (etcd's default request limit is 1.5 MiB).
const BATCH_BYTES: usize = 1 << 20;

pub(super) fn run(host: Arc<dyn HaHost>, stop: Arc<AtomicBool>) {
    let ha = host.ha();
    let Some(queue) = ha.write_queue() else {
        return;
    };
    let cfg = ha.config().expect("HA on").clone();
    let mut etcd = Etcd::new(cfg.etcd_endpoints.clone());
    let deadline_for = Duration::from_secs(cfg.lease_ttl_secs());
    let mut carry: Option<WriteReq> = None;
    loop {
        let first = match carry.take() {
            Some(r) => r,
            None => match queue.recv_timeout(Duration::from_millis(100)) {
                Ok(r) => r,
                Err(flume::RecvTimeoutError::Timeout) => {
                    if stop.load(Ordering::Acquire) {
                        // Whatever is still queued is answered, never left waiting.
                        while let Ok(r) = queue.try_recv() {
                            ha.send_to_shard(
                                r.shard,
                                ShardMsg::Written {
                                    op: r.op,
                                    reserved: r.reserved,
                                    outcome: Err(
                                        "Shutting down: the /metadata write was not stored".into(),
                                    ),
                                    done: r.done,
                                },
                            );
                        }
                        return;
                    }
                    continue;
                }
                Err(flume::RecvTimeoutError::Disconnected) => return,
            },
        };
        let mut bytes = op_bytes(&first.op);
        let mut batch = vec![first];
        while batch.len() < BATCH_OPS {
            let Ok(next) = queue.try_recv() else { break };
            // etcd refuses a transaction that names a key twice or is too large, and a batch
            // is written under one fence: such a write waits for the next batch.
            if next.fence != batch[0].fence
                || bytes + op_bytes(&next.op) > BATCH_BYTES
                || batch.iter().any(|r| r.op.key() == next.op.key())
            {
                carry = Some(next);
                break;
            }
            bytes += op_bytes(&next.op);
            batch.push(next);
        }
        // The fence of the writes, and still this node's: a write of an earlier leadership is
        // refused here, or by etcd's compare if the leadership changes meanwhile.
        let fence = if batch[0].fence == ha.fence() && ha.serving() {
            batch[0].fence
        } else {
            0
        };
        let outcomes = write(&mut etcd, &cfg, fence, &batch, deadline_for);
        for (req, outcome) in batch.into_iter().zip(outcomes) {
            let shard = req.shard;
            ha.send_to_shard(
                shard,
                ShardMsg::Written {
                    op: req.op,
                    reserved: req.reserved,
                    outcome,
                    done: req.done,
                },
            );
        }
    }
}

fn op_bytes(op: &MetaOp) -> usize {
    match op {
        MetaOp::Put(k, v) => k.len() + v.len(),
        MetaOp::Delete(k) => k.len(),
    }
}

/// Writes one batch; one outcome per write, in order.
fn write(
    etcd: &mut Etcd,
    cfg: &HaConfig,
    fence: i64,
    batch: &[WriteReq],
    timeout: Duration,
) -> Vec<Result<bool, String>> {
    let all = |msg: &str| vec![Err(msg.to_string()); batch.len()];
    if fence == 0 {
        return all("Not the leader: this meta does not hold the etcd leadership");
    }
    let ops: Vec<Value> = batch
        .iter()
        .map(|r| match &r.op {
            MetaOp::Put(k, v) => json!({"request_put": {
                "key": b64(&cfg.metadata_key(k)),
                "value": b64(v),
            }}),
            MetaOp::Delete(k) => json!({"request_delete_range": {
                "key": b64(&cfg.metadata_key(k)),
            }}),
        })
        .collect();
    let txn = json!({
        "compare": [{
            "key": b64(&cfg.election_key()),
            "target": "CREATE",
            "result": "EQUAL",
            "create_revision": fence.to_string(),
        }],
        "success": ops,
    });
    match etcd.txn(&txn, Instant::now() + timeout) {
        Ok(v) if v.get("succeeded").and_then(Value::as_bool) == Some(true) => {
            let responses = v.get("responses").and_then(Value::as_array);
            batch
                .iter()
                .enumerate()
                .map(|(i, r)| match r.op {
                    MetaOp::Put(..) => Ok(true),
                    MetaOp::Delete(_) => Ok(responses
                        .and_then(|rs| rs.get(i))
                        .map(|r| {
                            super::etcd::int(
                                r.get("response_delete_range").unwrap_or(&Value::Null),
                                "deleted",
                            ) > 0
                        })
                        .unwrap_or(false)),
                })
                .collect()
        }
        Ok(_) => {
            log::warn!("HA: a /metadata write was fenced off: this node is not the leader");
            all("Not the leader: this meta does not hold the etcd leadership")
        }
        Err(EtcdError::Unavailable(e)) => {
            log::warn!("HA: /metadata write to etcd failed: {e}");
            all("etcd unavailable: the /metadata write was not stored")
        }
        Err(EtcdError::Refused(e)) => {
            log::warn!("HA: etcd refused a /metadata write: {e}");
            all(&format!("etcd refused the /metadata write: {e}"))
        }
    }
}
