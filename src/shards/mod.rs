//! Shards: key ownership, the state each shard owns, and the messages between shards.
//!
//! The process runs one shard per core. Every key has exactly one owner shard
//! ([`shard_for`]); everything keyed lives on the owner in plain single-threaded structures,
//! so the per-key path takes no lock. A shard that receives a request for a key it does not
//! own sends the [`Command`] to the owner's inbox and awaits the [`Reply`] in its own.
//!
//! Cross-shard traffic is batched and wakes a shard only when it sleeps: a sender pushes into
//! the owner's lock-free queue and calls the owner's [`AtomicWaker`], which holds a waker only
//! while the owner's mailbox task is parked; the owner drains whole batches per pass and wakes
//! each requester once per batch. This module does no socket I/O.

pub mod command;
pub mod metadata;
pub mod runtime;

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use atomic_waker::AtomicWaker;
use crossbeam_queue::ArrayQueue;
use hashbrown::HashMap;

use crate::config::Config;
use crate::ha::HaView;
use crate::metrics::ShardStats;
pub use command::{Command, Reply};
use metadata::MetadataStore;

pub type ShardId = usize;

/// Fixed seed of the key → shard hash. Fixed (not random) so that a key's owner is the same
/// in every run with the same shard count, which makes placement reproducible in tests and
/// benchmarks. Per-shard maps use randomly seeded hashes, so this does not open hash flooding.
const SHARD_HASH_SEED: u64 = 0x6d6d_635f_7368_6172; // "mmc_shar"

/// The owner shard of `key` among `shards` shards: a seeded 64-bit hash reduced to the range by
/// multiply-high (uniform like `% shards`, without a division).
#[inline]
pub fn shard_for(key: &[u8], shards: usize) -> ShardId {
    let h = xxhash_rust::xxh3::xxh3_64_with_seed(key, SHARD_HASH_SEED);
    ((h as u128 * shards as u128) >> 64) as usize
}

/// A request travelling to its owner shard.
pub struct Envelope {
    from: ShardId,
    id: u64,
    cmd: Command,
}

/// A reply travelling back to the requesting shard.
pub struct ReplyEnvelope {
    id: u64,
    reply: Reply,
}

/// The part of a shard that other shards may touch: its inboxes, its waker and its
/// statistics. Everything else about a shard is reachable only from its own thread.
pub struct RemoteShard {
    requests: ArrayQueue<Envelope>,
    /// Sized to the requester's outstanding limit, so a reply always finds room: a shard never
    /// has more requests in flight than its reply queue holds.
    replies: ArrayQueue<ReplyEnvelope>,
    /// Holds the mailbox task's waker only while that task is parked.
    waker: AtomicWaker,
    pub stats: ShardStats,
}

impl RemoteShard {
    fn new(inbox: usize, outstanding: usize) -> RemoteShard {
        RemoteShard {
            requests: ArrayQueue::new(inbox),
            replies: ArrayQueue::new(outstanding),
            waker: AtomicWaker::new(),
            stats: ShardStats::default(),
        }
    }

    /// Wakes the shard's mailbox task if it sleeps; free when it is already awake.
    pub fn wake(&self) {
        self.waker.wake();
    }

    /// Messages waiting in this shard's inboxes.
    pub fn inbox_depth(&self) -> usize {
        self.requests.len() + self.replies.len()
    }
}

/// Process-wide state shared by all shards. Immutable after start except for the atomics.
pub struct Cluster {
    pub config: Config,
    pub shards: Box<[RemoteShard]>,
    pub ha: HaView,
    /// Shards whose listener accepts connections. `/ready` answers 200 once this equals the
    /// shard count.
    pub accepting: AtomicUsize,
    /// Set once by the signal handler; shards then stop accepting and drain.
    pub shutting_down: AtomicBool,
    /// Shards that have closed all their connections during shutdown. A shard keeps serving
    /// its mailbox until every shard has drained, so no cross-shard request is left hanging.
    pub drained: AtomicUsize,
    pub started: Instant,
}

impl Cluster {
    pub fn new(config: Config, shard_count: usize) -> Arc<Cluster> {
        assert!(shard_count > 0);
        let inbox = config.shard.inbox_capacity as usize;
        let outstanding = config.shard.max_outstanding as usize;
        let ha = HaView::standalone(&config.advertise_address);
        Arc::new(Cluster {
            shards: (0..shard_count)
                .map(|_| RemoteShard::new(inbox, outstanding))
                .collect(),
            config,
            ha,
            accepting: AtomicUsize::new(0),
            shutting_down: AtomicBool::new(false),
            drained: AtomicUsize::new(0),
            started: Instant::now(),
        })
    }

    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    pub fn is_ready(&self) -> bool {
        self.accepting.load(Ordering::Acquire) == self.shards.len()
            && !self.shutting_down.load(Ordering::Acquire)
    }

    /// Starts the graceful shutdown: every shard stops accepting and drains.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        for s in self.shards.iter() {
            s.wake();
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }
}

/// A cheap clock refreshed by the shard's housekeeping tick, so hot paths read a `Cell`
/// instead of calling the clock: `now_ms` for timeouts and leases, `unix_secs` for the
/// `timestamp` of error envelopes.
pub struct Clock {
    started: Instant,
    now_ms: Cell<u64>,
    unix_secs: Cell<u64>,
}

impl Clock {
    fn new(started: Instant) -> Clock {
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

/// A reply slot of a request sent to another shard.
enum Slot {
    Waiting(Option<Waker>),
    Ready(Reply),
}

/// The shard-local context: the state this shard owns and its end of the mailboxes. Lives on
/// the shard's thread behind an `Rc`; no other thread can reach it.
pub struct Shard {
    pub id: ShardId,
    pub cluster: Arc<Cluster>,
    pub clock: Clock,
    metadata: RefCell<MetadataStore>,
    /// Requests sent to other shards whose reply has not been consumed, by request id. A
    /// requester that gives up (its connection closed) removes its slot; the late reply is
    /// then dropped on arrival.
    pending: RefCell<HashMap<u64, Slot>>,
    next_request_id: Cell<u64>,
    /// Requests sent and not yet answered, including abandoned ones: bounds the reply queue.
    in_flight: Cell<usize>,
    /// The shard's main task, waiting for the shutdown signal (which arrives as a mailbox
    /// wake-up).
    shutdown_waker: RefCell<Option<Waker>>,
}

impl Shard {
    pub fn new(id: ShardId, cluster: Arc<Cluster>) -> Rc<Shard> {
        let shards = cluster.shard_count() as u64;
        let metadata_budget = cluster.config.metadata.max_total_bytes.div_ceil(shards);
        Rc::new(Shard {
            id,
            clock: Clock::new(cluster.started),
            metadata: RefCell::new(MetadataStore::new(metadata_budget)),
            pending: RefCell::new(HashMap::new()),
            next_request_id: Cell::new(0),
            in_flight: Cell::new(0),
            shutdown_waker: RefCell::new(None),
            cluster,
        })
    }

    pub fn remote(&self) -> &RemoteShard {
        &self.cluster.shards[self.id]
    }

    pub fn stats(&self) -> &ShardStats {
        &self.remote().stats
    }

    pub fn owner_of(&self, key: &[u8]) -> ShardId {
        shard_for(key, self.cluster.shard_count())
    }

    /// Runs `cmd` on the owner of its key: here when this shard owns it, else through the
    /// owner's inbox.
    pub async fn execute(&self, cmd: Command) -> Reply {
        let owner = self.owner_of(cmd.key());
        if owner == self.id {
            self.apply(cmd)
        } else {
            self.send(owner, cmd).await
        }
    }

    /// Applies a command to this shard's own state.
    fn apply(&self, cmd: Command) -> Reply {
        let mut md = self.metadata.borrow_mut();
        let reply = match cmd {
            Command::MetadataGet { key } => md.get(&key),
            Command::MetadataPut { key, value } => md.put(key, value),
            Command::MetadataDelete { key } => md.delete(&key),
        };
        let stats = self.stats();
        stats.metadata_keys.set(md.len() as i64);
        stats.metadata_bytes.set(md.bytes_used() as i64);
        reply
    }

    async fn send(&self, owner: ShardId, cmd: Command) -> Reply {
        let stats = self.stats();
        if self.in_flight.get() >= self.cluster.config.shard.max_outstanding as usize {
            stats.overload_rejections.inc();
            return Reply::Overloaded;
        }
        let id = self.next_request_id.get();
        self.next_request_id.set(id + 1);
        let target = &self.cluster.shards[owner];
        if target
            .requests
            .push(Envelope {
                from: self.id,
                id,
                cmd,
            })
            .is_err()
        {
            stats.overload_rejections.inc();
            return Reply::Overloaded;
        }
        stats.cross_shard_requests.inc();
        self.in_flight.set(self.in_flight.get() + 1);
        self.pending.borrow_mut().insert(id, Slot::Waiting(None));
        target.wake();
        ReplyFuture { shard: self, id }.await
    }

    /// Drains both inboxes once (up to `budget` requests). Returns how many messages it
    /// handled.
    fn drain(&self, budget: usize) -> usize {
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
        let mut wake_list = WakeSet::new(self.cluster.shard_count());
        let mut served = 0;
        while served < budget {
            let Some(Envelope { from, id, cmd }) = me.requests.pop() else {
                break;
            };
            served += 1;
            let reply = self.apply(cmd);
            let back = &self.cluster.shards[from];
            // Cannot fail: the requester keeps at most `max_outstanding` requests in flight
            // and its reply queue holds that many.
            if back.replies.push(ReplyEnvelope { id, reply }).is_err() {
                unreachable!("reply queue of shard {from} overflowed its outstanding bound");
            }
            wake_list.insert(from);
        }
        for s in wake_list.iter() {
            self.cluster.shards[s].wake();
        }
        handled + served
    }

    /// The mailbox task: drains the inboxes whenever another shard sends something, parking
    /// (with its waker registered) when both are empty.
    pub fn mailbox(self: &Rc<Self>) -> impl Future<Output = ()> + 'static {
        const BUDGET: usize = 256;
        let shard = self.clone();
        let spin = Duration::from_micros(shard.cluster.config.shard.idle_spin_us);
        std::future::poll_fn(move |cx| {
            if shard.cluster.is_shutting_down() {
                if let Some(w) = shard.shutdown_waker.borrow_mut().take() {
                    w.wake();
                }
            }
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
                // A message pushed between the drain and the registration found no waker;
                // look again before sleeping.
                if shard.remote().inbox_depth() == 0 {
                    return Poll::Pending;
                }
            }
        })
    }

    /// Busy-polls the reply queue for up to `spin` while replies are expected, to save the
    /// park/unpark round trip of a sleeping core. True when a reply arrived.
    fn spin_for_replies(&self, spin: Duration) -> bool {
        let until = Instant::now() + spin;
        while Instant::now() < until {
            if !self.remote().replies.is_empty() {
                return true;
            }
            std::hint::spin_loop();
        }
        false
    }

    /// Resolves once the process begins its graceful shutdown.
    pub fn shutdown_requested(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            if self.cluster.is_shutting_down() {
                return Poll::Ready(());
            }
            *self.shutdown_waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
    }

    /// Number of metadata keys this shard owns.
    pub fn metadata_len(&self) -> usize {
        self.metadata.borrow().len()
    }
}

/// Awaits the reply of a request sent to another shard.
struct ReplyFuture<'a> {
    shard: &'a Shard,
    id: u64,
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
struct WakeSet {
    bits: Vec<u64>,
}

impl WakeSet {
    fn new(shards: usize) -> WakeSet {
        WakeSet {
            bits: vec![0; shards.div_ceil(64)],
        }
    }

    fn insert(&mut self, s: ShardId) {
        self.bits[s / 64] |= 1 << (s % 64);
    }

    fn iter(&self) -> impl Iterator<Item = ShardId> + '_ {
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
    fn shard_for_is_stable_and_spreads_keys() {
        assert_eq!(shard_for(b"anything", 1), 0);
        let mut counts = [0usize; 4];
        for i in 0..40_000 {
            counts[shard_for(format!("key-{i}").as_bytes(), 4)] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "uneven spread {counts:?}");
        }
        // Fixed seed: the same key maps to the same shard in every process.
        assert_eq!(shard_for(b"demo_key", 4), shard_for(b"demo_key", 4));
    }

    #[test]
    fn wake_set_lists_each_member_once() {
        let mut w = WakeSet::new(130);
        for s in [3, 3, 64, 129, 0] {
            w.insert(s);
        }
        assert_eq!(w.iter().collect::<Vec<_>>(), vec![0, 3, 64, 129]);
    }
}
