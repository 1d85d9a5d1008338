//! Losses recorded in etcd: when a leader declares a local service's membership lost, it drops
//! that rank's copies and may then answer deletes relying on the loss. A later leader must not
//! adopt that service's catalog if the same process comes back (a freeze that outlasted the old
//! leader): so the loss is written, under the leadership's fence, to
//! `<prefix>lost/<rank>/<incarnation>` = `<incarnation> <view> <epoch>` (the lost process and
//! membership) before the meta relies on it, and every new leader loads the records before it
//! serves (`cluster::members::Members::note_lost`). The membership matters when the same
//! process joined again after the loss: told to drop its catalog then, it began a new one,
//! which the record does not void (a record of the incarnation alone, as older versions wrote,
//! voids every catalog of that process).
//!
//! One record per process, not per rank: older versions wrote `<prefix>lost/<rank>`, so the
//! loss of a rank's next holder (a service given the rank, or configured with it, after the
//! first was lost) overwrote the first one's record, and a later leader adopted the first
//! one's catalog when it came back, an older value over a newer put (found by the cluster
//! simulation with automatic ranks, seed 65131 with two metas). Those keys are still read. A
//! new leader keeps the [`KEPT_PER_RANK`] latest processes' records of each rank and deletes
//! the rest (a process that many restarts behind on its rank is taken for dead).
//!
//! Leaderships recorded in etcd: each leader writes `<prefix>served/<view_version>` before it
//! serves (`HaView::load_history`, the same transaction that reads the records back), so a
//! later leader can tell a local service whose catalog was last in step with an earlier
//! leadership that it missed one that served: that leader may have put newer versions of its
//! keys, or deleted them, and left no tombstone behind (`members::Members::missed`).
//!
//! The calls block (etcd's JSON gateway); a loss is rare, so each runs on a thread of its own
//! and answers on a channel the shard awaits. Loading runs on the election thread, as a
//! recovery step.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::HaView;

/// Loss records a new leader keeps per rank: those of the processes that started last.
pub const KEPT_PER_RANK: usize = 16;
use super::etcd::{Etcd, b64, bytes, prefix_end};
use crate::cluster::members::{LostMembership, Membership};
use crate::config::HaConfig;

impl HaView {
    /// Records that `membership` of process `incarnation` on `rank` was declared lost, fenced
    /// by the leadership that declared it (`fence`, its view; not whichever leads when a
    /// retry runs: a loss declared by a leader resuming from a freeze, refused then, would
    /// void a catalog that later leaderships took over, with their puts, if a later leadership
    /// of this meta recorded it). `Ok(true)` once etcd stored it; `Ok(false)` when that
    /// leadership is over (it will never be stored); an error when etcd did not answer within
    /// the lease TTL. Off HA: `Ok(true)` at once.
    pub fn record_loss(
        &self,
        rank: u32,
        incarnation: u64,
        membership: Membership,
        fence: i64,
    ) -> flume::Receiver<Result<bool, String>> {
        let (tx, rx) = flume::bounded(1);
        let Some(cfg) = self.config().cloned() else {
            let _ = tx.send(Ok(true));
            return rx;
        };
        if fence <= 0 {
            // Declared while not leading: no leadership to record it under.
            let _ = tx.send(Ok(false));
            return rx;
        }
        let spawned = std::thread::Builder::new()
            .name("mmc-ha-loss".into())
            .spawn(move || {
                let deadline = Instant::now() + Duration::from_millis(cfg.lease_ttl_ms);
                let mut etcd = Etcd::new(cfg.etcd_endpoints.clone());
                let txn = json!({
                    "compare": leads(&cfg, fence),
                    "success": [{"request_put": {
                        "key": b64(&cfg.lost_key(rank, incarnation)),
                        "value": b64(format!(
                            "{incarnation} {} {}",
                            membership.view, membership.epoch
                        )
                        .as_bytes()),
                    }}],
                });
                let outcome = match etcd.txn(&txn, deadline) {
                    Ok(v) if v.get("succeeded").and_then(Value::as_bool) == Some(true) => Ok(true),
                    Ok(_) => Ok(false),
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

    /// Before this leadership serves: records it under `<prefix>served/<view>` (fenced, so
    /// only while it holds the leader key) and reads back what earlier leaders left, in one
    /// transaction. Blocking: a recovery step on the election thread.
    pub fn load_history(&self, view: u64, deadline: Instant) -> Result<History, String> {
        let Some(cfg) = self.config() else {
            return Ok(History::default());
        };
        let mut etcd = Etcd::new(cfg.etcd_endpoints.clone());
        let (lost, served) = (cfg.lost_prefix(), cfg.served_prefix());
        let range = |from: &[u8]| json!({"request_range": {"key": b64(from), "range_end": b64(&prefix_end(from))}});
        let txn = json!({
            "compare": leads(cfg, view),
            "success": [
                {"request_put": {"key": b64(&cfg.served_key(view)), "value": b64(b"1")}},
                range(&lost),
                range(&served),
            ],
        });
        let v = etcd.txn(&txn, deadline).map_err(|e| format!("{e:?}"))?;
        if v.get("succeeded").and_then(Value::as_bool) != Some(true) {
            return Err("not the leader any more".into());
        }
        let kvs = |i: usize| {
            v.pointer(&format!("/responses/{i}/response_range/kvs"))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let suffix = |kv: &Value, prefix: &[u8]| -> Option<String> {
            let key = bytes(kv, "key");
            Some(
                std::str::from_utf8(key.strip_prefix(prefix)?)
                    .ok()?
                    .to_string(),
            )
        };
        let mut records: Vec<(LostMembership, Vec<u8>)> = kvs(1)
            .iter()
            .filter_map(|kv| {
                let rank = loss_rank(&suffix(kv, &lost)?)?;
                let loss = parse_loss(rank, std::str::from_utf8(&bytes(kv, "value")).ok()?)?;
                Some((loss, bytes(kv, "key")))
            })
            .collect();
        let stale = beyond_kept(&mut records);
        if !stale.is_empty() {
            // Fenced, best effort: a leader that fails to prune leaves the next one to.
            let txn = json!({
                "compare": leads(cfg, view),
                "success": stale
                    .iter()
                    .map(|k| json!({"request_delete_range": {"key": b64(k)}}))
                    .collect::<Vec<Value>>(),
            });
            if let Err(e) = etcd.txn(&txn, deadline) {
                log::warn!("could not delete {} old loss records: {e:?}", stale.len());
            }
        }
        let losses = records.into_iter().map(|(l, _)| l).collect();
        let served = kvs(2)
            .iter()
            .filter_map(|kv| suffix(kv, &served)?.parse().ok())
            .collect();
        Ok(History { losses, served })
    }
}

/// What earlier leaderships left in etcd for a new leader.
#[derive(Debug, Default)]
pub struct History {
    /// Memberships declared lost.
    pub losses: Vec<LostMembership>,
    /// The leaderships that served (`view_version`s), this one included.
    pub served: Vec<u64>,
}

/// A transaction's condition: the leadership `fence` (the leader key's create revision) still
/// holds the leader key.
fn leads(cfg: &HaConfig, fence: impl std::fmt::Display) -> Value {
    json!([{
        "key": b64(&cfg.election_key()),
        "target": "CREATE",
        "result": "EQUAL",
        "create_revision": fence.to_string(),
    }])
}

/// The rank of a loss record's key, past the prefix: `<rank>/<incarnation>`, or `<rank>` (an
/// older version's key).
fn loss_rank(suffix: &str) -> Option<u32> {
    let (rank, incarnation) = match suffix.split_once('/') {
        Some((r, i)) => (r, Some(i)),
        None => (suffix, None),
    };
    if incarnation.is_some_and(|i| i.parse::<u64>().is_err()) {
        return None;
    }
    rank.parse().ok()
}

/// Sorts `records` by rank and, within one, by the processes' start (latest first), keeps the
/// [`KEPT_PER_RANK`] latest of each rank and returns the keys of the others (taken out).
fn beyond_kept(records: &mut Vec<(LostMembership, Vec<u8>)>) -> Vec<Vec<u8>> {
    records.sort_by(|(a, _), (b, _)| {
        (a.rank, std::cmp::Reverse(a.incarnation)).cmp(&(b.rank, std::cmp::Reverse(b.incarnation)))
    });
    let mut stale = Vec::new();
    let mut kept = Vec::with_capacity(records.len());
    let mut run = (u32::MAX, 0);
    for (loss, key) in records.drain(..) {
        if run.0 != loss.rank {
            run = (loss.rank, 0);
        }
        run.1 += 1;
        if run.1 > KEPT_PER_RANK {
            stale.push(key);
        } else {
            kept.push((loss, key));
        }
    }
    *records = kept;
    stale
}

/// A loss record's value: `<incarnation> <view> <epoch>`, or the incarnation alone (an older
/// version's record: the membership unknown, so every catalog of that process is void).
fn parse_loss(rank: u32, value: &str) -> Option<LostMembership> {
    let mut f = value.split_whitespace().map(str::parse::<u64>);
    let incarnation = f.next()?.ok()?;
    let membership = match (f.next(), f.next(), f.next()) {
        (None, None, None) => Membership::UNKNOWN,
        (Some(Ok(view)), Some(Ok(epoch)), None) => Membership { view, epoch },
        _ => return None,
    };
    Some(LostMembership {
        rank,
        incarnation,
        membership,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loss_record_names_its_membership_and_an_old_one_stands_for_all() {
        let l = parse_loss(3, "41 7 12").unwrap();
        assert_eq!((l.rank, l.incarnation), (3, 41));
        assert_eq!(l.membership, Membership { view: 7, epoch: 12 });
        let old = parse_loss(3, "41").unwrap();
        assert_eq!(old.membership, Membership::UNKNOWN);
        for bad in ["", "x", "41 7", "41 7 12 1", "41 -7 12"] {
            assert_eq!(parse_loss(3, bad), None, "{bad:?}");
        }
    }

    /// A key names its rank and its process (`<rank>/<incarnation>`), or its rank alone (an
    /// older version's key, still read).
    #[test]
    fn a_loss_key_names_its_rank_and_process() {
        assert_eq!(loss_rank("3/41"), Some(3));
        assert_eq!(loss_rank("3"), Some(3));
        for bad in ["", "x", "3/x", "x/41", "-3/41"] {
            assert_eq!(loss_rank(bad), None, "{bad:?}");
        }
    }

    /// Two processes lost on one rank keep a record each; past [`KEPT_PER_RANK`] on a rank, the
    /// records of the processes that started first are the ones deleted.
    #[test]
    fn a_rank_keeps_the_records_of_its_latest_processes() {
        let rec = |rank: u32, incarnation: u64| {
            let loss = LostMembership {
                rank,
                incarnation,
                membership: Membership { view: 1, epoch: 1 },
            };
            (loss, format!("lost/{rank}/{incarnation}").into_bytes())
        };
        let mut records: Vec<_> = (0..KEPT_PER_RANK as u64 + 3)
            .map(|i| rec(5, 100 + i))
            .chain([rec(2, 7), rec(2, 9)])
            .collect();
        let stale = beyond_kept(&mut records);
        assert_eq!(
            stale,
            vec![
                b"lost/5/102".to_vec(),
                b"lost/5/101".to_vec(),
                b"lost/5/100".to_vec()
            ]
        );
        assert_eq!(records.len(), KEPT_PER_RANK + 2);
        assert!(
            records
                .iter()
                .any(|(l, _)| (l.rank, l.incarnation) == (2, 7))
        );
        assert!(
            records
                .iter()
                .any(|(l, _)| (l.rank, l.incarnation) == (2, 9))
        );
    }
}
