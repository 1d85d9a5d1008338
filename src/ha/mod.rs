//! High availability: the HA view (`role`, `ha_state`, `leader_address`, `view_version`) and,
//! with `ock.mmc.meta.ha.enable`, the election on etcd that writes it.
//!
//! Every endpoint that reports HA facts (`/health`, `/role`, `/ha_status`, `/leader`) and the
//! standby gate of the HTTP dispatch read them from [`HaView`], the one place they live.
//! Standalone (HA off) the node is "the leader, serving", as the contract notes say. A local
//! service is never a leader: it follows the meta service it joined ([`HaView::follower`],
//! `standby` once joined, with that meta's address and `view_version`). With HA on,
//! the election thread ([`election`]) campaigns with an etcd lease and publishes each change;
//! the `/metadata` writer thread ([`writer`]) writes `/metadata` through to etcd, fenced by the
//! leadership. Shards never block on either: they read one atomic (serving or not) and, on the
//! rare HA routes and redirects, a snapshot behind a lock held only to swap an `Arc`.

pub mod election;
pub mod etcd;
pub mod kv_events;
mod losses;
pub mod writer;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use bytes::Bytes;

use crate::config::{Config, HaConfig};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Leader,
    Standby,
    Unknown,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Standby => "standby",
            Role::Unknown => "unknown",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HaState {
    Starting,
    Standby,
    Serving,
    Unknown,
}

impl HaState {
    pub fn as_str(self) -> &'static str {
        match self {
            HaState::Starting => "starting",
            HaState::Standby => "standby",
            HaState::Serving => "serving",
            HaState::Unknown => "unknown",
        }
    }
}

/// One consistent reading of the HA facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HaSnapshot {
    pub role: Role,
    pub state: HaState,
    /// `None` is reported as `unknown`, as the contract says when there is no stable source.
    pub leader_address: Option<String>,
    pub view_version: u64,
}

impl HaSnapshot {
    pub fn leader_present(&self) -> bool {
        self.role == Role::Leader || self.leader_address.is_some()
    }

    pub fn leader_address_str(&self) -> &str {
        self.leader_address.as_deref().unwrap_or("unknown")
    }
}

/// A `/metadata` write on its way to etcd.
#[derive(Debug)]
pub enum MetaOp {
    Put(Box<[u8]>, Bytes),
    Delete(Box<[u8]>),
}

impl MetaOp {
    pub fn key(&self) -> &[u8] {
        match self {
            MetaOp::Put(k, _) | MetaOp::Delete(k) => k,
        }
    }
}

/// How a `/metadata` write ended, as its owner shard answers the waiting command once it
/// applied the write to its own copy (or etcd refused it).
#[derive(Debug, PartialEq, Eq)]
pub enum MetaReply {
    Done,
    /// A delete of a key etcd did not have.
    NotFound,
    Refused(std::borrow::Cow<'static, str>),
}

/// What the HA threads need of the server they run in, handed down as a trait (as
/// `metrics::view::Source` is) so that `ha` knows no shard: the server's `Shared` implements
/// it (`shards/replica.rs`).
pub trait HaHost: Send + Sync + 'static {
    /// The view the HA threads publish to and reach the shards through.
    fn ha(&self) -> &HaView;
    fn config(&self) -> &Config;
    /// The server is shutting down.
    fn shutting_down(&self) -> bool;
    /// The owner shard of the `/metadata` key `key`.
    fn owner_shard(&self, key: &[u8]) -> usize;
    /// Records the span of a leadership's start (`mmc.failover`: from winning the election
    /// to serving, or to resigning when `ok` is false) that took `elapsed` (OTLP, when tracing
    /// is on). The default records nothing.
    fn failover_span(&self, _elapsed: std::time::Duration, _ok: bool, _view: u64) {}
}

/// A `/metadata` write queued by its owner shard for the writer thread.
pub struct WriteReq {
    pub shard: usize,
    /// The leadership the write was accepted under: etcd takes it only while that leadership
    /// lasts (a write queued before a step-down never lands in a later leadership, after that
    /// leadership's load from etcd).
    pub fence: i64,
    pub op: MetaOp,
    /// Bytes the owner reserved in its metadata budget for this write.
    pub reserved: u64,
    /// Where the owner's waiting command gets its answer.
    pub done: flume::Sender<MetaReply>,
}

/// Messages from the HA threads to one shard (its applier task, `shards/replica.rs`). Each
/// shard receives them in the order they were sent, which for writes is etcd's order.
pub enum ShardMsg {
    /// A write went to etcd (`Ok(existed)`: stored; for a delete, whether the key existed) or
    /// did not (`Err`: the reason). The shard applies a stored write to its own copy, then
    /// answers `done`.
    Written {
        op: MetaOp,
        reserved: u64,
        outcome: Result<bool, String>,
        done: flume::Sender<MetaReply>,
    },
    /// This node became leader: drop the local `/metadata` copy (etcd's is the truth).
    Reset { ack: flume::Sender<()> },
    /// This node leads again after another leader served: the objects it still holds are
    /// from before and may be stale (removed or replaced since): drop them.
    Purge { ack: flume::Sender<()> },
    /// `/metadata` entries loaded from etcd.
    Load {
        entries: Vec<(Box<[u8]>, Bytes)>,
        ack: flume::Sender<()>,
    },
    /// A new KV-event epoch began: queue a `BlockStored` for every block this shard holds.
    Announce { ack: flume::Sender<()> },
}

/// A leader-change listener: called on the election thread with the previous and the new
/// snapshot, after the change is visible to readers. It must not block (hand work to a thread
/// or a queue of its own).
pub type HaListener = Box<dyn Fn(&HaSnapshot, &HaSnapshot) + Send + Sync>;

/// A step a newly elected leader runs before it serves (on the election thread, while its
/// `ha_state` is `starting`): given the new `view_version` and the instant by which it must
/// be done (the lease's step-down deadline), it recovers state (the cluster's catalog
/// hand-over, say). An `Err` makes the node resign instead of serving.
pub type RecoveryStep = Box<dyn Fn(u64, std::time::Instant) -> Result<(), String> + Send + Sync>;

/// Queued `/metadata` writes waiting for the writer thread; past it a write is answered 429.
const WRITE_QUEUE_CAPACITY: usize = 4096;

/// The shared HA view. Read on every HA endpoint (rare, cheap) and, with HA on, one atomic per
/// request; written only by the election thread on changes.
pub struct HaView {
    /// `ock.mmc.meta.ha.enable`, fixed at start.
    enabled: bool,
    /// A local service's view: it follows the meta it joined ([`HaView::follow`]).
    follower: bool,
    /// HA on, and this node is the leader and serving (a local service: it has joined its
    /// meta). The one thing the request path reads.
    serving: AtomicBool,
    /// While leading: nanoseconds after `epoch` at which serving ends unless a renewal moves
    /// it on (the step-down deadline). Checked on every request with HA on, so a leader whose
    /// election thread was descheduled or the whole process paused (SIGSTOP, a VM freeze)
    /// stops serving at its deadline all the same, before its lease can expire.
    serving_until_ns: AtomicU64,
    epoch: std::time::Instant,
    current: RwLock<Arc<HaSnapshot>>,
    /// While this node leads: the create revision of its election key, which every etcd write
    /// of the leader compares against (fencing); 0 otherwise.
    fence: AtomicI64,
    /// Counts published changes (a poller can compare it instead of subscribing).
    generation: AtomicU64,
    listeners: Mutex<Vec<HaListener>>,
    epoch_steps: Mutex<Vec<RecoveryStep>>,
    recovery: Mutex<Vec<RecoveryStep>>,
    config: Option<HaConfig>,
    to_shards: Vec<flume::Sender<ShardMsg>>,
    shard_inboxes: Vec<flume::Receiver<ShardMsg>>,
    writes: Option<(flume::Sender<WriteReq>, flume::Receiver<WriteReq>)>,
}

impl HaView {
    /// Standalone mode: this node leads and serves; its advertised address, if configured, is
    /// the leader address.
    pub fn standalone(advertise_address: &str) -> HaView {
        let leader_address = (!advertise_address.is_empty()).then(|| advertise_address.to_string());
        HaView::new(Role::Leader, HaState::Serving, leader_address, None, 0)
    }

    /// HA on: `starting` until the election thread has its first answer from etcd.
    pub fn elected(config: HaConfig, shard_count: usize) -> HaView {
        HaView::new(
            Role::Unknown,
            HaState::Starting,
            None,
            Some(config),
            shard_count,
        )
    }

    /// A local service: `unknown` / `starting`, not ready, until it has joined a meta service
    /// ([`HaView::follow`]). It never leads and is never gated (it serves its own routes).
    pub fn follower() -> HaView {
        let mut view = HaView::new(Role::Unknown, HaState::Starting, None, None, 0);
        view.follower = true;
        view.serving = AtomicBool::new(false);
        view
    }

    /// A view at `role` and `state`; serving from the start when HA is off (no `config`).
    fn new(
        role: Role,
        state: HaState,
        leader_address: Option<String>,
        config: Option<HaConfig>,
        shard_count: usize,
    ) -> HaView {
        let enabled = config.is_some();
        let (to_shards, shard_inboxes) = (0..shard_count).map(|_| flume::unbounded()).unzip();
        HaView {
            enabled,
            follower: false,
            serving: AtomicBool::new(!enabled),
            serving_until_ns: AtomicU64::new(if enabled { 0 } else { u64::MAX }),
            epoch: std::time::Instant::now(),
            current: RwLock::new(Arc::new(HaSnapshot {
                role,
                state,
                leader_address,
                view_version: 0,
            })),
            fence: AtomicI64::new(0),
            generation: AtomicU64::new(0),
            listeners: Mutex::new(Vec::new()),
            epoch_steps: Mutex::new(Vec::new()),
            recovery: Mutex::new(Vec::new()),
            config,
            to_shards,
            shard_inboxes,
            writes: enabled.then(|| flume::bounded(WRITE_QUEUE_CAPACITY)),
        }
    }

    pub fn snapshot(&self) -> HaSnapshot {
        (**self.current.read().unwrap_or_else(|p| p.into_inner())).clone()
    }

    /// HA is on (fixed at start).
    #[inline]
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Requests other than the HA and health routes must not be served here: HA is on and
    /// this node is not the serving leader, or its serving deadline passed. With HA off this is
    /// one load of a plain bool; with HA on, a relaxed atomic load and a monotonic clock read.
    #[inline]
    pub fn gated(&self) -> bool {
        self.enabled && !self.serving_now()
    }

    fn serving_now(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
            && (self.epoch.elapsed().as_nanos() as u64)
                < self.serving_until_ns.load(Ordering::Relaxed)
    }

    /// This node serves (always with HA off; with HA on, the serving leader within its
    /// deadline; a local service, once it has joined its meta).
    pub fn serving(&self) -> bool {
        if self.follower {
            return self.serving.load(Ordering::Acquire);
        }
        !self.enabled || self.serving_now()
    }

    /// A local service joined the meta service at `meta` (its URL and `view_version`): it
    /// reports `standby` following that leader, and is ready. `None`: it has no meta (it gave
    /// one up and is joining again): `unknown`, not ready. Called by the agent thread only.
    pub fn follow(&self, meta: Option<(&str, u64)>) {
        let next = match meta {
            Some((url, view)) => HaSnapshot {
                role: Role::Standby,
                state: HaState::Standby,
                leader_address: Some(url.to_string()),
                view_version: view,
            },
            None => HaSnapshot {
                role: Role::Unknown,
                state: HaState::Unknown,
                leader_address: None,
                view_version: 0,
            },
        };
        self.change(next, 0, meta.is_some());
    }

    /// The meta service a local service follows now (it joined it and has not given it up).
    pub fn followed(&self) -> Option<String> {
        let now = self.snapshot();
        (self.follower && now.role == Role::Standby)
            .then_some(now.leader_address)
            .flatten()
    }

    /// Moves the serving deadline (election thread only, as a renewal succeeds).
    pub(crate) fn serve_until(&self, deadline: std::time::Instant) {
        let ns = deadline.saturating_duration_since(self.epoch).as_nanos() as u64;
        self.serving_until_ns.store(ns, Ordering::Release);
    }

    pub fn config(&self) -> Option<&HaConfig> {
        self.config.as_ref()
    }

    /// The fence of this node's leadership (0: not the leader).
    pub fn fence(&self) -> i64 {
        self.fence.load(Ordering::Acquire)
    }

    /// How many changes were published so far.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Registers a leader-change listener (see [`HaListener`]). Listeners registered before
    /// the HA threads start see every change, the first one included.
    pub fn subscribe(&self, listener: HaListener) {
        locked(&self.listeners).push(listener);
    }

    /// Registers a step a new leader runs before serving (see [`RecoveryStep`]).
    pub fn add_recovery_step(&self, step: RecoveryStep) {
        locked(&self.recovery).push(step);
    }

    /// Registers a step run the moment a leadership is won, before anything of the new
    /// leadership can change the store: after the purge of stale objects, before the
    /// `/metadata` load and before every [`RecoveryStep`] (the catalog hand-over). The KV-event
    /// epoch starts here, so its `AllBlocksCleared` precedes every `BlockStored` of the
    /// leadership. Same signature and contract as a recovery step.
    pub fn add_epoch_step(&self, step: RecoveryStep) {
        locked(&self.epoch_steps).push(step);
    }

    /// Publishes a new view (election thread only). `serving` goes down before the snapshot
    /// changes and up after it, so no request is served on a view that does not allow it.
    /// A view without a leader address reports `view_version` 0: the contract fixes both
    /// fields to their defaults when there is no stable source (`unknown`, 0).
    pub(crate) fn publish(&self, mut next: HaSnapshot, fence: i64) {
        if next.leader_address.is_none() {
            next.view_version = 0;
        }
        let serving = next.role == Role::Leader && next.state == HaState::Serving;
        self.change(next, fence, serving);
    }

    /// Publishes `next` with its fence; `serving` goes down before the snapshot changes and up
    /// after it.
    fn change(&self, next: HaSnapshot, fence: i64, serving: bool) {
        if !serving {
            self.serving.store(false, Ordering::Release);
        }
        self.fence.store(fence, Ordering::Release);
        let previous = {
            let mut cur = self.current.write().unwrap_or_else(|p| p.into_inner());
            if **cur == next {
                return;
            }
            std::mem::replace(&mut *cur, Arc::new(next.clone()))
        };
        if serving {
            self.serving.store(true, Ordering::Release);
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
        log::info!(
            "HA: role {} ({}), leader {}, view_version {}",
            next.role.as_str(),
            next.state.as_str(),
            next.leader_address_str(),
            next.view_version
        );
        for l in locked(&self.listeners).iter() {
            l(&previous, &next);
        }
    }

    /// The inbox of shard `id`'s applier (HA on only).
    pub fn shard_inbox(&self, id: usize) -> Option<flume::Receiver<ShardMsg>> {
        self.shard_inboxes.get(id).cloned()
    }

    pub(crate) fn send_to_shard(&self, id: usize, msg: ShardMsg) -> bool {
        self.to_shards[id].send(msg).is_ok()
    }

    pub fn shard_count(&self) -> usize {
        self.to_shards.len()
    }

    /// Sends `msg` to every shard and waits until each that took it acknowledged; `Err(late)`
    /// when `deadline` comes first.
    pub(crate) fn ask_every_shard(
        &self,
        msg: impl Fn(flume::Sender<()>) -> ShardMsg,
        deadline: std::time::Instant,
        late: &str,
    ) -> Result<(), String> {
        let mut acks = Acks::new();
        for s in 0..self.shard_count() {
            acks.send(self, s, &msg);
        }
        acks.wait(deadline, late)
    }

    /// Queues a `/metadata` write for etcd (HA on); gives it back when the queue is full.
    pub fn submit_write(&self, req: WriteReq) -> Result<(), WriteReq> {
        match &self.writes {
            Some((tx, _)) => tx.try_send(req).map_err(|e| e.into_inner()),
            None => Err(req),
        }
    }

    pub(crate) fn write_queue(&self) -> Option<flume::Receiver<WriteReq>> {
        self.writes.as_ref().map(|(_, rx)| rx.clone())
    }
}

/// The acknowledgements of messages sent to shards: each message queued is counted, then
/// [`Acks::wait`] waits for as many acks.
pub(crate) struct Acks {
    tx: flume::Sender<()>,
    rx: flume::Receiver<()>,
    expected: usize,
}

impl Acks {
    pub(crate) fn new() -> Acks {
        let (tx, rx) = flume::unbounded();
        Acks {
            tx,
            rx,
            expected: 0,
        }
    }

    /// Sends `msg`, made with this ack channel, to shard `id` (counted when it was queued).
    pub(crate) fn send(
        &mut self,
        ha: &HaView,
        id: usize,
        msg: impl FnOnce(flume::Sender<()>) -> ShardMsg,
    ) {
        if ha.send_to_shard(id, msg(self.tx.clone())) {
            self.expected += 1;
        }
    }

    /// Waits for every counted ack; `Err(late)` when `deadline` comes first.
    pub(crate) fn wait(self, deadline: std::time::Instant, late: &str) -> Result<(), String> {
        drop(self.tx);
        for _ in 0..self.expected {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            self.rx.recv_timeout(left).map_err(|_| late.to_string())?;
        }
        Ok(())
    }
}

/// The mutex's value, also after a panic elsewhere poisoned it (the lists it guards stay
/// whole: each change is one push).
fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `steps` (a view's epoch or recovery steps) in registration order; the first error
/// stops them. The election thread runs them.
fn run_steps(
    steps: &Mutex<Vec<RecoveryStep>>,
    view_version: u64,
    deadline: std::time::Instant,
) -> Result<(), String> {
    for step in locked(steps).iter() {
        step(view_version, deadline)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn snap(role: Role, state: HaState, leader: Option<&str>, view: u64) -> HaSnapshot {
        HaSnapshot {
            role,
            state,
            leader_address: leader.map(str::to_string),
            view_version: view,
        }
    }

    /// Listeners see each change once, with the view before and after; `serving` and the
    /// fence follow the role; a repeated view is no change.
    #[test]
    fn publish_notifies_listeners_and_gates() {
        let mut cfg = Config::defaults();
        cfg.set("ock.mmc.meta.ha.enable", "true").unwrap();
        let view = HaView::elected(cfg.ha.clone(), 2);
        assert!(view.enabled() && view.gated() && !view.serving());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        view.subscribe(Box::new(move |old, new| {
            s.lock()
                .unwrap()
                .push((old.role, new.role, new.view_version));
        }));
        view.publish(
            snap(Role::Standby, HaState::Standby, Some("http://a:1"), 7),
            0,
        );
        view.publish(
            snap(Role::Standby, HaState::Standby, Some("http://a:1"), 7),
            0,
        );
        assert!(view.gated());
        view.serve_until(std::time::Instant::now() + std::time::Duration::from_secs(60));
        view.publish(
            snap(Role::Leader, HaState::Serving, Some("http://b:1"), 9),
            9,
        );
        assert!(!view.gated() && view.serving());
        // Past its deadline a leader does not serve, whatever the flag says.
        view.serve_until(std::time::Instant::now());
        assert!(view.gated() && !view.serving());
        view.serve_until(std::time::Instant::now() + std::time::Duration::from_secs(60));
        assert_eq!(view.fence(), 9);
        view.publish(snap(Role::Unknown, HaState::Unknown, None, 9), 0);
        assert!(view.gated() && view.fence() == 0);
        assert_eq!(
            *seen.lock().unwrap(),
            [
                (Role::Unknown, Role::Standby, 7),
                (Role::Standby, Role::Leader, 9),
                // No leader address: view_version 0, whatever the election last saw.
                (Role::Leader, Role::Unknown, 0)
            ]
        );
        assert_eq!(view.snapshot().view_version, 0);
        assert_eq!(view.generation(), 3);
        let standalone = HaView::standalone("");
        assert!(!standalone.gated() && standalone.serving());
    }

    /// A local service is never the leader: `unknown` / `starting` and not ready until it
    /// joined, then `standby` following its meta (its address and view), never gated.
    #[test]
    fn a_follower_never_leads() {
        let view = HaView::follower();
        let s = view.snapshot();
        assert_eq!((s.role, s.state), (Role::Unknown, HaState::Starting));
        assert!(!view.serving() && !view.gated() && !view.snapshot().leader_present());
        assert_eq!(view.followed(), None);
        view.follow(Some(("http://meta:8000", 12)));
        let s = view.snapshot();
        assert_eq!((s.role, s.state), (Role::Standby, HaState::Standby));
        assert_eq!(
            (s.leader_address_str(), s.view_version),
            ("http://meta:8000", 12)
        );
        assert!(view.serving() && !view.gated() && view.snapshot().leader_present());
        assert_eq!(view.followed().as_deref(), Some("http://meta:8000"));
        view.follow(None);
        let s = view.snapshot();
        assert_eq!(
            (s.role, s.state, s.view_version),
            (Role::Unknown, HaState::Unknown, 0)
        );
        assert!(!view.serving() && view.followed().is_none());
    }

    #[test]
    fn ha_keys_parse_and_validate() {
        let mut c = Config::defaults();
        assert!(!c.ha.enable);
        assert_eq!(c.ha.lease_ttl_ms, 5000);
        assert_eq!(c.ha.prefix, "/mmc/");
        c.validate().unwrap();
        c.set("ock.mmc.meta.ha.enable", "true").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("ock.mmc.meta.ha.etcd_endpoints is empty"), "{e}");
        c.set(
            "ock.mmc.meta.ha.etcd_endpoints",
            "http://10.0.0.1:2379, 10.0.0.2:2379,",
        )
        .unwrap();
        assert_eq!(c.ha.etcd_endpoints.len(), 2);
        assert_eq!(c.ha.etcd_endpoints[1].to_string(), "10.0.0.2:2379");
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("ock.mmc.meta.ha.advertise_url is empty"), "{e}");
        c.set("ock.mmc.meta.ha.advertise_url", "http://10.0.0.5:8000/")
            .unwrap();
        assert_eq!(c.ha.advertise_url, "http://10.0.0.5:8000");
        c.validate().unwrap();
        for (k, bad) in [
            ("ock.mmc.meta.ha.etcd_endpoints", "https://etcd:2379"),
            ("ock.mmc.meta.ha.etcd_endpoints", "etcd"),
            ("ock.mmc.meta.ha.advertise_url", "10.0.0.5:8000"),
            ("ock.mmc.meta.ha.lease_ttl_ms", "1000"),
            ("ock.mmc.meta.ha.prefix", "mmc"),
            ("ock.mmc.meta.ha.prefix", "/mmc"),
        ] {
            assert!(c.set(k, bad).is_err(), "{k} = {bad} must be refused");
        }
        c.set("ock.mmc.meta.ha.lease_ttl_ms", "2500").unwrap();
        assert_eq!(c.ha.lease_ttl_secs(), 3);
        assert_eq!(c.ha.election_key(), b"/mmc/leader");
        assert_eq!(c.ha.metadata_key(b"k"), b"/mmc/metadata/k");
    }
}
