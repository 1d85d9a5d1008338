//! The mailbox: handing commands to their owner shard (locally or through its bounded
//! inbox), replies back to the requester, notices, and the task that drains them.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::apply::Applied;
use super::{Command, Notice, Reply, Shard, ShardId};
use crate::common::error_kind::{ErrorKind, Refusal};

/// A request travelling to its owner shard.
pub struct Envelope {
    pub(super) from: ShardId,
    pub(super) id: u64,
    pub(super) cmd: Command,
}

/// A reply travelling back to the requesting shard.
pub struct ReplyEnvelope {
    pub(super) id: u64,
    pub(super) reply: Reply,
}

/// A reply slot of a request sent to another shard.
pub(super) enum Slot {
    Waiting(Option<Waker>),
    Ready(Reply),
}

/// A command handed to its owner: already answered, or awaiting the owner.
pub enum Submitted<'a> {
    Ready(Reply),
    Local(Pin<Box<dyn Future<Output = Reply>>>),
    Remote(ReplyFuture<'a>),
}

impl Submitted<'_> {
    pub async fn wait(self) -> Reply {
        match self {
            Submitted::Ready(r) => r,
            Submitted::Local(f) => f.await,
            Submitted::Remote(f) => f.await,
        }
    }
}

impl Shard {
    /// Runs a keyed command on the owner of its key.
    pub async fn execute(self: &Rc<Self>, cmd: Command) -> Reply {
        let owner = self.owner_of(cmd.key().expect("a keyed command"));
        self.submit(owner, cmd).wait().await
    }

    /// A `/metadata` read answered here when this shard owns the key (what
    /// `Command::MetadataGet` does on its owner, without the command); else `Err(owner)`.
    pub fn metadata_get_here(&self, key: &[u8]) -> Result<Reply, ShardId> {
        let owner = self.owner_of(key);
        if owner == self.id {
            Ok(self.metadata.borrow().get(key))
        } else {
            Err(owner)
        }
    }

    /// Hands `cmd` to shard `owner` without waiting, so several owners work in parallel.
    pub fn submit(self: &Rc<Self>, owner: ShardId, cmd: Command) -> Submitted<'_> {
        if owner == self.id {
            return match self.try_apply(cmd) {
                Applied::Now(r) => Submitted::Ready(r),
                Applied::Later(f) => Submitted::Local(f),
            };
        }
        match self.send(owner, cmd) {
            Some(f) => Submitted::Remote(f),
            None => Submitted::Ready(Reply::Overloaded),
        }
    }

    /// Runs `cmds` on their owners in parallel (grouped per owner) and returns the replies in
    /// the order of `cmds`.
    pub async fn execute_many(self: &Rc<Self>, cmds: Vec<Command>) -> Vec<Reply> {
        let n = self.shared.shard_count();
        let mut groups: Vec<Vec<(usize, Command)>> = (0..n).map(|_| Vec::new()).collect();
        let total = cmds.len();
        for (i, c) in cmds.into_iter().enumerate() {
            let owner = self.owner_of(c.key().expect("a keyed command"));
            groups[owner].push((i, c));
        }
        let mut order: Vec<Vec<usize>> = Vec::with_capacity(n);
        let mut submitted = Vec::with_capacity(n);
        for (owner, g) in groups.into_iter().enumerate() {
            if g.is_empty() {
                continue;
            }
            let (idx, cmds): (Vec<usize>, Vec<Command>) = g.into_iter().unzip();
            order.push(idx);
            submitted.push(self.submit(owner, Command::Many(cmds)));
        }
        let mut out: Vec<Option<Reply>> = (0..total).map(|_| None).collect();
        for (idx, s) in order.into_iter().zip(submitted) {
            match s.wait().await {
                Reply::Many(replies) => {
                    for (i, r) in idx.into_iter().zip(replies) {
                        out[i] = Some(r);
                    }
                }
                other => {
                    // The whole group failed to reach its owner (overload): every item gets
                    // that answer.
                    let overloaded = matches!(other, Reply::Overloaded);
                    for i in idx {
                        out[i] = Some(if overloaded {
                            Reply::Overloaded
                        } else {
                            Reply::Refused(Refusal::of(ErrorKind::Failed))
                        });
                    }
                }
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or(Reply::Overloaded))
            .collect()
    }

    /// Runs a per-shard command on every shard in parallel; replies in shard order.
    pub async fn broadcast(self: &Rc<Self>, make: impl Fn() -> Command) -> Vec<Reply> {
        let submitted: Vec<Submitted<'_>> = (0..self.shared.shard_count())
            .map(|s| self.submit(s, make()))
            .collect();
        let mut out = Vec::with_capacity(submitted.len());
        for s in submitted {
            out.push(s.wait().await);
        }
        out
    }

    /// Sends `cmd` to `owner`; `None` when the owner's inbox (or our outstanding limit) is
    /// full, which the caller answers as overload.
    pub(super) fn send(&self, owner: ShardId, cmd: Command) -> Option<ReplyFuture<'_>> {
        let stats = self.stats();
        if self.in_flight.get() >= self.shared.config.shard.max_outstanding as usize {
            return None;
        }
        let id = self.next_request_id.get();
        self.next_request_id.set(id + 1);
        let target = &self.shared.shards[owner];
        if target
            .requests
            .push(Envelope {
                from: self.id,
                id,
                cmd,
            })
            .is_err()
        {
            return None;
        }
        stats.cross_shard_requests.inc();
        self.in_flight.set(self.in_flight.get() + 1);
        self.pending.borrow_mut().insert(id, Slot::Waiting(None));
        target.wake();
        Some(ReplyFuture { shard: self, id })
    }

    pub(super) fn push_reply(&self, to: ShardId, id: u64, reply: Reply) {
        // Cannot fail: the requester keeps at most `max_outstanding` requests in flight and
        // its reply queue holds that many.
        if self.shared.shards[to]
            .replies
            .push(ReplyEnvelope { id, reply })
            .is_err()
        {
            unreachable!("reply queue of shard {to} overflowed its outstanding bound");
        }
    }

    pub(super) fn handle_notice(&self, n: Notice) {
        match n {
            Notice::Unpin(h) => self.store.borrow_mut().unpin(h),
            Notice::Abort(obj) => {
                self.store.borrow_mut().commit(obj, false);
            }
        }
    }

    /// Drains the inboxes once (up to `budget` requests). Returns how many messages it
    /// handled.
    pub(super) fn drain(self: &Rc<Self>, budget: usize) -> usize {
        let me = self.remote();
        let mut handled = 0;
        // Replies first: they complete work already paid for and free outstanding slots.
        while let Some(ReplyEnvelope { id, reply }) = me.replies.pop() {
            handled += 1;
            self.in_flight.set(self.in_flight.get() - 1);
            let mut pending = self.pending.borrow_mut();
            if let Some(slot) = pending.get_mut(&id) {
                if let Slot::Waiting(Some(w)) = std::mem::replace(slot, Slot::Ready(reply)) {
                    w.wake();
                }
            }
        }
        handled += self.shared.retry_notices();
        let mut notices = 0;
        while let Some(n) = me.notices.pop() {
            handled += 1;
            notices += 1;
            self.handle_notice(n);
        }
        if notices > 0 {
            self.after_store();
        }
        let mut wake_list = WakeSet::new(self.shared.shard_count());
        let mut served = 0;
        while served < budget {
            let Some(Envelope { from, id, cmd }) = me.requests.pop() else {
                break;
            };
            served += 1;
            match self.try_apply(cmd) {
                Applied::Now(reply) => {
                    self.push_reply(from, id, reply);
                    wake_list.insert(from);
                }
                Applied::Later(fut) => {
                    let me = self.clone();
                    monoio::spawn(async move {
                        let reply = fut.await;
                        me.push_reply(from, id, reply);
                        me.shared.shards[from].wake();
                    });
                }
            }
        }
        for s in wake_list.iter() {
            self.shared.shards[s].wake();
        }
        handled + served
    }

    /// The mailbox task: drains the inboxes whenever another shard sends something, parking
    /// (with its waker registered) when both are empty.
    pub fn mailbox(self: &Rc<Self>) -> impl Future<Output = ()> + 'static {
        const BUDGET: usize = 256;
        let shard = self.clone();
        let spin = Duration::from_micros(shard.shared.config.shard.idle_spin_us);
        std::future::poll_fn(move |cx| {
            shard.wake_shutdown_waiter();
            loop {
                let handled = shard.drain(BUDGET);
                if handled >= BUDGET {
                    // Let connection tasks run between large batches.
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                if handled > 0 {
                    continue;
                }
                if !spin.is_zero() && shard.in_flight.get() > 0 && shard.spin_for_replies(spin) {
                    continue;
                }
                shard.remote().waker.register(cx.waker());
                // A message pushed, or the shutdown begun, between the drain and the
                // registration found no waker: look again before sleeping.
                shard.wake_shutdown_waiter();
                if shard.remote().inbox_depth() == 0 {
                    return Poll::Pending;
                }
            }
        })
    }

    /// Busy-polls the reply queue for up to `spin` while replies are expected, to save the
    /// park/unpark round trip of a sleeping core. True when a reply arrived.
    pub(super) fn spin_for_replies(&self, spin: Duration) -> bool {
        let until = Instant::now() + spin;
        while Instant::now() < until {
            if !self.remote().replies.is_empty() {
                return true;
            }
            std::hint::spin_loop();
        }
        false
    }
}

/// Awaits the reply of a request sent to another shard.
pub struct ReplyFuture<'a> {
    pub(super) shard: &'a Shard,
    pub(super) id: u64,
}

impl Future for ReplyFuture<'_> {
    type Output = Reply;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Reply> {
        let mut pending = self.shard.pending.borrow_mut();
        match pending.get_mut(&self.id) {
            Some(Slot::Waiting(w)) => {
                if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *w = Some(cx.waker().clone());
                }
                Poll::Pending
            }
            Some(Slot::Ready(_)) => match pending.remove(&self.id) {
                Some(Slot::Ready(r)) => Poll::Ready(r),
                _ => unreachable!(),
            },
            None => unreachable!("reply slot {} vanished while awaited", self.id),
        }
    }
}

impl Drop for ReplyFuture<'_> {
    fn drop(&mut self) {
        // Abandoned (or already consumed, then this is a no-op): the reply, when it comes, is
        // dropped by the mailbox because the slot is gone.
        self.shard.pending.borrow_mut().remove(&self.id);
    }
}

/// A small set of shard ids, to wake each requester once per drained batch.
pub(super) struct WakeSet {
    pub(super) bits: Vec<u64>,
}

impl WakeSet {
    pub(super) fn new(shards: usize) -> WakeSet {
        WakeSet {
            bits: vec![0; shards.div_ceil(64)],
        }
    }

    pub(super) fn insert(&mut self, s: ShardId) {
        self.bits[s / 64] |= 1 << (s % 64);
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = ShardId> + '_ {
        self.bits.iter().enumerate().flat_map(|(w, &word)| {
            (0..64)
                .filter(move |b| word & (1 << b) != 0)
                .map(move |b| w * 64 + b)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_set_lists_each_member_once() {
        let mut w = WakeSet::new(130);
        for s in [3, 3, 64, 129, 0] {
            w.insert(s);
        }
        assert_eq!(w.iter().collect::<Vec<_>>(), vec![0, 3, 64, 129]);
    }
}
