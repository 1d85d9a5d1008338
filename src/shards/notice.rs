//! Unpin and abort notices: one-way messages that must never be lost, sent from `Drop`.
//!
//! A shard's notices arrive in a bounded ring ([`NOTICE_CAPACITY`]). A `Drop` cannot wait
//! and must not lose its notice, so a sender that finds the ring full keeps the notice in its
//! own thread's *overflow list* and retries it on its next mailbox pass and housekeeping tick
//! (the owner drains its ring on every pass, so room comes back quickly). The overflow list is
//! bounded in practice by the pins and grants the sending shard held. A thread that is not a
//! shard (a test, the main thread) has no mailbox to retry from: it yields until the ring has
//! room instead, or drops the notice once the server is shutting down (the state it would
//! release is going away with the process).

use std::cell::{Cell, RefCell};

use crossbeam_queue::ArrayQueue;

use super::ShardId;
use super::store::{BlobHandle, ObjHandle};

/// Notices one shard's ring holds. Past it, senders keep their notices (see the module doc).
pub const NOTICE_CAPACITY: usize = 4096;

/// A one-way message that must never be lost: releasing a pin, aborting an unfinished put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    Unpin(BlobHandle),
    Abort(ObjHandle),
}

/// One shard's incoming notices.
pub struct NoticeRing {
    ring: ArrayQueue<Notice>,
}

impl NoticeRing {
    pub fn new(capacity: usize) -> NoticeRing {
        NoticeRing {
            ring: ArrayQueue::new(capacity.max(1)),
        }
    }

    pub fn pop(&self) -> Option<Notice> {
        self.ring.pop()
    }

    pub fn len(&self) -> usize {
        self.ring.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }
}

thread_local! {
    /// Notices this thread could not deliver yet (their ring was full), with their target.
    static OVERFLOW: RefCell<Vec<(ShardId, Notice)>> = const { RefCell::new(Vec::new()) };
    /// Whether this thread is a shard's (it then retries its overflow from its mailbox).
    static ON_SHARD: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as a shard's: its undeliverable notices go to its overflow list.
pub fn mark_shard_thread() {
    ON_SHARD.with(|s| s.set(true));
}

/// Delivers `n` to `rings[to]` without blocking a shard and without losing it. `wake` is
/// called for every target that received a notice; `stopping` says whether the server is
/// shutting down (only a non-shard thread consults it).
pub fn deliver<'r>(
    rings: &dyn Fn(ShardId) -> &'r NoticeRing,
    wake: &dyn Fn(ShardId),
    stopping: &dyn Fn() -> bool,
    to: ShardId,
    n: Notice,
) {
    let Err(n) = rings(to).ring.push(n) else {
        wake(to);
        return;
    };
    if ON_SHARD.with(|s| s.get()) {
        OVERFLOW.with(|o| o.borrow_mut().push((to, n)));
        wake(to);
        return;
    }
    let mut n = n;
    loop {
        wake(to);
        std::thread::yield_now();
        match rings(to).ring.push(n) {
            Ok(()) => return wake(to),
            Err(back) if stopping() => {
                log::debug!("notice {back:?} dropped: shutting down");
                return;
            }
            Err(back) => n = back,
        }
    }
}

/// Retries this thread's overflowed notices; returns how many were delivered. Cheap when
/// there are none (one thread-local borrow).
pub fn retry_overflow<'r>(
    rings: &dyn Fn(ShardId) -> &'r NoticeRing,
    wake: &dyn Fn(ShardId),
) -> usize {
    OVERFLOW.with(|o| {
        let mut o = o.borrow_mut();
        if o.is_empty() {
            return 0;
        }
        let before = o.len();
        o.retain(|&(to, n)| {
            let pushed = rings(to).ring.push(n).is_ok();
            if pushed {
                wake(to);
            }
            !pushed
        });
        before - o.len()
    })
}

/// Notices this thread holds back (tests, diagnostics).
pub fn overflow_len() -> usize {
    OVERFLOW.with(|o| o.borrow().len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shards::store::BlobHandle;

    fn unpin(id: u32) -> Notice {
        Notice::Unpin(BlobHandle { id, tag: 1 })
    }

    #[test]
    fn a_full_ring_keeps_the_notice_on_a_shard_thread_until_there_is_room() {
        // A fresh thread, so its thread-locals start empty.
        std::thread::spawn(|| {
            mark_shard_thread();
            let rings = [NoticeRing::new(2)];
            let woken = Cell::new(0);
            let ring = |s: ShardId| &rings[s];
            let wake = |_| woken.set(woken.get() + 1);
            for i in 0..5 {
                deliver(&ring, &wake, &|| false, 0, unpin(i));
            }
            assert_eq!(rings[0].len(), 2, "the ring is bounded");
            assert_eq!(overflow_len(), 3, "the rest is kept, not lost");
            assert_eq!(retry_overflow(&ring, &wake), 0, "still full");
            let mut got = vec![rings[0].pop().unwrap(), rings[0].pop().unwrap()];
            assert_eq!(retry_overflow(&ring, &wake), 2);
            assert_eq!(overflow_len(), 1);
            while let Some(n) = rings[0].pop() {
                got.push(n);
            }
            assert_eq!(retry_overflow(&ring, &wake), 1);
            got.push(rings[0].pop().unwrap());
            assert_eq!(got, (0..5).map(unpin).collect::<Vec<_>>());
            assert_eq!(overflow_len(), 0);
            assert!(woken.get() >= 5);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_non_shard_thread_waits_for_room_or_shutdown() {
        let rings = [NoticeRing::new(1)];
        let ring = |s: ShardId| &rings[s];
        deliver(&ring, &|_| {}, &|| false, 0, unpin(1));
        // Full, and the server is stopping: the sender gives up instead of spinning forever.
        deliver(&ring, &|_| {}, &|| true, 0, unpin(2));
        assert_eq!(rings[0].len(), 1);
        assert_eq!(overflow_len(), 0, "a non-shard thread keeps no overflow");
        // Full, not stopping: the sender waits until the owner takes one (here the wake does).
        let popped = Cell::new(None);
        deliver(
            &ring,
            &|_| popped.set(popped.get().or_else(|| rings[0].pop())),
            &|| false,
            0,
            unpin(3),
        );
        assert_eq!(popped.get(), Some(unpin(1)));
        assert_eq!(rings[0].pop(), Some(unpin(3)));
    }
}
