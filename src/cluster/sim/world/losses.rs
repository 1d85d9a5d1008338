//! Meta's losses carried to the model of etcd, and what keeps the cluster from rest
//! (`world.rs`).

use super::super::meta::LossRecord;
use super::*;
use crate::cluster::members::LostMembership;

impl World {
    /// Meta `i`'s losses on their way to etcd: stored if etcd answers and the leader key is
    /// still this leadership's; refused when it is not; given up past their deadline.
    pub(super) fn record_losses(&mut self, i: usize) {
        let now = self.now;
        let reach = self.etcd.up(now) && !self.net.is_cut(Node::Meta(i as u8), Node::Etcd, now);
        let mut cx = cx!(self, Node::Meta(i as u8), self.metas[i].offset);
        let Some(m) = self.metas[i].proc.as_mut() else {
            return;
        };
        let current = m.ha.as_ref().map_or(0, |e| e.view());
        // The records there now (one tried again is pushed behind them, for the next look).
        let mut k = 0;
        let mut left = m.recording.len();
        while left > 0 {
            left -= 1;
            let r = &m.recording[k];
            // Fenced by the leadership that declared the loss (the mutation: by whichever
            // leads now, as before).
            let fence = if cx.mutations.loss_under_current_fence {
                current
            } else {
                r.fence
            };
            let outcome = if fence == 0 && !cx.mutations.loss_under_current_fence {
                LossRecord::Over
            } else if reach {
                let lost = LostMembership {
                    rank: r.rank,
                    incarnation: r.incarnation,
                    membership: r.membership,
                };
                if self.etcd.record_loss(i as u8, fence, lost, now) {
                    LossRecord::Recorded
                } else if cx.mutations.loss_under_current_fence {
                    LossRecord::Failed
                } else {
                    LossRecord::Over
                }
            } else if now >= r.deadline {
                LossRecord::Failed
            } else {
                k += 1;
                continue;
            };
            m.loss_recorded(&mut cx, k, outcome);
        }
        self.flush();
    }

    /// What keeps the cluster from rest ([`World::at_rest`]), for the report.
    pub(super) fn unrest(&self) -> String {
        let Some(i) = self.leader() else {
            return "no meta serves".into();
        };
        let m = self.metas[i].proc.as_ref().expect("serving");
        let mut why = Vec::new();
        if !m.quiet() {
            why.push(format!("meta {i}: {}", m.busy()));
        }
        if !self.clients.iter().all(Client::idle) {
            why.push("a client is not idle".into());
        }
        for (j, h) in self.locals.iter().enumerate() {
            match h.proc.as_ref() {
                None => why.push(format!("local {j} is down")),
                Some(l) if !l.joined => why.push(format!("local {j} has not joined")),
                Some(l) if !l.rank.is_some_and(|r| m.holds(r, l.epoch)) => why.push(format!(
                    "local {j}'s membership (rank {:?}, epoch {}) is not held with its segments OK",
                    l.rank, l.epoch
                )),
                _ => {}
            }
        }
        why.join("; ")
    }
}
