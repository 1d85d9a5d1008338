//! A meta's election under HA, as a pure machine: when a follower looks at the election key,
//! when it campaigns, when it stops trusting what it last saw, when a leader renews its lease
//! and when it steps down. No socket, no clock read, no sleep: the driver asks [`Election::next`]
//! what is due at a time, does it against etcd, and reports what etcd said with the time it
//! happened. `ha/election.rs` drives it against a real etcd; the cluster simulation
//! (`cluster::sim::ha`) drives the same machine against its model of etcd. Times are
//! milliseconds of one monotonic clock.
//!
//! - **Follow**: look at the election key every poll interval; a free key means campaign; a
//!   follower that has not reached etcd for a TTL no longer knows the leader.
//! - **Campaign** (the driver's transaction: grant a lease, create the key under it if it does
//!   not exist): won, it leads with the lease's [`Tenure`], counted from when the grant was
//!   sent; lost, it follows whoever holds the key.
//! - **Lead**: renew every TTL/3; a renewal that says the lease is gone, or a key that is not
//!   this leadership's any more, ends it; past the tenure's deadline it steps down before the
//!   lease can expire in etcd (`cluster::tenure`).
//! - A leader that won after another leader served since it last led purges its objects
//!   (they may be stale): [`Won::purge`].

use super::tenure::{Due, Tenure};

/// How often a follower looks at the election key: a quarter of the TTL, between 100 ms and
/// 1 s.
pub fn poll_ms(ttl_ms: u64) -> u64 {
    (ttl_ms / 4).clamp(100, 1000)
}

/// What the driver does at a time ([`Election::next`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// A follower's look at the election key: report it with [`Election::looked`].
    Look,
    /// A leader's renewal of `lease`: send it, report with [`Election::renewal`], then read
    /// the key back and report with [`Election::key_read`].
    Renew { lease: i64 },
    /// The leadership's deadline passed before a renewal moved it: [`Election::step_down`].
    StepDown,
    /// Nothing until then.
    Wait { until_ms: u64 },
}

/// What a look at the election key found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// etcd did not answer.
    Unreachable,
    /// Nobody holds the key.
    Free,
    /// Someone holds it, under the leadership `view` (the key's create revision).
    Held { view: u64 },
}

/// What the follower does after a look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Then {
    /// The key is free: campaign now (grant a lease, create the key), report with
    /// [`Election::won`] or [`Election::lost`].
    Campaign,
    /// Follow the holder of the key (the driver knows who from what it read).
    Follow { view: u64 },
    /// etcd was not reached; `unknown`: not for a TTL, so the leader is unknown now.
    Blind { unknown: bool },
}

/// How a renewal of the lease went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The lease lives on with this TTL (counted from when the renewal was sent).
    Renewed { ttl_ms: u64 },
    /// etcd says the lease is gone.
    Expired,
    /// No answer: the deadline stays, another renewal is tried soon.
    Failed,
}

/// What reading the election key back after a renewal found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyRead {
    /// Still this leadership's.
    Ours,
    /// Gone, or another leadership's.
    NotOurs,
    /// etcd did not answer: nothing is known, nothing changes.
    Unreadable,
}

/// A won election.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Won {
    /// The leadership's view (the key's create revision): its `view_version` and fence.
    pub view: u64,
    /// Another leader served since this process last led: the objects it holds may be stale
    /// and go before it serves.
    pub purge: bool,
    /// Serving stops then unless a renewal moves it.
    pub serve_until_ms: u64,
}

/// A leadership that ended: the driver stops serving and revokes `lease`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    pub lease: i64,
    pub view: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Leadership {
    lease: i64,
    view: u64,
    tenure: Tenure,
}

/// One meta's election.
#[derive(Clone, Debug)]
pub struct Election {
    ttl_ms: u64,
    poll_ms: u64,
    /// `Some` while leading.
    leading: Option<Leadership>,
    /// A follower's next look.
    next_look: u64,
    /// The last time etcd answered a look.
    last_seen: u64,
    /// This process led before (its store holds objects of that leadership).
    led_before: bool,
}

impl Election {
    /// A follower that looks at once, with leases of `ttl_ms` and looks every `poll_ms`.
    pub fn new(ttl_ms: u64, poll_ms: u64, now_ms: u64) -> Election {
        Election {
            ttl_ms,
            poll_ms,
            leading: None,
            next_look: now_ms,
            last_seen: now_ms,
            led_before: false,
        }
    }

    /// What is due at `now_ms`.
    pub fn next(&self, now_ms: u64) -> Next {
        match &self.leading {
            None if now_ms < self.next_look => Next::Wait {
                until_ms: self.next_look,
            },
            None => Next::Look,
            Some(l) => match l.tenure.due(now_ms) {
                Due::StepDown => Next::StepDown,
                Due::Renew => Next::Renew { lease: l.lease },
                Due::Wait { until_ms } => Next::Wait { until_ms },
            },
        }
    }

    /// A follower looked at the key at `now_ms` and found `seen`.
    pub fn looked(&mut self, seen: Seen, now_ms: u64) -> Then {
        self.next_look = now_ms + self.poll_ms;
        match seen {
            Seen::Unreachable => self.blind(now_ms),
            Seen::Free => {
                self.last_seen = now_ms;
                Then::Campaign
            }
            Seen::Held { view } => {
                self.last_seen = now_ms;
                Then::Follow { view }
            }
        }
    }

    fn blind(&self, now_ms: u64) -> Then {
        Then::Blind {
            unknown: now_ms.saturating_sub(self.last_seen) >= self.ttl_ms,
        }
    }

    /// The campaign won: `lease`, whose grant was sent at `sent_ms` and granted with
    /// `ttl_ms`, holds the key created at revision `view`; `continuous`: the last leader
    /// recorded in etcd was this process.
    pub fn won(
        &mut self,
        lease: i64,
        sent_ms: u64,
        ttl_ms: u64,
        view: u64,
        continuous: bool,
    ) -> Won {
        let tenure = Tenure::won(sent_ms, ttl_ms);
        let purge = self.led_before && !continuous;
        self.led_before = true;
        self.leading = Some(Leadership {
            lease,
            view,
            tenure,
        });
        Won {
            view,
            purge,
            serve_until_ms: tenure.step_down_at(),
        }
    }

    /// The campaign lost at `now_ms`: someone else holds the key (`Some(view)`), it was gone
    /// again (`Some(0)`: the next look campaigns), or etcd did not answer (`None`). The
    /// driver revokes the lease it was granted, if any.
    pub fn lost(&mut self, held: Option<u64>, now_ms: u64) -> Then {
        match held {
            Some(view) => {
                self.last_seen = now_ms;
                Then::Follow { view }
            }
            None => self.blind(now_ms),
        }
    }

    /// A renewal sent at `sent_ms` went as `r` (reported at `now_ms`). `Err`: the leadership
    /// is over ([`Election::step_down`] with the reason).
    pub fn renewal(&mut self, r: Renewal, sent_ms: u64, now_ms: u64) -> Result<(), &'static str> {
        let Some(l) = self.leading.as_mut() else {
            return Ok(());
        };
        match r {
            Renewal::Renewed { ttl_ms } => {
                l.tenure.renewed(sent_ms, ttl_ms);
                Ok(())
            }
            Renewal::Expired => Err("the lease expired"),
            Renewal::Failed => {
                l.tenure.renewal_failed(now_ms);
                Ok(())
            }
        }
    }

    /// The key read back after a renewal. `Err`: the leadership is over.
    pub fn key_read(&self, k: KeyRead) -> Result<(), &'static str> {
        match k {
            KeyRead::NotOurs if self.leading.is_some() => {
                Err("the election key is not this leader's any more")
            }
            _ => Ok(()),
        }
    }

    /// The leadership ends at `now_ms` (its deadline passed, the lease or the key is gone):
    /// not serving from now on; the follower looks at once and, having heard nothing of etcd
    /// meanwhile, does not know the leader until it reaches etcd again.
    pub fn step_down(&mut self, now_ms: u64) -> Option<Ended> {
        let l = self.leading.take()?;
        self.last_seen = now_ms.saturating_sub(self.ttl_ms);
        self.next_look = now_ms;
        Some(Ended {
            lease: l.lease,
            view: l.view,
        })
    }

    /// The leader gives its leadership up at `now_ms` (shutting down, or taking it failed):
    /// as [`Election::step_down`], but what it last saw of etcd stays true.
    pub fn resign(&mut self, now_ms: u64) -> Option<Ended> {
        let l = self.leading.take()?;
        self.next_look = now_ms;
        Some(Ended {
            lease: l.lease,
            view: l.view,
        })
    }

    /// Whether it may serve at `now_ms`: leading, before the tenure's deadline.
    pub fn serving(&self, now_ms: u64) -> bool {
        self.leading
            .as_ref()
            .is_some_and(|l| l.tenure.serving(now_ms))
    }

    /// Whether a renewal is due at `now_ms` (a leader between the steps of taking over).
    pub fn renewal_due(&self, now_ms: u64) -> bool {
        self.leading
            .as_ref()
            .is_some_and(|l| l.tenure.renewal_due(now_ms))
    }

    /// The leadership's view while leading (the fence), else 0.
    pub fn view(&self) -> u64 {
        self.leading.as_ref().map_or(0, |l| l.view)
    }

    /// The lease held while leading.
    pub fn lease(&self) -> Option<i64> {
        self.leading.as_ref().map(|l| l.lease)
    }

    /// Until when the leader may serve (its tenure's deadline); `None` while following.
    pub fn serve_until(&self) -> Option<u64> {
        self.leading.as_ref().map(|l| l.tenure.step_down_at())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: u64 = 3000;

    /// A follower looks every poll; a free key means campaign; once etcd has been out of
    /// reach for a TTL since it last answered, the leader is unknown.
    #[test]
    fn a_follower_looks_every_poll_and_goes_blind_after_a_ttl() {
        let mut e = Election::new(TTL, poll_ms(TTL), 0);
        assert_eq!(e.next(0), Next::Look);
        assert_eq!(
            e.looked(Seen::Held { view: 7 }, 0),
            Then::Follow { view: 7 }
        );
        assert_eq!(e.next(10), Next::Wait { until_ms: 750 });
        assert_eq!(e.next(750), Next::Look);
        assert_eq!(
            e.looked(Seen::Unreachable, 2_999),
            Then::Blind { unknown: false }
        );
        assert_eq!(
            e.looked(Seen::Unreachable, 3_000),
            Then::Blind { unknown: true }
        );
        assert_eq!(e.looked(Seen::Free, 3_750), Then::Campaign);
        assert_eq!(e.view(), 0);
        assert!(!e.serving(3_750));
    }

    /// A leader renews every TTL/3 counting from the send; a failed renewal leaves the
    /// deadline where it was, and the leader steps down a margin before its lease can expire.
    #[test]
    fn a_leader_renews_and_steps_down_before_its_lease_can_expire() {
        let mut e = Election::new(TTL, poll_ms(TTL), 0);
        let w = e.won(5, 100, TTL, 42, false);
        assert_eq!(
            w,
            Won {
                view: 42,
                purge: false,
                serve_until_ms: 100 + TTL - 600
            }
        );
        assert_eq!((e.view(), e.lease()), (42, Some(5)));
        assert_eq!(e.next(100), Next::Wait { until_ms: 1_100 });
        assert_eq!(e.next(1_100), Next::Renew { lease: 5 });
        assert_eq!(
            e.renewal(Renewal::Renewed { ttl_ms: TTL }, 1_100, 1_150),
            Ok(())
        );
        assert_eq!(e.key_read(KeyRead::Ours), Ok(()));
        assert_eq!(e.key_read(KeyRead::Unreadable), Ok(()));
        assert_eq!(e.serve_until(), Some(1_100 + TTL - 600));
        // etcd goes silent: renewals fail, the deadline stays, then it steps down.
        assert_eq!(e.next(2_100), Next::Renew { lease: 5 });
        assert_eq!(e.renewal(Renewal::Failed, 2_100, 2_600), Ok(()));
        assert_eq!(e.next(2_650), Next::Wait { until_ms: 2_700 });
        assert!(e.serving(3_499));
        assert!(!e.serving(3_500));
        assert_eq!(e.next(3_500), Next::StepDown);
        assert_eq!(e.step_down(3_500), Some(Ended { lease: 5, view: 42 }));
        assert_eq!(e.view(), 0);
        // It looks at once, but what it saw of etcd is a TTL old: blind means unknown.
        assert_eq!(e.next(3_500), Next::Look);
        assert_eq!(
            e.looked(Seen::Unreachable, 3_500),
            Then::Blind { unknown: true }
        );
    }

    /// An expired lease or a key that is not the leadership's any more ends it; an answer
    /// that comes after the leadership ended changes nothing.
    #[test]
    fn a_lost_lease_or_key_ends_the_leadership() {
        let mut e = Election::new(TTL, poll_ms(TTL), 0);
        e.won(1, 0, TTL, 3, false);
        assert_eq!(
            e.renewal(Renewal::Expired, 1_000, 1_001),
            Err("the lease expired")
        );
        assert!(e.key_read(KeyRead::NotOurs).is_err());
        e.step_down(1_001);
        assert_eq!(e.key_read(KeyRead::NotOurs), Ok(()));
        assert_eq!(e.renewal(Renewal::Expired, 1_000, 1_002), Ok(()));
        assert_eq!(e.step_down(1_002), None);
    }

    /// A process that led, then saw another leader serve, purges its objects when it wins
    /// again; one that was the last leader recorded in etcd keeps them; the first win never
    /// purges.
    #[test]
    fn a_second_leadership_after_another_purges() {
        let mut e = Election::new(TTL, poll_ms(TTL), 0);
        assert!(!e.won(1, 0, TTL, 3, false).purge);
        e.resign(500);
        assert!(!e.won(2, 600, TTL, 4, true).purge);
        e.resign(700);
        assert!(e.won(3, 800, TTL, 9, false).purge);
    }

    /// A lost campaign follows the holder (etcd answered) or goes blind (it did not).
    #[test]
    fn a_lost_campaign_follows_or_goes_blind() {
        let mut e = Election::new(TTL, poll_ms(TTL), 0);
        assert_eq!(e.looked(Seen::Free, 0), Then::Campaign);
        assert_eq!(e.lost(Some(8), 10), Then::Follow { view: 8 });
        assert_eq!(e.lost(None, 3_009), Then::Blind { unknown: false });
        assert_eq!(e.lost(None, 3_010), Then::Blind { unknown: true });
        assert_eq!(e.view(), 0);
    }
}
