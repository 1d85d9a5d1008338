//! A local service's membership: join the meta service, mount this host's segments under the
//! rank it gave, report at once (the meta's segments of this rank take puts from that first
//! report on) and then every `heartbeat_interval_ms`, join again when the meta forgot us
//! (it restarted, or declared us lost), and leave on a graceful stop.
//!
//! Runs on its own thread with a small monoio runtime; shards never wait for it. The bytes
//! themselves never pass here: clients bring them to the shards under grants.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod follow;

use crate::grant::GrantKey;
use crate::http::{catalog_wire, client, report_wire};
use crate::metrics::view::Source;
use crate::shards::Cluster;
use crate::shards::store::segment::{Medium, segment_name};

/// How long a join, heartbeat or leave waits for the meta service.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Catalog entries a hand-over carries at most, in one heartbeat (about 100 bytes of JSON each
/// with short keys: well under the meta's default `ock.mmc.http.max_body_bytes` of 64 MB).
const MAX_HANDED_OVER: usize = 400_000;
/// Pause between two join attempts while no meta service answers.
const JOIN_RETRY: Duration = Duration::from_millis(300);
/// How long after a tier move the agent reports (the meta has landed it by then, usually; the
/// second report is for a meta that was slower): its `landed` record is what lets the catalog
/// hand the copy over.
const AFTER_MOVE_MS: [u64; 2] = [50, 400];

/// Starts the agent thread of a local service listening at `listen`.
pub fn start(cluster: Arc<Cluster>, listen: std::net::SocketAddr) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("mmc-agent".into())
        .spawn(move || {
            let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
                .enable_timer()
                .build()
                .expect("the agent's runtime starts");
            rt.block_on(run(cluster, listen));
        })?;
    Ok(())
}

struct Membership {
    meta: String,
    rank: u32,
    interval: Duration,
    /// The join said a catalog follows: the next heartbeat carries it (until one is answered).
    hand_over: bool,
    /// No heartbeat sent since the join: the first goes at once, since the meta keeps this
    /// rank's segments UNDEFINED (no puts, no redirects) until it arrives.
    first_beat: bool,
}

fn advertise_url(cluster: &Cluster, listen: std::net::SocketAddr) -> String {
    let configured = &cluster.config.cluster.local_advertise_url;
    if configured.is_empty() {
        let scheme = if cluster.config.tls.enable {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{listen}")
    } else {
        configured.clone()
    }
}

/// The segments this host lends: DRAM and HBM of their configured sizes (when above 0), and
/// an SSD segment when `ock.mmc.ssd.enable` is set.
fn lent(cluster: &Cluster) -> Vec<(Medium, u64)> {
    let store = &cluster.config.store;
    [
        (Medium::Dram, store.dram_bytes),
        (Medium::Hbm, store.hbm_bytes),
        (
            Medium::Ssd,
            if store.ssd_enable { store.ssd_bytes } else { 0 },
        ),
    ]
    .into_iter()
    .filter(|&(_, size)| size > 0)
    .collect()
}

/// The directory of rank `rank`'s SSD file (`ock.mmc.ssd.path`, rank r takes directory r mod
/// count, as embedded ranks do).
fn ssd_dir(cluster: &Cluster, rank: u32) -> Option<&str> {
    let dirs = &cluster.config.store.ssd_dirs;
    (!dirs.is_empty()).then(|| dirs[rank as usize % dirs.len()].as_str())
}

async fn run(cluster: Arc<Cluster>, listen: std::net::SocketAddr) {
    let incarnation = incarnation();
    let url = advertise_url(&cluster, listen);
    let mut member: Option<Membership> = None;
    let mut last_report = Instant::now() - Duration::from_secs(3600);
    let mut last_report_ms = 0;
    // The meta is given up after as long without an answer as it waits for our reports: it
    // died or lost its leadership, and the list of meta URLs is tried again (with HA, the new
    // leader admits us; its index of our memory starts empty).
    let silence_limit = Duration::from_millis(cluster.config.cluster.heartbeat_timeout_ms);
    let mut last_heard = Instant::now();
    let mut unreachable = follow::Unreachable::default();
    loop {
        if cluster.local.leaving.load(Ordering::Acquire) {
            if let Some(m) = &member {
                leave(&cluster, m, incarnation).await;
            }
            cluster.local.left.store(true, Ordering::Release);
            return;
        }
        if cluster.is_shutting_down() {
            return;
        }
        match &mut member {
            None => match join(&cluster, &url, incarnation, &mut unreachable).await {
                Ok(m) => {
                    last_report = Instant::now();
                    last_heard = Instant::now();
                    member = Some(m);
                }
                Err(Fatal::Refused(why)) => {
                    log::error!("{why}");
                    // A wrong secret does not fix itself: stop, so the supervisor shows it.
                    std::process::exit(1);
                }
                Err(Fatal::Retry) => monoio::time::sleep(JOIN_RETRY).await,
            },
            Some(m) => {
                // A catalog to hand over goes at once, so the objects are back soon; a tier
                // move's landing is fetched soon after the move.
                let moved = cluster.local.moved_at_ms.load(Ordering::Relaxed);
                let now_ms = crate::grant::unix_ms();
                let after_move = moved != 0
                    && AFTER_MOVE_MS
                        .iter()
                        .any(|&d| now_ms >= moved + d && last_report_ms < moved + d);
                let due = last_report.elapsed() >= m.interval || m.first_beat;
                if due || m.hand_over || after_move {
                    m.first_beat = false;
                    last_report = Instant::now();
                    last_report_ms = now_ms;
                    match heartbeat(&cluster, m, incarnation).await {
                        Beat::Heard => last_heard = Instant::now(),
                        Beat::Unheard if last_heard.elapsed() <= silence_limit => {}
                        beat => {
                            log::warn!(
                                "rank {}: the meta service at {} {}: joining again",
                                m.rank,
                                m.meta,
                                beat.why()
                            );
                            member = None;
                            cluster.ha.follow(None);
                            continue;
                        }
                    }
                }
                monoio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

enum Fatal {
    Refused(String),
    Retry,
}

async fn join(
    cluster: &Cluster,
    url: &str,
    incarnation: u64,
    unreachable: &mut follow::Unreachable,
) -> Result<Membership, Fatal> {
    // Grants of the meta left behind are void from now on: none is accepted until the join's
    // answer brings the next meta's key, and bodies still arriving under one stop being written.
    cluster.grant_key.clear();
    cluster.local.revoke_writers();
    let segments: Vec<Value> = lent(cluster)
        .iter()
        .map(|&(m, size)| json!({"medium": m.upper(), "size": size}))
        .collect();
    // The catalog of what this service holds follows the join, in the first heartbeat (once
    // this service has the meta's grant key): a meta that does not know this membership (a
    // new HA leader, a restarted meta) adopts it. It asks for the rank its memory is mounted
    // under, so the blobs keep their places.
    let hand_over = !cluster.local.catalog().entries().is_empty();
    let rank = cluster
        .config
        .cluster
        .local_rank
        .or_else(|| hand_over.then(|| cluster.local.rank()).flatten());
    let body = json!({
        "rank": rank,
        "url": url,
        "incarnation": incarnation,
        "segments": segments,
        "catalog_follows": hand_over,
    });
    let mut candidates: Vec<String> = cluster.config.cluster.meta_urls.clone();
    let mut i = 0;
    while i < candidates.len() {
        let meta = candidates[i].clone();
        i += 1;
        let answer = tell(
            cluster,
            &meta,
            "/cluster/v1/join",
            body.clone(),
            CALL_TIMEOUT,
        )
        .await;
        let a = match answer {
            Ok(a) => a,
            // A certificate refused on either side does not fix itself, like a wrong secret.
            Err(e) if e.contains(client::UNTRUSTED) => {
                return Err(Fatal::Refused(format!(
                    "the meta service at {meta} and this local service do not trust each other's TLS certificates (ock.mmc.cluster.tls.ca.path, cert.path): not joining: {e}"
                )));
            }
            Err(e) => {
                unreachable.failed(&meta, &format!("cannot be reached: {e}"));
                continue;
            }
        };
        match a.status {
            200 => {}
            307 => {
                // An HA standby: the leader is where it points (tried next, once).
                if let Some(leader) = a.location.as_deref().and_then(base_of)
                    && !candidates.contains(&leader)
                {
                    candidates.insert(i, leader);
                }
                continue;
            }
            401 => {
                return Err(Fatal::Refused(format!(
                    "the meta service at {meta} refused this local service's cluster token (ock.mmc.cluster.token / MMC_CLUSTER_TOKEN): not joining"
                )));
            }
            s => {
                let why = String::from_utf8_lossy(&a.body);
                unreachable.failed(&meta, &format!("refused the join ({s}): {why}"));
                continue;
            }
        }
        unreachable.reached(&meta);
        let v: Value = serde_json::from_slice(&a.body).unwrap_or(Value::Null);
        let rank = v.get("rank").and_then(Value::as_u64).map(|r| r as u32);
        let key = v
            .get("grant_key")
            .and_then(Value::as_str)
            .and_then(GrantKey::from_hex);
        let (Some(rank), Some(key)) = (rank, key) else {
            log::warn!("the meta service at {meta} answered a join without rank or grant key");
            continue;
        };
        let interval = v
            .get("heartbeat_interval_ms")
            .and_then(Value::as_u64)
            .unwrap_or(cluster.config.cluster.heartbeat_interval_ms);
        if let Err(e) = mount_as(cluster, rank) {
            return Err(Fatal::Refused(format!(
                "cannot mount this host's segments as rank {rank}: {e}"
            )));
        }
        cluster.grant_key.set(key);
        cluster.local.set(rank, meta.clone());
        // From now on it reports that meta as the leader it follows, and is ready.
        let view = v.get("view_version").and_then(Value::as_u64).unwrap_or(0);
        cluster.ha.follow(Some((&meta, view)));
        // A new membership's freed log starts at sequence 0.
        cluster.local.catalog().reset_ack();
        log::info!("joined the meta service at {meta} as rank {rank} (serving at {url})");
        return Ok(Membership {
            meta: meta.clone(),
            rank,
            interval: Duration::from_millis(interval.max(10)),
            hand_over,
            first_beat: true,
        });
    }
    Err(Fatal::Retry)
}

/// `http[s]://host:port` of a URL.
fn base_of(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let host = rest.split('/').next()?;
    let known = scheme == "http" || scheme == "https";
    (known && !host.is_empty()).then(|| format!("{scheme}://{host}"))
}

/// Mounts this host's segments as `rank` (kept when already mounted under it; a new rank
/// replaces them: the meta forgot the old copies). Runs on the agent's thread, never a
/// shard's: the SSD file's creation (open with truncate, `set_len`) blocks here only.
fn mount_as(cluster: &Cluster, rank: u32) -> Result<(), String> {
    let table = &cluster.segments;
    for s in table.snapshot().iter() {
        if s.rank != rank {
            table.remove(&s.name);
            // Its memory goes with it: nothing it held is this service's any more.
            cluster.local.catalog().clear();
        }
    }
    for (medium, size) in lent(cluster) {
        if table.find(&segment_name(rank, medium)).is_some() {
            continue;
        }
        let seg = crate::shards::store::mount::build_segment(
            table,
            rank,
            medium,
            size,
            ssd_dir(cluster, rank),
            cluster.shard_count(),
            cluster.config.store.run_bytes,
        )?;
        if cluster.config.store.prefault {
            crate::shards::store::mount::prefault_in_background(&seg);
        }
        table.insert(seg)?;
    }
    Ok(())
}

/// What a heartbeat learned.
enum Beat {
    Heard,
    /// No answer (the meta may be restarting, or gone).
    Unheard,
    /// The meta does not know this incarnation (it restarted, or declared us lost).
    Forgotten,
    /// The meta is not the leader any more (HA: a standby answers 307 or 503).
    NotLeader,
}

impl Beat {
    fn why(&self) -> &'static str {
        match self {
            Beat::Heard => "answered",
            Beat::Unheard => "has not answered for the heartbeat timeout",
            Beat::Forgotten => "no longer knows this service",
            Beat::NotLeader => "is not the leader any more",
        }
    }
}

/// The catalog a heartbeat hands over: at most [`MAX_HANDED_OVER`] entries, the newest.
fn catalog_to_hand_over(cluster: &Cluster) -> Vec<Value> {
    let mut entries = cluster.local.catalog().entries();
    if entries.len() > MAX_HANDED_OVER {
        log::error!(
            "the catalog holds {} blobs; only the newest {MAX_HANDED_OVER} are handed over",
            entries.len()
        );
        entries.sort_by_key(|e| std::cmp::Reverse(e.stamp));
        entries.truncate(MAX_HANDED_OVER);
    }
    entries.iter().map(catalog_wire::entry_json).collect()
}

/// One report.
async fn heartbeat(cluster: &Cluster, m: &mut Membership, incarnation: u64) -> Beat {
    let client =
        report_wire::client_json(&(cluster as &dyn Source).recorded_client_views(), m.rank);
    let (ack, mark) = {
        let c = cluster.local.catalog();
        (c.acked(), c.mark())
    };
    let mut body = json!({
        "rank": m.rank,
        "incarnation": incarnation,
        "client": client,
        "catalog_ack": ack,
    });
    // The SSD file's figures, for the meta's per-disk series and its fault state.
    let window = cluster.config.metrics.window_secs.max(1);
    let now_secs = cluster.clock.now_secs();
    for seg in cluster.segments.snapshot().iter() {
        if let Some(f) = seg.backend.file() {
            let (read, written) = f.window_bytes(now_secs, window);
            body["ssd_path"] = json!(f.dir);
            body["ssd_status"] = json!(f.status());
            body["ssd_read_bps"] = json!(read / window);
            body["ssd_write_bps"] = json!(written / window);
        }
    }
    if m.hand_over {
        body["catalog"] = Value::Array(catalog_to_hand_over(cluster));
    }
    match tell(
        cluster,
        &m.meta,
        "/cluster/v1/heartbeat",
        body,
        CALL_TIMEOUT,
    )
    .await
    {
        Ok(a) if a.status == 200 => {
            m.hand_over = false;
            // The blobs the meta freed since the last acknowledged sequence.
            let v: Value = serde_json::from_slice(&a.body).unwrap_or(Value::Null);
            if let Some(news) = catalog_wire::parse_news(&v) {
                cluster.local.catalog().apply(news, mark);
            }
            Beat::Heard
        }
        Ok(a) if a.status == 413 && m.hand_over => {
            // The catalog does not fit the meta's body limit: it is not handed over (the meta
            // takes the next, plain heartbeat as an empty catalog; this memory is reused).
            log::error!(
                "the meta service at {} refused this service's catalog as too large (ock.mmc.http.max_body_bytes): its objects are not handed over",
                m.meta
            );
            m.hand_over = false;
            cluster.local.catalog().clear();
            Beat::Heard
        }
        Ok(a) if a.status == 409 => Beat::Forgotten,
        Ok(a) if a.status == 307 || a.status == 503 => Beat::NotLeader,
        Ok(a) => {
            log::warn!("heartbeat refused by {} ({})", m.meta, a.status);
            Beat::Unheard
        }
        Err(e) => {
            log::warn!("heartbeat: {e}");
            Beat::Unheard
        }
    }
}

async fn leave(cluster: &Cluster, m: &Membership, incarnation: u64) {
    let body = json!({"rank": m.rank, "incarnation": incarnation});
    match tell(
        cluster,
        &m.meta,
        "/cluster/v1/leave",
        body,
        Duration::from_secs(15),
    )
    .await
    {
        Ok(a) if a.status == 200 => {
            log::info!("left the meta service at {} (rank {})", m.meta, m.rank)
        }
        Ok(a) => log::warn!("leave refused by {} ({})", m.meta, a.status),
        Err(e) => log::warn!("leave: {e}"),
    }
}

/// POSTs a JSON message to the meta at `meta` with the cluster token.
async fn tell(
    cluster: &Cluster,
    meta: &str,
    path: &str,
    body: Value,
    timeout: Duration,
) -> Result<client::Answer, String> {
    let token = cluster.config.cluster.token.as_str();
    let body = body.to_string().into_bytes();
    client::request(meta, "POST", path, Some(token), body, timeout).await
}

/// A random number that tells this run of the service from a previous one with the same rank.
fn incarnation() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    xxhash_rust::xxh3::xxh3_64(&(nanos ^ ((std::process::id() as u128) << 64)).to_le_bytes())
        & ((1 << 53) - 1)
}
