//! A shard's re-replication task: the objects its store queued for a new copy
//! (`store/rereplicate.rs`) are copied to another rank by the cluster's [`ObjectCopier`], a
//! few at a time, while any wait.
//!
//! [`ObjectCopier`]: super::ObjectCopier

use std::rc::Rc;
use std::time::Duration;

use super::Shard;

/// How long the task waits before asking its store again after it started copies.
const BUSY_WAIT: Duration = Duration::from_millis(10);

/// ... after it started none (no room or no rank for them, the byte rate spent, every slot
/// taken, or this meta not serving).
const IDLE_WAIT: Duration = Duration::from_millis(100);

impl Shard {
    /// From the tick: starts the re-replication task when objects wait for a copy and it is
    /// not running.
    pub(super) fn rereplicate(self: &Rc<Self>) {
        if self.rereplicating.get()
            || self.shared.front.copier.is_none()
            || !self.store.borrow().rereplication_waiting()
        {
            return;
        }
        self.rereplicating.set(true);
        let me = self.clone();
        monoio::spawn(async move {
            me.rereplicate_while_waiting().await;
            me.rereplicating.set(false);
        });
    }

    /// Starts the copies the store hands out, each as a task of its own, until nothing is
    /// queued or in flight. Only a serving meta copies: a standby's or a deposed leader's
    /// objects may be stale, and the ranks another leader's.
    async fn rereplicate_while_waiting(self: &Rc<Self>) {
        while self.store.borrow().rereplication_waiting() && !self.shared.is_shutting_down() {
            let (floors, moves) = if self.shared.ha.serving() {
                // Taken before the new blobs are allocated (`copies.rs` `copy_floor`).
                let floors = Rc::new(self.shared.membership.freed_logs.floors());
                (floors, self.store.borrow_mut().begin_rereplicate())
            } else {
                (Rc::default(), Vec::new())
            };
            self.after_store();
            let wait = if moves.is_empty() {
                IDLE_WAIT
            } else {
                BUSY_WAIT
            };
            for m in moves {
                let (me, floors) = (self.clone(), floors.clone());
                monoio::spawn(async move {
                    let ok = match &me.shared.front.copier {
                        Some(c) => c.copy(&me, &m.key, &m.from, &m.to, m.stamp, &floors).await,
                        None => false,
                    };
                    me.store.borrow_mut().finish_rereplicate(m.to.handle, ok);
                    me.after_store();
                });
            }
            monoio::time::sleep(wait).await;
        }
    }
}
