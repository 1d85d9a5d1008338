//! The shard's cheap clock, refreshed by its housekeeping tick.

use std::cell::Cell;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A cheap clock refreshed by the shard's housekeeping tick, so hot paths read a `Cell`
/// instead of calling the clock: `now_ms` for timeouts, `unix_secs` for the `timestamp` of
/// error envelopes.
pub struct Clock {
    started: Instant,
    now_ms: Cell<u64>,
    unix_secs: Cell<u64>,
}

impl Clock {
    pub(super) fn new(started: Instant) -> Clock {
        let c = Clock {
            started,
            now_ms: Cell::new(0),
            unix_secs: Cell::new(0),
        };
        c.refresh();
        c
    }

    pub fn refresh(&self) {
        self.now_ms.set(self.started.elapsed().as_millis() as u64);
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        self.unix_secs.set(unix.as_secs());
    }

    /// Milliseconds since the process started, as of the last tick.
    pub fn now_ms(&self) -> u64 {
        self.now_ms.get()
    }

    pub fn unix_secs(&self) -> u64 {
        self.unix_secs.get()
    }
}
