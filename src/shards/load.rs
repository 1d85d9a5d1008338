//! How busy a shard is: requests in progress (bounded: past the limit the shard sheds with
//! 429 at once instead of queueing without bound) and a sampled moving average of the time a
//! request takes, from which `Retry-After` is estimated.

use std::cell::Cell;
use std::time::Instant;

/// One request in 16 is timed: enough for an average, nearly free on the hot path.
const SAMPLE_EVERY: u32 = 16;

pub struct Load {
    inflight: Cell<usize>,
    max: usize,
    /// Moving average of a request's service time, microseconds.
    avg_us: Cell<f64>,
    counter: Cell<u32>,
}

/// A request being worked on; leaves the count when dropped.
pub struct Working<'a> {
    load: &'a Load,
    started: Option<Instant>,
}

impl Load {
    pub fn new(max: usize) -> Load {
        Load {
            inflight: Cell::new(0),
            max,
            avg_us: Cell::new(50.0),
            counter: Cell::new(0),
        }
    }

    /// Enters a request, or `None` when the shard already works on `max`.
    pub fn enter(&self) -> Option<Working<'_>> {
        if self.inflight.get() >= self.max {
            return None;
        }
        Some(self.enter_always())
    }

    /// Enters a request whatever the shard works on already (a membership message: shedding
    /// it would get a live rank declared lost).
    pub fn enter_always(&self) -> Working<'_> {
        let n = self.inflight.get();
        self.inflight.set(n + 1);
        let c = self.counter.get().wrapping_add(1);
        self.counter.set(c);
        let started = (c % SAMPLE_EVERY == 0).then(Instant::now);
        Working {
            load: self,
            started,
        }
    }

    pub fn inflight(&self) -> usize {
        self.inflight.get()
    }

    /// Seconds until `backlog` more requests (plus the ones in progress) would be served at
    /// the recent pace, clamped to 1-60 (the `Retry-After` of a 429).
    pub fn retry_after_secs(&self, backlog: usize) -> u32 {
        let secs = (self.inflight.get() + backlog) as f64 * self.avg_us.get() / 1e6;
        (secs.ceil() as u32).clamp(1, 60)
    }
}

impl Drop for Working<'_> {
    fn drop(&mut self) {
        self.load.inflight.set(self.load.inflight.get() - 1);
        if let Some(t) = self.started {
            let us = t.elapsed().as_secs_f64() * 1e6;
            self.load
                .avg_us
                .set(self.load.avg_us.get() * 0.9 + us * 0.1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_estimates_clamped() {
        let l = Load::new(2);
        let a = l.enter().unwrap();
        let b = l.enter().unwrap();
        assert!(l.enter().is_none(), "the third request is shed");
        {
            let _beat = l.enter_always();
            assert_eq!(l.inflight(), 3, "a membership message is counted, not shed");
        }
        assert_eq!(l.inflight(), 2);
        drop(a);
        assert_eq!(l.inflight(), 1);
        assert!(l.enter().is_some());
        drop(b);
        assert_eq!(l.retry_after_secs(0), 1);
        l.avg_us.set(1e6); // one second per request
        assert_eq!(l.retry_after_secs(5), 5);
        assert_eq!(l.retry_after_secs(1000), 60);
    }
}
