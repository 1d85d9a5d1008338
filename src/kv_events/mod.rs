//! KV cache events in vLLM's wire format, so KV-aware routers (Dynamo, llm-d, vLLM tooling)
//! can subscribe to this server unchanged.
//!
//! Shards turn store events into [`KvEvent`]s and hand them to a bounded lock-free queue
//! ([`KvQueue`]) that never blocks them: past the soft capacity `stored` events are dropped
//! first; `removed` / `cleared` events only past the hard limit; every drop is counted by kind.
//! A publisher thread batches events by count and time, numbers the batches 0, 1, 2, … as it
//! sends them on a ZMQ PUB socket (`[topic, seq u64 BE, msgpack EventBatch]`), and keeps the
//! last batches for late subscribers on an optional ROUTER replay socket.
//!
//! The batch is encoded in one of vLLM's two wire generations ([`KvEncoding`], see
//! [`encode`]): real consumers decode with typed decoders, so each accepts exactly one of them.
//!
//! **Leadership epochs** (HA, [`leadership`]): only the leader publishes. The queue carries the
//! current leadership *epoch*; while this node does not lead, shards produce nothing and the
//! publisher sends nothing (its sockets stay bound). When the node wins a leadership,
//! [`KvQueue::begin_epoch`] queues an epoch marker ahead of every event of that leadership;
//! the publisher then starts the stream over: sequence numbers from 0 again, the replay buffer
//! emptied, and the epoch's first batch (`seq` 0) opens with an `AllBlocksCleared`, followed by
//! a `BlockStored` for every block the new leader holds. With HA off there is one epoch, 0,
//! for the process's life, and no marker.

pub mod encode;
pub mod leadership;

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_queue::SegQueue;

use crate::common::event::Event;
use crate::common::medium::Medium;
use crate::config::{KvEncoding, KvEventsConfig};
use crate::metrics::kv_events::{EventType, KvEventStats, medium_index};

/// One event on its way to subscribers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvEvent {
    Stored { hash: u64, medium: Medium },
    Removed { hash: u64, medium: Medium },
    Cleared,
}

impl KvEvent {
    fn kind(&self) -> EventType {
        match self {
            KvEvent::Stored { .. } => EventType::Stored,
            KvEvent::Removed { .. } => EventType::Removed,
            KvEvent::Cleared => EventType::Cleared,
        }
    }

    fn medium(&self) -> Option<Medium> {
        match *self {
            KvEvent::Stored { medium, .. } | KvEvent::Removed { medium, .. } => Some(medium),
            KvEvent::Cleared => None,
        }
    }
}

/// What travels from the shards to the publisher.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Queued {
    /// An event produced during leadership epoch `.0`.
    Event(u32, KvEvent),
    /// Leadership epoch `.0` begins here: the stream starts over.
    Epoch(u32),
}

/// The leadership word: the current epoch (upper bits) and whether this node publishes in it
/// (bit 0).
fn leadership_word(epoch: u32, active: bool) -> u64 {
    ((epoch as u64) << 1) | active as u64
}

/// The shards' side: a bounded, never-blocking queue to the publisher.
pub struct KvQueue {
    queue: SegQueue<Queued>,
    /// [`leadership_word`]: epoch 0 active with HA off; with HA on, inactive until this node
    /// wins a leadership.
    leadership: AtomicU64,
    size: AtomicUsize,
    soft: usize,
    hard: usize,
    /// Events per batch: the queue reaching this many wakes the publisher.
    batch_max: usize,
    stats: Arc<KvEventStats>,
    /// Written when the queue goes from empty to non-empty and when it fills a batch; the
    /// publisher polls it. Between the two the publisher sleeps until its batch is due, so a
    /// steady stream of events costs the shards one syscall and the publisher one wake-up
    /// per batch, not per event (it shares the shards' cores).
    wake: OwnedFd,
    stop: AtomicBool,
}

impl KvQueue {
    fn new(cfg: &KvEventsConfig, stats: Arc<KvEventStats>) -> std::io::Result<KvQueue> {
        // SAFETY: eventfd has no preconditions; the returned descriptor is owned here.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(KvQueue {
            queue: SegQueue::new(),
            size: AtomicUsize::new(0),
            soft: cfg.queue_capacity as usize,
            hard: cfg.hard_capacity.max(cfg.queue_capacity) as usize,
            batch_max: cfg.batch_max_events.max(1) as usize,
            stats,
            // SAFETY: `fd` is a fresh descriptor owned by nobody else.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
            stop: AtomicBool::new(false),
            leadership: AtomicU64::new(leadership_word(0, true)),
        })
    }

    /// Less than half the soft capacity is queued: a producer of a long burst (a new
    /// leader's re-announcement) waits for this between events.
    pub fn has_room_for_burst(&self) -> bool {
        self.size.load(Relaxed) < self.soft / 2
    }

    /// The current epoch and whether this node publishes in it.
    pub fn leadership(&self) -> (u32, bool) {
        let w = self.leadership.load(Acquire);
        ((w >> 1) as u32, w & 1 == 1)
    }

    /// Epoch `e` has ended: it is the current one and inactive, or a later one began.
    fn epoch_over(&self, e: u32) -> bool {
        let (now, active) = self.leadership();
        (now == e && !active) || (now.wrapping_sub(e) as i32) > 0
    }

    /// This node does not lead (any more): shards stop producing, and the publisher drops what
    /// is still queued or batched instead of sending it. Idempotent.
    pub fn end_epoch(&self) {
        let (epoch, active) = self.leadership();
        if active {
            self.leadership
                .store(leadership_word(epoch, false), Release);
            self.signal(usize::MAX);
        }
    }

    /// This node won a leadership: a new epoch begins. Its marker is queued before the epoch
    /// becomes active, so every event of the epoch follows it; it is never dropped (it does
    /// not count against the queue's limits). Returns the new epoch.
    pub fn begin_epoch(&self) -> u32 {
        let (epoch, _) = self.leadership();
        let next = epoch.wrapping_add(1);
        self.stats.count(usize::MAX, |c| &c.produced);
        let before = self.size.fetch_add(1, Relaxed);
        self.queue.push(Queued::Epoch(next));
        self.stats.queue_size.store((before + 1) as u64, Relaxed);
        self.leadership.store(leadership_word(next, true), Release);
        self.signal(usize::MAX);
        next
    }

    fn signal(&self, shard: usize) {
        self.stats.count(shard, |c| &c.wakeups);
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes to an eventfd we own; failure (counter overflow) is harmless.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
    }

    /// Turns a store event into a KV event and queues it. Never blocks; counts what it drops
    /// or skips in `shard`'s own counters. While this node does not lead (HA), nothing is
    /// produced.
    pub fn produce(&self, shard: usize, ev: &Event) {
        let (epoch, active) = self.leadership();
        if !active {
            return;
        }
        let kv = match *ev {
            Event::Stored { chunk, medium, .. } | Event::Removed { chunk, medium, .. } => {
                let Some(hash) = chunk else {
                    self.stats.count(shard, |c| &c.skipped_unparsed_keys);
                    return;
                };
                if matches!(ev, Event::Stored { .. }) {
                    KvEvent::Stored { hash, medium }
                } else {
                    KvEvent::Removed { hash, medium }
                }
            }
            Event::Cleared => KvEvent::Cleared,
            _ => return,
        };
        self.stats.count(shard, |c| &c.produced);
        let limit = if kv.kind() == EventType::Stored {
            self.soft
        } else {
            self.hard
        };
        let before = self.size.fetch_add(1, Relaxed);
        if before >= limit {
            self.size.fetch_sub(1, Relaxed);
            if kv.kind() == EventType::Stored {
                self.stats.count(shard, |c| &c.dropped_stored);
            } else {
                self.stats.count(shard, |c| &c.dropped_high_priority);
            }
            return;
        }
        self.queue.push(Queued::Event(epoch, kv));
        self.stats.queue_size.store((before + 1) as u64, Relaxed);
        if before == 0 || before + 1 == self.batch_max {
            self.signal(shard);
        }
    }

    fn pop(&self) -> Option<Queued> {
        let e = self.queue.pop()?;
        let left = self.size.fetch_sub(1, Relaxed) - 1;
        self.stats.queue_size.store(left as u64, Relaxed);
        Some(e)
    }
}

/// The running publisher: the queue shards write to, and its thread.
pub struct KvPublisher {
    pub queue: Arc<KvQueue>,
    thread: Option<JoinHandle<()>>,
}

impl KvPublisher {
    /// Binds the sockets and starts the publisher thread; an endpoint that cannot be bound
    /// is the one-line error that stops the start.
    pub fn start(cfg: KvEventsConfig, stats: Arc<KvEventStats>) -> Result<KvPublisher, String> {
        stats.enabled.store(true, Relaxed);
        stats.queue_capacity.store(cfg.queue_capacity, Relaxed);
        let queue = Arc::new(
            KvQueue::new(&cfg, stats.clone()).map_err(|e| format!("KV events: eventfd: {e}"))?,
        );
        let (tx, rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let q = queue.clone();
        let thread = std::thread::Builder::new()
            .name("mmc-kv-events".into())
            .spawn(move || {
                batch_scheduling();
                let sockets = match Sockets::bind(&cfg) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let _ = tx.send(Ok(()));
                stats.publisher_active.store(true, Relaxed);
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    Publisher::new(cfg, q, stats.clone(), sockets).run();
                }));
                stats.publisher_active.store(false, Relaxed);
                if res.is_err() {
                    log::error!("KV event publisher stopped after a panic");
                }
            })
            .map_err(|e| format!("KV events: cannot start the publisher thread: {e}"))?;
        match rx.recv() {
            Ok(Ok(())) => Ok(KvPublisher {
                queue,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err("KV events: the publisher thread exited during start".to_string()),
        }
    }

    /// Publishes what is queued, then stops the thread.
    pub fn stop(mut self) {
        self.queue.stop.store(true, Relaxed);
        // Not a shard: counted in the shared slot.
        self.queue.signal(usize::MAX);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Puts the calling thread (and the threads it starts: libzmq's I/O thread is created with the
/// first socket and inherits the policy) under `SCHED_BATCH`: same share of the CPU, but a
/// wake-up never preempts the running thread. The publisher usually shares a core with a
/// shard; preempting it at every batch would add the batch's work to the latency of the
/// requests that shard is serving, where running in the shard's idle moments costs nothing.
fn batch_scheduling() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain syscall on the calling thread (pid 0) with a valid parameter.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } != 0 {
        log::debug!(
            "KV events: SCHED_BATCH refused ({}); the publisher keeps the default policy",
            std::io::Error::last_os_error()
        );
    }
}

/// A socket of `kind` bound to `endpoint`, the value of `ock.mmc.kv_events.<key>`, with a
/// short linger and the send high-water mark `sndhwm` when given.
fn bound(
    ctx: &zmq::Context,
    kind: zmq::SocketType,
    sndhwm: Option<i32>,
    key: &str,
    endpoint: &str,
) -> Result<zmq::Socket, String> {
    let s = ctx.socket(kind).map_err(|e| format!("KV events: {e}"))?;
    if let Some(hwm) = sndhwm {
        let _ = s.set_sndhwm(hwm);
    }
    let _ = s.set_linger(100);
    s.bind(endpoint).map_err(|e| {
        format!("invalid value {endpoint:?} for ock.mmc.kv_events.{key}: cannot bind: {e}")
    })?;
    Ok(s)
}

struct Sockets {
    _ctx: zmq::Context,
    publisher: zmq::Socket,
    replay: Option<zmq::Socket>,
}

impl Sockets {
    fn bind(cfg: &KvEventsConfig) -> Result<Sockets, String> {
        let ctx = zmq::Context::new();
        // Slow subscribers lose messages past this many (PUB never blocks the sender).
        let publisher = bound(&ctx, zmq::PUB, Some(100_000), "endpoint", &cfg.endpoint)?;
        let replay = if cfg.replay_endpoint.is_empty() {
            None
        } else {
            let key = "replay_endpoint";
            Some(bound(&ctx, zmq::ROUTER, None, key, &cfg.replay_endpoint)?)
        };
        log::info!(
            "KV events: publishing on {}{}",
            cfg.endpoint,
            if cfg.replay_endpoint.is_empty() {
                String::new()
            } else {
                format!(", replay on {}", cfg.replay_endpoint)
            }
        );
        Ok(Sockets {
            _ctx: ctx,
            publisher,
            replay,
        })
    }
}

/// Replies to a replay request past its end.
const END_OF_REPLAY: [u8; 8] = [0xff; 8];

struct Publisher {
    cfg: KvEventsConfig,
    queue: Arc<KvQueue>,
    stats: Arc<KvEventStats>,
    sockets: Sockets,
    next_seq: u64,
    /// The leadership epoch being published (events of another are dropped).
    epoch: u32,
    /// The last published batches: (seq, payload).
    replay_buffer: VecDeque<(u64, Vec<u8>)>,
    batch: Vec<KvEvent>,
    payload: Vec<u8>,
}

impl Publisher {
    fn new(
        cfg: KvEventsConfig,
        queue: Arc<KvQueue>,
        stats: Arc<KvEventStats>,
        sockets: Sockets,
    ) -> Publisher {
        Publisher {
            batch: Vec::with_capacity(cfg.batch_max_events as usize),
            cfg,
            queue,
            stats,
            sockets,
            next_seq: 0,
            epoch: 0,
            replay_buffer: VecDeque::new(),
            payload: Vec::new(),
        }
    }

    fn run(&mut self) {
        let wake_fd: RawFd = self.queue.wake.as_raw_fd();
        let max = self.cfg.batch_max_events.max(1) as usize;
        let delay = Duration::from_millis(self.cfg.batch_max_delay_ms);
        // When the oldest event not yet published arrived (about: when its wake-up came).
        let mut first_at: Option<Instant> = None;
        loop {
            // Wait for events, replay requests, or the end of the batching delay (rounded up
            // to whole milliseconds, so that the wait never ends just before the batch is due).
            let timeout_ms = match first_at {
                Some(t) => delay.saturating_sub(t.elapsed()).as_micros().div_ceil(1000) as i64,
                None => 500,
            };
            let mut items = Vec::with_capacity(2);
            items.push(zmq::PollItem::from_fd(wake_fd, zmq::POLLIN));
            if let Some(r) = &self.sockets.replay {
                items.push(r.as_poll_item(zmq::POLLIN));
            }
            let _ = zmq::poll(&mut items, timeout_ms.max(0));
            let replay_ready = items.get(1).is_some_and(|i| i.is_readable());
            drop(items);
            let mut counter = [0u8; 8];
            // SAFETY: reading the eventfd's 8-byte counter into a local buffer (non-blocking).
            unsafe { libc::read(wake_fd, counter.as_mut_ptr().cast(), 8) };
            if replay_ready {
                self.serve_replays();
            }
            // Events stay queued until their batch is due or a whole batch is there: the
            // queue then does not go empty after every event, so producers do not wake this
            // thread for each one (they wake it when the queue leaves empty or fills a batch).
            let queued = self.queue.size.load(Relaxed);
            if queued > 0 {
                first_at.get_or_insert_with(Instant::now);
            }
            let due = first_at.is_some_and(|t| t.elapsed() >= delay);
            let stopping = self.queue.stop.load(Relaxed);
            let (_, leading) = self.queue.leadership();
            if !leading {
                // This node does not lead: what is left of an ended leadership is not sent.
                // A marker of a leadership that is beginning ends the discarding.
                self.discard_batch();
                while let Some(q) = self.queue.pop() {
                    match q {
                        Queued::Epoch(e) => {
                            self.start_epoch(e);
                            if !self.queue.epoch_over(e) {
                                break;
                            }
                            self.discard_batch();
                        }
                        Queued::Event(..) => self.stats.discarded_not_leader.inc(),
                    }
                }
                if self.batch.is_empty() {
                    first_at = None;
                }
            }
            if due || stopping || queued + self.batch.len() >= max {
                while let Some(q) = self.queue.pop() {
                    // An epoch that ended meanwhile (its end and the next begin both came
                    // between two looks at the word) sends nothing.
                    match q {
                        Queued::Epoch(e) => {
                            self.start_epoch(e);
                            if self.queue.epoch_over(e) {
                                self.discard_batch();
                            }
                        }
                        Queued::Event(e, ev) if e == self.epoch && !self.queue.epoch_over(e) => {
                            self.batch.push(ev)
                        }
                        Queued::Event(..) => self.stats.discarded_not_leader.inc(),
                    }
                    if self.batch.len() >= max {
                        self.publish();
                    }
                }
                if !self.batch.is_empty() && (due || stopping) {
                    self.publish();
                }
                // A partial batch left over keeps the time of the oldest event in it.
                if self.batch.is_empty() {
                    first_at = None;
                }
            }
            if stopping && self.queue.size.load(Relaxed) == 0 && self.batch.is_empty() {
                return;
            }
        }
    }

    /// Drops the batch being built (its events were never sent).
    fn discard_batch(&mut self) {
        self.stats.discarded_not_leader.add(self.batch.len() as u64);
        self.batch.clear();
    }

    /// Epoch `epoch` begins: the stream starts over (sequence 0, an empty replay buffer), and
    /// its first event is an `AllBlocksCleared`: a router drops what it believed this
    /// publisher held, and the `BlockStored`s that follow re-announce what the new leader
    /// holds.
    fn start_epoch(&mut self, epoch: u32) {
        self.discard_batch();
        self.epoch = epoch;
        self.next_seq = 0;
        self.replay_buffer.clear();
        self.batch.push(KvEvent::Cleared);
        self.stats.epochs.inc();
        log::info!("KV events: leadership epoch {epoch} begins (sequence 0, AllBlocksCleared)");
    }

    fn publish(&mut self) {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        encode::batch(
            &mut self.payload,
            self.cfg.encoding,
            ts,
            &self.batch,
            self.cfg.data_parallel_rank,
            self.cfg.block_size,
        );
        let seq = self.next_seq;
        self.next_seq += 1;
        let frames: [&[u8]; 3] = [self.cfg.topic.as_bytes(), &seq.to_be_bytes(), &self.payload];
        if let Err(e) = self.sockets.publisher.send_multipart(frames, zmq::DONTWAIT) {
            // PUB drops for slow subscribers itself; an error here is a broken socket.
            log::warn!("KV events: publishing batch {seq} failed: {e}");
        }
        let s = &self.stats;
        // This thread is the only writer of the published counters.
        s.published_batches.inc();
        s.published_events.add(self.batch.len() as u64);
        for e in &self.batch {
            s.published_by_type[e.kind() as usize].inc();
            s.published_by_medium[medium_index(e.medium())].inc();
        }
        s.last_sequence.store(seq, Relaxed);
        self.batch.clear();
        if self.cfg.replay_batches > 0 && self.sockets.replay.is_some() {
            if self.replay_buffer.len() as u64 >= self.cfg.replay_batches {
                self.replay_buffer.pop_front();
            }
            self.replay_buffer.push_back((seq, self.payload.clone()));
        }
    }

    /// Answers replay requests: `[identity, ("",) start_seq u64 BE]` → every buffered batch
    /// with `seq >= start` as `[identity, "", seq, payload]` (no topic frame: vLLM's replay
    /// client unpacks exactly `seq, payload`), then `[identity, "", 0xFFFFFFFFFFFFFFFF, ""]`.
    fn serve_replays(&mut self) {
        let Some(r) = &self.sockets.replay else {
            return;
        };
        while let Ok(frames) = r.recv_multipart(zmq::DONTWAIT) {
            let (Some(identity), Some(last)) = (frames.first(), frames.last()) else {
                continue;
            };
            let Ok(start) = <[u8; 8]>::try_from(last.as_slice()) else {
                log::debug!("KV events: ignoring a replay request without an 8-byte sequence");
                continue;
            };
            let start = u64::from_be_bytes(start);
            for (seq, payload) in self.replay_buffer.iter().filter(|(s, _)| *s >= start) {
                let out: [&[u8]; 4] = [identity, b"", &seq.to_be_bytes(), payload];
                let _ = r.send_multipart(out, 0);
            }
            let end: [&[u8]; 4] = [identity, b"", &END_OF_REPLAY, b""];
            let _ = r.send_multipart(end, 0);
        }
    }
}

#[cfg(test)]
mod tests;
