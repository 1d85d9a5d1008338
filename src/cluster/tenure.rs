//! A leadership's hold on its etcd lease, as a pure machine: until when the leader may serve,
//! when it renews, when it must step down. The rule it keeps: a leader stops serving before
//! its lease can have expired in etcd, counting from when each grant or renewal was *sent*
//! (etcd starts the TTL no earlier than it receives the request), less a margin that lets the
//! requests already past the gate finish. The election thread (`ha/election.rs`) and the
//! cluster simulation (`cluster::sim::ha`) drive the same machine; times are milliseconds of
//! one monotonic clock, handed in with each event.

/// How long before the lease's earliest possible expiry a leader stops serving: a fifth of the
/// TTL, at least 300 ms, at most half the TTL.
pub fn margin_ms(ttl_ms: u64) -> u64 {
    (ttl_ms / 5).max(300).min(ttl_ms / 2)
}

/// What a leader does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// The deadline passed before a renewal moved it: stop serving now.
    StepDown,
    /// A renewal is due: send one (its send time is the next [`Tenure::renewed`]'s `sent_ms`).
    Renew,
    /// Nothing until then.
    Wait { until_ms: u64 },
}

/// One leadership's lease timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tenure {
    /// The TTL the lease was granted with.
    ttl_ms: u64,
    /// Serving stops at this time unless a renewal moves it first.
    step_down_at: u64,
    next_renewal: u64,
}

impl Tenure {
    /// The election was won under a lease whose grant was sent at `sent_ms` and granted with
    /// `ttl_ms`.
    pub fn won(sent_ms: u64, ttl_ms: u64) -> Tenure {
        Tenure {
            ttl_ms,
            step_down_at: sent_ms + ttl_ms - margin_ms(ttl_ms),
            next_renewal: sent_ms + ttl_ms / 3,
        }
    }

    /// A renewal sent at `sent_ms` was answered with the lease's TTL `granted_ms` (never
    /// counted longer than the TTL the lease was granted with).
    pub fn renewed(&mut self, sent_ms: u64, granted_ms: u64) {
        let ttl = granted_ms.min(self.ttl_ms);
        self.step_down_at = sent_ms + ttl - margin_ms(self.ttl_ms).min(ttl / 2);
        self.next_renewal = sent_ms + self.ttl_ms / 3;
    }

    /// A renewal failed at `now_ms` (etcd did not answer): the deadline stays; another is
    /// tried soon.
    pub fn renewal_failed(&mut self, now_ms: u64) {
        self.next_renewal = now_ms + 100;
    }

    /// What is due at `now_ms`.
    pub fn due(&self, now_ms: u64) -> Due {
        if now_ms >= self.step_down_at {
            Due::StepDown
        } else if now_ms >= self.next_renewal {
            Due::Renew
        } else {
            Due::Wait {
                until_ms: self.next_renewal.min(self.step_down_at),
            }
        }
    }

    /// Whether the leader may serve at `now_ms`.
    pub fn serving(&self, now_ms: u64) -> bool {
        now_ms < self.step_down_at
    }

    /// The time serving stops unless a renewal moves it.
    pub fn step_down_at(&self) -> u64 {
        self.step_down_at
    }

    /// Whether a renewal is due at `now_ms`.
    pub fn renewal_due(&self, now_ms: u64) -> bool {
        now_ms >= self.next_renewal
    }

    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leader whose renewals fail steps down a margin before the lease sent at the win can
    /// expire, whatever happens meanwhile; one renewed in time serves on, counting from when
    /// the renewal was sent, not answered.
    #[test]
    fn a_leader_stops_serving_before_its_lease_can_expire() {
        let mut t = Tenure::won(1_000, 10_000);
        assert_eq!(margin_ms(10_000), 2_000);
        assert!(t.serving(1_000));
        assert_eq!(
            t.due(1_000),
            Due::Wait {
                until_ms: 1_000 + 3_333
            }
        );
        assert_eq!(t.due(4_333), Due::Renew);
        t.renewal_failed(4_333);
        assert_eq!(t.due(4_400), Due::Wait { until_ms: 4_433 });
        assert_eq!(t.due(4_433), Due::Renew);
        // Never renewed: the deadline stays where the win put it.
        assert!(t.serving(8_999));
        assert!(!t.serving(9_000));
        assert_eq!(t.due(9_000), Due::StepDown);
        // Renewed: sent at 8 000, answered late, counted from 8 000.
        t.renewed(8_000, 10_000);
        assert_eq!(t.step_down_at(), 16_000);
        assert_eq!(t.due(9_000), Due::Wait { until_ms: 11_333 });
        assert_eq!(t.due(11_000), Due::Wait { until_ms: 11_333 });
        // A shorter TTL in the answer shortens the hold; a longer one never lengthens it.
        t.renewed(12_000, 1_000);
        assert_eq!(t.step_down_at(), 12_500);
        t.renewed(12_000, 60_000);
        assert_eq!(t.step_down_at(), 20_000);
    }

    #[test]
    fn the_margin_is_a_fifth_at_least_300_ms_at_most_half() {
        assert_eq!(margin_ms(1_000), 300);
        assert_eq!(margin_ms(5_000), 1_000);
        assert_eq!(margin_ms(400), 200);
    }
}
