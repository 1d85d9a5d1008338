//! The mapped answers a same-host connection holds for its client (docs/same-host.md, *Mapped
//! gets*): each answer's pinned blobs stay pinned (not freed, not evicted, not reused) until
//! the client says with `X-Mmc-Map: N` that it is done copying up to lease `N`, or the
//! connection closes; counted on the shard's `/metrics` meanwhile
//! (`memcache_same_host_held_answers`, `memcache_same_host_held_bytes`).

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;

use crate::http::response::Part;
use crate::shards::Shared;

/// At most this many mapped answers are held per connection; a get beyond them is copied by
/// the server as before.
pub const MAX_HELD_LEASES: usize = 256;

/// A connection's held answers: each one's lease number, its pinned blobs and their bytes, in
/// lease order.
#[derive(Debug, Default)]
pub(super) struct HeldAnswers {
    answers: RefCell<VecDeque<(u64, Vec<Part>, u64)>>,
    /// The last lease number given on this connection.
    leases: Cell<u64>,
    /// Where the held answers are counted (the shard's statistics; none in unit tests).
    counted: Option<Counted>,
    /// The connection's registration with the local service's grant reads
    /// (`shards::grant_reads`), made by its first mapped answer read under a meta's grant,
    /// and the process state it is in.
    granted: OnceCell<Registered>,
}

/// A connection's registration with the grant reads of the process `.0`.
struct Registered(Arc<Shared>, u64);

impl std::fmt::Debug for Registered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "grant reads registration {}", self.1)
    }
}

impl Drop for HeldAnswers {
    fn drop(&mut self) {
        if let Some(Registered(shared, id)) = self.granted.take() {
            shared.membership.local.grant_reads.forget(id);
        }
    }
}

/// The shard whose statistics count a connection's held answers.
struct Counted(Arc<Shared>, usize);

impl std::fmt::Debug for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "shard {}", self.1)
    }
}

impl HeldAnswers {
    /// Counts the answers held here in shard `shard`'s statistics from now on.
    pub(super) fn count_in(&mut self, shared: Arc<Shared>, shard: usize) {
        self.counted = Some(Counted(shared, shard));
    }

    /// Whether the connection on socket `conn` may hold a mapped answer read under a grant
    /// checked in grant-read `epoch`: no join of the service since (it would have shut the
    /// connection down, or will). The first registers the connection for the next join's sweep.
    pub(super) fn may_hold_granted(&self, conn: RawFd, shared: &Arc<Shared>, epoch: u64) -> bool {
        let reads = &shared.membership.local.grant_reads;
        if self.granted.get().is_some() {
            return reads.epoch() == epoch;
        }
        let Some(id) = reads.register(conn, epoch) else {
            return false;
        };
        let _ = self.granted.set(Registered(shared.clone(), id));
        true
    }

    /// Holds an answer's pinned blobs; its lease number. `Err` (the parts given back) when
    /// [`MAX_HELD_LEASES`] are held already.
    pub(super) fn hold(&self, parts: Vec<Part>) -> Result<u64, Vec<Part>> {
        let mut answers = self.answers.borrow_mut();
        if answers.len() >= MAX_HELD_LEASES {
            return Err(parts);
        }
        let n = self.leases.get() + 1;
        self.leases.set(n);
        // Bytes pinned here: a local service's reads under a meta's grant pin nothing.
        let bytes = parts
            .iter()
            .filter(|p| matches!(p, Part::Blob(b) if b.is_managed()))
            .map(|p| p.len() as u64)
            .sum();
        answers.push_back((n, parts, bytes));
        self.count(1, bytes as i64);
        Ok(n)
    }

    /// Lets the pins of the answers up to lease `upto` go; how many answers that was.
    pub(super) fn release(&self, upto: u64) -> usize {
        let (mut n, mut bytes) = (0, 0);
        {
            let mut answers = self.answers.borrow_mut();
            while answers.front().is_some_and(|h| h.0 <= upto) {
                n += 1;
                bytes += answers.pop_front().map_or(0, |h| h.2);
            }
        }
        if n > 0 {
            self.count(-(n as i64), -(bytes as i64));
        }
        n
    }

    /// Lets every answer's pins go (the connection is closing).
    pub(super) fn clear(&mut self) {
        self.release(u64::MAX);
    }

    /// How many answers are held.
    pub(super) fn len(&self) -> usize {
        self.answers.borrow().len()
    }

    /// Adds `n` answers of `bytes` bytes to the shard's counts (negative: takes them away).
    /// On the shard's thread (the connection's), as its gauges require.
    fn count(&self, n: i64, bytes: i64) {
        if let Some(Counted(shared, shard)) = &self.counted {
            let stats = &shared.shards[*shard].stats.same_host;
            stats.held_answers.add(n);
            stats.held_bytes.add(bytes);
        }
    }
}
