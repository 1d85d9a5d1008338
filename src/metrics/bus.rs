//! The event bus (LMCache's observability design, thread-per-core shaped): the store publishes
//! lifecycle events into a bounded per-shard queue without ever blocking; a drain task on the
//! same shard hands them to subscribers (tier metrics, logs). The bus watches itself: queue
//! depth, drain lag, dropped events, and subscriber panics, caught and counted by name.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use super::hist::{BucketHistogram, GBS_BUCKETS, SECONDS_BUCKETS};
use super::{Counter, Gauge};
use crate::common::event::Event;
use crate::common::local_event::LocalEvent;

/// Tier metrics under LMCache's names (memory media = L1, SSD = L2), per shard, written by
/// the tier subscriber on the shard's thread.
pub struct TierStats {
    pub l1_read_chunks: Counter,
    pub l1_write_chunks: Counter,
    pub l1_evicted_chunks: Counter,
    pub l2_evicted_chunks: Counter,
    pub l2_store_submitted: Counter,
    pub l2_store_completed: Counter,
    pub l2_store_failed: Counter,
    pub l2_load_submitted: Counter,
    pub l2_load_completed: Counter,
    pub l2_load_failed: Counter,
    pub inflight_l2_stores: Gauge,
    pub inflight_l2_loads: Gauge,
    pub inflight_load_bytes: Gauge,
    pub active_prefetch_jobs: Gauge,
    pub l1_chunk_lifetime: BucketHistogram,
    pub l1_chunk_idle_before_evict: BucketHistogram,
    pub l2_store_throughput: BucketHistogram,
    pub l2_load_throughput: BucketHistogram,
}

impl Default for TierStats {
    fn default() -> Self {
        TierStats {
            l1_read_chunks: Counter::default(),
            l1_write_chunks: Counter::default(),
            l1_evicted_chunks: Counter::default(),
            l2_evicted_chunks: Counter::default(),
            l2_store_submitted: Counter::default(),
            l2_store_completed: Counter::default(),
            l2_store_failed: Counter::default(),
            l2_load_submitted: Counter::default(),
            l2_load_completed: Counter::default(),
            l2_load_failed: Counter::default(),
            inflight_l2_stores: Gauge::default(),
            inflight_l2_loads: Gauge::default(),
            inflight_load_bytes: Gauge::default(),
            active_prefetch_jobs: Gauge::default(),
            l1_chunk_lifetime: BucketHistogram::new(SECONDS_BUCKETS),
            l1_chunk_idle_before_evict: BucketHistogram::new(SECONDS_BUCKETS),
            l2_store_throughput: BucketHistogram::new(GBS_BUCKETS),
            l2_load_throughput: BucketHistogram::new(GBS_BUCKETS),
        }
    }
}

/// Subscribers the bus knows by name (for the panic counters). A subscriber's series are
/// exported only while it is installed ([`BusStats::installed`]): the test subscriber's name
/// never appears in a production `/metrics`.
pub const SUBSCRIBERS: &[&str] = &[
    "TierMetricsSubscriber",
    "LoggingSubscriber",
    "PanickingTestSubscriber",
];

/// The bus's own health, per shard.
#[derive(Default)]
pub struct BusStats {
    pub published: Counter,
    pub delivered: Counter,
    pub dropped: Counter,
    pub queue_depth: Gauge,
    /// Milliseconds (process clock) at which the oldest queued event was published; 0 when
    /// the queue is empty.
    pub oldest_ms: Gauge,
    pub subscriber_panics: [Counter; 3],
    /// Which of [`SUBSCRIBERS`] this shard's bus delivers to (set once, when the bus is built).
    pub installed: [std::sync::atomic::AtomicBool; 3],
}

impl BusStats {
    /// Whether the subscriber `id` (index into [`SUBSCRIBERS`]) is installed on this bus.
    pub fn is_installed(&self, id: usize) -> bool {
        self.installed[id].load(std::sync::atomic::Ordering::Relaxed)
    }
}

pub trait Subscriber {
    /// Index into [`SUBSCRIBERS`].
    fn id(&self) -> usize;
    fn on_event(&mut self, ev: &Event);
}

/// Updates [`TierStats`].
pub struct TierMetricsSubscriber {
    pub stats: Arc<TierStats>,
}

/// The end of an SSD transfer of `bytes` that took `micros`: completed (its throughput in
/// GB/s observed) or failed.
fn transfer_ended(
    ok: bool,
    bytes: u64,
    micros: u64,
    completed: &Counter,
    failed: &Counter,
    throughput: &BucketHistogram,
) {
    if ok {
        completed.inc();
        throughput.observe(bytes as f64 / (micros.max(1) as f64 / 1e6) / 1e9);
    } else {
        failed.inc();
    }
}

impl Subscriber for TierMetricsSubscriber {
    fn id(&self) -> usize {
        0
    }

    fn on_event(&mut self, ev: &Event) {
        let s = &self.stats;
        match *ev {
            Event::Stored { medium, .. } if medium.is_memory() => s.l1_write_chunks.inc(),
            Event::Read { .. } => s.l1_read_chunks.inc(),
            Event::Evicted {
                medium,
                lifetime_ms,
                idle_ms,
                ..
            } => {
                if medium.is_memory() {
                    s.l1_evicted_chunks.inc();
                    s.l1_chunk_lifetime.observe(lifetime_ms as f64 / 1000.0);
                    s.l1_chunk_idle_before_evict
                        .observe(idle_ms as f64 / 1000.0);
                } else {
                    s.l2_evicted_chunks.inc();
                }
            }
            Event::FlushStarted { .. } => {
                s.l2_store_submitted.inc();
                s.inflight_l2_stores.add(1);
            }
            Event::Flushed { bytes, ok, micros } => {
                s.inflight_l2_stores.add(-1);
                let (done, failed) = (&s.l2_store_completed, &s.l2_store_failed);
                transfer_ended(ok, bytes, micros, done, failed, &s.l2_store_throughput);
            }
            Event::RewarmStarted { bytes, prefetch } => {
                s.l2_load_submitted.inc();
                s.inflight_l2_loads.add(1);
                s.inflight_load_bytes.add(bytes as i64);
                if prefetch {
                    s.active_prefetch_jobs.add(1);
                }
            }
            Event::Rewarmed {
                bytes,
                ok,
                micros,
                prefetch,
            } => {
                s.inflight_l2_loads.add(-1);
                s.inflight_load_bytes.add(-(bytes as i64));
                if prefetch {
                    s.active_prefetch_jobs.add(-1);
                }
                let (done, failed) = (&s.l2_load_completed, &s.l2_load_failed);
                transfer_ended(ok, bytes, micros, done, failed, &s.l2_load_throughput);
            }
            _ => {}
        }
    }
}

/// Logs tier movements at debug level.
pub struct LoggingSubscriber {
    pub shard: usize,
}

impl Subscriber for LoggingSubscriber {
    fn id(&self) -> usize {
        1
    }

    fn on_event(&mut self, ev: &Event) {
        match ev {
            Event::Evicted { .. }
            | Event::Flushed { .. }
            | Event::Rewarmed { .. }
            | Event::Cleared => {
                log::debug!("shard {}: {ev:?}", self.shard)
            }
            _ => {}
        }
    }
}

/// A subscriber that panics on evictions, to prove that a failing subscriber is contained and
/// counted. Only in unit tests and debug builds (test hook `MMC_TEST_PANICKING_SUBSCRIBER=1`,
/// honoured by a debug build only): a release build does not contain it.
#[cfg(any(test, debug_assertions))]
pub struct PanickingTestSubscriber;

#[cfg(any(test, debug_assertions))]
impl Subscriber for PanickingTestSubscriber {
    fn id(&self) -> usize {
        2
    }

    fn on_event(&mut self, ev: &Event) {
        if matches!(ev, Event::Evicted { .. }) {
            panic!("PanickingTestSubscriber: injected failure");
        }
    }
}

thread_local! {
    static IN_SUBSCRIBER: Cell<bool> = const { Cell::new(false) };
}

/// True while a subscriber runs on this thread (the panic hook then lets the bus contain the
/// panic instead of stopping the process).
pub fn in_subscriber() -> bool {
    IN_SUBSCRIBER.with(|c| c.get())
}

/// One shard's bus.
pub struct EventBus {
    queue: RefCell<VecDeque<(u64, Event)>>,
    capacity: usize,
    subscribers: RefCell<Vec<Box<dyn Subscriber>>>,
    signal: LocalEvent,
    stats: Arc<BusStats>,
    /// Subscribers that panicked once (logged once each).
    logged: Cell<u8>,
}

impl EventBus {
    pub fn new(
        capacity: usize,
        stats: Arc<BusStats>,
        subscribers: Vec<Box<dyn Subscriber>>,
    ) -> EventBus {
        for s in &subscribers {
            stats.installed[s.id()].store(true, std::sync::atomic::Ordering::Relaxed);
        }
        EventBus {
            queue: RefCell::new(VecDeque::with_capacity(capacity.min(4096))),
            capacity,
            subscribers: RefCell::new(subscribers),
            signal: LocalEvent::default(),
            stats,
            logged: Cell::new(0),
        }
    }

    /// Publishes an event; never blocks: a full queue drops it (counted).
    pub fn publish(&self, now_ms: u64, ev: Event) {
        let mut q = self.queue.borrow_mut();
        self.stats.published.inc();
        if q.len() >= self.capacity {
            self.stats.dropped.inc();
            return;
        }
        if q.is_empty() {
            self.stats.oldest_ms.set(now_ms as i64);
        }
        q.push_back((now_ms, ev));
        self.stats.queue_depth.set(q.len() as i64);
        drop(q);
        self.signal.notify_all();
    }

    /// Delivers everything queued to every subscriber.
    pub fn drain(&self) {
        loop {
            let Some((_, ev)) = self.queue.borrow_mut().pop_front() else {
                break;
            };
            let mut subs = self.subscribers.borrow_mut();
            for sub in subs.iter_mut() {
                IN_SUBSCRIBER.with(|c| c.set(true));
                let res = std::panic::catch_unwind(AssertUnwindSafe(|| sub.on_event(&ev)));
                IN_SUBSCRIBER.with(|c| c.set(false));
                if res.is_err() {
                    let id = sub.id();
                    self.stats.subscriber_panics[id].inc();
                    if self.logged.get() & (1 << id) == 0 {
                        self.logged.set(self.logged.get() | 1 << id);
                        log::error!(
                            "event bus: subscriber {} panicked; it keeps receiving events and further panics are counted",
                            SUBSCRIBERS[id]
                        );
                    }
                }
            }
            self.stats.delivered.inc();
            let q = self.queue.borrow();
            self.stats.queue_depth.set(q.len() as i64);
            self.stats
                .oldest_ms
                .set(q.front().map_or(0, |(t, _)| *t as i64));
        }
    }

    /// The drain task: delivers events whenever some are published.
    pub async fn run(&self) {
        loop {
            let seen = self.signal.generation();
            self.drain();
            self.signal.wait_since(seen).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::medium::Medium;

    #[test]
    fn bounded_queue_counts_drops_and_contains_panics() {
        let stats = Arc::new(BusStats::default());
        let tier = Arc::new(TierStats::default());
        let bus = EventBus::new(
            2,
            stats.clone(),
            vec![
                Box::new(PanickingTestSubscriber),
                Box::new(TierMetricsSubscriber {
                    stats: tier.clone(),
                }),
            ],
        );
        let ev = Event::Evicted {
            medium: Medium::Dram,
            bytes: 10,
            lifetime_ms: 2000,
            idle_ms: 500,
        };
        bus.publish(5, ev.clone());
        bus.publish(
            6,
            Event::Read {
                medium: Medium::Hbm,
                bytes: 1,
            },
        );
        bus.publish(7, ev.clone()); // dropped: the queue holds two
        assert_eq!(
            (
                stats.published.get(),
                stats.dropped.get(),
                stats.queue_depth.get()
            ),
            (3, 1, 2)
        );
        assert_eq!(stats.oldest_ms.get(), 5);
        // The panicking subscriber does not stop delivery to the others.
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        bus.drain();
        std::panic::set_hook(hook);
        assert_eq!(stats.subscriber_panics[2].get(), 1);
        assert!(stats.is_installed(0) && !stats.is_installed(1) && stats.is_installed(2));
        assert_eq!(tier.l1_evicted_chunks.get(), 1);
        assert_eq!(tier.l1_read_chunks.get(), 1);
        assert_eq!(
            (
                stats.queue_depth.get(),
                stats.oldest_ms.get(),
                stats.delivered.get()
            ),
            (0, 0, 2)
        );
    }
}
