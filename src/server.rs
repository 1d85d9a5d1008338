//! Process orchestration: bind the shared port, start one pinned shard thread per planned
//! CPU, report readiness, drain on shutdown.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use monoio::net::TcpListener;

use crate::cli::Plan;
use crate::http::Front;
use crate::http::front_ring::FrontRing;
use crate::shards::runtime::{self, DriverKind};
use crate::shards::{Shard, Shared};

/// A started server: its shard threads are running and every shard accepts connections.
pub struct Server {
    pub shared: Arc<Shared>,
    pub local_addr: SocketAddr,
    pub drivers: Vec<DriverKind>,
    threads: Vec<JoinHandle<()>>,
    kv_publisher: Option<crate::kv_events::KvPublisher>,
    /// The election and `/metadata` writer threads (HA on).
    ha: Option<crate::ha::election::HaThreads>,
    /// The same-host sockets' paths (`ock.mmc.http.same_host_socket`), removed at the end.
    same_host_paths: Vec<std::path::PathBuf>,
    /// The OTLP exporter (`ock.mmc.otlp.endpoint` set), flushed at the end.
    otlp: Option<crate::http::otlp::Exporter>,
}

/// Backlog of each shard's listening socket: deep enough for a burst of new connections
/// from many clients at once (the kernel clamps it to `net.core.somaxconn`).
const LISTEN_BACKLOG: i32 = 4096;

/// How long a start waits for a port still held by a listening socket before giving up. A
/// process killed with SIGKILL keeps its listeners in LISTEN for a moment after it is gone
/// (io_uring tears a ring down asynchronously, and a pending accept holds its socket; measured
/// at up to ~200 ms under load), so a supervisor's immediate restart would otherwise fail with
/// "Address already in use". A port held by a live process is still refused, this much later.
const BUSY_PORT_WAIT_MS: u64 = 1000;

/// Pause between two binds of the probe while the port is busy.
const BUSY_PORT_POLL_MS: u64 = 10;

/// Creates one listening socket per shard on the same address with `SO_REUSEADDR` (connections
/// of a previous process left in TIME_WAIT or FIN_WAIT do not block the bind) and `SO_REUSEPORT`
/// (the kernel spreads new connections across shards). Port 0 is resolved by the first socket.
fn bind_listeners(addr: SocketAddr, count: usize) -> Result<Vec<std::net::TcpListener>, String> {
    use socket2::{Domain, Protocol, Socket, Type};
    let bind_err = |e: std::io::Error| format!("cannot listen on {addr}: {e}");
    // SO_REUSEPORT would let us silently share the port with another process of the same
    // user already listening there (or with the dying listeners of a killed one, whose
    // queued connections would then be reset); a bind without it first detects that, and
    // waits a bounded time for a listener that is going away.
    if addr.port() != 0 {
        let deadline = Instant::now() + Duration::from_millis(BUSY_PORT_WAIT_MS);
        let mut waited = false;
        loop {
            let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
                .map_err(bind_err)?;
            probe.set_reuse_address(true).map_err(bind_err)?;
            match probe.bind(&addr.into()) {
                Ok(()) => break,
                Err(e)
                    if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline =>
                {
                    if !waited {
                        log::info!(
                            "{addr} is still held by a listener; waiting up to {BUSY_PORT_WAIT_MS} ms for it to go away"
                        );
                        waited = true;
                    }
                    std::thread::sleep(Duration::from_millis(BUSY_PORT_POLL_MS));
                }
                Err(e) => return Err(bind_err(e)),
            }
        }
    }
    let mut out = Vec::with_capacity(count);
    let mut addr = addr;
    for _ in 0..count {
        let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
            .map_err(bind_err)?;
        s.set_reuse_address(true).map_err(bind_err)?;
        s.set_reuse_port(true).map_err(bind_err)?;
        s.set_nonblocking(true).map_err(bind_err)?;
        // Accepted connections inherit it (Linux): no setsockopt per connection.
        s.set_tcp_nodelay(true).map_err(bind_err)?;
        if addr.is_ipv6() {
            s.set_only_v6(true).map_err(bind_err)?;
        }
        s.bind(&addr.into()).map_err(bind_err)?;
        s.listen(LISTEN_BACKLOG).map_err(bind_err)?;
        if addr.port() == 0 {
            let local = s.local_addr().map_err(bind_err)?;
            addr = local
                .as_socket()
                .ok_or_else(|| "bound to a non-IP address".to_string())?;
        }
        out.push(s.into());
    }
    Ok(out)
}

/// Fail-closed binding: off loopback, the server needs a data token and a different metrics
/// token, or it does not start.
pub fn check_exposure(config: &crate::config::Config, addr: SocketAddr) -> Result<(), String> {
    if addr.ip().is_loopback() {
        return Ok(());
    }
    let http = &config.http;
    if config.cluster.role == crate::config::Role::Local {
        // A local service serves bytes only under grants; what it needs is the cluster
        // secret (to join) and a token for its metrics.
        if config.cluster.token.is_empty() {
            return Err(format!(
                "refusing to listen on {addr} (not loopback) as a local service without a cluster secret: set ock.mmc.cluster.token (or MMC_CLUSTER_TOKEN), the same as the meta service's"
            ));
        }
        if http.metrics_token.is_empty() {
            return Err(format!(
                "refusing to listen on {addr} (not loopback) without a metrics token: set ock.mmc.http.metrics_token (or MMC_METRICS_TOKEN)"
            ));
        }
        return Ok(());
    }
    if http.auth_token.is_empty() {
        return Err(format!(
            "refusing to listen on {addr} (not loopback) without authentication: set ock.mmc.http.auth_token (or MMC_API_TOKEN) and a different ock.mmc.http.metrics_token (or MMC_METRICS_TOKEN)"
        ));
    }
    if http.metrics_token.is_empty() {
        return Err(format!(
            "refusing to listen on {addr} (not loopback) without a separate metrics token: set ock.mmc.http.metrics_token (or MMC_METRICS_TOKEN), different from the data token"
        ));
    }
    if http.metrics_token == http.auth_token {
        return Err(format!(
            "refusing to listen on {addr} (not loopback): ock.mmc.http.metrics_token must differ from ock.mmc.http.auth_token, so scrapers never hold the data token"
        ));
    }
    Ok(())
}

/// The NUMA placement of this start (`ock.mmc.numa.enable`), logged; `None` when off or a
/// no-op. The topology is read from `/sys`, or from the tree `MMC_NUMA_SYSFS` names (tests
/// point it at a synthetic two-node tree).
fn numa_layout(plan: &Plan) -> Result<Option<Arc<crate::numa::NumaLayout>>, String> {
    let shard = &plan.config.shard;
    if shard.numa == crate::config::NumaMode::Off {
        return Ok(None);
    }
    let root = std::env::var_os("MMC_NUMA_SYSFS").unwrap_or_else(|| "/sys".into());
    let topology = crate::numa::read_topology(std::path::Path::new(&root))
        .map_err(|e| format!("cannot read the NUMA topology: {e}"))?;
    let placement = crate::numa::plan(shard.numa, &topology, &plan.shard_cpus);
    log::info!("{}", placement.reason);
    Ok(crate::numa::NumaLayout::new(placement, &topology, shard.numa_policy).map(Arc::new))
}

/// A per-process random id that prefixes generated request ids.
fn boot_id() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let seed = nanos as u64 ^ ((std::process::id() as u64) << 32);
    xxhash_rust::xxh3::xxh3_64(&seed.to_le_bytes()) as u32
}

impl Server {
    /// Binds, starts every shard and waits until each accepts. On failure nothing keeps
    /// running and the error is the one line to show the operator.
    pub fn start(plan: Plan) -> Result<Server, String> {
        let shard_count = plan.shard_cpus.len();
        let addr =
            plan.config.listen.resolve().map_err(|e| {
                format!("cannot resolve listen address {}: {e}", plan.config.listen)
            })?;
        check_exposure(&plan.config, addr)?;
        let numa = numa_layout(&plan)?;
        let listeners = bind_listeners(addr, shard_count)?;
        let local_addr = listeners[0].local_addr().map_err(|e| e.to_string())?;
        let boot = boot_id();
        let ring_entries = plan.config.shard.ring_entries as u32;
        let front = crate::http::front_assets(&plan.config)?;
        let shared = Shared::with_numa(plan.config, shard_count, front, numa)?;
        // After everything that may refuse the start (its error is then the one line shown).
        let same_host = bind_same_host(
            &shared.config.http.same_host_socket,
            local_addr.port(),
            boot,
            shard_count,
        );
        let kv_publisher = if shared.config.kv_events.enable {
            let p = crate::kv_events::KvPublisher::start(
                shared.config.kv_events.clone(),
                shared.exports.kv_stats.clone(),
            )?;
            let _ = shared.exports.kv_queue.set(p.queue.clone());
            // A start that may take blobs back from its SSD files opens its stream with
            // `AllBlocksCleared` (a router forgets what the previous process announced: its
            // memory tiers are gone), before the shards announce what they recovered. With HA
            // each leadership's epoch opens with one instead.
            let s = &shared.config.store;
            if !shared.config.ha.enable && s.ssd_enable && s.ssd_recover {
                p.queue
                    .produce(usize::MAX, &crate::common::event::Event::Cleared);
            }
            // With HA on, only the leader publishes: idle until this node wins a leadership.
            if shared.config.ha.enable {
                let host: Arc<dyn crate::ha::HaHost> = shared.clone();
                crate::ha::kv_events::follow_leadership(&host, &p.queue);
            }
            Some(p)
        } else {
            None
        };
        let recovering: usize = shared
            .segments
            .snapshot()
            .iter()
            .filter_map(|s| s.backend.file())
            .map(|f| f.recovered_pending())
            .sum();

        let (started_tx, started_rx) = mpsc::channel::<(usize, Result<DriverKind, String>)>();
        let mut threads = Vec::with_capacity(shard_count);
        for (id, (listener, cpu)) in listeners.into_iter().zip(plan.shard_cpus).enumerate() {
            let shared = shared.clone();
            let started = started_tx.clone();
            let driver = plan.driver;
            let unix = same_host.as_ref().and_then(|s| s.for_shard(id));
            let spawn = std::thread::Builder::new()
                .name(format!("mmc-shard-{id}"))
                .spawn(move || {
                    if let Err(e) = runtime::pin_to(cpu) {
                        log::warn!("shard {id}: cannot pin to CPU {cpu}: {e}; running unpinned");
                    }
                    let ran = runtime::run_shard(driver, ring_entries, id, |kind| {
                        let tls = shared.front.tls.is_some();
                        let (kind, front) = front_ring(driver, kind, id, listener, tls);
                        let _ = started.send((id, Ok(kind)));
                        shard_main(id, shared, front, unix, boot, kind != DriverKind::Epoll)
                    });
                    if let Err(e) = ran {
                        let _ = started.send((id, Err(e)));
                    }
                });
            threads.push(spawn.map_err(|e| format!("cannot start shard thread {id}: {e}"))?);
        }
        drop(started_tx);

        let mut drivers = vec![DriverKind::Epoll; shard_count];
        let mut failure = None;
        for _ in 0..shard_count {
            match started_rx.recv() {
                Ok((id, Ok(kind))) => drivers[id] = kind,
                Ok((_, Err(e))) => {
                    failure.get_or_insert(e);
                }
                Err(_) => {
                    failure.get_or_insert("a shard thread exited during start".to_string());
                }
            }
        }
        let server = Server {
            shared,
            local_addr,
            drivers,
            threads,
            kv_publisher,
            same_host_paths: same_host.map(|s| s.paths).unwrap_or_default(),
            ha: None,
            otlp: None,
        };
        if let Some(e) = failure {
            server.shared.begin_shutdown();
            server.join();
            return Err(e);
        }
        // Every runtime is up; wait (bounded) until each shard has entered its accept loop
        // (after indexing its recovered SSD blobs: a second more per 50k of them).
        let limit = Duration::from_secs(10 + recovering as u64 / 50_000);
        let deadline = Instant::now() + limit;
        while server.shared.life.accepting.load(Ordering::Acquire) < shard_count {
            if Instant::now() > deadline {
                server.shared.begin_shutdown();
                server.join();
                return Err(format!(
                    "shards did not start accepting within {} s",
                    limit.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        server.shared.log_ssd_recovery();
        let mut server = server;
        server.otlp = crate::http::otlp::start(server.shared.clone())
            .map_err(|e| format!("cannot start the OTLP exporter thread: {e}"))?;
        // A local service never campaigns (its view follows the meta it joins).
        if server.shared.ha.enabled() {
            if server.shared.config.cluster.role == crate::config::Role::Meta {
                // A new leader records itself and learns which memberships earlier leaders
                // declared lost and which leaderships served, before it serves (`ha::losses`):
                // those processes' catalogs, and catalogs that missed a leadership, are void.
                let weak = Arc::downgrade(&server.shared);
                server
                    .shared
                    .ha
                    .add_recovery_step(Box::new(move |view, deadline| {
                        let Some(shared) = weak.upgrade() else {
                            return Ok(());
                        };
                        let history = shared.ha.load_history(view, deadline)?;
                        if !history.losses.is_empty() {
                            log::info!(
                                "HA: {} memberships earlier leaders declared lost are void here",
                                history.losses.len()
                            );
                        }
                        let mut ranks = shared.membership.ranks.lock();
                        ranks.note_lost(history.losses);
                        ranks.note_served(history.served);
                        Ok(())
                    }));
            }
            match crate::ha::election::HaThreads::start(server.shared.clone()) {
                Ok(t) => server.ha = Some(t),
                Err(e) => {
                    server.shared.begin_shutdown();
                    server.join();
                    return Err(e);
                }
            }
        }
        if server.shared.config.cluster.role == crate::config::Role::Local
            && let Err(e) = start_agent(&server.shared, server.local_addr)
        {
            server.shared.begin_shutdown();
            server.join();
            return Err(format!("cannot start the local service's agent: {e}"));
        }
        Ok(server)
    }

    /// Waits for every shard thread to finish (after [`Shared::begin_shutdown`]).
    /// Returns false when a shard thread panicked.
    pub fn join(self) -> bool {
        let mut clean = true;
        for t in self.threads {
            clean &= t.join().is_ok();
        }
        // A leader resigned (its lease revoked) as soon as the shutdown began, so a standby
        // took over while this node drained.
        if let Some(ha) = self.ha {
            ha.stop();
        }
        // The shards are gone: what they journaled goes to file, then the thread stops.
        if let Some(j) = &self.shared.journals {
            j.stop();
        }
        // The shards are gone: publish what they queued, then stop.
        if let Some(p) = self.kv_publisher {
            p.stop();
        }
        for path in &self.same_host_paths {
            let _ = std::fs::remove_file(path);
        }
        // Last (the spans of everything above are queued by now): the metrics with every
        // request answered, and the spans still queued, to the collector; bounded by
        // `ock.mmc.otlp.timeout_ms`.
        if let Some(e) = self.otlp {
            e.flush();
        }
        clean
    }
}

/// Starts a local service's agent. One that recovered blobs from its SSD file joins no
/// earlier than the heartbeat timeout (and a second) after its start: by then its meta has
/// declared the previous process on the rank lost and dropped its segments, so the catalog it
/// hands over is adopted into the new membership alone (a hand-over while the previous
/// membership's segments are still being dropped loses the blobs they share with it).
fn start_agent(shared: &Arc<Shared>, listen: SocketAddr) -> std::io::Result<()> {
    if !shared.membership.local.catalog().holds_committed() {
        return crate::agent::start(shared.clone(), listen);
    }
    let wait = Duration::from_millis(shared.config.cluster.heartbeat_timeout_ms + 1000);
    log::info!(
        "joining in {} ms, once the meta service declared this rank's previous process lost (its catalog recovered from SSD follows)",
        wait.as_millis()
    );
    let shared = shared.clone();
    std::thread::Builder::new()
        .name("mmc-agent-wait".into())
        .spawn(move || {
            let until = Instant::now() + wait;
            while Instant::now() < until {
                if shared.membership.local.leaving.load(Ordering::Acquire) {
                    // Stopped before it joined: nothing to leave.
                    shared.membership.local.left.store(true, Ordering::Release);
                    return;
                }
                if shared.is_shutting_down() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if let Err(e) = crate::agent::start(shared, listen) {
                log::error!("cannot start the local service's agent: {e}");
                std::process::exit(1);
            }
        })
        .map(|_| ())
}

/// The same-host sockets (`http::same_host`): the one every shard accepts on, and, with more
/// than one shard, each shard's own (a client sends a key's request to its owner's).
struct SameHostSockets {
    shared: std::os::unix::net::UnixListener,
    own: Vec<std::os::unix::net::UnixListener>,
    /// Every socket's path (the shared one first), removed at the end.
    paths: Vec<std::path::PathBuf>,
    advert: Box<str>,
}

impl SameHostSockets {
    /// Shard `id`'s listeners: a handle on the shared socket, and its own when there are.
    fn for_shard(
        &self,
        id: usize,
    ) -> Option<(
        std::os::unix::net::UnixListener,
        Option<std::os::unix::net::UnixListener>,
        Box<str>,
    )> {
        let clone = |l: &std::os::unix::net::UnixListener| match l.try_clone() {
            Ok(l) => Some(l),
            Err(e) => {
                log::warn!("shard {id}: no same-host socket: {e}");
                None
            }
        };
        let shared = clone(&self.shared)?;
        let own = self.own.get(id).and_then(clone);
        Some((shared, own, self.advert.clone()))
    }
}

/// Binds the same-host sockets for the TCP `port`. `None` when they are off or the shared one
/// cannot be bound (logged: clients then use TCP); when a shard's own socket cannot be bound
/// (logged), there are none and clients send every request to the shared one.
fn bind_same_host(value: &str, port: u16, boot: u32, shards: usize) -> Option<SameHostSockets> {
    use crate::http::same_host::{advert, bind, header_path, shard_path, socket_path};
    let path = socket_path(value, port)?;
    let Some(shown) = header_path(&path) else {
        log::warn!(
            "no same-host data path: {path:?} is not a path a header can carry (clients use TCP)"
        );
        return None;
    };
    let nonblocking = |l: std::os::unix::net::UnixListener| l.set_nonblocking(true).map(|()| l);
    let shared = match bind(&path, value == "auto").and_then(nonblocking) {
        Ok(l) => l,
        Err(e) => {
            log::warn!(
                "no same-host data path: cannot bind {}: {e} (clients use TCP)",
                path.display()
            );
            return None;
        }
    };
    let mut paths = vec![path.clone()];
    let mut own = Vec::new();
    if shards > 1 {
        for id in 0..shards {
            let p = shard_path(&path, id);
            match bind(&p, false).and_then(nonblocking) {
                Ok(l) => {
                    own.push(l);
                    paths.push(p);
                }
                Err(e) => {
                    log::warn!(
                        "cannot bind {}: {e}; same-host clients send every request to {}",
                        p.display(),
                        path.display()
                    );
                    for p in paths.drain(1..) {
                        let _ = std::fs::remove_file(p);
                    }
                    own.clear();
                    break;
                }
            }
        }
    }
    let stale = crate::http::same_host::remove_stale_shard_sockets(&path, own.len());
    if stale > 0 {
        log::info!("removed {stale} per-shard socket(s) an earlier server of this port left");
    }
    log::info!(
        "same-host data path on {}{}",
        path.display(),
        if own.is_empty() {
            String::new()
        } else {
            format!(" (and one socket per shard: {}.N)", path.display())
        }
    );
    let advert = advert(boot, shown, (!own.is_empty()).then_some(own.len()));
    Some(SameHostSockets {
        shared,
        own,
        paths,
        advert,
    })
}

/// How a shard serves its TCP listener: on monoio, or on a front ring of its own.
enum Listening {
    Monoio(std::net::TcpListener),
    Ring(Rc<FrontRing>),
}

/// With `--io-driver auto` (the default) or `ring` on an io_uring runtime, the shard's front
/// ring; on a kernel without what it needs, logged, the listener stays on monoio (`--io-driver
/// uring`'s path). A TLS listener stays on monoio (monoio-rustls), logged.
fn front_ring(
    choice: runtime::DriverChoice,
    kind: DriverKind,
    shard: usize,
    listener: std::net::TcpListener,
    tls: bool,
) -> (DriverKind, Listening) {
    let wanted = matches!(
        choice,
        runtime::DriverChoice::Ring | runtime::DriverChoice::Auto
    );
    if !wanted || kind == DriverKind::Epoll {
        return (kind, Listening::Monoio(listener));
    }
    if tls {
        log::info!(
            "shard {shard}: the listener serves TLS: its connections stay on monoio's io_uring driver (no front ring)"
        );
        return (kind, Listening::Monoio(listener));
    }
    match FrontRing::new(shard, listener) {
        Ok(ring) => (kind.with_front_ring(), Listening::Ring(ring)),
        Err((why, listener)) => {
            log::warn!(
                "shard {shard}: front ring unavailable: {why}; connections stay on monoio's io_uring driver"
            );
            (kind, Listening::Monoio(listener))
        }
    }
}

/// The life of one shard on its own thread.
async fn shard_main(
    id: usize,
    shared: Arc<Shared>,
    listening: Listening,
    unix: Option<(
        std::os::unix::net::UnixListener,
        Option<std::os::unix::net::UnixListener>,
        Box<str>,
    )>,
    boot_id: u32,
    uring: bool,
) {
    let shard = Shard::new(id, shared.clone(), uring);
    let front = Front::new(shard.clone(), boot_id);
    monoio::spawn(shard.mailbox());
    monoio::spawn(front.clone().tick());
    if shared.ha.enabled() {
        monoio::spawn(shard.clone().ha_applier());
    }
    let bus_shard = shard.clone();
    monoio::spawn(async move { bus_shard.bus.run().await });
    // The blobs recovered from the SSD files' journals, indexed before the shard accepts.
    shard.recover_ssd().await;
    let (accept, ring) = match listening {
        Listening::Monoio(listener) => match TcpListener::from_std(listener) {
            Ok(l) => (Some(monoio::spawn(front.clone().serve(l))), None),
            Err(e) => {
                log::error!("shard {id}: cannot register the listener: {e}");
                return;
            }
        },
        Listening::Ring(ring) => {
            monoio::spawn(ring.clone().pump(front.clone()));
            (None, Some(ring))
        }
    };
    if let Some((unix, own, advert)) = unix {
        for l in std::iter::once(unix).chain(own) {
            match monoio::net::UnixListener::from_std(l) {
                Ok(l) => {
                    monoio::spawn(front.clone().serve_same_host(l, advert.clone()));
                }
                Err(e) => log::warn!("shard {id}: cannot register a same-host socket: {e}"),
            }
        }
    }
    shared.life.accepting.fetch_add(1, Ordering::AcqRel);

    shard.shutdown_requested().await;
    shared.life.accepting.fetch_sub(1, Ordering::AcqRel);
    front.begin_drain();
    if let Some(ring) = &ring {
        ring.begin_drain();
    }
    // The accept is cancelled by `begin_drain`; bounded all the same: under the epoll driver
    // a shutdown was seen (rarely, under load) to wait here for good, the accept never
    // completing (cause not found yet). A stop must not depend on it.
    if let Some(accept) = accept
        && monoio::time::timeout(Duration::from_millis(200), accept)
            .await
            .is_err()
    {
        log::debug!("shard {id}: the accept loop did not see its cancellation; leaving it");
    }
    shard.clock.refresh();
    let deadline_ms = shard.clock.now_ms() + shared.config.http.shutdown_timeout_ms;
    front.drain(deadline_ms).await;
    // Other shards may still wait on replies from this one: keep the mailbox running until
    // every shard has drained (bounded by the same deadline plus a second).
    shared.life.drained.fetch_add(1, Ordering::AcqRel);
    while shared.life.drained.load(Ordering::Acquire) < shared.shard_count()
        && shard.clock.now_ms() < deadline_ms + 1000
    {
        monoio::time::sleep(Duration::from_millis(5)).await;
        shard.clock.refresh();
    }
}
