//! A meta's losses on their way to etcd (`meta.rs`), mirroring `shards/ranks.rs`
//! `check_lost_ranks`: recorded, tried again, or abandoned when the leadership that declared
//! them is over.

use super::super::timing::*;
use super::super::world::Cx;
use super::*;

impl Meta {
    /// The loss `recording[i]` was recorded in etcd (`ok`), or could not be: its segments are
    /// dropped, with its freed log only when it was; one that could not be is tried again
    /// (`ranks.rs` `check_lost_ranks`), its log held meanwhile.
    pub fn loss_recorded(&mut self, cx: &mut Cx, i: usize, outcome: LossRecord) {
        self.store.set_manual_clock(cx.now);
        let r = self.recording.remove(i);
        let ok = outcome == LossRecord::Recorded;
        if ok {
            cx.log(format!("rank {}'s loss recorded in etcd", r.rank));
        } else if outcome == LossRecord::Over {
            cx.log(format!(
                "rank {}: its loss cannot be recorded: the leadership that declared it (view {}) is over",
                r.rank, r.fence
            ));
            self.logs.abandon(r.rank, r.epoch);
        } else if r.segs.is_empty() {
            // A retry: the segments went with the first attempt.
        } else {
            cx.log(format!(
                "rank {}: its loss could not be recorded in etcd; removals waiting on it are not confirmed",
                r.rank
            ));
        }
        if outcome == LossRecord::Failed {
            let mut again = r.again();
            again.deadline = cx.now + HA_TTL_MS;
            self.recording.push(again);
        }
        self.drops.push(Dropping {
            rank: r.rank,
            epoch: r.epoch,
            segs: r.segs,
            documented: true,
            retired: false,
            keep_log: !ok,
        });
        self.run_drops(cx);
        self.poll_removals(cx);
        self.after_store();
        self.store.check();
    }
}
