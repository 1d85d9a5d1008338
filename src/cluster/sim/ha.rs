//! HA as the simulation models it: etcd (a leader key held by a lease with a TTL, a global
//! revision, the last leader's incarnation) and each meta's election (`ha/election.rs`:
//! follow, campaign, then the real lease timing, [`Tenure`]: renew every TTL/3, stop serving
//! at the last renewal's send time + TTL − margin, before the lease can expire). etcd may be out (frozen or lost: nothing answers,
//! leases keep expiring by its clock) and a meta may be cut off from it.

use std::collections::BTreeMap;

use super::Node;
use super::timing::HA_TTL_MS;
use crate::cluster::members::LostMembership;
use crate::cluster::tenure::{Due, Tenure};
/// How often a follower reads the leader key (`Elector::poll`).
const POLL_MS: u64 = HA_TTL_MS / 4;

#[derive(Default)]
pub(super) struct Etcd {
    /// Out until then (frozen or down).
    pub out_until: u64,
    /// The leader key: the meta holding it, its lease, its create revision.
    key: Option<(u8, u64, u64)>,
    /// Lease → expiry.
    leases: BTreeMap<u64, u64>,
    revision: u64,
    last_leader: u64,
    next_lease: u64,
    /// `<prefix>lost/<rank>`: the membership (and its process) a leader last declared lost
    /// there (`ha/losses.rs`).
    pub lost: BTreeMap<u32, LostMembership>,
    /// `<prefix>served/<view>`: the leaderships that recorded themselves before serving
    /// (`ha/losses.rs` `load_history`).
    pub served: std::collections::BTreeSet<u64>,
}

impl Etcd {
    pub fn up(&self, now: u64) -> bool {
        now >= self.out_until
    }

    /// Leases past their TTL end, and the key they hold with them.
    fn expire(&mut self, now: u64) {
        self.leases.retain(|_, &mut exp| exp > now);
        if let Some((_, lease, _)) = self.key
            && !self.leases.contains_key(&lease)
        {
            self.key = None;
        }
    }

    /// `record_loss`'s transaction: stored when the leader key is `me`'s under `view`.
    pub fn record_loss(&mut self, me: u8, view: u64, lost: LostMembership, now: u64) -> bool {
        if self.holder(now) != Some((me, view)) {
            return false;
        }
        self.lost.insert(lost.rank, lost);
        true
    }

    /// The meta holding the leader key, and its revision.
    pub fn holder(&mut self, now: u64) -> Option<(u8, u64)> {
        self.expire(now);
        self.key.map(|(m, _, rev)| (m, rev))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Follower,
    Leader,
}

/// One meta's election thread.
pub(super) struct Elector {
    role: Role,
    /// The leadership's revision (its `view_version` and fence).
    view: u64,
    lease: u64,
    /// The leadership's lease timing (while leading).
    tenure: Tenure,
    next_poll: u64,
    last_seen: u64,
    /// This process led before (its store holds objects of that leadership).
    led_before: bool,
    /// The leader to send clients to (307).
    pub leader: Option<Node>,
}

/// What one look of the election did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Elected {
    Nothing,
    /// Won; `purge`: another leader served since this process last led, so its objects go.
    Won {
        view: u64,
        purge: bool,
    },
    SteppedDown(&'static str),
}

impl Elector {
    pub fn new(now: u64) -> Elector {
        Elector {
            role: Role::Follower,
            view: 0,
            lease: 0,
            tenure: Tenure::won(0, HA_TTL_MS),
            next_poll: now,
            last_seen: now,
            led_before: false,
            leader: None,
        }
    }

    pub fn serving(&self, now: u64) -> bool {
        self.role == Role::Leader && self.tenure.serving(now)
    }

    /// The fence: the leadership's view while leading.
    pub fn view(&self) -> u64 {
        if self.role == Role::Leader {
            self.view
        } else {
            0
        }
    }

    /// One look at time `now` by meta `me` (incarnation `incarnation`); `reach`: etcd answers
    /// this meta now.
    pub fn step(
        &mut self,
        etcd: &mut Etcd,
        me: u8,
        incarnation: u64,
        reach: bool,
        now: u64,
    ) -> Elected {
        match self.role {
            Role::Follower => {
                if now < self.next_poll {
                    return Elected::Nothing;
                }
                self.next_poll = now + POLL_MS;
                if !reach {
                    if now.saturating_sub(self.last_seen) >= HA_TTL_MS {
                        self.leader = None;
                    }
                    return Elected::Nothing;
                }
                self.last_seen = now;
                match etcd.holder(now) {
                    // Its own key under a lease it does not hold (a previous life): not a
                    // leader to send clients to; it goes with its lease.
                    Some((m, _)) => {
                        self.leader = (m != me).then_some(Node::Meta(m));
                        Elected::Nothing
                    }
                    None => self.campaign(etcd, me, incarnation, now),
                }
            }
            Role::Leader => {
                match self.tenure.due(now) {
                    Due::StepDown => {
                        return self.step_down(
                            etcd,
                            reach,
                            now,
                            "could not renew the lease in time",
                        );
                    }
                    Due::Wait { .. } => return Elected::Nothing,
                    Due::Renew => {}
                }
                if !reach {
                    self.tenure.renewal_failed(now);
                    return Elected::Nothing;
                }
                etcd.expire(now);
                let Some(exp) = etcd.leases.get_mut(&self.lease) else {
                    return self.step_down(etcd, reach, now, "the lease expired");
                };
                *exp = now + HA_TTL_MS;
                self.tenure.renewed(now, HA_TTL_MS);
                match etcd.holder(now) {
                    Some((m, rev)) if m == me && rev == self.view => Elected::Nothing,
                    _ => self.step_down(etcd, reach, now, "the key is not this leader's"),
                }
            }
        }
    }

    fn campaign(&mut self, etcd: &mut Etcd, me: u8, incarnation: u64, now: u64) -> Elected {
        etcd.next_lease += 1;
        let lease = etcd.next_lease;
        etcd.leases.insert(lease, now + HA_TTL_MS);
        etcd.revision += 1;
        let view = etcd.revision;
        etcd.key = Some((me, lease, view));
        let continuous = etcd.last_leader == incarnation;
        etcd.last_leader = incarnation;
        let purge = self.led_before && !continuous;
        self.led_before = true;
        self.role = Role::Leader;
        self.view = view;
        self.lease = lease;
        self.tenure = Tenure::won(now, HA_TTL_MS);
        self.leader = Some(Node::Meta(me));
        Elected::Won { view, purge }
    }

    fn step_down(&mut self, etcd: &mut Etcd, reach: bool, now: u64, why: &'static str) -> Elected {
        self.role = Role::Follower;
        self.leader = None;
        self.last_seen = now.saturating_sub(HA_TTL_MS);
        self.next_poll = now;
        if reach {
            etcd.leases.remove(&self.lease);
            etcd.expire(now);
        }
        Elected::SteppedDown(why)
    }
}
