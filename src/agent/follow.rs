//! What a local service says about the meta services it tries to join: the first failure to
//! reach one (or to be admitted) at once, at WARN with its address, then at most one line per
//! [`WARN_EVERY`] while it goes on failing (with how many attempts failed meanwhile), and one
//! line when it is reached again. A service started before its meta is thus neither silent
//! nor flooding its log (it tries every few hundred milliseconds).

use std::time::{Duration, Instant};

/// The most often a meta service that keeps failing is warned about.
pub(super) const WARN_EVERY: Duration = Duration::from_secs(30);

/// Failures to join, per meta service URL.
#[derive(Default)]
pub(super) struct Unreachable {
    metas: Vec<Failing>,
}

struct Failing {
    meta: String,
    since: Instant,
    warned_at: Instant,
    /// Attempts failed since the last warning.
    unwarned: u64,
}

impl Unreachable {
    /// A join sent to `meta` failed: `what` says how ("cannot be reached: …", "refused the
    /// join (409): …"). Warns now if it is the first failure or the last warning is
    /// [`WARN_EVERY`] old; else counts it (logged at debug).
    pub(super) fn failed(&mut self, meta: &str, what: &str) {
        let now = Instant::now();
        match self.metas.iter_mut().find(|f| f.meta == meta) {
            None => {
                log::warn!(
                    "the meta service at {meta} {what} (trying again; repeated at most every {} s)",
                    WARN_EVERY.as_secs()
                );
                self.metas.push(Failing {
                    meta: meta.to_string(),
                    since: now,
                    warned_at: now,
                    unwarned: 0,
                });
            }
            Some(f) if now.duration_since(f.warned_at) >= WARN_EVERY => {
                log::warn!(
                    "the meta service at {meta} {what} (failing for {} s; {} more attempts failed since the last warning)",
                    now.duration_since(f.since).as_secs(),
                    f.unwarned
                );
                f.warned_at = now;
                f.unwarned = 0;
            }
            Some(f) => {
                f.unwarned += 1;
                log::debug!("the meta service at {meta} {what}");
            }
        }
    }

    /// A join to `meta` was answered: it is forgotten as failing (one line when it was).
    pub(super) fn reached(&mut self, meta: &str) {
        if let Some(i) = self.metas.iter().position(|f| f.meta == meta) {
            let f = self.metas.swap_remove(i);
            log::info!(
                "the meta service at {meta} answered after failing for {} s",
                f.since.elapsed().as_secs()
            );
        }
    }

    /// Whether a failure of `meta` is being counted (tests).
    #[cfg(test)]
    fn failing(&self, meta: &str) -> Option<u64> {
        self.metas
            .iter()
            .find(|f| f.meta == meta)
            .map(|f| f.unwarned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_warns_and_repeats_are_counted() {
        let mut u = Unreachable::default();
        u.failed("http://a:1", "cannot be reached: refused");
        assert_eq!(u.failing("http://a:1"), Some(0));
        for _ in 0..5 {
            u.failed("http://a:1", "cannot be reached: refused");
        }
        assert_eq!(u.failing("http://a:1"), Some(5), "counted, not warned");
        u.failed("http://b:2", "cannot be reached: timed out");
        assert_eq!(
            u.failing("http://b:2"),
            Some(0),
            "each meta warned once at first"
        );
        // A warning older than WARN_EVERY: the next failure warns again.
        u.metas[0].warned_at = Instant::now() - WARN_EVERY;
        u.failed("http://a:1", "cannot be reached: refused");
        assert_eq!(u.failing("http://a:1"), Some(0));
        u.reached("http://a:1");
        assert_eq!(u.failing("http://a:1"), None);
        assert_eq!(u.failing("http://b:2"), Some(0));
    }
}
