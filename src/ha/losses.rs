//! Losses recorded in etcd: when a leader declares a local service's membership lost, it drops
//! that rank's copies and may then answer deletes relying on the loss. A later leader must not
//! adopt that service's catalog if the same process comes back (a freeze that outlasted the old
//! leader): so the loss is written, under the leadership's fence, to `<prefix>lost/<rank>` =
//! the lost incarnation before the meta relies on it, and every new leader loads the records
//! before it serves (`cluster::members::Members::note_lost`).
//!
//! The calls block (etcd's JSON gateway); a loss is rare, so each runs on a thread of its own
//! and answers on a channel the shard awaits. Loading runs on the election thread, as a
//! recovery step.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::HaView;
use super::etcd::{Etcd, b64, bytes, prefix_end};

impl HaView {
    /// Records that membership `incarnation` of `rank` was declared lost, fenced by this
    /// leadership: `Ok` once etcd stored it; an error when this node does not lead, or etcd
    /// did not answer within the lease TTL. Off HA: `Ok` at once.
    pub fn record_loss(&self, rank: u32, incarnation: u64) -> flume::Receiver<Result<(), String>> {
        let (tx, rx) = flume::bounded(1);
        let Some(cfg) = self.config().cloned() else {
            let _ = tx.send(Ok(()));
            return rx;
        };
        let fence = self.fence();
        let spawned = std::thread::Builder::new()
            .name("mmc-ha-loss".into())
            .spawn(move || {
                let deadline = Instant::now() + Duration::from_millis(cfg.lease_ttl_ms);
                let mut etcd = Etcd::new(cfg.etcd_endpoints.clone());
                let txn = json!({
                    "compare": [{
                        "key": b64(&cfg.election_key()),
                        "target": "CREATE",
                        "result": "EQUAL",
                        "create_revision": fence.to_string(),
                    }],
                    "success": [{"request_put": {
                        "key": b64(&cfg.lost_key(rank)),
                        "value": b64(incarnation.to_string().as_bytes()),
                    }}],
                });
                let outcome = match etcd.txn(&txn, deadline) {
                    Ok(v) if v.get("succeeded").and_then(Value::as_bool) == Some(true) => Ok(()),
                    Ok(_) => Err("not the leader any more".to_string()),
                    Err(e) => Err(format!("{e:?}")),
                };
                let _ = tx.send(outcome);
            });
        if let Err(e) = spawned {
            let (tx, rx2) = flume::bounded(1);
            let _ = tx.send(Err(format!("cannot start a thread: {e}")));
            return rx2;
        }
        rx
    }

    /// The memberships earlier leaders declared lost: (rank, incarnation). Blocking: for a
    /// recovery step on the election thread.
    pub fn load_losses(&self, deadline: Instant) -> Result<Vec<(u32, u64)>, String> {
        let Some(cfg) = self.config() else {
            return Ok(Vec::new());
        };
        let mut etcd = Etcd::new(cfg.etcd_endpoints.clone());
        let from = cfg.lost_prefix();
        let end = prefix_end(&from);
        let v = etcd
            .range(&from, Some(&end), 0, deadline)
            .map_err(|e| format!("{e:?}"))?;
        let kvs = v
            .get("kvs")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        Ok(kvs
            .iter()
            .filter_map(|kv| {
                let key = bytes(kv, "key");
                let rank = std::str::from_utf8(key.strip_prefix(from.as_slice())?)
                    .ok()?
                    .parse()
                    .ok()?;
                let incarnation = std::str::from_utf8(&bytes(kv, "value"))
                    .ok()?
                    .parse()
                    .ok()?;
                Some((rank, incarnation))
            })
            .collect())
    }
}
