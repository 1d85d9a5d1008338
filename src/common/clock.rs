//! The process clock: one origin, the moment the cluster was built, from which the store, the
//! shards and the metrics all read "now" (milliseconds or seconds since the start).
//!
//! - [`Clock`] reads the monotonic clock (a vDSO call) on every `now_ms`: the store (through
//!   its clock seam, which a simulation replaces by a manual clock), the shards' I/O jobs, and
//!   the metrics' per-second windows. It is `Copy`: every holder has the same origin.
//! - [`TickClock`] is one shard's cached reading of the same [`Clock`], refreshed by the
//!   housekeeping tick, for paths that accept a tick of staleness and run per request or per
//!   connection (timeouts, the `timestamp` of error envelopes).
//!
//! Durations of one operation (request latency, a transfer's time, a span) are differences
//! of `Instant`s taken around it, not readings of "now", and are measured directly.

use std::cell::Cell;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Monotonic time since the process's origin.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A clock whose origin is now (the cluster makes the process's one at start).
    pub fn start() -> Clock {
        Clock::since(Instant::now())
    }

    /// A clock whose origin is `origin` (tests: a process started a while ago).
    pub fn since(origin: Instant) -> Clock {
        Clock { origin }
    }

    /// Milliseconds since the origin.
    pub fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// Whole seconds since the origin.
    pub fn now_secs(&self) -> u64 {
        self.origin.elapsed().as_secs()
    }

    /// The milliseconds since the origin at `at` (0 before it).
    pub fn ms_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_millis() as u64
    }

    /// The instant `ms` milliseconds after the origin (a deadline for a blocking call made by
    /// a machine that counts in milliseconds of this clock).
    pub fn instant_at(&self, ms: u64) -> Instant {
        self.origin + std::time::Duration::from_millis(ms)
    }
}

/// Seconds since the Unix epoch (wall time, for timestamps shown to clients; it may jump, so
/// nothing measures time with it).
pub fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// A shard's cached reading of the process [`Clock`] (and of the wall clock), refreshed by
/// its housekeeping tick, so per-request paths read a `Cell` instead of the clock.
pub struct TickClock {
    clock: Clock,
    now_ms: Cell<u64>,
    unix_secs: Cell<u64>,
}

impl TickClock {
    pub fn new(clock: Clock) -> TickClock {
        let c = TickClock {
            clock,
            now_ms: Cell::new(0),
            unix_secs: Cell::new(0),
        };
        c.refresh();
        c
    }

    pub fn refresh(&self) {
        self.now_ms.set(self.clock.now_ms());
        self.unix_secs.set(unix_secs());
    }

    /// [`Clock::now_ms`] as of the last refresh.
    pub fn now_ms(&self) -> u64 {
        self.now_ms.get()
    }

    /// [`unix_secs`] as of the last refresh.
    pub fn unix_secs(&self) -> u64 {
        self.unix_secs.get()
    }

    /// The clock this one caches.
    pub fn clock(&self) -> Clock {
        self.clock
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn one_origin_for_every_reader() {
        let c = Clock::since(Instant::now() - Duration::from_secs(5));
        assert!((5000..6000).contains(&c.now_ms()), "{}", c.now_ms());
        assert_eq!(c.now_secs(), c.now_ms() / 1000);
        let t = TickClock::new(c);
        let before = t.now_ms();
        assert!(before >= 5000);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(t.now_ms(), before, "cached until refreshed");
        t.refresh();
        assert!(t.now_ms() >= before + 20);
        assert!(t.unix_secs() > 1_600_000_000);
    }
}
