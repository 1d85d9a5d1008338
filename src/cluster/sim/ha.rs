//! HA as the simulation models it: etcd (a leader key held by a lease with a TTL, a global
//! revision, the last leader's incarnation) and each meta's election (`ha/election.rs`:
//! follow, campaign, lead: the same machine, `cluster::election`, with its lease timing,
//! `cluster::tenure`: renew every TTL/3, stop serving at the last renewal's send time + TTL −
//! margin, before the lease can expire). etcd may be out (frozen or lost: nothing answers,
//! leases keep expiring by its clock) and a meta may be cut off from it.

use std::collections::BTreeMap;

use super::Node;
use super::timing::HA_TTL_MS;
use crate::cluster::election::{self, Election, KeyRead, Next, Renewal, Seen, Then};
use crate::cluster::members::LostMembership;

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
    /// `<prefix>lost/<rank>/<incarnation>`: the membership of each process a leader declared
    /// lost on each rank (`ha/losses.rs`; all kept: a run loses far fewer than
    /// `KEPT_PER_RANK` processes per rank).
    pub lost: BTreeMap<(u32, u64), LostMembership>,
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
        self.lost.insert((lost.rank, lost.incarnation), lost);
        true
    }

    /// The meta holding the leader key, and its revision.
    pub fn holder(&mut self, now: u64) -> Option<(u8, u64)> {
        self.expire(now);
        self.key.map(|(m, _, rev)| (m, rev))
    }
}

/// One meta's election thread: the election machine (`cluster::election`, as
/// `ha/election.rs` drives it) carried out against the model of etcd.
pub(super) struct Elector {
    election: Election,
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
            election: Election::new(HA_TTL_MS, election::poll_ms(HA_TTL_MS), now),
            leader: None,
        }
    }

    pub fn serving(&self, now: u64) -> bool {
        self.election.serving(now)
    }

    /// The fence: the leadership's view while leading.
    pub fn view(&self) -> u64 {
        self.election.view()
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
        match self.election.next(now) {
            Next::Wait { .. } => Elected::Nothing,
            Next::Look => {
                let seen = match reach.then(|| etcd.holder(now)) {
                    None => Seen::Unreachable,
                    Some(None) => Seen::Free,
                    Some(Some((_, view))) => Seen::Held { view },
                };
                match self.election.looked(seen, now) {
                    Then::Blind { unknown } => {
                        if unknown {
                            self.leader = None;
                        }
                        Elected::Nothing
                    }
                    Then::Follow { .. } => {
                        // Its own key under a lease it does not hold (a previous life): not a
                        // leader to send clients to; it goes with its lease.
                        let holder = etcd.holder(now).map(|(m, _)| m);
                        self.leader = holder.filter(|&m| m != me).map(Node::Meta);
                        Elected::Nothing
                    }
                    Then::Campaign => self.campaign(etcd, me, incarnation, now),
                }
            }
            Next::StepDown => self.step_down(etcd, reach, now, "could not renew the lease in time"),
            Next::Renew { lease } => {
                if !reach {
                    let _ = self.election.renewal(Renewal::Failed, now, now);
                    return Elected::Nothing;
                }
                etcd.expire(now);
                let r = match etcd.leases.get_mut(&(lease as u64)) {
                    None => Renewal::Expired,
                    Some(exp) => {
                        *exp = now + HA_TTL_MS;
                        Renewal::Renewed { ttl_ms: HA_TTL_MS }
                    }
                };
                if let Err(why) = self.election.renewal(r, now, now) {
                    return self.step_down(etcd, reach, now, why);
                }
                let read = match etcd.holder(now) {
                    Some((m, rev)) if m == me && rev == self.election.view() => KeyRead::Ours,
                    _ => KeyRead::NotOurs,
                };
                match self.election.key_read(read) {
                    Ok(()) => Elected::Nothing,
                    Err(why) => self.step_down(etcd, reach, now, why),
                }
            }
        }
    }

    /// The campaign's transaction, atomic in the model: the key was free at the look.
    fn campaign(&mut self, etcd: &mut Etcd, me: u8, incarnation: u64, now: u64) -> Elected {
        etcd.next_lease += 1;
        let lease = etcd.next_lease;
        etcd.leases.insert(lease, now + HA_TTL_MS);
        etcd.revision += 1;
        let view = etcd.revision;
        etcd.key = Some((me, lease, view));
        let continuous = etcd.last_leader == incarnation;
        etcd.last_leader = incarnation;
        let won = self
            .election
            .won(lease as i64, now, HA_TTL_MS, view, continuous);
        self.leader = Some(Node::Meta(me));
        Elected::Won {
            view,
            purge: won.purge,
        }
    }

    fn step_down(&mut self, etcd: &mut Etcd, reach: bool, now: u64, why: &'static str) -> Elected {
        self.leader = None;
        if let Some(end) = self.election.step_down(now)
            && reach
        {
            etcd.leases.remove(&(end.lease as u64));
            etcd.expire(now);
        }
        Elected::SteppedDown(why)
    }
}
