//! Shared handles: the process-wide [`Shared`] and the part of each shard other threads may
//! touch ([`RemoteShard`]: inboxes, waker, statistics).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use atomic_waker::AtomicWaker;
use crossbeam_queue::ArrayQueue;

use super::ShardId;
use super::mailbox::{Envelope, ReplyEnvelope};
use super::notice::{self, Notice, NoticeRing};
use super::store::segment::SegmentTable;
use super::store::{self, StoreConfig};
use crate::common::clock::Clock;
use crate::config::Config;
use crate::ha::HaView;
use crate::metrics::ShardStats;
use crate::metrics::bus::{BusStats, TierStats};
use crate::metrics::client::ClientStats;
use crate::metrics::store::StoreStats;
use crate::metrics::trace::Tracer;

/// The part of a shard that other shards may touch: its inboxes, its waker and its
/// statistics. Everything else about a shard is reachable only from its own thread.
pub struct RemoteShard {
    pub(super) requests: ArrayQueue<Envelope>,
    /// Sized to the requester's outstanding limit, so a reply always finds room: a shard never
    /// has more requests in flight than its reply queue holds.
    pub(super) replies: ArrayQueue<ReplyEnvelope>,
    /// Unpin and abort notices: bounded; a full ring leaves the notice with its sender
    /// (`notice.rs`).
    pub(super) notices: NoticeRing,
    /// Holds the mailbox task's waker only while that task is parked.
    pub(super) waker: AtomicWaker,
    pub stats: ShardStats,
    pub store_stats: Arc<StoreStats>,
    pub tracer: Arc<Tracer>,
    pub client: ClientStats,
    pub bus_stats: Arc<BusStats>,
    pub tier_stats: Arc<TierStats>,
}

impl RemoteShard {
    pub(super) fn new(
        inbox: usize,
        outstanding: usize,
        clock: Clock,
        window_secs: u64,
    ) -> RemoteShard {
        RemoteShard {
            requests: ArrayQueue::new(inbox),
            replies: ArrayQueue::new(outstanding),
            notices: NoticeRing::new(notice::NOTICE_CAPACITY),
            waker: AtomicWaker::new(),
            stats: ShardStats::default(),
            store_stats: Arc::new(StoreStats::default()),
            tracer: Arc::new(Tracer::default()),
            client: ClientStats::new(clock, window_secs),
            bus_stats: Arc::new(BusStats::default()),
            tier_stats: Arc::new(TierStats::default()),
        }
    }

    /// Wakes the shard's mailbox task if it sleeps; free when it is already awake.
    pub fn wake(&self) {
        self.waker.wake();
    }

    /// Messages waiting in this shard's inboxes.
    pub fn inbox_depth(&self) -> usize {
        self.requests.len() + self.replies.len() + self.notices.len()
    }
}

/// What the HTTP front end builds from the configuration at start (`http::front_assets`),
/// handed to the cluster so every shard can serve it. Shards only carry these; they know no
/// HTTP.
#[derive(Default)]
pub struct FrontAssets {
    /// The mTLS server configuration, when TLS is on (built at start from the files).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The OpenAPI document for this configuration, built once at start and served as is.
    pub openapi: bytes::Bytes,
    /// How a remote rank's blobs move between its tiers ([`RemoteTier`]).
    pub remote_tier: Option<Arc<dyn RemoteTier>>,
    /// How an object's bytes are copied from one rank to another ([`ObjectCopier`]).
    pub copier: Option<Arc<dyn ObjectCopier>>,
}

/// How the meta service has a remote rank's local service copy a blob between two of its own
/// segments: a flush of its DRAM blob to its SSD, a demotion of its HBM blob into its DRAM, a
/// rewarm of its SSD blob into its DRAM. The store allocates the destination and keeps both
/// blobs pinned while the copy runs, as for a flush or rewarm here; the HTTP front end implements the message (it knows the protocol),
/// shards only call it.
pub trait RemoteTier: Send + Sync {
    /// Copies the bytes of `from` into `to` (both on one remote rank): how it ended and, for
    /// a copy into SSD, the checksum of the bytes written. A copy from SSD is checked against
    /// `from.sum` by the local service (`IoOutcome::Damaged` when they do not match).
    fn copy<'a>(
        &'a self,
        shared: &'a Shared,
        from: &'a store::BlobView,
        to: &'a store::BlobView,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = (store::IoOutcome, u64)> + 'a>>;
}

/// How the meta service copies an object's bytes from a copy on one rank into a new blob on
/// another (a re-replication; the store allocated the new blob and pins both while the copy
/// runs): the bytes are read here (this process's memory or SSD) or fetched from the source's
/// local service under a read grant, and written here or to the destination's local service
/// under a write grant. The HTTP front end implements it; shards only call it.
pub trait ObjectCopier: Send + Sync {
    /// Copies the object `key` (with `stamp`, for the destination's catalog) from `from` into
    /// `to`; true when `to` holds its bytes. `floors`: the freed logs' sequences taken before
    /// `to` was allocated (`FreedLogs::floors`; the floor of the copy's write grant).
    fn copy<'a>(
        &'a self,
        shard: &'a super::Shard,
        key: &'a [u8],
        from: &'a store::BlobView,
        to: &'a store::BlobView,
        stamp: super::catalog::Stamp,
        floors: &'a super::catalog::Floors,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + 'a>>;
}

/// Process-wide state shared by all shards, grouped by what each handle is for. Immutable
/// after start except for the atomics, the segment table and what the groups guard.
pub struct Shared {
    pub config: Config,
    pub shards: Box<[RemoteShard]>,
    pub ha: HaView,
    pub segments: Arc<SegmentTable>,
    /// The process clock: its origin is the moment the cluster was built.
    pub clock: Clock,
    /// The journals of the SSD files' indexes, with `ock.mmc.ssd.recover` (`None`: SSD files
    /// start empty and keep no journal).
    pub journals: Option<Arc<store::ssd::journaling::Journals>>,
    /// Start, readiness and shutdown.
    pub life: Lifecycle,
    /// This process's part in the cluster protocol: a meta's ranks and freed logs, a local
    /// service's identity, the grant key and the used grants.
    pub membership: Membership,
    /// What the process publishes besides its answers: KV events and OTLP.
    pub exports: Exports,
    /// What the HTTP front end built at start ([`FrontAssets`]).
    pub front: FrontAssets,
}

/// Start, readiness and shutdown of the process's shards.
pub struct Lifecycle {
    /// Shards whose listener accepts connections. `/ready` answers 200 once this equals the
    /// shard count.
    pub accepting: AtomicUsize,
    /// Set once by the signal handler; shards then stop accepting and drain.
    pub shutting_down: AtomicBool,
    /// Shards that have closed all their connections during shutdown. A shard keeps serving
    /// its mailbox until every shard has drained, so no cross-shard request is left hanging.
    pub drained: AtomicUsize,
}

/// This process's part in the cluster protocol (`crate::cluster`).
pub struct Membership {
    /// A meta service's remote ranks (local services that joined).
    pub ranks: super::ranks::RankRegistry,
    /// A local service's membership (its rank and meta service, once joined).
    pub local: super::ranks::LocalIdentity,
    /// The key grants are signed with: the meta's own (random at start), or the one a local
    /// service received when it joined.
    pub grant_key: crate::grant::GrantKeyCell,
    /// The write and move grants this process served a request under: each is used once
    /// (a local service's, and a meta's for its own rank's hop of a chain).
    pub used_grants: crate::grant::GrantLedger,
    /// A meta service's logs of the blobs freed on each remote rank (the catalog hand-over).
    pub freed_logs: crate::cluster::catalog::FreedLogs,
    /// The Unix time in milliseconds this process started: the view of its objects' stamps
    /// without HA ([`Shared::stamp_view`]).
    pub lineage_ms: u64,
}

/// What the process publishes besides its answers.
pub struct Exports {
    /// The KV-event publisher's statistics.
    pub kv_stats: Arc<crate::metrics::kv_events::KvEventStats>,
    /// The KV-event queue, when publishing is enabled (set once at start).
    pub kv_queue: std::sync::OnceLock<Arc<crate::kv_events::KvQueue>>,
    /// OTLP (`ock.mmc.otlp.*`): the span sampler and queue, the exporter's statistics.
    pub telemetry: Arc<crate::metrics::otlp::Telemetry>,
}

impl Shared {
    /// The view new objects are stamped with now (`cluster::catalog::stamp_view`).
    pub fn stamp_view(&self) -> u64 {
        self.stamp_view_at(self.ha.fence().max(0) as u64)
    }

    /// [`Shared::stamp_view`] under leadership `view` (ignored without HA).
    pub fn stamp_view_at(&self, view: u64) -> u64 {
        let ha = self.ha.config().map(|_| view);
        crate::cluster::catalog::stamp_view(ha, self.membership.lineage_ms)
    }

    pub fn new(
        config: Config,
        shard_count: usize,
        front: FrontAssets,
    ) -> Result<Arc<Shared>, String> {
        Shared::with_numa(config, shard_count, front, None)
    }

    /// [`Shared::new`] whose DRAM segments are placed on NUMA nodes per `numa`.
    pub fn with_numa(
        config: Config,
        shard_count: usize,
        front: FrontAssets,
        numa: Option<Arc<crate::numa::NumaLayout>>,
    ) -> Result<Arc<Shared>, String> {
        assert!(shard_count > 0);
        let inbox = config.shard.inbox_capacity as usize;
        let outstanding = config.shard.max_outstanding as usize;
        let ha = if config.cluster.role == crate::config::Role::Local {
            // A local service follows the meta it joins; it never leads.
            HaView::follower()
        } else if config.ha.enable {
            HaView::elected(config.ha.clone(), shard_count)
        } else {
            HaView::standalone(&config.advertise_address)
        };
        let segments = Arc::new(SegmentTable::with_numa(numa));
        // One producer slot per shard, and one for writers that are no shard.
        let journals = (config.store.ssd_enable && config.store.ssd_recover)
            .then(|| store::ssd::journaling::Journals::new(shard_count + 1));
        let grant_key = crate::grant::GrantKeyCell::default();
        match config.cluster.role {
            // A local service mounts its segments once the meta gave it its rank.
            crate::config::Role::Local => {}
            crate::config::Role::Meta => {
                let owner = |key: &[u8]| super::shard_for(key, shard_count);
                store::mount::mount_configured(
                    &config,
                    &segments,
                    shard_count,
                    journals.as_ref(),
                    &owner,
                )?;
                grant_key.set(crate::grant::GrantKey::random());
            }
        }
        let clock = Clock::start();
        let window = config.metrics.window_secs;
        let telemetry = Arc::new(crate::metrics::otlp::Telemetry::new(&config));
        let shared = Arc::new(Shared {
            shards: (0..shard_count)
                .map(|_| RemoteShard::new(inbox, outstanding, clock, window))
                .collect(),
            config,
            ha,
            segments,
            clock,
            journals,
            life: Lifecycle {
                accepting: AtomicUsize::new(0),
                shutting_down: AtomicBool::new(false),
                drained: AtomicUsize::new(0),
            },
            membership: Membership {
                ranks: super::ranks::RankRegistry::new(crate::grant::unix_ms()),
                local: super::ranks::LocalIdentity::new(),
                grant_key,
                used_grants: crate::grant::GrantLedger::new(crate::limits::MAX_USED_GRANTS),
                freed_logs: Default::default(),
                lineage_ms: crate::grant::unix_ms(),
            },
            exports: Exports {
                kv_stats: Arc::new(crate::metrics::kv_events::KvEventStats::new(shard_count)),
                kv_queue: std::sync::OnceLock::new(),
                telemetry,
            },
            front,
        });
        if shared.config.cluster.role == crate::config::Role::Local {
            shared.recover_local_ssd()?;
        }
        Ok(shared)
    }

    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Every shard accepts, the server is not shutting down, and (HA on) this node is the
    /// serving leader, or (a local service) it has joined its meta service.
    pub fn is_ready(&self) -> bool {
        self.life.accepting.load(Ordering::Acquire) == self.shards.len()
            && !self.life.shutting_down.load(Ordering::Acquire)
            && self.ha.serving()
    }

    /// Starts the graceful shutdown: every shard stops accepting and drains.
    pub fn begin_shutdown(&self) {
        self.life.shutting_down.store(true, Ordering::Release);
        for s in self.shards.iter() {
            s.wake();
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.life.shutting_down.load(Ordering::Acquire)
    }

    /// Delivers a notice to a shard (from any thread, never blocking).
    pub fn notify(&self, shard: ShardId, n: Notice) {
        notice::deliver(
            &|s| &self.shards[s].notices,
            &|s| self.shards[s].wake(),
            &|| self.is_shutting_down(),
            shard,
            n,
        );
    }

    /// Retries the notices this (shard) thread could not deliver yet.
    pub(super) fn retry_notices(&self) -> usize {
        notice::retry_overflow(&|s| &self.shards[s].notices, &|s| self.shards[s].wake())
    }

    pub fn store_config(&self) -> StoreConfig {
        let cl = &self.config.cluster;
        StoreConfig {
            keep_tombstones: cl.role == crate::config::Role::Meta,
            lease_ms: self.config.store.lease_ms,
            high_percent: self.config.evict.high_percent,
            low_percent: self.config.evict.low_percent,
            alloc_timeout_ms: self.config.store.alloc_timeout_ms,
            remote_writer_ms: self.config.remote_writer_ms(),
            rereplicate: store::RereplicateLimits {
                concurrency: cl.rereplicate_concurrency as usize,
                bytes_per_sec: cl
                    .rereplicate_bytes_per_sec
                    .div_ceil(self.shard_count() as u64),
                queue: cl.rereplicate_queue as usize,
            },
            key_format: self.config.kv_events.key_format.clone(),
        }
    }
}
